// Entry point TensorBoard loads for the Advisor tab (es_module_path
// "/index.js"): builds the page, keeps the selection state and asks
// model.js for data and views.js for drawing.

import * as model from './model.js';
import * as views from './views.js';
import {StepTimeline} from './timeline.js';

const {h} = views;
const STORAGE_KEY = 'gpu_advisor.selection';

class AdvisorApp {
  constructor(root) {
    this.root = root;
    this.groups = new Map();
    this.selection = {run: null, session: null, host: '', base: ''};
    this.view = 'report';
    this.controller = null;
    this.info = {profile_tab: true};
    this.unreadable = new Set();    // "run\u0000session" of sessions that could not be analysed

    this.toolbar = h('div', {class: 'toolbar', role: 'toolbar', 'aria-label': 'Session selection'});
    this.tabs = h('div', {class: 'tabs', role: 'tablist', 'aria-label': 'Views'});
    this.content = h('main', {class: 'content', tabindex: '-1'});
    root.append(
      h('header', {class: 'top'}, h('h1', {text: 'GPU Advisor'}), this.toolbar),
      this.tabs,
      this.content);
  }

  async start() {
    this.show(views.statusView('Looking for profile captures…'));
    this.info = await model.fetchInfo();
    await this.refresh();
  }

  /** Fetches the run list into this.groups; false, with the reason shown, when there is nothing to show. */
  async listGroups() {
    let items;
    try {
      items = await model.listRuns();
    } catch (error) {
      this.show(error.status === 404 ? views.emptyView(error.message) :
        views.errorView('Could not list captures:', error.message));
      this.drawToolbar();
      return false;
    }
    this.groups = model.groupRuns(items);
    if (!this.groups.size) {
      this.drawToolbar();
      this.show(views.emptyView());
      return false;
    }
    return true;
  }

  /** The selection from the page URL (a shared link), else from this tab's last visit. */
  restoreSelection() {
    let saved = {};
    try {
      saved = JSON.parse(sessionStorage.getItem(STORAGE_KEY) || '{}');
    } catch (_) {
      saved = {};
    }
    const linked = model.readUrlState();
    if (linked.run) {
      saved = {run: linked.run, session: linked.session, host: linked.host,
        base: linked.base_run ? `${linked.base_run}\u0000${linked.base_session || ''}` : ''};
    }
    if (linked.view === 'compare' || linked.view === 'report') this.view = linked.view;
    const runs = [...this.groups.keys()];
    const run = runs.includes(saved.run) ? saved.run : runs[0];
    const sessions = this.groups.get(run);
    const known = sessions.find((item) => item.session === saved.session);
    this.selection = {
      run,
      session: (known || sessions[0]).session,
      host: known && known.hosts.includes(saved.host) ? saved.host : '',
      base: saved.base || '',
    };
    this.saveSelection();
  }

  /** Keeps the selection for this tab and in the page URL, so the view can be shared. */
  saveSelection() {
    try {
      sessionStorage.setItem(STORAGE_KEY, JSON.stringify(this.selection));
    } catch (_) {
      // Storage can be disabled; the selection then lasts for this view only.
    }
    const {run, session, host, base} = this.selection;
    const [baseRun, baseSession] = this.view === 'compare' && base ? base.split('\u0000') : ['', ''];
    model.writeUrlState({run, session, host, view: this.view === 'compare' ? 'compare' : '',
      base_run: baseRun, base_session: baseSession});
  }

  currentItem() {
    const sessions = this.groups.get(this.selection.run) || [];
    return sessions.find((item) => item.session === this.selection.session) || null;
  }

  drawToolbar() {
    this.toolbar.replaceChildren();
    const runs = [...this.groups.keys()];
    if (runs.length) {
      const sessions = this.groups.get(this.selection.run) || [];
      const item = this.currentItem();
      const hosts = item ? item.hosts : [];
      this.toolbar.append(
        views.selectField('Run', runs.map((run) => [run, run]), this.selection.run, (run) => {
          this.selection.run = run;
          this.selection.session = this.groups.get(run)[0].session;
          this.selection.host = '';
          this.selection.base = '';
          this.changed();
        }, {'data-testid': 'run-select'}),
        views.selectField('Session', sessions.map((s) => [s.session, s.session]), this.selection.session,
          (session) => {
            this.selection.session = session;
            this.selection.host = '';
            this.selection.base = '';
            this.changed();
          }, {'data-testid': 'session-select'}),
        views.selectField('Host',
          [['', hosts.length > 1 ? `All hosts (${hosts.length})` : (hosts[0] || 'All hosts')],
            ...(hosts.length > 1 ? hosts.map((host) => [host, host]) : [])],
          this.selection.host, (host) => {
            this.selection.host = host;
            this.changed();
          }, {'data-testid': 'host-select', disabled: hosts.length < 2}));
    }
    const refresh = h('button', {type: 'button', class: 'button', title: 'Look for new captures and re-read changed ones'},
      'Refresh');
    refresh.addEventListener('click', () => this.refresh());
    this.toolbar.append(refresh);
  }

  drawTabs() {
    this.tabs.replaceChildren();
    const make = (view, label) => {
      const tab = h('button', {
        type: 'button', role: 'tab', class: 'tab', id: `tab-${view}`,
        'aria-selected': this.view === view ? 'true' : 'false',
        tabindex: this.view === view ? '0' : '-1',
      }, label);
      tab.addEventListener('click', () => this.switchView(view));
      tab.addEventListener('keydown', (event) => {
        if (event.key === 'ArrowRight' || event.key === 'ArrowLeft') {
          const other = view === 'report' ? 'compare' : 'report';
          this.switchView(other);
          document.getElementById(`tab-${other}`).focus();
        }
      });
      return tab;
    };
    this.tabs.append(make('report', 'Report'), make('compare', 'Compare'));
  }

  switchView(view) {
    if (this.view === view) return;
    this.view = view;
    this.saveSelection();
    this.drawTabs();
    this.load();
  }

  changed() {
    this.saveSelection();
    this.drawToolbar();
    this.load();
  }

  /** Re-lists the captures, keeping the selection while it still exists (none does at start). */
  async refresh() {
    if (!(await this.listGroups())) return;
    if (!this.currentItem()) this.restoreSelection();
    this.drawToolbar();
    // Tabs are first drawn once a capture exists (at start or on a later refresh).
    this.drawTabs();
    await this.load();
  }

  show(...nodes) {
    this.content.replaceChildren(...nodes.filter(Boolean));
  }

  /** Starts the request for the current view, cancelling the previous one. */
  async load() {
    if (this.controller) this.controller.abort();
    this.controller = new AbortController();
    const {signal} = this.controller;
    try {
      if (this.view === 'compare') await this.loadCompare(signal);
      else await this.loadReport(signal);
    } catch (error) {
      if (error.name === 'AbortError') return;
      const title = error.status === 404 ? 'Not found:' : error.status === 400 ? 'Rejected:' : 'Failed:';
      this.show(views.errorView(title, error.message));
    }
  }

  async loadReport(signal) {
    const {run, session, host} = this.selection;
    this.show(views.statusView(`Loading ${run} / ${session}…`));
    const report = await model.fetchReport({run, session, host}, (progress) => {
      this.show(views.statusView(`${run} / ${session}:`, progress));
    }, signal);
    if (signal.aborted) return;
    if (model.unreadable(report)) {
      // Nothing was read: a header, chart or findings would describe an empty capture.
      this.unreadable.add(`${run}\u0000${session}`);
      this.show(views.errorsView(report, true), views.unreadNote());
      return;
    }
    const steps = report.steps || {};
    const context = {
      run, session, host, hosts: report.hosts || [], stepMeanMs: steps.mean_ms, timeOriginMs: report.time_origin_ms,
      profileTab: this.info.profile_tab !== false, profileInstall: this.info.profile_install,
    };
    // The device a check marks (report.marked_device: the straggler), as the report names it.
    const deviceChart = views.deviceChart(report.breakdown, report.marked_device || null);
    const stepChart = views.stepChart(report.breakdown, !deviceChart);
    const ranked = (report.findings || []).map((finding) => finding.check);
    const timeline = ((report.breakdown || {}).steps || []).length ?
      this.timeline(run, session, stepChart, ranked, signal) : null;
    this.show(
      views.errorsView(report),
      views.headerView(report),
      views.warningsView(report),
      views.firstFixView(report),
      h('div', {class: deviceChart ? 'charts two' : 'charts'}, stepChart, deviceChart),
      timeline && timeline.element,
      views.findingsView(report, context));
    if (timeline) timeline.load(null);
  }

  /** The step timeline under the step chart; a click on a step bar draws that step. */
  timeline(run, session, stepChart, ranked, signal) {
    const timeline = new StepTimeline((step, onProgress) =>
      model.fetchTimeline({run, session, step: step === null ? '' : String(step)}, onProgress, signal), ranked);
    const pick = (step) => {
      for (const bar of stepChart.querySelectorAll('g.step-bar')) {
        bar.classList.toggle('picked', bar.dataset.step === String(step));
      }
    };
    timeline.element.addEventListener('timeline-step', (event) => pick(event.detail));
    stepChart.addEventListener('click', (event) => {
      const bar = event.target.closest('g.step-bar');
      if (bar) timeline.load(Number(bar.dataset.step));
    });
    return timeline;
  }

  async loadCompare(signal) {
    const {run, session} = this.selection;
    const pairs = [];
    for (const [otherRun, sessions] of this.groups) {
      for (const item of sessions) {
        if (otherRun !== run || item.session !== session) pairs.push([otherRun, item.session]);
      }
    }
    if (!pairs.length) {
      this.show(views.errorView('Nothing to compare:', 'this logdir holds a single session.'));
      return;
    }
    // Sessions found unreadable (their report, or a refused comparison) are no base to offer.
    const readable = pairs.filter((pair) => !this.unreadable.has(pair.join('\u0000')));
    const others = readable.map((pair) => pair.join('\u0000'));
    const picked = others.includes(this.selection.base);
    if (!picked) {
      const base = model.defaultBase(run, session, readable);
      this.selection.base = base ? base.join('\u0000') : '';
      this.saveSelection();
    }
    const choices = others.map((key) => [key, key.replace('\u0000', ' / ')]);
    const picker = views.selectField('Compare against base session',
      this.selection.base ? choices : [['', '(pick a base session)'], ...choices], this.selection.base, (base) => {
        this.selection.base = base;
        this.saveSelection();
        this.load();
      }, {'data-testid': 'base-select'});
    const bar = h('div', {class: 'compare-bar'}, picker,
      h('span', {class: 'muted', text: `→ this session: ${run} / ${session}`}));
    if (!this.selection.base) {
      this.show(bar, views.nothingToCompareView(run, session));
      return;
    }
    const [baseRun, baseSession] = this.selection.base.split('\u0000');
    const note = baseRun === run ? null : views.otherRunNote(`${baseRun} / ${baseSession}`);
    this.show(bar, note, views.statusView('Comparing…'));
    let result;
    try {
      result = await model.fetchCompare({run, session, baseRun, baseSession}, (progress) => {
        this.show(bar, note, views.statusView('Analyzing both sessions…', progress));
      }, signal);
    } catch (error) {
      if (error.status === 422 && error.body.unreadable === 'base') {
        this.unreadable.add(this.selection.base);
        // A base the tab chose itself: the run's next earlier session instead.
        if (!picked && !signal.aborted) return this.loadCompare(signal);
      }
      // 422: one side could not be analysed, and the server refuses to tabulate it.
      const title = error.status === 422 ? 'Cannot compare:' : 'Comparison failed:';
      // The route's message may open with the same words as the title (compare.refusal's do).
      const message = error.message.replace(/^cannot compare:\s*/i, '');
      if (error.name !== 'AbortError') this.show(bar, note, views.errorView(title, message));
      return;
    }
    if (signal.aborted) return;
    this.show(bar, note, views.compareView(result, {
      base: `${baseRun} / ${baseSession}`, current: `${run} / ${session}`,
    }));
  }
}

function addStylesheet() {
  const link = document.createElement('link');
  link.rel = 'stylesheet';
  link.href = new URL('./style.css', import.meta.url).href;
  document.head.appendChild(link);
}

/** The tab follows TensorBoard's dark mode (a "dark-mode" class on its page's body) where it
 * can see that page; otherwise the browser's colour scheme decides (style.css). */
function followDarkMode() {
  let top;
  try {
    top = window.parent.document.body;
  } catch (_) {
    return;     // another origin: nothing to follow
  }
  if (!top || top === document.body) return;
  const sync = () => document.body.classList.toggle('dark', top.classList.contains('dark-mode'));
  sync();
  new MutationObserver(sync).observe(top, {attributes: true, attributeFilter: ['class']});
}

/** Called by TensorBoard's plugin entry page once the module is imported. */
export async function render() {
  addStylesheet();
  followDarkMode();
  document.documentElement.lang = document.documentElement.lang || 'en';
  const root = h('div', {class: 'advisor'});
  document.body.appendChild(root);
  await new AdvisorApp(root).start();
}

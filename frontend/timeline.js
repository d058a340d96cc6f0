// The step timeline under the step chart: one step drawn on a canvas from the /timeline route
// (tb_gpuadvisor/stepview.py), rows per device stream and host thread, a selected finding's
// intervals marked. A canvas, not SVG: a step of a big capture is 20,000 rectangles, redrawn on
// every zoom or pan frame.

import {h} from './views.js';

const ROW_H = 18;
const HOST_H = 16;          // a host's heading row in a many-host session
const AXIS_H = 22;
const MARK_H = 14;          // the marked finding's own row, above the others
const LABEL_MIN = 120;
const LABEL_MAX = 240;

/** Microseconds in words: "850 ns", "12.4 us", "3.21 ms". */
export function fmtUs(us) {
  if (!(us >= 0)) return '';
  if (us < 1) return `${Math.round(us * 1000)} ns`;
  if (us < 1000) return `${us < 10 ? us.toFixed(2) : us.toFixed(1)} us`;
  return `${(us / 1000).toFixed(us < 10000 ? 3 : 2)} ms`;
}

/** A tick step (1, 2 or 5 times a power of ten) giving about COUNT ticks over SPAN. */
function tickStep(span, count) {
  const raw = span / Math.max(count, 1);
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  for (const unit of [1, 2, 5, 10]) {
    if (unit * magnitude >= raw) return unit * magnitude;
  }
  return 10 * magnitude;
}

/** The colour of each legend group, read from the stylesheet the step chart's legend uses. */
function groupColours(groups, host) {
  const probe = h('span', {class: 'offscreen'});
  host.appendChild(probe);
  const colours = groups.map((group) => {
    probe.className = `offscreen c-group-${group}`;
    return getComputedStyle(probe).backgroundColor;
  });
  probe.remove();
  return colours;
}

/** Rows to draw, in order: host headings (many hosts) then each row with its y and height. */
function layout(rows) {
  const hosts = new Set(rows.map((row) => row.host).filter(Boolean));
  const out = [];
  let y = AXIS_H + MARK_H;
  let current = null;
  for (const row of rows) {
    if (hosts.size > 1 && row.host && row.host !== current) {
      current = row.host;
      out.push({heading: row.host, y, height: HOST_H});
      y += HOST_H;
    }
    out.push({row, y, height: ROW_H});
    y += ROW_H;
  }
  return {items: out, height: y + 4};
}

/** The rectangle of ROW under time T (us from the step's start) in LANE, or -1. */
function hitRect(row, t, lane, slack) {
  let best = -1;
  for (let i = 0; i < row.start.length; i += 1) {
    if (row.lane[i] !== lane) continue;
    const s = row.start[i];
    if (s - slack <= t && t <= s + row.dur[i] + slack) {
      if (best < 0 || row.dur[i] < row.dur[best]) best = i;
    }
  }
  return best;
}

export class StepTimeline {
  /**
   * FETCH(step) resolves the /timeline answer of a step (null: the representative one); RANKED,
   * the report's check ids in its order (the first with intervals is marked at first). The
   * element is built once; `load(step)` draws another step, `mark(check)` another finding.
   */
  constructor(fetch, ranked = []) {
    this.fetch = fetch;
    this.ranked = ranked;
    this.data = null;
    this.check = '';
    this.view = {from: 0, to: 1};
    this.maxDrawMs = 0;
    this.drag = null;
    this.frame = 0;
    this.stepSelect = h('select', {'aria-label': 'Step', 'data-testid': 'timeline-step'});
    this.stepSelect.addEventListener('change', () => this.load(Number(this.stepSelect.value)));
    this.findingSelect = h('select', {'aria-label': 'Finding to mark', 'data-testid': 'timeline-finding'});
    this.findingSelect.addEventListener('change', () => this.mark(this.findingSelect.value));
    const fit = h('button', {type: 'button', class: 'button', 'data-testid': 'timeline-fit'}, 'Fit step');
    fit.addEventListener('click', () => this.fit());
    this.note = h('p', {class: 'timeline-note', 'data-testid': 'timeline-note', 'aria-live': 'polite'});
    this.canvas = h('canvas', {
      class: 'timeline-canvas', tabindex: '0', 'data-testid': 'timeline-canvas', role: 'img',
      'aria-label': 'Timeline of one step: mouse wheel or + and - zoom, drag or arrow keys pan, 0 fits the step',
    });
    this.card = h('div', {class: 'timeline-card', 'data-testid': 'timeline-card', hidden: ''});
    this.status = h('span', {class: 'muted'});
    this.element = h('figure', {class: 'chart timeline', 'data-testid': 'timeline'},
      h('figcaption', {},
        h('strong', {text: 'The step, event by event'}),
        h('span', {class: 'muted', text: ' (click a bar above to pick a step)'})),
      h('div', {class: 'timeline-bar'},
        h('label', {class: 'field'}, 'Step', this.stepSelect),
        h('label', {class: 'field'}, 'Mark the evidence of', this.findingSelect),
        fit, this.status),
      this.note,
      h('div', {class: 'timeline-wrap'}, this.canvas, this.card));
    this.listen();
    // Drawn again at the new width when the tab is resized.
    new ResizeObserver(() => this.draw()).observe(this.canvas);
  }

  async load(step) {
    this.status.textContent = 'Loading the step…';
    this.element.dataset.state = 'loading';
    try {
      const data = await this.fetch(step, (progress) => {
        this.status.textContent = `Analysing the session for its timeline… ${progress.stage || ''}`;
      });
      this.show(data);
      this.status.textContent = '';
      this.element.dataset.state = 'ready';
    } catch (error) {
      if (error.name === 'AbortError') return;
      this.status.textContent = `Could not draw the step: ${error.message}`;
      this.element.dataset.state = 'error';
    }
  }

  show(data) {
    this.data = data;
    this.colours = groupColours(data.groups, this.element);
    this.laid = layout(data.rows);
    this.stepSelect.replaceChildren(...data.steps.map((n) => h('option', {value: String(n), text: `step ${n}`})));
    this.stepSelect.value = String(data.step);
    const order = (f) => (this.ranked.includes(f.check) ? this.ranked.indexOf(f.check) : this.ranked.length);
    const choices = data.findings.filter((f) => f.severity !== 'not_applicable').sort((a, b) => order(a) - order(b));
    if (!choices.some((f) => f.check === this.check)) {
      // The first finding with intervals that the report ranks as a problem, else none.
      const first = choices.find((f) => !f.why && ['critical', 'warning'].includes(f.severity));
      this.check = first ? first.check : '';
    }
    this.findingSelect.replaceChildren(h('option', {value: '', text: '(none)'}),
      ...choices.map((f) => h('option', {value: f.check, text: `${f.check}: ${f.title}`})));
    this.findingSelect.value = this.check;
    this.element.dataset.step = String(data.step);
    this.element.dataset.hosts = String(new Set(data.rows.map((row) => row.host).filter(Boolean)).size || 1);
    this.element.dataset.rows = String(data.rows.length);
    this.element.dispatchEvent(new CustomEvent('timeline-step', {detail: data.step}));
    this.fit();
    this.mark(this.check);
  }

  /** Marks the intervals of finding CHECK ('' marks nothing) and says what they add up to. */
  mark(check) {
    this.check = check;
    const finding = this.data ? this.data.findings.find((f) => f.check === check) : null;
    this.marked = finding && !finding.why ? finding : null;
    if (!finding) {
      this.note.textContent = 'Pick a finding to mark the intervals its number counts.';
    } else if (finding.why) {
      this.note.textContent = `${finding.title}: nothing to mark on the timeline, ${finding.why}.`;
    } else {
      this.note.textContent = `${finding.title}: the marked intervals are ${finding.step_percent.toFixed(1)}% ` +
        `of this step (${fmtUs(finding.marked_us)} of ${fmtUs(this.data.duration_us)}; ` +
        `${finding.finding_percent.toFixed(1)}% over all steps, the finding's number).`;
    }
    this.element.dataset.marked = this.marked ? String(this.marked.step_percent) : '';
    this.element.dataset.check = check;
    this.draw();
  }

  fit() {
    if (!this.data) return;
    this.view = {from: 0, to: this.data.duration_us};
    this.draw();
  }

  labelWidth() {
    return Math.max(LABEL_MIN, Math.min(LABEL_MAX, Math.round(this.canvas.clientWidth * 0.22)));
  }

  /** Zooms by FACTOR (<1 in) around time AT. */
  zoom(factor, at) {
    const {from, to} = this.view;
    const span = Math.max((to - from) * factor, Math.max(this.data.resolution_us * 4, 0.01));
    const full = this.data.duration_us;
    const where = (at - from) / (to - from);
    let start = at - where * Math.min(span, full);
    start = Math.max(0, Math.min(start, full - Math.min(span, full)));
    this.view = {from: start, to: start + Math.min(span, full)};
    this.schedule();
  }

  pan(fraction) {
    const {from, to} = this.view;
    const full = this.data.duration_us;
    const shift = Math.max(-from, Math.min((to - from) * fraction, full - to));
    this.view = {from: from + shift, to: to + shift};
    this.schedule();
  }

  timeAt(x) {
    const left = this.labelWidth();
    const width = this.canvas.clientWidth - left;
    return this.view.from + ((x - left) / width) * (this.view.to - this.view.from);
  }

  listen() {
    const canvas = this.canvas;
    canvas.addEventListener('wheel', (event) => {
      if (!this.data) return;
      event.preventDefault();
      const x = event.offsetX;
      if (x < this.labelWidth()) return;
      if (Math.abs(event.deltaX) > Math.abs(event.deltaY)) this.pan(event.deltaX / 500);
      else this.zoom(Math.exp(event.deltaY / 300), this.timeAt(x));
    }, {passive: false});
    canvas.addEventListener('mousedown', (event) => {
      this.drag = {x: event.offsetX, view: {...this.view}};
    });
    window.addEventListener('mouseup', () => { this.drag = null; });
    canvas.addEventListener('mousemove', (event) => {
      if (!this.data) return;
      if (this.drag && event.buttons) {
        const width = canvas.clientWidth - this.labelWidth();
        const {from, to} = this.drag.view;
        const shift = ((this.drag.x - event.offsetX) / width) * (to - from);
        const full = this.data.duration_us;
        const clamped = Math.max(-from, Math.min(shift, full - to));
        this.view = {from: from + clamped, to: to + clamped};
        this.card.hidden = true;
        this.schedule();
        return;
      }
      this.hover(event.offsetX, event.offsetY);
    });
    canvas.addEventListener('mouseleave', () => { this.card.hidden = true; });
    canvas.addEventListener('keydown', (event) => {
      if (!this.data) return;
      const middle = (this.view.from + this.view.to) / 2;
      const keys = {
        '+': () => this.zoom(0.5, middle), '=': () => this.zoom(0.5, middle), '-': () => this.zoom(2, middle),
        'ArrowLeft': () => this.pan(-0.2), 'ArrowRight': () => this.pan(0.2), '0': () => this.fit(),
      };
      if (keys[event.key]) {
        event.preventDefault();
        keys[event.key]();
      }
    });
  }

  /** The hover card of the rectangle under (X, Y), if any. */
  hover(x, y) {
    const item = this.laid.items.find((it) => it.row && y >= it.y && y < it.y + it.height);
    const left = this.labelWidth();
    if (!item || x < left) {
      this.card.hidden = true;
      return;
    }
    const {row} = item;
    const t = this.timeAt(x);
    const lane = row.kind === 'host' && y >= item.y + item.height / 2 ? 1 : 0;
    const perPx = (this.view.to - this.view.from) / (this.canvas.clientWidth - left);
    let i = hitRect(row, t, lane, perPx * 2);
    if (i < 0 && lane === 1) i = hitRect(row, t, 0, perPx * 2);
    if (i < 0) {
      this.card.hidden = true;
      return;
    }
    const name = this.data.names[row.name[i]];
    const lines = [
      h('strong', {text: row.count[i] > 1 ? `${row.count[i]} events, the longest: ${name}` : name}),
      h('div', {text: `${fmtUs(row.dur[i])} at +${fmtUs(row.start[i])} in the step`}),
      h('div', {class: 'muted', text: row.label}),
    ];
    if (row.corr[i] >= 0) lines.push(h('div', {class: 'muted', text: `correlation id ${row.corr[i]}`}));
    this.card.replaceChildren(...lines);
    this.card.hidden = false;
    const width = this.canvas.clientWidth;
    this.card.style.left = `${Math.max(0, Math.min(x + 12, width - 260))}px`;
    // Below the row, or above it where the canvas ends first.
    const below = item.y + item.height + 4;
    const fits = below + this.card.offsetHeight <= this.laid.height;
    this.card.style.top = `${fits ? below : Math.max(0, item.y - this.card.offsetHeight - 4)}px`;
  }

  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.draw();
    });
  }

  draw() {
    if (!this.data) return;
    const began = performance.now();
    const canvas = this.canvas;
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth;
    const height = this.laid.height;
    if (canvas.width !== Math.round(width * ratio) || canvas.height !== Math.round(height * ratio)) {
      canvas.width = Math.round(width * ratio);
      canvas.height = Math.round(height * ratio);
      canvas.style.height = `${height}px`;
    }
    const ctx = canvas.getContext('2d');
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const style = getComputedStyle(this.element);
    const bg = style.getPropertyValue('--tl-bg').trim() || '#fff';
    const fg = style.getPropertyValue('--tl-fg').trim() || '#212121';
    const grid = style.getPropertyValue('--tl-grid').trim() || '#e0e0e0';
    const stripe = style.getPropertyValue('--tl-stripe').trim() || '#f5f6f8';
    const markColour = style.getPropertyValue('--tl-mark').trim() || '#d50000';
    ctx.fillStyle = bg;
    ctx.fillRect(0, 0, width, height);
    const left = this.labelWidth();
    const plot = width - left;
    const {from, to} = this.view;
    const scale = plot / (to - from);
    const px = (t) => left + (t - from) * scale;

    // Axis and grid.
    ctx.font = '11px Roboto, "Segoe UI", Helvetica, Arial, sans-serif';
    ctx.textBaseline = 'middle';
    const step = tickStep(to - from, Math.max(2, Math.floor(plot / 110)));
    ctx.fillStyle = fg;
    ctx.strokeStyle = grid;
    ctx.lineWidth = 1;
    for (let t = Math.ceil(from / step) * step; t <= to; t += step) {
      const x = Math.round(px(t)) + 0.5;
      ctx.beginPath();
      ctx.moveTo(x, AXIS_H - 4);
      ctx.lineTo(x, height);
      ctx.stroke();
      const label = t === 0 ? '0' : fmtUs(t);
      if (x + 3 + ctx.measureText(label).width <= width) ctx.fillText(label, x + 3, AXIS_H / 2);
    }

    let drawn = 0;
    ctx.save();
    ctx.beginPath();
    ctx.rect(left, 0, plot, height);
    ctx.clip();
    this.laid.items.forEach((item, index) => {
      if (item.heading) return;
      if (index % 2) {
        ctx.fillStyle = stripe;
        ctx.fillRect(left, item.y, plot, ROW_H);
      }
      drawn += this.drawRow(ctx, item.row, item.y, px, from, to);
    });
    if (this.marked) drawn += this.drawMarks(ctx, px, from, to, height, markColour);
    ctx.restore();

    // Row labels and host headings, cut at the plot's edge.
    ctx.textBaseline = 'middle';
    for (const item of this.laid.items) {
      ctx.fillStyle = fg;
      ctx.save();
      ctx.beginPath();
      ctx.rect(0, item.y, left - 6, item.height);
      ctx.clip();
      ctx.font = `${item.heading ? '600 ' : ''}11px Roboto, "Segoe UI", Helvetica, Arial, sans-serif`;
      ctx.fillText(item.heading || item.row.label, 4, item.y + item.height / 2);
      ctx.restore();
    }
    if (this.marked) {
      ctx.fillStyle = markColour;
      ctx.fillText(`marked: ${this.marked.check}`, 4, AXIS_H + MARK_H / 2);
    }
    ctx.strokeStyle = grid;
    ctx.beginPath();
    ctx.moveTo(left - 0.5, AXIS_H);
    ctx.lineTo(left - 0.5, height);
    ctx.stroke();
    const spent = performance.now() - began;
    this.maxDrawMs = Math.max(this.maxDrawMs, spent);
    canvas.dataset.rects = String(drawn);
    canvas.dataset.drawMs = spent.toFixed(2);
    canvas.dataset.maxDrawMs = this.maxDrawMs.toFixed(2);
    canvas.dataset.from = String(from);
    canvas.dataset.to = String(to);
  }

  /** The marked finding: its own row of intervals under the axis, and a band over every row. */
  drawMarks(ctx, px, from, to, height, colour) {
    const {start, dur} = this.marked;
    let drawn = 0;
    ctx.fillStyle = colour;
    for (const [top, bandH, alpha] of [[AXIS_H + 2, MARK_H - 4, 1], [AXIS_H + MARK_H, height - AXIS_H - MARK_H, 0.16]]) {
      ctx.globalAlpha = alpha;
      let lastX = -1;
      for (let i = 0; i < start.length; i += 1) {
        const s = start[i];
        const e = s + dur[i];
        if (e < from || s > to) continue;
        const x0 = px(s);
        const x1 = Math.max(x0 + 1, px(e));
        if (Math.floor(x1) <= lastX) continue;
        ctx.fillRect(x0, top, x1 - x0, bandH);
        lastX = Math.floor(x1);
        drawn += alpha === 1 ? 1 : 0;
      }
    }
    ctx.globalAlpha = 1;
    return drawn;
  }

  /** One row's rectangles in view; several in one pixel column are drawn once. The count drawn. */
  drawRow(ctx, row, y, px, from, to) {
    const lanes = row.kind === 'host' ? 2 : 1;
    const laneH = (ROW_H - 4) / lanes;
    const lastX = [-1, -1];
    let colour = -1;
    let drawn = 0;
    for (let i = 0; i < row.start.length; i += 1) {
      const s = row.start[i];
      const e = s + row.dur[i];
      if (e < from || s > to) continue;
      const lane = lanes === 2 ? row.lane[i] : 0;
      const x0 = px(s);
      const x1 = Math.max(x0 + 1, px(e));
      if (Math.floor(x1) <= lastX[lane]) continue;
      if (row.group[i] !== colour) {
        colour = row.group[i];
        ctx.fillStyle = this.colours[colour];
      }
      ctx.fillRect(x0, y + 2 + lane * laneH, x1 - x0, laneH - (lanes === 2 ? 1 : 0));
      lastX[lane] = Math.floor(x1);
      drawn += 1;
    }
    return drawn;
  }
}

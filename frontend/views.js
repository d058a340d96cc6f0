// Drawing for the Advisor tab: DOM and SVG built node by node.
//
// Report data holds kernel and op names such as `foo<float>&` and whatever a
// capture file says, so text only ever goes in through textContent and
// attributes through setAttribute; nothing here assigns innerHTML.

import {profileUrl, safeDocUrl, traceRangeUrl} from './model.js';

const SVG_NS = 'http://www.w3.org/2000/svg';

/**
 * Severities a user should act on: the report's own definition (tb_gpuadvisor/checks/base.py
 * ACTIONABLE; tests/test_vocabulary.py keeps the two equal). Info findings are listed apart,
 * passed and not-applicable checks last.
 */
const ACTIONABLE = new Set(['critical', 'warning']);
const SEVERITY_LABEL = {
  critical: 'Critical', warning: 'Warning', info: 'Info', ok: 'OK', not_applicable: 'N/A',
};

/**
 * How the step chart names each group of the report's `breakdown.categories` (their `group`
 * field, tb_gpuadvisor/attribution/breakdown.py CATEGORIES). Each category has its own colour
 * class `c-<key>` (style.css: one hue per group, told apart within a group by lightness, so the
 * colours stay distinct for colour-blind readers); an unknown key falls back to its group's.
 */
const GROUP_LABEL = {
  compute: 'Compute', collective: 'Collectives', copy: 'Copies', not_traced: 'Not traced',
  input: 'Input', launch: 'Launch', host: 'Host', setup: 'One-time set-up',
};

/**
 * The stacked parts of a step: the report's categories ({key, label, group}; each step row holds
 * `<key>_ms`) that this run has (some step spends time in them), in the report's order.
 */
function stepComponents(breakdown) {
  const categories = breakdown && Array.isArray(breakdown.categories) ? breakdown.categories : [];
  const steps = (breakdown && breakdown.steps) || [];
  return categories
    .filter((category) => steps.some((step) => Number(step[`${category.key}_ms`]) > 0))
    .map((category) => ({
      key: `${category.key}_ms`, label: category.label || humanize(category.key), group: category.group,
      catchAll: /_other$/.test(category.key),
      cls: `c-${category.key} c-group-${category.group}`,
    }));
}

let idCounter = 0;
function nextId(prefix) {
  idCounter += 1;
  return `${prefix}-${idCounter}`;
}

function append(node, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    node.appendChild(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setProps(node, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'text') node.textContent = String(value);
    else if (key.startsWith('on') && typeof value === 'function') {
      node.addEventListener(key.slice(2), value);
    } else node.setAttribute(key, value === true ? '' : String(value));
  }
  return node;
}

/** An HTML element; strings among children become text nodes. */
export function h(tag, props, ...children) {
  return append(setProps(document.createElement(tag), props), children);
}

function svg(tag, props, ...children) {
  return append(setProps(document.createElementNS(SVG_NS, tag), props), children);
}

// -- formatting -------------------------------------------------------------------

function fmtMs(value) {
  if (typeof value !== 'number' || !Number.isFinite(value)) return '–';
  const abs = Math.abs(value);
  if (abs === 0) return '0 ms';
  if (abs >= 100) return `${value.toFixed(0)} ms`;
  if (abs >= 10) return `${value.toFixed(1)} ms`;
  if (abs >= 0.1) return `${value.toFixed(2)} ms`;
  return `${(value * 1000).toFixed(1)} µs`;
}

function fmtNumber(value) {
  if (typeof value !== 'number') return String(value);
  if (!Number.isFinite(value)) return '–';
  if (Number.isInteger(value)) return value.toLocaleString('en-US');
  const abs = Math.abs(value);
  return value.toFixed(abs >= 100 ? 0 : abs >= 10 ? 1 : abs >= 1 ? 2 : 3);
}

function fmtBytes(bytes) {
  if (typeof bytes !== 'number' || !bytes) return null;
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return `${value.toFixed(value >= 10 || unit === 0 ? 0 : 1)} ${units[unit]}`;
}

/** A metric value with the unit its name implies (`_percent`, `_ms`, `_us`, `_mb`). */
function fmtMetric(name, value) {
  if (typeof value !== 'number') {
    return value === null || value === undefined ? '–' : String(value);
  }
  const perStep = name.endsWith('_per_step');
  const base = perStep ? name.slice(0, -'_per_step'.length) : name;
  const suffix = perStep ? '/step' : '';
  if (base.endsWith('_percent')) return `${fmtNumber(value)} %`;
  if (base.endsWith('_ms')) return fmtMs(value) + suffix;
  if (base.endsWith('_us')) return `${fmtNumber(value)} µs${suffix}`;
  if (base.endsWith('_mb')) return `${fmtNumber(value)} MB${suffix}`;
  if (base.endsWith('_bytes')) return (fmtBytes(value) || '0 B') + suffix;
  return fmtNumber(value);
}

/** A metric change with its unit ("+2.1 pp", "-0.40 ms/step"); null for unitless numbers. */
function fmtDelta(name, value) {
  const sign = value > 0 ? '+' : '';
  if (name.endsWith('_percent')) return `${sign}${fmtNumber(value)} pp`;
  const text = fmtMetric(name, value);
  return text === fmtNumber(value) ? null : `${sign}${text}`;
}

function humanize(name) {
  const text = String(name).replace(/_/g, ' ');
  return text.charAt(0).toUpperCase() + text.slice(1);
}

// What marked the steps, in the framework's words (render.marker_words): a JAX loop's step
// annotations are its StepTraceAnnotation, not a TensorFlow custom loop's.
function markerWords(source, framework) {
  return source === 'custom_loop' && framework === 'jax' ? 'StepTraceAnnotation' : source;
}

function errorText(error) {
  if (typeof error === 'string') return error;
  if (error && typeof error === 'object') {
    const where = [error.host, error.file].filter(Boolean).join(' ');
    const message = error.message || error.error || JSON.stringify(error);
    return where ? `${where}: ${message}` : message;
  }
  return String(error);
}

function shortDevice(name) {
  return String(name || '').replace(/^\/device:/, '');
}

// -- states -----------------------------------------------------------------------

/** "Loading…" / "Analyzing… 40 %" with a progress bar; role=status for screen readers. */
export function statusView(text, progress) {
  const box = h('div', {class: 'state state-loading', role: 'status', 'aria-live': 'polite'});
  append(box, [h('span', {class: 'spinner', 'aria-hidden': 'true'}), h('span', {text})]);
  if (progress) {
    const fraction = typeof progress.fraction === 'number' ? progress.fraction : 0;
    const label = progress.stage === 'queued' ? 'Queued behind other analyses'
      : progress.stage === 'writing' ? (progress.message || 'A trace is still being written')
      : `Analyzing ${fmtBytes(progress.bytes) || 'capture'} (${Math.round(fraction * 100)} %)`;
    box.appendChild(h('progress', {max: '1', value: String(fraction), 'aria-label': label}));
    box.appendChild(h('span', {class: 'muted', text: label}));
  }
  return box;
}

export function errorView(title, message) {
  return h('div', {class: 'state state-error', role: 'alert'},
    h('strong', {text: title}), ' ', h('span', {text: message}));
}

/** Under the errors of a session nothing could be read from: why nothing else is shown. */
export function unreadNote() {
  return h('p', {class: 'muted', 'data-testid': 'unread-note',
    text: 'Nothing of this capture could be analysed, so there is no step time, device list or finding to show.'});
}

/** Above a comparison whose base is a session of another run (only ever picked by hand). */
export function otherRunNote(base) {
  return h('p', {class: 'note state state-warning', 'data-testid': 'base-note', role: 'note',
    text: `The base, ${base}, is from another run.`});
}

/** Compare on a run's first session: no earlier session of the same run to set it against. */
export function nothingToCompareView(run, session) {
  const name = run && run !== '.' ? `of ${run}` : 'in this logdir';
  return h('div', {class: 'state state-empty', 'data-testid': 'nothing-to-compare', role: 'note'},
    h('strong', {text: 'Nothing to compare yet.'}),
    h('p', {text: `${session} is the first session ${name}: profile it again after a change and Compare ` +
      'sets the new session against this one. To compare with another run, pick its session above.'}));
}

// How to capture, in each framework: the project's own helpers first, then the frameworks' own.
const CAPTURE_WAYS = [
  ['Keras', 'callbacks=[tb_gpuadvisor.keras.AdvisorCallback(log_dir=logdir)], or ' +
    'keras.callbacks.TensorBoard(logdir, profile_batch=(10, 15))'],
  ['JAX', 'with tb_gpuadvisor.jax.profile_steps(logdir) as advisor: ..., or jax.profiler.trace(logdir)'],
  ['PyTorch', 'torch.profiler.profile(schedule=torch.profiler.schedule(wait=1, warmup=3, active=5), ' +
    'on_trace_ready=torch.profiler.tensorboard_trace_handler(logdir)), with prof.step() after each step'],
  ['TensorFlow', 'tf.profiler.experimental.start(logdir) ... stop()'],
];

/** Nothing to show: MISSING (the route's message) when the logdir itself does not exist. */
export function emptyView(missing) {
  return h('div', {class: 'state state-empty', 'data-testid': missing ? 'missing-logdir' : 'empty-logdir'},
    h('strong', {text: missing ? 'The logdir does not exist (yet).' : 'No profile captures found.'}),
    h('p', {text: missing ?
      `${missing}. Check tensorboard --logdir, or start a profiled run that writes there, then press Refresh:` :
      'The Advisor reads <run>/plugins/profile/<session>/<host>.xplane.pb (TensorFlow, JAX) and ' +
      '<run>/<worker>.pt.trace.json[.gz] (PyTorch) under the logdir. Capture with:'}),
    h('ul', {class: 'capture-ways'}, CAPTURE_WAYS.map(([framework, how]) =>
      h('li', {}, h('strong', {text: `${framework}: `}), h('code', {text: how})))),
    missing ? null : h('p', {text: 'then press Refresh.'}));
}

// -- toolbar ----------------------------------------------------------------------

/** A labelled <select>; `options` are [value, label] pairs. */
export function selectField(label, options, selected, onChange, extra) {
  const id = nextId('sel');
  const select = h('select', Object.assign({id}, extra || {}));
  for (const [value, text] of options) {
    const option = h('option', {value}, text);
    if (value === selected) option.selected = true;
    select.appendChild(option);
  }
  select.addEventListener('change', () => onChange(select.value));
  return h('label', {class: 'field', for: id}, h('span', {text: label}), select);
}

// -- header -------------------------------------------------------------------------

export function headerView(report) {
  const steps = report.steps || {};
  const header = h('section', {class: 'summary', 'aria-label': 'Session summary'});
  const stepCard = h('div', {class: 'card card-step'},
    h('div', {class: 'card-label', text: 'Step time'}),
    h('div', {class: 'big', 'data-testid': 'step-mean', text: fmtMs(steps.mean_ms)}));
  const spread = [];
  if (typeof steps.std_ms === 'number') spread.push(`± ${fmtMs(steps.std_ms)}`);
  if (typeof steps.min_ms === 'number' && typeof steps.max_ms === 'number') {
    spread.push(`range ${fmtMs(steps.min_ms)} – ${fmtMs(steps.max_ms)}`);
  }
  if (spread.length) stepCard.appendChild(h('div', {class: 'muted', text: spread.join(' · ')}));
  header.appendChild(stepCard);

  header.appendChild(h('div', {class: 'card'},
    h('div', {class: 'card-label', text: 'Steps'}),
    h('div', {class: 'big', text: steps.count !== undefined ? String(steps.count) : '–'}),
    h('div', {class: 'muted', text: steps.source && steps.source !== 'window'
      ? `markers: ${markerWords(steps.source, report.framework)}`
      : (steps.source === 'window' ? 'no step markers: one window over the trace' : 'no step markers')})));

  header.appendChild(h('div', {class: 'card'},
    h('div', {class: 'card-label', text: 'Framework'}),
    h('div', {class: 'big', text: report.framework || 'unknown'}),
    h('div', {class: 'muted', text: (report.hosts || []).join(', ')})));

  const devices = report.devices || [];
  const deviceCard = h('div', {class: 'card card-devices'},
    h('div', {class: 'card-label', text: `Devices (${devices.length})`}));
  const list = h('ul', {class: 'chips'});
  for (const device of devices) {
    const facts = [shortDevice(device.name)];
    if (device.compute_capability) facts.push(`cc ${device.compute_capability}`);
    if (device.sm_count) facts.push(`${device.sm_count} SMs`);
    const memory = fmtBytes(device.memory_bytes);
    if (memory) facts.push(memory);
    list.appendChild(h('li', {class: `chip chip-${device.kind || 'device'}`, title: device.host || null},
      facts.join(' · ')));
  }
  // A CPU-only capture: the host is what the breakdown measures.
  if (!devices.length) list.appendChild(h('li', {class: 'chip', text: 'host CPU only (no accelerator)'}));
  deviceCard.appendChild(list);
  header.appendChild(deviceCard);
  return header;
}

export function firstFixView(report) {
  const first = report.first_fix;
  if (!first || !first.check) return null;
  const finding = (report.findings || []).find((item) => item.check === first.check);
  return h('p', {class: 'first-fix'},
    h('strong', {text: 'Fix first: '}),
    h('span', {text: first.why || (finding && finding.title) || humanize(first.check)}));
}

export function warningsView(report) {
  const warnings = report.warnings || [];
  if (!warnings.length) return null;
  return h('details', {class: 'state state-warning'},
    h('summary', {text: `Analysis notes (${warnings.length})`}),
    h('ul', {}, warnings.map((warning) => h('li', {text: errorText(warning)}))));
}

/** The report's errors; UNREAD: nothing of the capture could be read (not just part of it). */
export function errorsView(report, unread) {
  const errors = report.errors || [];
  if (!errors.length) return null;
  const box = h('div', {class: 'state state-error', role: 'alert', 'data-testid': 'report-errors'},
    h('strong', {text: unread ? 'This capture could not be read:' :
      errors.length === 1 ? 'This capture could not be fully read:' : `This capture has ${errors.length} problems:`}));
  box.appendChild(h('ul', {}, errors.map((error) => h('li', {text: errorText(error)}))));
  return box;
}

// -- charts ---------------------------------------------------------------------------

/**
 * A legend grouped as the breakdown groups its categories: a group with several parts is one
 * entry "Group: part, part"; a lone part is named by itself (by its group when it is the group's
 * catch-all "other ..." part, so a CPU run's compute reads "Compute").
 */
function legend(items) {
  const groups = [];
  for (const item of items) {
    const last = groups[groups.length - 1];
    if (last && item.group && last.group === item.group) last.items.push(item);
    else groups.push({group: item.group, items: [item]});
  }
  const entry = (item, label) => h('span', {class: 'legend-item'}, h('span', {class: `swatch ${item.cls}`}), label);
  return h('ul', {class: 'legend', 'aria-hidden': 'true'}, groups.map(({group, items: members}) => {
    const title = GROUP_LABEL[group] || humanize(group || '');
    if (members.length === 1) {
      const [item] = members;
      return h('li', {'data-group': group || ''}, entry(item, item.catchAll && group ? title : item.label));
    }
    return h('li', {class: 'legend-group', 'data-group': group},
      h('span', {class: 'legend-group-name', text: `${title}:`}), members.map((item) => entry(item, item.label)));
  }));
}

/**
 * An axis for values up to MAX: a round tick step (1, 2 or 5 times a power of ten) and the
 * smallest multiple of it at or above MAX, in at most MAX_TICKS steps, so 500 ms bars get
 * 0-500 by 100, never a 1000 ms axis or ticks at 62.5 and 187.5.
 */
export function niceScale(max, maxTicks = 5) {
  if (!(max > 0)) return {top: 1, step: 0.25};
  let magnitude = 10 ** Math.floor(Math.log10(max / maxTicks));
  for (;;) {
    for (const unit of [1, 2, 5]) {
      const step = unit * magnitude;
      const ticks = Math.ceil(max / step - 1e-9);
      if (ticks <= maxTicks) return {top: ticks * step, step};
    }
    magnitude *= 10;
  }
}

/** Per-step stacked bars of the step breakdown; one <g class="step-bar"> per step. */
export function stepChart(breakdown, wide) {
  const steps = (breakdown && breakdown.steps) || [];
  const figure = h('figure', {class: 'chart', 'data-testid': 'step-chart'});
  figure.appendChild(h('figcaption', {},
    h('strong', {text: 'Where each step goes'}),
    breakdown && breakdown.device ?
      h('span', {class: 'muted', text: ` (measured on ${shortDevice(breakdown.device)})`}) : null));
  if (!steps.length) {
    figure.appendChild(h('p', {class: 'muted', text: 'No steps were found in this capture.'}));
    return figure;
  }
  const components = stepComponents(breakdown);
  const total = (step) => components.reduce((sum, c) => sum + (Number(step[c.key]) || 0), 0);
  const {top, step: tick} = niceScale(Math.max(...steps.map((step) => Math.max(total(step), step.duration_ms || 0))));
  const width = wide ? 1160 : 760;
  const height = 170;
  const pad = {left: 56, right: 8, top: 10, bottom: 30};
  const plotW = width - pad.left - pad.right;
  const plotH = height - pad.top - pad.bottom;
  const slot = plotW / steps.length;
  const barW = Math.max(1, Math.min(48, slot * 0.75));
  const y = (ms) => pad.top + plotH - (ms / top) * plotH;

  const chart = svg('svg', {
    viewBox: `0 0 ${width} ${height}`, class: 'step-svg', role: 'img',
    'aria-label': `Stacked step-time breakdown for ${steps.length} steps`,
  });
  for (let i = 0; i * tick <= top * (1 + 1e-9); i += 1) {
    const value = Number((i * tick).toPrecision(12));    // 0.1 * 3 is 0.30000000000000004
    chart.appendChild(svg('line', {x1: pad.left, x2: width - pad.right, y1: y(value), y2: y(value), class: 'grid'}));
    chart.appendChild(svg('text', {x: pad.left - 6, y: y(value) + 4, class: 'axis', 'text-anchor': 'end'},
      fmtMs(value)));
  }
  const labelEvery = Math.max(1, Math.ceil(steps.length / 20));
  steps.forEach((step, index) => {
    const x = pad.left + index * slot + (slot - barW) / 2;
    const group = svg('g', {class: 'step-bar', 'data-step': step.step});
    const lines = [`Step ${step.step}: ${fmtMs(step.duration_ms)}`];
    let base = 0;
    for (const component of components) {
      const value = Number(step[component.key]) || 0;
      if (value <= 0) continue;
      group.appendChild(svg('rect', {
        x, width: barW, y: y(base + value), height: Math.max(0.5, y(base) - y(base + value)),
        class: `seg ${component.cls}`,
      }));
      base += value;
      lines.push(`${component.label}: ${fmtMs(value)}`);
    }
    group.appendChild(svg('rect', {x: pad.left + index * slot, width: slot, y: pad.top, height: plotH, class: 'hit'}));
    group.appendChild(svg('title', {}, lines.join('\n')));
    chart.appendChild(group);
    if (index % labelEvery === 0) {
      chart.appendChild(svg('text', {x: x + barW / 2, y: height - pad.bottom + 16, class: 'axis', 'text-anchor': 'middle'},
        String(step.step)));
    }
  });
  chart.appendChild(svg('text', {x: pad.left + plotW / 2, y: height - 2, class: 'axis', 'text-anchor': 'middle'}, 'step'));
  figure.appendChild(chart);
  figure.appendChild(legend(components));
  return figure;
}

/**
 * Per-GPU busy time per step, one horizontal bar per GPU; the straggler
 * (most non-collective work) is outlined and labelled. Null for < 2 GPUs.
 */
export function deviceChart(breakdown, stragglerName) {
  const devices = ((breakdown && breakdown.per_device) || [])
    .filter((device) => /GPU/i.test(device.device || ''));
  if (devices.length < 2) return null;
  const work = (device) => (Number(device.compute_ms) || 0) + (Number(device.copy_ms) || 0);
  const straggler = stragglerName ||
    devices.reduce((best, device) => (work(device) > work(best) ? device : best)).device;
  // The category groups a GPU runs itself (`<group>_ms` per device, in the step chart's group colours), then idle time.
  // Only the parts some GPU spends time in: the legend names no empty category.
  const parts = [
    ...['compute', 'copy', 'collective'].map((group) => ({key: `${group}_ms`, label: GROUP_LABEL[group], cls: `c-group-${group}`})),
    {key: 'idle_ms', label: 'Idle', cls: 'c-idle'},
  ].filter((part) => devices.some((device) => Number(device[part.key]) > 0));
  const total = (device) => parts.reduce((sum, p) => sum + (Number(device[p.key]) || 0), 0);
  const {top} = niceScale(Math.max(...devices.map(total)));
  const rowH = 22;
  const width = 420;
  const pad = {left: 120, right: 70, top: 6, bottom: 6};
  const height = pad.top + pad.bottom + rowH * devices.length;
  const plotW = width - pad.left - pad.right;
  const chart = svg('svg', {
    viewBox: `0 0 ${width} ${height}`, class: 'device-svg', role: 'img',
    'aria-label': `Per-GPU time per step; straggler ${shortDevice(straggler)}`,
  });
  devices.forEach((device, index) => {
    const yTop = pad.top + index * rowH;
    const isStraggler = device.device === straggler;
    const group = svg('g', {class: isStraggler ? 'gpu-bar straggler' : 'gpu-bar', 'data-device': device.device});
    const label = shortDevice(device.device) + (device.host ? ` (${device.host})` : '');
    group.appendChild(svg('text', {x: pad.left - 6, y: yTop + rowH / 2 + 4, class: 'axis', 'text-anchor': 'end'},
      label.length > 22 ? `${label.slice(0, 21)}…` : label));
    let x = pad.left;
    const lines = [`${label}${isStraggler ? ' — straggler' : ''}`];
    for (const part of parts) {
      const value = Number(device[part.key]) || 0;
      if (value <= 0) continue;
      const w = (value / top) * plotW;
      group.appendChild(svg('rect', {x, y: yTop + 3, width: Math.max(0.5, w), height: rowH - 6, class: `seg ${part.cls}`}));
      x += w;
      lines.push(`${part.label}: ${fmtMs(value)}`);
    }
    if (isStraggler) {
      group.appendChild(svg('rect', {x: pad.left - 2, y: yTop + 1, width: x - pad.left + 4, height: rowH - 2, class: 'outline'}));
      group.appendChild(svg('text', {x: x + 6, y: yTop + rowH / 2 + 4, class: 'axis straggler-label'}, 'straggler'));
    }
    group.appendChild(svg('title', {}, lines.join('\n')));
    chart.appendChild(group);
  });
  return h('figure', {class: 'chart chart-devices', 'data-testid': 'device-chart'},
    h('figcaption', {}, h('strong', {text: 'Per-GPU time per step'})),
    chart, legend(parts));
}

// -- findings ---------------------------------------------------------------------------

function severityBadge(severity) {
  return h('span', {class: `badge sev-${severity}`, 'data-severity': severity},
    SEVERITY_LABEL[severity] || String(severity));
}

async function copyText(text) {
  if (navigator.clipboard && window.isSecureContext) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch (_) {
      // Clipboard API refused (iframe permissions): fall back below.
    }
  }
  const area = h('textarea', {class: 'offscreen', readonly: true});
  area.value = text;
  document.body.appendChild(area);
  area.select();
  let copied = false;
  try {
    copied = document.execCommand('copy');
  } catch (_) {
    copied = false;
  }
  area.remove();
  return copied;
}

function codeBlock(code) {
  const button = h('button', {type: 'button', class: 'copy', 'aria-label': 'Copy code'}, 'Copy');
  button.addEventListener('click', async () => {
    const ok = await copyText(code);
    button.textContent = ok ? 'Copied' : 'Select & copy';
    setTimeout(() => { button.textContent = 'Copy'; }, 1600);
  });
  return h('div', {class: 'code'}, button, h('pre', {}, h('code', {text: code})));
}

function fixesView(fixes) {
  if (!fixes || !fixes.length) return null;
  return h('div', {class: 'fixes'},
    h('h4', {text: fixes.length === 1 ? 'Fix' : 'Fixes'}),
    h('ol', {}, fixes.map((fix) => {
      const doc = fix.doc ? safeDocUrl(fix.doc) : null;
      return h('li', {class: 'fix'},
        fix.text ? h('p', {text: fix.text}) : null,
        fix.code ? codeBlock(fix.code) : null,
        doc ? h('a', {href: doc, target: '_blank', rel: 'noopener noreferrer', class: 'doc'}, 'Read more ↗') :
          (fix.doc ? h('p', {class: 'muted', text: fix.doc}) : null));
    })));
}

function metricsView(metrics) {
  const entries = Object.entries(metrics || {});
  if (!entries.length) return null;
  return h('dl', {class: 'metrics'}, entries.map(([name, value]) => [
    h('dt', {text: humanize(name)}), h('dd', {text: fmtMetric(name, value)}),
  ]));
}

// XProf's input pipeline page: the report links it only where XProf finds the capture's step
// markers (report.XPROF_STEP_SOURCES); the trace viewer shows the stage's events either way.
const INPUT_PIPELINE_TOOL = 'input_pipeline_analyzer';
const TRACE_VIEWER = 'trace_viewer@';

function profileLink(context, host, tool) {
  const name = tool.replace(/@$/, '');
  if (context.profileTab === false) {
    // No Profile tab in this TensorBoard: a link would open "no dashboard by the name of profile".
    return h('span', {class: 'profile-missing muted', 'data-tool': name, 'data-testid': 'profile-missing',
      title: `The Profile tab is not installed: ${context.profileInstall}`},
    `${name.replace(/_/g, ' ')} (no Profile tab)`);
  }
  return h('a', {
    href: profileUrl({run: context.run, session: context.session, host, tool}),
    target: '_parent', class: 'profile-link', 'data-tool': name,
    title: `Open ${name} in the Profile tab` + (tool === TRACE_VIEWER ? ' (the whole trace)' : ''),
  }, `${name.replace(/_/g, ' ')} ↗`);
}

/** The evidence's time range (ms on the capture's clock), with a little margin either side; null when
 * the item or the report (an older one without time_origin_ms) does not give it. */
function viewRange(item, origin) {
  if (typeof item.start_ms !== 'number' || typeof origin !== 'number') return null;
  const end = typeof item.end_ms === 'number' ? item.end_ms : item.start_ms;
  const margin = Math.max(0.05 * (end - item.start_ms), 0.01);
  return {viewStart: origin + Math.max(0, item.start_ms - margin), viewEnd: origin + end + margin};
}

/** XProf's trace viewer on a page of its own, at the evidence's time range (the Profile tab cannot open one). */
function rangeLink(context, host, range) {
  const href = range && traceRangeUrl({run: context.run, session: context.session, host, ...range});
  if (!href) return null;
  return h('a', {
    href, target: '_blank', rel: 'noopener', class: 'range-link', 'data-tool': 'trace_viewer',
    title: 'Open XProf\'s trace viewer on its own page at this time range',
  }, 'at this time ↗');
}

function profileLinks(item, context, host) {
  if (item.tool !== INPUT_PIPELINE_TOOL && item.tool !== TRACE_VIEWER) return profileLink(context, host, item.tool);
  const range = context.profileTab === false ? null : rangeLink(context, host, viewRange(item, context.timeOriginMs));
  return h('div', {class: 'links'},
    profileLink(context, host, TRACE_VIEWER),
    range,
    item.tool === INPUT_PIPELINE_TOOL ? profileLink(context, host, item.tool) : null);
}

function inputPipelineNote(evidence) {
  if (!evidence.some((item) => item.tool === INPUT_PIPELINE_TOOL)) return null;
  return h('p', {class: 'muted small note', 'data-testid': 'input-pipeline-note',
    text: 'The trace viewer links show the tf.data stages too. In a logdir with several sessions ' +
      'XProf 2.24 leaves the input pipeline page\'s Hosts list blank: it still analyses the host ' +
      'the link names.'});
}

function rangeNote(table) {
  if (!table.querySelector('a.range-link')) return null;
  return h('p', {class: 'muted small note', 'data-testid': 'range-note',
    text: '"at this time" opens XProf\'s trace viewer on a page of its own at that time range; ' +
      'the Profile tab\'s trace viewer opens the whole trace (XProf 2.24 drops a range given to it).'});
}

function profileMissingNote(table, context) {
  if (!table.querySelector('.profile-missing')) return null;
  return h('p', {class: 'muted small note', 'data-testid': 'profile-missing-note',
    text: `The Profile tab these links open is not installed in this TensorBoard: ${context.profileInstall}.`});
}

function evidenceView(evidence, context) {
  if (!evidence || !evidence.length) return null;
  const rows = evidence.map((item) => {
    const host = item.host || context.host || (context.hosts || [])[0];
    const where = [item.device ? shortDevice(item.device) : null, item.host].filter(Boolean).join(' @ ');
    const timing = typeof item.start_ms === 'number' ?
      `${fmtMs(item.start_ms)}${typeof item.end_ms === 'number' ? ` – ${fmtMs(item.end_ms)}` : ''}` : '';
    const link = item.tool ? profileLinks(item, context, host) : null;
    const value = typeof item.value === 'number' ?
      (item.unit === 'ms' ? fmtMs(item.value) : `${fmtNumber(item.value)}${item.unit ? ` ${item.unit}` : ''}`) :
      (item.value === undefined ? '' : String(item.value));
    return h('tr', {},
      h('td', {class: 'kind', text: item.kind || ''}),
      h('td', {class: 'name'}, h('code', {text: item.name || ''}),
        item.detail ? h('div', {class: 'muted', text: item.detail}) : null),
      h('td', {class: 'num', text: value}),
      h('td', {text: [where, timing].filter(Boolean).join(' · ')}),
      h('td', {}, link));
  });
  const table = h('table', {},
    h('thead', {}, h('tr', {},
      ['Kind', 'Name', 'Value', 'Where / when', 'Profile'].map((title) => h('th', {scope: 'col', text: title})))),
    h('tbody', {}, rows));
  return h('div', {class: 'evidence'},
    h('h4', {text: 'Evidence'}),
    h('div', {class: 'table-wrap'}, table),
    rangeNote(table),
    profileMissingNote(table, context),
    inputPipelineNote(evidence));
}

/** "Confidence: low — reason; reason", when the finding says (an optional field). */
function confidenceView(finding) {
  if (!finding.confidence) return null;
  const reasons = finding.confidence_reasons || [];
  return h('p', {class: 'confidence-line', 'data-testid': 'confidence'},
    h('strong', {text: 'Confidence: '}), finding.confidence,
    reasons.length ? h('span', {class: 'muted', text: ` — ${reasons.join('; ')}`}) : null);
}

/** One finding: a button header (aria-expanded) and a collapsible body. */
function findingView(finding, context, expanded) {
  const bodyId = nextId('finding-body');
  const headId = nextId('finding-head');
  const saving = Number(finding.estimated_savings_ms_per_step) || 0;
  const stepMean = context.stepMeanMs;
  const savingText = saving > 0 ?
    `saves ≈ ${fmtMs(saving)}/step${stepMean ? ` (${Math.round((100 * saving) / stepMean)} %)` : ''}` : '';
  const button = h('button', {
    type: 'button', class: 'finding-toggle', id: headId,
    'aria-expanded': expanded ? 'true' : 'false', 'aria-controls': bodyId,
  },
  h('span', {class: 'chevron', 'aria-hidden': 'true'}),
  severityBadge(finding.severity),
  h('code', {class: 'check-id', text: finding.check}),
  h('span', {class: 'finding-title', text: finding.title || humanize(finding.check)}),
  finding.confidence && finding.confidence !== 'high' ?
    h('span', {class: `confidence conf-${finding.confidence}`, text: `${finding.confidence} confidence`}) : null,
  h('span', {class: 'saving', text: savingText}));
  const body = h('div', {class: 'finding-body', id: bodyId, role: 'region', 'aria-labelledby': headId},
    finding.summary ? h('p', {class: 'finding-summary', text: finding.summary}) : null,
    confidenceView(finding),
    metricsView(finding.metrics),
    evidenceView(finding.evidence, context),
    fixesView(finding.fixes));
  body.hidden = !expanded;
  button.addEventListener('click', () => {
    const open = button.getAttribute('aria-expanded') !== 'true';
    button.setAttribute('aria-expanded', open ? 'true' : 'false');
    body.hidden = !open;
  });
  return h('li', {class: `finding sev-border-${finding.severity}`, 'data-check': finding.check,
    'data-severity': finding.severity}, h('h3', {class: 'finding-head'}, button), body);
}

export function findingsView(report, context) {
  // The report's order is the ranking (report.rank_findings); the tab never re-ranks.
  const findings = report.findings || [];
  const actionable = findings.filter((f) => ACTIONABLE.has(f.severity));
  const info = findings.filter((f) => f.severity === 'info');
  const passed = findings.filter((f) => !ACTIONABLE.has(f.severity) && f.severity !== 'info');
  const section = h('section', {class: 'findings', 'aria-label': 'Findings'});
  section.appendChild(h('h2', {text: actionable.length ?
    `Findings (${actionable.length}), most valuable first` : 'Findings'}));
  if (!findings.length) {
    section.appendChild(h('p', {class: 'muted', text: 'No checks produced findings for this session.'}));
    return section;
  }
  if (!actionable.length) {
    const broken = (report.errors || []).length && !((report.steps || {}).count);
    // Without a GPU the GPU checks (precision, Tensor Cores, replicas, copies, launches) could not
    // look at all: "nothing to fix" would claim more than the capture shows.
    // (the titles say "No GPU ..." or "Fewer than two GPUs ...": every one of them is named).
    const gpuChecks = findings.filter((f) => f.severity === 'not_applicable' && /\bGPUs?\b/.test(f.title || ''));
    const cpuOnly = ((report.trust || {}).model_ran_on) === 'cpu_only' && gpuChecks.length;
    section.appendChild(broken ?
      h('p', {class: 'muted', text: 'No findings: the capture could not be analysed (see the errors above).'}) :
      cpuOnly ?
        h('p', {class: 'muted', 'data-testid': 'needs-gpu', text: 'Nothing to fix on the CPU. ' +
          `${gpuChecks.length} GPU checks (${gpuChecks.map((f) => f.check).join(', ')}) need a GPU capture: ` +
          'this one has no GPU, so they could not look.'}) :
        h('p', {class: 'good', text: 'Nothing to fix: no check found a problem worth acting on.'}));
  }
  section.appendChild(h('ol', {class: 'finding-list', 'data-testid': 'findings'},
    actionable.map((finding, index) => findingView(finding, context, index === 0))));
  if (info.length) {
    section.appendChild(h('details', {class: 'info-findings', 'data-testid': 'info-findings', open: ''},
      h('summary', {text: `For information (${info.length})`}),
      h('ol', {class: 'finding-list'}, info.map((finding) => findingView(finding, context, false)))));
  }
  if (passed.length) {
    section.appendChild(h('details', {class: 'passed'},
      h('summary', {text: `Passed or not applicable (${passed.length})`}),
      h('ol', {class: 'finding-list'}, passed.map((finding) => findingView(finding, context, false)))));
  }
  return section;
}

// -- compare ---------------------------------------------------------------------------------

export function compareView(result, labels) {
  const section = h('section', {class: 'compare', 'aria-label': 'Comparison', 'data-testid': 'compare'});
  const delta = Number(result.step_time_delta_ms);
  const percent = Number(result.step_time_delta_percent);
  const faster = delta < 0;
  const base = result.base || {};
  const next = result.new || {};
  const baseStep = base.step_ms;
  const newStep = next.step_ms;
  section.appendChild(h('div', {class: 'summary'},
    h('div', {class: 'card'}, h('div', {class: 'card-label', text: 'Base'}),
      h('div', {class: 'big', text: fmtMs(baseStep)}), h('div', {class: 'muted', text: labels.base})),
    h('div', {class: 'card'}, h('div', {class: 'card-label', text: 'This session'}),
      h('div', {class: 'big', text: fmtMs(newStep)}), h('div', {class: 'muted', text: labels.current})),
    h('div', {class: `card ${Number.isFinite(delta) ? (faster ? 'delta-good' : delta > 0 ? 'delta-bad' : '') : ''}`},
      h('div', {class: 'card-label', text: 'Step time change'}),
      h('div', {class: 'big', 'data-testid': 'step-delta', text: Number.isFinite(delta) ?
        `${delta > 0 ? '+' : ''}${fmtMs(delta)}` : '–'}),
      h('div', {class: 'muted', text: Number.isFinite(percent) ?
        `${percent > 0 ? '+' : ''}${percent.toFixed(1)} % ${faster ? '(faster)' : delta > 0 ? '(slower)' : ''}` : ''}),
      typeof result.noise_band === 'number' ? h('div', {class: 'muted small', 'data-testid': 'noise-band',
        text: result.step_status === 'unchanged' ? `within the noise band (±${fmtMs(result.noise_band)})` :
          `beyond the noise band (±${fmtMs(result.noise_band)})`}) : null)));
  // The comparison's order (compare.STATUSES: changes first), as given.
  const checks = result.checks || [];
  const unit = result.unit === 'ms/example' ? '/example' : '/step';
  const rows = checks.map((check) => {
    const metric = check.main_metric;
    const time = typeof check.base_ms === 'number' && typeof check.new_ms === 'number' ?
      `${fmtMs(check.base_ms)}${unit} → ${fmtMs(check.new_ms)}${unit}` : '';
    const share = metric && (check.base_value !== null || check.new_value !== null) ?
      `${humanize(metric)}: ${fmtMetric(metric, check.base_value)} → ${fmtMetric(metric, check.new_value)}` : '';
    const deltas = Object.entries(check.metric_deltas || {})
      .filter(([name, value]) => name !== metric && typeof value === 'number' && value !== 0)
      .map(([name, value]) => [name, fmtDelta(name, value)])
      .filter(([, text]) => text)
      .map(([name, text]) => `${humanize(name)} ${text}`);
    return h('tr', {'data-status': check.status, 'data-check': check.check},
      h('td', {}, h('span', {class: `badge status-${check.status}`, text: check.status})),
      h('td', {title: check.title || null}, h('div', {class: 'check-name', text: check.name || humanize(check.check)}),
        h('code', {class: 'check-id muted', text: check.check})),
      h('td', {}, check.base_severity ? severityBadge(check.base_severity) : '–'),
      h('td', {}, check.new_severity ? severityBadge(check.new_severity) : '–'),
      h('td', {}, time ? h('div', {class: 'time', text: time}) : null,
        share ? h('div', {class: time ? 'muted small' : '', text: share}) : null,
        deltas.length ? h('div', {class: 'muted small', text: deltas.join(' · ')}) : null,
        check.note ? h('div', {class: 'small compare-note', 'data-testid': 'compare-note', text: `Why ${check.status}: ${check.note}`}) : null));
  });
  section.appendChild(h('div', {class: 'table-wrap'}, h('table', {class: 'compare-table'},
    h('thead', {}, h('tr', {}, ['Change', 'Check', 'Base', 'This session', `Time ${unit}, share, other changes`]
      .map((title) => h('th', {scope: 'col', text: title})))),
    h('tbody', {}, rows.length ? rows : h('tr', {}, h('td', {colspan: '5', text: 'No checks to compare.'}))))));
  return section;
}

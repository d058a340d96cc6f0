// Data access for the Advisor tab: every request to the plugin's routes and
// every URL the tab builds lives here, so views.js only draws.
//
// TensorBoard loads this module from <root>/data/plugin/gpu_advisor/, so
// URLs resolved against import.meta.url reach our routes and the TensorBoard
// page itself under any --path_prefix.

const POLL_MS = 400;

/** Thrown for non-2xx answers; `status` is the HTTP code. */
class RequestError extends Error {
  constructor(message, status, body) {
    super(message);
    this.status = status;
    this.body = body || {};
  }
}

function routeUrl(route, params) {
  const url = new URL(`./${route}`, import.meta.url);
  for (const [key, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== '') {
      url.searchParams.set(key, value);
    }
  }
  return url;
}

async function getJson(url, signal) {
  const response = await fetch(url, {signal, headers: {Accept: 'application/json'}});
  let body = null;
  try {
    body = await response.json();
  } catch (_) {
    body = null;
  }
  if (!response.ok) {
    const message = body && body.error ? body.error : `HTTP ${response.status}`;
    throw new RequestError(message, response.status, body);
  }
  return {status: response.status, body};
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(resolve, ms);
    if (signal) {
      signal.addEventListener('abort', () => {
        clearTimeout(timer);
        reject(new DOMException('aborted', 'AbortError'));
      }, {once: true});
    }
  });
}

/**
 * GETs a report-like route until it is no longer 202 ("pending"), calling
 * onProgress with each progress object so the view can show it.
 */
async function poll(url, onProgress, signal) {
  for (;;) {
    const {status, body} = await getJson(url, signal);
    if (status !== 202) return body;
    if (onProgress) onProgress(body.progress || {});
    await sleep(POLL_MS, signal);
  }
}

/** [{run, session, hosts}] for every capture under the logdir. */
export async function listRuns(signal) {
  const {body} = await getJson(routeUrl('runs'), signal);
  return body;
}

/** Whether the Profile tab the evidence links open is installed ({profile_tab, profile_install});
 * an Advisor that cannot say is taken to have it (its links are drawn as before). */
export async function fetchInfo(signal) {
  try {
    const {body} = await getJson(routeUrl('info'), signal);
    return body || {profile_tab: true};
  } catch (_) {
    return {profile_tab: true};
  }
}

/** One session object (contract.md); `host` restricts it to one host. */
export function fetchReport({run, session, host}, onProgress, signal) {
  return poll(routeUrl('report', {run, session, host}), onProgress, signal);
}

/** One step of a session as the timeline draws it (stepview); STEP null: the representative step. */
export function fetchTimeline({run, session, step}, onProgress, signal) {
  return poll(routeUrl('timeline', {run, session, step}), onProgress, signal);
}

/** compare_sessions(base, new) for two sessions. */
export function fetchCompare({run, session, baseRun, baseSession}, onProgress, signal) {
  const url = routeUrl('compare', {
    run, session, base_run: baseRun, base_session: baseSession,
  });
  return poll(url, onProgress, signal);
}

/** TensorBoard's own page (the top window), under any --path_prefix. */
function tensorboardRoot() {
  return new URL('../../../', import.meta.url);
}

/** Milliseconds for a URL: enough digits for a microsecond, no float noise. */
function msParam(value) {
  return String(Math.round(value * 1000) / 1000);
}

/** XProf's name of a session: "<run>/<session>", or just "<session>" for a capture in the logdir root. */
function profileRun(run, session) {
  return run && run !== '.' ? `${run}/${session}` : session;
}

/**
 * Link into TensorBoard's Profile tab for one session and tool. It carries no time range:
 * XProf 2.24 rewrites the Profile tab's URL to run, tag and host(s) and opens the whole
 * trace, whatever range the link gives (see traceRangeUrl).
 */
export function profileUrl({run, session, host, tool}) {
  const query = [
    `run=${encodeURIComponent(profileRun(run, session))}`,
    `tool=${encodeURIComponent(tool || 'trace_viewer@')}`,
  ];
  if (host) query.push(`host=${encodeURIComponent(host)}`);
  return `${tensorboardRoot().href}?${query.join('&')}#profile`;
}

/**
 * XProf's trace viewer on its own page, opened at [viewStart, viewEnd]: the page the Profile tab
 * embeds (trace_viewer_index.html) reads view_start/view_end (ms, on the capture's clock) from
 * its own URL, and trace_data_url (a path from the server root) for the data. The times are
 * the report's plus its time_origin_ms. Null without a usable range.
 */
export function traceRangeUrl({run, session, host, viewStart, viewEnd}) {
  if (!(typeof viewStart === 'number' && typeof viewEnd === 'number' && viewEnd > viewStart)) return null;
  const root = tensorboardRoot();
  const data = new URLSearchParams({run: profileRun(run, session), tag: 'trace_viewer@'});
  if (host) {
    data.set('host', host);
    data.set('hosts', host);
  }
  const page = new URL('data/plugin/profile/trace_viewer_index.html', root);
  page.search = new URLSearchParams({
    is_streaming: 'true', is_oss: 'true', view_start: msParam(viewStart), view_end: msParam(viewEnd),
    trace_data_url: `${root.pathname}data/plugin/profile/data?${data}`,
  }).toString();
  return page.href;
}

// The Advisor's selection lives in the top page's query (advisor_run=...), next to
// TensorBoard's own "#gpu_advisor", so a view can be shared by its URL.
const STATE_KEYS = ['run', 'session', 'host', 'view', 'base_run', 'base_session'];
const STATE_PREFIX = 'advisor_';

function topWindow() {
  try {
    return window.top.location.href ? window.top : window;
  } catch (_) {
    return window;   // another origin embeds TensorBoard: keep the state in our own frame
  }
}

/** {run, session, host, view, base_run, base_session} from the page URL (missing keys are absent). */
export function readUrlState() {
  const params = new URL(topWindow().location.href).searchParams;
  const state = {};
  for (const key of STATE_KEYS) {
    const value = params.get(STATE_PREFIX + key);
    if (value !== null) state[key] = value;
  }
  return state;
}

/** Writes the selection into the page URL without a new history entry. */
export function writeUrlState(state) {
  const win = topWindow();
  const url = new URL(win.location.href);
  for (const key of STATE_KEYS) {
    const value = state[key];
    if (value) url.searchParams.set(STATE_PREFIX + key, value);
    else url.searchParams.delete(STATE_PREFIX + key);
  }
  if (url.href !== win.location.href) win.history.replaceState(win.history.state, '', url.href);
}

/** The URL if it is a web link, else null (never a javascript: URL). */
export function safeDocUrl(text) {
  try {
    const url = new URL(text);
    return url.protocol === 'https:' || url.protocol === 'http:' ? url.href : null;
  } catch (_) {
    return null;
  }
}

/** Seconds since 1970 from a session name like "2024_01_05_00_00_00" or "20221104-215722"; NaN otherwise. */
/**
 * The base to compare a session against: the previous session of the same run (by name, which
 * is its start time), or null when the run has none: another run's session is never a default
 * (the tab says there is nothing to compare yet, and the user may pick one).
 * `others` holds [run, session] pairs, the current session excluded.
 */
export function defaultBase(run, session, others) {
  const earlier = others.filter(([r, s]) => r === run && s < session).sort((a, b) => (a[1] < b[1] ? 1 : -1));
  return earlier.length ? earlier[0] : null;
}

/**
 * Why nothing of a session could be analysed (every host file failed, or a session-level error
 * left no steps), or null when something was: the same rule as the CLI's, so the tab shows the
 * error alone instead of an empty capture's header, chart and findings.
 */
export function unreadable(report) {
  const errors = report.errors || [];
  const failedHosts = new Set(errors.filter((e) => e.host).map((e) => e.host));
  const whole = errors.filter((e) => !e.host && !e.check);
  const hosts = report.hosts || [];
  const allFailed = hosts.length > 0 && hosts.every((host) => failedHosts.has(host));
  if (!allFailed && !(whole.length && !((report.steps || {}).count))) return null;
  return errors.filter((e) => !e.check).map((e) => (e.host ? `${e.host}: ${e.message}` : e.message)).join('; ');
}

/** Runs -> their sessions (newest first) -> hosts, from a /runs listing. */
export function groupRuns(items) {
  const runs = new Map();
  for (const item of items) {
    if (!runs.has(item.run)) runs.set(item.run, []);
    runs.get(item.run).push(item);
  }
  for (const sessions of runs.values()) {
    sessions.sort((a, b) => (a.session < b.session ? 1 : a.session > b.session ? -1 : 0));
  }
  return runs;
}

// Data access for the Advisor tab: every request to the plugin's routes and
// every URL the tab builds lives here, so views.js only draws.
//
// TensorBoard loads this module from <root>/data/plugin/gpu_advisor/, so
// URLs resolved against import.meta.url reach our routes and the TensorBoard
// page itself under any --path_prefix.

const POLL_MS = 400;

/** Thrown for non-2xx answers; `status` is the HTTP code. */
class RequestError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
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
    throw new RequestError(message, response.status);
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

/** One session object (contract.md); `host` restricts it to one host. */
export function fetchReport({run, session, host}, onProgress, signal) {
  return poll(routeUrl('report', {run, session, host}), onProgress, signal);
}

/** compare_sessions(base, new) for two sessions. */
export function fetchCompare({run, session, baseRun, baseSession}, onProgress, signal) {
  const url = routeUrl('compare', {
    run, session, base_run: baseRun, base_session: baseSession,
  });
  return poll(url, onProgress, signal);
}

/**
 * Link into TensorBoard's Profile tab for one session and tool. XProf names
 * a session "<run>/<session>" and a capture in the logdir root just
 * "<session>".
 */
export function profileUrl({run, session, host, tool}) {
  const root = new URL('../../../', import.meta.url);
  const profileRun = run && run !== '.' ? `${run}/${session}` : session;
  const query = [
    `run=${encodeURIComponent(profileRun)}`,
    `tool=${encodeURIComponent(tool || 'trace_viewer@')}`,
  ];
  if (host) query.push(`host=${encodeURIComponent(host)}`);
  return `${root.href}?${query.join('&')}#profile`;
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

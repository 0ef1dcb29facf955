// DOM and formatting helpers of the console: elements built from text (never HTML), the
// figures' formats, and the call disciplines the pages use (`newest`, `debounced`, `throttled`).

/** Longest text a log or output box keeps (characters); older text is dropped first. */
export const LOG_CAP = 256 * 1024;
/** A session's statuses once its container has started: its logs can be followed. */
export const HAS_LOGS = new Set(['RUNNING', 'RESTARTING', 'TERMINATING', 'PREEMPTED', 'TERMINATED']);
/** A session's statuses once it has ended. */
export const ENDED = new Set(['TERMINATED', 'CANCELLED']);

/** An element with properties (`class`, `dataset`, …) and children (nodes or text). */
export function el(tag, props = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (v === undefined || v === null) continue;
    if (k === 'class') e.className = v;
    else if (k === 'dataset') Object.assign(e.dataset, v);
    else if (k.startsWith('aria-')) e.setAttribute(k, v);
    else e[k] = v;
  }
  append(e, children);
  return e;
}

/** Appends children as nodes; anything else as text. */
export function append(e, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** An error box showing `e` (an ApiError's message and code, or any error's text). */
export function errorBox(e, id) {
  return el('div', { class: 'error', role: 'alert', id }, String(e));
}

export function shortId(id) {
  return id ? id.slice(0, 8) : '';
}

export function age(seconds) {
  if (!seconds) return '';
  const s = Math.max(0, Date.now() / 1000 - seconds);
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d`;
}

export function bytes(n) {
  const v = Number(n);
  if (!Number.isFinite(v)) return String(n);
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  let x = v;
  while (x >= 1024 && i < units.length - 1) {
    x /= 1024;
    i += 1;
  }
  return `${Number.isInteger(x) ? x : x.toFixed(1)} ${units[i]}`;
}

export function amount(slot, value) {
  return slot === 'mem' ? bytes(value) : String(value);
}

export function slotsText(slots) {
  return Object.entries(slots || {})
    .map(([k, v]) => `${k} ${amount(k, v)}`)
    .join(', ');
}

export function statusCell(tag, status, result) {
  return el(tag, { class: 'status', dataset: { status, result: result ?? '' } }, status);
}

export function reasonOf(s) {
  if (s.status === 'PENDING' && s.pending_reason) {
    return `${s.pending_reason.code}: ${s.pending_reason.message}`;
  }
  return s.status_reason ?? '';
}

/** `fn` made so that only its newest call's answer is used: `fn(stale)` is given `stale()`,
 * true once a newer call has started. Without it, an older read answered late (a session's
 * read waits up to 2 s for its agent's stages) would overwrite a newer one, and the page would
 * show a status the session has left, with no event to come to correct it. */
export function newest(fn) {
  let seq = 0;
  return () => {
    const mine = ++seq;
    return fn(() => mine !== seq);
  };
}

/** Calls `fn` once after `ms`, however often it is asked for meanwhile. */
export function debounced(fn, ms) {
  let timer = null;
  const call = () => {
    if (timer === null) {
      timer = setTimeout(() => {
        timer = null;
        fn();
      }, ms);
    }
  };
  call.cancel = () => {
    clearTimeout(timer);
    timer = null;
  };
  return call;
}


/** Calls `fn` at most once per `ms`: at once when the last call is older than that, else once
 * when `ms` has passed since it, however often it is asked for meanwhile. */
export function throttled(fn, ms) {
  let last = -Infinity;
  let timer = null;
  const call = () => {
    if (timer !== null) return;
    timer = setTimeout(() => {
      timer = null;
      last = performance.now();
      fn();
    }, Math.max(0, last + ms - performance.now()));
  };
  call.cancel = () => {
    clearTimeout(timer);
    timer = null;
  };
  return call;
}

/** A table of `headers` (texts) over `body` (its `tbody`), in a box that scrolls sideways on a
 * narrow screen rather than widening the page. */
export function table(headers, body) {
  return el(
    'div',
    { class: 'table-wrap' },
    el('table', {}, el('thead', {}, el('tr', {}, headers.map((h) => el('th', {}, h)))), body),
  );
}

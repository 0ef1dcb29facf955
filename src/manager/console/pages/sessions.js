// #/sessions: the caller's sessions (an admin's: everyone's), live from the event stream.
//
// Built to stay cheap with a fleet's worth of sessions: the list is read once and drawn once
// (`lib/rows.js` keeps a row per session); an event rewrites its session's row in place at the
// next animation frame (all events of a frame together); only what an event cannot tell (a
// session not yet listed, queue positions that moved) makes the list be read again, at most
// once a second; and it is read every 5 s anyway (ages, a waiting session's reason).

import { api } from '../lib/api.js';
import { age, el, ENDED, errorBox, newest, reasonOf, shortId, slotsText, table, throttled } from '../lib/dom.js';
import { keyedRows } from '../lib/rows.js';

/** Figures of the live list, for the console's bench (`benches/console.rs`): when the first
 * list was drawn (ms since the page's navigation), events applied, and each applied event's lag
 * from the manager's change to its row drawn (ms; the last 1,000). Bounded. */
const stats = { firstPaintMs: null, reads: 0, applied: 0, lags: [] };
window.kvConsoleStats = stats;

/** The least time between two reads of the whole list (ms). */
const REREAD_MS = 1000;
/** How often the list is read again without an event (ms): ages move, and a waiting
 * session's reason changes with each admission round without an event of its own. */
const REFRESH_MS = 5000;

const cells = (s) => [
  { text: shortId(s.session_id), class: 'mono', href: `#/sessions/${encodeURIComponent(s.session_id)}` },
  { text: s.image },
  { text: s.type ?? '' },
  { text: s.status, class: 'status', dataset: { status: s.status, result: s.result ?? '' } },
  { text: `${s.queue_position ? `#${s.queue_position} ` : ''}${reasonOf(s)}` },
  { text: String(s.priority ?? '') },
  { text: age(s.created_at) },
  { text: slotsText(s.resource_slots) },
];

export function sessionsPage(main, { role }) {
  const all = el('input', { type: 'checkbox', id: 'show-all' });
  const body = el('tbody', { id: 'sessions' });
  const status = el('div', { id: 'sessions-status' });
  const count = el('span', { id: 'sessions-count', class: 'note' });
  main.replaceChildren(
    el('h1', {}, role === 'admin' ? 'Sessions (every key)' : 'Your sessions'),
    el('p', {}, el('label', {}, all, ' include ended sessions'), ' ', count),
    status,
    table(['Session', 'Image', 'Type', 'Status', 'Queue / reason', 'Priority', 'Age', 'Slots'], body),
  );
  const rows = keyedRows(body, { key: (s) => s.session_id, cells, rowData: 'session', empty: 'No sessions.' });
  let shown = []; // the sessions listed, in order
  const byId = new Map();
  let gone = false;

  const draw = () => {
    rows.set(shown);
    count.textContent = `${shown.length} session${shown.length === 1 ? '' : 's'}`;
  };

  const load = newest(async (stale) => {
    try {
      const { sessions } = await api('GET', `/v1/sessions${all.checked ? '?all=true' : ''}`);
      if (gone || stale()) return;
      status.replaceChildren();
      shown = sessions;
      byId.clear();
      for (const s of sessions) byId.set(s.session_id, s);
      draw();
      stats.reads += 1;
      if (stats.firstPaintMs === null) {
        // The rows are in the document; the browser paints them in its next frame, which
        // ends before a task queued from that frame's animation callback runs.
        requestAnimationFrame(() =>
          setTimeout(() => {
            if (stats.firstPaintMs === null) stats.firstPaintMs = performance.now();
          }),
        );
      }
    } catch (e) {
      if (!gone && !stale()) status.replaceChildren(errorBox(e));
    }
  });

  // A read of the whole list, at most once per REREAD_MS.
  const reread = throttled(load, REREAD_MS);

  // Events wait for the next frame, newest per session.
  const queued = new Map();
  let frame = null;
  const flush = () => {
    frame = null;
    const now = Date.now();
    let removed = false;
    for (const ev of queued.values()) {
      const s = byId.get(ev.session_id);
      if (!s || s.kernel_id !== ev.kernel_id) {
        // A session this list does not show yet, or one kernel of a cluster session (the
        // session's status combines its kernels'): the list says.
        reread();
        continue;
      }
      const wasQueued = s.status === 'PENDING';
      s.status = ev.status;
      // A waiting session's reason and position are the list's (the event has the code only).
      if (ev.status !== 'PENDING') s.status_reason = ev.reason ?? null;
      if (ev.exit_code !== undefined) s.exit_code = ev.exit_code;
      if (ENDED.has(ev.status) && !all.checked) {
        byId.delete(s.session_id);
        removed = true;
      } else {
        rows.patch(s.session_id, s);
      }
      // Entering or leaving the queue moves every position behind it.
      if (wasQueued || ev.status === 'PENDING') reread();
      stats.applied += 1;
      if (typeof ev.time === 'number') {
        stats.lags.push(now - ev.time * 1000);
        if (stats.lags.length > 1000) stats.lags.shift();
      }
    }
    queued.clear();
    if (removed) {
      shown = shown.filter((s) => byId.has(s.session_id));
      draw();
    }
  };

  all.addEventListener('change', load);
  load();
  const refresh = setInterval(reread, REFRESH_MS);
  return {
    onEvent(ev) {
      if (ev.type !== 'session_status' || !ev.session_id) return;
      queued.set(ev.kernel_id ?? ev.session_id, ev);
      if (frame === null) frame = requestAnimationFrame(flush);
    },
    leave() {
      gone = true;
      clearInterval(refresh);
      reread.cancel();
      if (frame !== null) cancelAnimationFrame(frame);
    },
  };
}

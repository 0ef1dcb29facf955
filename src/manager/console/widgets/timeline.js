// A session page's status timeline.
import { authHeaders, refusal } from '../lib/api.js';
import { el, errorBox, shortId, statusCell } from '../lib/dom.js';
import { parseFrame } from '../lib/events.js';

/** Most entries the timeline keeps (the oldest go first). */
const CAP = 500;

/**
 * The session's status changes with their reasons: the manager's kept events of the session
 * (`GET /v1/events?session_id=…&type=session_status`, the history, not followed), then each
 * new one the page's event stream brings (`add`). Entries are keyed by event id, so one that
 * comes both ways is shown once, and kept in id order. A cluster session's entries name the
 * kernel (its host name) each is about.
 */
export function timelineBox() {
  const list = el('ol', { id: 'timeline', class: 'timeline' });
  const note = el('p', { id: 'timeline-note', class: 'note' });
  const section = el('section', {}, el('h2', {}, 'Status timeline'), note, list);
  const events = new Map(); // event id → event
  let hosts = new Map(); // kernel id → its cluster host name
  let cluster = false;
  let loaded = null; // the session id whose history was read

  const time = (t) => (t ? new Date(t * 1000).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z') : '');
  const render = () => {
    const ids = [...events.keys()].sort((a, b) => Number(a) - Number(b));
    while (ids.length > CAP) events.delete(ids.shift());
    list.replaceChildren(
      ...ids.map((id) => {
        const ev = events.get(id);
        const item = el(
          'li',
          { dataset: { event: id, status: ev.status ?? '' } },
          el('time', { class: 'mono', dateTime: ev.time ? new Date(ev.time * 1000).toISOString() : '' }, time(ev.time)),
          ' ',
        );
        if (cluster) item.append(el('span', { class: 'host mono' }, hosts.get(ev.kernel_id) ?? shortId(ev.kernel_id)), ' ');
        item.append(statusCell('span', ev.status ?? ''), ' ');
        item.append(el('span', { class: 'reason' }, ev.reason ?? ''));
        if (ev.exit_code !== undefined && ev.exit_code !== null) item.append(` (exit code ${ev.exit_code})`);
        return item;
      }),
    );
    note.textContent = ids.length ? '' : 'No status change kept for this session.';
  };

  const add = (ev) => {
    if (ev.type !== 'session_status' || ev.id === undefined) return;
    events.set(String(ev.id), ev);
    render();
  };

  return {
    section,
    add,
    /** Shows `session` (its kernels' host names); reads its kept events the first time. */
    async setSession(session) {
      cluster = (session.cluster_size ?? 1) > 1;
      hosts = new Map((session.kernels ?? []).map((k) => [k.kernel_id, k.cluster_hostname]));
      if (loaded === session.session_id) {
        render();
        return;
      }
      loaded = session.session_id;
      try {
        const q = new URLSearchParams({ session_id: session.session_id, type: 'session_status' });
        const r = await fetch(`/v1/events?${q}`, { headers: authHeaders(), cache: 'no-store' });
        if (!r.ok) throw await refusal(r);
        for (const frame of (await r.text()).split('\n\n')) {
          const ev = parseFrame(frame);
          if (ev) events.set(String(ev.id), ev);
        }
        render();
      } catch (e) {
        note.replaceChildren(errorBox(e, 'timeline-error'));
      }
    },
  };
}

// #/queue: the sessions waiting, in admission order (priority, then time queued), with why.
// Rows are kept by session (`lib/rows.js`); an event that touches the queue makes the list be
// read again, at most once a second, so a busy queue costs one read a second, not one an event.

import { api } from '../lib/api.js';
import { age, el, errorBox, newest, reasonOf, shortId, slotsText, table, throttled } from '../lib/dom.js';
import { keyedRows } from '../lib/rows.js';

/** The least time between two reads of the queue (ms). */
const REREAD_MS = 1000;

const cells = (s) => [
  { text: String(s.queue_position ?? '') },
  { text: shortId(s.session_id), class: 'mono', href: `#/sessions/${encodeURIComponent(s.session_id)}` },
  { text: s.access_key ?? '', class: 'mono' },
  { text: String(s.priority ?? '') },
  { text: reasonOf(s) },
  { text: age(s.queued_at ?? s.created_at) },
  { text: slotsText(s.resource_slots) },
];

export function queuePage(main) {
  const body = el('tbody', { id: 'queue' });
  const status = el('div');
  main.replaceChildren(
    el('h1', {}, 'Queue'),
    el('p', { class: 'note' }, 'Sessions waiting for room, in the order they will be admitted (priority, then time queued).'),
    status,
    table(['#', 'Session', 'Key', 'Priority', 'Reason', 'Waiting', 'Slots'], body),
  );
  const rows = keyedRows(body, { key: (s) => s.session_id, cells, rowData: 'session', empty: 'Nothing waits.' });
  let gone = false;
  const load = newest(async (stale) => {
    try {
      const { sessions } = await api('GET', '/v1/sessions');
      if (gone || stale()) return;
      status.replaceChildren();
      rows.set(
        sessions
          .filter((s) => s.status === 'PENDING')
          .sort((a, b) => (a.queue_position ?? 1e9) - (b.queue_position ?? 1e9)),
      );
    } catch (e) {
      if (!gone && !stale()) status.replaceChildren(errorBox(e));
    }
  });
  const reread = throttled(load, REREAD_MS);
  load();
  // Reasons change with each admission round without an event of their own.
  const refresh = setInterval(reread, 5000);
  return {
    onEvent(ev) {
      if (ev.type === 'session_status' || ev.type === 'agent_status') reread();
    },
    leave() {
      gone = true;
      clearInterval(refresh);
      reread.cancel();
    },
  };
}

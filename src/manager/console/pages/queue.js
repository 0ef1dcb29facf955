// #/queue: the sessions waiting, in admission order.
import { api } from '../lib/api.js';
import { age, debounced, el, errorBox, newest, reasonOf, shortId, slotsText } from '../lib/dom.js';

/** #/queue: the sessions waiting, in admission order, with why. */
export function queuePage(main) {
  const body = el('tbody', { id: 'queue' });
  const status = el('div');
  main.replaceChildren(
    el('h1', {}, 'Queue'),
    el('p', { class: 'note' }, 'Sessions waiting for room, in the order they will be admitted (priority, then time queued).'),
    status,
    el(
      'div',
      { class: 'table-wrap' },
      el(
        'table',
        {},
        el('thead', {}, el('tr', {}, ['#', 'Session', 'Key', 'Priority', 'Reason', 'Waiting', 'Slots'].map((h) => el('th', {}, h)))),
        body,
      ),
    ),
  );
  let gone = false;
  const load = newest(async (stale) => {
    try {
      const { sessions } = await api('GET', '/v1/sessions');
      if (gone || stale()) return;
      const queued = sessions
        .filter((s) => s.status === 'PENDING')
        .sort((a, b) => (a.queue_position ?? 1e9) - (b.queue_position ?? 1e9));
      status.replaceChildren();
      body.replaceChildren(
        ...queued.map((s) =>
          el(
            'tr',
            { dataset: { session: s.session_id } },
            el('td', {}, String(s.queue_position ?? '')),
            el('td', { class: 'mono' }, el('a', { href: `#/sessions/${encodeURIComponent(s.session_id)}` }, shortId(s.session_id))),
            el('td', { class: 'mono' }, s.access_key ?? ''),
            el('td', {}, String(s.priority ?? '')),
            el('td', {}, reasonOf(s)),
            el('td', {}, age(s.queued_at ?? s.created_at)),
            el('td', {}, slotsText(s.resource_slots)),
          ),
        ),
      );
      if (queued.length === 0) body.append(el('tr', {}, el('td', { colSpan: 7, class: 'note' }, 'Nothing waits.')));
    } catch (e) {
      if (!gone && !stale()) status.replaceChildren(errorBox(e));
    }
  });
  const reload = debounced(load, 250);
  load();
  return {
    onEvent(ev) {
      if (ev.type === 'session_status' || ev.type === 'agent_status') reload();
    },
    leave() {
      gone = true;
      reload.cancel();
    },
  };
}

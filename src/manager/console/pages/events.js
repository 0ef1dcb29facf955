// #/events: the manager's recent events (`GET /v1/events`, the history it keeps), then the live
// ones as the shell's event stream brings them; filtered by type and session in the page.
import { authHeaders, refusal } from '../lib/api.js';
import { el, errorBox, shortId, table } from '../lib/dom.js';
import { parseFrame } from '../lib/events.js';
import { keyedRows } from '../lib/rows.js';

/** The most events the page keeps (the oldest go first). */
export const EVENTS_CAP = 500;

const TYPES = ['session_status', 'agent_status', 'pull_progress', 'reclaim_warning', 'preemption', 'dropped'];

function timeText(t) {
  return t ? new Date(t * 1000).toLocaleTimeString() : '';
}

/** What an event says beyond its status: its reason, a pull's progress, a deadline, victims. */
function detail(ev) {
  const parts = [];
  if (ev.reason) parts.push(ev.reason);
  if (ev.exit_code !== undefined && ev.exit_code !== null) parts.push(`exit code ${ev.exit_code}`);
  if (ev.pull_progress) {
    const p = ev.pull_progress;
    parts.push(`layers ${p.layers_done}/${p.layers_total}`);
  }
  if (ev.deadline) parts.push(`at ${timeText(ev.deadline)}`);
  if (Array.isArray(ev.victims)) parts.push(`victims ${ev.victims.map(shortId).join(', ')}`);
  return parts.join('; ');
}

/** #/events: recent and live events, newest first. */
export function eventsPage(main) {
  const type = el(
    'select',
    { id: 'events-type', name: 'type' },
    el('option', { value: '' }, 'all types'),
    TYPES.map((t) => el('option', { value: t }, t)),
  );
  const session = el('input', {
    id: 'events-session',
    name: 'session',
    placeholder: 'session or kernel id, or its start',
    size: 36,
    spellcheck: false,
    autocomplete: 'off',
  });
  const count = el('span', { id: 'events-count', class: 'note' });
  const filters = el(
    'form',
    { id: 'events-filter', class: 'filters', role: 'search' },
    el('label', { htmlFor: 'events-type' }, 'Type '),
    type,
    el('label', { htmlFor: 'events-session' }, ' Session '),
    session,
    ' ',
    count,
  );
  const status = el('div', { id: 'events-status' });
  const body = el('tbody', { id: 'events' });
  main.replaceChildren(
    el('h1', {}, 'Events'),
    el('p', { class: 'note' }, `What the manager changed, newest first: the recent events it keeps, then live. The page keeps the last ${EVENTS_CAP}.`),
    filters,
    status,
    table(['Time', 'Type', 'Session', 'Agent', 'Status', 'Detail'], body),
  );
  const rows = keyedRows(body, {
    key: (ev) => String(ev.id),
    rowData: 'event',
    empty: 'No events.',
    cells: (ev) => [
      { text: timeText(ev.time), class: 'time' },
      { text: ev.type, class: 'type', dataset: { type: ev.type } },
      ev.session_id
        ? { text: shortId(ev.session_id), class: 'mono session', href: `#/sessions/${encodeURIComponent(ev.session_id)}` }
        : { text: '', class: 'mono session' },
      { text: ev.agent_id ?? '', class: 'mono agent' },
      { text: ev.status ?? '', class: 'status', dataset: { status: ev.status ?? '' } },
      { text: detail(ev), class: 'detail' },
    ],
  });

  let gone = false;
  let events = []; // oldest first, at most EVENTS_CAP
  let lastId = -1; // the newest id kept
  let early = []; // live events that came before the history answered
  let loaded = false;
  let frame = null;

  const matches = (ev) => {
    if (type.value && ev.type !== type.value) return false;
    const s = session.value.trim().toLowerCase();
    if (s && !(ev.session_id ?? '').startsWith(s) && !(ev.kernel_id ?? '').startsWith(s)) return false;
    return true;
  };
  const render = () => {
    frame = null;
    if (gone) return;
    const shown = events.filter(matches).reverse();
    rows.set(shown);
    count.textContent = `${shown.length} of ${events.length} kept`;
  };
  const schedule = () => {
    if (frame === null) frame = requestAnimationFrame(render);
  };
  const add = (ev) => {
    // Ids increase: one seen already (the history and the stream overlap) is not added twice.
    if (typeof ev.id !== 'number' || ev.id <= lastId) return;
    lastId = ev.id;
    events.push(ev);
    if (events.length > EVENTS_CAP) events = events.slice(events.length - EVENTS_CAP);
  };

  type.addEventListener('change', render);
  session.addEventListener('input', render);
  filters.addEventListener('submit', (ev) => ev.preventDefault());

  (async () => {
    try {
      const r = await fetch('/v1/events', { headers: authHeaders(), cache: 'no-store' });
      if (!r.ok) throw await refusal(r);
      const text = await r.text();
      if (gone) return;
      for (const f of text.split('\n\n')) {
        const ev = parseFrame(f);
        if (ev) add(ev);
      }
    } catch (e) {
      if (!gone) status.replaceChildren(errorBox(e, 'events-error'));
    }
    loaded = true;
    for (const ev of early) add(ev);
    early = [];
    render();
  })();

  return {
    onEvent(ev) {
      if (!loaded) {
        early.push(ev);
        if (early.length > EVENTS_CAP) early.shift();
        return;
      }
      add(ev);
      schedule();
    },
    leave() {
      gone = true;
      if (frame !== null) cancelAnimationFrame(frame);
    },
  };
}

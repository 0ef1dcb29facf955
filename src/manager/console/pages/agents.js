// #/agents: the fleet, for admin keys.
import { api } from '../lib/api.js';
import { age, amount, debounced, el, errorBox, newest, statusCell, table } from '../lib/dom.js';

/** The built-in slots; every other slot an agent has is an accelerator's (`cuda.device`,
 * `cuda.shares`, …), shown in the GPUs column. */
const BUILT_IN = new Set(['cpu', 'mem']);

/** Seconds as `1h 2m 3s` (at least one part). */
export function span(seconds) {
  let s = Math.max(0, Math.round(seconds));
  const h = Math.floor(s / 3600);
  s -= h * 3600;
  const m = Math.floor(s / 60);
  s -= m * 60;
  const parts = [];
  if (h) parts.push(`${h}h`);
  if (m) parts.push(`${m}m`);
  if (s || parts.length === 0) parts.push(`${s}s`);
  return parts.join(' ');
}

/** A slot's bar: used / total as a `<meter>`, its figures as text. */
function slotBar(k, used, total) {
  return el(
    'span',
    { class: 'slot', dataset: { slot: k } },
    el('meter', { min: 0, max: Number(total) || 1, value: Number(used) || 0, 'aria-label': `${k} used` }),
    ` ${k} ${amount(k, used)} / ${amount(k, total)}`,
  );
}

/** The drain's deadline as the page says it: how long is left (ticking) and the local time. */
function drainText(a, now) {
  if (!a.draining) return '';
  if (a.drain_deadline === null || a.drain_deadline === undefined) return 'no deadline';
  const left = a.drain_deadline - now;
  const at = new Date(a.drain_deadline * 1000).toLocaleTimeString();
  return left > 0 ? `deadline in ${span(left)} (${at})` : `deadline passed (${at})`;
}

/** #/agents: the fleet (admin keys; a user key is shown the API's 403). */
export function agentsPage(main) {
  const body = el('tbody', { id: 'agents' });
  const status = el('div', { id: 'agents-status' });
  const heads = ['Agent', 'Status', 'Heartbeat', 'Scheduling', 'Kernels', 'Images', 'Slots used / total', 'GPUs', 'Actions'];
  main.replaceChildren(
    el('h1', {}, 'Agents'),
    status,
    table(heads, body),
  );
  let gone = false;
  const rows = new Map(); // agent id -> row

  const act = async (agent, what, payload) => {
    try {
      await api('POST', `/v1/agents/${encodeURIComponent(agent)}/${what}`, payload);
      status.replaceChildren();
    } catch (e) {
      if (!gone) status.replaceChildren(errorBox(e, 'agents-action-error'));
    }
    load();
  };

  /** One agent's row, made once and updated in place (the drain's input keeps what is typed
   * while the page follows the fleet). */
  const makeRow = (id) => {
    const cells = {
      id: el('td', { class: 'mono' }),
      status: el('td'),
      heartbeat: el('td', { class: 'heartbeat' }),
      scheduling: el('span', { class: 'scheduling' }),
      drain: el('span', { class: 'drain-deadline' }),
      kernels: el('td', { class: 'kernels' }),
      images: el('td', { class: 'images' }),
      slots: el('td', { class: 'slots' }),
      gpus: el('td', { class: 'gpus' }),
    };
    const toggle = el('button', { type: 'button' });
    const seconds = el('input', {
      type: 'number',
      class: 'drain-after',
      step: 'any',
      value: '10',
      'aria-label': `drain deadline of ${id}`,
    });
    const unit = el(
      'select',
      { class: 'drain-unit', 'aria-label': 'unit of the deadline' },
      el('option', { value: '1' }, 's'),
      el('option', { value: '60' }, 'min'),
      el('option', { value: '0' }, 'none'),
    );
    const drain = el('button', { type: 'submit', class: 'drain' }, 'Drain');
    // Not validated by the browser: the API judges the deadline, and its refusal is shown.
    const drainForm = el('form', { class: 'drain-form', noValidate: true }, seconds, unit, drain);
    const tr = el(
      'tr',
      { dataset: { agent: id } },
      cells.id,
      cells.status,
      cells.heartbeat,
      el('td', { class: 'sched' }, cells.scheduling, ' ', cells.drain),
      cells.kernels,
      cells.images,
      cells.slots,
      cells.gpus,
      el('td', { class: 'actions' }, el('div', {}, toggle), drainForm),
    );
    const row = { tr, agent: null };
    toggle.addEventListener('click', () => {
      toggle.disabled = true;
      act(id, row.agent.schedulable ? 'cordon' : 'uncordon');
    });
    drainForm.addEventListener('submit', (ev) => {
      ev.preventDefault();
      const factor = Number(unit.value);
      let payload = {};
      if (factor > 0) {
        // A number is the API's to judge (0 or below: its 400, shown); no number is asked again.
        const n = Number(seconds.value);
        if (seconds.value.trim() === '' || !Number.isFinite(n)) {
          status.replaceChildren(errorBox('The deadline is a number of seconds or minutes.', 'agents-action-error'));
          seconds.setAttribute('aria-invalid', 'true');
          seconds.focus();
          return;
        }
        payload = { deadline: n * factor };
      }
      seconds.removeAttribute('aria-invalid');
      drain.disabled = true;
      act(id, 'drain', payload).finally(() => {
        drain.disabled = false;
      });
    });
    row.update = (a, now) => {
      row.agent = a;
      cells.id.replaceChildren(
        a.agent_id,
        el('div', { class: 'note' }, [a.region, a.version, a.addr].filter(Boolean).join(' · ')),
      );
      cells.status.replaceChildren(statusCell('span', a.status));
      tickRow(row, now);
      const scheduling = a.draining ? 'draining' : a.schedulable ? 'schedulable' : 'cordoned';
      cells.scheduling.textContent = scheduling;
      cells.scheduling.dataset.scheduling = scheduling;
      cells.kernels.textContent = String(a.kernels ?? '');
      cells.images.textContent = String(a.image_count ?? 0);
      const total = a.slots_total ?? {};
      const used = a.slots_used ?? {};
      const bars = (keys) => keys.map((k) => slotBar(k, used[k] ?? '0', total[k]));
      const keys = Object.keys(total);
      cells.slots.replaceChildren(...bars(keys.filter((k) => BUILT_IN.has(k))));
      const accel = keys.filter((k) => !BUILT_IN.has(k));
      cells.gpus.replaceChildren(...(accel.length ? bars(accel) : [el('span', { class: 'note' }, 'none')]));
      toggle.className = a.schedulable ? 'cordon' : 'uncordon';
      toggle.textContent = a.schedulable ? 'Cordon' : 'Uncordon';
      toggle.disabled = false;
      drain.textContent = a.draining ? 'Drain again' : 'Drain';
    };
    return row;
  };

  /** What changes with the clock alone: the heartbeat's age and the drain's countdown. */
  const tickRow = (row, now) => {
    const a = row.agent;
    const hb = a.last_heartbeat ? `${age(a.last_heartbeat) || '0s'} ago` : 'never';
    const cells = row.tr.querySelector('.heartbeat');
    if (cells.textContent !== hb) cells.textContent = hb;
    const drain = row.tr.querySelector('.drain-deadline');
    const text = drainText(a, now);
    if (drain.textContent !== text) drain.textContent = text;
  };

  const load = newest(async (stale) => {
    try {
      const { agents } = await api('GET', '/v1/agents');
      if (gone || stale()) return;
      const seen = new Set();
      const now = Date.now() / 1000;
      let cursor = body.firstChild;
      if (cursor && !cursor.dataset.agent) {
        cursor.remove(); // the "no agents" row
        cursor = body.firstChild;
      }
      for (const a of agents) {
        seen.add(a.agent_id);
        let row = rows.get(a.agent_id);
        if (!row) {
          row = makeRow(a.agent_id);
          rows.set(a.agent_id, row);
        }
        row.update(a, now);
        if (row.tr === cursor) cursor = cursor.nextSibling;
        else body.insertBefore(row.tr, cursor);
      }
      for (const [id, row] of rows) {
        if (!seen.has(id)) {
          row.tr.remove();
          rows.delete(id);
        }
      }
      if (agents.length === 0 && !body.firstChild) {
        body.append(el('tr', {}, el('td', { colSpan: heads.length, class: 'note' }, 'No agents.')));
      }
      const err = document.getElementById('agents-error');
      if (err) err.remove();
    } catch (e) {
      if (!gone && !stale()) status.replaceChildren(errorBox(e, 'agents-error'));
      // Not an admin key: asking again would only be refused again.
      if (e.status === 403) clearInterval(clock);
    }
  });
  const reload = debounced(load, 250);
  // Each second the ages and countdowns move on; every 5 s the fleet is read again (a heartbeat
  // is no event: without it the age shown would only grow).
  let ticks = 0;
  const clock = setInterval(() => {
    ticks += 1;
    if (ticks % 5 === 0) load();
    const now = Date.now() / 1000;
    for (const row of rows.values()) tickRow(row, now);
  }, 1000);
  load();
  return {
    onEvent(ev) {
      if (ev.type === 'agent_status' || ev.type === 'session_status') reload();
    },
    leave() {
      gone = true;
      reload.cancel();
      clearInterval(clock);
    },
  };
}

// #/agents: the fleet, for admin keys.
import { api } from '../lib/api.js';
import { amount, debounced, el, errorBox, newest, statusCell } from '../lib/dom.js';

/** #/agents: the fleet (admin keys; a user key is shown the API's 403). */
export function agentsPage(main) {
  const body = el('tbody', { id: 'agents' });
  const status = el('div', { id: 'agents-status' });
  main.replaceChildren(
    el('h1', {}, 'Agents'),
    status,
    el(
      'div',
      { class: 'table-wrap' },
      el(
        'table',
        {},
        el('thead', {}, el('tr', {}, ['Agent', 'Status', 'Scheduling', 'Kernels', 'Slots used / total', ''].map((h) => el('th', {}, h)))),
        body,
      ),
    ),
  );
  let gone = false;
  const act = async (agent, what) => {
    try {
      await api('POST', `/v1/agents/${encodeURIComponent(agent)}/${what}`);
    } catch (e) {
      status.replaceChildren(errorBox(e));
    }
    load();
  };
  const load = newest(async (stale) => {
    try {
      const { agents } = await api('GET', '/v1/agents');
      if (gone || stale()) return;
      status.replaceChildren();
      body.replaceChildren(
        ...agents.map((a) => {
          const scheduling = a.draining ? 'draining' : a.schedulable ? 'schedulable' : 'cordoned';
          const slots = Object.entries(a.slots_total ?? {}).map(([k, total]) => {
            const used = (a.slots_used ?? {})[k] ?? '0';
            return el(
              'span',
              { class: 'slot', dataset: { slot: k } },
              el('meter', { min: 0, max: Number(total) || 1, value: Number(used) || 0 }),
              ` ${k} ${amount(k, used)} / ${amount(k, total)}`,
            );
          });
          const button = a.schedulable
            ? el('button', { type: 'button', class: 'cordon' }, 'Cordon')
            : el('button', { type: 'button', class: 'uncordon' }, 'Uncordon');
          button.addEventListener('click', () => {
            button.disabled = true;
            act(a.agent_id, a.schedulable ? 'cordon' : 'uncordon');
          });
          return el(
            'tr',
            { dataset: { agent: a.agent_id } },
            el('td', { class: 'mono' }, a.agent_id),
            statusCell('td', a.status),
            el('td', { class: 'scheduling' }, scheduling),
            el('td', {}, String(a.kernels ?? '')),
            el('td', {}, slots),
            el('td', {}, button),
          );
        }),
      );
    } catch (e) {
      if (!gone && !stale()) status.replaceChildren(errorBox(e, 'agents-error'));
    }
  });
  const reload = debounced(load, 250);
  load();
  return {
    onEvent(ev) {
      if (ev.type === 'agent_status' || ev.type === 'session_status') reload();
    },
    leave() {
      gone = true;
      reload.cancel();
    },
  };
}

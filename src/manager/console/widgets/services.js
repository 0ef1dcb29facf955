// A session page's services.
import { api } from '../lib/api.js';
import { el, errorBox, table } from '../lib/dom.js';

/**
 * The session's services (`GET /v1/sessions/<id>/services`, its main kernel's service ports),
 * read while it is RUNNING: name, protocol, status and its `url` (a link, opened in a new tab
 * with `rel=noopener`, for an `http(s)` one only; a `tcp://` address is text), with Start
 * (`POST …/services/<name>`) and Stop (`DELETE`). A refusal (`service-failed` with its output)
 * is shown in the box.
 */
export function servicesBox(id) {
  const rows = el('tbody', { id: 'services' });
  const note = el('p', { id: 'services-note', class: 'note' });
  const errors = el('div', { id: 'services-errors' });
  const refresh = el('button', { type: 'button', id: 'services-refresh' }, 'Refresh');
  const section = el(
    'section',
    { hidden: true },
    el('h2', {}, 'Services'),
    el('p', {}, refresh),
    note,
    errors,
    table(['Name', 'Protocol', 'Status', 'Address', ''], rows),
  );
  let running = false;
  let busy = false; // a start or stop is under way: the list is read again after it
  const base = `/v1/sessions/${encodeURIComponent(id)}/services`;

  const link = (url) => {
    let u = null;
    try {
      u = new URL(url);
    } catch {
      // not a URL: shown as text
    }
    if (u && (u.protocol === 'http:' || u.protocol === 'https:')) {
      return el('a', { href: u.href, target: '_blank', rel: 'noopener noreferrer', class: 'service-link' }, url);
    }
    return el('span', { class: 'mono' }, url ?? '');
  };

  const act = async (method, name, button) => {
    busy = true;
    button.disabled = true;
    errors.replaceChildren();
    note.textContent = method === 'POST' ? `starting ${name}…` : `stopping ${name}…`;
    try {
      await api(method, `${base}/${encodeURIComponent(name)}`);
      note.textContent = '';
    } catch (e) {
      note.textContent = '';
      const box = errorBox(e, 'services-error');
      if (e.output) box.append(el('pre', { class: 'output' }, e.output));
      errors.replaceChildren(box);
    }
    busy = false;
    load();
  };

  const load = async () => {
    if (!running) return;
    try {
      const { services } = await api('GET', base);
      if (!running || busy) return;
      note.textContent = services.length ? '' : 'The session has no service ports.';
      rows.replaceChildren(
        ...services.map((s) => {
          const start = el('button', { type: 'button', class: 'service-start' }, 'Start');
          const stop = el('button', { type: 'button', class: 'service-stop' }, 'Stop');
          start.disabled = s.status === 'running';
          stop.disabled = s.status !== 'running';
          start.addEventListener('click', () => act('POST', s.name, start));
          stop.addEventListener('click', () => act('DELETE', s.name, stop));
          return el(
            'tr',
            { dataset: { service: s.name } },
            el('td', {}, s.name),
            el('td', {}, s.protocol ?? ''),
            el('td', { class: 'service-status', dataset: { status: s.status ?? '' } }, s.status ?? ''),
            el('td', {}, link(s.url)),
            el('td', {}, start, ' ', stop),
          );
        }),
      );
    } catch (e) {
      if (!running) return;
      errors.replaceChildren(errorBox(e, 'services-error'));
    }
  };

  refresh.addEventListener('click', () => load());
  return {
    section,
    /** Shown (and read) while the session is RUNNING. */
    setRunning(on) {
      section.hidden = !on;
      if (on && !running) {
        running = true;
        load();
      } else if (!on) {
        running = false;
        rows.replaceChildren();
      }
    },
    leave() {
      running = false;
    },
  };
}

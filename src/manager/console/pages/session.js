// #/sessions/<id>: one session.
import { api, ApiError, authHeaders, refusal } from '../lib/api.js';
import { age, debounced, el, ENDED, errorBox, HAS_LOGS, LOG_CAP, newest, reasonOf, slotsText, statusCell, table } from '../lib/dom.js';
import { filesBox } from '../widgets/files.js';
import { runBox } from '../widgets/run.js';
import { servicesBox } from '../widgets/services.js';
import { terminalBox } from '../widgets/terminal.js';
import { timelineBox } from '../widgets/timeline.js';

/** #/sessions/<id>: one session, its kernels, status timeline, services, files, run box,
 * terminal and logs, live. A cluster session has a kernel selector: the run box, the terminal,
 * the files and the logs are those of the kernel it names (the API's `kernel` selector, its
 * host name). */
export function sessionPage(main, ctx, id) {
  const head = el('div', { id: 'session' });
  const kernels = el('tbody', { id: 'kernels' });
  const logs = el('pre', { id: 'logs', tabIndex: 0 });
  const logNote = el('p', { id: 'logs-note', class: 'note' });
  const actions = el('p');
  const pick = el('select', { id: 'kernel-select' });
  const pickRow = el('p', { id: 'kernel-pick', hidden: true }, el('label', { htmlFor: 'kernel-select' }, 'Kernel for the run box, terminal, files and logs '), pick);
  // The selected kernel: null for a session of one kernel (the routes' default, its main one).
  const kernel = () => (pickRow.hidden || !pick.value ? null : pick.value);
  const repl = runBox(id, kernel);
  const term = terminalBox(id, kernel);
  const timeline = timelineBox();
  const services = servicesBox(id);
  const files = filesBox(id, kernel);
  pick.addEventListener('change', () => {
    files.kernelChanged();
    // The logs are the chosen kernel's: followed again from it.
    if (follow) follow.abort();
    follow = null;
    failedFollows = 0;
    if (session && HAS_LOGS.has(session.status)) followLogs();
  });
  const details = el('div', { hidden: true });
  main.replaceChildren(el('h1', {}, 'Session ', el('span', { class: 'mono' }, id)), head, details);
  details.replaceChildren(
    actions,
    el('h2', {}, 'Kernels'),
    table(['Host', 'Role', 'Agent', 'Status', 'Reason', 'Exit code'], kernels),
    timeline.section,
    pickRow,
    repl.section,
    term.section,
    services.section,
    files.section,
    el('h2', {}, 'Logs'),
    logNote,
    logs,
  );
  let gone = false;
  let session = null;
  let follow = null; // the logs' AbortController while following
  let logLength = 0;
  let failedFollows = 0; // follows retried (after the session ended, or cut off)

  const appendLog = (text) => {
    const atEnd = logs.scrollTop + logs.clientHeight >= logs.scrollHeight - 4;
    logs.append(document.createTextNode(text));
    logLength += text.length;
    while (logLength > LOG_CAP && logs.firstChild) {
      logLength -= logs.firstChild.textContent.length;
      logs.firstChild.remove();
    }
    if (atEnd) logs.scrollTop = logs.scrollHeight;
  };

  // The logs' query: the chosen kernel's of a cluster session.
  const logQuery = (extra = {}) => {
    const q = new URLSearchParams(extra);
    if (kernel()) q.set('kernel', kernel());
    return q;
  };

  const followLogs = async () => {
    if (follow || gone) return;
    const ctl = new AbortController();
    follow = ctl;
    logs.replaceChildren();
    logLength = 0;
    logNote.textContent = 'following…';
    try {
      const r = await fetch(`/v1/sessions/${encodeURIComponent(id)}/logs?${logQuery({ follow: 'true' })}`, {
        headers: authHeaders(),
        signal: ctl.signal,
        cache: 'no-store',
      });
      if (!r.ok) throw await refusal(r);
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        appendLog(value);
      }
      // A follow that attached as the kernel ended may close before its output came (a short
      // batch job): the kept logs are read once more, a few times at most, until they show.
      for (let tries = 0; logLength === 0 && tries < 5 && !gone; tries += 1) {
        const kept = await fetch(`/v1/sessions/${encodeURIComponent(id)}/logs?${logQuery()}`, {
          headers: authHeaders(),
          signal: ctl.signal,
          cache: 'no-store',
        });
        if (kept.ok) appendLog(await kept.text());
        if (logLength === 0) await new Promise((done) => setTimeout(done, 1000));
      }
      logNote.textContent = 'the kernel has ended: these are its last logs';
    } catch (e) {
      if (ctl.signal.aborted) return;
      logNote.textContent = String(e);
      // Tried again on the session's next change (its logs may exist once it runs), and, for
      // a session that has ended (no change is to come) or a follow cut off without an answer
      // (a network change), a few times a second apart.
      follow = null;
      const cut = !(e instanceof ApiError);
      if (session && (ENDED.has(session.status) || cut) && failedFollows < 5) {
        failedFollows += 1;
        setTimeout(followLogs, 1000);
      }
      return;
    }
  };

  const render = (s) => {
    const rows = [
      ['Status', statusCell('span', s.status, s.result)],
      ['Reason', reasonOf(s)],
      ['Queue position', s.queue_position ?? ''],
      ['Key', s.access_key],
      ['Image', s.image],
      ['Type', s.type],
      ['Command', s.command ?? ''],
      ['Priority', s.priority],
      ['Slots', slotsText(s.resource_slots)],
      ['Cluster', `${s.cluster_size} (${s.cluster_mode ?? 'single-node'})`],
      ['Created', s.created_at ? `${new Date(s.created_at * 1000).toISOString()} (${age(s.created_at)} ago)` : ''],
      ['Result', s.result ?? ''],
      ['Exit code', s.exit_code ?? ''],
    ];
    const dl = el('dl');
    for (const [k, v] of rows) {
      const dd = el('dd', {}, v);
      dd.id = `session-${k.toLowerCase().replace(/ /g, '-')}`;
      dl.append(el('dt', {}, k), dd);
    }
    head.replaceChildren(dl);
    kernels.replaceChildren(
      ...(s.kernels ?? []).map((k) =>
        el(
          'tr',
          { dataset: { kernel: k.kernel_id } },
          el('td', {}, k.cluster_hostname),
          el('td', {}, k.cluster_role),
          el('td', {}, k.agent_id || '(not placed)'),
          statusCell('td', k.status),
          el('td', {}, k.status_reason ?? ''),
          el('td', {}, k.exit_code ?? ''),
        ),
      ),
    );
    actions.replaceChildren();
    if (!ENDED.has(s.status)) {
      const stop = el('button', { type: 'button', id: 'terminate' }, 'Terminate');
      stop.addEventListener('click', async () => {
        stop.disabled = true;
        try {
          await api('DELETE', `/v1/sessions/${encodeURIComponent(id)}`);
        } catch (e) {
          actions.append(errorBox(e));
        }
        load();
      });
      actions.append(stop);
    }
    // The kernel selector of a cluster session: its kernels by host name, the choice kept.
    const hostsNow = (s.kernels ?? []).map((k) => k.cluster_hostname);
    pickRow.hidden = (s.cluster_size ?? 1) <= 1 || hostsNow.length <= 1;
    if ([...pick.options].map((o) => o.value).join(' ') !== hostsNow.join(' ')) {
      const was = pick.value;
      pick.replaceChildren(
        ...(s.kernels ?? []).map((k) => el('option', { value: k.cluster_hostname }, `${k.cluster_hostname} (${k.cluster_role})`)),
      );
      if (hostsNow.includes(was)) pick.value = was;
      else if (!pickRow.hidden) files.kernelChanged();
    }
    timeline.setSession(s);
    // Code runs, services and files are read in a RUNNING session only.
    const running = s.status === 'RUNNING';
    repl.section.hidden = !running;
    term.section.hidden = !running;
    services.setRunning(running);
    files.setRunning(running);
    repl.setPath(s.exec_path);
    // Logs once its container has started (before, the agent has none to follow).
    if (HAS_LOGS.has(s.status)) followLogs();
    else if (!follow) logNote.textContent = `no logs yet: the session is ${s.status}`;
  };

  const load = newest(async (stale) => {
    try {
      const s = await api('GET', `/v1/sessions/${encodeURIComponent(id)}`);
      if (gone || stale()) return;
      session = s;
      render(s);
      details.hidden = false;
    } catch (e) {
      if (gone || stale()) return;
      // Refused (another key's session is a 404, as a missing one): the API's word only.
      head.replaceChildren(errorBox(e, 'session-error'));
      details.hidden = true;
    }
  });
  const reload = debounced(load, 150);
  load();
  return {
    onEvent(ev) {
      if (ev.type !== 'session_status') return;
      // Before the first answer, any change may be this session's (the timeline's history,
      // read after it, has those that were).
      if (session && ev.session_id === session.session_id) timeline.add(ev);
      if (!session || ev.session_id === session.session_id) reload();
    },
    leave() {
      gone = true;
      reload.cancel();
      if (follow) follow.abort();
      repl.leave();
      term.leave();
      services.leave();
      files.leave();
    },
  };
}

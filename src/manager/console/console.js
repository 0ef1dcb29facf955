// kernelvisor's web console: one module, no framework. Every call goes to the manager's API
// with the signed-in key's secret as `Authorization: Bearer …` (never in a URL, a cookie or a
// log); what the API answers is written with `textContent` / text nodes only, never as HTML.
// Pages are hash routes: #/sessions, #/sessions/<id>, #/new, #/queue, #/agents.

const SECRET = 'kernelvisor.secret';
/** Longest log text a session page keeps (characters); older text is dropped first. */
const LOG_CAP = 256 * 1024;
/** Longest unfinished event frame the stream reader holds (characters). */
const FRAME_CAP = 64 * 1024;
/** A session's statuses once its container has started: its logs can be followed. */
const HAS_LOGS = new Set(['RUNNING', 'RESTARTING', 'TERMINATING', 'PREEMPTED', 'TERMINATED']);
/** A session's statuses once it has ended. */
const ENDED = new Set(['TERMINATED', 'CANCELLED']);

const main = document.getElementById('main');
let role = null; // 'admin' | 'user' once signed in
let page = null; // the page shown: {onEvent(ev), leave()}
let stream = null; // the event stream's AbortController

/** An element with properties (`class`, `dataset`, …) and children (nodes or text). */
function el(tag, props = {}, ...children) {
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
function append(e, children) {
  for (const c of children.flat()) {
    if (c === undefined || c === null) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
}

/** An API refusal: its HTTP status, the API's error code and message. */
class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  toString() {
    return `${this.message} (${this.status} ${this.code})`;
  }
}

function secret() {
  return sessionStorage.getItem(SECRET);
}

function authHeaders(extra = {}) {
  return { Authorization: `Bearer ${secret()}`, ...extra };
}

/** Raises the API's error of a refused answer `r`. */
async function refusal(r) {
  const text = await r.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not the API's JSON (a proxy's page): its text is the message
  }
  const code = body?.error?.code ?? `http-${r.status}`;
  const message = body?.error?.message ?? (text.slice(0, 500) || r.statusText);
  if (r.status === 401) signOut(message);
  return new ApiError(r.status, code, message);
}

/** A JSON call of the API; raises ApiError when refused. */
async function api(method, path, body) {
  const headers = authHeaders(body === undefined ? {} : { 'Content-Type': 'application/json' });
  const r = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: 'no-store',
  });
  if (!r.ok) throw await refusal(r);
  return r.status === 204 ? null : r.json();
}

/** An error box showing `e` (an ApiError's message and code, or any error's text). */
function errorBox(e, id) {
  return el('div', { class: 'error', role: 'alert', id }, String(e));
}

function signOut(why) {
  sessionStorage.removeItem(SECRET);
  role = null;
  stopEvents();
  setLive(false);
  document.getElementById('nav').hidden = true;
  showSignIn(why);
}

// ---- sign-in --------------------------------------------------------------------------------

function showSignIn(why) {
  leavePage();
  const input = el('input', {
    type: 'password',
    id: 'secret',
    name: 'secret',
    autocomplete: 'off',
    required: true,
    spellcheck: false,
  });
  const form = el(
    'form',
    { id: 'sign-in', class: 'grid' },
    el('label', { htmlFor: 'secret' }, 'Secret key'),
    input,
    el('div', { class: 'actions' }, el('button', { type: 'submit' }, 'Sign in')),
  );
  const note = el(
    'p',
    { class: 'note' },
    'The secret key of an access key (kvs_…). It stays in this tab only (sessionStorage) and is ',
    'sent to this manager as a bearer token.',
  );
  main.replaceChildren(el('h1', {}, 'Sign in'), why ? errorBox(why, 'sign-in-error') : '', note, form);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const value = input.value.trim();
    input.value = '';
    sessionStorage.setItem(SECRET, value);
    try {
      await signedIn();
    } catch (e) {
      sessionStorage.removeItem(SECRET);
      showSignIn(e);
    }
  });
  input.focus();
}

/** Learns the key's role (`GET /v1/agents`: 200 for an admin key, 403 for a user key; 401 a
 * bad secret), then shows the page the URL names. */
async function signedIn() {
  const r = await fetch('/v1/agents', { headers: authHeaders(), cache: 'no-store' });
  if (r.status === 403) role = 'user';
  else if (r.ok) role = 'admin';
  else throw await refusal(r);
  document.getElementById('nav').hidden = false;
  document.getElementById('nav-agents').hidden = role !== 'admin';
  document.getElementById('role').textContent = `${role} key`;
  startEvents();
  route();
}

// ---- the event stream -----------------------------------------------------------------------

function setLive(on) {
  const live = document.getElementById('live');
  live.textContent = on ? '● live' : '○ offline';
  live.classList.toggle('on', on);
}

function stopEvents() {
  if (stream) stream.abort();
  stream = null;
}

/** Follows `GET /v1/events` with fetch (an EventSource cannot send the bearer header), parsing
 * its server-sent events, and hands each event to the page shown; reconnects after a pause,
 * resuming after the last event seen. */
function startEvents() {
  stopEvents();
  const ctl = new AbortController();
  stream = ctl;
  const types = role === 'admin' ? 'session_status,agent_status' : 'session_status';
  let lastId = null;
  const run = async () => {
    while (!ctl.signal.aborted) {
      try {
        const headers = authHeaders(lastId ? { 'Last-Event-ID': lastId } : {});
        const r = await fetch(`/v1/events?follow=true&history=false&type=${types}`, {
          headers,
          signal: ctl.signal,
          cache: 'no-store',
        });
        if (!r.ok) throw await refusal(r);
        setLive(true);
        const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
        let buf = '';
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += value;
          let end;
          while ((end = buf.indexOf('\n\n')) >= 0) {
            const frame = buf.slice(0, end);
            buf = buf.slice(end + 2);
            const ev = parseFrame(frame);
            if (ev) {
              if (ev.id !== undefined) lastId = String(ev.id);
              if (page && page.onEvent) page.onEvent(ev);
            }
          }
          if (buf.length > FRAME_CAP) throw new Error('an event frame longer than the console takes');
        }
      } catch (e) {
        if (ctl.signal.aborted || role === null) return;
        console.warn('event stream:', String(e));
      }
      setLive(false);
      await new Promise((res) => setTimeout(res, 2000));
    }
  };
  run();
}

/** The event of one SSE frame (its `data:` lines' JSON), or null for a comment. */
function parseFrame(frame) {
  const data = frame
    .split('\n')
    .filter((l) => l.startsWith('data:'))
    .map((l) => l.slice(5).trimStart())
    .join('\n');
  if (!data) return null;
  try {
    return JSON.parse(data);
  } catch {
    return null;
  }
}

// ---- formatting -----------------------------------------------------------------------------

function shortId(id) {
  return id ? id.slice(0, 8) : '';
}

function age(seconds) {
  if (!seconds) return '';
  const s = Math.max(0, Date.now() / 1000 - seconds);
  if (s < 60) return `${Math.floor(s)}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d`;
}

function bytes(n) {
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

function amount(slot, value) {
  return slot === 'mem' ? bytes(value) : String(value);
}

function slotsText(slots) {
  return Object.entries(slots || {})
    .map(([k, v]) => `${k} ${amount(k, v)}`)
    .join(', ');
}

function statusCell(tag, status, result) {
  return el(tag, { class: 'status', dataset: { status, result: result ?? '' } }, status);
}

function reasonOf(s) {
  if (s.status === 'PENDING' && s.pending_reason) {
    return `${s.pending_reason.code}: ${s.pending_reason.message}`;
  }
  return s.status_reason ?? '';
}

/** `fn` made so that only its newest call's answer is used: `fn(stale)` is given `stale()`,
 * true once a newer call has started. Without it, an older read answered late (a session's
 * read waits up to 2 s for its agent's stages) would overwrite a newer one, and the page would
 * show a status the session has left, with no event to come to correct it. */
function newest(fn) {
  let seq = 0;
  return () => {
    const mine = ++seq;
    return fn(() => mine !== seq);
  };
}

/** Calls `fn` once after `ms`, however often it is asked for meanwhile. */
function debounced(fn, ms) {
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

// ---- pages ----------------------------------------------------------------------------------

function leavePage() {
  if (page && page.leave) page.leave();
  page = null;
}

function route() {
  if (!secret() || role === null) return;
  leavePage();
  const hash = location.hash || '#/sessions';
  for (const a of document.querySelectorAll('nav a')) {
    if (a.getAttribute('href') === hash) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const m = hash.match(/^#\/sessions\/([^/]+)$/);
  if (m) page = sessionPage(decodeURIComponent(m[1]));
  else if (hash === '#/new') page = createPage();
  else if (hash === '#/queue') page = queuePage();
  else if (hash === '#/agents') page = agentsPage();
  else page = sessionsPage();
  main.focus();
}

/** #/sessions: the caller's sessions (an admin's: everyone's), live. */
function sessionsPage() {
  const all = el('input', { type: 'checkbox', id: 'show-all' });
  const body = el('tbody', { id: 'sessions' });
  const status = el('div', { id: 'sessions-status' });
  main.replaceChildren(
    el('h1', {}, role === 'admin' ? 'Sessions (every key)' : 'Your sessions'),
    el('p', {}, el('label', {}, all, ' include ended sessions')),
    status,
    el(
      'div',
      { class: 'table-wrap' },
      el(
        'table',
        {},
        el(
          'thead',
          {},
          el(
            'tr',
            {},
            ['Session', 'Image', 'Type', 'Status', 'Queue / reason', 'Priority', 'Age', 'Slots'].map((h) =>
              el('th', {}, h),
            ),
          ),
        ),
        body,
      ),
    ),
  );
  let gone = false;
  const load = newest(async (stale) => {
    try {
      const { sessions } = await api('GET', `/v1/sessions${all.checked ? '?all=true' : ''}`);
      if (gone || stale()) return;
      status.replaceChildren();
      body.replaceChildren(
        ...sessions.map((s) =>
          el(
            'tr',
            { dataset: { session: s.session_id } },
            el('td', { class: 'mono' }, el('a', { href: `#/sessions/${encodeURIComponent(s.session_id)}` }, shortId(s.session_id))),
            el('td', {}, s.image),
            el('td', {}, s.type ?? ''),
            statusCell('td', s.status, s.result),
            el('td', {}, s.queue_position ? `#${s.queue_position} ` : '', reasonOf(s)),
            el('td', {}, String(s.priority ?? '')),
            el('td', {}, age(s.created_at)),
            el('td', {}, slotsText(s.resource_slots)),
          ),
        ),
      );
      if (sessions.length === 0) body.append(el('tr', {}, el('td', { colSpan: 8, class: 'note' }, 'No sessions.')));
    } catch (e) {
      if (!gone && !stale()) status.replaceChildren(errorBox(e));
    }
  });
  const reload = debounced(load, 250);
  all.addEventListener('change', load);
  load();
  return {
    onEvent(ev) {
      if (ev.type !== 'session_status') return;
      // The row's status at once; the rest (queue positions, reasons) on the next read.
      const row = body.querySelector(`tr[data-session="${CSS.escape(ev.session_id ?? '')}"]`);
      const cell = row && row.querySelector('.status');
      if (cell) {
        cell.textContent = ev.status;
        cell.dataset.status = ev.status;
      }
      reload();
    },
    leave() {
      gone = true;
      reload.cancel();
    },
  };
}

/** #/queue: the sessions waiting, in admission order, with why. */
function queuePage() {
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

/** #/sessions/<id>: one session, its kernels and its logs, live. */
function sessionPage(id) {
  const head = el('div', { id: 'session' });
  const kernels = el('tbody', { id: 'kernels' });
  const logs = el('pre', { id: 'logs', tabIndex: 0 });
  const logNote = el('p', { id: 'logs-note', class: 'note' });
  const actions = el('p');
  const repl = runBox(id);
  const term = terminalBox(id);
  const details = el('div', { hidden: true });
  main.replaceChildren(el('h1', {}, 'Session ', el('span', { class: 'mono' }, id)), head, details);
  details.replaceChildren(
    actions,
    el('h2', {}, 'Kernels'),
    el(
      'div',
      { class: 'table-wrap' },
      el(
        'table',
        {},
        el('thead', {}, el('tr', {}, ['Host', 'Role', 'Agent', 'Status', 'Reason', 'Exit code'].map((h) => el('th', {}, h)))),
        kernels,
      ),
    ),
    repl.section,
    term.section,
    el('h2', {}, 'Logs'),
    logNote,
    logs,
  );
  let gone = false;
  let session = null;
  let follow = null; // the logs' AbortController while following
  let logLength = 0;
  let failedFollows = 0; // follows retried after the session ended

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

  const followLogs = async () => {
    if (follow || gone) return;
    const ctl = new AbortController();
    follow = ctl;
    logs.replaceChildren();
    logLength = 0;
    logNote.textContent = 'following…';
    try {
      const r = await fetch(`/v1/sessions/${encodeURIComponent(id)}/logs?follow=true`, {
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
        const kept = await fetch(`/v1/sessions/${encodeURIComponent(id)}/logs`, {
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
      // a session that has ended (no change is to come), a few times a second apart.
      follow = null;
      if (session && ENDED.has(session.status) && failedFollows < 5) {
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
    // Code runs in a RUNNING session only.
    repl.section.hidden = s.status !== 'RUNNING';
    term.section.hidden = s.status !== 'RUNNING';
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
      // Before the first answer, any change may be this session's.
      if (ev.type === 'session_status' && (!session || ev.session_id === session.session_id)) reload();
    },
    leave() {
      gone = true;
      reload.cancel();
      if (follow) follow.abort();
      repl.leave();
      term.leave();
    },
  };
}

/** A session page's run box: code run with `POST /v1/sessions/<id>/execute` (Backend.AI's
 * continuation protocol): a query, then `continue` while the run goes on, an `input` when it
 * waits for a line (a runner kernel's `input()`), its output shown as it comes (as text), its
 * exit code at the end; Interrupt while it runs. On a runner kernel the code is Python in its
 * persistent REPL; elsewhere a shell command line in a process of its own. */
function runBox(id) {
  const code = el('textarea', { id: 'repl-code', rows: 3, spellcheck: false, 'aria-label': 'Code to run' });
  const run = el('button', { type: 'submit', id: 'repl-run' }, 'Run');
  const stop = el('button', { type: 'button', id: 'repl-interrupt', disabled: true }, 'Interrupt');
  const what = el('p', { class: 'note', id: 'repl-path' });
  const output = el('pre', { id: 'repl-output', class: 'output', tabIndex: 0 });
  const status = el('p', { id: 'repl-status', class: 'note' });
  const line = el('input', { id: 'repl-line', autocomplete: 'off', spellcheck: false });
  const prompt = el(
    'form',
    { id: 'repl-input', hidden: true },
    el('label', { htmlFor: 'repl-line' }, 'Input '),
    line,
    ' ',
    el('button', { type: 'submit' }, 'Send'),
  );
  const form = el('form', { id: 'repl' }, code, el('div', {}, run, ' ', stop));
  const section = el('section', { hidden: true }, el('h2', {}, 'Run'), what, form, output, prompt, status);
  let gone = false;
  let length = 0;
  let answerLine = null; // resolves the line the run waits for

  const show = (items) => {
    for (const [kind, text] of items ?? []) {
      const t = typeof text === 'string' ? text : JSON.stringify(text);
      output.append(kind === 'stderr' ? el('span', { class: 'stderr' }, t) : document.createTextNode(t));
      length += t.length;
    }
    while (length > LOG_CAP && output.firstChild) {
      length -= output.firstChild.textContent.length;
      output.firstChild.remove();
    }
    output.scrollTop = output.scrollHeight;
  };
  const call = (body) => api('POST', `/v1/sessions/${encodeURIComponent(id)}/execute`, body);

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    run.disabled = true;
    stop.disabled = false;
    output.replaceChildren();
    length = 0;
    status.textContent = 'running…';
    try {
      let res = await call({ mode: 'query', code: code.value, flush_timeout: 0.5 });
      while (!gone) {
        show(res.console);
        if (res.status === 'waiting-input') {
          status.textContent = 'waiting for input';
          prompt.hidden = false;
          line.type = res.options?.is_password ? 'password' : 'text';
          line.focus();
          const text = await new Promise((resolve) => {
            answerLine = resolve;
          });
          // null: the page was left.
          if (text === null) break;
          prompt.hidden = true;
          status.textContent = 'running…';
          res = await call({ mode: 'input', run_id: res.runId, code: text });
        } else if (res.status === 'finished' || res.status === 'exec-timeout') {
          status.textContent =
            res.status === 'finished' ? `finished, exit code ${res.exitCode ?? 'unknown'}` : 'killed: past its timeout';
          break;
        } else {
          res = await call({ mode: 'continue', run_id: res.runId });
        }
      }
    } catch (e) {
      if (!gone) status.replaceChildren(errorBox(e, 'repl-error'));
    }
    prompt.hidden = true;
    run.disabled = false;
    stop.disabled = true;
  });
  prompt.addEventListener('submit', (ev) => {
    ev.preventDefault();
    const text = line.value;
    line.value = '';
    if (answerLine) answerLine(text);
    answerLine = null;
  });
  stop.addEventListener('click', async () => {
    try {
      await api('POST', `/v1/sessions/${encodeURIComponent(id)}/interrupt`);
    } catch (e) {
      status.replaceChildren(errorBox(e));
    }
  });
  return {
    section,
    setPath(path) {
      what.textContent =
        path === 'kernel-runner'
          ? "Python, in the kernel's persistent REPL (its state stays from one run to the next)"
          : 'A shell command line, run in a process of its own';
    },
    leave() {
      gone = true;
      if (answerLine) answerLine(null);
    },
  };
}

/** #/new: the create form; the API's refusal is shown at the form. */
function createPage() {
  const field = (label, input, hint) => [el('label', { htmlFor: input.id }, label), el('div', {}, input, hint ? el('div', { class: 'note' }, hint) : '')];
  const inputs = {
    image: el('input', { id: 'image', name: 'image', required: true, placeholder: 'kernelvisor-test:latest', spellcheck: false }),
    cpu: el('input', { id: 'cpu', name: 'cpu', value: '1', inputMode: 'decimal' }),
    mem: el('input', { id: 'mem', name: 'mem', value: '256m' }),
    type: el('select', { id: 'type', name: 'type' }, el('option', { value: 'interactive' }, 'interactive'), el('option', { value: 'batch' }, 'batch')),
    priority: el('input', { id: 'priority', name: 'priority', type: 'number', value: '10', min: '0', max: '100' }),
    command: el('input', { id: 'command', name: 'command', spellcheck: false }),
    cluster_size: el('input', { id: 'cluster_size', name: 'cluster_size', type: 'number', value: '1', min: '1', max: '64' }),
  };
  const error = el('div', { id: 'create-error' });
  const submit = el('button', { type: 'submit', id: 'create-submit' }, 'Create');
  const form = el(
    'form',
    { id: 'create', class: 'grid', noValidate: true },
    field('Image', inputs.image),
    field('CPU (cores)', inputs.cpu),
    field('Memory', inputs.mem, 'bytes, or 256m / 1g'),
    field('Type', inputs.type),
    field('Priority', inputs.priority, '0–100, higher first while waiting'),
    field('Command', inputs.command, 'a shell command line: required for batch'),
    field('Cluster size', inputs.cluster_size),
    el('div', { class: 'actions' }, submit),
  );
  main.replaceChildren(el('h1', {}, 'New session'), error, form);
  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    for (const i of Object.values(inputs)) i.removeAttribute('aria-invalid');
    error.replaceChildren();
    const body = {
      image: inputs.image.value.trim(),
      resource_slots: { cpu: inputs.cpu.value.trim(), mem: inputs.mem.value.trim() },
      type: inputs.type.value,
    };
    if (inputs.priority.value !== '') body.priority = Number(inputs.priority.value);
    if (inputs.cluster_size.value !== '') body.cluster_size = Number(inputs.cluster_size.value);
    if (inputs.command.value.trim() !== '') body.command = inputs.command.value;
    submit.disabled = true;
    try {
      const s = await api('POST', '/v1/sessions', body);
      location.hash = `#/sessions/${encodeURIComponent(s.session_id)}`;
    } catch (e) {
      error.replaceChildren(errorBox(e, 'create-refused'));
      // The fields the API's message names are marked.
      for (const [name, input] of Object.entries(inputs)) {
        if (e instanceof ApiError && new RegExp(`\\b${name}\\b`).test(e.message)) input.setAttribute('aria-invalid', 'true');
      }
      submit.disabled = false;
    }
  });
  inputs.image.focus();
  return {};
}

/** #/agents: the fleet (admin keys; a user key is shown the API's 403). */
function agentsPage() {
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

// ---- start ----------------------------------------------------------------------------------

document.getElementById('sign-out').addEventListener('click', () => signOut());
window.addEventListener('hashchange', route);
if (secret()) {
  signedIn().catch((e) => signOut(e));
} else {
  showSignIn();
}

/** base64url of a string, no padding (the pty WebSocket's token subprotocol). */
function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = '';
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

/**
 * The terminal in the browser: xterm.js (vendor/xterm.js, loaded on first use) over the
 * session's pty WebSocket. A browser's WebSocket cannot send `Authorization`, so the secret
 * goes as the `kernelvisor.bearer.<base64url>` subprotocol beside `kernelvisor.pty` (never in
 * the URL). Keystrokes go as binary frames, output comes as binary frames, a size change as
 * `{"resize": {"rows", "cols"}}`; `{"exit_code"}` / `{"error"}` text frames end or note it.
 * `window.kvTerm` is the open terminal (tests read its text and resize it).
 */
function terminalBox(id) {
  const open = el('button', { type: 'button', id: 'term-open' }, 'Terminal');
  const close = el('button', { type: 'button', id: 'term-close', hidden: true }, 'Close terminal');
  const status = el('span', { id: 'term-status', class: 'note', 'aria-live': 'polite' });
  const screen = el('div', { id: 'terminal' });
  const section = el('section', { hidden: true }, el('h2', {}, 'Terminal'), el('p', {}, open, ' ', close, ' ', status), screen);
  let ws = null;
  let term = null;
  let refit = null;
  const end = (text) => {
    if (refit) window.removeEventListener('resize', refit);
    refit = null;
    if (ws) {
      const w = ws;
      ws = null;
      w.onclose = null;
      w.close(1000);
    }
    if (term) {
      term.dispose();
      term = null;
      window.kvTerm = null;
    }
    screen.replaceChildren();
    open.hidden = false;
    close.hidden = true;
    if (text !== undefined) status.textContent = text;
  };
  open.addEventListener('click', async () => {
    open.hidden = true;
    status.textContent = 'connecting…';
    const { Terminal, fit } = await import('./vendor/xterm.js');
    term = new Terminal({ rows: 24, cols: 80, rendererType: 'dom' });
    term.open(screen);
    // The terminal fills its box (console.css), now and whenever the window changes; each
    // change of size is sent as a resize (below).
    fit(term);
    refit = () => term && fit(term);
    window.addEventListener('resize', refit);
    window.kvTerm = term;
    const url = new URL(`/v1/sessions/${encodeURIComponent(id)}/pty?rows=${term.rows}&cols=${term.cols}`, location.href);
    url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
    ws = new WebSocket(url, [`kernelvisor.bearer.${base64url(secret())}`, 'kernelvisor.pty']);
    ws.binaryType = 'arraybuffer';
    const decoder = new TextDecoder();
    const enc = new TextEncoder();
    ws.onopen = () => {
      status.textContent = 'connected';
      close.hidden = false;
      term.focus();
    };
    ws.onmessage = (m) => {
      if (!term) return;
      if (typeof m.data === 'string') {
        const c = JSON.parse(m.data);
        if ('exit_code' in c) status.textContent = `ended (exit code ${c.exit_code ?? 'unknown'})`;
        else if (c.error) status.textContent = `${c.error.message} (${c.error.code})`;
        return;
      }
      term.write(decoder.decode(m.data, { stream: true }));
    };
    ws.onclose = () => {
      ws = null;
      close.hidden = true;
      open.hidden = false;
      if (status.textContent === 'connected' || status.textContent === 'connecting…') status.textContent = 'closed';
    };
    term.on('data', (d) => {
      if (ws && ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d));
    });
    term.on('resize', ({ rows, cols }) => {
      if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ resize: { rows, cols } }));
    });
  });
  close.addEventListener('click', () => end('closed'));
  return { section, leave: () => end() };
}

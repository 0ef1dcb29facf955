// The terminal in the browser.
import { api, base64url, secret } from '../lib/api.js';
import { el } from '../lib/dom.js';

/**
 * The terminal in the browser: xterm.js (vendor/xterm.js, loaded on first use) over the
 * session's pty WebSocket. A browser's WebSocket cannot send `Authorization`, so the secret
 * goes as the `kernelvisor.bearer.<base64url>` subprotocol beside `kernelvisor.pty` (never in
 * the URL). Keystrokes go as binary frames, output comes as binary frames, a size change as
 * `{"resize": {"rows", "cols"}}`; `{"exit_code"}` / `{"error"}` text frames end or note it.
 * `window.kvTerm` is the open terminal (tests read its text and resize it). A socket closed
 * before it opened (the upgrade refused: a browser's WebSocket does not tell why) is explained
 * from the session as the API reads it now (`GET /v1/sessions/<id>`: not found, or the kernel
 * not RUNNING), else by its close code. `kernel()` is the cluster session's selected kernel
 * (`?kernel=`), or null for the main one.
 */
export function terminalBox(id, kernel = () => null) {
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
    // A failed load of a module stays failed under its URL: a second try asks under another.
    const { Terminal, fit } = await import('../vendor/xterm.js').catch(() => import('../vendor/xterm.js?again'));
    term = new Terminal({ rows: 24, cols: 80, rendererType: 'dom' });
    term.open(screen);
    // The terminal fills its box (console.css), now and whenever the window changes; each
    // change of size is sent as a resize (below).
    // (Not while its box has no size, the page's section hidden: there is nothing to fit to.)
    refit = () => term && screen.clientWidth > 0 && screen.clientHeight > 0 && fit(term);
    refit();
    window.addEventListener('resize', refit);
    window.kvTerm = term;
    const q = new URLSearchParams({ rows: term.rows, cols: term.cols });
    const k = kernel();
    if (k) q.set('kernel', k);
    const url = new URL(`/v1/sessions/${encodeURIComponent(id)}/pty?${q}`, location.href);
    url.protocol = location.protocol === 'https:' ? 'wss:' : 'ws:';
    ws = new WebSocket(url, [`kernelvisor.bearer.${base64url(secret())}`, 'kernelvisor.pty']);
    ws.binaryType = 'arraybuffer';
    let opened = false;
    const decoder = new TextDecoder();
    const enc = new TextEncoder();
    ws.onopen = () => {
      opened = true;
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
    ws.onclose = (ev) => {
      ws = null;
      close.hidden = true;
      open.hidden = false;
      if (!opened) {
        if (term) {
          term.dispose();
          term = null;
          window.kvTerm = null;
          screen.replaceChildren();
        }
        refused(k, ev);
      } else if (status.textContent === 'connected' || status.textContent === 'connecting…') {
        status.textContent = ev.reason ? `closed: ${ev.reason}` : 'closed';
      }
    };
    term.on('data', (d) => {
      if (ws && ws.readyState === WebSocket.OPEN) ws.send(enc.encode(d));
    });
    term.on('resize', ({ rows, cols }) => {
      if (ws && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ resize: { rows, cols } }));
    });
  });
  // Why an upgrade was refused: the session (or the selected kernel) as the API reads it now.
  const refused = async (k, ev) => {
    let why = `the connection closed before it opened (code ${ev.code}${ev.reason ? `: ${ev.reason}` : ''})`;
    try {
      const s = await api('GET', `/v1/sessions/${encodeURIComponent(id)}`);
      const kern = k ? (s.kernels ?? []).find((x) => x.cluster_hostname === k || x.kernel_id === k) : null;
      if (k && !kern) why = `the session has no kernel ${k}`;
      else if (kern && kern.status !== 'RUNNING') why = `the kernel ${k} is ${kern.status}${kern.status_reason ? ` (${kern.status_reason})` : ''}`;
      else if (s.status !== 'RUNNING') why = `the session is ${s.status}${s.status_reason ? ` (${s.status_reason})` : ''}`;
    } catch (e) {
      why = String(e);
    }
    status.textContent = `refused: ${why}`;
  };
  close.addEventListener('click', () => end('closed'));
  return { section, leave: () => end() };
}


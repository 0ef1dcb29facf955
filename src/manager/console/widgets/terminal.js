// The terminal in the browser.
import { base64url, secret } from '../lib/api.js';
import { el } from '../lib/dom.js';

/**
 * The terminal in the browser: xterm.js (vendor/xterm.js, loaded on first use) over the
 * session's pty WebSocket. A browser's WebSocket cannot send `Authorization`, so the secret
 * goes as the `kernelvisor.bearer.<base64url>` subprotocol beside `kernelvisor.pty` (never in
 * the URL). Keystrokes go as binary frames, output comes as binary frames, a size change as
 * `{"resize": {"rows", "cols"}}`; `{"exit_code"}` / `{"error"}` text frames end or note it.
 * `window.kvTerm` is the open terminal (tests read its text and resize it).
 */
export function terminalBox(id) {
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
    const { Terminal, fit } = await import('../vendor/xterm.js');
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


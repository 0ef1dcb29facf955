// A session page's run box.
import { api } from '../lib/api.js';
import { el, errorBox, LOG_CAP } from '../lib/dom.js';

/** A session page's run box: code run with `POST /v1/sessions/<id>/execute` (Backend.AI's
 * continuation protocol): a query, then `continue` while the run goes on, an `input` when it
 * waits for a line (a runner kernel's `input()`), its output shown as it comes (as text), its
 * exit code at the end; Interrupt while it runs. On a runner kernel the code is Python in its
 * persistent REPL; elsewhere a shell command line in a process of its own. An expression's
 * value comes as the runner sends it (upstream's Python runner: `text/plain` as `stdout`, HTML
 * as an `html` item, an image as `media` `[mime, data]`); every item is shown as text (HTML by
 * its text, an image by its type). `kernel()` is the cluster session's selected kernel (the
 * body's `kernel`), or null for the main one. */
export function runBox(id, kernel = () => null) {
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
      const t = itemText(kind, text);
      output.append(
        kind === 'stderr'
          ? el('span', { class: 'stderr' }, t)
          : kind === 'stdout'
            ? document.createTextNode(t)
            : el('span', { class: `item-${kind}`, dataset: { kind } }, t),
      );
      length += t.length;
    }
    while (length > LOG_CAP && output.firstChild) {
      length -= output.firstChild.textContent.length;
      output.firstChild.remove();
    }
    output.scrollTop = output.scrollHeight;
  };
  let runKernel = null; // the kernel the current run lives in: its continue and input name it
  const call = (body) =>
    api('POST', `/v1/sessions/${encodeURIComponent(id)}/execute`, runKernel ? { ...body, kernel: runKernel } : body);

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    run.disabled = true;
    stop.disabled = false;
    output.replaceChildren();
    length = 0;
    status.textContent = 'running…';
    runKernel = kernel();
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

/** A console item's text: stdout and stderr as they are, `html` by the text of its HTML
 * (parsed inert: nothing in it runs or loads), `media` `[mime, data]` as its text when it is
 * text, else a note of its type, any other as JSON. */
function itemText(kind, data) {
  if (typeof data === 'string' && (kind === 'stdout' || kind === 'stderr' || kind === 'log')) return data;
  if (kind === 'html' && typeof data === 'string') {
    return new DOMParser().parseFromString(data, 'text/html').body.textContent ?? '';
  }
  if (kind === 'media' && Array.isArray(data)) {
    const [mime, body] = data;
    if (typeof body === 'string' && /^text\/(plain|markdown|latex)/.test(String(mime))) return body;
    if (mime === 'text/html' && typeof body === 'string') return itemText('html', body);
    return `[${mime}]\n`;
  }
  return typeof data === 'string' ? data : JSON.stringify(data);
}

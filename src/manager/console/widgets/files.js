// A session page's files.
import { authHeaders, refusal } from '../lib/api.js';
import { bytes, el, errorBox, table } from '../lib/dom.js';

/** A path under /home/work as the files routes take it: each component URL-encoded. */
function routePath(rel) {
  return rel
    .split('/')
    .filter((c) => c !== '')
    .map(encodeURIComponent)
    .join('/');
}

/** `dir/name`, or `name` at /home/work. */
function join(dir, name) {
  return dir ? `${dir}/${name}` : name;
}

/**
 * The kernel's files under /home/work (`GET /v1/sessions/<id>/files?dir=…`), read while the
 * session is RUNNING: a directory (or a symlink) opens in place and Up goes back; a file
 * downloads (read with the bearer header into a Blob, saved through an object URL: the token is
 * never in a URL); a file chosen in the upload input is sent to the directory shown
 * (`PUT …/files/<path>`, the File as the body, so the browser sends its `Content-Length`), with
 * its progress. The API's refusals (`invalid-path`, `upload-too-large`, …) are shown in the box.
 * `kernel()` is the cluster session's selected kernel (`?kernel=`), or null for the main one.
 */
export function filesBox(id, kernel) {
  const where = el('p', { id: 'files-dir', class: 'mono' });
  const up = el('button', { type: 'button', id: 'files-up' }, '.. (up)');
  const refresh = el('button', { type: 'button', id: 'files-refresh' }, 'Refresh');
  const input = el('input', { type: 'file', id: 'files-upload' });
  const progress = el('progress', { id: 'files-progress', max: 1, value: 0, hidden: true });
  const status = el('p', { id: 'files-status', class: 'note', 'aria-live': 'polite' });
  const errors = el('div', { id: 'files-errors' });
  const rows = el('tbody', { id: 'files' });
  const section = el(
    'section',
    { hidden: true },
    el('h2', {}, 'Files'),
    where,
    el('p', {}, up, ' ', refresh, ' ', el('label', { htmlFor: 'files-upload' }, 'Upload to this directory '), input, ' ', progress),
    status,
    errors,
    table(['Name', 'Type', 'Size', 'Mode', 'Modified'], rows),
  );
  let dir = ''; // relative to /home/work
  let running = false;
  let seq = 0; // the newest listing's number: an older answer is dropped
  const base = `/v1/sessions/${encodeURIComponent(id)}/files`;
  const query = (extra = {}) => {
    const q = new URLSearchParams(extra);
    const k = kernel();
    if (k) q.set('kernel', k);
    const s = q.toString();
    return s ? `?${s}` : '';
  };

  const load = async () => {
    if (!running) return;
    const mine = ++seq;
    where.textContent = `/home/work${dir ? `/${dir}` : ''}`;
    up.disabled = dir === '';
    try {
      const r = await fetch(`${base}${query(dir ? { dir } : {})}`, { headers: authHeaders(), cache: 'no-store' });
      if (!r.ok) throw await refusal(r);
      const list = await r.json();
      if (mine !== seq || !running) return;
      errors.replaceChildren();
      rows.replaceChildren(...list.files.map(row));
      if (list.truncated) errors.append(el('p', { class: 'note' }, 'The listing is cut short (too many entries).'));
      if (!list.files.length) rows.append(el('tr', {}, el('td', { colSpan: 5, class: 'note' }, 'Empty directory.')));
    } catch (e) {
      if (mine !== seq || !running) return;
      rows.replaceChildren();
      errors.replaceChildren(errorBox(e, 'files-error'));
    }
  };

  const row = (f) => {
    // A directory opens in place; so does a symlink, which may lead to one (one that leads out
    // of /home/work is the API's `invalid-path`, shown in the box); a file downloads.
    const opens = f.type === 'dir' || f.type === 'symlink';
    const name = opens
      ? el('button', { type: 'button', class: 'link file-dir' }, f.type === 'dir' ? `${f.name}/` : `${f.name}@`)
      : f.type === 'file'
        ? el('button', { type: 'button', class: 'link file-download', title: 'Download' }, f.name)
        : el('span', {}, f.name);
    if (opens) {
      name.addEventListener('click', () => {
        dir = join(dir, f.name);
        load();
      });
    } else if (f.type === 'file') {
      name.addEventListener('click', () => download(join(dir, f.name), f.name, name));
    }
    return el(
      'tr',
      { dataset: { file: f.name, type: f.type } },
      el('td', {}, name),
      el('td', {}, f.type),
      el('td', {}, f.type === 'file' ? bytes(f.size) : ''),
      el('td', { class: 'mono' }, f.mode ?? ''),
      el('td', {}, f.mtime ? new Date(f.mtime * 1000).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z') : ''),
    );
  };

  const download = async (path, name, button) => {
    button.disabled = true;
    errors.replaceChildren();
    status.textContent = `downloading ${name}…`;
    try {
      const r = await fetch(`${base}/${routePath(path)}${query()}`, { headers: authHeaders(), cache: 'no-store' });
      if (!r.ok) throw await refusal(r);
      const blob = await r.blob();
      const url = URL.createObjectURL(blob);
      const a = el('a', { href: url, download: name, hidden: true });
      document.body.append(a);
      a.click();
      a.remove();
      // Revoked once the browser has taken it (the click starts the download at once).
      setTimeout(() => URL.revokeObjectURL(url), 60_000);
      status.textContent = `downloaded ${name} (${bytes(blob.size)})`;
    } catch (e) {
      status.textContent = '';
      errors.replaceChildren(errorBox(e, 'files-error'));
    }
    button.disabled = false;
  };

  const upload = (file) => {
    const path = join(dir, file.name);
    input.disabled = true;
    errors.replaceChildren();
    progress.hidden = false;
    progress.value = 0;
    status.textContent = `uploading ${file.name}…`;
    // XMLHttpRequest, not fetch: it reports the upload's progress.
    const xhr = new XMLHttpRequest();
    xhr.open('PUT', `${base}/${routePath(path)}${query()}`);
    for (const [k, v] of Object.entries(authHeaders({ 'Content-Type': 'application/octet-stream' }))) {
      xhr.setRequestHeader(k, v);
    }
    xhr.upload.addEventListener('progress', (ev) => {
      if (ev.lengthComputable && ev.total > 0) {
        progress.value = ev.loaded / ev.total;
        status.textContent = `uploading ${file.name}: ${Math.floor((100 * ev.loaded) / ev.total)} %`;
      }
    });
    const done = () => {
      input.disabled = false;
      input.value = '';
      progress.hidden = true;
    };
    xhr.addEventListener('load', async () => {
      done();
      if (xhr.status >= 200 && xhr.status < 300) {
        let size = file.size;
        try {
          size = JSON.parse(xhr.responseText).size ?? size;
        } catch {
          // the size sent is the size shown
        }
        status.textContent = `uploaded ${file.name} (${bytes(size)})`;
      } else {
        status.textContent = '';
        const answer = new Response(xhr.responseText, { status: xhr.status, statusText: xhr.statusText });
        errors.replaceChildren(errorBox(await refusal(answer), 'files-error'));
      }
      load();
    });
    xhr.addEventListener('error', () => {
      done();
      status.textContent = '';
      errors.replaceChildren(errorBox(`the upload of ${file.name} failed (the connection broke)`, 'files-error'));
    });
    xhr.send(file);
  };

  up.addEventListener('click', () => {
    dir = dir.split('/').slice(0, -1).join('/');
    load();
  });
  refresh.addEventListener('click', () => load());
  input.addEventListener('change', () => {
    if (input.files && input.files.length) upload(input.files[0]);
  });

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
    /** The selected kernel changed: its home directory is listed. */
    kernelChanged() {
      dir = '';
      load();
    },
    leave() {
      running = false;
    },
  };
}

// #/keys: the access keys, for admin keys: list, create (the secret shown once), enable /
// disable, delete (confirmed in the page).
import { api, ApiError } from '../lib/api.js';
import { debounced, el, errorBox, newest, table } from '../lib/dom.js';

function created(t) {
  return t ? new Date(t * 1000).toLocaleString() : '';
}

/** #/keys: the access keys (admin keys; a user key is shown the API's 403). */
export function keysPage(main) {
  const status = el('div', { id: 'keys-status' });
  const body = el('tbody', { id: 'keys' });
  const heads = ['Access key', 'Name', 'Role', 'Enabled', 'Concurrency used / limit', 'Created', 'Actions'];

  // The create form.
  const name = el('input', { id: 'key-name', name: 'name', autocomplete: 'off', spellcheck: false });
  const role = el('select', { id: 'key-role', name: 'role' }, el('option', { value: 'user' }, 'user'), el('option', { value: 'admin' }, 'admin'));
  const limit = el('input', { id: 'key-limit', name: 'concurrency_limit', type: 'number', min: '0', value: '0' });
  const createError = el('div', { id: 'key-create-status' });
  const submit = el('button', { type: 'submit', id: 'key-create' }, 'Create key');
  const form = el(
    'form',
    { id: 'key-form', class: 'grid', noValidate: true, hidden: true },
    el('label', { htmlFor: 'key-name' }, 'Name'),
    name,
    el('label', { htmlFor: 'key-role' }, 'Role'),
    role,
    el('label', { htmlFor: 'key-limit' }, 'Concurrency limit'),
    el('div', {}, limit, el('div', { class: 'note' }, 'live sessions at once; 0 = unlimited')),
    el('div', { class: 'actions' }, submit),
  );
  const secretBox = el('div', { id: 'new-key' });
  const formSection = el('section', { id: 'key-create-section', hidden: true }, el('h2', {}, 'New access key'), createError, secretBox, form);

  main.replaceChildren(
    el('h1', {}, 'Access keys'),
    status,
    table(heads, body),
    formSection,
  );

  let gone = false;
  const rows = new Map(); // access key -> row

  const act = async (method, key, payload) => {
    try {
      await api(method, `/v1/access-keys/${encodeURIComponent(key)}`, payload);
      status.replaceChildren();
    } catch (e) {
      if (!gone) status.replaceChildren(errorBox(e, 'keys-action-error'));
    }
    load();
  };

  const makeRow = (id) => {
    const cells = {
      id: el('td', { class: 'mono' }, id),
      name: el('td', { class: 'name' }),
      role: el('td', { class: 'role' }),
      enabled: el('td', { class: 'enabled' }),
      concurrency: el('td', { class: 'concurrency' }),
      created: el('td', { class: 'created' }),
    };
    const toggle = el('button', { type: 'button' });
    const del = el('button', { type: 'button', class: 'delete' }, 'Delete');
    const confirm = el('span', { class: 'confirm', hidden: true });
    const yes = el('button', { type: 'button', class: 'confirm-delete danger' }, 'Delete for good');
    const no = el('button', { type: 'button', class: 'cancel-delete' }, 'Cancel');
    confirm.append(`Delete ${id}? Its secret stops working at once. `, yes, ' ', no);
    const actions = el('td', { class: 'actions' }, toggle, ' ', del, confirm);
    const tr = el('tr', { dataset: { key: id } }, ...Object.values(cells), actions);
    const row = { tr, key: null };
    toggle.addEventListener('click', () => {
      toggle.disabled = true;
      act('PATCH', id, { enabled: !row.key.enabled });
    });
    del.addEventListener('click', () => {
      del.hidden = true;
      confirm.hidden = false;
      no.focus();
    });
    no.addEventListener('click', () => {
      confirm.hidden = true;
      del.hidden = false;
      del.focus();
    });
    yes.addEventListener('click', () => {
      yes.disabled = true;
      act('DELETE', id).finally(() => {
        yes.disabled = false;
        confirm.hidden = true;
        del.hidden = false;
      });
    });
    row.update = (k) => {
      row.key = k;
      cells.name.textContent = k.name ?? '';
      cells.role.textContent = k.role;
      cells.enabled.textContent = k.enabled ? 'yes' : 'no';
      cells.enabled.dataset.enabled = String(Boolean(k.enabled));
      const lim = Number(k.concurrency_limit) ? String(k.concurrency_limit) : 'unlimited';
      cells.concurrency.textContent = `${k.concurrency_used ?? 0} / ${lim}`;
      cells.created.textContent = created(k.created_at);
      toggle.className = k.enabled ? 'disable' : 'enable';
      toggle.textContent = k.enabled ? 'Disable' : 'Enable';
      toggle.disabled = false;
    };
    return row;
  };

  const load = newest(async (stale) => {
    try {
      const { access_keys: keys } = await api('GET', '/v1/access-keys');
      if (gone || stale()) return;
      const seen = new Set();
      let cursor = body.firstChild;
      for (const k of keys) {
        seen.add(k.access_key);
        let row = rows.get(k.access_key);
        if (!row) {
          row = makeRow(k.access_key);
          rows.set(k.access_key, row);
        }
        row.update(k);
        if (row.tr === cursor) cursor = cursor.nextSibling;
        else body.insertBefore(row.tr, cursor);
      }
      for (const [id, row] of rows) {
        if (!seen.has(id)) {
          row.tr.remove();
          rows.delete(id);
        }
      }
      const err = document.getElementById('keys-error');
      if (err) err.remove();
      formSection.hidden = false;
      form.hidden = false;
    } catch (e) {
      if (!gone && !stale()) status.replaceChildren(errorBox(e, 'keys-error'));
    }
  });

  /** The new key's secret, shown once: a read-only field to copy it from, and a warning. */
  const showSecret = (k) => {
    const field = el('input', {
      id: 'new-key-secret',
      readOnly: true,
      value: k.secret_key,
      spellcheck: false,
      autocomplete: 'off',
      'aria-label': 'the new secret key',
    });
    field.addEventListener('focus', () => field.select());
    const copy = el('button', { type: 'button', id: 'new-key-copy' }, 'Copy');
    const copied = el('span', { class: 'note', role: 'status' });
    copy.addEventListener('click', async () => {
      field.focus();
      field.select();
      try {
        await navigator.clipboard.writeText(field.value);
        copied.textContent = 'copied';
      } catch {
        copied.textContent = 'selected: copy it with Ctrl+C';
      }
    });
    const done = el('button', { type: 'button', id: 'new-key-done' }, 'I have kept it');
    done.addEventListener('click', () => {
      secretBox.replaceChildren();
      name.focus();
    });
    secretBox.replaceChildren(
      el(
        'div',
        { class: 'secret', role: 'alert' },
        el('p', {}, el('strong', {}, 'Copy this secret now: it is shown only this once. '), 'The manager keeps only its hash; a lost secret means a new key.'),
        el('p', {}, 'Access key ', el('code', { id: 'new-key-id' }, k.access_key), ` (${k.role}${k.name ? `, ${k.name}` : ''})`),
        el('div', { class: 'copy' }, field, ' ', copy, ' ', copied),
        el('div', { class: 'actions' }, done),
      ),
    );
    field.focus();
  };

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    createError.replaceChildren();
    status.replaceChildren();
    for (const i of [name, role, limit]) i.removeAttribute('aria-invalid');
    const payload = { role: role.value };
    if (name.value.trim() !== '') payload.name = name.value.trim();
    if (limit.value.trim() !== '') {
      const n = Number(limit.value);
      if (!Number.isInteger(n) || n < 0) {
        limit.setAttribute('aria-invalid', 'true');
        createError.replaceChildren(errorBox('The concurrency limit is a whole number, 0 or more.', 'key-create-error'));
        limit.focus();
        return;
      }
      payload.concurrency_limit = n;
    }
    submit.disabled = true;
    try {
      const k = await api('POST', '/v1/access-keys', payload);
      if (gone) return;
      name.value = '';
      showSecret(k);
      load();
    } catch (e) {
      if (gone) return;
      createError.replaceChildren(errorBox(e, 'key-create-error'));
      const fields = { name, role, concurrency_limit: limit };
      for (const [f, input] of Object.entries(fields)) {
        if (e instanceof ApiError && new RegExp(`\\b${f}\\b`).test(e.message)) input.setAttribute('aria-invalid', 'true');
      }
    }
    submit.disabled = false;
  });

  const reload = debounced(load, 1000);
  load();
  return {
    onEvent(ev) {
      // A session's start or end changes its key's concurrency used.
      if (ev.type === 'session_status') reload();
    },
    leave() {
      gone = true;
      reload.cancel();
    },
  };
}

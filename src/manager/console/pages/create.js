// #/new: the create form.
import { api, ApiError } from '../lib/api.js';
import { el, errorBox } from '../lib/dom.js';

/** The form field an API refusal is about: by its code where the code says (an image the
 * registry lacks, a vfolder the key has none of), else the fields its message names. */
function fieldsOf(e, names) {
  if (!(e instanceof ApiError)) return [];
  if (e.code === 'image-not-found') return ['image'];
  if (e.code === 'vfolder-not-found') return ['mounts'];
  return names.filter((n) => new RegExp(`\\b${n.replace('.', '\\.')}\\b`).test(e.message));
}

/** #/new: the create form; the API's refusal is shown at the form and at the field it names. */
export function createPage(main) {
  const errors = {}; // field name -> its error line
  const field = (label, input, hint) => {
    const error = el('div', { class: 'field-error', id: `${input.id}-error`, role: 'alert', hidden: true });
    errors[input.name] = error;
    input.setAttribute('aria-describedby', error.id);
    return [el('label', { htmlFor: input.id }, label), el('div', {}, input, hint ? el('div', { class: 'note' }, hint) : '', error)];
  };
  const inputs = {
    image: el('input', { id: 'image', name: 'image', required: true, placeholder: 'kernelvisor-test:latest', spellcheck: false }),
    cpu: el('input', { id: 'cpu', name: 'cpu', value: '1', inputMode: 'decimal' }),
    mem: el('input', { id: 'mem', name: 'mem', value: '256m' }),
    type: el('select', { id: 'type', name: 'type' }, el('option', { value: 'interactive' }, 'interactive'), el('option', { value: 'batch' }, 'batch')),
    priority: el('input', { id: 'priority', name: 'priority', type: 'number', value: '10', min: '0', max: '100' }),
    command: el('input', { id: 'command', name: 'command', spellcheck: false }),
    cluster_size: el('input', { id: 'cluster_size', name: 'cluster_size', type: 'number', value: '1', min: '1', max: '64' }),
    cluster_mode: el(
      'select',
      { id: 'cluster_mode', name: 'cluster_mode' },
      el('option', { value: 'single-node' }, 'single-node (one agent)'),
      el('option', { value: 'multi-node' }, 'multi-node (a placement per kernel)'),
    ),
  };
  // The key's vfolders, each a checkbox (mounted at /home/work/<name>) with its permission.
  const mounts = el('fieldset', { id: 'mounts', name: 'mounts', class: 'mounts' }, el('legend', {}, 'vfolders to mount'));
  const mountsList = el('div', { id: 'mounts-list' }, el('span', { class: 'note' }, 'reading your vfolders…'));
  const mountsError = el('div', { class: 'field-error', id: 'mounts-error', role: 'alert', hidden: true });
  mounts.append(mountsList, el('div', { class: 'note' }, 'each at /home/work/<name>'), mountsError);
  mounts.setAttribute('aria-describedby', mountsError.id);
  errors.mounts = mountsError;
  const marked = { ...inputs, mounts };

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
    field('Cluster size', inputs.cluster_size, '1–64 kernels, each with these slots'),
    field('Cluster mode', inputs.cluster_mode),
    el('span', { class: 'label' }, 'vfolders'),
    mounts,
    el('div', { class: 'actions' }, submit),
  );
  main.replaceChildren(el('h1', {}, 'New session'), error, form);

  let gone = false;
  (async () => {
    try {
      const { vfolders } = await api('GET', '/v1/vfolders');
      if (gone) return;
      if (vfolders.length === 0) {
        mountsList.replaceChildren(el('span', { class: 'note', id: 'no-vfolders' }, 'You have no vfolders.'));
        return;
      }
      mountsList.replaceChildren(
        ...vfolders.map((v) => {
          const id = `mount-${v.name}`;
          const box = el('input', { type: 'checkbox', id, name: 'mount', value: v.name, class: 'mount' });
          const perm = el(
            'select',
            { class: 'mount-permission', dataset: { vfolder: v.name }, 'aria-label': `permission of ${v.name}` },
            el('option', { value: 'rw' }, 'read-write'),
            el('option', { value: 'ro' }, 'read-only'),
          );
          return el('div', { class: 'mount-row', dataset: { vfolder: v.name } }, box, ' ', el('label', { htmlFor: id }, v.name), ' ', perm);
        }),
      );
    } catch (e) {
      if (!gone) mountsList.replaceChildren(errorBox(e, 'vfolders-error'));
    }
  })();

  const clear = () => {
    for (const i of Object.values(marked)) i.removeAttribute('aria-invalid');
    for (const e of Object.values(errors)) {
      e.hidden = true;
      e.replaceChildren();
    }
    error.replaceChildren();
  };

  form.addEventListener('submit', async (ev) => {
    ev.preventDefault();
    clear();
    const body = {
      image: inputs.image.value.trim(),
      resource_slots: { cpu: inputs.cpu.value.trim(), mem: inputs.mem.value.trim() },
      type: inputs.type.value,
    };
    if (inputs.priority.value !== '') body.priority = Number(inputs.priority.value);
    if (inputs.cluster_size.value !== '') body.cluster_size = Number(inputs.cluster_size.value);
    if (body.cluster_size !== 1 || inputs.cluster_mode.value !== 'single-node') body.cluster_mode = inputs.cluster_mode.value;
    if (inputs.command.value.trim() !== '') body.command = inputs.command.value;
    const chosen = [...mountsList.querySelectorAll('input.mount:checked')].map((box) => ({
      name: box.value,
      permission: mountsList.querySelector(`select.mount-permission[data-vfolder="${CSS.escape(box.value)}"]`).value,
    }));
    if (chosen.length) body.mounts = chosen;
    submit.disabled = true;
    try {
      const s = await api('POST', '/v1/sessions', body);
      location.hash = `#/sessions/${encodeURIComponent(s.session_id)}`;
    } catch (e) {
      if (gone) return;
      error.replaceChildren(errorBox(e, 'create-refused'));
      // At the fields the refusal is about: marked, and the API's message beside them.
      const names = fieldsOf(e, Object.keys(marked).concat(['mount', 'vfolder']))
        .map((n) => (n === 'mount' || n === 'vfolder' ? 'mounts' : n))
        .filter((n, i, all) => all.indexOf(n) === i);
      for (const n of names) {
        marked[n].setAttribute('aria-invalid', 'true');
        errors[n].textContent = String(e);
        errors[n].hidden = false;
      }
      submit.disabled = false;
    }
  });
  inputs.image.focus();
  return {
    leave() {
      gone = true;
    },
  };
}

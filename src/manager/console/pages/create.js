// #/new: the create form.
import { api, ApiError } from '../lib/api.js';
import { el, errorBox } from '../lib/dom.js';

/** #/new: the create form; the API's refusal is shown at the form. */
export function createPage(main) {
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

// kernelvisor's web console: ES modules, no framework. Every call goes to the manager's API
// with the signed-in key's secret as `Authorization: Bearer …` (never in a URL, a cookie or a
// log); what the API answers is written with `textContent` / text nodes only, never as HTML.
// This module is the shell: sign-in, the event stream, the hash routes (#/sessions,
// #/sessions/<id>, #/new, #/queue, #/events, #/agents, #/keys) and the page shown; each page is
// a module of `pages/` (a function of the main element and the context, answering `{onEvent, leave}`).

import { authHeaders, onUnauthorized, refusal, secret, setSecret } from './lib/api.js';
import { el, errorBox } from './lib/dom.js';
import { followEvents } from './lib/events.js';
import { agentsPage } from './pages/agents.js';
import { createPage } from './pages/create.js';
import { eventsPage } from './pages/events.js';
import { keysPage } from './pages/keys.js';
import { queuePage } from './pages/queue.js';
import { sessionPage } from './pages/session.js';
import { sessionsPage } from './pages/sessions.js';

const main = document.getElementById('main');
let role = null; // 'admin' | 'user' once signed in
let page = null; // the page shown: {onEvent(ev), leave()}
let stopEvents = null; // stops the event stream

function signOut(why) {
  setSecret(null);
  role = null;
  if (stopEvents) stopEvents();
  stopEvents = null;
  setLive(false);
  document.getElementById('nav').hidden = true;
  showSignIn(why);
}
onUnauthorized(signOut);

function setLive(on) {
  const live = document.getElementById('live');
  live.textContent = on ? '● live' : '○ offline';
  live.classList.toggle('on', on);
}

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
    setSecret(value);
    try {
      await signedIn();
    } catch (e) {
      setSecret(null);
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
  // A refused secret is the sign-in form's to show (once), not a sign-out.
  else throw await refusal(r, false);
  document.getElementById('nav').hidden = false;
  for (const a of document.querySelectorAll('nav .admin')) a.hidden = role !== 'admin';
  document.getElementById('role').textContent = `${role} key`;
  if (stopEvents) stopEvents();
  const types = role === 'admin' ? 'session_status,agent_status' : 'session_status';
  stopEvents = followEvents(types, (ev) => page && page.onEvent && page.onEvent(ev), setLive);
  route();
}

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
  const ctx = { role };
  const m = hash.match(/^#\/sessions\/([^/]+)$/);
  if (m) page = sessionPage(main, ctx, decodeURIComponent(m[1]));
  else if (hash === '#/new') page = createPage(main, ctx);
  else if (hash === '#/queue') page = queuePage(main, ctx);
  else if (hash === '#/agents') page = agentsPage(main, ctx);
  else if (hash === '#/events') page = eventsPage(main, ctx);
  else if (hash === '#/keys') page = keysPage(main, ctx);
  else page = sessionsPage(main, ctx);
  main.focus();
}

document.getElementById('sign-out').addEventListener('click', () => signOut());
window.addEventListener('hashchange', route);
if (secret()) {
  signedIn().catch((e) => signOut(e));
} else {
  showSignIn();
}

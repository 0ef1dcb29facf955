// The manager's API as the console calls it: the signed-in key's secret (this tab's
// `sessionStorage`) sent as `Authorization: Bearer …`, never in a URL, a cookie or a log.

const SECRET = 'kernelvisor.secret';
let unauthorized = () => {};

/** What to do when the API answers 401 (the secret is no longer good): the app signs out. */
export function onUnauthorized(fn) {
  unauthorized = fn;
}

/** The signed-in key's secret, or null. */
export function secret() {
  return sessionStorage.getItem(SECRET);
}

/** Keeps (or, with null, forgets) the secret for this tab. */
export function setSecret(value) {
  if (value === null) sessionStorage.removeItem(SECRET);
  else sessionStorage.setItem(SECRET, value);
}

export function authHeaders(extra = {}) {
  return { Authorization: `Bearer ${secret()}`, ...extra };
}

/** The API's error of a refused answer `r`; a 401 also signs out (the secret is no longer good)
 * unless `signOutOn401` is false. */
export async function refusal(r, signOutOn401 = true) {
  const text = await r.text();
  let body = null;
  try {
    body = JSON.parse(text);
  } catch {
    // not the API's JSON (a proxy's page): its text is the message
  }
  const code = body?.error?.code ?? `http-${r.status}`;
  const message = body?.error?.message ?? (text.slice(0, 500) || r.statusText);
  if (r.status === 401 && signOutOn401) unauthorized(message);
  const e = new ApiError(r.status, code, message);
  // `service-failed` carries the service's last output.
  if (typeof body?.error?.output === 'string') e.output = body.error.output;
  return e;
}

/** A JSON call of the API; raises ApiError when refused. */
export async function api(method, path, body) {
  const headers = authHeaders(body === undefined ? {} : { 'Content-Type': 'application/json' });
  const call = () =>
    fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
    });
  let r;
  try {
    r = await call();
  } catch (e) {
    // A read cut off without an answer (the browser's ERR_NETWORK_CHANGED when an interface
    // comes or goes) is asked once more; a change is not (it may have been made).
    if (method !== 'GET') throw e;
    await new Promise((done) => setTimeout(done, 300));
    r = await call();
  }
  if (!r.ok) throw await refusal(r);
  return r.status === 204 ? null : r.json();
}

/** An API refusal: its HTTP status, the API's error code and message. */
export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
  toString() {
    return `${this.message} (${this.status} ${this.code})`;
  }
}

/** base64url of a string, no padding (the pty WebSocket's token subprotocol). */
export function base64url(text) {
  const bytes = new TextEncoder().encode(text);
  let bin = '';
  for (const b of bytes) bin += String.fromCharCode(b);
  return btoa(bin).replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '');
}

//! Who is calling: every request but `GET /health` and the web console's page (`/ui/`) carries `Authorization: Bearer <secret
//! key>`; [`authenticate`] (a middleware around the whole app) finds the access key whose
//! secret it is, refuses the request with 401 `unauthorized` otherwise, and hands the handlers a
//! [`Caller`]. It also writes the audit log: one line per mutating request (tracing target
//! `audit`: access key, method, path, status; never a secret, never a header).
//!
//! A browser's `WebSocket` cannot send an `Authorization` header, so a WebSocket upgrade
//! request (and only one: `GET` with `Upgrade: websocket`) may carry the secret instead as a
//! subprotocol, the way Kubernetes' API server takes a browser's token:
//! `Sec-WebSocket-Protocol: kernelvisor.bearer.<base64url of the secret, no padding>,
//! kernelvisor.pty` ([`BEARER_PROTOCOL_PREFIX`]). It is checked here, in the one auth path; the
//! handler then answers with a subprotocol the client offered that is not the token
//! ([`PTY_PROTOCOL`]), so the browser accepts the handshake. Never a query parameter or a
//! cookie: the secret stays out of URLs, logs and forms.

use std::future::{ready, Ready};

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderMap, AUTHORIZATION, SEC_WEBSOCKET_PROTOCOL, UPGRADE};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use base64::Engine;

use super::ApiState;
use crate::manager::credentials;
use crate::manager::error::ManagerError;
use crate::manager::store::{AccessKeyRow, KernelRow};

/// The authenticated caller of a request.
#[derive(Clone, Debug)]
pub struct Caller {
    /// Its access key (`AK…`).
    pub access_key: String,
    /// Whether the key has the `admin` role.
    pub admin: bool,
}

impl Caller {
    /// Admin routes: agents, access keys, other keys' sessions, `/metrics`.
    ///
    /// Errors: 403 `forbidden` for a `user` key.
    pub fn require_admin(&self) -> Result<(), ManagerError> {
        if self.admin {
            Ok(())
        } else {
            Err(ManagerError::Forbidden(format!(
                "access key `{}` is not an admin key",
                self.access_key
            )))
        }
    }

    /// Whether the caller may see and act on what `owner` owns (its own, or any as admin).
    pub fn may_act_for(&self, owner: &str) -> bool {
        self.admin || self.access_key == owner
    }

    /// `kernel` when the caller may act on it; another key's session is reported exactly as a
    /// missing one, so nothing leaks its existence.
    ///
    /// Errors: 404 `session-not-found`.
    pub fn owned(&self, id: &str, kernel: Option<KernelRow>) -> Result<KernelRow, ManagerError> {
        kernel
            .filter(|k| self.may_act_for(&k.access_key))
            .ok_or_else(|| ManagerError::SessionNotFound(id.to_owned()))
    }
}

impl FromRequest for Caller {
    type Error = ManagerError;
    type Future = Ready<Result<Caller, ManagerError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        // The middleware put it there; a handler reached without it is a routing bug, refused.
        ready(
            req.extensions()
                .get::<Caller>()
                .cloned()
                .ok_or_else(|| ManagerError::Unauthorized("authentication required".into())),
        )
    }
}

/// Routes anyone may call without a token: `GET /health` and the web console's page and
/// assets (`manager::console`; what it shows comes from the API, with the user's token).
fn is_public(req: &ServiceRequest) -> bool {
    (req.path() == "/health" && req.method() == Method::GET)
        || crate::manager::console::is_console_request(req.method(), req.path())
}

/// Prefix of the WebSocket subprotocol that carries the secret on an upgrade request:
/// `kernelvisor.bearer.<base64url of the secret, no padding>`.
pub const BEARER_PROTOCOL_PREFIX: &str = "kernelvisor.bearer.";

/// The subprotocol the pty WebSocket answers with when the client offers it (a browser
/// offering the token protocol must offer a second one for the server to pick: it fails a
/// handshake whose answer names none, or the token).
pub const PTY_PROTOCOL: &str = "kernelvisor.pty";

/// The subprotocols a request offers (`Sec-WebSocket-Protocol`, comma-separated, possibly over
/// several header lines), trimmed, empty ones dropped.
pub fn offered_protocols(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(SEC_WEBSOCKET_PROTOCOL)
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
}

/// Whether a request is a WebSocket upgrade: `GET` with `Upgrade: websocket`.
fn is_websocket_upgrade(method: &Method, headers: &HeaderMap) -> bool {
    method == Method::GET
        && headers
            .get(UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("websocket"))
}

/// The secret a request carries: `Authorization: Bearer <secret>`, or on a WebSocket upgrade
/// without that header the [`BEARER_PROTOCOL_PREFIX`] subprotocol.
///
/// Errors: 401 `unauthorized` when neither is there, when the token is malformed (not
/// base64url, not a secret's shape, more than one token protocol), and when the token protocol
/// comes on a request that is not a WebSocket upgrade (it is for browsers' sockets only). The
/// messages never quote what was sent.
fn secret_of(method: &Method, headers: &HeaderMap) -> Result<String, ManagerError> {
    let mut tokens =
        offered_protocols(headers).filter_map(|p| p.strip_prefix(BEARER_PROTOCOL_PREFIX));
    let token = tokens.next();
    if token.is_some() && !is_websocket_upgrade(method, headers) {
        return Err(ManagerError::Unauthorized(format!(
            "the `{BEARER_PROTOCOL_PREFIX}…` subprotocol is only accepted on a WebSocket upgrade \
             request; send `Authorization: Bearer <secret key>`"
        )));
    }
    if tokens.next().is_some() {
        return Err(ManagerError::Unauthorized(
            "more than one bearer subprotocol".into(),
        ));
    }
    if let Some(header) = headers.get(AUTHORIZATION) {
        return header
            .to_str()
            .ok()
            .and_then(|h| h.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|s| credentials::looks_like_secret(s))
            .map(str::to_owned)
            .ok_or_else(|| ManagerError::Unauthorized("malformed bearer token".into()));
    }
    let Some(token) = token else {
        return Err(ManagerError::Unauthorized(
            "missing `Authorization: Bearer <secret key>` (ctl: --token or KERNELVISOR_TOKEN)"
                .into(),
        ));
    };
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .filter(|s| credentials::looks_like_secret(s))
        .ok_or_else(|| ManagerError::Unauthorized("malformed bearer subprotocol".into()))
}

/// The access key of the request's secret ([`secret_of`]).
///
/// Errors: 401 `unauthorized` (missing, malformed, unknown or disabled), 503 when the store
/// cannot be asked.
async fn caller_of(state: &ApiState, req: &ServiceRequest) -> Result<Caller, ManagerError> {
    let secret = secret_of(req.method(), req.headers())?;
    let secret = secret.as_str();
    let hash = credentials::secret_hash(secret);
    let key: Option<AccessKeyRow> = state.store.access_key_by_secret_hash(&hash).await?;
    match key {
        Some(k)
            if k.enabled
                && k.secret_hash
                    .as_deref()
                    .is_some_and(|h| credentials::verify(secret, h)) =>
        {
            Ok(Caller {
                admin: k.is_admin(),
                access_key: k.access_key,
            })
        }
        Some(k) if !k.enabled => Err(ManagerError::Unauthorized(format!(
            "access key `{}` is disabled",
            k.access_key
        ))),
        _ => Err(ManagerError::Unauthorized("unknown bearer token".into())),
    }
}

/// The middleware: authenticate, run the handler, audit.
///
/// Errors: none of its own; a refused request is answered here (401, or 503
/// `store-unavailable`) without reaching a handler.
pub async fn authenticate(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let mutating = !matches!(*req.method(), Method::GET | Method::HEAD | Method::OPTIONS);
    let (method, path) = (req.method().clone(), req.path().to_owned());
    let mut who = String::from("-");
    let res = if is_public(&req) {
        next.call(req).await?.map_into_boxed_body()
    } else {
        let state = req
            .app_data::<web::Data<ApiState>>()
            .cloned()
            .expect("ApiState is registered");
        match caller_of(&state, &req).await {
            Ok(caller) => {
                who = caller.access_key.clone();
                req.extensions_mut().insert(caller);
                next.call(req).await?.map_into_boxed_body()
            }
            Err(e) => {
                if let ManagerError::StoreUnavailable(_) | ManagerError::Internal(_) = e {
                    tracing::warn!(error = %e, "cannot authenticate a request");
                }
                req.error_response(e).map_into_boxed_body()
            }
        }
    };
    if mutating {
        tracing::info!(target: "audit", access_key = %who, method = %method, path = %path, status = res.status().as_u16(), "api call");
    }
    Ok(res)
}

#[cfg(test)]
mod tests {
    use actix_web::http::header::{HeaderName, HeaderValue};

    use super::*;

    const SECRET: &str = "kvs_0123456789abcdefghijklmnopqrstuvwxyzABCDEFG";

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    fn token(secret: &str) -> String {
        format!(
            "{BEARER_PROTOCOL_PREFIX}{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret)
        )
    }

    fn refused(r: Result<String, ManagerError>) -> String {
        match r {
            Err(ManagerError::Unauthorized(m)) => m,
            other => panic!("expected 401, got {other:?}"),
        }
    }

    #[test]
    fn bearer_header_and_subprotocol() {
        assert!(credentials::looks_like_secret(SECRET));
        let h = headers(&[("authorization", &format!("Bearer {SECRET}"))]);
        assert_eq!(secret_of(&Method::GET, &h).unwrap(), SECRET);

        // The subprotocol, on an upgrade, next to the real one (and over two header lines).
        let offer = format!("{}, {PTY_PROTOCOL}", token(SECRET));
        let h = headers(&[("upgrade", "websocket"), ("sec-websocket-protocol", &offer)]);
        assert_eq!(secret_of(&Method::GET, &h).unwrap(), SECRET);
        assert_eq!(offered_protocols(&h).collect::<Vec<_>>()[1], PTY_PROTOCOL);
        let h = headers(&[
            ("upgrade", "WebSocket"),
            ("sec-websocket-protocol", PTY_PROTOCOL),
            ("sec-websocket-protocol", &token(SECRET)),
        ]);
        assert_eq!(secret_of(&Method::GET, &h).unwrap(), SECRET);
    }

    #[test]
    fn bad_subprotocol_tokens_are_refused_without_echoing_them() {
        let up = |p: &str| headers(&[("upgrade", "websocket"), ("sec-websocket-protocol", p)]);
        // Not base64url; base64url of something that is not a secret; padded; two tokens.
        let padded = format!("{}==", token(SECRET));
        for bad in [
            format!("{BEARER_PROTOCOL_PREFIX}not*base64"),
            token("hello"),
            format!("{BEARER_PROTOCOL_PREFIX}{SECRET}"),
            padded,
            format!("{}, {}", token(SECRET), token(SECRET)),
            BEARER_PROTOCOL_PREFIX.to_owned(),
        ] {
            let m = refused(secret_of(&Method::GET, &up(&bad)));
            assert!(!m.contains(SECRET) && !m.contains("not*base64"), "{m}");
        }
        // Missing: no header, no token protocol (the real one alone is no credential).
        assert!(refused(secret_of(&Method::GET, &headers(&[]))).contains("missing"));
        assert!(refused(secret_of(&Method::GET, &up(PTY_PROTOCOL))).contains("missing"));
    }

    #[test]
    fn the_subprotocol_token_is_refused_off_a_websocket_upgrade() {
        let offer = token(SECRET);
        // A plain GET, a POST claiming an upgrade, another upgrade kind: refused, also when a
        // good Authorization header comes along.
        for (method, upgrade) in [
            (Method::GET, None),
            (Method::POST, Some("websocket")),
            (Method::GET, Some("h2c")),
        ] {
            let mut pairs = vec![("sec-websocket-protocol", offer.as_str())];
            if let Some(u) = upgrade {
                pairs.push(("upgrade", u));
            }
            let m = refused(secret_of(&method, &headers(&pairs)));
            assert!(m.contains("only accepted on a WebSocket upgrade"), "{m}");
            let auth = format!("Bearer {SECRET}");
            pairs.push(("authorization", &auth));
            refused(secret_of(&method, &headers(&pairs)));
        }
    }
}

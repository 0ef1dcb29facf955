//! Who is calling: every request but `GET /health` and the web console's page (`/ui/`) carries `Authorization: Bearer <secret
//! key>`; [`authenticate`] (a middleware around the whole app) finds the access key whose
//! secret it is, refuses the request with 401 `unauthorized` otherwise, and hands the handlers a
//! [`Caller`]. It also writes the audit log: one line per mutating request (tracing target
//! `audit`: access key, method, path, status; never a secret).

use std::future::{ready, Ready};

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::Method;
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};

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

/// The access key of `Authorization: Bearer <secret>`.
///
/// Errors: 401 `unauthorized` (missing, malformed, unknown or disabled), 503 when the store
/// cannot be asked.
async fn caller_of(state: &ApiState, req: &ServiceRequest) -> Result<Caller, ManagerError> {
    let header = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .ok_or_else(|| {
            ManagerError::Unauthorized(
                "missing `Authorization: Bearer <secret key>` (ctl: --token or KERNELVISOR_TOKEN)"
                    .into(),
            )
        })?;
    let secret = header
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|s| credentials::looks_like_secret(s))
        .ok_or_else(|| ManagerError::Unauthorized("malformed bearer token".into()))?;
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

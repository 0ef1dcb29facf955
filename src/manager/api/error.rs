//! `ManagerError` as HTTP: `{"error": {"code", "message"}}` with its status; `starting-up` and
//! `store-unavailable` carry `Retry-After` (seconds), `unauthorized` `WWW-Authenticate: Bearer`
//! (RFC 6750).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use crate::manager::error::ManagerError;
use crate::model::error::{ErrorBody, InvalidField};

/// Seconds a client should wait before retrying after `store-unavailable`.
const STORE_RETRY_AFTER: &str = "5";

impl ResponseError for ManagerError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        let mut resp = HttpResponse::build(self.status_code());
        match self {
            ManagerError::StartingUp(after) => {
                resp.insert_header(("Retry-After", after.as_secs().max(1).to_string()));
            }
            ManagerError::StoreUnavailable(_) => {
                resp.insert_header(("Retry-After", STORE_RETRY_AFTER));
            }
            ManagerError::Unauthorized(_) => {
                resp.insert_header(("WWW-Authenticate", "Bearer realm=\"kernelvisor\""));
            }
            _ => {}
        }
        let mut body = ErrorBody::new(self.code(), &self.to_string());
        if let ManagerError::ServiceFailed { output, .. } = self {
            body.error.output = Some(output.clone());
        }
        resp.json(body)
    }
}

/// An error response outside `ManagerError` (routing: `not-found`, `method-not-allowed`).
pub fn plain(status: StatusCode, code: &str, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(ErrorBody::new(code, message))
}

impl From<InvalidField> for ManagerError {
    fn from(e: InvalidField) -> ManagerError {
        ManagerError::InvalidRequest(e.0)
    }
}

impl From<crate::model::session::GraceError> for ManagerError {
    fn from(e: crate::model::session::GraceError) -> ManagerError {
        use crate::model::session::GraceError;
        match e {
            GraceError::Invalid(f) => ManagerError::InvalidRequest(f.0),
            GraceError::TooLong(m) => ManagerError::GracePeriodTooLong(m),
        }
    }
}

//! `ManagerError` as HTTP: `{"error": {"code", "message"}}` with its status; `starting-up`
//! carries `Retry-After` (seconds).

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};

use crate::manager::error::ManagerError;

impl ResponseError for ManagerError {
    fn status_code(&self) -> StatusCode {
        StatusCode::from_u16(self.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> HttpResponse {
        let mut resp = HttpResponse::build(self.status_code());
        if let ManagerError::StartingUp(after) = self {
            resp.insert_header(("Retry-After", after.as_secs().max(1).to_string()));
        }
        let mut body = error_body(self.code(), &self.to_string());
        if let ManagerError::ServiceFailed { output, .. } = self {
            body["error"]["output"] = output.clone().into();
        }
        resp.json(body)
    }
}

/// The error body.
pub fn error_body(code: &str, message: &str) -> serde_json::Value {
    serde_json::json!({"error": {"code": code, "message": message}})
}

/// An error response outside `ManagerError` (routing: `not-found`, `method-not-allowed`).
pub fn plain(status: StatusCode, code: &str, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(error_body(code, message))
}

//! Error answers many operations share, declared once for the OpenAPI document (utoipa's
//! `IntoResponses`): an operation lists them in its `responses(...)` next to its own rows.
//! Each is the error envelope ([`ErrorBody`]) under one status; the codes are in the
//! description. (What every authenticated operation can answer, 401/500 and the store's 503,
//! [`super::openapi::Fixups`] adds.)

// The variants are never built (a handler's errors are `ManagerError`s): they exist for the
// document only.
#![allow(dead_code)]

use utoipa::IntoResponses;

use crate::model::error::ErrorBody;

/// 502 from routes that call the session's agent.
#[derive(IntoResponses)]
pub enum AgentFailed {
    /// `agent-unavailable` (transient), `agent-error`
    #[response(status = 502)]
    Agent(ErrorBody),
}

/// 503 from kernel routes (refused during the start-up grace) and the store.
#[derive(IntoResponses)]
pub enum StartingUp {
    /// `starting-up` (with `Retry-After`), `store-unavailable`
    #[response(status = 503)]
    Unavailable(ErrorBody),
}

/// 409 from routes that need the session's container running.
#[derive(IntoResponses)]
pub enum NotRunning {
    /// `session-not-running`
    #[response(status = 409)]
    Conflict(ErrorBody),
}

/// 403 from admin routes.
#[derive(IntoResponses)]
pub enum AdminOnly {
    /// `forbidden`: not an admin key
    #[response(status = 403)]
    Forbidden(ErrorBody),
}

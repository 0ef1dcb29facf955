//! Errors the manager gives its users, each with a stable code and HTTP status
//! (`docs/manager-api.md`). Clients branch on the code.

use std::time::Duration;

/// A user-facing manager error.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// Malformed JSON, a missing or ill-typed field, a bad amount. 400 `invalid-request`.
    #[error("{0}")]
    InvalidRequest(String),
    /// The agent has no such image. 400 `image-not-found`.
    #[error("{0}")]
    ImageNotFound(String),
    /// More slots than any agent has in total. 400 `slots-exceed-capacity`.
    #[error("{0}")]
    SlotsExceedCapacity(String),
    /// 404 `session-not-found`.
    #[error("session `{0}` not found")]
    SessionNotFound(String),
    /// 404 `access-key-not-found`.
    #[error("access key `{0}` not found")]
    AccessKeyNotFound(String),
    /// Every agent that could fit it is full now. 409 `no-capacity`.
    #[error("{0}")]
    NoCapacity(String),
    /// `continue` / `input` of an unknown or finished run. 404 `run-not-found`.
    #[error("{0}")]
    RunNotFound(String),
    /// The agent keeps no logs for the kernel. 404 `logs-not-found`.
    #[error("{0}")]
    LogsNotFound(String),
    /// `input` to a run started without stdin. 409 `run-has-no-stdin`.
    #[error("{0}")]
    RunHasNoStdin(String),
    /// 409 `session-not-running`.
    #[error("session `{0}` is {1}, not RUNNING")]
    SessionNotRunning(String, String),
    /// 429 `concurrency-limit-exceeded`.
    #[error("{0}")]
    ConcurrencyLimit(String),
    /// The agent did not answer. 502 `agent-unavailable`.
    #[error("{0}")]
    AgentUnavailable(String),
    /// The agent answered with another error. 502 `agent-error`.
    #[error("{0}")]
    AgentError(String),
    /// Start-up grace period; retry after the duration. 503 `starting-up`.
    #[error("the manager is starting up; retry in {} s", .0.as_secs().max(1))]
    StartingUp(Duration),
    /// No agent is `ALIVE`. 503 `no-agents`.
    #[error("no agent is ALIVE")]
    NoAgents,
    /// The store failed. 500 `internal`.
    #[error("{0}")]
    Internal(String),
}

impl ManagerError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ManagerError::InvalidRequest(_) => "invalid-request",
            ManagerError::ImageNotFound(_) => "image-not-found",
            ManagerError::SlotsExceedCapacity(_) => "slots-exceed-capacity",
            ManagerError::SessionNotFound(_) => "session-not-found",
            ManagerError::AccessKeyNotFound(_) => "access-key-not-found",
            ManagerError::NoCapacity(_) => "no-capacity",
            ManagerError::SessionNotRunning(..) => "session-not-running",
            ManagerError::RunNotFound(_) => "run-not-found",
            ManagerError::LogsNotFound(_) => "logs-not-found",
            ManagerError::RunHasNoStdin(_) => "run-has-no-stdin",
            ManagerError::ConcurrencyLimit(_) => "concurrency-limit-exceeded",
            ManagerError::AgentUnavailable(_) => "agent-unavailable",
            ManagerError::AgentError(_) => "agent-error",
            ManagerError::StartingUp(_) => "starting-up",
            ManagerError::NoAgents => "no-agents",
            ManagerError::Internal(_) => "internal",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            ManagerError::InvalidRequest(_)
            | ManagerError::ImageNotFound(_)
            | ManagerError::SlotsExceedCapacity(_) => 400,
            ManagerError::SessionNotFound(_)
            | ManagerError::AccessKeyNotFound(_)
            | ManagerError::RunNotFound(_)
            | ManagerError::LogsNotFound(_) => 404,
            ManagerError::NoCapacity(_)
            | ManagerError::SessionNotRunning(..)
            | ManagerError::RunHasNoStdin(_) => 409,
            ManagerError::ConcurrencyLimit(_) => 429,
            ManagerError::AgentUnavailable(_) | ManagerError::AgentError(_) => 502,
            ManagerError::StartingUp(_) | ManagerError::NoAgents => 503,
            ManagerError::Internal(_) => 500,
        }
    }
}

impl From<super::store::StoreError> for ManagerError {
    fn from(e: super::store::StoreError) -> Self {
        ManagerError::Internal(e.to_string())
    }
}

impl From<actix::MailboxError> for ManagerError {
    fn from(e: actix::MailboxError) -> Self {
        ManagerError::Internal(format!("manager actor stopped: {e}"))
    }
}

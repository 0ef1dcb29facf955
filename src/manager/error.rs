//! Errors the manager gives its users, each with a stable code and HTTP status
//! (`docs/manager-api.md`). Clients branch on the code.

use std::time::Duration;

/// A user-facing manager error.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// Malformed JSON, a missing or ill-typed field, a bad amount. 400 `invalid-request`.
    #[error("{0}")]
    InvalidRequest(String),
    /// No bearer token, or one no enabled access key has. 401 `unauthorized` (with
    /// `WWW-Authenticate: Bearer`).
    #[error("{0}")]
    Unauthorized(String),
    /// A `user` key on an admin route. 403 `forbidden`.
    #[error("{0}")]
    Forbidden(String),
    /// The caller has no vfolder of this name. 404 `vfolder-not-found`.
    #[error("vfolder `{0}` not found")]
    VfolderNotFound(String),
    /// 409 `vfolder-exists`.
    #[error("vfolder `{0}` exists already")]
    VfolderExists(String),
    /// A live session mounts it. 409 `vfolder-in-use`.
    #[error("{0}")]
    VfolderInUse(String),
    /// The key still has live sessions. 409 `access-key-in-use`.
    #[error("{0}")]
    AccessKeyInUse(String),
    /// The agent has no such image. 400 `image-not-found`.
    #[error("{0}")]
    ImageNotFound(String),
    /// A request naming a resource slot no `ALIVE` agent advertises (`rocm.device` on a CUDA
    /// fleet). 400 `unknown-slot`; the message names the slot.
    #[error("unknown resource slot `{0}`: no ALIVE agent has it")]
    UnknownSlot(String),
    /// More slots than any agent has in total. 400 `slots-exceed-capacity`.
    #[error("{0}")]
    SlotsExceedCapacity(String),
    /// 404 `session-not-found`.
    #[error("session `{0}` not found")]
    SessionNotFound(String),
    /// A kernel selector (`?kernel=`, execute's `kernel`) that names no kernel of the
    /// session; the message names it and the session's kernels. 404 `session-not-found`, the
    /// code of a session that is not there: the session and kernel together name nothing.
    #[error("{0}")]
    KernelNotFound(String),
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
    /// The session has no service port of this name. 404 `service-not-found`.
    #[error("{0}")]
    ServiceNotFound(String),
    /// A service did not start (exited, or not ready in time). 409 `service-failed`; the body
    /// also carries `output`, the tail of the service's output.
    #[error("{message}")]
    ServiceFailed {
        /// What went wrong.
        message: String,
        /// The last bytes (≤ 4 KiB) the service printed.
        output: String,
    },
    /// A path that is absolute, has `..`, leaves `/home/work` through a symlink, or is a
    /// directory where a file is needed. 400 `invalid-path`.
    #[error("{0}")]
    InvalidPath(String),
    /// 404 `file-not-found`.
    #[error("{0}")]
    FileNotFound(String),
    /// An upload without `Content-Length`. 411 `length-required`.
    #[error("{0}")]
    LengthRequired(String),
    /// An upload above `[api] max-upload-size`. 413 `upload-too-large`.
    #[error("{0}")]
    UploadTooLarge(String),
    /// 409 `session-not-running`.
    #[error("session `{0}` is {1}, not RUNNING")]
    SessionNotRunning(String, String),
    /// 429 `concurrency-limit-exceeded`.
    #[error("{0}")]
    ConcurrencyLimit(String),
    /// The image's registry cannot be reached from the agent. 502 `registry-unreachable`.
    #[error("{0}")]
    RegistryUnreachable(String),
    /// The image's registry refused the configured credentials (or wanted some). 502
    /// `registry-auth-failed`.
    #[error("{0}")]
    RegistryAuthFailed(String),
    /// The image pull outlasted the agent's `[container] image-pull-timeout`. 504
    /// `image-pull-timeout`.
    #[error("{0}")]
    ImagePullTimeout(String),
    /// The agent did not answer. 502 `agent-unavailable`.
    #[error("{0}")]
    AgentUnavailable(String),
    /// The agent answered with another error. 502 `agent-error`.
    #[error("{0}")]
    AgentError(String),
    /// A cluster session's network could not be made (the Swarm manager's engine refused or
    /// did not answer, or the agent's `create_local_network` failed). 502
    /// `cluster-network-failed`.
    #[error("{0}")]
    ClusterNetworkFailed(String),
    /// Start-up grace period; retry after the duration. 503 `starting-up`.
    #[error("the manager is starting up; retry in {} s", .0.as_secs().max(1))]
    StartingUp(Duration),
    /// No agent is `ALIVE`. 503 `no-agents`.
    #[error("no agent is ALIVE")]
    NoAgents,
    /// The store cannot be reached (connection refused, pool timeout, database gone); retry
    /// after the duration. 503 `store-unavailable`.
    #[error("the manager's store is unavailable: {0}")]
    StoreUnavailable(String),
    /// No agent with this id is known. 404 `agent-not-found`.
    #[error("agent `{0}` not found")]
    AgentNotFound(String),
    /// The session has no commit this manager knows of. 404 `commit-not-found`.
    #[error("{0}")]
    CommitNotFound(String),
    /// A commit of the session is still committing or pushing. 409 `commit-in-progress`.
    #[error("{0}")]
    CommitInProgress(String),
    /// A `grace_period` (session request, `DELETE ?grace=`) above `[scheduler]
    /// max-grace-period`. 400 `grace-period-too-long`.
    #[error("{0}")]
    GracePeriodTooLong(String),
    /// A bug or an unexpected store answer. 500 `internal`.
    #[error("{0}")]
    Internal(String),
}

impl ManagerError {
    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            ManagerError::InvalidRequest(_) => "invalid-request",
            ManagerError::Unauthorized(_) => "unauthorized",
            ManagerError::Forbidden(_) => "forbidden",
            ManagerError::VfolderNotFound(_) => "vfolder-not-found",
            ManagerError::VfolderExists(_) => "vfolder-exists",
            ManagerError::VfolderInUse(_) => "vfolder-in-use",
            ManagerError::AccessKeyInUse(_) => "access-key-in-use",
            ManagerError::StoreUnavailable(_) => "store-unavailable",
            ManagerError::ImageNotFound(_) => "image-not-found",
            ManagerError::SlotsExceedCapacity(_) => "slots-exceed-capacity",
            ManagerError::UnknownSlot(_) => "unknown-slot",
            ManagerError::SessionNotFound(_) | ManagerError::KernelNotFound(_) => {
                "session-not-found"
            }
            ManagerError::AccessKeyNotFound(_) => "access-key-not-found",
            ManagerError::NoCapacity(_) => "no-capacity",
            ManagerError::SessionNotRunning(..) => "session-not-running",
            ManagerError::RunNotFound(_) => "run-not-found",
            ManagerError::LogsNotFound(_) => "logs-not-found",
            ManagerError::RunHasNoStdin(_) => "run-has-no-stdin",
            ManagerError::ServiceNotFound(_) => "service-not-found",
            ManagerError::ServiceFailed { .. } => "service-failed",
            ManagerError::InvalidPath(_) => "invalid-path",
            ManagerError::FileNotFound(_) => "file-not-found",
            ManagerError::LengthRequired(_) => "length-required",
            ManagerError::UploadTooLarge(_) => "upload-too-large",
            ManagerError::ConcurrencyLimit(_) => "concurrency-limit-exceeded",
            ManagerError::RegistryUnreachable(_) => "registry-unreachable",
            ManagerError::RegistryAuthFailed(_) => "registry-auth-failed",
            ManagerError::ImagePullTimeout(_) => "image-pull-timeout",
            ManagerError::AgentUnavailable(_) => "agent-unavailable",
            ManagerError::AgentError(_) => "agent-error",
            ManagerError::ClusterNetworkFailed(_) => "cluster-network-failed",
            ManagerError::StartingUp(_) => "starting-up",
            ManagerError::NoAgents => "no-agents",
            ManagerError::AgentNotFound(_) => "agent-not-found",
            ManagerError::CommitNotFound(_) => "commit-not-found",
            ManagerError::CommitInProgress(_) => "commit-in-progress",
            ManagerError::GracePeriodTooLong(_) => "grace-period-too-long",
            ManagerError::Internal(_) => "internal",
        }
    }

    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            ManagerError::InvalidRequest(_)
            | ManagerError::InvalidPath(_)
            | ManagerError::ImageNotFound(_)
            | ManagerError::UnknownSlot(_)
            | ManagerError::SlotsExceedCapacity(_)
            | ManagerError::GracePeriodTooLong(_) => 400,
            ManagerError::Unauthorized(_) => 401,
            ManagerError::Forbidden(_) => 403,
            ManagerError::SessionNotFound(_)
            | ManagerError::KernelNotFound(_)
            | ManagerError::VfolderNotFound(_)
            | ManagerError::AccessKeyNotFound(_)
            | ManagerError::RunNotFound(_)
            | ManagerError::LogsNotFound(_)
            | ManagerError::ServiceNotFound(_)
            | ManagerError::FileNotFound(_)
            | ManagerError::AgentNotFound(_)
            | ManagerError::CommitNotFound(_) => 404,
            ManagerError::LengthRequired(_) => 411,
            ManagerError::UploadTooLarge(_) => 413,
            ManagerError::NoCapacity(_)
            | ManagerError::VfolderExists(_)
            | ManagerError::VfolderInUse(_)
            | ManagerError::AccessKeyInUse(_)
            | ManagerError::SessionNotRunning(..)
            | ManagerError::RunHasNoStdin(_)
            | ManagerError::ServiceFailed { .. }
            | ManagerError::CommitInProgress(_) => 409,
            ManagerError::ConcurrencyLimit(_) => 429,
            ManagerError::AgentUnavailable(_)
            | ManagerError::AgentError(_)
            | ManagerError::ClusterNetworkFailed(_)
            | ManagerError::RegistryUnreachable(_)
            | ManagerError::RegistryAuthFailed(_) => 502,
            ManagerError::ImagePullTimeout(_) => 504,
            ManagerError::StartingUp(_)
            | ManagerError::NoAgents
            | ManagerError::StoreUnavailable(_) => 503,
            ManagerError::Internal(_) => 500,
        }
    }
}

impl From<super::store::StoreError> for ManagerError {
    fn from(e: super::store::StoreError) -> Self {
        if e.is_unavailable() {
            ManagerError::StoreUnavailable(e.to_string())
        } else {
            ManagerError::Internal(e.to_string())
        }
    }
}

impl From<actix::MailboxError> for ManagerError {
    fn from(e: actix::MailboxError) -> Self {
        ManagerError::Internal(format!("manager actor stopped: {e}"))
    }
}

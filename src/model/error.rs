//! The error envelope of every 4xx/5xx answer: `{"error": {"code", "message"}}` (and `output`
//! for `service-failed`). Clients branch on `code` (`docs/manager-api.md`, "Error codes").

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The error envelope of every 4xx/5xx answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ErrorBody {
    /// The error.
    #[schema(required = true)]
    pub error: ErrorDetail,
}

impl ErrorBody {
    /// The envelope of `code` with a human `message`.
    pub fn new(code: &str, message: &str) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                code: code.to_owned(),
                message: message.to_owned(),
                output: None,
            },
        }
    }
}

/// An error: a stable code and a human message.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ErrorDetail {
    /// The stable code: clients branch on it, never on `message`.
    // A string, so that a reader takes a code it does not know yet.
    #[schema(value_type = ErrorCode, required = true)]
    pub code: String,
    /// Human text.
    #[schema(required = true)]
    pub message: String,
    /// `service-failed` only: the last 4 KiB the service printed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = String)]
    pub output: Option<String>,
}

/// Every error code (`docs/manager-api.md`, "Error codes").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    /// 400: malformed JSON, a missing or ill-typed field, a bad amount or parameter.
    InvalidRequest,
    /// 400: the image is not on the agent and its registry has no such image or tag.
    ImageNotFound,
    /// 400: more slots than any agent has in total.
    SlotsExceedCapacity,
    /// 400: a resource slot no `ALIVE` agent has.
    UnknownSlot,
    /// 400: an absolute path, `..`, a symlink out of `/home/work`, or a directory.
    InvalidPath,
    /// 401: no, or a bad, bearer token.
    Unauthorized,
    /// 403: a user key on an admin route.
    Forbidden,
    /// 404: no such route.
    NotFound,
    /// 404.
    SessionNotFound,
    /// 404.
    AccessKeyNotFound,
    /// 404.
    VfolderNotFound,
    /// 404: an unknown or finished run.
    RunNotFound,
    /// 404: the agent keeps no logs for the kernel.
    LogsNotFound,
    /// 404: the session has no service port of that name.
    ServiceNotFound,
    /// 404.
    FileNotFound,
    /// 404: no agent with that id.
    AgentNotFound,
    /// 404: the session has no commit this manager knows of.
    CommitNotFound,
    /// 405: wrong method on a known route.
    MethodNotAllowed,
    /// 409: every agent that could fit it is full now.
    NoCapacity,
    /// 409.
    SessionNotRunning,
    /// 409: `input` to a run started without stdin.
    RunHasNoStdin,
    /// 409: a service did not start (the error has `output`).
    ServiceFailed,
    /// 409.
    VfolderExists,
    /// 409: a live session mounts it.
    VfolderInUse,
    /// 409: the key still has live sessions.
    AccessKeyInUse,
    /// 409: a commit of the session is still committing or pushing.
    CommitInProgress,
    /// 411: an upload without `Content-Length`.
    LengthRequired,
    /// 413: an upload above `[api] max-upload-size`.
    UploadTooLarge,
    /// 429: the access key is at its concurrency limit.
    ConcurrencyLimitExceeded,
    /// 500.
    Internal,
    /// 502: the agent did not answer (transient).
    AgentUnavailable,
    /// 502: the agent answered with another error.
    AgentError,
    /// 502: the image's registry cannot be reached from the agent.
    RegistryUnreachable,
    /// 502: the image's registry refused the configured credentials.
    RegistryAuthFailed,
    /// 502: a cluster session's network could not be made.
    ClusterNetworkFailed,
    /// 504: the image pull outlasted the agent's `[container] image-pull-timeout`.
    ImagePullTimeout,
    /// 503: start-up grace period (kernel routes).
    StartingUp,
    /// 503: no agent is `ALIVE`.
    NoAgents,
    /// 503: the store cannot be reached.
    StoreUnavailable,
}

/// A request field the API refuses: the message names the field (400 `invalid-request`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidField(pub String);

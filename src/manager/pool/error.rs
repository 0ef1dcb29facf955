//! Errors of the agent pool.

use crate::rpc::CallError;

/// The pool will not call this agent now (Backend.AI's `AgentConnectionUnavailable`): it is
/// unknown, its connection could not be opened, or its entry is unhealthy and awaiting the
/// health check's recovery or eviction. The manager's API maps it to HTTP 503.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("agent {agent_id} connection unavailable: {reason}")]
pub struct AgentConnectionUnavailable {
    /// The agent asked for.
    pub agent_id: String,
    /// Why, e.g. `connection unhealthy`, `unknown agent`, or the handshake error.
    pub reason: String,
}

/// Why a call through the pool failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AgentCallError {
    /// The pool refused the call before sending it.
    #[error(transparent)]
    Unavailable(#[from] AgentConnectionUnavailable),
    /// The call was sent and failed; see [`CallError::is_connection_error`].
    #[error("agent {agent_id}: {source}")]
    Call {
        /// The agent called.
        agent_id: String,
        /// What went wrong.
        source: CallError,
    },
}

impl AgentCallError {
    /// The remote FAILURE, when the agent's handler answered with one.
    pub fn failure(&self) -> Option<&crate::rpc::ErrorMeta> {
        match self {
            AgentCallError::Call {
                source: CallError::Failure(meta),
                ..
            } => Some(meta),
            _ => None,
        }
    }
}

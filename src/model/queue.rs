//! The session queue as the API shows it: why a `PENDING` session waits ([`PendingReason`],
//! its stable [`PendingCode`]s) and the admission order's policy ([`QueuePolicy`]).
//!
//! The codes follow Slurm's pending reasons (`Resources`, `Priority`, `QOSMaxJobsPerUserLimit`,
//! …): a short stable word for scripts, a sentence for people.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Why a `PENDING` session waits: a stable `code` and a `message` for people (naming, for
/// `no-capacity`, the slot short and the best agent's free amount).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct PendingReason {
    /// One of [`PendingCode`]'s names: `no-capacity`, `concurrency-limit`, `agents-cordoned`,
    /// `priority`, `no-alive-agent`, `queued`.
    #[schema(required = true)]
    pub code: String,
    /// What it waits for, in words.
    #[schema(required = true)]
    pub message: String,
}

impl PendingReason {
    /// A reason of `code` with `message`.
    pub fn new(code: PendingCode, message: impl Into<String>) -> PendingReason {
        PendingReason {
            code: code.as_str().to_owned(),
            message: message.into(),
        }
    }
}

/// The stable codes of [`PendingReason`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingCode {
    /// No schedulable agent has the free slots now (one could in total).
    NoCapacity,
    /// Its access key has `concurrency_limit` live sessions.
    ConcurrencyLimit,
    /// Only cordoned (or draining) agents could fit it.
    AgentsCordoned,
    /// Sessions ahead of it (higher priority, or a head of its priority that does not fit yet)
    /// go first.
    Priority,
    /// No agent is `ALIVE`.
    NoAliveAgent,
    /// Just queued; the next admission round looks at it.
    Queued,
}

impl PendingCode {
    /// The API's name.
    pub fn as_str(self) -> &'static str {
        match self {
            PendingCode::NoCapacity => "no-capacity",
            PendingCode::ConcurrencyLimit => "concurrency-limit",
            PendingCode::AgentsCordoned => "agents-cordoned",
            PendingCode::Priority => "priority",
            PendingCode::NoAliveAgent => "no-alive-agent",
            PendingCode::Queued => "queued",
        }
    }
}

/// The order of admission within one priority (`[scheduler] policy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum QueuePolicy {
    /// First queued, first admitted (Backend.AI's `fifo`).
    #[default]
    Fifo,
    /// Dominant resource fairness across access keys: the next session is the oldest one of
    /// the key whose largest share of any resource slot (its live sessions' slots over the
    /// schedulable agents' total) is smallest (Ghodsi et al., NSDI 2011; Backend.AI's `drf`).
    Drf,
}

/// Priorities a session may ask for: 0 (lowest) to 100; Backend.AI's default is 10.
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i64> = 0..=100;

/// A session's priority when its request names none (Backend.AI's `DEFAULT_PRIORITY`).
pub const DEFAULT_PRIORITY: i64 = 10;

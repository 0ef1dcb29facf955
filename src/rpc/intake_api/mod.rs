//! The manager's event intake as a typed contract: the two methods an agent calls on it
//! (`docs/events.md`), with the serde types of their arguments and replies, as
//! [`agent_api`](super::agent_api) is for the calls the other way. The agent builds these
//! types and the manager, the benches and the tests read them, so the ends cannot drift apart.
//!
//! - [`events`]: `agent_events(agent_id, events)` → [`EventsReply`]: [`events::AgentEvent`].
//! - [`heartbeat`]: `agent_heartbeat(agent_id, info)` → `{}`: [`heartbeat::HeartbeatInfo`].
//!
//! Reading is as lenient as the intake has always been: unknown keys are ignored (a newer agent
//! adds fields), a nil value is an absent key, and a field a receiver defaulted keeps its
//! default ([`lenient`]).

pub mod events;
pub mod heartbeat;
pub mod lenient;

use serde::{Deserialize, Serialize};

/// The intake method that takes a batch of events: `agent_events(agent_id, events)`.
pub const EVENTS_METHOD: &str = "agent_events";

/// The intake method that takes a heartbeat: `agent_heartbeat(agent_id, info)`.
pub const HEARTBEAT_METHOD: &str = "agent_heartbeat";

/// The reply of `agent_events`: `{"acked": [id, …]}`, the ids the agent may delete from its
/// outbox (applied, duplicate or compacted ones).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsReply {
    /// Acked event ids, in the batch's order.
    pub acked: Vec<String>,
}

//! Agents as the manager knows them: `GET /v1/agents` (admin), and the body of
//! `POST /v1/agents/{id}/drain`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::slots::{slot_amounts_schema, slot_types_schema, SlotAmounts};

/// An agent's liveness status, as stored in `agents.status` and shown by the API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum AgentStatus {
    /// Heard from within the heartbeat timeout: kernels may be placed on it.
    Alive,
    /// No replica heard from it within the heartbeat timeout: its kernels were released.
    Lost,
    /// Lost, then heard from again: being reset (`reset_instance`); nothing is placed on it.
    Pending,
    /// Shut down cleanly (`agent_terminated`); its kernels stay live.
    Terminated,
}

impl AgentStatus {
    /// Every status, in the order the metrics list them.
    pub const ALL: [AgentStatus; 4] = [
        AgentStatus::Alive,
        AgentStatus::Lost,
        AgentStatus::Pending,
        AgentStatus::Terminated,
    ];

    /// The stored and shown name: `ALIVE`, `LOST`, `PENDING`, `TERMINATED`.
    pub const fn as_str(self) -> &'static str {
        match self {
            AgentStatus::Alive => "ALIVE",
            AgentStatus::Lost => "LOST",
            AgentStatus::Pending => "PENDING",
            AgentStatus::Terminated => "TERMINATED",
        }
    }

    /// Whether the agent was lost and has not been reset since (`LOST` or `PENDING`): the
    /// kernel lists of its heartbeats are ignored, it must be reset before it is used again.
    pub const fn needs_reset(self) -> bool {
        matches!(self, AgentStatus::Lost | AgentStatus::Pending)
    }

    /// Whether kernels may be placed on it (only `ALIVE`).
    pub const fn places_kernels(self) -> bool {
        matches!(self, AgentStatus::Alive)
    }
}

impl fmt::Display for AgentStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored status that is none of the four.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown agent status `{0}`")]
pub struct UnknownAgentStatus(pub String);

impl FromStr for AgentStatus {
    type Err = UnknownAgentStatus;

    /// Parses a stored name (exact, upper case).
    ///
    /// Errors: [`UnknownAgentStatus`] for anything else.
    fn from_str(s: &str) -> Result<AgentStatus, UnknownAgentStatus> {
        AgentStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| UnknownAgentStatus(s.to_owned()))
    }
}

/// An agent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Agent {
    /// Agent id.
    #[schema(required = true)]
    pub agent_id: String,
    /// Liveness.
    // A string, so that a reader takes a status it does not know yet.
    #[schema(value_type = AgentStatus, required = true)]
    pub status: String,
    /// `tcp://host:port` of its RPC server.
    #[schema(required = true)]
    pub addr: Option<String>,
    /// Region.
    #[schema(required = true)]
    pub region: Option<String>,
    /// Agent version.
    #[schema(required = true)]
    pub version: Option<String>,
    /// Every slot it has (`cpu`, `mem`, accelerator slots such as `cuda.device`), in total.
    #[schema(schema_with = slot_amounts_schema, required = true)]
    pub slots_total: SlotAmounts,
    /// What the manager has placed there: its live kernels' slots, summed, over the same slots.
    #[schema(schema_with = slot_amounts_schema, required = true)]
    pub slots_used: SlotAmounts,
    /// Each slot's unit: `count`, `bytes` or `unique` (`slot_key_and_units`).
    #[schema(schema_with = slot_types_schema, required = true)]
    pub slot_types: BTreeMap<String, String>,
    /// Live kernels placed there.
    #[schema(value_type = i64, required = true)]
    pub kernels: Option<i64>,
    /// Unix seconds of its newest heartbeat.
    #[schema(required = true)]
    pub last_heartbeat: Option<f64>,
    /// How many image references its engine holds, as its newest heartbeat to this manager
    /// listed them (at most 1,000; 0 before one did): what image-aware placement knows of it.
    #[schema(required = true)]
    pub image_count: i64,
    /// Whether new sessions may be placed on it: `false` once cordoned or draining
    /// (Backend.AI's `schedulable`); `POST /v1/agents/{id}/uncordon` sets it again.
    #[schema(required = true)]
    pub schedulable: bool,
    /// Whether it is being drained (`POST /v1/agents/{id}/drain`): cordoned, its sessions end
    /// by themselves or at `drain_deadline`. Stays `true` once they have all ended, until it
    /// is uncordoned.
    #[schema(required = true)]
    pub draining: bool,
    /// Unix seconds at which a drain terminates its remaining sessions (status reason
    /// `agent-drained`); `null` when not draining or draining without a deadline.
    #[schema(required = true)]
    pub drain_deadline: Option<f64>,
}

/// `POST /v1/agents/{id}/drain`'s body (optional: no body drains without a deadline).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// Seconds from now after which the sessions still on the agent are terminated
    /// (`agent-drained`); a number above 0. Absent or `null`: no deadline, its sessions end
    /// by themselves. Written as an integer when whole (`3600`), as ctl always wrote it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_seconds"
    )]
    pub deadline: Option<f64>,
}

/// `Some(secs)` as a JSON number: an integer when whole and exact in an `f64` (`3600`), else a
/// float (`0.5`).
fn whole_seconds<S: serde::Serializer>(secs: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match *secs {
        Some(n) if n.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(&n) => {
            s.serialize_u64(n as u64)
        }
        Some(n) => s.serialize_f64(n),
        None => s.serialize_none(),
    }
}

/// `GET /v1/agents`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct AgentList {
    /// Every known agent.
    #[schema(required = true)]
    pub agents: Vec<Agent>,
}

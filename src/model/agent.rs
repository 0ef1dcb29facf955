//! Agents as the manager knows them: `GET /v1/agents` (admin).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::slots::{slot_amounts_schema, slot_types_schema, SlotAmounts};

/// An agent's liveness.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum AgentStatus {
    /// Heartbeating.
    Alive,
    /// Missed heartbeats.
    Lost,
    /// Known, not heard from since the manager started.
    Pending,
    /// Shut down.
    Terminated,
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
}

/// `GET /v1/agents`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct AgentList {
    /// Every known agent.
    #[schema(required = true)]
    pub agents: Vec<Agent>,
}

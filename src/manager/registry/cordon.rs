//! Cordon and drain in the registry's memory: the scheduling flags of an agent row
//! (`schedulable`, `draining`, `drain_deadline`; Backend.AI's `schedulable`, Nomad's node
//! drain) that placement reads through [`super::PlacementCandidates`].
//!
//! The store is their truth (`Store::set_agent_schedulable`, `Store::drain_agent`): the API
//! writes them there, then tells this replica's registry at once ([`SetScheduling`]); the other
//! replicas take them from the row they re-read within a second ([`AgentRegistry::merge`]).
//! Heartbeat flushes never write them (`upsert_in` leaves the columns alone), so a replica's
//! older copy cannot undo a cordon.

use actix::prelude::*;

use super::queries::AgentSnapshot;
use super::AgentRegistry;
use crate::manager::store::{now, AgentRow};

/// The scheduling flags of one agent row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scheduling {
    /// Takes new sessions (`false`: cordoned).
    pub schedulable: bool,
    /// Being drained.
    pub draining: bool,
    /// Unix seconds its remaining sessions are terminated at (`agent-drained`); `None`: no
    /// deadline.
    pub drain_deadline: Option<f64>,
}

impl Scheduling {
    /// The flags `row` carries.
    pub fn of(row: &AgentRow) -> Scheduling {
        Scheduling {
            schedulable: row.schedulable,
            draining: row.draining,
            drain_deadline: row.drain_deadline,
        }
    }

    /// Puts them into `row`.
    pub fn apply_to(self, row: &mut AgentRow) {
        row.schedulable = self.schedulable;
        row.draining = self.draining;
        row.drain_deadline = self.drain_deadline;
    }
}

/// The flags this replica just wrote to the store for `agent_id` (the row the store answered):
/// taken into the registry's copy now, so the next placement sees them. Answers the agent as
/// `GET /v1/agents` shows it, `None` when the registry does not know it (yet).
#[derive(Message)]
#[rtype(result = "Option<AgentSnapshot>")]
pub struct SetScheduling {
    /// Agent id.
    pub agent_id: String,
    /// Its flags as stored.
    pub flags: Scheduling,
}

impl Handler<SetScheduling> for AgentRegistry {
    type Result = Option<AgentSnapshot>;

    fn handle(&mut self, msg: SetScheduling, _: &mut Context<Self>) -> Self::Result {
        let s = self.agents.get_mut(&msg.agent_id)?;
        msg.flags.apply_to(&mut s.row);
        // A re-read of the others' rows that began before this write may still answer the old
        // flags: `merge` ignores flags read before this moment.
        s.scheduling_set_at = now();
        self.candidates = None;
        Some(AgentSnapshot {
            row: s.row.clone(),
            image_count: s.images.len(),
        })
    }
}

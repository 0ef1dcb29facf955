//! What the registry answers: the agents as the API shows them, their counts by status, an
//! agent's address, placement candidates and their images, the start-up grace, and the flush
//! at shutdown.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::AgentRegistry;
use crate::manager::store::AgentRow;

/// What the API shows of one agent.
#[derive(Clone, Debug)]
pub struct AgentSnapshot {
    /// The row (status, address, slots total, last heartbeat).
    pub row: AgentRow,
    /// How many image references its newest heartbeat to this replica listed.
    pub image_count: usize,
}

/// Every known agent.
#[derive(Message)]
#[rtype(result = "Vec<AgentSnapshot>")]
pub struct ListAgents;

impl Handler<ListAgents> for AgentRegistry {
    type Result = MessageResult<ListAgents>;
    fn handle(&mut self, _: ListAgents, _: &mut Context<Self>) -> Self::Result {
        let mut v: Vec<AgentSnapshot> = self
            .agents
            .values()
            .map(|s| AgentSnapshot {
                row: s.row.clone(),
                image_count: s.images.len(),
            })
            .collect();
        v.sort_by(|a, b| a.row.id.cmp(&b.row.id));
        MessageResult(v)
    }
}

/// How many agents are in each status (`/health`, `/metrics`; without copying every row).
#[derive(Message)]
#[rtype(result = "HashMap<String, usize>")]
pub struct CountByStatus;

impl Handler<CountByStatus> for AgentRegistry {
    type Result = MessageResult<CountByStatus>;
    fn handle(&mut self, _: CountByStatus, _: &mut Context<Self>) -> Self::Result {
        let mut counts = HashMap::new();
        for s in self.agents.values() {
            *counts.entry(s.row.status.as_str().to_owned()).or_insert(0) += 1;
        }
        MessageResult(counts)
    }
}

/// One agent's RPC address (`tcp://host:port`), if the registry knows it.
#[derive(Message)]
#[rtype(result = "Option<String>")]
pub struct AgentAddr(pub String);

impl Handler<AgentAddr> for AgentRegistry {
    type Result = Option<String>;
    fn handle(&mut self, AgentAddr(id): AgentAddr, _: &mut Context<Self>) -> Option<String> {
        self.agents.get(&id).and_then(|s| s.row.addr.clone())
    }
}

/// `ALIVE` agents with an address and some `cpu`: where the scheduler may place. Each row carries
/// its slots in total and their types (the scheduler's known slots are their union).
#[derive(Message)]
#[rtype(result = "Arc<Vec<AgentRow>>")]
pub struct PlacementCandidates;

impl Handler<PlacementCandidates> for AgentRegistry {
    type Result = MessageResult<PlacementCandidates>;
    fn handle(&mut self, _: PlacementCandidates, ctx: &mut Context<Self>) -> Self::Result {
        // Placement sees every heartbeat the intake took before it asked, not only the last batch.
        if self.mode.is_normal() {
            self.take_heartbeats(ctx);
        }
        let agents = &self.agents;
        let list = self.candidates.get_or_insert_with(|| {
            Arc::new(
                agents
                    .values()
                    .filter(|s| {
                        s.row.status.places_kernels()
                            && s.endpoint.is_some()
                            && s.row.slots_total.get(crate::slots::CPU) > crate::slots::Amount::ZERO
                    })
                    .map(|s| s.row.clone())
                    .collect(),
            )
        });
        MessageResult(list.clone())
    }
}

/// Agent id → the references of the images its engine holds (as the engine names them,
/// [`crate::agent::node::normalize_image`]), from its newest heartbeat this replica took.
pub type AgentImageSets = HashMap<String, Arc<HashSet<String>>>;

/// Every agent's local images, for image-aware placement (the scheduler's `place`).
/// Only what this replica's intake heard: with several replicas, an agent reporting to another
/// one is absent (placed on as if it held nothing). Cached until an agent's images change.
#[derive(Message)]
#[rtype(result = "Arc<AgentImageSets>")]
pub struct AgentImages;

impl Handler<AgentImages> for AgentRegistry {
    type Result = MessageResult<AgentImages>;
    fn handle(&mut self, _: AgentImages, _: &mut Context<Self>) -> Self::Result {
        let agents = &self.agents;
        let sets = self.image_sets.get_or_insert_with(|| {
            Arc::new(
                agents
                    .iter()
                    .filter(|(_, s)| !s.images.is_empty())
                    .map(|(id, s)| (id.clone(), s.images.clone()))
                    .collect(),
            )
        });
        MessageResult(sets.clone())
    }
}

/// `Some(remaining)` while the start-up grace period (or the reconciliation after it) runs.
#[derive(Message)]
#[rtype(result = "Option<Duration>")]
pub struct GraceRemaining;

impl Handler<GraceRemaining> for AgentRegistry {
    type Result = Option<Duration>;
    fn handle(&mut self, _: GraceRemaining, _: &mut Context<Self>) -> Self::Result {
        self.mode.refusing(Instant::now())
    }
}

/// Writes every changed row now (on shutdown, and for a cordon or drain of an agent whose
/// row is not written yet).
#[derive(Message)]
#[rtype(result = "()")]
pub struct FlushAgents;

impl Handler<FlushAgents> for AgentRegistry {
    type Result = ResponseActFuture<Self, ()>;
    fn handle(&mut self, _: FlushAgents, _: &mut Context<Self>) -> Self::Result {
        let rows = self.take_dirty();
        let store = self.store.clone();
        Box::pin(
            async move {
                if let Err(e) = store.save_agents(&rows).await {
                    tracing::error!(error = %e, "could not save agent rows");
                }
            }
            .into_actor(self),
        )
    }
}

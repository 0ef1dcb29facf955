//! Agent events into the store, exactly once in effect (`docs/events.md`): agent-level events
//! (`agent_started`, `agent_terminated`) change liveness first, in order.

use actix::prelude::*;

use super::{liveness, AgentRegistry};
use crate::manager::events::{superseded, AgentEvent, EventBody};
use crate::manager::store::Applied;

/// A batch of one agent's events, oldest first. Answers the ids to ack: applied, duplicate or
/// compacted ones; an event the store could not take is left out (the agent resends it), and
/// so is every later one of the batch, to keep each kernel's events in order.
#[derive(Message)]
#[rtype(result = "Vec<String>")]
pub struct ApplyEvents {
    /// The sending agent.
    pub agent_id: String,
    /// Parsed events.
    pub events: Vec<AgentEvent>,
}

impl Handler<ApplyEvents> for AgentRegistry {
    type Result = ResponseActFuture<Self, Vec<String>>;

    fn handle(&mut self, msg: ApplyEvents, ctx: &mut Context<Self>) -> Self::Result {
        let skip = superseded(&msg.events);
        // Agent-level events change liveness now, in order; the store records them with their ids.
        let mut plan = Vec::with_capacity(msg.events.len());
        for (ev, skip) in msg.events.into_iter().zip(skip) {
            let row = match &ev.body {
                EventBody::AgentStarted => {
                    self.seen(&msg.agent_id);
                    self.transition(&msg.agent_id, liveness::heard, ctx);
                    Some(self.state(&msg.agent_id).row.clone())
                }
                EventBody::AgentTerminated { reason } => {
                    // A lost agent stays LOST: it must be reset before it is used again.
                    if !self.state(&msg.agent_id).row.status.needs_reset() {
                        tracing::info!(agent_id = %msg.agent_id, %reason, "agent terminated");
                    }
                    self.transition(&msg.agent_id, |l, _| liveness::terminated(l), ctx);
                    Some(self.state(&msg.agent_id).row.clone())
                }
                _ => None,
            };
            plan.push((ev, row, skip));
        }
        let (store, metrics, agent_id) = (self.store.clone(), self.metrics.clone(), msg.agent_id);
        Box::pin(
            async move {
                let mut acked = Vec::with_capacity(plan.len());
                for (ev, row, skip) in plan {
                    match store.apply_event(&agent_id, &ev, row.as_ref(), skip).await {
                        Ok(Applied::Applied) => {
                            metrics.events_applied.with_label_values(&[ev.body.name()]).inc();
                            if let EventBody::KernelDangling { kernel_id, container_id, session_id, running, host_ports, adoptable } = &ev.body {
                                tracing::warn!(%agent_id, %kernel_id, %container_id, %session_id, running, ?host_ports, adoptable, "agent reports a dangling container");
                                metrics.dangling_kernels.with_label_values(&["reported"]).inc();
                            }
                        }
                        Ok(Applied::Duplicate) => metrics.events_duplicate.inc(),
                        Ok(Applied::Compacted) => metrics.events_compacted.inc(),
                        Err(e) => {
                            tracing::error!(%agent_id, event_id = %ev.id, error = %e, "could not apply event; the agent will resend it");
                            metrics.events_rejected.with_label_values(&["store"]).inc();
                            break;
                        }
                    }
                    acked.push(ev.id);
                }
                acked
            }
            .into_actor(self)
            .map(|acked, act, ctx| {
                // Stored with its event: the leader reads it now (a standby leaves it to the
                // leader, which reads the store each tick).
                act.load_dangling(ctx);
                acked
            }),
        )
    }
}

//! Drain deadlines (Nomad's node drain with a deadline): the leader checks every
//! `[scheduler] sweep-interval` for draining agents past their `drain_deadline`
//! ([`Store::drain_due`](crate::manager::store::Store::drain_due)) and ends each of their placed live sessions with its grace:
//! `TERMINATING` with its `terminate_deadline`, `destroy_kernel` on the agent with reason
//! `agent-drained` (the workload gets its stop signal and its grace period), then `TERMINATED`
//! in the store with status reason `agent-drained` (its concurrency released, a queued session
//! may take its place), counted in `kernelvisor_manager_drained_sessions_total`.
//!
//! An agent that cannot be reached does not hold its sessions past the deadline: the row is
//! terminated anyway (logged). A container it still runs is cleaned up as after any loss: the
//! reset of an agent back from `LOST`, or its `kernel_dangling` reports.
//!
//! A drained agent stays cordoned once its sessions are gone (Nomad: a drained node stays
//! ineligible) until `POST /v1/agents/{id}/uncordon`. A drain without a deadline is never
//! enforced here: its sessions end by themselves.

use std::cell::Cell;
use std::rc::Rc;

use actix::prelude::*;
use futures::StreamExt;

use super::launch::{end_on_agent, grace_left, Launcher};
use super::Scheduler;
use crate::manager::store::{now, KernelRow};

/// The status reason (and `destroy_kernel` reason) of a session ended by a drain deadline.
pub const AGENT_DRAINED: &str = "agent-drained";

/// Sessions one check ends at once (each `destroy_kernel` may wait `destroy-timeout` on an
/// agent that does not answer).
const CONCURRENCY: usize = 16;

/// Starts the periodic check on `act`'s context (from [`Scheduler`]'s `started`): every
/// `sweep_interval`, on the leader only, one check at a time.
pub(super) fn start(act: &Scheduler, ctx: &mut Context<Scheduler>) {
    let running = Rc::new(Cell::new(false));
    ctx.run_interval(act.spec.sweep_interval, move |act, ctx| {
        if !act.leader.is_leader() || running.get() {
            return;
        }
        running.set(true);
        let done = running.clone();
        let check = enforce(act.launcher());
        ctx.spawn(check.into_actor(act).map(move |(), _, _| done.set(false)));
    });
}

/// One check: ends every session of draining agents whose deadline has passed, each with its
/// grace ([`end_on_agent`]). Returns when each has been tried; failures are logged and tried
/// again by the next check. A session already `TERMINATING` is being ended (by this check's
/// predecessor, a user, the sweep): left to that end.
async fn enforce(launcher: Launcher) {
    let due = match launcher.store.drain_due(now()).await {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!(error = %e, "reading the sessions past their agent's drain deadline failed");
            return;
        }
    };
    futures::stream::iter(
        due.into_iter()
            .filter(|k| k.status != crate::model::session::KernelStatus::Terminating),
    )
    .for_each_concurrent(CONCURRENCY, |k| {
        let launcher = &launcher;
        async move { end_drained(launcher, &k).await }
    })
    .await;
}

/// Ends one session of an agent past its drain deadline, with its grace.
async fn end_drained(launcher: &Launcher, k: &KernelRow) {
    let (store, metrics) = (&launcher.store, &launcher.metrics);
    let grace = grace_left(k, launcher.spec.grace_period);
    let (changed, destroyed) = match end_on_agent(launcher, k, AGENT_DRAINED, &grace).await {
        Ok((changed, _)) => (Ok(changed), true),
        Err(e) => {
            tracing::warn!(
                kernel_id = %k.id, agent_id = %k.agent_id, error = %e,
                "could not destroy a session on its drained agent; ending it in the store anyway"
            );
            (
                store.terminate_kernel(&k.id, AGENT_DRAINED, None).await,
                false,
            )
        }
    };
    match changed {
        // Ended here, or by the agent's `kernel_terminated` (reason `agent-drained`) for the
        // destroy just asked, which may reach the store first: the drain ended it either way.
        Ok(changed) if changed || destroyed => {
            metrics.drained_sessions.inc();
            tracing::info!(
                kernel_id = %k.id, session_id = %k.session_id, agent_id = %k.agent_id,
                reason = AGENT_DRAINED, "session ended at its agent's drain deadline"
            );
        }
        // It ended meanwhile (by itself, or by another call).
        Ok(_) => {}
        Err(e) => tracing::warn!(
            kernel_id = %k.id, error = %e,
            "could not end a drained session in the store; retrying at the next check"
        ),
    }
}

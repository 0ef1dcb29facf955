//! The end of the start-up grace (`docs/scenarios.md`, "Manager restart"): the store is
//! reconciled with each agent's newest heartbeat. Live kernels a heartbeat does not list are
//! terminated (`missing-on-agent`), but `PULLING` ones: a kernel waiting for its image is not
//! on its agent yet, whether its pull is followed by another replica or by nobody since the
//! restart (the reconcile sweep takes those over, `scheduler/sweep.rs`). Kernels it lists that
//! the store does not hold live are reported (log + `kernelvisor_manager_unknown_kernels_total`).
//! A lost agent's list is ignored: it is reset instead.

use std::collections::{HashMap, HashSet};

use actix::prelude::*;

use super::{liveness, AgentRegistry, Heartbeat};
use crate::manager::metrics::ManagerMetrics;
use crate::manager::store::{KernelRow, Store, StoreError};
use crate::model::session::KernelStatus;

impl AgentRegistry {
    /// End of the grace period: reconcile the store with each agent's newest heartbeat.
    pub(super) fn end_grace(
        &mut self,
        latest: HashMap<String, Heartbeat>,
        ctx: &mut Context<Self>,
    ) {
        tracing::info!(
            agents = latest.len(),
            "start-up grace over; reconciling the store with the latest heartbeats"
        );
        let mut to_diff = Vec::new();
        for (id, hb) in latest {
            let lost = self
                .agents
                .get(&id)
                .is_some_and(|s| s.row.status.needs_reset());
            if lost {
                // Its kernels were released before the restart: reset, ignore its list.
                self.heartbeat(hb, ctx);
            } else {
                self.absorb(&hb);
                self.transition(&id, liveness::heard, ctx);
                to_diff.push(hb);
            }
        }
        let (store, metrics) = (self.store.clone(), self.metrics.clone());
        let diff = async move {
            if let Err(e) = reconcile(&store, &metrics, &to_diff).await {
                tracing::error!(error = %e, "reconciling with the heartbeats failed");
            }
        };
        ctx.wait(diff.into_actor(self).map(|_, act, _| {
            act.mode.reconciled();
            tracing::info!("manager in normal mode");
        }));
    }
}

/// Each heartbeat is what runs on its agent: live kernels it does not list ended while the
/// manager was away; listed kernels the store does not hold live are reported. The live set is
/// read once for all of them.
async fn reconcile(
    store: &Store,
    metrics: &ManagerMetrics,
    heartbeats: &[Heartbeat],
) -> Result<(), StoreError> {
    if heartbeats.is_empty() {
        return Ok(());
    }
    let mut live_by_agent = store.live_kernels_by_agent().await?;
    for hb in heartbeats {
        let live: Vec<KernelRow> = live_by_agent.remove(&hb.agent_id).unwrap_or_default();
        let listed: HashSet<&str> = hb.kernels.iter().map(|(id, _, _)| id.as_str()).collect();
        for k in live
            .iter()
            .filter(|k| k.status != KernelStatus::Pulling && !listed.contains(k.id.as_str()))
        {
            if store
                .terminate_kernel(&k.id, "missing-on-agent", None)
                .await?
            {
                tracing::info!(agent_id = %hb.agent_id, kernel_id = %k.id, "kernel ended while the manager was away; released");
            }
        }
        let live_ids: HashSet<&str> = live.iter().map(|k| k.id.as_str()).collect();
        for (id, session, status) in hb
            .kernels
            .iter()
            .filter(|(id, _, _)| !live_ids.contains(id.as_str()))
        {
            metrics.unknown_kernels.inc();
            tracing::warn!(agent_id = %hb.agent_id, kernel_id = %id, session_id = %session, status = %status, "agent runs a kernel the store does not hold live");
        }
    }
    Ok(())
}

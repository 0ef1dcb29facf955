//! The manager tree's `registry` child: agent liveness, on an arbiter of its own.

use std::sync::Arc;

use actix::{Actor, Addr, Arbiter};
use actors::ChildSpec;

use crate::config::ManagerConfig;
use crate::manager::leader::Leadership;
use crate::manager::metrics::ManagerMetrics;
use crate::manager::pool::AgentPool;
use crate::manager::registry::{AgentRegistry, FlushAgents, HeartbeatInbox, RegistrySpec};
use crate::manager::store::Store;

/// The started registry.
pub(in crate::manager) struct Started {
    /// The registry actor.
    pub addr: Addr<AgentRegistry>,
    /// Where the intake leaves heartbeats for it (latest wins, one per agent).
    pub inbox: Arc<HeartbeatInbox>,
    /// Its thread.
    pub thread: Arbiter,
}

/// The registry's timings from `[manager]` (heartbeat timeout, start-up grace, processed-event
/// retention, dangling grace) and `[scheduler]` (reset and destroy timeouts).
fn spec(config: &ManagerConfig) -> RegistrySpec {
    let m = &config.manager;
    RegistrySpec {
        heartbeat_timeout: m.heartbeat_timeout.0,
        startup_grace: m.startup_grace.0,
        reset_timeout: config.scheduler.reset_timeout.0,
        processed_event_retention: m.processed_event_retention.0,
        dangling_grace: m.dangling_grace.0,
        dangling_call_timeout: config.scheduler.destroy_timeout.0,
    }
}

/// Starts the registry on a new arbiter, over the store's agent rows, with a heartbeat inbox
/// of `inbox_capacity` agents.
///
/// Errors: the store's agent rows cannot be read.
pub(in crate::manager) async fn start(
    config: &ManagerConfig,
    store: &Store,
    pool: &Addr<AgentPool>,
    metrics: &Arc<ManagerMetrics>,
    leader: &Leadership,
    inbox_capacity: usize,
) -> anyhow::Result<Started> {
    let rows = store.agents().await?;
    // One heartbeat per agent waits at most.
    let inbox = Arc::new(HeartbeatInbox::new(inbox_capacity));
    let registry = AgentRegistry::new(
        store.clone(),
        pool.clone(),
        metrics.clone(),
        spec(config),
        leader.clone(),
        rows,
        inbox.clone(),
    );
    // Its own thread: a fleet's heartbeat batches (thousands at a time, tens of ms) would
    // otherwise hold up every continuation of the scheduler's futures — a create waited
    // behind them for its INSERT's answer (issue 27's flood create p99; seed 004).
    let thread = Arbiter::new();
    let addr = AgentRegistry::start_in_arbiter(&thread.handle(), move |_| registry);
    Ok(Started {
        addr,
        inbox,
        thread,
    })
}

/// `registry`: agent liveness on its own arbiter; stopped, it writes its agent rows
/// ([`FlushAgents`]) and its thread ends.
pub(in crate::manager) fn child_spec(registry: Addr<AgentRegistry>, thread: Arbiter) -> ChildSpec {
    super::holder(
        "registry",
        (registry, thread),
        |(registry, thread)| async move {
            let _ = registry.send(FlushAgents).await;
            thread.stop();
        },
    )
}

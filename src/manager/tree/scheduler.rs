//! The manager tree's `scheduler` child: placement and the session calls (`[scheduler]`).

use std::sync::Arc;

use actix::{Actor, Addr, Arbiter};
use actors::ChildSpec;

use crate::config::ManagerConfig;
use crate::manager::image_registries::ImageRegistries;
use crate::manager::leader::Leadership;
use crate::manager::metrics::ManagerMetrics;
use crate::manager::pool::AgentPool;
use crate::manager::registry::AgentRegistry;
use crate::manager::scheduler::{Scheduler, SchedulerSpec, StateDeadlines};
use crate::manager::store::Store;

/// The scheduler's timeouts, policy, admission rounds and state deadlines from `[scheduler]`,
/// pulling with `registries`' credentials.
fn spec(config: &ManagerConfig, registries: Arc<ImageRegistries>) -> SchedulerSpec {
    let s = &config.scheduler;
    SchedulerSpec {
        create_timeout: s.create_timeout.0,
        destroy_timeout: s.destroy_timeout.0,
        execute_timeout: s.execute_timeout.0,
        flush_timeout: s.flush_timeout.0,
        image_pull_timeout: s.image_pull_timeout.0,
        registries,
        policy: s.policy,
        head_skip_rounds: s.head_skip_rounds,
        admission_interval: s.admission_interval.0,
        admission_window: s.admission_window.max(1),
        deadlines: StateDeadlines {
            preparing: s.preparing_timeout.0,
            pulling: s.image_pull_timeout.0,
            creating: s.creating_timeout.0,
            terminating: s.terminating_timeout.0,
            restarting: s.restarting_timeout.0,
        },
        sweep_interval: s.sweep_interval.0,
        cluster_placement: s.cluster_placement,
        overlay: crate::manager::scheduler::OverlaySpec {
            docker_host: s.swarm_docker_host.clone(),
            mtu: s.overlay_mtu,
        },
        grace_period: s.grace_period.0,
        max_grace_period: s.max_grace_period.0,
        reclaim: config.reclaim.clone(),
        preemption: crate::manager::scheduler::PreemptionSpec {
            enabled: s.preemption,
            cooldown: s.preemption_cooldown.0,
        },
    }
}

/// Starts the scheduler, its admission rounds on a new arbiter (returned).
pub(in crate::manager) fn start(
    config: &ManagerConfig,
    store: &Store,
    pool: &Addr<AgentPool>,
    registry: &Addr<AgentRegistry>,
    metrics: &Arc<ManagerMetrics>,
    leader: &Leadership,
    registries: Arc<ImageRegistries>,
) -> (Addr<Scheduler>, Arbiter) {
    let rounds = Arbiter::new();
    let scheduler = Scheduler::new(
        store.clone(),
        pool.clone(),
        registry.clone(),
        metrics.clone(),
        spec(config, registries),
        leader.clone(),
        rounds.handle(),
    )
    .start();
    (scheduler, rounds)
}

/// `scheduler`: placement and the session calls; it ends once its last address is dropped.
/// Stopped, the thread its admission rounds run on ends (a round in flight is dropped; the
/// queue is in the store, so the next leader's first round does its work).
pub(in crate::manager) fn child_spec(scheduler: Addr<Scheduler>, rounds: Arbiter) -> ChildSpec {
    super::holder("scheduler", (scheduler, rounds), |(_, rounds)| async move {
        rounds.stop();
    })
}

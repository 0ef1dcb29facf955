//! The exit watcher: the engine's event stream → [`ContainerExited`] (and [`ContainerOom`]) to
//! the registry, and the engine's health ([`super::engine`]).
//!
//! It subscribes only once a probe says the engine answers, then asks the registry to
//! reconcile (so an exit missed while the stream was down is still handled: after an engine
//! restart, a container that survived it is kept, one that died is handled by its kernel), and
//! again every 30 s. While subscribed it probes the engine every
//! [`PROBE_INTERVAL`](super::engine::PROBE_INTERVAL); a failed probe or a stream that fails or
//! ends marks the engine down, and it probes again after a backoff (0.5 s doubling to 5 s)
//! until the engine is back.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use actors::{ChildSpec, StopSignal};
use futures::StreamExt;
use tokio::time::{Instant, MissedTickBehavior};

use super::backend::labels;
use super::context::AgentContext;
use super::engine::{probe, PROBE_INTERVAL};
use super::kernels::CurrentRegistry;
use super::registry::{ContainerExited, ContainerOom, KernelRegistry, Reconcile};
use crate::retry::Backoff;

/// First step of the waits before probing again after the stream failed or a probe did (each
/// wait is drawn within its step: `crate::retry`).
pub const BACKOFF_MIN: Duration = Duration::from_millis(500);

/// Longest wait between probes while the engine is down: how late, at most, the agent sees
/// the engine back (plus one probe).
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// A subscription that lasted this long was healthy: the next failure starts the backoff over.
const HEALTHY_SUBSCRIPTION: Duration = Duration::from_secs(30);

/// Seconds between reconciliations while subscribed.
const RECONCILE_INTERVAL: Duration = Duration::from_secs(30);

/// The agent tree's `watcher` child: [`watch_exits`] for the current registry until stopped;
/// the registry stopping under it is a failure (the `kernels` child restarts it first).
pub fn child_spec(ctx: Arc<AgentContext>, registry: CurrentRegistry) -> ChildSpec {
    ChildSpec::task("watcher", move |stop: StopSignal| {
        let (ctx, registry) = (ctx.clone(), registry.get());
        async move {
            tokio::select! {
                _ = watch_exits(ctx, registry) => Err("the kernel registry stopped".to_owned()),
                _ = stop.requested() => Ok(()),
            }
        }
    })
}

/// Watches until the registry is gone.
pub async fn watch_exits(ctx: Arc<AgentContext>, registry: Addr<KernelRegistry>) {
    let mut backoff = Backoff::new(BACKOFF_MIN, BACKOFF_MAX);
    while registry.connected() {
        if probe(&*ctx.backend, &ctx.engine).await {
            let subscribed = Instant::now();
            follow(&ctx, &registry).await;
            if subscribed.elapsed() >= HEALTHY_SUBSCRIPTION {
                backoff.reset();
            }
            // Ended or failed: say at once whether the engine is still there.
            probe(&*ctx.backend, &ctx.engine).await;
        }
        tokio::time::sleep(backoff.next_wait()).await;
    }
}

/// One subscription: exits to the registry until the stream fails or ends, a probe fails, or
/// the registry is gone.
async fn follow(ctx: &AgentContext, registry: &Addr<KernelRegistry>) {
    let mut exits = ctx.backend.exits(labels::AGENT_ID, &ctx.agent_id);
    registry.do_send(Reconcile);
    let mut reconcile =
        tokio::time::interval_at(Instant::now() + RECONCILE_INTERVAL, RECONCILE_INTERVAL);
    let mut probe_tick = tokio::time::interval_at(Instant::now() + PROBE_INTERVAL, PROBE_INTERVAL);
    probe_tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    while registry.connected() {
        tokio::select! {
            item = exits.next() => match item {
                Some(Ok(exit)) => {
                    if exit.oom {
                        registry.do_send(ContainerOom(exit.container_id));
                    } else {
                        registry.do_send(ContainerExited(exit.container_id));
                    }
                }
                Some(Err(e)) => {
                    ctx.metrics.lifecycle_sync(Err("EventStreamError"));
                    tracing::warn!(agent_id = %ctx.agent_id, error = %e, "container event stream failed; resubscribing");
                    if e.is_unavailable() {
                        ctx.engine.mark_down(&e.to_string());
                    }
                    return;
                }
                None => return,
            },
            _ = reconcile.tick() => registry.do_send(Reconcile),
            _ = probe_tick.tick() => {
                if !probe(&*ctx.backend, &ctx.engine).await {
                    return;
                }
            }
        }
    }
}

//! The exit watcher: the engine's event stream → [`ContainerExited`] (and [`ContainerOom`]) to
//! the registry.
//!
//! On every (re)subscription, and every 30 s, it also asks the registry to reconcile, so an
//! exit missed while the stream was down is still handled.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use futures::StreamExt;

use super::backend::labels;
use super::context::AgentContext;
use super::registry::{ContainerExited, ContainerOom, KernelRegistry, Reconcile};

/// Watches until the registry is gone; reconnects with backoff (1 s doubling to 30 s).
pub async fn watch_exits(ctx: Arc<AgentContext>, registry: Addr<KernelRegistry>) {
    let mut backoff = Duration::from_secs(1);
    while registry.connected() {
        let mut exits = ctx.backend.exits(labels::AGENT_ID, &ctx.agent_id);
        registry.do_send(Reconcile);
        let mut tick = tokio::time::interval(Duration::from_secs(30));
        tick.tick().await;
        loop {
            tokio::select! {
                item = exits.next() => match item {
                    Some(Ok(exit)) => {
                        backoff = Duration::from_secs(1);
                        if exit.oom {
                            registry.do_send(ContainerOom(exit.container_id));
                        } else {
                            registry.do_send(ContainerExited(exit.container_id));
                        }
                    }
                    Some(Err(e)) => {
                        ctx.metrics.lifecycle_sync(Err("EventStreamError"));
                        tracing::warn!(agent_id = %ctx.agent_id, error = %e, "container event stream failed; resubscribing");
                        break;
                    }
                    None => break,
                },
                _ = tick.tick() => registry.do_send(Reconcile),
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

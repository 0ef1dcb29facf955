//! Backend.AI's side channels (`[redis]`): what a 26.x manager reads of an agent from Valkey
//! besides the event bus (`bus/`), written as Backend.AI 26.9.6's agent writes them
//! (`ai/backend/agent/agent.py`, `stats.py`, `observer/kernel_presence.py`) with the keys and
//! encodings of the manager's own clients (`ai/backend/common/clients/valkey_client/`):
//!
//! | channel | key (database) | when | module |
//! |---|---|---|---|
//! | kernel presence | `kernel:presence:<kernel_id>` hash (2) | every 60 s, and at once when a kernel starts | [`presence`] |
//! | installed images | `installed_image:<agent_id>` JSON (3) | at start, every 20 s, after a commit or pull | [`images`] |
//! | live stats | `<agent_id>`, `<kernel_id>`, `<container_id>` msgpack (0) | after each sampler round | [`stats`] |
//! | commit status | `kernel.<kernel_id>.commit` (0) | when a commit starts, every 7 s while it runs, deleted at its end | [`bgtask`] |
//! | background tasks | `bgtask.<task_id>` + `PUBLISH events_all` (4) | each start and end of a commit, push or pull | [`bgtask`] |
//!
//! One child, `valkey`, writes them all, one channel at a time, each write bounded
//! ([`conn::TIMEOUT`]) and never retried in place: images and stats are latest-wins (the next
//! turn writes the state then), and background task events, commit statuses and a presence
//! write that failed are written again on the next 7-second turn. An unreachable
//! or stalled Valkey costs this child bounded attempts and nothing else: the kernels, the RPC
//! methods and the sampler only update in-memory tables ([`LiveStats`],
//! [`Bgtasks`](crate::agent::bgtasks::Bgtasks)) and never wait for it. Writes and failures are
//! counted per channel (`kernelvisor_valkey_writes_total`,
//! `kernelvisor_valkey_write_failures_total`).

pub mod bgtask;
pub mod conn;
pub mod images;
pub mod presence;
pub mod stats;

use std::sync::Arc;
use std::time::Duration;

use actors::{ChildSpec, StopSignal};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::MissedTickBehavior;

use self::conn::{Conns, Failure};
use crate::agent::context::AgentContext;
use crate::agent::events::AgentEvent;
use crate::agent::kernel::KernelStatus;
use crate::agent::kernels::CurrentRegistry;
use crate::agent::registry::ListKernels;
use crate::agent::stats::live::LiveStats;
use crate::config::AgentConfig;

/// Seconds between two scans of the engine's images (upstream's `ScanImagesTask`).
pub const IMAGE_SCAN_INTERVAL_SECS: u64 = 20;

/// What the child needs: the agent's state, its kernels, `[redis]` and `[stats]`.
#[derive(Clone)]
pub struct SideChannels {
    ctx: Arc<AgentContext>,
    registry: CurrentRegistry,
}

/// The agent tree's `valkey` child for `config` (`None` without a `[redis]` section).
pub fn child_spec(
    config: &AgentConfig,
    ctx: Arc<AgentContext>,
    registry: CurrentRegistry,
) -> Option<ChildSpec> {
    config.redis.as_ref()?;
    let channels = SideChannels { ctx, registry };
    Some(ChildSpec::task("valkey", move |stop: StopSignal| {
        let writer = Writer::new(channels.clone());
        async move {
            writer.run(stop.requested()).await;
            Ok::<_, String>(())
        }
    }))
}

/// One run of the child: its connections and what it told.
struct Writer {
    ch: SideChannels,
    conns: Conns,
    tracker: bgtask::Tracker,
    /// A presence write failed: written again on the next 7-second turn, not 60 s later.
    presence_failed: bool,
}

impl Writer {
    fn new(ch: SideChannels) -> Writer {
        let redis = ch.ctx.config.redis.clone().expect("built with [redis]");
        Writer {
            ch,
            conns: Conns::new(redis),
            tracker: bgtask::Tracker::default(),
            presence_failed: false,
        }
    }

    fn live(&self) -> Arc<LiveStats> {
        self.ch.ctx.live_stats.clone()
    }

    /// Counts the outcome of one write on `channel`.
    fn count(&self, channel: &str, r: Result<(), Failure>) {
        let m = &self.ch.ctx.metrics;
        match r {
            Ok(()) => m.valkey_written(channel),
            Err(reason) => {
                tracing::debug!(agent_id = %self.ch.ctx.agent_id, channel, reason, "Valkey side channel not written (next turn writes again)");
                m.valkey_write_failed(channel, reason);
            }
        }
    }

    async fn run(mut self, stop: impl std::future::Future<Output = ()>) {
        let every = |secs: u64| {
            let mut t = tokio::time::interval(Duration::from_secs(secs));
            t.set_missed_tick_behavior(MissedTickBehavior::Delay);
            t
        };
        let mut presence_tick = every(presence::INTERVAL_SECS);
        let mut image_tick = every(IMAGE_SCAN_INTERVAL_SECS);
        let mut turn = every(bgtask::COMMIT_INTERVAL_SECS);
        let mut events = self.ch.ctx.events.subscribe();
        let live = self.live();
        let bgtasks = self.ch.ctx.bgtasks.clone();
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                biased;
                _ = &mut stop => break,
                _ = bgtasks.changed() => self.bgtasks().await,
                _ = turn.tick() => {
                    self.bgtasks().await;
                    if self.presence_failed {
                        self.presence().await;
                    }
                }
                event = events.recv() => match event {
                    Ok(AgentEvent::KernelStarted { kernel_id, .. }) => {
                        let r = presence::write(&mut self.conns, &[kernel_id]).await;
                        self.presence_failed |= r.is_err();
                        self.count("presence", r);
                    }
                    Err(RecvError::Lagged(_)) => self.presence().await,
                    Ok(_) | Err(RecvError::Closed) => {}
                },
                _ = presence_tick.tick() => self.presence().await,
                _ = image_tick.tick() => self.images().await,
                _ = live.node_round.notified() => self.node_stats().await,
                _ = live.container_round.notified() => self.kernel_stats().await,
                _ = live.process_round.notified() => self.process_stats().await,
            }
        }
    }

    /// Every running kernel's presence.
    async fn presence(&mut self) {
        let Ok(kernels) = self.ch.registry.get().send(ListKernels).await else {
            return; // the registry is restarting; the supervisor restarts this child too
        };
        let running: Vec<String> = kernels
            .into_iter()
            .filter(|k| k.status == KernelStatus::Running && k.container_id.is_some())
            .map(|k| k.id)
            .collect();
        let r = presence::write(&mut self.conns, &running).await;
        self.presence_failed = r.is_err();
        if !running.is_empty() {
            self.count("presence", r);
        }
    }

    /// The engine's images as installed images (an engine that cannot list them: skipped).
    async fn images(&mut self) {
        let listed = tokio::time::timeout(conn::TIMEOUT * 2, self.ch.ctx.backend.list_images());
        let Ok(Ok(listed)) = listed.await else {
            return;
        };
        let installed = images::installed(&listed);
        if !installed.is_empty() {
            let r = images::write(&mut self.conns, &self.ch.ctx.agent_id, &installed).await;
            self.count("images", r);
        }
    }

    /// Background task events and commit statuses.
    async fn bgtasks(&mut self) {
        let tasks = self.ch.ctx.bgtasks.snapshot();
        let source = self.ch.ctx.agent_id.clone();
        match self.tracker.sync(&mut self.conns, &source, &tasks).await {
            Ok(synced) => {
                for _ in 0..synced.events {
                    self.ch.ctx.metrics.valkey_written("bgtask");
                }
                if synced.images_changed {
                    self.images().await;
                }
            }
            Err(reason) => self.count("bgtask", Err(reason)),
        }
    }

    async fn node_stats(&mut self) {
        let value = stats::node_value(&self.live().snapshot());
        let ttl = ttl(self.ch.ctx.config.stats.node_interval.0);
        let entry = [(self.ch.ctx.agent_id.clone(), value)];
        let r = stats::write(&mut self.conns, &entry, ttl).await;
        self.count("node-stats", r);
    }

    async fn kernel_stats(&mut self) {
        let entries = stats::kernel_values(&self.live().snapshot());
        if !entries.is_empty() {
            let r = stats::write(&mut self.conns, &entries, stats::KERNEL_TTL_SECS).await;
            self.count("kernel-stats", r);
        }
    }

    async fn process_stats(&mut self) {
        let entries = stats::process_values(&self.live().snapshot());
        if !entries.is_empty() {
            let ttl = ttl(self.ch.ctx.config.stats.process_interval.0);
            let r = stats::write(&mut self.conns, &entries, ttl).await;
            self.count("process-stats", r);
        }
    }
}

/// A TTL of [`stats::TTL_FACTOR`] intervals, whole seconds (`StatContext._metric_ttl`).
fn ttl(interval: Duration) -> u64 {
    (interval.as_secs_f64() * stats::TTL_FACTOR) as u64
}

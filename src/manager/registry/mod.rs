//! `AgentRegistry`: agent liveness (seed 003). It owns each agent's status in memory and writes
//! it behind to the store; it applies agent event batches in order.
//!
//! ```text
//!            heartbeat / agent_started                  no heartbeat for heartbeat-timeout
//! (new) ─────────────────────────────────▶ ALIVE ──────────────────────────────────────▶ LOST
//!                                          ▲  │ agent_terminated                           │ heartbeat or
//!                  heartbeat/agent_started │  ▼                                            │ agent_started
//!                                      TERMINATED            ALIVE ◀── reset_instance ── PENDING
//! ```
//! - `LOST`: its live kernels leave the live set (`agent-lost`), their `concurrency_used` comes
//!   back, its pool entry is invalidated, and `agent_terminated` (`agent-lost`) is logged and
//!   counted. A lost agent may still run containers the manager has released, so it is only
//!   placed on again after `reset_instance` returns: until then it is `PENDING` and the kernel
//!   lists of its heartbeats are ignored.
//! - `TERMINATED` (clean shutdown): kernels stay live (`on-shutdown = "preserve"` keeps their
//!   containers); no timeout applies until it reports again.
//! - Start-up grace: for `startup-grace` after start kernel API calls are refused (503); the
//!   newest heartbeat of each agent is kept, then the store is reconciled with it: live kernels
//!   it does not list are terminated (`missing-on-agent`), kernels it lists that the store does
//!   not hold live are reported (log + `kernelvisor_manager_unknown_kernels_total`).
//! - Dangling kernels (`kernel_dangling`, seed 001): adopted when the store holds them live on
//!   the reporting agent, destroyed after `dangling-grace` otherwise (dangling.rs).

mod dangling;
pub mod heartbeat;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

pub use heartbeat::Heartbeat;

use super::calls::call_agent;
use super::events::{superseded, AgentEvent, EventBody};
use super::metrics::ManagerMetrics;
use super::pool::{AgentEndpoint, AgentPool, Invalidate, Reconnect, RegisterAgent};
use super::store::{AgentRow, Applied, Store};
use crate::rpc::curve::CurveKey;

/// Liveness statuses, as stored and shown.
pub const ALIVE: &str = "ALIVE";
/// No heartbeat within the timeout.
pub const LOST: &str = "LOST";
/// Back from `LOST`, being reset.
pub const PENDING: &str = "PENDING";
/// Shut down cleanly.
pub const TERMINATED: &str = "TERMINATED";

/// The registry's intervals.
#[derive(Clone, Debug)]
pub struct RegistrySpec {
    /// No heartbeat for this long → `LOST`.
    pub heartbeat_timeout: Duration,
    /// Kernel API refused for this long after start.
    pub startup_grace: Duration,
    /// `reset_instance` deadline.
    pub reset_timeout: Duration,
    /// Processed event ids older than this are pruned (hourly).
    pub processed_event_retention: Duration,
    /// A dangling kernel the store does not hold live is destroyed this long after its first
    /// report (`[manager] dangling-grace`).
    pub dangling_grace: Duration,
    /// Deadline of `adopt_kernel` / `destroy_dangling_kernel` (`[scheduler] destroy-timeout`).
    pub dangling_call_timeout: Duration,
}

struct AgentState {
    row: AgentRow,
    last_seen: Instant,
    dirty: bool,
    resetting: bool,
    endpoint: Option<AgentEndpoint>,
}

enum Mode {
    /// Start-up: newest heartbeat per agent, applied at the end.
    Grace {
        until: Instant,
        latest: HashMap<String, Heartbeat>,
    },
    /// Grace over, store being reconciled with the heartbeats (API still refused).
    Reconciling,
    Normal,
}

/// The registry actor.
pub struct AgentRegistry {
    store: Store,
    pool: Addr<AgentPool>,
    metrics: Arc<ManagerMetrics>,
    spec: RegistrySpec,
    agents: HashMap<String, AgentState>,
    mode: Mode,
    dangling: dangling::DanglingBook,
}

impl AgentRegistry {
    /// A registry over `rows` (the store's agents at start); every agent gets a full heartbeat
    /// timeout from now.
    pub fn new(
        store: Store,
        pool: Addr<AgentPool>,
        metrics: Arc<ManagerMetrics>,
        spec: RegistrySpec,
        rows: Vec<AgentRow>,
    ) -> Self {
        let now = Instant::now();
        let agents = rows
            .into_iter()
            .map(|row| {
                (
                    row.id.clone(),
                    AgentState {
                        row,
                        last_seen: now,
                        dirty: false,
                        resetting: false,
                        endpoint: None,
                    },
                )
            })
            .collect();
        let mode = Mode::Grace {
            until: now + spec.startup_grace,
            latest: HashMap::new(),
        };
        AgentRegistry {
            store,
            pool,
            metrics,
            spec,
            agents,
            mode,
            dangling: dangling::DanglingBook::default(),
        }
    }

    /// Runs a step for every dangling report that is due (dangling.rs).
    fn drive_dangling(&mut self, ctx: &mut Context<Self>) {
        for p in self.dangling.due() {
            let (store, pool, metrics, timeout) = (
                self.store.clone(),
                self.pool.clone(),
                self.metrics.clone(),
                self.spec.dangling_call_timeout,
            );
            let key = (p.agent_id.clone(), p.kernel_id.clone());
            ctx.spawn(
                async move { dangling::step(store, pool, &metrics, p, timeout).await }
                    .into_actor(self)
                    .map(move |outcome, act, _| {
                        match &outcome {
                            dangling::Outcome::Done(action) => act
                                .metrics
                                .dangling_kernels
                                .with_label_values(&[action])
                                .inc(),
                            dangling::Outcome::Retry(why) => {
                                tracing::debug!(agent_id = %key.0, kernel_id = %key.1, %why, "dangling kernel: retrying")
                            }
                            dangling::Outcome::Wait => {}
                        }
                        if let Some(p) = act.dangling.settle(key, &outcome) {
                            tracing::error!(agent_id = %p.agent_id, kernel_id = %p.kernel_id, "dangling kernel unresolved after many tries: given up (reported again on the agent's next start)");
                            act.metrics.dangling_kernels.with_label_values(&["failed"]).inc();
                        }
                    }),
            );
        }
    }

    fn state(&mut self, agent_id: &str) -> &mut AgentState {
        self.agents
            .entry(agent_id.to_owned())
            .or_insert_with(|| AgentState {
                row: AgentRow {
                    id: agent_id.to_owned(),
                    status: ALIVE.into(),
                    addr: None,
                    public_key: None,
                    region: None,
                    version: None,
                    slots_total: crate::slots::ResourceSlots::new(),
                    slot_types: heartbeat::slot_types(None),
                    last_heartbeat: None,
                },
                last_seen: Instant::now(),
                dirty: true,
                resetting: false,
                endpoint: None,
            })
    }

    fn set_status(&mut self, agent_id: &str, status: &str) {
        let s = self.state(agent_id);
        if s.row.status != status {
            tracing::info!(agent_id, from = %s.row.status, to = status, "agent status");
            s.row.status = status.to_owned();
            s.dirty = true;
        }
    }

    /// Takes the heartbeat's facts (address, key, slots) and tells the pool a changed endpoint.
    fn absorb(&mut self, hb: &Heartbeat) {
        let pool = self.pool.clone();
        let s = self.state(&hb.agent_id);
        s.last_seen = Instant::now();
        s.row.addr = Some(hb.addr.clone());
        s.row.public_key = hb.public_key.clone();
        s.row.region = Some(hb.region.clone());
        s.row.version = Some(hb.version.clone());
        s.row.slots_total = hb.slots_total.clone();
        s.row.slot_types = hb.slot_types.clone();
        s.row.last_heartbeat = Some(hb.ts);
        s.dirty = true;
        let public_key = hb
            .public_key
            .as_deref()
            .and_then(|k| CurveKey::from_z85(k).ok());
        let endpoint = AgentEndpoint {
            addr: hb.addr.clone(),
            public_key,
        };
        if s.endpoint.as_ref() != Some(&endpoint) {
            s.endpoint = Some(endpoint.clone());
            pool.do_send(RegisterAgent {
                agent_id: hb.agent_id.clone(),
                endpoint,
            });
        }
    }

    /// A heartbeat in normal mode.
    fn heartbeat(&mut self, hb: Heartbeat, ctx: &mut Context<Self>) {
        let status = self.agents.get(&hb.agent_id).map(|s| s.row.status.clone());
        match self.agents.get_mut(&hb.agent_id) {
            // Overtaken by a newer one (latest wins): its facts are stale, but it still proves
            // the agent is alive.
            Some(s) if s.row.last_heartbeat.is_some_and(|last| hb.ts < last) => {
                s.last_seen = Instant::now()
            }
            _ => self.absorb(&hb),
        }
        match status.as_deref() {
            None | Some(TERMINATED) => self.set_status(&hb.agent_id, ALIVE),
            Some(LOST) | Some(PENDING) => self.begin_reset(&hb.agent_id, ctx),
            _ => {}
        }
    }

    /// `PENDING` and `reset_instance` (one in flight per agent; retried on the next heartbeat).
    fn begin_reset(&mut self, agent_id: &str, ctx: &mut Context<Self>) {
        self.set_status(agent_id, PENDING);
        let s = self.state(agent_id);
        if s.resetting || s.endpoint.is_none() {
            return;
        }
        s.resetting = true;
        let (pool, metrics, timeout, id) = (
            self.pool.clone(),
            self.metrics.clone(),
            self.spec.reset_timeout,
            agent_id.to_owned(),
        );
        let call = async move {
            // The old connection was invalidated when the agent was lost: start afresh.
            let _ = pool
                .send(Reconnect {
                    agent_id: id.clone(),
                })
                .await;
            call_agent(&pool, &metrics, &id, "reset_instance", vec![], timeout).await
        };
        let id = agent_id.to_owned();
        ctx.spawn(call.into_actor(self).map(move |res, act, _| {
            let Some(s) = act.agents.get_mut(&id) else { return };
            s.resetting = false;
            match res {
                Ok(v) if s.row.status == PENDING => {
                    tracing::info!(agent_id = %id, result = %v, "agent reset; placing kernels on it again");
                    act.metrics.agent_resets.with_label_values(&["ok"]).inc();
                    act.set_status(&id, ALIVE);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(agent_id = %id, error = %e, "reset_instance failed; retrying on the next heartbeat");
                    act.metrics.agent_resets.with_label_values(&["failed"]).inc();
                }
            }
        }));
    }

    /// Agents silent for longer than the timeout become `LOST`.
    fn check_liveness(&mut self, ctx: &mut Context<Self>) {
        let timeout = self.spec.heartbeat_timeout;
        let lost: Vec<String> = self
            .agents
            .values()
            .filter(|s| {
                (s.row.status == ALIVE || s.row.status == PENDING)
                    && s.last_seen.elapsed() > timeout
            })
            .map(|s| s.row.id.clone())
            .collect();
        for id in lost {
            self.set_status(&id, LOST);
            let s = self.state(&id);
            s.dirty = false;
            let row = s.row.clone();
            self.pool.do_send(Invalidate {
                agent_id: id.clone(),
            });
            let store = self.store.clone();
            ctx.spawn(
                async move { store.mark_agent_lost(&row).await }
                    .into_actor(self)
                    .map(move |res, act, _| match res {
                        Ok(kernels) => {
                            act.metrics.agents_lost.inc();
                            tracing::warn!(
                            agent_id = %id, event = "agent_terminated", reason = "agent-lost", released_kernels = kernels.len(),
                            "agent lost: no heartbeat within {:?}", act.spec.heartbeat_timeout
                            )
                        }
                        Err(e) => {
                            tracing::error!(agent_id = %id, error = %e, "could not record the lost agent; retrying");
                            if let Some(s) = act.agents.get_mut(&id) {
                                // Try again on the next tick.
                                s.row.status = ALIVE.into();
                                s.last_seen = Instant::now() - act.spec.heartbeat_timeout * 2;
                            }
                        }
                    }),
            );
        }
    }

    /// Changed rows, marked clean (the caller saves them).
    fn take_dirty(&mut self) -> Vec<AgentRow> {
        self.agents
            .values_mut()
            .filter(|s| s.dirty)
            .map(|s| {
                s.dirty = false;
                s.row.clone()
            })
            .collect()
    }

    /// Write-behind of changed agent rows.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        let rows = self.take_dirty();
        if rows.is_empty() {
            return;
        }
        let store = self.store.clone();
        let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
        ctx.spawn(
            async move { store.save_agents(&rows).await }
                .into_actor(self)
                .map(move |res, act, _| {
                    if let Err(e) = res {
                        tracing::error!(error = %e, "could not save agent rows; retrying");
                        for id in &ids {
                            if let Some(s) = act.agents.get_mut(id) {
                                s.dirty = true;
                            }
                        }
                    }
                }),
        );
    }

    /// End of the grace period: reconcile the store with each agent's newest heartbeat.
    fn end_grace(&mut self, latest: HashMap<String, Heartbeat>, ctx: &mut Context<Self>) {
        tracing::info!(
            agents = latest.len(),
            "start-up grace over; reconciling the store with the latest heartbeats"
        );
        self.mode = Mode::Reconciling;
        let mut to_diff = Vec::new();
        for (id, hb) in latest {
            let lost = self
                .agents
                .get(&id)
                .is_some_and(|s| s.row.status == LOST || s.row.status == PENDING);
            if lost {
                // Its kernels were released before the restart: reset, ignore its list.
                self.heartbeat(hb, ctx);
            } else {
                self.absorb(&hb);
                self.set_status(&id, ALIVE);
                to_diff.push(hb);
            }
        }
        let (store, metrics) = (self.store.clone(), self.metrics.clone());
        let diff = async move {
            for hb in to_diff {
                if let Err(e) = reconcile(&store, &metrics, &hb).await {
                    tracing::error!(agent_id = %hb.agent_id, error = %e, "reconciling with the heartbeat failed");
                }
            }
        };
        ctx.wait(diff.into_actor(self).map(|_, act, _| {
            act.mode = Mode::Normal;
            tracing::info!("manager in normal mode");
        }));
    }
}

/// The heartbeat is what runs on the agent: live kernels it does not list ended while the
/// manager was away; listed kernels the store does not hold live are reported.
async fn reconcile(
    store: &Store,
    metrics: &ManagerMetrics,
    hb: &Heartbeat,
) -> Result<(), super::store::StoreError> {
    let listed: HashSet<&str> = hb.kernels.iter().map(|(id, _, _)| id.as_str()).collect();
    let live = store.live_kernels_of(&hb.agent_id).await?;
    for k in live.iter().filter(|k| !listed.contains(k.id.as_str())) {
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
    Ok(())
}

impl Actor for AgentRegistry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Liveness is checked 4× per timeout (at most every second), rows flushed every second.
        let tick = (self.spec.heartbeat_timeout / 4).min(Duration::from_secs(1));
        ctx.run_interval(tick, |act, ctx| {
            if let Mode::Grace { until, .. } = &act.mode {
                if Instant::now() >= *until {
                    let Mode::Grace { latest, .. } =
                        std::mem::replace(&mut act.mode, Mode::Reconciling)
                    else {
                        unreachable!()
                    };
                    act.end_grace(latest, ctx);
                }
            }
            act.check_liveness(ctx);
            act.flush(ctx);
            act.drive_dangling(ctx);
        });
        let retention = self.spec.processed_event_retention.as_secs_f64();
        ctx.run_interval(Duration::from_secs(3600), move |act, ctx| {
            let store = act.store.clone();
            ctx.spawn(
                async move {
                    match store.prune_processed_events(retention).await {
                        Ok(n) if n > 0 => {
                            tracing::info!(pruned = n, "old processed event ids pruned")
                        }
                        Ok(_) => {}
                        Err(e) => tracing::warn!(error = %e, "pruning processed event ids failed"),
                    }
                }
                .into_actor(act),
            );
        });
    }
}

/// An agent's heartbeat arrived.
#[derive(Message)]
#[rtype(result = "()")]
pub struct HeartbeatReceived(pub Heartbeat);

impl Handler<HeartbeatReceived> for AgentRegistry {
    type Result = ();
    fn handle(&mut self, HeartbeatReceived(hb): HeartbeatReceived, ctx: &mut Context<Self>) {
        self.metrics.heartbeats.inc();
        match &mut self.mode {
            Mode::Grace { latest, .. } => {
                let newer = latest.get(&hb.agent_id).is_none_or(|old| old.ts <= hb.ts);
                if let Some(s) = self.agents.get_mut(&hb.agent_id) {
                    s.last_seen = Instant::now();
                }
                if newer {
                    latest.insert(hb.agent_id.clone(), hb);
                }
            }
            Mode::Reconciling => {
                if let Some(s) = self.agents.get_mut(&hb.agent_id) {
                    s.last_seen = Instant::now();
                }
            }
            Mode::Normal => self.heartbeat(hb, ctx),
        }
    }
}

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
                    match self
                        .agents
                        .get(&msg.agent_id)
                        .map(|s| s.row.status.as_str())
                    {
                        Some(LOST) | Some(PENDING) => self.begin_reset(&msg.agent_id, ctx),
                        _ => self.set_status(&msg.agent_id, ALIVE),
                    }
                    let s = self.state(&msg.agent_id);
                    s.last_seen = Instant::now();
                    Some(s.row.clone())
                }
                EventBody::AgentTerminated { reason } => {
                    // A lost agent stays LOST: it must be reset before it is used again.
                    if self
                        .agents
                        .get(&msg.agent_id)
                        .is_none_or(|s| s.row.status != LOST && s.row.status != PENDING)
                    {
                        tracing::info!(agent_id = %msg.agent_id, %reason, "agent terminated");
                        self.set_status(&msg.agent_id, TERMINATED);
                    }
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
                let mut dangling = Vec::new();
                for (ev, row, skip) in plan {
                    match store.apply_event(&agent_id, &ev, row.as_ref(), skip).await {
                        Ok(Applied::Applied) => {
                            metrics.events_applied.with_label_values(&[ev.body.name()]).inc();
                            if let EventBody::KernelDangling { kernel_id, container_id, session_id, running, host_ports, adoptable } = &ev.body {
                                tracing::warn!(%agent_id, %kernel_id, %container_id, %session_id, running, ?host_ports, adoptable, "agent reports a dangling container");
                                dangling.push((kernel_id.clone(), session_id.clone(), *adoptable));
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
                (acked, dangling, agent_id)
            }
            .into_actor(self)
            .map(|(acked, dangling, agent_id), act, ctx| {
                for (kernel_id, session_id, adoptable) in dangling {
                    act.metrics.dangling_kernels.with_label_values(&["reported"]).inc();
                    act.dangling.report(&agent_id, &kernel_id, &session_id, adoptable, act.spec.dangling_grace);
                }
                act.drive_dangling(ctx);
                acked
            }),
        )
    }
}

/// What the API shows of one agent.
#[derive(Clone, Debug)]
pub struct AgentSnapshot {
    /// The row (status, address, slots total, last heartbeat).
    pub row: AgentRow,
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
            .map(|s| AgentSnapshot { row: s.row.clone() })
            .collect();
        v.sort_by(|a, b| a.row.id.cmp(&b.row.id));
        MessageResult(v)
    }
}

/// `ALIVE` agents with an address and some `cpu`: where the scheduler may place. Each row carries
/// its slots in total and their types (the scheduler's known slots are their union).
#[derive(Message)]
#[rtype(result = "Vec<AgentRow>")]
pub struct PlacementCandidates;

impl Handler<PlacementCandidates> for AgentRegistry {
    type Result = MessageResult<PlacementCandidates>;
    fn handle(&mut self, _: PlacementCandidates, _: &mut Context<Self>) -> Self::Result {
        MessageResult(
            self.agents
                .values()
                .filter(|s| {
                    s.row.status == ALIVE
                        && s.endpoint.is_some()
                        && s.row.slots_total.get(crate::slots::CPU) > crate::slots::Amount::ZERO
                })
                .map(|s| s.row.clone())
                .collect(),
        )
    }
}

/// `Some(remaining)` while the start-up grace period (or the reconciliation after it) runs.
#[derive(Message)]
#[rtype(result = "Option<Duration>")]
pub struct GraceRemaining;

impl Handler<GraceRemaining> for AgentRegistry {
    type Result = Option<Duration>;
    fn handle(&mut self, _: GraceRemaining, _: &mut Context<Self>) -> Self::Result {
        match &self.mode {
            Mode::Grace { until, .. } => Some(
                until
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_secs(1)),
            ),
            Mode::Reconciling => Some(Duration::from_secs(1)),
            Mode::Normal => None,
        }
    }
}

/// Writes every changed row now (on shutdown).
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
                    tracing::error!(error = %e, "could not save agent rows at shutdown");
                }
            }
            .into_actor(self),
        )
    }
}

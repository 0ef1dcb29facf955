//! `AgentRegistry`: agent liveness (`docs/scenarios.md`). Each replica keeps every agent's row
//! in memory: what its own intake hears (heartbeats, written behind to the store in one
//! transaction a second) and what the other replicas wrote (re-read from the store each
//! second). The store is the truth that placement and every replica share.
//!
//! The statuses and their transitions are a pure state machine (`liveness.rs`, with its
//! diagram); the start-up grace is another (`grace.rs`). This actor gathers the facts they need
//! and applies their answers.
//! - Leader duties (the replica holding the lock, `super::leader`): the heartbeat-timeout
//!   sweep, the reset flow, processed-event pruning and dangling-kernel decisions. `LOST`,
//!   `PENDING` and the reset's `ALIVE` are conditional updates in the store, so each happens
//!   once however many replicas there are or have been.
//! - `LOST`: no replica heard from it (`seen_at`) for `heartbeat-timeout` (counted from this
//!   replica's start at the earliest). Its live kernels leave the live set (`agent-lost`), their
//!   `concurrency_used` comes back, its pool entry is invalidated, and `agent_terminated`
//!   (`agent-lost`) is logged and counted. A lost agent may still run containers the manager has
//!   released, so it is only placed on again after `reset_instance` returns: until then it is
//!   `PENDING` and the kernel lists of its heartbeats are ignored.
//! - `TERMINATED` (clean shutdown): kernels stay live (`on-shutdown = "preserve"` keeps their
//!   containers); no timeout applies until it reports again.
//! - Start-up grace (`grace.rs`, `reconcile.rs`): kernel API calls are refused (503) until every
//!   agent the store had `ALIVE` has been heard from since this start, or for `startup-grace` at
//!   most; then the store is reconciled with each agent's newest heartbeat.
//! - Dangling kernels (`kernel_dangling`, Backend.AI's agent architecture): adopted when the
//!   store holds them live on the reporting agent, destroyed after `dangling-grace` otherwise
//!   (`dangling.rs`).
//! - Cordon and drain (`cordon.rs`): each row's scheduling flags, which placement reads; the
//!   API's store writes, taken at once by this replica and from the re-read rows by the others.

mod apply;
pub mod cordon;
mod dangling;
mod grace;
pub mod heartbeat;
pub mod inbox;
pub mod liveness;
mod queries;
mod reconcile;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

pub use apply::ApplyEvents;
pub use cordon::{Scheduling, SetScheduling};
pub use heartbeat::Heartbeat;
pub use inbox::{HeartbeatInbox, InboxFull, Put};
pub use liveness::AgentStatus;
pub use queries::{
    AgentAddr, AgentImageSets, AgentImages, AgentSnapshot, CountByStatus, FlushAgents,
    GraceRemaining, ListAgents, PlacementCandidates,
};

use super::calls::call_method;
use super::leader::Leadership;
use super::metrics::ManagerMetrics;
use super::pool::{AgentEndpoint, AgentPool, Connect, Invalidate, Reconnect, RegisterAgent};
use super::store::{now, AgentRow, Store};
use crate::rpc::agent_api::kernel::{NoArgs, ResetAgent};
use crate::rpc::curve::CurveKey;
use grace::{GraceEnd, Mode};
use liveness::{Effect, Liveness, LossRecord, ResetGate, ResetOutcome, Step, Sweep};

/// Liveness statuses, as stored and shown ([`AgentStatus::as_str`]).
pub const ALIVE: &str = AgentStatus::Alive.as_str();
/// No heartbeat within the timeout.
pub const LOST: &str = AgentStatus::Lost.as_str();
/// Back from `LOST`, being reset.
pub const PENDING: &str = AgentStatus::Pending.as_str();
/// Shut down cleanly.
pub const TERMINATED: &str = AgentStatus::Terminated.as_str();

/// How far back (seconds) each re-read of other replicas' rows reaches before the previous
/// one: a row is stamped before its transaction commits, so a commit that took this long still
/// shows up.
const REFRESH_OVERLAP: f64 = 2.0;

/// Agent rows one write-behind transaction holds at most (two statements of the store's
/// multi-row upsert): a create's write waits for one such transaction at most.
const FLUSH_CHUNK: usize = 64;

/// The registry's intervals.
#[derive(Clone, Debug)]
pub struct RegistrySpec {
    /// No heartbeat for this long → `LOST`.
    pub heartbeat_timeout: Duration,
    /// Kernel API refused for at most this long after start.
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
    /// The row; its `status` is the liveness status.
    row: AgentRow,
    /// Its row is to be written behind: its facts or liveness changed, or it was heard from
    /// and the `seen_at` last written is older than [`AgentRegistry::seen_write_gap`].
    dirty: bool,
    /// The `seen_at` of the row as last written (or read).
    saved_seen_at: f64,
    /// The reset flow is in flight ([`Liveness::resetting`]).
    resetting: bool,
    /// A `mark_agent_lost` is in flight ([`Liveness::losing`]).
    losing: bool,
    endpoint: Option<AgentEndpoint>,
    /// The images its engine holds, from the newest heartbeat this replica took (references
    /// as the engine names them; empty until one says). Kept in memory only, beside the row:
    /// another replica's row does not carry them.
    images: Arc<HashSet<String>>,
    /// Unix seconds this replica last wrote the row's scheduling flags ([`SetScheduling`]);
    /// 0 when never. A re-read that began earlier carries older flags.
    scheduling_set_at: f64,
}

impl AgentState {
    /// A row as the store holds it: nothing to write back, no endpoint told to the pool yet.
    fn stored(row: AgentRow) -> AgentState {
        AgentState {
            saved_seen_at: row.seen_at,
            row,
            dirty: false,
            resetting: false,
            losing: false,
            endpoint: None,
            images: Arc::default(),
            scheduling_set_at: 0.0,
        }
    }

    /// Its liveness, for the transition functions.
    fn liveness(&self) -> Liveness {
        Liveness {
            status: self.row.status,
            resetting: self.resetting,
            losing: self.losing,
        }
    }
}

/// The registry actor.
pub struct AgentRegistry {
    store: Store,
    pool: Addr<AgentPool>,
    metrics: Arc<ManagerMetrics>,
    spec: RegistrySpec,
    leader: Leadership,
    agents: HashMap<String, AgentState>,
    mode: Mode,
    dangling: dangling::DanglingBook,
    /// Unix seconds of this start: nobody is lost sooner than a timeout after it.
    started_at: f64,
    /// Other replicas' rows are re-read from here (Unix seconds) on.
    refreshed_to: f64,
    refreshing: bool,
    flushing: bool,
    /// A read of the stored dangling reports is in flight.
    loading_dangling: bool,
    /// Where the scheduler may place, built on demand and dropped when a status, address or
    /// slot total changes (not on every heartbeat's `seen_at`): a fleet's worth of rows is not
    /// copied for every create.
    candidates: Option<Arc<Vec<AgentRow>>>,
    /// Every agent's images ([`AgentImages`]), built on demand and dropped when an agent's
    /// images change.
    image_sets: Option<Arc<AgentImageSets>>,
    /// Heartbeats the intake left, taken every [`HEARTBEAT_BATCH_INTERVAL`].
    inbox: Arc<HeartbeatInbox>,
    // Idle reclaim.
    /// The kernels' activity the heartbeats reported, by kernel id (the newest per kernel),
    /// written behind with the rows ([`Store::record_activity`]).
    activity: HashMap<String, crate::model::reclaim::ActivityReport>,
    /// A write of `activity` is in flight.
    activity_flushing: bool,
}

/// How often the registry takes the heartbeats waiting in its inbox and applies them as one
/// batch: a fleet's 500 heartbeats a second cost the registry's thread 10 wake-ups, not 500.
pub const HEARTBEAT_BATCH_INTERVAL: Duration = Duration::from_millis(100);

impl AgentRegistry {
    /// A registry over `rows` (the store's agents at start); every agent gets a full heartbeat
    /// timeout from now. The grace waits for the `ALIVE` ones; with none there is no grace.
    /// Heartbeats arrive through `inbox` (the intake puts them there).
    pub fn new(
        store: Store,
        pool: Addr<AgentPool>,
        metrics: Arc<ManagerMetrics>,
        spec: RegistrySpec,
        leader: Leadership,
        rows: Vec<AgentRow>,
        inbox: Arc<HeartbeatInbox>,
    ) -> Self {
        let started_at = now();
        let alive = rows
            .iter()
            .filter(|r| r.status == AgentStatus::Alive)
            .map(|r| r.id.clone())
            .collect();
        let agents = rows
            .into_iter()
            .map(|row| (row.id.clone(), AgentState::stored(row)))
            .collect();
        let mode = Mode::at_start(alive, Instant::now(), spec.startup_grace);
        match &mode {
            Mode::Grace { waiting, .. } => tracing::info!(
                agents = waiting.len(),
                "start-up grace: waiting for the agents the store had ALIVE"
            ),
            _ => tracing::info!("the store had no live agent: no start-up grace"),
        }
        AgentRegistry {
            store,
            pool,
            metrics,
            spec,
            leader,
            agents,
            mode,
            dangling: dangling::DanglingBook::default(),
            started_at,
            refreshed_to: started_at - REFRESH_OVERLAP,
            refreshing: false,
            flushing: false,
            loading_dangling: false,
            candidates: None,
            image_sets: None,
            inbox,
            activity: HashMap::new(),
            activity_flushing: false,
        }
    }

    fn state(&mut self, agent_id: &str) -> &mut AgentState {
        // A known agent (every heartbeat but the first): no id copied. Several lookups per
        // heartbeat, at 10,000 agents' flood tens of thousands a second.
        if self.agents.contains_key(agent_id) {
            return self.agents.get_mut(agent_id).expect("checked above");
        }
        self.candidates = None;
        self.publish_status(agent_id, Liveness::first_contact().status, "first-contact");
        self.agents
            .entry(agent_id.to_owned())
            .or_insert_with(|| AgentState {
                row: AgentRow {
                    id: agent_id.to_owned(),
                    status: Liveness::first_contact().status,
                    addr: None,
                    public_key: None,
                    region: None,
                    version: None,
                    slots_total: crate::slots::ResourceSlots::new(),
                    slot_types: heartbeat::slot_types(None),
                    last_heartbeat: None,
                    seen_at: now(),
                    status_changed: now(),
                    schedulable: true,
                    draining: false,
                    drain_deadline: None,
                },
                dirty: true,
                saved_seen_at: 0.0,
                resetting: false,
                losing: false,
                endpoint: None,
                images: Arc::default(),
                scheduling_set_at: 0.0,
            })
    }

    /// Puts an agent's new liveness on the event stream (`agent_status`). Every replica
    /// publishes the changes it applies, its own and those it reads from the others' rows, so a
    /// watcher of any replica sees them.
    fn publish_status(&self, agent_id: &str, status: AgentStatus, reason: &str) {
        self.store.events().publish(crate::model::event::Event {
            agent_id: Some(agent_id.to_owned()),
            status: Some(status.as_str().to_owned()),
            reason: Some(reason.to_owned()),
            ..crate::model::event::Event::of(crate::model::event::EventType::AgentStatus)
        });
    }

    /// Runs one liveness transition of `agent_id` (known or first heard from) and applies it.
    fn transition(
        &mut self,
        agent_id: &str,
        f: impl FnOnce(Liveness, ResetGate) -> Step,
        ctx: &mut Context<Self>,
    ) {
        let leader = self.leader.is_leader();
        let s = self.state(agent_id);
        let gate = ResetGate {
            leader,
            reachable: s.endpoint.is_some(),
        };
        let step = f(s.liveness(), gate);
        self.apply(agent_id, step, ctx);
    }

    /// Keeps a step's liveness and performs its effects, in order.
    fn apply(&mut self, agent_id: &str, step: Step, ctx: &mut Context<Self>) {
        let Some(s) = self.agents.get_mut(agent_id) else {
            return;
        };
        let from = s.row.status;
        let to = step.next.status;
        s.row.status = to;
        s.resetting = step.next.resetting;
        s.losing = step.next.losing;
        if from != to {
            self.candidates = None;
            self.publish_status(agent_id, to, liveness::change_reason(from, to));
        }
        for effect in step.effects {
            match effect {
                Effect::Persist | Effect::Stamp => {
                    if let Some(s) = self.agents.get_mut(agent_id) {
                        s.row.status_changed = now();
                        s.dirty |= effect == Effect::Persist;
                    }
                    self.candidates = None;
                    if effect == Effect::Persist {
                        tracing::info!(agent_id, %from, %to, "agent status");
                    }
                }
                Effect::StartReset => {
                    if from == AgentStatus::Lost {
                        tracing::info!(agent_id, "lost agent heard from again: resetting it");
                    }
                    self.start_reset(agent_id, ctx);
                }
                Effect::RecordLoss => self.record_loss(agent_id, ctx),
                Effect::InvalidatePeer => self.pool.do_send(Invalidate {
                    agent_id: agent_id.to_owned(),
                }),
            }
        }
    }

    /// Heard from `agent_id` now (heartbeat or event).
    fn seen(&mut self, agent_id: &str) {
        let gap = self.seen_write_gap();
        let s = self.state(agent_id);
        s.row.seen_at = now();
        s.dirty |= s.row.seen_at - s.saved_seen_at >= gap;
        self.mode.heard_from(agent_id);
    }

    /// How stale the stored `seen_at` of a live agent may get before a heartbeat rewrites it:
    /// an eighth of the heartbeat timeout. Other replicas read liveness from it (the leader
    /// marks an agent silent for a timeout `LOST`), so it stays well inside the timeout, but a
    /// fleet whose agents report more often than that (10,000 agents resending as soon as
    /// answered: `just bench scheduler`'s flood) no longer writes every row every second,
    /// holding SQLite's one connection from the creates.
    fn seen_write_gap(&self) -> f64 {
        self.spec.heartbeat_timeout.as_secs_f64() / 8.0
    }

    /// Tells the pool the agent's endpoint when it changed.
    fn note_endpoint(&mut self, agent_id: &str) {
        let pool = self.pool.clone();
        let s = self.state(agent_id);
        let Some(addr) = s.row.addr.clone() else {
            return;
        };
        let public_key = s
            .row
            .public_key
            .as_deref()
            .and_then(|k| CurveKey::from_z85(k).ok());
        let endpoint = AgentEndpoint { addr, public_key };
        if s.endpoint.as_ref() != Some(&endpoint) {
            s.endpoint = Some(endpoint.clone());
            let live = s.row.status == AgentStatus::Alive;
            pool.do_send(RegisterAgent {
                agent_id: agent_id.to_owned(),
                endpoint,
            });
            // Its persistent peer from now on (Backend.AI's agent RPC connection pooling), not
            // from the first call.
            if live {
                pool.do_send(Connect {
                    agent_id: agent_id.to_owned(),
                });
            }
            self.candidates = None;
        }
    }

    /// Takes the heartbeat's facts (address, key, slots, images) and tells the pool a changed
    /// endpoint.
    fn absorb(&mut self, hb: &Heartbeat) {
        let s = self.state(&hb.agent_id);
        if s.images.len() != hb.images.len() || hb.images.iter().any(|r| !s.images.contains(r)) {
            s.images = Arc::new(hb.images.iter().cloned().collect());
            self.image_sets = None;
        }
        let s = self.state(&hb.agent_id);
        let changed = s.row.slots_total != hb.slots_total || s.row.slot_types != hb.slot_types;
        let facts = s.row.addr.as_deref() != Some(hb.addr.as_str())
            || s.row.public_key != hb.public_key
            || s.row.region.as_deref() != Some(hb.region.as_str())
            || s.row.version.as_deref() != Some(hb.version.as_str());
        s.dirty |= changed || facts;
        // Copied only when they differ: a fleet's heartbeats mostly repeat what is known.
        if facts {
            s.row.addr = Some(hb.addr.clone());
            s.row.public_key = hb.public_key.clone();
            s.row.region = Some(hb.region.clone());
            s.row.version = Some(hb.version.clone());
        }
        if changed {
            s.row.slots_total = hb.slots_total.clone();
            s.row.slot_types = hb.slot_types.clone();
        }
        s.row.last_heartbeat = Some(hb.ts);
        // The endpoint comes from the address and key: looked at again only when they changed
        // (or none is known yet), not rebuilt (a key decoded) per heartbeat.
        let endpoint_due = facts || s.endpoint.is_none();
        if changed {
            self.candidates = None;
        }
        self.seen(&hb.agent_id);
        if endpoint_due {
            self.note_endpoint(&hb.agent_id);
        }
    }

    /// Applies what the inbox holds (one heartbeat per agent).
    fn take_heartbeats(&mut self, ctx: &mut Context<Self>) {
        for hb in self.inbox.take() {
            self.receive(hb, ctx);
        }
    }

    /// One heartbeat, as the mode wants it: kept for the end of the grace, only proof of life
    /// while reconciling, applied in normal mode.
    fn receive(&mut self, hb: Heartbeat, ctx: &mut Context<Self>) {
        if !self.mode.is_normal() {
            if let Some(s) = self.agents.get_mut(&hb.agent_id) {
                s.row.seen_at = now();
            }
        }
        if let Some(hb) = self.mode.receive(hb) {
            self.heartbeat(hb, ctx);
        }
    }

    // Idle reclaim.
    /// Keeps `reports` (a heartbeat's) for the next [`AgentRegistry::flush_activity`]: the
    /// newest per kernel.
    fn note_activity(&mut self, reports: Vec<crate::model::reclaim::ActivityReport>) {
        for r in reports {
            match self.activity.get_mut(&r.kernel_id) {
                Some(kept) if kept.at > r.at => {}
                Some(kept) => {
                    // The readings of both, the newer's where they overlap.
                    let mut utilization = std::mem::take(&mut kept.utilization);
                    utilization.extend(r.utilization.clone());
                    *kept = crate::model::reclaim::ActivityReport { utilization, ..r };
                }
                None => {
                    self.activity.insert(r.kernel_id.clone(), r);
                }
            }
        }
    }

    /// Writes the kept activity behind (one write at a time; a failed one is logged and its
    /// reports dropped: the next heartbeats report again).
    fn flush_activity(&mut self, ctx: &mut Context<Self>) {
        if self.activity_flushing || self.activity.is_empty() {
            return;
        }
        self.activity_flushing = true;
        let reports: Vec<_> = std::mem::take(&mut self.activity).into_values().collect();
        let store = self.store.clone();
        ctx.spawn(
            async move { store.record_activity(&reports).await }
                .into_actor(self)
                .map(|res, act, _| {
                    act.activity_flushing = false;
                    if let Err(e) = res {
                        tracing::warn!(error = %e, "could not record the kernels' activity; the next heartbeats report it again");
                    }
                }),
        );
    }

    /// A heartbeat in normal mode (or a lost agent's newest at the end of the grace).
    fn heartbeat(&mut self, mut hb: Heartbeat, ctx: &mut Context<Self>) {
        // A `TERMINATED` agent is `ALIVE` again only by its `agent_started` event: heartbeats
        // are not ordered with its events, so one sent just before its `agent_terminated` but
        // taken after it (heartbeats are taken in batches) revived a stopped agent, which
        // the sweep then marked `LOST`, releasing the kernels a preserving shutdown kept.
        if self
            .agents
            .get(&hb.agent_id)
            .is_some_and(|s| s.row.status == AgentStatus::Terminated)
        {
            return;
        }
        match self.agents.get(&hb.agent_id) {
            // Overtaken by a newer one (latest wins): its facts are stale, but it still proves
            // the agent is alive.
            Some(s) if s.row.last_heartbeat.is_some_and(|last| hb.ts < last) => {
                self.seen(&hb.agent_id)
            }
            _ => {
                self.note_activity(std::mem::take(&mut hb.activity));
                self.absorb(&hb)
            }
        }
        self.transition(&hb.agent_id, liveness::heard, ctx);
    }

    /// The reset flow ([`Effect::StartReset`]): `PENDING` in the store, a fresh connection,
    /// `reset_instance`, `ALIVE` in the store; its end is [`liveness::reset_finished`].
    fn start_reset(&mut self, agent_id: &str, ctx: &mut Context<Self>) {
        let (store, pool, metrics, timeout, id) = (
            self.store.clone(),
            self.pool.clone(),
            self.metrics.clone(),
            self.spec.reset_timeout,
            agent_id.to_owned(),
        );
        let call = async move {
            store
                .set_agent_status(&id, &[AgentStatus::Lost], AgentStatus::Pending)
                .await?;
            // The old connection was invalidated when the agent was lost: start afresh.
            let _ = pool
                .send(Reconnect {
                    agent_id: id.clone(),
                })
                .await;
            let v = call_method::<ResetAgent>(&pool, &metrics, &id, &NoArgs {}, timeout)
                .await
                .map_err(|e| anyhow::anyhow!(e))?;
            let alive = store
                .set_agent_status(&id, &[AgentStatus::Pending], AgentStatus::Alive)
                .await?;
            anyhow::Ok((v, alive))
        };
        let id = agent_id.to_owned();
        ctx.spawn(call.into_actor(self).map(move |res, act, ctx| {
            if !act.agents.contains_key(&id) {
                return;
            }
            let outcome = match res {
                Ok((v, true)) => {
                    tracing::info!(agent_id = %id, destroyed = v.destroyed, "agent reset; placing kernels on it again");
                    act.metrics.agent_resets.with_label_values(&["ok"]).inc();
                    ResetOutcome::Done
                }
                Ok((_, false)) => ResetOutcome::Overtaken,
                Err(e) => {
                    tracing::warn!(agent_id = %id, error = %e, "reset_instance failed; retrying on the next heartbeat");
                    act.metrics.agent_resets.with_label_values(&["failed"]).inc();
                    ResetOutcome::Failed
                }
            };
            act.transition(&id, |l, _| liveness::reset_finished(l, outcome), ctx);
        }));
    }

    /// Records the loss in the store ([`Effect::RecordLoss`]); its end is
    /// [`liveness::loss_recorded`].
    fn record_loss(&mut self, agent_id: &str, ctx: &mut Context<Self>) {
        let store = self.store.clone();
        let id = agent_id.to_owned();
        let id2 = id.clone();
        ctx.spawn(
            async move { store.mark_agent_lost(&id2).await }
                .into_actor(self)
                .map(move |res, act, ctx| {
                    if !act.agents.contains_key(&id) {
                        return;
                    }
                    let record = match res {
                        Ok(Some(kernels)) => {
                            act.metrics.agents_lost.inc();
                            tracing::warn!(
                                agent_id = %id, event = "agent_terminated", reason = "agent-lost", released_kernels = kernels.len(),
                                "agent lost: no heartbeat within {:?}", act.spec.heartbeat_timeout
                            );
                            LossRecord::Recorded
                        }
                        Ok(None) => LossRecord::NotRecorded,
                        Err(e) => {
                            tracing::error!(agent_id = %id, error = %e, "could not record the lost agent; retrying");
                            LossRecord::Failed
                        }
                    };
                    act.transition(&id, |l, _| liveness::loss_recorded(l, record), ctx);
                }),
        );
    }

    /// The leader's sweep ([`liveness::swept`]): agents nobody heard from for longer than the
    /// timeout become `LOST` (once, by a conditional update); lost agents heard from since start
    /// their reset.
    fn check_liveness(&mut self, ctx: &mut Context<Self>) {
        if !self.leader.is_leader() {
            return;
        }
        let timeout = self.spec.heartbeat_timeout.as_secs_f64();
        let t = now();
        let started = self.started_at;
        let steps: Vec<(String, Step)> = self
            .agents
            .values()
            .map(|s| {
                let sweep = Sweep {
                    silent_too_long: liveness::silent_too_long(s.row.seen_at, started, t, timeout),
                    heard_since_change: s.row.seen_at > s.row.status_changed,
                    gate: ResetGate {
                        leader: true,
                        reachable: s.endpoint.is_some(),
                    },
                };
                (s.row.id.clone(), liveness::swept(s.liveness(), sweep))
            })
            .filter(|(_, step)| !step.effects.is_empty())
            .collect();
        for (id, step) in steps {
            self.apply(&id, step, ctx);
        }
    }

    /// Changed rows, marked clean (the caller saves them).
    fn take_dirty(&mut self) -> Vec<AgentRow> {
        self.agents
            .values_mut()
            .filter(|s| s.dirty)
            .map(|s| {
                s.dirty = false;
                s.saved_seen_at = s.row.seen_at;
                s.row.clone()
            })
            .collect()
    }

    /// Write-behind of changed agent rows, in transactions of at most [`FLUSH_CHUNK`] rows (SQLite
    /// has one connection: a create waits for one chunk, not for a fleet's rows). One flush
    /// at a time; a failed one is retried.
    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.flushing {
            return;
        }
        let rows = self.take_dirty();
        if rows.is_empty() {
            return;
        }
        self.flushing = true;
        let store = self.store.clone();
        let ids: Vec<String> = rows.iter().map(|r| r.id.clone()).collect();
        ctx.spawn(
            async move {
                for chunk in rows.chunks(FLUSH_CHUNK) {
                    store.save_agents(chunk).await?;
                }
                Ok::<(), crate::manager::store::StoreError>(())
            }
            .into_actor(self)
            .map(move |res, act, _| {
                act.flushing = false;
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

    /// Re-reads the rows other replicas wrote since the last re-read: their agents' facts and
    /// `seen_at`, and the leader's transitions.
    fn refresh(&mut self, ctx: &mut Context<Self>) {
        if self.refreshing {
            return;
        }
        self.refreshing = true;
        let store = self.store.clone();
        let since = self.refreshed_to - REFRESH_OVERLAP;
        let next = now();
        ctx.spawn(
            async move { store.agents_changed_by_others(since).await }
                .into_actor(self)
                .map(move |res, act, ctx| {
                    act.refreshing = false;
                    match res {
                        Ok(rows) => {
                            act.refreshed_to = next;
                            for row in rows {
                                act.merge(row, next, ctx);
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "re-reading agent rows failed"),
                    }
                }),
        );
    }

    /// Takes a row another replica wrote (read from the store at `read_at`, Unix seconds): its
    /// status ([`liveness::keeps_own_status`], [`liveness::replica_wrote`]) and newer facts,
    /// keeping what this replica heard since (it is written with the next flush), and its
    /// scheduling flags (cordon, drain), which only the API's writes change: the store's, unless
    /// this replica wrote them after the read began.
    fn merge(&mut self, row: AgentRow, read_at: f64, ctx: &mut Context<Self>) {
        let id = row.id.clone();
        if row.seen_at > self.started_at {
            self.mode.heard_from(&id);
        }
        if !self.agents.contains_key(&id) {
            self.agents.insert(id.clone(), AgentState::stored(row));
            self.note_endpoint(&id);
            return;
        }
        let s = self.state(&id);
        let before = (s.row.slots_total.clone(), s.row.addr.clone());
        let own = s.liveness();
        let own_changed = s.row.status_changed;
        let (theirs, their_changed) = (row.status, row.status_changed);
        let their_row_newer = row.seen_at >= s.row.seen_at;
        let keep = liveness::keeps_own_status(s.dirty, own_changed, their_changed, their_row_newer);
        let own_flags = Scheduling::of(&s.row);
        // The flags do not follow `seen_at`: a cordon by another replica stamps `updated_at`
        // only, while this replica may have heard a heartbeat since.
        let flags = if s.scheduling_set_at > read_at {
            own_flags
        } else {
            Scheduling::of(&row)
        };
        // A first-contact row (this replica heard only an event from the agent, no heartbeat)
        // knows none of its facts: it takes theirs whatever their `seen_at`, keeping its own
        // newer `seen_at`. Without that it stayed unplaceable (no address, no slots) until the
        // agent's next heartbeat reached this replica, which may be never.
        if their_row_newer || (s.row.addr.is_none() && row.addr.is_some()) {
            let seen_at = s.row.seen_at.max(row.seen_at);
            s.row = row;
            s.row.seen_at = seen_at;
        }
        flags.apply_to(&mut s.row);
        // The status is set by the step (or kept) below.
        s.row.status = own.status;
        s.row.status_changed = if keep { own_changed } else { their_changed };
        if before != (s.row.slots_total.clone(), s.row.addr.clone()) || flags != own_flags {
            self.candidates = None;
        }
        if !keep {
            self.apply(&id, liveness::replica_wrote(own, theirs), ctx);
        }
        self.note_endpoint(&id);
    }
}

impl Actor for AgentRegistry {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Liveness is checked 4× per timeout (at most every second); rows are flushed and the
        // other replicas' re-read as often.
        let tick = (self.spec.heartbeat_timeout / 4).min(Duration::from_secs(1));
        ctx.run_interval(HEARTBEAT_BATCH_INTERVAL, |act, ctx| {
            act.take_heartbeats(ctx)
        });
        ctx.run_interval(tick, |act, ctx| {
            act.take_heartbeats(ctx);
            if let Some(end) = act.mode.grace_over(Instant::now()) {
                match end {
                    GraceEnd::AllReported => {
                        tracing::info!("every agent the store had ALIVE has reported")
                    }
                    GraceEnd::TimedOut { silent } => tracing::warn!(
                        silent,
                        "start-up grace ran out before every known agent reported"
                    ),
                }
                let latest = act.mode.end_grace();
                act.end_grace(latest, ctx);
            }
            act.flush(ctx);
            act.flush_activity(ctx);
            act.refresh(ctx);
            if act.mode.is_normal() {
                act.check_liveness(ctx);
            }
            act.load_dangling(ctx);
        });
        let retention = self.spec.processed_event_retention.as_secs_f64();
        ctx.run_interval(Duration::from_secs(3600), move |act, ctx| {
            if !act.leader.is_leader() {
                return;
            }
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

//! `AgentRegistry`: agent liveness (seed 003). Each replica keeps every agent's row in memory:
//! what its own intake hears (heartbeats, written behind to the store in one transaction a
//! second) and what the other replicas wrote (re-read from the store each second). The store
//! is the truth that placement and every replica share (issue 17).
//!
//! ```text
//!            heartbeat / agent_started                  no heartbeat for heartbeat-timeout
//! (new) ─────────────────────────────────▶ ALIVE ──────────────────────────────────────▶ LOST
//!                                          ▲  │ agent_terminated                           │ heartbeat or
//!                  heartbeat/agent_started │  ▼                                            │ agent_started
//!                                      TERMINATED            ALIVE ◀── reset_instance ── PENDING
//! ```
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
//! - Start-up grace: kernel API calls are refused (503) until every agent the store had `ALIVE`
//!   has been heard from since this start (by this replica or another), or for `startup-grace`
//!   at most; none when the store had no live agent (seed 003 ends the grace "after heartbeat
//!   processing ... finishes"). The newest heartbeat of each agent is kept, then the store is
//!   reconciled with it: live kernels it does not list are terminated (`missing-on-agent`),
//!   kernels it lists that the store does not hold live are reported (log +
//!   `kernelvisor_manager_unknown_kernels_total`).
//! - Dangling kernels (`kernel_dangling`, seed 001): adopted when the store holds them live on
//!   the reporting agent, destroyed after `dangling-grace` otherwise (dangling.rs).

mod dangling;
pub mod heartbeat;
pub mod inbox;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;

pub use heartbeat::Heartbeat;
pub use inbox::{HeartbeatInbox, InboxFull, Put};

use super::calls::call_method;
use super::events::{superseded, AgentEvent, EventBody};
use super::leader::Leadership;
use super::metrics::ManagerMetrics;
use super::pool::{AgentEndpoint, AgentPool, Connect, Invalidate, Reconnect, RegisterAgent};
use super::store::{now, AgentRow, Applied, KernelRow, Store};
use crate::rpc::agent_api::kernel::{NoArgs, ResetAgent};
use crate::rpc::curve::CurveKey;

/// Liveness statuses, as stored and shown.
pub const ALIVE: &str = "ALIVE";
/// No heartbeat within the timeout.
pub const LOST: &str = "LOST";
/// Back from `LOST`, being reset.
pub const PENDING: &str = "PENDING";
/// Shut down cleanly.
pub const TERMINATED: &str = "TERMINATED";

/// How far back (seconds) each re-read of other replicas' rows reaches before the previous
/// one: a row is stamped before its transaction commits, so a commit that took this long still
/// shows up.
const REFRESH_OVERLAP: f64 = 2.0;

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
    row: AgentRow,
    /// Heard from by this replica since the last flush: its row is written behind.
    dirty: bool,
    resetting: bool,
    /// A `mark_agent_lost` is in flight.
    losing: bool,
    endpoint: Option<AgentEndpoint>,
}

impl AgentState {
    /// A row as the store holds it: nothing to write back, no endpoint told to the pool yet.
    fn stored(row: AgentRow) -> AgentState {
        AgentState {
            row,
            dirty: false,
            resetting: false,
            losing: false,
            endpoint: None,
        }
    }
}

enum Mode {
    /// Start-up: newest heartbeat per agent, applied at the end.
    Grace {
        until: Instant,
        latest: HashMap<String, Heartbeat>,
        /// Agents the store had `ALIVE` at start and no replica has heard from since.
        waiting: HashSet<String>,
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
    /// Heartbeats the intake left, taken every [`HEARTBEAT_BATCH_INTERVAL`].
    inbox: Arc<HeartbeatInbox>,
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
        let waiting: HashSet<String> = rows
            .iter()
            .filter(|r| r.status == ALIVE)
            .map(|r| r.id.clone())
            .collect();
        let agents = rows
            .into_iter()
            .map(|row| (row.id.clone(), AgentState::stored(row)))
            .collect();
        let mode = if waiting.is_empty() {
            tracing::info!("the store had no live agent: no start-up grace");
            Mode::Normal
        } else {
            tracing::info!(
                agents = waiting.len(),
                "start-up grace: waiting for the agents the store had ALIVE"
            );
            Mode::Grace {
                until: Instant::now() + spec.startup_grace,
                latest: HashMap::new(),
                waiting,
            }
        };
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
            inbox,
        }
    }

    /// Takes the reports the store holds (other replicas', the previous leader's) into the
    /// book, then drives it; the leader's duty. One read at a time.
    fn load_dangling(&mut self, ctx: &mut Context<Self>) {
        if !self.leader.is_leader() || self.loading_dangling {
            return;
        }
        self.loading_dangling = true;
        let store = self.store.clone();
        ctx.spawn(
            async move { store.dangling_reports().await }
                .into_actor(self)
                .map(|res, act, ctx| {
                    act.loading_dangling = false;
                    match res {
                        Ok(reports) => {
                            act.dangling.load(&reports, act.spec.dangling_grace);
                            act.drive_dangling(ctx);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "reading dangling kernel reports failed")
                        }
                    }
                }),
        );
    }

    /// Runs a step for every dangling report that is due (dangling.rs); the leader's duty.
    fn drive_dangling(&mut self, ctx: &mut Context<Self>) {
        if !self.leader.is_leader() {
            return;
        }
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
                            let store = act.store.clone();
                            actix::spawn(async move {
                                let _ = store.resolve_dangling_report(&p.agent_id, &p.kernel_id).await;
                            });
                        }
                    }),
            );
        }
    }

    fn state(&mut self, agent_id: &str) -> &mut AgentState {
        if !self.agents.contains_key(agent_id) {
            self.candidates = None;
        }
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
                    seen_at: now(),
                    status_changed: now(),
                },
                dirty: true,
                resetting: false,
                losing: false,
                endpoint: None,
            })
    }

    /// A status change this replica may make alone (`ALIVE` ⇄ `TERMINATED`): in memory, written
    /// with the row (the store keeps a `LOST`/`PENDING` the leader wrote).
    fn set_status(&mut self, agent_id: &str, status: &str) {
        let s = self.state(agent_id);
        if s.row.status != status {
            tracing::info!(agent_id, from = %s.row.status, to = status, "agent status");
            s.row.status = status.to_owned();
            s.row.status_changed = now();
            s.dirty = true;
            self.candidates = None;
        }
    }

    /// Heard from `agent_id` now (heartbeat or event).
    fn seen(&mut self, agent_id: &str) {
        let s = self.state(agent_id);
        s.row.seen_at = now();
        s.dirty = true;
        if let Mode::Grace { waiting, .. } = &mut self.mode {
            waiting.remove(agent_id);
        }
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
            let live = s.row.status == ALIVE;
            pool.do_send(RegisterAgent {
                agent_id: agent_id.to_owned(),
                endpoint,
            });
            // Its persistent peer from now on (seed 000), not from the first call.
            if live {
                pool.do_send(Connect {
                    agent_id: agent_id.to_owned(),
                });
            }
            self.candidates = None;
        }
    }

    /// Takes the heartbeat's facts (address, key, slots) and tells the pool a changed endpoint.
    fn absorb(&mut self, hb: &Heartbeat) {
        let s = self.state(&hb.agent_id);
        let changed = s.row.slots_total != hb.slots_total || s.row.slot_types != hb.slot_types;
        s.row.addr = Some(hb.addr.clone());
        s.row.public_key = hb.public_key.clone();
        s.row.region = Some(hb.region.clone());
        s.row.version = Some(hb.version.clone());
        s.row.slots_total = hb.slots_total.clone();
        s.row.slot_types = hb.slot_types.clone();
        s.row.last_heartbeat = Some(hb.ts);
        if changed {
            self.candidates = None;
        }
        self.seen(&hb.agent_id);
        self.note_endpoint(&hb.agent_id);
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
        match &mut self.mode {
            Mode::Grace {
                latest, waiting, ..
            } => {
                let newer = latest.get(&hb.agent_id).is_none_or(|old| old.ts <= hb.ts);
                waiting.remove(&hb.agent_id);
                if let Some(s) = self.agents.get_mut(&hb.agent_id) {
                    s.row.seen_at = now();
                }
                if newer {
                    latest.insert(hb.agent_id.clone(), hb);
                }
            }
            Mode::Reconciling => {
                if let Some(s) = self.agents.get_mut(&hb.agent_id) {
                    s.row.seen_at = now();
                }
            }
            Mode::Normal => self.heartbeat(hb, ctx),
        }
    }

    /// A heartbeat in normal mode.
    fn heartbeat(&mut self, hb: Heartbeat, ctx: &mut Context<Self>) {
        let status = self.agents.get(&hb.agent_id).map(|s| s.row.status.clone());
        match self.agents.get(&hb.agent_id) {
            // Overtaken by a newer one (latest wins): its facts are stale, but it still proves
            // the agent is alive.
            Some(s) if s.row.last_heartbeat.is_some_and(|last| hb.ts < last) => {
                self.seen(&hb.agent_id)
            }
            _ => self.absorb(&hb),
        }
        match status.as_deref() {
            None | Some(TERMINATED) => self.set_status(&hb.agent_id, ALIVE),
            Some(LOST) | Some(PENDING) => self.begin_reset(&hb.agent_id, ctx),
            _ => {}
        }
    }

    /// `PENDING` and `reset_instance`: the leader's duty (a standby leaves it to the leader,
    /// which sees the agent's newer `seen_at` in the store). One in flight per agent; retried on
    /// the next tick while the agent is heard from.
    fn begin_reset(&mut self, agent_id: &str, ctx: &mut Context<Self>) {
        if !self.leader.is_leader() {
            return;
        }
        let s = self.state(agent_id);
        if s.resetting || s.endpoint.is_none() {
            return;
        }
        s.resetting = true;
        let (store, pool, metrics, timeout, id) = (
            self.store.clone(),
            self.pool.clone(),
            self.metrics.clone(),
            self.spec.reset_timeout,
            agent_id.to_owned(),
        );
        let call = async move {
            store.set_agent_status(&id, &[LOST], PENDING).await?;
            // The old connection was invalidated when the agent was lost: start afresh.
            let _ = pool
                .send(Reconnect {
                    agent_id: id.clone(),
                })
                .await;
            let v = call_method::<ResetAgent>(&pool, &metrics, &id, &NoArgs {}, timeout)
                .await
                .map_err(|e| anyhow::anyhow!(e))?;
            let alive = store.set_agent_status(&id, &[PENDING], ALIVE).await?;
            anyhow::Ok((v, alive))
        };
        let id = agent_id.to_owned();
        if let Some(s) = self.agents.get_mut(&id) {
            if s.row.status == LOST {
                tracing::info!(agent_id = %id, "lost agent heard from again: resetting it");
                s.row.status = PENDING.into();
                self.candidates = None;
            }
        }
        ctx.spawn(call.into_actor(self).map(move |res, act, _| {
            let Some(s) = act.agents.get_mut(&id) else { return };
            s.resetting = false;
            match res {
                Ok((v, true)) => {
                    tracing::info!(agent_id = %id, destroyed = v.destroyed, "agent reset; placing kernels on it again");
                    act.metrics.agent_resets.with_label_values(&["ok"]).inc();
                    s.row.status = ALIVE.into();
                    s.row.status_changed = now();
                    act.candidates = None;
                }
                // Lost again meanwhile: the next heartbeat resets it again.
                Ok((_, false)) => {}
                Err(e) => {
                    tracing::warn!(agent_id = %id, error = %e, "reset_instance failed; retrying on the next heartbeat");
                    act.metrics.agent_resets.with_label_values(&["failed"]).inc();
                }
            }
        }));
    }

    /// The leader's sweep: agents nobody heard from for longer than the timeout become `LOST`
    /// (once, by a conditional update); lost agents heard from since start their reset.
    fn check_liveness(&mut self, ctx: &mut Context<Self>) {
        if !self.leader.is_leader() {
            return;
        }
        let timeout = self.spec.heartbeat_timeout.as_secs_f64();
        let t = now();
        let started = self.started_at;
        let lost: Vec<String> = self
            .agents
            .values()
            .filter(|s| {
                (s.row.status == ALIVE || s.row.status == PENDING)
                    && !s.losing
                    && t - s.row.seen_at.max(started) > timeout
            })
            .map(|s| s.row.id.clone())
            .collect();
        let back: Vec<String> = self
            .agents
            .values()
            .filter(|s| {
                !s.resetting
                    && ((s.row.status == LOST && s.row.seen_at > s.row.status_changed)
                        || s.row.status == PENDING)
            })
            .map(|s| s.row.id.clone())
            .collect();
        for id in back {
            self.begin_reset(&id, ctx);
        }
        for id in lost {
            self.state(&id).losing = true;
            let store = self.store.clone();
            let id2 = id.clone();
            ctx.spawn(
                async move { store.mark_agent_lost(&id2).await }
                    .into_actor(self)
                    .map(move |res, act, _| {
                        let Some(s) = act.agents.get_mut(&id) else { return };
                        s.losing = false;
                        match res {
                            Ok(Some(kernels)) => {
                                s.row.status = LOST.into();
                                s.row.status_changed = now();
                                act.candidates = None;
                                act.pool.do_send(Invalidate { agent_id: id.clone() });
                                act.metrics.agents_lost.inc();
                                tracing::warn!(
                                    agent_id = %id, event = "agent_terminated", reason = "agent-lost", released_kernels = kernels.len(),
                                    "agent lost: no heartbeat within {:?}", act.spec.heartbeat_timeout
                                )
                            }
                            // Not ALIVE/PENDING in the store: another replica's write (a newer
                            // status) arrives with the next re-read.
                            Ok(None) => {}
                            Err(e) => {
                                tracing::error!(agent_id = %id, error = %e, "could not record the lost agent; retrying")
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

    /// Write-behind of changed agent rows: every heartbeat this replica took in the last second,
    /// in one transaction. One flush at a time; a failed one is retried.
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
            async move { store.save_agents(&rows).await }
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
                .map(move |res, act, _| {
                    act.refreshing = false;
                    match res {
                        Ok(rows) => {
                            act.refreshed_to = next;
                            for row in rows {
                                act.merge(row);
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "re-reading agent rows failed"),
                    }
                }),
        );
    }

    /// Takes a row another replica wrote: its status and newer facts, keeping what this replica
    /// heard since (it is written with the next flush).
    fn merge(&mut self, row: AgentRow) {
        let id = row.id.clone();
        let started = self.started_at;
        if let Mode::Grace { waiting, .. } = &mut self.mode {
            if row.seen_at > started {
                waiting.remove(&id);
            }
        }
        if !self.agents.contains_key(&id) {
            self.agents.insert(id.clone(), AgentState::stored(row));
            self.note_endpoint(&id);
            return;
        }
        let s = self.state(&id);
        let before = (s.row.slots_total.clone(), s.row.addr.clone());
        let was = std::mem::take(&mut s.row.status);
        if row.seen_at >= s.row.seen_at {
            let local_status_changed = s.row.status_changed;
            s.row = row;
            // A local ALIVE ⇄ TERMINATED not yet flushed stays; the leader's newer ones win.
            if s.dirty && local_status_changed > s.row.status_changed {
                s.row.status = was.clone();
                s.row.status_changed = local_status_changed;
            }
        } else {
            s.row.status = row.status;
            s.row.status_changed = row.status_changed;
        }
        let now_status = s.row.status.clone();
        if now_status != was || before != (s.row.slots_total.clone(), s.row.addr.clone()) {
            self.candidates = None;
        }
        if now_status == LOST && was != LOST {
            self.pool.do_send(Invalidate {
                agent_id: id.clone(),
            });
        }
        self.note_endpoint(&id);
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
            if let Err(e) = reconcile(&store, &metrics, &to_diff).await {
                tracing::error!(error = %e, "reconciling with the heartbeats failed");
            }
        };
        ctx.wait(diff.into_actor(self).map(|_, act, _| {
            act.mode = Mode::Normal;
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
) -> Result<(), super::store::StoreError> {
    if heartbeats.is_empty() {
        return Ok(());
    }
    let mut live_by_agent = store.live_kernels_by_agent().await?;
    for hb in heartbeats {
        let live: Vec<KernelRow> = live_by_agent.remove(&hb.agent_id).unwrap_or_default();
        let listed: HashSet<&str> = hb.kernels.iter().map(|(id, _, _)| id.as_str()).collect();
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
    }
    Ok(())
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
            if let Mode::Grace { until, waiting, .. } = &act.mode {
                if waiting.is_empty() || Instant::now() >= *until {
                    if waiting.is_empty() {
                        tracing::info!("every agent the store had ALIVE has reported");
                    } else {
                        tracing::warn!(
                            silent = waiting.len(),
                            "start-up grace ran out before every known agent reported"
                        );
                    }
                    let Mode::Grace { latest, .. } =
                        std::mem::replace(&mut act.mode, Mode::Reconciling)
                    else {
                        unreachable!()
                    };
                    act.end_grace(latest, ctx);
                }
            }
            act.flush(ctx);
            act.refresh(ctx);
            if matches!(act.mode, Mode::Normal) {
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
                    match self
                        .agents
                        .get(&msg.agent_id)
                        .map(|s| s.row.status.as_str())
                    {
                        Some(LOST) | Some(PENDING) => self.begin_reset(&msg.agent_id, ctx),
                        _ => self.set_status(&msg.agent_id, ALIVE),
                    }
                    Some(self.state(&msg.agent_id).row.clone())
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

/// How many agents are in each status (`/health`, `/metrics`; without copying every row).
#[derive(Message)]
#[rtype(result = "HashMap<String, usize>")]
pub struct CountByStatus;

impl Handler<CountByStatus> for AgentRegistry {
    type Result = MessageResult<CountByStatus>;
    fn handle(&mut self, _: CountByStatus, _: &mut Context<Self>) -> Self::Result {
        let mut counts = HashMap::new();
        for s in self.agents.values() {
            *counts.entry(s.row.status.clone()).or_insert(0) += 1;
        }
        MessageResult(counts)
    }
}

/// One agent's RPC address (`tcp://host:port`), if the registry knows it.
#[derive(Message)]
#[rtype(result = "Option<String>")]
pub struct AgentAddr(pub String);

impl Handler<AgentAddr> for AgentRegistry {
    type Result = Option<String>;
    fn handle(&mut self, AgentAddr(id): AgentAddr, _: &mut Context<Self>) -> Option<String> {
        self.agents.get(&id).and_then(|s| s.row.addr.clone())
    }
}

/// `ALIVE` agents with an address and some `cpu`: where the scheduler may place. Each row carries
/// its slots in total and their types (the scheduler's known slots are their union).
#[derive(Message)]
#[rtype(result = "Arc<Vec<AgentRow>>")]
pub struct PlacementCandidates;

impl Handler<PlacementCandidates> for AgentRegistry {
    type Result = MessageResult<PlacementCandidates>;
    fn handle(&mut self, _: PlacementCandidates, ctx: &mut Context<Self>) -> Self::Result {
        // Placement sees every heartbeat the intake took before it asked, not only the last batch.
        if matches!(self.mode, Mode::Normal) {
            self.take_heartbeats(ctx);
        }
        let agents = &self.agents;
        let list = self.candidates.get_or_insert_with(|| {
            Arc::new(
                agents
                    .values()
                    .filter(|s| {
                        s.row.status == ALIVE
                            && s.endpoint.is_some()
                            && s.row.slots_total.get(crate::slots::CPU) > crate::slots::Amount::ZERO
                    })
                    .map(|s| s.row.clone())
                    .collect(),
            )
        });
        MessageResult(list.clone())
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

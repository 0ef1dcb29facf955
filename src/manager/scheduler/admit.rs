//! Admission rounds: the leader takes queued (`PENDING`) sessions out of the store in order,
//! plans which fit where ([`super::queue::plan`]), admits each in the store (the agent's room
//! re-checked in the transaction, as a direct create's reservation is) and creates it the way
//! a direct create does, with nobody waiting ([`Waiter::Nobody`]).
//!
//! Rounds run on an arbiter of their own (`Scheduler::new`'s `rounds`), their outcome handed
//! back to the scheduler's actor. A round starts every `[scheduler] admission-interval`, when
//! this replica ends a kernel (`Store::released`), and when a session is queued here
//! ([`Queued`]: unless the last round found no room less than an interval ago and the session
//! cannot preempt, see [`Queued`]). One round runs
//! at a time; a request during a round runs one more after it. Only the leader admits (the
//! queue is shared by every replica through the store), so a failover hands the queue over
//! with its order.

use std::time::Instant;

use actix::prelude::*;

use super::cluster::{end_gang, gang_kernels, GangLaunch, GangPlaced};
use super::evict::{preempt_for, Unplaced};
use super::launch::{new_kernel, resolve_mounts, ClusterPlace, Launcher, Placed};
use super::queue::{plan, Fleet};
use super::{AdmitNow, Queued, Scheduler};
use crate::manager::error::ManagerError;
use crate::manager::registry::{AgentImages, PlacementCandidates};
use crate::manager::store::{now, QueuedSession, ReserveError};
use crate::model::queue::{PendingCode, PendingReason};
use crate::model::session::SessionRequest;
use crate::slots::ResourceSlots;

/// What one round did (for tests and the bench: `kernelvisor_manager_admissions_total` is the
/// running count).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundOutcome {
    /// Sessions admitted.
    pub admitted: usize,
    /// Sessions the plan placed that lost their agent's room to another create.
    pub lost_races: usize,
}

impl Handler<AdmitNow> for Scheduler {
    type Result = ();

    fn handle(&mut self, _: AdmitNow, ctx: &mut Context<Self>) {
        self.start_round(ctx);
    }
}

impl Handler<Queued> for Scheduler {
    type Result = ();

    fn handle(&mut self, q: Queued, ctx: &mut Context<Self>) {
        let may_preempt = self.spec.preemption.enabled && q.first_in_line;
        let stuck = !may_preempt
            && self.last_round.is_some_and(|(at, admitted)| {
                admitted == 0 && at.elapsed() < self.spec.admission_interval
            });
        if !stuck {
            self.start_round(ctx);
        }
    }
}

impl Scheduler {
    /// Starts a round unless one runs (then one more runs after it); nothing on a replica that
    /// does not lead.
    pub(super) fn start_round(&mut self, ctx: &mut Context<Self>) {
        if !self.leader.is_leader() {
            return;
        }
        if self.round_running {
            self.round_again = true;
            return;
        }
        self.round_running = true;
        self.round_again = false;
        let started = Instant::now();
        // On the rounds' own thread: the round's reads decode a window of the queue and copy
        // the fleet's usage, and its plan is pure CPU; on this actor's thread every create and
        // status call waited for them (issue 27's flood create p99). Its launches, spawned from
        // the round, run there too.
        let fut = self.round();
        let (tx, rx) = tokio::sync::oneshot::channel();
        if !self.rounds.spawn(async move {
            let _ = tx.send(fut.await);
        }) {
            // The manager is stopping: its tree stopped the rounds' thread.
            self.round_running = false;
            return;
        }
        let done = async move {
            rx.await.unwrap_or_else(|_| {
                Err(ManagerError::Internal(
                    "the admission rounds' thread stopped".into(),
                ))
            })
        };
        ctx.spawn(done.into_actor(self).map(move |r, act, ctx| {
            act.round_running = false;
            act.last_round = Some((started, r.as_ref().map_or(0, |out| out.admitted)));
            match r {
                // Room may be left (a round looks at one window of the queue): another round
                // at once rather than at the next tick, until one admits nothing.
                Ok(out) if out.lost_races > 0 || out.admitted > 0 => act.round_again = true,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "admission round failed; the next one retries")
                }
            }
            if act.round_again {
                act.start_round(ctx);
            }
        }));
    }

    /// One round: plan over the window, admit, launch, write the reasons, update metrics.
    fn round(&self) -> impl std::future::Future<Output = Result<RoundOutcome, ManagerError>> {
        let (store, registry, placing, launcher, metrics) = (
            self.store.clone(),
            self.registry.clone(),
            self.placing.clone(),
            self.launcher(),
            self.metrics.clone(),
        );
        let (policy, skips, window_size) = (
            self.spec.policy,
            self.spec.head_skip_rounds,
            self.spec.admission_window,
        );
        let cluster_placement = self.spec.cluster_placement;
        let preemption = self.spec.preemption;
        async move {
            let started = Instant::now();
            let mut out = RoundOutcome::default();
            // Whether anything waits is one row looked at; the gauge comes from the in-memory
            // depth (a count of every queued row, four times a second, held SQLite's one
            // connection from the creates).
            metrics.set_queue_depth(&store.queue_depth_cached().await?);
            if !store.any_queued().await? {
                return Ok(out);
            }
            metrics.admission_rounds.inc();
            let window = store.pending_window(window_size).await?;
            let candidates = registry.send(PlacementCandidates).await?;
            let images = registry.send(AgentImages).await?;
            let fleet = Fleet {
                candidates: &candidates,
                usage: store.usage_by_agent().await?,
                images: &images,
                keys: store.key_shares().await?,
                cluster_placement,
            };
            let mut p = plan(window, fleet, policy, skips);
            let unplaced = std::mem::take(&mut p.unplaced);
            let mut reasons = p.reasons;
            // Direct creates on this replica wait while a round admits (they would race it for
            // the same room). Only then: reading the queue and the fleet and planning hold
            // nobody up (with 10,000 agents and 100,000 queued, a round that admits nothing
            // takes long enough to show in every create's latency), and the store re-checks
            // each admitted session's room, so a create that placed meanwhile costs a lost race
            // and another round, never an overcommit.
            let _guard = match p.admit.is_empty() {
                true => None,
                false => Some(placing.lock().await),
            };
            // Each admitted agent's total by id (a scan of the fleet per admission was
            // O(agents) on the round's hot path).
            let totals: std::collections::HashMap<&str, &ResourceSlots> = candidates
                .iter()
                .map(|a| (a.id.as_str(), &a.slots_total))
                .collect();
            let none = ResourceSlots::new();
            // Cluster sessions are admitted one by one, each whole (`admit_gang`); the others
            // in one batch.
            let (gangs, singles): (Vec<_>, Vec<_>) =
                p.admit.iter().partition(|(q, _)| q.cluster_size > 1);
            for (q, agents) in gangs {
                match admit_gang(&launcher, q, agents, &totals).await {
                    Ok(true) => {
                        out.admitted += 1;
                        metrics.admissions.inc();
                        metrics
                            .admission_wait
                            .observe((now() - q.queued_at).max(0.0));
                    }
                    Ok(false) => {}
                    Err(ReserveError::NoRoom(_) | ReserveError::AgentNotAlive(..)) => {
                        if out.lost_races == 0 {
                            store.expire_usage();
                        }
                        out.lost_races += 1;
                    }
                    Err(e @ ReserveError::ConcurrencyLimit(..)) => {
                        let r = PendingReason::new(PendingCode::ConcurrencyLimit, e.to_string());
                        reasons.push((q.id.clone(), r, q.head_skips));
                    }
                    Err(ReserveError::UnknownAccessKey(k)) => {
                        tracing::info!(session_id = %q.session_id, access_key = %k, "queued session's access key is gone; cancelling it");
                        store.cancel_pending(&q.id, "access-key-disabled").await?;
                    }
                    Err(ReserveError::Store(e)) => return Err(e.into()),
                }
            }
            let batch: Vec<(&QueuedSession, &str, &ResourceSlots)> = singles
                .iter()
                .map(|(q, agents)| {
                    let agent_id = agents[0].as_str();
                    let total = totals.get(agent_id).copied().unwrap_or(&none);
                    (q, agent_id, total)
                })
                .collect();
            let outcomes = match batch.is_empty() {
                true => Vec::new(),
                false => store.admit_kernels(&batch).await?,
            };
            for ((q, _), outcome) in singles.iter().zip(outcomes) {
                let admitted = match outcome {
                    Ok(Some(a)) => a,
                    Ok(None) => continue,
                    Err(ReserveError::NoRoom(_) | ReserveError::AgentNotAlive(..)) => {
                        if out.lost_races == 0 {
                            store.expire_usage();
                        }
                        out.lost_races += 1;
                        continue;
                    }
                    Err(e @ ReserveError::ConcurrencyLimit(..)) => {
                        let r = PendingReason::new(PendingCode::ConcurrencyLimit, e.to_string());
                        reasons.push((q.id.clone(), r, q.head_skips));
                        continue;
                    }
                    Err(ReserveError::UnknownAccessKey(k)) => {
                        // Its key was disabled or deleted while it waited.
                        tracing::info!(session_id = %q.session_id, access_key = %k, "queued session's access key is gone; cancelling it");
                        store.cancel_pending(&q.id, "access-key-disabled").await?;
                        continue;
                    }
                    Err(ReserveError::Store(e)) => return Err(e.into()),
                };
                out.admitted += 1;
                metrics.admissions.inc();
                if let Some(at) = admitted.row.queued_at {
                    metrics
                        .admission_wait
                        .observe((admitted.row.admitted_at.unwrap_or_else(now) - at).max(0.0));
                }
                let launcher = launcher.clone();
                actix::spawn(async move {
                    let id = admitted.row.id.clone();
                    if let Err(e) = launcher.launch_stored(admitted).await {
                        tracing::info!(kernel_id = %id, error = %e, "an admitted session could not be created");
                    }
                });
            }
            store.set_pending_reasons(&reasons).await?;
            drop(_guard);
            if preemption.enabled && !unplaced.is_empty() {
                let u = Unplaced {
                    sessions: &unplaced,
                    candidates: &candidates,
                    images: &images,
                    placement: cluster_placement,
                };
                if let Err(e) = preempt_for(&launcher, u, preemption).await {
                    tracing::warn!(error = %e, "preemption failed this round; the next one looks again");
                }
            }
            if out.admitted > 0 {
                metrics.set_queue_depth(&store.queue_depth_cached().await?);
                tracing::debug!(
                    admitted = out.admitted,
                    took_ms = started.elapsed().as_millis() as u64,
                    "admission round"
                );
            }
            Ok(out)
        }
    }
}

/// Admits a queued cluster session whole on `agents` (one per kernel, `main1` first): its
/// stored request read back, its rows reserved in one transaction (the main row moves
/// `PENDING` → `SCHEDULED`, the others are inserted), then its creation spawned with nobody
/// waiting. `Ok(false)`: it was no longer `PENDING`, or its request cannot be read (then it is
/// cancelled, saying so).
///
/// Errors: the reservation's ([`ReserveError`]), nothing reserved.
async fn admit_gang(
    launcher: &Launcher,
    q: &QueuedSession,
    agents: &[String],
    totals: &std::collections::HashMap<&str, &ResourceSlots>,
) -> Result<bool, ReserveError> {
    let store = &launcher.store;
    let Some(text) = store.pending_request(&q.id).await? else {
        return Ok(false);
    };
    let req: SessionRequest = match serde_json::from_str(&text) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(session_id = %q.session_id, error = %e, "a queued cluster session's request cannot be read back; cancelling it");
            store.cancel_pending(&q.id, "internal").await?;
            return Ok(false);
        }
    };
    let size = u32::try_from(q.cluster_size).unwrap_or(1);
    let kernels = gang_kernels(&q.id, agents);
    let mut rows = Vec::with_capacity(kernels.len());
    for k in &kernels {
        let place = ClusterPlace {
            slot: k.slot.clone(),
            mode: q.cluster_mode,
            size,
        };
        let row = new_kernel(
            &q.access_key,
            &req,
            (&k.kernel_id, &q.session_id),
            &k.agent_id,
            &q.resource_slots,
            q.priority,
            &place,
        );
        match row {
            Ok(r) => rows.push(r),
            Err(e) => {
                store.cancel_pending(&q.id, e.code()).await?;
                return Ok(false);
            }
        }
    }
    let totals = agents
        .iter()
        .map(|a| {
            let t = totals
                .get(a.as_str())
                .map(|t| (*t).clone())
                .unwrap_or_default();
            (a.clone(), t)
        })
        .collect();
    if store.reserve_gang(&rows, &totals, true).await?.is_none() {
        return Ok(false);
    }
    let launcher = launcher.clone();
    let (owner, session_id, slots) = (
        q.access_key.clone(),
        q.session_id.clone(),
        q.resource_slots.clone(),
    );
    let main_id = q.id.clone();
    let mode = q.cluster_mode;
    actix::spawn(async move {
        let mounts = match resolve_mounts(&launcher.store, &owner, &req.mounts).await {
            Ok(m) => m,
            Err(e) => {
                if let Ok(rows) = launcher.store.session_kernels(&session_id).await {
                    end_gang(&launcher, &rows, e.code(), Some(std::time::Duration::ZERO)).await;
                }
                return;
            }
        };
        let placed = Placed {
            owner,
            request: req,
            kernel_id: main_id,
            session_id: session_id.clone(),
            agent_id: kernels[0].agent_id.clone(),
            slots,
            mounts,
        };
        // A generation a restart queued names its own network (`network_name`).
        let generation = match launcher.store.kernel(&placed.kernel_id).await {
            Ok(row) => row.map_or(0, |k| k.restart_count),
            Err(_) => 0,
        };
        match launcher
            .launch_gang(GangPlaced {
                placed,
                mode,
                kernels,
                generation,
            })
            .await
        {
            Ok(GangLaunch::Created) => {}
            Ok(GangLaunch::Requeued(row)) => {
                tracing::info!(session_id = %session_id, kernel_id = %row.id, "an admitted cluster session could not be created; requeued by its restart policy");
            }
            Err(e) => {
                tracing::info!(session_id = %session_id, error = %e, "an admitted cluster session could not be created");
            }
        }
    });
    Ok(true)
}

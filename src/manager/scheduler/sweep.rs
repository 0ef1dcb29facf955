//! The reconcile sweep: no state without a deadline (issue 27).
//!
//! Every transient state has a deadline in `[scheduler]` ([`StateDeadlines`]): `SCHEDULED` and
//! `PREPARING` (`preparing-timeout`), `PULLING` (`image-pull-timeout`), `CREATING`
//! (`creating-timeout`), `RESTARTING` (`restarting-timeout`), `TERMINATING`
//! (`terminating-timeout`), counted from the kernel's last status change. Every
//! `sweep-interval` the leader takes the kernels past theirs (at most [`SWEEP_BATCH`] a pass,
//! oldest first) and resolves each to what is true, asking its agent the way Backend.AI's
//! manager does for its stuck sessions (Backend.AI issues #3881 and #12317; the agent RPCs
//! `check_running`, `check_creating`):
//!
//! - the agent runs it (`check_running`) → `RUNNING` (outcome `running`): its answer or event
//!   was lost, the kernel is fine;
//! - `TERMINATING`: the destroy is driven again (`destroy_kernel`); the agent destroyed it or
//!   does not hold it → `TERMINATED` with the reason it was being destroyed for
//!   (`user-requested`); no answer → `TERMINATED` `terminating-timeout`;
//! - anything else → `TERMINATED` `<state>-timeout` (`preparing-timeout`, `pulling-timeout`,
//!   `creating-timeout`, `restarting-timeout`; a `SCHEDULED` kernel reads `preparing-timeout`),
//!   and the agent is asked to destroy what it holds of it (`check_creating`). A `PULLING`
//!   kernel past `image-pull-timeout` ends whether or not the pull goes on.
//!
//! An orphaned pull is re-driven long before that: the process that follows a `PULLING`
//! kernel writes to its row at least every `pull::TOUCH_INTERVAL` (5 s), so one unseen for
//! [`ORPHANED_PULL_AFTER`] lost its follower (its manager was restarted, or failed over). The
//! sweep claims it (`Store::claim_orphaned_pull`: one sweep, and never a live follower), asks
//! the agent (`check_running`: then `RUNNING`; `check_creating`: then the agent's events settle
//! it; else `check_pulling`) and creates it from its stored request
//! through the usual launch: `check_and_pull` joins the pull in flight or finds the image, the
//! follow and `create_kernels` go on as for a new session (outcome `adopted` when the pull was
//! still in flight, `redriven` when it had ended; an agent that does not answer is asked again
//! at the next claim, and `image-pull-timeout` still bounds it).
//!
//! An agent that cannot be reached does not keep the row: it ends all the same, so a lost
//! answer never leaks a reservation (slots, concurrency), and the next queued session is
//! admitted at once (`Store::released`). What the agent still holds is cleaned up when it is
//! heard from again: an in-flight `create_kernels` that answers after the sweep sees the row
//! ended and destroys the kernel; the sweep's own destroy is tried again every
//! [`DESTROY_RETRY`] for up to `create-timeout` (a kernel its agent is still creating can be
//! destroyed once its stages are up); an agent silent for `heartbeat-timeout` is `LOST`
//! (`registry`); and a container the store does not hold live is reported `kernel_dangling`
//! at the agent's next start and destroyed after `[manager] dangling-grace`
//! (`registry/dangling.rs`). No pass runs during the manager's start-up grace, while its
//! agents are not all heard from yet.
//!
//! A row is ended only while it still has the status and change time the sweep read
//! (`Store::end_stuck_kernel`), so an answer or event that lands meanwhile wins. Each
//! resolution is logged at info and counted in
//! `kernelvisor_manager_stuck_kernels_resolved_total{state,outcome}`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::StreamExt;

use super::launch::{destroy_on_agent, grace_left, Launcher};
use super::{Scheduler, StateDeadlines};
use crate::manager::calls::call_method;
use crate::manager::metrics::ManagerMetrics;
use crate::manager::pool::{AgentCallError, AgentPool};
use crate::manager::registry::GraceRemaining;
use crate::manager::store::{now, KernelRow, OrphanedPull, Store, StoreError};
use crate::model::session::KernelStatus;
use crate::rpc::agent_api::images::{CheckPulling, CheckPullingArgs};
use crate::rpc::agent_api::kernel::{CheckCreating, CheckRunning, ImageConfig, KernelIdArgs};

/// Kernels one pass resolves at most: a pass stays bounded however many are stuck (the rest
/// are the next pass's, oldest first).
pub const SWEEP_BATCH: u32 = 100;

/// Kernels resolved at once within a pass (each waits on its agent).
const SWEEP_CONCURRENCY: usize = 8;

/// The longest one agent call of the sweep waits (`destroy-timeout` when shorter): an agent
/// that does not answer in this long is treated as unreachable.
pub const SWEEP_CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How often a destroy is tried again on a kernel its agent is still creating (it can be
/// destroyed once its stages are up).
pub const DESTROY_RETRY: Duration = Duration::from_secs(5);

/// How long a `PULLING` kernel may go without a write from its follower before the sweep takes
/// it as orphaned: six of the follower's touches (`pull::TOUCH_INTERVAL`).
pub const ORPHANED_PULL_AFTER: Duration = Duration::from_secs(30);

impl StateDeadlines {
    /// Each transient state with its deadline: `SCHEDULED` shares `PREPARING`'s.
    pub fn by_state(&self) -> [(KernelStatus, Duration); 6] {
        [
            (KernelStatus::Scheduled, self.preparing),
            (KernelStatus::Preparing, self.preparing),
            (KernelStatus::Pulling, self.pulling),
            (KernelStatus::Creating, self.creating),
            (KernelStatus::Restarting, self.restarting),
            (KernelStatus::Terminating, self.terminating),
        ]
    }
}

/// What the sweep did with one stuck kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Its agent runs it: now `RUNNING`.
    Running,
    /// Ended with this reason (its reservation released).
    Terminated(String),
    /// An orphaned pull taken over: created from its request, the pull in flight joined
    /// (`adopted`: `check_pulling` said it still runs) or found done (`redriven`).
    Redriven {
        /// Whether the agent still pulled its image.
        pull_in_flight: bool,
    },
    /// It moved meanwhile (an answer or event landed): left as it is now.
    Moved,
}

impl Resolution {
    /// The metric's `outcome` label; `None` when nothing was resolved.
    fn outcome(&self) -> Option<&'static str> {
        match self {
            Resolution::Running => Some("running"),
            Resolution::Terminated(_) => Some("terminated"),
            Resolution::Redriven {
                pull_in_flight: true,
            } => Some("adopted"),
            Resolution::Redriven {
                pull_in_flight: false,
            } => Some("redriven"),
            Resolution::Moved => None,
        }
    }
}

/// What the agent says of a kernel.
enum AgentView {
    /// `check_running`: its container runs.
    Running,
    /// `check_creating`: it is being created, or held there without running.
    Holds,
    /// Neither: the agent does not hold it.
    Gone,
    /// No answer (unreachable, timed out, or an error instead of an answer).
    Unknown(String),
}

/// The parts one pass uses, cloned out of the actor.
#[derive(Clone)]
pub(super) struct Sweep {
    pub(super) store: Store,
    pub(super) pool: Addr<AgentPool>,
    pub(super) metrics: Arc<ManagerMetrics>,
    pub(super) deadlines: StateDeadlines,
    /// Each agent call's deadline.
    pub(super) call_timeout: Duration,
    /// How long a kernel its agent still creates is tried again (`create-timeout`).
    pub(super) linger: Duration,
    /// Creates an orphaned pull's kernel.
    pub(super) launcher: Launcher,
}

impl Scheduler {
    /// Starts a sweep pass unless one runs; nothing on a replica that does not lead.
    pub(super) fn start_sweep(&mut self, ctx: &mut Context<Self>) {
        if !self.leader.is_leader() || self.sweep_running {
            return;
        }
        self.sweep_running = true;
        let registry = self.registry.clone();
        let sweep = Sweep {
            store: self.store.clone(),
            pool: self.pool.clone(),
            metrics: self.metrics.clone(),
            deadlines: self.spec.deadlines,
            call_timeout: self.spec.destroy_timeout.min(SWEEP_CALL_TIMEOUT),
            linger: self.spec.create_timeout,
            launcher: self.launcher(),
        };
        let pass = async move {
            // During the start-up grace the agents are not all heard from yet (the pool may
            // not even know where they are): an agent would read as unreachable and a kernel
            // that runs would be ended. The store is reconciled with their heartbeats first.
            if registry.send(GraceRemaining).await.ok().flatten().is_some() {
                return Ok(Vec::new());
            }
            sweep.pass().await
        };
        ctx.spawn(pass.into_actor(self).map(|r, act, _| {
            act.sweep_running = false;
            if let Err(e) = r {
                tracing::warn!(error = %e, "reconcile sweep failed; the next one retries");
            }
        }));
    }
}

impl Sweep {
    /// One pass: resolves up to [`SWEEP_BATCH`] kernels past their state's deadline. Returns
    /// each kernel's id with what was done.
    ///
    /// Errors: the store could not be read (a kernel the store fails to end stays for the
    /// next pass, logged).
    pub(super) async fn pass(&self) -> Result<Vec<(String, Resolution)>, StoreError> {
        let stuck = self
            .store
            .stuck_kernels(now(), &self.deadlines.by_state(), SWEEP_BATCH)
            .await?;
        let mut done: Vec<(String, Resolution)> = futures::stream::iter(stuck)
            .map(|k| async move {
                let resolution = self.resolve(&k).await;
                (k.id, resolution)
            })
            .buffer_unordered(SWEEP_CONCURRENCY)
            .filter_map(|(id, r)| async move { r.ok().map(|r| (id, r)) })
            .collect()
            .await;
        let orphans = self
            .store
            .orphaned_pulls(now() - ORPHANED_PULL_AFTER.as_secs_f64(), SWEEP_BATCH)
            .await?;
        let redriven: Vec<(String, Resolution)> = futures::stream::iter(orphans)
            .map(|o| async move {
                let id = o.kernel.row.id.clone();
                (id, self.take_over(o).await)
            })
            .buffer_unordered(SWEEP_CONCURRENCY)
            .filter_map(|(id, r)| async move { r.ok().flatten().map(|r| (id, r)) })
            .collect()
            .await;
        done.extend(redriven);
        // Cluster sessions: one kernel ended ends the rest; the last one's end frees the
        // network.
        super::cluster::settle(&self.launcher, SWEEP_BATCH).await?;
        // Preemptions a stopped or failed-over manager left half done (`evict.rs`): past
        // `destroy-timeout`, an eviction's own calls have ended one way or the other.
        let older_than = self.launcher.spec.destroy_timeout.as_secs_f64();
        super::evict::complete_stale(&self.launcher, older_than).await?;
        Ok(done)
    }

    /// Takes over an orphaned pull (see the module's doc): `RUNNING` when its agent runs it,
    /// else created from its request in the background. `None`: nothing done this pass (taken
    /// by someone else, or the agent did not answer; the next claim asks again).
    async fn take_over(&self, o: OrphanedPull) -> Result<Option<Resolution>, StoreError> {
        let k = &o.kernel.row;
        if !self.store.claim_orphaned_pull(&k.id, o.seen_at).await? {
            return Ok(None);
        }
        let r = match self.ask(k).await {
            AgentView::Running => match self
                .store
                .advance_kernel(&k.id, KernelStatus::Running)
                .await?
            {
                true => Resolution::Running,
                false => Resolution::Moved,
            },
            AgentView::Unknown(why) => {
                tracing::info!(kernel_id = %k.id, agent_id = %k.agent_id, error = %why, "reconcile sweep: an orphaned pull's agent did not answer; asking again later");
                return Ok(None);
            }
            AgentView::Holds => {
                // Its create reached the agent before its follower went: the agent's
                // kernel_started (or kernel_terminated) settles the row; creating it again
                // would be refused as a duplicate and end it.
                tracing::debug!(kernel_id = %k.id, "reconcile sweep: an orphaned pull's kernel is being created on its agent; leaving it to the agent's events");
                return Ok(None);
            }
            AgentView::Gone => {
                let image = ImageConfig::by_reference(&k.image).canonical;
                let args = CheckPullingArgs { image_name: image };
                let pull_in_flight = match call_method::<CheckPulling>(
                    &self.pool,
                    &self.metrics,
                    &k.agent_id,
                    &args,
                    self.call_timeout,
                )
                .await
                {
                    Ok(pulling) => pulling,
                    Err(e) => {
                        tracing::info!(kernel_id = %k.id, agent_id = %k.agent_id, error = %e, "reconcile sweep: an orphaned pull's agent did not answer check_pulling; asking again later");
                        return Ok(None);
                    }
                };
                let (launcher, admitted) = (self.launcher.clone(), o.kernel.clone());
                actix::spawn(async move {
                    let id = admitted.row.id.clone();
                    if let Err(e) = launcher.launch_stored(admitted).await {
                        tracing::info!(kernel_id = %id, error = %e, "an orphaned pull's session could not be created");
                    }
                });
                Resolution::Redriven { pull_in_flight }
            }
        };
        if let Some(outcome) = r.outcome() {
            tracing::info!(kernel_id = %k.id, session_id = %k.session_id, agent_id = %k.agent_id, outcome, "reconcile sweep: took over a pull whose follower was gone");
            self.metrics
                .stuck_kernels_resolved
                .with_label_values(&[k.status.as_str(), outcome])
                .inc();
        }
        Ok(Some(r))
    }

    /// Resolves one stuck kernel, logs and counts it.
    async fn resolve(&self, k: &KernelRow) -> Result<Resolution, StoreError> {
        let r = match k.status {
            KernelStatus::Terminating => self.finish_terminating(k).await,
            KernelStatus::Pending
            | KernelStatus::Scheduled
            | KernelStatus::Preparing
            | KernelStatus::Pulling
            | KernelStatus::Creating
            | KernelStatus::Running
            | KernelStatus::Restarting
            | KernelStatus::Terminated
            | KernelStatus::Cancelled
            // Never stuck by its state's deadline: `evict::complete_stale` completes it.
            | KernelStatus::Preempted => self.settle(k).await,
        };
        let r = match r {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(kernel_id = %k.id, state = %k.status, error = %e, "reconcile sweep: cannot resolve a stuck kernel; the next pass retries");
                return Err(e);
            }
        };
        if let Some(outcome) = r.outcome() {
            let reason = match &r {
                Resolution::Terminated(reason) => reason.as_str(),
                _ => "",
            };
            tracing::info!(kernel_id = %k.id, session_id = %k.session_id, agent_id = %k.agent_id, state = %k.status, outcome, reason, "reconcile sweep: resolved a kernel past its state's deadline");
            self.metrics
                .stuck_kernels_resolved
                .with_label_values(&[k.status.as_str(), outcome])
                .inc();
        }
        Ok(r)
    }

    /// A kernel stuck on its way up (or restarting): `RUNNING` when its agent runs it, else
    /// ended `<state>-timeout` and destroyed on the agent as far as it can be.
    async fn settle(&self, k: &KernelRow) -> Result<Resolution, StoreError> {
        let view = self.ask(k).await;
        if let AgentView::Running = view {
            return Ok(
                if self
                    .store
                    .advance_kernel(&k.id, KernelStatus::Running)
                    .await?
                {
                    Resolution::Running
                } else {
                    Resolution::Moved
                },
            );
        }
        let reason = timeout_reason(k.status);
        if !self
            .store
            .end_stuck_kernel(&k.id, k.status, k.status_changed_at, &reason)
            .await?
        {
            return Ok(Resolution::Moved);
        }
        match view {
            AgentView::Gone => {}
            AgentView::Unknown(why) => {
                tracing::info!(kernel_id = %k.id, agent_id = %k.agent_id, error = %why, "reconcile sweep: the agent did not answer; ended the kernel anyway");
                self.destroy_in_background(k, &reason);
            }
            AgentView::Holds | AgentView::Running => self.destroy_in_background(k, &reason),
        }
        Ok(Resolution::Terminated(reason))
    }

    /// A kernel stuck `TERMINATING`: the destroy driven again; ended with the reason it was
    /// being destroyed for once the agent no longer holds it, else `terminating-timeout`.
    async fn finish_terminating(&self, k: &KernelRow) -> Result<Resolution, StoreError> {
        let asked = k
            .status_reason
            .clone()
            .unwrap_or_else(|| "user-requested".into());
        let reason = match self.destroy(k, &asked).await {
            Ok(()) => asked,
            Err(e) => {
                tracing::info!(kernel_id = %k.id, agent_id = %k.agent_id, error = %e, "reconcile sweep: destroy_kernel failed again past terminating-timeout");
                // The agent may hold it still (being created, or back later): keep trying.
                self.destroy_in_background(k, &asked);
                timeout_reason(k.status)
            }
        };
        Ok(
            if self
                .store
                .end_stuck_kernel(&k.id, k.status, k.status_changed_at, &reason)
                .await?
            {
                Resolution::Terminated(reason)
            } else {
                Resolution::Moved
            },
        )
    }

    /// What the agent says of the kernel: `check_running`, then `check_creating`.
    async fn ask(&self, k: &KernelRow) -> AgentView {
        let args = KernelIdArgs {
            kernel_id: k.id.clone(),
        };
        let (pool, metrics, agent, timeout) =
            (&self.pool, &self.metrics, &k.agent_id, self.call_timeout);
        match call_method::<CheckRunning>(pool, metrics, agent, &args, timeout).await {
            Ok(true) => return AgentView::Running,
            Ok(false) => {}
            Err(e) => return AgentView::Unknown(e.to_string()),
        }
        match call_method::<CheckCreating>(pool, metrics, agent, &args, timeout).await {
            Ok(true) => AgentView::Holds,
            Ok(false) => AgentView::Gone,
            Err(e) => AgentView::Unknown(e.to_string()),
        }
    }

    /// `destroy_kernel` on the kernel's agent; a kernel the agent does not hold counts as
    /// destroyed.
    ///
    /// Errors: the call's, but `KernelNotFound`.
    async fn destroy(&self, k: &KernelRow, reason: &str) -> Result<(), AgentCallError> {
        let grace = grace_left(k, self.launcher.spec.grace_period);
        destroy_on_agent(
            &self.pool,
            &self.metrics,
            k,
            reason,
            &grace,
            self.call_timeout,
        )
        .await
        .map(|_| ())
    }

    /// Destroys what the agent holds of an ended kernel, off the pass, tried again every
    /// [`DESTROY_RETRY`] for up to `linger` while it fails: a kernel still being created
    /// cannot be destroyed until its stages are up (the agent refuses, or holds the call until
    /// then), and an agent may be back within that time. Past it, an agent that comes back
    /// reports what it still holds as dangling.
    fn destroy_in_background(&self, k: &KernelRow, reason: &str) {
        let grace = grace_left(k, self.launcher.spec.grace_period);
        let (pool, metrics, k, reason, timeout, until) = (
            self.pool.clone(),
            self.metrics.clone(),
            k.clone(),
            reason.to_owned(),
            self.call_timeout,
            Instant::now() + self.linger,
        );
        actix::spawn(async move {
            loop {
                match destroy_on_agent(&pool, &metrics, &k, &reason, &grace, timeout).await {
                    Ok(_) => return,
                    Err(e) if Instant::now() < until => {
                        tracing::debug!(kernel_id = %k.id, error = %e, "reconcile sweep: the agent cannot destroy the kernel yet; trying again");
                        tokio::time::sleep(DESTROY_RETRY).await;
                    }
                    Err(e) => {
                        tracing::info!(kernel_id = %k.id, agent_id = %k.agent_id, error = %e, "reconcile sweep: could not destroy an ended kernel on its agent");
                        return;
                    }
                }
            }
        });
    }
}

/// The reason a kernel ended at its state's deadline: `<state>-timeout`, lower case;
/// `SCHEDULED` shares `PREPARING`'s deadline and so its reason.
pub fn timeout_reason(status: KernelStatus) -> String {
    let state = match status {
        KernelStatus::Scheduled => KernelStatus::Preparing,
        other => other,
    };
    format!("{}-timeout", state.as_str().to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_name_the_state() {
        assert_eq!(timeout_reason(KernelStatus::Scheduled), "preparing-timeout");
        assert_eq!(timeout_reason(KernelStatus::Preparing), "preparing-timeout");
        assert_eq!(timeout_reason(KernelStatus::Pulling), "pulling-timeout");
        assert_eq!(timeout_reason(KernelStatus::Creating), "creating-timeout");
        assert_eq!(
            timeout_reason(KernelStatus::Restarting),
            "restarting-timeout"
        );
        assert_eq!(
            timeout_reason(KernelStatus::Terminating),
            "terminating-timeout"
        );
    }

    #[test]
    fn every_transient_state_has_a_deadline() {
        let d = StateDeadlines {
            preparing: Duration::from_secs(1),
            pulling: Duration::from_secs(2),
            creating: Duration::from_secs(3),
            terminating: Duration::from_secs(4),
            restarting: Duration::from_secs(5),
        };
        let by = d.by_state();
        for s in KernelStatus::ALL {
            let named = by.iter().filter(|(t, _)| *t == s).count();
            assert_eq!(
                named,
                usize::from(crate::manager::store::is_transient(s)),
                "{s:?}"
            );
        }
        assert_eq!(by[0].1, by[1].1, "SCHEDULED has PREPARING's deadline");
    }
}

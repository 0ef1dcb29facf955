//! Dangling kernels: what the manager does with an agent's `kernel_dangling` report
//! (`docs/events.md`).
//!
//! - The store holds the kernel live **on that agent** (same session when the report names one)
//!   and the agent could rebuild it → `adopt_kernel(kernel_id)` at once: the agent re-reserves
//!   its slots and ports and runs it under a kernel actor again; the store's row moves to (or
//!   stays) `RUNNING`. An agent that cannot be reached is retried (waits doubling from 2 s to
//!   30 s, each drawn within its step: `crate::retry`).
//! - The store holds it live there but the agent answers `KernelNotAdoptable` (it could not
//!   rebuild it) → it leaves the live set (`dangling-not-adoptable`, its concurrency released)
//!   and is treated as unknown. Any other FAILURE (e.g. an agent without `adopt_kernel`) leaves
//!   it alone (`failed`).
//! - Anything else (unknown id, `TERMINATED`, live on another agent) → after `[manager]
//!   dangling-grace` from its first report, if the store still does not hold it live there,
//!   `destroy_dangling_kernel(kernel_id)`.
//!
//! Every outcome is logged and counted in `kernelvisor_manager_dangling_kernels_total{action}`
//! (`reported`, `adopted`, `destroyed`, `gone`: the agent no longer has it, `failed`).
//!
//! Several replicas: the report is stored with its event (`dangling_reports`); the
//! leader loads what the store holds each tick and deletes a report once resolved, so one taken
//! by a standby, or left unresolved by a leader that died, is resolved by the next leader.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use actix::prelude::*;

use super::super::calls::call_method;
use super::super::metrics::ManagerMetrics;
use super::super::pool::{AgentCallError, AgentPool};
use super::super::store::{now, DanglingReport, Store};
use crate::model::session::KernelStatus;
use crate::retry::Backoff;
use crate::rpc::agent_api::kernel::{AdoptKernel, DestroyDanglingKernel, KernelIdArgs};
use crate::rpc::Failure;

/// First wait (at most) before trying an agent that could not be reached again.
const FIRST_BACKOFF: Duration = Duration::from_secs(2);
/// Longest wait between two tries of an agent that cannot be reached.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A report still unresolved after this many tries is dropped (logged): roughly an hour (waits
/// average 22.5 s once at the 30 s step).
const MAX_ATTEMPTS: u32 = 165;

/// One reported dangling kernel awaiting its outcome.
#[derive(Clone, Debug)]
pub(super) struct Pending {
    /// Reporting agent.
    pub agent_id: String,
    /// Kernel id of the container's label.
    pub kernel_id: String,
    /// Session id of its label (may be empty).
    pub session_id: String,
    /// The agent could rebuild it.
    pub adoptable: bool,
    /// The destroy deadline: first report + `dangling-grace`.
    pub destroy_after: Instant,
    /// Not before this instant.
    pub next_try: Instant,
    /// A step is running.
    pub in_flight: bool,
    /// The waits between retries; its `attempts()` counts the steps that ended in a retry.
    pub backoff: Backoff,
}

/// What one step did.
#[derive(Debug)]
pub(super) enum Outcome {
    /// Resolved (the `action` label it is counted under).
    Done(&'static str),
    /// Not known live, the grace not over: try again at the deadline.
    Wait,
    /// The agent or the store could not be reached: try again later.
    Retry(String),
}

/// How long a resolved report is remembered, so that a store read begun before its row was
/// deleted does not bring it back.
const RESOLVED_MEMORY: Duration = Duration::from_secs(30);

/// The reports being resolved, by `(agent id, kernel id)`.
#[derive(Debug, Default)]
pub(super) struct DanglingBook {
    entries: HashMap<(String, String), Pending>,
    /// Recently resolved reports and when.
    resolved: HashMap<(String, String), Instant>,
}

impl DanglingBook {
    /// Records a report first made at `first_reported` (Unix seconds); a repeated one keeps its
    /// first deadline (the grace runs from the first report, as a reaper's does).
    pub fn report(&mut self, r: &DanglingReport, grace: Duration) {
        let left = (r.first_reported + grace.as_secs_f64() - now()).max(0.0);
        let now = Instant::now();
        let e = self
            .entries
            .entry((r.agent_id.clone(), r.kernel_id.clone()))
            .or_insert_with(|| Pending {
                agent_id: r.agent_id.clone(),
                kernel_id: r.kernel_id.clone(),
                session_id: r.session_id.clone(),
                adoptable: r.adoptable,
                destroy_after: now + Duration::from_secs_f64(left),
                next_try: now,
                in_flight: false,
                backoff: Backoff::new(FIRST_BACKOFF, MAX_BACKOFF),
            });
        e.adoptable = r.adoptable;
        e.next_try = now;
    }

    /// Takes what the store holds: reports not in the book yet (another replica's, or the
    /// previous leader's) join it; ones resolved moments ago do not come back.
    pub fn load(&mut self, reports: &[DanglingReport], grace: Duration) {
        self.resolved.retain(|_, at| at.elapsed() < RESOLVED_MEMORY);
        for r in reports {
            let key = (r.agent_id.clone(), r.kernel_id.clone());
            if !self.entries.contains_key(&key) && !self.resolved.contains_key(&key) {
                self.report(r, grace);
            }
        }
    }

    /// The entries due now, marked in flight.
    pub fn due(&mut self) -> Vec<Pending> {
        let now = Instant::now();
        self.entries
            .values_mut()
            .filter(|e| !e.in_flight && e.next_try <= now)
            .map(|e| {
                e.in_flight = true;
                e.clone()
            })
            .collect()
    }

    /// Takes a step's outcome; returns the entry when it was dropped for good after
    /// [`MAX_ATTEMPTS`].
    pub fn settle(&mut self, key: (String, String), outcome: &Outcome) -> Option<Pending> {
        let e = self.entries.get_mut(&key)?;
        e.in_flight = false;
        match outcome {
            Outcome::Done(_) => {
                self.entries.remove(&key);
                self.resolved.insert(key, Instant::now());
                None
            }
            Outcome::Wait => {
                e.next_try = e.destroy_after;
                None
            }
            Outcome::Retry(_) => {
                let wait = e.backoff.next_wait();
                if e.backoff.attempts() >= MAX_ATTEMPTS {
                    self.resolved.insert(key.clone(), Instant::now());
                    return self.entries.remove(&key);
                }
                e.next_try = Instant::now() + wait;
                None
            }
        }
    }
}

/// The FAILURE the agent answered: `Ok` a name this build knows, `Err` one it does not (a newer
/// agent's); `None` when the agent did not answer.
fn failure_name(e: &AgentCallError) -> Option<Result<Failure, &str>> {
    e.failure().map(|m| m.known().ok_or(m.name.as_str()))
}

/// One step for `p`: decide from the store, then adopt or (once due) destroy. A resolved report
/// leaves the store before the step ends (a failed delete is retried as a step).
pub(super) async fn step(
    store: Store,
    pool: Addr<AgentPool>,
    metrics: &ManagerMetrics,
    p: Pending,
    timeout: Duration,
) -> Outcome {
    let outcome = decide(&store, &pool, metrics, &p, timeout).await;
    if matches!(outcome, Outcome::Done(_)) {
        if let Err(e) = store
            .resolve_dangling_report(&p.agent_id, &p.kernel_id)
            .await
        {
            return Outcome::Retry(format!("store: {e}"));
        }
    }
    outcome
}

async fn decide(
    store: &Store,
    pool: &Addr<AgentPool>,
    metrics: &ManagerMetrics,
    p: &Pending,
    timeout: Duration,
) -> Outcome {
    let (agent, kernel) = (p.agent_id.as_str(), p.kernel_id.as_str());
    let row = match store.kernel(kernel).await {
        Ok(row) => row.filter(|r| r.id == kernel),
        Err(e) => return Outcome::Retry(format!("store: {e}")),
    };
    let live_here = row.as_ref().is_some_and(|r| {
        r.is_live()
            && r.agent_id == agent
            && (p.session_id.is_empty() || r.session_id == p.session_id)
    });
    // Asked even when the report says it is not adoptable: the agent's answer is what counts
    // (and an older agent's report carries no `adoptable` at all).
    if live_here {
        let args = KernelIdArgs {
            kernel_id: kernel.to_owned(),
        };
        return match call_method::<AdoptKernel>(pool, metrics, agent, &args, timeout).await {
            Ok(info) => {
                let status = info.status;
                // The agent's name for it; one that is no kernel status moves nothing.
                let advanced = match KernelStatus::parse(&status) {
                    Some(to) => store.advance_kernel(kernel, to).await.map(drop),
                    None => Ok(()),
                };
                if let Err(e) = advanced {
                    tracing::warn!(agent_id = %agent, kernel_id = %kernel, error = %e, "adopted kernel: could not record its status (its events will)");
                }
                tracing::info!(agent_id = %agent, kernel_id = %kernel, session_id = %p.session_id, %status, "dangling kernel adopted");
                Outcome::Done("adopted")
            }
            Err(e) => match failure_name(&e) {
                // Adopted or destroyed already (a repeated report), or the kernel is live there.
                Some(Ok(Failure::KernelNotFound | Failure::InvalidKernelConfig)) => {
                    tracing::info!(agent_id = %agent, kernel_id = %kernel, error = %e, "dangling kernel: nothing to adopt any more");
                    Outcome::Done("gone")
                }
                Some(Ok(Failure::KernelNotAdoptable)) => {
                    let why = format!("{e} (reported adoptable: {})", p.adoptable);
                    not_adoptable(store, p, &why).await
                }
                // An agent without the method (older than dangling adoption): left alone.
                Some(name) if name != Ok(Failure::AgentShuttingDown) => {
                    tracing::error!(agent_id = %agent, kernel_id = %kernel, error = %e, "adopting a dangling kernel failed; leaving it as it is");
                    Outcome::Done("failed")
                }
                _ => Outcome::Retry(e.to_string()),
            },
        };
    }
    if Instant::now() < p.destroy_after {
        return Outcome::Wait;
    }
    let args = KernelIdArgs {
        kernel_id: kernel.to_owned(),
    };
    match call_method::<DestroyDanglingKernel>(pool, metrics, agent, &args, timeout).await {
        Ok(v) => {
            tracing::warn!(agent_id = %agent, kernel_id = %kernel, destroyed = v.destroyed, "dangling kernel unknown to the store past dangling-grace: destroyed");
            Outcome::Done("destroyed")
        }
        Err(e) if failure_name(&e) == Some(Ok(Failure::KernelNotFound)) => Outcome::Done("gone"),
        Err(e) if failure_name(&e).is_some() => {
            tracing::error!(agent_id = %agent, kernel_id = %kernel, error = %e, "destroying a dangling kernel failed");
            Outcome::Done("failed")
        }
        Err(e) => Outcome::Retry(e.to_string()),
    }
}

/// The store holds it live but the agent cannot run it as a kernel: out of the live set, then
/// destroyed like an unknown one.
async fn not_adoptable(store: &Store, p: &Pending, why: &str) -> Outcome {
    tracing::warn!(agent_id = %p.agent_id, kernel_id = %p.kernel_id, reason = %why, "dangling kernel known live but not adoptable: terminating it");
    match store
        .terminate_kernel(&p.kernel_id, "dangling-not-adoptable", None)
        .await
    {
        Ok(_) if Instant::now() < p.destroy_after => Outcome::Wait,
        Ok(_) => Outcome::Retry("terminated in the store; destroying next".into()),
        Err(e) => Outcome::Retry(format!("store: {e}")),
    }
}

impl super::AgentRegistry {
    /// Takes the reports the store holds (other replicas', the previous leader's) into the
    /// book, then drives it; the leader's duty. One read at a time.
    pub(super) fn load_dangling(&mut self, ctx: &mut Context<Self>) {
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
    pub(super) fn drive_dangling(&mut self, ctx: &mut Context<Self>) {
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
                async move { step(store, pool, &metrics, p, timeout).await }
                    .into_actor(self)
                    .map(move |outcome, act, _| {
                        match &outcome {
                            Outcome::Done(action) => act
                                .metrics
                                .dangling_kernels
                                .with_label_values(&[action])
                                .inc(),
                            Outcome::Retry(why) => {
                                tracing::debug!(agent_id = %key.0, kernel_id = %key.1, %why, "dangling kernel: retrying")
                            }
                            Outcome::Wait => {}
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(session: &str, adoptable: bool, first_reported: f64) -> DanglingReport {
        DanglingReport {
            agent_id: "a".into(),
            kernel_id: "k".into(),
            session_id: session.into(),
            adoptable,
            first_reported,
        }
    }

    #[test]
    fn book_keeps_the_first_deadline_and_backs_off() {
        let mut b = DanglingBook::default();
        let grace = Duration::from_secs(60);
        b.report(&report("s", true, now()), grace);
        let first = b.entries[&("a".into(), "k".into())].destroy_after;
        std::thread::sleep(Duration::from_millis(5));
        b.report(&report("s", false, now()), grace);
        let e = &b.entries[&("a".into(), "k".into())];
        assert_eq!(
            e.destroy_after, first,
            "the grace runs from the first report"
        );
        assert!(!e.adoptable);
        let due = b.due();
        assert_eq!(due.len(), 1);
        assert!(b.due().is_empty(), "in flight: not due twice");
        let key = ("a".to_owned(), "k".to_owned());
        b.settle(key.clone(), &Outcome::Retry("down".into()));
        assert!(b.entries[&key].next_try > Instant::now());
        assert!(b.due().is_empty());
        b.entries.get_mut(&key).unwrap().next_try = Instant::now();
        b.due();
        b.settle(key.clone(), &Outcome::Wait);
        assert_eq!(b.entries[&key].next_try, first);
        b.entries.get_mut(&key).unwrap().next_try = Instant::now();
        b.due();
        b.settle(key.clone(), &Outcome::Done("destroyed"));
        assert!(b.entries.is_empty());
        // A store read from before its row was deleted does not bring it back.
        b.load(&[report("s", false, now())], grace);
        assert!(b.entries.is_empty());
    }

    #[test]
    fn a_stored_report_keeps_its_grace_from_the_first_report() {
        let mut b = DanglingBook::default();
        let grace = Duration::from_secs(60);
        // Reported 50 s ago on another replica: 10 s of grace left, due now for its first step.
        b.load(&[report("s", true, now() - 50.0)], grace);
        let e = &b.entries[&("a".into(), "k".into())];
        let left = e.destroy_after.saturating_duration_since(Instant::now());
        assert!(left <= Duration::from_secs(10), "{left:?}");
        assert!(left > Duration::from_secs(8), "{left:?}");
        assert_eq!(b.due().len(), 1);
        // Reported long ago: the grace is over.
        let mut b = DanglingBook::default();
        b.load(&[report("s", false, now() - 600.0)], grace);
        assert!(b.entries[&("a".into(), "k".into())].destroy_after <= Instant::now());
    }
}

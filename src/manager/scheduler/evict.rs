//! Preemption's effects (issue 41 item 2): after an admission round, the sessions it could not
//! place are looked at in the round's order (priority first) and, where the pure victim choice
//! (`preempt.rs`) finds a set, the victims are evicted: their kernels `PREEMPTED` in one
//! transaction, a `preemption` event naming the preemptor and the victims, then each victim
//! ended on its agents with reason `preempted` ([`destroy_on_agent`]) and ended in the store:
//! requeued as a new row of the same session, or `TERMINATED` `preempted` when its restart
//! policy says no ([`requeues`]).
//!
//! The preemptor does not hold the freed room by a reservation: it is first in line for it.
//! Admission goes by priority, and the victims' room frees in the transaction that ends them
//! (a round follows at once, `Store::released`), where the preemptor is placed before any
//! session of its priority or lower (a session of its priority queued before it was placed
//! or tried first; a direct create of its priority or lower queues behind it,
//! `Store::queued_at_or_above`). Only a session of a higher priority may take the room, and
//! it is entitled to. While the victims end, their room counts as the preemptor's for the
//! choice (`PREEMPTED` rows), so no second set is evicted for it.
//!
//! A manager stopped (or a leader failed over) between the two steps leaves `PREEMPTED`
//! rows: the reconcile sweep completes them ([`complete_stale`]) once `destroy-timeout` past
//! their `terminate_deadline`, the same way; each step is idempotent (a kernel its agent no longer
//! holds counts as destroyed, and `Store::finish_preempted` acts only while the end is due,
//! and clears that in its transaction), so a preemption completes once.

use std::collections::{HashMap, HashSet};

use futures::StreamExt;

use super::launch::{destroy_on_agent, grace_left, Launcher};
use super::preempt::{
    choose, settled_by_prefix, take, victims, without_preempted, Choice, Room, Victim,
};
use super::PreemptionSpec;
use crate::manager::registry::AgentImageSets;
use crate::manager::store::{
    now, AgentRow, KernelRow, PreemptCandidate, QueuedSession, StoreError, Usage, PREEMPTED,
};
use crate::model::cluster::ClusterPlacement;
use crate::model::event::{Event, EventType};
use crate::workload::RestartMode;

/// Pending sessions one round may evict for: the first ones it could not place (a choice
/// looks at every agent).
pub(super) const MAX_PREEMPTORS: usize = 8;

/// Victim kernels ended at once.
const CONCURRENCY: usize = 16;

/// The `reason` label of `kernelvisor_manager_preemptions_total` for an eviction by priority.
const BY_PRIORITY: &str = "priority";

/// Whether a preempted session is requeued: its restart policy restarts it (`on-failure` or
/// `always`: an eviction is no success) and it has restarts left (`restart_count`, which
/// counts its restarts and requeues over its whole life, below `max_restarts`); `never` ends
/// it `TERMINATED` `preempted`.
pub(super) fn requeues(k: &KernelRow) -> bool {
    let p = &k.restart_policy;
    p.mode != RestartMode::Never && k.restart_count < i64::from(p.max_restarts)
}

/// What an admission round hands over: the sessions it could not place, in its order, and
/// the fleet it looked at (its usage is read again here: see [`preempt_for`]).
pub(super) struct Unplaced<'a> {
    pub(super) sessions: &'a [QueuedSession],
    pub(super) candidates: &'a [AgentRow],
    pub(super) images: &'a AgentImageSets,
    pub(super) placement: ClusterPlacement,
}

/// Chooses and starts the evictions for a round's unplaced sessions (the effects run in the
/// background). Returns how many sessions were evicted.
///
/// The candidates are read in two steps: the [`FIRST_CANDIDATES`] most evictable first
/// (`Store::preemption_candidates_first`), and every one only when a choice over those is not
/// settled ([`settled_by_prefix`]: a session that needs more than one victim, or that no
/// victim among them makes fit). Reading every running preemptible session, grouping them
/// and choosing over them took most of a preemption's time at 10,000 agents (0.42 s of a
/// 0.75 s p50 in `just bench scheduler`), where the most evictable session was enough.
///
/// Errors: the store could not be read or written (nothing evicted).
pub(super) async fn preempt_for(
    launcher: &Launcher,
    u: Unplaced<'_>,
    spec: PreemptionSpec,
) -> Result<usize, StoreError> {
    let Some(top) = u.sessions.iter().map(|q| q.priority).max() else {
        return Ok(0);
    };
    let store = &launcher.store;
    let (first, all) = store
        .preemption_candidates_first(top, FIRST_CANDIDATES)
        .await?;
    if first.is_empty() {
        return Ok(0);
    }
    // The usage is read AFTER the candidates, not taken from the round: a victim whose end
    // committed between the round's read and the candidates' (`Store::finish_preempted`) is
    // no longer `PREEMPTED` there, while the round's usage still counted its room as taken,
    // so its preemptor looked unplaceable still and a second victim was evicted for it (seen
    // in `tests/it/preemption.rs`). The ledger read now is as new as the candidates (it drops
    // an ended kernel right after its end commits); a round's own admissions are in it.
    let usage = store.usage_by_agent().await?;
    let evictions = match choose_all(&u, &first, usage, spec, !all) {
        Some(e) => e,
        None => {
            let every = store.preemption_candidates(top).await?;
            let usage = store.usage_by_agent().await?;
            choose_all(&u, &every, usage, spec, false).unwrap_or_default()
        }
    };
    let mut n = 0;
    for (q, evicted) in evictions {
        n += start(launcher, q, &evicted).await?;
    }
    Ok(n)
}

/// The most evictable candidate kernels a round reads first ([`preempt_for`]).
const FIRST_CANDIDATES: usize = 256;

/// The evictions for `u`'s first [`MAX_PREEMPTORS`] sessions, in order, over `candidates` and
/// `usage` (read after them). With `prefix` (`candidates` holds only the most evictable of
/// them), `None` as soon as one choice is not [`settled_by_prefix`]: the caller reads them
/// all and chooses again.
fn choose_all<'q>(
    u: &Unplaced<'q>,
    candidates: &[PreemptCandidate],
    usage: HashMap<String, Usage>,
    spec: PreemptionSpec,
    prefix: bool,
) -> Option<Vec<(&'q QueuedSession, Vec<Victim>)>> {
    let mut room = Room {
        candidates: u.candidates,
        usage: without_preempted(usage, candidates),
        images: u.images,
        placement: u.placement,
    };
    let at = now();
    let mut taken: HashSet<String> = HashSet::new();
    let mut evictions: Vec<(&QueuedSession, Vec<Victim>)> = Vec::new();
    for q in u.sessions.iter().take(MAX_PREEMPTORS) {
        let pool: Vec<Victim> = victims(candidates, q.priority, at, spec.cooldown.as_secs_f64())
            .into_iter()
            .filter(|v| !taken.contains(&v.session_id))
            .collect();
        let c = choose(q, &pool, &room);
        if prefix && !settled_by_prefix(q, &c) {
            return None;
        }
        match c {
            Choice::Waits(agents) => take(&mut room.usage, q, &agents, &[]),
            Choice::Evict(evicted, agents) => {
                take(&mut room.usage, q, &agents, &evicted);
                taken.extend(evicted.iter().map(|v| v.session_id.clone()));
                evictions.push((q, evicted));
            }
            Choice::Nothing => {}
        }
    }
    Some(evictions)
}

/// Evicts `evicted` for `q`: `PREEMPTED` in the store, the event and the metric, then each
/// victim's end in the background. Returns the victims that moved.
async fn start(
    launcher: &Launcher,
    q: &QueuedSession,
    evicted: &[Victim],
) -> Result<usize, StoreError> {
    let ids: Vec<String> = evicted
        .iter()
        .flat_map(|v| v.kernels.iter().map(|(id, _, _)| id.clone()))
        .collect();
    let moved = launcher
        .store
        .preempt_kernels(&ids, launcher.spec.grace_period)
        .await?;
    let mut sessions: Vec<String> = moved.iter().map(|k| k.session_id.clone()).collect();
    sessions.sort();
    sessions.dedup();
    if sessions.is_empty() {
        return Ok(0);
    }
    launcher
        .metrics
        .preemptions
        .with_label_values(&[BY_PRIORITY])
        .inc_by(sessions.len() as u64);
    tracing::info!(
        session_id = %q.session_id, priority = q.priority, victims = ?sessions,
        "preemption: evicting lower-priority sessions to fit a pending one"
    );
    launcher.store.events().publish(Event {
        session_id: Some(q.session_id.clone()),
        kernel_id: Some(q.id.clone()),
        access_key: Some(q.access_key.clone()),
        reason: Some(PREEMPTED.into()),
        victims: Some(sessions.clone()),
        ..Event::of(EventType::Preemption)
    });
    let n = sessions.len();
    let launcher = launcher.clone();
    actix::spawn(async move {
        futures::stream::iter(sessions)
            .for_each_concurrent(CONCURRENCY, |s| {
                let rows: Vec<KernelRow> = moved
                    .iter()
                    .filter(|k| k.session_id == s)
                    .cloned()
                    .collect();
                let launcher = &launcher;
                async move { complete(launcher, &rows).await }
            })
            .await;
    });
    Ok(n)
}

/// Ends one preempted session whose `PREEMPTED` rows are `rows` (main first when it is
/// among them): every kernel destroyed on its agent (reason `preempted`), a cluster's
/// network removed, then requeued or ended ([`requeues`]). A destroy that fails leaves the
/// rows `PREEMPTED` for the sweep ([`complete_stale`]).
pub(super) async fn complete(launcher: &Launcher, rows: &[KernelRow]) {
    let Some(first) = rows.first() else {
        return;
    };
    // Tests only (a `fault-injection` build): hold every eviction here until the path in
    // `KV_FAULT_HOLD_PREEMPTION` exists, so that a test can stop the manager mid-preemption.
    #[cfg(feature = "fault-injection")]
    if let Some(path) = std::env::var_os("KV_FAULT_HOLD_PREEMPTION") {
        let path = std::path::PathBuf::from(path);
        while !path.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
    let timeout = launcher.spec.destroy_timeout;
    let failed = futures::stream::iter(rows)
        .map(|k| async move {
            // The victim's own grace: its stop signal, then what is left of its period.
            let grace = grace_left(k, launcher.spec.grace_period);
            destroy_on_agent(
                &launcher.pool,
                &launcher.metrics,
                k,
                PREEMPTED,
                &grace,
                timeout,
            )
            .await
            .map_err(|e| (k.id.clone(), e.to_string()))
        })
        .buffer_unordered(CONCURRENCY)
        .filter_map(|r| async move { r.err() })
        .collect::<Vec<_>>()
        .await;
    if let Some((kernel_id, error)) = failed.first() {
        tracing::info!(%kernel_id, %error, "preemption: a victim's kernel could not be ended now; the reconcile sweep completes it");
        return;
    }
    let main = rows.iter().find(|k| k.is_main()).unwrap_or(first);
    if main.network.is_some() {
        if let Err(e) = super::cluster::remove_network_of(launcher, main).await {
            tracing::info!(session_id = %main.session_id, error = %e, "preemption: a victim's network could not be removed now; the reconcile sweep completes it");
            return;
        }
    }
    match launcher
        .store
        .finish_preempted(&main.session_id, requeues(main))
        .await
    {
        Ok(Some(new)) => {
            tracing::info!(session_id = %new.session_id, kernel_id = %new.id, restart_count = new.restart_count, "preemption: victim requeued")
        }
        Ok(None) => {
            tracing::info!(session_id = %main.session_id, "preemption: victim ended (its restart policy does not requeue it)")
        }
        Err(e) => {
            tracing::warn!(session_id = %main.session_id, error = %e, "preemption: a victim could not be requeued now; the reconcile sweep completes it")
        }
    }
}

/// The reconcile sweep's part: completes the preemptions whose end is still due and older
/// than `older_than` seconds (their manager stopped or lost the leadership, or an agent did
/// not answer): each session's kernels destroyed again (one its agent no longer holds counts
/// as destroyed), then requeued or ended. Returns the sessions looked at.
///
/// Errors: the store could not be read.
pub(super) async fn complete_stale(
    launcher: &Launcher,
    older_than: f64,
) -> Result<usize, StoreError> {
    let due = launcher.store.preempted_before(now() - older_than).await?;
    let n = due.len();
    for main in due {
        let mut rows = vec![main.clone()];
        if main.cluster_size > 1 {
            rows = launcher.store.session_kernels(&main.session_id).await?;
            rows.retain(|k| {
                k.is_main() || k.status == crate::model::session::KernelStatus::Preempted
            });
        }
        tracing::info!(session_id = %main.session_id, "preemption: completing an eviction left half done");
        complete(launcher, &rows).await;
    }
    Ok(n)
}

//! Idle reclaim (`docs/design.md`, "Idle reclaim"): the leader checks every `[reclaim]
//! interval` the `RUNNING` sessions with a reclaim policy ([`Store::reclaim_candidates`]) and,
//! for each, does what [`decide`] says: sends its `reclaim_warning` event once per deadline
//! ([`Store::warn_reclaim`]), or ends it with reason `idle-timeout`, `lifetime-exceeded` or
//! `low-utilization` through the path every end takes (`cluster::end_gang`: `TERMINATING`,
//! `destroy_kernel` on its agent through `launch::destroy_on_agent`, `TERMINATED`), counted in
//! `kernelvisor_manager_reclaims_total{reason}`.
//!
//! Everything it decides from is in the store (the policy, the agents' reported activity and
//! readings, the deadline already warned of), so a restarted or new leader carries on where
//! the last one stopped: a warning is sent once (a conditional write), and an end that was
//! interrupted finds the session `TERMINATING`, which the reconcile sweep resolves.

use std::cell::Cell;
use std::rc::Rc;

use actix::prelude::*;
use futures::StreamExt;

use super::cluster::end_gang;
use super::launch::Launcher;
use super::Scheduler;
use crate::config::ReclaimSection;
use crate::manager::error::ManagerError;
use crate::manager::store::{now, KernelRow, Store};
use crate::model::reclaim::{decide, Action, ReclaimPolicy, ReclaimReason};
use crate::model::session::SessionRequest;

/// The reclaim policy of a session `owner` asks for with `req`: the request's fields
/// ([`SessionRequest::checked_reclaim`]), then the key's defaults, then `[reclaim]`'s
/// (`config`); a window only with a floor.
///
/// Errors: a field out of range (400 `invalid-request`), the store's.
pub(super) async fn policy_of(
    store: &Store,
    owner: &str,
    req: &SessionRequest,
    config: &ReclaimSection,
) -> Result<ReclaimPolicy, ManagerError> {
    let asked = req.checked_reclaim()?;
    let key = store.key_reclaim_defaults(owner).await?;
    let mut p = asked.or(&key).or(&config.defaults());
    if p.min_utilization.is_empty() {
        p.utilization_window = None;
    }
    Ok(p)
}

/// Sessions one check handles at once (each end may wait `destroy-timeout` on an agent).
const CONCURRENCY: usize = 16;

/// Starts the periodic check on `act`'s context (from [`Scheduler`]'s `started`): every
/// `[reclaim] interval`, on the leader only, one check at a time.
pub(super) fn start(act: &Scheduler, ctx: &mut Context<Scheduler>) {
    let running = Rc::new(Cell::new(false));
    ctx.run_interval(act.spec.reclaim.interval.0, move |act, ctx| {
        if !act.leader.is_leader() || running.get() {
            return;
        }
        running.set(true);
        let done = running.clone();
        let check = check(act.launcher());
        ctx.spawn(check.into_actor(act).map(move |(), _, _| done.set(false)));
    });
}

/// One check over every candidate. Failures are logged and tried again by the next check.
async fn check(launcher: Launcher) {
    let due = match launcher.store.reclaim_candidates().await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %e, "reading the sessions with a reclaim policy failed");
            return;
        }
    };
    let lead = launcher
        .spec
        .reclaim
        .warning_lead
        .map(|s| s.0.as_secs_f64());
    let at = now();
    futures::stream::iter(due)
        .for_each_concurrent(CONCURRENCY, |k| {
            let launcher = &launcher;
            async move {
                let action = decide(
                    &k.reclaim_state(),
                    lead,
                    k.reclaim.activity_at,
                    k.reclaim.reclaim_warned,
                    at,
                );
                match action {
                    Action::Wait => {}
                    Action::Warn { reason, deadline } => {
                        warn(&launcher.store, &k, reason, deadline).await
                    }
                    Action::End(reason) => end(launcher, &k, reason).await,
                }
            }
        })
        .await;
}

/// Sends `k`'s warning for `deadline`, once.
async fn warn(store: &Store, k: &KernelRow, reason: ReclaimReason, deadline: f64) {
    match store.warn_reclaim(k, reason, deadline).await {
        Ok(true) => tracing::info!(
            session_id = %k.session_id, reason = %reason, deadline,
            "session warned: it will be reclaimed at its deadline"
        ),
        Ok(false) => {}
        Err(e) => tracing::warn!(
            session_id = %k.session_id, error = %e,
            "could not record a reclaim warning; retrying at the next check"
        ),
    }
}

/// Ends `k`'s session (every kernel of it) with `reason`.
async fn end(launcher: &Launcher, k: &KernelRow, reason: ReclaimReason) {
    let rows = match launcher.store.session_kernels(&k.session_id).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(session_id = %k.session_id, error = %e, "could not read a session to reclaim; retrying at the next check");
            return;
        }
    };
    end_gang(launcher, &rows, reason.as_str(), None).await;
    // Counted when this check took it out of `RUNNING` (the end may still be completing on
    // the agent: the reconcile sweep sees a `TERMINATING` row through).
    match launcher.store.kernel(&k.id).await {
        Ok(Some(after)) if after.status != k.status => {
            launcher
                .metrics
                .reclaims
                .with_label_values(&[reason.as_str()])
                .inc();
            tracing::info!(
                session_id = %k.session_id, kernel_id = %k.id, agent_id = %k.agent_id,
                reason = %reason, "session reclaimed"
            );
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(session_id = %k.session_id, error = %e, "could not read a reclaimed session back")
        }
    }
}

//! A cluster session's restart policy (issue 40: "a create that fails on any kernel … ends or
//! requeues the session by its restart policy; a lost kernel ends the session (or restarts the
//! gang, by policy)").
//!
//! A gang is restarted whole, never kernel by kernel: its kernels share a network, a keypair
//! and one distributed job (a torchrun or MPI world cannot take one new member), as Slurm
//! requeues a whole job when one of its nodes fails and as SkyPilot users ask of it
//! (skypilot #3907). A kernel's own container is still restarted in place by its agent
//! (`workload/restart_policy.rs`); what reaches the manager is a kernel that ENDED: its agent
//! lost, its restarts on the agent spent, its create refused. Then the session is ended whole
//! (`settle`, or the create's rollback) and, once none of its kernels is live, this module
//! decides ([`decide`]) and the store queues the next generation
//! (`Store::restart_gang`: a new main row of the same session, `restart_count` + 1,
//! `KERNELVISOR_RESTART_COUNT`, its original queue time, placed no earlier than the policy's
//! backoff) or clears what it kept (`Store::keep_ended`).
//!
//! The count is the main row's `restart_count` over the session's whole life (its agent's
//! in-place restarts of the main container, its preemptions and its gang restarts), checked
//! against `max_restarts` as a preemption's requeue does (`evict::requeues`); the policy's
//! `window` is the agent's, for in-place restarts.

use super::super::launch::Launcher;
use crate::manager::store::{KernelRow, StoreError, PREEMPTED};
use crate::model::reclaim::ReclaimReason;
use crate::model::session::SessionResult;
use crate::workload::restart_policy::MAX_BACKOFF_SECONDS;
use crate::workload::RestartMode;

/// Reasons a session ends on purpose: its user's destroy, an idle reclaim. They never
/// restart it, whatever its policy (`always` restarts a workload that ended by itself).
/// A preemption has its own requeue (`evict.rs`).
fn on_purpose(reason: &str) -> bool {
    reason == "user-requested"
        || reason == PREEMPTED
        || ReclaimReason::ALL.iter().any(|r| r.as_str() == reason)
}

/// What a cluster session whose kernels all ended comes to.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Next {
    /// Requeued whole, placed no earlier than `not_before` (Unix seconds).
    Restart {
        /// Unix seconds: when the last kernel ended plus the policy's backoff.
        not_before: f64,
    },
    /// Ended for good.
    End,
}

/// Decides a cluster session's end by its restart policy: `main` is its main kernel's row
/// (policy, `restart_count`, batch result), `first` the kernel that ended first (its reason
/// and exit code are the session's), `ended_at` when the last kernel ended (Unix seconds).
///
/// `never`: ended. A reason on purpose ([`on_purpose`]): ended. No restarts left
/// (`restart_count` ≥ `max_restarts`): ended. `on-failure`: restarted unless it succeeded (a
/// batch session's `SUCCESS`, or the first kernel's exit code 0). `always`: restarted. The
/// backoff doubles with each restart: `backoff × 2^restart_count`, at most
/// [`MAX_BACKOFF_SECONDS`], as the agent's in-place restarts.
pub(super) fn decide(main: &KernelRow, first: &KernelRow, ended_at: f64) -> Next {
    let p = &main.restart_policy;
    let reason = first.status_reason.as_deref().unwrap_or("");
    let succeeded = main.result == SessionResult::Success || first.exit_code == Some(0);
    let restarts = match p.mode {
        RestartMode::Never => false,
        RestartMode::OnFailure => !succeeded,
        RestartMode::Always => true,
    };
    if !restarts || on_purpose(reason) || main.restart_count >= i64::from(p.max_restarts) {
        return Next::End;
    }
    let exp = i32::try_from(main.restart_count.clamp(0, 30)).unwrap_or(30);
    let delay = (p.backoff * 2f64.powi(exp)).min(MAX_BACKOFF_SECONDS);
    Next::Restart {
        not_before: ended_at + delay,
    }
}

/// Applies the restart policy to a cluster session whose kernels all ended (`rows`, its
/// current generation, `main1` first): requeued ([`Next::Restart`]) or settled
/// ([`Next::End`]). A session ended by preemption is left to `evict.rs`. Returns the
/// requeued main row.
///
/// Errors: the store's (nothing changed; the next sweep decides again).
pub(super) async fn apply(
    launcher: &Launcher,
    rows: &[KernelRow],
) -> Result<Option<KernelRow>, StoreError> {
    let Some(main) = rows.iter().find(|k| k.is_main()) else {
        return Ok(None);
    };
    if rows.iter().any(KernelRow::is_live) || main.status_reason.as_deref() == Some(PREEMPTED) {
        return Ok(None);
    }
    let first = rows
        .iter()
        .min_by(|a, b| {
            a.terminated_at
                .unwrap_or(f64::MAX)
                .total_cmp(&b.terminated_at.unwrap_or(f64::MAX))
        })
        .unwrap_or(main);
    let ended_at = rows
        .iter()
        .filter_map(|k| k.terminated_at)
        .fold(0.0, f64::max);
    let why = format!(
        "kernel {} ended ({})",
        first.cluster_hostname,
        first.status_reason.as_deref().unwrap_or("?")
    );
    match decide(main, first, ended_at) {
        Next::End => {
            launcher.store.keep_ended(&main.session_id).await?;
            Ok(None)
        }
        Next::Restart { not_before } => {
            let row = launcher
                .store
                .restart_gang(&main.session_id, &why, Some(not_before))
                .await?;
            if let Some(new) = &row {
                let reason = first.status_reason.as_deref().unwrap_or("unknown");
                launcher
                    .metrics
                    .gang_restarts
                    .with_label_values(&[reason])
                    .inc();
                tracing::info!(
                    session_id = %new.session_id, kernel_id = %new.id, restart_count = new.restart_count,
                    %why, not_before, "cluster session restarted by its restart policy"
                );
            }
            Ok(row)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::session::{KernelStatus, RestartPolicy};

    fn row(mode: RestartMode, restarts: i64, reason: &str, exit: Option<i64>) -> KernelRow {
        let mut k = KernelRow::for_tests("k", KernelStatus::Terminated);
        k.restart_policy = RestartPolicy {
            mode,
            max_restarts: 2,
            window: 60.0,
            backoff: 1.5,
        };
        k.restart_count = restarts;
        k.status_reason = Some(reason.into());
        k.exit_code = exit;
        k
    }

    #[test]
    fn the_policy_decides_and_the_backoff_doubles() {
        let lost = row(RestartMode::OnFailure, 0, "agent-lost", None);
        assert_eq!(
            decide(&lost, &lost, 100.0),
            Next::Restart { not_before: 101.5 }
        );
        let again = row(RestartMode::OnFailure, 1, "failed-to-create", None);
        assert_eq!(
            decide(&again, &again, 100.0),
            Next::Restart { not_before: 103.0 }
        );
        // No restarts left.
        let spent = row(RestartMode::Always, 2, "agent-lost", None);
        assert_eq!(decide(&spent, &spent, 100.0), Next::End);
        // `never`.
        let never = row(RestartMode::Never, 0, "agent-lost", None);
        assert_eq!(decide(&never, &never, 100.0), Next::End);
    }

    #[test]
    fn success_and_ends_on_purpose_do_not_restart() {
        let done = row(RestartMode::OnFailure, 0, "self-terminated", Some(0));
        assert_eq!(decide(&done, &done, 1.0), Next::End);
        let mut batch = row(RestartMode::OnFailure, 0, "task-finished", None);
        batch.result = SessionResult::Success;
        assert_eq!(decide(&batch, &batch, 1.0), Next::End);
        // `always` restarts a workload that ended by itself, success or not ...
        let always = row(RestartMode::Always, 0, "self-terminated", Some(0));
        assert!(matches!(
            decide(&always, &always, 1.0),
            Next::Restart { .. }
        ));
        // ... but never one its user, a reclaim or a preemption ended.
        for reason in [
            "user-requested",
            "idle-timeout",
            "low-utilization",
            PREEMPTED,
        ] {
            let k = row(RestartMode::Always, 0, reason, None);
            assert_eq!(decide(&k, &k, 1.0), Next::End, "{reason}");
        }
        // The first kernel's failure counts for the whole gang.
        let main = row(RestartMode::OnFailure, 0, "agent-lost", Some(0));
        let sub = row(
            RestartMode::OnFailure,
            0,
            "restart-limit-exceeded",
            Some(137),
        );
        assert!(matches!(decide(&main, &sub, 1.0), Next::Restart { .. }));
    }

    #[test]
    fn the_backoff_is_capped() {
        let mut k = row(RestartMode::Always, 20, "agent-lost", None);
        k.restart_policy.max_restarts = 1000;
        k.restart_policy.backoff = 3600.0;
        assert_eq!(
            decide(&k, &k, 0.0),
            Next::Restart {
                not_before: MAX_BACKOFF_SECONDS
            }
        );
    }
}

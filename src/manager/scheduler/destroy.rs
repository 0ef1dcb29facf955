//! `DestroySession`: `TERMINATING` with its deadline, `destroy_kernel` on the agent (the
//! workload's stop signal, its grace period, then the kill), then out of the live set; a
//! queued (`PENDING`) session is `CANCELLED` without any agent call.
//!
//! `TERMINATING` is recorded before the agent is called so that a destroy whose answer is lost
//! has a deadline (its `terminate_deadline` plus `[scheduler] terminating-timeout`): the
//! reconcile sweep (`sweep.rs`) drives it again and ends the row either way.
//!
//! The end runs apart from the request: the caller waits for it up to [`ANSWER_WAIT`] (most
//! workloads exit on their stop signal at once, and the answer is then the ended session, as
//! before grace periods), and past that gets the session still `TERMINATING`, its
//! `terminate_deadline` saying by when it ends (`DELETE` answers 202 then). The end goes on
//! without it, once: the agent owns the wait.

use std::time::Duration;

use actix::prelude::*;

use super::launch::{end_on_agent, grace_left, Launcher};
use super::Scheduler;
use crate::manager::error::ManagerError;
use crate::manager::store::KernelRow;

/// The longest a `DestroySession` waits for the end before answering with the session still
/// `TERMINATING`.
pub const ANSWER_WAIT: Duration = Duration::from_secs(10);

/// The reason of a session its user destroyed.
const USER_REQUESTED: &str = "user-requested";

/// Destroys a session's kernels on their agents and takes them out of the live set; answers
/// the session's main kernel's row, `TERMINATED`, or `TERMINATING` when the end takes longer
/// than [`ANSWER_WAIT`].
#[derive(Message)]
#[rtype(result = "Result<KernelRow, ManagerError>")]
pub struct DestroySession {
    /// A session or kernel id.
    pub id: String,
    /// Seconds the workload has to exit after its stop signal, instead of the session's own
    /// `grace_period` (`rm --grace`; 0: `rm --now`); checked against `[scheduler]
    /// max-grace-period`. A session already `TERMINATING` ends sooner with a shorter one,
    /// never later.
    pub grace: Option<f64>,
}

impl Handler<DestroySession> for Scheduler {
    type Result = ResponseFuture<Result<KernelRow, ManagerError>>;

    fn handle(&mut self, msg: DestroySession, _: &mut Context<Self>) -> Self::Result {
        let launcher = self.launcher();
        Box::pin(async move {
            let store = launcher.store.clone();
            let id = msg.id;
            let grace = msg
                .grace
                .map(|s| {
                    crate::model::session::checked_grace_period(s, launcher.spec.max_grace_period)
                })
                .transpose()?;
            let k = store
                .kernel(&id)
                .await?
                .ok_or_else(|| ManagerError::SessionNotFound(id.clone()))?;
            let main_of = |rows: Vec<KernelRow>| {
                rows.into_iter()
                    .find(KernelRow::is_main)
                    .ok_or(ManagerError::SessionNotFound(id.clone()))
            };
            if k.cluster_size > 1 {
                // A cluster session ends whole, whichever of its kernels was named: every
                // kernel destroyed, then its network removed. The main kernel's row answers.
                let rows = store.session_kernels(&k.session_id).await?;
                if rows.iter().any(KernelRow::is_live) {
                    let end = {
                        let launcher = launcher.clone();
                        async move {
                            super::cluster::end_gang(&launcher, &rows, USER_REQUESTED, grace).await;
                            Ok(())
                        }
                    };
                    answer_when_ended(end).await?;
                } else {
                    // Ended already (a lost kernel, a failed create) and perhaps about to be
                    // restarted by its policy (`cluster::restart`): its user's destroy keeps
                    // it ended.
                    store.keep_ended(&k.session_id).await?;
                }
                return main_of(store.session_kernels(&k.session_id).await?);
            }
            if !k.is_live() {
                return Ok(k);
            }
            if k.is_pending() {
                // Queued: no agent holds anything of it.
                store.cancel_pending(&k.id, USER_REQUESTED).await?;
                return store
                    .kernel(&k.id)
                    .await?
                    .ok_or(ManagerError::SessionNotFound(id));
            }
            let end = end_one(launcher, k.clone(), grace);
            // On an error the row stays `TERMINATING`: the caller may ask again, and past its
            // deadline plus `terminating-timeout` the sweep resolves it.
            answer_when_ended(end).await?;
            store
                .kernel(&k.id)
                .await?
                .ok_or(ManagerError::SessionNotFound(id))
        })
    }
}

/// Ends one placed kernel `k` with `grace` (`None`: its own): recorded `TERMINATING` first (a
/// row already `TERMINATING` gets the shorter deadline of the two), then [`end_on_agent`].
async fn end_one(
    launcher: Launcher,
    k: KernelRow,
    grace: Option<Duration>,
) -> Result<(), ManagerError> {
    let store = &launcher.store;
    let mut g = grace_left(&k, launcher.spec.grace_period);
    if let Some(period) = grace {
        g.period = g.period.min(period);
    }
    store
        .terminating_kernel(&k.id, USER_REQUESTED, g.period)
        .await?;
    // Read back: `TERMINATING` since now (or since an end under way began).
    let k = store.kernel(&k.id).await?.unwrap_or(k);
    if !k.is_live() {
        return Ok(());
    }
    end_on_agent(&launcher, &k, USER_REQUESTED, &g).await?;
    Ok(())
}

/// Runs `end` apart from the caller and waits for it up to [`ANSWER_WAIT`].
///
/// Errors: `end`'s, when it failed within the wait.
async fn answer_when_ended(
    end: impl std::future::Future<Output = Result<(), ManagerError>> + 'static,
) -> Result<(), ManagerError> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    actix::spawn(async move {
        let r = end.await;
        if let Err(e) = &r {
            tracing::info!(error = %e, "a session's end failed; the reconcile sweep ends it past its deadline");
        }
        let _ = tx.send(r);
    });
    match tokio::time::timeout(ANSWER_WAIT, rx).await {
        Ok(Ok(r)) => r,
        // Still ending (or its task is gone): the session answers as it is, `TERMINATING`.
        _ => Ok(()),
    }
}

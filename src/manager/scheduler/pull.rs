//! The pull phase of a create, as Backend.AI 26.x's scheduler runs it: `check_and_pull` on the
//! chosen agent before `create_kernels`, so that a pull (minutes for a 15 GB image) is bounded
//! by the agent's `[container] image-pull-timeout` rather than by `create-timeout`.
//!
//! The agent answers `check_and_pull` at once and pulls in the background; the manager then
//! asks `image_pull_status` once a second, moves the kernel to `PULLING` and stores its
//! progress in bytes (`pull_progress`, at most one write a second) until the pull ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;

use crate::manager::calls::{agent_error, call_method, failure_error};
use crate::manager::error::ManagerError;
use crate::manager::metrics::ManagerMetrics;
use crate::manager::pool::AgentPool;
use crate::manager::store::Store;
use crate::model::pull::PullProgress;
use crate::model::session::KernelStatus;
use crate::rpc::agent_api::images::{
    CheckAndPull, CheckAndPullArgs, CheckPullingArgs, ImagePullStatus, PullState,
};
use crate::rpc::agent_api::kernel::ImageConfig;
use crate::rpc::{ErrorMeta, Failure};

/// How often the pull's state is asked for.
pub(super) const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Deadline of one `check_and_pull` or `image_pull_status` call (both answer at once).
const CALL_TIMEOUT: Duration = Duration::from_secs(15);

/// The longest a followed `PULLING` kernel goes without a store write (progress, else a touch,
/// `Store::touch_pull`): the reconcile sweep takes a pull unseen for much longer
/// (`sweep::ORPHANED_PULL_AFTER`) as one nobody follows.
pub(super) const TOUCH_INTERVAL: Duration = Duration::from_secs(5);

/// How the pull phase ended, or that it has not yet.
pub(super) enum PullOutcome {
    /// The image is on the agent: go on with `create_kernels`.
    Ready,
    /// The pull failed (`image-not-found`, `registry-auth-failed`, `registry-unreachable`,
    /// `image-pull-timeout`, or the agent went away).
    Failed(ManagerError),
    /// Still pulling at the deadline given.
    Pulling,
}

/// One kernel's pull phase on its agent.
#[derive(Clone)]
pub(super) struct PullPhase {
    pub(super) pool: Addr<AgentPool>,
    pub(super) metrics: Arc<ManagerMetrics>,
    pub(super) store: Store,
    pub(super) agent_id: String,
    pub(super) kernel_id: String,
    pub(super) image: ImageConfig,
}

impl PullPhase {
    /// Asks the agent to check (and pull when needed) the image. `Ok(false)`: the agent does
    /// not implement `check_and_pull` (an older kernelvisor agent): its `create_kernels`
    /// pulls as before.
    ///
    /// Errors: the agent's refusal mapped to the manager's codes; `agent-unavailable` when it
    /// does not answer (nothing was created there).
    pub(super) async fn start(&self) -> Result<bool, ManagerError> {
        let args = CheckAndPullArgs {
            image_configs: [(self.image.canonical.clone(), self.image.clone())].into(),
        };
        match call_method::<CheckAndPull>(
            &self.pool,
            &self.metrics,
            &self.agent_id,
            &args,
            CALL_TIMEOUT,
        )
        .await
        {
            Ok(_) => Ok(true),
            Err(e)
                if e.failure().and_then(|m| m.known()).is_some_and(|f| {
                    matches!(f, Failure::NotImplemented | Failure::UnknownMethod)
                }) =>
            {
                Ok(false)
            }
            Err(e) => Err(agent_error(&e)),
        }
    }

    /// Follows the pull until it ends or `until` passes, keeping the kernel's status and
    /// progress in the store. Calls that go unanswered are retried until `give_up` passes
    /// (then `agent-unavailable`).
    pub(super) async fn follow(&self, until: Instant, give_up: Instant) -> PullOutcome {
        let args = CheckPullingArgs {
            image_name: self.image.canonical.clone(),
        };
        let mut last_written: Option<(PullProgress, Instant)> = None;
        let mut marked_pulling = false;
        // The last store write of this follow (its status, progress or a touch).
        let mut last_seen = Instant::now();
        loop {
            let state = call_method::<ImagePullStatus>(
                &self.pool,
                &self.metrics,
                &self.agent_id,
                &args,
                CALL_TIMEOUT,
            )
            .await;
            match state {
                Ok(None) | Ok(Some(PullState::Done { .. })) => {
                    // `None`: the agent forgot it (restarted): its image stage pulls if needed.
                    if let Ok(Some(PullState::Done { progress })) = &state {
                        if marked_pulling {
                            self.write_progress(progress).await;
                        }
                    }
                    return PullOutcome::Ready;
                }
                Ok(Some(PullState::Failed { error, message })) => {
                    return PullOutcome::Failed(failure_error(&ErrorMeta::new(error, message)));
                }
                Ok(Some(PullState::Pulling { progress })) => {
                    if !marked_pulling {
                        marked_pulling = true;
                        let _ = self
                            .store
                            .advance_kernel(&self.kernel_id, KernelStatus::Pulling)
                            .await;
                    }
                    let due = last_written
                        .is_none_or(|(p, at)| p != progress && at.elapsed() >= POLL_INTERVAL);
                    if due {
                        self.write_progress(&progress).await;
                        last_written = Some((progress, Instant::now()));
                        last_seen = Instant::now();
                    }
                }
                Err(e) if e.failure().is_some() => return PullOutcome::Failed(agent_error(&e)),
                Err(e) => {
                    if Instant::now() >= give_up {
                        return PullOutcome::Failed(ManagerError::AgentUnavailable(format!(
                            "lost the agent while it pulled {}: {e}",
                            self.image.canonical
                        )));
                    }
                    tracing::debug!(agent_id = %self.agent_id, error = %e, "image_pull_status unanswered; asking again");
                }
            }
            // Followed, whether or not the agent answered this time (a silent agent's pull is
            // still this follower's: the sweep must not take it over).
            if last_seen.elapsed() >= TOUCH_INTERVAL {
                if let Err(e) = self.store.touch_pull(&self.kernel_id).await {
                    tracing::warn!(kernel_id = %self.kernel_id, error = %e, "cannot mark the pull as followed");
                }
                last_seen = Instant::now();
            }
            if Instant::now() >= until {
                return PullOutcome::Pulling;
            }
            actix_rt::time::sleep(
                POLL_INTERVAL.min(until.saturating_duration_since(Instant::now())),
            )
            .await;
        }
    }

    async fn write_progress(&self, progress: &PullProgress) {
        if let Err(e) = self
            .store
            .set_pull_progress(&self.kernel_id, progress)
            .await
        {
            tracing::warn!(kernel_id = %self.kernel_id, error = %e, "cannot store the pull progress");
        }
    }
}

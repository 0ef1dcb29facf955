//! `DestroySession`: `TERMINATING`, `destroy_kernel` on the agent, then out of the live set; a
//! queued (`PENDING`) session is `CANCELLED` without any agent call.
//!
//! `TERMINATING` is recorded before the agent is called so that a destroy whose answer is lost
//! has a deadline (`[scheduler] terminating-timeout`): the reconcile sweep (`sweep.rs`) drives
//! it again and ends the row either way.

use actix::prelude::*;

use super::launch::destroy_on_agent;
use super::Scheduler;
use crate::manager::calls::agent_error;
use crate::manager::error::ManagerError;
use crate::manager::store::KernelRow;

/// Destroys a session's kernel on its agent and takes it out of the live set.
#[derive(Message)]
#[rtype(result = "Result<KernelRow, ManagerError>")]
pub struct DestroySession(pub String);

impl Handler<DestroySession> for Scheduler {
    type Result = ResponseFuture<Result<KernelRow, ManagerError>>;

    fn handle(
        &mut self,
        DestroySession(id): DestroySession,
        _: &mut Context<Self>,
    ) -> Self::Result {
        let (store, pool, metrics, timeout) = (
            self.store.clone(),
            self.pool.clone(),
            self.metrics.clone(),
            self.spec.destroy_timeout,
        );
        let launcher = self.launcher();
        Box::pin(async move {
            let k = store
                .kernel(&id)
                .await?
                .ok_or_else(|| ManagerError::SessionNotFound(id.clone()))?;
            if k.cluster_size > 1 {
                // A cluster session ends whole, whichever of its kernels was named: every
                // kernel destroyed, then its network removed. The main kernel's row answers.
                let rows = store.session_kernels(&k.session_id).await?;
                if rows.iter().any(KernelRow::is_live) {
                    super::cluster::end_gang(&launcher, &rows, "user-requested").await;
                }
                return store
                    .session_kernels(&k.session_id)
                    .await?
                    .into_iter()
                    .find(KernelRow::is_main)
                    .ok_or(ManagerError::SessionNotFound(id));
            }
            if !k.is_live() {
                return Ok(k);
            }
            if k.is_pending() {
                // Queued: no agent holds anything of it.
                store.cancel_pending(&k.id, "user-requested").await?;
                return store
                    .kernel(&k.id)
                    .await?
                    .ok_or(ManagerError::SessionNotFound(id));
            }
            store.terminating_kernel(&k.id, "user-requested").await?;
            // On an error the row stays `TERMINATING`: the caller may ask again, and past
            // `terminating-timeout` the sweep resolves it.
            destroy_on_agent(&pool, &metrics, &k, "user-requested", timeout)
                .await
                .map_err(|e| agent_error(&e))?;
            store
                .terminate_kernel(&k.id, "user-requested", None)
                .await?;
            store
                .kernel(&k.id)
                .await?
                .ok_or(ManagerError::SessionNotFound(id))
        })
    }
}

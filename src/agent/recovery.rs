//! Start-up recovery (`docs/design.md`): rebuild every kernel actor from the store and the containers'
//! labels, re-reserve what they hold, clean up kernels caught mid-creation by a crash, and
//! report containers with this agent's id that nobody knows as dangling, described from the
//! engine alone so that the manager can have them adopted (`crate::agent::dangling`).

use std::collections::HashSet;
use std::sync::Arc;

use actix::Addr;

use super::backend::labels;
use super::context::AgentContext;
use super::events::AgentEvent;
use super::kernel::stages::scratch::{remove_scratch, scratch_path};
use super::kernel::KernelStatus;
use super::registry::{Adopt, DestroyKernel, KernelRegistry, Reconcile};

/// What recovery did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Kernels re-attached (their containers are then checked: dead ones are torn down).
    pub reattached: usize,
    /// Kernels caught mid-creation or mid-teardown, now cleaned up.
    pub cleaned: usize,
    /// Containers with this agent's id and no live kernel: described, reported as dangling
    /// (their slots and ports reserved while they run), left for the manager to adopt or
    /// destroy (`crate::agent::dangling`).
    pub dangling: usize,
}

/// Runs recovery before the agent serves RPC.
///
/// Errors: the store or the engine cannot be read (the agent must not start blind).
pub async fn recover(
    ctx: &Arc<AgentContext>,
    registry: &Addr<KernelRegistry>,
) -> anyhow::Result<RecoveryReport> {
    let records = ctx.store.live_kernels().await?;
    // Only containers carrying this agent's id: anything else is never touched.
    let containers = ctx
        .backend
        .list_containers(labels::AGENT_ID, &ctx.agent_id)
        .await?;
    let mut report = RecoveryReport::default();
    let known: HashSet<String> = records.iter().map(|r| r.kernel_id.clone()).collect();
    for rec in records {
        let id = rec.kernel_id.clone();
        match rec.resources {
            Some(resources) => {
                ctx.slots
                    .lock()
                    .expect("slots lock")
                    .reserve_exact(&id, &resources.slots);
                ctx.ports
                    .lock()
                    .expect("ports lock")
                    .reserve_exact(&resources.ports);
                registry
                    .send(Adopt {
                        kernel_id: id.clone(),
                        session_id: rec.session_id.clone(),
                        config: rec.config,
                        resources,
                    })
                    .await??;
                if rec.status == KernelStatus::Terminating {
                    registry
                        .send(DestroyKernel {
                            kernel_id: id.clone(),
                            reason: "user-requested".into(),
                            suppress_events: false,
                            // Its end began before the agent stopped: it gets its grace anew.
                            grace: None,
                        })
                        .await??;
                    report.cleaned += 1;
                } else {
                    report.reattached += 1;
                }
            }
            None => {
                // Caught mid-creation: whatever exists of it goes; slots and ports were only
                // in the dead process's memory.
                for c in containers
                    .iter()
                    .filter(|c| c.labels.get(labels::KERNEL_ID) == Some(&id))
                {
                    ctx.backend.remove_container(&c.id).await?;
                }
                let c = &ctx.config.container;
                remove_scratch(
                    &scratch_path(&c.scratch_root, &id)?,
                    c.scratch_size.is_some(),
                )?;
                ctx.store
                    .set_terminated(&id, "agent-restarted-during-creation", None)
                    .await?;
                ctx.events.emit(AgentEvent::KernelTerminated {
                    kernel_id: id.clone(),
                    session_id: rec.session_id,
                    reason: "agent-restarted-during-creation".into(),
                    exit_code: None,
                });
                tracing::info!(agent_id = %ctx.agent_id, kernel_id = %id, "cleaned up a kernel interrupted during creation");
                report.cleaned += 1;
            }
        }
    }
    // Containers with this agent's id that no live record claims: described from the engine,
    // their resources reserved while running, reported for the manager to adopt or destroy.
    let mut unknown = Vec::new();
    for c in &containers {
        let kernel_id = c.labels.get(labels::KERNEL_ID).cloned().unwrap_or_default();
        if !known.contains(&kernel_id) {
            if let Some(desc) = ctx.backend.describe_container(&c.id).await? {
                unknown.push(desc);
            }
        }
    }
    report.dangling = super::dangling::report(ctx, unknown).await;
    // Containers that died while the agent was away: their kernels tear down now.
    registry.send(Reconcile).await?;
    Ok(report)
}

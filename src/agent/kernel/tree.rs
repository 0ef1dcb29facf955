//! The kernel's stage tree: image → slots → ports → scratch → mounts → container →
//! service-ports (the list in `stages/mod.rs`), one supervised actor each (`rest_for_one`),
//! each stage's spec built from the config and the stages before it (its
//! `KernelStage::spec`). The container stage watches its container ([`super::watch`]); the
//! tree's restart intensity and backoff are the session's restart policy.

use std::sync::Arc;
use std::time::Duration;

use actors::{Backoff, Intensity, StageError, StageTree, StageTreeBuilder};

use super::messages::StagesChanged;
pub use super::stages::KernelRecipients;
use super::stages::{self, Plan};
use super::{KernelHandle, KernelResources};
use crate::agent::metrics::StageMetricsHook;
use crate::workload::restart_policy::{RestartPolicy, MAX_BACKOFF_SECONDS};

/// The tree's restart intensity and backoff from the session's restart policy.
fn intensity_of(policy: &RestartPolicy) -> (Intensity, Backoff) {
    let intensity = Intensity {
        max_restarts: policy.max_restarts,
        max_window: Duration::from_secs_f64(policy.window),
    };
    let backoff = if policy.backoff > 0.0 {
        Backoff::Exponential {
            base: Duration::from_secs_f64(policy.backoff),
            max: Duration::from_secs_f64(MAX_BACKOFF_SECONDS.max(policy.backoff)),
        }
    } else {
        Backoff::None
    };
    (intensity, backoff)
}

fn describe(handle: &KernelHandle, kernel: &KernelRecipients) -> StageTreeBuilder {
    let config = handle.info().config;
    let (intensity, backoff) = intensity_of(&config.restart_policy);
    let (h_observer, changed) = (handle.clone(), kernel.stages_changed.clone());
    let plan = Arc::new(Plan {
        handle: handle.clone(),
        config,
        recipients: kernel.clone(),
    });
    let tree = StageTree::builder(format!("kernel {}", handle.id))
        .intensity(intensity)
        .backoff(backoff)
        .observer(Arc::new(move |stages| {
            h_observer.update(|i| i.stages = stages.to_vec());
            changed.do_send(StagesChanged);
        }))
        .hook(Arc::new(StageMetricsHook {
            metrics: handle.ctx.metrics.clone(),
            kernel_id: handle.id.clone(),
        }));
    stages::add_all(&plan, tree)
}

/// A new kernel's tree, holding nothing yet (not started).
pub fn build(handle: &KernelHandle, kernel: &KernelRecipients) -> StageTree {
    describe(handle, kernel).build()
}

/// A recovered kernel's tree owning `resources` again (after a restart). The caller has
/// re-reserved the slots and ports in the agent's allocators.
///
/// Errors: [`StageError`] if the tree refuses a resource (a programming error).
pub fn rebuild(
    handle: &KernelHandle,
    kernel: &KernelRecipients,
    r: KernelResources,
) -> Result<StageTree, StageError> {
    let existing = stages::detached(r);
    describe(handle, kernel).rebuild(existing)
}

/// Every stage's resource once the tree is fully set up, for the store.
pub fn resources(tree: &StageTree) -> Option<KernelResources> {
    tree.resources(stages::collect)
}

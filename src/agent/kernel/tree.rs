//! The kernel's stage tree: image → slots → ports → scratch → mounts → container →
//! service-ports, one supervised actor each (`rest_for_one`), each stage's spec built from the
//! config and the stages before it. The container stage watches its container
//! ([`super::watch`]); the tree's restart intensity and backoff are the session's restart
//! policy.

use std::sync::Arc;
use std::time::Duration;

use actix::Recipient;
use actors::{
    Backoff, BoxError, Detached, Intensity, Provisioner, StageError, StageTree, StageTreeBuilder,
};

use super::config::{Injection, ServicePortRequest};
use super::messages::{ContainerEnded, StagesChanged};
use super::stages::{
    self, ContainerStage, ImageStage, MountStage, PortStage, ScratchSpec, ScratchStage,
    ServicePortStage, SlotStage,
};
use super::{KernelError, KernelHandle, KernelResources};
use crate::agent::backend::ImageInfo;
use crate::agent::metrics::StageMetricsHook;
use crate::workload::restart_policy::{RestartPolicy, MAX_BACKOFF_SECONDS};

/// Wraps a provisioner with the kernel's test-only [`Injection`] (inert unless the config
/// carried `_inject`, which only a `fault-injection` build reads).
struct Injected<P> {
    inner: P,
    inject: Injection,
}

impl<P: Provisioner> Provisioner for Injected<P> {
    type Spec = P::Spec;
    type Resource = P::Resource;

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn setup(&self, spec: P::Spec) -> Result<P::Resource, BoxError> {
        if let Some((stage, seconds)) = &self.inject.pause_before {
            if stage == self.name() {
                tokio::time::sleep(Duration::from_secs_f64(*seconds)).await;
            }
        }
        if self.inject.fail_at.as_deref() == Some(self.name()) {
            return Err(KernelError::Engine("injected failure".into()).into());
        }
        self.inner.setup(spec).await
    }

    async fn teardown(&self, resource: P::Resource) -> Result<(), BoxError> {
        self.inner.teardown(resource).await
    }
}

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
    let info = handle.info();
    let config = info.config.clone();
    let (intensity, backoff) = intensity_of(&config.restart_policy);
    let (h_observer, changed) = (handle.clone(), kernel.stages_changed.clone());
    let watcher = super::watch::container_watcher(handle.clone(), kernel.container_ended.clone());
    let inject = config.inject.clone();
    let (image_ref, slots, mounts) = (
        config.image.clone(),
        config.slots.clone(),
        config.mounts.clone(),
    );
    let (h_scratch, h_container) = (handle.clone(), handle.clone());
    // The image's service ports (its label) and the request's, known once the image is.
    let requested = Arc::new(config.service_ports.clone());
    let (req_ports, req_container, req_assign) = (requested.clone(), requested.clone(), requested);
    StageTree::builder(format!("kernel {}", handle.id))
        .intensity(intensity)
        .backoff(backoff)
        .observer(Arc::new(move |stages| {
            h_observer.update(|i| i.stages = stages.to_vec());
            changed.do_send(StagesChanged);
        }))
        .hook(Arc::new(StageMetricsHook {
            metrics: handle.ctx.metrics.clone(),
            kernel_id: handle.id.clone(),
        }))
        .stage(
            Injected {
                inner: ImageStage(handle.clone()),
                inject: inject.clone(),
            },
            move |_| Ok(image_ref.clone()),
        )
        .stage(
            Injected {
                inner: SlotStage(handle.clone()),
                inject: inject.clone(),
            },
            move |_| Ok(slots.clone()),
        )
        .stage(
            Injected {
                inner: PortStage(handle.clone()),
                inject: inject.clone(),
            },
            move |r| {
                let all = service_ports_of(r.of(stages::IMAGE)?, &req_ports)?;
                Ok(all.iter().map(|s| s.container_ports.len()).sum::<usize>())
            },
        )
        .stage(
            Injected {
                inner: ScratchStage(handle.clone()),
                inject: inject.clone(),
            },
            move |r| {
                let alloc = r.of(stages::SLOTS)?;
                let ports = r.of(stages::PORTS)?;
                // Every slot held, then the devices: their ids in the agent's numbering and
                // the allocation per slot (`{slot: {device id: amount}}` as JSON).
                let mut resources: Vec<(String, String)> = alloc
                    .slots
                    .iter()
                    .map(|(k, v)| (k.to_owned(), v.to_string()))
                    .collect();
                resources.push((
                    "CUDA_GLOBAL_DEVICE_IDS".into(),
                    alloc.device_ids().join(","),
                ));
                resources.push((
                    "ALLOCATED_DEVICES".into(),
                    serde_json::to_string(&alloc.devices).unwrap_or_default(),
                ));
                resources.push((
                    "HOST_PORTS".into(),
                    ports
                        .iter()
                        .map(u16::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                ));
                Ok(ScratchSpec {
                    environ: stages::container::environ(&h_scratch, alloc),
                    resources,
                })
            },
        )
        .stage(
            Injected {
                inner: MountStage(handle.clone()),
                inject: inject.clone(),
            },
            move |_| Ok(mounts.clone()),
        )
        .watched_stage(
            Injected {
                inner: ContainerStage(handle.clone()),
                inject: inject.clone(),
            },
            move |r| {
                let image = r.of(stages::IMAGE)?;
                Ok(stages::container_spec(
                    &h_container,
                    &image.id,
                    &service_ports_of(image, &req_container)?,
                    r.of(stages::SLOTS)?,
                    r.of(stages::PORTS)?,
                    r.of(stages::SCRATCH)?,
                    r.of(stages::MOUNTS)?,
                ))
            },
            watcher,
        )
        .stage(
            Injected {
                inner: ServicePortStage(handle.clone()),
                inject,
            },
            move |r| {
                let container = r.of(stages::CONTAINER)?;
                let all = service_ports_of(r.of(stages::IMAGE)?, &req_assign)?;
                Ok((
                    container.id.clone(),
                    stages::service_ports::assign(&all, r.of(stages::PORTS)?),
                ))
            },
        )
}

/// The kernel's service ports: the image label's plus the request's (Backend.AI's service
/// definitions, `crate::agent::services::defs`).
///
/// Errors: [`KernelError::InvalidConfig`] naming the label when it does not parse.
fn service_ports_of(
    image: &ImageInfo,
    requested: &[ServicePortRequest],
) -> Result<Vec<ServicePortRequest>, BoxError> {
    crate::agent::services::defs::merge(&image.labels, requested)
        .map_err(|e| KernelError::InvalidConfig(e).into())
}

/// Where the kernel's stages report to its actor.
#[derive(Clone)]
pub struct KernelRecipients {
    /// A stage's status changed (the tree's observer).
    pub stages_changed: Recipient<StagesChanged>,
    /// The container ended and the restart policy does not restart it.
    pub container_ended: Recipient<ContainerEnded>,
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
    let existing = Detached::new()
        .with_key(stages::IMAGE, r.image)
        .with_key(stages::SLOTS, r.slots)
        .with_key(stages::PORTS, r.ports)
        .with_key(stages::SCRATCH, r.scratch)
        .with_key(stages::MOUNTS, r.mounts)
        .with_key(stages::CONTAINER, r.container)
        .with_key(stages::SERVICE_PORTS, r.service_ports);
    describe(handle, kernel).rebuild(existing)
}

/// Every stage's resource once the tree is fully set up, for the store.
pub fn resources(tree: &StageTree) -> Option<KernelResources> {
    tree.resources(|r| {
        Some(KernelResources {
            image: r.of(stages::IMAGE).ok()?.clone(),
            slots: r.of(stages::SLOTS).ok()?.clone(),
            ports: r.of(stages::PORTS).ok()?.clone(),
            scratch: r.of(stages::SCRATCH).ok()?.clone(),
            mounts: r.of(stages::MOUNTS).ok()?.clone(),
            container: r.of(stages::CONTAINER).ok()?.clone(),
            service_ports: r.of(stages::SERVICE_PORTS).ok()?.clone(),
        })
    })
}

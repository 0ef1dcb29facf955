//! The kernel's stage chain: image → slots → ports → scratch → mounts → container →
//! service-ports, each stage's spec built from the config and the stages before it.

use std::sync::Arc;
use std::time::Duration;

use actors::{BoxError, Detached, Provisioner, StageChain, StageChainBuilder, StageError};

use super::config::{Injection, ServicePortRequest};
use super::stages::{
    self, ContainerHandle, ContainerStage, ImageStage, MountStage, PortStage, ScratchDir,
    ScratchSpec, ScratchStage, ServicePortInfo, ServicePortStage, SlotStage,
};
use super::{KernelError, KernelHandle, KernelResources};
use crate::agent::backend::{Bind, ImageInfo};
use crate::agent::metrics::StageMetricsHook;
use crate::agent::resources::slots::format_cores;
use crate::agent::resources::SlotAllocation;

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

fn describe(handle: &KernelHandle) -> StageChainBuilder {
    let info = handle.info();
    let config = info.config.clone();
    let inject = config.inject.clone();
    let (image_ref, slots, mounts) = (config.image.clone(), config.slots, config.mounts.clone());
    let (h_scratch, h_container) = (handle.clone(), handle.clone());
    // The image's service ports (its label) and the request's, known once the image is.
    let requested = Arc::new(config.service_ports.clone());
    let (req_ports, req_container, req_assign) = (requested.clone(), requested.clone(), requested);
    StageChain::builder()
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
            move |_| Ok(slots),
        )
        .stage(
            Injected {
                inner: PortStage(handle.clone()),
                inject: inject.clone(),
            },
            move |r| {
                let all = service_ports_of(r.get::<ImageInfo>("image")?, &req_ports)?;
                Ok(all.iter().map(|s| s.container_ports.len()).sum::<usize>())
            },
        )
        .stage(
            Injected {
                inner: ScratchStage(handle.clone()),
                inject: inject.clone(),
            },
            move |r| {
                let alloc = r.get::<SlotAllocation>("slots")?;
                let ports = r.get::<Vec<u16>>("ports")?;
                let mut resources = vec![
                    ("cpu".to_owned(), format_cores(alloc.request.cpu_millis)),
                    ("mem".to_owned(), alloc.request.mem_bytes.to_string()),
                    (
                        "cuda.device".to_owned(),
                        alloc.request.cuda_devices.to_string(),
                    ),
                ];
                resources.push(("CUDA_GLOBAL_DEVICE_IDS".into(), alloc.gpus.join(",")));
                resources.push((
                    "HOST_PORTS".into(),
                    ports
                        .iter()
                        .map(u16::to_string)
                        .collect::<Vec<_>>()
                        .join(","),
                ));
                Ok(ScratchSpec {
                    environ: stages::container::environ(&h_scratch, &alloc.gpus),
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
        .stage(
            Injected {
                inner: ContainerStage(handle.clone()),
                inject: inject.clone(),
            },
            move |r| {
                let image = r.get::<ImageInfo>("image")?;
                Ok(stages::container_spec(
                    &h_container,
                    &image.id,
                    &service_ports_of(image, &req_container)?,
                    r.get::<SlotAllocation>("slots")?,
                    r.get::<Vec<u16>>("ports")?,
                    r.get::<ScratchDir>("scratch")?,
                    r.get::<Vec<Bind>>("mounts")?,
                ))
            },
        )
        .stage(
            Injected {
                inner: ServicePortStage(handle.clone()),
                inject,
            },
            move |r| {
                let container = r.get::<ContainerHandle>("container")?;
                let all = service_ports_of(r.get::<ImageInfo>("image")?, &req_assign)?;
                Ok((
                    container.id.clone(),
                    stages::service_ports::assign(&all, r.get::<Vec<u16>>("ports")?),
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

/// A new kernel's chain, holding nothing yet.
pub fn build(handle: &KernelHandle) -> StageChain {
    describe(handle).build()
}

/// A recovered kernel's chain owning `resources` again (after a restart). The caller has
/// re-reserved the slots and ports in the agent's allocators.
///
/// Errors: [`StageError`] if the chain refuses a resource (a programming error).
pub fn rebuild(handle: &KernelHandle, r: KernelResources) -> Result<StageChain, StageError> {
    let existing = Detached::new()
        .with("image", r.image)
        .with("slots", r.slots)
        .with("ports", r.ports)
        .with("scratch", r.scratch)
        .with("mounts", r.mounts)
        .with("container", r.container)
        .with("service-ports", r.service_ports);
    describe(handle).rebuild(existing)
}

/// Every stage's resource once the chain is fully set up, for the store.
pub fn resources(chain: &StageChain) -> Option<KernelResources> {
    let r = chain.resources();
    Some(KernelResources {
        image: r.get::<ImageInfo>("image").ok()?.clone(),
        slots: r.get::<SlotAllocation>("slots").ok()?.clone(),
        ports: r.get::<Vec<u16>>("ports").ok()?.clone(),
        scratch: r.get::<ScratchDir>("scratch").ok()?.clone(),
        mounts: r.get::<Vec<Bind>>("mounts").ok()?.clone(),
        container: r.get::<ContainerHandle>("container").ok()?.clone(),
        service_ports: r.get::<Vec<ServicePortInfo>>("service-ports").ok()?.clone(),
    })
}

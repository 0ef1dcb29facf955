//! The kernel's stages, one provisioner per resource, in setup order (`docs/design.md`). Each holds
//! the kernel's [`KernelHandle`](super::KernelHandle) for the agent context and status
//! reports, and no per-resource state: what it made is its `Resource`, owned by the chain.
//!
//! Each stage is declared once, in its own file: its provisioner, its typed key, and its
//! [`KernelStage`] impl (how its spec is built from the config and the stages before it).
//! The one ordered list of them is `with_kernel_stages!` in `resources.rs` (one line per stage:
//! its module, its resource type, its provisioner and key), beside the persisted
//! [`KernelResources`] it makes (plain data, so that the store and the dangling table need no
//! stage code). [`kernel_stages!`] below turns the same list into the modules, the stage names
//! ([`STAGES`]), what `tree.rs` builds, rebuilds and collects, and what recovery rebuilds for a
//! dangling container ([`rebuild_all`]).

use std::sync::Arc;
use std::time::Duration;

use actix::Recipient;
use actors::{BoxError, Detached, Provisioner, Resources, StageTreeBuilder};

use super::config::{Injection, ServicePortRequest};
use super::messages::{ContainerEnded, StagesChanged};
use super::{KernelConfig, KernelError, KernelHandle, KernelResources};
use crate::agent::backend::{ContainerDescription, ImageInfo};
use crate::agent::resources::SlotAllocation;
use crate::agent::runner::{launch, Gate};
use crate::config::ContainerSection;

/// Where the kernel's stages report to its actor.
#[derive(Clone)]
pub struct KernelRecipients {
    /// A stage's status changed (the tree's observer).
    pub stages_changed: Recipient<StagesChanged>,
    /// The container ended and the restart policy does not restart it.
    pub container_ended: Recipient<ContainerEnded>,
}

/// Wraps a provisioner with the kernel's test-only [`Injection`] (inert unless the config
/// carried `_inject`, which only a `fault-injection` build reads).
pub struct Injected<P> {
    inner: P,
    inject: Injection,
}

impl<P> Injected<P> {
    /// `inner` with the injection of the kernel `plan` describes.
    pub fn new(inner: P, plan: &Plan) -> Self {
        Injected {
            inner,
            inject: plan.config.inject.clone(),
        }
    }
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
        if let Some((stage, path)) = &self.inject.hold_before {
            while stage == self.name() && !path.exists() {
                tokio::time::sleep(Duration::from_millis(50)).await;
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

/// What every stage's spec is built from: the kernel, its config as the tree was described
/// (a later config update reaches the stages only through a new tree), and where its stages
/// report.
pub struct Plan {
    /// The kernel.
    pub handle: KernelHandle,
    /// The kernel's config when its tree was described.
    pub config: Arc<KernelConfig>,
    /// Where the kernel's stages report to its actor.
    pub recipients: KernelRecipients,
}

impl Plan {
    /// The kernel's service ports: the image label's plus the request's (Backend.AI's service
    /// definitions, `crate::agent::services::defs`), then a runner kernel's intrinsic ones. A
    /// cluster's sub kernel gets the intrinsic ones only: the image's and the preopen ports
    /// are the main kernel's (upstream's `create_kernel`; `crate::agent::kernel::cluster::is_main`).
    ///
    /// Errors: [`KernelError::InvalidConfig`] naming the label when it does not parse.
    pub fn service_ports(&self, image: &ImageInfo) -> Result<Vec<ServicePortRequest>, BoxError> {
        let mut all = if super::cluster::is_main(self.config.cluster_role.as_deref()) {
            crate::agent::services::defs::merge(&image.labels, &self.config.service_ports)
                .map_err(KernelError::InvalidConfig)?
        } else {
            Vec::new()
        };
        match self.gate(image) {
            // The runner starts its intrinsic services itself (upstream always adds them).
            Gate::Runner { .. } => {
                for (name, protocol, port) in [
                    ("sshd", "tcp", launch::SSHD_PORT),
                    ("ttyd", "http", launch::TTYD_PORT),
                ] {
                    if !all.iter().any(|s| s.name == name) {
                        all.push(ServicePortRequest {
                            name: name.into(),
                            protocol: protocol.into(),
                            container_ports: vec![port],
                        });
                    }
                }
            }
            Gate::Refused(why) => return Err(KernelError::InvalidConfig(why).into()),
            Gate::Process => {}
        }
        Ok(all)
    }

    /// Whether the kernel gets Backend.AI's kernel runner (`crate::agent::runner::gate`), by
    /// the image's labels, `[kernel-runner]` and the image stage's libc probe.
    pub fn gate(&self, image: &ImageInfo) -> Gate {
        let r = &self.handle.ctx.runners;
        crate::agent::runner::gate::decide(
            &image.reference,
            &image.labels,
            r.config.mode,
            r.krunner.is_some(),
            r.glibc_known(&image.id),
        )
    }
}

/// What recovery read off a dangling container (one this agent's store does not know,
/// `crate::agent::dangling`), checked as far as the kernel's identity and service ports: the
/// one view every stage's [`KernelStage::rebuild`] rebuilds its resource from.
pub struct Found<'a> {
    /// The kernel's id (its `ai.backend.kernel-id` label, checked).
    pub kernel_id: &'a str,
    /// The engine's description of the container.
    pub desc: &'a ContainerDescription,
    /// Its image as the engine inspects it now (labels empty if the image went).
    pub image: &'a ImageInfo,
    /// The slots and devices it holds (from its labels, else its `HostConfig` limits).
    pub slots: &'a SlotAllocation,
    /// Every host port it publishes: the service ports' first, in service-port order (the
    /// order the ports stage allocated them), then any other.
    pub host_ports: &'a [u16],
    /// How many of `host_ports` are the service ports'.
    pub service_host_ports: usize,
    /// Its service ports (its `ai.backend.service-ports` label), each container port
    /// published on a host port.
    pub service_ports: &'a [ServicePortRequest],
    /// This agent's `[container]` section (where its scratch directories are).
    pub container: &'a ContainerSection,
}

/// One resource stage of a kernel: its provisioner plus how the kernel's tree makes it and
/// feeds it. Its typed key and its place in the order are its line in [`kernel_stages!`].
pub trait KernelStage: Provisioner<Resource: Clone> + Send + Sync + Sized {
    /// The stage's provisioner for kernel `handle`.
    fn new(handle: KernelHandle) -> Self;

    /// The stage's spec from the plan and the resources of the stages before it.
    fn spec(plan: &Plan, earlier: &Resources<'_>) -> Result<Self::Spec, BoxError>;

    /// The stage's resource as a dangling container `found` holds it, to adopt it with; pure
    /// (touches neither the engine nor the allocators: recovery reserves what it holds).
    ///
    /// Errors: why the container cannot be adopted as a kernel of this agent (the
    /// `KernelNotAdoptable` message).
    fn rebuild(found: &Found<'_>) -> Result<Self::Resource, String>;

    /// Appends the stage to the kernel's tree (with the kernel's test-only injection); a stage
    /// that watches its resource overrides this to add itself as a watched stage.
    fn add(plan: &Arc<Plan>, tree: StageTreeBuilder) -> StageTreeBuilder {
        let p = plan.clone();
        tree.stage(
            Injected::new(Self::new(plan.handle.clone()), plan),
            move |r| Self::spec(&p, r),
        )
    }
}

/// The stages of `resources.rs`'s list (`module: Resource => Provisioner, KEY;` per line, in
/// setup order, the `rest_for_one` order): their modules, names, tree, adoption, collection and
/// rebuild. A line's resource type must be its provisioner's `Resource`: `collect` and
/// `rebuild_all` do not compile otherwise.
macro_rules! kernel_stages {
    ($($(#[$attr:meta])* $module:ident: $resource:ty => $stage:ident, $key:ident;)+) => {
        $(
            pub mod $module;
            pub use $module::{$stage, $key};
        )+

        /// Every stage's resource as the dangling container `found` holds it, stage by stage in
        /// setup order ([`KernelStage::rebuild`]).
        ///
        /// Errors: the first stage's reason the container cannot be adopted.
        pub fn rebuild_all(found: &Found<'_>) -> Result<KernelResources, String> {
            Ok(KernelResources {
                $($module: <$stage as KernelStage>::rebuild(found)?,)+
            })
        }

        /// Stage names, in setup order: the chain's names, metric labels and error prefixes.
        pub const STAGES: [&str; [$(stringify!($module)),+].len()] = [$($key.name()),+];

        /// Appends every stage to the kernel's tree, in order.
        pub(super) fn add_all(plan: &Arc<Plan>, tree: StageTreeBuilder) -> StageTreeBuilder {
            $(let tree = <$stage as KernelStage>::add(plan, tree);)+
            tree
        }

        /// `resources` as the stages' resources to adopt, keyed by stage.
        pub(super) fn detached(resources: KernelResources) -> Detached {
            Detached::new()$(.with_key($key, resources.$module))+
        }

        /// Every stage's resource, or `None` while a stage holds none.
        pub(super) fn collect(r: &Resources<'_>) -> Option<KernelResources> {
            Some(KernelResources {
                $($module: r.of($key).ok()?.clone(),)+
            })
        }
    };
}

// The one list of stages is `resources.rs`'s `with_kernel_stages!`: the persisted
// `KernelResources` is made from it there, as plain data, and the stages from it here.
super::resources::with_kernel_stages!(kernel_stages);

pub use container::{container_spec, recreate_container, ContainerHandle};
pub use scratch::{ScratchDir, ScratchSpec};
pub use service_ports::ServicePortInfo;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::backend::Bind;
    use serde::Serialize;

    fn json<T: Serialize>(v: &T) -> String {
        serde_json::to_string(v).expect("serializes")
    }

    /// The generated struct keeps the persisted layout of `resources_version` 1: the store's
    /// rows name the stages' fields in this order, and older rows must still load.
    #[test]
    fn kernel_resources_keep_the_persisted_layout() {
        let r = KernelResources {
            image: ImageInfo {
                id: "sha256:1".into(),
                reference: "python:3".into(),
                labels: Default::default(),
            },
            slots: SlotAllocation::default(),
            ports: vec![30000, 30001],
            scratch: ScratchDir {
                path: "/s/k".into(),
                tmpfs: false,
            },
            mounts: vec![Bind {
                host_path: "/v".into(),
                container_path: "/home/work/v".into(),
                read_only: true,
            }],
            container: ContainerHandle {
                id: "c1".into(),
                name: "kernel.k".into(),
            },
            service_ports: vec![ServicePortInfo {
                name: "p".into(),
                protocol: "tcp".into(),
                container_ports: vec![8000],
                host_ports: vec![30000],
            }],
            runner: None,
        };
        let whole = json(&r);
        let expected = format!(
            "{{\"image\":{},\"slots\":{},\"ports\":{},\"scratch\":{},\"mounts\":{},\"container\":{},\"service_ports\":{},\"runner\":null}}",
            json(&r.image),
            json(&r.slots),
            json(&r.ports),
            json(&r.scratch),
            json(&r.mounts),
            json(&r.container),
            json(&r.service_ports),
        );
        assert_eq!(whole, expected);
        let back: KernelResources = serde_json::from_str(&whole).expect("loads back");
        assert_eq!(back, r);
        // A row persisted before the runner stage existed loads as a process-path kernel.
        let older = whole.replace(",\"runner\":null", "");
        let back: KernelResources = serde_json::from_str(&older).expect("an older row loads");
        assert_eq!(back, r);
    }
}

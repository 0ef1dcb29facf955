//! The kernel's stages, one provisioner per resource, in setup order (`docs/design.md`). Each holds
//! the kernel's [`KernelHandle`](super::KernelHandle) for the agent context and status
//! reports, and no per-resource state: what it made is its `Resource`, owned by the chain.
//!
//! Each stage is declared once, in its own file: its provisioner, its typed key, and its
//! [`KernelStage`] impl (how its spec is built from the config and the stages before it).
//! [`kernel_stages!`] below is the one ordered list of them: the modules, the stage names
//! ([`STAGES`]), and what `tree.rs` builds, rebuilds (from the persisted [`KernelResources`],
//! whose field per stage is named as the stage's module) and collects all come from it.

use std::sync::Arc;
use std::time::Duration;

use actix::Recipient;
use actors::{BoxError, Detached, Provisioner, Resources, StageTreeBuilder};

use super::config::{Injection, ServicePortRequest};
use super::messages::{ContainerEnded, StagesChanged};
use super::{KernelConfig, KernelError, KernelHandle, KernelResources};
use crate::agent::backend::ImageInfo;

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
    /// definitions, `crate::agent::services::defs`).
    ///
    /// Errors: [`KernelError::InvalidConfig`] naming the label when it does not parse.
    pub fn service_ports(&self, image: &ImageInfo) -> Result<Vec<ServicePortRequest>, BoxError> {
        crate::agent::services::defs::merge(&image.labels, &self.config.service_ports)
            .map_err(|e| KernelError::InvalidConfig(e).into())
    }
}

/// One resource stage of a kernel: its provisioner plus how the kernel's tree makes it and
/// feeds it. Its typed key and its place in the order are its line in [`kernel_stages!`].
pub trait KernelStage: Provisioner<Resource: Clone> + Send + Sync + Sized {
    /// The stage's provisioner for kernel `handle`.
    fn new(handle: KernelHandle) -> Self;

    /// The stage's spec from the plan and the resources of the stages before it.
    fn spec(plan: &Plan, earlier: &Resources<'_>) -> Result<Self::Spec, BoxError>;

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

/// The one ordered list of stages: `module::{Provisioner, KEY}` per line, in setup order (the
/// `rest_for_one` order). The module's name is the stage's field in [`KernelResources`]
/// (`resources.rs`: the persisted JSON layout, kept as a plain struct so that the store and
/// the dangling table need no stage code).
macro_rules! kernel_stages {
    ($($module:ident::{$stage:ident, $key:ident}),+ $(,)?) => {
        $(
            pub mod $module;
            pub use $module::{$stage, $key};
        )+

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

kernel_stages! {
    image::{ImageStage, IMAGE},
    slots::{SlotStage, SLOTS},
    ports::{PortStage, PORTS},
    scratch::{ScratchStage, SCRATCH},
    mounts::{MountStage, MOUNTS},
    container::{ContainerStage, CONTAINER},
    service_ports::{ServicePortStage, SERVICE_PORTS},
}

pub use container::{container_spec, recreate_container, ContainerHandle};
pub use scratch::{ScratchDir, ScratchSpec};
pub use service_ports::ServicePortInfo;

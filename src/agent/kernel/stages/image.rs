//! `image`: the local image, or a pull reported as `PULLING`.
//!
//! The pull goes through the agent's [`ImagePulls`](crate::agent::pulls::ImagePulls): one engine
//! pull per image however many kernels need it, with the registry's credentials from the
//! kernel's `ImageConfig.registry`, bounded by `[container] image-pull-timeout`. Under a
//! manager that calls `check_and_pull` first (Backend.AI 26.x, kernelvisor's own) the image is
//! already local here.

use actors::{BoxError, Provisioner, Resources, StageKey};

use super::{Found, KernelStage, Plan};

use crate::agent::backend::ImageInfo;
use crate::agent::kernel::{KernelError, KernelHandle, KernelStatus};
use crate::agent::pulls::registry_auth;
use crate::rpc::agent_api::kernel::ImageConfig;

/// Resolves the kernel's image reference. Teardown keeps the image (it is a cache).
pub struct ImageStage(pub KernelHandle);

/// This stage's key: its name, typed with its resource.
pub const IMAGE: StageKey<ImageInfo> = StageKey::of::<ImageStage>("image");

impl Provisioner for ImageStage {
    type Spec = String;
    type Resource = ImageInfo;

    fn name(&self) -> &'static str {
        IMAGE.name()
    }

    async fn setup(&self, reference: String) -> Result<ImageInfo, BoxError> {
        let ctx = &self.0.ctx;
        let image = self
            .0
            .info()
            .config
            .image_config
            .clone()
            .unwrap_or_else(|| ImageConfig::by_reference(&reference));
        let image = ImageConfig {
            canonical: reference.clone(),
            ..image
        };
        if let Some(local) = ctx.pulls.local_image(&image).await? {
            return self.gated(local).await;
        }
        self.0.set_status(KernelStatus::Pulling);
        ctx.pulls
            .start(&reference, registry_auth(&reference, &image.registry))
            .finish()
            .await?;
        let pulled = ctx
            .backend
            .inspect_image(&reference)
            .await
            .map_err(KernelError::from)?
            .ok_or_else(|| {
                KernelError::ImageNotFound(format!("{reference}: gone right after its pull"))
            })?;
        self.gated(pulled).await
    }

    async fn teardown(&self, _image: ImageInfo) -> Result<(), BoxError> {
        Ok(())
    }
}

impl ImageStage {
    /// `image`, once it is known whether it has glibc (probed once per image id when it could
    /// get the kernel runner: `crate::agent::runner::gate`).
    ///
    /// Errors: `InvalidKernelConfig` when `[kernel-runner] mode = require` refuses it.
    async fn gated(&self, image: ImageInfo) -> Result<ImageInfo, BoxError> {
        use crate::agent::runner::gate;
        let ctx = &self.0.ctx;
        let r = &ctx.runners;
        if r.glibc_known(&image.id).is_none()
            && gate::worth_probing(&image.labels, r.config.mode, r.krunner.is_some())
        {
            let glibc = match gate::probe_glibc(&*ctx.backend, &image.id).await {
                Ok(g) => g,
                Err(e) => {
                    tracing::warn!(image = %image.reference, error = %e, "libc probe failed: taken as no glibc");
                    false
                }
            };
            r.set_glibc(&image.id, glibc);
        }
        let decided = gate::decide(
            &image.reference,
            &image.labels,
            r.config.mode,
            r.krunner.is_some(),
            r.glibc_known(&image.id),
        );
        if let gate::Gate::Refused(why) = decided {
            return Err(KernelError::InvalidConfig(why).into());
        }
        Ok(image)
    }
}

impl KernelStage for ImageStage {
    fn new(handle: KernelHandle) -> Self {
        ImageStage(handle)
    }

    /// The config's image reference.
    fn spec(plan: &Plan, _: &Resources<'_>) -> Result<String, BoxError> {
        Ok(plan.config.image.clone())
    }

    /// The container's image as the engine inspects it now.
    fn rebuild(found: &Found<'_>) -> Result<ImageInfo, String> {
        Ok(found.image.clone())
    }
}

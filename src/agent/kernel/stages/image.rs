//! `image`: the local image, or a pull reported as `PULLING`.

use actors::{BoxError, Provisioner, StageKey};

use crate::agent::backend::ImageInfo;
use crate::agent::kernel::{KernelError, KernelHandle, KernelStatus};

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
        let backend = &self.0.ctx.backend;
        if let Some(image) = backend
            .inspect_image(&reference)
            .await
            .map_err(KernelError::from)?
        {
            return Ok(image);
        }
        if !self.0.info().config.may_pull() {
            return Err(KernelError::ImageNotFound(format!(
                "{reference} is not on this node, and a local image (or `auto_pull = none`) is never pulled"
            ))
            .into());
        }
        self.0.set_status(KernelStatus::Pulling);
        let (agent_id, kernel_id) = (self.0.ctx.agent_id.clone(), self.0.id.clone());
        let progress = move |p: crate::agent::backend::PullProgress| {
            tracing::debug!(%agent_id, %kernel_id, status = %p.status, current = ?p.current, total = ?p.total, "pulling");
        };
        // `check_pulling` answers true meanwhile.
        let _pulling = self.0.ctx.node.pull_started(&reference);
        Ok(backend
            .pull_image(&reference, None, &progress)
            .await
            .map_err(KernelError::from)?)
    }

    async fn teardown(&self, _image: ImageInfo) -> Result<(), BoxError> {
        Ok(())
    }
}

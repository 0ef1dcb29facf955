//! `purge_images(image_canonicals, force, noprune)` (the typed contract of
//! [`crate::rpc::agent_api::images::PurgeImages`]), answered as upstream's `DockerAgent`
//! answers it: `{"responses": [{"image", "error"}]}`, one entry per image in the call's order,
//! `error` nil when the image was removed (`docker rmi` with `force` and `noprune`), the
//! reason otherwise. Never a FAILURE for an image; FAILURE `ContainerEngineUnavailable` when
//! the engine is down.
//!
//! An image a kernel of this agent uses (its reference, or the id of the image its container
//! runs) is refused without `force`, naming the kernels; the engine would refuse it too, with
//! a conflict that names only a container. With `force` the call does what upstream's does:
//! it asks the engine to remove it anyway, and the engine then removes the tag only (a running
//! container keeps its image's layers; the kernel runs on).

use actix::Addr;

use super::args::mailbox;
use super::{Ctx, Table};
use crate::agent::context::AgentContext;
use crate::agent::kernel::KernelStatus;
use crate::agent::node::normalize_image;
use crate::agent::registry::{KernelRegistry, ListKernels};
use crate::rpc::agent_api::images as api;
use crate::rpc::Dispatcher;

/// A live kernel's image: its id, the reference it was created from, the image id its
/// container runs.
struct InUse {
    kernel_id: String,
    reference: String,
    image_id: Option<String>,
}

/// The images the agent's live kernels use.
async fn images_in_use(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
) -> Result<Vec<InUse>, crate::rpc::ErrorMeta> {
    let kernels = registry.send(ListKernels).await.map_err(mailbox)?;
    let mut out = Vec::new();
    for k in kernels {
        if k.status == KernelStatus::Terminated {
            continue;
        }
        let image_id = match &k.container_id {
            Some(cid) => ctx
                .backend
                .describe_container(cid)
                .await
                .ok()
                .flatten()
                .map(|d| d.spec.image),
            None => None,
        };
        out.push(InUse {
            kernel_id: k.id.clone(),
            reference: normalize_image(&k.config.image),
            image_id,
        });
    }
    Ok(out)
}

/// Registers `purge_images` on `dispatcher`.
pub(crate) fn register(dispatcher: &mut Dispatcher, cx: &Ctx) {
    Table::new(dispatcher, cx.clone()).method::<api::PurgeImages, _, _>(purge_images);
}

/// `purge_images(image_canonicals, force, noprune)`: see the module's doc.
async fn purge_images(
    cx: Ctx,
    args: api::PurgeImagesArgs,
) -> Result<api::PurgeImagesReply, crate::rpc::ErrorMeta> {
    cx.engine.check()?;
    tracing::info!(images = ?args.image_canonicals, force = args.force, noprune = args.noprune, "purging images");
    let in_use = images_in_use(&cx, &cx.registry).await?;
    let mut responses = Vec::with_capacity(args.image_canonicals.len());
    for image in args.image_canonicals {
        let id = cx
            .backend
            .inspect_image(&image)
            .await
            .ok()
            .flatten()
            .map(|i| i.id);
        let reference = normalize_image(&image);
        let users: Vec<&str> = in_use
            .iter()
            .filter(|u| u.reference == reference || (id.is_some() && u.image_id == id))
            .map(|u| u.kernel_id.as_str())
            .collect();
        let error = if !users.is_empty() && !args.force {
            Some(format!(
                "image {image} is in use by kernel(s) {} of this agent: not removed (with force, only its tag would be removed while they run)",
                users.join(", ")
            ))
        } else {
            match cx
                .backend
                .remove_image(&image, args.force, args.noprune)
                .await
            {
                Ok(steps) => {
                    tracing::info!(%image, ?steps, "image purged");
                    None
                }
                Err(e) => Some(e.to_string()),
            }
        };
        if let Some(e) = &error {
            tracing::warn!(%image, error = %e, "image not purged");
        }
        responses.push(api::PurgeImageResult { image, error });
    }
    Ok(api::PurgeImagesReply { responses })
}

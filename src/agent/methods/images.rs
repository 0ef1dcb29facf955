//! Image methods (the typed contract of [`crate::rpc::agent_api::images`]): `check_and_pull`
//! (Backend.AI 26.x's: check, pull in the background, tell the outcome by events),
//! `check_pulling` and kernelvisor's `image_pull_status`, from the agent's
//! [`ImagePulls`](crate::agent::pulls::ImagePulls). `purge_images` is in [`super::purge`];
//! `commit`, `get_commit_status`, `push_image` and kernelvisor's `get_bgtask` in
//! [`super::commit`].

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Ctx, Table};
use crate::agent::context::AgentContext;
use crate::agent::events::AgentEvent;
use crate::agent::kernel::config::run_reference;
use crate::agent::pulls::registry_auth;
use crate::rpc::agent_api::images as api;
use crate::rpc::agent_api::images::PullState;
use crate::rpc::agent_api::kernel::ImageConfig;
use crate::rpc::{Dispatcher, ErrorMeta};

/// Registers the image methods on `dispatcher`.
pub(crate) fn register(dispatcher: &mut Dispatcher, cx: &Ctx) {
    Table::new(dispatcher, cx.clone())
        .method::<api::CheckPulling, _, _>(|cx, args| async move {
            Ok(cx.pulls.is_pulling(&args.image_name))
        })
        .method::<api::ImagePullStatus, _, _>(|cx, args| async move {
            Ok(cx.pulls.status(&args.image_name))
        })
        .method::<api::CheckAndPull, _, _>(check_and_pull_all);
}

/// `check_and_pull(image_configs)` → `{key: background task id}`, one [`check_and_pull`] per
/// image. Errors: `ContainerEngineUnavailable`.
async fn check_and_pull_all(
    cx: Ctx,
    args: api::CheckAndPullArgs,
) -> Result<BTreeMap<String, String>, ErrorMeta> {
    cx.engine.check()?;
    let mut tasks = BTreeMap::new();
    for (key, image) in args.image_configs {
        tasks.insert(key, check_and_pull(&cx.agent, image).await);
    }
    Ok(tasks)
}

/// The error name of a failed pull task (its `bgtask_failed` says `ImagePullError('…')`).
const PULL_FAILED: &str = "ImagePullError";

/// Unix seconds now.
fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One image of `check_and_pull`: decides before answering whether it must be pulled (so that
/// `image_pull_status` right after the answer knows the image), then pulls in the background.
/// Events as upstream's `check_and_pull`: `image_pull_started` when this call starts the pull,
/// then `image_pull_finished` or `image_pull_failed`; `image_pull_finished` with `Image already
/// exists` at once when no pull is needed. Unlike upstream (which stays silent), a call that
/// finds the image being pulled waits for that pull and tells its outcome too, so every caller
/// hears how its image ended. Returns the background task's id (32 hex digits).
async fn check_and_pull(ctx: &Arc<AgentContext>, image: ImageConfig) -> String {
    let canonical = image.canonical.clone();
    // Upstream's pull task (`check_and_pull`'s `_pull` under its BackgroundTaskManager):
    // `bgtask_done` when the image is there, `bgtask_failed` when the pull failed.
    let tasks = ctx.bgtasks.clone();
    let task = tasks.start_pull(&canonical);
    let task_id = uuid::Uuid::parse_str(&task)
        .expect("the task table makes UUIDs")
        .simple()
        .to_string();
    let reference = run_reference(&image);
    let events = ctx.events.clone();
    // Upstream's `ImageRef.from_image_config`, in each of the pull's events.
    let image_ref = image.image_ref();
    let failed = {
        let image_ref = image_ref.clone();
        move |image: &str, msg: String| AgentEvent::ImagePullFailed {
            image: image.to_owned(),
            msg,
            image_ref: image_ref.clone(),
        }
    };
    match ctx.pulls.local_image(&image).await {
        Err(e) => {
            ctx.pulls.note_failed(&reference, &e);
            tasks.failed(&task, PULL_FAILED, e.to_string());
            events.emit(failed(&canonical, e.to_string()));
        }
        Ok(Some(_)) => {
            ctx.pulls.note_present(&reference);
            tasks.done(&task, None);
            events.emit(AgentEvent::ImagePullFinished {
                image: canonical.clone(),
                timestamp: now(),
                msg: Some("Image already exists".into()),
                image_ref,
            });
        }
        Ok(None) => {
            let mut pull = ctx
                .pulls
                .start(&reference, registry_auth(&reference, &image.registry));
            if pull.started {
                events.emit(AgentEvent::ImagePullStarted {
                    image: canonical.clone(),
                    timestamp: now(),
                    image_ref: image_ref.clone(),
                });
            }
            actix_rt::spawn(async move {
                loop {
                    match pull.now() {
                        PullState::Pulling { .. } => {
                            if !pull.changed().await {
                                let why = "the image pull task stopped";
                                tasks.failed(&task, PULL_FAILED, why.into());
                                events.emit(failed(&canonical, why.into()));
                                return;
                            }
                        }
                        PullState::Done { .. } => {
                            tasks.done(&task, None);
                            events.emit(AgentEvent::ImagePullFinished {
                                image: canonical.clone(),
                                timestamp: now(),
                                msg: None,
                                image_ref,
                            });
                            return;
                        }
                        PullState::Failed { message, .. } => {
                            tasks.failed(&task, PULL_FAILED, message.clone());
                            events.emit(failed(&canonical, message));
                            return;
                        }
                    }
                }
            });
        }
    }
    task_id
}

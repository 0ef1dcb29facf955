//! Image routes: `POST /v1/agents/{id}/images/purge` (admin; the agent's `purge_images`), and
//! `POST` / `GET /v1/sessions/{id}/commit` (the session's owner or an admin; the agent's
//! `commit`, then `push_image`, followed by [`crate::manager::commits`]).

use std::time::Duration;

use actix_web::{get, post, web, HttpResponse};

use super::auth::Caller;
use super::responses;
use super::{count_error, owned_kernel, reply, running_kernel, ApiState, Res};
use crate::manager::calls::{agent_error, call_method};
use crate::manager::commits::{self, CommitContext};
use crate::manager::error::ManagerError;
use crate::manager::registry::ListAgents;
use crate::model::error::ErrorBody;
use crate::model::image::{
    check_reference, Commit, CommitRequest, CommitStatus, PurgeImagesRequest, PurgedImage,
    PurgedImages,
};
use crate::model::object::Object;
use crate::rpc::agent_api::images::{PurgeImages, PurgeImagesArgs};

/// How long the agent may take to remove the images (each `docker rmi` may delete many layers).
const PURGE_TIMEOUT: Duration = Duration::from_secs(300);

/// The most images one purge names.
const MAX_PURGE: usize = 100;

/// Removes images from an agent, as `docker rmi` does; each image's outcome in the answer
/// (an image a kernel of the agent runs is refused without `force`, naming the kernels).
#[utoipa::path(
    operation_id = "purge_agent_images",
    tag = "system",
    params(("id" = String, Path, description = "Agent id")),
    request_body = PurgeImagesRequest,
    responses(
        (status = 200, description = "Each image's outcome, in the request's order", body = PurgedImages),
        (status = 400, description = "`invalid-request`: no image, more than 100, or an empty name", body = ErrorBody),
        (status = 404, description = "`agent-not-found`", body = ErrorBody),
        responses::AdminOnly, responses::AgentFailed,
    ),
)]
#[post("/v1/agents/{id}/images/purge")]
pub(super) async fn purge(
    s: web::Data<ApiState>,
    caller: Caller,
    id: web::Path<String>,
    body: web::Json<Object<PurgeImagesRequest>>,
) -> Res {
    caller.require_admin()?;
    let request = body.into_inner().into_inner();
    if request.images.is_empty() || request.images.len() > MAX_PURGE {
        return Err(ManagerError::InvalidRequest(format!(
            "`images` must name 1 to {MAX_PURGE} images"
        )));
    }
    if request.images.iter().any(|i| i.trim().is_empty()) {
        return Err(ManagerError::InvalidRequest(
            "`images` may not hold an empty name".into(),
        ));
    }
    let agents = s.registry.send(ListAgents).await?;
    if !agents.iter().any(|a| a.row.id == *id) {
        return Err(ManagerError::AgentNotFound(id.into_inner()));
    }
    let args = PurgeImagesArgs {
        image_canonicals: request.images,
        force: request.force,
        noprune: request.noprune,
    };
    let out = call_method::<PurgeImages>(&s.pool, &s.metrics, &id, &args, PURGE_TIMEOUT)
        .await
        .map_err(|e| agent_error(&e))?;
    tracing::info!(target: "audit", agent = %id, key = %caller.access_key, images = ?out.responses, "images purged");
    let images = out
        .responses
        .into_iter()
        .map(|r| PurgedImage {
            image: r.image,
            removed: r.error.is_none(),
            error: r.error,
        })
        .collect();
    reply(
        HttpResponse::Ok(),
        &PurgedImages {
            agent_id: id.into_inner(),
            images,
        },
    )
}

/// Saves the session's container as the image `image` (its files outside `/home/work` and
/// the vfolders), then pushes it to its registry when `push` is set (with the credentials of
/// the manager's `[[registry]]` for the image's host). Answers at once with the commit's
/// state; `GET` follows it.
#[utoipa::path(
    operation_id = "commit_session",
    tag = "sessions",
    params(("id" = String, Path, description = "Session or kernel id")),
    request_body = CommitRequest,
    responses(
        (status = 202, description = "Started: its state (`committing`)", body = Commit),
        (status = 400, description = "`invalid-request`: a malformed image reference", body = ErrorBody),
        (status = 404, description = "`session-not-found`", body = ErrorBody),
        (status = 409, description = "`session-not-running`, `commit-in-progress`", body = ErrorBody),
        responses::AgentFailed, responses::StartingUp,
    ),
)]
#[post("/v1/sessions/{id}/commit")]
pub(super) async fn commit(
    s: web::Data<ApiState>,
    caller: Caller,
    id: web::Path<String>,
    body: web::Json<Object<CommitRequest>>,
) -> Res {
    let r = async {
        let request = body.into_inner().into_inner();
        check_reference(&request.image).map_err(ManagerError::InvalidRequest)?;
        // The kernel the path names (a session id: the main kernel); a commit takes no selector.
        let k = running_kernel(&s, &caller, &id, None).await?;
        let state = Commit {
            session_id: k.session_id.clone(),
            kernel_id: k.id.clone(),
            agent_id: k.agent_id.clone(),
            image: request.image,
            push: request.push,
            status: CommitStatus::Committing,
            started_at: crate::manager::commits::now_secs(),
            ..Commit::default()
        };
        let ctx = CommitContext {
            pool: s.pool.clone(),
            metrics: s.metrics.clone(),
            registries: s.registries.clone(),
            commits: s.commits.clone(),
        };
        ctx.commits.begin(state.clone())?;
        let bgtask = match commits::start(&ctx, &state, &k.access_key, &k.image).await {
            Ok(id) => id,
            Err(e) => {
                ctx.commits.fail(&state.session_id, &e);
                return Err(e);
            }
        };
        tracing::info!(target: "audit", session = %state.session_id, key = %caller.access_key, image = %state.image, push = state.push, "commit started");
        actix_web::rt::spawn(commits::follow(ctx, state.clone(), bgtask));
        Ok(state)
    }
    .await;
    let state = count_error(&s, r)?;
    reply(HttpResponse::Accepted(), &state)
}

/// The session's last commit: `committing` → `pushing` (bytes pushed of the total) → `done`,
/// or `failed` with `error_code` and `reason`. Kept by the manager replica that started it
/// (a day after it ended).
#[utoipa::path(
    operation_id = "get_session_commit",
    tag = "sessions",
    params(("id" = String, Path, description = "Session or kernel id")),
    responses(
        (status = 200, description = "The commit's state", body = Commit),
        (status = 404, description = "`session-not-found`, `commit-not-found`", body = ErrorBody),
    ),
)]
#[get("/v1/sessions/{id}/commit")]
pub(super) async fn commit_state(
    s: web::Data<ApiState>,
    caller: Caller,
    id: web::Path<String>,
) -> Res {
    let k = owned_kernel(&s, &caller, &id).await?;
    let state = s.commits.get(&k.session_id).ok_or_else(|| {
        ManagerError::CommitNotFound(format!(
            "session {} has no commit this manager knows of",
            k.session_id
        ))
    })?;
    reply(HttpResponse::Ok(), &state)
}

//! vfolder routes: a key creates, lists and deletes its own vfolders by name (an admin lists
//! everyone's with `?all=true`). A session mounts them by name (`mounts` in `POST
//! /v1/sessions`); nobody names a host path.

use actix_web::{delete, get, post, web, HttpResponse};
use serde::Deserialize;

use super::auth::Caller;
use super::{reply, ApiState, Res};
use crate::manager::error::ManagerError;
use crate::manager::store::VfolderRow;
use crate::manager::vfolder_name;
use crate::model::error::ErrorBody;
use crate::model::object::Object;
use crate::model::vfolder::{NewVfolder, Vfolder, VfolderList};

/// A vfolder as the API shows it.
fn vfolder(v: &VfolderRow) -> Vfolder {
    Vfolder {
        name: v.name.clone(),
        owner: v.owner.clone(),
        created_at: Some(v.created_at),
    }
}

/// Creates a vfolder of the caller's.
#[utoipa::path(
    operation_id = "create_vfolder",
    tag = "vfolders",
    request_body = NewVfolder,
    responses(
        (status = 201, description = "Created", body = Vfolder),
        (status = 400, description = "`invalid-request`: malformed JSON, an unknown field, a bad name", body = ErrorBody),
        (status = 409, description = "`vfolder-exists`", body = ErrorBody),
    ),
)]
#[post("/v1/vfolders")]
pub(super) async fn create(
    s: web::Data<ApiState>,
    caller: Caller,
    body: web::Json<Object<NewVfolder>>,
) -> Res {
    let name = body.into_inner().into_inner().name;
    vfolder_name::check(&name)?;
    if !s.store.create_vfolder(&caller.access_key, &name).await? {
        return Err(ManagerError::VfolderExists(name));
    }
    let v = s
        .store
        .vfolder(&caller.access_key, &name)
        .await?
        .ok_or(ManagerError::VfolderNotFound(name))?;
    reply(HttpResponse::Created(), &vfolder(&v))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct ListQuery {
    #[serde(default)]
    all: bool,
}

/// The caller's vfolders; everyone's with `?all=true` (admin).
#[utoipa::path(
    operation_id = "list_vfolders",
    tag = "vfolders",
    params(("all" = Option<bool>, Query, description = "Every key's vfolders (admin only)")),
    responses(
        (status = 200, description = "The vfolders", body = VfolderList),
        (status = 400, description = "`invalid-request`: an unknown or ill-typed query parameter", body = ErrorBody),
        (status = 403, description = "`forbidden`: `all=true` with a user key", body = ErrorBody),
    ),
)]
#[get("/v1/vfolders")]
pub(super) async fn list(s: web::Data<ApiState>, caller: Caller, q: web::Query<ListQuery>) -> Res {
    let owner = if q.all {
        caller.require_admin()?;
        None
    } else {
        Some(caller.access_key.as_str())
    };
    let rows = s.store.vfolders(owner).await?;
    let vfolders = rows.iter().map(vfolder).collect();
    reply(HttpResponse::Ok(), &VfolderList { vfolders })
}

/// Deletes the caller's vfolder record (not while a live session mounts it). The data stays
/// on the agents' storage under `<owner>/<name>`; creating the name again finds it.
#[utoipa::path(
    operation_id = "delete_vfolder",
    tag = "vfolders",
    params(("name" = String, Path, description = "The caller's vfolder")),
    responses(
        (status = 200, description = "The vfolder record, deleted", body = Vfolder),
        (status = 404, description = "`vfolder-not-found`", body = ErrorBody),
        (status = 409, description = "`vfolder-in-use`: a live session mounts it", body = ErrorBody),
    ),
)]
#[delete("/v1/vfolders/{name}")]
pub(super) async fn delete(s: web::Data<ApiState>, caller: Caller, name: web::Path<String>) -> Res {
    let name = name.into_inner();
    let v = s
        .store
        .vfolder(&caller.access_key, &name)
        .await?
        .ok_or_else(|| ManagerError::VfolderNotFound(name.clone()))?;
    let live = s.store.kernels(Some(&caller.access_key), false).await?;
    if let Some(k) = live
        .iter()
        .find(|k| k.mounts.iter().any(|m| m.name == name))
    {
        return Err(ManagerError::VfolderInUse(format!(
            "vfolder `{name}` is mounted by live session `{}`",
            k.session_id
        )));
    }
    s.store.delete_vfolder(&caller.access_key, &name).await?;
    reply(HttpResponse::Ok(), &vfolder(&v))
}

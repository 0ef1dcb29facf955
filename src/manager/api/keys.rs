//! Access-key routes (admin only, but a key may read itself): create (the only answer that
//! ever shows a secret key), list, get, change (limit, enabled, name), delete.

use actix_web::{delete, get, patch, post, web, HttpResponse};

use super::auth::Caller;
use super::responses;
use super::{reply, ApiState, Res};
use crate::manager::credentials;
use crate::manager::error::ManagerError;
use crate::manager::store::{AccessKeyRow, DeleteKeyError, KeyChange, ROLE_ADMIN, ROLE_USER};
use crate::model::access_key::{AccessKey, AccessKeyList, ChangeBody, NewAccessKey, NewKeyBody};
use crate::model::error::ErrorBody;
use crate::model::object::Object;

/// A key as the API shows it (never its secret or the secret's hash).
pub fn shown(k: &AccessKeyRow) -> AccessKey {
    AccessKey {
        access_key: k.access_key.clone(),
        role: Some(Some(k.role.clone())),
        name: Some(Some(k.name.clone())),
        enabled: Some(Some(k.enabled)),
        concurrency_used: Some(k.concurrency_used),
        concurrency_limit: Some(k.concurrency_limit),
        created_at: Some(Some(k.created_at)),
        reclaim: None,
        preemptible: Some(k.preemptible),
    }
}

/// Longest key label, in bytes.
const MAX_NAME: usize = 128;

fn check_name(name: &str) -> Result<(), ManagerError> {
    if name.len() > MAX_NAME || name.chars().any(char::is_control) {
        return Err(ManagerError::InvalidRequest(format!(
            "`name` must be at most {MAX_NAME} bytes without control characters"
        )));
    }
    Ok(())
}

/// Creates an access key (admin): the only answer that ever shows a secret key.
#[utoipa::path(
    operation_id = "create_access_key",
    tag = "access-keys",
    request_body = NewKeyBody,
    responses(
        (status = 201, description = "Created, with its `secret_key`", body = NewAccessKey),
        (status = 400, description = "`invalid-request`: malformed JSON, an unknown field, a bad role or name", body = ErrorBody),
        responses::AdminOnly,
    ),
)]
#[post("/v1/access-keys")]
pub(super) async fn create(
    s: web::Data<ApiState>,
    caller: Caller,
    body: web::Json<Object<NewKeyBody>>,
) -> Res {
    caller.require_admin()?;
    let b = body.into_inner().into_inner();
    let role = match b.role.as_deref() {
        None | Some(ROLE_USER) => ROLE_USER,
        Some(ROLE_ADMIN) => ROLE_ADMIN,
        Some(r) => {
            return Err(ManagerError::InvalidRequest(format!(
                "`role` `{r}` must be `user` or `admin`"
            )))
        }
    };
    let name = b.name.unwrap_or_default();
    check_name(&name)?;
    let (access_key, secret) = (credentials::new_access_key(), credentials::new_secret_key());
    let k = s
        .store
        .create_access_key(
            &access_key,
            &credentials::secret_hash(&secret),
            role,
            &name,
            b.concurrency_limit.unwrap_or(0).into(),
        )
        .await?;
    let k = shown(&k);
    let created = NewAccessKey {
        access_key: k.access_key,
        role: k.role,
        name: k.name,
        enabled: k.enabled,
        concurrency_used: k.concurrency_used,
        concurrency_limit: k.concurrency_limit,
        created_at: k.created_at,
        secret_key: secret,
    };
    reply(HttpResponse::Created(), &created)
}

/// Every access key (admin).
#[utoipa::path(
    operation_id = "list_access_keys",
    tag = "access-keys",
    responses(
        (status = 200, description = "The keys", body = AccessKeyList),
        responses::AdminOnly,
    ),
)]
#[get("/v1/access-keys")]
pub(super) async fn list(s: web::Data<ApiState>, caller: Caller) -> Res {
    caller.require_admin()?;
    let keys = s.store.access_keys().await?;
    let access_keys = keys.iter().map(shown).collect();
    reply(HttpResponse::Ok(), &AccessKeyList { access_keys })
}

/// Any key may read itself (its concurrency); others' are an admin's.
#[utoipa::path(
    operation_id = "get_access_key",
    tag = "access-keys",
    params(("key" = String, Path, description = "Access key (`AK…`)")),
    responses(
        (status = 200, description = "The key", body = AccessKey),
        (status = 403, description = "`forbidden`: a user key reading another key", body = ErrorBody),
        (status = 404, description = "`access-key-not-found`", body = ErrorBody),
    ),
)]
#[get("/v1/access-keys/{key}")]
pub(super) async fn get(s: web::Data<ApiState>, caller: Caller, key: web::Path<String>) -> Res {
    if !caller.may_act_for(&key) {
        caller.require_admin()?;
    }
    let k = s
        .store
        .access_key(&key)
        .await?
        .ok_or_else(|| ManagerError::AccessKeyNotFound(key.into_inner()))?;
    // Idle reclaim: its defaults.
    let reclaim = s.store.key_reclaim_defaults(&k.access_key).await?;
    reply(
        HttpResponse::Ok(),
        &AccessKey {
            reclaim: Some(reclaim),
            ..shown(&k)
        },
    )
}

/// An admin cannot disable or delete the key it is calling with (nobody could undo it if it
/// is the last admin key).
fn not_own(caller: &Caller, key: &str, what: &str) -> Result<(), ManagerError> {
    if caller.access_key == key {
        return Err(ManagerError::InvalidRequest(format!(
            "cannot {what} the access key this request is made with"
        )));
    }
    Ok(())
}

/// Changes a key's limit, name, enabled flag or reclaim defaults (admin).
#[utoipa::path(
    operation_id = "change_access_key",
    tag = "access-keys",
    params(("key" = String, Path, description = "Access key (`AK…`)")),
    request_body = ChangeBody,
    responses(
        (status = 200, description = "The key, changed", body = AccessKey),
        (status = 400, description = "`invalid-request`: malformed JSON, an unknown field, a bad name, disabling the key this request is made with, a bad reclaim policy", body = ErrorBody),
        (status = 404, description = "`access-key-not-found`", body = ErrorBody),
        responses::AdminOnly,
    ),
)]
#[patch("/v1/access-keys/{key}")]
pub(super) async fn change(
    s: web::Data<ApiState>,
    caller: Caller,
    key: web::Path<String>,
    body: web::Json<Object<ChangeBody>>,
) -> Res {
    caller.require_admin()?;
    let b = body.into_inner().into_inner();
    if b.enabled == Some(false) {
        not_own(&caller, &key, "disable")?;
    }
    if let Some(n) = &b.name {
        check_name(n)?;
    }
    // Idle reclaim: checked before anything is written.
    if let Some(p) = &b.reclaim {
        p.check()?;
    }
    let change = KeyChange {
        concurrency_limit: b.concurrency_limit.map(i64::from),
        enabled: b.enabled,
        name: b.name,
        preemptible: b.preemptible,
    };
    let k = s
        .store
        .update_access_key(&key, &change)
        .await?
        .ok_or_else(|| ManagerError::AccessKeyNotFound(key.into_inner()))?;
    // Idle reclaim: the key's defaults, set when given.
    if let Some(p) = &b.reclaim {
        s.store.set_key_reclaim_defaults(&k.access_key, p).await?;
    }
    let reclaim = s.store.key_reclaim_defaults(&k.access_key).await?;
    reply(
        HttpResponse::Ok(),
        &AccessKey {
            reclaim: Some(reclaim),
            ..shown(&k)
        },
    )
}

/// Deletes a key (admin): not while it has live sessions, not the key this request is made
/// with.
#[utoipa::path(
    operation_id = "delete_access_key",
    tag = "access-keys",
    params(("key" = String, Path, description = "Access key (`AK…`)")),
    responses(
        (status = 200, description = "The key as it was, `enabled` false", body = AccessKey),
        (status = 400, description = "`invalid-request`: the key this request is made with", body = ErrorBody),
        (status = 404, description = "`access-key-not-found`", body = ErrorBody),
        (status = 409, description = "`access-key-in-use`: it has live sessions", body = ErrorBody),
        responses::AdminOnly,
    ),
)]
#[delete("/v1/access-keys/{key}")]
pub(super) async fn delete(s: web::Data<ApiState>, caller: Caller, key: web::Path<String>) -> Res {
    caller.require_admin()?;
    not_own(&caller, &key, "delete")?;
    let k = s.store.delete_access_key(&key).await.map_err(|e| match e {
        DeleteKeyError::NotFound(k) => ManagerError::AccessKeyNotFound(k),
        e @ DeleteKeyError::InUse(..) => ManagerError::AccessKeyInUse(e.to_string()),
        DeleteKeyError::Store(e) => e.into(),
    })?;
    let gone = AccessKey {
        enabled: Some(Some(false)),
        ..shown(&k)
    };
    reply(HttpResponse::Ok(), &gone)
}

//! vfolders: `/v1/vfolders`. A key creates, lists and deletes its own by name; a session mounts
//! them by name (never a host path).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/vfolders` body.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewVfolder {
    /// 1–64 characters of `A-Z a-z 0-9 . _ -`, not starting with `.`.
    #[schema(pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")]
    pub name: String,
}

/// A vfolder.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Vfolder {
    /// Its name.
    #[schema(required = true)]
    pub name: String,
    /// The owning access key.
    #[schema(required = true)]
    pub owner: String,
    /// Unix seconds.
    #[schema(value_type = f64, required = true)]
    pub created_at: Option<f64>,
}

/// `GET /v1/vfolders`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct VfolderList {
    /// The vfolders.
    #[schema(required = true)]
    pub vfolders: Vec<Vfolder>,
}

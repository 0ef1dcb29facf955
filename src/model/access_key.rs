//! Access keys: `/v1/access-keys` (admin, but a key may read itself). A key's secret is shown
//! once, in [`NewAccessKey`]; no other answer has it.

use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

/// An access key's role.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Its own sessions and vfolders.
    User,
    /// Everything.
    Admin,
}

/// `POST /v1/access-keys` body (`ctl` sends it: a field left `None` is not written).
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewKeyBody {
    /// `user` (default) or `admin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Role>)]
    pub role: Option<String>,
    /// At most this many live sessions (0, the default: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, maximum = 4294967295_u64)]
    pub concurrency_limit: Option<u32>,
    /// A label for people: at most 128 bytes, no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 128, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$")]
    pub name: Option<String>,
}

/// `PATCH /v1/access-keys/{key}` body: what to change (a field left `None` is not written).
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChangeBody {
    /// At most this many live sessions (0: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<u64>, maximum = 4294967295_u64)]
    pub concurrency_limit: Option<u32>,
    /// Enable or disable the key (not the one this request is made with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    /// A label for people: at most 128 bytes, no control characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_length = 128, pattern = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$")]
    pub name: Option<String>,
    // Idle reclaim.
    /// The key's defaults for its sessions' reclaim policy (`max_lifetime`, `idle_timeout`,
    /// `utilization_window`, `min_utilization`), replacing the ones it had; `{}` clears them
    /// (then `[reclaim]`'s apply).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<crate::model::reclaim::ReclaimPolicy>,
    /// The default of `preemptible` for the key's new sessions (preemption: a session that
    /// does not say is preemptible when its key's default is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptible: Option<bool>,
}

/// An access key (never its secret).
// A reader tells a key missing from the answer (outer `None`: not shown) from one that is null
// (`Some(None)`: shown as `-`); the manager writes every key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct AccessKey {
    /// `AK…`, the public id.
    #[schema(required = true)]
    pub access_key: String,
    /// Role.
    #[serde(deserialize_with = "present")]
    #[schema(value_type = Role, required = true)]
    pub role: Option<Option<String>>,
    /// A label (may be empty).
    #[serde(deserialize_with = "present")]
    #[schema(value_type = String, required = true)]
    pub name: Option<Option<String>>,
    /// Refused at once when false.
    #[serde(deserialize_with = "present")]
    #[schema(value_type = bool, required = true)]
    pub enabled: Option<Option<bool>>,
    /// Live sessions now.
    #[schema(value_type = i64, required = true)]
    pub concurrency_used: Option<i64>,
    /// At most this many live sessions (0 = unlimited).
    #[schema(value_type = i64, required = true)]
    pub concurrency_limit: Option<i64>,
    /// Unix seconds.
    #[serde(deserialize_with = "present")]
    #[schema(value_type = f64, required = true)]
    pub created_at: Option<Option<f64>>,
    // Idle reclaim.
    /// `GET` and `PATCH /v1/access-keys/{key}` only: its defaults for its sessions' reclaim
    /// policy (`{}`: none, `[reclaim]`'s apply).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reclaim: Option<crate::model::reclaim::ReclaimPolicy>,
    /// The default of `preemptible` for the key's sessions (missing from a manager before
    /// preemption).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemptible: Option<bool>,
}

/// `POST /v1/access-keys`'s answer: the key and, this once, its secret.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct NewAccessKey {
    /// `AK…`, the public id.
    #[schema(required = true)]
    pub access_key: String,
    /// Role.
    #[serde(deserialize_with = "present")]
    #[schema(value_type = Role, required = true)]
    pub role: Option<Option<String>>,
    /// A label (may be empty).
    #[serde(deserialize_with = "present")]
    #[schema(value_type = String, required = true)]
    pub name: Option<Option<String>>,
    /// True.
    #[serde(deserialize_with = "present")]
    #[schema(value_type = bool, required = true)]
    pub enabled: Option<Option<bool>>,
    /// 0.
    #[schema(value_type = i64, required = true)]
    pub concurrency_used: Option<i64>,
    /// At most this many live sessions (0 = unlimited).
    #[schema(value_type = i64, required = true)]
    pub concurrency_limit: Option<i64>,
    /// Unix seconds.
    #[serde(deserialize_with = "present")]
    #[schema(value_type = f64, required = true)]
    pub created_at: Option<Option<f64>>,
    /// The bearer token of this key: shown only here.
    #[schema(pattern = "^kvs_[A-Za-z0-9_-]{43}$", required = true)]
    pub secret_key: String,
}

impl NewAccessKey {
    /// The key without its secret.
    pub fn key(&self) -> AccessKey {
        AccessKey {
            access_key: self.access_key.clone(),
            role: self.role.clone(),
            name: self.name.clone(),
            enabled: self.enabled,
            concurrency_used: self.concurrency_used,
            concurrency_limit: self.concurrency_limit,
            created_at: self.created_at,
            reclaim: None,
            preemptible: None,
        }
    }
}

/// `GET /v1/access-keys`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct AccessKeyList {
    /// Every key.
    #[schema(required = true)]
    pub access_keys: Vec<AccessKey>,
}

/// A key that is present, null or not: `Some(value)` (a missing key stays the field's
/// default, `None`).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

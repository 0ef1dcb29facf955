//! How the store's rows read and write their typed columns, so that a row type derives
//! `sqlx::FromRow` and a query binds an enum itself:
//!
//! - the statuses and words ([`KernelStatus`], [`SessionType`], [`SessionResult`],
//!   [`AgentStatus`]) are TEXT columns holding their names, the same text the store always
//!   wrote (`PENDING`, `batch`, `UNDEFINED`, `ALIVE`); a name that is none of them fails the
//!   row's decoding;
//! - JSON columns ([`JsonText`], [`NullableJsonText`]) read leniently, as the API always read
//!   them: text that does not parse reads as the type's default (`None` for a nullable one);
//! - slots ([`SlotColumns`], an agent's [`TotalSlotColumns`]) are stored as JSON
//!   (`0005_resource_slots`), with the columns from before it still written and read for rows
//!   that predate it;
//! - flags ([`IntFlag`]) are INTEGER columns of 0 or 1 (what both databases store alike).

use sqlx::any::{Any, AnyRow, AnyTypeInfo};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::{Database, Decode, Encode, Row, Type};

use crate::model::agent::AgentStatus;
use crate::model::cluster::ClusterMode;
use crate::model::pull::PullProgress;
use crate::model::queue::PendingReason;
use crate::model::session::{
    KernelStatus, RestartPolicy, SessionMount, SessionResult, SessionType,
};
use crate::slots::{Amount, ResourceSlots, SlotTypes};

/// A stored name that is none of its column's values (the row fails to decode).
#[derive(Debug, thiserror::Error)]
#[error("`{name}` is no {what}")]
pub(super) struct UnknownName {
    /// What was stored.
    name: String,
    /// What the column holds (`kernel status`, …).
    what: &'static str,
}

/// Makes `$ty` a TEXT column of its names: `$as_str` writes one, `$parse` (`&str` →
/// `Option<$ty>`) reads one back.
macro_rules! text_column {
    ($ty:ty, $what:literal, $as_str:expr, $parse:expr) => {
        impl Type<Any> for $ty {
            fn type_info() -> AnyTypeInfo {
                <str as Type<Any>>::type_info()
            }
        }

        impl<'q> Encode<'q, Any> for $ty {
            fn encode_by_ref(
                &self,
                buf: &mut <Any as Database>::ArgumentBuffer<'q>,
            ) -> Result<IsNull, BoxDynError> {
                let name: &'static str = $as_str(*self);
                <&str as Encode<'q, Any>>::encode(name, buf)
            }
        }

        impl<'r> Decode<'r, Any> for $ty {
            fn decode(value: <Any as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
                let name = <String as Decode<'r, Any>>::decode(value)?;
                match $parse(name.as_str()) {
                    Some(v) => Ok(v),
                    None => Err(Box::new(UnknownName { name, what: $what })),
                }
            }
        }
    };
}

text_column!(
    KernelStatus,
    "kernel status",
    KernelStatus::as_str,
    KernelStatus::parse
);
text_column!(
    SessionType,
    "session type",
    SessionType::as_str,
    SessionType::parse
);
text_column!(
    SessionResult,
    "session result",
    SessionResult::as_str,
    SessionResult::parse
);
text_column!(
    ClusterMode,
    "cluster mode",
    ClusterMode::as_str,
    ClusterMode::parse
);
text_column!(
    AgentStatus,
    "agent status",
    AgentStatus::as_str,
    |name: &str| name.parse::<AgentStatus>().ok()
);

/// A NOT NULL TEXT column of JSON, as read: the row type's field is the parsed value (a
/// `From<JsonText>` impl below), for `#[sqlx(try_from = "JsonText")]`.
pub(super) struct JsonText(String);

/// A nullable TEXT column of JSON, as read (see [`JsonText`]).
pub(super) struct NullableJsonText(Option<String>);

impl Type<Any> for JsonText {
    fn type_info() -> AnyTypeInfo {
        <str as Type<Any>>::type_info()
    }
}

impl<'r> Decode<'r, Any> for JsonText {
    fn decode(value: <Any as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        <String as Decode<'r, Any>>::decode(value).map(JsonText)
    }
}

impl Type<Any> for NullableJsonText {
    fn type_info() -> AnyTypeInfo {
        <str as Type<Any>>::type_info()
    }
}

impl<'r> Decode<'r, Any> for NullableJsonText {
    fn decode(value: <Any as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        <Option<String> as Decode<'r, Any>>::decode(value).map(NullableJsonText)
    }
}

/// The JSON columns' types, each read leniently from [`JsonText`] (the type's default when the
/// text does not parse) or [`NullableJsonText`] (`None` when NULL or when it does not parse).
macro_rules! json_columns {
    ($($ty:ty),*; $($opt:ty),*) => {
        $(impl From<JsonText> for $ty {
            fn from(j: JsonText) -> $ty {
                serde_json::from_str(&j.0).unwrap_or_default()
            }
        })*
        $(impl From<NullableJsonText> for Option<$opt> {
            fn from(j: NullableJsonText) -> Option<$opt> {
                j.0.and_then(|text| serde_json::from_str(&text).ok())
            }
        })*
    };
}

json_columns!(Vec<SessionMount>, Vec<String>, RestartPolicy; PullProgress, PendingReason, std::collections::BTreeMap<String, f64>);

/// An agent's slot types (`slot_key_and_units`): text that does not parse reads as the built-in
/// slots rather than none, since an agent without `cpu` and `mem` types could take no session.
impl From<JsonText> for SlotTypes {
    fn from(j: JsonText) -> SlotTypes {
        serde_json::from_str(&j.0)
            .unwrap_or_else(|_| crate::manager::registry::heartbeat::slot_types(None))
    }
}

/// An INTEGER column of a flag (0: false, anything else: true), as read, for
/// `#[sqlx(try_from = "IntFlag")]` of a `bool` field: the agents table stores its flags as
/// integers, which `Any` does not decode as `bool` on SQLite.
pub(super) struct IntFlag(i64);

impl Type<Any> for IntFlag {
    fn type_info() -> AnyTypeInfo {
        <i64 as Type<Any>>::type_info()
    }
}

impl<'r> Decode<'r, Any> for IntFlag {
    fn decode(value: <Any as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        <i64 as Decode<'r, Any>>::decode(value).map(IntFlag)
    }
}

impl From<IntFlag> for bool {
    fn from(f: IntFlag) -> bool {
        f.0 != 0
    }
}

/// A JSON column's text as written: `value` serialized (`fallback` in the unreachable case
/// that it does not serialize).
pub(super) fn json_text<T: serde::Serialize>(value: &T, fallback: &str) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| fallback.to_owned())
}

/// A row's slots as stored: the JSON column and the columns from before it, for
/// `#[sqlx(flatten, try_from = "SlotColumns")]` of a `resource_slots` field.
#[derive(sqlx::FromRow)]
pub(super) struct SlotColumns {
    /// JSON slots; `''` in a row from before `0005_resource_slots`.
    resource_slots: String,
    /// Millicores (old column).
    cpu_millis: i64,
    /// Bytes (old column).
    mem_bytes: i64,
    /// Whole `cuda.device`s (old column).
    cuda_devices: i64,
}

impl TryFrom<SlotColumns> for ResourceSlots {
    type Error = serde_json::Error;

    /// The JSON slots, or (`''`) the old columns'.
    ///
    /// Errors: JSON that is no slots.
    fn try_from(c: SlotColumns) -> Result<ResourceSlots, serde_json::Error> {
        stored_slots(&c.resource_slots, c.cpu_millis, c.mem_bytes, c.cuda_devices)
    }
}

/// An agent row's total slots as stored: `slots_total` (JSON) and the columns from before
/// `0005_resource_slots`, for `#[sqlx(flatten, try_from = "TotalSlotColumns")]` (as
/// [`SlotColumns`], under the agents table's name for the JSON column).
#[derive(sqlx::FromRow)]
pub(super) struct TotalSlotColumns {
    /// JSON slots; `''` in a row from before `0005_resource_slots`.
    slots_total: String,
    /// Millicores (old column).
    cpu_millis: i64,
    /// Bytes (old column).
    mem_bytes: i64,
    /// Whole `cuda.device`s (old column).
    cuda_devices: i64,
}

impl TryFrom<TotalSlotColumns> for ResourceSlots {
    type Error = serde_json::Error;

    /// The JSON slots, or (`''`) the old columns'.
    ///
    /// Errors: JSON that is no slots.
    fn try_from(c: TotalSlotColumns) -> Result<ResourceSlots, serde_json::Error> {
        stored_slots(&c.slots_total, c.cpu_millis, c.mem_bytes, c.cuda_devices)
    }
}

/// Slots from their JSON text, or (`''`, a row from before `0005_resource_slots`) from the old
/// columns' values.
fn stored_slots(
    json: &str,
    cpu_millis: i64,
    mem_bytes: i64,
    cuda_devices: i64,
) -> Result<ResourceSlots, serde_json::Error> {
    if json.is_empty() {
        return Ok(legacy_slots(cpu_millis, mem_bytes, cuda_devices));
    }
    serde_json::from_str(json)
}

/// Slots from the columns written before `0005_resource_slots` (millicores, bytes, devices);
/// `cuda.device` only when non-zero.
fn legacy_slots(cpu_millis: i64, mem_bytes: i64, cuda_devices: i64) -> ResourceSlots {
    let mut s = ResourceSlots::new();
    s.set(
        crate::slots::CPU,
        Amount::from_milli(cpu_millis.max(0) as u64),
    );
    s.set(
        crate::slots::MEM,
        Amount::from_units(mem_bytes.max(0) as u64),
    );
    if cuda_devices > 0 {
        s.set("cuda.device", Amount::from_units(cuda_devices as u64));
    }
    s
}

/// Slots from their JSON column, or (`''`, a row from before `0005_resource_slots`) from the old
/// columns.
pub(super) fn slots_column(r: &AnyRow, column: &str) -> Result<ResourceSlots, sqlx::Error> {
    let text: String = r.try_get(column)?;
    if text.is_empty() {
        return Ok(legacy_slots(
            r.try_get("cpu_millis")?,
            r.try_get("mem_bytes")?,
            r.try_get("cuda_devices")?,
        ));
    }
    serde_json::from_str(&text).map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

/// The old columns' values for `slots` (still written, for compatibility): millicores, bytes,
/// whole `cuda.device`s.
pub(super) fn legacy_columns(slots: &ResourceSlots) -> (i64, i64, i64) {
    let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    (
        clamp(slots.get(crate::slots::CPU).milli()),
        clamp(slots.get(crate::slots::MEM).units()),
        clamp(slots.get("cuda.device").units()),
    )
}

#[cfg(test)]
mod tests {
    use crate::model::session::{KernelStatus, SessionResult, SessionType};

    /// The stored names are the API's (serde's) names: a row's text and its JSON agree.
    #[test]
    fn stored_names_are_the_serde_names() {
        let serde_name = |v: serde_json::Value| v.as_str().unwrap().to_owned();
        for s in KernelStatus::ALL {
            assert_eq!(serde_name(serde_json::to_value(s).unwrap()), s.as_str());
            assert_eq!(KernelStatus::parse(s.as_str()), Some(s));
        }
        for t in [SessionType::Interactive, SessionType::Batch] {
            assert_eq!(serde_name(serde_json::to_value(t).unwrap()), t.as_str());
            assert_eq!(SessionType::parse(t.as_str()), Some(t));
        }
        for r in [
            SessionResult::Undefined,
            SessionResult::Success,
            SessionResult::Failure,
        ] {
            assert_eq!(serde_name(serde_json::to_value(r).unwrap()), r.as_str());
            assert_eq!(SessionResult::parse(r.as_str()), Some(r));
        }
    }

    /// A kernel row's words read back typed; JSON columns that do not parse read as their
    /// defaults; a status that is none fails the row.
    #[actix_rt::test]
    async fn typed_columns_read_back_and_json_reads_leniently() {
        let (_dir, store) = super::super::test_store_with_key().await;
        sqlx::query(
            "INSERT INTO kernels (id, session_id, agent_id, access_key, image, status, cpu_millis, mem_bytes, cuda_devices, created_at, session_type, result, mounts, restart_policy, pull_progress, pending_reason) \
             VALUES ('k', 's', 'a', 'AK', 'img', 'RESTARTING', 0, 0, 0, 0, 'batch', 'SUCCESS', 'not json', '{', 'nope', 'nope')",
        )
        .execute(&store.pool)
        .await
        .unwrap();
        let k = store.kernel("k").await.unwrap().unwrap();
        assert_eq!(
            (k.status, k.session_type, k.result),
            (
                KernelStatus::Restarting,
                SessionType::Batch,
                SessionResult::Success
            )
        );
        assert!(k.mounts.is_empty());
        assert_eq!(k.restart_policy, Default::default());
        assert_eq!((k.pull_progress, k.pending_reason), (None, None));
        sqlx::query("UPDATE kernels SET status = 'BOGUS' WHERE id = 'k'")
            .execute(&store.pool)
            .await
            .unwrap();
        assert!(store.kernel("k").await.is_err());
    }
}

// Idle reclaim.
/// A kernel row's reclaim columns (`#[sqlx(flatten)]` of [`KernelRow::reclaim`]).
#[derive(Clone, Debug, Default, PartialEq, sqlx::FromRow)]
pub struct ReclaimColumns {
    /// Seconds it may run once placed.
    pub max_lifetime: Option<f64>,
    /// Seconds without activity before it ends (interactive only).
    pub idle_timeout: Option<f64>,
    /// Seconds under the floor before it ends.
    pub utilization_window: Option<f64>,
    /// `{slot: percent}` (JSON; `None` when NULL or unreadable).
    #[sqlx(try_from = "NullableJsonText")]
    pub min_utilization: Option<std::collections::BTreeMap<String, f64>>,
    /// Unix seconds (agent's clock) of its last reported activity.
    pub last_activity: Option<f64>,
    /// Unix seconds (agent's clock) of the newest heartbeat that reported on it.
    pub activity_at: Option<f64>,
    /// Unix seconds (agent's clock) since which its readings were all under the floor.
    pub low_since: Option<f64>,
    /// The deadline its last `reclaim_warning` was for.
    pub reclaim_warned: Option<f64>,
}

impl ReclaimColumns {
    /// The columns of a session created with policy `p` (nothing reported yet).
    pub fn of_policy(p: &crate::model::reclaim::ReclaimPolicy) -> ReclaimColumns {
        ReclaimColumns {
            max_lifetime: p.max_lifetime,
            idle_timeout: p.idle_timeout,
            utilization_window: p.utilization_window,
            min_utilization: (!p.min_utilization.is_empty()).then(|| p.min_utilization.clone()),
            ..ReclaimColumns::default()
        }
    }

    /// The policy it was created with.
    pub fn policy(&self) -> crate::model::reclaim::ReclaimPolicy {
        crate::model::reclaim::ReclaimPolicy {
            max_lifetime: self.max_lifetime,
            idle_timeout: self.idle_timeout,
            utilization_window: self.utilization_window,
            min_utilization: self.min_utilization.clone().unwrap_or_default(),
        }
    }
}

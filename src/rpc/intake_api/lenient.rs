//! `deserialize_with` helpers that read a field the way the intake always has: a value of the
//! wrong type reads as the field's default instead of failing the whole message (an older or
//! newer agent, a hand-built test map), and sequence or map entries that do not read are
//! skipped one by one.

use std::collections::BTreeMap;

use rmpv::Value;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

/// `T` when the value reads as one, else `T::default()`.
///
/// Errors: only when the input is not msgpack at all.
pub fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned + Default,
{
    let v = Value::deserialize(d)?;
    Ok(rmpv::ext::from_value(v).unwrap_or_default())
}

/// The entries of a sequence that read as `T`, in order; anything but a sequence is empty.
///
/// Errors: only when the input is not msgpack at all.
pub fn seq<'de, D, T>(d: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    Ok(match Value::deserialize(d)? {
        Value::Array(items) => items
            .into_iter()
            .filter_map(|v| rmpv::ext::from_value(v).ok())
            .collect(),
        _ => Vec::new(),
    })
}

/// The entries of a map whose key is a string and whose value reads as `T`; `None` when the
/// value is not a map.
///
/// Errors: only when the input is not msgpack at all.
pub fn opt_map<'de, D, T>(d: D) -> Result<Option<BTreeMap<String, T>>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    Ok(match Value::deserialize(d)? {
        Value::Map(entries) => Some(
            entries
                .into_iter()
                // Through bytes: a unit enum variant (`SlotType`) reads from its name there.
                .filter_map(|(k, v)| {
                    Some((
                        k.as_str()?.to_owned(),
                        crate::rpc::agent_api::from_value(v).ok()?,
                    ))
                })
                .collect(),
        ),
        _ => None,
    })
}

/// A map without its nil-valued entries (msgpack peers write `None` for an absent value);
/// anything else as it is.
pub fn without_nils(v: &Value) -> Value {
    match v {
        Value::Map(m) => Value::Map(m.iter().filter(|(_, v)| !v.is_nil()).cloned().collect()),
        other => other.clone(),
    }
}

//! The heartbeat an agent sends every `heartbeat-interval`: `agent_heartbeat(agent_id, info)` →
//! `{}` (`docs/events.md`, "Heartbeats"). [`HeartbeatInfo`] is `info`: the agent builds it
//! (`agent/heartbeat.rs`), the manager reads it (`manager/registry/heartbeat.rs`), and the
//! benches' simulated agents send it.
//!
//! Only `addr` is required; every other field reads as its default when absent, nil or of
//! another type, and entries of `kernels` / `images` / `slot_key_and_units` that do not read
//! are skipped (an agent that predates a field sends none of it).

use std::collections::BTreeMap;

use rmpv::Value;
use serde::{Deserialize, Deserializer, Serialize};

use super::lenient;
use crate::slots::{ResourceSlots, SlotType};

/// `info` of `agent_heartbeat`, as a msgpack map with these keys in this order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatInfo {
    /// The agent's id (the call's first argument is what counts).
    #[serde(default, deserialize_with = "lenient::or_default")]
    pub agent_id: String,
    /// `[agent] region` (`local` when absent).
    #[serde(default = "local", deserialize_with = "region")]
    pub region: String,
    /// The agent's RPC endpoint, `tcp://host:port`: the one required key.
    pub addr: String,
    /// Its CURVE public key (Z85); nil without CURVE.
    #[serde(default, deserialize_with = "lenient::or_default")]
    pub public_key: Option<String>,
    /// The agent's version (`CARGO_PKG_VERSION`).
    #[serde(default, deserialize_with = "lenient::or_default")]
    pub version: String,
    /// Its CPU architecture (`x86_64`, `aarch64`).
    #[serde(default, deserialize_with = "lenient::or_default")]
    pub architecture: String,
    /// Unix seconds when the agent built it: latest wins.
    #[serde(default, deserialize_with = "lenient::or_default")]
    pub ts: f64,
    /// Its slots, over every slot it has.
    #[serde(default, deserialize_with = "lenient::or_default")]
    pub slots: HeartbeatSlots,
    /// `{slot: "count" | "bytes" | "unique"}`: every slot's unit (Backend.AI's name); absent
    /// from agents that predate it (then the manager assumes `cuda.device`, a count).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::opt_map"
    )]
    pub slot_key_and_units: Option<BTreeMap<String, SlotType>>,
    /// Every kernel not `TERMINATED`.
    #[serde(default, deserialize_with = "lenient::seq")]
    pub kernels: Vec<HeartbeatKernel>,
    /// The references of the images the engine holds, as it names them, the largest images'
    /// first, at most `MAX_HEARTBEAT_IMAGES` (`agent/heartbeat.rs`).
    #[serde(default, deserialize_with = "lenient::seq")]
    pub images: Vec<String>,
}

/// `slots`: `{slot: "decimal"}` maps (Backend.AI's wire form: `cpu` cores, `mem` bytes, each
/// accelerator slot); entries that do not parse are skipped.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatSlots {
    /// What the agent has in all.
    #[serde(default, deserialize_with = "slots")]
    pub total: ResourceSlots,
    /// What is free.
    #[serde(default, deserialize_with = "slots")]
    pub available: ResourceSlots,
    /// What its kernels hold.
    #[serde(default, deserialize_with = "slots")]
    pub occupied: ResourceSlots,
}

/// One live kernel of a heartbeat.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HeartbeatKernel {
    /// Kernel id (an entry without one is skipped).
    pub id: String,
    /// Session id (empty when absent).
    #[serde(default, deserialize_with = "lenient::or_default")]
    pub session_id: String,
    /// The agent's status of it (`PREPARING` … `TERMINATING`; empty when absent).
    #[serde(default, deserialize_with = "lenient::or_default")]
    pub status: String,
    // Idle reclaim (`agent/activity.rs`).
    /// Unix seconds (the agent's clock) of its last activity: an `execute`, a terminal, a file
    /// transfer, a connection to a service port; absent before any (and from agents that
    /// predate it).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient::or_default"
    )]
    pub last_activity: Option<f64>,
    /// `{slot: percent}`: its mean utilization since the previous heartbeat (`cpu` of the
    /// cores it holds, `mem` of its limit, each `cuda.*` slot it holds); absent when nothing
    /// was read.
    #[serde(
        default,
        skip_serializing_if = "BTreeMap::is_empty",
        deserialize_with = "lenient::or_default"
    )]
    pub utilization: BTreeMap<String, f64>,
}

fn local() -> String {
    "local".into()
}

fn region<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(v.as_str().map_or_else(local, str::to_owned))
}

fn slots<'de, D: Deserializer<'de>>(d: D) -> Result<ResourceSlots, D::Error> {
    Ok(ResourceSlots::from_wire_msgpack(&Value::deserialize(d)?))
}

impl HeartbeatInfo {
    /// As the msgpack map the intake takes.
    pub fn to_value(&self) -> Value {
        super::super::agent_api::to_value(self)
    }

    /// Reads `info`; nil values read as absent keys.
    ///
    /// Errors: `info` is not a map, or has no string `addr` (the message names it).
    pub fn from_value(info: &Value) -> Result<HeartbeatInfo, String> {
        if !info.is_map() {
            return Err("heartbeat info must be a map".into());
        }
        rmpv::ext::from_value(lenient::without_nils(info)).map_err(|e| format!("heartbeat: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_leniently_and_round_trips() {
        let info = Value::Map(vec![
            ("addr".into(), "tcp://h:1".into()),
            ("region".into(), Value::Nil),
            ("ts".into(), 3.into()),
            ("public_key".into(), 5.into()),
            (
                "kernels".into(),
                Value::Array(vec![
                    Value::Map(vec![("session_id".into(), "s".into())]),
                    Value::Map(vec![
                        ("id".into(), "k".into()),
                        ("session_id".into(), Value::Nil),
                    ]),
                ]),
            ),
            ("images".into(), Value::Array(vec!["a:1".into(), 7.into()])),
            (
                "slot_key_and_units".into(),
                Value::Map(vec![
                    ("cpu".into(), "count".into()),
                    ("x.y".into(), "furlongs".into()),
                ]),
            ),
        ]);
        let hb = HeartbeatInfo::from_value(&info).unwrap();
        assert_eq!(hb.region, "local");
        assert_eq!(hb.ts, 3.0);
        assert_eq!(hb.public_key, None);
        assert_eq!(
            hb.kernels,
            [HeartbeatKernel {
                id: "k".into(),
                ..Default::default()
            }]
        );
        assert_eq!(hb.images, ["a:1"]);
        assert_eq!(
            hb.slot_key_and_units,
            Some([("cpu".to_owned(), SlotType::Count)].into())
        );
        assert_eq!(HeartbeatInfo::from_value(&hb.to_value()).unwrap(), hb);
        assert!(HeartbeatInfo::from_value(&Value::Map(vec![]))
            .unwrap_err()
            .contains("addr"));
        assert!(HeartbeatInfo::from_value(&Value::from(1)).is_err());
    }
}

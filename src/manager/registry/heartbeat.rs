//! The heartbeat of `agent_heartbeat(agent_id, info)` (`docs/events.md`) as the registry keeps
//! it: read through the agent's own type ([`HeartbeatInfo`]), images normalized, slot types
//! completed.

use rmpv::Value;

use crate::agent::heartbeat::MAX_HEARTBEAT_IMAGES;
use crate::agent::node::normalize_image;
use crate::rpc::intake_api::heartbeat::HeartbeatInfo;
use crate::slots::{builtin_types, ResourceSlots, SlotType, SlotTypes};

/// One heartbeat: the agent's address and key, its slots in total (every slot it has: `cpu`,
/// `mem`, accelerator slots) with their types, its kernels, and its local images.
#[derive(Clone, Debug, PartialEq)]
pub struct Heartbeat {
    /// Agent id.
    pub agent_id: String,
    /// `tcp://host:port` of its RPC server.
    pub addr: String,
    /// Z85 CURVE public key, `None` without CURVE.
    pub public_key: Option<String>,
    /// Region.
    pub region: String,
    /// Agent version.
    pub version: String,
    /// Unix seconds when the agent built it (latest wins).
    pub ts: f64,
    /// `slots.total`: every slot the agent has (`{name: amount}`, in the slot's unit).
    pub slots_total: ResourceSlots,
    /// `slot_key_and_units`, with the built-in `cpu` / `mem` (see [`slot_types`]).
    pub slot_types: SlotTypes,
    /// `(kernel id, session id, status)` of every kernel not `TERMINATED`.
    pub kernels: Vec<(String, String, String)>,
    /// `images`: the references of the images its engine holds, as the engine names them
    /// ([`normalize_image`]), each once, at most [`MAX_HEARTBEAT_IMAGES`] (more are cut);
    /// empty when the agent sends none (one that predates it).
    pub images: Vec<String>,
    // Idle reclaim.
    /// Each kernel's reported activity and utilization, stamped with the heartbeat's `ts`.
    pub activity: Vec<crate::model::reclaim::ActivityReport>,
}

/// The slot types of a heartbeat's `slot_key_and_units` (`{name: "count" | "bytes" |
/// "unique"}`, entries with a bad unit already skipped when read), always with the built-in
/// `cpu` (count) and `mem` (bytes). Agents that predate it send none: then `cuda.device`
/// (count) besides the built-ins, the one accelerator slot they knew. Entries with a bad name
/// are skipped.
pub fn slot_types(units: Option<&SlotTypes>) -> SlotTypes {
    let mut types = builtin_types();
    match units {
        None => {
            types.insert("cuda.device".into(), SlotType::Count);
        }
        Some(map) => {
            for (name, ty) in map {
                if crate::slots::check_name(name).is_ok() && !types.contains_key(name) {
                    types.insert(name.clone(), *ty);
                }
            }
        }
    }
    types
}

impl Heartbeat {
    /// Reads `info` ([`HeartbeatInfo`]) of agent `agent_id` (the call's first argument wins
    /// over `info.agent_id`).
    ///
    /// Errors: `info` is not a map, or has no `addr`.
    pub fn from_value(agent_id: &str, info: &Value) -> Result<Heartbeat, String> {
        let info = HeartbeatInfo::from_value(info)?;
        let mut seen = std::collections::HashSet::new();
        let images = info
            .images
            .iter()
            .map(|r| normalize_image(r))
            .filter(|r| seen.insert(r.clone()))
            .take(MAX_HEARTBEAT_IMAGES)
            .collect();
        // Idle reclaim: every kernel, with or without activity or readings (the heartbeat's
        // `ts` vouches for it either way).
        let activity = info
            .kernels
            .iter()
            .map(|k| crate::model::reclaim::ActivityReport {
                kernel_id: k.id.clone(),
                at: info.ts,
                last_activity: k.last_activity,
                utilization: k.utilization.clone(),
            })
            .collect();
        Ok(Heartbeat {
            activity,
            agent_id: agent_id.to_owned(),
            slot_types: slot_types(info.slot_key_and_units.as_ref()),
            kernels: info
                .kernels
                .into_iter()
                .map(|k| (k.id, k.session_id, k.status))
                .collect(),
            addr: info.addr,
            public_key: info.public_key,
            region: info.region,
            version: info.version,
            ts: info.ts,
            slots_total: info.slots.total,
            images,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::Amount;

    #[test]
    fn parses_slots_as_decimal_strings() {
        let slots = Value::Map(vec![
            ("cpu".into(), "1.5".into()),
            ("mem".into(), "1073741824".into()),
            ("cuda.device".into(), "0".into()),
        ]);
        let info = Value::Map(vec![
            ("addr".into(), "tcp://127.0.0.1:6011".into()),
            ("ts".into(), Value::F64(12.5)),
            ("slots".into(), Value::Map(vec![("total".into(), slots)])),
            (
                "kernels".into(),
                Value::Array(vec![Value::Map(vec![
                    ("id".into(), "k".into()),
                    ("session_id".into(), "s".into()),
                    ("status".into(), "RUNNING".into()),
                ])]),
            ),
        ]);
        let hb = Heartbeat::from_value("a1", &info).unwrap();
        assert_eq!(hb.slots_total.get("cpu"), Amount::from_milli(1500));
        assert_eq!(hb.slots_total.get("mem"), Amount::from_units(1 << 30));
        assert_eq!(hb.slots_total.get("cuda.device"), Amount::ZERO);
        assert_eq!(hb.ts, 12.5);
        // No `slot_key_and_units`: the built-ins and `cuda.device`.
        assert_eq!(hb.slot_types.get("cuda.device"), Some(&SlotType::Count));
        assert_eq!(hb.slot_types.len(), 3);
        assert_eq!(hb.kernels, vec![("k".into(), "s".into(), "RUNNING".into())]);
        // No `images`: none known.
        assert!(hb.images.is_empty());
        let units = Value::Map(vec![
            ("cpu".into(), "count".into()),
            ("mem".into(), "bytes".into()),
            ("cuda.shares".into(), "count".into()),
            ("tpu.device".into(), "unique".into()),
            ("Bad Name".into(), "count".into()),
            ("x.y".into(), "furlongs".into()),
        ]);
        let info = Value::Map(vec![
            ("addr".into(), "tcp://127.0.0.1:6011".into()),
            ("slot_key_and_units".into(), units),
        ]);
        let types = Heartbeat::from_value("a1", &info).unwrap().slot_types;
        assert_eq!(
            types.keys().map(String::as_str).collect::<Vec<_>>(),
            ["cpu", "cuda.shares", "mem", "tpu.device"]
        );
        assert_eq!(types["tpu.device"], SlotType::Unique);
        assert!(Heartbeat::from_value("a1", &Value::Map(vec![]))
            .unwrap_err()
            .contains("addr"));
    }

    #[test]
    fn images_are_normalized_deduplicated_and_capped() {
        let info = |images: Vec<Value>| {
            Value::Map(vec![
                ("addr".into(), "tcp://127.0.0.1:6011".into()),
                ("images".into(), Value::Array(images)),
            ])
        };
        let hb = Heartbeat::from_value(
            "a1",
            &info(vec![
                "python".into(),
                "docker.io/library/python:latest".into(),
                "localhost:5000/team/cuda:12".into(),
                Value::from(7),
            ]),
        )
        .unwrap();
        assert_eq!(hb.images, ["python:latest", "localhost:5000/team/cuda:12"]);
        let many: Vec<Value> = (0..MAX_HEARTBEAT_IMAGES + 5)
            .map(|i| format!("img:{i}").into())
            .collect();
        let hb = Heartbeat::from_value("a1", &info(many)).unwrap();
        assert_eq!(hb.images.len(), MAX_HEARTBEAT_IMAGES);
        assert_eq!(hb.images[0], "img:0");
    }
}

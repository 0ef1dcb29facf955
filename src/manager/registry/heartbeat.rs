//! The heartbeat map of `agent_heartbeat(agent_id, info)` (`docs/events.md`), parsed.

use rmpv::Value;

use crate::agent::heartbeat::MAX_HEARTBEAT_IMAGES;
use crate::agent::node::normalize_image;
use crate::manager::events::field;
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
}

fn text(map: &[(Value, Value)], key: &str) -> Option<String> {
    field(map, key).and_then(Value::as_str).map(str::to_owned)
}

/// The slot types of a heartbeat's `slot_key_and_units` (`{name: "count" | "bytes" |
/// "unique"}`), always with the built-in `cpu` (count) and `mem` (bytes). Agents that predate it
/// send none: then `cuda.device` (count) besides the built-ins, the one accelerator slot they
/// knew. Entries with a bad name or unit are skipped.
pub fn slot_types(units: Option<&Value>) -> SlotTypes {
    let mut types = builtin_types();
    match units.and_then(Value::as_map) {
        None => {
            types.insert("cuda.device".into(), SlotType::Count);
        }
        Some(map) => {
            for (k, v) in map {
                let (Some(name), Some(ty)) = (k.as_str(), v.as_str().and_then(SlotType::parse))
                else {
                    continue;
                };
                if crate::slots::check_name(name).is_ok() && !types.contains_key(name) {
                    types.insert(name.to_owned(), ty);
                }
            }
        }
    }
    types
}

impl Heartbeat {
    /// Parses `info` of agent `agent_id` (the call's first argument wins over `info.agent_id`).
    ///
    /// Errors: `info` is not a map, or has no `addr`.
    pub fn from_value(agent_id: &str, info: &Value) -> Result<Heartbeat, String> {
        let map = info.as_map().ok_or("heartbeat info must be a map")?;
        let addr = text(map, "addr").ok_or("heartbeat without `addr`")?;
        let slots_total = field(map, "slots")
            .and_then(Value::as_map)
            .and_then(|s| field(s, "total"))
            .map(ResourceSlots::from_wire_msgpack)
            .unwrap_or_default();
        let kernels = field(map, "kernels")
            .and_then(Value::as_array)
            .map(|ks| {
                ks.iter()
                    .filter_map(Value::as_map)
                    .filter_map(|k| {
                        Some((
                            text(k, "id")?,
                            text(k, "session_id").unwrap_or_default(),
                            text(k, "status").unwrap_or_default(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut seen = std::collections::HashSet::new();
        let images = field(map, "images")
            .and_then(Value::as_array)
            .map(|refs| {
                refs.iter()
                    .filter_map(Value::as_str)
                    .map(normalize_image)
                    .filter(|r| seen.insert(r.clone()))
                    .take(MAX_HEARTBEAT_IMAGES)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Heartbeat {
            agent_id: agent_id.to_owned(),
            addr,
            public_key: text(map, "public_key"),
            region: text(map, "region").unwrap_or_else(|| "local".into()),
            version: text(map, "version").unwrap_or_default(),
            ts: field(map, "ts").and_then(Value::as_f64).unwrap_or(0.0),
            slots_total,
            slot_types: slot_types(field(map, "slot_key_and_units")),
            kernels,
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
        let types = slot_types(Some(&units));
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

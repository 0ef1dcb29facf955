//! The heartbeat map of `agent_heartbeat(agent_id, info)` (`docs/events.md`), parsed.

use rmpv::Value;

use crate::manager::events::field;

/// One heartbeat. Slots total: `cpu_millis` (millicores), `mem_bytes`, `cuda_devices`.
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
    /// Millicores.
    pub cpu_millis: i64,
    /// Bytes.
    pub mem_bytes: i64,
    /// GPUs.
    pub cuda_devices: i64,
    /// `(kernel id, session id, status)` of every kernel not `TERMINATED`.
    pub kernels: Vec<(String, String, String)>,
}

fn text(map: &[(Value, Value)], key: &str) -> Option<String> {
    field(map, key).and_then(Value::as_str).map(str::to_owned)
}

/// A slot amount: a decimal string (Backend.AI's way) or a number.
fn amount(v: Option<&Value>) -> f64 {
    match v {
        Some(Value::String(s)) => s.as_str().and_then(|s| s.parse().ok()).unwrap_or(0.0),
        Some(v) => v
            .as_f64()
            .or_else(|| v.as_u64().map(|n| n as f64))
            .unwrap_or(0.0),
        None => 0.0,
    }
}

impl Heartbeat {
    /// Parses `info` of agent `agent_id` (the call's first argument wins over `info.agent_id`).
    ///
    /// Errors: `info` is not a map, or has no `addr`.
    pub fn from_value(agent_id: &str, info: &Value) -> Result<Heartbeat, String> {
        let map = info.as_map().ok_or("heartbeat info must be a map")?;
        let addr = text(map, "addr").ok_or("heartbeat without `addr`")?;
        let total = field(map, "slots")
            .and_then(Value::as_map)
            .and_then(|s| field(s, "total"))
            .and_then(Value::as_map)
            .cloned()
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
        Ok(Heartbeat {
            agent_id: agent_id.to_owned(),
            addr,
            public_key: text(map, "public_key"),
            region: text(map, "region").unwrap_or_else(|| "local".into()),
            version: text(map, "version").unwrap_or_default(),
            ts: field(map, "ts").and_then(Value::as_f64).unwrap_or(0.0),
            cpu_millis: (amount(field(&total, "cpu")) * 1000.0).round() as i64,
            mem_bytes: amount(field(&total, "mem")) as i64,
            cuda_devices: amount(field(&total, "cuda.device")) as i64,
            kernels,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            (hb.cpu_millis, hb.mem_bytes, hb.cuda_devices, hb.ts),
            (1500, 1 << 30, 0, 12.5)
        );
        assert_eq!(hb.kernels, vec![("k".into(), "s".into(), "RUNNING".into())]);
        assert!(Heartbeat::from_value("a1", &Value::Map(vec![]))
            .unwrap_err()
            .contains("addr"));
    }
}

//! Live stats in the statistics database (0), msgpack-encoded maps of upstream's `MetricValue`
//! (`current`, `capacity`, `pct`, `unit_hint`, `stats.*`; [`LiveStats`](crate::agent::stats::
//! live::LiveStats)), as `StatContext` writes them (`ai/backend/agent/stats.py`):
//!
//! | key | value | TTL |
//! |---|---|---|
//! | `<agent_id>` | `{"node": {metric: MetricValue}, "devices": {metric: {device_id: MetricValue}}}` | 4 × the node interval (`collect_node_stat`) |
//! | `<kernel_id>` | `{metric: MetricValue}` | 86,400 s (`collect_container_stat` sets no TTL: `ValkeyStatClient`'s default) |
//! | `<container_id>` | `{pid: {metric: MetricValue}}` (pids as integers) | 4 × the process interval (`collect_per_container_process_stat`) |
//!
//! The manager reads them with `ValkeyStatClient.get_agent_statistics_batch`,
//! `get_kernel_statistics` (its idle checker's utilization: `<metric>.pct`, `mem.current`) and
//! `get_user_kernel_statistics_batch`.

use rmpv::Value;

use super::conn::{Conns, Failure};
use crate::agent::stats::live::{MetricValue, Metrics, Snapshot};

/// The statistics database (`ai.backend.common.defs.REDIS_STATISTICS_DB`).
pub const DB: i64 = 0;

/// A kernel's stats' TTL in seconds (`_DEFAULT_EXPIRATION` of `valkey_stat/client.py`).
pub const KERNEL_TTL_SECS: u64 = 86_400;

/// Node and process stats live this many intervals (`_METRIC_TTL_FACTOR`).
pub const TTL_FACTOR: f64 = 4.0;

fn s(v: &str) -> Value {
    Value::from(v)
}

/// One `MetricValue` as a msgpack map.
pub fn metric_value(v: &MetricValue) -> Value {
    let mut fields = vec![
        (s("current"), s(&v.current)),
        (s("capacity"), v.capacity.as_deref().map_or(Value::Nil, s)),
        (s("pct"), s(&v.pct)),
        (s("unit_hint"), s(v.unit_hint)),
    ];
    fields.extend(v.stats.iter().map(|(k, x)| (s(k), s(x))));
    Value::Map(fields)
}

fn metrics(m: &Metrics) -> Value {
    Value::Map(
        m.iter()
            .map(|(k, metric)| (s(k), metric_value(&metric.value())))
            .collect(),
    )
}

fn pack(v: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).expect("writing to a Vec cannot fail");
    out
}

/// The node's value: `{"node": …, "devices": …}`.
pub fn node_value(snap: &Snapshot) -> Vec<u8> {
    let devices = Value::Map(
        snap.devices
            .iter()
            .map(|(k, per)| {
                let per = per
                    .iter()
                    .map(|(dev, m)| (s(dev), metric_value(&m.value())))
                    .collect();
                (s(k), Value::Map(per))
            })
            .collect(),
    );
    pack(&Value::Map(vec![
        (s("node"), metrics(&snap.node)),
        (s("devices"), devices),
    ]))
}

/// Each kernel's `(key, value)`.
pub fn kernel_values(snap: &Snapshot) -> Vec<(String, Vec<u8>)> {
    snap.kernels
        .iter()
        .map(|(id, m)| (id.clone(), pack(&metrics(m))))
        .collect()
}

/// Each container's `(key, value)`: its processes' metrics by pid.
pub fn process_values(snap: &Snapshot) -> Vec<(String, Vec<u8>)> {
    snap.processes
        .iter()
        .map(|(cid, per_pid)| {
            let table = per_pid
                .iter()
                .map(|(pid, m)| (Value::from(*pid), metrics(m)))
                .collect();
            (cid.clone(), pack(&Value::Map(table)))
        })
        .collect()
}

/// `SET key value EX ttl` for each of `entries` (one pipeline; nothing for none).
///
/// Errors: the [`Failure`] of the pipeline.
pub async fn write(
    conns: &mut Conns,
    entries: &[(String, Vec<u8>)],
    ttl_secs: u64,
) -> Result<(), Failure> {
    if entries.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    for (k, v) in entries {
        pipe.cmd("SET")
            .arg(k)
            .arg(v)
            .arg("EX")
            .arg(ttl_secs.max(1))
            .ignore();
    }
    conns.pipe::<()>(DB, &pipe).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::stats::live::{specs, LiveStats, Measurement};
    use std::time::Instant;

    #[test]
    fn a_kernels_stats_decode_as_metric_values() {
        let live = LiveStats::default();
        let t = Instant::now();
        live.kernel(
            specs::MEM,
            "k1",
            Measurement::with_capacity(512.0, 1024.0),
            t,
        );
        let values = kernel_values(&live.snapshot());
        assert_eq!(values.len(), 1);
        let v = rmpv::decode::read_value(&mut values[0].1.as_slice()).unwrap();
        let mem = v
            .as_map()
            .unwrap()
            .iter()
            .find(|(k, _)| k.as_str() == Some("mem"))
            .unwrap()
            .1
            .clone();
        let field = |name: &str| {
            mem.as_map()
                .unwrap()
                .iter()
                .find(|(k, _)| k.as_str() == Some(name))
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(field("current").as_str(), Some("512"));
        assert_eq!(field("capacity").as_str(), Some("1024"));
        assert_eq!(field("pct").as_str(), Some("50"));
        assert_eq!(field("stats.max").as_str(), Some("512"));
    }
}

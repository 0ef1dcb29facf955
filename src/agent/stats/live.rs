//! Live stats as Backend.AI's agent keeps them for its manager: per metric a current value, a
//! capacity and moving statistics, per node (and device), per kernel and per process — the
//! `StatContext` of upstream's `ai/backend/agent/stats.py` (`Metric`, `MovingStatistics`,
//! `Metric.to_serializable_dict`). The sampler ([`super::sampler`]) feeds it each round; the
//! `valkey` child ([`crate::agent::valkey::stats`]) writes it to Valkey, where the manager's
//! `ValkeyStatClient` reads it (`get_kernel_statistics`, `get_agent_statistics_batch`).
//!
//! Each metric is upstream's: its name, unit hint, which moving statistics it exposes
//! (`stats_filter`) and how its `current` is derived (`current_hook`: the measured value, its
//! rate per second or its difference from the previous sample), as
//! `ai/backend/agent/docker/intrinsic.py` declares them ([`MetricSpec`]).

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use tokio::sync::Notify;

/// How a metric's `current` comes from its samples (upstream's `current_hook`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Current {
    /// The last sample (no hook).
    Value,
    /// The change per second between the last two samples (`metric.stats.rate`); 0 with one.
    Rate,
    /// The change between the last two samples (`metric.stats.diff`); 0 with one.
    Diff,
}

/// Which moving statistics a metric exposes (`stats_filter`), as `stats.<name>` fields.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StatsFilter {
    /// `stats.avg`.
    pub avg: bool,
    /// `stats.max`.
    pub max: bool,
    /// `stats.rate`.
    pub rate: bool,
}

impl StatsFilter {
    /// No statistics.
    pub const NONE: StatsFilter = StatsFilter {
        avg: false,
        max: false,
        rate: false,
    };
    /// `{"max"}`.
    pub const MAX: StatsFilter = StatsFilter {
        avg: false,
        max: true,
        rate: false,
    };
    /// `{"avg", "max"}`.
    pub const AVG_MAX: StatsFilter = StatsFilter {
        avg: true,
        max: true,
        rate: false,
    };
    /// `{"rate"}`.
    pub const RATE: StatsFilter = StatsFilter {
        avg: false,
        max: false,
        rate: true,
    };
}

/// What a metric is: its name, unit hint, statistics and `current`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricSpec {
    /// The metric key (`cpu_util`, `mem`, …).
    pub key: &'static str,
    /// `unit_hint` (`msec`, `millicores`, `bytes`, `bps`, `percent`).
    pub unit_hint: &'static str,
    /// `stats_filter`.
    pub filter: StatsFilter,
    /// `current_hook`.
    pub current: Current,
}

/// Upstream's metrics (`ai/backend/agent/docker/intrinsic.py`; the CUDA ones as the CUDA
/// plugin declares them).
pub mod specs {
    use super::{Current, MetricSpec, StatsFilter};

    /// Node CPU: busy milliseconds summed over CPUs; `current` the busy time of the last
    /// interval, `capacity` the interval in ms (`CPUPlugin.gather_node_measures`).
    pub const NODE_CPU_UTIL: MetricSpec = MetricSpec {
        key: "cpu_util",
        unit_hint: "msec",
        filter: StatsFilter::NONE,
        current: Current::Diff,
    };
    /// Container CPU: its CPU time in ms, `current` per second (millicores), capacity 1000.
    pub const CPU_UTIL: MetricSpec = MetricSpec {
        key: "cpu_util",
        unit_hint: "millicores",
        filter: StatsFilter::AVG_MAX,
        current: Current::Rate,
    };
    /// Container CPU time used, ms, cumulative.
    pub const CPU_USED: MetricSpec = MetricSpec {
        key: "cpu_used",
        unit_hint: "msec",
        filter: StatsFilter::NONE,
        current: Current::Value,
    };
    /// Memory in use, bytes; capacity the total (node) or the limit (container).
    pub const MEM: MetricSpec = MetricSpec {
        key: "mem",
        unit_hint: "bytes",
        filter: StatsFilter::MAX,
        current: Current::Value,
    };
    /// Bytes read from block devices, cumulative.
    pub const IO_READ: MetricSpec = MetricSpec {
        key: "io_read",
        unit_hint: "bytes",
        filter: StatsFilter::RATE,
        current: Current::Value,
    };
    /// Bytes written to block devices, cumulative.
    pub const IO_WRITE: MetricSpec = MetricSpec {
        key: "io_write",
        unit_hint: "bytes",
        filter: StatsFilter::RATE,
        current: Current::Value,
    };
    /// Bytes received; `current` per second.
    pub const NET_RX: MetricSpec = MetricSpec {
        key: "net_rx",
        unit_hint: "bps",
        filter: StatsFilter::NONE,
        current: Current::Rate,
    };
    /// Bytes sent; `current` per second.
    pub const NET_TX: MetricSpec = MetricSpec {
        key: "net_tx",
        unit_hint: "bps",
        filter: StatsFilter::NONE,
        current: Current::Rate,
    };
    /// GPU memory in use, bytes.
    pub const CUDA_MEM: MetricSpec = MetricSpec {
        key: "cuda_mem",
        unit_hint: "bytes",
        filter: StatsFilter::MAX,
        current: Current::Value,
    };
    /// GPU utilization, %.
    pub const CUDA_UTIL: MetricSpec = MetricSpec {
        key: "cuda_util",
        unit_hint: "percent",
        filter: StatsFilter::AVG_MAX,
        current: Current::Value,
    };
}

/// One sample: a value and, when the source knows one, a capacity.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Measurement {
    /// The value, in the metric's unit.
    pub value: f64,
    /// The capacity, when known.
    pub capacity: Option<f64>,
}

impl Measurement {
    /// A value without a capacity.
    pub fn of(value: f64) -> Measurement {
        Measurement {
            value,
            capacity: None,
        }
    }

    /// A value with its capacity.
    pub fn with_capacity(value: f64, capacity: f64) -> Measurement {
        Measurement {
            value,
            capacity: Some(capacity),
        }
    }
}

/// A metric and its moving statistics over every sample since it appeared (upstream's `Metric`
/// with its `MovingStatistics`).
#[derive(Clone, Debug)]
pub struct Metric {
    spec: MetricSpec,
    current: f64,
    capacity: Option<f64>,
    min: f64,
    max: f64,
    sum: f64,
    count: u64,
    /// The last two samples and when they were taken.
    last: [Option<(f64, Instant)>; 2],
}

impl Metric {
    /// A metric from its first sample. `capacity_fallback`: a sample without a capacity makes
    /// the value its capacity (upstream's container and process metrics: `capacity=measure.
    /// capacity or measure.value`; node metrics keep none).
    pub fn new(spec: MetricSpec, first: Measurement, capacity_fallback: bool, at: Instant) -> Self {
        let mut m = Metric {
            spec,
            current: first.value,
            capacity: first.capacity.or(capacity_fallback.then_some(first.value)),
            min: first.value,
            max: first.value,
            sum: first.value,
            count: 1,
            last: [None, Some((first.value, at))],
        };
        m.current = m.hooked();
        m
    }

    /// Takes a new sample (`Metric.update`): a capacity it carries replaces the old one.
    pub fn update(&mut self, sample: Measurement, at: Instant) {
        if let Some(c) = sample.capacity {
            self.capacity = Some(c);
        }
        self.min = self.min.min(sample.value);
        self.max = self.max.max(sample.value);
        self.sum += sample.value;
        self.count += 1;
        self.last = [self.last[1], Some((sample.value, at))];
        self.current = sample.value;
        self.current = self.hooked();
    }

    fn hooked(&self) -> f64 {
        match self.spec.current {
            Current::Value => self.current,
            Current::Rate => self.rate(),
            Current::Diff => self.diff(),
        }
    }

    /// The change between the last two samples; 0 with one, or when the counter went back
    /// (a restarted container).
    fn diff(&self) -> f64 {
        match self.last {
            [Some((a, _)), Some((b, _))] if b >= a => b - a,
            _ => 0.0,
        }
    }

    /// [`Self::diff`] per second between the two samples.
    fn rate(&self) -> f64 {
        match self.last {
            [Some((a, ta)), Some((b, tb))] if b >= a => {
                let secs = tb.duration_since(ta).as_secs_f64();
                if secs > 0.0 {
                    (b - a) / secs
                } else {
                    0.0
                }
            }
            _ => 0.0,
        }
    }

    /// What it is.
    pub fn spec(&self) -> MetricSpec {
        self.spec
    }

    /// Upstream's `MetricValue` (`Metric.to_serializable_dict`): `current`, `capacity` (or
    /// none), `pct` (of the capacity, 2 decimals; `"0.00"` without one), `unit_hint` and
    /// `stats.<name>` for each statistic of the filter; numbers as decimal strings with at
    /// most 3 decimals and no trailing zeros.
    pub fn value(&self) -> MetricValue {
        let pct = match self.capacity {
            Some(c) if c.is_normal() && c > 0.0 => decimal(self.current / c * 100.0, 2),
            _ => "0.00".to_owned(),
        };
        let mut stats = Vec::new();
        let f = self.spec.filter;
        if f.max {
            stats.push(("stats.max", decimal(self.max, 3)));
        }
        if f.avg {
            stats.push(("stats.avg", decimal(self.sum / self.count as f64, 3)));
        }
        if f.rate {
            stats.push(("stats.rate", decimal(self.rate(), 3)));
        }
        MetricValue {
            current: decimal(self.current, 3),
            capacity: self.capacity.map(|c| decimal(c, 3)),
            pct,
            unit_hint: self.spec.unit_hint,
            stats,
        }
    }
}

/// One metric as the manager reads it (`ai.backend.common.types.MetricValue`).
#[derive(Clone, Debug, PartialEq)]
pub struct MetricValue {
    /// `current`.
    pub current: String,
    /// `capacity`, `None` for none.
    pub capacity: Option<String>,
    /// `pct`.
    pub pct: String,
    /// `unit_hint`.
    pub unit_hint: &'static str,
    /// `stats.<name>` fields, as the filter names them.
    pub stats: Vec<(&'static str, String)>,
}

/// `v` as upstream's `_to_serializable_value`: rounded to `places` decimals, then without
/// trailing zeros (`"12.5"`, `"1024"`, `"0"`); `pct` keeps its two places only when they are
/// not zeros (`"12.35"`, `"100"`). Not finite: `"0"`.
pub fn decimal(v: f64, places: usize) -> String {
    if !v.is_finite() {
        return "0".to_owned();
    }
    let s = format!("{v:.places$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    } else {
        s
    };
    if s == "-0" {
        "0".to_owned()
    } else {
        s
    }
}

/// Metrics by key.
pub type Metrics = BTreeMap<&'static str, Metric>;

/// What the sampler knows now, for the Valkey writer.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Node metrics.
    pub node: Metrics,
    /// Device metrics: key → device id → metric.
    pub devices: BTreeMap<&'static str, BTreeMap<String, Metric>>,
    /// Kernel metrics by kernel id (running kernels only).
    pub kernels: BTreeMap<String, Metrics>,
    /// Process metrics by container id, then host pid.
    pub processes: BTreeMap<String, BTreeMap<u32, Metrics>>,
}

/// The live stats of the agent, shared by the sampler (writer) and the Valkey writer (reader).
#[derive(Debug, Default)]
pub struct LiveStats {
    tables: Mutex<Snapshot>,
    /// Notified after each node round.
    pub node_round: Notify,
    /// Notified after each container round.
    pub container_round: Notify,
    /// Notified after each process round.
    pub process_round: Notify,
}

fn observe(metrics: &mut Metrics, spec: MetricSpec, m: Measurement, fallback: bool, at: Instant) {
    match metrics.get_mut(spec.key) {
        Some(metric) => metric.update(m, at),
        None => {
            metrics.insert(spec.key, Metric::new(spec, m, fallback, at));
        }
    }
}

impl LiveStats {
    fn tables(&self) -> MutexGuard<'_, Snapshot> {
        self.tables.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A node sample of `spec` (no capacity fallback, as upstream's node metrics).
    pub fn node(&self, spec: MetricSpec, m: Measurement, at: Instant) {
        observe(&mut self.tables().node, spec, m, false, at);
    }

    /// A device sample of `spec` for device `device`.
    pub fn device(&self, spec: MetricSpec, device: &str, m: Measurement, at: Instant) {
        let mut t = self.tables();
        let per = t.devices.entry(spec.key).or_default();
        match per.get_mut(device) {
            Some(metric) => metric.update(m, at),
            None => {
                per.insert(device.to_owned(), Metric::new(spec, m, false, at));
            }
        }
    }

    /// A kernel sample of `spec` for kernel `kernel_id`.
    pub fn kernel(&self, spec: MetricSpec, kernel_id: &str, m: Measurement, at: Instant) {
        let mut t = self.tables();
        let metrics = t.kernels.entry(kernel_id.to_owned()).or_default();
        observe(metrics, spec, m, true, at);
    }

    /// A process sample of `spec` for host pid `pid` of container `container_id`.
    pub fn process(
        &self,
        spec: MetricSpec,
        container_id: &str,
        pid: u32,
        m: Measurement,
        at: Instant,
    ) {
        let mut t = self.tables();
        let metrics = t
            .processes
            .entry(container_id.to_owned())
            .or_default()
            .entry(pid)
            .or_default();
        observe(metrics, spec, m, true, at);
    }

    /// Keeps only the kernels in `live` (their ids) and the containers in `containers`.
    pub fn retain_kernels(&self, live: &dyn Fn(&str) -> bool, containers: &dyn Fn(&str) -> bool) {
        let mut t = self.tables();
        t.kernels.retain(|k, _| live(k));
        t.processes.retain(|c, _| containers(c));
    }

    /// Keeps only the pids of container `container_id` in `alive`.
    pub fn retain_processes(&self, container_id: &str, alive: &dyn Fn(u32) -> bool) {
        if let Some(p) = self.tables().processes.get_mut(container_id) {
            p.retain(|pid, _| alive(*pid));
        }
    }

    /// A copy of everything now.
    pub fn snapshot(&self) -> Snapshot {
        self.tables().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn decimals_are_written_as_upstream_writes_them() {
        assert_eq!(decimal(12.5, 3), "12.5");
        assert_eq!(decimal(1024.0, 3), "1024");
        assert_eq!(decimal(0.0, 3), "0");
        assert_eq!(decimal(-0.0001, 3), "0");
        assert_eq!(decimal(12.345_678, 2), "12.35");
        assert_eq!(decimal(100.0, 2), "100");
        assert_eq!(decimal(f64::NAN, 3), "0");
    }

    #[test]
    fn a_rate_metric_is_zero_until_its_second_sample_then_per_second() {
        let t0 = Instant::now();
        let mut m = Metric::new(
            specs::CPU_UTIL,
            Measurement::with_capacity(5_000.0, 1_000.0),
            true,
            t0,
        );
        assert_eq!(m.value().current, "0");
        m.update(
            Measurement::with_capacity(5_500.0, 1_000.0),
            t0 + Duration::from_secs(2),
        );
        let v = m.value();
        // 500 ms of CPU over 2 s: 250 millicores, 25 % of one core.
        assert_eq!(v.current, "250");
        assert_eq!(v.capacity.as_deref(), Some("1000"));
        assert_eq!(v.pct, "25");
        assert_eq!(v.unit_hint, "millicores");
        assert_eq!(
            v.stats,
            vec![
                ("stats.max", "5500".to_owned()),
                ("stats.avg", "5250".to_owned())
            ]
        );
    }

    #[test]
    fn capacity_falls_back_to_the_first_value_for_kernels_only() {
        let t0 = Instant::now();
        let k = Metric::new(specs::NET_RX, Measurement::of(100.0), true, t0);
        assert_eq!(k.value().capacity.as_deref(), Some("100"));
        let n = Metric::new(specs::NET_RX, Measurement::of(100.0), false, t0);
        assert_eq!(n.value().capacity, None);
        assert_eq!(n.value().pct, "0.00");
    }

    #[test]
    fn a_counter_that_goes_back_counts_zero() {
        let t0 = Instant::now();
        let mut m = Metric::new(specs::NODE_CPU_UTIL, Measurement::of(900.0), false, t0);
        m.update(Measurement::of(100.0), t0 + Duration::from_secs(1));
        assert_eq!(m.value().current, "0");
        m.update(Measurement::of(400.0), t0 + Duration::from_secs(2));
        assert_eq!(m.value().current, "300");
    }
}

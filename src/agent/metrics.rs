//! The agent's Prometheus metrics: Backend.AI's agent metric names and labels exactly (`docs/design.md`) (an interface that
//! dashboards and alerts are written against), plus kernelvisor's own under `kernelvisor_`.
//!
//! One [`AgentMetrics`] per agent, each with its own registry (several agents may share a test
//! process). Served as Prometheus text on `[agent] service-addr` `/metrics` (server.rs).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use prometheus::{
    Encoder, Gauge, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry,
    TextEncoder,
};

/// `backendai_rpc_request_duration_seconds` buckets, seconds (Backend.AI's agent).
pub const RPC_BUCKETS: [f64; 10] = [0.001, 0.01, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0];

/// Stage setup/teardown duration buckets, seconds (image pulls may take minutes).
const STAGE_BUCKETS: [f64; 12] = [
    0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 60.0, 300.0,
];

/// Labels of one kernel's `backendai_container_utilization` series, in the seed's order
/// after `container_metric_name`: agent_id, kernel_id, session_id, user_id, project_id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelLabels {
    /// Kernel id.
    pub kernel_id: String,
    /// Session id.
    pub session_id: String,
    /// Owner's user id (empty when the kernel config had none).
    pub user_id: String,
    /// Owner's project id (empty when none).
    pub project_id: String,
}

/// Every metric of one agent.
pub struct AgentMetrics {
    agent_id: String,
    families: Families,
    rpc_requests: IntCounterVec,
    rpc_failures: IntCounterVec,
    rpc_duration: HistogramVec,
    container: GaugeVec,
    device: GaugeVec,
    sync_trigger: IntCounterVec,
    sync_success: IntCounterVec,
    sync_failure: IntCounterVec,
    stat_trigger: IntCounterVec,
    stat_success: IntCounterVec,
    stat_failure: IntCounterVec,
    heartbeat: Gauge,
    kernel_count: IntGauge,
    stage_duration: HistogramVec,
    stage_failures: IntCounterVec,
    kernel_restarts: IntCounterVec,
    grace_kills: IntCounterVec,
    create_retries: IntCounterVec,
    outbox_depth: IntGauge,
    bus_outbox_depth: IntGauge,
    bus_published: IntCounterVec,
    bus_failures: IntCounterVec,
    valkey_writes: IntCounterVec,
    valkey_failures: IntCounterVec,
    image_pulls: IntCounterVec,
    exec_runs: IntGauge,
    exec_buffered: IntGauge,
    engine_up: IntGauge,
    outbox_capacity: IntGauge,
    outbox_dropped: IntCounterVec,
    outbox_write_failures: IntCounterVec,
    events_sent: IntCounterVec,
    events_deduplicated: IntCounterVec,
    event_send_failures: IntCounterVec,
    heartbeat_failures: IntCounterVec,
    stat_round: HistogramVec,
    container_samples: IntCounterVec,
    /// `(container_metric_name, value_type)` pairs set per kernel, so they can be removed.
    kernel_series: Mutex<HashMap<KernelLabels, Vec<(&'static str, &'static str)>>>,
}

/// A counter exposed as `<name>_total`, as Python's prometheus_client (Backend.AI's) does and
/// as Backend.AI's queries expect (`rate(backendai_rpc_requests_total[5m])`).
/// A registry that remembers every family's name, help and type, to declare empty ones.
struct Families {
    registry: Registry,
    declared: Mutex<Vec<(String, String, &'static str)>>,
}

impl Families {
    fn add(
        &self,
        c: Box<dyn prometheus::core::Collector>,
        name: &str,
        help: &str,
        kind: &'static str,
    ) {
        self.registry.register(c).expect("unique metric");
        self.declared
            .lock()
            .expect("families lock")
            .push((name.to_owned(), help.to_owned(), kind));
    }
}

fn counter(r: &Families, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let name = format!("{name}_total");
    let c = IntCounterVec::new(Opts::new(&name, help), labels).expect("valid counter");
    r.add(Box::new(c.clone()), &name, help, "counter");
    c
}

fn gauge_vec(r: &Families, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid gauge");
    r.add(Box::new(g.clone()), name, help, "gauge");
    g
}

fn histogram(
    r: &Families,
    name: &str,
    help: &str,
    labels: &[&str],
    buckets: &[f64],
) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(buckets.to_vec()),
        labels,
    )
    .expect("valid histogram");
    r.add(Box::new(h.clone()), name, help, "histogram");
    h
}

impl AgentMetrics {
    /// Registers every metric for agent `agent_id`.
    pub fn new(agent_id: &str) -> AgentMetrics {
        let r = Families {
            registry: Registry::new(),
            declared: Mutex::new(Vec::new()),
        };
        let gauge = |name: &str, help: &str| {
            let g = Gauge::new(name, help).expect("valid gauge");
            r.add(Box::new(g.clone()), name, help, "gauge");
            g
        };
        let int_gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid gauge");
            r.add(Box::new(g.clone()), name, help, "gauge");
            g
        };
        let heartbeat = gauge(
            "backendai_agent_heartbeat",
            "Unix time (seconds) of the agent's last heartbeat",
        );
        let kernel_count = int_gauge(
            "backendai_kernel_count",
            "Number of running kernels on the agent (set every container sampling round)",
        );
        let outbox_depth = int_gauge(
            "kernelvisor_outbox_depth",
            "Events in the durable outbox not yet acked by the manager",
        );
        let bus_outbox_depth = int_gauge(
            "kernelvisor_bus_outbox_depth",
            "Events in the durable bus outbox not yet accepted by Backend.AI's Redis ([redis])",
        );
        let outbox_capacity = int_gauge(
            "kernelvisor_outbox_capacity",
            "Most events the outbox keeps ([manager] outbox-max-events)",
        );
        let exec_runs = int_gauge(
            "kernelvisor_exec_runs",
            "execute runs held (running, or ended with output not yet read)",
        );
        let exec_buffered = int_gauge(
            "kernelvisor_exec_buffered_bytes",
            "Unread execute output held over all runs (each at most [agent] exec-buffer-size)",
        );
        let engine_up = int_gauge(
            "kernelvisor_agent_engine_up",
            "1 while the container engine answers, 0 while the agent sees it down",
        );
        AgentMetrics {
            agent_id: agent_id.to_owned(),
            rpc_requests: counter(
                &r,
                "backendai_rpc_requests",
                "Total RPC requests processed by the agent",
                &["method"],
            ),
            rpc_failures: counter(
                &r,
                "backendai_rpc_failure_requests",
                "Failed RPC requests",
                &["method", "exception"],
            ),
            rpc_duration: histogram(
                &r,
                "backendai_rpc_request_duration_seconds",
                "RPC request processing time in seconds",
                &["method"],
                &RPC_BUCKETS,
            ),
            container: gauge_vec(
                &r,
                "backendai_container_utilization",
                "Container resource utilization per kernel",
                &[
                    "container_metric_name",
                    "agent_id",
                    "kernel_id",
                    "session_id",
                    "user_id",
                    "project_id",
                    "value_type",
                ],
            ),
            device: gauge_vec(
                &r,
                "backendai_device_utilization",
                "Physical device utilization on the agent node",
                &["device_metric_name", "agent_id", "device_id", "value_type"],
            ),
            sync_trigger: counter(
                &r,
                "backendai_sync_container_lifecycle_trigger_count",
                "Container lifecycle syncs triggered",
                &["agent_id"],
            ),
            sync_success: counter(
                &r,
                "backendai_sync_container_lifecycle_success_count",
                "Kernels synchronized successfully",
                &["agent_id"],
            ),
            sync_failure: counter(
                &r,
                "backendai_sync_container_lifecycle_failure_count",
                "Failed container lifecycle syncs",
                &["agent_id", "exception"],
            ),
            stat_trigger: counter(
                &r,
                "backendai_stat_task_trigger_count",
                "Statistics collections triggered",
                &["agent_id", "stat_scope"],
            ),
            stat_success: counter(
                &r,
                "backendai_stat_task_success_count",
                "Statistics collections that succeeded",
                &["agent_id", "stat_scope"],
            ),
            stat_failure: counter(
                &r,
                "backendai_stat_task_failure_count",
                "Statistics collections that failed",
                &["agent_id", "stat_scope", "exception"],
            ),
            stage_duration: histogram(
                &r,
                "kernelvisor_stage_duration_seconds",
                "Kernel stage setup/teardown time in seconds",
                &["stage", "phase"],
                &STAGE_BUCKETS,
            ),
            stage_failures: counter(
                &r,
                "kernelvisor_stage_failures",
                "Kernel stage setups/teardowns that failed",
                &["stage", "phase"],
            ),
            kernel_restarts: counter(
                &r,
                "kernelvisor_kernel_restarts",
                "Kernel containers restarted by their restart policy, by why the container ended.",
                &["reason"],
            ),
            grace_kills: counter(
                &r,
                "kernelvisor_agent_grace_kills",
                "Kernel containers killed (SIGKILL) at the end of their grace period, their \
                 workload still running after its stop signal.",
                &[],
            ),
            create_retries: counter(
                &r,
                "kernelvisor_create_kernels_retries",
                "Kernels named again by a create_kernels retry, by how they were answered \
                 (joined: still being created; running: answered as they run, kernel_started \
                 sent again)",
                &["answer"],
            ),
            outbox_dropped: counter(
                &r,
                "kernelvisor_outbox_dropped_events",
                "Events dropped because the outbox was full",
                &["policy"],
            ),
            outbox_write_failures: counter(
                &r,
                "kernelvisor_outbox_write_failures",
                "Failed attempts to write events to the outbox (retried: nothing is lost), by cause",
                &["cause"],
            ),
            events_sent: counter(
                &r,
                "kernelvisor_events_sent",
                "Events acked by the manager",
                &["agent_id"],
            ),
            events_deduplicated: counter(
                &r,
                "kernelvisor_events_deduplicated",
                "Events not enqueued because the kernel's state did not change",
                &["agent_id"],
            ),
            event_send_failures: counter(
                &r,
                "kernelvisor_event_send_failures",
                "Failed attempts to deliver an event batch",
                &["reason"],
            ),
            bus_published: {
                let c = counter(
                    &r,
                    "kernelvisor_bus_events_published",
                    "Events Backend.AI's Redis accepted from the bus outbox (each once)",
                    &[],
                );
                c.with_label_values(&[]).inc_by(0);
                c
            },
            bus_failures: counter(
                &r,
                "kernelvisor_bus_publish_failures",
                "Failed attempts to publish on Backend.AI's bus (retried), by reason",
                &["reason"],
            ),
            valkey_writes: counter(
                &r,
                "kernelvisor_valkey_writes",
                "Writes of Backend.AI's side channels Valkey accepted, by channel",
                &["channel"],
            ),
            valkey_failures: counter(
                &r,
                "kernelvisor_valkey_write_failures",
                "Writes of Backend.AI's side channels that failed (written again on the channel's next turn), by channel and reason",
                &["channel", "reason"],
            ),
            image_pulls: counter(
                &r,
                "kernelvisor_image_pulls",
                "Image pulls the engine ran (one per image however many kernels wait), by result",
                &["result"],
            ),
            heartbeat_failures: counter(
                &r,
                "kernelvisor_heartbeat_failures",
                "Heartbeats the manager did not take",
                &["reason"],
            ),
            stat_round: histogram(
                &r,
                "kernelvisor_stat_round_duration_seconds",
                "Wall time of one sampling round",
                &["stat_scope"],
                &[0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0],
            ),
            container_samples: counter(
                &r,
                "kernelvisor_container_samples",
                "Container samples read, by source (cgroup files or the engine's stats API)",
                &["source"],
            ),
            heartbeat,
            kernel_count,
            outbox_depth,
            bus_outbox_depth,
            outbox_capacity,
            exec_runs,
            exec_buffered,
            engine_up,
            kernel_series: Mutex::new(HashMap::new()),
            families: r,
        }
    }

    /// The agent id every agent-scoped label carries.
    pub fn agent_id(&self) -> &str {
        &self.agent_id
    }

    /// The whole registry in Prometheus text format 0.0.4. A family without samples yet (a
    /// failure counter that never counted) is still declared by its `# HELP` and `# TYPE`
    /// lines, as Python's prometheus_client (Backend.AI's) does, so dashboards see it exists.
    pub fn render(&self) -> String {
        let families = self.families.registry.gather();
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&families, &mut buf)
            .expect("text encoding cannot fail");
        let mut text = String::from_utf8(buf).expect("prometheus text is UTF-8");
        let present: std::collections::HashSet<&str> =
            families.iter().map(|f| f.get_name()).collect();
        for (name, help, kind) in self.families.declared.lock().expect("families lock").iter() {
            if !present.contains(name.as_str()) {
                text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
            }
        }
        text
    }

    /// One RPC request handled: `exception` is the FAILURE name when it failed.
    pub fn rpc_request(&self, method: &str, duration: Duration, exception: Option<&str>) {
        self.rpc_requests.with_label_values(&[method]).inc();
        self.rpc_duration
            .with_label_values(&[method])
            .observe(duration.as_secs_f64());
        if let Some(e) = exception {
            self.rpc_failures.with_label_values(&[method, e]).inc();
        }
    }

    /// Sets one kernel series of `backendai_container_utilization`.
    pub fn set_container(
        &self,
        kernel: &KernelLabels,
        metric: &'static str,
        value_type: &'static str,
        value: f64,
    ) {
        let a = &self.agent_id;
        self.container
            .with_label_values(&[
                metric,
                a,
                &kernel.kernel_id,
                &kernel.session_id,
                &kernel.user_id,
                &kernel.project_id,
                value_type,
            ])
            .set(value);
        let mut series = self.kernel_series.lock().expect("kernel series lock");
        let set = series.entry(kernel.clone()).or_default();
        if !set.contains(&(metric, value_type)) {
            set.push((metric, value_type));
        }
    }

    /// Removes every series of a kernel (it terminated). Returns how many were removed.
    pub fn remove_kernel(&self, kernel: &KernelLabels) -> usize {
        let Some(set) = self
            .kernel_series
            .lock()
            .expect("kernel series lock")
            .remove(kernel)
        else {
            return 0;
        };
        let a = &self.agent_id;
        for (metric, value_type) in &set {
            let _ = self.container.remove_label_values(&[
                metric,
                a,
                &kernel.kernel_id,
                &kernel.session_id,
                &kernel.user_id,
                &kernel.project_id,
                value_type,
            ]);
        }
        set.len()
    }

    /// The kernels that currently have series.
    pub fn kernels_with_series(&self) -> Vec<KernelLabels> {
        self.kernel_series
            .lock()
            .expect("kernel series lock")
            .keys()
            .cloned()
            .collect()
    }

    /// Sets one series of `backendai_device_utilization`.
    pub fn set_device(&self, metric: &str, device_id: &str, value_type: &str, value: f64) {
        self.device
            .with_label_values(&[metric, &self.agent_id, device_id, value_type])
            .set(value);
    }

    /// A container lifecycle sync (reconcile) ran: `synced` kernels checked, or it failed.
    pub fn lifecycle_sync(&self, result: Result<u64, &str>) {
        let a = &self.agent_id;
        self.sync_trigger.with_label_values(&[a]).inc();
        match result {
            Ok(n) => self.sync_success.with_label_values(&[a]).inc_by(n),
            Err(e) => self.sync_failure.with_label_values(&[a, e]).inc(),
        }
    }

    /// One stats collection of `scope` (`node`, `container`, `device`) ran in `duration`.
    pub fn stat_task(&self, scope: &str, duration: Duration, result: Result<(), &str>) {
        let a = &self.agent_id;
        self.stat_trigger.with_label_values(&[a, scope]).inc();
        self.stat_round
            .with_label_values(&[scope])
            .observe(duration.as_secs_f64());
        match result {
            Ok(()) => self.stat_success.with_label_values(&[a, scope]).inc(),
            Err(e) => self.stat_failure.with_label_values(&[a, scope, e]).inc(),
        }
    }

    /// One container sample read from `source` (`cgroup` or `engine`).
    pub fn container_sampled(&self, source: &str) {
        self.container_samples.with_label_values(&[source]).inc();
    }

    /// A heartbeat was produced at `unix_secs`.
    pub fn heartbeat(&self, unix_secs: f64) {
        self.heartbeat.set(unix_secs);
    }

    /// A heartbeat could not be delivered.
    pub fn heartbeat_failed(&self, reason: &str) {
        self.heartbeat_failures.with_label_values(&[reason]).inc();
    }

    /// The number of running kernels (the stats sampler's container round owns it).
    pub fn kernel_count(&self, n: usize) {
        self.kernel_count.set(n as i64);
    }

    /// One stage operation of a kernel; `phase` is `setup` or `teardown`.
    pub fn stage(&self, stage: &str, phase: &str, duration: Duration, failed: bool) {
        self.stage_duration
            .with_label_values(&[stage, phase])
            .observe(duration.as_secs_f64());
        if failed {
            self.stage_failures.with_label_values(&[stage, phase]).inc();
        }
    }

    /// A kernel's restart policy restarted its container, which ended with `reason`
    /// (`self-terminated`, `oom-killed`, `unhealthy`, …).
    pub fn kernel_restarted(&self, reason: &str) {
        self.kernel_restarts.with_label_values(&[reason]).inc();
    }

    /// A kernel's container killed at its grace period's deadline.
    pub fn grace_killed(&self) {
        self.grace_kills.with_label_values(&[]).inc();
    }

    /// A kernel named again by a `create_kernels` retry, answered `joined` (its creation was
    /// still going on) or `running`.
    pub fn create_retried(&self, answer: &str) {
        self.create_retries.with_label_values(&[answer]).inc();
    }

    /// The outbox holds `depth` events of at most `capacity`.
    pub fn outbox(&self, depth: i64, capacity: i64) {
        self.outbox_depth.set(depth);
        self.outbox_capacity.set(capacity);
    }

    /// The bus outbox holds `depth` events (`kernelvisor_bus_outbox_depth`).
    pub fn bus_outbox(&self, depth: i64) {
        self.bus_outbox_depth.set(depth);
    }

    /// `n` events accepted by Backend.AI's Redis (`kernelvisor_bus_events_published_total`).
    pub fn bus_published(&self, n: u64) {
        self.bus_published.with_label_values(&[]).inc_by(n);
    }

    /// A failed publish on the bus: `reason` is `connect`, `io`, `rejected`, `outbox` or
    /// `encode` (`kernelvisor_bus_publish_failures_total{reason}`).
    pub fn bus_publish_failed(&self, reason: &str) {
        self.bus_failures.with_label_values(&[reason]).inc();
    }

    /// One write of side channel `channel` (`presence`, `images`, `node-stats`,
    /// `kernel-stats`, `process-stats`, `bgtask`) accepted by Valkey
    /// (`kernelvisor_valkey_writes_total{channel}`).
    pub fn valkey_written(&self, channel: &str) {
        self.valkey_writes.with_label_values(&[channel]).inc();
    }

    /// A failed write of side channel `channel`: `reason` is `connect`, `io` or `rejected`
    /// (`kernelvisor_valkey_write_failures_total{channel,reason}`).
    pub fn valkey_write_failed(&self, channel: &str, reason: &str) {
        self.valkey_failures
            .with_label_values(&[channel, reason])
            .inc();
    }

    /// An engine pull of an image ended: `result` is `pulled`, `not-found`, `unreachable`,
    /// `auth-failed`, `timeout` or `error` (`kernelvisor_image_pulls_total{result}`).
    pub fn image_pulled(&self, result: &str) {
        self.image_pulls.with_label_values(&[result]).inc();
    }

    /// `runs` execute runs are held with `buffered` bytes of unread output in all.
    pub fn exec_runs(&self, runs: usize, buffered: usize) {
        self.exec_runs.set(runs as i64);
        self.exec_buffered.set(buffered as i64);
    }

    /// The container engine answers (`true`) or not (`kernelvisor_agent_engine_up`).
    pub fn engine_up(&self, up: bool) {
        self.engine_up.set(i64::from(up));
    }

    /// `n` events dropped by a full outbox; `policy` says which (`superseded`, `newest`).
    pub fn outbox_dropped(&self, policy: &str, n: u64) {
        self.outbox_dropped.with_label_values(&[policy]).inc_by(n);
    }

    /// A failed outbox write; `cause` is `locked` for SQLite's busy errors, else `other`.
    pub fn outbox_write_failed(&self, cause: &str) {
        self.outbox_write_failures.with_label_values(&[cause]).inc();
    }

    /// `n` events acked by the manager.
    pub fn events_sent(&self, n: u64) {
        self.events_sent
            .with_label_values(&[&self.agent_id])
            .inc_by(n);
    }

    /// An event not enqueued because it repeated the kernel's last state.
    pub fn event_deduplicated(&self) {
        self.events_deduplicated
            .with_label_values(&[&self.agent_id])
            .inc();
    }

    /// A batch delivery failed: `reason` is `connect`, `timeout`, `disconnected`, `rejected`.
    pub fn event_send_failed(&self, reason: &str) {
        self.event_send_failures.with_label_values(&[reason]).inc();
    }
}

impl crate::rpc::RequestObserver for AgentMetrics {
    fn observe(&self, method: &str, duration: Duration, failure: Option<&str>) {
        self.rpc_request(method, duration, failure);
    }
}

/// Reports kernel stages' setup and teardown durations ([`actors::StageHook`]) to the metrics,
/// and logs each with the kernel's id.
pub struct StageMetricsHook {
    /// The agent's metrics.
    pub metrics: std::sync::Arc<AgentMetrics>,
    /// Whose stages these are (for the log lines).
    pub kernel_id: String,
}

impl actors::StageHook for StageMetricsHook {
    fn on_setup(
        &self,
        stage: &'static str,
        duration: Duration,
        result: Result<(), &actors::BoxError>,
    ) {
        self.metrics
            .stage(stage, "setup", duration, result.is_err());
        tracing::debug!(agent_id = %self.metrics.agent_id, kernel_id = %self.kernel_id, stage, ms = duration.as_secs_f64() * 1e3, error = result.err().map(|e| e.to_string()), "stage setup");
    }

    fn on_teardown(
        &self,
        stage: &'static str,
        duration: Duration,
        result: Result<(), &actors::BoxError>,
    ) {
        self.metrics
            .stage(stage, "teardown", duration, result.is_err());
        tracing::debug!(agent_id = %self.metrics.agent_id, kernel_id = %self.kernel_id, stage, ms = duration.as_secs_f64() * 1e3, error = result.err().map(|e| e.to_string()), "stage teardown");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel() -> KernelLabels {
        KernelLabels {
            kernel_id: "k1".into(),
            session_id: "s1".into(),
            user_id: "u".into(),
            project_id: "p".into(),
        }
    }

    #[test]
    fn kernel_series_disappear_on_removal() {
        let m = AgentMetrics::new("a1");
        m.set_container(&kernel(), "cpu_util", "current", 42.0);
        m.set_container(&kernel(), "mem", "current", 1.0);
        m.set_container(&kernel(), "mem", "current", 2.0);
        let text = m.render();
        assert!(text.contains(r#"backendai_container_utilization{agent_id="a1",container_metric_name="cpu_util",kernel_id="k1",project_id="p",session_id="s1",user_id="u",value_type="current"} 42"#), "{text}");
        assert_eq!(m.remove_kernel(&kernel()), 2);
        assert!(!m.render().contains("kernel_id=\"k1\""));
        assert_eq!(m.remove_kernel(&kernel()), 0);
    }

    #[test]
    fn rpc_histogram_has_the_seed_buckets() {
        let m = AgentMetrics::new("a1");
        m.rpc_request("ping", Duration::from_millis(3), None);
        m.rpc_request(
            "create_kernels",
            Duration::from_secs(2),
            Some("ResourceExhausted"),
        );
        let text = m.render();
        for le in [
            "0.001", "0.01", "0.1", "0.5", "1", "2", "5", "10", "30", "60", "+Inf",
        ] {
            assert!(
                text.contains(&format!(
                    r#"backendai_rpc_request_duration_seconds_bucket{{method="ping",le="{le}"}}"#
                )),
                "{le}: {text}"
            );
        }
        assert!(text.contains(r#"backendai_rpc_failure_requests_total{exception="ResourceExhausted",method="create_kernels"} 1"#));
        assert!(text.contains(r#"backendai_rpc_requests_total{method="create_kernels"} 1"#));
    }
}

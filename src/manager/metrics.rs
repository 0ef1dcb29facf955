//! The manager's Prometheus metrics (`GET /metrics` on the API). All under `kernelvisor_manager_`;
//! counters end in `_total`. Gauges that describe current state (agents by status, pool
//! entries, live kernels) are set when scraped.

use std::time::Duration;

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Buckets of agent RPC latency, seconds (a ping is ~0.3 ms; `create_kernels` seconds).
const RPC_BUCKETS: [f64; 12] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0,
];

/// Every manager metric.
pub struct ManagerMetrics {
    registry: Registry,
    /// `kernelvisor_manager_agents{status}`: agents by `ALIVE`/`LOST`/`PENDING`/`TERMINATED`.
    pub agents: IntGaugeVec,
    /// `kernelvisor_manager_pool_entries{state}`: `connecting`, `healthy`, `unhealthy`, `known`.
    pub pool_entries: IntGaugeVec,
    /// `kernelvisor_manager_pool_last_sweep_seconds`: wall time of the newest health-check sweep.
    pub pool_last_sweep: prometheus::Gauge,
    /// `kernelvisor_manager_pool_last_sweep_entries`: entries that sweep pinged.
    pub pool_last_sweep_entries: prometheus::IntGauge,
    /// `kernelvisor_manager_live_kernels`: kernels in the live set.
    pub live_kernels: IntGaugeVec,
    /// `kernelvisor_manager_agent_rpc_duration_seconds{method}`.
    pub rpc_duration: HistogramVec,
    /// `kernelvisor_manager_agent_rpc_failures_total{method, kind}` (`connection`, `failure`, `unavailable`).
    pub rpc_failures: IntCounterVec,
    /// `kernelvisor_manager_events_applied_total{name}`.
    pub events_applied: IntCounterVec,
    /// `kernelvisor_manager_events_duplicate_total`: resent ids acked without re-applying.
    pub events_duplicate: IntCounter,
    /// `kernelvisor_manager_events_compacted_total`: superseded status updates skipped.
    pub events_compacted: IntCounter,
    /// `kernelvisor_manager_events_rejected_total{reason}`: unparseable or failed, not acked.
    pub events_rejected: IntCounterVec,
    /// `kernelvisor_manager_intake_identity_mismatches_total{method}`: intake calls refused
    /// because their `agent_id` is not the one the caller's CURVE key is named after.
    pub intake_identity_mismatches: IntCounterVec,
    /// `kernelvisor_manager_heartbeats_total`: heartbeats the intake took (each applied, or
    /// superseded by the same agent's next one before the registry got to it).
    pub heartbeats: IntCounter,
    /// `kernelvisor_manager_heartbeats_dropped_total{reason}`: `superseded` (a newer one of the
    /// same agent arrived before the registry applied it), `stale` (an older one arrived after a
    /// newer one), `inbox-full` (refused: `capacity` other agents were waiting).
    pub heartbeats_dropped: IntCounterVec,
    /// `kernelvisor_manager_agents_lost_total`.
    pub agents_lost: IntCounter,
    /// `kernelvisor_manager_agent_resets_total{result}` (`ok`, `failed`).
    pub agent_resets: IntCounterVec,
    /// `kernelvisor_manager_unknown_kernels_total`: kernels an agent reports that the store does not hold live.
    pub unknown_kernels: IntCounter,
    /// `kernelvisor_manager_sessions_created_total`.
    pub sessions_created: IntCounter,
    /// `kernelvisor_manager_dangling_kernels_total{action}`: `kernel_dangling` reports
    /// (`reported`) and how they ended (`adopted`, `destroyed`, `gone`, `failed`).
    pub dangling_kernels: IntCounterVec,
    /// `kernelvisor_manager_leader`: 1 while this replica holds the single-leader duties.
    pub leader: prometheus::IntGauge,
    /// `kernelvisor_manager_session_errors_total{code}`: API error codes of session calls.
    pub session_errors: IntCounterVec,
    /// `kernelvisor_manager_event_subscribers`: `GET /v1/events` streams following now.
    pub event_subscribers: prometheus::IntGauge,
    /// `kernelvisor_manager_events_published_total`: events this replica put on its stream.
    pub events_published: IntCounter,
    /// `kernelvisor_manager_event_subscribers_dropped_total`: streams ended because their reader
    /// fell `[api] events-queue` events behind.
    pub event_subscribers_dropped: IntCounter,
    /// `kernelvisor_manager_queue_depth{priority}`: `PENDING` sessions by priority (written by
    /// the leader's admission rounds).
    pub queue_depth: IntGaugeVec,
    /// `kernelvisor_manager_admissions_total`: queued sessions admitted (placed).
    pub admissions: IntCounter,
    /// `kernelvisor_manager_admission_wait_seconds`: time from queued to admitted, seconds.
    pub admission_wait: prometheus::Histogram,
    /// `kernelvisor_manager_stuck_kernels_resolved_total{state,outcome}`: kernels past their
    /// state's deadline that the reconcile sweep resolved (`running`, `terminated`), and
    /// orphaned pulls it took over (`adopted`, `redriven`).
    pub stuck_kernels_resolved: IntCounterVec,
    /// `kernelvisor_manager_drained_sessions_total`: sessions terminated at their agent's drain
    /// deadline (`agent-drained`).
    pub drained_sessions: IntCounter,
    /// `kernelvisor_manager_terminating_seconds`: time a session's kernel spent `TERMINATING`
    /// (its stop signal, its grace, its removal), seconds, observed when the agent answered.
    pub terminating_seconds: prometheus::Histogram,
    // Idle reclaim.
    /// `kernelvisor_manager_reclaims_total{reason}`: sessions the reclaim duty ended
    /// (`idle-timeout`, `lifetime-exceeded`, `low-utilization`).
    pub reclaims: IntCounterVec,
    // Preemption (issue 41 item 2).
    /// `kernelvisor_manager_preemptions_total{reason}`: sessions evicted by preemption, by why
    /// (`priority`: a pending session of a strictly higher priority needed their room).
    pub preemptions: IntCounterVec,
    // Cluster sessions (issue 40).
    /// `kernelvisor_manager_gang_restarts_total{reason}`: cluster sessions requeued whole by
    /// their restart policy, by the reason of the kernel that ended first (`agent-lost`,
    /// `failed-to-create`, …).
    pub gang_restarts: IntCounterVec,
    /// `kernelvisor_manager_admission_rounds_total`: admission rounds that planned over a
    /// non-empty queue (a test tells from it that rounds looked at a session).
    pub admission_rounds: IntCounter,
}

impl Default for ManagerMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ManagerMetrics {
    /// Registers every family.
    pub fn new() -> ManagerMetrics {
        let registry = Registry::new();
        let reg =
            |c: Box<dyn prometheus::core::Collector>| registry.register(c).expect("unique metric");
        let counter = |name: &str, help: &str| {
            let c = IntCounter::new(format!("kernelvisor_manager_{name}_total"), help)
                .expect("valid counter");
            reg(Box::new(c.clone()));
            c
        };
        let counter_vec = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(
                Opts::new(format!("kernelvisor_manager_{name}_total"), help),
                labels,
            )
            .expect("valid counter");
            reg(Box::new(c.clone()));
            c
        };
        let gauge_vec = |name: &str, help: &str, labels: &[&str]| {
            let g = IntGaugeVec::new(
                Opts::new(format!("kernelvisor_manager_{name}"), help),
                labels,
            )
            .expect("valid gauge");
            reg(Box::new(g.clone()));
            g
        };
        let rpc_duration = HistogramVec::new(
            HistogramOpts::new(
                "kernelvisor_manager_agent_rpc_duration_seconds",
                "Agent RPC call time through the pool, seconds",
            )
            .buckets(RPC_BUCKETS.to_vec()),
            &["method"],
        )
        .expect("valid histogram");
        reg(Box::new(rpc_duration.clone()));
        let pool_last_sweep = prometheus::Gauge::new(
            "kernelvisor_manager_pool_last_sweep_seconds",
            "Wall time of the newest agent pool health-check sweep, seconds",
        )
        .expect("valid gauge");
        reg(Box::new(pool_last_sweep.clone()));
        let pool_last_sweep_entries = prometheus::IntGauge::new(
            "kernelvisor_manager_pool_last_sweep_entries",
            "Pool entries the newest health-check sweep pinged",
        )
        .expect("valid gauge");
        reg(Box::new(pool_last_sweep_entries.clone()));
        let leader = prometheus::IntGauge::new(
            "kernelvisor_manager_leader",
            "1 while this replica holds the single-leader duties (advisory lock), else 0",
        )
        .expect("valid gauge");
        reg(Box::new(leader.clone()));
        let event_subscribers = prometheus::IntGauge::new(
            "kernelvisor_manager_event_subscribers",
            "GET /v1/events streams following now",
        )
        .expect("valid gauge");
        reg(Box::new(event_subscribers.clone()));
        let admission_wait = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "kernelvisor_manager_admission_wait_seconds",
                "Time a queued session waited before it was admitted, seconds",
            )
            .buckets(vec![
                0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0, 86400.0,
            ]),
        )
        .expect("valid histogram");
        reg(Box::new(admission_wait.clone()));
        let terminating_seconds = prometheus::Histogram::with_opts(
            HistogramOpts::new(
                "kernelvisor_manager_terminating_seconds",
                "Time a kernel spent TERMINATING (stop signal, grace period, removal), seconds",
            )
            .buckets(vec![
                0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0,
            ]),
        )
        .expect("valid histogram");
        reg(Box::new(terminating_seconds.clone()));
        ManagerMetrics {
            terminating_seconds,
            queue_depth: gauge_vec(
                "queue_depth",
                "PENDING sessions waiting for capacity, by priority",
                &["priority"],
            ),
            admissions: counter("admissions", "Queued sessions admitted onto an agent"),
            admission_wait,
            stuck_kernels_resolved: counter_vec(
                "stuck_kernels_resolved",
                "Kernels past their state's deadline resolved, and orphaned pulls taken over, by the reconcile sweep",
                &["state", "outcome"],
            ),
            drained_sessions: counter(
                "drained_sessions",
                "Sessions terminated at their agent's drain deadline",
            ),
            reclaims: {
                let c = counter_vec(
                    "reclaims",
                    "Sessions ended by idle reclaim, by reason",
                    &["reason"],
                );
                // Every reason present from the start (at 0).
                for r in crate::model::reclaim::ReclaimReason::ALL {
                    c.with_label_values(&[r.as_str()]);
                }
                c
            },
            preemptions: counter_vec(
                "preemptions",
                "Sessions evicted by preemption, by why",
                &["reason"],
            ),
            gang_restarts: counter_vec(
                "gang_restarts",
                "Cluster sessions requeued whole by their restart policy, by the first ended kernel's reason",
                &["reason"],
            ),
            admission_rounds: counter(
                "admission_rounds",
                "Admission rounds that planned over a non-empty queue",
            ),
            leader,
            event_subscribers,
            events_published: counter(
                "events_published",
                "Events put on this replica's event stream",
            ),
            event_subscribers_dropped: counter(
                "event_subscribers_dropped",
                "Event streams dropped because their reader fell a whole queue behind",
            ),
            pool_last_sweep,
            pool_last_sweep_entries,
            agents: gauge_vec("agents", "Agents by liveness status", &["status"]),
            pool_entries: gauge_vec("pool_entries", "Agent pool entries by state", &["state"]),
            live_kernels: gauge_vec(
                "live_kernels",
                "Kernels in the live set, by status",
                &["status"],
            ),
            rpc_duration,
            rpc_failures: counter_vec(
                "agent_rpc_failures",
                "Agent RPC calls that failed, by kind",
                &["method", "kind"],
            ),
            events_applied: counter_vec(
                "events_applied",
                "Agent events applied to the store",
                &["name"],
            ),
            events_duplicate: counter(
                "events_duplicate",
                "Resent agent events acked without being applied again",
            ),
            events_compacted: counter(
                "events_compacted",
                "Superseded kernel status events recorded without effect",
            ),
            events_rejected: counter_vec(
                "events_rejected",
                "Agent events not acked (unparseable, or the store failed)",
                &["reason"],
            ),
            intake_identity_mismatches: counter_vec(
                "intake_identity_mismatches",
                "Intake calls refused: agent_id differs from the caller's CURVE key name",
                &["method"],
            ),
            heartbeats: counter("heartbeats", "Agent heartbeats taken by the intake"),
            heartbeats_dropped: counter_vec(
                "heartbeats_dropped",
                "Heartbeats not applied: superseded by the agent's next, stale, or inbox full",
                &["reason"],
            ),
            agents_lost: counter(
                "agents_lost",
                "Agents marked LOST after the heartbeat timeout",
            ),
            agent_resets: counter_vec(
                "agent_resets",
                "reset_instance calls to agents back from LOST",
                &["result"],
            ),
            unknown_kernels: counter(
                "unknown_kernels",
                "Kernels agents report that the store does not hold live",
            ),
            sessions_created: counter("sessions_created", "Sessions created"),
            dangling_kernels: counter_vec(
                "dangling_kernels",
                "Dangling kernel reports and their outcomes",
                &["action"],
            ),
            session_errors: counter_vec("session_errors", "Session API errors by code", &["code"]),
            registry,
        }
    }

    /// One agent call: its time, and the failure kind when it failed.
    pub fn agent_call(&self, method: &str, took: Duration, failure: Option<&str>) {
        self.rpc_duration
            .with_label_values(&[method])
            .observe(took.as_secs_f64());
        if let Some(kind) = failure {
            self.rpc_failures.with_label_values(&[method, kind]).inc();
        }
    }

    /// Sets `queue_depth` from `(priority, count)` pairs; priorities absent now read 0.
    pub fn set_queue_depth(&self, depth: &[(i64, i64)]) {
        self.queue_depth.reset();
        for (priority, n) in depth {
            self.queue_depth
                .with_label_values(&[&priority.to_string()])
                .set(*n);
        }
    }

    /// Prometheus text format 0.0.4.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}

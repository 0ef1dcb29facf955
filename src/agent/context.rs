//! What every kernel actor and RPC method shares: the agent's identity and config, the
//! container backend, the node's allocators, the store and the event bus.

use std::sync::{Arc, Mutex};

use super::accelerators::Accelerators;
use super::backend::ContainerBackend;
use super::events::EventBus;
use super::metrics::AgentMetrics;
use super::resources::{PortPool, SlotAllocator};
use super::store::Store;
use crate::config::AgentConfig;

/// Shared agent state, behind an `Arc`. The allocators are the only mutable parts; each is
/// locked only for an allocation or a release, never across an await.
pub struct AgentContext {
    /// `[agent] id`.
    pub agent_id: String,
    /// The whole config.
    pub config: AgentConfig,
    /// The container engine.
    pub backend: Arc<dyn ContainerBackend>,
    /// Whether the engine answers (the exit watcher probes it; `health` reports it).
    pub engine: Arc<super::engine::EngineHealth>,
    /// Resource slots (capacity net of reservations).
    pub slots: Mutex<SlotAllocator>,
    /// Host ports of `[container] port-range`.
    pub ports: Mutex<PortPool>,
    /// The kernel registry's rows.
    pub store: Store,
    /// Where status transitions are published.
    pub events: EventBus,
    /// The agent's Prometheus metrics.
    pub metrics: Arc<AgentMetrics>,
    /// `execute` runs in progress.
    pub runs: super::exec::Runs,
    /// Backend.AI's kernel runner: where it is, and one connection per runner kernel.
    pub runners: super::runner::Runners,
    /// Kernel logs kept past their containers.
    pub logs: Arc<super::logs::LogStore>,
    /// Services started on kernels' service ports.
    pub services: super::services::Services,
    /// File uploads and downloads in progress.
    pub transfers: super::files::transfer::Transfers,
    /// Containers with this agent's id that its store does not know, waiting for the manager
    /// to adopt or destroy them (`docs/design.md`).
    pub dangling: super::dangling_table::DanglingTable,
    /// Ports `assign_port` handed out, a requested shutdown.
    pub node: super::node::NodeState,
    /// Image pulls: one engine pull per image at a time, with progress (`pulls.rs`).
    pub pulls: Arc<super::pulls::ImagePulls>,
    /// Background tasks (commit, push, pull), told to Backend.AI's manager through Valkey.
    pub bgtasks: super::bgtasks::Bgtasks,
    /// Backend.AI's live stats (node, kernels, processes), written to Valkey (`valkey/`).
    pub live_stats: Arc<super::stats::live::LiveStats>,
    // Idle reclaim.
    /// Each kernel's last activity and utilization, for the heartbeat (`activity.rs`).
    pub activity: Arc<super::activity::Activity>,
}

impl AgentContext {
    /// The slot capacity from the host (or `[resource] cpu`/`mem`) minus `reserved-cpu` /
    /// `reserved-mem`, and every device of `accelerators`.
    pub fn detect_slots(config: &AgentConfig, accelerators: Accelerators) -> SlotAllocator {
        let r = &config.resource;
        let mut sys = sysinfo::System::new();
        sys.refresh_memory();
        let cores = r
            .cpu
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()) as f64);
        let mem = r.mem.map_or_else(|| sys.total_memory(), |m| m.0);
        let cpu_millis = ((cores - r.reserved_cpu).max(0.0) * 1000.0).round() as u64;
        SlotAllocator::new(
            cpu_millis,
            mem.saturating_sub(r.reserved_mem.0),
            accelerators,
        )
    }
}

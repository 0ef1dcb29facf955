//! The stats sampler: every `[stats]` interval it reads the node (procfs), each running
//! kernel's container (its cgroup files; Docker's stats API when they cannot be read) and the
//! GPUs (NVML), and sets Backend.AI's gauges:
//!
//! | `backendai_device_utilization` `device_metric_name` | `device_id` | `current` | `capacity` | `pct` |
//! |---|---|---|---|---|
//! | `cpu_util` | `node` | % of one core | cores × 100 | of capacity |
//! | `mem` | `node` | bytes used | bytes total | of capacity |
//! | `net_rx`, `net_tx`, `io_read`, `io_write` | `node` | bytes, cumulative | | |
//! | `cuda_util` | GPU index | % | | |
//! | `cuda_mem` | GPU index | bytes used | bytes total | of capacity |
//! | `cuda_temp`, `cuda_power` | GPU index | °C, W | | |
//!
//! `backendai_container_utilization` per kernel: `cpu_util` (% of one core over the last
//! interval; capacity = the kernel's cores × 100), `cpu_used` (ms, cumulative), `mem` (bytes
//! without page cache; capacity = its limit), `mem_rss`, `mem_cache`, `mem_swap` (bytes),
//! `net_rx`, `net_tx`, `io_read`, `io_write` (bytes, cumulative). A kernel's series are
//! removed as soon as it terminates.
//!
//! The same samples feed the agent's [`LiveStats`](super::live::LiveStats) (upstream's metrics,
//! units and moving statistics), which the `valkey` child writes for Backend.AI's manager.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::Addr;

use super::cgroup::{self, CgroupPaths, ContainerSample};
use super::gpu::GpuSampler;
use super::live::{specs, Measurement};
use super::node::{self, NodeSample};
use crate::agent::accelerators::{DeviceMap, DeviceSample, DeviceShares};
use crate::agent::activity::Connections;
use crate::agent::context::AgentContext;
use crate::agent::events::AgentEvent;
use crate::agent::kernel::{KernelInfo, KernelStatus};
use crate::agent::metrics::{AgentMetrics, KernelLabels};
use crate::agent::registry::{KernelRegistry, ListKernels};
use crate::config::StatsSection;

/// Where a container's figures come from, found once per container.
enum Source {
    /// Its cgroup files, and its init pid for the network namespace.
    Cgroup { paths: CgroupPaths, pid: u32 },
    /// Docker's stats API (cgroup files unreadable, e.g. a remote engine).
    Engine,
}

/// What was read of one container last round, for rates.
struct Previous {
    cpu_used_ns: u64,
    at: Instant,
}

/// Samples the node, the kernels' containers and the GPUs into the agent's metrics.
pub struct StatsSampler {
    ctx: Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
    intervals: StatsSection,
    sources: HashMap<String, Source>,
    previous: HashMap<String, Previous>,
    node_previous: Option<NodeSample>,
    /// When the last node sample was read (the live `cpu_util`'s capacity is the interval).
    node_at: Option<Instant>,
    /// Connections to the kernels' service ports (idle reclaim).
    connections: Connections,
}

impl StatsSampler {
    /// A sampler for `ctx`'s kernels (listed through `registry`).
    pub fn new(
        ctx: Arc<AgentContext>,
        registry: Addr<KernelRegistry>,
        intervals: StatsSection,
    ) -> StatsSampler {
        StatsSampler {
            ctx,
            registry,
            intervals,
            sources: HashMap::new(),
            previous: HashMap::new(),
            node_previous: None,
            node_at: None,
            connections: Connections::default(),
        }
    }

    /// Samples until `stop` resolves. The first round of each scope runs at once.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) {
        let gpus = GpuSampler::init();
        // Mock (or any non-NVML) accelerators report their devices on the GPU tick too.
        let other_devices = {
            let slots = self.ctx.slots.lock().expect("slot allocator lock");
            slots
                .accelerators()
                .plugins()
                .iter()
                .any(|p| p.name() != "cuda")
        };
        let ticker = |d: Duration| {
            let mut t = tokio::time::interval(d);
            t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            t
        };
        let (mut node_tick, mut container_tick, mut gpu_tick, mut process_tick) = (
            ticker(self.intervals.node_interval.0),
            ticker(self.intervals.container_interval.0),
            ticker(self.intervals.gpu_interval.0),
            ticker(self.intervals.process_interval.0),
        );
        // Per-process stats go only to Backend.AI's Valkey (no Prometheus series).
        let processes = self.ctx.config.redis.is_some();
        let mut events = self.ctx.events.subscribe();
        let mut stop = std::pin::pin!(stop);
        loop {
            tokio::select! {
                _ = node_tick.tick() => self.node_round(),
                _ = container_tick.tick() => self.container_round().await,
                _ = gpu_tick.tick(), if gpus.available() || other_devices => self.gpu_round(&gpus),
                _ = process_tick.tick(), if processes => self.process_round(),
                event = events.recv() => match event {
                    Ok(AgentEvent::KernelTerminated { kernel_id, .. }) => self.forget_kernel(&kernel_id),
                    Ok(_) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => {}
                },
                _ = &mut stop => break,
            }
        }
    }

    fn metrics(&self) -> &AgentMetrics {
        &self.ctx.metrics
    }

    // Idle reclaim.
    /// Someone connected to one of `kernel`'s service ports (an ESTABLISHED TCP connection in
    /// its container's network namespace, read through its init pid) is activity
    /// (`agent/activity.rs`). A container read through the engine's API (no pid) is not
    /// looked at.
    fn note_service_connections(&mut self, kernel: &KernelInfo, container_id: &str) {
        let Some(Source::Cgroup { pid, .. }) = self.sources.get(container_id) else {
            return;
        };
        let ports: Vec<u16> = kernel
            .service_ports
            .iter()
            .flat_map(|s| s.container_ports.iter().copied())
            .collect();
        let pid = *pid;
        if self.connections.connected(container_id, pid, &ports) {
            self.ctx.activity.touch(&kernel.id);
        }
    }

    /// Removes a terminated kernel's series at once.
    fn forget_kernel(&mut self, kernel_id: &str) {
        self.ctx.activity.retain(|id| id != kernel_id);
        for labels in self.metrics().kernels_with_series() {
            if labels.kernel_id == kernel_id {
                self.metrics().remove_kernel(&labels);
            }
        }
    }

    fn node_round(&mut self) {
        let started = Instant::now();
        match node::read() {
            Ok(now) => {
                let m = &self.ctx.metrics;
                let capacity = now.cpu_count as f64 * 100.0;
                if let Some(prev) = &self.node_previous {
                    let util = node::cpu_util_pct(prev, &now);
                    m.set_device("cpu_util", "node", "current", util);
                    m.set_device("cpu_util", "node", "capacity", capacity);
                    m.set_device("cpu_util", "node", "pct", pct(util, capacity));
                }
                let used = now.mem_total_bytes.saturating_sub(now.mem_available_bytes) as f64;
                m.set_device("mem", "node", "current", used);
                m.set_device("mem", "node", "capacity", now.mem_total_bytes as f64);
                m.set_device("mem", "node", "pct", pct(used, now.mem_total_bytes as f64));
                m.set_device("net_rx", "node", "current", now.net_rx_bytes as f64);
                m.set_device("net_tx", "node", "current", now.net_tx_bytes as f64);
                m.set_device("io_read", "node", "current", now.disk_read_bytes as f64);
                m.set_device("io_write", "node", "current", now.disk_write_bytes as f64);
                m.stat_task("node", started.elapsed(), Ok(()));
                self.live_node(&now, started);
                self.node_previous = Some(now);
            }
            Err(e) => {
                tracing::warn!(agent_id = %self.ctx.agent_id, error = %e, "node stats unreadable");
                self.metrics()
                    .stat_task("node", started.elapsed(), Err("ProcError"));
            }
        }
    }

    /// The node's live stats as upstream's intrinsic plugins measure them: `cpu_util` (busy ms
    /// summed over CPUs; capacity the interval in ms), `mem` (also as device `root`),
    /// `net_rx` / `net_tx` (also as device `node`).
    fn live_node(&mut self, now: &NodeSample, at: Instant) {
        let live = &self.ctx.live_stats;
        let interval_ms = self
            .node_at
            .map_or(0.0, |t| at.duration_since(t).as_secs_f64() * 1000.0);
        self.node_at = Some(at);
        let busy_ms = now.cpu_busy_ticks as f64 * 1000.0 / node::clock_ticks_per_second();
        live.node(
            specs::NODE_CPU_UTIL,
            Measurement::with_capacity(busy_ms, interval_ms),
            at,
        );
        let used = now.mem_total_bytes.saturating_sub(now.mem_available_bytes) as f64;
        let mem = Measurement::with_capacity(used, now.mem_total_bytes as f64);
        live.node(specs::MEM, mem, at);
        live.device(specs::MEM, "root", mem, at);
        for (spec, bytes) in [
            (specs::NET_RX, now.net_rx_bytes),
            (specs::NET_TX, now.net_tx_bytes),
        ] {
            live.node(spec, Measurement::of(bytes as f64), at);
            live.device(spec, "node", Measurement::of(bytes as f64), at);
        }
        live.node_round.notify_one();
    }

    async fn container_round(&mut self) {
        let started = Instant::now();
        let kernels = match self.registry.send(ListKernels).await {
            Ok(k) => k,
            Err(_) => return, // the registry is restarting; the supervisor restarts us too
        };
        let running: Vec<KernelInfo> = kernels
            .into_iter()
            .filter(|k| k.status == KernelStatus::Running && k.container_id.is_some())
            .collect();
        self.metrics().kernel_count(running.len());
        let mut failed = None;
        let mut live = HashSet::new();
        for kernel in &running {
            let container_id = kernel
                .container_id
                .clone()
                .expect("filtered on container_id");
            live.insert(container_id.clone());
            match self.sample_container(&container_id).await {
                Ok(Some((sample, net))) => self.publish(kernel, &container_id, sample, net),
                Ok(None) => {}
                Err(e) => {
                    tracing::debug!(agent_id = %self.ctx.agent_id, kernel_id = %kernel.id, error = %e, "container stats unreadable");
                    failed = Some("ContainerStatsError");
                }
            }
            self.note_service_connections(kernel, &container_id);
        }
        self.publish_accelerators(&running);
        // Containers no longer running: their caches and series go.
        self.sources.retain(|id, _| live.contains(id));
        self.previous.retain(|id, _| live.contains(id));
        self.connections.retain(|id| live.contains(id));
        let live_kernels: HashSet<&str> = running.iter().map(|k| k.id.as_str()).collect();
        for labels in self.metrics().kernels_with_series() {
            if !live_kernels.contains(labels.kernel_id.as_str()) {
                self.metrics().remove_kernel(&labels);
            }
        }
        self.ctx
            .live_stats
            .retain_kernels(&|k: &str| live_kernels.contains(k), &|c: &str| {
                live.contains(c)
            });
        self.ctx.live_stats.container_round.notify_one();
        self.metrics()
            .stat_task("container", started.elapsed(), failed.map_or(Ok(()), Err));
    }

    /// Each process of each running kernel whose cgroup files are read (the containers of the
    /// last container round) into the live stats, as upstream's per-process metrics: `cpu_util`
    /// (CPU ms, capacity 1000, per second), `cpu_used` (ms), `mem` (resident bytes),
    /// `io_read`, `io_write` (bytes). Processes that ended are forgotten.
    fn process_round(&mut self) {
        let live = self.ctx.live_stats.clone();
        let now = Instant::now();
        for (container_id, source) in &self.sources {
            let Source::Cgroup { paths, .. } = source else {
                continue;
            };
            let Ok(pids) = super::process::pids(paths) else {
                continue;
            };
            let mut alive = HashSet::new();
            for pid in pids {
                let Some(p) = super::process::read(pid) else {
                    continue;
                };
                alive.insert(pid);
                let c = container_id.as_str();
                let cpu = Measurement::with_capacity(p.cpu_used_ms, 1000.0);
                live.process(specs::CPU_UTIL, c, pid, cpu, now);
                live.process(specs::CPU_USED, c, pid, Measurement::of(p.cpu_used_ms), now);
                live.process(specs::MEM, c, pid, Measurement::of(p.rss_bytes as f64), now);
                if let Some((read, written)) = p.io {
                    live.process(specs::IO_READ, c, pid, Measurement::of(read as f64), now);
                    live.process(
                        specs::IO_WRITE,
                        c,
                        pid,
                        Measurement::of(written as f64),
                        now,
                    );
                }
            }
            live.retain_processes(container_id, &|pid| alive.contains(&pid));
        }
        live.process_round.notify_one();
    }

    /// Reads one container: cgroup files when they can be found, else the engine's API.
    async fn sample_container(
        &mut self,
        container_id: &str,
    ) -> anyhow::Result<Option<(ContainerSample, Option<(u64, u64)>)>> {
        if !self.sources.contains_key(container_id) {
            let source = match self.ctx.backend.inspect_container(container_id).await? {
                None => return Ok(None),
                Some(state) => match state
                    .pid
                    .and_then(|pid| CgroupPaths::for_pid(pid).ok().map(|paths| (paths, pid)))
                {
                    Some((paths, pid)) => Source::Cgroup { paths, pid },
                    None => Source::Engine,
                },
            };
            self.sources.insert(container_id.to_owned(), source);
        }
        match &self.sources[container_id] {
            Source::Cgroup { paths, pid } => match cgroup::read(paths) {
                Ok(sample) => {
                    self.ctx.metrics.container_sampled("cgroup");
                    Ok(Some((sample, node::net_dev_of_pid(*pid).ok())))
                }
                Err(e) => {
                    // Gone, or moved: find it again next round.
                    self.sources.remove(container_id);
                    Err(e.into())
                }
            },
            Source::Engine => {
                let stats = self.ctx.backend.stats(container_id).await?;
                if stats.is_some() {
                    self.ctx.metrics.container_sampled("engine");
                }
                Ok(stats.map(|s| (s.cgroup, Some((s.net_rx_bytes, s.net_tx_bytes)))))
            }
        }
    }

    fn publish(
        &mut self,
        kernel: &KernelInfo,
        container_id: &str,
        s: ContainerSample,
        net: Option<(u64, u64)>,
    ) {
        let owner = &kernel.config.owner;
        let labels = KernelLabels {
            kernel_id: kernel.id.clone(),
            session_id: kernel.session_id.clone(),
            user_id: owner.user_id.clone(),
            project_id: owner.project_id.clone(),
        };
        let m = &self.ctx.metrics;
        let now = Instant::now();
        let cpu_capacity = kernel.config.slots.get(crate::slots::CPU).milli() as f64 / 10.0;
        if let Some(prev) = self.previous.get(container_id) {
            let wall = now.duration_since(prev.at).as_nanos() as f64;
            if wall > 0.0 {
                let util = s.cpu_used_ns.saturating_sub(prev.cpu_used_ns) as f64 / wall * 100.0;
                m.set_container(&labels, "cpu_util", "current", util);
                m.set_container(&labels, "cpu_util", "capacity", cpu_capacity);
                m.set_container(&labels, "cpu_util", "pct", pct(util, cpu_capacity));
                // Idle reclaim: `cpu` as a % of the cores it holds.
                self.ctx
                    .activity
                    .sample(&kernel.id, crate::slots::CPU, pct(util, cpu_capacity));
            }
        }
        self.previous.insert(
            container_id.to_owned(),
            Previous {
                cpu_used_ns: s.cpu_used_ns,
                at: now,
            },
        );
        m.set_container(&labels, "cpu_used", "current", s.cpu_used_ns as f64 / 1e6);
        let mem_capacity =
            s.mem_limit_bytes
                .unwrap_or(kernel.config.slots.get(crate::slots::MEM).units()) as f64;
        m.set_container(&labels, "mem", "current", s.mem_usage_bytes as f64);
        m.set_container(&labels, "mem", "capacity", mem_capacity);
        m.set_container(
            &labels,
            "mem",
            "pct",
            pct(s.mem_usage_bytes as f64, mem_capacity),
        );
        // Idle reclaim: `mem` as a % of its limit.
        self.ctx.activity.sample(
            &kernel.id,
            crate::slots::MEM,
            pct(s.mem_usage_bytes as f64, mem_capacity),
        );
        m.set_container(&labels, "mem_rss", "current", s.mem_rss_bytes as f64);
        m.set_container(&labels, "mem_cache", "current", s.mem_cache_bytes as f64);
        m.set_container(&labels, "mem_swap", "current", s.mem_swap_bytes as f64);
        m.set_container(&labels, "io_read", "current", s.io_read_bytes as f64);
        m.set_container(&labels, "io_write", "current", s.io_write_bytes as f64);
        if let Some((rx, tx)) = net {
            m.set_container(&labels, "net_rx", "current", rx as f64);
            m.set_container(&labels, "net_tx", "current", tx as f64);
        }
        // Upstream's container metrics (intrinsic.py): CPU in ms (capacity 1000 ms per second),
        // memory against the limit, I/O and network counters.
        let (live, k) = (&self.ctx.live_stats, kernel.id.as_str());
        let cpu_ms = s.cpu_used_ns as f64 / 1e6;
        live.kernel(
            specs::CPU_UTIL,
            k,
            Measurement::with_capacity(cpu_ms, 1000.0),
            now,
        );
        live.kernel(specs::CPU_USED, k, Measurement::of(cpu_ms), now);
        live.kernel(
            specs::MEM,
            k,
            Measurement::with_capacity(s.mem_usage_bytes as f64, mem_capacity),
            now,
        );
        live.kernel(
            specs::IO_READ,
            k,
            Measurement::of(s.io_read_bytes as f64),
            now,
        );
        live.kernel(
            specs::IO_WRITE,
            k,
            Measurement::of(s.io_write_bytes as f64),
            now,
        );
        if let Some((rx, tx)) = net {
            live.kernel(specs::NET_RX, k, Measurement::of(rx as f64), now);
            live.kernel(specs::NET_TX, k, Measurement::of(tx as f64), now);
        }
    }

    fn gpu_round(&self, gpus: &GpuSampler) {
        let started = Instant::now();
        let m = self.metrics();
        for g in gpus.sample() {
            let id = g.index.to_string();
            m.set_device("cuda_util", &id, "current", g.util_pct);
            m.set_device("cuda_mem", &id, "current", g.mem_used_bytes as f64);
            m.set_device("cuda_mem", &id, "capacity", g.mem_total_bytes as f64);
            m.set_device(
                "cuda_mem",
                &id,
                "pct",
                pct(g.mem_used_bytes as f64, g.mem_total_bytes as f64),
            );
            m.set_device("cuda_temp", &id, "current", g.temperature_c);
            m.set_device("cuda_power", &id, "current", g.power_w);
            let (live, at) = (&self.ctx.live_stats, Instant::now());
            live.device(
                specs::CUDA_MEM,
                &id,
                Measurement::with_capacity(g.mem_used_bytes as f64, g.mem_total_bytes as f64),
                at,
            );
            live.device(specs::CUDA_UTIL, &id, Measurement::of(g.util_pct), at);
        }
        // Other accelerators' devices (NVML's are above, with temperature and power), under
        // the metric names of their slot family (`cuda_*` for a mock serving `cuda.*`).
        let accelerators = self
            .ctx
            .slots
            .lock()
            .expect("slot allocator lock")
            .accelerators()
            .clone();
        for p in accelerators.plugins().iter().filter(|p| p.name() != "cuda") {
            for d in p.sample() {
                let cuda = p
                    .devices()
                    .iter()
                    .any(|dev| dev.id == d.id && dev.slot.starts_with("cuda."));
                if !cuda {
                    continue;
                }
                let (used, total) = (d.mem_used_bytes as f64, d.mem_total_bytes as f64);
                m.set_device("cuda_util", &d.id, "current", d.utilization_pct);
                m.set_device("cuda_mem", &d.id, "current", used);
                m.set_device("cuda_mem", &d.id, "capacity", total);
                m.set_device("cuda_mem", &d.id, "pct", pct(used, total));
                let (live, at) = (&self.ctx.live_stats, Instant::now());
                live.device(
                    specs::CUDA_MEM,
                    &d.id,
                    Measurement::with_capacity(used, total),
                    at,
                );
                live.device(
                    specs::CUDA_UTIL,
                    &d.id,
                    Measurement::of(d.utilization_pct),
                    at,
                );
            }
        }
        // Backend.AI counts device (GPU) sampling in the node scope.
        m.stat_task("node", started.elapsed(), Ok(()));
    }

    /// Per-kernel GPU use (`cuda_mem` bytes, `cuda_util` %) of every running kernel holding
    /// `cuda.*` devices: the plugin's own per-process reading when it has one (NVML), else
    /// each held device's sample apportioned by the share held (a whole device: all of it).
    fn publish_accelerators(&self, running: &[KernelInfo]) {
        let (accelerators, holders) = {
            let slots = self.ctx.slots.lock().expect("slot allocator lock");
            (slots.accelerators().clone(), slots.holders().clone())
        };
        if holders.is_empty() {
            return;
        }
        let samples: Vec<Vec<DeviceSample>> =
            accelerators.plugins().iter().map(|p| p.sample()).collect();
        for kernel in running {
            let (Some(held), Some(container_id)) = (holders.get(&kernel.id), &kernel.container_id)
            else {
                continue;
            };
            let cuda: DeviceMap = held
                .iter()
                .filter(|(slot, _)| slot.starts_with("cuda."))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            if cuda.is_empty() {
                continue;
            }
            let (mut mem, mut cap, mut util, mut weight) = (0.0f64, 0.0f64, 0.0f64, 0.0f64);
            for (p, samples) in accelerators.plugins().iter().zip(&samples) {
                let mine: DeviceMap = cuda
                    .iter()
                    .map(|(slot, shares)| {
                        let shares: DeviceShares = shares
                            .iter()
                            .filter(|(id, _)| {
                                p.devices().iter().any(|d| &d.slot == slot && &d.id == *id)
                            })
                            .map(|(id, a)| (id.clone(), *a))
                            .collect();
                        (slot.clone(), shares)
                    })
                    .filter(|(_, s)| !s.is_empty())
                    .collect();
                if mine.is_empty() {
                    continue;
                }
                let own = p.kernel_sample(&mine, container_id);
                for (id, share) in mine.values().flat_map(|s| s.iter()) {
                    let Some(d) = samples.iter().find(|d| &d.id == id) else {
                        continue;
                    };
                    let part = share.as_f64().min(1.0);
                    cap += d.mem_total_bytes as f64 * part;
                    if own.is_none() {
                        mem += d.mem_used_bytes as f64 * part;
                        util += d.utilization_pct * part;
                        weight += part;
                    }
                }
                if let Some((m, u)) = own {
                    mem += m as f64;
                    util += u;
                    weight += 1.0;
                }
            }
            let owner = &kernel.config.owner;
            let labels = KernelLabels {
                kernel_id: kernel.id.clone(),
                session_id: kernel.session_id.clone(),
                user_id: owner.user_id.clone(),
                project_id: owner.project_id.clone(),
            };
            let m = self.metrics();
            m.set_container(&labels, "cuda_mem", "current", mem);
            m.set_container(&labels, "cuda_mem", "capacity", cap);
            m.set_container(&labels, "cuda_mem", "pct", pct(mem, cap));
            let util = if weight > 0.0 { util / weight } else { 0.0 };
            m.set_container(&labels, "cuda_util", "current", util);
            // Idle reclaim: each `cuda.*` slot it holds at the devices' utilization.
            for slot in cuda.keys() {
                self.ctx.activity.sample(&kernel.id, slot, util);
            }
            let (live, at) = (&self.ctx.live_stats, Instant::now());
            live.kernel(
                specs::CUDA_MEM,
                &kernel.id,
                Measurement::with_capacity(mem, cap),
                at,
            );
            live.kernel(specs::CUDA_UTIL, &kernel.id, Measurement::of(util), at);
        }
    }
}

/// `value` as a percentage of `capacity` (0 when there is no capacity).
fn pct(value: f64, capacity: f64) -> f64 {
    if capacity > 0.0 {
        value / capacity * 100.0
    } else {
        0.0
    }
}

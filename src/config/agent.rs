//! `agent.toml`.

use std::path::PathBuf;

use serde::Deserialize;

use super::common::{ByteSize, ConfigError, HostPort, LoggingConfig, Seconds};

/// The whole agent config file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AgentConfig {
    /// `[agent]`.
    pub agent: AgentSection,
    /// `[container]`.
    #[serde(default)]
    pub container: ContainerSection,
    /// `[resource]`.
    #[serde(default)]
    pub resource: ResourceSection,
    /// `[dummy]`: delays of the simulated backend.
    #[serde(default)]
    pub dummy: DummySection,
    /// `[manager]`: where events and heartbeats go. Absent: the agent runs standalone.
    pub manager: Option<AgentManagerSection>,
    /// `[redis]`: Backend.AI's event bus (Backend.AI's `config/redis`). Present: every event
    /// upstream has a class for, and a heartbeat every `[manager] heartbeat-interval` (20 s
    /// without `[manager]`), are also published there (`crate::agent::bus`).
    pub redis: Option<RedisSection>,
    /// `[stats]`: sampling intervals.
    #[serde(default)]
    pub stats: StatsSection,
    /// `[accelerator]`: which accelerator plugins run (`cuda`, `mock`).
    #[serde(default)]
    pub accelerator: AcceleratorSection,
    /// `[logging]`.
    #[serde(default)]
    pub logging: LoggingConfig,
    /// `[kernel-runner]`: Backend.AI's kernel runner in labelled images
    /// (`crate::agent::runner`).
    #[serde(default)]
    pub kernel_runner: KernelRunnerSection,
}

/// Which kernels get Backend.AI's kernel runner (`[kernel-runner] mode`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum RunnerMode {
    /// Images labelled `ai.backend.kernelspec` (or `ai.backend.runtime-type`) with glibc get
    /// it when `dir` holds a runner; others keep the agent's process path.
    #[default]
    Auto,
    /// No kernel gets it.
    Off,
    /// Every kernel gets it: an image that cannot run it is refused by name.
    Require,
}

/// `[kernel-runner]`: where `just krunner` put Backend.AI's kernel runner, and who gets it.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct KernelRunnerSection {
    /// The directory `just krunner` printed (`ai/backend/{kernel,helpers,runner}` and
    /// `env/v<N>.<arch>.static-gnu/`). Absent: no runner (in `auto`, every kernel takes the
    /// process path).
    pub dir: Option<PathBuf>,
    /// `auto` (default), `off` or `require`.
    pub mode: RunnerMode,
    /// Seconds a new kernel's runner may take to answer `status` and `get-apps` (its REPL
    /// started, `bootstrap.sh` run) before the create fails (default 60, upstream's
    /// `init-timeout-sec`); each boot, where a `python` kernel whose REPL did not start is
    /// booted once more (`agent::kernel::stages::runner::wait_serving`).
    pub init_timeout: Seconds,
}

impl Default for KernelRunnerSection {
    fn default() -> Self {
        KernelRunnerSection {
            dir: None,
            mode: RunnerMode::Auto,
            init_timeout: Seconds(std::time::Duration::from_secs(60)),
        }
    }
}

/// Which container engine runs kernels.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The local Docker engine (bollard, the default socket or `DOCKER_HOST`).
    #[default]
    Docker,
    /// Kernels simulated in memory (scale tests, hosts without an engine).
    Dummy,
}

/// What a graceful shutdown (SIGTERM/SIGINT) does with running kernels (`docs/design.md`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnShutdown {
    /// Detach: containers keep serving; the next start re-attaches them.
    #[default]
    Preserve,
    /// Destroy every kernel (`docs/scenarios.md`, scenario 2).
    Terminate,
}

/// `[container]`: how kernel containers are made (Backend.AI's names where they exist).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ContainerSection {
    /// Inclusive host port range for service ports (default `[30000, 31000]`).
    pub port_range: [u16; 2],
    /// Seconds a released host port rests before reuse (default 10), so a client of the old
    /// kernel does not reach the new one.
    pub port_reuse_cooldown: Seconds,
    /// Host address published ports bind to (default `0.0.0.0`).
    pub bind_host: String,
    /// Parent of every kernel's scratch directory `<scratch-root>/<kernel-id>` (default
    /// `./var/scratches`).
    pub scratch_root: PathBuf,
    /// Size quota of a kernel's scratch `work/` directory; when set, it is a tmpfs of this
    /// size (Backend.AI's `scratch-type = "memory"`; needs root). Default: none.
    pub scratch_size: Option<ByteSize>,
    /// Root under which vfolder host paths must lie; without it, kernels cannot mount vfolders.
    pub vfolder_root: Option<PathBuf>,
    /// Maximum processes per container (default 4096).
    pub pids_limit: i64,
    /// `/dev/shm` size when a kernel's `resource_opts.shmem` is absent (default 64 MiB).
    pub default_shmem: ByteSize,
    /// Bytes of a kernel's stdout/stderr kept and served by `get_logs` (default 1 MiB); its log
    /// file never holds more than twice this.
    pub log_tail: ByteSize,
    /// Seconds a finished kernel's logs are kept under `<var-base-path>/logs` (default 3600).
    pub log_retention: Seconds,
    /// Seconds `start_service` waits for a service's port to accept connections (default 30).
    pub service_start_timeout: Seconds,
    /// Host name or address users reach service ports at, reported in service URLs (default:
    /// none, and the manager uses the host of the agent's advertised RPC address).
    pub advertised_host: Option<String>,
    /// Owner (uid, gid) of uploaded files and of directories created for them: the image's
    /// `work` user (default 1000 and 1000, Backend.AI's `kernel-uid` / `kernel-gid`).
    pub kernel_uid: u32,
    /// See `kernel-uid`.
    pub kernel_gid: u32,
    /// The Docker engine's socket, `unix:///path/docker.sock` (or the bare path). Default: none,
    /// and the local default is used (`DOCKER_HOST`, else `/var/run/docker.sock`).
    pub docker_host: Option<String>,
    /// Seconds one image pull may take before it fails with `ImagePullTimeout` (default 3600,
    /// Backend.AI's `api.pull-timeout` is unbounded by default). A pull is its own phase: this,
    /// not the manager's `create-timeout`, bounds it.
    pub image_pull_timeout: Seconds,
    /// Seconds a kernel's workload has to exit after its stop signal before it is killed, for a
    /// kernel whose config names no `grace_period` (every kernel Backend.AI's manager creates;
    /// default 10, Docker's own `stop` timeout and upstream's runner shutdown wait).
    pub grace_period: Seconds,
}

impl Default for ContainerSection {
    fn default() -> Self {
        ContainerSection {
            port_range: [30000, 31000],
            port_reuse_cooldown: Seconds(std::time::Duration::from_secs(10)),
            bind_host: "0.0.0.0".into(),
            scratch_root: PathBuf::from("var/scratches"),
            scratch_size: None,
            vfolder_root: None,
            pids_limit: 4096,
            default_shmem: ByteSize(64 << 20),
            log_tail: ByteSize(1 << 20),
            log_retention: Seconds(std::time::Duration::from_secs(3600)),
            service_start_timeout: Seconds(std::time::Duration::from_secs(30)),
            advertised_host: None,
            kernel_uid: 1000,
            kernel_gid: 1000,
            docker_host: None,
            image_pull_timeout: Seconds(std::time::Duration::from_secs(3600)),
            grace_period: Seconds(std::time::Duration::from_secs(10)),
        }
    }
}

/// `[resource]`: what part of the node kernels may use.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ResourceSection {
    /// Cores kept for the host (default 1; may be fractional).
    pub reserved_cpu: f64,
    /// Memory kept for the host (default `"1g"`).
    pub reserved_mem: ByteSize,
    /// Overrides the detected core count (e.g. a dummy agent pretending to be large).
    pub cpu: Option<f64>,
    /// Overrides the detected memory size.
    pub mem: Option<ByteSize>,
}

impl Default for ResourceSection {
    fn default() -> Self {
        ResourceSection {
            reserved_cpu: 1.0,
            reserved_mem: ByteSize(1 << 30),
            cpu: None,
            mem: None,
        }
    }
}

/// `[accelerator]`: the accelerator plugins (`crate::agent::accelerators`).
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct AcceleratorSection {
    /// `cuda = true | false`; absent: auto-detect through NVML (never fails without a GPU).
    pub cuda: Option<bool>,
    /// `[accelerator.mock]`: mock devices.
    pub mock: MockAcceleratorSection,
}

/// `[accelerator.mock]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct MockAcceleratorSection {
    /// `[[accelerator.mock.devices]]`: one table per device.
    pub devices: Vec<MockDeviceConfig>,
}

/// One mock device: `{ id = "0", memory = "16g", slot = "cuda.device" }`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct MockDeviceConfig {
    /// Its id (unique among the mock devices).
    pub id: String,
    /// Its memory: bytes or a size (`"16g"`).
    pub memory: ByteSize,
    /// The slot it serves: `cuda.device` (whole devices) or `cuda.shares` (fractions).
    #[serde(default = "default_mock_slot")]
    pub slot: String,
    /// A fixed utilization reading in percent (0–100) instead of the default drift between 0
    /// and 100 % over a minute: what tests of idle reclaim's utilization floor read.
    #[serde(default)]
    pub utilization: Option<f64>,
}

fn default_mock_slot() -> String {
    "cuda.device".into()
}

/// `[dummy]`: simulated engine delays in seconds (all default 0), and the images it holds.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct DummySection {
    /// Image references the simulated engine holds from the start (its image list, which
    /// heartbeats report; default none). Any image still "pulls" at once.
    pub images: Vec<String>,
    /// Image pull.
    pub pull_delay: f64,
    /// Container create.
    pub create_delay: f64,
    /// Container start.
    pub start_delay: f64,
    /// Container removal.
    pub remove_delay: f64,
}

/// `[manager]`: the manager's event intake, which takes the agent's events and heartbeats
/// over callosum RPC with CURVE (`docs/events.md`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AgentManagerSection {
    /// The manager's event intake (default port 6021). Authenticated with the key pair and
    /// manager public key of `[agent]` when those are set. The one-element form of
    /// `event-addrs`; give exactly one of the two.
    #[serde(default)]
    pub event_addr: Option<HostPort>,
    /// Several managers' intakes (`[{ host, port }, …]`): events and heartbeats go to
    /// one at a time; when it stops acking (connection failure or ack timeout) the agent moves
    /// to the next, round-robin, and resends what was not acked (the managers drop duplicates
    /// by event id). Every manager must have the key `rpc-auth-manager-public-key` names.
    #[serde(default)]
    pub event_addrs: Vec<HostPort>,
    /// Seconds between heartbeats (default 20; the manager's timeout is 40).
    #[serde(default = "default_heartbeat_interval")]
    pub heartbeat_interval: Seconds,
    /// Most events kept while the manager is unreachable (default 100000); beyond it, older
    /// states of kernels with a newer pending state are dropped first, then new events, with
    /// a warning and `kernelvisor_outbox_dropped_events_total`.
    #[serde(default = "default_outbox_max_events")]
    pub outbox_max_events: u64,
    /// Events sent per batch, at most (default 256).
    #[serde(default = "default_event_batch_size")]
    pub event_batch_size: u32,
    /// Seconds to wait for the manager's ack of a batch before resending it (default 10).
    #[serde(default = "default_event_ack_timeout")]
    pub event_ack_timeout: Seconds,
    /// Longest wait, in seconds, between delivery attempts; the wait's step starts at 0.2 s
    /// and doubles after each failure, each wait drawn within `[step/2, step)` (default 30).
    #[serde(default = "default_event_retry_max")]
    pub event_retry_max: Seconds,
}

impl AgentManagerSection {
    /// The intake endpoints, `tcp://host:port`, in the order they are tried.
    pub fn intake_endpoints(&self) -> Vec<String> {
        self.event_addr
            .iter()
            .chain(&self.event_addrs)
            .map(HostPort::zmq_endpoint)
            .collect()
    }
}

fn default_heartbeat_interval() -> Seconds {
    Seconds(std::time::Duration::from_secs(20))
}

fn default_outbox_max_events() -> u64 {
    100_000
}

fn default_event_batch_size() -> u32 {
    256
}

fn default_event_ack_timeout() -> Seconds {
    Seconds(std::time::Duration::from_secs(10))
}

fn default_event_retry_max() -> Seconds {
    Seconds(std::time::Duration::from_secs(30))
}

/// `[redis]`: the Redis (or Valkey) that carries Backend.AI's event bus. The streams live in
/// the logical database Backend.AI fixes for them (`REDIS_STREAM_DB` = 4,
/// `ai/backend/common/defs/__init__.py`), not a configurable one.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RedisSection {
    /// `{ host = "127.0.0.1", port = 6379 }` (Backend.AI's `config/redis/addr`).
    pub addr: HostPort,
    /// `AUTH` password; never logged (`Debug` shows `<redacted>`).
    #[serde(default)]
    pub password: Option<String>,
    /// Most events kept while Redis is unreachable (default 100000); beyond it, older states
    /// of kernels with a newer pending state are dropped first, then new events
    /// (`kernelvisor_outbox_dropped_events_total`, as for `[manager]`).
    #[serde(default = "default_outbox_max_events")]
    pub outbox_max_events: u64,
    /// Longest wait, in seconds, between publish attempts while Redis is down; the wait's step
    /// starts at 0.2 s and doubles after each failure, each wait drawn within `[step/2, step)`
    /// (default 5).
    #[serde(default = "default_bus_retry_max")]
    pub retry_max: Seconds,
}

impl RedisSection {
    /// A client of logical database `db` at [`Self::addr`], with [`Self::password`]: what the
    /// event bus and the side channels each connect with.
    ///
    /// Errors: redis' own, for an address it cannot use.
    pub fn client(&self, db: i64) -> redis::RedisResult<redis::Client> {
        redis::Client::open(redis::ConnectionInfo {
            addr: redis::ConnectionAddr::Tcp(self.addr.host.clone(), self.addr.port),
            redis: redis::RedisConnectionInfo {
                db,
                password: self.password.clone(),
                ..Default::default()
            },
        })
    }
}

impl std::fmt::Debug for RedisSection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSection")
            .field("addr", &self.addr)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("outbox_max_events", &self.outbox_max_events)
            .field("retry_max", &self.retry_max)
            .finish()
    }
}

fn default_bus_retry_max() -> Seconds {
    Seconds(std::time::Duration::from_secs(5))
}

/// `[stats]`: how often the stats sampler reads the node, the containers and the GPUs.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct StatsSection {
    /// Seconds between node samples (procfs; default 5).
    pub node_interval: Seconds,
    /// Seconds between container samples (cgroup files; default 5).
    pub container_interval: Seconds,
    /// Seconds between GPU samples (NVML; default 5).
    pub gpu_interval: Seconds,
    /// Seconds between samples of each kernel's processes (`/proc`; default 30, upstream's
    /// `utilization-metric.process.interval`); written only to Valkey, with `[redis]`.
    pub process_interval: Seconds,
}

impl Default for StatsSection {
    fn default() -> Self {
        let five = Seconds(std::time::Duration::from_secs(5));
        StatsSection {
            node_interval: five,
            container_interval: five,
            gpu_interval: five,
            process_interval: Seconds(std::time::Duration::from_secs(30)),
        }
    }
}

/// `[agent]`: identity, RPC endpoint and its keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AgentSection {
    /// Agent id, unique in the cluster (Backend.AI: `[agent] id`).
    pub id: String,
    /// Where the RPC ROUTER binds (default `0.0.0.0:6011`).
    #[serde(default = "default_rpc_listen_addr")]
    pub rpc_listen_addr: HostPort,
    /// The manager's public certificate (`zmq.auth` format). With `rpc-auth-agent-keypair`, turns
    /// CURVE on and admits only this key.
    pub rpc_auth_manager_public_key: Option<PathBuf>,
    /// The agent's secret certificate (`.key_secret`).
    pub rpc_auth_agent_keypair: Option<PathBuf>,
    /// Directory for the agent's state (store, outbox); default `./var/agent`.
    #[serde(default = "default_var_base_path")]
    pub var_base_path: PathBuf,
    /// Container engine (default `docker`).
    #[serde(default)]
    pub backend: BackendKind,
    /// Kernels set up at once; more wait their turn (default 8).
    #[serde(default = "default_creation_concurrency")]
    pub kernel_creation_concurrency: usize,
    /// What SIGTERM/SIGINT does with running kernels (default `preserve`).
    #[serde(default)]
    pub on_shutdown: OnShutdown,
    /// Where Prometheus scrapes `/metrics` (default `0.0.0.0:6003`, Backend.AI's
    /// `service-addr`; port 0 picks a free one).
    #[serde(default = "default_service_addr")]
    pub service_addr: HostPort,
    /// The region reported in heartbeats (default `local`).
    #[serde(default = "default_region")]
    pub region: String,
    /// `scaling-group`: the scaling group (resource group) the agent joins; read it with
    /// [`AgentSection::scaling_group`].
    #[serde(default)]
    scaling_group: Option<String>,
    /// `initial-resource-group-name`: the same setting as Backend.AI 26.8+ spells it
    /// (BEP-1059; its agent refuses `scaling-group` since, `AgentConfig` in
    /// `ai/backend/agent/config/unified.py`); read it with [`AgentSection::scaling_group`].
    #[serde(default)]
    initial_resource_group_name: Option<String>,
    /// The RPC address the manager should dial, sent in heartbeats (default: the bound
    /// `rpc-listen-addr`; set it when that is `0.0.0.0` and the manager is on another host).
    #[serde(default)]
    pub advertised_rpc_addr: Option<HostPort>,
    /// Most bytes of unread `execute` output held per run (default 1 MiB); when full the agent
    /// stops reading the run's output until a `continue` drains it. Also the most one answer carries.
    #[serde(default = "default_exec_buffer_size")]
    pub exec_buffer_size: ByteSize,
    /// Seconds a run may go without a reader before it is killed and freed (default 60).
    #[serde(default = "default_exec_idle_timeout")]
    pub exec_idle_timeout: Seconds,
}

fn default_exec_buffer_size() -> ByteSize {
    ByteSize(1 << 20)
}

fn default_exec_idle_timeout() -> Seconds {
    Seconds(std::time::Duration::from_secs(60))
}

fn default_service_addr() -> HostPort {
    HostPort {
        host: "0.0.0.0".into(),
        port: 6003,
    }
}

impl AgentSection {
    /// The scaling group (resource group) the agent joins, sent in `agent_heartbeat`'s
    /// `AgentInfo` on Backend.AI's bus: `scaling-group` or `initial-resource-group-name`,
    /// whichever is given (the config check refuses the two disagreeing), else `default`.
    pub fn scaling_group(&self) -> &str {
        self.scaling_group
            .as_deref()
            .or(self.initial_resource_group_name.as_deref())
            .unwrap_or("default")
    }
}

fn default_region() -> String {
    "local".into()
}

fn default_creation_concurrency() -> usize {
    8
}

fn default_rpc_listen_addr() -> HostPort {
    HostPort {
        host: "0.0.0.0".into(),
        port: 6011,
    }
}

fn default_var_base_path() -> PathBuf {
    PathBuf::from("var/agent")
}

impl AgentConfig {
    /// Loads and checks an agent config file.
    ///
    /// Errors: see [`super::load`]; an empty `id`; only one of the two key paths set.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        super::load(path, Self::validate)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let a = &self.agent;
        if a.id.trim().is_empty() {
            return Err(ConfigError::Invalid("agent.id", "must not be empty".into()));
        }
        match (&a.rpc_auth_manager_public_key, &a.rpc_auth_agent_keypair) {
            (Some(_), None) => Err(ConfigError::Invalid(
                "agent.rpc-auth-agent-keypair",
                "required when rpc-auth-manager-public-key is set".into(),
            )),
            (None, Some(_)) => Err(ConfigError::Invalid(
                "agent.rpc-auth-manager-public-key",
                "required when rpc-auth-agent-keypair is set".into(),
            )),
            _ => Ok(()),
        }?;
        if let Some(m) = &self.manager {
            match (&m.event_addr, m.event_addrs.len()) {
                (Some(_), 0) | (None, 1..) => {}
                (Some(_), _) => {
                    return Err(ConfigError::Invalid(
                        "manager.event-addrs",
                        "give event-addr or event-addrs, not both".into(),
                    ))
                }
                (None, 0) => {
                    return Err(ConfigError::Invalid(
                        "manager.event-addr",
                        "the manager's event intake is required in [manager] (event-addr, or event-addrs for several managers)".into(),
                    ))
                }
            }
        }
        if a.exec_buffer_size.0 < 4096 {
            return Err(ConfigError::Invalid(
                "agent.exec-buffer-size",
                "must be at least 4 KiB".into(),
            ));
        }
        if self.container.log_tail.0 == 0 {
            return Err(ConfigError::Invalid(
                "container.log-tail",
                "must be at least 1 byte".into(),
            ));
        }
        if a.kernel_creation_concurrency == 0 {
            return Err(ConfigError::Invalid(
                "agent.kernel-creation-concurrency",
                "must be at least 1".into(),
            ));
        }
        let [lo, hi] = self.container.port_range;
        if lo == 0 || lo > hi {
            return Err(ConfigError::Invalid(
                "container.port-range",
                format!("[{lo}, {hi}] is not a range of ports"),
            ));
        }
        if let Some(h) = &self.container.docker_host {
            let path = h.strip_prefix("unix://").unwrap_or(h);
            if !path.starts_with('/') {
                return Err(ConfigError::Invalid(
                    "container.docker-host",
                    format!("{h:?} is not a Unix socket (unix:///path/docker.sock)"),
                ));
            }
        }
        let mut ids = std::collections::BTreeSet::new();
        for d in &self.accelerator.mock.devices {
            if d.id.trim().is_empty() || !ids.insert(d.id.as_str()) {
                return Err(ConfigError::Invalid(
                    "accelerator.mock.devices",
                    format!("device id {:?} is empty or repeated", d.id),
                ));
            }
            if d.utilization
                .is_some_and(|u| !(u.is_finite() && (0.0..=100.0).contains(&u)))
            {
                return Err(ConfigError::Invalid(
                    "accelerator.mock.devices",
                    format!("device {:?}: utilization must be 0 to 100 (%)", d.id),
                ));
            }
            if !(d.slot.ends_with(".device") || d.slot.ends_with(".shares"))
                || crate::slots::check_name(&d.slot).is_err()
            {
                return Err(ConfigError::Invalid(
                    "accelerator.mock.devices",
                    format!(
                        "device {:?}: slot {:?} is not a `*.device` or `*.shares` slot name",
                        d.id, d.slot
                    ),
                ));
            }
        }
        let r = &self.resource;
        if !(r.reserved_cpu.is_finite() && r.reserved_cpu >= 0.0) {
            return Err(ConfigError::Invalid(
                "resource.reserved-cpu",
                "must be a non-negative number of cores".into(),
            ));
        }
        if r.cpu.is_some_and(|c| !(c.is_finite() && c > 0.0)) {
            return Err(ConfigError::Invalid(
                "resource.cpu",
                "must be a positive number of cores".into(),
            ));
        }
        if let Some(m) = &self.manager {
            if m.event_batch_size == 0 {
                return Err(ConfigError::Invalid(
                    "manager.event-batch-size",
                    "must be at least 1".into(),
                ));
            }
            if m.outbox_max_events == 0 {
                return Err(ConfigError::Invalid(
                    "manager.outbox-max-events",
                    "must be at least 1".into(),
                ));
            }
        }
        if let Some(r) = &self.redis {
            if r.outbox_max_events == 0 {
                return Err(ConfigError::Invalid(
                    "redis.outbox-max-events",
                    "must be at least 1".into(),
                ));
            }
            if r.addr.host.trim().is_empty() || r.addr.port == 0 {
                return Err(ConfigError::Invalid(
                    "redis.addr",
                    format!("{} is not a Redis address", r.addr),
                ));
            }
        }
        if let (Some(sg), Some(rg)) = (&a.scaling_group, &a.initial_resource_group_name) {
            if sg != rg {
                return Err(ConfigError::Invalid(
                    "agent.initial-resource-group-name",
                    format!(
                        "is {rg:?} but scaling-group is {sg:?}: the two name one setting \
                         (Backend.AI 26.8+ spells it initial-resource-group-name); give one, \
                         or both the same"
                    ),
                ));
            }
        }
        if a.scaling_group().trim().is_empty() {
            return Err(ConfigError::Invalid(
                if a.scaling_group.is_some() {
                    "agent.scaling-group"
                } else {
                    "agent.initial-resource-group-name"
                },
                "must not be empty".into(),
            ));
        }
        let d = &self.dummy;
        if [d.pull_delay, d.create_delay, d.start_delay, d.remove_delay]
            .iter()
            .any(|s| !(s.is_finite() && *s >= 0.0))
        {
            return Err(ConfigError::Invalid(
                "dummy",
                "delays must be non-negative seconds".into(),
            ));
        }
        Ok(())
    }
}

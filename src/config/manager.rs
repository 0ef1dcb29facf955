//! `manager.toml`.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use super::common::{ByteSize, ConfigError, HostPort, LoggingConfig, Seconds};
use crate::manager::pool::PoolSpec;
use crate::rpc::socket::Keepalive;

/// The whole manager config file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ManagerConfig {
    /// `[manager]`.
    #[serde(default)]
    pub manager: ManagerSection,
    /// `[agent-pool]`: the agent pool's intervals (`docs/design.md`, agent pool).
    #[serde(default)]
    pub agent_pool: PoolSection,
    /// `[[agents]]`: agents known at start (the agent registry adds the rest at run time).
    #[serde(default)]
    pub agents: Vec<StaticAgent>,
    /// `[store]`.
    #[serde(default)]
    pub store: StoreSection,
    /// `[api]`.
    #[serde(default)]
    pub api: ApiSection,
    /// `[scheduler]`.
    #[serde(default)]
    pub scheduler: SchedulerSection,
    /// `[events]`: the event stream's bounds (`GET /v1/events`).
    #[serde(default)]
    pub events: EventsSection,
    // Idle reclaim.
    /// `[reclaim]`: the idle reclaim duty and the sessions' default policy.
    #[serde(default)]
    pub reclaim: ReclaimSection,
    /// `[[registry]]`: container registries and their credentials, handed to the agent with
    /// each kernel of an image they hold (Backend.AI's `ImageConfig.registry`).
    #[serde(default)]
    pub registry: Vec<RegistrySection>,
    /// `[[access-keys]]` is gone: keys are created over the API (`ctl access-key create`) so
    /// that no secret sits in a config file. Still parsed, to refuse it with that message.
    #[serde(default)]
    pub access_keys: Vec<toml::Value>,
    /// `[logging]`.
    #[serde(default)]
    pub logging: LoggingConfig,
}

/// `[manager]`: identity, event intake and agent liveness. Durations in seconds.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ManagerSection {
    /// The manager's secret certificate (`.key_secret`): CURVE client key towards agents and
    /// server key of the event intake.
    pub rpc_keypair: Option<PathBuf>,
    /// Event intake (ZeroMQ ROUTER, callosum): `0.0.0.0:6021`.
    pub event_listen_addr: HostPort,
    /// Directory of agents' public certificates (`*.key`, zmq.auth format) admitted by the
    /// intake. Required with `rpc-keypair`; without both the intake is unauthenticated.
    pub agent_keys_dir: Option<PathBuf>,
    /// The agents' heartbeat interval (20), used to check `startup-grace`.
    pub heartbeat_interval: Seconds,
    /// No heartbeat for this long → the agent is `LOST` (40; `docs/scenarios.md`, scenario 4).
    pub heartbeat_timeout: Seconds,
    /// After start, kernel API calls answer 503 for this long while the latest heartbeats come
    /// in (45; must exceed 2 × `heartbeat-interval`; `docs/scenarios.md`, scenario 3).
    pub startup_grace: Seconds,
    /// Processed event ids are kept this long for deduplication (7 days).
    pub processed_event_retention: Seconds,
    /// A dangling kernel (`kernel_dangling`, `docs/design.md`) whose kernel the store does not hold
    /// live on its agent is destroyed (`destroy_dangling_kernel`) this long after it was first
    /// reported (300, as Nomad's dangling-container reaper); one it holds live is adopted at once.
    pub dangling_grace: Seconds,
    /// Several managers on one PostgreSQL: when the leader (the replica holding the advisory
    /// lock) dies, another takes its duties within this many seconds (10).
    pub leader_lease: Seconds,
}

impl Default for ManagerSection {
    fn default() -> Self {
        ManagerSection {
            rpc_keypair: None,
            event_listen_addr: HostPort {
                host: "0.0.0.0".into(),
                port: 6021,
            },
            agent_keys_dir: None,
            heartbeat_interval: Seconds(Duration::from_secs(20)),
            heartbeat_timeout: Seconds(Duration::from_secs(40)),
            startup_grace: Seconds(Duration::from_secs(45)),
            processed_event_retention: Seconds(Duration::from_secs(7 * 24 * 3600)),
            dangling_grace: Seconds(Duration::from_secs(300)),
            leader_lease: Seconds(Duration::from_secs(10)),
        }
    }
}

/// `[store]`.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct StoreSection {
    /// `sqlite://PATH` (default `sqlite://var/manager/manager.db`, created when missing) or
    /// `postgres://user:password@host:port/database`.
    pub url: String,
}

impl Default for StoreSection {
    fn default() -> Self {
        StoreSection {
            url: "sqlite://var/manager/manager.db".into(),
        }
    }
}

/// `[api]`: the HTTP API.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ApiSection {
    /// Listen address (`0.0.0.0:8081`).
    pub listen_addr: HostPort,
    /// HTTP worker threads (2).
    pub workers: usize,
    /// Largest file `PUT /v1/sessions/{id}/files/{path}` accepts (default 1 GiB); larger → 413.
    pub max_upload_size: ByteSize,
    /// Where a start with no admin key in the store writes the secret of the admin key it
    /// creates (`var/manager/admin-token`, mode 0600). Never rewritten once it exists: a start
    /// on an empty store with this file present makes its secret the admin key's again.
    pub admin_token_file: PathBuf,
    /// PEM file of the API's TLS certificate chain (the server's certificate first). With
    /// `tls-key` the API is served over HTTPS only; without both it is plain HTTP.
    pub tls_cert: Option<PathBuf>,
    /// PEM file of the private key of `tls-cert` (PKCS#8, PKCS#1 or SEC1). Set together with
    /// `tls-cert`, or neither.
    pub tls_key: Option<PathBuf>,
}

impl Default for ApiSection {
    fn default() -> Self {
        ApiSection {
            listen_addr: HostPort {
                host: "0.0.0.0".into(),
                port: 8081,
            },
            workers: 2,
            max_upload_size: ByteSize(1 << 30),
            admin_token_file: PathBuf::from("var/manager/admin-token"),
            tls_cert: None,
            tls_key: None,
        }
    }
}

/// `[events]`: the bounds of the event stream (`GET /v1/events`), which hold the manager's
/// memory whatever its readers do.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct EventsSection {
    /// Most recent events kept in memory (1000): what `GET /v1/events` answers without
    /// `follow`, a follower's first lines, and how far back `Last-Event-ID` resumes.
    pub history: usize,
    /// Events one follower may leave unread (256, at least 1); one more and its stream ends with
    /// a `dropped` event.
    pub queue: usize,
}

impl Default for EventsSection {
    fn default() -> Self {
        EventsSection {
            history: 1000,
            queue: 256,
        }
    }
}

// Idle reclaim.
/// `[reclaim]`: idle reclaim (`docs/design.md`, "Idle reclaim"): how often the leader checks
/// the sessions' deadlines, the lead of its warnings, and the default policy of sessions whose
/// request and access key set none; durations in seconds.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct ReclaimSection {
    /// Seconds between the leader's checks (5).
    pub interval: Seconds,
    /// Seconds before a deadline its `reclaim_warning` is sent; absent: 10 % of the limit,
    /// at least 60 s; never longer than the limit.
    pub warning_lead: Option<Seconds>,
    /// Default `max_lifetime` (none).
    pub max_lifetime: Option<Seconds>,
    /// Default `idle_timeout` (none).
    pub idle_timeout: Option<Seconds>,
    /// Default `utilization_window` (600), also of a floor given without a window.
    pub utilization_window: Seconds,
    /// Default `min_utilization`, `{slot = percent}` (none).
    pub min_utilization: std::collections::BTreeMap<String, f64>,
}

impl Default for ReclaimSection {
    fn default() -> Self {
        ReclaimSection {
            interval: Seconds(Duration::from_secs(5)),
            warning_lead: None,
            max_lifetime: None,
            idle_timeout: None,
            utilization_window: Seconds(Duration::from_secs(600)),
            min_utilization: Default::default(),
        }
    }
}

impl ReclaimSection {
    /// The default policy it gives sessions (`utilization_window` always set).
    pub fn defaults(&self) -> crate::model::reclaim::ReclaimPolicy {
        crate::model::reclaim::ReclaimPolicy {
            max_lifetime: self.max_lifetime.map(|s| s.0.as_secs_f64()),
            idle_timeout: self.idle_timeout.map(|s| s.0.as_secs_f64()),
            utilization_window: Some(self.utilization_window.0.as_secs_f64()),
            min_utilization: self.min_utilization.clone(),
        }
    }
}

/// `[scheduler]`: agent call deadlines, the queue's admission, and the transient states'
/// deadlines; durations in seconds.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct SchedulerSection {
    /// `create_kernels` (120). An image pull is not part of it: see `image-pull-timeout`.
    pub create_timeout: Seconds,
    /// Longest a session waits in `PULLING` for its image (7200; the agent's own
    /// `[container] image-pull-timeout`, 3600 by default, normally ends a pull first).
    pub image_pull_timeout: Seconds,
    /// `destroy_kernel` (60).
    pub destroy_timeout: Seconds,
    /// Seconds an `execute` run may take when the request gives no `timeout` (600): the agent
    /// kills it then (status `exec-timeout`).
    pub execute_timeout: Seconds,
    /// Seconds an `execute` call waits for output before answering `continued`, when the request
    /// gives no `flush_timeout` (2, Backend.AI's default).
    pub flush_timeout: Seconds,
    /// `reset_instance` of an agent back from `LOST` (60).
    pub reset_timeout: Seconds,
    /// Order of admission within one priority: `fifo` (default) or `drf` (dominant resource
    /// fairness across access keys).
    pub policy: crate::model::queue::QueuePolicy,
    /// Admission rounds a head of its priority that does not fit blocks the sessions behind it
    /// (and lower priorities) before it is passed over (5; Backend.AI's `num_retries_to_skip`).
    /// 0: never blocks (small sessions always fill the gaps).
    pub head_skip_rounds: u32,
    /// Seconds between admission rounds when nothing else starts one (1; a session ending or
    /// being queued on this replica starts one at once).
    pub admission_interval: Seconds,
    /// Pending sessions one admission round looks at, in priority and queue order (1000).
    pub admission_window: u32,
    /// Longest a kernel stays `SCHEDULED` or `PREPARING` before the reconcile sweep asks its
    /// agent and resolves it (300).
    pub preparing_timeout: Seconds,
    /// Longest a kernel stays `CREATING` (300; `create-timeout` normally ends the call first).
    pub creating_timeout: Seconds,
    /// Longest a kernel stays `TERMINATING` (300).
    pub terminating_timeout: Seconds,
    /// Longest a kernel stays `RESTARTING` (600).
    pub restarting_timeout: Seconds,
    /// Seconds between reconcile sweeps over kernels past their state's deadline and agents
    /// past their drain deadline (10).
    pub sweep_interval: Seconds,
    /// The Docker engine of a Swarm manager, where a `multi-node` cluster session's overlay
    /// network (`bai-multinode-<session id>`) is made and removed, as Backend.AI's manager
    /// does (`manager/network/overlay.py`): `unix:///path`, `tcp://host:port` or
    /// `http://host:port`. Unset: the engine of `DOCKER_HOST`, else the local socket. The
    /// agents' engines must be Swarm nodes of it (`docker swarm join`).
    pub swarm_docker_host: Option<String>,
    /// MTU of those overlay networks (`com.docker.network.driver.mtu`); unset: Docker's.
    pub overlay_mtu: Option<u32>,
    /// How a `multi-node` cluster session's kernels spread over the agents: `spread` (default:
    /// each on the least loaded agent, as any session) or `pack` (each on the most loaded agent
    /// that fits it, leaving whole agents free).
    pub cluster_placement: crate::model::cluster::ClusterPlacement,
    // -- graceful termination (issue 41) --
    /// Seconds a session's workload has to exit after its stop signal before it is killed,
    /// when its request names no `grace_period` (default 10).
    pub grace_period: Seconds,
    /// The longest `grace_period` a request may ask for (default 3600); above it, 400
    /// `grace-period-too-long`.
    pub max_grace_period: Seconds,
    // Preemption (issue 41 item 2).
    /// Whether a pending session that fits no agent evicts `preemptible` `RUNNING` sessions
    /// of a strictly lower priority to fit (false).
    pub preemption: bool,
    /// Seconds after a session's preemption during which it is not evicted again (60): a
    /// stream of higher-priority arrivals does not requeue the same session over and over.
    pub preemption_cooldown: Seconds,
}

impl Default for SchedulerSection {
    fn default() -> Self {
        SchedulerSection {
            create_timeout: Seconds(Duration::from_secs(120)),
            image_pull_timeout: Seconds(Duration::from_secs(7200)),
            destroy_timeout: Seconds(Duration::from_secs(60)),
            execute_timeout: Seconds(Duration::from_secs(600)),
            flush_timeout: Seconds(Duration::from_secs(2)),
            reset_timeout: Seconds(Duration::from_secs(60)),
            policy: crate::model::queue::QueuePolicy::Fifo,
            head_skip_rounds: 5,
            admission_interval: Seconds(Duration::from_secs(1)),
            admission_window: 1000,
            preparing_timeout: Seconds(Duration::from_secs(300)),
            creating_timeout: Seconds(Duration::from_secs(300)),
            terminating_timeout: Seconds(Duration::from_secs(300)),
            restarting_timeout: Seconds(Duration::from_secs(600)),
            sweep_interval: Seconds(Duration::from_secs(10)),
            swarm_docker_host: None,
            overlay_mtu: None,
            cluster_placement: Default::default(),
            grace_period: Seconds(Duration::from_secs(10)),
            max_grace_period: Seconds(Duration::from_secs(3600)),
            preemption: false,
            preemption_cooldown: Seconds(Duration::from_secs(60)),
        }
    }
}

/// `[agent-pool]`; every duration in seconds. Defaults: the agent-pool design's (`docs/design.md`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct PoolSection {
    /// Health-check sweep period (30).
    pub health_check_interval: Seconds,
    /// Health-check ping timeout (5).
    pub ping_timeout: Seconds,
    /// Connection errors before an entry is unhealthy (3).
    pub failure_threshold: u32,
    /// Unhealthy time before eviction (60).
    pub recovery_timeout: Seconds,
    /// Wait for callosum's handshake PONG (5).
    pub handshake_timeout: Seconds,
    /// TCP keepalive idle time (60).
    pub tcp_keepalive_idle: u16,
    /// TCP keepalive probe interval (20).
    pub tcp_keepalive_intvl: u16,
    /// TCP keepalive probe count (3).
    pub tcp_keepalive_cnt: u16,
    /// Most agents in the fleet: sizes the open-file limit the manager needs (2 descriptors per
    /// agent: its pool route's and its intake's TCP connections; plus 4096). Given explicitly, the manager
    /// refuses to start when `RLIMIT_NOFILE` (raised to its hard limit) is below that; left
    /// out, it is 20000 or what the limit allows, whichever is less (with a warning).
    pub max_agents: Option<u32>,
    /// ZeroMQ I/O threads of the pool's context (1; one thread moves about 1 GB/s).
    pub io_threads: u16,
    /// Health-check pings in flight at once, at most (256).
    pub health_check_concurrency: u32,
    /// Seconds over which a periodic sweep starts its pings, evenly (half the interval; a few ms:
    /// as fast as the concurrency bound allows).
    pub health_check_spread: Option<Seconds>,
}

impl Default for PoolSection {
    fn default() -> Self {
        let d = PoolSpec::default();
        PoolSection {
            health_check_interval: Seconds(d.health_check_interval),
            ping_timeout: Seconds(d.ping_timeout),
            failure_threshold: d.failure_threshold,
            recovery_timeout: Seconds(d.recovery_timeout),
            handshake_timeout: Seconds(d.handshake_timeout),
            tcp_keepalive_idle: d.keepalive.idle_secs as u16,
            tcp_keepalive_intvl: d.keepalive.interval_secs as u16,
            tcp_keepalive_cnt: d.keepalive.count as u16,
            max_agents: None,
            io_threads: d.io_threads,
            health_check_concurrency: d.health_check_concurrency,
            health_check_spread: None,
        }
    }
}

fn d_max_agents() -> u32 {
    PoolSpec::default().max_agents
}

impl PoolSection {
    /// The pool's runtime spec.
    pub fn spec(&self) -> PoolSpec {
        PoolSpec {
            health_check_interval: self.health_check_interval.0,
            ping_timeout: self.ping_timeout.0,
            failure_threshold: self.failure_threshold,
            recovery_timeout: self.recovery_timeout.0,
            handshake_timeout: self.handshake_timeout.0,
            keepalive: Keepalive {
                idle_secs: self.tcp_keepalive_idle.into(),
                interval_secs: self.tcp_keepalive_intvl.into(),
                count: self.tcp_keepalive_cnt.into(),
            },
            max_agents: self.max_agents.unwrap_or(d_max_agents()),
            io_threads: self.io_threads,
            health_check_concurrency: self.health_check_concurrency,
            health_check_spread: self.health_check_spread.map(|s| s.0),
        }
    }
}

/// `[[registry]]`: one container registry. An image whose reference names this registry's
/// host (`<host>/<repository>:<tag>`) is pulled with these credentials; any other image
/// anonymously.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct RegistrySection {
    /// A name for it (Backend.AI's registry name: `ImageRegistry.name`).
    pub name: String,
    /// `https://registry.example.com` or `http://127.0.0.1:5000`: its host (and port) is
    /// what image references name. A URL without a scheme is taken as `https://`.
    pub url: String,
    /// User name, when the registry needs one.
    pub username: Option<String>,
    /// A file holding the password or token (first line; never in this file, never logged).
    /// Required with `username`.
    pub password_file: Option<PathBuf>,
}

impl RegistrySection {
    /// Checks the entry: a name, a URL with a host, a password file with a user name (and only
    /// with one).
    ///
    /// Errors: the reason, for `ConfigError::Invalid("registry", …)`.
    pub fn check(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("every [[registry]] needs a `name`".into());
        }
        if registry_url_host(&self.url).is_empty() {
            return Err(format!(
                "registry `{}`: `url` has no host: {:?}",
                self.name, self.url
            ));
        }
        if self.username.is_some() != self.password_file.is_some() {
            return Err(format!(
                "registry `{}`: `username` and `password-file` go together",
                self.name
            ));
        }
        Ok(())
    }
}

/// `https://host:port/path` → `host:port`, lower-cased: what image references name.
pub fn registry_url_host(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    rest.split('/').next().unwrap_or("").to_ascii_lowercase()
}

/// `[[agents]]`: an agent the manager knows without waiting for its heartbeat.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct StaticAgent {
    /// Agent id.
    pub id: String,
    /// Its RPC address.
    pub addr: HostPort,
    /// Its public certificate; omit for an unauthenticated agent.
    pub public_key: Option<PathBuf>,
}

impl ManagerConfig {
    /// Loads and checks a manager config file.
    ///
    /// Errors: see [`super::load`]; `failure-threshold = 0`; a CURVE agent without `rpc-keypair`;
    /// only one of `api.tls-cert` and `api.tls-key` (an error naming `api.tls-key`).
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        super::load(path, Self::validate)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.agent_pool.failure_threshold == 0 {
            return Err(ConfigError::Invalid(
                "agent-pool.failure-threshold",
                "must be at least 1".into(),
            ));
        }
        let m = &self.manager;
        if m.startup_grace.0 <= m.heartbeat_interval.0 * 2 {
            return Err(ConfigError::Invalid(
                "manager.startup-grace",
                format!(
                    "must exceed 2 × heartbeat-interval ({:?})",
                    m.heartbeat_interval.0 * 2
                ),
            ));
        }
        if m.heartbeat_timeout.0 <= m.heartbeat_interval.0 {
            return Err(ConfigError::Invalid(
                "manager.heartbeat-timeout",
                "must exceed heartbeat-interval".into(),
            ));
        }
        if m.rpc_keypair.is_some() != m.agent_keys_dir.is_some() {
            return Err(ConfigError::Invalid(
                "manager.agent-keys-dir",
                "rpc-keypair and agent-keys-dir go together (CURVE on the event intake)".into(),
            ));
        }
        if !(self.store.url.starts_with("sqlite:")
            || self.store.url.starts_with("postgres:")
            || self.store.url.starts_with("postgresql:"))
        {
            return Err(ConfigError::Invalid(
                "store.url",
                format!(
                    "`{}`: expected sqlite://PATH or postgres://…",
                    self.store.url
                ),
            ));
        }
        if self.api.tls_cert.is_some() != self.api.tls_key.is_some() {
            return Err(ConfigError::Invalid(
                "api.tls-key",
                "tls-cert and tls-key go together (TLS on the API), or neither (plain HTTP)".into(),
            ));
        }
        for r in &self.registry {
            r.check()
                .map_err(|why| ConfigError::Invalid("registry", why))?;
        }
        // Idle reclaim.
        self.reclaim
            .defaults()
            .check()
            .map_err(|e| ConfigError::Invalid("reclaim", e.0))?;
        if self.api.workers == 0 {
            return Err(ConfigError::Invalid(
                "api.workers",
                "must be at least 1".into(),
            ));
        }
        if !self.access_keys.is_empty() {
            return Err(ConfigError::Invalid(
                "access-keys",
                "[[access-keys]] is no longer read: access keys and their secrets are managed over \
                 the API (`kernelvisor ctl access-key create`); remove the section"
                    .into(),
            ));
        }
        if self.manager.rpc_keypair.is_none() && self.agents.iter().any(|a| a.public_key.is_some())
        {
            return Err(ConfigError::Invalid(
                "manager.rpc-keypair",
                "required when an agent has a public-key".into(),
            ));
        }
        Ok(())
    }
}

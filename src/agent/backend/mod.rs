//! Container backends: the agent's view of a container engine.
//!
//! [`ContainerBackend`] is everything the kernel stages, the RPC methods and the exit watcher
//! need from an engine. Two implementations: [`docker::DockerBackend`] (the local Docker
//! engine through bollard) and [`dummy::DummyBackend`] (containers simulated in memory with
//! configurable delays, for scale tests and for agents on hosts without an engine).

pub mod docker;
pub mod dummy;

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

/// Labels every kernel container carries (Backend.AI's names); the second source of truth
/// after the agent's store (`docs/design.md`).
pub mod labels {
    /// The kernel id.
    pub const KERNEL_ID: &str = "ai.backend.kernel-id";
    /// The session id.
    pub const SESSION_ID: &str = "ai.backend.session-id";
    /// The agent that created the container: a container without this agent's id here is
    /// never touched.
    pub const AGENT_ID: &str = "ai.backend.agent-id";
    /// The owner as JSON: `{"user_id", "project_id", "access_key"}`.
    pub const OWNER: &str = "ai.backend.owner";
    /// The service ports as JSON (see `ServicePort`).
    pub const SERVICE_PORTS: &str = "ai.backend.service-ports";
    /// On an image: the interpreter `execute` runs code with (`<path> -c <code>`); `sh` when absent.
    pub const RUNTIME_PATH: &str = "ai.backend.runtime-path";
    /// The session type (`interactive` or `batch`), so a dangling kernel is rebuilt as it was.
    pub const SESSION_TYPE: &str = "ai.backend.session-type";
    /// The kernel's restart policy as JSON (`crate::workload::RestartPolicy`), likewise.
    pub const RESTART_POLICY: &str = "ai.kernelvisor.restart-policy";
    /// The kernel's slots as JSON `{name: "decimal"}` (Backend.AI's label name).
    pub const RESOURCE_SLOTS: &str = "ai.backend.resource.slots";
    /// The kernel's accelerator devices as JSON `{slot: {device id: "decimal"}}`.
    pub const DEVICES: &str = "ai.kernelvisor.devices";
}

/// An engine error, classified for the kernel's error names.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The registry answered that it has no such image (or tag), or the image is not local and
    /// may not be pulled.
    #[error("image not found: {0}")]
    ImageNotFound(String),
    /// The image's registry cannot be reached: its name does not resolve, it refuses
    /// connections, TLS fails, or it does not answer (FAILURE name `RegistryUnreachable`).
    #[error("registry unreachable: {0}")]
    RegistryUnreachable(String),
    /// The registry refused the credentials (or asked for some and none were given) (FAILURE
    /// name `RegistryAuthFailed`).
    #[error("registry authentication failed: {0}")]
    RegistryAuthFailed(String),
    /// No such container.
    #[error("container not found: {0}")]
    ContainerNotFound(String),
    /// No such path in the container (archive API).
    #[error("no such file or directory in the container: {0}")]
    PathNotFound(String),
    /// The engine cannot be reached: its socket is missing, refuses connections, the
    /// connection broke mid-request, or it did not answer in time. Transient: the engine is
    /// down or restarting (FAILURE name `ContainerEngineUnavailable`).
    #[error("container engine unavailable: {0}")]
    Unavailable(String),
    /// The engine refused the request (or failed it for another reason).
    #[error("{0}")]
    Engine(String),
}

impl BackendError {
    /// `true` for [`BackendError::Unavailable`]: the engine itself is unreachable, not this
    /// request wrong.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, BackendError::Unavailable(_))
    }
}

/// A local image.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ImageInfo {
    /// The engine's id (`sha256:…`).
    pub id: String,
    /// The reference it was asked for.
    pub reference: String,
    /// The image's labels (e.g. [`labels::RUNTIME_PATH`]).
    pub labels: HashMap<String, String>,
}

/// Credentials for a registry (Backend.AI's `ImageRegistry` without its name). `Debug` never
/// prints the password.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RegistryAuth {
    /// User name.
    pub username: String,
    /// Password or token.
    pub password: String,
    /// The registry's host (`registry.example.com`, `127.0.0.1:5000`), as the engine keys its
    /// credentials.
    pub server: String,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("server", &self.server)
            .finish()
    }
}

/// One image the engine holds, as its image list shows it (`docker image ls`; the engine's
/// `GET /images/json`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImageSummary {
    /// The engine's id (`sha256:…`).
    pub id: String,
    /// Its references (`repo:tag`) as the engine lists them (`python:3.12`,
    /// `registry.example.com:5000/team/cuda:12.4`), without Docker's `<none>:<none>`; may be
    /// empty (an untagged image).
    pub tags: Vec<String>,
    /// Its size on disk in bytes (the engine's `Size`: every layer, shared ones included).
    pub size_bytes: u64,
    /// Its labels (empty when it has none).
    pub labels: HashMap<String, String>,
}

/// One step of an image pull (or push), as the engine reports it.
#[derive(Clone, Debug, Default)]
pub struct PullProgress {
    /// The layer it is about (the engine's short layer id); `None` for lines about the whole
    /// image (`Pulling from …`, `Digest: …`, `Status: …`).
    pub layer: Option<String>,
    /// The engine's status line (`Downloading`, `Pull complete`, …).
    pub status: String,
    /// Bytes done and total of the current layer, when known.
    pub current: Option<i64>,
    /// See `current`.
    pub total: Option<i64>,
}

/// A bind mount of a host path into the container.
///
/// [`Bind::parse`] reads Docker's `host:container[:options]` form back.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Bind {
    /// Absolute host path.
    pub host_path: String,
    /// Absolute path in the container.
    pub container_path: String,
    /// Read-only when `true`.
    pub read_only: bool,
}

impl Bind {
    /// Reads Docker's `HostConfig.Binds` entry `host:container[:opts]` (`opts` comma-separated;
    /// `ro` makes it read-only). `None` for anything else (a named volume has no absolute host
    /// path).
    pub fn parse(entry: &str) -> Option<Bind> {
        let mut parts = entry.splitn(3, ':');
        let host_path = parts.next()?;
        let container_path = parts.next()?;
        let read_only = parts
            .next()
            .is_some_and(|o| o.split(',').any(|x| x == "ro"));
        (host_path.starts_with('/') && container_path.starts_with('/')).then(|| Bind {
            host_path: host_path.to_owned(),
            container_path: container_path.to_owned(),
            read_only,
        })
    }
}

/// A container port published on a host port.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct PortMapping {
    /// TCP port inside the container.
    pub container_port: u16,
    /// TCP port on the host.
    pub host_port: u16,
}

/// Everything needed to create a kernel's container.
#[derive(Clone, Debug, Default)]
pub struct ContainerSpec {
    /// Container name (unique on the engine).
    pub name: String,
    /// Image reference or id.
    pub image: String,
    /// `KEY=VALUE` pairs.
    pub env: Vec<String>,
    /// Labels (see [`labels`]).
    pub labels: HashMap<String, String>,
    /// Memory limit in bytes (no swap beyond it); `None` = unlimited.
    pub memory_bytes: Option<i64>,
    /// CPU limit in billionths of a core (Docker's `NanoCpus`); `None` = unlimited.
    pub nano_cpus: Option<i64>,
    /// Maximum number of processes.
    pub pids_limit: Option<i64>,
    /// Size of `/dev/shm` in bytes.
    pub shm_size: Option<i64>,
    /// Bind mounts (scratch, vfolders).
    pub binds: Vec<Bind>,
    /// Published ports, bound on `port_bind_host`.
    pub ports: Vec<PortMapping>,
    /// Host address the published ports bind to.
    pub port_bind_host: String,
    /// GPU indexes passed as Docker device requests (driver `nvidia`); empty for none.
    pub gpu_device_ids: Vec<String>,
    /// Host device nodes (`/dev/…`) passed through at the same path (`rwm`); empty for none.
    pub device_nodes: Vec<String>,
    /// Replaces the image's command (`["sh", "-c", command]` for a session's `command`).
    pub cmd: Option<Vec<String>>,
    /// Replaces the image's working directory.
    pub working_dir: Option<String>,
    /// `uid[:gid]` the container's processes run as; the image's user when `None`
    /// (Backend.AI's `uid` / `main_gid`).
    pub user: Option<String>,
    /// Supplementary group ids (Backend.AI's `supplementary_gids`).
    pub group_add: Vec<String>,
    /// The container's hostname (Backend.AI's `cluster_hostname`); the engine's when `None`.
    pub hostname: Option<String>,
    /// Replaces the image's entrypoint (a runner kernel's `/opt/kernel/entrypoint.sh`).
    pub entrypoint: Option<Vec<String>>,
    /// The engine's init (`docker-init`) as PID 1, reaping zombies (runner kernels).
    pub init: bool,
    /// The signal a stop sends first (`SIGINT` for runner kernels, as upstream); the
    /// image's when `None`.
    pub stop_signal: Option<String>,
    /// Ports published on 127.0.0.1 only (a runner's repl-in/repl-out: upstream binds them
    /// to the loopback, whatever `port_bind_host` is).
    pub local_ports: Vec<PortMapping>,
    /// Capabilities added to the engine's default set (a runner kernel's `IPC_LOCK`,
    /// `SYS_NICE`, as upstream's Docker agent adds).
    pub cap_add: Vec<String>,
    /// The network the container joins instead of the engine's default bridge (a cluster
    /// kernel's, `crate::agent::kernel::cluster`); `None`: the default.
    pub network: Option<NetworkAttachment>,
    /// `name:address` entries added to the container's `/etc/hosts` (Docker's
    /// `HostConfig.ExtraHosts`; a host-network cluster kernel's peers).
    pub extra_hosts: Vec<String>,
}

/// Where a container is attached (Docker's `HostConfig.NetworkMode` and its
/// `NetworkingConfig.EndpointsConfig` entry), as Backend.AI's `apply_network` sets them
/// (`src/ai/backend/agent/docker/agent.py`, `docker/intrinsic.py`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetworkAttachment {
    /// `HostConfig.NetworkMode`: a network's name, or [`HOST_NETWORK`].
    pub mode: String,
    /// The container's DNS aliases on that network (`EndpointsConfig[mode].Aliases`); unused
    /// with [`HOST_NETWORK`].
    pub aliases: Vec<String>,
    /// The endpoint's driver options (`EndpointsConfig[mode].DriverOpts`; an overlay kernel's
    /// `com.docker.network.endpoint.ifname`).
    pub driver_opts: HashMap<String, String>,
}

/// `HostConfig.NetworkMode` for the host's network namespace: no endpoint, no published ports.
pub const HOST_NETWORK: &str = "host";

/// A container's state as the engine reports it.
#[derive(Clone, Debug, Default)]
pub struct ContainerState {
    /// The engine's id.
    pub id: String,
    /// `true` while running (or restarting).
    pub running: bool,
    /// The exit code once exited.
    pub exit_code: Option<i64>,
    /// The kernel was killed by the OOM killer.
    pub oom_killed: bool,
    /// Its labels.
    pub labels: HashMap<String, String>,
    /// Published ports as the engine bound them.
    pub ports: Vec<PortMapping>,
    /// The host pid of its init process while running (where its cgroup and network
    /// namespace are found); `None` when not running or not known (listings, dummy).
    pub pid: Option<u32>,
    /// Its address while running, reachable from the host: on the default bridge, else on
    /// `docker_gwbridge` (a container on a Swarm overlay: the overlay's own address is not
    /// reachable from the host), else on its first network by name. Where a service's
    /// readiness is probed. `None` when unknown (listings, dummy).
    pub ip_address: Option<String>,
    /// Its Docker `HEALTHCHECK` status (`starting`, `healthy`, `unhealthy`); `None` when the
    /// image has no health check (or the backend does not know).
    pub health: Option<String>,
}

/// What the engine still knows of a container's creation: enough to rebuild a kernel whose
/// store record is gone (a dangling container, `docs/design.md`).
#[derive(Clone, Debug, Default)]
pub struct ContainerDescription {
    /// The engine's id.
    pub id: String,
    /// `true` while running (or restarting).
    pub running: bool,
    /// The creation spec as the engine reports it: `name` (no leading `/`), `image` (the image
    /// id the container runs), `env` (the image's environment included), `labels`, the
    /// `HostConfig` limits (`memory_bytes`, `nano_cpus`, `pids_limit`, `shm_size`), `binds`
    /// (the `HostConfig.Binds` strings parsed), `ports` (the `HostConfig.PortBindings` TCP
    /// entries, sorted by container port) with the address they bind in `port_bind_host`,
    /// `gpu_device_ids` (the `nvidia` device requests), `cmd` and `working_dir`.
    pub spec: ContainerSpec,
}

/// A container exited (the engine's `die` event) or the OOM killer ran in it (`oom`).
#[derive(Clone, Debug)]
pub struct ContainerExit {
    /// The engine's container id.
    pub container_id: String,
    /// Its labels at exit.
    pub labels: HashMap<String, String>,
    /// `true` for the engine's `oom` event, which may come before or after the `die`.
    pub oom: bool,
}

/// Which of a process's output streams a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OutputStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl OutputStream {
    /// `"stdout"` or `"stderr"`, Backend.AI's console names.
    pub fn as_str(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// A started exec: its output as it comes and, when asked for, its stdin.
///
/// The output stream is pulled: while nobody polls it the engine's connection is not read, so
/// the process blocks on its write once the pipes are full (backpressure, no buffering here).
pub struct ExecSession {
    /// The engine's exec id, for [`ContainerBackend::exec_status`] and [`ContainerBackend::exec_kill`].
    pub exec_id: String,
    /// Output chunks in arrival order (each at most what the engine sent in one frame).
    pub output: BoxStream<'static, Result<(OutputStream, Bytes), BackendError>>,
    /// The process's stdin when the exec was started with `stdin`; shutting it down closes it.
    pub stdin: Option<std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>>,
}

/// A process to start in a running container with [`ContainerBackend::exec_start`].
#[derive(Clone, Debug, Default)]
pub struct ExecSpec {
    /// Argument vector (no shell unless it names one).
    pub cmd: Vec<String>,
    /// Working directory; the image's when `None`.
    pub working_dir: Option<String>,
    /// Extra `KEY=VALUE` environment on top of the container's.
    pub env: Vec<String>,
    /// Keep its stdin open for writing ([`ExecSession::stdin`]).
    pub stdin: bool,
    /// Start it and return at once, attached to nothing (a service that writes its own log):
    /// the session's output stream is empty.
    pub detach: bool,
    /// Give it a pseudo-terminal of this size (its stdin, stdout and stderr; the output is
    /// one stream, [`OutputStream::Stdout`], with the terminal's bytes as the line discipline
    /// made them: echo, `\r\n`). `None`: plain pipes.
    pub tty: Option<TtySize>,
    /// `uid:gid` to run as; the container's user when `None` (a runner kernel's container runs
    /// as root, its user's processes as the kernel's uid).
    pub user: Option<String>,
}

/// A terminal's size in character cells (`rows` lines of `cols` columns), as `TIOCSWINSZ` sets it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TtySize {
    /// Lines.
    pub rows: u16,
    /// Columns.
    pub cols: u16,
}

/// An exec the engine still knows for a container (found again after an agent restart).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecProcess {
    /// The engine's exec id.
    pub exec_id: String,
    /// Still running.
    pub running: bool,
    /// Its argument vector.
    pub cmd: Vec<String>,
}

/// An exec's state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExecStatus {
    /// Still running.
    pub running: bool,
    /// The exit code once it ended.
    pub exit_code: Option<i64>,
}

/// The agent's view of a container engine. Every call is cancel-safe; a container that is
/// already gone is `Ok` for [`remove_container`](ContainerBackend::remove_container), so
/// teardown is idempotent.
#[async_trait]
pub trait ContainerBackend: Send + Sync + 'static {
    /// `"docker"` or `"dummy"`.
    fn kind(&self) -> &'static str;

    /// Asks the engine whether it answers, waiting at most `timeout`; the engine-health probe
    /// (see [`crate::agent::engine`]). The dummy engine always answers.
    ///
    /// Errors: [`BackendError::Unavailable`] when it cannot be reached or does not answer in
    /// time; `Engine` when it answers with an error.
    async fn ping(&self, timeout: Duration) -> Result<(), BackendError> {
        let _ = timeout;
        Ok(())
    }

    /// The local image `reference`, or `None` when absent.
    async fn inspect_image(&self, reference: &str) -> Result<Option<ImageInfo>, BackendError>;

    /// Every image the engine holds (Backend.AI's `scan_images` lists the same), in the
    /// engine's order. Errors: `Unavailable` / `Engine` as for every call.
    async fn list_images(&self) -> Result<Vec<ImageSummary>, BackendError>;

    /// Pulls `reference` with `auth` (anonymously when `None`), reporting each progress line.
    ///
    /// Errors: [`BackendError::ImageNotFound`] when the registry has no such image or tag,
    /// [`BackendError::RegistryUnreachable`], [`BackendError::RegistryAuthFailed`],
    /// [`BackendError::Unavailable`] when the engine itself cannot be reached.
    async fn pull_image(
        &self,
        reference: &str,
        auth: Option<&RegistryAuth>,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<ImageInfo, BackendError>;

    /// Creates (does not start) a container; returns its id.
    async fn create_container(&self, spec: &ContainerSpec) -> Result<String, BackendError>;

    /// Starts a created container.
    async fn start_container(&self, id: &str) -> Result<(), BackendError>;

    /// The container's state, or `None` when it does not exist.
    async fn inspect_container(&self, id: &str) -> Result<Option<ContainerState>, BackendError>;

    /// What the engine knows of the container's creation (see [`ContainerDescription`]), or
    /// `None` when it does not exist.
    async fn describe_container(
        &self,
        id: &str,
    ) -> Result<Option<ContainerDescription>, BackendError>;

    /// Kills and removes the container with its anonymous volumes; `Ok` if already gone.
    async fn remove_container(&self, id: &str) -> Result<(), BackendError>;

    /// Restarts the container (stop with `timeout`, then start).
    async fn restart_container(&self, id: &str, timeout: Duration) -> Result<(), BackendError>;

    /// Sends `signal` (e.g. `"SIGINT"`) to the container's main process.
    async fn signal_container(&self, id: &str, signal: &str) -> Result<(), BackendError>;

    /// Every container (running or not) whose label `key` equals `value`.
    async fn list_containers(
        &self,
        key: &str,
        value: &str,
    ) -> Result<Vec<ContainerState>, BackendError>;

    /// Starts `spec.cmd` in the running container, streaming its output (none when
    /// `spec.detach`); with `spec.stdin` its standard input stays open for writing.
    ///
    /// Errors: [`BackendError::ContainerNotFound`], or `Engine` when it is not running.
    async fn exec_start(&self, id: &str, spec: ExecSpec) -> Result<ExecSession, BackendError>;

    /// The execs the engine still knows for the container (running ones at least).
    ///
    /// Errors: [`BackendError::ContainerNotFound`].
    async fn exec_processes(&self, id: &str) -> Result<Vec<ExecProcess>, BackendError>;

    /// A tar archive of `path` in the container (the engine's archive API: a directory comes
    /// with everything under it, a symlink as the link itself), streamed as the engine sends it.
    ///
    /// Errors (in the stream): [`BackendError::PathNotFound`], [`BackendError::ContainerNotFound`].
    fn archive_get(&self, id: &str, path: &str) -> BoxStream<'static, Result<Bytes, BackendError>>;

    /// Extracts the tar archive `tar` into the existing directory `dir` of the container,
    /// streaming it to the engine as the stream yields (ending it early aborts the upload with an
    /// error). Ownership and modes come from the tar headers.
    ///
    /// Errors: [`BackendError::PathNotFound`] when `dir` does not exist, `Engine` for a bad
    /// archive or a directory where a file should go.
    async fn archive_put(
        &self,
        id: &str,
        dir: &str,
        tar: BoxStream<'static, Bytes>,
    ) -> Result<(), BackendError>;

    /// The state of an exec started by [`exec_start`](ContainerBackend::exec_start).
    async fn exec_status(&self, exec_id: &str) -> Result<ExecStatus, BackendError>;

    /// Kills an exec's process and all its descendants (no-op once it ended).
    async fn exec_kill(&self, exec_id: &str) -> Result<(), BackendError>;

    /// Sets the terminal size of an exec started with [`ExecSpec::tty`] (its processes get
    /// `SIGWINCH`).
    ///
    /// Errors: `Engine` when the exec has no terminal or is gone; the dummy engine has no
    /// terminals (`Engine`).
    async fn exec_resize(&self, exec_id: &str, size: TtySize) -> Result<(), BackendError> {
        let _ = (exec_id, size);
        Err(BackendError::Engine(format!(
            "the {} engine has no terminals",
            self.kind()
        )))
    }

    /// The container's stdout and stderr (merged) from `since` (Unix seconds; 0 for all), then
    /// as they are written, until the container stops or is removed.
    fn follow_logs(&self, id: &str, since: i64) -> BoxStream<'static, Result<Bytes, BackendError>>;

    /// Exits (and OOM events) of containers whose label `key` equals `value`, as they happen.
    /// The stream ends
    /// when the engine connection drops; the caller resubscribes and reconciles.
    fn exits(
        &self,
        key: &str,
        value: &str,
    ) -> BoxStream<'static, Result<ContainerExit, BackendError>>;

    /// The engine's own statistics of a running container, for when its cgroup files cannot
    /// be read (the stats sampler's fallback; Docker's stats API is slow: ~1 s per call).
    /// `None`: the engine has none (gone, or the dummy backend).
    async fn stats(&self, id: &str) -> Result<Option<EngineStats>, BackendError> {
        let _ = id;
        Ok(None)
    }

    /// The labels of the network named exactly `name`, or `None` when there is none (the
    /// `create_local_network` / `destroy_local_network` methods).
    async fn inspect_network(
        &self,
        name: &str,
    ) -> Result<Option<HashMap<String, String>>, BackendError> {
        let _ = name;
        Ok(None)
    }

    /// Creates a bridge network `name` with `labels`; `Ok(false)` when one of that name
    /// already exists (nothing changed).
    async fn create_network(
        &self,
        name: &str,
        labels: &HashMap<String, String>,
    ) -> Result<bool, BackendError> {
        let _ = (name, labels);
        Ok(false)
    }

    /// The first IPAM subnet of the network named exactly `name` (`10.0.0.0/24`), or `None`
    /// when there is no such network or it has no subnet (an overlay kernel's
    /// `docker_gwbridge`, which MPI must skip). The dummy engine has none.
    async fn network_subnet(&self, name: &str) -> Result<Option<String>, BackendError> {
        let _ = name;
        Ok(None)
    }

    /// Removes the network `name`; `Ok(false)` when there was none.
    ///
    /// Errors: `Engine` when the engine refuses (containers still attached).
    async fn remove_network(&self, name: &str) -> Result<bool, BackendError> {
        let _ = name;
        Ok(false)
    }

    /// Removes the local image `reference` (a tag or an id) as `docker rmi` does (Backend.AI's
    /// `purge_images` calls the engine the same way): with `force` also when stopped
    /// containers use it or it has other tags (the engine then only untags an image a running
    /// container uses, its layers stay), with `noprune` its untagged parents stay. Returns what
    /// the engine did, one line per step: `Untagged: <reference>`, `Deleted: sha256:…`.
    ///
    /// Errors: [`BackendError::ImageNotFound`] when there is no such local image; `Engine` when
    /// the engine refuses (a container uses it and no `force`: `conflict: unable to remove
    /// repository reference …`).
    async fn remove_image(
        &self,
        reference: &str,
        force: bool,
        noprune: bool,
    ) -> Result<Vec<String>, BackendError>;

    /// Saves container `id`'s filesystem as the local image `reference` (`repo[:tag]`,
    /// `latest` when it has no tag) as `docker commit` does, the container paused meanwhile.
    /// Bind mounts (the kernel's `/home/work` scratch, vfolders) are not part of it. The
    /// image's config is the container's with `labels` added, except that the kernel labels of
    /// [`labels`] the container carries are set back to the base image's values (empty when
    /// it had none: the engine cannot drop a label), so a container of the new image is not
    /// taken for this kernel's; and its command is the base image's (not a session's
    /// `command`).
    ///
    /// Errors: [`BackendError::ContainerNotFound`]; `Engine` for a bad reference or a refusal.
    async fn commit_container(
        &self,
        id: &str,
        reference: &str,
        labels: &HashMap<String, String>,
    ) -> Result<ImageInfo, BackendError>;

    /// Pushes the local image `reference` (`host[:port]/repo:tag`; `latest` when it has no
    /// tag) to its registry with `auth` (anonymously when `None`), reporting each progress
    /// line: `Pushing` with the bytes done and total of one layer, `Pushed`, `Layer already
    /// exists`. `layer` is `None`: the engine's push lines as bollard reads them do not name
    /// their layer.
    ///
    /// Errors: [`BackendError::ImageNotFound`] when there is no such local image,
    /// [`BackendError::RegistryUnreachable`], [`BackendError::RegistryAuthFailed`] (the
    /// registry refused the credentials, or the push, for want of them),
    /// [`BackendError::Unavailable`] when the engine itself cannot be reached.
    async fn push_image(
        &self,
        reference: &str,
        auth: Option<&RegistryAuth>,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<(), BackendError>;
}

/// Re-inspections (20 ms apart) of an exec whose output ended before the engine recorded its
/// exit code.
const EXIT_CODE_RECHECKS: usize = 100;

/// The exit code of an exec whose output ended (the engine can record it a moment later);
/// `None` when the engine does not say (the container went, or it never recorded one).
pub async fn exec_exit_code(backend: &dyn ContainerBackend, exec_id: &str) -> Option<i64> {
    for _ in 0..EXIT_CODE_RECHECKS {
        match backend.exec_status(exec_id).await {
            Ok(s) if !s.running && s.exit_code.is_some() => return s.exit_code,
            Ok(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(_) => return None,
        }
    }
    None
}

/// A container's statistics as the engine reports them (cumulative counters).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineStats {
    /// The cgroup figures (CPU ns, memory bytes, block I/O bytes).
    pub cgroup: crate::agent::stats::cgroup::ContainerSample,
    /// Bytes received over every interface but `lo`.
    pub net_rx_bytes: u64,
    /// Bytes sent.
    pub net_tx_bytes: u64,
}

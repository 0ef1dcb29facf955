//! The kernel lifecycle methods and the kernel config types, as Backend.AI 26.x names and shapes
//! them (`ai.backend.common.types`: `KernelCreationConfig`, `ImageConfig`, `ImageRegistry`,
//! `ClusterInfo`, `VFolderMount`, `KernelCreationResult`; `ai.backend.common.docker.ImageRef`;
//! the methods of `ai.backend.agent.server.AgentRPCServer`).
//!
//! kernelvisor's own extensions of `KernelCreationConfig` (`service_ports`, `restart_policy`,
//! `batch_timeout`, `_inject`) are optional keys a Backend.AI manager never sends.

use std::collections::BTreeMap;
use std::fmt;

use rmpv::Value;
use serde::{Deserialize, Serialize};

use super::Method;

/// `ai.backend.common.types.AutoPullBehavior`: when the agent pulls the image before creating.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AutoPullBehavior {
    /// Pull when the local image's digest differs from `ImageConfig.digest` (upstream's default).
    #[default]
    Digest,
    /// Pull when no image with the tag is present.
    Tag,
    /// Never pull; a missing image fails the create.
    None,
}

/// `ai.backend.common.types.SessionTypes` (sent as a pickled enum, read as its value).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionTypes {
    /// Runs until destroyed; code runs through `execute`.
    #[default]
    Interactive,
    /// Runs its `startup_command`; its exit ends the session with a result.
    Batch,
    /// A model-serving replica (run as interactive here).
    Inference,
    /// A system session (run as interactive here).
    System,
}

/// `ai.backend.common.types.ClusterMode`: one type for the wire and the API.
pub use crate::model::cluster::ClusterMode;

/// `ai.backend.common.types.ImageRegistry`: where the image comes from, with credentials.
/// `Debug` never prints the password.
#[derive(Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRegistry {
    /// Registry name as the manager knows it (`local` for images built on the node).
    pub name: String,
    /// Registry URL (`https://cr.backend.ai`); empty for `local`.
    #[serde(default)]
    pub url: String,
    /// User name for the registry, if it needs one.
    #[serde(default)]
    pub username: Option<String>,
    /// Password or token for the registry.
    #[serde(default)]
    pub password: Option<String>,
}

impl fmt::Debug for ImageRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImageRegistry")
            .field("name", &self.name)
            .field("url", &self.url)
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// The registry host an image reference names, Docker's rule: its first path component when
/// it has several and that one has a `.` or a `:` or is `localhost`; otherwise Docker Hub
/// (`docker.io`). Lower-cased.
pub fn registry_host(reference: &str) -> String {
    match reference.split_once('/') {
        Some((first, _)) if first.contains('.') || first.contains(':') || first == "localhost" => {
            first.to_ascii_lowercase()
        }
        _ => "docker.io".into(),
    }
}

/// `ai.backend.common.types.ImageConfig`: the image a kernel runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// The full reference the engine pulls and runs (`cr.backend.ai/stable/python:3.12`, or a
    /// local tag).
    pub canonical: String,
    /// Project (namespace) within the registry.
    #[serde(default)]
    pub project: Option<String>,
    /// `x86_64`, `aarch64`.
    #[serde(default = "default_architecture")]
    pub architecture: String,
    /// Image id the manager knows (`sha256:…`); empty when unknown.
    #[serde(default)]
    pub digest: String,
    /// Registry digest, when known.
    #[serde(default)]
    pub repo_digest: Option<String>,
    /// The registry and its credentials.
    pub registry: ImageRegistry,
    /// The image's labels as the manager scanned them (`ai.backend.service-ports`, …).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Built on the node, never pulled.
    #[serde(default)]
    pub is_local: bool,
    /// When to pull.
    #[serde(default)]
    pub auto_pull: AutoPullBehavior,
}

fn default_architecture() -> String {
    std::env::consts::ARCH.to_owned()
}

impl ImageConfig {
    /// The image as upstream's `ImageRef.from_image_config` names it: `canonical` less its
    /// registry prefix, split at the last `:` into repository and tag (`latest` when none),
    /// the repository less its project prefix. `None` where upstream would raise: a canonical
    /// name that is not under its registry or its project (`ProjectMismatchWithCanonical`), or
    /// one without a repository.
    pub fn image_ref(&self) -> Option<ImageRef> {
        let registry = &self.registry.name;
        // Upstream's `parse_image_str` reads the part before the first `/` as the registry when
        // it is the registry's name (a name with a port, `127.0.0.1:5000`, included).
        let rest = self
            .canonical
            .strip_prefix(registry.as_str())
            .and_then(|r| r.strip_prefix('/'))?;
        let rest = rest.split('@').next().unwrap_or(rest);
        let (repo, tag) = match rest.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => (repo, tag),
            _ => (rest, "latest"),
        };
        if repo.is_empty() {
            return None;
        }
        let project = self.project.as_deref().filter(|p| !p.is_empty());
        let name = match project {
            None => repo.to_owned(),
            Some(p) if repo == p => String::new(),
            Some(p) => repo.strip_prefix(p)?.strip_prefix('/')?.to_owned(),
        };
        Some(ImageRef {
            name,
            project: project.map(str::to_owned),
            tag: tag.to_owned(),
            registry: registry.clone(),
            architecture: self.architecture.clone(),
            is_local: self.is_local,
        })
    }
}

impl ImageConfig {
    /// A local image (registry `local`, never pulled) named `canonical`.
    pub fn local(canonical: &str) -> ImageConfig {
        ImageConfig {
            canonical: canonical.to_owned(),
            architecture: default_architecture(),
            registry: ImageRegistry {
                name: "local".into(),
                ..ImageRegistry::default()
            },
            is_local: true,
            auto_pull: AutoPullBehavior::None,
            ..ImageConfig::default()
        }
    }
}

impl ImageConfig {
    /// An image named by a plain reference (`python:3.12`, `registry.example.com/team/img:1`),
    /// pulled anonymously when the node lacks it (`auto_pull = tag`): what kernelvisor's own
    /// manager sends until registries are configured (the Images issue).
    pub fn by_reference(reference: &str) -> ImageConfig {
        ImageConfig {
            canonical: reference.to_owned(),
            architecture: default_architecture(),
            is_local: false,
            auto_pull: AutoPullBehavior::Tag,
            ..ImageConfig::default()
        }
    }
}

/// `ai.backend.common.docker.ImageRef` (a pickle on the wire, read as this map by the codec):
/// an image named by its parts. Upstream's agent also puts it in its image pull events
/// (`image_ref`), where the manager reads which of its images (by canonical name and
/// architecture) a pull was for (`event_dispatcher/handlers/image.py`); there it is the
/// dataclass's fields as JSON.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRef {
    /// Image name without registry, project and tag.
    pub name: String,
    /// Project (namespace).
    #[serde(default)]
    pub project: Option<String>,
    /// Tag.
    #[serde(default)]
    pub tag: String,
    /// Registry name.
    #[serde(default)]
    pub registry: String,
    /// Architecture.
    #[serde(default)]
    pub architecture: String,
    /// Built on the node.
    #[serde(default)]
    pub is_local: bool,
}

/// `ai.backend.common.types.VFolderMount` as `to_json()` writes it: a vfolder bound into the
/// kernel. `permission` (kernelvisor before this contract) is read as `mount_perm`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VFolderMount {
    /// Folder name.
    pub name: String,
    /// Storage id (`quota_scope_id/folder_id`), kept for labels.
    #[serde(default)]
    pub vfid: String,
    /// Sub-path inside the folder that is mounted (`.`).
    #[serde(default)]
    pub vfsubpath: Option<String>,
    /// Host path; confined under the agent's `[container] vfolder-root`.
    pub host_path: String,
    /// Where it appears in the container; default `/home/work/<name>`.
    #[serde(default)]
    pub kernel_path: Option<String>,
    /// `ro`, `rw` or `wd` (`rw` for the working directory).
    #[serde(default = "default_perm", alias = "permission")]
    pub mount_perm: String,
    /// `general`, `model`, `data`.
    #[serde(default)]
    pub usage_mode: Option<String>,
}

fn default_perm() -> String {
    "ro".into()
}

/// A service port requested by kernelvisor's manager (extension of `KernelCreationConfig`):
/// `{"name", "protocol", "container_ports": [int]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePortSpec {
    /// Service name.
    pub name: String,
    /// `http`, `tcp`, `preopen`, ….
    #[serde(default = "default_protocol")]
    pub protocol: String,
    /// Ports inside the container.
    pub container_ports: Vec<u16>,
}

fn default_protocol() -> String {
    "tcp".into()
}

/// `ai.backend.common.types.KernelCreationConfig`: everything the agent needs to create one
/// kernel. Every upstream key is read; unknown keys are ignored. Required: `image`,
/// `resource_slots`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelCreationConfig {
    /// The image.
    pub image: ImageConfig,
    /// Kernel id (also the `kernel_ids` entry).
    #[serde(default)]
    pub kernel_id: Option<String>,
    /// Session id.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Owner user UUID.
    #[serde(default)]
    pub owner_user_id: Option<String>,
    /// Owner project UUID.
    #[serde(default)]
    pub owner_project_id: Option<String>,
    /// Network id (the session id upstream).
    #[serde(default)]
    pub network_id: Option<String>,
    /// When to pull (also in `image`).
    #[serde(default)]
    pub auto_pull: Option<AutoPullBehavior>,
    /// Session type.
    #[serde(default)]
    pub session_type: SessionTypes,
    /// Cluster mode.
    #[serde(default)]
    pub cluster_mode: ClusterMode,
    /// Role in the cluster (`main`).
    #[serde(default)]
    pub cluster_role: Option<String>,
    /// Index in the cluster.
    #[serde(default)]
    pub cluster_idx: Option<u32>,
    /// Hostname in the cluster (the container's hostname).
    #[serde(default)]
    pub cluster_hostname: Option<String>,
    /// Local rank.
    #[serde(default)]
    pub local_rank: Option<u32>,
    /// User id user code runs as; the agent's `[container] kernel-uid` when nil.
    #[serde(default)]
    pub uid: Option<u32>,
    /// Main group id; the agent's `[container] kernel-gid` when nil.
    #[serde(default)]
    pub main_gid: Option<u32>,
    /// Supplementary group ids.
    #[serde(default)]
    pub supplementary_gids: Vec<u32>,
    /// Requested slots, `{slot: "decimal"}` (`cpu` cores, `mem` bytes, accelerators).
    pub resource_slots: BTreeMap<String, Value>,
    /// Resource options (`shmem` bytes or size text).
    #[serde(default)]
    pub resource_opts: BTreeMap<String, Value>,
    /// Environment variables.
    #[serde(default)]
    pub environ: BTreeMap<String, Value>,
    /// vfolders.
    #[serde(default)]
    pub mounts: Vec<VFolderMount>,
    /// Package directories (unused here).
    #[serde(default)]
    pub package_directory: Vec<String>,
    /// Seconds of idleness before the manager reclaims the session (recorded, labelled).
    #[serde(default)]
    pub idle_timeout: Option<f64>,
    /// Shell script run once before the kernel is `RUNNING`.
    #[serde(default)]
    pub bootstrap_script: Option<String>,
    /// A batch session's command (`sh -c`, in `/home/work`); for an interactive one, replaces
    /// the image's command.
    #[serde(default)]
    pub startup_command: Option<String>,
    /// Manager-internal data: its `ssh_keypair` (the user's, `{"public_key", "private_key"}`)
    /// goes into a runner kernel's `/home/work/.ssh`; the rest is unused.
    #[serde(default)]
    pub internal_data: Option<Value>,
    /// Container ports to publish without a service (each gets a host port).
    #[serde(default)]
    pub preopen_ports: Vec<u16>,
    /// Host ports the manager already allocated (used for the service ports first).
    #[serde(default)]
    pub allocated_host_ports: Vec<u16>,
    /// Scaling group (resource group).
    #[serde(default)]
    pub scaling_group: Option<String>,
    /// The agent's RPC address as the manager knows it.
    #[serde(default)]
    pub agent_addr: Option<String>,
    /// Inference endpoint id.
    #[serde(default)]
    pub endpoint_id: Option<String>,
    /// kernelvisor: service ports to publish (Backend.AI reads them from image labels only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub service_ports: Vec<ServicePortSpec>,
    /// kernelvisor: what to do when the container exits (`never` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<Value>,
    /// kernelvisor: seconds a batch session may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_timeout: Option<f64>,
    /// kernelvisor: the signal the workload gets when the kernel is ended (`SIGTERM`, …;
    /// `crate::workload::grace`); absent: `SIGTERM`, `SIGINT` for a runner kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
    /// kernelvisor: seconds the workload has to exit after the stop signal before it is
    /// killed; absent: the agent's `[container] grace-period`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<f64>,
    /// kernelvisor tests: failure injection (read only with the `fault-injection` feature).
    #[serde(default, rename = "_inject", skip_serializing_if = "Option::is_none")]
    pub inject: Option<Value>,
}

/// `ai.backend.common.types.ClusterInfo`: the session's cluster, the same for every kernel of a
/// `create_kernels` call; the agent applies it as `crate::agent::kernel::cluster` says.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterInfo {
    /// Cluster mode.
    #[serde(default)]
    pub mode: ClusterMode,
    /// Kernels in the session.
    #[serde(default = "one")]
    pub size: u32,
    /// Kernels per role.
    #[serde(default)]
    pub replicas: BTreeMap<String, u32>,
    /// `{"mode": "bridge" | "overlay" | "host", "network_name", "network_id"}` for a
    /// multi-kernel session; `{}` for one kernel.
    #[serde(default)]
    pub network_config: BTreeMap<String, Value>,
    /// The session's keypair, `{"public_key", "private_key"}` (OpenSSH public, PEM private):
    /// `id_cluster` in each kernel's `/home/config/ssh`.
    #[serde(default)]
    pub ssh_keypair: Option<Value>,
    /// Host mode: `{hostname: [agent host, sshd host port]}`.
    #[serde(default)]
    pub cluster_ssh_port_mapping: Option<Value>,
}

fn one() -> u32 {
    1
}

/// `ai.backend.common.types.ServicePort` as a reply carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePort {
    /// Service name.
    pub name: String,
    /// Protocol.
    pub protocol: String,
    /// Container ports.
    pub container_ports: Vec<u16>,
    /// Host ports, one per container port.
    pub host_ports: Vec<Option<u16>>,
    /// Whether it serves inference.
    #[serde(default)]
    pub is_inference: bool,
}

/// One entry of `create_kernels`' reply (`ai.backend.common.types.KernelCreationResult`, as
/// `AgentRPCServer.create_kernels` lists it), plus kernelvisor's `status` and `stages`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelCreationResult {
    /// Kernel id.
    pub id: String,
    /// Host name or address the kernel's ports are reached at.
    pub kernel_host: String,
    /// REPL ports (no REPL here: 0).
    pub repl_in_port: u16,
    /// REPL ports (no REPL here: 0).
    pub repl_out_port: u16,
    /// Legacy.
    pub stdin_port: u16,
    /// Legacy.
    pub stdout_port: u16,
    /// Published service ports.
    pub service_ports: Vec<ServicePort>,
    /// Container id.
    pub container_id: String,
    /// `{"slots": {slot: "decimal"}, "mounts": [...], "scratch_disk_size": 0}`.
    pub resource_spec: Value,
    /// `{device_name: [{device_id, model_name, data}]}`.
    pub attached_devices: Value,
    /// The agent's RPC address.
    pub agent_addr: String,
    /// Scaling group.
    pub scaling_group: String,
    /// kernelvisor: the kernel's full info map (`status`, `stages`, …).
    #[serde(flatten)]
    pub info: BTreeMap<String, Value>,
}

/// `create_kernels(session_id, kernel_ids, configs, cluster_info, kernel_image_refs)` → one
/// [`KernelCreationResult`] per kernel. All or nothing: one refused config refuses the call.
pub struct CreateKernels;

/// Arguments of [`CreateKernels`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CreateKernelsArgs {
    /// Session id.
    pub session_id: String,
    /// Kernel ids, one per config.
    pub kernel_ids: Vec<String>,
    /// Configs, one per kernel.
    pub configs: Vec<Value>,
    /// Cluster info; absent from kernelvisor's managers before this contract.
    #[serde(default)]
    pub cluster_info: Option<ClusterInfo>,
    /// `{kernel_id: ImageRef}`.
    #[serde(default)]
    pub kernel_image_refs: Option<BTreeMap<String, ImageRef>>,
}

impl Method for CreateKernels {
    const NAME: &'static str = "create_kernels";
    const PARAMS: &'static [&'static str] = &[
        "session_id",
        "kernel_ids",
        "configs",
        "cluster_info",
        "kernel_image_refs",
    ];
    type Args = CreateKernelsArgs;
    type Reply = Vec<KernelCreationResult>;
}

/// `destroy_kernel(kernel_id, session_id, reason=None, suppress_events=False)` → nil. `reason`
/// is a `KernelLifecycleEventReason` (its value) or a string.
pub struct DestroyKernel;

/// Arguments of [`DestroyKernel`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DestroyKernelArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// Session id.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Why (`user-requested` when nil).
    #[serde(default)]
    pub reason: Option<String>,
    /// No `kernel_terminated` event.
    #[serde(default)]
    pub suppress_events: Option<bool>,
    /// kernelvisor (a keyword Backend.AI's manager never sends): seconds the workload has to
    /// exit after its stop signal, instead of the kernel's own grace period (`0`: killed at
    /// once). Given, the answer is a [`DestroyKernelReply`] map instead of nil.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_period: Option<f64>,
}

/// kernelvisor: what `destroy_kernel` answers a caller that gave `grace_period` (upstream's
/// callers get nil): how the workload ended, so that the caller records a batch job's result
/// without waiting for the agent's events.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DestroyKernelReply {
    /// The workload's exit code when it exited by itself within the grace (143: the stop signal
    /// it did not catch); `None` when it was killed at the deadline or had no container.
    #[serde(default)]
    pub exit_code: Option<i64>,
    /// Whether it was killed at the grace's deadline (`SIGKILL`).
    #[serde(default)]
    pub killed: bool,
}

impl Method for DestroyKernel {
    const NAME: &'static str = "destroy_kernel";
    const PARAMS: &'static [&'static str] =
        &["kernel_id", "session_id", "reason", "suppress_events"];
    type Args = DestroyKernelArgs;
    type Reply = Value;
}

/// `restart_kernel(session_id, kernel_id, kernel_image, updated_config)` → the kernel's
/// creation result: the container recreated with the updated config, same kernel id, host
/// ports and scratch.
pub struct RestartKernel;

/// Arguments of [`RestartKernel`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RestartKernelArgs {
    /// Session id.
    #[serde(default)]
    pub session_id: Option<String>,
    /// Kernel id.
    pub kernel_id: String,
    /// The image to run (upstream's `ImageRef`).
    #[serde(default)]
    pub kernel_image: Option<ImageRef>,
    /// Keys of the kernel's config to change (`environ`, `resource_slots`, …).
    #[serde(default)]
    pub updated_config: Option<BTreeMap<String, Value>>,
}

impl Method for RestartKernel {
    const NAME: &'static str = "restart_kernel";
    const PARAMS: &'static [&'static str] =
        &["session_id", "kernel_id", "kernel_image", "updated_config"];
    type Args = RestartKernelArgs;
    type Reply = KernelCreationResult;
}

/// Arguments of the methods that name one kernel.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelIdArgs {
    /// Kernel id.
    pub kernel_id: String,
}

macro_rules! kernel_query {
    ($(#[$doc:meta])* $t:ident, $name:literal, $reply:ty) => {
        $(#[$doc])*
        pub struct $t;
        impl Method for $t {
            const NAME: &'static str = $name;
            const PARAMS: &'static [&'static str] = &["kernel_id"];
            type Args = KernelIdArgs;
            type Reply = $reply;
        }
    };
}

kernel_query!(
    /// `check_running(kernel_id)` → bool: the kernel is here and `RUNNING` (`false`, not an
    /// error, for a kernel this agent does not hold).
    CheckRunning, "check_running", bool
);
kernel_query!(
    /// `check_creating(kernel_id)` → bool: the kernel is being created or exists here.
    CheckCreating, "check_creating", bool
);
kernel_query!(
    /// `ping_kernel(kernel_id)` → bool: the kernel's container answers (nil upstream when it
    /// has no REPL; kernelvisor answers whether it is running).
    PingKernel, "ping_kernel", bool
);
kernel_query!(
    /// `get_kernel(kernel_id)` → the kernel's info map (kernelvisor).
    GetKernel, "get_kernel", KernelInfoReply
);

/// `sync_kernel_registry(raw_kernel_session_ids)` → `{"kernels": [info]}` (nil upstream; the
/// extra key is kernelvisor's). Kernels listed but unknown here get a `kernel_terminated`
/// event (`already-terminated`); kernels held here but not listed are destroyed without
/// events (`not-found-in-manager`), as upstream does.
pub struct SyncKernelRegistry;

/// Arguments of [`SyncKernelRegistry`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SyncKernelRegistryArgs {
    /// `[(kernel_id, session_id)]`.
    #[serde(alias = "kernel_session_ids")]
    pub raw_kernel_session_ids: Vec<(String, String)>,
}

impl Method for SyncKernelRegistry {
    const NAME: &'static str = "sync_kernel_registry";
    const PARAMS: &'static [&'static str] = &["raw_kernel_session_ids"];
    type Args = SyncKernelRegistryArgs;
    type Reply = Value;
}

/// A kernel's info map as kernelvisor's agent answers it (`get_kernel`, `adopt_kernel`): its id
/// and status typed, the rest (`session_id`, `container_id`, `stages`, …) as given.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KernelInfoReply {
    /// Kernel id.
    pub id: String,
    /// `PREPARING`, `PULLING`, `CREATING`, `RUNNING`, `RESTARTING`, `TERMINATING`, `TERMINATED`.
    pub status: String,
    /// The other keys.
    #[serde(flatten)]
    pub rest: BTreeMap<String, Value>,
}

/// `adopt_kernel(kernel_id)` → [`KernelInfoReply`] (kernelvisor; the agent design's dangling kernels):
/// the dangling kernel runs under a kernel actor again.
pub struct AdoptKernel;

impl Method for AdoptKernel {
    const NAME: &'static str = "adopt_kernel";
    const PARAMS: &'static [&'static str] = &["kernel_id"];
    type Args = KernelIdArgs;
    type Reply = KernelInfoReply;
}

/// `{"destroyed": n}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Destroyed {
    /// Kernels (or containers) destroyed.
    pub destroyed: u64,
}

/// `destroy_dangling_kernel(kernel_id)` → [`Destroyed`] (kernelvisor): its containers and
/// scratch removed, no events.
pub struct DestroyDanglingKernel;

impl Method for DestroyDanglingKernel {
    const NAME: &'static str = "destroy_dangling_kernel";
    const PARAMS: &'static [&'static str] = &["kernel_id"];
    type Args = KernelIdArgs;
    type Reply = Destroyed;
}

/// No arguments.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoArgs {}

/// `reset_agent()` (alias `reset_instance`) → [`Destroyed`]: every kernel destroyed without
/// termination events.
pub struct ResetAgent;

impl Method for ResetAgent {
    const NAME: &'static str = "reset_agent";
    const PARAMS: &'static [&'static str] = &[];
    type Args = NoArgs;
    type Reply = Destroyed;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::agent_api::{decode_args, encode_args, from_value, to_value};

    #[test]
    fn a_config_missing_required_keys_names_them() {
        let e = from_value::<KernelCreationConfig>(Value::Map(vec![(
            "resource_slots".into(),
            Value::Map(vec![]),
        )]))
        .unwrap_err();
        assert!(e.0.contains("image"), "{e}");
        let e = from_value::<KernelCreationConfig>(to_value(&serde_json::json!({
            "image": {"canonical": "x"}, "resource_slots": {}
        })))
        .unwrap_err();
        assert!(e.0.contains("registry"), "{e}");
    }

    #[test]
    fn create_kernels_round_trips_and_tolerates_unknown_keys() {
        let config = KernelCreationConfig {
            image: ImageConfig::local("kernelvisor-test:latest"),
            resource_slots: [("cpu", "1"), ("mem", "268435456")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), Value::from(v)))
                .collect(),
            ..KernelCreationConfig::default()
        };
        let mut v = to_value(&config);
        if let Value::Map(m) = &mut v {
            m.push(("a_field_from_2027".into(), 1.into()));
        }
        let back: KernelCreationConfig = from_value(v.clone()).unwrap();
        assert_eq!(back, config);
        let args = CreateKernelsArgs {
            session_id: "s".into(),
            kernel_ids: vec!["k".into()],
            configs: vec![v],
            cluster_info: Some(ClusterInfo::default()),
            kernel_image_refs: None,
        };
        let call = encode_args::<CreateKernels>(&args);
        assert_eq!(call.args.len(), 5);
        assert_eq!(decode_args::<CreateKernels>(&call).unwrap(), args);
        let dbg = format!(
            "{:?}",
            ImageRegistry {
                password: Some("hunter2".into()),
                ..ImageRegistry::default()
            }
        );
        assert!(!dbg.contains("hunter2"));
    }

    /// What 26.9.6's `ImageRef.from_image_str(canonical, project, registry)` answers for the
    /// same inputs (read off the real class in the trixie root), and `None` where it raises.
    #[test]
    fn image_refs_are_upstreams() {
        // (canonical, project, registry, Some((name, tag)) or None where upstream raises)
        type Case = (
            &'static str,
            Option<&'static str>,
            &'static str,
            Option<(&'static str, &'static str)>,
        );
        let cases: [Case; 7] = [
            (
                "local/kernelvisor/test-py:bash",
                Some("kernelvisor"),
                "local",
                Some(("test-py", "bash")),
            ),
            (
                "cr.backend.ai/stable/python:3.9-ubuntu20.04",
                Some("stable"),
                "cr.backend.ai",
                Some(("python", "3.9-ubuntu20.04")),
            ),
            (
                "127.0.0.1:5000/kv/img:1",
                Some("kv"),
                "127.0.0.1:5000",
                Some(("img", "1")),
            ),
            (
                "cr.backend.ai/stable/python",
                Some("stable"),
                "cr.backend.ai",
                Some(("python", "latest")),
            ),
            (
                "cr.backend.ai/stable:1",
                Some("stable"),
                "cr.backend.ai",
                Some(("", "1")),
            ),
            (
                "cr.backend.ai/other/python:1",
                Some("stable"),
                "cr.backend.ai",
                None,
            ),
            (
                "registry.x/a/b/c:2",
                None,
                "registry.x",
                Some(("a/b/c", "2")),
            ),
        ];
        for (canonical, project, registry, want) in cases {
            let mut config = ImageConfig::by_reference(canonical);
            config.project = project.map(str::to_owned);
            config.registry.name = registry.to_owned();
            config.architecture = "x86_64".into();
            let got = config.image_ref();
            match want {
                None => assert_eq!(got, None, "{canonical}"),
                Some((name, tag)) => {
                    let r = got.unwrap_or_else(|| panic!("{canonical} parses"));
                    assert_eq!(
                        (r.name.as_str(), r.tag.as_str()),
                        (name, tag),
                        "{canonical}"
                    );
                    assert_eq!(r.project.as_deref(), project, "{canonical}");
                    assert_eq!(r.registry, registry, "{canonical}");
                    assert_eq!((r.architecture.as_str(), r.is_local), ("x86_64", false));
                }
            }
        }
    }
}

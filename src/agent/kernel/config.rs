//! A kernel's creation config, as `create_kernels` receives it (Backend.AI's kernel config map),
//! parsed and checked before anything is allocated.

use std::collections::BTreeMap;

use rmpv::Value;
use serde::{Deserialize, Serialize};

use super::error::KernelError;
use crate::agent::resources::SlotRequest;
use crate::rpc::agent_api::kernel::{
    ImageConfig, ImageRegistry, KernelCreationConfig, ServicePortSpec, SessionTypes, VFolderMount,
};
use crate::slots::{ResourceSlots, SlotTypes};
use crate::workload::RestartPolicy;

/// Docker refuses memory limits below 6 MiB; refuse them first with a clear message.
const MIN_MEM_BYTES: u64 = 6 << 20;

/// A vfolder mount: `{"name", "host_path", "permission": "ro"|"rw"}` → `/home/work/<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountRequest {
    /// Folder name: the last path component in the container; no `/`, no `..`.
    pub name: String,
    /// Host path; must lie under `[container] vfolder-root` (checked by the mounts stage).
    pub host_path: String,
    /// `true` for `"ro"`.
    pub read_only: bool,
    /// Where it appears in the container; `/home/work/<name>` when `None`.
    #[serde(default)]
    pub kernel_path: Option<String>,
}

/// A service port the kernel exposes: `{"name", "protocol", "container_ports": [int]}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePortRequest {
    /// Service name (`jupyter`, `http`, …).
    pub name: String,
    /// `http`, `tcp`, `preopen`, … (reported as given).
    pub protocol: String,
    /// Ports inside the container, each published on one host port.
    pub container_ports: Vec<u16>,
}

/// The kernel's owner: `{"user_id", "project_id", "access_key"}` (the `ai.backend.owner` label).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// User UUID.
    pub user_id: String,
    /// Project (group) UUID.
    pub project_id: String,
    /// Access key that created it.
    pub access_key: String,
}

/// Test-only failure injection (`_inject` in the config; read only when built with the
/// `fault-injection` feature, ignored otherwise).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Injection {
    /// Fail this stage's setup (before it allocates anything).
    pub fail_at: Option<String>,
    /// Sleep this many seconds before this stage's setup (to kill the agent mid-create).
    pub pause_before: Option<(String, f64)>,
    /// Hold this stage's setup until this path exists on the agent's host (a test holds a
    /// creation open as long as it needs, e.g. until a retry has joined it).
    #[serde(default)]
    pub hold_before: Option<(String, std::path::PathBuf)>,
}

/// Backend.AI's session types.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionType {
    /// Runs until destroyed; code runs through `execute`.
    #[default]
    Interactive,
    /// Runs its `command` as the main process; its exit ends the session with a result.
    Batch,
}

impl SessionType {
    /// `interactive` or `batch`.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionType::Interactive => "interactive",
            SessionType::Batch => "batch",
        }
    }
}

/// A checked kernel config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelConfig {
    /// Image reference (local, or pulled when a registry is reachable).
    pub image: String,
    /// Requested slots, every slot named (`cpu` in cores, `mem` in bytes, accelerator slots).
    /// Stored configs of an older agent (`{"cpu_millis", "mem_bytes", "cuda_devices"}`) load.
    #[serde(deserialize_with = "slots_any")]
    pub slots: ResourceSlots,
    /// `/dev/shm` bytes (`resource_opts.shmem`); agent default when absent.
    pub shmem: Option<u64>,
    /// Extra environment variables.
    pub environ: BTreeMap<String, String>,
    /// vfolders.
    pub mounts: Vec<MountRequest>,
    /// Service ports to publish.
    pub service_ports: Vec<ServicePortRequest>,
    /// Who owns it.
    pub owner: Owner,
    /// `interactive` (default) or `batch`.
    #[serde(default)]
    pub session_type: SessionType,
    /// Shell command run as the main process (`sh -c`, in `/home/work`): a batch session's job,
    /// or an interactive session's replacement for the image's command.
    #[serde(default)]
    pub command: Option<String>,
    /// Seconds a batch session may run before it is killed (`batch-timeout`).
    #[serde(default)]
    pub batch_timeout: Option<f64>,
    /// What the kernel's supervisor does when its container exits (default `never`).
    #[serde(default)]
    pub restart_policy: RestartPolicy,
    /// Failure injection (tests only).
    #[serde(default)]
    pub inject: Injection,
    /// User id the container (and so user code, execute and services) runs as; the image's
    /// user when `None`.
    #[serde(default)]
    pub uid: Option<u32>,
    /// Main group id (with `uid`; the uid's own number when `None`).
    #[serde(default)]
    pub main_gid: Option<u32>,
    /// Supplementary group ids of the container's user.
    #[serde(default)]
    pub supplementary_gids: Vec<u32>,
    /// Shell script run once (`sh -c`, as the kernel's user, in `/home/work`) after the
    /// container starts and before the kernel is `RUNNING`.
    #[serde(default)]
    pub bootstrap_script: Option<String>,
    /// Host ports the manager allocated, used first for the service ports.
    #[serde(default)]
    pub allocated_host_ports: Vec<u16>,
    /// Seconds of idleness the manager allows (recorded as a label).
    #[serde(default)]
    pub idle_timeout: Option<f64>,
    /// The container's hostname (Backend.AI's `cluster_hostname`).
    #[serde(default)]
    pub cluster_hostname: Option<String>,
    /// The image as the manager described it, without the registry password.
    #[serde(default)]
    pub image_config: Option<ImageConfig>,
    /// The user's SSH keypair (`internal_data.ssh_keypair`, which Backend.AI's manager sends
    /// for a user who has one): a runner kernel's sshd lets it in (upstream's
    /// `DockerKernelCreationContext.prepare_scratch`, `src/ai/backend/agent/docker/agent.py`).
    #[serde(default)]
    pub ssh_keypair: Option<crate::agent::runner::UserKeypair>,
    /// Its role in the session's cluster (Backend.AI's `cluster_role`: `main`, `sub`, …);
    /// only a main kernel publishes service ports ([`super::cluster::is_main`]).
    #[serde(default)]
    pub cluster_role: Option<String>,
    /// What it keeps of `create_kernels`' `cluster_info` (network, keys), re-applied by every
    /// container made for it; `None` for a config of a caller without `cluster_info`.
    #[serde(default)]
    pub cluster: Option<super::cluster::ClusterConfig>,
    /// kernelvisor: the signal its workload gets when it is ended (`SIGTERM` as checked by
    /// [`crate::workload::grace::checked_signal`]); `None`: `SIGTERM`, or `SIGINT` for a runner
    /// kernel, as upstream's agent stops its runner.
    #[serde(default)]
    pub stop_signal: Option<String>,
    /// kernelvisor: seconds its workload has to exit after the stop signal before it is killed;
    /// `None` (a Backend.AI manager's kernel): the agent's `[container] grace-period`.
    #[serde(default)]
    pub grace_period: Option<f64>,
}

/// `internal_data.ssh_keypair` (`{"public_key", "private_key"}`, OpenSSH text), if the manager
/// sent one.
///
/// Errors: [`KernelError::InvalidConfig`] when it is there but not two strings.
fn ssh_keypair(
    internal: Option<&Value>,
) -> Result<Option<crate::agent::runner::UserKeypair>, KernelError> {
    let get = |m: &Value, k: &str| {
        m.as_map()
            .and_then(|m| m.iter().find(|(n, _)| n.as_str() == Some(k)))
            .map(|(_, v)| v.clone())
    };
    let Some(pair) = internal
        .and_then(|i| get(i, "ssh_keypair"))
        .filter(|p| !p.is_nil())
    else {
        return Ok(None);
    };
    let text = |k: &str| {
        get(&pair, k)
            .and_then(|v| v.as_str().map(str::to_owned))
            .filter(|t| !t.trim().is_empty())
            .ok_or_else(|| {
                invalid(format!(
                    "`internal_data.ssh_keypair.{k}` is not a key's text"
                ))
            })
    };
    Ok(Some(crate::agent::runner::UserKeypair {
        public_key: text("public_key")?,
        private_key: text("private_key")?,
    }))
}

/// A kernel id must be safe as a path component and a container name:
/// `[A-Za-z0-9][A-Za-z0-9._-]{0,127}` (UUIDs pass).
pub fn check_kernel_id(id: &str) -> Result<(), KernelError> {
    let ok = (1..=128).contains(&id.len())
        && id.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    ok.then_some(()).ok_or_else(|| {
        KernelError::InvalidConfig(format!(
            "`{id}` is not a valid kernel id (letters, digits, . _ -; at most 128)"
        ))
    })
}

/// A vfolder name must be one path component: no `/`, not `.` or `..`, not empty.
pub fn check_mount_name(name: &str) -> Result<(), KernelError> {
    if name.is_empty()
        || name == "."
        || name == ".."
        || name.contains('/')
        || name.contains('\0')
        || name.contains("..")
    {
        return Err(KernelError::InvalidConfig(format!(
            "vfolder name `{name}` must be a single path component without `/` or `..`"
        )));
    }
    Ok(())
}

/// `resource_slots` without the zero amounts of slots this agent does not know: Backend.AI's
/// manager (and this one before generic slots) sends every slot type, `"cuda.device": "0"`
/// included, to agents without the accelerator. A non-zero unknown slot stays, to be refused.
fn known_or_nonzero(v: &Value, types: &SlotTypes) -> Value {
    match v.as_map() {
        Some(m) => Value::Map(
            m.iter()
                .filter(|(k, a)| {
                    let known = k.as_str().is_some_and(|k| types.contains_key(k));
                    let zero = crate::slots::RawAmount::from_msgpack(a)
                        .amount("", crate::slots::SlotType::Count)
                        .is_ok_and(|a| a == crate::slots::Amount::ZERO);
                    known || !zero
                })
                .cloned()
                .collect(),
        ),
        None => v.clone(),
    }
}

/// `slots` as stored now (`{name: "decimal"}`) or by an agent before generic slots
/// (`{"cpu_millis", "mem_bytes", "cuda_devices"}`).
fn slots_any<'de, D: serde::Deserializer<'de>>(d: D) -> Result<ResourceSlots, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Any {
        Legacy(SlotRequest),
        Current(ResourceSlots),
    }
    Ok(match Any::deserialize(d)? {
        Any::Legacy(r) => r.to_slots(),
        Any::Current(s) => s,
    })
}

fn invalid(msg: impl Into<String>) -> KernelError {
    KernelError::InvalidConfig(msg.into())
}

/// Backend.AI's `environ` key for the access key that created the session (its manager's
/// `SessionLauncher` sets it); kernelvisor reads the owner's access key from it.
pub const ACCESS_KEY_ENV: &str = "BACKENDAI_ACCESS_KEY";

/// A container path for a vfolder's `kernel_path`: absolute, plain components, not `/`.
fn check_kernel_path(name: &str, path: &str) -> Result<(), KernelError> {
    let p = std::path::Path::new(path);
    let plain = p
        .components()
        .skip(1)
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !p.is_absolute() || !plain || p.components().count() < 2 {
        return Err(invalid(format!(
            "vfolder `{name}`: kernel_path `{path}` must be an absolute path below `/` without `..`"
        )));
    }
    Ok(())
}

/// The reference the engine runs for `image`: a local image (`is_local`, or registry `local`)
/// by its short name, the canonical one without its `registry/` prefix (Backend.AI's manager
/// names a local image `local/<name>:<tag>`; its agent runs `ImageRef.short`), any other by its
/// canonical name.
pub fn run_reference(image: &ImageConfig) -> String {
    let canonical = image.canonical.trim();
    if image.is_local || image.registry.name == "local" {
        let prefix = format!("{}/", image.registry.name);
        if !image.registry.name.is_empty() {
            if let Some(short) = canonical.strip_prefix(&prefix) {
                return short.to_owned();
            }
        }
    }
    canonical.to_owned()
}

impl KernelConfig {
    /// Whether the image may be pulled when the engine lacks it: never for a local image
    /// (Backend.AI's agent never pulls one) nor with `auto_pull = none`.
    pub fn may_pull(&self) -> bool {
        self.image_config.as_ref().is_none_or(|i| {
            !(i.is_local || i.registry.name == "local")
                && i.auto_pull != crate::rpc::agent_api::kernel::AutoPullBehavior::None
        })
    }

    /// Decodes one config of `create_kernels` (a [`KernelCreationConfig`], Backend.AI's shape)
    /// and checks it ([`KernelConfig::from_creation`]).
    ///
    /// Errors: [`KernelError::InvalidConfig`] naming the missing or mistyped key, or what
    /// [`KernelConfig::from_creation`] refuses.
    pub fn from_value(v: &Value, types: &SlotTypes) -> Result<KernelConfig, KernelError> {
        let c: KernelCreationConfig = crate::rpc::agent_api::from_value(v.clone())
            .map_err(|e| invalid(format!("kernel config: {e}")))?;
        KernelConfig::from_creation(c, types)
    }

    /// Checks a [`KernelCreationConfig`] before anything is allocated. Unknown keys were
    /// already ignored (Backend.AI's manager sends more than this agent uses).
    ///
    /// Errors: [`KernelError::InvalidConfig`] naming the key: an empty `image.canonical`, an
    /// unknown slot, a negative or too small `mem` (< 6 MiB), a fractional `*.device`, a
    /// vfolder name with `/` or `..` or a bad `kernel_path`, a permission other than
    /// `ro`/`rw`/`wd`, a bad port, a batch session without `startup_command`.
    /// `types` are the slots this agent knows (built-in plus its accelerators').
    pub fn from_creation(
        c: KernelCreationConfig,
        types: &SlotTypes,
    ) -> Result<KernelConfig, KernelError> {
        let image = run_reference(&c.image);
        if image.is_empty() {
            return Err(invalid("`image.canonical` must not be empty"));
        }
        let requested = Value::Map(
            c.resource_slots
                .iter()
                .map(|(k, v)| (Value::from(k.as_str()), v.clone()))
                .collect(),
        );
        let slots =
            ResourceSlots::request_from_msgpack(&known_or_nonzero(&requested, types), types)?;
        let mem = slots.get(crate::slots::MEM).units();
        if mem < MIN_MEM_BYTES {
            return Err(invalid(format!(
                "resource slot `mem`: {mem} bytes is below the 6 MiB minimum"
            )));
        }
        if let Some((slot, a)) = slots
            .nonzero()
            .find(|(s, a)| s.ends_with(".device") && !a.is_whole())
        {
            return Err(invalid(format!(
                "resource slot `{slot}`: {a} is not a whole number of devices"
            )));
        }
        let shmem = match c.resource_opts.get("shmem").filter(|v| !v.is_nil()) {
            None => None,
            Some(s) => Some(
                s.as_u64()
                    .or_else(|| {
                        s.as_str()
                            .and_then(|t| crate::config::ByteSize::parse(t).ok())
                            .map(|b| b.0)
                    })
                    .ok_or_else(|| {
                        invalid(format!("`resource_opts.shmem`: {s} is not a size in bytes"))
                    })?,
            ),
        };
        let mut environ = BTreeMap::new();
        for (k, v) in c.environ {
            if k.is_empty() || k.contains('=') {
                return Err(invalid(format!(
                    "environ key `{k}` is empty or contains `=`"
                )));
            }
            let v = match v {
                Value::String(s) => s
                    .into_str()
                    .ok_or_else(|| invalid(format!("environ `{k}` is not UTF-8")))?,
                other => other.to_string(),
            };
            environ.insert(k, v);
        }
        let mut mounts = Vec::new();
        for m in c.mounts {
            check_mount_name(&m.name)?;
            let read_only = match m.mount_perm.as_str() {
                "ro" => true,
                "rw" | "wd" => false,
                other => {
                    return Err(invalid(format!(
                        "vfolder `{}`: mount_perm `{other}` must be `ro`, `rw` or `wd`",
                        m.name
                    )))
                }
            };
            if let Some(p) = &m.kernel_path {
                check_kernel_path(&m.name, p)?;
            }
            if mounts.iter().any(|x: &MountRequest| x.name == m.name) {
                return Err(invalid(format!("vfolder `{}` is mounted twice", m.name)));
            }
            mounts.push(MountRequest {
                name: m.name,
                host_path: m.host_path,
                read_only,
                kernel_path: m.kernel_path,
            });
        }
        let mut service_ports: Vec<ServicePortRequest> = c
            .service_ports
            .into_iter()
            .map(|sp| ServicePortRequest {
                name: sp.name,
                protocol: sp.protocol,
                container_ports: sp.container_ports,
            })
            .collect();
        // Backend.AI publishes each preopen port as a service named after it
        // (`ai.backend.agent.agent.AbstractAgent.create_kernel`).
        for &p in &c.preopen_ports {
            service_ports.push(ServicePortRequest {
                name: p.to_string(),
                protocol: "preopen".into(),
                container_ports: vec![p],
            });
        }
        for sp in &service_ports {
            if sp.container_ports.is_empty() || sp.container_ports.contains(&0) {
                return Err(invalid(format!(
                    "service port `{}`: container_ports must be non-empty TCP ports",
                    sp.name
                )));
            }
        }
        let mut all: Vec<u16> = service_ports
            .iter()
            .flat_map(|s| s.container_ports.iter().copied())
            .collect();
        all.sort_unstable();
        if all.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("a container port appears in two service ports"));
        }
        let owner = Owner {
            user_id: c.owner_user_id.unwrap_or_default(),
            project_id: c.owner_project_id.unwrap_or_default(),
            access_key: environ.get(ACCESS_KEY_ENV).cloned().unwrap_or_default(),
        };
        let session_type = match c.session_type {
            SessionTypes::Batch => SessionType::Batch,
            _ => SessionType::Interactive,
        };
        let command = c.startup_command;
        if command.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return Err(invalid("`startup_command` must not be blank"));
        }
        if session_type == SessionType::Batch && command.is_none() {
            return Err(invalid("a batch session needs a `startup_command`"));
        }
        let batch_timeout = match c.batch_timeout {
            None => None,
            Some(t) if t.is_finite() && t > 0.0 => Some(t),
            Some(t) => {
                return Err(invalid(format!(
                    "`batch_timeout`: {t} is not a positive number of seconds"
                )))
            }
        };
        if batch_timeout.is_some() && session_type != SessionType::Batch {
            return Err(invalid("`batch_timeout` applies to batch sessions only"));
        }
        let bootstrap_script = c.bootstrap_script.filter(|s| !s.trim().is_empty());
        let ssh_keypair = ssh_keypair(c.internal_data.as_ref())?;
        let restart_policy = c
            .restart_policy
            .as_ref()
            .filter(|v| !v.is_nil())
            .map(RestartPolicy::from_value)
            .transpose()
            .map_err(invalid)?
            .unwrap_or_default();
        let stop_signal = c
            .stop_signal
            .as_deref()
            .map(crate::workload::grace::checked_signal)
            .transpose()
            .map_err(invalid)?;
        let grace_period = match c.grace_period {
            None => None,
            Some(t) => Some(
                crate::workload::grace::checked_period(t)
                    .map_err(invalid)?
                    .as_secs_f64(),
            ),
        };
        Ok(KernelConfig {
            stop_signal,
            grace_period,
            image,
            slots,
            shmem,
            environ,
            mounts,
            service_ports,
            owner,
            session_type,
            command,
            batch_timeout,
            restart_policy,
            inject: injection(c.inject)?,
            uid: c.uid,
            main_gid: c.main_gid,
            supplementary_gids: c.supplementary_gids,
            bootstrap_script,
            allocated_host_ports: c.allocated_host_ports,
            idle_timeout: c.idle_timeout,
            cluster_hostname: c.cluster_hostname.filter(|h| !h.is_empty()),
            image_config: Some(ImageConfig {
                registry: ImageRegistry {
                    // Credentials serve the pull and are never stored.
                    password: None,
                    ..c.image.registry.clone()
                },
                ..c.image
            }),
            ssh_keypair,
            cluster_role: c.cluster_role.filter(|r| !r.is_empty()),
            // `create_kernels` sets it from its `cluster_info`.
            cluster: None,
        })
    }

    /// Host ports this kernel needs: one per container port of its service ports.
    pub fn port_count(&self) -> usize {
        self.service_ports
            .iter()
            .map(|s| s.container_ports.len())
            .sum()
    }

    /// The [`KernelCreationConfig`] that [`KernelConfig::from_creation`] reads back as this
    /// config (unit-tested both ways): the checked config in Backend.AI's shape again, for a
    /// partial update to be merged over. Without the registry password (never stored) and the
    /// keys this agent does not keep (`cluster_*` but the hostname and role, `internal_data`
    /// but its `ssh_keypair`, …; the cluster config is not a key of it). A
    /// preopen port goes back to `preopen_ports`. A config stored before `image_config` was
    /// kept names its image by reference.
    pub fn to_creation(&self) -> KernelCreationConfig {
        let (preopen, service): (Vec<_>, Vec<_>) =
            self.service_ports.iter().partition(|s| s.is_preopen());
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        KernelCreationConfig {
            image: self
                .image_config
                .clone()
                .unwrap_or_else(|| ImageConfig::by_reference(&self.image)),
            owner_user_id: some(&self.owner.user_id),
            owner_project_id: some(&self.owner.project_id),
            session_type: match self.session_type {
                SessionType::Batch => SessionTypes::Batch,
                SessionType::Interactive => SessionTypes::Interactive,
            },
            cluster_hostname: self.cluster_hostname.clone(),
            cluster_role: self.cluster_role.clone(),
            uid: self.uid,
            main_gid: self.main_gid,
            supplementary_gids: self.supplementary_gids.clone(),
            resource_slots: match self.slots.to_msgpack() {
                Value::Map(m) => m
                    .into_iter()
                    .filter_map(|(k, v)| Some((k.as_str()?.to_owned(), v)))
                    .collect(),
                _ => BTreeMap::new(),
            },
            resource_opts: self
                .shmem
                .map(|b| ("shmem".to_owned(), Value::from(b)))
                .into_iter()
                .collect(),
            environ: self
                .environ
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
                .collect(),
            mounts: self
                .mounts
                .iter()
                .map(|m| VFolderMount {
                    name: m.name.clone(),
                    host_path: m.host_path.clone(),
                    kernel_path: m.kernel_path.clone(),
                    mount_perm: if m.read_only { "ro" } else { "rw" }.into(),
                    ..VFolderMount::default()
                })
                .collect(),
            idle_timeout: self.idle_timeout,
            bootstrap_script: self.bootstrap_script.clone(),
            startup_command: self.command.clone(),
            preopen_ports: preopen.iter().map(|s| s.container_ports[0]).collect(),
            allocated_host_ports: self.allocated_host_ports.clone(),
            service_ports: service
                .into_iter()
                .map(|s| ServicePortSpec {
                    name: s.name.clone(),
                    protocol: s.protocol.clone(),
                    container_ports: s.container_ports.clone(),
                })
                .collect(),
            restart_policy: (self.restart_policy != RestartPolicy::default())
                .then(|| self.restart_policy.to_value()),
            batch_timeout: self.batch_timeout,
            stop_signal: self.stop_signal.clone(),
            grace_period: self.grace_period,
            inject: (self.inject != Injection::default())
                .then(|| crate::rpc::agent_api::to_value(&self.inject)),
            internal_data: self.ssh_keypair.as_ref().map(|k| {
                Value::Map(vec![(
                    "ssh_keypair".into(),
                    Value::Map(vec![
                        ("public_key".into(), k.public_key.as_str().into()),
                        ("private_key".into(), k.private_key.as_str().into()),
                    ]),
                )])
            }),
            ..KernelCreationConfig::default()
        }
    }

    /// This config with `update`'s keys put over its own, as upstream's
    /// `AbstractAgent.restart_kernel` merges `{**existing_kernel_config, **updating_kernel_config}`
    /// (`ai/backend/agent/agent.py`, 26.9.6): a key given replaces the stored value whole (an
    /// `environ` given is the whole environment), a key not given keeps it.
    ///
    /// Errors: what [`KernelConfig::from_creation`] refuses in the merged config, as
    /// [`KernelError::InvalidConfig`].
    pub fn updated(
        &self,
        update: &BTreeMap<String, Value>,
        types: &SlotTypes,
    ) -> Result<KernelConfig, KernelError> {
        let Value::Map(mut merged) = crate::rpc::agent_api::to_value(&self.to_creation()) else {
            unreachable!("a KernelCreationConfig serializes as a map")
        };
        for (k, v) in update {
            merged.retain(|(key, _)| key.as_str() != Some(k.as_str()));
            merged.push((Value::from(k.as_str()), v.clone()));
        }
        // The cluster is the session's, not the kernel config's (upstream keeps it apart, in
        // `cluster.json`, and restarts with it as it was).
        Ok(KernelConfig {
            cluster: self.cluster.clone(),
            ..KernelConfig::from_value(&Value::Map(merged), types)?
        })
    }
}

impl ServicePortRequest {
    /// Whether it is a preopen port (`KernelCreationConfig.preopen_ports`): published as a
    /// service named after its one port, protocol `preopen`.
    fn is_preopen(&self) -> bool {
        self.protocol == "preopen"
            && matches!(self.container_ports.as_slice(), [p] if p.to_string() == self.name)
    }
}

#[cfg(feature = "fault-injection")]
fn injection(v: Option<Value>) -> Result<Injection, KernelError> {
    match v.filter(|v| !v.is_nil()) {
        None => Ok(Injection::default()),
        Some(v) => rmpv::ext::from_value(v).map_err(|e| invalid(format!("`_inject`: {e}"))),
    }
}

#[cfg(not(feature = "fault-injection"))]
fn injection(_: Option<Value>) -> Result<Injection, KernelError> {
    Ok(Injection::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: Vec<(&str, Value)>) -> Result<KernelConfig, KernelError> {
        let mut m = vec![
            (
                Value::from("image"),
                crate::rpc::agent_api::to_value(&ImageConfig::local("kernelvisor-test:latest")),
            ),
            (
                Value::from("resource_slots"),
                Value::Map(vec![
                    ("cpu".into(), 1.into()),
                    ("mem".into(), "268435456".into()),
                ]),
            ),
        ];
        for (k, v) in extra {
            m.retain(|(x, _)| x.as_str() != Some(k));
            m.push((k.into(), v));
        }
        let mut types = crate::slots::builtin_types();
        types.insert("cuda.device".into(), crate::slots::SlotType::Count);
        KernelConfig::from_value(&Value::Map(m), &types)
    }

    #[test]
    fn parses_a_full_config() {
        let c = cfg(vec![
            (
                "resource_opts",
                Value::Map(vec![("shmem".into(), Value::from(1u64 << 26))]),
            ),
            ("environ", Value::Map(vec![("A".into(), "1".into())])),
            (
                "mounts",
                Value::Array(vec![Value::Map(vec![
                    ("name".into(), "data".into()),
                    ("host_path".into(), "/vf/data".into()),
                    ("permission".into(), "rw".into()),
                ])]),
            ),
            (
                "service_ports",
                Value::Array(vec![Value::Map(vec![
                    ("name".into(), "http".into()),
                    ("protocol".into(), "http".into()),
                    ("container_ports".into(), Value::Array(vec![8080.into()])),
                ])]),
            ),
            ("kernel_features", Value::Array(vec![])),
        ])
        .unwrap();
        assert_eq!(c.shmem, Some(1 << 26));
        assert_eq!(c.environ["A"], "1");
        assert!(!c.mounts[0].read_only);
        assert_eq!(c.port_count(), 1);
    }

    #[test]
    fn batch_sessions_need_a_command() {
        let c = cfg(vec![
            ("session_type", "batch".into()),
            ("startup_command", "echo hi".into()),
            ("batch_timeout", Value::F64(2.5)),
        ])
        .unwrap();
        assert_eq!(
            (c.session_type, c.command.as_deref(), c.batch_timeout),
            (SessionType::Batch, Some("echo hi"), Some(2.5))
        );
        assert_eq!(cfg(vec![]).unwrap().session_type, SessionType::Interactive);
        for bad in [
            vec![("session_type", Value::from("batch"))],
            vec![
                ("session_type", "cron".into()),
                ("startup_command", "x".into()),
            ],
            vec![
                ("session_type", "batch".into()),
                ("startup_command", "x".into()),
                ("batch_timeout", Value::from(-1)),
            ],
            vec![
                ("startup_command", "x".into()),
                ("batch_timeout", Value::from(5)),
            ],
            vec![("startup_command", " ".into())],
        ] {
            assert_eq!(
                cfg(bad.clone()).unwrap_err().name(),
                "InvalidKernelConfig",
                "{bad:?}"
            );
        }
    }

    #[test]
    fn refuses_bad_specs_with_invalid_kernel_config() {
        let neg = cfg(vec![(
            "resource_slots",
            Value::Map(vec![
                ("cpu".into(), 1.into()),
                ("mem".into(), Value::from(-1)),
            ]),
        )])
        .unwrap_err();
        assert_eq!(neg.name(), "InvalidKernelConfig");
        let unknown = cfg(vec![(
            "resource_slots",
            Value::Map(vec![
                ("cpu".into(), 1.into()),
                ("mem".into(), Value::from(1u64 << 28)),
                ("tpu".into(), 1.into()),
            ]),
        )])
        .unwrap_err();
        assert!(
            unknown.to_string().contains("unknown resource slot `tpu`"),
            "{unknown}"
        );
        let frac = cfg(vec![(
            "resource_slots",
            Value::Map(vec![
                ("cpu".into(), 1.into()),
                ("mem".into(), Value::from(1u64 << 28)),
                ("cuda.device".into(), "0.5".into()),
            ]),
        )])
        .unwrap_err();
        assert!(frac.to_string().contains("`cuda.device`"), "{frac}");
        // A zero amount of a slot this agent lacks is no request (Backend.AI's manager sends it).
        let zero = cfg(vec![(
            "resource_slots",
            Value::Map(vec![
                ("cpu".into(), 1.into()),
                ("mem".into(), Value::from(1u64 << 28)),
                ("rocm.device".into(), "0".into()),
            ]),
        )])
        .unwrap();
        assert_eq!(zero.slots.to_string(), "cpu=1 mem=268435456");
        let old = r#"{"cpu_millis":500,"mem_bytes":268435456,"cuda_devices":2}"#;
        let mut c = cfg(vec![]).unwrap();
        let mut j = serde_json::to_value(&c).unwrap();
        j["slots"] = serde_json::from_str(old).unwrap();
        c = serde_json::from_value(j).unwrap();
        assert_eq!(c.slots.to_string(), "cpu=0.5 cuda.device=2 mem=268435456");
        for bad in ["../etc", "a/b", "..", ""] {
            let m = Value::Array(vec![Value::Map(vec![
                ("name".into(), bad.into()),
                ("host_path".into(), "/vf/x".into()),
            ])]);
            assert_eq!(
                cfg(vec![("mounts", m)]).unwrap_err().name(),
                "InvalidKernelConfig",
                "{bad}"
            );
        }
        assert!(check_kernel_id("../x").is_err());
        assert!(check_kernel_id("3f1c-ab_9.x").is_ok());
    }

    #[test]
    fn the_users_ssh_keypair_is_read_from_internal_data() {
        let pair = |p: Value, k: Value| {
            Value::Map(vec![(
                "ssh_keypair".into(),
                Value::Map(vec![("public_key".into(), p), ("private_key".into(), k)]),
            )])
        };
        let c = cfg(vec![(
            "internal_data",
            pair("ssh-rsa AAAA u@h".into(), "-----BEGIN…".into()),
        )])
        .unwrap();
        assert_eq!(
            c.ssh_keypair,
            Some(crate::agent::runner::UserKeypair {
                public_key: "ssh-rsa AAAA u@h".into(),
                private_key: "-----BEGIN…".into(),
            })
        );
        // None sent (or other internal data only): the agent makes one for a runner kernel.
        assert_eq!(cfg(vec![]).unwrap().ssh_keypair, None);
        let other = Value::Map(vec![("dotfiles".into(), Value::Array(vec![]))]);
        assert_eq!(
            cfg(vec![("internal_data", other)]).unwrap().ssh_keypair,
            None
        );
        // A keypair that is not two texts is refused by name.
        let bad = cfg(vec![("internal_data", pair(Value::from(3), "k".into()))]).unwrap_err();
        assert_eq!(bad.name(), "InvalidKernelConfig");
        assert!(bad.to_string().contains("ssh_keypair.public_key"), "{bad}");
    }

    fn types() -> SlotTypes {
        let mut types = crate::slots::builtin_types();
        types.insert("cuda.device".into(), crate::slots::SlotType::Count);
        types
    }

    /// A config using every key `to_creation` writes back.
    fn full() -> KernelConfig {
        cfg(vec![
            ("owner_user_id", "u-1".into()),
            ("owner_project_id", "p-1".into()),
            ("session_type", "batch".into()),
            ("startup_command", "echo hi".into()),
            ("batch_timeout", Value::F64(2.5)),
            ("cluster_hostname", "main1".into()),
            (
                "internal_data",
                Value::Map(vec![(
                    "ssh_keypair".into(),
                    Value::Map(vec![
                        ("public_key".into(), "ssh-ed25519 AAAA u@h".into()),
                        ("private_key".into(), "-----BEGIN…".into()),
                    ]),
                )]),
            ),
            ("uid", 1000.into()),
            ("main_gid", 1001.into()),
            ("supplementary_gids", Value::Array(vec![27.into()])),
            (
                "resource_slots",
                Value::Map(vec![
                    ("cpu".into(), "0.5".into()),
                    ("mem".into(), "268435456".into()),
                    ("cuda.device".into(), "1".into()),
                ]),
            ),
            (
                "resource_opts",
                Value::Map(vec![("shmem".into(), Value::from(1u64 << 26))]),
            ),
            (
                "environ",
                Value::Map(vec![
                    ("A".into(), "1".into()),
                    (ACCESS_KEY_ENV.into(), "AKTEST".into()),
                ]),
            ),
            (
                "mounts",
                Value::Array(vec![
                    Value::Map(vec![
                        ("name".into(), "data".into()),
                        ("host_path".into(), "/vf/data".into()),
                        ("mount_perm".into(), "rw".into()),
                        ("kernel_path".into(), "/data".into()),
                    ]),
                    Value::Map(vec![
                        ("name".into(), "ro".into()),
                        ("host_path".into(), "/vf/ro".into()),
                    ]),
                ]),
            ),
            (
                "service_ports",
                Value::Array(vec![Value::Map(vec![
                    ("name".into(), "http".into()),
                    ("protocol".into(), "http".into()),
                    ("container_ports".into(), Value::Array(vec![8080.into()])),
                ])]),
            ),
            ("preopen_ports", Value::Array(vec![9000.into()])),
            ("allocated_host_ports", Value::Array(vec![30001.into()])),
            ("idle_timeout", Value::F64(600.0)),
            ("bootstrap_script", "touch /tmp/x".into()),
            (
                "restart_policy",
                Value::Map(vec![
                    ("mode".into(), "on-failure".into()),
                    ("max_restarts".into(), 3.into()),
                    ("window".into(), Value::F64(60.0)),
                    ("backoff".into(), Value::F64(1.0)),
                ]),
            ),
        ])
        .unwrap()
    }

    #[test]
    fn to_creation_reads_back_as_the_same_config() {
        for c in [cfg(vec![]).unwrap(), full()] {
            let back = KernelConfig::from_creation(c.to_creation(), &types()).unwrap();
            assert_eq!(back, c);
        }
        // A stored config from before `image_config` was kept: its image by reference.
        let mut old = cfg(vec![]).unwrap();
        old.image_config = None;
        assert_eq!(
            KernelConfig::from_creation(old.to_creation(), &types())
                .unwrap()
                .image,
            old.image
        );
    }

    #[test]
    fn an_update_replaces_only_its_keys_as_upstream_merges_them() {
        let c = full();
        // `{**stored, **update}`: `environ` given is the whole environment.
        let update = BTreeMap::from([
            (
                "environ".to_owned(),
                Value::Map(vec![("B".into(), "2".into())]),
            ),
            ("startup_command".to_owned(), "echo again".into()),
        ]);
        let u = c.updated(&update, &types()).unwrap();
        assert_eq!(
            u.environ,
            BTreeMap::from([("B".to_owned(), "2".to_owned())])
        );
        assert_eq!(u.command.as_deref(), Some("echo again"));
        // The owner's access key is read from the environment given.
        assert_eq!(u.owner.access_key, "");
        let mut expected = c.clone();
        expected.environ = u.environ.clone();
        expected.command = u.command.clone();
        expected.owner.access_key = String::new();
        assert_eq!(u, expected, "every other key as stored");
        // Nothing given: the config as stored.
        assert_eq!(c.updated(&BTreeMap::new(), &types()).unwrap(), c);
        // The merged config is checked as a created one is.
        let bad = BTreeMap::from([("startup_command".to_owned(), Value::Nil)]);
        assert_eq!(
            c.updated(&bad, &types()).unwrap_err().name(),
            "InvalidKernelConfig",
            "a batch session without its command"
        );
    }
}

//! A kernel's creation config, as `create_kernels` receives it (Backend.AI's kernel config map),
//! parsed and checked before anything is allocated.

use std::collections::BTreeMap;

use rmpv::Value;
use serde::{Deserialize, Serialize};

use super::error::KernelError;
use crate::agent::resources::SlotRequest;
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

fn get<'a>(map: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    map.iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
        .filter(|v| !v.is_nil())
}

fn string(v: &Value, what: &str) -> Result<String, KernelError> {
    v.as_str()
        .map(str::to_owned)
        .ok_or_else(|| invalid(format!("`{what}` must be a string, got {v}")))
}

fn list<'a>(v: &'a Value, what: &str) -> Result<&'a [Value], KernelError> {
    v.as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| invalid(format!("`{what}` must be a list")))
}

fn port(v: &Value, what: &str) -> Result<u16, KernelError> {
    v.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0)
        .ok_or_else(|| invalid(format!("`{what}`: {v} is not a TCP port")))
}

impl KernelConfig {
    /// Parses one config map of `create_kernels`. Unknown keys are ignored (Backend.AI's
    /// manager sends more than this agent uses).
    ///
    /// Errors: [`KernelError::InvalidConfig`] naming the key: missing `image` or
    /// `resource_slots`, an unknown slot, a negative or too small `mem` (< 6 MiB), a vfolder
    /// name with `/` or `..`, a permission other than `ro`/`rw`, a bad port.
    /// `types` are the slots this agent knows (built-in plus its accelerators'); a `*.device`
    /// amount must be whole.
    pub fn from_value(v: &Value, types: &SlotTypes) -> Result<KernelConfig, KernelError> {
        let map = v
            .as_map()
            .ok_or_else(|| invalid("a kernel config must be a map"))?;
        let image = string(
            get(map, "image").ok_or_else(|| invalid("`image` is required"))?,
            "image",
        )?;
        if image.trim().is_empty() {
            return Err(invalid("`image` must not be empty"));
        }
        let slots = ResourceSlots::request_from_msgpack(
            &known_or_nonzero(
                get(map, "resource_slots")
                    .ok_or_else(|| invalid("`resource_slots` is required"))?,
                types,
            ),
            types,
        )?;
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
        let shmem = match get(map, "resource_opts")
            .and_then(|o| o.as_map())
            .and_then(|o| get(o, "shmem"))
        {
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
        if let Some(env) = get(map, "environ") {
            for (k, v) in env
                .as_map()
                .ok_or_else(|| invalid("`environ` must be a map"))?
            {
                let k = string(k, "environ key")?;
                if k.is_empty() || k.contains('=') {
                    return Err(invalid(format!(
                        "environ key `{k}` is empty or contains `=`"
                    )));
                }
                let v = match v {
                    Value::String(_) => string(v, "environ value")?,
                    other => other.to_string(),
                };
                environ.insert(k, v);
            }
        }
        let mut mounts = Vec::new();
        for m in get(map, "mounts")
            .map(|m| list(m, "mounts"))
            .transpose()?
            .unwrap_or_default()
        {
            let m = m
                .as_map()
                .ok_or_else(|| invalid("each mount must be a map"))?;
            let name = string(
                get(m, "name").ok_or_else(|| invalid("mount `name` is required"))?,
                "mounts.name",
            )?;
            check_mount_name(&name)?;
            let host_path = string(
                get(m, "host_path").ok_or_else(|| invalid("mount `host_path` is required"))?,
                "mounts.host_path",
            )?;
            let read_only = match get(m, "permission")
                .map(|p| string(p, "mounts.permission"))
                .transpose()?
                .as_deref()
            {
                None | Some("ro") => true,
                Some("rw") => false,
                Some(other) => {
                    return Err(invalid(format!(
                        "mount permission `{other}` must be `ro` or `rw`"
                    )))
                }
            };
            if mounts.iter().any(|x: &MountRequest| x.name == name) {
                return Err(invalid(format!("vfolder `{name}` is mounted twice")));
            }
            mounts.push(MountRequest {
                name,
                host_path,
                read_only,
            });
        }
        let mut service_ports = Vec::new();
        for sp in get(map, "service_ports")
            .map(|s| list(s, "service_ports"))
            .transpose()?
            .unwrap_or_default()
        {
            let sp = sp
                .as_map()
                .ok_or_else(|| invalid("each service port must be a map"))?;
            let name = string(
                get(sp, "name").ok_or_else(|| invalid("service port `name` is required"))?,
                "service_ports.name",
            )?;
            let protocol = get(sp, "protocol")
                .map(|p| string(p, "service_ports.protocol"))
                .transpose()?
                .unwrap_or_else(|| "tcp".into());
            let container_ports = list(
                get(sp, "container_ports")
                    .ok_or_else(|| invalid("service port `container_ports` is required"))?,
                "service_ports.container_ports",
            )?
            .iter()
            .map(|p| port(p, "service_ports.container_ports"))
            .collect::<Result<Vec<_>, _>>()?;
            service_ports.push(ServicePortRequest {
                name,
                protocol,
                container_ports,
            });
        }
        let mut all: Vec<u16> = service_ports
            .iter()
            .flat_map(|s| s.container_ports.iter().copied())
            .collect();
        all.sort_unstable();
        if all.windows(2).any(|w| w[0] == w[1]) {
            return Err(invalid("a container port appears in two service ports"));
        }
        let owner = match get(map, "owner") {
            None => Owner::default(),
            Some(o) => {
                let o = o.as_map().ok_or_else(|| invalid("`owner` must be a map"))?;
                let field = |k: &str| {
                    get(o, k)
                        .map(|v| string(v, &format!("owner.{k}")))
                        .transpose()
                        .map(Option::unwrap_or_default)
                };
                Owner {
                    user_id: field("user_id")?,
                    project_id: field("project_id")?,
                    access_key: field("access_key")?,
                }
            }
        };
        let session_type = match get(map, "session_type")
            .map(|v| string(v, "session_type"))
            .transpose()?
            .as_deref()
        {
            None | Some("interactive") => SessionType::Interactive,
            Some("batch") => SessionType::Batch,
            Some(other) => {
                return Err(invalid(format!(
                    "`session_type` `{other}` must be `interactive` or `batch`"
                )))
            }
        };
        let command = get(map, "command")
            .map(|v| string(v, "command"))
            .transpose()?;
        if command.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return Err(invalid("`command` must not be empty"));
        }
        if session_type == SessionType::Batch && command.is_none() {
            return Err(invalid("a batch session needs a `command`"));
        }
        let batch_timeout = match get(map, "batch_timeout") {
            None => None,
            Some(v) => Some(
                v.as_f64()
                    .or_else(|| v.as_i64().map(|n| n as f64))
                    .filter(|t| t.is_finite() && *t > 0.0)
                    .ok_or_else(|| {
                        invalid(format!(
                            "`batch_timeout`: {v} is not a positive number of seconds"
                        ))
                    })?,
            ),
        };
        if batch_timeout.is_some() && session_type != SessionType::Batch {
            return Err(invalid("`batch_timeout` applies to batch sessions only"));
        }
        Ok(KernelConfig {
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
            restart_policy: get(map, "restart_policy")
                .map(RestartPolicy::from_value)
                .transpose()
                .map_err(invalid)?
                .unwrap_or_default(),
            inject: injection(map)?,
        })
    }

    /// Host ports this kernel needs: one per container port of its service ports.
    pub fn port_count(&self) -> usize {
        self.service_ports
            .iter()
            .map(|s| s.container_ports.len())
            .sum()
    }
}

#[cfg(feature = "fault-injection")]
fn injection(map: &[(Value, Value)]) -> Result<Injection, KernelError> {
    match get(map, "_inject") {
        None => Ok(Injection::default()),
        Some(v) => rmpv::ext::from_value(v.clone()).map_err(|e| invalid(format!("`_inject`: {e}"))),
    }
}

#[cfg(not(feature = "fault-injection"))]
fn injection(_: &[(Value, Value)]) -> Result<Injection, KernelError> {
    Ok(Injection::default())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra: Vec<(&str, Value)>) -> Result<KernelConfig, KernelError> {
        let mut m = vec![
            (Value::from("image"), Value::from("kernelvisor-test:latest")),
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
            ("command", "echo hi".into()),
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
            vec![("session_type", "cron".into()), ("command", "x".into())],
            vec![
                ("session_type", "batch".into()),
                ("command", "x".into()),
                ("batch_timeout", Value::from(-1)),
            ],
            vec![("command", "x".into()), ("batch_timeout", Value::from(5))],
            vec![("command", " ".into())],
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
}

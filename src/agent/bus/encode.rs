//! Our [`AgentEvent`]s as Backend.AI 26.x's event classes, byte for byte as its agent puts them
//! on the bus (`ai/backend/common/events/event_types/`, `message_queue/payload.py`).
//!
//! An event is a [`BusMessage`]: its upstream name and its body, the JSON that pydantic's
//! `model_dump_json()` writes for the event class (fields in declaration order, compact, UUIDs
//! and decimals as strings). The anycast entry is the stream field map `name`, `source` (the
//! agent id), `payload` (the body) and `metadata` (the producer's context, all null here:
//! [`METADATA`]) — `AnycastMessagePayload.to_stream_fields()`; the broadcast message is the
//! same four as one JSON object with `metadata` as a string — `BroadcastMessagePayload.
//! to_json()`.
//!
//! What goes where (upstream's agent): kernel and session events anycast **and** broadcast;
//! agent, image, execution and log events anycast only. Events upstream has no class for
//! (`kernel_restarting`, `kernel_dangling`), a `kernel_started` without its creation info (an
//! adopted kernel), session results upstream does not report (a batch kernel destroyed by a
//! call), and kernel or session events whose ids are not UUIDs (upstream's `KernelId` /
//! `SessionId`) never go on the bus ([`on_bus`]).

use std::collections::BTreeMap;

use serde::Serialize;

use crate::agent::events::{AgentEvent, StartedInfo};
use crate::rpc::agent_api::kernel::ImageRef;

/// The anycast stream (`RedisMQArgs.anycast_stream_key`, agent.py `_make_message_queue`).
pub const STREAM_KEY: &str = "events";
/// The broadcast channel (`RedisMQArgs.broadcast_channel`).
pub const BROADCAST_CHANNEL: &str = "events_all";
/// The logical database of the streams (`ai.backend.common.defs.REDIS_STREAM_DB`).
pub const STREAM_DB: i64 = 4;
/// The approximate length our `XADD`s trim the stream to. Upstream trims to about 128
/// (`_MAX_STREAM_LENGTH` of `valkey_stream/client.py`), which drops entries the manager has not
/// read yet when more than that arrive at once: exactly what an agent does when it flushes the
/// events it kept while Redis was down. 10,000 entries (a few MiB of Redis memory) keep such a
/// backlog readable; a larger one is still paced by the manager's reads only as far as this
/// bound, and in a fleet that mixes upstream agents their own `XADD`s trim to 128.
pub const STREAM_MAXLEN: usize = 10_000;
/// `MessageMetadata.from_current_context().serialize()` outside any request: every field null.
pub const METADATA: &str =
    r#"{"request_id":null,"user":null,"triggered_user":null,"traceparent":null}"#;

/// One event as upstream's class renders it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BusMessage {
    /// The event name (`kernel_started`, …): the stream entry's `name`.
    pub name: &'static str,
    /// The body, `model_dump_json()` of the event class.
    pub payload: String,
    /// Also published on [`BROADCAST_CHANNEL`] (kernel and session events).
    pub broadcast: bool,
}

impl BusMessage {
    /// The stream entry's fields in upstream's order: `name`, `source`, `payload`, `metadata`.
    pub fn stream_fields(&self, source: &str) -> [(&'static str, String); 4] {
        [
            ("name", self.name.to_owned()),
            ("source", source.to_owned()),
            ("payload", self.payload.clone()),
            ("metadata", METADATA.to_owned()),
        ]
    }

    /// The broadcast message: `{"name", "source", "payload", "metadata"}` with the body and
    /// the metadata as JSON strings.
    pub fn broadcast_json(&self, source: &str) -> String {
        #[derive(Serialize)]
        struct Wire<'a> {
            name: &'a str,
            source: &'a str,
            payload: &'a str,
            metadata: &'a str,
        }
        serde_json::to_string(&Wire {
            name: self.name,
            source,
            payload: &self.payload,
            metadata: METADATA,
        })
        .expect("strings always serialize")
    }
}

/// Whether `event` goes on the bus (see the module doc).
pub fn on_bus(event: &AgentEvent) -> bool {
    encode(event, "").is_some()
}

/// `event` as upstream's class, from the agent `agent_id` (image events carry it); `None` when
/// it does not go on the bus.
pub fn encode(event: &AgentEvent, agent_id: &str) -> Option<BusMessage> {
    use AgentEvent as E;
    let anycast = |name, payload| {
        Some(BusMessage {
            name,
            payload,
            broadcast: false,
        })
    };
    let both = |name, payload| {
        Some(BusMessage {
            name,
            payload,
            broadcast: true,
        })
    };
    match event {
        E::AgentStarted => anycast(
            "agent_started",
            json(&Reason {
                reason: "self-started",
            }),
        ),
        E::AgentTerminated { reason } => anycast("agent_terminated", json(&Reason { reason })),
        E::AgentError { message, traceback } => anycast(
            "agent_error",
            json(&AgentError {
                message,
                traceback: traceback.as_deref(),
                user: None,
                context_env: BTreeMap::new(),
                severity: "ERROR",
            }),
        ),
        E::KernelPreparing {
            kernel_id,
            session_id,
        }
        | E::KernelCreating {
            kernel_id,
            session_id,
        } => {
            uuids(&[kernel_id, session_id])?;
            both(
                event.name(),
                json(&KernelLifecycle {
                    kernel_id,
                    session_id,
                    reason: "",
                }),
            )
        }
        E::KernelPulling {
            kernel_id,
            session_id,
            image,
        } => {
            uuids(&[kernel_id, session_id])?;
            both(
                "kernel_pulling",
                json(&KernelLifecycle {
                    kernel_id,
                    session_id,
                    reason: image.as_deref().unwrap_or(""),
                }),
            )
        }
        E::KernelStarted {
            kernel_id,
            session_id,
            creation_info,
        } => {
            uuids(&[kernel_id, session_id])?;
            let info = creation_info.as_deref()?;
            both(
                "kernel_started",
                json(&KernelStarted {
                    kernel_id,
                    session_id,
                    reason: "",
                    creation_info: CreationInfo::from(info),
                }),
            )
        }
        E::KernelTerminated {
            kernel_id,
            session_id,
            reason,
            exit_code,
        } => {
            uuids(&[kernel_id, session_id])?;
            both(
                "kernel_terminated",
                json(&KernelTermination {
                    kernel_id,
                    session_id,
                    reason: termination_reason(reason),
                    exit_code: exit_code.unwrap_or(-1),
                }),
            )
        }
        E::SessionSuccess { session_id, .. } => {
            uuids(&[session_id])?;
            both(
                "session_success",
                json(&SessionResult {
                    session_id,
                    reason: "task-finished",
                    exit_code: 0,
                }),
            )
        }
        E::SessionFailure {
            session_id,
            reason,
            exit_code,
            ..
        } => {
            uuids(&[session_id])?;
            // `task-failed` / `task-timeout` are what a batch job's run reports
            // (`trigger_batch_execution`, methods/runner.rs and methods/kernels.rs): dropping
            // them left a failed batch session RUNNING forever (tests/it/bai_halfstack.rs).
            let (reason, exit_code) = match reason.as_str() {
                "batch-timeout" | "task-timeout" => ("task-timeout", -2),
                "self-terminated" | "oom-killed" | "shm-exceeded" | "task-failed" => {
                    ("task-failed", exit_code.unwrap_or(-1))
                }
                _ => return None,
            };
            both(
                "session_failure",
                json(&SessionResult {
                    session_id,
                    reason,
                    exit_code,
                }),
            )
        }
        E::ExecutionStarted { session_id, .. }
        | E::ExecutionFinished { session_id, .. }
        | E::ExecutionTimeout { session_id, .. } => {
            uuids(&[session_id])?;
            anycast(event.name(), json(&Session { session_id }))
        }
        E::ImagePullStarted {
            image,
            timestamp,
            image_ref,
        } => anycast(
            "image_pull_started",
            json(&ImagePullStarted {
                image,
                agent_id,
                timestamp: *timestamp,
                image_ref: image_ref.as_ref(),
            }),
        ),
        E::ImagePullFinished {
            image,
            timestamp,
            msg,
            image_ref,
        } => anycast(
            "image_pull_finished",
            json(&ImagePullFinished {
                image,
                agent_id,
                timestamp: *timestamp,
                msg: msg.as_deref(),
                image_ref: image_ref.as_ref(),
            }),
        ),
        E::ImagePullFailed {
            image,
            msg,
            image_ref,
        } => anycast(
            "image_pull_failed",
            json(&ImagePullFailed {
                image,
                agent_id,
                msg,
                image_ref: image_ref.as_ref(),
            }),
        ),
        E::DoSyncKernelLogs {
            kernel_id,
            container_id,
        } => {
            uuids(&[kernel_id])?;
            anycast(
                "do_sync_kernel_logs",
                json(&SyncLogs {
                    kernel_id,
                    container_id,
                }),
            )
        }
        E::KernelRestarting { .. } | E::KernelDangling { .. } => None,
    }
}

/// `Some(())` when every id is a UUID (upstream's `KernelId` / `SessionId` validate as one).
fn uuids(ids: &[&String]) -> Option<()> {
    ids.iter()
        .all(|id| uuid::Uuid::parse_str(id).is_ok())
        .then_some(())
}

/// Upstream's `KernelLifecycleEventReason` values (`kernel/types.py`): a `kernel_terminated`
/// whose reason is not one of them does not validate.
pub const LIFECYCLE_REASONS: &[&str] = &[
    "agent-termination",
    "already-terminated",
    "anomaly-detected",
    "exec-timeout",
    "failed-to-create",
    "failed-to-start",
    "force-terminated",
    "bootstrap-timeout",
    "hang-timeout",
    "idle-timeout",
    "idle-session-lifetime",
    "idle-utilization",
    "killed-by-event",
    "service-scaled-down",
    "new-container-started",
    "pending-timeout",
    "restarting",
    "restart-timeout",
    "resuming-agent-operation",
    "self-terminated",
    "task-failed",
    "task-timeout",
    "task-cancelled",
    "task-finished",
    "terminated-unknown-container",
    "unknown",
    "user-requested",
    "user-purged",
    "not-found-in-manager",
    "container-not-found",
    "route-termination",
    "dry-run-complete",
    "preempted-by-scheduler",
    "agent-resource-group-changed",
    "stale-kernel",
    "exceeded-max-retries",
    "abnormal-termination",
    "rescheduled",
    "triggered-by-scheduler",
    "passed-preconditions",
    "deprioritized-for-rescheduling",
    "preemption-reservation",
    "preempted-by-reservation",
    "kernel-handler-failure",
];

/// Our termination reason as one of upstream's: itself when upstream has it; a container that
/// ended by itself (also by the OOM killer or a full `/dev/shm`) is `self-terminated`, as
/// upstream's `handle_action_die` reports it; a batch timeout `task-timeout`; a kernel ended
/// by the agent's shutdown or reset `agent-termination`; one that never came up
/// `failed-to-create`; anything else `unknown`.
pub fn termination_reason(reason: &str) -> &str {
    if LIFECYCLE_REASONS.contains(&reason) {
        return reason;
    }
    match reason {
        "oom-killed" | "shm-exceeded" | "unhealthy" => "self-terminated",
        "batch-timeout" => "task-timeout",
        "shutdown" | "agent-shutdown" | "agent-reset" => "agent-termination",
        "session-creation-failed" | "agent-restarted-during-creation" => "failed-to-create",
        _ => "unknown",
    }
}

/// `v` as compact JSON, as pydantic's `model_dump_json()` writes it.
fn json<T: Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("event bodies always serialize")
}

#[derive(Serialize)]
struct Reason<'a> {
    reason: &'a str,
}

#[derive(Serialize)]
struct AgentError<'a> {
    message: &'a str,
    traceback: Option<&'a str>,
    user: Option<&'a str>,
    context_env: BTreeMap<String, String>,
    severity: &'a str,
}

#[derive(Serialize)]
struct KernelLifecycle<'a> {
    kernel_id: &'a str,
    session_id: &'a str,
    reason: &'a str,
}

#[derive(Serialize)]
struct KernelStarted<'a> {
    kernel_id: &'a str,
    session_id: &'a str,
    reason: &'a str,
    creation_info: CreationInfo<'a>,
}

/// Upstream's `KernelCreationInfo`.
#[derive(Serialize)]
struct CreationInfo<'a> {
    container_id: &'a str,
    kernel_host: &'a str,
    repl_in_port: u16,
    repl_out_port: u16,
    service_ports: Vec<ServicePort<'a>>,
    used_devices: UsedDevices<'a>,
}

#[derive(Serialize)]
struct ServicePort<'a> {
    name: &'a str,
    protocol: &'a str,
    container_ports: &'a [u16],
    host_ports: &'a [u16],
    is_inference: bool,
}

#[derive(Serialize)]
struct UsedDevices<'a> {
    units: BTreeMap<&'a str, BTreeMap<&'a str, &'a crate::agent::events::UsedDevice>>,
}

impl<'a> From<&'a StartedInfo> for CreationInfo<'a> {
    fn from(i: &'a StartedInfo) -> Self {
        CreationInfo {
            container_id: &i.container_id,
            kernel_host: &i.kernel_host,
            repl_in_port: i.repl_in_port,
            repl_out_port: i.repl_out_port,
            service_ports: i
                .service_ports
                .iter()
                .map(|s| ServicePort {
                    name: &s.name,
                    protocol: &s.protocol,
                    container_ports: &s.container_ports,
                    host_ports: &s.host_ports,
                    is_inference: false,
                })
                .collect(),
            used_devices: UsedDevices {
                units: i
                    .used_devices
                    .iter()
                    .map(|(d, units)| {
                        (
                            d.as_str(),
                            units.iter().map(|(u, x)| (u.as_str(), x)).collect(),
                        )
                    })
                    .collect(),
            },
        }
    }
}

#[derive(Serialize)]
struct KernelTermination<'a> {
    kernel_id: &'a str,
    session_id: &'a str,
    reason: &'a str,
    exit_code: i64,
}

#[derive(Serialize)]
struct SessionResult<'a> {
    session_id: &'a str,
    reason: &'a str,
    exit_code: i64,
}

#[derive(Serialize)]
struct Session<'a> {
    session_id: &'a str,
}

#[derive(Serialize)]
struct ImagePullStarted<'a> {
    image: &'a str,
    agent_id: &'a str,
    timestamp: f64,
    image_ref: Option<&'a ImageRef>,
}

#[derive(Serialize)]
struct ImagePullFinished<'a> {
    image: &'a str,
    agent_id: &'a str,
    timestamp: f64,
    msg: Option<&'a str>,
    image_ref: Option<&'a ImageRef>,
}

#[derive(Serialize)]
struct ImagePullFailed<'a> {
    image: &'a str,
    agent_id: &'a str,
    msg: &'a str,
    image_ref: Option<&'a ImageRef>,
}

#[derive(Serialize)]
struct SyncLogs<'a> {
    kernel_id: &'a str,
    container_id: &'a str,
}

/// Upstream's `AgentInfo` (`ai/backend/common/data/agent/types.py`), the body of
/// `agent_heartbeat` as `{"agent_info": AgentInfo}`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AgentInfo {
    /// The host of the advertised RPC address.
    pub ip: String,
    /// `[agent] region`.
    pub region: Option<String>,
    /// `[agent] scaling-group`.
    pub scaling_group: Option<String>,
    /// The advertised RPC address, `tcp://host:port`.
    pub addr: String,
    /// The agent's CURVE public key (Z85, 40 characters), `None` without CURVE.
    pub public_key: Option<String>,
    /// Where users reach the kernels' service ports (`[container] advertised-host`, else
    /// `bind-host`, as upstream's `_get_public_host`).
    pub public_host: String,
    /// `[{resource_type, quantity}]`: every slot's capacity as a decimal string.
    pub available_resource_slots: Vec<SlotEntry>,
    /// `{slot: "count" | "bytes" | "unique"}`.
    pub slot_key_and_units: BTreeMap<String, String>,
    /// The agent's version.
    pub version: String,
    /// `{device name: {"version": …, …}}`, one per compute plugin (`cpu`, `mem`, `cuda`).
    pub compute_plugins: BTreeMap<String, serde_json::Value>,
    /// `platform.machine()` with `amd64` as `x86_64` and `arm64` as `aarch64`.
    pub architecture: String,
    /// Whether the agent kills abusing kernels itself (never here).
    pub auto_terminate_abusing_kernel: bool,
}

/// Upstream's `ResourceSlotEntry`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlotEntry {
    /// Slot name (`cpu`, `mem`, `cuda.device`).
    pub resource_type: String,
    /// Decimal string.
    pub quantity: String,
}

/// `agent_heartbeat` with `info` (anycast only).
pub fn heartbeat(info: &AgentInfo) -> BusMessage {
    #[derive(Serialize)]
    struct Heartbeat<'a> {
        agent_info: &'a AgentInfo,
    }
    BusMessage {
        name: "agent_heartbeat",
        payload: serde_json::to_string(&Heartbeat { agent_info: info })
            .expect("AgentInfo always serializes"),
        broadcast: false,
    }
}

/// Upstream's `get_arch_name()` for this build's architecture (`x86_64`, `aarch64`).
pub fn architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "x86_64",
        "aarch64" => "aarch64",
        other => other,
    }
}

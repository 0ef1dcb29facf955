//! The agent's events as they travel to the manager's intake: `agent_events(agent_id, events)`
//! (`docs/events.md`). One type, [`AgentEvent`], that the agent emits, keeps in its outbox and
//! sends ([`encode`]) and that the manager reads back ([`ReceivedEvent::from_value`]).
//!
//! Fields a receiver has always defaulted when an event lacks them (an older agent's, a test's
//! hand-built map) carry their default here (`#[serde(default)]`), so reading stays as lenient
//! as it was; a missing field without a default is an error naming it. An event whose name this
//! build does not know (a newer agent's), and the events only Backend.AI's bus takes, read as
//! [`Received::Unknown`]: still stored and acked, so the agent does not resend them forever.

use rmpv::Value;
use serde::{Deserialize, Serialize};

use crate::rpc::agent_api::kernel::ImageRef;

fn shutdown() -> String {
    "shutdown".into()
}

fn unknown() -> String {
    "unknown".into()
}

fn one() -> u32 {
    1
}

/// One event about this agent or one of its kernels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum AgentEvent {
    /// The agent is up (after recovery).
    AgentStarted,
    /// The agent is stopping: `reason` (`"shutdown"`).
    AgentTerminated {
        /// Why (`shutdown` when an event lacks it).
        #[serde(default = "shutdown")]
        reason: String,
    },
    /// Setup began.
    KernelPreparing {
        /// Kernel id.
        kernel_id: String,
        /// Session id (empty when an event lacks it).
        #[serde(default)]
        session_id: String,
    },
    /// The image is being pulled.
    KernelPulling {
        /// Kernel id.
        kernel_id: String,
        /// Session id (empty when an event lacks it).
        #[serde(default)]
        session_id: String,
        /// The image (its canonical name): upstream's `reason` of `kernel_pulling`. Bus only:
        /// left out of our manager's wire (`event_sender::encode_event`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        image: Option<String>,
    },
    /// The container is being created.
    KernelCreating {
        /// Kernel id.
        kernel_id: String,
        /// Session id (empty when an event lacks it).
        #[serde(default)]
        session_id: String,
    },
    /// The kernel is `RUNNING`.
    KernelStarted {
        /// Kernel id.
        kernel_id: String,
        /// Session id (empty when an event lacks it).
        #[serde(default)]
        session_id: String,
        /// How it came up (upstream's `KernelCreationInfo`), when the agent created it (not
        /// when it adopted it). Bus only: left out of our manager's wire.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        creation_info: Option<Box<StartedInfo>>,
    },
    /// The kernel's container ended and its restart policy restarts it (Kubernetes' restart
    /// with back-off; durable and never superseded, so the manager counts every restart).
    KernelRestarting {
        /// Kernel id.
        kernel_id: String,
        /// Session id (empty when an event lacks it).
        #[serde(default)]
        session_id: String,
        /// Restarts so far, this one included (1 when an event lacks it).
        #[serde(default = "one")]
        restart_count: u32,
        /// Why the container ended: `self-terminated`, `oom-killed`, `unhealthy`, …
        #[serde(default)]
        reason: String,
        /// Its exit code, when it exited.
        exit_code: Option<i64>,
    },
    /// The kernel ended and its resources are released: `reason` is `user-requested`,
    /// `self-terminated`, `oom-killed`, `shm-exceeded`, `failed-to-create`, …
    KernelTerminated {
        /// Kernel id.
        kernel_id: String,
        /// Session id (empty when an event lacks it).
        #[serde(default)]
        session_id: String,
        /// Why it ended (`unknown` when an event lacks it).
        #[serde(default = "unknown")]
        reason: String,
        /// The container's exit code, when it exited by itself.
        exit_code: Option<i64>,
    },
    /// A batch session's command exited 0 (Backend.AI's `session_success`); published before
    /// its `kernel_terminated`.
    SessionSuccess {
        /// Kernel id.
        kernel_id: String,
        /// Session id (empty when an event lacks it).
        #[serde(default)]
        session_id: String,
        /// The command's exit code (0).
        exit_code: Option<i64>,
    },
    /// A batch session failed (Backend.AI's `session_failure`): non-zero exit, killed,
    /// `batch-timeout`, or ended by anything else than its command's own exit.
    SessionFailure {
        /// Kernel id.
        kernel_id: String,
        /// Session id (empty when an event lacks it).
        #[serde(default)]
        session_id: String,
        /// Why (`self-terminated`, `batch-timeout`, `user-requested`, …).
        #[serde(default)]
        reason: String,
        /// The command's exit code, when it exited by itself.
        exit_code: Option<i64>,
    },
    /// `execute` started a run.
    ExecutionStarted {
        /// Kernel id.
        kernel_id: String,
        /// Session id (empty when an event lacks it).
        #[serde(default)]
        session_id: String,
        /// The run.
        #[serde(default)]
        run_id: String,
    },
    /// A run exited.
    ExecutionFinished {
        /// Kernel id.
        kernel_id: String,
        /// Session id (empty when an event lacks it).
        #[serde(default)]
        session_id: String,
        /// The run.
        #[serde(default)]
        run_id: String,
        /// Its exit code (nil when the engine lost it).
        exit_code: Option<i64>,
    },
    /// A run was killed by its `timeout`.
    ExecutionTimeout {
        /// Kernel id.
        kernel_id: String,
        /// Session id (empty when an event lacks it).
        #[serde(default)]
        session_id: String,
        /// The run.
        #[serde(default)]
        run_id: String,
    },
    /// An image pull began (bus only: upstream's `image_pull_started`).
    ImagePullStarted {
        /// The image's canonical name.
        image: String,
        /// Unix seconds.
        timestamp: f64,
        /// The image by its parts, as upstream sends it (`None` when its name does not parse).
        #[serde(default)]
        image_ref: Option<ImageRef>,
    },
    /// An image pull ended, or was not needed (bus only: upstream's `image_pull_finished`).
    ImagePullFinished {
        /// The image's canonical name.
        image: String,
        /// Unix seconds.
        timestamp: f64,
        /// `"Image already exists"` when no pull was needed.
        #[serde(default)]
        msg: Option<String>,
        /// The image by its parts, as upstream sends it (`None` when its name does not parse).
        #[serde(default)]
        image_ref: Option<ImageRef>,
    },
    /// An image pull failed (bus only: upstream's `image_pull_failed`).
    ImagePullFailed {
        /// The image's canonical name.
        image: String,
        /// Why.
        msg: String,
        /// The image by its parts, as upstream sends it (`None` when its name does not parse).
        #[serde(default)]
        image_ref: Option<ImageRef>,
    },
    /// The kernel's logs are complete (its container ended): bus only, upstream's
    /// `do_sync_kernel_logs`.
    DoSyncKernelLogs {
        /// Kernel id.
        kernel_id: String,
        /// The engine's container id.
        container_id: String,
    },
    /// An RPC handler failed (a FAILURE it answered, or a panic): bus only, upstream's
    /// `agent_error`, which Backend.AI's agent sends from every RPC function that raises
    /// (`collect_error`).
    AgentError {
        /// One line: what failed.
        message: String,
        /// More detail, when any.
        #[serde(default)]
        traceback: Option<String>,
    },
    /// A container carrying this agent's id that the agent does not know (`docs/design.md`), with what
    /// the engine tells of it (`crate::agent::dangling`). The fields after `container_id` were
    /// added later: receivers that do not know them ignore them, and an outbox row written
    /// before them reads with their defaults.
    KernelDangling {
        /// From the container's `ai.backend.kernel-id` label.
        kernel_id: String,
        /// From its `ai.backend.session-id` label (empty when absent).
        #[serde(default)]
        session_id: String,
        /// The engine's container id (empty when an event lacks it).
        #[serde(default)]
        container_id: String,
        /// The container was running when the agent found it.
        #[serde(default)]
        running: bool,
        /// The image id it runs.
        #[serde(default)]
        image: String,
        /// Its published host ports (service ports first, in their order).
        #[serde(default)]
        host_ports: Vec<u16>,
        /// Its slots, `{name: "decimal"}`: from its `ai.backend.resource.slots` label, else its
        /// `HostConfig` limits (`cpu`, `mem`, `cuda.device`; 0 for a limit it does not have).
        #[serde(default)]
        resource_slots: crate::slots::ResourceSlots,
        /// The owner's access key from its `ai.backend.owner` label (empty when absent).
        #[serde(default)]
        access_key: String,
        /// The agent could rebuild it as a kernel: `adopt_kernel` may take it.
        #[serde(default)]
        adoptable: bool,
        /// Why it cannot be adopted, when it cannot.
        #[serde(default)]
        not_adoptable_reason: Option<String>,
    },
}

impl AgentEvent {
    /// The kernel it is about; `None` for agent events.
    pub fn kernel_id(&self) -> Option<&str> {
        match self {
            AgentEvent::AgentStarted
            | AgentEvent::AgentTerminated { .. }
            | AgentEvent::AgentError { .. }
            | AgentEvent::ImagePullStarted { .. }
            | AgentEvent::ImagePullFinished { .. }
            | AgentEvent::ImagePullFailed { .. } => None,
            AgentEvent::DoSyncKernelLogs { kernel_id, .. } => Some(kernel_id),
            AgentEvent::KernelPreparing { kernel_id, .. }
            | AgentEvent::KernelPulling { kernel_id, .. }
            | AgentEvent::KernelCreating { kernel_id, .. }
            | AgentEvent::KernelStarted { kernel_id, .. }
            | AgentEvent::KernelRestarting { kernel_id, .. }
            | AgentEvent::KernelTerminated { kernel_id, .. }
            | AgentEvent::KernelDangling { kernel_id, .. }
            | AgentEvent::SessionSuccess { kernel_id, .. }
            | AgentEvent::SessionFailure { kernel_id, .. }
            | AgentEvent::ExecutionStarted { kernel_id, .. }
            | AgentEvent::ExecutionFinished { kernel_id, .. }
            | AgentEvent::ExecutionTimeout { kernel_id, .. } => Some(kernel_id),
        }
    }

    /// The event's wire name (`kernel_started`, …).
    pub fn name(&self) -> &'static str {
        match self {
            AgentEvent::AgentStarted => "agent_started",
            AgentEvent::AgentTerminated { .. } => "agent_terminated",
            AgentEvent::KernelPreparing { .. } => "kernel_preparing",
            AgentEvent::KernelPulling { .. } => "kernel_pulling",
            AgentEvent::KernelCreating { .. } => "kernel_creating",
            AgentEvent::KernelStarted { .. } => "kernel_started",
            AgentEvent::KernelRestarting { .. } => "kernel_restarting",
            AgentEvent::KernelTerminated { .. } => "kernel_terminated",
            AgentEvent::KernelDangling { .. } => "kernel_dangling",
            AgentEvent::SessionSuccess { .. } => "session_success",
            AgentEvent::SessionFailure { .. } => "session_failure",
            AgentEvent::ExecutionStarted { .. } => "execution_started",
            AgentEvent::ExecutionFinished { .. } => "execution_finished",
            AgentEvent::ExecutionTimeout { .. } => "execution_timeout",
            AgentEvent::ImagePullStarted { .. } => "image_pull_started",
            AgentEvent::ImagePullFinished { .. } => "image_pull_finished",
            AgentEvent::ImagePullFailed { .. } => "image_pull_failed",
            AgentEvent::DoSyncKernelLogs { .. } => "do_sync_kernel_logs",
            AgentEvent::AgentError { .. } => "agent_error",
        }
    }

    /// An event only Backend.AI's bus takes: our manager's intake has no name for it, so it
    /// never enters the manager's outbox.
    pub fn is_bus_only(&self) -> bool {
        matches!(
            self,
            AgentEvent::ImagePullStarted { .. }
                | AgentEvent::ImagePullFinished { .. }
                | AgentEvent::ImagePullFailed { .. }
                | AgentEvent::DoSyncKernelLogs { .. }
                | AgentEvent::AgentError { .. }
        )
    }

    /// A kernel status transition (`kernel_preparing` … `kernel_terminated`): the only events
    /// that a later one of the same kernel supersedes, and that repeat-suppression applies to.
    pub fn is_kernel_status(&self) -> bool {
        matches!(
            self,
            AgentEvent::KernelPreparing { .. }
                | AgentEvent::KernelPulling { .. }
                | AgentEvent::KernelCreating { .. }
                | AgentEvent::KernelStarted { .. }
                | AgentEvent::KernelTerminated { .. }
        )
    }
}

/// What `kernel_started` tells Backend.AI's manager of a kernel the agent created: upstream's
/// `KernelCreationInfo` (`ai/backend/common/events/event_types/kernel/types.py`), as plain data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StartedInfo {
    /// The engine's full container id.
    pub container_id: String,
    /// Host name or address its ports are reached at.
    pub kernel_host: String,
    /// REPL input port (0: no REPL here).
    pub repl_in_port: u16,
    /// REPL output port (0: no REPL here).
    pub repl_out_port: u16,
    /// Published service ports: `(name, protocol, container ports, host ports)`.
    pub service_ports: Vec<StartedServicePort>,
    /// `{device name: {device id: unit}}`: upstream's `UsedDevices.units`, from which the
    /// manager books the kernel's resources.
    pub used_devices:
        std::collections::BTreeMap<String, std::collections::BTreeMap<String, UsedDevice>>,
}

/// One published service (upstream's `ServicePortInfo`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StartedServicePort {
    /// Service name.
    pub name: String,
    /// `http`, `tcp`, `preopen`, …
    pub protocol: String,
    /// Ports in the container.
    pub container_ports: Vec<u16>,
    /// Host ports, index for index.
    pub host_ports: Vec<u16>,
}

/// One device unit the kernel holds (upstream's `UsedDevice`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsedDevice {
    /// The device's model (`""` for the intrinsic cpu/mem devices, as upstream reports them).
    pub model_name: Option<String>,
    /// `{slot: "decimal"}` held of this unit.
    pub used: std::collections::BTreeMap<String, String>,
    /// Processing units of the device (accelerators only).
    pub processing_units: Option<i64>,
    /// Memory of the device, bytes (accelerators only).
    pub memory_size: Option<i64>,
}

/// The wire map of one event: its fields (less what only Backend.AI's bus reads: `image` of
/// `kernel_pulling`, `creation_info` of `kernel_started`), then `id` (the agent's UUID, the
/// same on every resend), `seq` (the outbox order) and `ts` (enqueue time, Unix seconds).
pub fn encode(id: &str, seq: i64, ts: f64, event: &AgentEvent) -> Value {
    // Named fields (rmpv's own serializer would write structs as arrays).
    let bytes = rmp_serde::to_vec_named(event).expect("an event always serializes");
    let mut map = match rmpv::decode::read_value(&mut &bytes[..]) {
        Ok(Value::Map(m)) => m,
        // AgentEvent is an internally tagged enum of structs: always a map.
        other => unreachable!("event encodes as a map, got {other:?}"),
    };
    // What only Backend.AI's bus reads stays off our manager's wire (its shape is unchanged).
    if matches!(
        event,
        AgentEvent::KernelPulling { .. } | AgentEvent::KernelStarted { .. }
    ) {
        map.retain(|(k, _)| !matches!(k.as_str(), Some("image" | "creation_info")));
    }
    map.push(("id".into(), id.into()));
    map.push(("seq".into(), seq.into()));
    map.push(("ts".into(), ts.into()));
    Value::Map(map)
}

/// One event as the intake received it.
#[derive(Clone, Debug, PartialEq)]
pub struct ReceivedEvent {
    /// Event UUID, the same on every resend.
    pub id: String,
    /// The agent's outbox order (0 when absent).
    pub seq: i64,
    /// What happened.
    pub event: Received,
}

/// A received event's body.
#[derive(Clone, Debug, PartialEq)]
pub enum Received {
    /// An event of this build's intake.
    Known(AgentEvent),
    /// A name this build's intake does not take (a newer agent's, or a bus-only one): recorded
    /// and acked, no effect.
    Unknown {
        /// The name.
        name: String,
    },
}

impl Received {
    /// The wire name.
    pub fn name(&self) -> &str {
        match self {
            Received::Known(e) => e.name(),
            Received::Unknown { name } => name,
        }
    }
}

/// Every name the intake takes: the events that are not bus-only.
pub const INTAKE_NAMES: &[&str] = &[
    "agent_started",
    "agent_terminated",
    "kernel_preparing",
    "kernel_pulling",
    "kernel_creating",
    "kernel_started",
    "kernel_restarting",
    "kernel_terminated",
    "session_success",
    "session_failure",
    "execution_started",
    "execution_finished",
    "execution_timeout",
    "kernel_dangling",
];

/// The envelope every event map has.
#[derive(Deserialize)]
struct Envelope {
    id: String,
    #[serde(default)]
    seq: i64,
    name: String,
}

impl ReceivedEvent {
    /// Reads one event map. A nil value reads as an absent key (msgpack peers write `None`).
    ///
    /// Errors: not a map, or a missing / ill-typed `id`, `name`, or field the event requires
    /// (serde's message names it: ``missing field `kernel_id` ``). Such an event is not acked:
    /// the agent keeps it and the operator sees the error in the manager's log.
    pub fn from_value(v: &Value) -> Result<ReceivedEvent, String> {
        let map = v.as_map().ok_or("an event must be a map")?;
        let map = Value::Map(map.iter().filter(|(_, v)| !v.is_nil()).cloned().collect());
        let envelope: Envelope = rmpv::ext::from_value(map.clone()).map_err(|e| e.to_string())?;
        let event = if INTAKE_NAMES.contains(&envelope.name.as_str()) {
            Received::Known(rmpv::ext::from_value(map).map_err(|e| e.to_string())?)
        } else {
            Received::Unknown {
                name: envelope.name,
            }
        };
        Ok(ReceivedEvent {
            id: envelope.id,
            seq: envelope.seq,
            event,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intake_names_are_the_events_not_bus_only() {
        // One of each variant, by name.
        let all = [
            AgentEvent::AgentStarted,
            AgentEvent::AgentTerminated { reason: shutdown() },
            AgentEvent::KernelPreparing {
                kernel_id: "k".into(),
                session_id: "s".into(),
            },
            AgentEvent::KernelPulling {
                kernel_id: "k".into(),
                session_id: "s".into(),
                image: None,
            },
            AgentEvent::KernelCreating {
                kernel_id: "k".into(),
                session_id: "s".into(),
            },
            AgentEvent::KernelStarted {
                kernel_id: "k".into(),
                session_id: "s".into(),
                creation_info: None,
            },
            AgentEvent::KernelRestarting {
                kernel_id: "k".into(),
                session_id: "s".into(),
                restart_count: 1,
                reason: String::new(),
                exit_code: None,
            },
            AgentEvent::KernelTerminated {
                kernel_id: "k".into(),
                session_id: "s".into(),
                reason: unknown(),
                exit_code: None,
            },
            AgentEvent::SessionSuccess {
                kernel_id: "k".into(),
                session_id: "s".into(),
                exit_code: Some(0),
            },
            AgentEvent::SessionFailure {
                kernel_id: "k".into(),
                session_id: "s".into(),
                reason: String::new(),
                exit_code: None,
            },
            AgentEvent::ExecutionStarted {
                kernel_id: "k".into(),
                session_id: "s".into(),
                run_id: "r".into(),
            },
            AgentEvent::ExecutionFinished {
                kernel_id: "k".into(),
                session_id: "s".into(),
                run_id: "r".into(),
                exit_code: None,
            },
            AgentEvent::ExecutionTimeout {
                kernel_id: "k".into(),
                session_id: "s".into(),
                run_id: "r".into(),
            },
            AgentEvent::ImagePullStarted {
                image: "i".into(),
                timestamp: 0.0,
                image_ref: None,
            },
            AgentEvent::ImagePullFinished {
                image: "i".into(),
                timestamp: 0.0,
                msg: None,
                image_ref: None,
            },
            AgentEvent::ImagePullFailed {
                image: "i".into(),
                msg: String::new(),
                image_ref: None,
            },
            AgentEvent::DoSyncKernelLogs {
                kernel_id: "k".into(),
                container_id: "c".into(),
            },
            AgentEvent::AgentError {
                message: String::new(),
                traceback: None,
            },
            AgentEvent::KernelDangling {
                kernel_id: "k".into(),
                session_id: "s".into(),
                container_id: "c".into(),
                running: false,
                image: String::new(),
                host_ports: vec![],
                resource_slots: Default::default(),
                access_key: String::new(),
                adoptable: false,
                not_adoptable_reason: None,
            },
        ];
        let intake: Vec<&str> = all
            .iter()
            .filter(|e| !e.is_bus_only())
            .map(AgentEvent::name)
            .collect();
        assert_eq!(intake, INTAKE_NAMES);
        // Each one reads back as itself through the wire.
        for e in all.iter().filter(|e| !e.is_bus_only()) {
            let got = ReceivedEvent::from_value(&encode("id", 3, 1.5, e)).unwrap();
            assert_eq!((got.id.as_str(), got.seq), ("id", 3));
            assert_eq!(got.event, Received::Known(e.clone()), "{}", e.name());
        }
        let bus = encode("id", 1, 0.0, &all[13]);
        assert_eq!(
            ReceivedEvent::from_value(&bus).unwrap().event,
            Received::Unknown {
                name: "image_pull_started".into()
            }
        );
    }
}

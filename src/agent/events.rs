//! Agent events (Backend.AI's names) and the in-process bus they are published on.
//!
//! Kernel actors publish every status transition here. With a manager configured, every event
//! also goes to the outbox writer (outbox.rs), which makes it durable before the event sender
//! (event_sender.rs) delivers it; subscribers (tests) each get every event in order. The wire
//! encoding is in `docs/events.md`.

use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc};

/// One event about this agent or one of its kernels.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case")]
pub enum AgentEvent {
    /// The agent is up (after recovery).
    AgentStarted,
    /// The agent is stopping: `reason` (`"shutdown"`).
    AgentTerminated {
        /// Why.
        reason: String,
    },
    /// Setup began.
    KernelPreparing {
        /// Kernel id.
        kernel_id: String,
        /// Session id.
        session_id: String,
    },
    /// The image is being pulled.
    KernelPulling {
        /// Kernel id.
        kernel_id: String,
        /// Session id.
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
        /// Session id.
        session_id: String,
    },
    /// The kernel is `RUNNING`.
    KernelStarted {
        /// Kernel id.
        kernel_id: String,
        /// Session id.
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
        /// Session id.
        session_id: String,
        /// Restarts so far, this one included.
        restart_count: u32,
        /// Why the container ended: `self-terminated`, `oom-killed`, `unhealthy`, …
        reason: String,
        /// Its exit code, when it exited.
        exit_code: Option<i64>,
    },
    /// The kernel ended and its resources are released: `reason` is `user-requested`,
    /// `self-terminated`, `oom-killed`, `shm-exceeded`, `failed-to-create`, …
    KernelTerminated {
        /// Kernel id.
        kernel_id: String,
        /// Session id.
        session_id: String,
        /// Why it ended.
        reason: String,
        /// The container's exit code, when it exited by itself.
        exit_code: Option<i64>,
    },
    /// A batch session's command exited 0 (Backend.AI's `session_success`); published before
    /// its `kernel_terminated`.
    SessionSuccess {
        /// Kernel id.
        kernel_id: String,
        /// Session id.
        session_id: String,
        /// The command's exit code (0).
        exit_code: Option<i64>,
    },
    /// A batch session failed (Backend.AI's `session_failure`): non-zero exit, killed,
    /// `batch-timeout`, or ended by anything else than its command's own exit.
    SessionFailure {
        /// Kernel id.
        kernel_id: String,
        /// Session id.
        session_id: String,
        /// Why (`self-terminated`, `batch-timeout`, `user-requested`, …).
        reason: String,
        /// The command's exit code, when it exited by itself.
        exit_code: Option<i64>,
    },
    /// `execute` started a run.
    ExecutionStarted {
        /// Kernel id.
        kernel_id: String,
        /// Session id.
        session_id: String,
        /// The run.
        run_id: String,
    },
    /// A run exited.
    ExecutionFinished {
        /// Kernel id.
        kernel_id: String,
        /// Session id.
        session_id: String,
        /// The run.
        run_id: String,
        /// Its exit code (nil when the engine lost it).
        exit_code: Option<i64>,
    },
    /// A run was killed by its `timeout`.
    ExecutionTimeout {
        /// Kernel id.
        kernel_id: String,
        /// Session id.
        session_id: String,
        /// The run.
        run_id: String,
    },
    /// An image pull began (bus only: upstream's `image_pull_started`).
    ImagePullStarted {
        /// The image's canonical name.
        image: String,
        /// Unix seconds.
        timestamp: f64,
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
    },
    /// An image pull failed (bus only: upstream's `image_pull_failed`).
    ImagePullFailed {
        /// The image's canonical name.
        image: String,
        /// Why.
        msg: String,
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
        /// From its `ai.backend.session-id` label.
        session_id: String,
        /// The engine's container id.
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

/// Fan-out of [`AgentEvent`]s: to the outbox writer when there is one (nothing lost), and to
/// every subscriber (one that falls more than 4096 events behind loses the oldest: it sees
/// `Lagged`).
#[derive(Clone, Debug)]
pub struct EventBus {
    subscribers: broadcast::Sender<AgentEvent>,
    outbox: Option<mpsc::UnboundedSender<AgentEvent>>,
}

impl Default for EventBus {
    fn default() -> Self {
        EventBus {
            subscribers: broadcast::channel(4096).0,
            outbox: None,
        }
    }
}

impl EventBus {
    /// A bus that also feeds the outbox writer through `outbox`.
    pub fn with_outbox(outbox: mpsc::UnboundedSender<AgentEvent>) -> Self {
        EventBus {
            outbox: Some(outbox),
            ..EventBus::default()
        }
    }

    /// Publishes `event` to the outbox writer and the current subscribers (none is fine).
    pub fn emit(&self, event: AgentEvent) {
        tracing::debug!(
            event = event.name(),
            kernel_id = event.kernel_id(),
            ?event,
            "event"
        );
        if let Some(outbox) = &self.outbox {
            if outbox.send(event.clone()).is_err() {
                tracing::warn!(
                    event = event.name(),
                    kernel_id = event.kernel_id(),
                    "event emitted after the outbox writer stopped: not delivered"
                );
            }
        }
        let _ = self.subscribers.send(event);
    }

    /// A new subscriber, seeing events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<AgentEvent> {
        self.subscribers.subscribe()
    }
}

//! Agent events (Backend.AI's names) and the in-process bus they are published on.
//!
//! Kernel actors publish every status transition here; subscribers (the durable event sender
//! of the agent-level actors, tests) each get every event in order. The bus itself keeps
//! nothing: durability is the event sender's job.

use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;

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
    /// A container carrying this agent's id that the agent does not know (seed 001).
    KernelDangling {
        /// From the container's `ai.backend.kernel-id` label.
        kernel_id: String,
        /// From its `ai.backend.session-id` label.
        session_id: String,
        /// The engine's container id.
        container_id: String,
    },
}

impl AgentEvent {
    /// The event's wire name (`kernel_started`, …).
    pub fn name(&self) -> &'static str {
        match self {
            AgentEvent::AgentStarted => "agent_started",
            AgentEvent::AgentTerminated { .. } => "agent_terminated",
            AgentEvent::KernelPreparing { .. } => "kernel_preparing",
            AgentEvent::KernelPulling { .. } => "kernel_pulling",
            AgentEvent::KernelCreating { .. } => "kernel_creating",
            AgentEvent::KernelStarted { .. } => "kernel_started",
            AgentEvent::KernelTerminated { .. } => "kernel_terminated",
            AgentEvent::KernelDangling { .. } => "kernel_dangling",
        }
    }
}

/// Fan-out of [`AgentEvent`]s to every subscriber. A subscriber that falls more than 4096
/// events behind loses the oldest (it sees `Lagged`), so subscribers must keep up.
#[derive(Clone, Debug)]
pub struct EventBus(broadcast::Sender<AgentEvent>);

impl Default for EventBus {
    fn default() -> Self {
        EventBus(broadcast::channel(4096).0)
    }
}

impl EventBus {
    /// Publishes `event` to the current subscribers (none is fine).
    pub fn emit(&self, event: AgentEvent) {
        tracing::debug!(event = event.name(), ?event, "event");
        let _ = self.0.send(event);
    }

    /// A new subscriber, seeing events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<AgentEvent> {
        self.0.subscribe()
    }
}

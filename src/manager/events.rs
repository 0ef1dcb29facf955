//! Agent events as the intake receives them (`docs/events.md`): read from the msgpack maps of
//! `agent_events(agent_id, events)` through the agent's own type
//! ([`crate::rpc::intake_api::events`]), seen as what they do here, and compacted per batch.

use std::collections::HashSet;

use rmpv::Value;

use crate::model::session::{KernelStatus, SessionResult};
use crate::rpc::intake_api::events::{AgentEvent as WireEvent, Received, ReceivedEvent};

/// One event. `id` is the agent's UUID, the same on every resend.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentEvent {
    /// Event UUID.
    pub id: String,
    /// The agent's outbox order.
    pub seq: i64,
    /// What happened.
    pub body: EventBody,
}

/// The event's own fields, by `name`.
#[derive(Clone, Debug, PartialEq)]
pub enum EventBody {
    /// `agent_started`.
    AgentStarted,
    /// `agent_terminated` (`reason`: `shutdown`, or `agent-lost` when the manager emits it).
    AgentTerminated {
        /// Why.
        reason: String,
    },
    /// `kernel_preparing` / `kernel_pulling` / `kernel_creating` / `kernel_started`: `status` is
    /// the kernel status it means (`PREPARING`, `PULLING`, `CREATING`, `RUNNING`).
    KernelStatus {
        /// The event name.
        name: String,
        /// Kernel id.
        kernel_id: String,
        /// Status it moves the kernel to.
        status: KernelStatus,
    },
    /// `kernel_terminated`.
    KernelTerminated {
        /// Kernel id.
        kernel_id: String,
        /// `user-requested`, `self-terminated`, `oom-killed`, …
        reason: String,
        /// Exit code, when it exited by itself.
        exit_code: Option<i64>,
    },
    /// `session_success` / `session_failure`: a batch session's outcome.
    SessionResult {
        /// The event name.
        name: String,
        /// Kernel id.
        kernel_id: String,
        /// `SUCCESS` or `FAILURE`.
        result: SessionResult,
    },
    /// `kernel_restarting`: the kernel's restart policy restarts its container.
    KernelRestarting {
        /// Kernel id.
        kernel_id: String,
        /// Restarts so far, this one included.
        restart_count: i64,
    },
    /// `kernel_dangling`: a container of this agent that its store does not know, as the agent
    /// described it from the engine (fields an older agent does not send read as their
    /// defaults: not adoptable).
    KernelDangling {
        /// Kernel id from the container's labels.
        kernel_id: String,
        /// Container id.
        container_id: String,
        /// Session id from its labels (empty when absent).
        session_id: String,
        /// It was running when the agent found it.
        running: bool,
        /// Its published host ports.
        host_ports: Vec<u16>,
        /// The agent rebuilt it as a kernel: `adopt_kernel` may take it.
        adoptable: bool,
    },
    /// A name this manager does not know: recorded and acked (so it is not resent forever), no effect.
    Other {
        /// The name.
        name: String,
    },
}

impl EventBody {
    /// The wire name.
    pub fn name(&self) -> &str {
        match self {
            EventBody::AgentStarted => "agent_started",
            EventBody::AgentTerminated { .. } => "agent_terminated",
            EventBody::KernelStatus { name, .. }
            | EventBody::SessionResult { name, .. }
            | EventBody::Other { name } => name,
            EventBody::KernelTerminated { .. } => "kernel_terminated",
            EventBody::KernelDangling { .. } => "kernel_dangling",
            EventBody::KernelRestarting { .. } => "kernel_restarting",
        }
    }

    /// The kernel it is about, for kernel events.
    pub fn kernel_id(&self) -> Option<&str> {
        match self {
            EventBody::KernelStatus { kernel_id, .. }
            | EventBody::KernelTerminated { kernel_id, .. }
            | EventBody::KernelDangling { kernel_id, .. }
            | EventBody::KernelRestarting { kernel_id, .. }
            | EventBody::SessionResult { kernel_id, .. } => Some(kernel_id),
            _ => None,
        }
    }
}

impl EventBody {
    /// The manager's view of an event as the agent typed it ([`WireEvent`]).
    pub fn of(event: Received) -> EventBody {
        let event = match event {
            Received::Known(e) => e,
            Received::Unknown { name } => return EventBody::Other { name },
        };
        let name = event.name().to_owned();
        match event {
            WireEvent::AgentStarted => EventBody::AgentStarted,
            WireEvent::AgentTerminated { reason } => EventBody::AgentTerminated { reason },
            WireEvent::KernelPreparing { kernel_id, .. } => EventBody::KernelStatus {
                name,
                kernel_id,
                status: KernelStatus::Preparing,
            },
            WireEvent::KernelPulling { kernel_id, .. } => EventBody::KernelStatus {
                name,
                kernel_id,
                status: KernelStatus::Pulling,
            },
            WireEvent::KernelCreating { kernel_id, .. } => EventBody::KernelStatus {
                name,
                kernel_id,
                status: KernelStatus::Creating,
            },
            WireEvent::KernelStarted { kernel_id, .. } => EventBody::KernelStatus {
                name,
                kernel_id,
                status: KernelStatus::Running,
            },
            WireEvent::KernelRestarting {
                kernel_id,
                restart_count,
                ..
            } => EventBody::KernelRestarting {
                kernel_id,
                restart_count: i64::from(restart_count),
            },
            WireEvent::KernelTerminated {
                kernel_id,
                reason,
                exit_code,
                ..
            } => EventBody::KernelTerminated {
                kernel_id,
                reason,
                exit_code,
            },
            WireEvent::SessionSuccess { kernel_id, .. } => EventBody::SessionResult {
                name,
                kernel_id,
                result: SessionResult::Success,
            },
            WireEvent::SessionFailure { kernel_id, .. } => EventBody::SessionResult {
                name,
                kernel_id,
                result: SessionResult::Failure,
            },
            WireEvent::KernelDangling {
                kernel_id,
                container_id,
                session_id,
                running,
                host_ports,
                adoptable,
                ..
            } => EventBody::KernelDangling {
                kernel_id,
                container_id,
                session_id,
                running,
                host_ports,
                adoptable,
            },
            // Recorded as processed, no effect yet (`docs/events.md`); the bus-only ones never
            // arrive as `Known`.
            WireEvent::ExecutionStarted { .. }
            | WireEvent::ExecutionFinished { .. }
            | WireEvent::ExecutionTimeout { .. }
            | WireEvent::ImagePullStarted { .. }
            | WireEvent::ImagePullFinished { .. }
            | WireEvent::ImagePullFailed { .. }
            | WireEvent::DoSyncKernelLogs { .. }
            | WireEvent::AgentError { .. } => EventBody::Other { name },
        }
    }
}

impl AgentEvent {
    /// Reads one event map through the agent's own type ([`ReceivedEvent::from_value`]).
    ///
    /// Errors: not a map, or a missing/ill-typed `id`, `name`, or field the name requires
    /// (the message names it). Such an event is not acked: the agent keeps it and the operator
    /// sees the error in the manager's log.
    pub fn from_value(v: &Value) -> Result<AgentEvent, String> {
        let ReceivedEvent { id, seq, event } = ReceivedEvent::from_value(v)?;
        Ok(AgentEvent {
            id,
            seq,
            body: EventBody::of(event),
        })
    }
}

/// Which events of a batch (oldest first) are superseded: a kernel status update followed, in
/// the same batch, by a later event of the same kernel. `kernel_terminated` is never superseded.
pub fn superseded(batch: &[AgentEvent]) -> Vec<bool> {
    let mut seen_later: HashSet<&str> = HashSet::new();
    let mut out = vec![false; batch.len()];
    for (i, ev) in batch.iter().enumerate().rev() {
        if let EventBody::KernelStatus { kernel_id, .. } = &ev.body {
            out[i] = seen_later.contains(kernel_id.as_str());
        }
        if let Some(k) = ev.body.kernel_id() {
            seen_later.insert(k);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(id: &str, name: &str, kernel: &str) -> Value {
        Value::Map(vec![
            ("id".into(), id.into()),
            ("seq".into(), 1.into()),
            ("name".into(), name.into()),
            ("kernel_id".into(), kernel.into()),
        ])
    }

    #[test]
    fn parses_names_and_requires_fields() {
        let e = AgentEvent::from_value(&ev("a", "kernel_started", "k1")).unwrap();
        assert_eq!(
            e.body,
            EventBody::KernelStatus {
                name: "kernel_started".into(),
                kernel_id: "k1".into(),
                status: KernelStatus::Running
            }
        );
        let bad = Value::Map(vec![
            ("id".into(), "x".into()),
            ("name".into(), "kernel_terminated".into()),
        ]);
        assert!(AgentEvent::from_value(&bad)
            .unwrap_err()
            .contains("kernel_id"));
        assert!(AgentEvent::from_value(&Value::from(3)).is_err());
        let ok = AgentEvent::from_value(&ev("c", "session_success", "k2")).unwrap();
        assert_eq!(
            ok.body,
            EventBody::SessionResult {
                name: "session_success".into(),
                kernel_id: "k2".into(),
                result: SessionResult::Success
            }
        );
        let other = AgentEvent::from_value(&ev("b", "kernel_heartbeat_v9", "k")).unwrap();
        assert_eq!(other.body.name(), "kernel_heartbeat_v9");
    }

    #[test]
    fn compaction_keeps_last_status_and_every_termination() {
        let batch: Vec<AgentEvent> = [
            ev("1", "kernel_preparing", "k1"),
            ev("2", "kernel_creating", "k1"),
            ev("3", "kernel_preparing", "k2"),
            ev("4", "kernel_started", "k1"),
            ev("5", "kernel_terminated", "k2"),
            ev("6", "kernel_terminated", "k2"),
        ]
        .iter()
        .map(|v| AgentEvent::from_value(v).unwrap())
        .collect();
        assert_eq!(
            superseded(&batch),
            vec![true, true, true, false, false, false]
        );
    }
}

//! Kernel status, the kernel's public facts, and the handle its stages report through.

use std::sync::{Arc, Mutex};

use rmpv::Value;

use super::config::KernelConfig;
use super::stages::ServicePortInfo;
use crate::agent::context::AgentContext;
use crate::agent::events::AgentEvent;

/// `PREPARING → PULLING → CREATING → RUNNING → TERMINATING → TERMINATED`, plus `RESTARTING`
/// (Backend.AI's kernel statuses).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelStatus {
    /// Allocating slots, ports, scratch, mounts.
    Preparing,
    /// Pulling the image.
    Pulling,
    /// Creating and starting the container.
    Creating,
    /// Up.
    Running,
    /// `restart_kernel` in progress.
    Restarting,
    /// Tearing down.
    Terminating,
    /// Gone; every resource released.
    Terminated,
}

impl KernelStatus {
    /// The upper-case wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelStatus::Preparing => "PREPARING",
            KernelStatus::Pulling => "PULLING",
            KernelStatus::Creating => "CREATING",
            KernelStatus::Running => "RUNNING",
            KernelStatus::Restarting => "RESTARTING",
            KernelStatus::Terminating => "TERMINATING",
            KernelStatus::Terminated => "TERMINATED",
        }
    }
}

impl std::str::FromStr for KernelStatus {
    type Err = ();
    fn from_str(s: &str) -> Result<Self, ()> {
        Ok(match s {
            "PREPARING" => KernelStatus::Preparing,
            "PULLING" => KernelStatus::Pulling,
            "CREATING" => KernelStatus::Creating,
            "RUNNING" => KernelStatus::Running,
            "RESTARTING" => KernelStatus::Restarting,
            "TERMINATING" => KernelStatus::Terminating,
            "TERMINATED" => KernelStatus::Terminated,
            _ => return Err(()),
        })
    }
}

/// What the agent tells about a kernel (`create_kernels`' result, `sync_kernel_registry`).
#[derive(Clone, Debug)]
pub struct KernelInfo {
    /// Kernel id.
    pub id: String,
    /// Session id.
    pub session_id: String,
    /// Current status.
    pub status: KernelStatus,
    /// The config it was created with.
    pub config: Arc<KernelConfig>,
    /// Engine container id, once created.
    pub container_id: Option<String>,
    /// Host ports held.
    pub host_ports: Vec<u16>,
    /// Service ports as mapped.
    pub service_ports: Vec<ServicePortInfo>,
    /// GPUs allocated (NVML indexes).
    pub gpus: Vec<String>,
    /// `execute`'s interpreter: the image's `ai.backend.runtime-path`, if any.
    pub runtime_path: Option<String>,
    /// Why it ended (when `TERMINATED`).
    pub reason: Option<String>,
    /// Its container's exit code, if it exited by itself.
    pub exit_code: Option<i64>,
    /// The engine reported an `oom` event for its container (the OOM killer ran in its memory
    /// cgroup). Kept beside the container's `OOMKilled` flag, which the engine can miss when
    /// it records the exit before the OOM (seen with cgroup v1).
    pub oom_event: bool,
}

impl KernelInfo {
    /// A new kernel's info: `PREPARING`, nothing held yet.
    pub fn new(id: &str, session_id: &str, config: Arc<KernelConfig>) -> KernelInfo {
        KernelInfo {
            id: id.to_owned(),
            session_id: session_id.to_owned(),
            status: KernelStatus::Preparing,
            config,
            container_id: None,
            host_ports: Vec::new(),
            service_ports: Vec::new(),
            gpus: Vec::new(),
            runtime_path: None,
            reason: None,
            exit_code: None,
            oom_event: false,
        }
    }

    /// As the wire map: `{id, kernel_id, session_id, agent_id, status, container_id, image,
    /// host_ports, service_ports, resource_slots, gpus, reason, exit_code}`.
    pub fn to_value(&self, agent_id: &str) -> Value {
        let opt = |s: &Option<String>| s.clone().map_or(Value::Nil, Value::from);
        Value::Map(vec![
            ("id".into(), self.id.clone().into()),
            ("kernel_id".into(), self.id.clone().into()),
            ("session_id".into(), self.session_id.clone().into()),
            ("agent_id".into(), agent_id.into()),
            ("status".into(), self.status.as_str().into()),
            ("container_id".into(), opt(&self.container_id)),
            ("image".into(), self.config.image.clone().into()),
            (
                "host_ports".into(),
                Value::Array(self.host_ports.iter().map(|&p| p.into()).collect()),
            ),
            (
                "service_ports".into(),
                Value::Array(
                    self.service_ports
                        .iter()
                        .map(ServicePortInfo::to_value)
                        .collect(),
                ),
            ),
            ("resource_slots".into(), self.config.slots.to_value()),
            (
                "gpus".into(),
                Value::Array(self.gpus.iter().map(|g| g.clone().into()).collect()),
            ),
            ("reason".into(), opt(&self.reason)),
            (
                "exit_code".into(),
                self.exit_code.map_or(Value::Nil, Value::from),
            ),
        ])
    }
}

/// A kernel's identity plus the agent context, given to its actor and its stages: they read
/// and update the shared [`KernelInfo`] and publish status events through it.
#[derive(Clone)]
pub struct KernelHandle {
    /// Kernel id.
    pub id: String,
    /// Session id.
    pub session_id: String,
    /// Shared with the registry, which answers status queries without asking the actor.
    pub info: Arc<Mutex<KernelInfo>>,
    /// The agent.
    pub ctx: Arc<AgentContext>,
}

impl KernelHandle {
    /// The current facts.
    pub fn info(&self) -> KernelInfo {
        self.info.lock().expect("kernel info lock").clone()
    }

    /// Updates the facts.
    pub fn update(&self, f: impl FnOnce(&mut KernelInfo)) {
        f(&mut self.info.lock().expect("kernel info lock"));
    }

    /// Sets the status and publishes its event (`kernel_pulling`, …); `TERMINATED` is
    /// published by [`KernelHandle::terminated`] with its reason.
    pub fn set_status(&self, status: KernelStatus) {
        self.update(|i| i.status = status);
        tracing::info!(agent_id = %self.ctx.agent_id, kernel_id = %self.id, status = status.as_str(), "kernel status");
        let (kernel_id, session_id) = (self.id.clone(), self.session_id.clone());
        let event = match status {
            KernelStatus::Preparing => AgentEvent::KernelPreparing {
                kernel_id,
                session_id,
            },
            KernelStatus::Pulling => AgentEvent::KernelPulling {
                kernel_id,
                session_id,
            },
            KernelStatus::Creating => AgentEvent::KernelCreating {
                kernel_id,
                session_id,
            },
            KernelStatus::Running => AgentEvent::KernelStarted {
                kernel_id,
                session_id,
            },
            _ => return,
        };
        self.ctx.events.emit(event);
    }

    /// Marks the kernel `TERMINATED` with `reason` and publishes `kernel_terminated`
    /// unless `suppress_events`.
    pub fn terminated(&self, reason: &str, exit_code: Option<i64>, suppress_events: bool) {
        self.update(|i| {
            i.status = KernelStatus::Terminated;
            i.reason = Some(reason.to_owned());
            i.exit_code = exit_code;
        });
        tracing::info!(agent_id = %self.ctx.agent_id, kernel_id = %self.id, reason, ?exit_code, "kernel terminated");
        if !suppress_events {
            self.ctx.events.emit(AgentEvent::KernelTerminated {
                kernel_id: self.id.clone(),
                session_id: self.session_id.clone(),
                reason: reason.to_owned(),
                exit_code,
            });
        }
    }
}

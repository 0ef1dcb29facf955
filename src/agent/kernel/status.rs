//! Kernel status, the kernel's public facts, and the handle its stages report through.

use std::sync::{Arc, Mutex};

use ::actors::StageInfo;
use rmpv::Value;
use tokio::sync::watch;

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
    /// Its container is being restarted: `restart_kernel`, or its restart policy after the
    /// container exited.
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
    /// Restarts by the restart policy so far (`restart_kernel` not counted).
    pub restart_count: u32,
    /// Its stages in order, as its supervision tree reports them.
    pub stages: Vec<StageInfo>,
    /// `restart_kernel` is restarting the container: its exit is expected, not an end.
    pub manual_restart: bool,
    /// Why its container last ended and the exit code (`oom-killed`, `unhealthy`, …), kept
    /// for the restart event and for the reason when the restart limit is reached.
    pub last_exit: Option<(String, Option<i64>)>,
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
            restart_count: 0,
            stages: Vec::new(),
            manual_restart: false,
            last_exit: None,
        }
    }

    /// As the wire map: `{id, kernel_id, session_id, agent_id, status, container_id, image,
    /// host_ports, service_ports, resource_slots, gpus, reason, exit_code, restart_count,
    /// restart_policy, stages: [{name, status, restarts, setup_seconds}]}`.
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
            ("resource_slots".into(), self.config.slots.to_msgpack()),
            (
                "gpus".into(),
                Value::Array(self.gpus.iter().map(|g| g.clone().into()).collect()),
            ),
            ("reason".into(), opt(&self.reason)),
            (
                "exit_code".into(),
                self.exit_code.map_or(Value::Nil, Value::from),
            ),
            ("restart_count".into(), self.restart_count.into()),
            (
                "restart_policy".into(),
                self.config.restart_policy.to_value(),
            ),
            (
                "stages".into(),
                Value::Array(self.stages.iter().map(stage_value).collect()),
            ),
        ])
    }
}

/// One stage as the wire map `{name, status, restarts, setup_seconds}`.
fn stage_value(s: &StageInfo) -> Value {
    Value::Map(vec![
        ("name".into(), s.name.into()),
        ("status".into(), s.status.as_str().into()),
        ("restarts".into(), s.restarts.into()),
        (
            "setup_seconds".into(),
            s.setup_seconds.map_or(Value::Nil, Value::F64),
        ),
    ])
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
    /// Bumped when the engine reports something about its container (an exit, an OOM) or a
    /// reconcile asks for a check: the container stage's watcher then inspects it.
    pub container_events: Arc<watch::Sender<u64>>,
}

impl KernelHandle {
    /// A handle for a new kernel (`PREPARING`) or one being adopted.
    pub fn new(
        kernel_id: &str,
        session_id: &str,
        config: KernelConfig,
        ctx: Arc<AgentContext>,
    ) -> KernelHandle {
        KernelHandle {
            id: kernel_id.to_owned(),
            session_id: session_id.to_owned(),
            info: Arc::new(Mutex::new(KernelInfo::new(
                kernel_id,
                session_id,
                Arc::new(config),
            ))),
            ctx,
            container_events: Arc::new(watch::channel(0).0),
        }
    }

    /// Asks the container stage's watcher to look at the container again.
    pub fn poke_container(&self) {
        self.container_events
            .send_modify(|n| *n = n.wrapping_add(1));
    }
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

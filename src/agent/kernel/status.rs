//! Kernel status and the kernel's public facts (plain data: the store and the dangling table
//! read them without the agent context; the handle that reports through the context is
//! `handle.rs`).

use std::sync::Arc;

use ::actors::StageInfo;
use rmpv::Value;

use super::config::KernelConfig;
use super::resources::ServicePortInfo;

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
    /// Its runner's host ports when Backend.AI's kernel runner serves it (`None`: the
    /// process path, `crate::agent::runner`).
    pub runner: Option<crate::agent::runner::RunnerPorts>,
    /// Its runner's runtime type keeps a Python REPL (`ai.backend.runtime-type` `python`): the
    /// runner's readiness then includes a query run (`crate::agent::kernel::stages::runner`).
    pub runner_repl: bool,
    /// Its runner's REPL did not start on either boot (the readiness check found query mode
    /// off twice): a query's bare exit code 127 is then explained on its stderr
    /// (`crate::agent::methods::runner`).
    pub runner_repl_off: bool,
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
    /// The grace period of the end under way when its caller gave one (`destroy_kernel`'s
    /// `grace_period`), instead of the kernel's own ([`KernelInfo::grace`]); read by the
    /// container stage's teardown on every look, so a later, shorter one (`rm --now` during a
    /// grace) cuts the wait.
    pub grace_override: Option<std::time::Duration>,
    /// How its workload ended when the container stage's teardown stopped it.
    pub stopped: Option<Stopped>,
}

/// How a kernel's workload ended when its container was stopped with a grace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stopped {
    /// Its exit code when it exited within the grace (143: the `SIGTERM` it did not catch).
    pub exit_code: Option<i64>,
    /// Killed at the grace's deadline.
    pub killed: bool,
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
            runner: None,
            runner_repl: false,
            runner_repl_off: false,
            reason: None,
            exit_code: None,
            oom_event: false,
            restart_count: 0,
            stages: Vec::new(),
            manual_restart: false,
            last_exit: None,
            grace_override: None,
            stopped: None,
        }
    }

    /// How the kernel is ended now: the config's `stop_signal` (default `SIGTERM`, `SIGINT`
    /// for a runner kernel), and the end's own grace period when its caller gave one, else the
    /// config's `grace_period` (default `default_period`, the agent's `[container] grace-period`).
    pub fn grace(&self, default_period: std::time::Duration) -> crate::workload::Grace {
        use crate::workload::grace;
        let signal = self.config.stop_signal.clone().unwrap_or_else(|| {
            if self.runner.is_some() {
                grace::RUNNER_STOP_SIGNAL
            } else {
                grace::DEFAULT_STOP_SIGNAL
            }
            .into()
        });
        let period = self.grace_override.unwrap_or_else(|| {
            self.config
                .grace_period
                .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
                .unwrap_or(default_period)
        });
        crate::workload::Grace { signal, period }
    }

    /// Who a process started in the kernel's container runs as: `uid:gid` for a runner kernel
    /// (its container runs as root; its user is the config's `uid`/`main_gid`, else
    /// `[container] kernel-uid`/`kernel-gid`, as its entrypoint made it), else `None` (the
    /// container's user).
    pub fn exec_user(&self, container: &crate::config::ContainerSection) -> Option<String> {
        self.runner.map(|_| {
            format!(
                "{}:{}",
                self.config.uid.unwrap_or(container.kernel_uid),
                self.config.main_gid.unwrap_or(container.kernel_gid)
            )
        })
    }

    /// As the wire map: `{id, kernel_id, session_id, agent_id, status, container_id, image,
    /// host_ports, service_ports, resource_slots, gpus, reason, exit_code, restart_count,
    /// restart_policy, stages: [{name, status, restarts, setup_seconds}], exec_path:
    /// "kernel-runner" | "process"}`.
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
            (
                "exec_path".into(),
                if self.runner.is_some() {
                    "kernel-runner"
                } else {
                    "process"
                }
                .into(),
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

//! Sessions (one kernel each, or a cluster of them: `cluster.rs`): `POST /v1/sessions`'s request, the session as the API shows it,
//! its kernel's stages, and the enums both ends share: [`SessionType`], [`KernelStatus`] (with
//! its lifecycle order), [`SessionResult`], and the restart policy's [`RestartMode`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::cluster::{ClusterMode, SessionKernel, MAX_CLUSTER_SIZE};
use super::error::InvalidField;
use super::slots::{
    container_ports_schema, resource_slots_schema, slot_amounts_schema, SlotAmounts,
};
pub use crate::workload::{RestartMode, RestartPolicy};

/// `interactive` or `batch`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionType {
    /// Runs until destroyed.
    #[default]
    Interactive,
    /// Its `command`'s exit ends it.
    Batch,
}

impl SessionType {
    /// The API's (and the store's) name: `interactive`, `batch`.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionType::Interactive => "interactive",
            SessionType::Batch => "batch",
        }
    }

    /// The type of a stored name; `None` for a name that is neither.
    pub fn parse(name: &str) -> Option<SessionType> {
        [SessionType::Interactive, SessionType::Batch]
            .into_iter()
            .find(|t| t.as_str() == name)
    }
}

/// `kernelvisor ctl session create --type`: the same two values, with the CLI's help.
impl clap::ValueEnum for SessionType {
    fn value_variants<'a>() -> &'a [Self] {
        &[SessionType::Interactive, SessionType::Batch]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            SessionType::Interactive => {
                "Runs until terminated; code runs in it with `session exec`"
            }
            SessionType::Batch => {
                "Runs --command; its exit ends the session (SUCCESS on exit 0, else FAILURE)"
            }
        };
        Some(clap::builder::PossibleValue::new(self.as_str()).help(help))
    }
}

/// `kernelvisor ctl session create --restart`: the restart policy's mode, with the CLI's help.
impl clap::ValueEnum for RestartMode {
    fn value_variants<'a>() -> &'a [Self] {
        &[
            RestartMode::Never,
            RestartMode::OnFailure,
            RestartMode::Always,
        ]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            RestartMode::Never => "A container exit ends the session",
            RestartMode::OnFailure => "Restart after a failure",
            RestartMode::Always => "Restart after every exit",
        };
        Some(clap::builder::PossibleValue::new(self.as_str()).help(help))
    }
}

/// A kernel's (and so its session's) status, in lifecycle order. The store moves a status only
/// forward in this order ([`KernelStatus::rank`]): events and RPC replies may race, and
/// `TERMINATED` is final. The stored and shown names are the upper-case ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum KernelStatus {
    /// Queued: waiting for capacity (no agent yet, no concurrency taken; `pending_reason` says
    /// why). Backend.AI's `PENDING`.
    Pending,
    /// Placed on an agent and reserved; the agent has not answered yet (Backend.AI's
    /// `SCHEDULED`).
    Scheduled,
    /// The agent prepares it.
    Preparing,
    /// Its image is being pulled.
    Pulling,
    /// Its container is being created.
    Creating,
    /// Its container runs.
    Running,
    /// Its container is restarting by its restart policy (ranks with `RUNNING`).
    Restarting,
    /// Being destroyed.
    Terminating,
    /// Evicted by a higher-priority session (preemption, issue 41): being ended on its agent,
    /// then requeued as a new row of the same session (or ended `TERMINATED` `preempted` when
    /// its restart policy says no). Ranks with `TERMINATING`.
    Preempted,
    /// Ended (final).
    Terminated,
    /// Deleted while `PENDING`: never placed, no agent touched (final; Backend.AI's
    /// `CANCELLED`).
    Cancelled,
}

impl KernelStatus {
    /// Every status, in lifecycle order.
    pub const ALL: [KernelStatus; 11] = [
        KernelStatus::Pending,
        KernelStatus::Scheduled,
        KernelStatus::Preparing,
        KernelStatus::Pulling,
        KernelStatus::Creating,
        KernelStatus::Running,
        KernelStatus::Restarting,
        KernelStatus::Terminating,
        KernelStatus::Terminated,
        KernelStatus::Cancelled,
        KernelStatus::Preempted,
    ];

    /// The stored name: `PENDING`, …, `TERMINATED`.
    pub fn as_str(self) -> &'static str {
        match self {
            KernelStatus::Pending => "PENDING",
            KernelStatus::Scheduled => "SCHEDULED",
            KernelStatus::Preparing => "PREPARING",
            KernelStatus::Pulling => "PULLING",
            KernelStatus::Creating => "CREATING",
            KernelStatus::Running => "RUNNING",
            KernelStatus::Restarting => "RESTARTING",
            KernelStatus::Terminating => "TERMINATING",
            KernelStatus::Preempted => "PREEMPTED",
            KernelStatus::Terminated => "TERMINATED",
            KernelStatus::Cancelled => "CANCELLED",
        }
    }

    /// The status of a stored name; `None` for a name that is none of them.
    pub fn parse(name: &str) -> Option<KernelStatus> {
        KernelStatus::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Its place in the lifecycle: a status update only moves to a higher rank. `RESTARTING`
    /// ranks with `RUNNING` (a restart ends in `RUNNING` again).
    pub fn rank(self) -> u8 {
        match self {
            KernelStatus::Pending => 0,
            KernelStatus::Scheduled => 1,
            KernelStatus::Preparing => 2,
            KernelStatus::Pulling => 3,
            KernelStatus::Creating => 4,
            KernelStatus::Running | KernelStatus::Restarting => 5,
            KernelStatus::Terminating | KernelStatus::Preempted => 6,
            KernelStatus::Terminated | KernelStatus::Cancelled => 7,
        }
    }

    /// Being destroyed or ended: `TERMINATING`, `TERMINATED` or `CANCELLED` (by [`Self::rank`]).
    pub fn is_ending(self) -> bool {
        self.rank() >= KernelStatus::Terminating.rank()
    }
}

impl std::fmt::Display for KernelStatus {
    /// The stored name (as logs and errors show it).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A requested service port's protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServiceProtocol {
    /// An HTTP service.
    Http,
    /// A TCP service (the default).
    Tcp,
    /// Backend.AI's pre-opened port: published, nothing started by the agent.
    Preopen,
}

/// A vfolder mount's permission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum MountPermission {
    /// Read-only.
    Ro,
    /// Read-write (the default).
    Rw,
}

/// A batch session's outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "UPPERCASE")]
pub enum SessionResult {
    /// Interactive, or not ended yet.
    Undefined,
    /// Exit 0.
    Success,
    /// Non-zero exit, killed, or `batch_timeout` exceeded.
    Failure,
}

impl SessionResult {
    /// The API's (and the store's) name: `UNDEFINED`, `SUCCESS`, `FAILURE`.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionResult::Undefined => "UNDEFINED",
            SessionResult::Success => "SUCCESS",
            SessionResult::Failure => "FAILURE",
        }
    }

    /// The result of a stored name; `None` for a name that is none of them.
    pub fn parse(name: &str) -> Option<SessionResult> {
        [
            SessionResult::Undefined,
            SessionResult::Success,
            SessionResult::Failure,
        ]
        .into_iter()
        .find(|r| r.as_str() == name)
    }
}

/// `POST /v1/sessions` body (`docs/manager-api.md`).
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Image reference.
    #[schema(min_length = 1)]
    pub image: String,
    /// `{"cpu": cores, "mem": bytes or "256m", "cuda.device": n}`.
    #[schema(schema_with = resource_slots_schema)]
    pub resource_slots: BTreeMap<String, serde_json::Value>,
    /// Admin keys only: create the session on behalf of this access key. Without it the owner
    /// is the caller (`CreateSession::owner`).
    #[serde(default)]
    pub access_key: Option<String>,
    /// Extra environment.
    #[serde(default)]
    pub environ: BTreeMap<String, String>,
    /// The owner's vfolders: `{"name", "permission"}` (never a host path: the manager resolves
    /// names to `<owner>/<name>` under the agents' vfolder root).
    #[serde(default, deserialize_with = "super::object::objects")]
    pub mounts: Vec<MountSpec>,
    /// `interactive` (default) or `batch`.
    // A string: `SessionRequest::checked_type` parses it, with a message naming the field.
    #[serde(default, rename = "type")]
    #[schema(value_type = Option<SessionType>)]
    pub session_type: Option<String>,
    /// Shell command for the main process: required for batch, optional for interactive.
    #[serde(default)]
    pub command: Option<String>,
    /// Seconds a batch session may run (batch only).
    #[serde(default)]
    #[schema(minimum = 0, exclusive_minimum = 0)]
    pub batch_timeout: Option<f64>,
    /// Service ports beyond those the image declares: `{"name", "protocol", "container_ports"}`
    /// (the agent checks them: names, protocols, ports).
    #[serde(default, deserialize_with = "super::object::objects")]
    pub service_ports: Vec<ServicePortSpec>,
    /// What the kernel's supervisor does when its container exits: `{"mode": "never" |
    /// "on-failure" | "always", "max_restarts", "window", "backoff"}` (default `never`).
    #[serde(default)]
    pub restart_policy: Option<RestartPolicy>,
    /// 0 (lowest) to 100; higher is admitted first when sessions wait for capacity (default 10,
    /// Backend.AI's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, maximum = 100)]
    pub priority: Option<i64>,
    /// `false`: answer 409 `no-capacity` (or `concurrency-limit`) at once instead of queueing
    /// the session `PENDING` when nothing fits now (default `true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enqueue: Option<bool>,
    /// Kernels in the session, 1 (default) to 64: `main1`, `sub1` … `sub{N-1}`, each with
    /// `resource_slots`, placed as one gang.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 64)]
    pub cluster_size: Option<u32>,
    /// `single-node` (default: every kernel on one agent) or `multi-node` (a placement per
    /// kernel).
    // A string: `SessionRequest::checked_cluster` parses it, with a message naming the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<ClusterMode>)]
    pub cluster_mode: Option<String>,
    /// Tests only (a `fault-injection` build): passed to the agent as the kernel config's
    /// `_inject` (fail or pause a stage).
    #[cfg(feature = "fault-injection")]
    // Not in the OpenAPI document: no client is meant to send it.
    #[serde(default, rename = "_inject", skip_serializing_if = "Option::is_none")]
    #[schema(ignore)]
    pub inject: Option<serde_json::Value>,
    // Idle reclaim (`docs/design.md`, "Idle reclaim"): absent fields take the access key's
    // defaults, then `[reclaim]`'s.
    /// Seconds it may run once placed; then it ends `lifetime-exceeded` (batch sessions too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, exclusive_minimum = 0)]
    pub max_lifetime: Option<f64>,
    /// Seconds without activity (an `execute`, an open terminal, a file transfer, a connection
    /// to a service port) before it ends `idle-timeout`; interactive sessions only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, exclusive_minimum = 0)]
    pub idle_timeout: Option<f64>,
    /// Seconds its utilization must stay under `min_utilization` before it ends
    /// `low-utilization`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, exclusive_minimum = 0)]
    pub utilization_window: Option<f64>,
    /// `{slot: percent}`: its utilization floor (`cpu`, `mem`, or a `cuda.*` slot it asks
    /// for).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_utilization: Option<BTreeMap<String, f64>>,
    // -- graceful termination (issue 41) --
    /// The signal its workload gets when the session is ended: `SIGTERM` (default), `SIGINT`,
    /// `SIGHUP`, `SIGQUIT`, `SIGUSR1` or `SIGUSR2` (`TERM` also reads as `SIGTERM`). A runner
    /// kernel's default is `SIGINT`, as upstream's agent stops its runner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
    /// Seconds its workload has to exit after the stop signal before it is killed (`SIGKILL`):
    /// 0 to `[scheduler] max-grace-period`; default `[scheduler] grace-period`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0)]
    pub grace_period: Option<f64>,
    // Preemption (issue 41 item 2).
    /// Whether a pending session of a strictly higher priority may evict it when `[scheduler]
    /// preemption` is on (default: its access key's default, `false` unless an admin set it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptible: Option<bool>,
}

impl SessionRequest {
    /// Its stop signal and grace period, checked: the signal one of
    /// [`crate::workload::grace::STOP_SIGNALS`] (`None` when not given: the agent's default,
    /// `SIGTERM` or a runner kernel's `SIGINT`), the period 0 to `max` seconds (`default`
    /// when not given).
    ///
    /// Errors: [`GraceError::Invalid`] for a bad signal or a negative period (400
    /// `invalid-request`), [`GraceError::TooLong`] above `max` (400 `grace-period-too-long`).
    pub fn checked_grace(
        &self,
        default: std::time::Duration,
        max: std::time::Duration,
    ) -> Result<(Option<String>, std::time::Duration), GraceError> {
        let signal = self
            .stop_signal
            .as_deref()
            .map(crate::workload::grace::checked_signal)
            .transpose()
            .map_err(|e| GraceError::Invalid(InvalidField(e)))?;
        let period = match self.grace_period {
            None => default.min(max),
            Some(secs) => checked_grace_period(secs, max)?,
        };
        Ok((signal, period))
    }
}

/// A grace period as asked for (a session's `grace_period`, `DELETE ?grace=`, `rm --grace`):
/// 0 to `max` seconds.
///
/// Errors: as [`SessionRequest::checked_grace`].
pub fn checked_grace_period(
    secs: f64,
    max: std::time::Duration,
) -> Result<std::time::Duration, GraceError> {
    let period = crate::workload::grace::checked_period(secs)
        .map_err(|e| GraceError::Invalid(InvalidField(e)))?;
    if period > max {
        return Err(GraceError::TooLong(format!(
            "`grace_period` {secs} s is above this manager's maximum of {} s \
             ([scheduler] max-grace-period)",
            max.as_secs_f64()
        )));
    }
    Ok(period)
}

/// Why a grace period or stop signal was refused.
#[derive(Debug, thiserror::Error)]
pub enum GraceError {
    /// Not a signal that may stop a kernel, or not a number of seconds ≥ 0.
    #[error(transparent)]
    Invalid(InvalidField),
    /// Above `[scheduler] max-grace-period`.
    #[error("{0}")]
    TooLong(String),
}

impl SessionRequest {
    // Idle reclaim.
    /// The reclaim policy it asks for, checked (positive seconds; floors of 0–100 % over
    /// `cpu`, `mem` or a slot in its `resource_slots`); fields it leaves out are `None`, for
    /// the defaults to fill ([`crate::model::reclaim::ReclaimPolicy::or`]).
    ///
    /// Errors: [`InvalidField`] naming the field (400 `invalid-request`).
    pub fn checked_reclaim(&self) -> Result<crate::model::reclaim::ReclaimPolicy, InvalidField> {
        let p = crate::model::reclaim::ReclaimPolicy {
            max_lifetime: self.max_lifetime,
            idle_timeout: self.idle_timeout,
            utilization_window: self.utilization_window,
            min_utilization: self.min_utilization.clone().unwrap_or_default(),
        };
        p.check()?;
        if let Some(slot) = p.min_utilization.keys().find(|s| {
            !matches!(s.as_str(), crate::slots::CPU | crate::slots::MEM)
                && !self.resource_slots.contains_key(*s)
        }) {
            return Err(InvalidField(format!(
                "`min_utilization.{slot}` names a slot the session does not ask for"
            )));
        }
        Ok(p)
    }

    /// The priority, checked: 0–100, [`crate::model::queue::DEFAULT_PRIORITY`] when absent.
    ///
    /// Errors: [`InvalidField`] naming the range (400 `invalid-request`).
    pub fn checked_priority(&self) -> Result<i64, InvalidField> {
        let p = self
            .priority
            .unwrap_or(crate::model::queue::DEFAULT_PRIORITY);
        if crate::model::queue::PRIORITY_RANGE.contains(&p) {
            Ok(p)
        } else {
            Err(InvalidField(format!(
                "`priority` must be 0 to 100 (higher first), not {p}"
            )))
        }
    }

    /// The cluster's size and mode, checked: 1 to [`MAX_CLUSTER_SIZE`] kernels (default 1),
    /// `single-node` (default) or `multi-node`.
    ///
    /// Errors: [`InvalidField`] naming the field (400 `invalid-request`).
    pub fn checked_cluster(&self) -> Result<(u32, ClusterMode), InvalidField> {
        let size = self.cluster_size.unwrap_or(1);
        if !(1..=MAX_CLUSTER_SIZE).contains(&size) {
            return Err(InvalidField(format!(
                "`cluster_size` must be 1 to {MAX_CLUSTER_SIZE}, not {size}"
            )));
        }
        let mode = match self.cluster_mode.as_deref() {
            None => ClusterMode::SingleNode,
            Some(m) => ClusterMode::parse(m).ok_or_else(|| {
                InvalidField(format!(
                    "`cluster_mode` must be `single-node` or `multi-node`, not `{m}`"
                ))
            })?,
        };
        Ok((size, mode))
    }

    /// The session type, checked: `interactive` or `batch`; `command` required for batch,
    /// non-blank when given; `batch_timeout` positive and batch only; `restart_policy` within
    /// its bounds.
    ///
    /// Errors: [`InvalidField`] naming the field (400 `invalid-request`).
    pub fn checked_type(&self) -> Result<SessionType, InvalidField> {
        let bad = |m: &str| Err(InvalidField(m.to_owned()));
        let t = match self.session_type.as_deref() {
            None | Some("interactive") => SessionType::Interactive,
            Some("batch") => SessionType::Batch,
            Some(_) => return bad("`type` must be `interactive` or `batch`"),
        };
        if self.command.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return bad("`command` must not be empty");
        }
        if t == SessionType::Batch && self.command.is_none() {
            return bad("a batch session needs a `command`");
        }
        match self.batch_timeout {
            Some(x) if !(x.is_finite() && x > 0.0) => {
                bad("`batch_timeout` must be a positive number of seconds")
            }
            Some(_) if t != SessionType::Batch => {
                bad("`batch_timeout` applies to batch sessions only")
            }
            _ => Ok(t),
        }?;
        if let Some(p) = &self.restart_policy {
            p.check().map_err(InvalidField)?;
        }
        Ok(t)
    }
}

/// `POST /v1/sessions` body as a client writes it (`kernelvisor ctl session create`): only what
/// was given is sent, seconds whole when they are (`3600`, not `3600.0`). The server reads it as
/// [`SessionRequest`] (a test holds it to that); it is a type of its own because that one
/// serializes every field, defaults included, for the rows that keep it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct NewSession {
    /// Image reference.
    pub image: String,
    /// Slot name → amount as typed (`{"cpu": "0.5", "mem": "256m", "cuda.device": "1"}`).
    pub resource_slots: BTreeMap<String, String>,
    /// Admin keys only: the access key the session is charged to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_key: Option<String>,
    /// Extra environment (omitted when empty).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub environ: BTreeMap<String, String>,
    /// The owner's vfolders to mount (omitted when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<MountSpec>,
    /// `interactive` or `batch` (omitted: the manager's default, interactive).
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub session_type: Option<SessionType>,
    /// Shell command for the main process.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Seconds a batch session may run.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_seconds"
    )]
    pub batch_timeout: Option<f64>,
    /// The restart policy, with only the limits given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restart_policy: Option<NewRestartPolicy>,
    /// 0 (lowest) to 100 (omitted: the manager's default, 10).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub priority: Option<i64>,
    /// `Some(false)`: fail with `no-capacity` rather than queue (omitted: queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enqueue: Option<bool>,
    /// Kernels in the session (omitted: 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_size: Option<u32>,
    /// `single-node` or `multi-node` (omitted: the manager's default, single-node).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cluster_mode: Option<ClusterMode>,
    // -- graceful termination (issue 41) --
    /// The workload's stop signal (omitted: the agent's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
    /// Seconds after the stop signal before the kill (omitted: `[scheduler] grace-period`).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_seconds"
    )]
    pub grace_period: Option<f64>,
    // Preemption (issue 41 item 2).
    /// Whether a higher-priority session may evict it (omitted: its key's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preemptible: Option<bool>,
    // Idle reclaim (`docs/design.md`, "Idle reclaim"); omitted: its key's defaults, then
    // `[reclaim]`'s.
    /// Seconds it may run once placed.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_seconds"
    )]
    pub max_lifetime: Option<f64>,
    /// Seconds without activity before it ends (interactive sessions).
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_seconds"
    )]
    pub idle_timeout: Option<f64>,
    /// Seconds under `min_utilization` before it ends.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_seconds"
    )]
    pub utilization_window: Option<f64>,
    /// `{slot: percent}`: its utilization floor.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub min_utilization: BTreeMap<String, f64>,
}

/// A [`RestartPolicy`] as a client writes it: the mode, and each limit only when given (the
/// server fills in the others).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct NewRestartPolicy {
    /// When to restart.
    pub mode: RestartMode,
    /// Restarts allowed within `window`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_restarts: Option<u32>,
    /// The intensity window in seconds.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_seconds"
    )]
    pub window: Option<f64>,
    /// Seconds before the first restart.
    #[serde(
        skip_serializing_if = "Option::is_none",
        serialize_with = "whole_seconds"
    )]
    pub backoff: Option<f64>,
}

/// Seconds as a JSON number: an integer when whole (`3600`), else a float (`0.5`), as a person
/// would write them (and as ctl's bodies always were).
fn whole_seconds<S: serde::Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match *v {
        // Whole and within the integers an f64 holds exactly.
        Some(n) if n.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(&n) => {
            s.serialize_u64(n as u64)
        }
        Some(n) => s.serialize_f64(n),
        None => s.serialize_none(),
    }
}

/// A service port a session asks for (`POST /v1/sessions`).
#[derive(Clone, Debug, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServicePortSpec {
    /// Service name (its def file is `/etc/backend.ai/service-defs/<name>.json` in the image).
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
    /// `http`, `tcp` or `preopen` (default `tcp`).
    #[serde(default)]
    #[schema(value_type = Option<ServiceProtocol>)]
    pub protocol: Option<String>,
    /// Ports inside the container.
    #[schema(schema_with = container_ports_schema)]
    pub container_ports: Vec<u16>,
}

/// A vfolder mount of a session request: one of the owner's vfolders (`POST /v1/vfolders`).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    /// vfolder name; mounted at `/home/work/<name>`.
    #[schema(pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")]
    pub name: String,
    /// `rw` (default, Backend.AI's for an owned vfolder) or `ro`.
    #[serde(default)]
    #[schema(value_type = Option<MountPermission>)]
    pub permission: Option<String>,
}

impl MountSpec {
    /// `ro` or `rw`.
    ///
    /// Errors: [`InvalidField`] for another value.
    pub fn checked_permission(&self) -> Result<&'static str, InvalidField> {
        match self.permission.as_deref() {
            None | Some("rw") => Ok("rw"),
            Some("ro") => Ok("ro"),
            Some(p) => Err(InvalidField(format!(
                "mount `{}`: permission `{p}` must be `ro` or `rw`",
                self.name
            ))),
        }
    }
}

/// A vfolder a session mounts, as asked for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct SessionMount {
    /// The vfolder's name.
    #[schema(required = true)]
    pub name: String,
    /// `ro` or `rw`; null when not given (`rw`).
    pub permission: Option<String>,
}

/// A session.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Session {
    /// Session UUID.
    #[schema(required = true)]
    pub session_id: String,
    /// Its main kernel's UUID.
    #[schema(required = true)]
    pub kernel_id: String,
    /// The agent its main kernel is placed on.
    #[schema(required = true)]
    pub agent_id: String,
    /// The owning access key.
    #[schema(required = true)]
    pub access_key: String,
    /// Image reference.
    #[schema(required = true)]
    pub image: String,
    /// `PENDING` (queued), `SCHEDULED`, `PREPARING`, …, `RUNNING`, …, `TERMINATED`,
    /// `CANCELLED`.
    // A `KernelStatus` name; a string, so that a reader takes a status it does not know yet.
    #[schema(required = true)]
    pub status: String,
    /// Why it terminated (`user-requested`, `agent-lost`, `batch-timeout`, …).
    #[schema(required = true)]
    pub status_reason: Option<String>,
    /// Exit code, when it ended by itself.
    #[schema(required = true)]
    pub exit_code: Option<i64>,
    /// Session type.
    #[serde(rename = "type")]
    #[schema(value_type = SessionType, required = true)]
    pub session_type: Option<SessionType>,
    /// The main process's shell command, if one was given.
    #[schema(required = true)]
    pub command: Option<String>,
    /// Seconds a batch session may run.
    #[schema(required = true)]
    pub batch_timeout: Option<f64>,
    /// A batch session's outcome.
    #[schema(value_type = SessionResult, required = true)]
    pub result: Option<SessionResult>,
    /// Every slot it asked for (`{name: decimal string}`).
    #[schema(schema_with = slot_amounts_schema, required = true)]
    pub resource_slots: SlotAmounts,
    /// Its vfolders.
    #[schema(required = true)]
    pub mounts: Vec<SessionMount>,
    /// Unix seconds.
    #[schema(value_type = f64, required = true)]
    pub created_at: Option<f64>,
    /// Unix seconds; null while live.
    #[schema(required = true)]
    pub terminated_at: Option<f64>,
    /// Its restart policy (`never` unless it asked for one).
    #[schema(required = true)]
    pub restart_policy: RestartPolicy,
    /// Restarts by its restart policy so far.
    #[schema(required = true)]
    pub restart_count: i64,
    /// Its image pull's progress in bytes while it is `PULLING` (and the last figures after);
    /// null when its agent had the image.
    #[schema(required = true)]
    pub pull_progress: Option<crate::model::pull::PullProgress>,
    /// 0 (lowest) to 100: its place in the queue's order.
    #[schema(required = true)]
    pub priority: i64,
    /// While `PENDING`: why it waits; null otherwise.
    #[schema(required = true)]
    pub pending_reason: Option<crate::model::queue::PendingReason>,
    /// While `PENDING`: 1 for the next session to be admitted, in priority then queue order;
    /// null otherwise.
    #[schema(required = true)]
    pub queue_position: Option<i64>,
    /// Unix seconds it entered the queue; null when it was placed at once.
    #[schema(required = true)]
    pub queued_at: Option<f64>,
    /// Unix seconds it left the queue (was placed); null while pending or when never queued.
    #[schema(required = true)]
    pub admitted_at: Option<f64>,
    /// Kernels in it (1 unless it is a cluster session).
    #[schema(required = true)]
    pub cluster_size: i64,
    /// `single-node` or `multi-node`.
    #[schema(value_type = ClusterMode, required = true)]
    pub cluster_mode: Option<ClusterMode>,
    /// Its kernels, `main1` first: role, host name, agent and status of each (the session's
    /// `status` is theirs combined: `RUNNING` only when every kernel is).
    #[schema(required = true)]
    pub kernels: Vec<SessionKernel>,
    /// `GET /v1/sessions/{id}` only: its kernel's stage actors in order, as its agent reports
    /// them; null once it has ended or when the agent does not answer within 2 s.
    // Absent from the other answers: the outer `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Vec<Stage>>)]
    pub stages: Option<Option<Vec<Stage>>>,
    /// `GET /v1/sessions/{id}` only: how its kernel runs code, as its agent reports it:
    /// `kernel-runner` (Backend.AI's kernel runner: `execute` goes to its persistent REPL) or
    /// `process` (a process per run); null when its agent does not say (as `stages`).
    // Absent from the other answers: the outer `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<ExecPath>)]
    pub exec_path: Option<Option<String>>,
    // -- graceful termination (issue 41) --
    /// The signal its workload gets when it is ended (`SIGTERM`, …); null: the agent's default
    /// (`SIGTERM`, `SIGINT` for a runner kernel).
    #[schema(required = true)]
    pub stop_signal: Option<String>,
    /// Seconds its workload has to exit after the stop signal before it is killed; null for a
    /// session stored before grace periods (the agent's `[container] grace-period`).
    #[schema(required = true)]
    pub grace_period: Option<f64>,
    /// While `TERMINATING`: Unix seconds by which its agent kills what still runs (its end's
    /// grace period from when it began); null otherwise.
    #[schema(required = true)]
    pub terminate_deadline: Option<f64>,
    // Idle reclaim (`docs/design.md`, "Idle reclaim").
    /// Its reclaim policy, with the defaults it took (`max_lifetime`, `idle_timeout`,
    /// `utilization_window`, `min_utilization`; `{}` when none applies).
    #[schema(required = true)]
    pub reclaim: crate::model::reclaim::ReclaimPolicy,
    /// Unix seconds of its last activity its agent reported; null before any.
    #[schema(required = true)]
    pub last_activity: Option<f64>,
    /// Unix seconds it ends `idle-timeout` unless active before; null without an
    /// `idle_timeout` (batch sessions), or once it ended.
    #[schema(required = true)]
    pub idle_deadline: Option<f64>,
    /// Unix seconds it ends `lifetime-exceeded`; null without a `max_lifetime`, or once it
    /// ended.
    #[schema(required = true)]
    pub lifetime_deadline: Option<f64>,
    /// Unix seconds it ends `low-utilization` if its utilization stays under the floor; null
    /// without a floor, while a reading is at or above it, or once it ended.
    #[schema(required = true)]
    pub utilization_deadline: Option<f64>,
    // Preemption (issue 41 item 2).
    /// Whether a pending session of a strictly higher priority may evict it (`[scheduler]
    /// preemption`); an evicted one shows `PREEMPTED`, then `PENDING` again with
    /// `restart_count` one more.
    #[schema(required = true)]
    pub preemptible: bool,
}

/// How a kernel runs code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ExecPath {
    /// Backend.AI's kernel runner serves it: `execute` runs code in its persistent REPL
    /// (`shell: true` still runs a process).
    KernelRunner,
    /// A process per run (`ai.backend.runtime-path -c code`, else `sh -c code`).
    Process,
}

impl ExecPath {
    /// Its name on the wire: `kernel-runner`, `process`.
    pub fn as_str(self) -> &'static str {
        match self {
            ExecPath::KernelRunner => "kernel-runner",
            ExecPath::Process => "process",
        }
    }
}

impl Session {
    /// Whether it is over (`terminated_at` set, or status `TERMINATED` or `CANCELLED`).
    pub fn terminated(&self) -> bool {
        self.terminated_at.is_some()
            || self.status == KernelStatus::Terminated.as_str()
            || self.status == KernelStatus::Cancelled.as_str()
    }
}

/// One stage actor of a session's kernel.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Stage {
    /// `image`, `slots`, `ports`, `scratch`, `mounts`, `container` or `service-ports`.
    #[schema(required = true)]
    pub name: String,
    /// Where it stands.
    #[schema(required = true)]
    pub status: StageState,
    /// How many times its supervisor restarted it.
    #[schema(required = true)]
    pub restarts: u32,
    /// Seconds its last setup took; null when it adopted its resource (after an agent restart).
    #[schema(required = true)]
    pub setup_seconds: Option<f64>,
}

/// A stage actor's state.
// `actors::StageStatus` on the wire (its `as_str` names; a test holds the two together).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum StageState {
    /// Waiting for the stages before it.
    #[default]
    Pending,
    /// Setting its resource up.
    SettingUp,
    /// Holds its resource.
    Ready,
    /// Its setup or its resource failed.
    Failed,
    /// Released its resource.
    Stopped,
    /// Let go of its resource (agent shutdown with `preserve`).
    Detached,
}

impl From<actors::StageStatus> for StageState {
    fn from(s: actors::StageStatus) -> StageState {
        use actors::StageStatus as S;
        match s {
            S::Pending => StageState::Pending,
            S::SettingUp => StageState::SettingUp,
            S::Ready => StageState::Ready,
            S::Failed => StageState::Failed,
            S::Stopped => StageState::Stopped,
            S::Detached => StageState::Detached,
        }
    }
}

/// `POST /v1/sessions`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct SessionCreated {
    /// Session UUID.
    #[schema(required = true)]
    pub session_id: String,
    /// Kernel UUID.
    #[schema(required = true)]
    pub kernel_id: String,
    /// The agent it runs on; empty while `PENDING`.
    #[schema(required = true)]
    pub agent_id: String,
    /// `RUNNING` when the agent has started it; `PULLING` when its image is still being pulled
    /// (the session goes on by itself: follow it with `GET /v1/sessions/{id}`); `PENDING` when
    /// it waits in the queue for capacity.
    #[schema(required = true)]
    pub status: String,
    /// While `PENDING`: why it waits; null otherwise.
    #[schema(required = true)]
    pub pending_reason: Option<crate::model::queue::PendingReason>,
    /// While `PENDING`: its place in the queue (1 = next); null otherwise.
    #[schema(required = true)]
    pub queue_position: Option<i64>,
    /// Kernels in it (1 unless it is a cluster session).
    #[schema(required = true)]
    pub cluster_size: i64,
    /// `single-node` or `multi-node`.
    #[schema(value_type = ClusterMode, required = true)]
    pub cluster_mode: Option<ClusterMode>,
    /// Its kernels, `main1` first (a queued cluster session lists its main kernel only: the
    /// others are made when it is placed).
    #[schema(required = true)]
    pub kernels: Vec<SessionKernel>,
}

/// `GET /v1/sessions`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct SessionList {
    /// The sessions.
    #[schema(required = true)]
    pub sessions: Vec<Session>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seconds go out as integers when whole (`3600`, as a person writes them), else as floats.
    #[test]
    fn seconds_whole_when_they_are() {
        let window = |s: f64| {
            let p = NewRestartPolicy {
                window: Some(s),
                ..NewRestartPolicy::default()
            };
            serde_json::to_value(p).unwrap()["window"].clone()
        };
        assert_eq!(window(3600.0), serde_json::json!(3600));
        assert_eq!(window(0.5), serde_json::json!(0.5));
        assert_eq!(window(0.0), serde_json::json!(0));
    }

    /// A client's body reads back as the server's, with the same meaning; whole seconds are
    /// integers on the wire.
    #[test]
    fn new_session_reads_as_the_request() {
        let new = NewSession {
            image: "img:1".into(),
            resource_slots: BTreeMap::from([("cpu".into(), "0.5".into())]),
            environ: BTreeMap::from([("A".into(), "1".into())]),
            mounts: vec![MountSpec {
                name: "data".into(),
                permission: Some("ro".into()),
            }],
            session_type: Some(SessionType::Batch),
            command: Some("true".into()),
            batch_timeout: Some(3600.0),
            restart_policy: Some(NewRestartPolicy {
                mode: RestartMode::OnFailure,
                max_restarts: Some(2),
                window: Some(0.5),
                backoff: None,
            }),
            priority: Some(50),
            enqueue: Some(false),
            ..NewSession::default()
        };
        let v = serde_json::to_value(&new).unwrap();
        assert_eq!(v["batch_timeout"], serde_json::json!(3600));
        assert_eq!(
            v["restart_policy"],
            serde_json::json!({"mode": "on-failure", "max_restarts": 2, "window": 0.5})
        );
        assert!(v.get("access_key").is_none() && v.get("service_ports").is_none());
        let r: SessionRequest = serde_json::from_value(v).unwrap();
        assert_eq!(r.checked_type().unwrap(), SessionType::Batch);
        assert_eq!(
            (r.batch_timeout, r.priority, r.enqueue),
            (Some(3600.0), Some(50), Some(false))
        );
        assert_eq!(r.environ, new.environ);
        assert_eq!(r.mounts[0].checked_permission().unwrap(), "ro");
        let p = r.restart_policy.unwrap();
        assert_eq!(
            (p.mode, p.max_restarts, p.window, p.backoff),
            (RestartMode::OnFailure, 2, 0.5, 1.0)
        );
    }

    #[test]
    fn stage_state_names_are_the_actors_names() {
        use actors::StageStatus as S;
        for s in [
            S::Pending,
            S::SettingUp,
            S::Ready,
            S::Failed,
            S::Stopped,
            S::Detached,
        ] {
            assert_eq!(
                serde_json::to_value(StageState::from(s)).unwrap(),
                s.as_str()
            );
        }
    }

    #[test]
    fn kernel_status_order() {
        let rank = |s: &str| KernelStatus::parse(s).map(KernelStatus::rank);
        assert!(rank("PENDING") < rank("PREPARING"));
        assert!(rank("CREATING") < rank("RUNNING"));
        assert_eq!(rank("RESTARTING"), rank("RUNNING"));
        assert!(rank("RUNNING") < rank("TERMINATING"));
        assert!(rank("TERMINATING") < rank("TERMINATED"));
        assert_eq!(rank("BOGUS"), None);
        for s in KernelStatus::ALL {
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
            assert_eq!(KernelStatus::parse(s.as_str()), Some(s));
        }
    }

    #[test]
    fn session_type_names() {
        for t in [SessionType::Interactive, SessionType::Batch] {
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
    }

    /// A request's grace: the default (capped by the maximum) when absent, 0 to the maximum
    /// when given; a signal from the list, written one way; each refusal a clear error.
    #[test]
    fn grace_is_checked_against_the_managers_bounds() {
        use std::time::Duration;
        let req = |signal: Option<&str>, period: Option<f64>| SessionRequest {
            stop_signal: signal.map(str::to_owned),
            grace_period: period,
            ..serde_json::from_value(serde_json::json!({"image": "i", "resource_slots": {}}))
                .unwrap()
        };
        let (d, max) = (Duration::from_secs(10), Duration::from_secs(60));
        assert_eq!(req(None, None).checked_grace(d, max).unwrap(), (None, d));
        assert_eq!(
            req(None, None)
                .checked_grace(Duration::from_secs(100), max)
                .unwrap()
                .1,
            max,
            "a default above the maximum is the maximum"
        );
        assert_eq!(
            req(Some("int"), Some(0.0)).checked_grace(d, max).unwrap(),
            (Some("SIGINT".to_owned()), Duration::ZERO)
        );
        assert_eq!(req(None, Some(60.0)).checked_grace(d, max).unwrap().1, max);
        match req(None, Some(60.5)).checked_grace(d, max) {
            Err(GraceError::TooLong(m)) => assert!(m.contains("max-grace-period"), "{m}"),
            other => panic!("{other:?}"),
        }
        for bad in [
            req(None, Some(-1.0)),
            req(Some("SIGKILL"), None),
            req(Some("9"), None),
        ] {
            assert!(matches!(
                bad.checked_grace(d, max),
                Err(GraceError::Invalid(_))
            ));
        }
        assert!(matches!(
            checked_grace_period(f64::NAN, max),
            Err(GraceError::Invalid(_))
        ));
    }
}

//! What every path that creates or ends a placed kernel shares: the [`Launcher`] (the
//! scheduler's parts a creation uses), a placed session ([`Placed`]) and a kernel's place in its
//! cluster ([`ClusterPlace`]), a kernel's stored row ([`new_kernel`]) and its
//! `KernelCreationConfig` ([`kernel_config`]), the vfolder mounts ([`resolve_mounts`]), and
//! `destroy_kernel` on its agent ([`destroy_on_agent`]). A session of one kernel is created in
//! `create.rs`, a cluster in `cluster/`; both, and the admissions, the sweep, drains and
//! destroys, build on this module, which builds on none of them.

use std::collections::BTreeMap;
use std::time::Duration;

use actix::prelude::*;
use rmpv::Value;

use crate::agent::kernel::config::ACCESS_KEY_ENV;
use crate::manager::calls::call_method_kw;
use crate::manager::error::ManagerError;
use crate::manager::metrics::ManagerMetrics;
use crate::manager::pool::{AgentCallError, AgentPool};
use crate::manager::store::{KernelRow, NewKernel, Store};
use crate::model::cluster::{cluster_slots, hosts_env, replicas_env, ClusterMode, ClusterSlot};
use crate::model::session::{MountSpec, SessionRequest, SessionType};
use crate::rpc::agent_api::kernel::{
    DestroyKernel, DestroyKernelArgs, DestroyKernelReply, ImageConfig, KernelCreationConfig,
    ServicePortSpec as WireServicePort, SessionTypes, VFolderMount,
};
use crate::slots::ResourceSlots;
use crate::workload::{Grace, RestartPolicy};

/// The agent's `mounts` for `owner`'s vfolders: `{"name", "host_path": "<owner>/<name>",
/// "permission"}`, the path relative to the agent's `[container] vfolder-root`.
///
/// Errors: 400 for a bad name or permission or a name mounted twice, 404
/// `vfolder-not-found` for a name the owner has no vfolder of.
pub(super) async fn resolve_mounts(
    store: &Store,
    owner: &str,
    mounts: &[MountSpec],
) -> Result<Vec<VFolderMount>, ManagerError> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::with_capacity(mounts.len());
    for m in mounts {
        crate::manager::vfolder_name::check(&m.name)?;
        let permission = m.checked_permission()?;
        if !seen.insert(m.name.as_str()) {
            return Err(ManagerError::InvalidRequest(format!(
                "vfolder `{}` is mounted twice",
                m.name
            )));
        }
        if store.vfolder(owner, &m.name).await?.is_none() {
            return Err(ManagerError::VfolderNotFound(m.name.clone()));
        }
        out.push(VFolderMount {
            name: m.name.clone(),
            host_path: format!("{owner}/{}", m.name),
            kernel_path: Some(format!("/home/work/{}", m.name)),
            mount_perm: permission.into(),
            ..VFolderMount::default()
        });
    }
    Ok(out)
}

/// A session's kernel placed and reserved on an agent: what its creation needs.
pub(super) struct Placed {
    pub(super) owner: String,
    pub(super) request: SessionRequest,
    pub(super) kernel_id: String,
    pub(super) session_id: String,
    pub(super) agent_id: String,
    pub(super) slots: ResourceSlots,
    pub(super) mounts: Vec<VFolderMount>,
}

/// A session's stop signal and grace period as its request asked, checked against `[scheduler]
/// grace-period` / `max-grace-period`.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct RequestGrace {
    /// `None`: the agent's default (`SIGTERM`, `SIGINT` for a runner kernel).
    pub(super) signal: Option<String>,
    /// Seconds after the stop signal before the kill.
    pub(super) period: Duration,
}

impl RequestGrace {
    /// `req`'s, checked.
    ///
    /// Errors: 400 `invalid-request` (a bad signal, a negative period) or
    /// `grace-period-too-long`.
    pub(super) fn of(
        spec: &super::SchedulerSpec,
        req: &SessionRequest,
    ) -> Result<RequestGrace, ManagerError> {
        let (signal, period) = req.checked_grace(spec.grace_period, spec.max_grace_period)?;
        Ok(RequestGrace { signal, period })
    }

    /// Checks `req`'s and writes them back into it, the default filled in: the stored request
    /// (a queued session's, read back at its admission) and its rows then carry the grace it was
    /// accepted with, whatever `[scheduler] grace-period` says later.
    ///
    /// Errors: as [`RequestGrace::of`].
    pub(super) fn fill(
        spec: &super::SchedulerSpec,
        req: &mut SessionRequest,
    ) -> Result<(), ManagerError> {
        let g = RequestGrace::of(spec, req)?;
        req.stop_signal = g.signal;
        req.grace_period = Some(g.period.as_secs_f64());
        Ok(())
    }
}

/// Where a kernel sits in its session's cluster: its slot, and the session's mode and size.
pub(super) struct ClusterPlace {
    pub(super) slot: ClusterSlot,
    pub(super) mode: ClusterMode,
    pub(super) size: u32,
}

impl ClusterPlace {
    /// A session of one kernel: `main1` of 1.
    pub(super) fn single() -> ClusterPlace {
        ClusterPlace {
            slot: cluster_slots(1).remove(0),
            mode: ClusterMode::SingleNode,
            size: 1,
        }
    }
}

/// A kernel's `KernelCreationConfig`: the request's image, slots, mounts, command, service
/// ports and environment, its place in the cluster (`cluster_role`, `cluster_idx`,
/// `cluster_hostname`, `local_rank`) and the cluster's environment, as Backend.AI's manager
/// sets it for every kernel (`manager/sokovan/scheduler/launcher/launcher.py`):
/// `BACKENDAI_SESSION_ID`, `BACKENDAI_KERNEL_ID`, `BACKENDAI_CLUSTER_SIZE`,
/// `BACKENDAI_CLUSTER_REPLICAS`, `BACKENDAI_CLUSTER_HOSTS`, `BACKENDAI_CLUSTER_ROLE`,
/// `BACKENDAI_CLUSTER_IDX`, `BACKENDAI_CLUSTER_LOCAL_RANK`, `BACKENDAI_CLUSTER_HOST`. The
/// request's own `environ` cannot override these. `kernel_id` is `p.kernel_id` unless given.
///
/// kernelvisor's own keys: `stop_signal` and `grace_period` (the request's, checked), so the
/// agent ends the kernel with its grace also when it decides the end itself (a batch timeout,
/// the restart policy, its shutdown).
///
/// Errors: the request's type or grace does not check (`invalid-request`,
/// `grace-period-too-long`).
pub(super) fn kernel_config(
    spec: &super::SchedulerSpec,
    p: &Placed,
    place: &ClusterPlace,
    kernel_id: Option<&str>,
) -> Result<KernelCreationConfig, ManagerError> {
    let req = &p.request;
    let kernel_id = kernel_id.unwrap_or(&p.kernel_id);
    let session_type = req.checked_type()?;
    let grace = RequestGrace::of(spec, req)?;
    let mut environ: BTreeMap<String, Value> = req
        .environ
        .iter()
        .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
        .collect();
    environ.insert(ACCESS_KEY_ENV.into(), p.owner.as_str().into());
    let slot = &place.slot;
    // A batch cluster session's job is its main kernel's (upstream's manager triggers the
    // batch execution on the main kernel only): the other kernels run as interactive ones,
    // there for the job to reach (ssh, MPI), until the main kernel's end ends them.
    let is_main = slot.role == crate::model::cluster::MAIN_ROLE;
    let (session_type, startup_command, batch_timeout) = match session_type {
        SessionType::Batch if !is_main => (SessionType::Interactive, None, None),
        t => (t, req.command.clone(), req.batch_timeout),
    };
    for (k, v) in [
        ("BACKENDAI_SESSION_ID", p.session_id.clone()),
        ("BACKENDAI_KERNEL_ID", kernel_id.to_owned()),
        ("BACKENDAI_CLUSTER_SIZE", place.size.to_string()),
        ("BACKENDAI_CLUSTER_REPLICAS", replicas_env(place.size)),
        ("BACKENDAI_CLUSTER_HOSTS", hosts_env(place.size)),
        ("BACKENDAI_CLUSTER_ROLE", slot.role.to_owned()),
        ("BACKENDAI_CLUSTER_IDX", slot.idx.to_string()),
        ("BACKENDAI_CLUSTER_LOCAL_RANK", slot.local_rank.to_string()),
        ("BACKENDAI_CLUSTER_HOST", slot.hostname.clone()),
    ] {
        environ.insert(k.to_owned(), Value::from(v));
    }
    Ok(KernelCreationConfig {
        image: ImageConfig {
            registry: spec.registries.for_image(&req.image),
            ..ImageConfig::by_reference(&req.image)
        },
        kernel_id: Some(kernel_id.to_owned()),
        session_id: Some(p.session_id.clone()),
        network_id: Some(p.session_id.clone()),
        session_type: match session_type {
            SessionType::Batch => SessionTypes::Batch,
            SessionType::Interactive => SessionTypes::Interactive,
        },
        cluster_mode: place.mode,
        cluster_role: Some(slot.role.into()),
        cluster_idx: Some(slot.idx),
        cluster_hostname: Some(slot.hostname.clone()),
        local_rank: Some(slot.local_rank),
        resource_slots: match p.slots.to_msgpack() {
            Value::Map(m) => m
                .into_iter()
                .filter_map(|(k, v)| k.as_str().map(|k| (k.to_owned(), v)))
                .collect(),
            _ => BTreeMap::new(),
        },
        environ,
        mounts: p.mounts.clone(),
        startup_command,
        service_ports: req
            .service_ports
            .iter()
            .map(|sp| WireServicePort {
                name: sp.name.clone(),
                protocol: sp.protocol.clone().unwrap_or_else(|| "tcp".into()),
                container_ports: sp.container_ports.clone(),
            })
            .collect(),
        batch_timeout,
        restart_policy: req.restart_policy.as_ref().map(RestartPolicy::to_value),
        stop_signal: grace.signal,
        grace_period: Some(grace.period.as_secs_f64()),
        agent_addr: None,
        // `{"kernels": {"sub2": {…}}}` injects into the kernels named only (a cluster test
        // fails one kernel of a gang); anything else into every kernel.
        #[cfg(feature = "fault-injection")]
        inject: req
            .inject
            .as_ref()
            .and_then(|v| match v.get("kernels") {
                Some(per) => per.get(&slot.hostname),
                None => Some(v),
            })
            .map(json_to_msgpack),
        ..KernelCreationConfig::default()
    })
}

/// The scheduler's parts a creation uses, cloned out of the actor.
#[derive(Clone)]
pub(super) struct Launcher {
    pub(super) store: Store,
    pub(super) pool: Addr<crate::manager::pool::AgentPool>,
    pub(super) metrics: std::sync::Arc<crate::manager::metrics::ManagerMetrics>,
    pub(super) spec: super::SchedulerSpec,
}

/// The stored row of a session's kernel that was queued or placed (`place`: its place in
/// the cluster; [`ClusterPlace::single`] for a session of one kernel).
pub(super) fn new_kernel(
    owner: &str,
    req: &SessionRequest,
    ids: (&str, &str),
    agent_id: &str,
    slots: &ResourceSlots,
    priority: i64,
    place: &ClusterPlace,
) -> Result<NewKernel, ManagerError> {
    Ok(NewKernel {
        // As the request holds them once `CreateSession` checked them (`RequestGrace::fill`).
        stop_signal: req.stop_signal.clone(),
        grace_period: req.grace_period,
        cluster_mode: place.mode,
        cluster_size: place.size,
        cluster: place.slot.clone(),
        id: ids.0.to_owned(),
        session_id: ids.1.to_owned(),
        agent_id: agent_id.to_owned(),
        access_key: owner.to_owned(),
        image: req.image.clone(),
        resource_slots: slots.clone(),
        session_type: req.checked_type()?,
        command: req.command.clone(),
        batch_timeout: req.batch_timeout,
        mounts: req.mounts.clone(),
        restart_policy: req.restart_policy.unwrap_or_default(),
        priority,
        request: Some(
            serde_json::to_string(req).map_err(|e| ManagerError::Internal(e.to_string()))?,
        ),
        preemptible: req.preemptible.unwrap_or(false),
    })
}

/// A JSON value as msgpack (the fault-injection `_inject` passthrough).
#[cfg(feature = "fault-injection")]
fn json_to_msgpack(v: &serde_json::Value) -> Value {
    rmpv::ext::to_value(v).unwrap_or(Value::Nil)
}

/// How a kernel's end on its agent went, as the agent answered `destroy_kernel`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Ended {
    /// The workload's exit code when it exited within its grace (143: a `SIGTERM` it did not
    /// catch); `None` when it was killed, or the agent no longer had it.
    pub(super) exit_code: Option<i64>,
    /// Killed at the grace's deadline.
    pub(super) killed: bool,
}

/// `destroy_kernel` of a placed kernel `k` on its agent, with `reason` (`user-requested`,
/// `agent-drained`, …) and `grace`: the agent sends the kernel's stop signal (the one it was
/// created with: `grace.signal` is the kernel's, for the record), waits up to `grace.period`
/// for the workload to exit, then kills it. The call may take `timeout` beyond the grace.
/// A kernel the agent no longer has (`KernelNotFound`) counts as destroyed. The store is left
/// to the caller ([`end_on_agent`] does both).
///
/// Errors: the call's, when the agent did not answer or failed otherwise.
pub(super) async fn destroy_on_agent(
    pool: &Addr<AgentPool>,
    metrics: &ManagerMetrics,
    k: &KernelRow,
    reason: &str,
    grace: &Grace,
    timeout: Duration,
) -> Result<Ended, AgentCallError> {
    let args = DestroyKernelArgs {
        kernel_id: k.id.clone(),
        session_id: Some(k.session_id.clone()),
        reason: Some(reason.into()),
        suppress_events: None,
        grace_period: Some(grace.period.as_secs_f64()),
    };
    let timeout = timeout.saturating_add(grace.period);
    match call_method_kw::<DestroyKernel>(pool, metrics, &k.agent_id, &args, timeout).await {
        // An agent before grace periods answers nil.
        Ok(v) => Ok(rmpv::ext::from_value::<DestroyKernelReply>(v)
            .map(|r| Ended {
                exit_code: r.exit_code,
                killed: r.killed,
            })
            .unwrap_or_default()),
        Err(e)
            if e.failure()
                .is_some_and(|m| m.known() == Some(crate::rpc::Failure::KernelNotFound)) =>
        {
            Ok(Ended::default())
        }
        Err(e) => Err(e),
    }
}

/// The grace left to kernel `k` now: what remains of its `TERMINATING` (or `PREEMPTED`)
/// deadline (none once past it), else its own grace (`default`: `[scheduler] grace-period`, for a row stored
/// without one). A re-driven end (the sweep, a manager that took over) never extends a grace.
pub(super) fn grace_left(k: &KernelRow, default: Duration) -> Grace {
    let own = k.grace(default);
    match k.terminate_deadline.filter(|_| k.status.is_ending()) {
        Some(deadline) => Grace {
            period: Duration::try_from_secs_f64(deadline - crate::manager::store::now())
                .unwrap_or(Duration::ZERO)
                .min(own.period),
            ..own
        },
        None => own,
    }
}

/// Ends placed kernel `k` for `reason` with `grace`: `TERMINATING` with its
/// `terminate_deadline` (now + the grace; a row already `TERMINATING` keeps its own),
/// `destroy_kernel` on its agent ([`destroy_on_agent`]; none for a `SCHEDULED` row, whose
/// agent was not asked yet, or one without an agent), then `TERMINATED` with the workload's
/// exit code, a batch job's result following it when it exited within the grace (`SUCCESS`
/// for 0). The time it spent `TERMINATING` goes to `kernelvisor_manager_terminating_seconds`.
/// Returns whether this call ended it in the store (`false`: something else did first, as the
/// agent's own `kernel_terminated`).
///
/// Errors: the store's, or the agent call's (the row then stays `TERMINATING`: the caller may
/// ask again, and past its deadline plus `terminating-timeout` the sweep resolves it).
pub(super) async fn end_on_agent(
    launcher: &Launcher,
    k: &KernelRow,
    reason: &str,
    grace: &Grace,
) -> Result<(bool, Ended), EndError> {
    let store = &launcher.store;
    let since = if k.status == crate::model::session::KernelStatus::Terminating {
        k.status_changed_at
    } else {
        store
            .terminating_kernel(&k.id, reason, grace.period)
            .await
            .map_err(EndError::Store)?;
        crate::manager::store::now()
    };
    let ended =
        if k.agent_id.is_empty() || k.status == crate::model::session::KernelStatus::Scheduled {
            Ended::default()
        } else {
            destroy_on_agent(
                &launcher.pool,
                &launcher.metrics,
                k,
                reason,
                grace,
                launcher.spec.destroy_timeout,
            )
            .await
            .map_err(EndError::Agent)?
        };
    let result = match (k.session_type, ended.exit_code) {
        (SessionType::Batch, Some(0)) => Some(crate::model::session::SessionResult::Success),
        _ => None,
    };
    let changed = store
        .terminate_with_result(&k.id, reason, ended.exit_code, result)
        .await
        .map_err(EndError::Store)?;
    launcher
        .metrics
        .terminating_seconds
        .observe((crate::manager::store::now() - since).max(0.0));
    Ok((changed, ended))
}

/// Why [`end_on_agent`] could not end a kernel now.
#[derive(Debug, thiserror::Error)]
pub(super) enum EndError {
    /// The store failed.
    #[error(transparent)]
    Store(crate::manager::store::StoreError),
    /// The agent did not answer, or failed.
    #[error(transparent)]
    Agent(AgentCallError),
}

impl From<EndError> for ManagerError {
    fn from(e: EndError) -> ManagerError {
        match e {
            EndError::Store(e) => e.into(),
            EndError::Agent(e) => crate::manager::calls::agent_error(&e),
        }
    }
}

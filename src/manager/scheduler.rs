//! `Scheduler`: places a session's kernel on the least-loaded `ALIVE` agent with enough free
//! slots, creates it through the agent pool, and destroys and executes in it.
//!
//! Placement is serialized (choose + reserve under one lock), so two requests never take the
//! same free slots; the agent call runs outside the lock. On any failure the reservation is
//! undone in the store: no kernel stays live and `concurrency_used` is as before.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use rmpv::Value;

use super::calls::{agent_error, call_agent, call_method};
use super::error::ManagerError;
use super::metrics::ManagerMetrics;
use super::pool::AgentPool;
use super::registry::{AgentRegistry, PlacementCandidates};
use super::store::{AgentRow, KernelRow, NewKernel, ReserveError, Store, Usage};
use crate::agent::kernel::config::ACCESS_KEY_ENV;
use crate::model::session::{MountSpec, SessionRequest, SessionType};
use crate::rpc::agent_api::exec::{Execute, ExecuteArgs, GetLogs, GetLogsArgs};
use crate::rpc::agent_api::kernel::{
    ClusterInfo, CreateKernels, CreateKernelsArgs, DestroyKernel, DestroyKernelArgs, ImageConfig,
    KernelCreationConfig, ServicePortSpec as WireServicePort, SessionTypes, VFolderMount,
};
use crate::rpc::agent_api::{decode_reply, encode_args, to_value};
use crate::slots::{Amount, ResourceSlots, SlotError, SlotTypes};
use crate::workload::RestartPolicy;

/// Agent call deadlines.
#[derive(Clone, Debug)]
pub struct SchedulerSpec {
    /// `create_kernels`.
    pub create_timeout: Duration,
    /// `destroy_kernel`.
    pub destroy_timeout: Duration,
    /// An `execute` run's timeout when the request gives none.
    pub execute_timeout: Duration,
    /// `execute`'s `flush_timeout` when the request gives none (Backend.AI's default: 2 s).
    pub flush_timeout: Duration,
}

/// The slot types a request may name: the built-in `cpu` / `mem` and every slot type the
/// `candidates` (the `ALIVE` agents) advertise. Where agents disagree on a slot's type, the
/// agent with the smallest id wins (deterministic; the built-ins always win).
pub fn known_slot_types(candidates: &[AgentRow]) -> SlotTypes {
    let mut types = crate::slots::builtin_types();
    let mut by_id: Vec<&AgentRow> = candidates.iter().collect();
    by_id.sort_by(|a, b| a.id.cmp(&b.id));
    for a in by_id {
        for (name, ty) in &a.slot_types {
            types.entry(name.clone()).or_insert(*ty);
        }
    }
    types
}

/// Parses a session's `resource_slots` against the slots the `candidates` have
/// ([`known_slot_types`]): `cpu` (> 0) and `mem` required, amounts in the slot's unit (cores
/// with up to 3 decimals, whole bytes or a size such as `"256m"`, counts with up to 3 decimals,
/// whole `unique` devices).
///
/// Errors: [`ManagerError::UnknownSlot`] for a slot no candidate has (with no candidate at all,
/// [`ManagerError::NoAgents`]); [`ManagerError::InvalidRequest`] naming the slot for a bad or
/// missing amount.
pub fn parse_request(
    slots: &BTreeMap<String, serde_json::Value>,
    candidates: &[AgentRow],
) -> Result<ResourceSlots, ManagerError> {
    ResourceSlots::request_from_json(slots, &known_slot_types(candidates)).map_err(|e| match e {
        SlotError::Unknown(_) if candidates.is_empty() => ManagerError::NoAgents,
        SlotError::Unknown(name) => ManagerError::UnknownSlot(name),
        other => ManagerError::InvalidRequest(other.to_string()),
    })
}

/// An agent's load after placing `req`: the fullest slot's `(used + req) / total`
/// ([`ResourceSlots::load`]; lower = less loaded).
fn load_after(total: &ResourceSlots, used: &ResourceSlots, req: &ResourceSlots) -> f64 {
    let after = used.checked_add(req).unwrap_or_else(|_| total.clone());
    ResourceSlots::load(&after, total)
}

/// Picks the agent for `req` over every slot: among the `candidates` whose total has every
/// non-zero slot of `req` and whose free slots (`total − usage`) fit it, the least loaded after
/// placing it ([`load_after`]); ties go to fewer kernels, then the id. An agent without a slot
/// the request needs (an accelerator) is never chosen.
///
/// Errors: no candidates → `NoAgents`; none could ever fit (not in any agent's total) →
/// `SlotsExceedCapacity`, naming the slot; none fits now → `NoCapacity`.
pub fn place(
    candidates: &[AgentRow],
    usage: &std::collections::HashMap<String, Usage>,
    req: &ResourceSlots,
) -> Result<String, ManagerError> {
    if candidates.is_empty() {
        return Err(ManagerError::NoAgents);
    }
    if !candidates
        .iter()
        .any(|a| req.fits_in(&a.slots_total).is_ok())
    {
        // Name the first slot that no agent has enough of in total, with the largest total.
        let (slot, largest) = req
            .nonzero()
            .map(|(slot, want)| {
                let largest = candidates
                    .iter()
                    .map(|a| a.slots_total.get(slot))
                    .max()
                    .unwrap_or_default();
                (slot, want, largest)
            })
            .find(|(_, want, largest)| want > largest)
            .map(|(slot, _, largest)| (slot.to_owned(), largest))
            .unwrap_or_else(|| ("(combined)".to_owned(), Amount::ZERO));
        return Err(ManagerError::SlotsExceedCapacity(format!(
            "requested {req}: no ALIVE agent has that much in total (largest {slot}: {largest})"
        )));
    }
    let empty = Usage::default();
    // Each candidate's load computed once (10,000 agents: one pass, not one per comparison).
    candidates
        .iter()
        .map(|a| (a, usage.get(&a.id).unwrap_or(&empty)))
        .filter(|(a, u)| req.fits_in(&a.slots_total.saturating_sub(&u.slots)).is_ok())
        .map(|(a, u)| (load_after(&a.slots_total, &u.slots, req), u.kernels, a))
        .min_by(|(la, ka, a), (lb, kb, b)| la.total_cmp(lb).then(ka.cmp(kb)).then(a.id.cmp(&b.id)))
        .map(|(_, _, a)| a.id.clone())
        .ok_or_else(|| {
            ManagerError::NoCapacity(
                "every agent that could run it is full; retry after a session ends".into(),
            )
        })
}

/// Placements tried before a create gives up with `no-capacity` when every try lost a race for
/// the chosen agent's slots (other replicas placing at the same time).
const MAX_PLACEMENT_ATTEMPTS: u32 = 5;

/// The scheduler actor.
pub struct Scheduler {
    store: Store,
    pool: Addr<AgentPool>,
    registry: Addr<AgentRegistry>,
    metrics: Arc<ManagerMetrics>,
    spec: SchedulerSpec,
    placing: Arc<tokio::sync::Mutex<()>>,
}

impl Scheduler {
    /// A scheduler over the store, pool and registry.
    pub fn new(
        store: Store,
        pool: Addr<AgentPool>,
        registry: Addr<AgentRegistry>,
        metrics: Arc<ManagerMetrics>,
        spec: SchedulerSpec,
    ) -> Self {
        Scheduler {
            store,
            pool,
            registry,
            metrics,
            spec,
            placing: Arc::new(tokio::sync::Mutex::new(())),
        }
    }
}

impl Actor for Scheduler {
    type Context = Context<Self>;
}

/// Creates a session: `(session, kernel, agent, status)` as stored after the agent answered.
/// The agent's `mounts` for `owner`'s vfolders: `{"name", "host_path": "<owner>/<name>",
/// "permission"}`, the path relative to the agent's `[container] vfolder-root`.
///
/// Errors: 400 for a bad name or permission or a name mounted twice, 404
/// `vfolder-not-found` for a name the owner has no vfolder of.
async fn resolve_mounts(
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

#[derive(Message)]
#[rtype(result = "Result<KernelRow, ManagerError>")]
pub struct CreateSession {
    /// The access key that will own it (the caller, or the key an admin named).
    pub owner: String,
    /// What was asked for.
    pub request: SessionRequest,
}

impl Handler<CreateSession> for Scheduler {
    type Result = ResponseFuture<Result<KernelRow, ManagerError>>;

    fn handle(&mut self, msg: CreateSession, _: &mut Context<Self>) -> Self::Result {
        let (owner, req) = (msg.owner, msg.request);
        let (store, pool, registry, metrics, spec, placing) = (
            self.store.clone(),
            self.pool.clone(),
            self.registry.clone(),
            self.metrics.clone(),
            self.spec.clone(),
            self.placing.clone(),
        );
        Box::pin(async move {
            if req.image.trim().is_empty() {
                return Err(ManagerError::InvalidRequest(
                    "`image` must not be empty".into(),
                ));
            }
            if owner.is_empty() {
                return Err(ManagerError::InvalidRequest(
                    "`access_key` must not be empty".into(),
                ));
            }
            let session_type = req.checked_type()?;
            let mounts = resolve_mounts(&store, &owner, &req.mounts).await?;
            let kernel_id = uuid::Uuid::new_v4().to_string();
            let session_id = uuid::Uuid::new_v4().to_string();
            let (agent_id, slots) = {
                // One placement at a time per replica; the store serializes reservations on an
                // agent across replicas and re-checks its room, so a lost race places again.
                let _guard = placing.lock().await;
                let all = registry.send(PlacementCandidates).await?;
                let slots = parse_request(&req.resource_slots, &all)?;
                // Agents the store turned out to hold LOST/PENDING (rare: copied only then).
                let mut fewer: Option<Vec<AgentRow>> = None;
                let mut attempt = 0;
                loop {
                    attempt += 1;
                    let candidates: &[AgentRow] = fewer.as_deref().unwrap_or(&all);
                    let usage = store.usage_by_agent().await?;
                    let agent_id = place(candidates, &usage, &slots)?;
                    let total = candidates
                        .iter()
                        .find(|a| a.id == agent_id)
                        .map(|a| a.slots_total.clone())
                        .unwrap_or_default();
                    let new = NewKernel {
                        id: kernel_id.clone(),
                        session_id: session_id.clone(),
                        agent_id: agent_id.clone(),
                        access_key: owner.clone(),
                        image: req.image.clone(),
                        resource_slots: slots.clone(),
                        session_type: session_type.as_str().to_owned(),
                        command: req.command.clone(),
                        batch_timeout: req.batch_timeout,
                        mounts: serde_json::to_string(&req.mounts).unwrap_or_else(|_| "[]".into()),
                        restart_policy: serde_json::to_string(
                            &req.restart_policy.unwrap_or_default(),
                        )
                        .unwrap_or_else(|_| r#"{"mode":"never"}"#.into()),
                    };
                    match store.reserve_kernel(&new, &total).await {
                        Ok(()) => break (agent_id, slots),
                        Err(ReserveError::UnknownAccessKey(k)) => {
                            return Err(ManagerError::AccessKeyNotFound(k))
                        }
                        Err(e @ ReserveError::ConcurrencyLimit(..)) => {
                            return Err(ManagerError::ConcurrencyLimit(e.to_string()))
                        }
                        Err(ReserveError::Store(e)) => return Err(e.into()),
                        Err(e) if attempt >= MAX_PLACEMENT_ATTEMPTS => {
                            tracing::warn!(error = %e, attempt, "placement kept losing races");
                            return Err(ManagerError::NoCapacity(format!(
                                "{e}; retry after a session ends"
                            )));
                        }
                        Err(ReserveError::AgentNotAlive(id, status)) => {
                            tracing::info!(agent_id = %id, %status, "placement: the store holds the agent not alive; placing elsewhere");
                            let mut rest = candidates.to_vec();
                            rest.retain(|a| a.id != id);
                            fewer = Some(rest);
                        }
                        Err(ReserveError::NoRoom(id)) => {
                            tracing::debug!(agent_id = %id, attempt, "placement: lost a race for the agent's slots; placing again");
                        }
                    }
                }
            };
            let mut environ: BTreeMap<String, Value> = req
                .environ
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
                .collect();
            environ.insert(ACCESS_KEY_ENV.into(), owner.as_str().into());
            let config = KernelCreationConfig {
                image: ImageConfig::by_reference(&req.image),
                kernel_id: Some(kernel_id.clone()),
                session_id: Some(session_id.clone()),
                network_id: Some(session_id.clone()),
                session_type: match session_type {
                    SessionType::Batch => SessionTypes::Batch,
                    SessionType::Interactive => SessionTypes::Interactive,
                },
                cluster_role: Some("main".into()),
                cluster_idx: Some(1),
                cluster_hostname: Some("main1".into()),
                resource_slots: match slots.to_msgpack() {
                    Value::Map(m) => m
                        .into_iter()
                        .filter_map(|(k, v)| k.as_str().map(|k| (k.to_owned(), v)))
                        .collect(),
                    _ => BTreeMap::new(),
                },
                environ,
                mounts,
                startup_command: req.command.clone(),
                service_ports: req
                    .service_ports
                    .iter()
                    .map(|sp| WireServicePort {
                        name: sp.name.clone(),
                        protocol: sp.protocol.clone().unwrap_or_else(|| "tcp".into()),
                        container_ports: sp.container_ports.clone(),
                    })
                    .collect(),
                batch_timeout: req.batch_timeout,
                restart_policy: req.restart_policy.as_ref().map(RestartPolicy::to_value),
                agent_addr: None,
                ..KernelCreationConfig::default()
            };
            let call = encode_args::<CreateKernels>(&CreateKernelsArgs {
                session_id: session_id.clone(),
                kernel_ids: vec![kernel_id.clone()],
                configs: vec![to_value(&config)],
                cluster_info: Some(ClusterInfo::default()),
                kernel_image_refs: None,
            });
            let args = call.args;
            match call_agent(
                &pool,
                &metrics,
                &agent_id,
                "create_kernels",
                args,
                spec.create_timeout,
            )
            .await
            {
                Ok(reply) => {
                    let status = decode_reply::<CreateKernels>(reply)
                        .map_err(|e| ManagerError::Internal(e.to_string()))?
                        .first()
                        .and_then(|r| r.info.get("status"))
                        .and_then(Value::as_str)
                        .unwrap_or("RUNNING")
                        .to_owned();
                    store.advance_kernel(&kernel_id, &status).await?;
                    metrics.sessions_created.inc();
                }
                Err(e) if e.failure().is_some() => {
                    // The agent refused it whole: nothing exists there.
                    store.discard_reservation(&kernel_id).await?;
                    return Err(agent_error(&e));
                }
                Err(e) => {
                    // Unknown outcome: the kernel may exist. Release it here, and ask the agent
                    // to destroy it when it can be reached (its kernel_terminated is then a no-op).
                    store
                        .terminate_kernel(&kernel_id, "failed-to-create", None)
                        .await?;
                    let (pool, metrics, agent, kid, sid, t) = (
                        pool.clone(),
                        metrics.clone(),
                        agent_id.clone(),
                        kernel_id.clone(),
                        session_id.clone(),
                        spec.destroy_timeout,
                    );
                    actix::spawn(async move {
                        let args = DestroyKernelArgs {
                            kernel_id: kid,
                            session_id: Some(sid),
                            reason: Some("failed-to-create".into()),
                            suppress_events: None,
                        };
                        let _ =
                            call_method::<DestroyKernel>(&pool, &metrics, &agent, &args, t).await;
                    });
                    return Err(ManagerError::AgentUnavailable(e.to_string()));
                }
            }
            store
                .kernel(&kernel_id)
                .await?
                .ok_or_else(|| ManagerError::Internal("created kernel row vanished".into()))
        })
    }
}

/// Destroys a session's kernel on its agent and takes it out of the live set.
#[derive(Message)]
#[rtype(result = "Result<KernelRow, ManagerError>")]
pub struct DestroySession(pub String);

impl Handler<DestroySession> for Scheduler {
    type Result = ResponseFuture<Result<KernelRow, ManagerError>>;

    fn handle(
        &mut self,
        DestroySession(id): DestroySession,
        _: &mut Context<Self>,
    ) -> Self::Result {
        let (store, pool, metrics, timeout) = (
            self.store.clone(),
            self.pool.clone(),
            self.metrics.clone(),
            self.spec.destroy_timeout,
        );
        Box::pin(async move {
            let k = store
                .kernel(&id)
                .await?
                .ok_or_else(|| ManagerError::SessionNotFound(id.clone()))?;
            if !k.is_live() {
                return Ok(k);
            }
            let args = DestroyKernelArgs {
                kernel_id: k.id.clone(),
                session_id: Some(k.session_id.clone()),
                reason: Some("user-requested".into()),
                suppress_events: None,
            };
            match call_method::<DestroyKernel>(&pool, &metrics, &k.agent_id, &args, timeout).await {
                Ok(_) => {}
                Err(e) if e.failure().is_some_and(|m| m.name == "KernelNotFound") => {}
                Err(e) => return Err(agent_error(&e)),
            }
            store
                .terminate_kernel(&k.id, "user-requested", None)
                .await?;
            store
                .kernel(&k.id)
                .await?
                .ok_or(ManagerError::SessionNotFound(id))
        })
    }
}

/// One `execute` call of Backend.AI's continuation protocol (`docs/manager-api.md`).
#[derive(Clone, Debug, Default)]
pub struct ExecuteInSession {
    /// Session or kernel id.
    pub id: String,
    /// `query` (default), `continue` or `input`.
    pub mode: Option<String>,
    /// Code for the image's interpreter (`query`), or text for stdin (`input`).
    pub code: Option<String>,
    /// The run to continue or feed (required for `continue` / `input`).
    pub run_id: Option<String>,
    /// Seconds; the agent kills the run when exceeded (`query`).
    pub timeout: Option<f64>,
    /// Seconds to wait for output before answering `continued` (default: the manager's).
    pub flush_timeout: Option<f64>,
    /// Keep the run's stdin open for `input` (`query`).
    pub stdin: bool,
    /// Close stdin after writing (`input`).
    pub eof: bool,
}

impl Message for ExecuteInSession {
    type Result = Result<serde_json::Value, ManagerError>;
}

/// Longest `flush_timeout` the manager passes on (seconds): an answer always comes back within
/// an HTTP client's patience.
const MAX_FLUSH_TIMEOUT: f64 = 60.0;

impl Handler<ExecuteInSession> for Scheduler {
    type Result = ResponseFuture<Result<serde_json::Value, ManagerError>>;

    fn handle(&mut self, msg: ExecuteInSession, _: &mut Context<Self>) -> Self::Result {
        let (store, pool, metrics, default_flush, default_timeout) = (
            self.store.clone(),
            self.pool.clone(),
            self.metrics.clone(),
            self.spec.flush_timeout,
            self.spec.execute_timeout,
        );
        Box::pin(async move {
            let bad = |m: String| Err(ManagerError::InvalidRequest(m));
            for (name, v) in [
                ("timeout", msg.timeout),
                ("flush_timeout", msg.flush_timeout),
            ] {
                if let Some(t) = v.filter(|t| !(t.is_finite() && *t > 0.0)) {
                    return bad(format!("`{name}`: {t} is not a positive number of seconds"));
                }
            }
            let mode = msg.mode.clone().unwrap_or_else(|| "query".into());
            let k = store
                .kernel(&msg.id)
                .await?
                .ok_or_else(|| ManagerError::SessionNotFound(msg.id.clone()))?;
            let (run_id, code, opts) = match mode.as_str() {
                "query" => {
                    let Some(code) = msg.code.clone() else {
                        return bad("`code` is required for mode `query`".into());
                    };
                    if k.status != "RUNNING" {
                        return Err(ManagerError::SessionNotRunning(msg.id, k.status));
                    }
                    let timeout = msg.timeout.unwrap_or(default_timeout.as_secs_f64());
                    let opts = BTreeMap::from([
                        ("stdin".to_owned(), Value::from(msg.stdin)),
                        ("timeout".to_owned(), Value::F64(timeout)),
                    ]);
                    (
                        msg.run_id
                            .clone()
                            .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string()),
                        code,
                        opts,
                    )
                }
                "continue" | "input" => {
                    let Some(run_id) = msg.run_id.clone() else {
                        return bad(format!("`run_id` is required for mode `{mode}`"));
                    };
                    (
                        run_id,
                        msg.code.clone().unwrap_or_default(),
                        BTreeMap::from([("eof".to_owned(), Value::from(msg.eof))]),
                    )
                }
                other => {
                    return bad(format!(
                        "`mode` `{other}` must be `query`, `continue` or `input`"
                    ))
                }
            };
            let flush = msg
                .flush_timeout
                .unwrap_or(default_flush.as_secs_f64())
                .min(MAX_FLUSH_TIMEOUT);
            // The agent answers within the flush timeout (or sooner); the margin covers a full
            // buffer's transfer and a busy agent.
            let rpc_timeout = Duration::from_secs_f64(flush) + Duration::from_secs(30);
            let args = ExecuteArgs {
                session_id: Some(k.session_id.clone()),
                kernel_id: k.id.clone(),
                api_version: Some(2.into()),
                run_id: Some(run_id),
                mode: mode.to_owned(),
                code,
                opts: Some(opts),
                flush_timeout: Some(flush),
            };
            let out = call_method::<Execute>(&pool, &metrics, &k.agent_id, &args, rpc_timeout)
                .await
                .map_err(|e| agent_error(&e))?;
            Ok(serde_json::json!({
                "runId": out.run_id,
                "status": out.status,
                "console": out.console,
                "exitCode": out.exit_code,
            }))
        })
    }
}

/// A read of a session's logs from its agent: `offset` `None` for the tail, else on from there
/// waiting up to `wait` for more.
#[derive(Clone, Debug)]
pub struct ReadLogs {
    /// The kernel's row.
    pub kernel: KernelRow,
    /// Absolute offset, or `None` for the last `log-tail` bytes.
    pub offset: Option<u64>,
    /// Seconds to wait at the end of a running kernel's log.
    pub wait: Option<f64>,
}

/// What [`ReadLogs`] got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogsChunk {
    /// The bytes.
    pub data: Vec<u8>,
    /// Where the next read goes on from.
    pub next: u64,
    /// The kernel still runs: more may come.
    pub active: bool,
}

impl Message for ReadLogs {
    type Result = Result<LogsChunk, ManagerError>;
}

impl Handler<ReadLogs> for Scheduler {
    type Result = ResponseFuture<Result<LogsChunk, ManagerError>>;

    fn handle(&mut self, m: ReadLogs, _: &mut Context<Self>) -> Self::Result {
        let (pool, metrics) = (self.pool.clone(), self.metrics.clone());
        Box::pin(async move {
            let mut opts = Vec::new();
            if let Some(o) = m.offset {
                opts.push(("offset".into(), o.into()));
            }
            if let Some(w) = m.wait {
                opts.push(("wait".into(), Value::F64(w)));
            }
            let timeout = Duration::from_secs_f64(m.wait.unwrap_or(0.0)) + Duration::from_secs(30);
            let args = GetLogsArgs {
                kernel_id: m.kernel.id.clone(),
                opts: Some(Value::Map(opts)),
            };
            let v = call_method::<GetLogs>(&pool, &metrics, &m.kernel.agent_id, &args, timeout)
                .await
                .map_err(|e| agent_error(&e))?;
            Ok(LogsChunk {
                data: match (v.data, v.logs) {
                    (Some(b), _) => b.into_vec(),
                    (None, Some(text)) => text.into_bytes(),
                    (None, None) => Vec::new(),
                },
                next: v.next,
                active: v.active,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::slots::SlotType;

    fn slots(pairs: &[(&str, &str)]) -> ResourceSlots {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Amount::parse(v).unwrap()))
            .collect()
    }

    fn agent(id: &str, total: &[(&str, &str)], accel: &[(&str, SlotType)]) -> AgentRow {
        let mut slot_types = crate::slots::builtin_types();
        for (k, t) in accel {
            slot_types.insert(k.to_string(), *t);
        }
        AgentRow {
            id: id.into(),
            status: "ALIVE".into(),
            addr: None,
            public_key: None,
            region: None,
            version: None,
            slots_total: slots(total),
            slot_types,
            last_heartbeat: None,
            seen_at: 0.0,
            status_changed: 0.0,
        }
    }

    fn used(pairs: &[(&str, &str)], kernels: i64) -> Usage {
        Usage {
            slots: slots(pairs),
            kernels,
        }
    }

    fn request(
        json: serde_json::Value,
        candidates: &[AgentRow],
    ) -> Result<ResourceSlots, ManagerError> {
        parse_request(&serde_json::from_value(json).unwrap(), candidates)
    }

    const GIB: &str = "1073741824";

    #[test]
    fn slot_parsing() {
        let fleet = [
            agent("a", &[("cpu", "4"), ("mem", GIB)], &[]),
            agent(
                "g",
                &[("cpu", "4"), ("mem", GIB), ("cuda.shares", "2")],
                &[("cuda.shares", SlotType::Count)],
            ),
        ];
        let r = request(serde_json::json!({"cpu": 1.5, "mem": "256m"}), &fleet).unwrap();
        assert_eq!(r, slots(&[("cpu", "1.5"), ("mem", "268435456")]));
        let r = request(
            serde_json::json!({"cpu": "1", "mem": 1024, "cuda.shares": "0.25"}),
            &fleet,
        )
        .unwrap();
        assert_eq!(r.get("cuda.shares"), Amount::from_milli(250));
        for (v, word) in [
            (serde_json::json!({"cpu": 0, "mem": "1g"}), "`cpu`"),
            (serde_json::json!({"cpu": 0.0001, "mem": "1g"}), "decimals"),
            (serde_json::json!({"cpu": 1, "mem": "lots"}), "`mem`"),
            (serde_json::json!({"cpu": 1}), "`mem`"),
            (
                serde_json::json!({"cpu": 1, "mem": 1, "cuda.shares": -1}),
                "`cuda.shares`",
            ),
        ] {
            let e = request(v.clone(), &fleet).unwrap_err();
            assert_eq!(e.code(), "invalid-request", "{v}");
            assert!(e.to_string().contains(word), "{v}: {e}");
        }
        let e = request(
            serde_json::json!({"cpu": 1, "mem": 1, "tpu.device": 1}),
            &fleet,
        )
        .unwrap_err();
        assert_eq!((e.code(), e.status()), ("unknown-slot", 400), "{e}");
        assert!(e.to_string().contains("`tpu.device`"), "{e}");
        // Agents that predate `slot_key_and_units` know `cuda.device`.
        let old = [agent(
            "o",
            &[("cpu", "4"), ("mem", GIB)],
            &[("cuda.device", SlotType::Count)],
        )];
        assert!(request(
            serde_json::json!({"cpu": 1, "mem": 1, "cuda.device": 1}),
            &old
        )
        .is_ok());
        assert_eq!(
            request(
                serde_json::json!({"cpu": 1, "mem": 1, "cuda.device": 1}),
                &[]
            )
            .unwrap_err()
            .code(),
            "no-agents"
        );
    }

    #[test]
    fn placement_least_loaded_and_errors() {
        let agents = vec![
            agent("a", &[("cpu", "4"), ("mem", "8")], &[]),
            agent("b", &[("cpu", "4"), ("mem", "8")], &[]),
        ];
        let req = slots(&[("cpu", "1"), ("mem", "1")]);
        let mut usage = HashMap::new();
        usage.insert("a".to_string(), used(&[("cpu", "2"), ("mem", "1")], 2));
        assert_eq!(place(&agents, &usage, &req).unwrap(), "b");
        usage.insert("b".to_string(), used(&[("cpu", "3"), ("mem", "1")], 1));
        assert_eq!(place(&agents, &usage, &req).unwrap(), "a");
        // Equal load: fewer kernels wins.
        usage.insert("a".to_string(), used(&[("cpu", "3"), ("mem", "1")], 3));
        assert_eq!(place(&agents, &usage, &req).unwrap(), "b");
        usage.insert("a".to_string(), used(&[("cpu", "4"), ("mem", "1")], 4));
        usage.insert("b".to_string(), used(&[("cpu", "3.5"), ("mem", "1")], 1));
        assert_eq!(
            place(&agents, &usage, &req).unwrap_err().code(),
            "no-capacity"
        );
        let huge = slots(&[("cpu", "64"), ("mem", "1")]);
        let e = place(&agents, &usage, &huge).unwrap_err();
        assert_eq!(e.code(), "slots-exceed-capacity");
        assert!(e.to_string().contains("largest cpu: 4"), "{e}");
        assert_eq!(place(&[], &usage, &req).unwrap_err().code(), "no-agents");
    }

    #[test]
    fn placement_never_picks_an_agent_without_the_slot() {
        let agents = vec![
            agent("cpu-only", &[("cpu", "64"), ("mem", GIB)], &[]),
            agent(
                "gpu",
                &[("cpu", "4"), ("mem", GIB), ("cuda.device", "4")],
                &[("cuda.device", SlotType::Count)],
            ),
        ];
        let mut usage = HashMap::new();
        // The GPU agent is far busier, yet the only one with the device.
        usage.insert(
            "gpu".to_string(),
            used(&[("cpu", "3"), ("cuda.device", "2")], 2),
        );
        let gpu_req = slots(&[("cpu", "0.5"), ("mem", "1"), ("cuda.device", "2")]);
        assert_eq!(place(&agents, &usage, &gpu_req).unwrap(), "gpu");
        // A plain request goes to the least loaded one.
        let plain = slots(&[("cpu", "0.5"), ("mem", "1")]);
        assert_eq!(place(&agents, &usage, &plain).unwrap(), "cpu-only");
        // A zero amount of a slot the agent lacks does not exclude it.
        let zero = slots(&[("cpu", "0.5"), ("mem", "1"), ("cuda.device", "0")]);
        assert_eq!(place(&agents, &usage, &zero).unwrap(), "cpu-only");
        // All 4 devices in use: full now, not over capacity.
        usage.insert(
            "gpu".to_string(),
            used(&[("cpu", "1"), ("cuda.device", "4")], 2),
        );
        assert_eq!(
            place(&agents, &usage, &gpu_req).unwrap_err().code(),
            "no-capacity"
        );
        // More devices than any agent has, or an accelerator on CPU-only agents: never fits.
        let five = slots(&[("cpu", "1"), ("mem", "1"), ("cuda.device", "5")]);
        let e = place(&agents, &usage, &five).unwrap_err();
        assert_eq!(e.code(), "slots-exceed-capacity");
        assert!(e.to_string().contains("largest cuda.device: 4"), "{e}");
        assert_eq!(
            place(&agents[..1], &HashMap::new(), &gpu_req)
                .unwrap_err()
                .code(),
            "slots-exceed-capacity"
        );
    }

    #[test]
    fn fractional_shares_are_exact() {
        let agents = vec![
            agent(
                "s1",
                &[("cpu", "8"), ("mem", GIB), ("cuda.shares", "1")],
                &[("cuda.shares", SlotType::Count)],
            ),
            agent(
                "s2",
                &[("cpu", "8"), ("mem", GIB), ("cuda.shares", "1")],
                &[("cuda.shares", SlotType::Count)],
            ),
        ];
        // 0.1 + 0.2 + 0.7 fill s1 exactly (no float drift): 0.3 more does not fit there.
        let mut usage = HashMap::new();
        let held = slots(&[("cuda.shares", "0.1")])
            .checked_add(&slots(&[("cuda.shares", "0.2")]))
            .unwrap()
            .checked_add(&slots(&[("cuda.shares", "0.4")]))
            .unwrap();
        usage.insert("s1".to_string(), used(&[], 3));
        usage.get_mut("s1").unwrap().slots = held;
        usage.insert("s2".to_string(), used(&[("cuda.shares", "0.8")], 1));
        let req = slots(&[("cpu", "1"), ("mem", "1"), ("cuda.shares", "0.3")]);
        // s1: 0.7 + 0.3 = 1.0 exactly fits; s2: 0.8 + 0.3 does not.
        assert_eq!(place(&agents, &usage, &req).unwrap(), "s1");
        let more = slots(&[("cpu", "1"), ("mem", "1"), ("cuda.shares", "0.301")]);
        assert_eq!(
            place(&agents, &usage, &more).unwrap_err().code(),
            "no-capacity"
        );
        // Least loaded by shares: s2 at 0.25 beats s1 at 0.5.
        usage.insert("s1".to_string(), used(&[("cuda.shares", "0.5")], 1));
        usage.insert("s2".to_string(), used(&[("cuda.shares", "0.25")], 5));
        let half = slots(&[("cpu", "1"), ("mem", "1"), ("cuda.shares", "0.5")]);
        assert_eq!(place(&agents, &usage, &half).unwrap(), "s2");
    }
}

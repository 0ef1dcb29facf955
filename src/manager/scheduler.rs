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
use serde::Deserialize;

use super::calls::{agent_error, call_agent, to_json};
use super::error::ManagerError;
use super::metrics::ManagerMetrics;
use super::pool::AgentPool;
use super::registry::{AgentRegistry, PlacementCandidates};
use super::store::{AgentRow, KernelRow, NewKernel, ReserveError, Store, Usage};
use crate::agent::resources::SlotRequest;
use crate::config::ByteSize;
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

/// `POST /v1/sessions` body (`docs/manager-api.md`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Image reference.
    #[schema(min_length = 1)]
    pub image: String,
    /// `{"cpu": cores, "mem": bytes or "256m", "cuda.device": n}`.
    #[schema(schema_with = crate::manager::api::openapi::resource_slots_schema)]
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
    #[serde(default, deserialize_with = "crate::manager::api::body::objects")]
    pub mounts: Vec<MountSpec>,
    /// `interactive` (default) or `batch`.
    #[serde(default, rename = "type")]
    #[schema(value_type = Option<crate::manager::api::openapi::SessionType>)]
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
    #[serde(default, deserialize_with = "crate::manager::api::body::objects")]
    pub service_ports: Vec<ServicePortSpec>,
    /// What the kernel's supervisor does when its container exits: `{"mode": "never" |
    /// "on-failure" | "always", "max_restarts", "window", "backoff"}` (default `never`).
    #[serde(default)]
    pub restart_policy: Option<RestartPolicy>,
}

/// A service port a session asks for (`POST /v1/sessions`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServicePortSpec {
    /// Service name (its def file is `/etc/backend.ai/service-defs/<name>.json` in the image).
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
    /// `http`, `tcp` or `preopen` (default `tcp`).
    #[serde(default)]
    #[schema(value_type = Option<crate::manager::api::openapi::ServiceProtocol>)]
    pub protocol: Option<String>,
    /// Ports inside the container.
    #[schema(schema_with = crate::manager::api::openapi::container_ports_schema)]
    pub container_ports: Vec<u16>,
}

impl SessionRequest {
    /// The session type, checked: `interactive` or `batch`; `command` required for batch,
    /// non-blank when given; `batch_timeout` positive and batch only; `restart_policy` within
    /// its bounds.
    ///
    /// Errors: [`ManagerError::InvalidRequest`] naming the field.
    pub fn checked_type(&self) -> Result<&'static str, ManagerError> {
        let bad = |m: &str| Err(ManagerError::InvalidRequest(m.to_owned()));
        let t = match self.session_type.as_deref() {
            None | Some("interactive") => "interactive",
            Some("batch") => "batch",
            Some(_) => return bad("`type` must be `interactive` or `batch`"),
        };
        if self.command.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return bad("`command` must not be empty");
        }
        if t == "batch" && self.command.is_none() {
            return bad("a batch session needs a `command`");
        }
        match self.batch_timeout {
            Some(x) if !(x.is_finite() && x > 0.0) => {
                bad("`batch_timeout` must be a positive number of seconds")
            }
            Some(_) if t != "batch" => bad("`batch_timeout` applies to batch sessions only"),
            _ => Ok(t),
        }?;
        if let Some(p) = &self.restart_policy {
            p.check().map_err(ManagerError::InvalidRequest)?;
        }
        Ok(t)
    }
}

/// A vfolder mount of a session request: one of the owner's vfolders (`POST /v1/vfolders`).
#[derive(Clone, Debug, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    /// vfolder name; mounted at `/home/work/<name>`.
    #[schema(pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")]
    pub name: String,
    /// `rw` (default, Backend.AI's for an owned vfolder) or `ro`.
    #[serde(default)]
    #[schema(value_type = Option<crate::manager::api::openapi::MountPermission>)]
    pub permission: Option<String>,
}

impl MountSpec {
    /// `ro` or `rw`.
    ///
    /// Errors: [`ManagerError::InvalidRequest`] for another value.
    pub fn checked_permission(&self) -> Result<&'static str, ManagerError> {
        match self.permission.as_deref() {
            None | Some("rw") => Ok("rw"),
            Some("ro") => Ok("ro"),
            Some(p) => Err(ManagerError::InvalidRequest(format!(
                "mount `{}`: permission `{p}` must be `ro` or `rw`",
                self.name
            ))),
        }
    }
}

/// Requested slots: millicores, bytes, GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slots {
    /// Millicores.
    pub cpu_millis: i64,
    /// Bytes.
    pub mem_bytes: i64,
    /// GPUs.
    pub cuda_devices: i64,
}

impl Slots {
    /// Parses `resource_slots` with the agent's own rules ([`SlotRequest::from_value`]: cpu
    /// cores with at most 3 decimals, whole bytes and devices); `mem` may also be a size string
    /// such as `"256m"` ([`ByteSize`]).
    ///
    /// Errors ([`ManagerError::InvalidRequest`], naming the slot): unknown slot, missing `cpu`
    /// or `mem`, a non-positive or non-numeric amount, more than 3 decimals of `cpu`.
    pub fn parse(slots: &BTreeMap<String, serde_json::Value>) -> Result<Slots, ManagerError> {
        let bad = |m: String| ManagerError::InvalidRequest(m);
        let mut map = Vec::with_capacity(slots.len());
        for (k, v) in slots {
            let v = match (k.as_str(), v) {
                ("mem", serde_json::Value::String(s)) => Value::from(
                    ByteSize::parse(s)
                        .map_err(|e| bad(format!("resource slot `mem`: {e}")))?
                        .0,
                ),
                (_, serde_json::Value::String(s)) => Value::from(s.as_str()),
                (_, serde_json::Value::Number(n)) => n
                    .as_u64()
                    .map(Value::from)
                    .or_else(|| n.as_i64().map(Value::from))
                    .unwrap_or_else(|| Value::F64(n.as_f64().unwrap_or(f64::NAN))),
                (_, other) => Value::from(other.to_string()),
            };
            map.push((Value::from(k.as_str()), v));
        }
        let req = SlotRequest::from_value(&Value::Map(map)).map_err(|e| bad(e.to_string()))?;
        if req.mem_bytes == 0 {
            return Err(bad("resource slot `mem` must be positive".into()));
        }
        let too_large = || bad("resource slots too large".into());
        Ok(Slots {
            cpu_millis: i64::try_from(req.cpu_millis).map_err(|_| too_large())?,
            mem_bytes: i64::try_from(req.mem_bytes).map_err(|_| too_large())?,
            cuda_devices: req.cuda_devices.into(),
        })
    }

    /// Backend.AI's slot map: decimal strings ([`SlotRequest::to_value`]).
    pub fn to_value(self) -> Value {
        SlotRequest {
            cpu_millis: self.cpu_millis as u64,
            mem_bytes: self.mem_bytes as u64,
            cuda_devices: self.cuda_devices as u32,
        }
        .to_value()
    }

    fn fits(self, total: &AgentRow, used: Usage) -> bool {
        self.cpu_millis <= total.cpu_millis - used.cpu_millis
            && self.mem_bytes <= total.mem_bytes - used.mem_bytes
            && self.cuda_devices <= total.cuda_devices - used.cuda_devices
    }

    fn fits_total(self, total: &AgentRow) -> bool {
        self.fits(total, Usage::default())
    }
}

/// The larger of an agent's cpu and memory fill ratio after placing `req` (lower = less loaded).
fn load_after(total: &AgentRow, used: Usage, req: Slots) -> f64 {
    let ratio = |u: i64, r: i64, t: i64| {
        if t > 0 {
            (u + r) as f64 / t as f64
        } else {
            0.0
        }
    };
    ratio(used.cpu_millis, req.cpu_millis, total.cpu_millis).max(ratio(
        used.mem_bytes,
        req.mem_bytes,
        total.mem_bytes,
    ))
}

/// Picks the least-loaded agent that fits `req`; ties go to fewer kernels, then the id.
///
/// Errors: no candidates → `NoAgents`; none could ever fit → `SlotsExceedCapacity`; none fits
/// now → `NoCapacity`.
pub fn place(
    candidates: &[AgentRow],
    usage: &std::collections::HashMap<String, Usage>,
    req: Slots,
) -> Result<String, ManagerError> {
    if candidates.is_empty() {
        return Err(ManagerError::NoAgents);
    }
    if !candidates.iter().any(|a| req.fits_total(a)) {
        let biggest = candidates
            .iter()
            .map(|a| (a.cpu_millis, a.mem_bytes))
            .max()
            .unwrap_or_default();
        return Err(ManagerError::SlotsExceedCapacity(format!(
            "requested cpu {} cores, mem {} bytes, cuda.device {}: more than any ALIVE agent has (largest: cpu {} cores, mem {} bytes)",
            req.cpu_millis as f64 / 1000.0,
            req.mem_bytes,
            req.cuda_devices,
            biggest.0 as f64 / 1000.0,
            biggest.1
        )));
    }
    candidates
        .iter()
        .map(|a| (a, usage.get(&a.id).copied().unwrap_or_default()))
        .filter(|(a, u)| req.fits(a, *u))
        .min_by(|(a, ua), (b, ub)| {
            load_after(a, *ua, req)
                .total_cmp(&load_after(b, *ub, req))
                .then(ua.kernels.cmp(&ub.kernels))
                .then(a.id.cmp(&b.id))
        })
        .map(|(a, _)| a.id.clone())
        .ok_or_else(|| {
            ManagerError::NoCapacity(
                "every agent that could run it is full; retry after a session ends".into(),
            )
        })
}

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
) -> Result<Vec<Value>, ManagerError> {
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
        out.push(Value::Map(vec![
            ("name".into(), m.name.clone().into()),
            ("host_path".into(), format!("{owner}/{}", m.name).into()),
            ("permission".into(), permission.into()),
        ]));
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
            let slots = Slots::parse(&req.resource_slots)?;
            let kernel_id = uuid::Uuid::new_v4().to_string();
            let session_id = uuid::Uuid::new_v4().to_string();
            let agent_id = {
                let _guard = placing.lock().await;
                let candidates = registry.send(PlacementCandidates).await?;
                let usage = store.usage_by_agent().await?;
                let agent_id = place(&candidates, &usage, slots)?;
                let new = NewKernel {
                    id: kernel_id.clone(),
                    session_id: session_id.clone(),
                    agent_id: agent_id.clone(),
                    access_key: owner.clone(),
                    image: req.image.clone(),
                    cpu_millis: slots.cpu_millis,
                    mem_bytes: slots.mem_bytes,
                    cuda_devices: slots.cuda_devices,
                    session_type: session_type.to_owned(),
                    command: req.command.clone(),
                    batch_timeout: req.batch_timeout,
                    mounts: serde_json::to_string(&req.mounts).unwrap_or_else(|_| "[]".into()),
                    restart_policy: serde_json::to_string(&req.restart_policy.unwrap_or_default())
                        .unwrap_or_else(|_| r#"{"mode":"never"}"#.into()),
                };
                store.reserve_kernel(&new).await.map_err(|e| match e {
                    ReserveError::UnknownAccessKey(k) => ManagerError::AccessKeyNotFound(k),
                    e @ ReserveError::ConcurrencyLimit(..) => {
                        ManagerError::ConcurrencyLimit(e.to_string())
                    }
                    ReserveError::Store(e) => e.into(),
                })?;
                agent_id
            };
            let mut config = vec![
                ("image".into(), req.image.clone().into()),
                ("resource_slots".into(), slots.to_value()),
                (
                    "environ".into(),
                    Value::Map(
                        req.environ
                            .iter()
                            .map(|(k, v)| (k.clone().into(), v.clone().into()))
                            .collect(),
                    ),
                ),
                ("mounts".into(), Value::Array(mounts)),
                (
                    "owner".into(),
                    Value::Map(vec![("access_key".into(), owner.clone().into())]),
                ),
                ("session_type".into(), session_type.into()),
            ];
            if let Some(c) = &req.command {
                config.push(("command".into(), c.clone().into()));
            }
            if !req.service_ports.is_empty() {
                let ports = req
                    .service_ports
                    .iter()
                    .map(|sp| {
                        Value::Map(vec![
                            ("name".into(), sp.name.clone().into()),
                            (
                                "protocol".into(),
                                sp.protocol.clone().unwrap_or_else(|| "tcp".into()).into(),
                            ),
                            (
                                "container_ports".into(),
                                Value::Array(
                                    sp.container_ports.iter().map(|&p| p.into()).collect(),
                                ),
                            ),
                        ])
                    })
                    .collect();
                config.push(("service_ports".into(), Value::Array(ports)));
            }
            if let Some(t) = req.batch_timeout {
                config.push(("batch_timeout".into(), Value::F64(t)));
            }
            if let Some(p) = &req.restart_policy {
                config.push(("restart_policy".into(), p.to_value()));
            }
            let config = Value::Map(config);
            let args = vec![
                session_id.clone().into(),
                Value::Array(vec![kernel_id.clone().into()]),
                Value::Array(vec![config]),
            ];
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
                Ok(infos) => {
                    let status = infos
                        .as_array()
                        .and_then(|a| a.first())
                        .and_then(Value::as_map)
                        .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some("status")))
                        .and_then(|(_, v)| v.as_str())
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
                        let args = vec![kid.into(), sid.into(), "failed-to-create".into()];
                        let _ =
                            call_agent(&pool, &metrics, &agent, "destroy_kernel", args, t).await;
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
            let args = vec![
                k.id.clone().into(),
                k.session_id.clone().into(),
                "user-requested".into(),
            ];
            match call_agent(
                &pool,
                &metrics,
                &k.agent_id,
                "destroy_kernel",
                args,
                timeout,
            )
            .await
            {
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
                    let opts = vec![
                        ("stdin".into(), msg.stdin.into()),
                        ("timeout".into(), Value::F64(timeout)),
                    ];
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
                        vec![("eof".into(), msg.eof.into())],
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
            let args = vec![
                k.session_id.clone().into(),
                k.id.clone().into(),
                2.into(),
                run_id.into(),
                mode.into(),
                code.into(),
                Value::Map(opts),
                Value::F64(flush),
            ];
            let out = call_agent(&pool, &metrics, &k.agent_id, "execute", args, rpc_timeout)
                .await
                .map_err(|e| agent_error(&e))?;
            // Moved out of the answer, not cloned: the console may be a whole buffer (1 MiB).
            let mut out = to_json(&out);
            let mut take = |key: &str| out.get_mut(key).map(serde_json::Value::take);
            Ok(serde_json::json!({
                "runId": take("runId").unwrap_or_default(),
                "status": take("status").unwrap_or_default(),
                "console": take("console").unwrap_or_else(|| serde_json::json!([])),
                "exitCode": take("exitCode").unwrap_or_default(),
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
            let args = vec![m.kernel.id.clone().into(), Value::Map(opts)];
            let v = call_agent(
                &pool,
                &metrics,
                &m.kernel.agent_id,
                "get_logs",
                args,
                timeout,
            )
            .await
            .map_err(|e| agent_error(&e))?;
            let Value::Map(map) = v else {
                return Err(ManagerError::AgentError("get_logs answered no map".into()));
            };
            // The bytes are moved out of the answer (up to 1 MiB), not copied.
            let mut chunk = LogsChunk {
                data: Vec::new(),
                next: 0,
                active: false,
            };
            for (key, value) in map {
                match (key.as_str(), value) {
                    (Some("data"), Value::Binary(b)) => chunk.data = b,
                    (Some("logs"), Value::String(s)) => chunk.data = s.into_bytes(),
                    (Some("next"), v) => chunk.next = v.as_u64().unwrap_or(0),
                    (Some("active"), v) => chunk.active = v.as_bool().unwrap_or(false),
                    _ => {}
                }
            }
            Ok(chunk)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str, cpu: i64, mem: i64) -> AgentRow {
        AgentRow {
            id: id.into(),
            status: "ALIVE".into(),
            addr: None,
            public_key: None,
            region: None,
            version: None,
            cpu_millis: cpu,
            mem_bytes: mem,
            cuda_devices: 0,
            last_heartbeat: None,
        }
    }

    fn slots(json: serde_json::Value) -> Result<Slots, ManagerError> {
        Slots::parse(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn slot_parsing() {
        assert_eq!(
            slots(serde_json::json!({"cpu": 1.5, "mem": "256m"})).unwrap(),
            Slots {
                cpu_millis: 1500,
                mem_bytes: 256 << 20,
                cuda_devices: 0
            }
        );
        assert_eq!(
            slots(serde_json::json!({"cpu": "2", "mem": 1024}))
                .unwrap()
                .mem_bytes,
            1024
        );
        assert!(slots(serde_json::json!({"cpu": 0, "mem": "1g"}))
            .unwrap_err()
            .to_string()
            .contains("cpu"));
        assert!(slots(serde_json::json!({"cpu": 0.0001, "mem": "1g"}))
            .unwrap_err()
            .to_string()
            .contains("decimals"));
        assert!(slots(serde_json::json!({"cpu": 1, "mem": "lots"}))
            .unwrap_err()
            .to_string()
            .contains("mem"));
        assert!(slots(serde_json::json!({"cpu": 1, "mem": "1g", "tpu": 1}))
            .unwrap_err()
            .to_string()
            .contains("tpu"));
        assert!(slots(serde_json::json!({"cpu": 1})).is_err());
    }

    #[test]
    fn placement_least_loaded_and_errors() {
        let gib = 1i64 << 30;
        let agents = vec![agent("a", 4000, 8 * gib), agent("b", 4000, 8 * gib)];
        let req = Slots {
            cpu_millis: 1000,
            mem_bytes: gib,
            cuda_devices: 0,
        };
        let mut usage = std::collections::HashMap::new();
        usage.insert(
            "a".to_string(),
            Usage {
                cpu_millis: 2000,
                mem_bytes: gib,
                cuda_devices: 0,
                kernels: 2,
            },
        );
        assert_eq!(place(&agents, &usage, req).unwrap(), "b");
        usage.insert(
            "b".to_string(),
            Usage {
                cpu_millis: 3000,
                mem_bytes: gib,
                cuda_devices: 0,
                kernels: 1,
            },
        );
        assert_eq!(place(&agents, &usage, req).unwrap(), "a");
        usage.insert(
            "a".to_string(),
            Usage {
                cpu_millis: 4000,
                mem_bytes: gib,
                cuda_devices: 0,
                kernels: 4,
            },
        );
        usage.insert(
            "b".to_string(),
            Usage {
                cpu_millis: 3500,
                mem_bytes: gib,
                cuda_devices: 0,
                kernels: 1,
            },
        );
        assert_eq!(
            place(&agents, &usage, req).unwrap_err().code(),
            "no-capacity"
        );
        let huge = Slots {
            cpu_millis: 64000,
            mem_bytes: gib,
            cuda_devices: 0,
        };
        assert_eq!(
            place(&agents, &usage, huge).unwrap_err().code(),
            "slots-exceed-capacity"
        );
        assert_eq!(place(&[], &usage, req).unwrap_err().code(), "no-agents");
    }
}

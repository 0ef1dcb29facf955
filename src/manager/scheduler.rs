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

use super::calls::{call_agent, to_json};
use super::error::ManagerError;
use super::metrics::ManagerMetrics;
use super::pool::{AgentCallError, AgentPool};
use super::registry::{AgentRegistry, PlacementCandidates};
use super::store::{AgentRow, KernelRow, NewKernel, ReserveError, Store, Usage};
use crate::agent::resources::SlotRequest;
use crate::config::ByteSize;

/// Agent call deadlines.
#[derive(Clone, Debug)]
pub struct SchedulerSpec {
    /// `create_kernels`.
    pub create_timeout: Duration,
    /// `destroy_kernel`.
    pub destroy_timeout: Duration,
    /// `execute` without a request timeout.
    pub execute_timeout: Duration,
}

/// `POST /v1/sessions` body (`docs/manager-api.md`).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Image reference.
    pub image: String,
    /// `{"cpu": cores, "mem": bytes or "256m", "cuda.device": n}`.
    pub resource_slots: BTreeMap<String, serde_json::Value>,
    /// Owner.
    pub access_key: String,
    /// Extra environment.
    #[serde(default)]
    pub environ: BTreeMap<String, String>,
    /// vfolders: `{"name", "host_path", "permission"}`.
    #[serde(default)]
    pub mounts: Vec<MountSpec>,
}

/// A vfolder mount of a session request.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    /// Folder name (`/home/work/<name>`).
    pub name: String,
    /// Host path under the agent's vfolder root.
    pub host_path: String,
    /// `ro` (default) or `rw`.
    #[serde(default)]
    pub permission: Option<String>,
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
                ("mem", serde_json::Value::String(s)) => Value::from(ByteSize::parse(s).map_err(|e| bad(format!("resource slot `mem`: {e}")))?.0),
                (_, serde_json::Value::String(s)) => Value::from(s.as_str()),
                (_, serde_json::Value::Number(n)) => n.as_u64().map(Value::from).or_else(|| n.as_i64().map(Value::from)).unwrap_or_else(|| Value::F64(n.as_f64().unwrap_or(f64::NAN))),
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
        SlotRequest { cpu_millis: self.cpu_millis as u64, mem_bytes: self.mem_bytes as u64, cuda_devices: self.cuda_devices as u32 }.to_value()
    }

    fn fits(self, total: &AgentRow, used: Usage) -> bool {
        self.cpu_millis <= total.cpu_millis - used.cpu_millis && self.mem_bytes <= total.mem_bytes - used.mem_bytes && self.cuda_devices <= total.cuda_devices - used.cuda_devices
    }

    fn fits_total(self, total: &AgentRow) -> bool {
        self.fits(total, Usage::default())
    }
}

/// The larger of an agent's cpu and memory fill ratio after placing `req` (lower = less loaded).
fn load_after(total: &AgentRow, used: Usage, req: Slots) -> f64 {
    let ratio = |u: i64, r: i64, t: i64| if t > 0 { (u + r) as f64 / t as f64 } else { 0.0 };
    ratio(used.cpu_millis, req.cpu_millis, total.cpu_millis).max(ratio(used.mem_bytes, req.mem_bytes, total.mem_bytes))
}

/// Picks the least-loaded agent that fits `req`; ties go to fewer kernels, then the id.
///
/// Errors: no candidates → `NoAgents`; none could ever fit → `SlotsExceedCapacity`; none fits
/// now → `NoCapacity`.
pub fn place(candidates: &[AgentRow], usage: &std::collections::HashMap<String, Usage>, req: Slots) -> Result<String, ManagerError> {
    if candidates.is_empty() {
        return Err(ManagerError::NoAgents);
    }
    if !candidates.iter().any(|a| req.fits_total(a)) {
        let biggest = candidates.iter().map(|a| (a.cpu_millis, a.mem_bytes)).max().unwrap_or_default();
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
        .min_by(|(a, ua), (b, ub)| load_after(a, *ua, req).total_cmp(&load_after(b, *ub, req)).then(ua.kernels.cmp(&ub.kernels)).then(a.id.cmp(&b.id)))
        .map(|(a, _)| a.id.clone())
        .ok_or_else(|| ManagerError::NoCapacity("every agent that could run it is full; retry after a session ends".into()))
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
    pub fn new(store: Store, pool: Addr<AgentPool>, registry: Addr<AgentRegistry>, metrics: Arc<ManagerMetrics>, spec: SchedulerSpec) -> Self {
        Scheduler { store, pool, registry, metrics, spec, placing: Arc::new(tokio::sync::Mutex::new(())) }
    }
}

impl Actor for Scheduler {
    type Context = Context<Self>;
}

fn agent_failure(e: &AgentCallError) -> ManagerError {
    match e.failure() {
        Some(meta) => match meta.name.as_str() {
            "ImageNotFound" => ManagerError::ImageNotFound(meta.repr.clone()),
            "InvalidKernelConfig" | "TypeError" => ManagerError::InvalidRequest(meta.repr.clone()),
            "ResourceExhausted" => ManagerError::NoCapacity(meta.repr.clone()),
            "KernelNotRunning" => ManagerError::AgentError(meta.repr.clone()),
            name => ManagerError::AgentError(format!("{name}: {}", meta.repr)),
        },
        None => ManagerError::AgentUnavailable(e.to_string()),
    }
}

/// Creates a session: `(session, kernel, agent, status)` as stored after the agent answered.
#[derive(Message)]
#[rtype(result = "Result<KernelRow, ManagerError>")]
pub struct CreateSession(pub SessionRequest);

impl Handler<CreateSession> for Scheduler {
    type Result = ResponseFuture<Result<KernelRow, ManagerError>>;

    fn handle(&mut self, CreateSession(req): CreateSession, _: &mut Context<Self>) -> Self::Result {
        let (store, pool, registry, metrics, spec, placing) = (self.store.clone(), self.pool.clone(), self.registry.clone(), self.metrics.clone(), self.spec.clone(), self.placing.clone());
        Box::pin(async move {
            if req.image.trim().is_empty() {
                return Err(ManagerError::InvalidRequest("`image` must not be empty".into()));
            }
            if req.access_key.is_empty() {
                return Err(ManagerError::InvalidRequest("`access_key` must not be empty".into()));
            }
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
                    access_key: req.access_key.clone(),
                    image: req.image.clone(),
                    cpu_millis: slots.cpu_millis,
                    mem_bytes: slots.mem_bytes,
                    cuda_devices: slots.cuda_devices,
                };
                store.reserve_kernel(&new).await.map_err(|e| match e {
                    ReserveError::UnknownAccessKey(k) => ManagerError::AccessKeyNotFound(k),
                    e @ ReserveError::ConcurrencyLimit(..) => ManagerError::ConcurrencyLimit(e.to_string()),
                    ReserveError::Store(e) => e.into(),
                })?;
                agent_id
            };
            let config = Value::Map(vec![
                ("image".into(), req.image.clone().into()),
                ("resource_slots".into(), slots.to_value()),
                ("environ".into(), Value::Map(req.environ.iter().map(|(k, v)| (k.clone().into(), v.clone().into())).collect())),
                (
                    "mounts".into(),
                    Value::Array(
                        req.mounts
                            .iter()
                            .map(|m| {
                                Value::Map(vec![
                                    ("name".into(), m.name.clone().into()),
                                    ("host_path".into(), m.host_path.clone().into()),
                                    ("permission".into(), m.permission.clone().unwrap_or_else(|| "ro".into()).into()),
                                ])
                            })
                            .collect(),
                    ),
                ),
                ("owner".into(), Value::Map(vec![("access_key".into(), req.access_key.clone().into())])),
            ]);
            let args = vec![session_id.clone().into(), Value::Array(vec![kernel_id.clone().into()]), Value::Array(vec![config])];
            match call_agent(&pool, &metrics, &agent_id, "create_kernels", args, spec.create_timeout).await {
                Ok(infos) => {
                    let status = infos.as_array().and_then(|a| a.first()).and_then(Value::as_map).and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some("status"))).and_then(|(_, v)| v.as_str()).unwrap_or("RUNNING").to_owned();
                    store.advance_kernel(&kernel_id, &status).await?;
                    metrics.sessions_created.inc();
                }
                Err(e) if e.failure().is_some() => {
                    // The agent refused it whole: nothing exists there.
                    store.discard_reservation(&kernel_id).await?;
                    return Err(agent_failure(&e));
                }
                Err(e) => {
                    // Unknown outcome: the kernel may exist. Release it here, and ask the agent
                    // to destroy it when it can be reached (its kernel_terminated is then a no-op).
                    store.terminate_kernel(&kernel_id, "failed-to-create", None).await?;
                    let (pool, metrics, agent, kid, sid, t) = (pool.clone(), metrics.clone(), agent_id.clone(), kernel_id.clone(), session_id.clone(), spec.destroy_timeout);
                    actix::spawn(async move {
                        let args = vec![kid.into(), sid.into(), "failed-to-create".into()];
                        let _ = call_agent(&pool, &metrics, &agent, "destroy_kernel", args, t).await;
                    });
                    return Err(ManagerError::AgentUnavailable(e.to_string()));
                }
            }
            store.kernel(&kernel_id).await?.ok_or_else(|| ManagerError::Internal("created kernel row vanished".into()))
        })
    }
}

/// Destroys a session's kernel on its agent and takes it out of the live set.
#[derive(Message)]
#[rtype(result = "Result<KernelRow, ManagerError>")]
pub struct DestroySession(pub String);

impl Handler<DestroySession> for Scheduler {
    type Result = ResponseFuture<Result<KernelRow, ManagerError>>;

    fn handle(&mut self, DestroySession(id): DestroySession, _: &mut Context<Self>) -> Self::Result {
        let (store, pool, metrics, timeout) = (self.store.clone(), self.pool.clone(), self.metrics.clone(), self.spec.destroy_timeout);
        Box::pin(async move {
            let k = store.kernel(&id).await?.ok_or_else(|| ManagerError::SessionNotFound(id.clone()))?;
            if !k.is_live() {
                return Ok(k);
            }
            let args = vec![k.id.clone().into(), k.session_id.clone().into(), "user-requested".into()];
            match call_agent(&pool, &metrics, &k.agent_id, "destroy_kernel", args, timeout).await {
                Ok(_) => {}
                Err(e) if e.failure().is_some_and(|m| m.name == "KernelNotFound") => {}
                Err(e) => return Err(agent_failure(&e)),
            }
            store.terminate_kernel(&k.id, "user-requested", None).await?;
            store.kernel(&k.id).await?.ok_or_else(|| ManagerError::SessionNotFound(id))
        })
    }
}

/// Runs `code` in a session's kernel (`execute`, mode `query`): `{exitCode, console, status}`.
#[derive(Message)]
#[rtype(result = "Result<serde_json::Value, ManagerError>")]
pub struct ExecuteInSession {
    /// Session or kernel id.
    pub id: String,
    /// Code for the image's interpreter (`sh -c` on images without one).
    pub code: String,
    /// Seconds; the agent kills the run when exceeded.
    pub timeout: Option<f64>,
}

impl Handler<ExecuteInSession> for Scheduler {
    type Result = ResponseFuture<Result<serde_json::Value, ManagerError>>;

    fn handle(&mut self, msg: ExecuteInSession, _: &mut Context<Self>) -> Self::Result {
        let (store, pool, metrics, default_timeout) = (self.store.clone(), self.pool.clone(), self.metrics.clone(), self.spec.execute_timeout);
        Box::pin(async move {
            if let Some(t) = msg.timeout.filter(|t| !(t.is_finite() && *t > 0.0)) {
                return Err(ManagerError::InvalidRequest(format!("`timeout`: {t} is not a positive number of seconds")));
            }
            let k = store.kernel(&msg.id).await?.ok_or_else(|| ManagerError::SessionNotFound(msg.id.clone()))?;
            if k.status != "RUNNING" {
                return Err(ManagerError::SessionNotRunning(msg.id, k.status));
            }
            let opts = match msg.timeout {
                Some(t) => Value::Map(vec![("timeout".into(), Value::F64(t))]),
                None => Value::Map(vec![]),
            };
            let rpc_timeout = msg.timeout.map_or(default_timeout, |t| Duration::from_secs_f64(t) + Duration::from_secs(10));
            let run_id = uuid::Uuid::new_v4().simple().to_string();
            let args = vec![k.session_id.clone().into(), k.id.clone().into(), 2.into(), run_id.into(), "query".into(), msg.code.into(), opts, Value::Nil];
            let out = call_agent(&pool, &metrics, &k.agent_id, "execute", args, rpc_timeout).await.map_err(|e| agent_failure(&e))?;
            let out = to_json(&out);
            Ok(serde_json::json!({
                "exitCode": out.get("exitCode").cloned().unwrap_or(serde_json::Value::Null),
                "console": out.get("console").cloned().unwrap_or(serde_json::json!([])),
                "status": out.get("status").cloned().unwrap_or(serde_json::Value::Null),
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str, cpu: i64, mem: i64) -> AgentRow {
        AgentRow { id: id.into(), status: "ALIVE".into(), addr: None, public_key: None, region: None, version: None, cpu_millis: cpu, mem_bytes: mem, cuda_devices: 0, last_heartbeat: None }
    }

    fn slots(json: serde_json::Value) -> Result<Slots, ManagerError> {
        Slots::parse(&serde_json::from_value(json).unwrap())
    }

    #[test]
    fn slot_parsing() {
        assert_eq!(slots(serde_json::json!({"cpu": 1.5, "mem": "256m"})).unwrap(), Slots { cpu_millis: 1500, mem_bytes: 256 << 20, cuda_devices: 0 });
        assert_eq!(slots(serde_json::json!({"cpu": "2", "mem": 1024})).unwrap().mem_bytes, 1024);
        assert!(slots(serde_json::json!({"cpu": 0, "mem": "1g"})).unwrap_err().to_string().contains("cpu"));
        assert!(slots(serde_json::json!({"cpu": 0.0001, "mem": "1g"})).unwrap_err().to_string().contains("decimals"));
        assert!(slots(serde_json::json!({"cpu": 1, "mem": "lots"})).unwrap_err().to_string().contains("mem"));
        assert!(slots(serde_json::json!({"cpu": 1, "mem": "1g", "tpu": 1})).unwrap_err().to_string().contains("tpu"));
        assert!(slots(serde_json::json!({"cpu": 1})).is_err());
    }

    #[test]
    fn placement_least_loaded_and_errors() {
        let gib = 1i64 << 30;
        let agents = vec![agent("a", 4000, 8 * gib), agent("b", 4000, 8 * gib)];
        let req = Slots { cpu_millis: 1000, mem_bytes: gib, cuda_devices: 0 };
        let mut usage = std::collections::HashMap::new();
        usage.insert("a".to_string(), Usage { cpu_millis: 2000, mem_bytes: gib, cuda_devices: 0, kernels: 2 });
        assert_eq!(place(&agents, &usage, req).unwrap(), "b");
        usage.insert("b".to_string(), Usage { cpu_millis: 3000, mem_bytes: gib, cuda_devices: 0, kernels: 1 });
        assert_eq!(place(&agents, &usage, req).unwrap(), "a");
        usage.insert("a".to_string(), Usage { cpu_millis: 4000, mem_bytes: gib, cuda_devices: 0, kernels: 4 });
        usage.insert("b".to_string(), Usage { cpu_millis: 3500, mem_bytes: gib, cuda_devices: 0, kernels: 1 });
        assert_eq!(place(&agents, &usage, req).unwrap_err().code(), "no-capacity");
        let huge = Slots { cpu_millis: 64000, mem_bytes: gib, cuda_devices: 0 };
        assert_eq!(place(&agents, &usage, huge).unwrap_err().code(), "slots-exceed-capacity");
        assert_eq!(place(&[], &usage, req).unwrap_err().code(), "no-agents");
    }
}

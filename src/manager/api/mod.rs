//! The HTTP API (actix-web, `[api] listen-addr`, :8081): sessions, agents, access keys,
//! `/health`, `/metrics`. Contract: `docs/manager-api.md`.

mod error;
mod files;
mod services;

use std::net::TcpListener;
use std::sync::Arc;

use actix::Addr;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpResponse, HttpServer};
use serde::Deserialize;

use super::error::ManagerError;
use super::metrics::ManagerMetrics;
use super::pool::{AgentPool, GetPoolStats};
use super::registry::{AgentRegistry, GraceRemaining, ListAgents};
use super::scheduler::{
    CreateSession, DestroySession, ExecuteInSession, ReadLogs, Scheduler, SessionRequest,
};
use super::store::{KernelRow, Store};
use crate::agent::resources::slots::format_cores;

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    /// The store.
    pub store: Store,
    /// The registry (liveness, grace).
    pub registry: Addr<AgentRegistry>,
    /// The scheduler.
    pub scheduler: Addr<Scheduler>,
    /// The pool (metrics).
    pub pool: Addr<AgentPool>,
    /// Metrics.
    pub metrics: Arc<ManagerMetrics>,
    /// `[api] max-upload-size`, bytes.
    pub max_upload_size: u64,
}

type Res = Result<HttpResponse, ManagerError>;

fn slots_json(cpu_millis: i64, mem_bytes: i64, cuda: i64) -> serde_json::Value {
    serde_json::json!({"cpu": format_cores(cpu_millis.max(0) as u64), "mem": mem_bytes.to_string(), "cuda.device": cuda.to_string()})
}

/// A session as the API shows it.
pub fn session_json(k: &KernelRow) -> serde_json::Value {
    serde_json::json!({
        "session_id": k.session_id, "kernel_id": k.id, "agent_id": k.agent_id, "access_key": k.access_key,
        "image": k.image, "status": k.status, "status_reason": k.status_reason, "exit_code": k.exit_code,
        "type": k.session_type, "command": k.command, "batch_timeout": k.batch_timeout, "result": k.result,
        "resource_slots": slots_json(k.cpu_millis, k.mem_bytes, k.cuda_devices),
        "created_at": k.created_at, "terminated_at": k.terminated_at,
    })
}

/// Kernel API calls are refused during the start-up grace period.
async fn not_in_grace(s: &ApiState) -> Result<(), ManagerError> {
    match s.registry.send(GraceRemaining).await? {
        Some(left) => Err(ManagerError::StartingUp(left)),
        None => Ok(()),
    }
}

/// The session's kernel, which must be `RUNNING` (files and services live in its container).
///
/// Errors: 404 `session-not-found`, 409 `session-not-running`.
async fn running_kernel(s: &ApiState, id: &str) -> Result<KernelRow, ManagerError> {
    not_in_grace(s).await?;
    let k = s
        .store
        .kernel(id)
        .await?
        .ok_or_else(|| ManagerError::SessionNotFound(id.to_owned()))?;
    if k.status != "RUNNING" {
        return Err(ManagerError::SessionNotRunning(id.to_owned(), k.status));
    }
    Ok(k)
}

fn count_error<T>(s: &ApiState, r: Result<T, ManagerError>) -> Result<T, ManagerError> {
    if let Err(e) = &r {
        s.metrics
            .session_errors
            .with_label_values(&[e.code()])
            .inc();
    }
    r
}

async fn create_session(s: web::Data<ApiState>, body: web::Json<SessionRequest>) -> Res {
    let r = async {
        not_in_grace(&s).await?;
        s.scheduler.send(CreateSession(body.into_inner())).await?
    }
    .await;
    let k = count_error(&s, r)?;
    Ok(HttpResponse::Created().json(serde_json::json!({"session_id": k.session_id, "kernel_id": k.id, "agent_id": k.agent_id, "status": k.status})))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    access_key: Option<String>,
    #[serde(default)]
    all: bool,
}

async fn list_sessions(s: web::Data<ApiState>, q: web::Query<ListQuery>) -> Res {
    not_in_grace(&s).await?;
    let rows = s.store.kernels(q.access_key.as_deref(), q.all).await?;
    Ok(HttpResponse::Ok()
        .json(serde_json::json!({"sessions": rows.iter().map(session_json).collect::<Vec<_>>()})))
}

async fn get_session(s: web::Data<ApiState>, id: web::Path<String>) -> Res {
    not_in_grace(&s).await?;
    let k = s
        .store
        .kernel(&id)
        .await?
        .ok_or_else(|| ManagerError::SessionNotFound(id.into_inner()))?;
    Ok(HttpResponse::Ok().json(session_json(&k)))
}

async fn delete_session(s: web::Data<ApiState>, id: web::Path<String>) -> Res {
    let r = async {
        not_in_grace(&s).await?;
        s.scheduler.send(DestroySession(id.into_inner())).await?
    }
    .await;
    Ok(HttpResponse::Ok().json(session_json(&count_error(&s, r)?)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExecuteBody {
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    code: Option<String>,
    #[serde(default)]
    run_id: Option<String>,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    flush_timeout: Option<f64>,
    #[serde(default)]
    stdin: bool,
    #[serde(default)]
    eof: bool,
}

async fn execute(
    s: web::Data<ApiState>,
    id: web::Path<String>,
    body: web::Json<ExecuteBody>,
) -> Res {
    let r = async {
        not_in_grace(&s).await?;
        let b = body.into_inner();
        let msg = ExecuteInSession {
            id: id.into_inner(),
            mode: b.mode,
            code: b.code,
            run_id: b.run_id,
            timeout: b.timeout,
            flush_timeout: b.flush_timeout,
            stdin: b.stdin,
            eof: b.eof,
        };
        s.scheduler.send(msg).await?
    }
    .await;
    Ok(HttpResponse::Ok().json(count_error(&s, r)?))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogsQuery {
    #[serde(default)]
    follow: bool,
}

/// The next chunk of a followed log from `offset`; `None` ends the follow (the agent cannot be
/// read: logged).
async fn read_more(
    scheduler: &Addr<Scheduler>,
    kernel: &KernelRow,
    offset: u64,
) -> Option<super::scheduler::LogsChunk> {
    match scheduler
        .send(ReadLogs {
            kernel: kernel.clone(),
            offset: Some(offset),
            wait: Some(FOLLOW_WAIT),
        })
        .await
    {
        Ok(Ok(c)) => Some(c),
        Ok(Err(e)) => {
            tracing::info!(kernel_id = %kernel.id, error = %e, "log follow ends: the agent cannot be read");
            None
        }
        Err(_) => None,
    }
}

/// Seconds one follow read waits at the agent for new output before asking again.
const FOLLOW_WAIT: f64 = 10.0;

async fn logs(s: web::Data<ApiState>, id: web::Path<String>, q: web::Query<LogsQuery>) -> Res {
    not_in_grace(&s).await?;
    let kernel = s
        .store
        .kernel(&id)
        .await?
        .ok_or_else(|| ManagerError::SessionNotFound(id.into_inner()))?;
    let first = s
        .scheduler
        .send(ReadLogs {
            kernel: kernel.clone(),
            offset: None,
            wait: None,
        })
        .await??;
    let mut resp = HttpResponse::Ok();
    resp.content_type("text/plain; charset=utf-8")
        .insert_header(("X-Content-Type-Options", "nosniff"));
    if !q.follow {
        return Ok(resp.body(first.data));
    }
    // Follow: the tail, then each newer chunk as the agent has it, until the kernel has ended and
    // everything is sent. One chunk (≤ 1 MiB) is held at a time; a slow reader slows the reads.
    let scheduler = s.scheduler.clone();
    let stream = futures::stream::unfold(Some((first, kernel)), move |state| {
        let scheduler = scheduler.clone();
        async move {
            let (mut chunk, kernel) = state?;
            // Never a zero-length chunk (it would read as the end of a chunked body): ask again
            // until there are bytes to send or the kernel has ended.
            while chunk.data.is_empty() {
                if !chunk.active {
                    return None;
                }
                chunk = read_more(&scheduler, &kernel, chunk.next).await?;
            }
            let next = chunk.next;
            let data = actix_web::web::Bytes::from(std::mem::take(&mut chunk.data));
            let following = if chunk.active {
                read_more(&scheduler, &kernel, next)
                    .await
                    .map(|c| (c, kernel))
            } else {
                None
            };
            Some((Ok::<_, actix_web::Error>(data), following))
        }
    });
    Ok(resp.streaming(stream))
}

async fn list_agents(s: web::Data<ApiState>) -> Res {
    let agents = s.registry.send(ListAgents).await?;
    let usage = s.store.usage_by_agent().await?;
    let list: Vec<serde_json::Value> = agents
        .iter()
        .map(|a| {
            let r = &a.row;
            let u = usage.get(&r.id).copied().unwrap_or_default();
            serde_json::json!({
                "agent_id": r.id, "status": r.status, "addr": r.addr, "region": r.region, "version": r.version,
                "slots_total": slots_json(r.cpu_millis, r.mem_bytes, r.cuda_devices),
                "slots_used": slots_json(u.cpu_millis, u.mem_bytes, u.cuda_devices),
                "kernels": u.kernels, "last_heartbeat": r.last_heartbeat,
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({"agents": list})))
}

async fn access_key(s: web::Data<ApiState>, key: web::Path<String>) -> Res {
    let (used, limit) = s
        .store
        .access_key(&key)
        .await?
        .ok_or_else(|| ManagerError::AccessKeyNotFound(key.clone()))?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"access_key": key.into_inner(), "concurrency_used": used, "concurrency_limit": limit})))
}

async fn health(s: web::Data<ApiState>) -> Res {
    let grace = s.registry.send(GraceRemaining).await?;
    let alive = s
        .registry
        .send(ListAgents)
        .await?
        .iter()
        .filter(|a| a.row.status == super::registry::ALIVE)
        .count();
    Ok(HttpResponse::Ok().json(serde_json::json!({"status": "ok", "mode": if grace.is_some() { "grace" } else { "normal" }, "agents_alive": alive})))
}

async fn metrics(s: web::Data<ApiState>) -> Res {
    let m = &s.metrics;
    m.agents.reset();
    for status in [
        super::registry::ALIVE,
        super::registry::LOST,
        super::registry::PENDING,
        super::registry::TERMINATED,
    ] {
        m.agents.with_label_values(&[status]).set(0);
    }
    for a in s.registry.send(ListAgents).await? {
        m.agents.with_label_values(&[&a.row.status]).inc();
    }
    let p = s.pool.send(GetPoolStats).await?;
    for (state, n) in [
        ("known", p.known),
        ("connecting", p.connecting),
        ("healthy", p.healthy),
        ("unhealthy", p.unhealthy),
    ] {
        m.pool_entries.with_label_values(&[state]).set(n as i64);
    }
    if let Some((took, n)) = p.last_sweep {
        m.pool_last_sweep.set(took.as_secs_f64());
        m.pool_last_sweep_entries.set(n as i64);
    }
    m.live_kernels.reset();
    for (status, n) in s.store.live_kernel_counts().await? {
        m.live_kernels.with_label_values(&[&status]).set(n);
    }
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(m.render()))
}

fn invalid(e: impl std::fmt::Display) -> actix_web::Error {
    ManagerError::InvalidRequest(e.to_string()).into()
}

/// The routes, for the server and for tests.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let not_allowed = || {
        web::to(|| async {
            error::plain(
                StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "method not allowed on this route",
            )
        })
    };
    cfg.app_data(
        web::JsonConfig::default()
            .limit(1 << 20)
            .error_handler(|e, _| invalid(e)),
    )
    .app_data(web::QueryConfig::default().error_handler(|e, _| invalid(e)))
    .app_data(web::PathConfig::default().error_handler(|e, _| invalid(e)))
    .service(
        web::resource("/v1/sessions")
            .route(web::post().to(create_session))
            .route(web::get().to(list_sessions))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/v1/sessions/{id}")
            .route(web::get().to(get_session))
            .route(web::delete().to(delete_session))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/v1/sessions/{id}/execute")
            .route(web::post().to(execute))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/v1/sessions/{id}/logs")
            .route(web::get().to(logs))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/v1/sessions/{id}/services")
            .route(web::get().to(services::list))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/v1/sessions/{id}/services/{name}")
            .route(web::post().to(services::start))
            .route(web::delete().to(services::stop))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/v1/sessions/{id}/files")
            .route(web::get().to(files::list))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/v1/sessions/{id}/files/{path:.*}")
            .route(web::put().to(files::upload))
            .route(web::get().to(files::download))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/v1/agents")
            .route(web::get().to(list_agents))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/v1/access-keys/{key}")
            .route(web::get().to(access_key))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/health")
            .route(web::get().to(health))
            .default_service(not_allowed()),
    )
    .service(
        web::resource("/metrics")
            .route(web::get().to(metrics))
            .default_service(not_allowed()),
    );
}

/// Starts the API server on `listener` with `workers` threads; returns its handle (stop it
/// with `handle.stop(true)`) and the future that runs it.
///
/// Errors: the listener cannot be used.
pub fn serve(
    listener: TcpListener,
    workers: usize,
    state: ApiState,
) -> std::io::Result<actix_web::dev::Server> {
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(state.clone()))
            .configure(configure)
            .default_service(web::to(|| async {
                error::plain(StatusCode::NOT_FOUND, "not-found", "no such route")
            }))
    })
    .workers(workers)
    .disable_signals()
    .shutdown_timeout(5)
    .listen(listener)?
    .run();
    Ok(server)
}

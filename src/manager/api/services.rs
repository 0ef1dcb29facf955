//! Service routes: `GET /v1/sessions/{id}/services`, `POST` and `DELETE
//! /v1/sessions/{id}/services/{name}` (the agent's `list_services`, `start_service`,
//! `shutdown_service`).
//!
//! Each service is `{"name", "protocol", "container_ports", "host_ports", "status", "url"}`;
//! `url` is `http://<host>:<first host port>` (`tcp://` for `tcp`) where `<host>` is the agent's
//! `[container] advertised-host`, else the host of its advertised RPC address.

use std::time::Duration;

use actix_web::{delete, get, post, web, HttpResponse};

use super::auth::Caller;
use super::responses;
use super::{reply, running_kernel, ApiState, KernelQuery, Res, KERNEL_PARAM};
use crate::manager::calls::{agent_error, call_method};
use crate::manager::error::ManagerError;
use crate::manager::registry::AgentAddr;
use crate::manager::store::KernelRow;
use crate::model::error::ErrorBody;
use crate::model::service::{Service, ServiceList, ServiceStarted};
use crate::rpc::agent_api::kernel::KernelIdArgs;
use crate::rpc::agent_api::services::{
    ListServices, ServiceState, ShutdownService, ShutdownServiceArgs, StartService,
    StartServiceArgs,
};
use crate::rpc::agent_api::Method;

/// How long the manager waits for `start_service`: the agent's readiness wait
/// (`service-start-timeout`, 30 s by default) and a prestart, with margin.
const START_TIMEOUT: Duration = Duration::from_secs(150);

/// Other service calls.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// The host users reach the kernel's agent at: the host of its advertised RPC address
/// (`tcp://host:port`); an unspecified address means the agent shares the manager's host.
async fn agent_host(s: &ApiState, agent_id: &str) -> String {
    let addr = s
        .registry
        .send(AgentAddr(agent_id.to_owned()))
        .await
        .ok()
        .flatten()
        .unwrap_or_default();
    let host = addr
        .trim_start_matches("tcp://")
        .rsplit_once(':')
        .map_or("", |(h, _)| h)
        .trim_matches(|c| c == '[' || c == ']')
        .to_owned();
    match host.as_str() {
        "" | "0.0.0.0" | "*" | "::" => "127.0.0.1".into(),
        _ => host,
    }
}

/// The agent's service as the API shows it: without the agent's `advertised_host` and
/// `is_inference`, with its `url`.
fn service(v: &ServiceState, fallback_host: &str) -> Service {
    let host = v.advertised_host.as_deref().unwrap_or(fallback_host);
    let scheme = match v.protocol.as_str() {
        "tcp" => "tcp",
        _ => "http",
    };
    Service {
        name: v.name.clone(),
        protocol: v.protocol.clone(),
        container_ports: v.container_ports.clone(),
        host_ports: v.host_ports.clone(),
        status: v.status.clone(),
        url: v
            .host_ports
            .first()
            .map(|port| format!("{scheme}://{host}:{port}")),
    }
}

async fn call<M: Method>(
    s: &ApiState,
    k: &KernelRow,
    args: &M::Args,
    timeout: Duration,
) -> Result<M::Reply, crate::manager::error::ManagerError> {
    call_method::<M>(&s.pool, &s.metrics, &k.agent_id, args, timeout)
        .await
        .map_err(|e| agent_error(&e))
}

/// Every service port of the session, with whether its service runs.
#[utoipa::path(
    operation_id = "list_services",
    tag = "services",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        ("kernel" = Option<String>, Query, description = KERNEL_PARAM),
    ),
    responses(
        (status = 200, description = "The services", body = ServiceList),
        (status = 404, description = "`session-not-found`", body = ErrorBody),
        responses::NotRunning, responses::AgentFailed, responses::StartingUp,
    ),
)]
#[get("/v1/sessions/{id}/services")]
pub(super) async fn list(
    s: web::Data<ApiState>,
    caller: Caller,
    id: web::Path<String>,
    q: web::Query<KernelQuery>,
) -> Res {
    let k = running_kernel(&s, &caller, &id, q.kernel.as_deref()).await?;
    let args = KernelIdArgs {
        kernel_id: k.id.clone(),
    };
    let out = call::<ListServices>(&s, &k, &args, CALL_TIMEOUT).await?;
    let host = agent_host(&s, &k.agent_id).await;
    let services = out.services.iter().map(|v| service(v, &host)).collect();
    reply(HttpResponse::Ok(), &ServiceList { services })
}

/// Starts a service (its prestart commands, then its command) and answers once its first
/// container port accepts connections; one already running answers at once.
#[utoipa::path(
    operation_id = "start_service",
    tag = "services",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        ("name" = String, Path, description = "Service name"),
        ("kernel" = Option<String>, Query, description = KERNEL_PARAM),
    ),
    responses(
        (status = 200, description = "The service, running; `started`: whether this call started it", body = ServiceStarted),
        (status = 404, description = "`session-not-found`, `service-not-found`", body = ErrorBody),
        (status = 409, description = "`session-not-running`, `service-failed` (the error has `output`)", body = ErrorBody),
        responses::AgentFailed, responses::StartingUp,
    ),
)]
#[post("/v1/sessions/{id}/services/{name}")]
pub(super) async fn start(
    s: web::Data<ApiState>,
    caller: Caller,
    p: web::Path<(String, String)>,
    q: web::Query<KernelQuery>,
) -> Res {
    let (id, name) = p.into_inner();
    let k = running_kernel(&s, &caller, &id, q.kernel.as_deref()).await?;
    let args = StartServiceArgs {
        kernel_id: k.id.clone(),
        service: name,
        opts: Some(Default::default()),
    };
    let out = call::<StartService>(&s, &k, &args, START_TIMEOUT).await?;
    if out.status == "failed" {
        // Upstream's shape: a failed start is an answer, not a FAILURE.
        let message = out.error.unwrap_or_default();
        return Err(match out.error_name.as_deref() {
            Some("ServiceNotFound") => ManagerError::ServiceNotFound(message),
            _ => ManagerError::ServiceFailed {
                message,
                output: out.output.unwrap_or_default(),
            },
        });
    }
    let host = agent_host(&s, &k.agent_id).await;
    // A `started`/`running` answer always has the service; without it the answer is `null`,
    // as before the model.
    let Some(v) = out.service.as_ref() else {
        return reply(HttpResponse::Ok(), &serde_json::Value::Null);
    };
    let sv = service(v, &host);
    let started = ServiceStarted {
        name: sv.name,
        protocol: sv.protocol,
        container_ports: sv.container_ports,
        host_ports: sv.host_ports,
        status: sv.status,
        url: sv.url,
        started: Some(out.status == "started"),
    };
    reply(HttpResponse::Ok(), &started)
}

/// Stops a service (kills its process tree); stopping a stopped one is not an error.
#[utoipa::path(
    operation_id = "stop_service",
    tag = "services",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        ("name" = String, Path, description = "Service name"),
        ("kernel" = Option<String>, Query, description = KERNEL_PARAM),
    ),
    responses(
        (status = 200, description = "The service, stopped", body = Service),
        (status = 404, description = "`session-not-found`, `service-not-found`", body = ErrorBody),
        responses::NotRunning, responses::AgentFailed, responses::StartingUp,
    ),
)]
#[delete("/v1/sessions/{id}/services/{name}")]
pub(super) async fn stop(
    s: web::Data<ApiState>,
    caller: Caller,
    p: web::Path<(String, String)>,
    q: web::Query<KernelQuery>,
) -> Res {
    let (id, name) = p.into_inner();
    let k = running_kernel(&s, &caller, &id, q.kernel.as_deref()).await?;
    let args = ShutdownServiceArgs {
        kernel_id: k.id.clone(),
        service: name,
    };
    let out = call::<ShutdownService>(&s, &k, &args, CALL_TIMEOUT).await?;
    let host = agent_host(&s, &k.agent_id).await;
    reply(HttpResponse::Ok(), &service(&out.service, &host))
}

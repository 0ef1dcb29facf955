//! Service routes: `GET /v1/sessions/{id}/services`, `POST` and `DELETE
//! /v1/sessions/{id}/services/{name}` (the agent's `list_services`, `start_service`,
//! `shutdown_service`).
//!
//! Each service is `{"name", "protocol", "container_ports", "host_ports", "status", "url"}`;
//! `url` is `http://<host>:<first host port>` (`tcp://` for `tcp`) where `<host>` is the agent's
//! `[container] advertised-host`, else the host of its advertised RPC address.

use std::time::Duration;

use actix_web::{web, HttpResponse};

use super::auth::Caller;
use super::openapi;
use super::{running_kernel, ApiState, Res};
use crate::manager::calls::{agent_error, call_method};
use crate::manager::error::ManagerError;
use crate::manager::registry::AgentAddr;
use crate::manager::store::KernelRow;
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

/// The agent's service map as the API shows it.
fn service_json(v: &ServiceState, fallback_host: &str) -> serde_json::Value {
    let host = v.advertised_host.as_deref().unwrap_or(fallback_host);
    let scheme = match v.protocol.as_str() {
        "tcp" => "tcp",
        _ => "http",
    };
    let url = v
        .host_ports
        .first()
        .map(|port| format!("{scheme}://{host}:{port}"));
    let mut j = serde_json::to_value(v).unwrap_or_default();
    if let Some(map) = j.as_object_mut() {
        map.remove("advertised_host");
        map.remove("is_inference");
        map.insert("url".into(), url.into());
    }
    j
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
    get,
    path = "/v1/sessions/{id}/services",
    operation_id = "list_services",
    tag = "services",
    params(("id" = String, Path, description = "Session or kernel id")),
    responses(
        (status = 200, description = "The services", body = openapi::ServiceList),
        (status = 404, description = "`session-not-found`", body = openapi::ErrorBody),
        (status = 409, description = "`session-not-running`", body = openapi::ErrorBody),
        (status = 502, description = "`agent-unavailable` (transient), `agent-error`", body = openapi::ErrorBody),
        (status = 503, description = "`starting-up` (with `Retry-After`), `store-unavailable`", body = openapi::ErrorBody),
    ),
)]
pub(super) async fn list(s: web::Data<ApiState>, caller: Caller, id: web::Path<String>) -> Res {
    let k = running_kernel(&s, &caller, &id).await?;
    let args = KernelIdArgs {
        kernel_id: k.id.clone(),
    };
    let out = call::<ListServices>(&s, &k, &args, CALL_TIMEOUT).await?;
    let host = agent_host(&s, &k.agent_id).await;
    let services: Vec<serde_json::Value> = out
        .services
        .iter()
        .map(|v| service_json(v, &host))
        .collect();
    Ok(HttpResponse::Ok().json(serde_json::json!({ "services": services })))
}

/// Starts a service (its prestart commands, then its command) and answers once its first
/// container port accepts connections; one already running answers at once.
#[utoipa::path(
    post,
    path = "/v1/sessions/{id}/services/{name}",
    operation_id = "start_service",
    tag = "services",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        ("name" = String, Path, description = "Service name"),
    ),
    responses(
        (status = 200, description = "The service, running; `started`: whether this call started it", body = openapi::ServiceStarted),
        (status = 404, description = "`session-not-found`, `service-not-found`", body = openapi::ErrorBody),
        (status = 409, description = "`session-not-running`, `service-failed` (the error has `output`)", body = openapi::ErrorBody),
        (status = 502, description = "`agent-unavailable` (transient), `agent-error`", body = openapi::ErrorBody),
        (status = 503, description = "`starting-up` (with `Retry-After`), `store-unavailable`", body = openapi::ErrorBody),
    ),
)]
pub(super) async fn start(
    s: web::Data<ApiState>,
    caller: Caller,
    p: web::Path<(String, String)>,
) -> Res {
    let (id, name) = p.into_inner();
    let k = running_kernel(&s, &caller, &id).await?;
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
    let mut j = out
        .service
        .as_ref()
        .map_or(serde_json::Value::Null, |v| service_json(v, &host));
    if let Some(map) = j.as_object_mut() {
        map.insert("started".into(), (out.status == "started").into());
    }
    Ok(HttpResponse::Ok().json(j))
}

/// Stops a service (kills its process tree); stopping a stopped one is not an error.
#[utoipa::path(
    delete,
    path = "/v1/sessions/{id}/services/{name}",
    operation_id = "stop_service",
    tag = "services",
    params(
        ("id" = String, Path, description = "Session or kernel id"),
        ("name" = String, Path, description = "Service name"),
    ),
    responses(
        (status = 200, description = "The service, stopped", body = openapi::Service),
        (status = 404, description = "`session-not-found`, `service-not-found`", body = openapi::ErrorBody),
        (status = 409, description = "`session-not-running`", body = openapi::ErrorBody),
        (status = 502, description = "`agent-unavailable` (transient), `agent-error`", body = openapi::ErrorBody),
        (status = 503, description = "`starting-up` (with `Retry-After`), `store-unavailable`", body = openapi::ErrorBody),
    ),
)]
pub(super) async fn stop(
    s: web::Data<ApiState>,
    caller: Caller,
    p: web::Path<(String, String)>,
) -> Res {
    let (id, name) = p.into_inner();
    let k = running_kernel(&s, &caller, &id).await?;
    let args = ShutdownServiceArgs {
        kernel_id: k.id.clone(),
        service: name,
    };
    let out = call::<ShutdownService>(&s, &k, &args, CALL_TIMEOUT).await?;
    let host = agent_host(&s, &k.agent_id).await;
    let j = service_json(&out.service, &host);
    Ok(HttpResponse::Ok().json(j))
}

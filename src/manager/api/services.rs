//! Service routes: `GET /v1/sessions/{id}/services`, `POST` and `DELETE
//! /v1/sessions/{id}/services/{name}` (the agent's `list_services`, `start_service`,
//! `shutdown_service`).
//!
//! Each service is `{"name", "protocol", "container_ports", "host_ports", "status", "url"}`;
//! `url` is `http://<host>:<first host port>` (`tcp://` for `tcp`) where `<host>` is the agent's
//! `[container] advertised-host`, else the host of its advertised RPC address.

use std::time::Duration;

use actix_web::{web, HttpResponse};
use rmpv::Value;

use super::auth::Caller;
use super::openapi;
use super::{running_kernel, ApiState, Res};
use crate::manager::calls::{agent_error, call_agent, to_json};
use crate::manager::error::ManagerError;
use crate::manager::registry::AgentAddr;
use crate::manager::store::KernelRow;

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
fn service_json(v: &Value, fallback_host: &str) -> serde_json::Value {
    let mut j = to_json(v);
    let host = j
        .get("advertised_host")
        .and_then(|h| h.as_str())
        .map_or_else(|| fallback_host.to_owned(), str::to_owned);
    let scheme = match j.get("protocol").and_then(|p| p.as_str()) {
        Some("tcp") => "tcp",
        _ => "http",
    };
    let url = j
        .get("host_ports")
        .and_then(|p| p.get(0))
        .and_then(|p| p.as_u64())
        .map(|port| format!("{scheme}://{host}:{port}"));
    if let Some(map) = j.as_object_mut() {
        map.remove("advertised_host");
        map.insert("url".into(), url.into());
    }
    j
}

async fn call(
    s: &ApiState,
    k: &KernelRow,
    method: &str,
    args: Vec<Value>,
    timeout: Duration,
) -> Result<Value, crate::manager::error::ManagerError> {
    call_agent(&s.pool, &s.metrics, &k.agent_id, method, args, timeout)
        .await
        .map_err(|e| agent_error(&e))
}

fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
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
    let out = call(
        &s,
        &k,
        "list_services",
        vec![k.id.clone().into()],
        CALL_TIMEOUT,
    )
    .await?;
    let host = agent_host(&s, &k.agent_id).await;
    let services: Vec<serde_json::Value> = field(&out, "services")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|v| service_json(v, &host)).collect())
        .unwrap_or_default();
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
    let args = vec![k.id.clone().into(), name.into(), Value::Map(Vec::new())];
    let out = call(&s, &k, "start_service", args, START_TIMEOUT).await?;
    if field(&out, "status").and_then(Value::as_str) == Some("failed") {
        // Upstream's shape: a failed start is an answer, not a FAILURE.
        let text = |key| {
            field(&out, key)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        return Err(match field(&out, "error_name").and_then(Value::as_str) {
            Some("ServiceNotFound") => ManagerError::ServiceNotFound(text("error")),
            _ => ManagerError::ServiceFailed {
                message: text("error"),
                output: text("output"),
            },
        });
    }
    let host = agent_host(&s, &k.agent_id).await;
    let mut j = field(&out, "service").map_or(serde_json::Value::Null, |v| service_json(v, &host));
    let started = field(&out, "status").and_then(Value::as_str) == Some("started");
    if let Some(map) = j.as_object_mut() {
        map.insert("started".into(), started.into());
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
    let args = vec![k.id.clone().into(), name.into()];
    let out = call(&s, &k, "shutdown_service", args, CALL_TIMEOUT).await?;
    let host = agent_host(&s, &k.agent_id).await;
    let j = field(&out, "service").map_or(serde_json::Value::Null, |v| service_json(v, &host));
    Ok(HttpResponse::Ok().json(j))
}

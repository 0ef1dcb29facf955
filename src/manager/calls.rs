//! Agent calls through the pool, timed and counted (`kernelvisor_manager_agent_rpc_*`).

use std::time::{Duration, Instant};

use actix::Addr;
use rmpv::Value;

use super::error::ManagerError;
use super::metrics::ManagerMetrics;
use super::pool::{AgentCall, AgentCallError, AgentPool};
use crate::rpc::agent_api::{decode_reply, encode_args, Method};

/// Calls `method(*args)` on `agent_id` through `pool`, waiting up to `timeout`.
///
/// Errors: [`AgentCallError`] as the pool gives it; a stopped pool is `Unavailable`.
pub async fn call_agent(
    pool: &Addr<AgentPool>,
    metrics: &ManagerMetrics,
    agent_id: &str,
    method: &str,
    args: Vec<Value>,
    timeout: Duration,
) -> Result<Value, AgentCallError> {
    send_counted(
        pool,
        metrics,
        AgentCall::new(agent_id, method, args, timeout),
    )
    .await
}

/// Sends `call` through `pool`, timed and counted by its method and outcome (`failure`,
/// `connection`, `unavailable`); a stopped pool is `Unavailable`.
async fn send_counted(
    pool: &Addr<AgentPool>,
    metrics: &ManagerMetrics,
    call: AgentCall,
) -> Result<Value, AgentCallError> {
    let started = Instant::now();
    let (agent_id, method) = (call.agent_id.clone(), call.method.clone());
    let res = match pool.send(call).await {
        Ok(r) => r,
        Err(e) => Err(AgentCallError::Unavailable(
            super::pool::AgentConnectionUnavailable {
                agent_id,
                reason: format!("agent pool stopped: {e}"),
            },
        )),
    };
    let kind = match &res {
        Ok(_) => None,
        Err(e @ AgentCallError::Call { .. }) if e.failure().is_some() => Some("failure"),
        Err(AgentCallError::Call { .. }) => Some("connection"),
        Err(AgentCallError::Unavailable(_)) => Some("unavailable"),
    };
    metrics.agent_call(&method, started.elapsed(), kind);
    res
}

/// An agent's answer as the user-facing error: its FAILURE names mapped to the manager's codes
/// (`docs/manager-api.md`), anything else `agent-error`; no answer at all is `agent-unavailable`.
pub fn agent_error(e: &AgentCallError) -> ManagerError {
    match e.failure() {
        Some(meta) => failure_error(meta),
        None => ManagerError::AgentUnavailable(e.to_string()),
    }
}

/// A FAILURE the agent answered (or reported, as a background task's or a pull's outcome) as
/// the user-facing error of its name; an unknown name is `agent-error`.
pub fn failure_error(meta: &crate::rpc::ErrorMeta) -> ManagerError {
    use crate::rpc::Failure as F;
    let repr = || meta.repr.clone();
    match meta.known() {
        Some(F::ImageNotFound) => ManagerError::ImageNotFound(repr()),
        Some(F::RegistryUnreachable) => ManagerError::RegistryUnreachable(repr()),
        Some(F::RegistryAuthFailed) => ManagerError::RegistryAuthFailed(repr()),
        Some(F::ImagePullTimeout) => ManagerError::ImagePullTimeout(repr()),
        Some(F::InvalidKernelConfig | F::TypeError) => ManagerError::InvalidRequest(repr()),
        Some(F::ResourceExhausted) => ManagerError::NoCapacity(repr()),
        Some(F::KernelNotRunning) => ManagerError::AgentError(repr()),
        Some(F::RunNotFound) => ManagerError::RunNotFound(repr()),
        Some(F::RunHasNoStdin) => ManagerError::RunHasNoStdin(repr()),
        Some(F::RunExists | F::RunStdinClosed | F::RunHasNoTty | F::UnsupportedExecutionMode) => {
            ManagerError::InvalidRequest(repr())
        }
        Some(F::LogsNotFound) => ManagerError::LogsNotFound(repr()),
        // The agent answers but its Docker engine does not: transient, like a lost agent.
        Some(F::ContainerEngineUnavailable) => {
            ManagerError::AgentUnavailable(format!("container engine: {}", meta.repr))
        }
        Some(F::ServiceNotFound) => ManagerError::ServiceNotFound(repr()),
        Some(F::ServiceStartFailed) => ManagerError::ServiceFailed {
            message: repr(),
            output: meta.traceback.clone(),
        },
        Some(F::InvalidPath) => ManagerError::InvalidPath(repr()),
        Some(F::FileNotFound) => ManagerError::FileNotFound(repr()),
        Some(F::FileTooLarge | F::UploadSizeMismatch | F::TransferNotFound) => {
            ManagerError::InvalidRequest(repr())
        }
        // Every other name, this build's or a newer agent's: shown with its name.
        _ => ManagerError::AgentError(format!("{}: {}", meta.name, meta.repr)),
    }
}

/// msgpack → JSON for API answers: maps with non-string keys get their keys as text, binary
/// becomes a lossy UTF-8 string, extension types their debug text.
pub fn to_json(v: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match v {
        Value::Nil => J::Null,
        Value::Boolean(b) => J::Bool(*b),
        Value::Integer(i) => i
            .as_i64()
            .map(J::from)
            .or_else(|| i.as_u64().map(J::from))
            .unwrap_or(J::Null),
        Value::F32(f) => serde_json::Number::from_f64(f64::from(*f)).map_or(J::Null, J::Number),
        Value::F64(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        Value::String(s) => J::String(
            s.as_str()
                .map(str::to_owned)
                .unwrap_or_else(|| String::from_utf8_lossy(s.as_bytes()).into_owned()),
        ),
        Value::Binary(b) => J::String(String::from_utf8_lossy(b).into_owned()),
        Value::Array(a) => J::Array(a.iter().map(to_json).collect()),
        Value::Map(m) => J::Object(
            m.iter()
                .map(|(k, v)| {
                    (
                        k.as_str()
                            .map(str::to_owned)
                            .unwrap_or_else(|| k.to_string()),
                        to_json(v),
                    )
                })
                .collect(),
        ),
        Value::Ext(t, _) => J::String(format!("<ext {t}>")),
    }
}

/// Calls a typed method of the agent contract ([`crate::rpc::agent_api`]): `args` go out
/// positional in upstream's order, the reply is decoded into `M::Reply`.
///
/// Errors: as [`call_agent`]; a reply that does not decode reads as a FAILURE named
/// `InvalidReply` naming the field (shown to users as `agent-error`).
pub async fn call_method<M: Method>(
    pool: &Addr<AgentPool>,
    metrics: &ManagerMetrics,
    agent_id: &str,
    args: &M::Args,
    timeout: Duration,
) -> Result<M::Reply, AgentCallError> {
    call_encoded::<M>(pool, metrics, agent_id, encode_args::<M>(args), timeout).await
}

/// As [`call_method`] for a method with keyword-only parameters (upstream's `commit`:
/// `canonical`, `filename`, `extra_labels` after a `*`): see
/// [`encode_args_with_kwargs`](crate::rpc::agent_api::encode_args_with_kwargs).
///
/// Errors: as [`call_method`].
pub async fn call_method_kw<M: Method>(
    pool: &Addr<AgentPool>,
    metrics: &ManagerMetrics,
    agent_id: &str,
    args: &M::Args,
    timeout: Duration,
) -> Result<M::Reply, AgentCallError> {
    let call = crate::rpc::agent_api::encode_args_with_kwargs::<M>(args);
    call_encoded::<M>(pool, metrics, agent_id, call, timeout).await
}

/// Sends an encoded call of `M` and decodes its reply (one that does not decode: FAILURE
/// `InvalidReply`).
async fn call_encoded<M: Method>(
    pool: &Addr<AgentPool>,
    metrics: &ManagerMetrics,
    agent_id: &str,
    call: crate::rpc::Call,
    timeout: Duration,
) -> Result<M::Reply, AgentCallError> {
    let call = AgentCall {
        agent_id: agent_id.to_owned(),
        method: M::NAME.to_owned(),
        args: call.args,
        kwargs: call.kwargs,
        timeout,
    };
    let reply = send_counted(pool, metrics, call).await?;
    decode_reply::<M>(reply).map_err(|e| AgentCallError::Call {
        agent_id: agent_id.to_owned(),
        source: crate::rpc::CallError::Failure(crate::rpc::ErrorMeta::failure(
            crate::rpc::Failure::InvalidReply,
            e.to_string(),
        )),
    })
}

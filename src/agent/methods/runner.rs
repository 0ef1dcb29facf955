//! The workload methods for a kernel Backend.AI's kernel runner serves
//! (`crate::agent::runner`), answering as upstream's agent does (`AbstractCodeRunner`,
//! `src/ai/backend/agent/kernel.py`): `execute` in `query`, `batch`, `input` and `continue`,
//! `interrupt_kernel`, `get_completions`, `trigger_batch_execution`, and the services.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rmpv::Value;
use serde_json::Value as Json;

use crate::agent::context::AgentContext;
use crate::agent::events::AgentEvent;
use crate::agent::kernel::KernelInfo;
use crate::agent::runner::protocol::ToRunner;
use crate::agent::runner::{RunnerAnswer, RunnerClient, RunnerError, RunnerPorts};
use crate::rpc::agent_api::exec as exec_api;
use crate::rpc::{ErrorMeta, Failure};

/// A runner error as a FAILURE.
pub fn runner_err(e: RunnerError) -> ErrorMeta {
    let name = match &e {
        RunnerError::RunNotFound(_) => Failure::RunNotFound,
        RunnerError::RunExists(_) => Failure::RunExists,
        RunnerError::NoReply { .. } | RunnerError::Socket(_) | RunnerError::Closed => {
            Failure::KernelRunnerUnresponsive
        }
    };
    ErrorMeta::new(name, e.to_string())
}

/// The client of kernel `info`'s runner, whose ports are `ports`.
pub fn client(
    ctx: &AgentContext,
    info: &KernelInfo,
    ports: RunnerPorts,
) -> Result<Arc<RunnerClient>, ErrorMeta> {
    ctx.runners.client(&info.id, ports).map_err(runner_err)
}

/// One `execute` call on a runner kernel.
pub struct RunnerExecute<'a> {
    /// The kernel.
    pub info: &'a KernelInfo,
    /// Its runner's ports.
    pub ports: RunnerPorts,
    /// The caller's run id (a fresh one for a query without).
    pub run_id: Option<String>,
    /// `query`, `batch`, `input` or `continue`.
    pub mode: &'a str,
    /// Code (query), the line (input).
    pub code: String,
    /// `clean`/`build`/`exec` for batch.
    pub batch: [String; 3],
    /// `opts.timeout`: the agent interrupts the run then (`exec-timeout`).
    pub timeout: Option<Duration>,
    /// `flush_timeout` (`None`: answer only at the end, the input prompt or a full buffer).
    pub flush: Option<Duration>,
}

/// `execute` through the runner: starts (query/batch, after the kernel's previous run) or
/// feeds (input) the run, then its next answer; `execution_started`/`_finished`/`_timeout`
/// events around it.
///
/// Errors: `RunNotFound`, `RunExists`, `KernelRunnerUnresponsive`, `UnsupportedExecutionMode`.
pub async fn execute(
    ctx: &AgentContext,
    call: RunnerExecute<'_>,
) -> Result<exec_api::ExecuteResult, ErrorMeta> {
    let client = client(ctx, call.info, call.ports)?;
    let need_id = || {
        call.run_id.clone().ok_or_else(|| {
            super::args::type_error(format!("mode '{}' needs a 'run_id'", call.mode))
        })
    };
    let run_id = match call.mode {
        "query" | "batch" => {
            let run_id = call
                .run_id
                .clone()
                .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string());
            let ops = if call.mode == "query" {
                vec![ToRunner::Code(call.code.clone())]
            } else {
                let [clean, build, exec] = call.batch.clone();
                vec![
                    ToRunner::Clean(clean),
                    ToRunner::Build(build),
                    ToRunner::Exec(exec),
                ]
            };
            client
                .start(&run_id, ops, call.timeout)
                .await
                .map_err(runner_err)?;
            ctx.events.emit(AgentEvent::ExecutionStarted {
                kernel_id: call.info.id.clone(),
                session_id: call.info.session_id.clone(),
                run_id: run_id.clone(),
            });
            run_id
        }
        "input" => {
            let run_id = need_id()?;
            client
                .input(&run_id, &call.code)
                .await
                .map_err(runner_err)?;
            run_id
        }
        "continue" => need_id()?,
        other => {
            return Err(ErrorMeta::failure(
                Failure::UnsupportedExecutionMode,
                format!("mode '{other}' is not supported (query, batch, continue, input)"),
            ))
        }
    };
    let answer = client
        .answer(&run_id, call.flush)
        .await
        .map_err(runner_err)?;
    emit_end(ctx, call.info, &answer);
    let mut result = result(answer);
    if call.info.runner_repl_off
        && result.status == "finished"
        && result.exit_code == Some(QUERY_MODE_OFF)
        && result.console.is_empty()
    {
        result
            .console
            .push(("stderr".to_owned(), Value::from(QUERY_MODE_OFF_SAID)));
    }
    Ok(result)
}

/// The exit code of every query once upstream's runner turned query mode off (`query`,
/// `src/ai/backend/kernel/base.py`), with no output: a user's `sys.exit(127)` prints a
/// traceback, so an empty console tells the two apart.
const QUERY_MODE_OFF: i64 = 127;

/// What a query in a kernel whose REPL never started gets on its stderr, rather than a bare
/// 127 (upstream's agent answers the bare 127).
const QUERY_MODE_OFF_SAID: &str = "kernelvisor: query mode is off in this kernel: its Python REPL \
did not start within the kernel runner's 10 s, on either of two boots (the node may be \
overloaded; the agent's log says more). Batch mode, the terminal and ssh work; restart the \
session to try again.\n";

fn emit_end(ctx: &AgentContext, info: &KernelInfo, answer: &RunnerAnswer) {
    let (kernel_id, session_id, run_id) = (
        info.id.clone(),
        info.session_id.clone(),
        answer.run_id.clone(),
    );
    match answer.status {
        "finished" => ctx.events.emit(AgentEvent::ExecutionFinished {
            kernel_id,
            session_id,
            run_id,
            exit_code: answer.exit_code,
        }),
        "exec-timeout" => ctx.events.emit(AgentEvent::ExecutionTimeout {
            kernel_id,
            session_id,
            run_id,
        }),
        _ => {}
    }
}

/// The wire result of a runner answer.
fn result(a: RunnerAnswer) -> exec_api::ExecuteResult {
    exec_api::ExecuteResult {
        run_id: a.run_id,
        status: a.status.to_owned(),
        console: a
            .console
            .into_iter()
            .map(|(kind, v)| (kind, crate::rpc::agent_api::to_value(&v)))
            .collect(),
        exit_code: a.exit_code,
        options: a
            .options
            .map(|o| match crate::rpc::agent_api::to_value(&o) {
                Value::Map(m) => m
                    .into_iter()
                    .filter_map(|(k, v)| k.as_str().map(|k| (k.to_owned(), v)))
                    .collect(),
                _ => BTreeMap::new(),
            }),
    }
}

/// `interrupt_kernel` on a runner kernel: the runner's `interrupt` (SIGINT to the batch
/// child, else the Jupyter kernel's interrupt): the REPL and its state stay.
///
/// Errors: `KernelRunnerUnresponsive`.
pub async fn interrupt(
    ctx: &AgentContext,
    info: &KernelInfo,
    ports: RunnerPorts,
) -> Result<(), ErrorMeta> {
    client(ctx, info, ports)?
        .send(ToRunner::Interrupt)
        .await
        .map_err(runner_err)
}

/// `get_completions` on a runner kernel: the runner's `complete` with `{"code": text, ..opts}`
/// → `{"status": "finished", "error": nil, "suggestions": [...]}`.
///
/// Errors: `KernelRunnerUnresponsive`.
pub async fn complete(
    ctx: &AgentContext,
    info: &KernelInfo,
    ports: RunnerPorts,
    text: &str,
    opts: Json,
) -> Result<exec_api::CodeCompletionResult, ErrorMeta> {
    let mut payload = match opts {
        Json::Object(o) => o,
        _ => Default::default(),
    };
    payload.insert("code".into(), Json::String(text.to_owned()));
    let reply = client(ctx, info, ports)?
        .complete(Json::Object(payload))
        .await
        .map_err(runner_err)?;
    let suggestions = reply
        .get("suggestions")
        .and_then(Json::as_array)
        .map(|a| {
            a.iter()
                .map(|s| s.as_str().map_or_else(|| s.to_string(), str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    Ok(exec_api::CodeCompletionResult {
        status: "finished".into(),
        error: None,
        suggestions,
    })
}

/// How often a batch job's driver asks for more output (each answer drains the buffer).
const BATCH_FLUSH: Duration = Duration::from_secs(5);

/// `trigger_batch_execution` on a runner kernel, as upstream's `execute_batch`: run id
/// `batch-job`, `batch` with `{exec: code}`, `continue` until `finished` (exit 0 →
/// `session_success`, else `session_failure`) or `exec-timeout` (`task-timeout`).
///
/// Errors: `RunExists`, `KernelRunnerUnresponsive`.
pub async fn trigger_batch(
    ctx: &Arc<AgentContext>,
    info: &KernelInfo,
    ports: RunnerPorts,
    code: String,
    timeout: Option<Duration>,
) -> Result<(), ErrorMeta> {
    let client = client(ctx, info, ports)?;
    let run_id = "batch-job".to_owned();
    client
        .start(
            &run_id,
            vec![
                ToRunner::Clean(String::new()),
                ToRunner::Build(String::new()),
                ToRunner::Exec(code),
            ],
            timeout,
        )
        .await
        .map_err(runner_err)?;
    let (c, kernel_id, session_id) = (ctx.clone(), info.id.clone(), info.session_id.clone());
    actix::spawn(async move {
        let end = loop {
            match client.answer(&run_id, Some(BATCH_FLUSH)).await {
                Ok(a) if matches!(a.status, "finished" | "exec-timeout") => break Ok(a),
                Ok(_) => {}
                Err(e) => break Err(e),
            }
        };
        let event = match end {
            Ok(a) if a.status == "finished" && a.exit_code == Some(0) => {
                AgentEvent::SessionSuccess {
                    kernel_id,
                    session_id,
                    exit_code: Some(0),
                }
            }
            Ok(a) => AgentEvent::SessionFailure {
                kernel_id,
                session_id,
                reason: if a.status == "exec-timeout" {
                    "task-timeout".into()
                } else {
                    "task-failed".into()
                },
                exit_code: a.exit_code,
            },
            Err(_) => AgentEvent::SessionFailure {
                kernel_id,
                session_id,
                reason: "task-failed".into(),
                exit_code: None,
            },
        };
        c.events.emit(event);
    });
    Ok(())
}

/// `start_service` on a runner kernel, as upstream's `DockerKernel.start_service`: the service
/// port must exist, then the runner's `start-service` `{"name", "port": its first container
/// port, "ports", "protocol", "options"}`; its `{"status", "error"?}` is the answer's.
///
/// Errors: `KernelRunnerUnresponsive` (no reply within 35 s).
pub async fn start_service(
    ctx: &AgentContext,
    info: &KernelInfo,
    ports: RunnerPorts,
    service: &str,
    opts: Option<&BTreeMap<String, Value>>,
) -> Result<(String, Option<String>), ErrorMeta> {
    let Some(sp) = info.service_ports.iter().find(|s| s.name == service) else {
        return Ok((
            "failed".into(),
            Some(format!(
                "kernel {} has no service port `{service}`",
                info.id
            )),
        ));
    };
    let options = opts
        .map(|o| serde_json::to_value(o).unwrap_or_default())
        .unwrap_or_else(|| Json::Object(Default::default()));
    let reply = client(ctx, info, ports)?
        .start_service(serde_json::json!({
            "name": service,
            "port": sp.container_ports.first(),
            "ports": sp.container_ports,
            "protocol": sp.protocol,
            "options": options,
        }))
        .await
        .map_err(runner_err)?;
    let status = reply
        .get("status")
        .and_then(Json::as_str)
        .unwrap_or("failed")
        .to_owned();
    let error = reply
        .get("error")
        .filter(|e| !e.is_null())
        .map(|e| e.as_str().map_or_else(|| e.to_string(), str::to_owned));
    Ok((status, error))
}

/// How long `shutdown_service` waits for a runner-started service's port to close.
const SERVICE_STOP_WAIT: Duration = Duration::from_secs(10);

/// `shutdown_service` on a runner kernel: the runner's `shutdown-service` (no reply: it stops
/// the process in the background), then up to [`SERVICE_STOP_WAIT`] for the service's first
/// host port to stop answering, so that `stopped` is true when the caller hears it.
///
/// Errors: `KernelRunnerUnresponsive`.
pub async fn shutdown_service(
    ctx: &AgentContext,
    info: &KernelInfo,
    ports: RunnerPorts,
    service: &str,
) -> Result<(), ErrorMeta> {
    client(ctx, info, ports)?
        .send(ToRunner::ShutdownService(service.to_owned()))
        .await
        .map_err(runner_err)?;
    let Some(port) = info
        .service_ports
        .iter()
        .find(|s| s.name == service)
        .and_then(|s| s.host_ports.first().copied())
    else {
        return Ok(());
    };
    let host = match ctx.config.container.bind_host.as_str() {
        "0.0.0.0" | "::" | "" => "127.0.0.1".to_owned(),
        h => h.to_owned(),
    };
    let deadline = tokio::time::Instant::now() + SERVICE_STOP_WAIT;
    while tokio::time::Instant::now() < deadline && serves(&host, port).await {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Whether something answers on `host:port`: a connection that stays open for a moment. (The
/// engine's proxy accepts on a published port whatever the container does, and closes at once
/// when nothing listens behind it.)
async fn serves(host: &str, port: u16) -> bool {
    use tokio::io::AsyncReadExt;
    let Ok(Ok(mut s)) = tokio::time::timeout(
        Duration::from_secs(1),
        tokio::net::TcpStream::connect((host, port)),
    )
    .await
    else {
        return false;
    };
    let mut buf = [0u8; 1];
    !matches!(
        tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

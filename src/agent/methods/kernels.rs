//! The kernel lifecycle methods, with callosum names and Backend.AI's positional arguments:
//! `create_kernels`, `destroy_kernel`, `restart_kernel`, `interrupt_kernel`, `execute`,
//! `get_logs`, `check_running`, `ping_kernel`, `sync_kernel_registry`, `reset_agent`
//! (alias `reset_instance`), and `resource_usage`.
//!
//! Typed errors cross the wire as FAILURE with stable names: `KernelNotFound`,
//! `ResourceExhausted`, `ImageNotFound`, `InvalidKernelConfig`, `KernelNotRunning`,
//! `ContainerEngineError`, `UnsupportedExecutionMode`.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use rmpv::Value;

use crate::agent::context::AgentContext;
use crate::agent::events::AgentEvent;
use crate::agent::kernel::{KernelConfig, KernelError, KernelInfo, KernelStatus};
use crate::agent::registry::{CreateKernels, DestroyKernel, GetKernel, KernelRegistry, ListKernels, Reconcile, ResetAgent, RestartKernel};
use crate::rpc::{Call, Dispatcher, ErrorMeta};

type Res = Result<Value, ErrorMeta>;

fn type_error(msg: String) -> ErrorMeta {
    ErrorMeta::new("TypeError", msg)
}

/// Argument `i` named `name` (positional or keyword), required.
fn arg<'a>(call: &'a Call, i: usize, name: &str) -> Result<&'a Value, ErrorMeta> {
    call.arg(i, name).filter(|v| !v.is_nil()).ok_or_else(|| type_error(format!("missing required argument: '{name}'")))
}

fn str_arg(call: &Call, i: usize, name: &str) -> Result<String, ErrorMeta> {
    arg(call, i, name)?.as_str().map(str::to_owned).ok_or_else(|| type_error(format!("argument '{name}' must be a string")))
}

fn mailbox(e: actix::MailboxError) -> ErrorMeta {
    ErrorMeta::new("AgentShuttingDown", e.to_string())
}

/// The kernel's facts, or FAILURE `KernelNotFound`.
async fn lookup(registry: &Addr<KernelRegistry>, kernel_id: &str) -> Result<KernelInfo, ErrorMeta> {
    registry.send(GetKernel(kernel_id.to_owned())).await.map_err(mailbox)?.ok_or_else(|| KernelError::NotFound(kernel_id.to_owned()).to_meta())
}

/// The facts of a `RUNNING` kernel with a container, or FAILURE `KernelNotFound` /
/// `KernelNotRunning`.
async fn running(registry: &Addr<KernelRegistry>, kernel_id: &str) -> Result<KernelInfo, ErrorMeta> {
    let info = lookup(registry, kernel_id).await?;
    match (&info.container_id, info.status) {
        (Some(_), KernelStatus::Running) => Ok(info),
        _ => Err(KernelError::NotRunning(kernel_id.to_owned(), info.status.as_str()).to_meta()),
    }
}

/// Registers the kernel methods on `dispatcher`.
pub fn register(dispatcher: &mut Dispatcher, ctx: Arc<AgentContext>, registry: Addr<KernelRegistry>) {
    let agent_id = ctx.agent_id.clone();

    // create_kernels(session_id, kernel_ids, configs) → [kernel info]
    let (r, a) = (registry.clone(), agent_id.clone());
    dispatcher.register("create_kernels", move |call| {
        let (r, a) = (r.clone(), a.clone());
        async move {
            let session_id = str_arg(&call, 0, "session_id")?;
            let ids = arg(&call, 1, "kernel_ids")?.as_array().ok_or_else(|| type_error("'kernel_ids' must be a list".into()))?;
            let configs = arg(&call, 2, "configs")?.as_array().ok_or_else(|| type_error("'configs' must be a list".into()))?;
            if ids.len() != configs.len() || ids.is_empty() {
                return Err(KernelError::InvalidConfig(format!("{} kernel ids for {} configs", ids.len(), configs.len())).to_meta());
            }
            let mut kernels = Vec::new();
            for (id, config) in ids.iter().zip(configs) {
                let id = id.as_str().ok_or_else(|| type_error("kernel ids must be strings".into()))?.to_owned();
                let config = KernelConfig::from_value(config).map_err(|e| match e {
                    KernelError::InvalidConfig(m) => KernelError::InvalidConfig(format!("kernel {id}: {m}")).to_meta(),
                    other => other.to_meta(),
                })?;
                kernels.push((id, config));
            }
            let infos = r.send(CreateKernels { session_id, kernels }).await.map_err(mailbox)?.map_err(|e| e.to_meta())?;
            Ok(Value::Array(infos.iter().map(|i| i.to_value(&a)).collect()))
        }
    });

    // destroy_kernel(kernel_id, session_id, reason=None, suppress_events=False) → None
    let r = registry.clone();
    dispatcher.register("destroy_kernel", move |call| {
        let r = r.clone();
        async move {
            let kernel_id = str_arg(&call, 0, "kernel_id")?;
            let reason = call.arg(2, "reason").and_then(Value::as_str).unwrap_or("user-requested").to_owned();
            let suppress_events = call.arg(3, "suppress_events").and_then(Value::as_bool).unwrap_or(false);
            r.send(DestroyKernel { kernel_id, reason, suppress_events }).await.map_err(mailbox)?.map_err(|e| e.to_meta())?;
            Ok(Value::Nil)
        }
    });

    // restart_kernel(session_id, kernel_id, …) → kernel info
    let (r, a) = (registry.clone(), agent_id.clone());
    dispatcher.register("restart_kernel", move |call| {
        let (r, a) = (r.clone(), a.clone());
        async move {
            let kernel_id = str_arg(&call, 1, "kernel_id")?;
            let info = r.send(RestartKernel(kernel_id)).await.map_err(mailbox)?.map_err(|e| e.to_meta())?;
            Ok(info.to_value(&a))
        }
    });

    // interrupt_kernel(kernel_id) → None: SIGINT to the container's main process.
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("interrupt_kernel", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            let info = running(&r, &str_arg(&call, 0, "kernel_id")?).await?;
            c.backend.signal_container(info.container_id.as_deref().unwrap_or_default(), "SIGINT").await.map_err(|e| KernelError::from(e).to_meta())?;
            Ok(Value::Nil)
        }
    });

    // execute(session_id, kernel_id, api_version, run_id, mode, code, opts, flush_timeout)
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("execute", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move { execute(&c, &r, &call).await }
    });

    // get_logs(kernel_id) → {"logs": text}
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("get_logs", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            let kernel_id = str_arg(&call, 0, "kernel_id")?;
            let info = lookup(&r, &kernel_id).await?;
            let container_id = info.container_id.ok_or_else(|| KernelError::NotRunning(kernel_id, info.status.as_str()).to_meta())?;
            let logs = c.backend.logs(&container_id).await.map_err(|e| KernelError::from(e).to_meta())?;
            Ok(Value::Map(vec![("logs".into(), logs.into())]))
        }
    });

    // check_running(kernel_id) → bool: the kernel is RUNNING and so is its container.
    // ping_kernel(kernel_id) → bool: the same question, Backend.AI's other name for it.
    for method in ["check_running", "ping_kernel"] {
        let (r, c) = (registry.clone(), ctx.clone());
        dispatcher.register(method, move |call| {
            let (r, c) = (r.clone(), c.clone());
            async move {
                let info = lookup(&r, &str_arg(&call, 0, "kernel_id")?).await?;
                let running = match (info.status, &info.container_id) {
                    (KernelStatus::Running, Some(id)) => c.backend.inspect_container(id).await.map_err(|e| KernelError::from(e).to_meta())?.is_some_and(|s| s.running),
                    _ => false,
                };
                Ok(running.into())
            }
        });
    }

    // sync_kernel_registry(kernel_session_ids) → {"kernels": [kernel info]}
    let (r, c, a) = (registry.clone(), ctx.clone(), agent_id.clone());
    dispatcher.register("sync_kernel_registry", move |call| {
        let (r, c, a) = (r.clone(), c.clone(), a.clone());
        async move {
            // Kernels the manager believes live here but this agent does not hold: tell it.
            let pairs = call.arg(0, "kernel_session_ids").and_then(Value::as_array).cloned().unwrap_or_default();
            let ours = r.send(ListKernels).await.map_err(mailbox)?;
            for pair in pairs {
                let (kernel_id, session_id) = match &pair {
                    Value::Array(p) if p.len() == 2 => (p[0].as_str().unwrap_or_default().to_owned(), p[1].as_str().unwrap_or_default().to_owned()),
                    Value::String(_) => (pair.as_str().unwrap_or_default().to_owned(), String::new()),
                    _ => continue,
                };
                if !ours.iter().any(|k| k.id == kernel_id) {
                    c.events.emit(AgentEvent::KernelTerminated { kernel_id, session_id, reason: "not-found-in-agent".into(), exit_code: None });
                }
            }
            r.do_send(Reconcile);
            Ok(Value::Map(vec![("kernels".into(), Value::Array(ours.iter().map(|k| k.to_value(&a)).collect()))]))
        }
    });

    // reset_agent() → {"destroyed": n}: every kernel destroyed, no termination events.
    let r = registry.clone();
    dispatcher.register("reset_agent", move |_| {
        let r = r.clone();
        async move {
            let n = r.send(ResetAgent).await.map_err(mailbox)?;
            Ok(Value::Map(vec![("destroyed".into(), (n as u64).into())]))
        }
    });
    dispatcher.alias("reset_instance", "reset_agent");

    // resource_usage() → {"total", "occupied", "available": slots; "free_host_ports": int}
    let c = ctx.clone();
    dispatcher.register("resource_usage", move |_| {
        let c = c.clone();
        async move {
            let (total, used, available) = {
                let s = c.slots.lock().expect("slots lock");
                (s.capacity(), s.used(), s.available())
            };
            let free_ports = c.ports.lock().expect("ports lock").available();
            Ok(Value::Map(vec![
                ("total".into(), total.to_value()),
                ("occupied".into(), used.to_value()),
                ("available".into(), available.to_value()),
                ("free_host_ports".into(), (free_ports as u64).into()),
            ]))
        }
    });
}

/// `execute`: modes `query` and `batch` run `code` through Docker exec with the image's
/// interpreter (`ai.backend.runtime-path -c code`, else `sh -c code`); `opts.timeout`
/// (seconds) kills it when exceeded (status `exec-timeout`, `exitCode` nil).
async fn execute(ctx: &AgentContext, registry: &Addr<KernelRegistry>, call: &Call) -> Res {
    let kernel_id = str_arg(call, 1, "kernel_id")?;
    let run_id = call.arg(3, "run_id").cloned().unwrap_or(Value::Nil);
    let mode = str_arg(call, 4, "mode")?;
    let code = str_arg(call, 5, "code")?;
    if mode != "query" && mode != "batch" {
        return Err(ErrorMeta::new("UnsupportedExecutionMode", format!("mode '{mode}' is not supported (query, batch)")));
    }
    let timeout = call
        .arg(6, "opts")
        .and_then(Value::as_map)
        .and_then(|o| o.iter().find(|(k, _)| k.as_str() == Some("timeout")))
        .and_then(|(_, v)| v.as_f64().or_else(|| v.as_u64().map(|n| n as f64)))
        .filter(|t| t.is_finite() && *t > 0.0)
        .map(Duration::from_secs_f64);
    let info = running(registry, &kernel_id).await?;
    let interpreter = info.runtime_path.clone().unwrap_or_else(|| "sh".into());
    let out = ctx
        .backend
        .exec(info.container_id.as_deref().unwrap_or_default(), vec![interpreter, "-c".into(), code], timeout)
        .await
        .map_err(|e| KernelError::from(e).to_meta())?;
    let console = out.console.into_iter().map(|(stream, text)| Value::Array(vec![stream.into(), text.into()])).collect();
    Ok(Value::Map(vec![
        ("status".into(), if out.exit_code.is_some() { "finished" } else { "exec-timeout" }.into()),
        ("runId".into(), run_id),
        ("exitCode".into(), out.exit_code.map_or(Value::Nil, Value::from)),
        ("console".into(), Value::Array(console)),
        ("options".into(), Value::Map(vec![])),
    ]))
}

//! The kernel lifecycle methods, with callosum names and Backend.AI's positional arguments:
//! `create_kernels`, `destroy_kernel`, `restart_kernel`, `interrupt_kernel`, `execute`,
//! `get_kernel`, `get_logs`, `check_running`, `ping_kernel`, `sync_kernel_registry`, `reset_agent`
//! (alias `reset_instance`), `resource_usage` and `scan_gpu_alloc_map`.
//!
//! Typed errors cross the wire as FAILURE with stable names: `KernelNotFound`,
//! `ResourceExhausted`, `ImageNotFound`, `InvalidKernelConfig`, `KernelNotRunning`,
//! `ContainerEngineError`, `ContainerEngineUnavailable` (the engine is down or restarting:
//! refused at once while the agent knows it is down, see [`crate::agent::engine`]),
//! `UnsupportedExecutionMode`, and for runs `RunNotFound`,
//! `RunHasNoStdin`, `RunExists`, `RunStdinClosed`; `LogsNotFound` for `get_logs`.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use rmpv::Value;

use super::args::{arg, lookup, mailbox, running, str_arg, type_error};
use crate::agent::backend::{BackendError, ENGINE_UNAVAILABLE};
use crate::agent::context::AgentContext;
use crate::agent::engine::probe;
use crate::agent::events::AgentEvent;
use crate::agent::exec::{RunError, RunIds, RunRequest};
use crate::agent::kernel::{KernelConfig, KernelError, KernelStatus};
use crate::agent::logs::LogChunk;
use crate::agent::registry::{
    CreateKernels, DestroyKernel, KernelRegistry, ListKernels, Reconcile, ResetAgent, RestartKernel,
};
use crate::rpc::{Call, Dispatcher, ErrorMeta};

type Res = Result<Value, ErrorMeta>;

/// Registers the kernel methods on `dispatcher`.
pub fn register(
    dispatcher: &mut Dispatcher,
    ctx: Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
) {
    let agent_id = ctx.agent_id.clone();

    // create_kernels(session_id, kernel_ids, configs) → [kernel info]
    let (r, a, c) = (registry.clone(), agent_id.clone(), ctx.clone());
    dispatcher.register("create_kernels", move |call| {
        let (r, a, c) = (r.clone(), a.clone(), c.clone());
        async move {
            let session_id = str_arg(&call, 0, "session_id")?;
            let ids = arg(&call, 1, "kernel_ids")?
                .as_array()
                .ok_or_else(|| type_error("'kernel_ids' must be a list".into()))?;
            let configs = arg(&call, 2, "configs")?
                .as_array()
                .ok_or_else(|| type_error("'configs' must be a list".into()))?;
            if ids.len() != configs.len() || ids.is_empty() {
                return Err(KernelError::InvalidConfig(format!(
                    "{} kernel ids for {} configs",
                    ids.len(),
                    configs.len()
                ))
                .to_meta());
            }
            let mut kernels = Vec::new();
            let types = c.slots.lock().expect("slots lock").slot_types().clone();
            for (id, config) in ids.iter().zip(configs) {
                let id = id
                    .as_str()
                    .ok_or_else(|| type_error("kernel ids must be strings".into()))?
                    .to_owned();
                let config = KernelConfig::from_value(config, &types).map_err(|e| match e {
                    KernelError::InvalidConfig(m) => {
                        KernelError::InvalidConfig(format!("kernel {id}: {m}")).to_meta()
                    }
                    other => other.to_meta(),
                })?;
                kernels.push((id, config));
            }
            // Refused at once while the engine is down, and within a probe's timeout when it
            // hangs without the watcher having noticed yet: nothing is reserved or recorded.
            if c.engine.is_up() {
                probe(&*c.backend, &c.engine).await;
            }
            c.engine.check()?;
            let infos = r
                .send(CreateKernels {
                    session_id,
                    kernels,
                })
                .await
                .map_err(mailbox)?
                .map_err(|e| kernel_err(&c, e))?;
            Ok(Value::Array(infos.iter().map(|i| i.to_value(&a)).collect()))
        }
    });

    // destroy_kernel(kernel_id, session_id, reason=None, suppress_events=False) → None
    // Refused while the engine is down (the kernel stays as it is, to be destroyed later):
    // a teardown now would leave its container behind.
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("destroy_kernel", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            let kernel_id = str_arg(&call, 0, "kernel_id")?;
            c.engine.check()?;
            let reason = call
                .arg(2, "reason")
                .and_then(Value::as_str)
                .unwrap_or("user-requested")
                .to_owned();
            let suppress_events = call
                .arg(3, "suppress_events")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            r.send(DestroyKernel {
                kernel_id,
                reason,
                suppress_events,
            })
            .await
            .map_err(mailbox)?
            .map_err(|e| e.to_meta())?;
            Ok(Value::Nil)
        }
    });

    // restart_kernel(session_id, kernel_id, …) → kernel info
    let (r, a, c) = (registry.clone(), agent_id.clone(), ctx.clone());
    dispatcher.register("restart_kernel", move |call| {
        let (r, a, c) = (r.clone(), a.clone(), c.clone());
        async move {
            let kernel_id = str_arg(&call, 1, "kernel_id")?;
            c.engine.check()?;
            let info = r
                .send(RestartKernel(kernel_id))
                .await
                .map_err(mailbox)?
                .map_err(|e| kernel_err(&c, e))?;
            Ok(info.to_value(&a))
        }
    });

    // get_kernel(kernel_id) → the kernel's info map, with its restart count and its stages
    // (`[{name, status, restarts, setup_seconds}]`, in order).
    let (r, a) = (registry.clone(), agent_id.clone());
    dispatcher.register("get_kernel", move |call| {
        let (r, a) = (r.clone(), a.clone());
        async move {
            let info = lookup(&r, &str_arg(&call, 0, "kernel_id")?).await?;
            Ok(info.to_value(&a))
        }
    });

    // interrupt_kernel(kernel_id) → None: SIGINT to the container's main process.
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("interrupt_kernel", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            let info = running(&r, &str_arg(&call, 0, "kernel_id")?).await?;
            c.engine.check()?;
            c.backend
                .signal_container(info.container_id.as_deref().unwrap_or_default(), "SIGINT")
                .await
                .map_err(|e| backend_err(&c, e))?;
            Ok(Value::Nil)
        }
    });

    // execute(session_id, kernel_id, api_version, run_id, mode, code, opts, flush_timeout)
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("execute", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move { execute(&c, &r, &call).await }
    });

    // get_logs(kernel_id, opts=None) → {"logs" | "data", "start", "next", "active"}
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("get_logs", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move { get_logs(&c, &r, &call).await }
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
                    (KernelStatus::Running, Some(id)) => {
                        c.engine.check()?;
                        c.backend
                            .inspect_container(id)
                            .await
                            .map_err(|e| backend_err(&c, e))?
                            .is_some_and(|s| s.running)
                    }
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
            let pairs = call
                .arg(0, "kernel_session_ids")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let ours = r.send(ListKernels).await.map_err(mailbox)?;
            for pair in pairs {
                let (kernel_id, session_id) = match &pair {
                    Value::Array(p) if p.len() == 2 => (
                        p[0].as_str().unwrap_or_default().to_owned(),
                        p[1].as_str().unwrap_or_default().to_owned(),
                    ),
                    Value::String(_) => {
                        (pair.as_str().unwrap_or_default().to_owned(), String::new())
                    }
                    _ => continue,
                };
                if !ours.iter().any(|k| k.id == kernel_id) {
                    c.events.emit(AgentEvent::KernelTerminated {
                        kernel_id,
                        session_id,
                        reason: "not-found-in-agent".into(),
                        exit_code: None,
                    });
                }
            }
            // While the engine is down the watcher reconciles once it is back.
            if c.engine.is_up() {
                r.do_send(Reconcile);
            }
            Ok(Value::Map(vec![(
                "kernels".into(),
                Value::Array(ours.iter().map(|k| k.to_value(&a)).collect()),
            )]))
        }
    });

    // reset_agent() → {"destroyed": n}: every kernel destroyed, no termination events.
    // Refused while the engine is down, as `destroy_kernel` is.
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("reset_agent", move |_| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            c.engine.check()?;
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
                ("total".into(), total.to_msgpack()),
                ("occupied".into(), used.to_msgpack()),
                ("available".into(), available.to_msgpack()),
                ("free_host_ports".into(), (free_ports as u64).into()),
            ]))
        }
    });

    // scan_gpu_alloc_map() → {kernel_id: {device_id: "amount"}} (Backend.AI's name)
    let c = ctx.clone();
    dispatcher.register("scan_gpu_alloc_map", move |_| {
        let c = c.clone();
        async move {
            let s = c.slots.lock().expect("slots lock");
            Ok(gpu_alloc_map(s.holders()))
        }
    });
}

/// `scan_gpu_alloc_map()`'s reply: every kernel holding accelerator devices, as
/// `{kernel_id: {device_id: "decimal amount"}}` over all its accelerator slots (Backend.AI's
/// `AbstractComputePlugin.get_attached_devices` / `scan_gpu_alloc_map`).
pub fn gpu_alloc_map(
    holders: &std::collections::BTreeMap<String, crate::agent::accelerators::DeviceMap>,
) -> Value {
    Value::Map(
        holders
            .iter()
            .map(|(kernel, slots)| {
                let mut per_device: std::collections::BTreeMap<&str, crate::slots::Amount> =
                    Default::default();
                for (id, a) in slots.values().flatten() {
                    let x = per_device.entry(id.as_str()).or_default();
                    *x = x.checked_add(*a).unwrap_or(*x);
                }
                (
                    kernel.as_str().into(),
                    Value::Map(
                        per_device
                            .into_iter()
                            .map(|(id, a)| (id.into(), a.to_string().into()))
                            .collect(),
                    ),
                )
            })
            .collect(),
    )
}

fn opt<'a>(opts: Option<&'a [(Value, Value)]>, key: &str) -> Option<&'a Value> {
    opts.and_then(|o| crate::rpc::codec::map_get(o, key))
        .filter(|v| !v.is_nil())
}

fn seconds(v: Option<&Value>) -> Option<Duration> {
    // More seconds than a `Duration` holds (≥ 2^64) is no limit, not a panic.
    v.and_then(|v| v.as_f64().or_else(|| v.as_i64().map(|n| n as f64)))
        .filter(|t| t.is_finite() && *t > 0.0)
        .and_then(|t| Duration::try_from_secs_f64(t).ok())
}

/// A backend error as a FAILURE; an unreachable engine is recorded as down on the way (the
/// watcher's next probe says when it is back).
fn backend_err(ctx: &AgentContext, e: BackendError) -> ErrorMeta {
    kernel_err(ctx, KernelError::from(e))
}

/// A kernel error as a FAILURE; `ContainerEngineUnavailable` marks the engine down.
fn kernel_err(ctx: &AgentContext, e: KernelError) -> ErrorMeta {
    let meta = e.to_meta();
    if meta.name == ENGINE_UNAVAILABLE {
        ctx.engine.mark_down(&e.to_string());
    }
    meta
}

fn run_error(e: RunError) -> ErrorMeta {
    ErrorMeta::new(e.name(), e.to_string())
}

/// How long an `input` write may wait for the process to read.
const STDIN_WRITE_LIMIT: Duration = Duration::from_secs(10);

/// `execute(session_id, kernel_id, api_version, run_id, mode, code, opts, flush_timeout)`,
/// Backend.AI's continuation protocol (see [`crate::agent::exec`]). Modes: `query` (also
/// `batch`) starts `code` with the image's interpreter (`ai.backend.runtime-path -c code`, else
/// `sh -c code`) in `/home/work`; `continue` answers more of run `run_id`; `input` writes `code`
/// to its stdin first. `opts`: `timeout` (seconds; the run is killed: status `exec-timeout`),
/// `stdin` (bool, query: keep stdin open), `eof` (bool, input: close stdin after). The answer
/// comes when the run ends, when `exec-buffer-size` bytes are waiting, or after
/// `flush_timeout` seconds (nil: no deadline):
/// `{"runId", "status": "continued" | "finished" | "exec-timeout", "exitCode", "console": [[stream, text]], "options": {}}`.
///
/// Errors: `KernelNotFound`, `KernelNotRunning` (query), `RunNotFound`, `RunHasNoStdin`,
/// `RunExists`, `RunStdinClosed`, `UnsupportedExecutionMode`, `ContainerEngineError`,
/// `ContainerEngineUnavailable` (query, while the engine is down).
async fn execute(ctx: &AgentContext, registry: &Addr<KernelRegistry>, call: &Call) -> Res {
    let kernel_id = str_arg(call, 1, "kernel_id")?;
    let run_id = call
        .arg(3, "run_id")
        .and_then(Value::as_str)
        .filter(|r| !r.is_empty())
        .map(str::to_owned);
    let mode = str_arg(call, 4, "mode")?;
    let opts = call
        .arg(6, "opts")
        .and_then(Value::as_map)
        .map(Vec::as_slice);
    let flush = seconds(call.arg(7, "flush_timeout"));
    let need_run_id = || {
        run_id
            .clone()
            .ok_or_else(|| type_error(format!("mode '{mode}' needs a 'run_id'")))
    };
    let run = match mode.as_str() {
        "query" | "batch" => {
            let code = str_arg(call, 5, "code")?;
            let info = running(registry, &kernel_id).await?;
            ctx.engine.check()?;
            let interpreter = info.runtime_path.clone().unwrap_or_else(|| "sh".into());
            let req = RunRequest {
                ids: RunIds {
                    run_id: run_id
                        .clone()
                        .unwrap_or_else(|| uuid::Uuid::new_v4().simple().to_string()),
                    kernel_id: kernel_id.clone(),
                    session_id: info.session_id.clone(),
                },
                container_id: info.container_id.clone().unwrap_or_default(),
                cmd: vec![interpreter, "-c".into(), code],
                timeout: seconds(opt(opts, "timeout")),
                stdin: opt(opts, "stdin").and_then(Value::as_bool).unwrap_or(false),
            };
            ctx.runs
                .start(&ctx.backend, &ctx.events, req)
                .await
                .map_err(|e| match e {
                    RunError::Engine(engine) => backend_err(ctx, engine),
                    other => run_error(other),
                })?
        }
        "continue" | "input" => {
            let run = ctx.runs.get(&need_run_id()?).map_err(run_error)?;
            if run.ids().kernel_id != kernel_id {
                // Another kernel's run is not this kernel's business.
                return Err(run_error(RunError::NotFound(run.ids().run_id.clone())));
            }
            if mode == "input" {
                let data = call
                    .arg(5, "code")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let eof = opt(opts, "eof").and_then(Value::as_bool).unwrap_or(false);
                run.input(data.as_bytes(), eof, STDIN_WRITE_LIMIT)
                    .await
                    .map_err(run_error)?;
            }
            run
        }
        other => {
            return Err(ErrorMeta::new(
                "UnsupportedExecutionMode",
                format!("mode '{other}' is not supported (query, batch, continue, input)"),
            ))
        }
    };
    let answer = run.answer(flush).await;
    ctx.runs.forget_if_done(&run);
    let console = answer
        .console
        .into_iter()
        .map(|(stream, text)| Value::Array(vec![stream.as_str().into(), text.into()]))
        .collect();
    Ok(Value::Map(vec![
        ("status".into(), answer.status.as_str().into()),
        ("runId".into(), run.ids().run_id.clone().into()),
        (
            "exitCode".into(),
            answer.exit_code.map_or(Value::Nil, Value::from),
        ),
        ("console".into(), Value::Array(console)),
        ("options".into(), Value::Map(vec![])),
    ]))
}

/// `get_logs(kernel_id, opts=None)`: the kernel's stdout and stderr as the agent keeps them
/// (also after the kernel ended, for `log-retention`). Without `opts.offset`: the last
/// `log-tail` bytes (at most `opts.max_bytes`) as `{"logs": text, "start", "next", "active"}`;
/// with it: `{"data": bytes, "start", "next", "active"}` from that absolute offset, waiting up to
/// `opts.wait` seconds for more when at the end of a running kernel's log. `active`: the
/// container still runs. Errors: `LogsNotFound` (no log kept and no such kernel).
async fn get_logs(ctx: &AgentContext, registry: &Addr<KernelRegistry>, call: &Call) -> Res {
    let kernel_id = str_arg(call, 0, "kernel_id")?;
    let opts = call
        .arg(1, "opts")
        .and_then(Value::as_map)
        .map(Vec::as_slice);
    let offset = opt(opts, "offset").and_then(Value::as_u64);
    let max = opt(opts, "max_bytes")
        .and_then(Value::as_u64)
        .map_or(LOG_READ_MAX, |m| (m as usize).clamp(1, LOG_READ_MAX));
    let wait = seconds(opt(opts, "wait")).map(|w| w.min(Duration::from_secs(30)));
    let chunk = ctx
        .logs
        .read(&kernel_id, offset, max, wait)
        .await
        .map_err(|e| ErrorMeta::new("LogsUnreadable", e.to_string()))?;
    let chunk = match chunk {
        Some(chunk) => chunk,
        // A kernel that has not written anything yet (or a backend with no logs) has empty ones.
        None => {
            let info = lookup(registry, &kernel_id).await.map_err(|_| {
                ErrorMeta::new(
                    "LogsNotFound",
                    format!("no logs kept for kernel {kernel_id}"),
                )
            })?;
            LogChunk {
                data: Vec::new(),
                start: 0,
                next: 0,
                active: info.status == KernelStatus::Running,
            }
        }
    };
    let body = match offset {
        Some(_) => ("data", Value::Binary(chunk.data)),
        None => (
            "logs",
            Value::from(String::from_utf8_lossy(&chunk.data).into_owned()),
        ),
    };
    Ok(Value::Map(vec![
        (body.0.into(), body.1),
        ("start".into(), chunk.start.into()),
        ("next".into(), chunk.next.into()),
        ("active".into(), chunk.active.into()),
    ]))
}

/// Most bytes one `get_logs` answer carries.
const LOG_READ_MAX: usize = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_positive_and_never_panic() {
        assert_eq!(
            seconds(Some(&Value::F64(1.5))),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(seconds(Some(&Value::from(2))), Some(Duration::from_secs(2)));
        for v in [
            Value::F64(0.0),
            Value::F64(-1.0),
            Value::F64(f64::NAN),
            Value::F64(f64::INFINITY),
            // Past `Duration::MAX`: `from_secs_f64` panicked.
            Value::F64(1e20),
            Value::Nil,
        ] {
            assert_eq!(seconds(Some(&v)), None, "{v}");
        }
        assert_eq!(seconds(None), None);
    }
}

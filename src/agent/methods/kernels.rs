//! The kernel lifecycle methods, with callosum names and Backend.AI's positional arguments:
//! `create_kernels`, `destroy_kernel`, `restart_kernel`, `interrupt_kernel`, `execute`,
//! `get_kernel`, `get_logs`, `check_running`, `ping_kernel`, `sync_kernel_registry`, `reset_agent`
//! (alias `reset_instance`), `resource_usage` and `scan_gpu_alloc_map`.
//!
//! Typed errors cross the wire as FAILURE with stable names: `KernelNotFound`,
//! `ResourceExhausted`, `ImageNotFound`, `InvalidKernelConfig`, `KernelNotRunning`,
//! `ContainerEngineError`, `ContainerEngineUnavailable` (the engine is down or restarting:
//! refused at once while the agent knows it is down, see [`crate::agent::engine`]),
//! `UnsupportedExecutionMode`, `ContainerCreationFailedError` (a cluster network that does not
//! exist, upstream's name), and for runs `RunNotFound`,
//! `RunHasNoStdin`, `RunExists`, `RunStdinClosed`; `LogsNotFound` for `get_logs`.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use rmpv::Value;

use super::args::{lookup, mailbox, running, type_error};
use super::{Ctx, Table};
use crate::agent::backend::BackendError;
use crate::agent::context::AgentContext;
use crate::agent::engine::probe;
use crate::agent::events::AgentEvent;
use crate::agent::exec::{RunError, RunIds, RunRequest};
use crate::agent::kernel::cluster::ClusterConfig;
use crate::agent::kernel::KernelInfo;
use crate::agent::kernel::{KernelConfig, KernelError, KernelStatus};
use crate::agent::logs::LogChunk;
use crate::agent::registry::{
    CreateKernels, DestroyKernel, KernelRegistry, ListKernels, Reconcile, ResetAgent, RestartKernel,
};
use crate::rpc::agent_api::exec as exec_api;
use crate::rpc::agent_api::kernel as api;
use crate::rpc::{Call, Dispatcher, ErrorMeta, Failure};

/// Registers the kernel methods on `dispatcher`.
pub(crate) fn register(dispatcher: &mut Dispatcher, cx: &Ctx) {
    Table::new(dispatcher, cx.clone())
        .method::<api::CreateKernels, _, _>(create_kernels)
        .method::<api::DestroyKernel, _, _>(destroy_kernel)
        .method::<api::RestartKernel, _, _>(restart_kernel)
        .method::<api::GetKernel, _, _>(get_kernel)
        .method::<exec_api::InterruptKernel, _, _>(interrupt_kernel)
        .method::<exec_api::Execute, _, _>(|cx, args| async move {
            execute(&cx, &cx.registry, args).await
        })
        .method::<exec_api::TriggerBatchExecution, _, _>(|cx, args| async move {
            trigger_batch(&cx.agent, &cx.registry, args).await
        })
        .method::<exec_api::GetCompletions, _, _>(get_completions)
        .method::<exec_api::GetLogs, _, _>(|cx, args| async move {
            get_logs(&cx, &cx.registry, args).await
        })
        .method::<api::CheckRunning, _, _>(check_running)
        .method::<api::PingKernel, _, _>(ping_kernel)
        .method::<api::CheckCreating, _, _>(check_creating)
        .raw("list_kernels", list_kernels)
        .raw("sync_kernel_registry", sync_kernel_registry)
        .method::<api::ResetAgent, _, _>(reset_agent)
        .alias("reset_instance", "reset_agent")
        .raw("resource_usage", resource_usage)
        .raw("scan_gpu_alloc_map", scan_gpu_alloc_map);
}

/// `create_kernels(session_id, kernel_ids, configs, cluster_info, kernel_image_refs)` →
/// `[KernelCreationResult]`: all of them or none. `cluster_info` is checked first
/// (`InvalidKernelConfig` naming its key) and kept with every kernel: its network, its keys
/// (`crate::agent::kernel::cluster`); a network it names that the engine lacks fails the
/// kernels' containers with `ContainerCreationFailedError`. A retry of a call (the same session's kernel
/// ids, all held here) creates nothing and answers as the first call did: it joins a creation
/// still going on, and answers a `RUNNING` kernel as it is now, publishing its
/// `kernel_started` again (see [`CreateKernels`]; upstream's reply shape is `create_kernels`
/// in `ai/backend/agent/server.py`).
async fn create_kernels(
    cx: Ctx,
    args: api::CreateKernelsArgs,
) -> Result<Vec<api::KernelCreationResult>, ErrorMeta> {
    if args.kernel_ids.len() != args.configs.len() || args.kernel_ids.is_empty() {
        return Err(KernelError::InvalidConfig(format!(
            "{} kernel ids for {} configs",
            args.kernel_ids.len(),
            args.configs.len()
        ))
        .to_meta());
    }
    // Every kernel of the call keeps the session's cluster info (its network, its keys):
    // applied by each container made for it (`crate::agent::kernel::cluster`).
    let cluster = args
        .cluster_info
        .as_ref()
        .map(ClusterConfig::from_info)
        .transpose()
        .map_err(|e| e.to_meta())?;
    let mut kernels = Vec::new();
    let types = cx.slots.lock().expect("slots lock").slot_types().clone();
    for (id, config) in args.kernel_ids.into_iter().zip(args.configs) {
        let mut config = KernelConfig::from_value(&config, &types).map_err(|e| match e {
            KernelError::InvalidConfig(m) => {
                KernelError::InvalidConfig(format!("kernel {id}: {m}")).to_meta()
            }
            other => other.to_meta(),
        })?;
        config.cluster = cluster.clone();
        kernels.push((id, config));
    }
    // Refused at once while the engine is down, and within a probe's timeout when it
    // hangs without the watcher having noticed yet: nothing is reserved or recorded.
    if cx.engine.is_up() {
        probe(&*cx.backend, &cx.engine).await;
    }
    cx.engine.check()?;
    let infos = cx
        .registry
        .send(CreateKernels {
            session_id: args.session_id,
            kernels,
        })
        .await
        .map_err(mailbox)?
        .map_err(|e| kernel_err(&cx, e))?;
    Ok(infos.iter().map(|i| creation_result(&cx, i)).collect())
}

/// `destroy_kernel(kernel_id, session_id, reason=None, suppress_events=False)` → None.
/// Refused while the engine is down (the kernel stays as it is, to be destroyed later): a
/// teardown now would leave its container behind.
async fn destroy_kernel(cx: Ctx, args: api::DestroyKernelArgs) -> Result<Value, ErrorMeta> {
    cx.engine.check()?;
    // kernelvisor's manager names the grace of this end; Backend.AI's never does (the kernel's
    // own then, or the agent's `[container] grace-period`), and gets nil as upstream answers.
    let grace = args
        .grace_period
        .map(|secs| {
            crate::workload::grace::checked_period(secs)
                .map_err(|e| KernelError::InvalidConfig(e).to_meta())
        })
        .transpose()?;
    let answer = grace.is_some();
    let stopped = cx
        .registry
        .send(DestroyKernel {
            kernel_id: args.kernel_id,
            reason: args
                .reason
                .filter(|r| !r.is_empty())
                .unwrap_or_else(|| "user-requested".into()),
            suppress_events: args.suppress_events.unwrap_or(false),
            grace,
        })
        .await
        .map_err(mailbox)?
        .map_err(|e| e.to_meta())?;
    if !answer {
        return Ok(Value::Nil);
    }
    Ok(crate::rpc::agent_api::to_value(&api::DestroyKernelReply {
        exit_code: stopped.exit_code,
        killed: stopped.killed,
    }))
}

/// `restart_kernel(session_id, kernel_id, kernel_image, updated_config)` →
/// `KernelCreationResult`.
async fn restart_kernel(
    cx: Ctx,
    args: api::RestartKernelArgs,
) -> Result<api::KernelCreationResult, ErrorMeta> {
    // Upstream's `updated_config` is merged over the kernel's stored `KernelCreationConfig`
    // (`{**stored, **update}`, `AbstractAgent.restart_kernel` in `ai/backend/agent/agent.py`):
    // a partial config changes only its keys; the container is recreated from the result.
    // What was allocated (image, slots, vfolders, service ports) stays as it is; an update
    // that changes it is refused.
    let updated = match args.updated_config.filter(|u| !u.is_empty()) {
        None => None,
        Some(u) => {
            let current = lookup(&cx.registry, &args.kernel_id).await?.config;
            let types = cx.slots.lock().expect("slots lock").slot_types().clone();
            let new = current.updated(&u, &types).map_err(|e| e.to_meta())?;
            let changed: Vec<&str> = [
                ("image", new.image != current.image),
                ("resource_slots", new.slots != current.slots),
                ("mounts", new.mounts != current.mounts),
                ("service_ports", new.service_ports != current.service_ports),
            ]
            .into_iter()
            .filter_map(|(k, differs)| differs.then_some(k))
            .collect();
            if !changed.is_empty() {
                return Err(KernelError::InvalidConfig(format!(
                    "restart_kernel cannot change {} (destroy and create instead)",
                    changed.join(", ")
                ))
                .to_meta());
            }
            Some(Box::new(new))
        }
    };
    cx.engine.check()?;
    let info = cx
        .registry
        .send(RestartKernel(args.kernel_id, updated))
        .await
        .map_err(mailbox)?
        .map_err(|e| kernel_err(&cx, e))?;
    Ok(creation_result(&cx, &info))
}

/// `get_kernel(kernel_id)` → the kernel's info map, with its restart count and its stages
/// (`[{name, status, restarts, setup_seconds}]`, in order).
async fn get_kernel(cx: Ctx, args: api::KernelIdArgs) -> Result<api::KernelInfoReply, ErrorMeta> {
    crate::rpc::agent_api::from_value(
        lookup(&cx.registry, &args.kernel_id)
            .await?
            .to_value(&cx.agent_id),
    )
    .map_err(|e| ErrorMeta::failure(Failure::InvalidReply, e.to_string()))
}

/// `interrupt_kernel(kernel_id)` → `{}`: the kernel runner's `interrupt` on a runner kernel
/// (the run stops, the REPL stays), else SIGINT to the container's main process.
async fn interrupt_kernel(
    cx: Ctx,
    args: api::KernelIdArgs,
) -> Result<std::collections::BTreeMap<String, Value>, ErrorMeta> {
    let info = running(&cx.registry, &args.kernel_id).await?;
    if let Some(ports) = info.runner {
        super::runner::interrupt(&cx, &info, ports).await?;
        return Ok(Default::default());
    }
    cx.engine.check()?;
    let id = info.container_id.as_deref().unwrap_or_default();
    if info.config.command.is_none() && !main_catches_sigint(&cx, id).await {
        // The image's own command, under `docker-init`, that has no SIGINT handler: as PID 1 it
        // ignored the signal, so the interrupt ends nothing now either.
        return Ok(Default::default());
    }
    cx.backend
        .signal_container(id, "SIGINT")
        .await
        .map_err(|e| backend_err(&cx, e))?;
    Ok(Default::default())
}

/// Whether container `id`'s main process (the child of its `docker-init`) catches `SIGINT`
/// (bit 2 of `SigCgt` in its `/proc/<pid>/status`). `true` when it cannot be told (no host
/// pid, `/proc` unreadable): then the signal is sent, as the API documents.
async fn main_catches_sigint(cx: &Ctx, id: &str) -> bool {
    let Ok(Some(state)) = cx.backend.inspect_container(id).await else {
        return true;
    };
    let Some(init) = state.pid else {
        return true;
    };
    let children = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children"));
    let Some(child) = children
        .ok()
        .and_then(|c| c.split_whitespace().next().map(str::to_owned))
    else {
        return true;
    };
    let status = std::fs::read_to_string(format!("/proc/{child}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|m| u64::from_str_radix(m.trim(), 16).ok())
        .is_none_or(|mask| mask & (1 << (2 - 1)) != 0)
}

/// `get_completions(kernel_id, text, opts)` → `{"result": {"status", "error", "suggestions"}}`.
async fn get_completions(
    cx: Ctx,
    args: exec_api::GetCompletionsArgs,
) -> Result<exec_api::CodeCompletionResp, ErrorMeta> {
    let info = running(&cx.registry, &args.kernel_id).await?;
    if let Some(ports) = info.runner {
        let opts = args
            .opts
            .as_ref()
            .and_then(|o| serde_json::to_value(o).ok())
            .unwrap_or_default();
        let result = super::runner::complete(&cx, &info, ports, &args.text, opts).await?;
        return Ok(exec_api::CodeCompletionResp { result });
    }
    // A process-path kernel has no code runner with a completer: an empty, finished answer,
    // as upstream gives when the runner has no completer.
    Ok(exec_api::CodeCompletionResp {
        result: exec_api::CodeCompletionResult {
            status: "finished".into(),
            error: None,
            suggestions: Vec::new(),
        },
    })
}

/// `check_running(kernel_id)` → bool: the kernel is here, RUNNING, and so is its container;
/// `false` for a kernel this agent does not hold (upstream).
async fn check_running(cx: Ctx, args: api::KernelIdArgs) -> Result<bool, ErrorMeta> {
    match lookup(&cx.registry, &args.kernel_id).await {
        Ok(info) => container_running(&cx, &info).await,
        Err(e) if e.known() == Some(Failure::KernelNotFound) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `ping_kernel(kernel_id)` → bool: the same question; FAILURE `KernelNotFound` for a kernel
/// this agent does not hold (upstream raises there too).
async fn ping_kernel(cx: Ctx, args: api::KernelIdArgs) -> Result<bool, ErrorMeta> {
    container_running(&cx, &lookup(&cx.registry, &args.kernel_id).await?).await
}

/// `check_creating(kernel_id)` → bool: being created, or held here (upstream).
async fn check_creating(cx: Ctx, args: api::KernelIdArgs) -> Result<bool, ErrorMeta> {
    Ok(match lookup(&cx.registry, &args.kernel_id).await {
        Ok(info) => info.status != KernelStatus::Terminated,
        Err(_) => false,
    })
}

/// `list_kernels()` → `{"kernels": [kernel info]}` (kernelvisor): what this agent holds.
async fn list_kernels(cx: Ctx, _: Call) -> Result<Value, ErrorMeta> {
    let ours = cx.registry.send(ListKernels).await.map_err(mailbox)?;
    Ok(kernel_list(&ours, &cx.agent_id))
}

/// `sync_kernel_registry(raw_kernel_session_ids)` → None.
/// Upstream's semantics: a listed kernel this agent does not hold gets `kernel_terminated`
/// (`already-terminated`); a kernel held here but not listed is destroyed without events
/// (`not-found-in-manager`). Without the argument (kernelvisor), only the listing.
async fn sync_kernel_registry(cx: Ctx, call: Call) -> Result<Value, ErrorMeta> {
    let listed = call
        .arg(0, "raw_kernel_session_ids")
        .is_some_and(|v| !v.is_nil());
    let args = if listed {
        Some(
            crate::rpc::agent_api::decode_args::<api::SyncKernelRegistry>(&call)
                .map_err(|e| type_error(format!("sync_kernel_registry(): {e}")))?,
        )
    } else {
        None
    };
    let ours = cx.registry.send(ListKernels).await.map_err(mailbox)?;
    let Some(args) = args else {
        return Ok(kernel_list(&ours, &cx.agent_id));
    };
    let pairs = args.raw_kernel_session_ids;
    for (kernel_id, session_id) in &pairs {
        if !ours.iter().any(|k| &k.id == kernel_id) {
            cx.events.emit(AgentEvent::KernelTerminated {
                kernel_id: kernel_id.clone(),
                session_id: session_id.clone(),
                reason: "already-terminated".into(),
                exit_code: None,
            });
        }
    }
    let mut kept = Vec::new();
    for k in ours {
        let known = pairs.iter().any(|(id, _)| *id == k.id);
        if known || k.status == KernelStatus::Terminated {
            kept.push(k);
            continue;
        }
        cx.engine.check()?;
        cx.registry
            .send(DestroyKernel {
                kernel_id: k.id.clone(),
                reason: "not-found-in-manager".into(),
                suppress_events: true,
                grace: None,
            })
            .await
            .map_err(mailbox)?
            .map_err(|e| e.to_meta())?;
    }
    // While the engine is down the watcher reconciles once it is back.
    if cx.engine.is_up() {
        cx.registry.do_send(Reconcile);
    }
    // Upstream answers None.
    Ok(Value::Nil)
}

/// `reset_agent()` → `{"destroyed": n}`: every kernel destroyed, no termination events.
/// Refused while the engine is down, as `destroy_kernel` is.
async fn reset_agent(cx: Ctx, _: api::NoArgs) -> Result<api::Destroyed, ErrorMeta> {
    cx.engine.check()?;
    let n = cx.registry.send(ResetAgent).await.map_err(mailbox)?;
    Ok(api::Destroyed {
        destroyed: n as u64,
    })
}

/// `resource_usage()` → `{"total", "occupied", "available": slots; "free_host_ports": int}`.
async fn resource_usage(cx: Ctx, _: Call) -> Result<Value, ErrorMeta> {
    let (total, used, available) = {
        let s = cx.slots.lock().expect("slots lock");
        (s.capacity(), s.used(), s.available())
    };
    let free_ports = cx.ports.lock().expect("ports lock").available();
    Ok(Value::Map(vec![
        ("total".into(), total.to_msgpack()),
        ("occupied".into(), used.to_msgpack()),
        ("available".into(), available.to_msgpack()),
        ("free_host_ports".into(), (free_ports as u64).into()),
    ]))
}

/// `scan_gpu_alloc_map()` → `{kernel_id: {device_id: "amount"}}` (Backend.AI's name).
async fn scan_gpu_alloc_map(cx: Ctx, _: Call) -> Result<Value, ErrorMeta> {
    let s = cx.slots.lock().expect("slots lock");
    Ok(gpu_alloc_map(s.holders()))
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

/// A kernel's `KernelCreationResult` (upstream's `create_kernels` entry) with kernelvisor's
/// info map alongside (`status`, `stages`, `restart_count`, …).
fn creation_result(ctx: &AgentContext, info: &KernelInfo) -> api::KernelCreationResult {
    let cfg = &ctx.config;
    let mut extra: std::collections::BTreeMap<String, Value> = match info.to_value(&ctx.agent_id) {
        Value::Map(m) => m
            .into_iter()
            .filter_map(|(k, v)| k.as_str().map(|k| (k.to_owned(), v)))
            .collect(),
        _ => Default::default(),
    };
    for k in ["id", "container_id", "service_ports"] {
        extra.remove(k);
    }
    let kernel_host = cfg
        .container
        .advertised_host
        .clone()
        .unwrap_or_else(|| cfg.container.bind_host.clone());
    let rpc = cfg
        .agent
        .advertised_rpc_addr
        .as_ref()
        .unwrap_or(&cfg.agent.rpc_listen_addr);
    let devices: Vec<Value> = info
        .gpus
        .iter()
        .map(|g| {
            crate::rpc::agent_api::to_value(&serde_json::json!({
                "device_id": g, "model_name": "", "data": {}
            }))
        })
        .collect();
    api::KernelCreationResult {
        id: info.id.clone(),
        kernel_host,
        repl_in_port: info.runner.map_or(0, |p| p.repl_in),
        repl_out_port: info.runner.map_or(0, |p| p.repl_out),
        stdin_port: 0,
        stdout_port: 0,
        service_ports: info
            .service_ports
            .iter()
            .map(|s| api::ServicePort {
                name: s.name.clone(),
                protocol: s.protocol.clone(),
                container_ports: s.container_ports.clone(),
                host_ports: s.host_ports.iter().copied().map(Some).collect(),
                is_inference: false,
            })
            .collect(),
        container_id: info.container_id.clone().unwrap_or_default(),
        resource_spec: Value::Map(vec![
            ("slots".into(), info.config.slots.to_msgpack()),
            ("mounts".into(), Value::Array(vec![])),
            ("scratch_disk_size".into(), 0.into()),
        ]),
        attached_devices: if devices.is_empty() {
            Value::Map(vec![])
        } else {
            Value::Map(vec![("cuda".into(), Value::Array(devices))])
        },
        agent_addr: format!("tcp://{}:{}", rpc.host, rpc.port),
        scaling_group: "default".into(),
        info: extra,
    }
}

/// `{"kernels": [info]}`.
fn kernel_list(kernels: &[KernelInfo], agent_id: &str) -> Value {
    Value::Map(vec![(
        "kernels".into(),
        Value::Array(kernels.iter().map(|k| k.to_value(agent_id)).collect()),
    )])
}

/// Whether `info`'s kernel is `RUNNING` and its container too (asks the engine).
async fn container_running(ctx: &AgentContext, info: &KernelInfo) -> Result<bool, ErrorMeta> {
    match (info.status, &info.container_id) {
        (KernelStatus::Running, Some(id)) => {
            ctx.engine.check()?;
            Ok(ctx
                .backend
                .inspect_container(id)
                .await
                .map_err(|e| backend_err(ctx, e))?
                .is_some_and(|s| s.running))
        }
        _ => Ok(false),
    }
}

/// `trigger_batch_execution`: runs `code` (`sh -c`, in `/home/work`) as a run of the kernel
/// and returns at once; when it ends the agent reports `session_success` (exit 0) or
/// `session_failure` (`task-failed`, `task-timeout`), as Backend.AI's
/// `AbstractAgent.create_batch_execution_task` does.
async fn trigger_batch(
    ctx: &Arc<AgentContext>,
    registry: &Addr<KernelRegistry>,
    args: exec_api::TriggerBatchExecutionArgs,
) -> Result<Value, ErrorMeta> {
    let info = running(registry, &args.kernel_id).await?;
    let timeout = args
        .timeout_seconds
        .filter(|t| t.is_finite() && *t > 0.0)
        .and_then(|t| Duration::try_from_secs_f64(t).ok());
    if let Some(ports) = info.runner {
        super::runner::trigger_batch(ctx, &info, ports, args.code, timeout).await?;
        return Ok(Value::Nil);
    }
    ctx.engine.check()?;
    let req = RunRequest {
        ids: RunIds {
            run_id: format!("batch-{}", uuid::Uuid::new_v4().simple()),
            kernel_id: args.kernel_id.clone(),
            session_id: info.session_id.clone(),
        },
        container_id: info.container_id.clone().unwrap_or_default(),
        cmd: vec!["sh".into(), "-c".into(), args.code],
        timeout,
        stdin: false,
        tty: None,
        env: Vec::new(),
        user: info.exec_user(&ctx.config.container),
    };
    let run = ctx
        .runs
        .start(&ctx.backend, &ctx.events, req)
        .await
        .map_err(|e| match e {
            RunError::Engine(engine) => backend_err(ctx, engine),
            other => run_error(other),
        })?;
    let c = ctx.clone();
    actix::spawn(async move {
        // Drain the run's output (bounded by the run's own buffer) until it finishes.
        let answer = loop {
            let answer = run.answer(Some(Duration::from_secs(5))).await;
            if answer.status.as_str() != "continued" {
                break answer;
            }
        };
        c.runs.forget_if_done(&run);
        let ids = run.ids().clone();
        let event = match (answer.status.as_str(), answer.exit_code) {
            ("finished", Some(0)) => AgentEvent::SessionSuccess {
                kernel_id: ids.kernel_id,
                session_id: ids.session_id,
                exit_code: Some(0),
            },
            (status, exit_code) => AgentEvent::SessionFailure {
                kernel_id: ids.kernel_id,
                session_id: ids.session_id,
                reason: if status == "exec-timeout" {
                    "task-timeout".into()
                } else {
                    "task-failed".into()
                },
                exit_code,
            },
        };
        c.events.emit(event);
    });
    Ok(Value::Nil)
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
    if meta.known() == Some(Failure::ContainerEngineUnavailable) {
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
/// Backend.AI's continuation protocol. On a kernel Backend.AI's kernel runner serves, through
/// its REPL ([`super::runner::execute`]; `opts.shell = true` takes the process path instead,
/// running `code` with `sh -c` as the kernel's user).
/// Otherwise (see [`crate::agent::exec`]) modes: `query` (also
/// `batch`) starts `code` with the image's interpreter (`ai.backend.runtime-path -c code`, else
/// `sh -c code`; with `opts.shell = true` always `sh -c code`) in `/home/work`; `continue` answers more of run `run_id`; `input` writes `code`
/// to its stdin first. `opts`: `timeout` (seconds; the run is killed: status `exec-timeout`),
/// `stdin` (bool, query: keep stdin open), `eof` (bool, input: close stdin after). The answer
/// comes when the run ends, when `exec-buffer-size` bytes are waiting, or after
/// `flush_timeout` seconds (nil: no deadline):
/// `{"runId", "status": "continued" | "finished" | "exec-timeout", "exitCode", "console": [[stream, text]], "options": {}}`.
///
/// Errors: `KernelNotFound`, `KernelNotRunning` (query), `RunNotFound`, `RunHasNoStdin`,
/// `RunExists`, `RunStdinClosed`, `UnsupportedExecutionMode`, `ContainerEngineError`,
/// `ContainerEngineUnavailable` (query, while the engine is down).
async fn execute(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    args: exec_api::ExecuteArgs,
) -> Result<exec_api::ExecuteResult, ErrorMeta> {
    let kernel_id = args.kernel_id;
    // Every `execute` call is activity, `continue` polls of a long run too (idle reclaim,
    // `agent/activity.rs`).
    ctx.activity.touch(&kernel_id);
    let run_id = args.run_id.filter(|r| !r.is_empty());
    let mode = args.mode;
    let opts_map: Option<Vec<(Value, Value)>> = args
        .opts
        .map(|o| o.into_iter().map(|(k, v)| (Value::from(k), v)).collect());
    let opts = opts_map.as_deref();
    let flush = seconds(args.flush_timeout.map(Value::F64).as_ref());
    let need_run_id = || {
        run_id
            .clone()
            .ok_or_else(|| type_error(format!("mode '{mode}' needs a 'run_id'")))
    };
    // A runner kernel's runs go through its runner, unless `opts.shell` asks for a process.
    let shell = opt(opts, "shell").and_then(Value::as_bool).unwrap_or(false);
    let in_runner = match mode.as_str() {
        "query" | "batch" if !shell => Some(running(registry, &kernel_id).await?),
        "continue" | "input" => match run_id.as_deref().map(|r| ctx.runs.get(r)) {
            Some(Ok(_)) => None,
            // A runner kernel's run ends with its kernel (then `RunNotFound`, as on the process
            // path).
            _ => running(registry, &kernel_id).await.ok(),
        },
        _ => None,
    };
    if let Some((info, ports)) = in_runner.and_then(|i| i.runner.map(|p| (i, p))) {
        let text = |k: &str| {
            opt(opts, k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned()
        };
        return super::runner::execute(
            ctx,
            super::runner::RunnerExecute {
                info: &info,
                ports,
                run_id,
                mode: &mode,
                code: args.code,
                batch: [text("clean"), text("build"), text("exec")],
                timeout: seconds(opt(opts, "timeout")),
                flush,
            },
        )
        .await;
    }
    let run = match mode.as_str() {
        "query" | "batch" => {
            let code = args.code.clone();
            let info = running(registry, &kernel_id).await?;
            ctx.engine.check()?;
            // `opts.shell`: a shell command, whatever the image's interpreter.
            let interpreter = match &info.runtime_path {
                Some(path) if !shell => path.clone(),
                _ => "sh".into(),
            };
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
                tty: None,
                env: Vec::new(),
                user: info.exec_user(&ctx.config.container),
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
                let data = args.code.as_str();
                let eof = opt(opts, "eof").and_then(Value::as_bool).unwrap_or(false);
                run.input(data.as_bytes(), eof, STDIN_WRITE_LIMIT)
                    .await
                    .map_err(run_error)?;
            }
            run
        }
        other => {
            return Err(ErrorMeta::failure(
                Failure::UnsupportedExecutionMode,
                format!("mode '{other}' is not supported (query, batch, continue, input)"),
            ))
        }
    };
    let answer = run.answer(flush).await;
    ctx.runs.forget_if_done(&run);
    Ok(exec_api::ExecuteResult {
        run_id: run.ids().run_id.clone(),
        status: answer.status.as_str().to_owned(),
        console: answer
            .console
            .into_iter()
            .map(|(stream, text)| (stream.as_str().to_owned(), Value::from(text)))
            .collect(),
        exit_code: answer.exit_code,
        options: Some(Default::default()),
    })
}

/// `get_logs(kernel_id, opts=None)`: the kernel's stdout and stderr as the agent keeps them
/// (also after the kernel ended, for `log-retention`). Without `opts.offset`: the last
/// `log-tail` bytes (at most `opts.max_bytes`) as `{"logs": text, "start", "next", "active"}`;
/// with it: `{"data": bytes, "start", "next", "active"}` from that absolute offset, waiting up to
/// `opts.wait` seconds for more when at the end of a running kernel's log. `active`: the
/// container still runs. Errors: `LogsNotFound` (no log kept and no such kernel).
async fn get_logs(
    ctx: &AgentContext,
    registry: &Addr<KernelRegistry>,
    args: exec_api::GetLogsArgs,
) -> Result<exec_api::LogsReply, ErrorMeta> {
    let kernel_id = args.kernel_id;
    let opts = args
        .opts
        .as_ref()
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
        .map_err(|e| ErrorMeta::failure(Failure::LogsUnreadable, e.to_string()))?;
    let chunk = match chunk {
        Some(chunk) => chunk,
        // A kernel that has not written anything yet (or a backend with no logs) has empty ones.
        None => {
            let info = lookup(registry, &kernel_id).await.map_err(|_| {
                ErrorMeta::failure(
                    Failure::LogsNotFound,
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
    let (logs, data) = match offset {
        Some(_) => (None, Some(serde_bytes::ByteBuf::from(chunk.data))),
        None => (
            Some(String::from_utf8_lossy(&chunk.data).into_owned()),
            None,
        ),
    };
    Ok(exec_api::LogsReply {
        logs,
        data,
        start: chunk.start,
        next: chunk.next,
        active: chunk.active,
    })
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

//! The agent's RPC methods: the node methods here (`ping`, `health`, `gather_hwinfo`), the
//! kernel lifecycle in [`kernels`].

mod args;
pub mod dangling;
pub mod files;
pub mod kernels;
pub mod services;

use std::time::Instant;

use rmpv::Value;

use std::sync::Arc;

use actix::Addr;

use crate::agent::context::AgentContext;
use crate::agent::engine::EngineHealth;
use crate::agent::registry::KernelRegistry;
use crate::rpc::{Dispatcher, ErrorMeta};

/// Registers every method that acts on kernels: the lifecycle ([`kernels`]), services
/// ([`services`]), files ([`files`]) and dangling kernels ([`dangling`]); `health` again,
/// now reporting the engine's health (see [`register_health`]); and `gather_hwinfo` again,
/// now with the accelerators' devices and `slot_key_and_units`.
pub fn register_kernel_methods(
    dispatcher: &mut Dispatcher,
    ctx: Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
) {
    register_health(dispatcher, &ctx.agent_id, Some(ctx.engine.clone()));
    let accelerators = ctx.slots.lock().expect("slots lock").accelerators().clone();
    dispatcher.register("gather_hwinfo", move |_| {
        let accelerators = accelerators.clone();
        async move {
            tokio::task::spawn_blocking(move || super::hwinfo::gather_with(&accelerators))
                .await
                .map_err(|e| ErrorMeta::new("HardwareProbeFailed", e.to_string()))
        }
    });
    kernels::register(dispatcher, ctx.clone(), registry.clone());
    services::register(dispatcher, ctx.clone(), registry.clone());
    files::register(dispatcher, ctx.clone(), registry.clone());
    dangling::register(dispatcher, ctx, registry);
}

/// Registers `ping(msg)` (returns `msg`), `health()` and `gather_hwinfo()` on `dispatcher`;
/// `health` as [`register_health`] without an engine (always `ok`).
pub fn register(dispatcher: &mut Dispatcher, agent_id: &str) {
    register_health(dispatcher, agent_id, None);
    dispatcher
        .register("ping", |call| async move {
            call.arg(0, "msg").cloned().ok_or_else(|| {
                ErrorMeta::new("TypeError", "ping() missing required argument: 'msg'")
            })
        })
        .register("gather_hwinfo", |_| async {
            tokio::task::spawn_blocking(super::hwinfo::gather)
                .await
                .map_err(|e| ErrorMeta::new("HardwareProbeFailed", e.to_string()))
        });
}

/// Registers (or replaces) `health()`, which returns
/// `{"status": "ok" | "degraded", "agent_id": str, "version": str, "uptime_seconds": float,
/// "engine_error": str | nil, "engine_down_seconds": float | nil}`: `degraded` while `engine`
/// says the container engine is down, with its error and how long it has been down (both nil
/// while it is up, or without an `engine`). It never touches the engine itself, so it answers
/// at once during an outage.
pub fn register_health(
    dispatcher: &mut Dispatcher,
    agent_id: &str,
    engine: Option<Arc<EngineHealth>>,
) {
    let started = Instant::now();
    let agent_id = agent_id.to_owned();
    dispatcher.register("health", move |_| {
        let agent_id = agent_id.clone();
        let down = engine.as_ref().and_then(|e| e.down());
        async move {
            let (status, error, down_for) = match down {
                None => ("ok", Value::Nil, Value::Nil),
                Some((error, for_)) => (
                    "degraded",
                    Value::from(error),
                    Value::from(for_.as_secs_f64()),
                ),
            };
            Ok(Value::Map(vec![
                (Value::from("status"), Value::from(status)),
                (Value::from("agent_id"), Value::from(agent_id)),
                (
                    Value::from("version"),
                    Value::from(env!("CARGO_PKG_VERSION")),
                ),
                (
                    Value::from("uptime_seconds"),
                    Value::from(started.elapsed().as_secs_f64()),
                ),
                (Value::from("engine_error"), error),
                (Value::from("engine_down_seconds"), down_for),
            ]))
        }
    });
}

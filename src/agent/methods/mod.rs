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
use crate::agent::registry::KernelRegistry;
use crate::rpc::{Dispatcher, ErrorMeta};

/// Registers every method that acts on kernels: the lifecycle ([`kernels`]), services
/// ([`services`]), files ([`files`]) and dangling kernels ([`dangling`]).
pub fn register_kernel_methods(
    dispatcher: &mut Dispatcher,
    ctx: Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
) {
    kernels::register(dispatcher, ctx.clone(), registry.clone());
    services::register(dispatcher, ctx.clone(), registry.clone());
    files::register(dispatcher, ctx.clone(), registry.clone());
    dangling::register(dispatcher, ctx, registry);
}

/// Registers `ping(msg)` (returns `msg`), `health()` and `gather_hwinfo()` on `dispatcher`.
///
/// `health()` returns `{"status": "ok", "agent_id": str, "version": str, "uptime_seconds": float}`.
pub fn register(dispatcher: &mut Dispatcher, agent_id: &str) {
    let started = Instant::now();
    let agent_id = agent_id.to_owned();
    dispatcher
        .register("ping", |call| async move {
            call.arg(0, "msg").cloned().ok_or_else(|| {
                ErrorMeta::new("TypeError", "ping() missing required argument: 'msg'")
            })
        })
        .register("health", move |_| {
            let agent_id = agent_id.clone();
            async move {
                Ok(Value::Map(vec![
                    (Value::from("status"), Value::from("ok")),
                    (Value::from("agent_id"), Value::from(agent_id)),
                    (
                        Value::from("version"),
                        Value::from(env!("CARGO_PKG_VERSION")),
                    ),
                    (
                        Value::from("uptime_seconds"),
                        Value::from(started.elapsed().as_secs_f64()),
                    ),
                ]))
            }
        })
        .register("gather_hwinfo", |_| async {
            tokio::task::spawn_blocking(super::hwinfo::gather)
                .await
                .map_err(|e| ErrorMeta::new("HardwareProbeFailed", e.to_string()))
        });
}

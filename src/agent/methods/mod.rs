//! The agent's RPC methods, each registered through its typed contract
//! ([`crate::rpc::agent_api`]): the node methods ([`node`]: `ping`, `health` / `health_v2`,
//! `gather_hwinfo` / `gather_hwinfo_v2`, `get_local_config`, `shutdown_agent`), the kernel
//! lifecycle ([`kernels`]), services ([`services`]), files ([`files`]), local networks and
//! host ports ([`network`]), images ([`images`], [`purge`], [`commit`]), dangling kernels
//! ([`dangling`]) and kernelvisor's terminals ([`terminal`]).

mod args;
pub mod commit;
pub mod dangling;
pub mod files;
pub mod images;
pub mod kernels;
pub mod network;
pub mod node;
pub mod purge;
pub mod services;
pub mod terminal;

use std::sync::Arc;

use actix::Addr;

use crate::agent::context::AgentContext;
use crate::agent::registry::KernelRegistry;
use crate::rpc::Dispatcher;

/// Registers every method that needs the agent's context: `health` / `health_v2` again, now
/// reporting the engine's health; `gather_hwinfo` / `gather_hwinfo_v2` again, now with the
/// accelerators' devices; `get_local_config`, `shutdown_agent`; the lifecycle ([`kernels`]),
/// services, files, networks and ports, images, dangling kernels, and terminals.
pub fn register_kernel_methods(
    dispatcher: &mut Dispatcher,
    ctx: Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
) {
    node::register_with_context(dispatcher, ctx.clone());
    kernels::register(dispatcher, ctx.clone(), registry.clone());
    services::register(dispatcher, ctx.clone(), registry.clone());
    files::register(dispatcher, ctx.clone(), registry.clone());
    network::register(dispatcher, ctx.clone());
    images::register(dispatcher, ctx.clone());
    purge::register(dispatcher, ctx.clone(), registry.clone());
    commit::register(dispatcher, ctx.clone(), registry.clone());
    terminal::register(dispatcher, ctx.clone(), registry.clone());
    dangling::register(dispatcher, ctx, registry);
}

/// Registers the node methods that need no agent: `ping(msg)` (returns `msg`), `health()` /
/// `health_v2(req)` (no engine to check: always `ok`), `gather_hwinfo()` /
/// `gather_hwinfo_v2(req)` (the host's facts). See [`node::register`].
pub fn register(dispatcher: &mut Dispatcher, agent_id: &str) {
    node::register(dispatcher, agent_id);
}

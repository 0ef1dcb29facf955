//! The agent's RPC methods, each registered through its typed contract
//! ([`crate::rpc::agent_api`]): the node methods ([`node`]: `ping`, `health` / `health_v2`,
//! `gather_hwinfo` / `gather_hwinfo_v2`, `get_local_config`, `shutdown_agent`), the kernel
//! lifecycle ([`kernels`]), services ([`services`]), files ([`files`]), local networks and
//! host ports ([`network`]), images ([`images`], [`purge`], [`commit`]), dangling kernels
//! ([`dangling`]) and kernelvisor's terminals ([`terminal`]).
//!
//! Each module is one `async fn` per method and a `register` that lists them in a [`Table`]
//! over a [`Ctx`] (or over a state of its own, as `commit`'s task table).

mod args;
pub mod commit;
pub mod dangling;
pub mod files;
pub mod images;
pub mod kernels;
pub mod network;
pub mod node;
pub mod purge;
pub mod runner;
pub mod services;
mod table;
pub mod terminal;

use std::ops::Deref;
use std::sync::Arc;

use actix::Addr;

use crate::agent::context::AgentContext;
use crate::agent::registry::KernelRegistry;
use crate::rpc::Dispatcher;
use table::Table;

/// What an agent method's handler gets, cloned once per call: the agent's context and the
/// kernel registry it asks. Derefs to the [`AgentContext`].
#[derive(Clone)]
pub(crate) struct Ctx {
    /// The agent's shared state.
    pub agent: Arc<AgentContext>,
    /// The registry of the agent's kernels (the current one: a restart of the `kernels` child
    /// builds the method table again).
    pub registry: Addr<KernelRegistry>,
}

impl Deref for Ctx {
    type Target = AgentContext;

    fn deref(&self) -> &AgentContext {
        &self.agent
    }
}

/// Registers every method that needs the agent's context: `health` / `health_v2` again, now
/// reporting the engine's health; `gather_hwinfo` / `gather_hwinfo_v2` again, now with the
/// accelerators' devices; `get_local_config`, `shutdown_agent`; the lifecycle ([`kernels`]),
/// services, files, networks and ports, images, dangling kernels, and terminals.
pub fn register_kernel_methods(
    dispatcher: &mut Dispatcher,
    ctx: Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
) {
    let cx = Ctx {
        agent: ctx,
        registry,
    };
    node::register_with_context(dispatcher, &cx);
    kernels::register(dispatcher, &cx);
    services::register(dispatcher, &cx);
    files::register(dispatcher, &cx);
    network::register(dispatcher, &cx);
    images::register(dispatcher, &cx);
    purge::register(dispatcher, &cx);
    commit::register(dispatcher, &cx);
    terminal::register(dispatcher, &cx);
    dangling::register(dispatcher, &cx);
}

/// Registers the node methods that need no agent: `ping(msg)` (returns `msg`), `health()` /
/// `health_v2(req)` (no engine to check: always `ok`), `gather_hwinfo()` /
/// `gather_hwinfo_v2(req)` (the host's facts). See [`node::register`].
pub fn register(dispatcher: &mut Dispatcher, agent_id: &str) {
    node::register(dispatcher, agent_id);
}

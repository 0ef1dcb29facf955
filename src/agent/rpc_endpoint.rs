//! The agent's RPC endpoint: callosum over ZeroMQ (CURVE when keys are configured) serving the
//! node methods and the kernel methods (`methods/`), and the agent tree's `rpc` child.

use std::sync::Arc;

use actix::{Actor, Addr};
use actors::{ChildSpec, StopSignal};

use super::context::AgentContext;
use super::first_start::FirstStart;
use super::kernels::CurrentRegistry;
use super::methods;
use super::metrics::AgentMetrics;
use super::registry::KernelRegistry;
use crate::config::AgentConfig;
use crate::rpc::curve::{load_certificate, load_keypair};
use crate::rpc::{Dispatcher, RpcServer, ServerCurve};

/// Builds the agent's RPC server from its config (bound, not yet started), with the node
/// methods plus whatever `extra` registers.
///
/// Errors: unreadable key files, or the RPC address cannot be bound.
pub fn rpc_server(
    config: &AgentConfig,
    extra: impl FnOnce(&mut Dispatcher),
) -> anyhow::Result<RpcServer> {
    rpc_server_at(config, &config.agent.rpc_listen_addr.zmq_endpoint(), extra)
}

fn rpc_server_at(
    config: &AgentConfig,
    endpoint: &str,
    extra: impl FnOnce(&mut Dispatcher),
) -> anyhow::Result<RpcServer> {
    let a = &config.agent;
    let curve = match (&a.rpc_auth_manager_public_key, &a.rpc_auth_agent_keypair) {
        (Some(manager_key), Some(keypair)) => Some(ServerCurve {
            keypair: load_keypair(keypair)?,
            allowed_clients: vec![(load_certificate(manager_key)?.public, "manager".to_owned())],
            reload: None,
        }),
        _ => None,
    };
    let mut dispatcher = Dispatcher::new(Some(a.id.clone()));
    methods::register(&mut dispatcher, &a.id);
    extra(&mut dispatcher);
    Ok(RpcServer::bind(endpoint, curve, dispatcher)?)
}

/// The agent's RPC server with the kernel methods on `registry`, observed by `metrics`.
///
/// Errors: as [`rpc_server`].
pub fn agent_server(
    ctx: &Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
    metrics: &Arc<AgentMetrics>,
) -> anyhow::Result<RpcServer> {
    rpc_server(&ctx.config, |d| {
        methods::register_kernel_methods(d, ctx.clone(), registry);
        d.observe(observer(ctx, metrics));
    })
}

/// What watches the agent's requests: the metrics count each, and a failed handler is an
/// `agent_error` event, as Backend.AI's agent sends one from every RPC function that raises
/// (`collect_error` → `produce_error_event`; on the bus only).
fn observer(ctx: &Arc<AgentContext>, metrics: &Arc<AgentMetrics>) -> Arc<RequestWatch> {
    Arc::new(RequestWatch {
        metrics: metrics.clone(),
        events: ctx.events.clone(),
    })
}

/// See [`observer`].
struct RequestWatch {
    metrics: Arc<AgentMetrics>,
    events: crate::agent::events::EventBus,
}

impl crate::rpc::RequestObserver for RequestWatch {
    fn observe(&self, method: &str, duration: std::time::Duration, failure: Option<&str>) {
        self.metrics.observe(method, duration, failure);
    }

    fn failed(&self, method: &str, error: &crate::rpc::ErrorMeta) {
        self.events
            .emit(crate::agent::events::AgentEvent::AgentError {
                message: format!("{}: {} (in {method})", error.name, error.repr),
                traceback: (!error.traceback.is_empty()).then(|| error.traceback.clone()),
            });
    }
}

/// The agent tree's `rpc` child: serves `first` (bound by `Agent::start`, so a bad key file or
/// a port in use stops the start) until stopped; a restart binds `first`'s endpoint again with
/// the kernel methods on the current registry.
pub fn child_spec(
    first: RpcServer,
    ctx: Arc<AgentContext>,
    registry: CurrentRegistry,
    metrics: Arc<AgentMetrics>,
) -> ChildSpec {
    let endpoint = first.endpoint().to_owned();
    let first = FirstStart::new(first);
    ChildSpec::task("rpc", move |stop: StopSignal| {
        let server = first.take().map(Ok).unwrap_or_else(|| {
            let registry = registry.get();
            rpc_server_at(&ctx.config, &endpoint, |d| {
                methods::register_kernel_methods(d, ctx.clone(), registry);
                d.observe(observer(&ctx, &metrics));
            })
        });
        async move {
            let server = server.map_err(|e| format!("{e:#}"))?.start();
            stop.requested().await;
            let _ = server.send(crate::rpc::server::Shutdown).await;
            Ok::<_, String>(())
        }
    })
}

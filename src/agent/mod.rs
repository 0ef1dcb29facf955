//! The agent daemon: runs kernels on the node's container engine and serves the manager's RPC.
//!
//! ```text
//! Agent
//! ├─ Store            SQLite: the kernel registry's rows (store.rs)
//! ├─ kernels          one_for_one Supervisor; one Kernel actor per kernel (kernel/)
//! ├─ KernelRegistry   kernel index; routes operations and exits (registry.rs)
//! ├─ exit watcher     engine events → ContainerExited (watcher.rs)
//! └─ RpcServer        callosum over ZeroMQ, CURVE (rpc/ + methods/)
//! ```
//! Start: store → backend → recovery (recovery.rs) → watcher → RPC. Stop: the reverse; kernels
//! are detached (`on-shutdown = "preserve"`) or destroyed (`"terminate"`).

pub mod backend;
pub mod context;
pub mod events;
pub mod hwinfo;
pub mod kernel;
pub mod methods;
pub mod recovery;
pub mod registry;
pub mod resources;
pub mod store;
pub mod watcher;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Addr};
use actors::{Root, Supervisor};

use self::backend::{docker::DockerBackend, dummy::{DummyBackend, DummyDelays}, ContainerBackend};
use self::context::AgentContext;
use self::events::{AgentEvent, EventBus};
use self::registry::{KernelRegistry, ShutdownKernels};
use self::resources::PortPool;
use self::store::Store;
use crate::config::{AgentConfig, BackendKind, OnShutdown};
use crate::rpc::curve::{load_certificate, load_keypair};
use crate::rpc::{Dispatcher, RpcServer, ServerCurve};

/// Builds the agent's RPC server from its config (bound, not yet started), with the node
/// methods plus whatever `extra` registers.
///
/// Errors: unreadable key files, or the RPC address cannot be bound.
pub fn rpc_server(config: &AgentConfig, extra: impl FnOnce(&mut Dispatcher)) -> anyhow::Result<RpcServer> {
    let a = &config.agent;
    let curve = match (&a.rpc_auth_manager_public_key, &a.rpc_auth_agent_keypair) {
        (Some(manager_key), Some(keypair)) => Some(ServerCurve {
            keypair: load_keypair(keypair)?,
            allowed_clients: vec![(load_certificate(manager_key)?.public, "manager".to_owned())],
        }),
        _ => None,
    };
    let mut dispatcher = Dispatcher::new(Some(a.id.clone()));
    methods::register(&mut dispatcher, &a.id);
    extra(&mut dispatcher);
    Ok(RpcServer::bind(&a.rpc_listen_addr.zmq_endpoint(), curve, dispatcher)?)
}

/// The container backend `[agent] backend` names.
///
/// Errors: the Docker engine cannot be reached.
pub async fn connect_backend(config: &AgentConfig) -> anyhow::Result<Arc<dyn ContainerBackend>> {
    Ok(match config.agent.backend {
        BackendKind::Docker => Arc::new(DockerBackend::connect().await?),
        BackendKind::Dummy => {
            let d = &config.dummy;
            let s = Duration::from_secs_f64;
            Arc::new(DummyBackend::new(DummyDelays { pull: s(d.pull_delay), create: s(d.create_delay), start: s(d.start_delay), remove: s(d.remove_delay) }))
        }
    })
}

/// A running agent (inside an actix system).
pub struct Agent {
    /// Shared state (tests read the allocators and subscribe to events through it).
    pub ctx: Arc<AgentContext>,
    /// The kernel registry.
    pub registry: Addr<KernelRegistry>,
    /// What start-up recovery did.
    pub recovery: recovery::RecoveryReport,
    kernels: Root,
    server: Addr<RpcServer>,
    endpoint: String,
    watcher: tokio::task::JoinHandle<()>,
}

impl Agent {
    /// Opens the store, connects the backend, recovers the kernels of a previous run, starts
    /// the exit watcher and then serves RPC. `backend` overrides `[agent] backend` (tests).
    ///
    /// Errors: the store, the engine or the RPC address is unusable, or recovery cannot read
    /// the store or the engine.
    pub async fn start(config: AgentConfig, backend: Option<Arc<dyn ContainerBackend>>) -> anyhow::Result<Agent> {
        let a = &config.agent;
        let store = Store::open(&a.var_base_path.join("agent.db")).await?;
        let pruned = store.prune_terminated(7.0 * 86400.0).await?;
        let backend = match backend {
            Some(b) => b,
            None => connect_backend(&config).await?,
        };
        let c = &config.container;
        let ctx = Arc::new(AgentContext {
            agent_id: a.id.clone(),
            slots: Mutex::new(AgentContext::detect_slots(&config)),
            ports: Mutex::new(PortPool::new(c.port_range[0], c.port_range[1], c.port_reuse_cooldown.0)),
            backend,
            store,
            events: EventBus::default(),
            config: config.clone(),
        });
        let kernels = Supervisor::build("kernels").start();
        let registry = KernelRegistry::new(ctx.clone(), kernels.addr()).start();
        let recovery = recovery::recover(&ctx, &registry).await?;
        tracing::info!(agent_id = %a.id, backend = ctx.backend.kind(), ?recovery, pruned, "kernels recovered");
        let watcher = actix_rt::spawn(watcher::watch_exits(ctx.clone(), registry.clone()));
        let server = rpc_server(&config, |d| methods::kernels::register(d, ctx.clone(), registry.clone()))?;
        let endpoint = server.endpoint().to_owned();
        let server = server.start();
        ctx.events.emit(AgentEvent::AgentStarted);
        tracing::info!(agent_id = %a.id, %endpoint, "agent started");
        Ok(Agent { ctx, registry, recovery, kernels, server, endpoint, watcher })
    }

    /// The RPC endpoint actually bound (`tcp://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Stops in reverse order: RPC, then the kernels (detached or destroyed per `mode`), the
    /// watcher, the kernels supervisor and the store.
    pub async fn shutdown(self, mode: OnShutdown) {
        let _ = self.server.send(crate::rpc::server::Shutdown).await;
        let _ = self.registry.send(ShutdownKernels(mode)).await;
        self.watcher.abort();
        self.ctx.events.emit(AgentEvent::AgentTerminated { reason: "shutdown".into() });
        self.kernels.shutdown().await;
        self.ctx.store.close().await;
        tracing::info!(agent_id = %self.ctx.agent_id, ?mode, "agent stopped");
    }
}

/// Runs the agent until SIGINT or SIGTERM, then shuts down per `[agent] on-shutdown`.
pub async fn run(config: AgentConfig) -> anyhow::Result<()> {
    let mode = config.agent.on_shutdown;
    let agent = Agent::start(config, None).await?;
    crate::signals::wait_for_shutdown().await;
    tracing::info!(agent_id = %agent.ctx.agent_id, "agent shutting down");
    agent.shutdown(mode).await;
    Ok(())
}

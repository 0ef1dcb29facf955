//! The agent daemon: runs kernels on the node's container engine and serves the manager's RPC.
//!
//! ```text
//! agent (rest_for_one, at most 5 restarts in 60 s)
//! ├─ event-sender     outbox → manager's event intake, until acked      ┐ with [manager]
//! ├─ bus-sender       bus outbox → Backend.AI's bus, once each (bus/)   │ with [redis]
//! ├─ outbox-writer    events → durable SQLite outboxes (outbox.rs)      ┘ with [manager] or [redis]
//! ├─ kernels          KernelRegistry + one_for_one Supervisor of Kernel actors (kernels.rs, registry.rs, kernel/)
//! ├─ watcher          engine events → ContainerExited; engine health probes (watcher.rs, engine.rs)
//! ├─ exec-reaper      runs nobody reads for exec-idle-timeout are killed (exec/)
//! ├─ transfer-reaper  uploads and downloads nobody continues are dropped (files/transfer.rs)
//! ├─ log-retention    kept kernel logs past [container] log-retention are removed (logs.rs)
//! ├─ stats            node / container / GPU sampling → gauges, live stats (stats/)
//! ├─ valkey           presence, images, live stats, bgtasks → Valkey (valkey/) ┤ with [redis]
//! ├─ metrics          Prometheus text on [agent] service-addr /metrics (metrics_server.rs)
//! ├─ heartbeat        every heartbeat-interval to the manager (heartbeat.rs)
//! └─ rpc              callosum over ZeroMQ, CURVE (rpc_endpoint.rs, methods/)
//! ```
//! Each child is built by a `child_spec` function in its own module; [`Agent::start`] lists
//! them. `tests/it/trees.rs` compares this drawing with the running tree (`WhichChildren`).
//!
//! The store (store.rs) is opened before the tree and closed after it. Children start in this
//! order and stop in reverse (SIGTERM/SIGINT); a child that fails restarts with every child
//! after it, each of which depends on those before it (the RPC methods and the watcher on the
//! registry, the registry's events on the outbox). Restarting `kernels` detaches the kernels
//! and adopts them again from the store, as an agent restart does (recovery.rs). On the final
//! shutdown kernels are detached (`on-shutdown = "preserve"`) or destroyed (`"terminate"`).

pub mod accelerators;
pub mod activity;
pub mod backend;
pub mod bgtasks;
pub mod bus;
pub mod context;
pub mod dangling;
pub mod dangling_table;
pub mod engine;
pub mod event_sender;
pub mod events;
pub mod exec;
pub mod files;
pub mod first_start;
pub mod heartbeat;
pub mod hwinfo;
pub mod intakes;
pub mod kernel;
pub mod kernels;
pub mod logs;
pub mod methods;
pub mod metrics;
pub mod metrics_server;
pub mod node;
pub mod outbox;
pub mod pulls;
pub mod recovery;
pub mod registry;
pub mod resources;
pub mod rpc_endpoint;
pub mod runner;
pub mod services;
pub mod stats;
pub mod store;
pub mod valkey;
pub mod watcher;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::Addr;
use actors::{ChildSpec, Intensity, Root, Strategy, Supervisor};
use tokio::sync::mpsc;

use self::backend::{
    docker::DockerBackend,
    dummy::{DummyBackend, DummyDelays},
    ContainerBackend,
};
use self::context::AgentContext;
use self::events::{AgentEvent, EventBus};
use self::kernels::{CurrentRegistry, FinalShutdown, Kernels};
use self::metrics::AgentMetrics;
use self::metrics_server::MetricsServer;
use self::outbox::{Destination, OutboxWriter};
use self::registry::KernelRegistry;
use self::resources::PortPool;
use self::store::Store;
use crate::config::{AgentConfig, BackendKind, OnShutdown};
use crate::rpc::curve::load_keypair;

pub use self::rpc_endpoint::rpc_server;

/// The container backend `[agent] backend` names.
///
/// Errors: the Docker engine (`[container] docker-host`, else the local default) cannot be
/// reached.
pub async fn connect_backend(config: &AgentConfig) -> anyhow::Result<Arc<dyn ContainerBackend>> {
    Ok(match config.agent.backend {
        BackendKind::Docker => {
            Arc::new(DockerBackend::connect_to(config.container.docker_host.as_deref()).await?)
        }
        BackendKind::Dummy => {
            let d = &config.dummy;
            let s = Duration::from_secs_f64;
            let backend = DummyBackend::new(DummyDelays {
                pull: s(d.pull_delay),
                create: s(d.create_delay),
                start: s(d.start_delay),
                remove: s(d.remove_delay),
            });
            for image in &d.images {
                backend.hold_image(image);
            }
            Arc::new(backend)
        }
    })
}

/// A running agent (inside an actix system): the agent supervisor's tree.
pub struct Agent {
    /// Shared state (tests read the allocators and subscribe to events through it).
    pub ctx: Arc<AgentContext>,
    /// What start-up recovery did.
    pub recovery: recovery::RecoveryReport,
    registry: CurrentRegistry,
    root: Root,
    store: Store,
    endpoint: String,
    metrics_addr: std::net::SocketAddr,
    final_shutdown: FinalShutdown,
}

impl Agent {
    /// Opens the store, connects the backend, recovers the kernels of a previous run, binds
    /// the RPC and metrics endpoints, then starts the agent supervisor's children in order.
    /// `backend` overrides `[agent] backend` (tests).
    ///
    /// Errors: the store, the engine, the RPC or metrics address, or a key file is unusable,
    /// or recovery cannot read the store or the engine.
    pub async fn start(
        config: AgentConfig,
        backend: Option<Arc<dyn ContainerBackend>>,
    ) -> anyhow::Result<Agent> {
        let a = &config.agent;
        let store = Store::open(&a.var_base_path.join("agent.db")).await?;
        let pruned = store.prune_terminated(7.0 * 86400.0).await?;
        let backend = match backend {
            Some(b) => b,
            None => connect_backend(&config).await?,
        };
        let metrics = Arc::new(AgentMetrics::new(&a.id));
        let (events, outbox_rx) = if config.manager.is_some() || config.redis.is_some() {
            let (tx, rx) = mpsc::unbounded_channel();
            (EventBus::with_outbox(tx), Some(rx))
        } else {
            tracing::info!(agent_id = %a.id, "no [manager] or [redis] section: running standalone (events are not sent)");
            (EventBus::default(), None)
        };
        let ctx = context(&config, backend, &store, events, &metrics)?;

        // What can fail for a reason the operator must fix is done here, so start() reports it.
        let kernels = Kernels::start(&ctx).await?;
        let recovery = kernels.recovery.clone();
        let server = rpc_endpoint::agent_server(&ctx, kernels.registry.clone(), &metrics)?;
        let endpoint = server.endpoint().to_owned();
        let metrics_server = MetricsServer::bind(&a.service_addr, metrics.clone())?;
        let metrics_addr = metrics_server.addr();
        let agent_keypair = a
            .rpc_auth_agent_keypair
            .as_deref()
            .map(load_keypair)
            .transpose()?;
        let link = event_sender::link(&config, agent_keypair.as_ref(), &store, &metrics)?;
        let beat_interval = config
            .manager
            .as_ref()
            .map_or(Duration::from_secs(20), |m| m.heartbeat_interval.0);
        let identity = heartbeat::Identity {
            region: a.region.clone(),
            rpc_addr: advertised_rpc_addr(&config, &endpoint),
            public_key: agent_keypair.as_ref().map(|pair| pair.public.to_z85()),
        };
        let bus = bus::sender::from_config(
            &config,
            &store,
            &metrics,
            bus::sender::HeartbeatIdentity {
                ctx: ctx.clone(),
                rpc_addr: identity.rpc_addr.clone(),
                public_key: identity.public_key.clone(),
                interval: beat_interval,
            },
        );
        // The outbox writer fills one outbox per sender; the heartbeat goes where events go.
        let destinations: Vec<Destination> = (link.iter().map(|l| l.destination.clone()))
            .chain(bus.iter().map(|(d, _)| d.clone()))
            .collect();
        let beat_to = link.as_ref().map(|l| (l.peer.clone(), l.intakes.clone()));
        let writer = outbox_rx.map(|rx| {
            let metrics = metrics.clone();
            (
                OutboxWriter {
                    destinations,
                    metrics,
                },
                rx,
            )
        });
        let final_shutdown = FinalShutdown::new(a.on_shutdown);
        let (kernels, registry) = kernels::child_spec(ctx.clone(), kernels, final_shutdown.clone());
        let exec_gauges = {
            let metrics = metrics.clone();
            move |runs, buffered| metrics.exec_runs(runs, buffered)
        };

        // The tree, in start order (see the module doc); `None`: a child its config leaves out.
        let children: [Option<ChildSpec>; 13] = [
            link.map(|l| event_sender::child_spec(l.sender)),
            bus.map(|(_, sender)| bus::sender::child_spec(sender)),
            writer.map(|(writer, rx)| outbox::child_spec(writer, rx)),
            Some(kernels),
            Some(watcher::child_spec(ctx.clone(), registry.clone())),
            Some(exec::reaper_spec(
                ctx.clone(),
                |c| &c.runs,
                ctx.backend.clone(),
                exec_gauges,
            )),
            Some(files::transfer::reaper_spec(ctx.clone(), |c| &c.transfers)),
            Some(logs::retention_spec(ctx.logs.clone())),
            Some(stats::child_spec(
                ctx.clone(),
                registry.clone(),
                config.stats.clone(),
            )),
            valkey::child_spec(&config, ctx.clone(), registry.clone()),
            Some(metrics_server::child_spec(metrics_server, metrics.clone())),
            Some(heartbeat::child_spec(
                ctx.clone(),
                registry.clone(),
                identity,
                beat_to,
                beat_interval,
            )),
            Some(rpc_endpoint::child_spec(
                server,
                ctx.clone(),
                registry.clone(),
                metrics.clone(),
            )),
        ];
        let root = children
            .into_iter()
            .flatten()
            .fold(
                Supervisor::build("agent")
                    .strategy(Strategy::RestForOne)
                    .intensity(Intensity::new(5, 60)),
                |tree, child| tree.child(child),
            )
            .start();

        ctx.events.emit(AgentEvent::AgentStarted);
        tracing::info!(agent_id = %a.id, %endpoint, metrics = %metrics_addr, pruned, "agent started");
        Ok(Agent {
            ctx,
            recovery,
            registry,
            root,
            store,
            endpoint,
            metrics_addr,
            final_shutdown,
        })
    }

    /// The agent supervisor (the root of the tree in the module doc), for
    /// [`actors::WhichChildren`].
    pub fn supervisor(&self) -> Addr<Supervisor> {
        self.root.addr()
    }

    /// The kernel registry (a new one after the `kernels` child restarted).
    pub fn registry(&self) -> Addr<KernelRegistry> {
        self.registry.get()
    }

    /// The RPC endpoint actually bound (`tcp://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The metrics endpoint actually bound (`/metrics` is served there).
    pub fn metrics_addr(&self) -> std::net::SocketAddr {
        self.metrics_addr
    }

    /// Stops the tree in reverse order (RPC, heartbeat, metrics, the Valkey writer, stats, the
    /// three sweeps, watcher, kernels — detached or destroyed per `mode` — then the outbox
    /// writer, which stores the last events such as `agent_terminated`, then the event sender's
    /// last delivery attempt), then closes the store.
    pub async fn shutdown(self, mode: OnShutdown) {
        self.final_shutdown.begin(mode);
        let exit = self.root.shutdown().await;
        self.store.close().await;
        tracing::info!(agent_id = %self.ctx.agent_id, ?mode, ?exit, "agent stopped");
    }
}

/// The agent's shared state over `store`, `backend`, `events` and `metrics`: allocators from
/// the host and `[resource]`, the exec, log, service and transfer tables.
///
/// Errors: the log directory under `[agent] var-base-path` cannot be created.
fn context(
    config: &AgentConfig,
    backend: Arc<dyn ContainerBackend>,
    store: &Store,
    events: EventBus,
    metrics: &Arc<AgentMetrics>,
) -> anyhow::Result<Arc<AgentContext>> {
    let (a, c) = (&config.agent, &config.container);
    Ok(Arc::new(AgentContext {
        agent_id: a.id.clone(),
        slots: Mutex::new(AgentContext::detect_slots(
            config,
            accelerators::Accelerators::detect(config),
        )),
        ports: Mutex::new(PortPool::new(
            c.port_range[0],
            c.port_range[1],
            c.port_reuse_cooldown.0,
        )),
        backend: backend.clone(),
        engine: Arc::new(engine::EngineHealth::new(Some(metrics.clone()))),
        store: store.clone(),
        events,
        metrics: metrics.clone(),
        runs: exec::Runs::new(a.exec_buffer_size.0 as usize, a.exec_idle_timeout.0),
        runners: runner::Runners::new(
            config.kernel_runner.clone(),
            a.exec_buffer_size.0 as usize,
            a.exec_idle_timeout.0,
        ),
        logs: Arc::new(logs::LogStore::open(
            &a.var_base_path.join("logs"),
            c.log_tail.0,
            c.log_retention.0,
        )?),
        services: services::Services::new(c.service_start_timeout.0),
        transfers: files::transfer::Transfers::new(a.exec_idle_timeout.0),
        dangling: dangling_table::DanglingTable::default(),
        node: node::NodeState::default(),
        pulls: Arc::new(pulls::ImagePulls::new(
            backend.clone(),
            metrics.clone(),
            c.image_pull_timeout.0,
        )),
        bgtasks: bgtasks::Bgtasks::default(),
        live_stats: Arc::default(),
        // Idle reclaim.
        activity: Arc::default(),
        config: config.clone(),
    }))
}

/// The RPC address heartbeats advertise: `[agent] advertised-rpc-addr`, else the bound
/// `endpoint` (with a warning when a manager could not dial it).
fn advertised_rpc_addr(config: &AgentConfig, endpoint: &str) -> String {
    match &config.agent.advertised_rpc_addr {
        Some(addr) => addr.zmq_endpoint(),
        None => {
            if config.manager.is_some()
                && (endpoint.contains("//0.0.0.0:")
                    || endpoint.contains("//[::]:")
                    || endpoint.contains("//*:"))
            {
                tracing::warn!(%endpoint, "heartbeats advertise an unspecified address: a manager on another host cannot dial it; set [agent] advertised-rpc-addr");
            }
            endpoint.to_owned()
        }
    }
}

/// Runs the agent until SIGINT or SIGTERM, then shuts down per `[agent] on-shutdown`; or until
/// the `shutdown_agent` RPC asks for the same shutdown, kernels kept or destroyed as it says.
pub async fn run(config: AgentConfig) -> anyhow::Result<()> {
    let mode = config.agent.on_shutdown;
    let agent = Agent::start(config, None).await?;
    let requested = {
        let ctx = agent.ctx.clone();
        async move { ctx.node.shutdown_requested().await }
    };
    let supervisor = agent.root.addr();
    let gave_up = async {
        while supervisor.connected() {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    tokio::select! {
        _ = crate::signals::wait_for_shutdown() => {
            tracing::info!(agent_id = %agent.ctx.agent_id, "agent shutting down");
            agent.shutdown(mode).await;
            Ok(())
        }
        mode = requested => {
            tracing::info!(agent_id = %agent.ctx.agent_id, ?mode, "agent shutting down (shutdown_agent)");
            agent.shutdown(mode).await;
            Ok(())
        }
        _ = gave_up => {
            agent.store.close().await;
            anyhow::bail!("the agent supervisor gave up: a child kept failing (see the log above)")
        }
    }
}

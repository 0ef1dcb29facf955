//! The agent daemon: runs kernels on the node's container engine and serves the manager's RPC.
//!
//! ```text
//! AgentSupervisor (rest_for_one, at most 5 restarts in 60 s)
//! ├─ event-sender     outbox → manager's event intake, until acked      ┐ with a [manager]
//! ├─ outbox-writer    events → durable SQLite outbox (outbox.rs)        ┘ section only
//! ├─ kernels          KernelRegistry + one_for_one Supervisor of Kernel actors (registry.rs, kernel/)
//! ├─ watcher          engine events → ContainerExited; engine health probes (watcher.rs, engine.rs)
//! ├─ stats            node / container / GPU sampling → gauges (stats/)
//! ├─ metrics          Prometheus text on [agent] service-addr /metrics (metrics_server.rs)
//! ├─ heartbeat        every heartbeat-interval to the manager (heartbeat.rs)
//! └─ rpc              callosum over ZeroMQ, CURVE (rpc/ + methods/)
//! ```
//! The store (store.rs) is opened before the tree and closed after it. Children start in this
//! order and stop in reverse (SIGTERM/SIGINT); a child that fails restarts with every child
//! after it, each of which depends on those before it (the RPC methods and the watcher on the
//! registry, the registry's events on the outbox). Restarting `kernels` detaches the kernels
//! and adopts them again from the store, as an agent restart does (recovery.rs). On the final
//! shutdown kernels are detached (`on-shutdown = "preserve"`) or destroyed (`"terminate"`).

pub mod accelerators;
pub mod backend;
pub mod context;
pub mod dangling;
pub mod engine;
pub mod event_sender;
pub mod events;
pub mod exec;
pub mod files;
pub mod heartbeat;
pub mod hwinfo;
pub mod intakes;
pub mod kernel;
pub mod logs;
pub mod methods;
pub mod metrics;
pub mod metrics_server;
pub mod node;
pub mod outbox;
pub mod recovery;
pub mod registry;
pub mod resources;
pub mod services;
pub mod stats;
pub mod store;
pub mod watcher;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::{Actor, Addr};
use actors::{ChildSpec, Intensity, Root, Shutdown, StopSignal, Strategy, Supervisor};
use tokio::sync::{mpsc, watch, Notify};

use self::backend::{
    docker::DockerBackend,
    dummy::{DummyBackend, DummyDelays},
    ContainerBackend,
};
use self::context::AgentContext;
use self::event_sender::EventSender;
use self::events::{AgentEvent, EventBus};
use self::metrics::AgentMetrics;
use self::metrics_server::MetricsServer;
use self::outbox::{Outbox, OutboxWriter};
use self::registry::{KernelRegistry, ShutdownKernels};
use self::resources::PortPool;
use self::store::Store;
use crate::config::{AgentConfig, BackendKind, OnShutdown};
use crate::rpc::curve::{load_certificate, load_keypair};
use crate::rpc::socket::ClientCurve;
use crate::rpc::{Dispatcher, PeerOptions, RpcServer, ServerCurve};

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
            Arc::new(DummyBackend::new(DummyDelays {
                pull: s(d.pull_delay),
                create: s(d.create_delay),
                start: s(d.start_delay),
                remove: s(d.remove_delay),
            }))
        }
    })
}

/// The kernel registry and the supervisor of its kernel actors: the `kernels` child's state.
struct Kernels {
    registry: Addr<KernelRegistry>,
    supervisor: Root,
    recovery: recovery::RecoveryReport,
}

impl Kernels {
    /// After a restart of the `kernels` child: the detached kernels still hold their slots and
    /// ports, so the allocators start afresh before [`Kernels::start`] adopts them again.
    async fn restart(ctx: &Arc<AgentContext>) -> anyhow::Result<Kernels> {
        let c = &ctx.config.container;
        {
            let mut slots = ctx.slots.lock().expect("slot allocator lock");
            let accelerators = slots.accelerators().clone();
            *slots = AgentContext::detect_slots(&ctx.config, accelerators);
        }
        *ctx.ports.lock().expect("port pool lock") =
            PortPool::new(c.port_range[0], c.port_range[1], c.port_reuse_cooldown.0);
        Kernels::start(ctx).await
    }

    /// A registry, and the kernels of the store adopted again (allocators as they are).
    async fn start(ctx: &Arc<AgentContext>) -> anyhow::Result<Kernels> {
        let supervisor = Supervisor::build("kernels").start();
        let registry = KernelRegistry::new(ctx.clone(), supervisor.addr()).start();
        let recovery = recovery::recover(ctx, &registry).await?;
        tracing::info!(agent_id = %ctx.agent_id, backend = ctx.backend.kind(), ?recovery, "kernels recovered");
        Ok(Kernels {
            registry,
            supervisor,
            recovery,
        })
    }
}

/// Takes what `Agent::start` prepared for a child's first start; later starts make their own.
type FirstStart<T> = Arc<Mutex<Option<T>>>;

fn first<T>(slot: &FirstStart<T>) -> Option<T> {
    slot.lock().expect("first-start slot lock").take()
}

/// A running agent (inside an actix system): the agent supervisor's tree.
pub struct Agent {
    /// Shared state (tests read the allocators and subscribe to events through it).
    pub ctx: Arc<AgentContext>,
    /// What start-up recovery did.
    pub recovery: recovery::RecoveryReport,
    registry: watch::Receiver<Option<Addr<KernelRegistry>>>,
    root: Root,
    store: Store,
    endpoint: String,
    metrics_addr: std::net::SocketAddr,
    final_shutdown: Arc<AtomicBool>,
    on_shutdown: Arc<Mutex<OnShutdown>>,
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
        let (events, outbox_rx) = match &config.manager {
            Some(_) => {
                let (tx, rx) = mpsc::unbounded_channel();
                (EventBus::with_outbox(tx), Some(rx))
            }
            None => {
                tracing::info!(agent_id = %a.id, "no [manager] section: running standalone (events are not sent)");
                (EventBus::default(), None)
            }
        };
        let c = &config.container;
        let ctx = Arc::new(AgentContext {
            agent_id: a.id.clone(),
            slots: Mutex::new(AgentContext::detect_slots(
                &config,
                accelerators::Accelerators::detect(&config),
            )),
            ports: Mutex::new(PortPool::new(
                c.port_range[0],
                c.port_range[1],
                c.port_reuse_cooldown.0,
            )),
            backend,
            engine: Arc::new(engine::EngineHealth::new(Some(metrics.clone()))),
            store: store.clone(),
            events,
            metrics: metrics.clone(),
            runs: exec::Runs::new(a.exec_buffer_size.0 as usize, a.exec_idle_timeout.0),
            logs: Arc::new(logs::LogStore::open(
                &a.var_base_path.join("logs"),
                c.log_tail.0,
                c.log_retention.0,
            )?),
            services: services::Services::new(c.service_start_timeout.0),
            transfers: files::transfer::Transfers::new(a.exec_idle_timeout.0),
            dangling: dangling::DanglingTable::default(),
            node: node::NodeState::default(),
            config: config.clone(),
        });

        // What can fail for a reason the operator must fix is done here, so start() reports it.
        let kernels = Kernels::start(&ctx).await?;
        let recovery = kernels.recovery.clone();
        let (registry_tx, registry_rx) = watch::channel(Some(kernels.registry.clone()));
        let registry_tx = Arc::new(registry_tx);
        let server = rpc_server(&config, |d| {
            methods::register_kernel_methods(d, ctx.clone(), kernels.registry.clone());
            d.observe(metrics.clone());
        })?;
        let endpoint = server.endpoint().to_owned();
        let metrics_server = MetricsServer::bind(&a.service_addr, metrics.clone())?;
        let metrics_addr = metrics_server.addr();
        let agent_keypair = a
            .rpc_auth_agent_keypair
            .as_deref()
            .map(load_keypair)
            .transpose()?;
        let intakes = config
            .manager
            .as_ref()
            .map(|m| Arc::new(intakes::Intakes::new(m.intake_endpoints())));
        let manager_peer = match &config.manager {
            Some(m) => Some(PeerOptions {
                endpoint: m.intake_endpoints()[0].clone(),
                curve: match (&a.rpc_auth_manager_public_key, &agent_keypair) {
                    (Some(manager), Some(pair)) => Some(ClientCurve {
                        keypair: pair.clone(),
                        server_key: load_certificate(manager)?.public,
                    }),
                    _ => None,
                },
                keepalive: Some(Default::default()),
                handshake_timeout: m.event_ack_timeout.0.min(Duration::from_secs(5)),
            }),
            None => None,
        };
        let rpc_addr = match &a.advertised_rpc_addr {
            Some(addr) => addr.zmq_endpoint(),
            None => {
                if config.manager.is_some()
                    && (endpoint.contains("//0.0.0.0:")
                        || endpoint.contains("//[::]:")
                        || endpoint.contains("//*:"))
                {
                    tracing::warn!(%endpoint, "heartbeats advertise an unspecified address: a manager on another host cannot dial it; set [agent] advertised-rpc-addr");
                }
                endpoint.clone()
            }
        };
        let identity = heartbeat::Identity {
            region: a.region.clone(),
            rpc_addr,
            public_key: agent_keypair.as_ref().map(|pair| pair.public.to_z85()),
        };

        let final_shutdown = Arc::new(AtomicBool::new(false));
        let on_shutdown = Arc::new(Mutex::new(a.on_shutdown));
        let mut tree = Supervisor::build("agent")
            .strategy(Strategy::RestForOne)
            .intensity(Intensity::new(5, 60));

        if let (Some(m), Some(rx), Some(peer), Some(intakes)) = (
            &config.manager,
            outbox_rx,
            manager_peer.clone(),
            intakes.clone(),
        ) {
            let outbox = Outbox::new(&store, m.outbox_max_events);
            let appended = Arc::new(Notify::new());
            let rx = Arc::new(tokio::sync::Mutex::new(rx));
            let writer = Arc::new(OutboxWriter {
                outbox: outbox.clone(),
                metrics: metrics.clone(),
                appended: appended.clone(),
            });
            let sender = Arc::new(EventSender {
                agent_id: a.id.clone(),
                peer,
                intakes,
                config: m.clone(),
                outbox,
                appended,
                metrics: metrics.clone(),
            });
            let grace = m.event_ack_timeout.0 + Duration::from_secs(2);
            tree = tree.child(
                ChildSpec::task("event-sender", move |stop: StopSignal| {
                    let sender = sender.clone();
                    async move {
                        sender.run(stop.requested()).await;
                        Ok::<_, String>(())
                    }
                })
                .shutdown(Shutdown::Graceful(grace)),
            );
            tree = tree.child(
                ChildSpec::task("outbox-writer", move |stop: StopSignal| {
                    let (writer, rx) = (writer.clone(), rx.clone());
                    async move {
                        writer.run(&mut *rx.lock().await, stop.requested()).await;
                        Ok::<_, String>(())
                    }
                })
                .shutdown(Shutdown::millis(10_000)),
            );
        }

        let first_kernels: FirstStart<Kernels> = Arc::new(Mutex::new(Some(kernels)));
        {
            let (ctx, final_shutdown, on_shutdown, registry_tx) = (
                ctx.clone(),
                final_shutdown.clone(),
                on_shutdown.clone(),
                registry_tx.clone(),
            );
            tree = tree.child(
                ChildSpec::task("kernels", move |stop: StopSignal| {
                    let (ctx, first_kernels, final_shutdown, on_shutdown, registry_tx) = (
                        ctx.clone(),
                        first_kernels.clone(),
                        final_shutdown.clone(),
                        on_shutdown.clone(),
                        registry_tx.clone(),
                    );
                    async move {
                        let k = match first(&first_kernels) {
                            Some(k) => k,
                            None => Kernels::restart(&ctx).await.map_err(|e| format!("{e:#}"))?,
                        };
                        registry_tx.send_replace(Some(k.registry.clone()));
                        stop.requested().await;
                        let last = final_shutdown.load(Ordering::SeqCst);
                        // A restart detaches (the next start adopts the kernels again).
                        let mode = if last {
                            *on_shutdown.lock().expect("on-shutdown lock")
                        } else {
                            OnShutdown::Preserve
                        };
                        let _ = k.registry.send(ShutdownKernels(mode)).await;
                        if last {
                            ctx.events.emit(AgentEvent::AgentTerminated {
                                reason: "shutdown".into(),
                            });
                        }
                        k.supervisor.shutdown().await;
                        Ok::<_, String>(())
                    }
                })
                .shutdown(Shutdown::Infinity),
            );
        }

        let current_registry = {
            let rx = registry_rx.clone();
            move || {
                rx.borrow()
                    .clone()
                    .expect("the kernels child starts before its dependants")
            }
        };
        {
            let (ctx, current_registry) = (ctx.clone(), current_registry.clone());
            tree = tree.child(ChildSpec::task("watcher", move |stop: StopSignal| {
                let (ctx, registry) = (ctx.clone(), current_registry());
                async move {
                    tokio::select! {
                        _ = watcher::watch_exits(ctx, registry) => Err("the kernel registry stopped".to_owned()),
                        _ = stop.requested() => Ok(()),
                    }
                }
            }));
        }
        {
            let ctx = ctx.clone();
            tree = tree.child(ChildSpec::task("exec-reaper", move |stop: StopSignal| {
                let ctx = ctx.clone();
                async move {
                    let metrics = ctx.metrics.clone();
                    let report = move |runs, buffered| metrics.exec_runs(runs, buffered);
                    ctx.runs
                        .reap_every(
                            ctx.backend.clone(),
                            Duration::from_secs(1),
                            report,
                            stop.requested(),
                        )
                        .await;
                    Ok::<_, String>(())
                }
            }));
        }
        {
            // Uploads and downloads nobody continues for `exec-idle-timeout` are dropped.
            let ctx = ctx.clone();
            tree = tree.child(ChildSpec::task(
                "transfer-reaper",
                move |stop: StopSignal| {
                    let ctx = ctx.clone();
                    async move {
                        let mut tick = tokio::time::interval(Duration::from_secs(5));
                        let mut stop = std::pin::pin!(stop.requested());
                        loop {
                            tokio::select! {
                                _ = tick.tick() => { ctx.transfers.reap(); }
                                _ = &mut stop => return Ok::<_, String>(()),
                            }
                        }
                    }
                },
            ));
        }
        {
            let ctx = ctx.clone();
            tree = tree.child(ChildSpec::task("log-retention", move |stop: StopSignal| {
                let ctx = ctx.clone();
                async move {
                    ctx.logs
                        .sweep_every(Duration::from_secs(60), stop.requested())
                        .await;
                    Ok::<_, String>(())
                }
            }));
        }
        {
            let (ctx, current_registry) = (ctx.clone(), current_registry.clone());
            let intervals = config.stats.clone();
            tree = tree.child(ChildSpec::task("stats", move |stop: StopSignal| {
                let sampler = stats::sampler::StatsSampler::new(
                    ctx.clone(),
                    current_registry(),
                    intervals.clone(),
                );
                async move {
                    sampler.run(stop.requested()).await;
                    Ok::<_, String>(())
                }
            }));
        }
        {
            let first_server: FirstStart<MetricsServer> =
                Arc::new(Mutex::new(Some(metrics_server)));
            let metrics = metrics.clone();
            // A restart binds the port the first start got (it may have been 0).
            let addr = crate::config::HostPort {
                host: metrics_addr.ip().to_string(),
                port: metrics_addr.port(),
            };
            tree = tree.child(ChildSpec::task("metrics", move |stop: StopSignal| {
                let server = first(&first_server)
                    .map(Ok)
                    .unwrap_or_else(|| MetricsServer::bind(&addr, metrics.clone()));
                async move { server?.run(stop.requested()).await }
            }));
        }
        {
            let (ctx, current_registry) = (ctx.clone(), current_registry.clone());
            let beat_to = manager_peer.clone().zip(intakes.clone());
            let interval = config
                .manager
                .as_ref()
                .map_or(Duration::from_secs(20), |m| m.heartbeat_interval.0);
            tree = tree.child(ChildSpec::task("heartbeat", move |stop: StopSignal| {
                let run = heartbeat::run(
                    ctx.clone(),
                    current_registry(),
                    identity.clone(),
                    beat_to.clone(),
                    interval,
                    async move { stop.requested().await },
                );
                async move {
                    run.await;
                    Ok::<_, String>(())
                }
            }));
        }
        {
            let first_server: FirstStart<RpcServer> = Arc::new(Mutex::new(Some(server)));
            let (ctx, config, metrics, endpoint) = (
                ctx.clone(),
                config.clone(),
                metrics.clone(),
                endpoint.clone(),
            );
            tree = tree.child(ChildSpec::task("rpc", move |stop: StopSignal| {
                let server = first(&first_server).map(Ok).unwrap_or_else(|| {
                    let registry = current_registry();
                    rpc_server_at(&config, &endpoint, |d| {
                        methods::register_kernel_methods(d, ctx.clone(), registry);
                        d.observe(metrics.clone());
                    })
                });
                async move {
                    let server = server.map_err(|e| format!("{e:#}"))?.start();
                    stop.requested().await;
                    let _ = server.send(crate::rpc::server::Shutdown).await;
                    Ok::<_, String>(())
                }
            }));
        }

        let root = tree.start();
        ctx.events.emit(AgentEvent::AgentStarted);
        tracing::info!(agent_id = %a.id, %endpoint, metrics = %metrics_addr, pruned, "agent started");
        Ok(Agent {
            ctx,
            recovery,
            registry: registry_rx,
            root,
            store,
            endpoint,
            metrics_addr,
            final_shutdown,
            on_shutdown,
        })
    }

    /// The kernel registry (a new one after the `kernels` child restarted).
    pub fn registry(&self) -> Addr<KernelRegistry> {
        self.registry
            .borrow()
            .clone()
            .expect("the registry is published at start")
    }

    /// The RPC endpoint actually bound (`tcp://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The metrics endpoint actually bound (`/metrics` is served there).
    pub fn metrics_addr(&self) -> std::net::SocketAddr {
        self.metrics_addr
    }

    /// Stops the tree in reverse order (RPC, heartbeat, metrics, stats, watcher, kernels —
    /// detached or destroyed per `mode` — then the outbox writer, which stores the last events
    /// such as `agent_terminated`, then the event sender's last delivery attempt), then closes
    /// the store.
    pub async fn shutdown(self, mode: OnShutdown) {
        *self.on_shutdown.lock().expect("on-shutdown lock") = mode;
        self.final_shutdown.store(true, Ordering::SeqCst);
        let exit = self.root.shutdown().await;
        self.store.close().await;
        tracing::info!(agent_id = %self.ctx.agent_id, ?mode, ?exit, "agent stopped");
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

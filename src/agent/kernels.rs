//! The agent tree's `kernels` child: the [`KernelRegistry`] and the one_for_one supervisor of
//! its kernel actors, with the kernels of the store adopted again at each start
//! ([`super::recovery`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use actix::{Actor, Addr};
use actors::{ChildSpec, Root, Shutdown, StopSignal, Supervisor};
use tokio::sync::watch;

use super::context::AgentContext;
use super::events::AgentEvent;
use super::first_start::FirstStart;
use super::recovery::{self, RecoveryReport};
use super::registry::{KernelRegistry, ShutdownKernels};
use super::resources::PortPool;
use crate::config::OnShutdown;

/// The kernel registry and the supervisor of its kernel actors: the `kernels` child's state.
pub struct Kernels {
    /// The registry the RPC methods, watcher, stats and heartbeat talk to.
    pub registry: Addr<KernelRegistry>,
    supervisor: Root,
    /// What adopting the store's kernels did at this start.
    pub recovery: RecoveryReport,
}

impl Kernels {
    /// A registry, and the kernels of the store adopted again (allocators as they are).
    ///
    /// Errors: recovery cannot read the store or the engine.
    pub async fn start(ctx: &Arc<AgentContext>) -> anyhow::Result<Kernels> {
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
}

/// The registry of the `kernels` child's current life: a new one after each restart, which
/// the children started after it (and so restarted with it, `rest_for_one`) pick up.
#[derive(Clone)]
pub struct CurrentRegistry(watch::Receiver<Option<Addr<KernelRegistry>>>);

impl CurrentRegistry {
    /// The registry now.
    ///
    /// # Panics
    /// Before the `kernels` child published one, which its place in the tree rules out.
    pub fn get(&self) -> Addr<KernelRegistry> {
        self.0
            .borrow()
            .clone()
            .expect("the kernels child starts before its dependants")
    }
}

/// How the agent's final shutdown treats its kernels; a restart of the `kernels` child always
/// detaches them (the next start adopts them again).
#[derive(Clone)]
pub struct FinalShutdown {
    last: Arc<AtomicBool>,
    mode: Arc<Mutex<OnShutdown>>,
}

impl FinalShutdown {
    /// Kernels are treated per `mode` once [`FinalShutdown::begin`] is called.
    pub fn new(mode: OnShutdown) -> FinalShutdown {
        FinalShutdown {
            last: Arc::new(AtomicBool::new(false)),
            mode: Arc::new(Mutex::new(mode)),
        }
    }

    /// Marks the coming stop as the agent's last, treating kernels per `mode`.
    pub fn begin(&self, mode: OnShutdown) {
        *self.mode.lock().expect("on-shutdown lock") = mode;
        self.last.store(true, Ordering::SeqCst);
    }

    /// `Some(mode)` when the stop under way is the agent's last.
    fn mode(&self) -> Option<OnShutdown> {
        self.last
            .load(Ordering::SeqCst)
            .then(|| *self.mode.lock().expect("on-shutdown lock"))
    }
}

/// The `kernels` child: `first` for its first start (prepared by `Agent::start`, so recovery
/// errors stop the start), [`Kernels::restart`] after. It publishes each life's registry to
/// the returned [`CurrentRegistry`]; stopped, it detaches the kernels (a restart) or treats
/// them per `[agent] on-shutdown` and emits `agent_terminated` (the final shutdown).
pub fn child_spec(
    ctx: Arc<AgentContext>,
    first: Kernels,
    shutdown: FinalShutdown,
) -> (ChildSpec, CurrentRegistry) {
    let (tx, rx) = watch::channel(Some(first.registry.clone()));
    let tx = Arc::new(tx);
    let first = FirstStart::new(first);
    let spec = ChildSpec::task("kernels", move |stop: StopSignal| {
        let (ctx, first, shutdown, tx) = (ctx.clone(), first.clone(), shutdown.clone(), tx.clone());
        async move {
            let k = match first.take() {
                Some(k) => k,
                None => Kernels::restart(&ctx).await.map_err(|e| format!("{e:#}"))?,
            };
            tx.send_replace(Some(k.registry.clone()));
            stop.requested().await;
            let last = shutdown.mode();
            let _ = k
                .registry
                .send(ShutdownKernels(last.unwrap_or(OnShutdown::Preserve)))
                .await;
            if last.is_some() {
                ctx.events.emit(AgentEvent::AgentTerminated {
                    reason: "shutdown".into(),
                });
            }
            k.supervisor.shutdown().await;
            Ok::<_, String>(())
        }
    })
    .shutdown(Shutdown::Infinity);
    (spec, CurrentRegistry(rx))
}

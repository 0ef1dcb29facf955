//! `Scheduler`: places a session's kernel on an `ALIVE` agent with enough free slots (one
//! already holding its image first, then the least loaded), creates it through the agent pool,
//! and destroys and executes in it.
//!
//! Placement is serialized (choose + reserve under one lock), so two requests never take the
//! same free slots; the agent call runs outside the lock. On any failure the reservation is
//! undone in the store: no kernel stays live and `concurrency_used` is as before.
//!
//! A session that does not fit now waits in the queue (`PENDING` rows in the store): the
//! leader's admission rounds (`admit.rs`, planned by the pure `queue.rs`) place it once room
//! frees, in priority order, FIFO or DRF within a priority.
//!
//! One file per concern (the request body is `model::session::SessionRequest`): the pure
//! placement (`place.rs`) and queue order (`queue.rs`), and one per message: create
//! (`create.rs`), admission (`admit.rs`), destroy (`destroy.rs`), execute and logs (`exec.rs`),
//! the leader's drain-deadline check (`drain.rs`) and the reconcile sweep over kernels past
//! their state's deadline (`sweep.rs`).

mod admit;
mod cluster;
mod create;
mod destroy;
mod drain;
mod evict;
mod exec;
mod launch;
mod place;
mod preempt;
mod pull;
mod queue;
mod reclaim;
mod sweep;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

pub use crate::model::session::{MountSpec, ServicePortSpec, SessionRequest};
pub use cluster::OverlaySpec;
pub use create::CreateSession;
pub use destroy::DestroySession;
pub use drain::AGENT_DRAINED;
pub use exec::{ExecuteInSession, LogsChunk, ReadLogs};
pub use place::{fits_some_agent, known_slot_types, parse_request, place, PlaceError};
pub use queue::{dominant_share, plan, Fleet, Plan};
pub use sweep::{timeout_reason, Resolution, DESTROY_RETRY, SWEEP_BATCH, SWEEP_CALL_TIMEOUT};

use super::metrics::ManagerMetrics;
use super::pool::AgentPool;
use super::registry::AgentRegistry;
use super::store::Store;

/// Agent call deadlines and the queue's settings (`[scheduler]`).
#[derive(Clone, Debug)]
pub struct SchedulerSpec {
    /// `create_kernels`.
    pub create_timeout: Duration,
    /// `destroy_kernel`.
    pub destroy_timeout: Duration,
    /// An `execute` run's timeout when the request gives none.
    pub execute_timeout: Duration,
    /// `execute`'s `flush_timeout` when the request gives none (Backend.AI's default: 2 s).
    pub flush_timeout: Duration,
    /// Longest a session waits in `PULLING` for its image (the agent's own
    /// `[container] image-pull-timeout` normally ends a pull first).
    pub image_pull_timeout: Duration,
    /// The registries' credentials, put into each kernel's `ImageConfig.registry`.
    pub registries: Arc<crate::manager::image_registries::ImageRegistries>,
    /// Admission order within a priority.
    pub policy: crate::model::queue::QueuePolicy,
    /// Rounds a head that does not fit holds back the sessions after it.
    pub head_skip_rounds: u32,
    /// Period of the admission rounds.
    pub admission_interval: Duration,
    /// Queued sessions one round looks at.
    pub admission_window: u32,
    /// Deadlines of the transient states, past which the reconcile sweep resolves a kernel.
    pub deadlines: StateDeadlines,
    /// Period of the reconcile sweep (stuck kernels, drain deadlines, cluster sessions).
    pub sweep_interval: Duration,
    /// How a `multi-node` session's kernels spread over the agents (`[scheduler]
    /// cluster-placement`).
    pub cluster_placement: crate::model::cluster::ClusterPlacement,
    /// Where `multi-node` sessions' overlay networks are made (`[scheduler]
    /// swarm-docker-host`, `overlay-mtu`).
    pub overlay: OverlaySpec,
    /// A session's grace period when its request names none (`[scheduler] grace-period`).
    pub grace_period: Duration,
    /// The longest grace period a request may ask for (`[scheduler] max-grace-period`).
    pub max_grace_period: Duration,
    // Idle reclaim.
    /// `[reclaim]`: the reclaim duty's period and warning lead, the default policy.
    pub reclaim: crate::config::ReclaimSection,
    /// Preemption (`[scheduler] preemption`, `preemption-cooldown`).
    pub preemption: PreemptionSpec,
}

/// Preemption's settings (`[scheduler] preemption`, `preemption-cooldown`; issue 41).
#[derive(Clone, Copy, Debug, Default)]
pub struct PreemptionSpec {
    /// Whether admission rounds evict preemptible lower-priority sessions for a pending one
    /// that fits no agent.
    pub enabled: bool,
    /// How long after its preemption a session is not a victim again.
    pub cooldown: Duration,
}

/// How long a kernel may stay in each transient state (`[scheduler] *-timeout`).
#[derive(Clone, Copy, Debug)]
pub struct StateDeadlines {
    /// `SCHEDULED` and `PREPARING`.
    pub preparing: Duration,
    /// `PULLING` (`image-pull-timeout`).
    pub pulling: Duration,
    /// `CREATING`.
    pub creating: Duration,
    /// `TERMINATING`.
    pub terminating: Duration,
    /// `RESTARTING`.
    pub restarting: Duration,
}

/// Start an admission round now (or one more after the one running): `admit.rs` handles it;
/// defined here because creates (`create.rs`) send it too.
#[derive(Message)]
#[rtype(result = "()")]
pub struct AdmitNow;

/// A session was queued on this replica (sent by `create.rs`, handled in `admit.rs`): a round
/// now, unless the last round admitted nothing and started less than an `admission-interval`
/// ago (no room then; the next tick looks again). A burst of creates that queue costs a round
/// per interval, not one per create: with 10,000 agents and a long queue every round reads the
/// whole fleet's usage. With `[scheduler] preemption` on, a session queued ahead of every
/// other (`first_in_line`) gets its round at once all the same: the last round found no room,
/// but it never looked at this session, which may evict lower-priority ones to fit (waiting for
/// the next tick cost issue 41's preemption up to an `admission-interval`). Only a session of
/// a priority above all that wait is first in line, so a burst of queued creates still costs
/// one round per interval.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct Queued {
    /// No session of its priority or higher waited when it was queued.
    pub(crate) first_in_line: bool,
}

/// The scheduler actor.
pub struct Scheduler {
    store: Store,
    pool: Addr<AgentPool>,
    registry: Addr<AgentRegistry>,
    metrics: Arc<ManagerMetrics>,
    spec: SchedulerSpec,
    /// Held while placing: by a direct create, and by an admission round.
    placing: Arc<tokio::sync::Mutex<()>>,
    /// Only the leader admits from the queue.
    leader: crate::manager::leader::Leadership,
    /// An admission round is running.
    round_running: bool,
    /// Another round was asked for while one ran.
    round_again: bool,
    /// A reconcile sweep pass is running (`sweep.rs`).
    sweep_running: bool,
    /// When the last round started and how many it admitted.
    last_round: Option<(std::time::Instant, usize)>,
    /// The thread admission rounds run on (`admit.rs`).
    rounds: actix::ArbiterHandle,
    /// The candidates' slot types, computed once per fleet change.
    slot_types: place::SlotTypesMemo,
}

impl Scheduler {
    /// A scheduler over the store, pool and registry; its admission rounds run on `rounds`
    /// (an arbiter of their own: reading a window of the queue and the fleet's usage, and
    /// planning, take tens of ms with 10,000 agents, which creates would otherwise wait for).
    pub fn new(
        store: Store,
        pool: Addr<AgentPool>,
        registry: Addr<AgentRegistry>,
        metrics: Arc<ManagerMetrics>,
        spec: SchedulerSpec,
        leader: crate::manager::leader::Leadership,
        rounds: actix::ArbiterHandle,
    ) -> Self {
        Scheduler {
            store,
            pool,
            registry,
            metrics,
            spec,
            placing: Arc::new(tokio::sync::Mutex::new(())),
            leader,
            round_running: false,
            round_again: false,
            sweep_running: false,
            last_round: None,
            rounds,
            slot_types: Default::default(),
        }
    }

    /// The parts a kernel's creation needs.
    fn launcher(&self) -> launch::Launcher {
        launch::Launcher {
            store: self.store.clone(),
            pool: self.pool.clone(),
            metrics: self.metrics.clone(),
            spec: self.spec.clone(),
        }
    }
}

impl Actor for Scheduler {
    type Context = Context<Self>;

    /// Admission rounds: every `admission-interval`, and whenever this replica ends a kernel;
    /// the drain-deadline check (`drain.rs`) and the reconcile sweep (`sweep.rs`) every
    /// `sweep-interval`.
    fn started(&mut self, ctx: &mut Context<Self>) {
        drain::start(self, ctx);
        reclaim::start(self, ctx);
        ctx.run_interval(self.spec.admission_interval, |act, ctx| {
            act.start_round(ctx)
        });
        ctx.run_interval(self.spec.sweep_interval, |act, ctx| act.start_sweep(ctx));
        let released = self.store.released();
        let me = ctx.address().downgrade();
        actix::spawn(async move {
            loop {
                released.notified().await;
                match me.upgrade() {
                    Some(addr) => addr.do_send(AdmitNow),
                    None => break,
                }
            }
        });
    }
}

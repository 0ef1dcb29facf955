//! `Scheduler`: places a session's kernel on an `ALIVE` agent with enough free slots (one
//! already holding its image first, then the least loaded), creates it through the agent pool,
//! and destroys and executes in it.
//!
//! Placement is serialized (choose + reserve under one lock), so two requests never take the
//! same free slots; the agent call runs outside the lock. On any failure the reservation is
//! undone in the store: no kernel stays live and `concurrency_used` is as before.
//!
//! One file per concern (the request body is `model::session::SessionRequest`): the pure placement (`place.rs`),
//! and one per message: create (`create.rs`), destroy (`destroy.rs`), execute and logs
//! (`exec.rs`).

mod create;
mod destroy;
mod exec;
mod place;
mod pull;

use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;

pub use crate::model::session::{MountSpec, ServicePortSpec, SessionRequest};
pub use create::CreateSession;
pub use destroy::DestroySession;
pub use exec::{ExecuteInSession, LogsChunk, ReadLogs};
pub use place::{known_slot_types, parse_request, place};

use super::metrics::ManagerMetrics;
use super::pool::AgentPool;
use super::registry::AgentRegistry;
use super::store::Store;

/// Agent call deadlines.
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
}

/// The scheduler actor.
pub struct Scheduler {
    store: Store,
    pool: Addr<AgentPool>,
    registry: Addr<AgentRegistry>,
    metrics: Arc<ManagerMetrics>,
    spec: SchedulerSpec,
    placing: Arc<tokio::sync::Mutex<()>>,
}

impl Scheduler {
    /// A scheduler over the store, pool and registry.
    pub fn new(
        store: Store,
        pool: Addr<AgentPool>,
        registry: Addr<AgentRegistry>,
        metrics: Arc<ManagerMetrics>,
        spec: SchedulerSpec,
    ) -> Self {
        Scheduler {
            store,
            pool,
            registry,
            metrics,
            spec,
            placing: Arc::new(tokio::sync::Mutex::new(())),
        }
    }
}

impl Actor for Scheduler {
    type Context = Context<Self>;
}

//! The manager actor host: the agent side of the control plane (`docs/scenarios.md`).
//!
//! ```text
//! manager (one_for_all, no restart: fail-stop)
//! ├─ store      sqlx: SQLite file by default, PostgreSQL by URL; migrations    store/
//! ├─ leader     which replica runs the single-leader duties                    leader.rs
//! ├─ pool       one persistent DEALER per agent, ping health checks            pool/
//! ├─ registry   liveness ALIVE/LOST/PENDING/TERMINATED, grace, event batches  registry/
//! ├─ intake     ROUTER :6021 (callosum, CURVE): agent_events, agent_heartbeat  intake.rs
//! ├─ scheduler  placement, create/destroy/execute through the pool            scheduler.rs
//! └─ api        actix-web :8081, /metrics                                      api/
//! ```
//! Started in that order (each needs only those before it), stopped in reverse: the API (in-
//! flight requests get 5 s), the intake, the registry (flushing agent rows), the pool, the
//! store. Each child is built by a `child_spec` function in its own module of `tree/`, beside
//! the conversion of its config into what it holds; [`Manager::start`] lists them, and
//! `tree/mod.rs` says why the tree is fail-stop. `tests/it/trees.rs` compares this drawing
//! with the running tree (`WhichChildren`).
//!
//! Threads: the registry, the intake and the scheduler's admission rounds each run on an actix
//! arbiter of their own (the intake's at nice 10), so that a fleet's heartbeats and a long
//! queue's rounds never hold up the creates and status changes served by the system thread
//! (the pool, the scheduler's actor) and the API's workers (issue 27's flood create p99;
//! seed 004's prioritised status updates).
//!
//! The event stream (`event_hub.rs`, `GET /v1/events`) is no child: a shared value the store
//! (session status changes, as it commits them) and the registry (agent liveness) publish to and
//! the API's followers read, bounded whatever they do; it lives as long as its holders.

pub mod api;
pub mod bootstrap;
pub mod calls;
pub mod commits;
pub mod console;
pub mod credentials;
pub mod error;
pub mod event_hub;
pub mod events;
pub mod image_registries;
pub mod intake;
pub mod leader;
pub mod metrics;
pub mod pool;
pub mod registry;
pub mod scheduler;
pub mod store;
pub mod tls;
mod tree;
pub mod vfolder_name;

use std::net::SocketAddr;
use std::sync::Arc;

use actix::Addr;
use actors::{ChildSpec, Root, Supervisor};
use anyhow::Context as _;

use crate::config::ManagerConfig;
use crate::rpc::curve::load_keypair;

/// A running manager: the manager supervisor's tree.
pub struct Manager {
    root: Root,
    leader: leader::Leadership,
    intake_endpoint: String,
    api_addr: SocketAddr,
}

impl Manager {
    /// Opens the store (migrating it), makes sure it has an admin key ([`bootstrap`]), and
    /// starts the pool, registry,
    /// intake, scheduler and API. Must run inside an actix system.
    ///
    /// Errors: the store cannot be opened; a key file is unreadable; `[api] tls-cert` or
    /// `tls-key` is unreadable or invalid (the message names the file); the intake or API
    /// address cannot be bound.
    pub async fn start(config: &ManagerConfig) -> anyhow::Result<Manager> {
        let metrics = Arc::new(metrics::ManagerMetrics::new());
        let tree::store::Opened {
            store,
            lock,
            events,
        } = tree::store::open(config, &metrics).await?;
        let keypair = config
            .manager
            .rpc_keypair
            .as_deref()
            .map(load_keypair)
            .transpose()?;
        let pool = tree::pool::start(config, keypair.clone()).await?;
        let leader = tree::leader::start(config, &store);
        let registry = tree::registry::start(
            config,
            &store,
            &pool.pool,
            &metrics,
            &leader,
            pool.inbox_capacity,
        )
        .await?;
        let intake =
            tree::intake::start(config, keypair, &registry.addr, registry.inbox, &metrics)?;
        // `[[registry]]`'s passwords, read once: the scheduler's pulls and the API's pushes.
        let registries = Arc::new(
            image_registries::ImageRegistries::load(&config.registry).context("[[registry]]")?,
        );
        let (scheduler, rounds) = tree::scheduler::start(
            config,
            &store,
            &pool.pool,
            &registry.addr,
            &metrics,
            &leader,
            registries.clone(),
        );
        let api = tree::api::bind(
            config,
            api::ApiState {
                store: store.clone(),
                registry: registry.addr.clone(),
                scheduler: scheduler.clone(),
                pool: pool.pool.clone(),
                metrics,
                leader: leader.clone(),
                max_upload_size: config.api.max_upload_size.0,
                registries,
                commits: commits::Commits::default(),
                events,
            },
        )?;
        let backend = store.backend();

        // The tree, in start order (see the module doc).
        let children: [ChildSpec; 7] = [
            tree::store::child_spec(store, lock),
            tree::leader::child_spec(leader.clone()),
            tree::pool::child_spec(pool.pool),
            tree::registry::child_spec(registry.addr, registry.thread),
            tree::intake::child_spec(intake.server, intake.thread),
            tree::scheduler::child_spec(scheduler, rounds),
            tree::api::child_spec(api.server),
        ];
        let root = children
            .into_iter()
            .fold(tree::supervisor(), |tree, child| tree.child(child))
            .start();
        tracing::info!(api = %api.addr, scheme = api.scheme, intake = %intake.endpoint, store = ?backend, grace = ?config.manager.startup_grace.0, "manager started");
        Ok(Manager {
            root,
            leader,
            intake_endpoint: intake.endpoint,
            api_addr: api.addr,
        })
    }

    /// The manager supervisor (the root of the tree in the module doc), for
    /// [`actors::WhichChildren`].
    pub fn supervisor(&self) -> Addr<Supervisor> {
        self.root.addr()
    }

    /// Where the API listens.
    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr
    }

    /// Whether this replica holds the single-leader duties now.
    pub fn is_leader(&self) -> bool {
        self.leader.is_leader()
    }

    /// The intake's endpoint, `tcp://host:port`.
    pub fn intake_endpoint(&self) -> &str {
        &self.intake_endpoint
    }

    /// Stops the tree in reverse order: API (in-flight requests get 5 s), scheduler, intake,
    /// registry (flushing agent rows), pool, leadership, store.
    pub async fn stop(self) {
        let exit = self.root.shutdown().await;
        tracing::debug!(?exit, "manager supervisor stopped");
    }
}

/// Runs the manager until SIGINT or SIGTERM.
pub async fn run(config: ManagerConfig) -> anyhow::Result<()> {
    let manager = Manager::start(&config).await?;
    crate::signals::wait_for_shutdown().await;
    tracing::info!("manager shutting down");
    manager.stop().await;
    tracing::info!("manager stopped");
    Ok(())
}

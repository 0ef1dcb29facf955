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
//! store. Each child is built in `tree.rs`, which says why the tree is fail-stop;
//! `tests/it/trees.rs` compares this drawing with the running tree (`WhichChildren`).
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

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use actix::{Actor, Addr};
use actors::{ChildSpec, Root, Supervisor};
use anyhow::Context as _;

use crate::config::ManagerConfig;
use crate::rpc::curve::{load_certificate, load_keypair};
use crate::rpc::{RpcServer, ServerCurve};
use pool::{AgentEndpoint, AgentPool, RegisterAgent};
use registry::{AgentRegistry, HeartbeatInbox, RegistrySpec};
use scheduler::{Scheduler, SchedulerSpec};
use store::Store;

/// Intake calls handled at once; past it the intake stops reading its socket until one is
/// answered, so agents wait in their own queues (ZeroMQ's high-water marks) instead of the
/// manager's memory. Heartbeats are answered at once and never count; this bounds the
/// `agent_events` batches waiting for the registry.
const INTAKE_MAX_IN_FLIGHT: usize = 1024;

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
        let m = &config.manager;
        // Before anything migrates: SQLite serves one manager.
        let sqlite_lock = leader::SqliteLock::acquire(&config.store.url)?;
        let metrics = Arc::new(metrics::ManagerMetrics::new());
        // The event stream: fed by the store's status writes and the registry's liveness.
        let events = event_hub::EventHub::new(
            event_hub::HubSpec {
                history: config.events.history,
                queue: config.events.queue,
            },
            Some(metrics.clone()),
        );
        let store = Store::connect(&config.store.url)
            .await
            .with_context(|| format!("store {}", redact(&config.store.url)))?
            .with_events(events.clone());
        bootstrap::ensure_admin_key(&store, &config.api.admin_token_file).await?;
        let keypair = m.rpc_keypair.as_deref().map(load_keypair).transpose()?;

        let mut pool_spec = config.agent_pool.spec();
        // The heartbeat inbox's bound: the configured fleet, not the descriptor-derived estimate
        // below (agents sharing connections need fewer).
        let inbox_capacity = pool_spec.max_agents as usize;
        match config.agent_pool.max_agents {
            Some(n) => {
                crate::limits::ensure_open_files(
                    pool::PoolSpec::fds_needed(n),
                    "[agent-pool] max-agents",
                )?;
            }
            None => {
                let (soft, hard) = crate::limits::raise_open_files()?;
                let fits = pool::PoolSpec::agents_for_fds(soft);
                if fits < pool_spec.max_agents {
                    tracing::warn!(soft, hard, agents = fits, "RLIMIT_NOFILE serves only this many agents; raise it (LimitNOFILE) for a larger fleet, or set [agent-pool] max-agents to be refused at start instead");
                    pool_spec.max_agents = fits;
                }
            }
        }
        let pool = AgentPool::new(pool_spec, keypair.clone())
            .context("[agent-pool] max-agents / io-threads")?
            .start();
        for agent in &config.agents {
            let public_key = agent
                .public_key
                .as_deref()
                .map(load_certificate)
                .transpose()?
                .map(|c| c.public);
            pool.send(RegisterAgent {
                agent_id: agent.id.clone(),
                endpoint: AgentEndpoint {
                    addr: agent.addr.zmq_endpoint(),
                    public_key,
                },
            })
            .await?;
        }

        let spec = RegistrySpec {
            heartbeat_timeout: m.heartbeat_timeout.0,
            startup_grace: m.startup_grace.0,
            reset_timeout: config.scheduler.reset_timeout.0,
            processed_event_retention: m.processed_event_retention.0,
            dangling_grace: m.dangling_grace.0,
            dangling_call_timeout: config.scheduler.destroy_timeout.0,
        };
        let rows = store.agents().await?;
        // One heartbeat per agent waits at most.
        let inbox = Arc::new(HeartbeatInbox::new(inbox_capacity));
        let leader = leader::Leadership::start(&store, m.leader_lease.0);
        let registry = AgentRegistry::new(
            store.clone(),
            pool.clone(),
            metrics.clone(),
            spec,
            leader.clone(),
            rows,
            inbox.clone(),
        );
        // Its own thread: a fleet's heartbeat batches (thousands at a time, tens of ms) would
        // otherwise hold up every continuation of the scheduler's futures — a create waited
        // behind them for its INSERT's answer (issue 27's flood create p99; seed 004).
        let registry_thread = actix::Arbiter::new();
        let registry =
            AgentRegistry::start_in_arbiter(&registry_thread.handle(), move |_| registry);

        let curve = match (&keypair, &m.agent_keys_dir) {
            (Some(keypair), Some(dir)) => {
                let allowed = intake::load_agent_keys(dir)
                    .with_context(|| format!("manager.agent-keys-dir {}", dir.display()))?;
                tracing::info!(keys = allowed.len(), dir = %dir.display(), "event intake admits these agent keys (CURVE)");
                let dir2 = dir.clone();
                let reload = crate::rpc::zap::KeyReload(Arc::new(move || {
                    match intake::load_agent_keys(&dir2) {
                        Ok(keys) => Some(keys),
                        Err(e) => {
                            tracing::warn!(error = %e, "re-reading manager.agent-keys-dir failed; keeping the keys admitted so far");
                            None
                        }
                    }
                }));
                Some(ServerCurve {
                    keypair: keypair.clone(),
                    allowed_clients: allowed,
                    reload: Some(reload),
                })
            }
            _ => {
                tracing::warn!("event intake is unauthenticated: set [manager] rpc-keypair and agent-keys-dir for CURVE");
                None
            }
        };
        let server = RpcServer::bind(
            &m.event_listen_addr.zmq_endpoint(),
            curve,
            intake::dispatcher(registry.clone(), inbox, metrics.clone()),
        )
        .with_context(|| format!("manager.event-listen-addr {}", m.event_listen_addr))?
        .max_in_flight(INTAKE_MAX_IN_FLIGHT);
        let intake_endpoint = server.endpoint().to_owned();
        // Its own thread: decoding a fleet's heartbeats and events does not take the thread
        // the scheduler and pool share.
        let intake_thread = actix::Arbiter::new();
        // Below the API's and the scheduler's threads in the kernel's CPU scheduling: on a
        // saturated host a fleet's heartbeats (superseded by the next, latest wins) wait, not
        // the creates and status changes (seed 004: status updates prioritised over the volume
        // of node messages). Best effort: a host that refuses it runs the intake at the normal
        // priority.
        intake_thread.spawn(async { lower_this_threads_priority(INTAKE_NICE) });
        let intake = RpcServer::start_in_arbiter(&intake_thread.handle(), |_| server);

        // `[[registry]]`'s passwords, read once: the scheduler's pulls and the API's pushes.
        let registries = Arc::new(
            image_registries::ImageRegistries::load(&config.registry).context("[[registry]]")?,
        );
        let sched_spec = SchedulerSpec {
            create_timeout: config.scheduler.create_timeout.0,
            destroy_timeout: config.scheduler.destroy_timeout.0,
            execute_timeout: config.scheduler.execute_timeout.0,
            flush_timeout: config.scheduler.flush_timeout.0,
            image_pull_timeout: config.scheduler.image_pull_timeout.0,
            registries: registries.clone(),
            policy: config.scheduler.policy,
            head_skip_rounds: config.scheduler.head_skip_rounds,
            admission_interval: config.scheduler.admission_interval.0,
            admission_window: config.scheduler.admission_window.max(1),
            deadlines: scheduler::StateDeadlines {
                preparing: config.scheduler.preparing_timeout.0,
                pulling: config.scheduler.image_pull_timeout.0,
                creating: config.scheduler.creating_timeout.0,
                terminating: config.scheduler.terminating_timeout.0,
                restarting: config.scheduler.restarting_timeout.0,
            },
            sweep_interval: config.scheduler.sweep_interval.0,
        };
        let rounds_thread = actix::Arbiter::new();
        let scheduler = Scheduler::new(
            store.clone(),
            pool.clone(),
            registry.clone(),
            metrics.clone(),
            sched_spec,
            leader.clone(),
            rounds_thread.handle(),
        )
        .start();

        // Read before anything listens, so a bad certificate or key stops the start naming the
        // file.
        let tls = match (&config.api.tls_cert, &config.api.tls_key) {
            (Some(cert), Some(key)) => Some(tls::server_config(cert, key)?),
            _ => {
                tracing::warn!("the HTTP API is plain HTTP (no TLS): set [api] tls-cert and tls-key to serve HTTPS");
                None
            }
        };
        let listener = TcpListener::bind((
            config.api.listen_addr.host.as_str(),
            config.api.listen_addr.port,
        ))
        .with_context(|| format!("api.listen-addr {}", config.api.listen_addr))?;
        let api_addr = listener.local_addr()?;
        let state = api::ApiState {
            store: store.clone(),
            registry: registry.clone(),
            scheduler: scheduler.clone(),
            pool: pool.clone(),
            metrics,
            leader: leader.clone(),
            max_upload_size: config.api.max_upload_size.0,
            registries,
            commits: commits::Commits::default(),
            events,
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let api = api::serve(listener, config.api.workers, state, tls)?;
        let backend = store.backend();

        // The tree, in start order (see the module doc).
        let children: [ChildSpec; 7] = [
            tree::store(store, sqlite_lock),
            tree::leader(leader.clone()),
            tree::pool(pool),
            tree::registry(registry, registry_thread),
            tree::intake(intake, intake_thread),
            tree::scheduler(scheduler, rounds_thread),
            tree::api(api),
        ];
        let root = children
            .into_iter()
            .fold(tree::supervisor(), |tree, child| tree.child(child))
            .start();
        tracing::info!(api = %api_addr, scheme, intake = %intake_endpoint, store = ?backend, grace = ?m.startup_grace.0, "manager started");
        Ok(Manager {
            root,
            leader,
            intake_endpoint,
            api_addr,
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

/// The nice value of the intake's thread (`setpriority` on the thread alone: 0 is the
/// process's own, 19 the lowest; 10 weighs about a tenth of a normal thread on a busy core).
const INTAKE_NICE: i32 = 10;

/// Sets the calling thread's nice value to `nice` (Linux: a thread is its own scheduling
/// entity). Logs and keeps the priority when refused.
fn lower_this_threads_priority(nice: i32) {
    // SAFETY: gettid and setpriority take no pointers; they act on this thread only.
    let r = unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, nice)
    };
    if r != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "the intake's thread keeps its priority");
    }
}

/// `postgres://user:secret@host` → `postgres://user:***@host` for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].find(':') {
            Some(c) => format!("{}:***{}", &url[..s + 3 + c], &url[at..]),
            None => url.to_owned(),
        },
        _ => url.to_owned(),
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

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_passwords() {
        assert_eq!(
            super::redact("postgres://kv:secret@127.0.0.1/db"),
            "postgres://kv:***@127.0.0.1/db"
        );
        assert_eq!(super::redact("sqlite://var/m.db"), "sqlite://var/m.db");
    }
}

//! The manager's store, through sqlx's `Any` driver: a SQLite file by default (embedded, zero
//! set-up), PostgreSQL for a fleet (`postgres://…`), one schema for both
//! (`migrations/manager/`, applied at start).
//!
//! What the store decides itself, so that no caller can get it wrong: a kernel leaves the live
//! set at most once, and `concurrency_used` of its access key drops in the same transaction
//! (invariant 2 of `docs/scenarios.md`; the column also has `CHECK (concurrency_used >= 0)`).

mod agents;
mod columns;
mod dangling;
mod depth;
mod events;
mod kernels;
mod keys;
mod preemption;
mod queue;
mod reclaim;
mod requeue;
mod sweep;
mod usage;
mod vfolders;

use std::str::FromStr;
use std::time::Duration;

use sqlx::any::{AnyConnectOptions, AnyPoolOptions};
use sqlx::{AnyPool, Executor};

use super::event_hub::{EventHub, HubSpec};
use crate::model::event::Event;
use crate::model::session::KernelStatus;

pub use agents::AgentRow;
pub use columns::ReclaimColumns;
pub use dangling::DanglingReport;
pub use events::Applied;
pub use kernels::{KernelRow, NewKernel, ReserveError};
pub use keys::{AccessKeyRow, DeleteKeyError, KeyChange, ROLE_ADMIN, ROLE_USER};
pub use preemption::{PreemptCandidate, PREEMPTED};
pub use queue::{Admitted, KeyShare, QueuedSession};
pub use requeue::{RESTART, RESTART_COUNT_ENV};
pub use sweep::{is_transient, Deadlines, OrphanedPull};
pub use usage::Usage;
pub use vfolders::VfolderRow;

/// Store errors: the database failed or refused (constraint); the message names the query.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// sqlx error.
    #[error("store: {0}")]
    Db(#[from] sqlx::Error),
    /// Migration failure at start.
    #[error("store migrations: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// A URL that is neither `sqlite:` nor `postgres:`/`postgresql:`.
    #[error("store url `{0}`: expected sqlite://PATH or postgres://…")]
    Url(String),
}

impl StoreError {
    /// Whether the database could not be reached or refused to serve (connection, pool timeout,
    /// I/O, server shutting down, database gone): an outage to retry, not a bug. The API answers
    /// these 503 `store-unavailable`.
    pub fn is_unavailable(&self) -> bool {
        let StoreError::Db(e) = self else {
            return false;
        };
        match e {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => true,
            sqlx::Error::Database(d) => {
                let code = d.code().unwrap_or_default();
                // PostgreSQL SQLSTATE classes 08 (connection), 53 (resources), 57 (operator
                // intervention), 3D000 (no such database); SQLite 5/6/10/14 (busy, locked,
                // I/O, cannot open).
                code.starts_with("08")
                    || code.starts_with("53")
                    || code.starts_with("57")
                    || code == "3D000"
                    || matches!(code.as_ref(), "5" | "6" | "10" | "14")
            }
            _ => false,
        }
    }
}

/// Which database a store runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Embedded SQLite file: one connection (SQLite has one writer anyway, and this way no
    /// transaction ever waits on a lock upgrade).
    Sqlite,
    /// PostgreSQL server.
    Postgres,
}

/// A connected, migrated store. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    /// Where the long snapshot reads go (an admission round's window, the usage ledger's
    /// reload, the queue's counts): on SQLite, two read-only connections beside the one that
    /// writes, so that a create's write does not wait behind such a read (WAL readers and the
    /// writer do not block each other; each read sees every commit made before it starts). On
    /// PostgreSQL, the same pool.
    reads: AnyPool,
    backend: Backend,
    /// Where every kernel status change it commits is published (the event stream,
    /// `GET /v1/events`): the store is the one place they all pass.
    events: EventHub,
    /// This process's replica id (a fresh UUID per start): rows it writes carry it, so that it
    /// re-reads only what other replicas wrote.
    replica: std::sync::Arc<str>,
    /// Notified when this replica commits a kernel's end (its slots and concurrency freed): the
    /// queue's admission round starts at once instead of at its next tick.
    released: std::sync::Arc<tokio::sync::Notify>,
    /// Every placed live kernel's slots by agent and by key, in memory (`usage.rs`).
    usage: std::sync::Arc<usage::Ledger>,
    /// Queued sessions per priority, in memory (`depth.rs`).
    depth: std::sync::Arc<depth::Depth>,
}

/// Read-only SQLite connections beside the writer ([`Store`]'s `reads`).
const SQLITE_READERS: u32 = 2;

/// Unix time now, seconds.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

impl Store {
    /// Connects to `url` (`sqlite://PATH` — created with its directory when missing — or
    /// `postgres://user:pass@host/db`) and applies the migrations.
    ///
    /// Errors: [`StoreError::Url`] for another scheme; connection or migration failures.
    pub async fn connect(url: &str) -> Result<Store, StoreError> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres:") || url.starts_with("postgresql:") {
            Backend::Postgres
        } else {
            return Err(StoreError::Url(url.to_owned()));
        };
        let mut url = url.to_owned();
        if backend == Backend::Sqlite {
            let path = url.trim_start_matches("sqlite:").trim_start_matches("//");
            let path = path.split('?').next().unwrap_or_default();
            if let Some(dir) = std::path::Path::new(path)
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
            {
                std::fs::create_dir_all(dir).map_err(sqlx::Error::Io)?;
            }
            if !url.contains("mode=") {
                url.push_str(if url.contains('?') {
                    "&mode=rwc"
                } else {
                    "?mode=rwc"
                });
            }
        }
        let options = AnyConnectOptions::from_str(&url)?;
        let read_url = url.replace("mode=rwc", "mode=ro");
        let pool = match backend {
            Backend::Sqlite => {
                AnyPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(30))
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            conn.execute("PRAGMA journal_mode = WAL").await?;
                            conn.execute("PRAGMA synchronous = NORMAL").await?;
                            conn.execute("PRAGMA foreign_keys = ON").await?;
                            conn.execute("PRAGMA busy_timeout = 5000").await?;
                            Ok(())
                        })
                    })
                    .connect_with(options)
                    .await?
            }
            Backend::Postgres => {
                AnyPoolOptions::new()
                    .max_connections(8)
                    .acquire_timeout(Duration::from_secs(30))
                    .connect_with(options)
                    .await?
            }
        };
        sqlx::migrate!("migrations/manager").run(&pool).await?;
        // Opened after the migrations: the file exists, in WAL mode (a database setting).
        let reads = match backend {
            Backend::Sqlite => {
                AnyPoolOptions::new()
                    .max_connections(SQLITE_READERS)
                    .acquire_timeout(Duration::from_secs(30))
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            conn.execute("PRAGMA busy_timeout = 5000").await?;
                            conn.execute("PRAGMA query_only = ON").await?;
                            Ok(())
                        })
                    })
                    .connect_with(AnyConnectOptions::from_str(&read_url)?)
                    .await?
            }
            Backend::Postgres => pool.clone(),
        };
        // Other replicas place and end kernels too: their writes arrive by reload. On SQLite one
        // manager holds the file (`sqlite_lock`): every write is this one's.
        let refresh = match backend {
            Backend::Postgres => Duration::from_secs(1),
            Backend::Sqlite => Duration::from_secs(60),
        };
        Ok(Store {
            pool,
            reads,
            backend,
            events: EventHub::new(HubSpec::default(), None),
            replica: uuid::Uuid::new_v4().simple().to_string().into(),
            released: Default::default(),
            usage: std::sync::Arc::new(usage::Ledger::new(refresh)),
            depth: std::sync::Arc::new(depth::Depth::new(refresh)),
        })
    }

    /// This store publishing to `events` (the manager's hub, with its configured bounds and
    /// metrics) instead of the unobserved one [`Store::connect`] gives it.
    pub fn with_events(mut self, events: EventHub) -> Store {
        self.events = events;
        self
    }

    /// The hub its changes are published to.
    pub fn events(&self) -> &EventHub {
        &self.events
    }

    /// Publishes a committed change's event, answering whether there was one (what the
    /// callers' `bool` results have always meant: the row changed).
    fn publish(&self, event: Option<Event>) -> bool {
        if let Some(e) = event
            .as_ref()
            .filter(|e| e.status.as_deref() == Some(KernelStatus::Terminated.as_str()))
        {
            if let Some(id) = &e.kernel_id {
                self.usage.remove(id);
            }
            self.released.notify_one();
        }
        event.map(|e| self.events.publish(e)).is_some()
    }

    /// Notified (one waiter, a permit kept when none waits) each time this replica ends a
    /// placed kernel: capacity may have freed for a `PENDING` session.
    pub fn released(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.released.clone()
    }

    /// This process's replica id (a UUID, fresh per start).
    pub fn replica_id(&self) -> &str {
        &self.replica
    }

    /// The connection pool, for the leader lock (`super::leader`), which needs a dedicated
    /// session of its own.
    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// The database this store runs on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Closes every connection.
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// Tests' fixture: a fresh SQLite store (in its directory, kept alive by the caller) with the
/// user key `AK` (no concurrency limit).
#[cfg(test)]
pub(crate) async fn test_store_with_key() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(&format!("sqlite://{}/m.db", dir.path().display()))
        .await
        .unwrap();
    store
        .create_access_key("AK", "hash", "user", "", 0)
        .await
        .unwrap();
    (dir, store)
}

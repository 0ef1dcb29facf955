//! Which replica runs the single-leader duties: the heartbeat-timeout sweep (`LOST`),
//! the `reset_instance` flow, processed-event pruning and dangling-kernel decisions.
//!
//! - **PostgreSQL** (a fleet, several managers): the replica holding the session-level advisory
//!   lock [`ADVISORY_KEY`] leads, as Backend.AI's managers share a `pg_advisory` lock. The lock
//!   lives on one dedicated connection (detached from the pool, so it never goes back to it
//!   still holding the lock). A replica that dies closes its socket and PostgreSQL frees the lock
//!   at once; one that hangs or loses the network is cut off by the session's TCP keepalives,
//!   set from `[manager] leader-lease`. Standbys try the lock every `lease / 4`; the leader
//!   checks its connection as often and steps down when the check fails or takes longer than
//!   `lease / 2`. So the duties move to a survivor within the lease.
//! - **SQLite** (one manager): a second manager on the same file is refused at start by an
//!   exclusive `flock` on `<file>.lock` ([`SqliteLock`]); the one that runs always leads.

use std::fs::File;
use std::io::Write as _;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sqlx::{AnyConnection, Connection as _};
use tokio::sync::watch;

use super::store::{Backend, Store};

/// The advisory lock key the leader holds (`pg_try_advisory_lock(bigint)`): "kvleader" in ASCII.
pub const ADVISORY_KEY: i64 = 0x6b76_6c65_6164_6572;

/// Whether this replica leads now; cheap to clone and to read.
#[derive(Clone, Debug)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
}

impl Leadership {
    /// A replica that always leads (SQLite: the file lock made it the only one).
    pub fn always() -> Leadership {
        // The value stays readable after the sender is gone; `changed` then says so.
        let (_, rx) = watch::channel(true);
        Leadership { rx }
    }

    /// Whether this replica holds the leadership now.
    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    /// Resolves when the leadership changes; `false` when its source has stopped.
    pub async fn changed(&mut self) -> bool {
        self.rx.changed().await.is_ok()
    }

    /// Starts the advisory-lock loop on `store` (PostgreSQL) with `lease`; on SQLite, always
    /// leads. The loop runs until the returned [`Leadership`] and every clone are dropped and
    /// the process stops.
    pub fn start(store: &Store, lease: Duration) -> Leadership {
        if store.backend() == Backend::Sqlite {
            return Leadership::always();
        }
        let (tx, rx) = watch::channel(false);
        actix_rt::spawn(lock_loop(store.clone(), lease, tx));
        Leadership { rx }
    }
}

async fn lock_loop(store: Store, lease: Duration, tx: watch::Sender<bool>) {
    let tick = (lease / 4).max(Duration::from_millis(100));
    let mut conn: Option<AnyConnection> = None;
    let mut leading = false;
    loop {
        if tx.is_closed() {
            break;
        }
        match conn.as_mut() {
            None => match dedicated(&store, lease).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    tracing::warn!(error = %e, "leader lock: no connection to the store; retrying")
                }
            },
            Some(c) if !leading => {
                let got = tokio::time::timeout(
                    lease / 2,
                    sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
                        .bind(ADVISORY_KEY)
                        .fetch_one(&mut *c),
                )
                .await;
                match got {
                    Ok(Ok(true)) => {
                        leading = true;
                        tracing::info!(
                            replica = store.replica_id(),
                            "this manager now leads (advisory lock held)"
                        );
                        let _ = tx.send(true);
                    }
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "leader lock: trying the lock failed; reconnecting");
                        conn = None;
                    }
                    Err(_) => {
                        tracing::warn!("leader lock: trying the lock timed out; reconnecting");
                        conn = None;
                    }
                }
            }
            Some(c) => {
                let started = Instant::now();
                let ok = tokio::time::timeout(lease / 2, sqlx::query("SELECT 1").execute(&mut *c))
                    .await
                    .map(|r| r.is_ok())
                    .unwrap_or(false);
                if !ok {
                    tracing::error!(replica = store.replica_id(), took = ?started.elapsed(), "lost the leader lock's connection: stepping down");
                    leading = false;
                    let _ = tx.send(false);
                    // Dropping it closes the session (and frees the lock, if the server still
                    // holds it for us).
                    conn = None;
                }
            }
        }
        tokio::time::sleep(tick).await;
    }
    if let Some(c) = conn {
        let _ = c.close().await;
    }
}

/// A connection of its own, with TCP keepalives such that the server drops a vanished leader's
/// session (and its lock) within about `lease`.
async fn dedicated(store: &Store, lease: Duration) -> Result<AnyConnection, sqlx::Error> {
    let mut c = store.pool().acquire().await?.detach();
    let idle = (lease.as_secs() / 2).max(1);
    let count = (lease.as_secs() / 4).max(1);
    for set in [
        format!("SET tcp_keepalives_idle = {idle}"),
        "SET tcp_keepalives_interval = 1".to_owned(),
        format!("SET tcp_keepalives_count = {count}"),
    ] {
        sqlx::query(&set).execute(&mut c).await?;
    }
    Ok(c)
}

/// The exclusive lock a manager holds on its SQLite file (`<file>.lock`, `flock`): SQLite serves
/// one manager. Released when dropped or when the process dies.
#[derive(Debug)]
pub struct SqliteLock {
    _file: File,
}

impl SqliteLock {
    /// Takes the lock for the store at `url` (`sqlite://PATH…`); `None` for other URLs.
    ///
    /// Errors: another process holds it (the message names the lock file and that process's
    /// pid); the lock file cannot be created.
    pub fn acquire(url: &str) -> anyhow::Result<Option<SqliteLock>> {
        let Some(rest) = url.strip_prefix("sqlite:") else {
            return Ok(None);
        };
        let path = rest.trim_start_matches("//");
        let path = path.split('?').next().unwrap_or_default();
        if path.is_empty() || path == ":memory:" {
            return Ok(None);
        }
        let lock = lock_path(Path::new(path));
        if let Some(dir) = lock.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&lock)
            .map_err(|e| anyhow::anyhow!("store lock {}: {e}", lock.display()))?;
        // SAFETY: flock on a file descriptor we own; no memory is passed.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let holder = std::fs::read_to_string(&lock).unwrap_or_default();
            anyhow::bail!(
                "store {url} is in use by another manager (lock {} held{}): SQLite serves one \
                 manager; run several managers on PostgreSQL",
                lock.display(),
                match holder.trim() {
                    "" => String::new(),
                    pid => format!(" by pid {pid}"),
                }
            );
        }
        file.set_len(0)?;
        writeln!(file, "{}", std::process::id())?;
        Ok(Some(SqliteLock { _file: file }))
    }
}

fn lock_path(db: &Path) -> PathBuf {
    let mut s = db.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

#[cfg(test)]
mod tests {
    use super::SqliteLock;

    #[test]
    fn a_second_lock_on_the_same_file_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}/m.db", dir.path().display());
        let first = SqliteLock::acquire(&url).unwrap().expect("a lock");
        let err = SqliteLock::acquire(&url).unwrap_err().to_string();
        assert!(err.contains("m.db.lock"), "{err}");
        assert!(err.contains(&std::process::id().to_string()), "{err}");
        drop(first);
        assert!(SqliteLock::acquire(&url).unwrap().is_some());
        assert!(SqliteLock::acquire("postgres://x@y/z").unwrap().is_none());
    }
}

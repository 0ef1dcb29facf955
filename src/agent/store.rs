//! The agent's store: SQLite through sqlx, schema by migrations (`migrations/agent/`).
//!
//! It holds the kernel registry: each kernel's config from creation on, and every stage's
//! resources once it is `RUNNING`, so a restarted agent can rebuild its kernel actors
//! (`docs/design.md`: no pickle; the container labels are the second source of truth).

use std::path::Path;
use std::str::FromStr;
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::Row;

use super::kernel::{KernelConfig, KernelResources, KernelStatus};

/// Layout of the `resources` JSON written now: 2 has generic slots and devices
/// (`SlotAllocation`); version 1 rows (fixed `cpu_millis`/`mem_bytes`/`cuda_devices`) still load.
pub const RESOURCES_VERSION: i64 = 2;

/// A kernel row.
#[derive(Clone, Debug)]
pub struct KernelRecord {
    /// Kernel id.
    pub kernel_id: String,
    /// Session id.
    pub session_id: String,
    /// Last recorded status.
    pub status: KernelStatus,
    /// Its creation config.
    pub config: KernelConfig,
    /// Every stage's resource, once set up.
    pub resources: Option<KernelResources>,
}

/// Handle to the agent's SQLite database; cheap to clone.
#[derive(Clone, Debug)]
pub struct Store {
    pool: SqlitePool,
}

pub(crate) fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

impl Store {
    /// Opens (creating it and its directory if needed) `path` and runs the migrations.
    /// WAL with `synchronous = NORMAL`: a committed row survives a crash of the agent.
    ///
    /// Errors: the directory or file cannot be created, or a migration fails.
    pub async fn open(path: &Path) -> anyhow::Result<Store> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let options = SqliteConnectOptions::from_str(&format!("sqlite://{}", path.display()))?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(std::time::Duration::from_secs(5));
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await?;
        sqlx::migrate!("migrations/agent").run(&pool).await?;
        Ok(Store { pool })
    }

    /// Records a new kernel as `PREPARING`, before any of its resources exists, so that a
    /// crash mid-creation is cleaned up on the next start.
    ///
    /// A `TERMINATED` row with the same id is replaced. Returns `false`, writing nothing, when
    /// a live kernel with this id exists (a duplicate kernel id).
    ///
    /// Errors: the database fails.
    pub async fn insert_kernel(
        &self,
        kernel_id: &str,
        session_id: &str,
        config: &KernelConfig,
    ) -> anyhow::Result<bool> {
        let t = now();
        let done = sqlx::query(
            "INSERT INTO kernels (kernel_id, session_id, status, config, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?) \
             ON CONFLICT (kernel_id) DO UPDATE SET session_id = excluded.session_id, status = excluded.status, config = excluded.config, \
             resources = NULL, reason = NULL, exit_code = NULL, created_at = excluded.created_at, updated_at = excluded.updated_at \
             WHERE kernels.status = 'TERMINATED'",
        )
            .bind(kernel_id)
            .bind(session_id)
            .bind(KernelStatus::Preparing.as_str())
            .bind(serde_json::to_string(config)?)
            .bind(t)
            .bind(t)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Replaces a kernel's recorded config (`restart_kernel` with an updated config).
    ///
    /// Errors: the database fails.
    pub async fn set_config(&self, kernel_id: &str, config: &KernelConfig) -> anyhow::Result<()> {
        sqlx::query("UPDATE kernels SET config = ?, updated_at = ? WHERE kernel_id = ?")
            .bind(serde_json::to_string(config)?)
            .bind(now())
            .bind(kernel_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records `status` (and the resources once set up).
    pub async fn set_status(
        &self,
        kernel_id: &str,
        status: KernelStatus,
        resources: Option<&KernelResources>,
    ) -> anyhow::Result<()> {
        let resources = resources.map(serde_json::to_string).transpose()?;
        sqlx::query("UPDATE kernels SET status = ?, resources = COALESCE(?, resources), resources_version = ?, updated_at = ? WHERE kernel_id = ?")
            .bind(status.as_str())
            .bind(resources)
            .bind(RESOURCES_VERSION)
            .bind(now())
            .bind(kernel_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records the end of a kernel: `TERMINATED` with `reason` and exit code, resources dropped.
    pub async fn set_terminated(
        &self,
        kernel_id: &str,
        reason: &str,
        exit_code: Option<i64>,
    ) -> anyhow::Result<()> {
        sqlx::query("UPDATE kernels SET status = ?, resources = NULL, reason = ?, exit_code = ?, updated_at = ? WHERE kernel_id = ?")
            .bind(KernelStatus::Terminated.as_str())
            .bind(reason)
            .bind(exit_code)
            .bind(now())
            .bind(kernel_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// `true` if a kernel with this id was ever recorded and is not `TERMINATED`.
    pub async fn is_live(&self, kernel_id: &str) -> anyhow::Result<bool> {
        let row = sqlx::query("SELECT 1 FROM kernels WHERE kernel_id = ? AND status != ?")
            .bind(kernel_id)
            .bind(KernelStatus::Terminated.as_str())
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// Every kernel not `TERMINATED`, oldest first.
    ///
    /// Errors: the database fails, or a row's JSON cannot be read (a row written by a newer
    /// agent: its `resources_version` is named).
    pub async fn live_kernels(&self) -> anyhow::Result<Vec<KernelRecord>> {
        let rows = sqlx::query("SELECT kernel_id, session_id, status, config, resources, resources_version FROM kernels WHERE status != ? ORDER BY created_at")
            .bind(KernelStatus::Terminated.as_str())
            .fetch_all(&self.pool)
            .await?;
        rows.into_iter()
            .map(|r| {
                let kernel_id: String = r.get("kernel_id");
                let version: i64 = r.get("resources_version");
                anyhow::ensure!(version <= RESOURCES_VERSION, "kernel {kernel_id}: resources_version {version} is newer than this agent's {RESOURCES_VERSION}");
                let status: String = r.get("status");
                Ok(KernelRecord {
                    session_id: r.get("session_id"),
                    status: status.parse().map_err(|_| anyhow::anyhow!("kernel {kernel_id}: unknown status {status}"))?,
                    config: serde_json::from_str(r.get("config"))?,
                    resources: r.get::<Option<String>, _>("resources").map(|j| serde_json::from_str(&j)).transpose()?,
                    kernel_id,
                })
            })
            .collect()
    }

    /// Deletes `TERMINATED` rows older than `age_seconds`; returns how many.
    pub async fn prune_terminated(&self, age_seconds: f64) -> anyhow::Result<u64> {
        let r = sqlx::query("DELETE FROM kernels WHERE status = ? AND updated_at < ?")
            .bind(KernelStatus::Terminated.as_str())
            .bind(now() - age_seconds)
            .execute(&self.pool)
            .await?;
        Ok(r.rows_affected())
    }

    /// The connection pool, for the other tables of the agent's database (the outbox).
    pub(crate) fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Closes the pool (waits for in-flight queries).
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

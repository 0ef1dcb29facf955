//! Agent rows: written behind the registry, which owns liveness in memory.

use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

use super::{now, Store, StoreError};

/// One agent row. Slots total: `cpu_millis` (millicores), `mem_bytes`, `cuda_devices`.
#[derive(Clone, Debug, PartialEq)]
pub struct AgentRow {
    /// Agent id.
    pub id: String,
    /// `ALIVE`, `LOST`, `PENDING`, `TERMINATED`.
    pub status: String,
    /// `tcp://host:port` of its RPC server.
    pub addr: Option<String>,
    /// Z85 CURVE public key.
    pub public_key: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Agent version.
    pub version: Option<String>,
    /// Millicores.
    pub cpu_millis: i64,
    /// Bytes.
    pub mem_bytes: i64,
    /// GPUs.
    pub cuda_devices: i64,
    /// Unix seconds of its newest heartbeat.
    pub last_heartbeat: Option<f64>,
}

impl AgentRow {
    fn from_row(r: &AnyRow) -> Result<AgentRow, sqlx::Error> {
        Ok(AgentRow {
            id: r.try_get("id")?,
            status: r.try_get("status")?,
            addr: r.try_get("addr")?,
            public_key: r.try_get("public_key")?,
            region: r.try_get("region")?,
            version: r.try_get("version")?,
            cpu_millis: r.try_get("cpu_millis")?,
            mem_bytes: r.try_get("mem_bytes")?,
            cuda_devices: r.try_get("cuda_devices")?,
            last_heartbeat: r.try_get("last_heartbeat")?,
        })
    }
}

/// Inserts or overwrites an agent row inside `tx`.
pub(super) async fn upsert_in(
    tx: &mut Transaction<'_, Any>,
    a: &AgentRow,
) -> Result<(), sqlx::Error> {
    let t = now();
    sqlx::query(
        "INSERT INTO agents (id, status, addr, public_key, region, version, cpu_millis, mem_bytes, cuda_devices, first_contact, last_heartbeat, status_changed) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, NULLIF($11, -1.0), $10) \
         ON CONFLICT (id) DO UPDATE SET \
           status_changed = CASE WHEN agents.status = excluded.status THEN agents.status_changed ELSE excluded.status_changed END, \
           status = excluded.status, addr = excluded.addr, public_key = excluded.public_key, region = excluded.region, \
           version = excluded.version, cpu_millis = excluded.cpu_millis, mem_bytes = excluded.mem_bytes, \
           cuda_devices = excluded.cuda_devices, last_heartbeat = excluded.last_heartbeat",
    )
    .bind(&a.id)
    .bind(&a.status)
    .bind(&a.addr)
    .bind(&a.public_key)
    .bind(&a.region)
    .bind(&a.version)
    .bind(a.cpu_millis)
    .bind(a.mem_bytes)
    .bind(a.cuda_devices)
    .bind(t)
    // Never a NULL f64 parameter: sqlx 0.8's Any driver declares it float4 to PostgreSQL, and the
    // connection's cached statement then refuses the next real (8-byte) value.
    .bind(a.last_heartbeat.unwrap_or(-1.0))
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Store {
    /// Every agent row.
    pub async fn agents(&self) -> Result<Vec<AgentRow>, StoreError> {
        let rows = sqlx::query("SELECT id, status, addr, public_key, region, version, cpu_millis, mem_bytes, cuda_devices, last_heartbeat FROM agents ORDER BY id")
            .fetch_all(&self.pool)
            .await?;
        Ok(rows
            .iter()
            .map(AgentRow::from_row)
            .collect::<Result<_, _>>()?)
    }

    /// Writes agent rows (the registry's write-behind flush), in one transaction.
    pub async fn save_agents(&self, rows: &[AgentRow]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        for a in rows {
            upsert_in(&mut tx, a).await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Marks an agent `LOST` and takes every live kernel on it out of the live set (reason
    /// `agent-lost`), releasing their concurrency, in one transaction. Returns those kernel ids.
    pub async fn mark_agent_lost(&self, agent: &AgentRow) -> Result<Vec<String>, StoreError> {
        let mut tx = self.pool.begin().await?;
        upsert_in(&mut tx, agent).await?;
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM kernels WHERE agent_id = $1 AND status <> 'TERMINATED'",
        )
        .bind(&agent.id)
        .fetch_all(&mut *tx)
        .await?;
        for id in &ids {
            super::kernels::terminate_in(&mut tx, id, "agent-lost", None).await?;
        }
        tx.commit().await?;
        Ok(ids)
    }
}

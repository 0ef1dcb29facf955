//! Agent rows: written behind the registry, which owns liveness in memory.

use sqlx::any::AnyRow;
use sqlx::{Any, FromRow as _, Transaction};

use super::columns::{legacy_columns, IntFlag, JsonText, TotalSlotColumns};
use super::{now, KernelRow, Store, StoreError};
use crate::manager::registry::liveness::AgentStatus;
use crate::slots::{ResourceSlots, SlotTypes};

/// One agent row: liveness, address, and its slots in total with their types (`sqlx::FromRow`
/// over the columns of `SELECT`; the status is a TEXT column of its name, the slots' JSON and the
/// flags read as `columns.rs` says).
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct AgentRow {
    /// Agent id.
    pub id: String,
    /// Liveness (stored as `ALIVE`, `LOST`, `PENDING`, `TERMINATED`).
    pub status: AgentStatus,
    /// `tcp://host:port` of its RPC server.
    pub addr: Option<String>,
    /// Z85 CURVE public key.
    pub public_key: Option<String>,
    /// Region.
    pub region: Option<String>,
    /// Agent version.
    pub version: Option<String>,
    /// Every slot it has in total, from its heartbeats (`cpu` cores, `mem` bytes, accelerator
    /// slots in their units); stored as JSON, or in the old columns by rows from before
    /// `0005_resource_slots`.
    #[sqlx(flatten, try_from = "TotalSlotColumns")]
    pub slots_total: ResourceSlots,
    /// The types of its slots (`slot_key_and_units`, with the built-ins); the built-ins alone
    /// when the stored text does not parse.
    #[sqlx(try_from = "JsonText")]
    pub slot_types: SlotTypes,
    /// Unix seconds of its newest heartbeat (the agent's clock).
    pub last_heartbeat: Option<f64>,
    /// Unix seconds (a manager's clock) when any replica last heard from it; 0 when never.
    pub seen_at: f64,
    /// Unix seconds of its last status change.
    pub status_changed: f64,
    /// Whether it takes new sessions (`false`: cordoned; Backend.AI's `schedulable`).
    #[sqlx(try_from = "IntFlag")]
    pub schedulable: bool,
    /// Whether it is being drained (cordoned; its sessions end by themselves or at
    /// `drain_deadline`).
    #[sqlx(try_from = "IntFlag")]
    pub draining: bool,
    /// Unix seconds at which a drain terminates its remaining sessions (`agent-drained`);
    /// `None` without a deadline.
    pub drain_deadline: Option<f64>,
}

const SELECT: &str = "SELECT id, status, addr, public_key, region, version, cpu_millis, mem_bytes, cuda_devices, last_heartbeat, slots_total, slot_types, seen_at, status_changed, schedulable, draining, drain_deadline FROM agents";

impl AgentRow {
    /// An `ALIVE`, schedulable agent with `slots_total` of `slot_types` and nothing else known
    /// (placement's input in tests, and the built-in slots' stand-in when no agent is alive).
    pub fn alive(id: &str, slots_total: ResourceSlots, slot_types: SlotTypes) -> AgentRow {
        AgentRow {
            id: id.to_owned(),
            status: AgentStatus::Alive,
            addr: None,
            public_key: None,
            region: None,
            version: None,
            slots_total,
            slot_types,
            last_heartbeat: None,
            seen_at: 0.0,
            status_changed: 0.0,
            schedulable: true,
            draining: false,
            drain_deadline: None,
        }
    }

    fn from_rows(rows: &[AnyRow]) -> Result<Vec<AgentRow>, sqlx::Error> {
        rows.iter().map(AgentRow::from_row).collect()
    }
}

/// Inserts an agent row or updates its facts inside `tx`, as replica `by`. The status is written
/// too, but never from or to `LOST` or `PENDING`: only the leader's explicit transitions
/// ([`Store::mark_agent_lost`], [`Store::set_agent_status`]) enter or leave those, so a replica
/// whose memory lags the leader's can neither undo a `LOST` nor bring back a `PENDING` the
/// reset already ended. `seen_at` only moves forward.
pub(super) async fn upsert_in(
    tx: &mut Transaction<'_, Any>,
    a: &AgentRow,
    by: &str,
) -> Result<(), sqlx::Error> {
    upsert_many_in(tx, std::slice::from_ref(a), by).await
}

/// Parameters of one row of [`upsert_many_in`]'s statement.
const UPSERT_PARAMS: usize = 15;

/// Rows of one [`upsert_many_in`] statement at most. sqlx binds SQLite's `$N` parameters by
/// name, and SQLite finds a parameter's name by walking the statement's list: quadratic in the
/// parameters (a statement of 256 rows, 3,840 parameters, spent most of its time there under
/// `perf`); 32 rows keep that small and still spare 31 of 32 hand-offs.
const UPSERT_ROWS: usize = 32;

/// [`upsert_in`] of every row of `rows` (distinct ids), [`UPSERT_ROWS`] to a statement: one
/// round trip to the database (on SQLite, one hand-off to sqlx's worker thread) per statement
/// instead of one per row, so the write-behind flush holds SQLite's one writing connection for
/// a short time.
pub(super) async fn upsert_many_in(
    tx: &mut Transaction<'_, Any>,
    rows: &[AgentRow],
    by: &str,
) -> Result<(), sqlx::Error> {
    for chunk in rows.chunks(UPSERT_ROWS) {
        upsert_statement(tx, chunk, by).await?;
    }
    Ok(())
}

/// One statement of [`upsert_many_in`]. A row that does not know the agent's facts (no
/// address, key, region or version; no slots) keeps the stored ones: a replica that has heard
/// only an event from an agent it has no row for yet (the agent failed over to its intake)
/// holds a first-contact row, and writing it must not erase what the agent's heartbeats told
/// another replica (that left every replica with no agent to place on: `no-agents`).
async fn upsert_statement(
    tx: &mut Transaction<'_, Any>,
    rows: &[AgentRow],
    by: &str,
) -> Result<(), sqlx::Error> {
    if rows.is_empty() {
        return Ok(());
    }
    let t = now();
    let values: Vec<String> = (0..rows.len())
        .map(|i| {
            let p = |n: usize| format!("${}", i * UPSERT_PARAMS + n);
            format!(
                "({}, {}, {}, {}, {}, {}, {}, {}, {}, {}, NULLIF({}, -1.0), {}, {}, {}, {}, {}, {})",
                p(1), p(2), p(3), p(4), p(5), p(6), p(7), p(8), p(9), p(10), p(11), p(10), p(12),
                p(13), p(14), p(10), p(15)
            )
        })
        .collect();
    let sql = format!(
        "INSERT INTO agents (id, status, addr, public_key, region, version, cpu_millis, mem_bytes, cuda_devices, first_contact, last_heartbeat, status_changed, slots_total, slot_types, seen_at, updated_at, updated_by) \
         VALUES {} \
         ON CONFLICT (id) DO UPDATE SET \
           status_changed = CASE WHEN agents.status = excluded.status OR agents.status IN ('LOST', 'PENDING') OR excluded.status IN ('LOST', 'PENDING') THEN agents.status_changed ELSE excluded.status_changed END, \
           status = CASE WHEN agents.status IN ('LOST', 'PENDING') OR excluded.status IN ('LOST', 'PENDING') THEN agents.status ELSE excluded.status END, \
           addr = COALESCE(excluded.addr, agents.addr), public_key = COALESCE(excluded.public_key, agents.public_key), \
           region = COALESCE(excluded.region, agents.region), version = COALESCE(excluded.version, agents.version), \
           cpu_millis = CASE WHEN excluded.slots_total = '{{}}' THEN agents.cpu_millis ELSE excluded.cpu_millis END, \
           mem_bytes = CASE WHEN excluded.slots_total = '{{}}' THEN agents.mem_bytes ELSE excluded.mem_bytes END, \
           cuda_devices = CASE WHEN excluded.slots_total = '{{}}' THEN agents.cuda_devices ELSE excluded.cuda_devices END, \
           last_heartbeat = COALESCE(excluded.last_heartbeat, agents.last_heartbeat), \
           slot_types = CASE WHEN excluded.slots_total = '{{}}' THEN agents.slot_types ELSE excluded.slot_types END, \
           slots_total = CASE WHEN excluded.slots_total = '{{}}' THEN agents.slots_total ELSE excluded.slots_total END, \
           seen_at = CASE WHEN excluded.seen_at > agents.seen_at THEN excluded.seen_at ELSE agents.seen_at END, \
           updated_at = excluded.updated_at, updated_by = excluded.updated_by",
        values.join(", ")
    );
    let mut q = sqlx::query(&sql);
    for a in rows {
        let (cpu_millis, mem_bytes, cuda_devices) = legacy_columns(&a.slots_total);
        let slots_total = serde_json::to_string(&a.slots_total).unwrap_or_else(|_| "{}".into());
        let slot_types = serde_json::to_string(&a.slot_types).unwrap_or_else(|_| "{}".into());
        q = q
            .bind(a.id.clone())
            .bind(a.status.as_str())
            .bind(a.addr.clone())
            .bind(a.public_key.clone())
            .bind(a.region.clone())
            .bind(a.version.clone())
            .bind(cpu_millis)
            .bind(mem_bytes)
            .bind(cuda_devices)
            .bind(t)
            // Never a NULL f64 parameter: sqlx 0.8's Any driver declares it float4 to
            // PostgreSQL, and the connection's cached statement then refuses the next real
            // (8-byte) value.
            .bind(a.last_heartbeat.unwrap_or(-1.0))
            .bind(slots_total)
            .bind(slot_types)
            .bind(a.seen_at)
            .bind(by.to_owned());
    }
    q.execute(&mut **tx).await?;
    Ok(())
}

impl Store {
    /// Every agent row.
    pub async fn agents(&self) -> Result<Vec<AgentRow>, StoreError> {
        let rows = sqlx::query(&format!("{SELECT} ORDER BY id"))
            .fetch_all(&self.pool)
            .await?;
        Ok(AgentRow::from_rows(&rows)?)
    }

    /// Rows another replica wrote at or after `since` (Unix seconds): what a replica re-reads
    /// each second to follow the others' heartbeats and the leader's transitions.
    pub async fn agents_changed_by_others(&self, since: f64) -> Result<Vec<AgentRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "{SELECT} WHERE updated_at >= $1 AND updated_by <> $2"
        ))
        .bind(since)
        .bind(self.replica.as_ref())
        .fetch_all(&self.pool)
        .await?;
        Ok(AgentRow::from_rows(&rows)?)
    }

    /// Writes agent rows (the registry's write-behind flush of heartbeats; distinct ids) in one
    /// statement and transaction: a chunk of the fleet's heartbeats lands in one commit.
    pub async fn save_agents(&self, rows: &[AgentRow]) -> Result<(), StoreError> {
        let mut tx = self.pool.begin().await?;
        upsert_many_in(&mut tx, rows, &self.replica).await?;
        tx.commit().await?;
        Ok(())
    }

    /// One agent row, `None` when the store has no agent of this id.
    pub async fn agent(&self, agent_id: &str) -> Result<Option<AgentRow>, StoreError> {
        let row = sqlx::query(&format!("{SELECT} WHERE id = $1"))
            .bind(agent_id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.as_ref().map(AgentRow::from_row).transpose()?)
    }

    /// Cordons an agent (`schedulable = false`: nothing new is placed on it; Backend.AI's
    /// `schedulable` flag) or uncordons it (`true`: placed on again, and a drain in progress
    /// ends: `draining` and `drain_deadline` are cleared). Cordoning a draining agent leaves the
    /// drain as it is. Stamps `updated_at`/`updated_by`, so the other replicas re-read the row
    /// within a second. Returns the row as written, `None` when there is no such agent.
    pub async fn set_agent_schedulable(
        &self,
        agent_id: &str,
        schedulable: bool,
    ) -> Result<Option<AgentRow>, StoreError> {
        let sql = if schedulable {
            "UPDATE agents SET schedulable = 1, draining = 0, drain_deadline = NULL, \
             updated_at = $1, updated_by = $2 WHERE id = $3"
        } else {
            "UPDATE agents SET schedulable = 0, updated_at = $1, updated_by = $2 WHERE id = $3"
        };
        self.write_scheduling(agent_id, sql, None).await
    }

    /// Drains an agent (Nomad's node drain): cordoned (`schedulable = false`) and `draining`;
    /// its sessions end by themselves, or at `deadline` (Unix seconds; `None`: no deadline) the
    /// leader terminates those left (`agent-drained`, [`Store::drain_due`]). Draining again
    /// replaces the deadline. A drained agent stays cordoned until it is uncordoned. Stamps
    /// `updated_at`/`updated_by` as [`Store::set_agent_schedulable`] does. Returns the row as
    /// written, `None` when there is no such agent.
    pub async fn drain_agent(
        &self,
        agent_id: &str,
        deadline: Option<f64>,
    ) -> Result<Option<AgentRow>, StoreError> {
        // Never a NULL f64 parameter (see `upsert_in`): -1 stands for none.
        self.write_scheduling(
            agent_id,
            "UPDATE agents SET schedulable = 0, draining = 1, drain_deadline = NULLIF($4, -1.0), \
             updated_at = $1, updated_by = $2 WHERE id = $3",
            Some(deadline.unwrap_or(-1.0)),
        )
        .await
    }

    /// Runs one of the scheduling updates (`$1` now, `$2` this replica, `$3` the agent, `$4`
    /// the drain deadline when given) and reads the row back in the same transaction.
    async fn write_scheduling(
        &self,
        agent_id: &str,
        sql: &str,
        deadline: Option<f64>,
    ) -> Result<Option<AgentRow>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let mut q = sqlx::query(sql)
            .bind(now())
            .bind(self.replica.as_ref())
            .bind(agent_id);
        if let Some(d) = deadline {
            q = q.bind(d);
        }
        if q.execute(&mut *tx).await?.rows_affected() == 0 {
            return Ok(None);
        }
        let row = sqlx::query(&format!("{SELECT} WHERE id = $1"))
            .bind(agent_id)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(AgentRow::from_row(&row)?))
    }

    /// The placed live kernels (not `PENDING`) of draining agents whose drain deadline is at or
    /// before `at` (Unix seconds): what the leader's drain check terminates (`agent-drained`).
    pub async fn drain_due(&self, at: f64) -> Result<Vec<KernelRow>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS} FROM kernels WHERE {LIVE} AND status <> 'PENDING' AND agent_id IN \
             (SELECT id FROM agents WHERE draining = 1 AND drain_deadline IS NOT NULL AND drain_deadline <= $1) \
             ORDER BY agent_id, created_at",
            COLUMNS = super::kernels::COLUMNS,
            LIVE = super::kernels::LIVE,
        ))
        .bind(at)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .iter()
            .map(KernelRow::from_row)
            .collect::<Result<_, _>>()?)
    }

    /// Moves an agent from one of `from` to `to`; returns whether it did (another replica, or
    /// an earlier call, may have moved it already).
    pub async fn set_agent_status(
        &self,
        agent_id: &str,
        from: &[AgentStatus],
        to: AgentStatus,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let moved = set_status_in(&mut tx, agent_id, from, to, &self.replica).await?;
        tx.commit().await?;
        Ok(moved)
    }

    /// Marks an agent `LOST` if it is `ALIVE` or `PENDING` and takes every live kernel on it out
    /// of the live set (reason `agent-lost`), releasing their concurrency, in one transaction.
    /// Returns those kernel ids, or `None` when it was not `ALIVE`/`PENDING` (already lost,
    /// by this leader or an earlier one: a loss is recorded exactly once).
    pub async fn mark_agent_lost(&self, agent_id: &str) -> Result<Option<Vec<String>>, StoreError> {
        let mut tx = self.pool.begin().await?;
        if !set_status_in(
            &mut tx,
            agent_id,
            &[AgentStatus::Alive, AgentStatus::Pending],
            AgentStatus::Lost,
            &self.replica,
        )
        .await?
        {
            return Ok(None);
        }
        let ids: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT id FROM kernels WHERE agent_id = $1 AND {}",
            super::kernels::LIVE
        ))
        .bind(agent_id)
        .fetch_all(&mut *tx)
        .await?;
        let mut ended = Vec::with_capacity(ids.len());
        for id in &ids {
            ended.push(super::kernels::terminate_in(&mut tx, id, "agent-lost", None).await?);
        }
        tx.commit().await?;
        for e in ended {
            self.publish(e);
        }
        Ok(Some(ids))
    }
}

async fn set_status_in(
    tx: &mut Transaction<'_, Any>,
    agent_id: &str,
    from: &[AgentStatus],
    to: AgentStatus,
    by: &str,
) -> Result<bool, sqlx::Error> {
    // Status names are the enum's fixed strings, never user input.
    let list = from
        .iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    let t = now();
    let n = sqlx::query(&format!(
        "UPDATE agents SET status = $1, status_changed = $2, updated_at = $2, updated_by = $3 \
         WHERE id = $4 AND status IN ({list})"
    ))
    .bind(to.as_str())
    .bind(t)
    .bind(by)
    .bind(agent_id)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(n == 1)
}

#[cfg(test)]
mod tests {
    use super::AgentRow;
    use crate::slots::{Amount, ResourceSlots};

    /// A replica that heard only an event from an agent writes a first-contact row (no address,
    /// no slots): the facts another replica wrote from the agent's heartbeats stay, and the
    /// newer `seen_at` is taken.
    #[actix_rt::test]
    async fn a_row_without_facts_keeps_the_stored_ones() {
        let (_dir, store) = crate::manager::store::test_store_with_key().await;
        let slots: ResourceSlots = [
            ("cpu".to_owned(), Amount::from_units(4)),
            ("mem".to_owned(), Amount::from_units(1 << 30)),
        ]
        .into_iter()
        .collect();
        let types = crate::manager::registry::heartbeat::slot_types(None);
        let mut full = AgentRow::alive("a", slots.clone(), types.clone());
        full.addr = Some("tcp://10.0.0.1:6001".into());
        full.public_key = Some("key".into());
        full.version = Some("26.9.6".into());
        full.last_heartbeat = Some(100.0);
        full.seen_at = 100.0;
        store.save_agents(&[full]).await.unwrap();

        let mut bare = AgentRow::alive("a", ResourceSlots::new(), types);
        bare.seen_at = 105.0;
        store.save_agents(&[bare]).await.unwrap();

        let row = store.agents().await.unwrap().remove(0);
        assert_eq!(row.addr.as_deref(), Some("tcp://10.0.0.1:6001"));
        assert_eq!(row.public_key.as_deref(), Some("key"));
        assert_eq!(row.version.as_deref(), Some("26.9.6"));
        assert_eq!(row.slots_total, slots);
        assert_eq!(row.last_heartbeat, Some(100.0));
        assert_eq!(row.seen_at, 105.0);
    }

    /// A row read back as written: slots and types through their JSON, the flags through their
    /// integers, a deadline and no heartbeat (NULL); slot types that do not parse read as the
    /// built-ins.
    #[actix_rt::test]
    async fn a_row_reads_back_typed() {
        let (_dir, store) = crate::manager::store::test_store_with_key().await;
        let slots: ResourceSlots = [
            ("cpu".to_owned(), Amount::from_units(8)),
            ("mem".to_owned(), Amount::from_units(1 << 32)),
            ("cuda.shares".to_owned(), Amount::from_milli(2500)),
        ]
        .into_iter()
        .collect();
        let mut types = crate::manager::registry::heartbeat::slot_types(None);
        types.insert("cuda.shares".into(), crate::slots::SlotType::Count);
        let mut row = AgentRow::alive("a", slots, types);
        row.addr = Some("tcp://10.0.0.2:6001".into());
        row.seen_at = 7.0;
        store.save_agents(&[row.clone()]).await.unwrap();
        let drained = store.drain_agent("a", Some(50.0)).await.unwrap().unwrap();
        assert!(!drained.schedulable && drained.draining);
        assert_eq!(drained.drain_deadline, Some(50.0));
        let back = store.agent("a").await.unwrap().unwrap();
        assert_eq!(back.last_heartbeat, None);
        assert_eq!(
            AgentRow {
                status_changed: row.status_changed,
                ..back.clone()
            },
            AgentRow {
                schedulable: false,
                draining: true,
                drain_deadline: Some(50.0),
                status_changed: row.status_changed,
                ..row
            }
        );

        sqlx::query("UPDATE agents SET slot_types = 'nope' WHERE id = 'a'")
            .execute(&store.pool)
            .await
            .unwrap();
        assert_eq!(
            store.agent("a").await.unwrap().unwrap().slot_types,
            crate::manager::registry::heartbeat::slot_types(None)
        );
    }
}

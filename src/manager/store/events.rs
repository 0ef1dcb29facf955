//! Applying agent events exactly once in effect: the event's id and its effect commit in one
//! transaction; an id seen before is reported as a duplicate and changes nothing
//! (`docs/events.md`, invariant 4 of `docs/scenarios.md`).

use sqlx::{Any, Transaction};

use super::agents::{upsert_in, AgentRow};
use super::dangling::report_in;
use super::kernels::{advance_in, restarting_in, set_result_in, terminate_in};
use super::{now, Store, StoreError};
use crate::manager::events::{AgentEvent, EventBody};

/// What applying one event did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applied {
    /// Its effect is committed.
    Applied,
    /// Its id was applied before: acked again, not re-applied.
    Duplicate,
    /// Recorded as processed without effect: a later event of the same batch supersedes it.
    Compacted,
}

async fn record(
    tx: &mut Transaction<'_, Any>,
    agent_id: &str,
    ev: &AgentEvent,
) -> Result<bool, sqlx::Error> {
    let inserted = sqlx::query("INSERT INTO processed_events (id, agent_id, name, applied_at) VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO NOTHING")
        .bind(&ev.id)
        .bind(agent_id)
        .bind(ev.body.name())
        .bind(now())
        .execute(&mut **tx)
        .await?
        .rows_affected();
    Ok(inserted == 1)
}

impl Store {
    /// Applies one event of `agent_id` in a transaction. `agent_row` is the agent's new row for
    /// agent-level events (the registry decides its status); `compacted` records the id without
    /// applying a superseded status update.
    pub async fn apply_event(
        &self,
        agent_id: &str,
        ev: &AgentEvent,
        agent_row: Option<&AgentRow>,
        compacted: bool,
    ) -> Result<Applied, StoreError> {
        let mut tx = self.pool.begin().await?;
        if !record(&mut tx, agent_id, ev).await? {
            return Ok(Applied::Duplicate);
        }
        if compacted {
            tx.commit().await?;
            return Ok(Applied::Compacted);
        }
        // The stream's event of what changed, published once the change commits.
        let mut changed = None;
        match &ev.body {
            EventBody::KernelStatus {
                kernel_id, status, ..
            } => {
                changed = advance_in(&mut *tx, kernel_id, *status).await?;
            }
            EventBody::KernelTerminated {
                kernel_id,
                reason,
                exit_code,
                ..
            } => {
                changed = terminate_in(&mut tx, kernel_id, reason, *exit_code).await?;
            }
            EventBody::AgentStarted | EventBody::AgentTerminated { .. } => {
                if let Some(row) = agent_row {
                    upsert_in(&mut tx, row, &self.replica).await?;
                }
            }
            EventBody::SessionResult {
                kernel_id, result, ..
            } => {
                set_result_in(&mut tx, kernel_id, *result).await?;
            }
            EventBody::KernelRestarting { kernel_id, .. } => {
                changed = restarting_in(&mut tx, kernel_id).await?;
            }
            EventBody::KernelDangling {
                kernel_id,
                session_id,
                adoptable,
                ..
            } => {
                report_in(&mut tx, agent_id, kernel_id, session_id, *adoptable).await?;
            }
            EventBody::Other { .. } => {}
        }
        tx.commit().await?;
        self.publish(changed);
        Ok(Applied::Applied)
    }

    /// Forgets processed event ids older than `max_age_secs` (an agent resends only what is in
    /// its outbox, so ids older than any plausible outage are dead weight). Returns rows removed.
    pub async fn prune_processed_events(&self, max_age_secs: f64) -> Result<u64, StoreError> {
        let cutoff = now() - max_age_secs;
        Ok(
            sqlx::query("DELETE FROM processed_events WHERE applied_at < $1")
                .bind(cutoff)
                .execute(&self.pool)
                .await?
                .rows_affected(),
        )
    }

    /// How many events named `name` of `agent_id` were applied (tests, diagnostics).
    pub async fn processed_event_count(
        &self,
        agent_id: &str,
        name: &str,
    ) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(
            "SELECT COUNT(*) FROM processed_events WHERE agent_id = $1 AND name = $2",
        )
        .bind(agent_id)
        .bind(name)
        .fetch_one(&self.pool)
        .await?)
    }

    /// Whether an event id has been applied (tests, diagnostics).
    pub async fn event_processed(&self, id: &str) -> Result<bool, StoreError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM processed_events WHERE id = $1")
            .bind(id)
            .fetch_one(&self.pool)
            .await?;
        Ok(n > 0)
    }
}

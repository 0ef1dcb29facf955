//! Dangling kernel reports (`kernel_dangling`, `docs/events.md`) awaiting the leader's decision
//! (`migrations/manager/0007_dangling_reports.sql`): written in the reporting event's
//! transaction by whichever replica takes it, read by the leader, deleted once resolved.

use sqlx::{Any, Row, Transaction};

use super::{now, Store, StoreError};

/// One unresolved report.
#[derive(Clone, Debug, PartialEq)]
pub struct DanglingReport {
    /// The reporting agent.
    pub agent_id: String,
    /// Kernel id of the container's label.
    pub kernel_id: String,
    /// Session id of its label (may be empty).
    pub session_id: String,
    /// The agent said it could rebuild the kernel.
    pub adoptable: bool,
    /// Unix seconds (manager clock) of the first report: `dangling-grace` runs from it.
    pub first_reported: f64,
}

/// Records a report; a repeated one keeps its `first_reported` (the grace runs from the first
/// report) and takes the newer session and `adoptable`.
pub(super) async fn report_in(
    tx: &mut Transaction<'_, Any>,
    agent_id: &str,
    kernel_id: &str,
    session_id: &str,
    adoptable: bool,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO dangling_reports (agent_id, kernel_id, session_id, adoptable, first_reported) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (agent_id, kernel_id) DO UPDATE SET \
         session_id = excluded.session_id, adoptable = excluded.adoptable",
    )
    .bind(agent_id)
    .bind(kernel_id)
    .bind(session_id)
    .bind(i64::from(adoptable))
    .bind(now())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Store {
    /// Every unresolved report, oldest first.
    pub async fn dangling_reports(&self) -> Result<Vec<DanglingReport>, StoreError> {
        let rows = sqlx::query(
            "SELECT agent_id, kernel_id, session_id, adoptable, first_reported \
             FROM dangling_reports ORDER BY first_reported",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(DanglingReport {
                    agent_id: r.try_get("agent_id")?,
                    kernel_id: r.try_get("kernel_id")?,
                    session_id: r.try_get("session_id")?,
                    adoptable: r.try_get::<i64, _>("adoptable")? != 0,
                    first_reported: r.try_get("first_reported")?,
                })
            })
            .collect::<Result<_, sqlx::Error>>()
            .map_err(Into::into)
    }

    /// Forgets a resolved report. Returns whether it was there.
    pub async fn resolve_dangling_report(
        &self,
        agent_id: &str,
        kernel_id: &str,
    ) -> Result<bool, StoreError> {
        Ok(
            sqlx::query("DELETE FROM dangling_reports WHERE agent_id = $1 AND kernel_id = $2")
                .bind(agent_id)
                .bind(kernel_id)
                .execute(&self.pool)
                .await?
                .rows_affected()
                == 1,
        )
    }
}

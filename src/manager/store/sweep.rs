//! The reconcile sweep's side of the store ("no state without a deadline", issue 27): which
//! kernels sit in a transient state past its deadline, and ending one only while it still sits
//! there, so that a sweep never overwrites what an agent's answer or event recorded meanwhile.

use std::time::Duration;

use super::kernels::{terminate_in, KernelRow, COLUMNS};
use super::{Store, StoreError};
use crate::model::session::KernelStatus;

/// The transient states the sweep looks at, with how long a kernel may stay in each.
/// `PENDING` (queued) is never one: a queued session waits as long as it must and holds no
/// agent's slots.
pub type Deadlines = [(KernelStatus, Duration)];

impl Store {
    /// Up to `limit` kernels whose status is one of `deadlines`' states and whose last status
    /// change (`status_changed_at`) is older than that state's deadline at `now` (Unix
    /// seconds), oldest change first. A state named twice counts with each deadline; a
    /// `PENDING`, `RUNNING` or final state is ignored (none of them has a deadline).
    ///
    /// Errors: the database.
    pub async fn stuck_kernels(
        &self,
        now: f64,
        deadlines: &Deadlines,
        limit: u32,
    ) -> Result<Vec<KernelRow>, StoreError> {
        let transient: Vec<(KernelStatus, f64)> = deadlines
            .iter()
            .filter(|(s, _)| is_transient(*s))
            .map(|(s, d)| (*s, now - d.as_secs_f64()))
            .collect();
        if transient.is_empty() {
            return Ok(Vec::new());
        }
        // The status names come from the `KernelStatus` constants, never from input; the
        // cut-offs are bound.
        let clauses: Vec<String> = transient
            .iter()
            .enumerate()
            .map(|(i, (s, _))| {
                format!(
                    "(status = '{}' AND status_changed_at < ${})",
                    s.as_str(),
                    i + 1
                )
            })
            .collect();
        let sql = format!(
            "SELECT {COLUMNS} FROM kernels WHERE {} ORDER BY status_changed_at LIMIT {limit}",
            clauses.join(" OR ")
        );
        let mut q = sqlx::query(&sql);
        for (_, cutoff) in &transient {
            q = q.bind(*cutoff);
        }
        let rows = q.fetch_all(&self.pool).await?;
        Ok(rows
            .iter()
            .map(KernelRow::from_row)
            .collect::<Result<_, _>>()?)
    }

    /// Takes a stuck kernel out of the live set with `reason` (releasing its concurrency), but
    /// only while it still has the `status` and `status_changed_at` the sweep read: a kernel
    /// that moved meanwhile (its create answered, its agent's event arrived) is left as it is
    /// now. Returns whether it ended here.
    ///
    /// Errors: the database.
    pub async fn end_stuck_kernel(
        &self,
        kernel_id: &str,
        status: &str,
        status_changed_at: f64,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        // A no-op write on the row: it tells whether the row is still as read and, on
        // PostgreSQL, locks it until the commit, so no advance slips in between.
        let still = sqlx::query(
            "UPDATE kernels SET status_changed_at = status_changed_at \
             WHERE id = $1 AND status = $2 AND status_changed_at = $3",
        )
        .bind(kernel_id)
        .bind(status)
        .bind(status_changed_at)
        .execute(&mut *tx)
        .await?
        .rows_affected()
            > 0;
        if !still {
            return Ok(false);
        }
        let ended = terminate_in(&mut tx, kernel_id, reason, None).await?;
        tx.commit().await?;
        Ok(self.publish(ended))
    }
}

/// Whether `status` is one the sweep resolves: placed and not yet answered, or on its way
/// between two steady states.
pub fn is_transient(status: KernelStatus) -> bool {
    matches!(
        status,
        KernelStatus::Scheduled
            | KernelStatus::Preparing
            | KernelStatus::Pulling
            | KernelStatus::Creating
            | KernelStatus::Restarting
            | KernelStatus::Terminating
    )
}

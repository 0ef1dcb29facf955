//! The reconcile sweep's side of the store ("no state without a deadline", issue 27): which
//! kernels sit in a transient state past its deadline, and ending one only while it still sits
//! there, so that a sweep never overwrites what an agent's answer or event recorded meanwhile.

use std::time::Duration;

use sqlx::{FromRow as _, Row as _};

use super::kernels::{terminate_in, KernelRow, COLUMNS};
use super::{now, Admitted, Store, StoreError};
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
                // A `TERMINATING` kernel's deadline counts from its grace's end (its agent may
                // rightly wait that long for the workload to exit), not from its status change.
                let since = match s {
                    KernelStatus::Terminating => "COALESCE(terminate_deadline, status_changed_at)",
                    _ => "status_changed_at",
                };
                format!("(status = '{}' AND {since} < ${})", s.as_str(), i + 1)
            })
            .collect();
        let sql = format!(
            "SELECT {COLUMNS} FROM kernels WHERE {} ORDER BY status_changed_at LIMIT {limit}",
            clauses.join(" OR ")
        );
        let mut q = sqlx::query_as(&sql);
        for (_, cutoff) in &transient {
            q = q.bind(*cutoff);
        }
        Ok(q.fetch_all(&self.pool).await?)
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
        status: KernelStatus,
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

/// A `PULLING` kernel whose follower has not been heard from (see [`Store::orphaned_pulls`]).
#[derive(Clone, Debug)]
pub struct OrphanedPull {
    /// The kernel, as placed (its slots still reserved) and its request.
    pub kernel: Admitted,
    /// When it was last seen followed (Unix seconds): what [`Store::claim_orphaned_pull`]
    /// checks.
    pub seen_at: f64,
}

impl Store {
    /// Marks a `PULLING` kernel's pull as followed now (`pull_seen_at`), without an event:
    /// the process that follows it touches it every few seconds, so that a pull nobody follows
    /// any more (its manager restarted, or failed over) can be told apart.
    ///
    /// Errors: the database.
    pub async fn touch_pull(&self, kernel_id: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE kernels SET pull_seen_at = $2 WHERE id = $1 AND status = 'PULLING'")
            .bind(kernel_id)
            .bind(now())
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Up to `limit` `PULLING` kernels not seen followed since `cutoff` (Unix seconds;
    /// `pull_seen_at`, else their last status change), oldest first, that keep their request.
    /// A kernel without a stored request (made before migration 0011) is left to
    /// `image-pull-timeout`.
    ///
    /// Errors: the database.
    pub async fn orphaned_pulls(
        &self,
        cutoff: f64,
        limit: u32,
    ) -> Result<Vec<OrphanedPull>, StoreError> {
        let rows = sqlx::query(&format!(
            "SELECT {COLUMNS}, request, COALESCE(pull_seen_at, status_changed_at) AS seen_at \
             FROM kernels WHERE status = 'PULLING' AND request IS NOT NULL AND cluster_size = 1 \
             AND COALESCE(pull_seen_at, status_changed_at) < $1 ORDER BY seen_at LIMIT {limit}"
        ))
        .bind(cutoff)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(OrphanedPull {
                    kernel: Admitted {
                        row: KernelRow::from_row(r)?,
                        request: r
                            .try_get::<Option<String>, _>("request")?
                            .unwrap_or_default(),
                    },
                    seen_at: r.try_get("seen_at")?,
                })
            })
            .collect()
    }

    /// Takes over an orphaned pull: marks it followed now, but only while it is still
    /// `PULLING` and unseen since `seen_at` (what [`Store::orphaned_pulls`] read), so that a
    /// follower heard from meanwhile, or another sweep, keeps it. Returns whether it was taken.
    ///
    /// Errors: the database.
    pub async fn claim_orphaned_pull(
        &self,
        kernel_id: &str,
        seen_at: f64,
    ) -> Result<bool, StoreError> {
        Ok(sqlx::query(
            "UPDATE kernels SET pull_seen_at = $3 WHERE id = $1 AND status = 'PULLING' \
             AND COALESCE(pull_seen_at, status_changed_at) = $2",
        )
        .bind(kernel_id)
        .bind(seen_at)
        .bind(now())
        .execute(&self.pool)
        .await?
        .rows_affected()
            > 0)
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{NewKernel, Store};
    use crate::model::session::{KernelStatus, RestartPolicy, SessionType};
    use crate::slots::{Amount, ResourceSlots};

    async fn reserve(store: &Store, id: &str) {
        reserve_with(store, id, None).await
    }

    async fn reserve_with(store: &Store, id: &str, request: Option<&str>) {
        let slots: ResourceSlots = [("cpu".to_owned(), Amount::from_milli(100))]
            .into_iter()
            .collect();
        let roomy: ResourceSlots = [("cpu".to_owned(), Amount::from_units(100))]
            .into_iter()
            .collect();
        let k = NewKernel {
            cluster_mode: crate::model::cluster::ClusterMode::SingleNode,
            cluster_size: 1,
            cluster: crate::model::cluster::ClusterSlot::main(),
            id: id.into(),
            session_id: id.into(),
            agent_id: "a".into(),
            access_key: "AK".into(),
            image: "img".into(),
            resource_slots: slots,
            session_type: SessionType::Interactive,
            command: None,
            batch_timeout: None,
            mounts: Vec::new(),
            restart_policy: RestartPolicy::default(),
            priority: 10,
            request: request.map(str::to_owned),
            stop_signal: None,
            grace_period: None,
            preemptible: false,
        };
        store.reserve_kernel(&k, &roomy).await.unwrap();
    }

    async fn used(store: &Store) -> i64 {
        store
            .access_key("AK")
            .await
            .unwrap()
            .unwrap()
            .concurrency_used
    }

    /// Only rows past their own state's deadline are stuck; ending one is conditional on the
    /// row as read, releases its concurrency once, and a refused create's discard keeps it.
    #[actix_rt::test]
    async fn stuck_rows_by_deadline_and_conditional_end() {
        let (_dir, store) = super::super::test_store_with_key().await;
        for id in ["sched", "creating", "running", "terminating"] {
            reserve(&store, id).await;
        }
        assert!(store
            .advance_kernel("creating", KernelStatus::Creating)
            .await
            .unwrap());
        assert!(store
            .advance_kernel("running", KernelStatus::Running)
            .await
            .unwrap());
        assert!(store
            .terminating_kernel("terminating", "user-requested", Duration::from_secs(30))
            .await
            .unwrap());
        let t = store.kernel("terminating").await.unwrap().unwrap();
        assert_eq!(
            (t.status, t.status_reason.as_deref()),
            (KernelStatus::Terminating, Some("user-requested"))
        );
        // Its deadline is its grace from now.
        let deadline = t
            .terminate_deadline
            .expect("a TERMINATING row has its deadline");
        assert!(
            (deadline - t.status_changed_at - 30.0).abs() < 0.01,
            "{deadline}"
        );
        // A queued session is never terminating.
        assert!(!store
            .terminating_kernel("nope", "x", Duration::ZERO)
            .await
            .unwrap());

        let short = Duration::from_secs(5);
        let long = Duration::from_secs(3600);
        let deadlines = [
            (KernelStatus::Scheduled, short),
            (KernelStatus::Creating, long),
            (KernelStatus::Terminating, short),
            // No deadline for these: ignored.
            (KernelStatus::Running, Duration::ZERO),
            (KernelStatus::Pending, Duration::ZERO),
        ];
        let now = super::super::now();
        assert!(store
            .stuck_kernels(now, &deadlines, 100)
            .await
            .unwrap()
            .is_empty());
        let ids = |rows: Vec<super::KernelRow>| {
            let mut v: Vec<String> = rows.into_iter().map(|k| k.id).collect();
            v.sort();
            v
        };
        // Past its status change's deadline but within its grace (+ the deadline): not stuck.
        assert_eq!(
            ids(store
                .stuck_kernels(now + 20.0, &deadlines, 100)
                .await
                .unwrap()),
            ["sched"]
        );
        let later = now + 60.0;
        assert_eq!(
            ids(store.stuck_kernels(later, &deadlines, 100).await.unwrap()),
            ["sched", "terminating"]
        );
        assert_eq!(
            store
                .stuck_kernels(later, &deadlines, 1)
                .await
                .unwrap()
                .len(),
            1
        );

        // Moved since it was read: left alone.
        let sched = store.kernel("sched").await.unwrap().unwrap();
        assert!(!store
            .end_stuck_kernel(
                "sched",
                KernelStatus::Preparing,
                sched.status_changed_at,
                "x"
            )
            .await
            .unwrap());
        assert!(!store
            .end_stuck_kernel(
                "sched",
                KernelStatus::Scheduled,
                sched.status_changed_at - 1.0,
                "x"
            )
            .await
            .unwrap());
        assert_eq!(used(&store).await, 4);
        // As read: ended once, its concurrency released once.
        assert!(store
            .end_stuck_kernel(
                "sched",
                KernelStatus::Scheduled,
                sched.status_changed_at,
                "preparing-timeout"
            )
            .await
            .unwrap());
        assert!(!store
            .end_stuck_kernel(
                "sched",
                KernelStatus::Scheduled,
                sched.status_changed_at,
                "preparing-timeout"
            )
            .await
            .unwrap());
        assert_eq!(used(&store).await, 3);
        // The create's late refusal does not discard what the sweep decided.
        assert!(!store.discard_reservation("sched").await.unwrap());
        let k = store.kernel("sched").await.unwrap().unwrap();
        assert_eq!(
            (k.status, k.status_reason.as_deref()),
            (KernelStatus::Terminated, Some("preparing-timeout"))
        );
        // A live row's refusal still removes it.
        assert!(store.discard_reservation("creating").await.unwrap());
        assert!(store.kernel("creating").await.unwrap().is_none());
        assert_eq!(used(&store).await, 2);
    }

    /// A `PULLING` row is orphaned once unseen since the cut-off (and only with a stored
    /// request); a touch or a progress write marks it seen; a claim takes it once, and the
    /// request is dropped when the row ends.
    #[actix_rt::test]
    async fn orphaned_pulls_are_claimed_once_and_touches_keep_them() {
        let (_dir, store) = super::super::test_store_with_key().await;
        reserve_with(&store, "p", Some(r#"{"image":"img"}"#)).await;
        reserve_with(&store, "legacy", None).await;
        reserve_with(&store, "sched", Some("{}")).await;
        for id in ["p", "legacy"] {
            assert!(store
                .advance_kernel(id, KernelStatus::Pulling)
                .await
                .unwrap());
        }
        let now = super::super::now();
        assert!(store
            .orphaned_pulls(now - 30.0, 10)
            .await
            .unwrap()
            .is_empty());
        // Past the cut-off: only the PULLING row that keeps its request.
        let orphans = store.orphaned_pulls(now + 60.0, 10).await.unwrap();
        assert_eq!(orphans.len(), 1, "{orphans:?}");
        let o = &orphans[0];
        assert_eq!(o.kernel.row.id, "p");
        assert_eq!(o.kernel.request, r#"{"image":"img"}"#);
        // One claim wins; a second with what was read loses.
        assert!(store.claim_orphaned_pull("p", o.seen_at).await.unwrap());
        assert!(!store.claim_orphaned_pull("p", o.seen_at).await.unwrap());
        // Claimed (seen now): not orphaned at a cut-off before now.
        assert!(store
            .orphaned_pulls(now - 1.0, 10)
            .await
            .unwrap()
            .is_empty());
        // A touch is seen too; a row that left PULLING is never orphaned.
        std::thread::sleep(Duration::from_millis(20));
        let before = super::super::now();
        store.touch_pull("p").await.unwrap();
        assert!(store.orphaned_pulls(before, 10).await.unwrap().is_empty());
        assert!(store
            .advance_kernel("p", KernelStatus::Running)
            .await
            .unwrap());
        assert!(store
            .orphaned_pulls(now + 60.0, 10)
            .await
            .unwrap()
            .is_empty());
        // An ended row drops its request.
        assert!(store
            .terminate_kernel("p", "user-requested", None)
            .await
            .unwrap());
        let request: Option<String> =
            sqlx::query_scalar("SELECT request FROM kernels WHERE id = 'p'")
                .fetch_one(&store.pool)
                .await
                .unwrap();
        assert_eq!(request, None);
    }
}

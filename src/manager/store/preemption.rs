//! Preemption's rows (issue 41 item 2): the `RUNNING` preemptible sessions a pending one may
//! evict ([`Store::preemption_candidates`]), their move to `PREEMPTED`
//! ([`Store::preempt_kernels`]), and their end: requeued as a NEW kernel row of the same
//! session, or ended `TERMINATED` `preempted` ([`Store::finish_preempted`]).
//!
//! Why a new row, and how it is queued: `requeue.rs`.

use sqlx::Row;

use super::kernels::{session_event, terminate_in, KernelRow, COLUMNS};
use super::requeue::{clear_requests_in, requeue_in, Requeue};
use super::{now, Store, StoreError};
use crate::model::event::{Event, EventType};
use crate::model::queue::PendingReason;
use crate::model::session::KernelStatus;
use crate::slots::ResourceSlots;

/// The status reason of a preempted session (its `PREEMPTED` row, its requeued row's first
/// `PENDING` reason, and `TERMINATED` when its restart policy does not requeue it) and the
/// `destroy_kernel` reason its agent gets.
pub const PREEMPTED: &str = "preempted";

/// A placed kernel a preemption may evict, as the victim choice sees it.
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct PreemptCandidate {
    /// Kernel UUID.
    pub id: String,
    /// Session UUID (a gang's kernels share it and are evicted together).
    pub session_id: String,
    /// The agent it is placed on.
    pub agent_id: String,
    /// 0..=100.
    pub priority: i64,
    /// Unix seconds the row was created (the youngest session goes first among equals).
    pub created_at: f64,
    /// The slots it holds.
    #[sqlx(flatten, try_from = "super::columns::SlotColumns")]
    pub resource_slots: ResourceSlots,
    /// Kernels in its session.
    pub cluster_size: i64,
    /// `RUNNING`, or `PREEMPTED` (already being evicted: its room is on its way).
    pub status: KernelStatus,
    /// Unix seconds of its session's last preemption.
    pub preempted_at: Option<f64>,
}

/// A [`PreemptCandidate`]'s columns.
const CANDIDATE_COLUMNS: &str = "id, session_id, agent_id, priority, created_at, resource_slots, \
     cpu_millis, mem_bytes, cuda_devices, cluster_size, status, preempted_at";

impl Store {
    /// Every kernel a pending session of priority `below` or higher may evict or is waiting
    /// for: the current (not superseded) rows of preemptible sessions of a lower priority
    /// that are `RUNNING`, and every `PREEMPTED` row (their room is on its way).
    ///
    /// Errors: the database.
    pub async fn preemption_candidates(
        &self,
        below: i64,
    ) -> Result<Vec<PreemptCandidate>, StoreError> {
        // Two statements, each through the `(status, priority, …)` index: one with an `OR`
        // scanned every row (140,000 in `just bench scheduler`) in every admission round
        // that left a session unplaced.
        let mut out: Vec<PreemptCandidate> = sqlx::query_as(&format!(
            "SELECT {CANDIDATE_COLUMNS} FROM kernels WHERE status = 'RUNNING' AND priority < $1 \
             AND preemptible = 1 AND superseded_by IS NULL"
        ))
        .bind(below)
        .fetch_all(&self.reads)
        .await?;
        out.extend(
            sqlx::query_as::<_, PreemptCandidate>(&format!(
                "SELECT {CANDIDATE_COLUMNS} FROM kernels WHERE status = 'PREEMPTED'"
            ))
            .fetch_all(&self.reads)
            .await?,
        );
        Ok(out)
    }

    /// The first `limit` kernels of [`Store::preemption_candidates`]'s `RUNNING` ones in the
    /// victim choice's order (lowest priority, then youngest, then by session id: the order
    /// of `scheduler::preempt::victims`), every other `RUNNING` candidate kernel of a cluster
    /// session among them (a gang counts whole), and every `PREEMPTED` row. The flag is
    /// `true` when that is every candidate (fewer than `limit` `RUNNING` ones matched).
    ///
    /// A round reads these first: one victim is usually enough, and it is among the most
    /// evictable. Through `kernels_preemptible` (`migrations/manager/0017_preemption_order.sql`)
    /// this reads `limit` rows where [`Store::preemption_candidates`] reads every running
    /// preemptible session (40,000 at 10,000 agents in `just bench scheduler`).
    ///
    /// Errors: the database.
    pub async fn preemption_candidates_first(
        &self,
        below: i64,
        limit: usize,
    ) -> Result<(Vec<PreemptCandidate>, bool), StoreError> {
        // The ORDER BY is the index's, and the partial index's conditions are written as its
        // WHERE has them, so that SQLite and PostgreSQL walk it and stop at the limit.
        let mut out: Vec<PreemptCandidate> = sqlx::query_as(&format!(
            "SELECT {CANDIDATE_COLUMNS} FROM kernels WHERE status = 'RUNNING' AND priority < $1 \
             AND preemptible = 1 AND superseded_by IS NULL \
             ORDER BY priority, created_at DESC, session_id LIMIT $2"
        ))
        .bind(below)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&self.reads)
        .await?;
        let all = out.len() < limit;
        // A cluster session cut by the limit: its other kernels (they may come later in the
        // order: a gang's kernels need not be created together).
        let mut listed: std::collections::HashMap<&str, i64> = std::collections::HashMap::new();
        for c in &out {
            *listed.entry(c.session_id.as_str()).or_default() += 1;
        }
        let cut: Vec<String> = out
            .iter()
            .filter(|c| {
                listed
                    .get(c.session_id.as_str())
                    .is_some_and(|n| *n < c.cluster_size)
            })
            .map(|c| c.session_id.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for session in cut {
            // By session id alone (its index), filtered here as the first read filters: with
            // the candidate conditions in SQL, SQLite without statistics may walk the partial
            // index (every candidate) instead.
            let rows = sqlx::query(&format!(
                "SELECT preemptible, superseded_by, {CANDIDATE_COLUMNS} FROM kernels \
                 WHERE session_id = $1"
            ))
            .bind(&session)
            .fetch_all(&self.reads)
            .await?;
            for row in rows {
                let c = <PreemptCandidate as sqlx::FromRow<_>>::from_row(&row)?;
                let preemptible: i64 = row.try_get("preemptible")?;
                let superseded: Option<String> = row.try_get("superseded_by")?;
                let candidate = c.status == KernelStatus::Running
                    && c.priority < below
                    && preemptible == 1
                    && superseded.is_none();
                if candidate && !out.iter().any(|o| o.id == c.id) {
                    out.push(c);
                }
            }
        }
        out.extend(
            sqlx::query_as::<_, PreemptCandidate>(&format!(
                "SELECT {CANDIDATE_COLUMNS} FROM kernels WHERE status = 'PREEMPTED'"
            ))
            .fetch_all(&self.reads)
            .await?,
        );
        Ok((out, all))
    }

    /// Moves the victims' kernels (every kernel of each victim session) from `RUNNING` to
    /// `PREEMPTED`, in one transaction, with `preempted_at` now and status reason
    /// `preempted`. Returns the rows that moved (a kernel that ended or moved meanwhile is
    /// left out: the next round looks again).
    ///
    /// Errors: the database (nothing moved).
    pub async fn preempt_kernels(
        &self,
        kernel_ids: &[String],
        default_grace: std::time::Duration,
    ) -> Result<Vec<KernelRow>, StoreError> {
        let at = now();
        let mut tx = self.pool.begin().await?;
        let mut moved = Vec::with_capacity(kernel_ids.len());
        for id in kernel_ids {
            let row: Option<KernelRow> = sqlx::query_as(&format!(
                "UPDATE kernels SET status = 'PREEMPTED', status_reason = $2, status_changed_at = $3, \
                 preempted_at = $3, terminate_deadline = $3 + COALESCE(grace_period, $4) \
                 WHERE id = $1 AND status = 'RUNNING' RETURNING {COLUMNS}"
            ))
            .bind(id)
            .bind(PREEMPTED)
            .bind(at)
            .bind(default_grace.as_secs_f64())
            .fetch_optional(&mut *tx)
            .await?;
            moved.extend(row);
        }
        tx.commit().await?;
        for k in &moved {
            self.events.publish(Event {
                status: Some(KernelStatus::Preempted.as_str().into()),
                reason: Some(PREEMPTED.into()),
                terminate_deadline: k.terminate_deadline,
                ..session_event(
                    EventType::SessionStatus,
                    &k.id,
                    (
                        k.session_id.clone(),
                        k.agent_id.clone(),
                        k.access_key.clone(),
                    ),
                )
            });
        }
        Ok(moved)
    }

    /// The main rows of the preemptions whose end is still due ([`DUE`]) and whose grace
    /// ended (`terminate_deadline`; for a row without one, whose status changed) before
    /// `before` (Unix seconds): evictions a manager started and did not finish
    /// (it stopped, or lost the leadership, or an agent did not answer), for the reconcile
    /// sweep to complete; at most 100, oldest first.
    ///
    /// Errors: the database.
    pub async fn preempted_before(&self, before: f64) -> Result<Vec<KernelRow>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM kernels WHERE cluster_role = 'main' AND {DUE} \
             AND COALESCE(terminate_deadline, status_changed_at) < $1 ORDER BY status_changed_at LIMIT 100"
        ))
        .bind(before)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Ends a preempted session (its kernels already ended on their agents) in one
    /// transaction, when its main row's end is still due ([`DUE`]): each of its `PREEMPTED`
    /// rows `TERMINATED` `preempted` (the session's concurrency and slots released; a row its
    /// agent's `kernel_terminated` ended first is already); with `requeue`, a NEW main row of
    /// the same session is queued `PENDING` in the same transaction (a new kernel id; the
    /// same priority, request, slots and cluster shape; its ORIGINAL `queued_at` — its
    /// creation time when it was never queued — so it waits ahead of its priority's later
    /// arrivals; `restart_count` one more, and [`super::RESTART_COUNT_ENV`] set to it in its
    /// request's `environ`) and the old rows name it in `superseded_by`. The old rows'
    /// request is cleared: done. Returns the new row when one was queued; `None` when
    /// nothing was due (done already: idempotent) or the session was ended.
    ///
    /// Errors: the database (nothing changed).
    pub async fn finish_preempted(
        &self,
        session_id: &str,
        requeue: bool,
    ) -> Result<Option<KernelRow>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let due: Option<sqlx::any::AnyRow> = sqlx::query(&format!(
            "SELECT request, {COLUMNS} FROM kernels WHERE session_id = $1 AND cluster_role = 'main' \
             AND {DUE} ORDER BY created_at DESC LIMIT 1"
        ))
        .bind(session_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(due) = due else {
            return Ok(None);
        };
        let main = <KernelRow as sqlx::FromRow<_>>::from_row(&due)?;
        let main_request: Option<String> = due.try_get("request")?;
        let preempted: Vec<(String,)> = sqlx::query_as(
            "SELECT id FROM kernels WHERE session_id = $1 AND status = 'PREEMPTED' AND superseded_by IS NULL",
        )
        .bind(session_id)
        .fetch_all(&mut *tx)
        .await?;
        let mut events = Vec::with_capacity(preempted.len());
        for (id,) in &preempted {
            events.extend(terminate_in(&mut tx, id, PREEMPTED, None).await?);
        }
        let queued = match requeue {
            true => {
                let restarts = main.restart_count + 1;
                let r = Requeue {
                    main: &main,
                    request: main_request.as_deref(),
                    reason: PendingReason::new(
                        crate::model::queue::PendingCode::NoCapacity,
                        format!("preempted; requeued (restart {restarts})"),
                    ),
                    status_reason: PREEMPTED,
                    not_before: None,
                };
                Some(requeue_in(&mut tx, &r).await?)
            }
            false => {
                clear_requests_in(&mut tx, session_id, "").await?;
                None
            }
        };
        tx.commit().await?;
        for e in events {
            self.publish(Some(e));
        }
        let Some(new_id) = queued else {
            return Ok(None);
        };
        self.announce_requeued(&new_id, main.priority, PREEMPTED)
            .await
    }
}

/// A row whose preemption's end is still due, in SQL: the session's current row, evicted
/// (`PREEMPTED`), or ended `preempted` with its request still kept (its agent's
/// `kernel_terminated` ended it before [`Store::finish_preempted`] ran; that clears it).
const DUE: &str = "superseded_by IS NULL AND status_reason = 'preempted' \
     AND (status = 'PREEMPTED' OR (status = 'TERMINATED' AND request IS NOT NULL))";

#[cfg(test)]
mod tests {
    use super::super::{NewKernel, Store};
    use crate::model::session::{KernelStatus, RestartPolicy, SessionType};
    use crate::slots::{Amount, ResourceSlots};

    async fn running(store: &Store, id: &str, preemptible: bool) {
        running_in(store, id, &format!("{id}-s"), 1, preemptible).await;
    }

    /// A running kernel `id` of session `session`, one of `size` (the first one is its main).
    async fn running_in(store: &Store, id: &str, session: &str, size: u32, preemptible: bool) {
        let slot = match store.kernel(session).await.unwrap() {
            None => crate::model::cluster::ClusterSlot::main(),
            Some(_) => crate::model::cluster::cluster_slots(2).remove(1),
        };
        let roomy: ResourceSlots = [("cpu".to_owned(), Amount::from_units(100))]
            .into_iter()
            .collect();
        let k = NewKernel {
            cluster_mode: match size {
                1 => crate::model::cluster::ClusterMode::SingleNode,
                _ => crate::model::cluster::ClusterMode::MultiNode,
            },
            cluster_size: size,
            cluster: slot,
            id: id.into(),
            session_id: session.into(),
            agent_id: "a".into(),
            access_key: "AK".into(),
            image: "img".into(),
            resource_slots: [("cpu".to_owned(), Amount::from_units(1))]
                .into_iter()
                .collect(),
            session_type: SessionType::Interactive,
            command: None,
            batch_timeout: None,
            mounts: Vec::new(),
            restart_policy: RestartPolicy::default(),
            priority: 10,
            request: Some(r#"{"image":"img","resource_slots":{"cpu":1}}"#.into()),
            stop_signal: None,
            grace_period: None,
            preemptible,
        };
        store.reserve_kernel(&k, &roomy).await.unwrap();
        store
            .advance_kernel(id, KernelStatus::Running)
            .await
            .unwrap();
    }

    /// A victim moves `RUNNING` → `PREEMPTED`, and its end requeues it once as a new row of
    /// the same session (the old one superseded, out of the lists; concurrency released; the
    /// original queue time kept), whether or not its agent's `kernel_terminated` ended the old
    /// row first; a second end, or the sweep's, changes nothing.
    #[actix_rt::test]
    async fn a_victim_is_requeued_once_as_a_new_row_of_its_session() {
        let (_dir, store) = super::super::test_store_with_key().await;
        running(&store, "v", true).await;
        running(&store, "w", true).await;
        running(&store, "n", false).await;
        let c = store.preemption_candidates(50).await.unwrap();
        let mut ids: Vec<&str> = c.iter().map(|k| k.id.as_str()).collect();
        ids.sort();
        assert_eq!(ids, ["v", "w"], "the non-preemptible one is no candidate");
        assert!(store.preemption_candidates(10).await.unwrap().is_empty());
        let moved = store
            .preempt_kernels(
                &["v".into(), "w".into(), "n".into()],
                std::time::Duration::from_secs(10),
            )
            .await
            .unwrap();
        assert_eq!(moved.len(), 3, "the store moves what it is told");
        let v = store.kernel("v").await.unwrap().unwrap();
        assert_eq!(v.status, KernelStatus::Preempted);
        assert!(v.preempted_at.is_some());
        // w's agent reports its end first (reason `preempted`, the destroy's).
        assert!(store
            .terminate_kernel("w", "preempted", None)
            .await
            .unwrap());
        for id in ["v", "w"] {
            let new = store
                .finish_preempted(&format!("{id}-s"), true)
                .await
                .unwrap()
                .expect("requeued");
            assert_eq!(
                (new.status, new.restart_count, new.session_id.clone()),
                (KernelStatus::Pending, 1, format!("{id}-s"))
            );
            assert_ne!(new.id, id);
            assert_eq!(
                new.queued_at,
                Some(store.kernel(id).await.unwrap().unwrap().created_at)
            );
            assert!(new.preemptible);
            let req = store.pending_request(&new.id).await.unwrap().unwrap();
            assert!(req.contains("KERNELVISOR_RESTART_COUNT"), "{req}");
            // Done once: again, nothing.
            assert!(store
                .finish_preempted(&format!("{id}-s"), true)
                .await
                .unwrap()
                .is_none());
            let old = store.kernel(id).await.unwrap().unwrap();
            assert_eq!(old.status, KernelStatus::Terminated);
            assert_eq!(old.superseded_by.as_deref(), Some(new.id.as_str()));
            // The session's look-up is the new row.
            let by_session = store.kernel(&format!("{id}-s")).await.unwrap().unwrap();
            assert_eq!(by_session.id, new.id);
        }
        assert!(store
            .preempted_before(f64::MAX)
            .await
            .unwrap()
            .iter()
            .all(|k| k.id == "n"));
        // Not requeued (its restart policy says no): ended, and nothing is due any more.
        assert!(store
            .finish_preempted("n-s", false)
            .await
            .unwrap()
            .is_none());
        assert!(store.preempted_before(f64::MAX).await.unwrap().is_empty());
        let n = store.kernel("n").await.unwrap().unwrap();
        assert_eq!(
            (n.status, n.status_reason.as_deref()),
            (KernelStatus::Terminated, Some("preempted"))
        );
        // One row per session in the list; no concurrency held by the queued ones.
        let all = store.kernels(None, true).await.unwrap();
        assert_eq!(all.len(), 3, "{all:?}");
        assert_eq!(
            store
                .access_key("AK")
                .await
                .unwrap()
                .unwrap()
                .concurrency_used,
            0
        );
    }

    /// The first candidates come in the victim choice's order (lowest priority, then youngest),
    /// a gang cut by the limit whole, the `PREEMPTED` rows with them, and the flag says
    /// whether that is every candidate.
    #[actix_rt::test]
    async fn the_first_candidates_are_the_most_evictable_and_a_gang_comes_whole() {
        let (_dir, store) = super::super::test_store_with_key().await;
        // Oldest first: the gang's main, a, b, a non-preemptible one, then the gang's sub.
        running_in(&store, "g1", "g-s", 2, true).await;
        running(&store, "a", true).await;
        running(&store, "b", true).await;
        running(&store, "n", false).await;
        running_in(&store, "g2", "g-s", 2, true).await;
        let ids = |c: &[super::PreemptCandidate]| -> Vec<String> {
            c.iter().map(|k| k.id.clone()).collect()
        };
        let (c, all) = store.preemption_candidates_first(50, 2).await.unwrap();
        assert_eq!(
            ids(&c),
            ["g2", "b", "g1"],
            "the youngest two, the gang whole"
        );
        assert!(!all);
        let (c, all) = store.preemption_candidates_first(50, 10).await.unwrap();
        assert_eq!(ids(&c), ["g2", "b", "a", "g1"]);
        assert!(all, "fewer than the limit: every one");
        let mut every = ids(&store.preemption_candidates(50).await.unwrap());
        every.sort();
        assert_eq!(every, ["a", "b", "g1", "g2"]);
        // Not for a priority at or below theirs.
        assert_eq!(
            store.preemption_candidates_first(10, 2).await.unwrap(),
            (Vec::new(), true)
        );
        // An eviction on its way is listed beyond the limit.
        store
            .preempt_kernels(&["a".into()], std::time::Duration::ZERO)
            .await
            .unwrap();
        let (c, _) = store.preemption_candidates_first(50, 1).await.unwrap();
        assert_eq!(ids(&c), ["g2", "g1", "a"]);
        assert_eq!(c[2].status, KernelStatus::Preempted);
    }
}

//! A session requeued as a NEW main row of the same session: what a preemption's end
//! (`preemption.rs`, issue 41) and a gang restart by the restart policy (issue 40, this
//! module's [`Store::restart_gang`]) share.
//!
//! Why a new row: the store moves a status only forward ([`super::KernelStatus::rank`]), and
//! an agent's late events for an ended kernel (its `kernel_terminated`, a lost answer's
//! retry) name the old kernel id: they land on the old row, which is over, and never on the
//! requeued session. The old rows keep their history and name the row that replaced them
//! (`superseded_by`); the session's lists, look-ups, concurrency and usage see only the
//! current generation.

use sqlx::{Any, Row, Transaction};

use super::columns::json_text;
use super::kernels::{session_event, KernelRow, COLUMNS, LIVE};
use super::{now, Store, StoreError};
use crate::model::event::{Event, EventType};
use crate::model::queue::{PendingCode, PendingReason};
use crate::model::session::KernelStatus;

/// The environment variable a requeued session's kernels get: how many times it was
/// restarted or preempted and requeued (Slurm's `SLURM_RESTART_COUNT`).
pub const RESTART_COUNT_ENV: &str = "KERNELVISOR_RESTART_COUNT";

/// How a session's next generation is queued.
pub(super) struct Requeue<'a> {
    /// The ended main row it is made from.
    pub(super) main: &'a KernelRow,
    /// That row's stored request (`SessionRequest` JSON).
    pub(super) request: Option<&'a str>,
    /// The new row's first `pending_reason`.
    pub(super) reason: PendingReason,
    /// The new row's `status_reason` (why it was requeued).
    pub(super) status_reason: &'a str,
    /// Unix seconds before which no round places it (`None`: at once).
    pub(super) not_before: Option<f64>,
}

/// Queues the next generation of `r.main`'s session inside `tx`: a NEW main row `PENDING`
/// (a new kernel id; the same priority, request, slots, cluster shape and policies; its
/// ORIGINAL `queued_at` — its creation time when it was never queued — so it waits ahead of
/// its priority's later arrivals; `restart_count` one more, and [`RESTART_COUNT_ENV`] set to
/// it in its request's `environ`), the old rows `superseded_by` it and their requests
/// cleared. Returns the new kernel id.
pub(super) async fn requeue_in(
    tx: &mut Transaction<'_, Any>,
    r: &Requeue<'_>,
) -> Result<String, sqlx::Error> {
    let main = r.main;
    let new_id = uuid::Uuid::new_v4().to_string();
    let restarts = main.restart_count + 1;
    let request = with_restart_count(r.request.unwrap_or("{}"), restarts);
    let at = now();
    sqlx::query(
        "INSERT INTO kernels (id, session_id, agent_id, access_key, image, status, status_reason, \
         cpu_millis, mem_bytes, cuda_devices, created_at, session_type, command, batch_timeout, \
         result, mounts, restart_policy, restart_count, resource_slots, priority, queued_at, \
         pending_reason, status_changed_at, cluster_mode, cluster_size, cluster_role, \
         cluster_idx, cluster_hostname, service_ports, preemptible, preempted_at, head_skips, request, \
         stop_signal, grace_period, max_lifetime, idle_timeout, utilization_window, min_utilization, \
         not_before) \
         SELECT $2, session_id, '', access_key, image, 'PENDING', $6, cpu_millis, mem_bytes, \
         cuda_devices, $3, session_type, command, batch_timeout, 'UNDEFINED', mounts, \
         restart_policy, $4, resource_slots, priority, COALESCE(queued_at, created_at), $5, $3, \
         cluster_mode, cluster_size, cluster_role, cluster_idx, cluster_hostname, '[]', \
         preemptible, preempted_at, 0, $7, \
         stop_signal, grace_period, max_lifetime, idle_timeout, utilization_window, min_utilization, \
         $8 FROM kernels WHERE id = $1",
    )
    .bind(&main.id)
    .bind(&new_id)
    .bind(at)
    .bind(restarts)
    .bind(json_text(&r.reason, ""))
    .bind(r.status_reason)
    .bind(&request)
    .bind(r.not_before)
    .execute(&mut **tx)
    .await?;
    sqlx::query(
        "UPDATE kernels SET superseded_by = $2 WHERE session_id = $1 AND superseded_by IS NULL AND id <> $2",
    )
    .bind(&main.session_id)
    .bind(&new_id)
    .execute(&mut **tx)
    .await?;
    clear_requests_in(tx, &main.session_id, &new_id).await?;
    Ok(new_id)
}

/// Clears the request of every ended row of a session but `keep`: their session is done with
/// them (requeued from, or ended for good).
pub(super) async fn clear_requests_in(
    tx: &mut Transaction<'_, Any>,
    session_id: &str,
    keep: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE kernels SET request = NULL WHERE session_id = $1 AND id <> $2 \
         AND status IN ('TERMINATED', 'CANCELLED')",
    )
    .bind(session_id)
    .bind(keep)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

impl Store {
    /// Announces a requeued row (read back) after its transaction committed: one more in its
    /// priority's queue depth, and a `session_status` `PENDING` event with `reason`.
    pub(super) async fn announce_requeued(
        &self,
        new_id: &str,
        priority: i64,
        reason: &str,
    ) -> Result<Option<KernelRow>, StoreError> {
        self.depth.add(priority, 1);
        let row = self.kernel(new_id).await?;
        if let Some(k) = &row {
            self.events.publish(Event {
                status: Some(KernelStatus::Pending.as_str().into()),
                reason: Some(reason.into()),
                ..session_event(
                    EventType::SessionStatus,
                    &k.id,
                    (k.session_id.clone(), String::new(), k.access_key.clone()),
                )
            });
        }
        Ok(row)
    }

    /// Restarts a cluster session whose kernels all ended (issue 40: a lost kernel or a failed
    /// create, by its restart policy), in one transaction: when its current main row ended
    /// with its request kept (see `terminate_in`) and none of its current kernels is live, the
    /// next generation is queued ([`requeue_in`]) with reason `restart` and `pending_reason`
    /// naming `why` (the first ended kernel's reason), placed no earlier than `not_before`
    /// (Unix seconds). Returns the new main row; `None` when nothing was due (restarted or
    /// settled already, or a kernel still live): idempotent, and two replicas cannot both
    /// restart it (the old main row is claimed by a conditional update first).
    ///
    /// Errors: the database (nothing changed).
    pub async fn restart_gang(
        &self,
        session_id: &str,
        why: &str,
        not_before: Option<f64>,
    ) -> Result<Option<KernelRow>, StoreError> {
        let mut tx = self.pool.begin().await?;
        let live: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM kernels WHERE session_id = $1 AND superseded_by IS NULL AND {LIVE}"
        ))
        .bind(session_id)
        .fetch_one(&mut *tx)
        .await?;
        if live > 0 {
            return Ok(None);
        }
        let due: Option<sqlx::any::AnyRow> = sqlx::query(&format!(
            "SELECT request, {COLUMNS} FROM kernels WHERE session_id = $1 AND cluster_role = 'main' \
             AND superseded_by IS NULL AND request IS NOT NULL AND status IN ('TERMINATED', 'CANCELLED') \
             ORDER BY created_at DESC LIMIT 1"
        ))
        .bind(session_id)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(due) = due else {
            return Ok(None);
        };
        // The claim: the main row's request taken by a conditional update, so that a second
        // caller (the other replica's sweep, the create's own rollback) finds nothing due.
        let claimed = sqlx::query(
            "UPDATE kernels SET request = NULL WHERE id = $1 AND request IS NOT NULL AND superseded_by IS NULL",
        )
        .bind(due.try_get::<String, _>("id")?)
        .execute(&mut *tx)
        .await?;
        if claimed.rows_affected() != 1 {
            return Ok(None);
        }
        let main = <KernelRow as sqlx::FromRow<_>>::from_row(&due)?;
        let kept: Option<String> = due.try_get("request")?;
        let restarts = main.restart_count + 1;
        let new_id = requeue_in(
            &mut tx,
            &Requeue {
                main: &main,
                request: kept.as_deref(),
                reason: PendingReason::new(
                    PendingCode::NoCapacity,
                    match not_before.map(|t| t - now()).filter(|d| *d >= 0.5) {
                        Some(d) => format!(
                            "{why}; restarting the session by its restart policy (restart {restarts}, in {d:.0} s)"
                        ),
                        None => format!(
                            "{why}; restarting the session by its restart policy (restart {restarts})"
                        ),
                    },
                ),
                status_reason: RESTART,
                not_before,
            },
        )
        .await?;
        tx.commit().await?;
        self.announce_requeued(&new_id, main.priority, RESTART)
            .await
    }

    /// Up to `limit` main rows of generations a restart superseded that still name a network,
    /// none of whose kernels is live (their networks are for `cluster::settle` to remove).
    ///
    /// Errors: the database.
    pub async fn superseded_networks(&self, limit: u32) -> Result<Vec<KernelRow>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM kernels m WHERE cluster_role = 'main' AND superseded_by IS NOT NULL \
             AND network IS NOT NULL AND NOT EXISTS (SELECT 1 FROM kernels k WHERE k.session_id = m.session_id \
             AND k.superseded_by = m.superseded_by AND k.status NOT IN ('TERMINATED', 'CANCELLED')) \
             ORDER BY created_at LIMIT $1"
        ))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?)
    }

    /// Forgets the network named on one kernel row (its network was removed).
    ///
    /// Errors: the database.
    pub async fn clear_network(&self, kernel_id: &str) -> Result<(), StoreError> {
        sqlx::query("UPDATE kernels SET network = NULL WHERE id = $1")
            .bind(kernel_id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Settles a cluster session that is not restarted: the requests its ended rows kept are
    /// cleared (the leader stops looking at it). Returns whether one was.
    ///
    /// Errors: the database.
    pub async fn keep_ended(&self, session_id: &str) -> Result<bool, StoreError> {
        let r = sqlx::query(
            "UPDATE kernels SET request = NULL WHERE session_id = $1 AND superseded_by IS NULL \
             AND request IS NOT NULL AND status IN ('TERMINATED', 'CANCELLED')",
        )
        .bind(session_id)
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() > 0)
    }
}

/// The `status_reason` (and first event reason) of a row queued by a gang restart.
pub const RESTART: &str = "restart";

/// A stored `SessionRequest` (JSON) with [`RESTART_COUNT_ENV`] = `n` in its `environ`; the
/// text as it was when it is not a JSON object.
fn with_restart_count(request: &str, n: i64) -> String {
    let Ok(serde_json::Value::Object(mut req)) = serde_json::from_str(request) else {
        return request.to_owned();
    };
    let environ = req
        .entry("environ")
        .or_insert_with(|| serde_json::Value::Object(Default::default()));
    if !environ.is_object() {
        *environ = serde_json::Value::Object(Default::default());
    }
    if let Some(m) = environ.as_object_mut() {
        m.insert(RESTART_COUNT_ENV.into(), n.to_string().into());
    }
    serde_json::Value::Object(req).to_string()
}

#[cfg(test)]
mod tests {
    use super::super::{NewKernel, Store};
    use crate::model::cluster::{cluster_slots, ClusterMode};
    use crate::model::session::{KernelStatus, RestartPolicy, SessionType};
    use crate::slots::{Amount, ResourceSlots};

    /// A RUNNING single-node cluster of 2 (`<sid>-main`, `<sid>-sub`) of session `sid`.
    async fn gang(store: &Store, sid: &str) {
        let roomy: ResourceSlots = [("cpu".to_owned(), Amount::from_units(100))]
            .into_iter()
            .collect();
        let rows: Vec<NewKernel> = cluster_slots(2)
            .into_iter()
            .map(|slot| NewKernel {
                cluster_mode: ClusterMode::SingleNode,
                cluster_size: 2,
                id: format!("{sid}-{}", slot.role),
                session_id: sid.into(),
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
                preemptible: false,
                cluster: slot,
            })
            .collect();
        let totals = [("a".to_owned(), roomy)].into_iter().collect();
        store.reserve_gang(&rows, &totals, false).await.unwrap();
        for k in &rows {
            store
                .advance_kernel(&k.id, KernelStatus::Running)
                .await
                .unwrap();
        }
    }

    /// A gang whose kernels ended (its agent lost) keeps its main row's request until the
    /// restart: once every kernel ended, it is queued again once (a new main row of the same
    /// session, one more restart, the count in its environment, the old rows superseded and
    /// their requests cleared; concurrency released); a second call, or one while a kernel is
    /// live, changes nothing. A gang its user ended keeps nothing to restart from.
    #[actix_rt::test]
    async fn a_lost_gang_is_queued_again_once() {
        let (_dir, store) = super::super::test_store_with_key().await;
        gang(&store, "g").await;
        store
            .terminate_kernel("g-sub", "agent-lost", None)
            .await
            .unwrap();
        assert!(
            store
                .restart_gang("g", "lost", None)
                .await
                .unwrap()
                .is_none(),
            "not while main1 lives"
        );
        store
            .terminate_kernel("g-main", "agent-lost", None)
            .await
            .unwrap();
        let new = store
            .restart_gang(
                "g",
                "kernel sub1 ended (agent-lost)",
                Some(super::now() + 60.0),
            )
            .await
            .unwrap()
            .expect("restarted");
        assert_eq!(
            (new.status, new.restart_count, new.session_id.as_str()),
            (KernelStatus::Pending, 1, "g")
        );
        assert_eq!(new.status_reason.as_deref(), Some(super::RESTART));
        assert!(new
            .pending_reason
            .as_ref()
            .unwrap()
            .message
            .contains("agent-lost"));
        let request = store.pending_request(&new.id).await.unwrap().unwrap();
        let v: serde_json::Value = serde_json::from_str(&request).unwrap();
        assert_eq!(v["environ"][super::RESTART_COUNT_ENV], "1");
        // The old rows are history; the session is its new row.
        let rows = store.session_kernels("g").await.unwrap();
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].id, new.id);
        assert_eq!(
            store.kernel("g-sub").await.unwrap().unwrap().superseded_by,
            Some(new.id.clone())
        );
        assert!(store
            .restart_gang("g", "again", None)
            .await
            .unwrap()
            .is_none());
        assert!(!store.keep_ended("g").await.unwrap(), "nothing kept");
        // The backoff keeps it out of the rounds until it passes.
        assert!(store
            .pending_window(10)
            .await
            .unwrap()
            .iter()
            .all(|q| q.id != new.id));
        assert_eq!(
            store
                .access_key("AK")
                .await
                .unwrap()
                .unwrap()
                .concurrency_used,
            0
        );
        // A gang its user ended: nothing kept, nothing to restart.
        gang(&store, "u").await;
        for id in ["u-sub", "u-main"] {
            store
                .terminate_kernel(id, "user-requested", None)
                .await
                .unwrap();
        }
        assert!(store.restart_gang("u", "x", None).await.unwrap().is_none());
        // A gang ended for good by its policy: the kept request cleared once.
        gang(&store, "n").await;
        for id in ["n-sub", "n-main"] {
            store
                .terminate_kernel(id, "agent-lost", None)
                .await
                .unwrap();
        }
        assert!(store.keep_ended("n").await.unwrap());
        assert!(!store.keep_ended("n").await.unwrap());
        assert!(store.restart_gang("n", "x", None).await.unwrap().is_none());
    }

    #[test]
    fn the_restart_count_goes_into_the_requests_environment() {
        let r = super::with_restart_count(r#"{"image":"i","environ":{"A":"1"}}"#, 2);
        let v: serde_json::Value = serde_json::from_str(&r).unwrap();
        assert_eq!(v["environ"]["A"], "1");
        assert_eq!(v["environ"]["KERNELVISOR_RESTART_COUNT"], "2");
        let r = super::with_restart_count(r#"{"image":"i"}"#, 1);
        let v: serde_json::Value = serde_json::from_str(&r).unwrap();
        assert_eq!(v["environ"]["KERNELVISOR_RESTART_COUNT"], "1");
        assert_eq!(super::with_restart_count("nope", 1), "nope");
    }
}

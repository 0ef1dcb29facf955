//! The session queue (issue 27): `PENDING` kernel rows, persistent so that a restarted manager
//! or a replica taking over the leadership finds the queue and its order as they were.
//!
//! A queued row has no agent (`agent_id` is empty), takes no concurrency and holds no slots;
//! it keeps its whole request (`request`, JSON) to be created from once admitted. Admission
//! ([`Store::admit_kernels`], a round's admissions in one transaction) is a reservation made
//! later: for each, the agent's room is checked as a direct create's is, the key's concurrency
//! taken, and the row moves `PENDING` → `SCHEDULED`. A queued row ends only by admission or by
//! [`Store::cancel_pending`] (`CANCELLED`).

use std::collections::HashMap;

use sqlx::{Any, FromRow, Row, Transaction};

use super::columns::{slots_column, NullableJsonText, SlotColumns};
use super::kernels::{
    insert_in, lock_agent_in, refuses_placement, scheduled_event, session_event, KernelRow,
    NewKernel, ReserveError, Start, COLUMNS, LIVE,
};
use super::usage::Placed;
use super::{now, Store, StoreError};
use crate::model::agent::AgentStatus;
use crate::model::cluster::ClusterMode;
use crate::model::event::{Event, EventType};
use crate::model::queue::PendingReason;
use crate::model::session::KernelStatus;
use crate::slots::ResourceSlots;

/// A `PENDING` session as an admission round sees it (no request body: read once admitted).
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct QueuedSession {
    /// Kernel UUID.
    pub id: String,
    /// Session UUID.
    pub session_id: String,
    /// Owner.
    pub access_key: String,
    /// Image reference.
    pub image: String,
    /// The slots it asks for.
    #[sqlx(flatten, try_from = "SlotColumns")]
    pub resource_slots: ResourceSlots,
    /// 0..=100.
    pub priority: i64,
    /// Unix seconds it was queued (0 when the row has none).
    pub queued_at: f64,
    /// Rounds it has held back the sessions behind it as a head that did not fit.
    pub head_skips: i64,
    /// The reason last written (`None` when its JSON does not parse).
    #[sqlx(try_from = "NullableJsonText")]
    pub pending_reason: Option<PendingReason>,
    /// `single-node` or `multi-node`.
    pub cluster_mode: ClusterMode,
    /// Kernels in the session, each of `resource_slots` (the row is its main kernel's; a gang
    /// waits as one entry).
    pub cluster_size: i64,
}

/// One access key's placed live sessions: what DRF and the concurrency limit look at.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyShare {
    /// The slots its placed live kernels hold.
    pub slots: ResourceSlots,
    /// `concurrency_used` (its placed live sessions).
    pub used: i64,
    /// `concurrency_limit`; 0 = unlimited.
    pub limit: i64,
    /// Whether it may create sessions at all (enabled, not deleted).
    pub enabled: bool,
}

/// An admitted session: its row as placed and its request, to create it from.
#[derive(Clone, Debug)]
pub struct Admitted {
    /// The row, `SCHEDULED` on its agent.
    pub row: KernelRow,
    /// The request it was queued with (`SessionRequest` JSON).
    pub request: String,
}

/// The queue's order in SQL: priority first (higher first), then the time it was queued.
const ORDER: &str = "ORDER BY priority DESC, queued_at ASC, id ASC";

/// Ids one `IN (…)` list of an admission batch binds at most.
const IN_CHUNK: usize = 500;

/// `$1, $2, …, $n`.
fn placeholders(n: usize) -> String {
    (1..=n)
        .map(|i| format!("${i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An agent as an admission batch sees it.
#[derive(Default)]
struct AgentRoom {
    /// `Some(status)` when the store holds it `LOST` or `PENDING`.
    not_alive: Option<AgentStatus>,
    /// The slots its live kernels hold (and, as the batch goes, the ones it admitted).
    used: ResourceSlots,
}

impl Store {
    /// Queues a session `PENDING` with `reason`: no agent, no concurrency taken, its request
    /// (`k.request`, JSON) kept to be created from once admitted. `k.agent_id` is ignored.
    ///
    /// Errors: [`ReserveError::UnknownAccessKey`] for a key that does not exist or is disabled;
    /// the database.
    pub async fn enqueue_kernel(
        &self,
        k: &NewKernel,
        reason: &PendingReason,
    ) -> Result<KernelRow, ReserveError> {
        match self.access_key(&k.access_key).await? {
            Some(key) if key.enabled => {}
            _ => return Err(ReserveError::UnknownAccessKey(k.access_key.clone())),
        }
        insert_in(&self.pool, k, Start::Queued(reason), now())
            .await
            .map_err(StoreError::from)?;
        self.depth.add(k.priority, 1);
        self.events.publish(Event {
            status: Some(KernelStatus::Pending.as_str().into()),
            reason: Some(reason.code.clone()),
            ..session_event(
                EventType::SessionStatus,
                &k.id,
                (k.session_id.clone(), String::new(), k.access_key.clone()),
            )
        });
        self.kernel(&k.id)
            .await?
            .ok_or_else(|| ReserveError::Store(StoreError::Db(sqlx::Error::RowNotFound)))
    }

    /// Whether any session of priority `priority` or higher waits: a new session of that
    /// priority queues behind it rather than being placed first.
    /// (One row looked at through the queue's index, not a count: with 100,000 queued a count
    /// costs every create milliseconds.)
    pub async fn queued_at_or_above(&self, priority: i64) -> Result<bool, StoreError> {
        let any: Option<i64> = sqlx::query_scalar(
            "SELECT priority FROM kernels WHERE status = 'PENDING' AND priority >= $1 LIMIT 1",
        )
        .bind(priority)
        .fetch_optional(&self.reads)
        .await?;
        Ok(any.is_some())
    }

    /// The first `limit` queued sessions in the queue's order (priority, then queued time)
    /// that may be placed now: a gang restart's backoff (`not_before`, Unix seconds) keeps its
    /// row out of the rounds until it passes, behind nobody and holding nothing.
    pub async fn pending_window(&self, limit: u32) -> Result<Vec<QueuedSession>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "SELECT id, session_id, access_key, image, resource_slots, cpu_millis, mem_bytes, cuda_devices, \
             priority, COALESCE(queued_at, 0.0) AS queued_at, head_skips, pending_reason, cluster_mode, cluster_size FROM kernels \
             WHERE status = $2 AND (not_before IS NULL OR not_before <= $3) {ORDER} LIMIT $1"
        ))
        .bind(i64::from(limit))
        .bind(KernelStatus::Pending)
        .bind(now())
        .fetch_all(&self.reads)
        .await?)
    }

    /// The request a queued session was made with (`SessionRequest` JSON); `None` when it is
    /// no longer `PENDING`.
    ///
    /// Errors: the database.
    pub async fn pending_request(&self, kernel_id: &str) -> Result<Option<String>, StoreError> {
        let row: Option<(Option<String>,)> =
            sqlx::query_as("SELECT request FROM kernels WHERE id = $1 AND status = 'PENDING'")
                .bind(kernel_id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|(r,)| r.unwrap_or_default()))
    }

    /// Every access key's placed live slots, concurrency and limit (DRF's shares and the
    /// concurrency check of an admission round): one pass over the live kernels and the keys.
    pub async fn key_shares(&self) -> Result<HashMap<String, KeyShare>, StoreError> {
        let mut out: HashMap<String, KeyShare> = HashMap::new();
        for k in self.access_keys().await? {
            out.insert(
                k.access_key.clone(),
                KeyShare {
                    slots: ResourceSlots::new(),
                    used: k.concurrency_used,
                    limit: k.concurrency_limit,
                    enabled: k.enabled,
                },
            );
        }
        for (key, slots) in self.slots_by_key().await? {
            out.entry(key).or_default().slots = slots;
        }
        Ok(out)
    }

    /// Admits queued sessions, each onto its agent (whose slots in total are given), in one
    /// transaction: for each, in order, the agent must not be `LOST`/`PENDING` and its live
    /// kernels plus the ones admitted before it in the batch plus this one must fit its total;
    /// the key must be enabled and below its `concurrency_limit` with the ones before it; then
    /// the row moves `PENDING` → `SCHEDULED` with its agent and `admitted_at`, and the keys'
    /// `concurrency_used` grows by what was admitted. The agents' and keys' rows are read once
    /// for the batch (PostgreSQL: each agent's reservation lock taken first, as a direct
    /// create's, and the keys' rows locked), so an admission costs one statement: on SQLite
    /// every statement is a round trip to its worker thread, and per-session checks made that
    /// most of a round's time (`just bench scheduler`).
    ///
    /// Each session's outcome, in order: its row and request; `Ok(None)` when it is no longer
    /// `PENDING` (cancelled meanwhile); or, nothing changed for it, [`ReserveError::NoRoom`] /
    /// [`ReserveError::AgentNotAlive`] (another create took the room first: it stays queued),
    /// [`ReserveError::ConcurrencyLimit`] / [`ReserveError::UnknownAccessKey`].
    ///
    /// Errors: the database (nothing admitted).
    pub async fn admit_kernels(
        &self,
        batch: &[(&QueuedSession, &str, &ResourceSlots)],
    ) -> Result<Vec<Result<Option<Admitted>, ReserveError>>, StoreError> {
        let mut agents: Vec<&str> = batch.iter().map(|(_, a, _)| *a).collect();
        agents.sort_unstable();
        agents.dedup();
        let mut keys: Vec<&str> = batch
            .iter()
            .map(|(q, _, _)| q.access_key.as_str())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let mut tx = self.pool.begin().await?;
        if self.backend == super::Backend::Postgres {
            // In id order, so two batches never wait on each other's locks crosswise.
            for a in &agents {
                lock_agent_in(&mut tx, a).await?;
            }
        }
        let mut room = self.agents_room_in(&mut tx, &agents).await?;
        let quota = self.keys_quota_in(&mut tx, &keys).await?;
        let mut out = Vec::with_capacity(batch.len());
        let mut taken: HashMap<&str, i64> = HashMap::new();
        let at = now();
        for (q, agent_id, total) in batch {
            let agent = room.entry((*agent_id).to_owned()).or_default();
            if let Some(st) = &agent.not_alive {
                out.push(Err(ReserveError::AgentNotAlive(
                    (*agent_id).to_owned(),
                    *st,
                )));
                continue;
            }
            let used = agent.used.checked_add(&q.resource_slots);
            let Some(used) = used.ok().filter(|u| u.fits_in(total).is_ok()) else {
                out.push(Err(ReserveError::NoRoom((*agent_id).to_owned())));
                continue;
            };
            let key = q.access_key.as_str();
            match quota.get(key) {
                Some(&(limit, used_now)) => {
                    let n = taken.get(key).copied().unwrap_or(0);
                    if limit > 0 && used_now + n >= limit {
                        out.push(Err(ReserveError::ConcurrencyLimit(key.to_owned(), limit)));
                        continue;
                    }
                }
                None => {
                    out.push(Err(ReserveError::UnknownAccessKey(key.to_owned())));
                    continue;
                }
            }
            let row = sqlx::query(&format!(
                "UPDATE kernels SET status = 'SCHEDULED', agent_id = $2, admitted_at = $3, \
                 status_changed_at = $3, pending_reason = NULL \
                 WHERE id = $1 AND status = 'PENDING' RETURNING request, {COLUMNS}"
            ))
            .bind(&q.id)
            .bind(*agent_id)
            .bind(at)
            .fetch_optional(&mut *tx)
            .await?;
            // `None`: cancelled meanwhile.
            let Some(row) = row else {
                out.push(Ok(None));
                continue;
            };
            agent.used = used;
            *taken.entry(key).or_default() += 1;
            out.push(Ok(Some(Admitted {
                row: KernelRow::from_row(&row)?,
                request: row
                    .try_get::<Option<String>, _>("request")?
                    .unwrap_or_default(),
            })));
        }
        for (key, n) in &taken {
            sqlx::query(
                "UPDATE access_keys SET concurrency_used = concurrency_used + $2 WHERE access_key = $1",
            )
            .bind(*key)
            .bind(*n)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        for (admitted, (q, agent_id, _)) in out.iter().zip(batch) {
            if let Ok(Some(_)) = admitted {
                self.depth.add(q.priority, -1);
                self.usage.add(
                    &q.id,
                    Placed {
                        agent_id: (*agent_id).to_owned(),
                        access_key: q.access_key.clone(),
                        slots: q.resource_slots.clone(),
                    },
                );
                self.events.publish(scheduled_event(
                    &q.id,
                    (&q.session_id, agent_id, &q.access_key),
                    "admitted",
                ));
            }
        }
        Ok(out)
    }

    /// Inside an admission batch: each agent's status (`LOST`/`PENDING` refuse) and the slots
    /// its live kernels hold, for `agents` (an agent without a row is one the store has not
    /// saved yet: alive, as [`Store::check_room_in`] takes it).
    async fn agents_room_in(
        &self,
        tx: &mut Transaction<'_, Any>,
        agents: &[&str],
    ) -> Result<HashMap<String, AgentRoom>, StoreError> {
        let mut out: HashMap<String, AgentRoom> = HashMap::new();
        for chunk in agents.chunks(IN_CHUNK) {
            let list = placeholders(chunk.len());
            let statuses = format!("SELECT id, status FROM agents WHERE id IN ({list})");
            let mut q = sqlx::query(&statuses);
            for a in chunk {
                q = q.bind(*a);
            }
            for r in q.fetch_all(&mut **tx).await? {
                let status: AgentStatus = r.try_get("status")?;
                let e = out.entry(r.try_get("id")?).or_default();
                e.not_alive = refuses_placement(status).then_some(status);
            }
            let live = format!(
                "SELECT agent_id, resource_slots, cpu_millis, mem_bytes, cuda_devices FROM kernels \
                 WHERE agent_id IN ({list}) AND {LIVE}"
            );
            let mut q = sqlx::query(&live);
            for a in chunk {
                q = q.bind(*a);
            }
            for r in q.fetch_all(&mut **tx).await? {
                let slots = slots_column(&r, "resource_slots")?;
                let e = out.entry(r.try_get("agent_id")?).or_default();
                e.used = e
                    .used
                    .checked_add(&slots)
                    .unwrap_or_else(|_| e.used.clone());
            }
        }
        Ok(out)
    }

    /// Inside an admission batch: `(concurrency_limit, concurrency_used)` of each of `keys`
    /// that is enabled and not deleted (PostgreSQL: their rows locked until the end).
    async fn keys_quota_in(
        &self,
        tx: &mut Transaction<'_, Any>,
        keys: &[&str],
    ) -> Result<HashMap<String, (i64, i64)>, StoreError> {
        let lock = match self.backend {
            super::Backend::Postgres => " FOR UPDATE",
            super::Backend::Sqlite => "",
        };
        let mut out = HashMap::new();
        for chunk in keys.chunks(IN_CHUNK) {
            let sql = format!(
                "SELECT access_key, concurrency_limit, concurrency_used FROM access_keys \
                 WHERE access_key IN ({}) AND enabled = 1 AND deleted_at IS NULL{lock}",
                placeholders(chunk.len())
            );
            let mut q = sqlx::query_as::<_, (String, i64, i64)>(&sql);
            for k in chunk {
                q = q.bind(*k);
            }
            for (key, limit, used) in q.fetch_all(&mut **tx).await? {
                out.insert(key, (limit, used));
            }
        }
        Ok(out)
    }

    /// Cancels a queued session (`CANCELLED`, reason `reason`, `terminated_at` now): no agent
    /// was touched and no concurrency taken. Returns whether it was `PENDING`.
    pub async fn cancel_pending(&self, kernel_id: &str, reason: &str) -> Result<bool, StoreError> {
        let at = now();
        let row: Option<(String, String, String, i64)> = sqlx::query_as(
            "UPDATE kernels SET status = 'CANCELLED', status_reason = $2, terminated_at = $3, \
             status_changed_at = $3, pending_reason = NULL, request = NULL, \
             result = CASE WHEN session_type = 'batch' THEN 'FAILURE' ELSE result END \
             WHERE id = $1 AND status = 'PENDING' RETURNING session_id, agent_id, access_key, priority",
        )
        .bind(kernel_id)
        .bind(reason)
        .bind(at)
        .fetch_optional(&self.pool)
        .await?;
        let owner = row.map(|(session_id, agent_id, access_key, priority)| {
            self.depth.add(priority, -1);
            (session_id, agent_id, access_key)
        });
        Ok(self.publish(owner.map(|owner| Event {
            status: Some(KernelStatus::Cancelled.as_str().into()),
            reason: Some(reason.to_owned()),
            ..session_event(EventType::SessionStatus, kernel_id, owner)
        })))
    }

    /// Writes the reasons (and head-skip counts) an admission round found, in one
    /// transaction; rows no longer `PENDING` are left alone.
    pub async fn set_pending_reasons(
        &self,
        updates: &[(String, PendingReason, i64)],
    ) -> Result<(), StoreError> {
        if updates.is_empty() {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for (id, reason, skips) in updates {
            sqlx::query(
                "UPDATE kernels SET pending_reason = $2, head_skips = $3 WHERE id = $1 AND status = 'PENDING'",
            )
            .bind(id)
            .bind(serde_json::to_string(reason).unwrap_or_default())
            .bind(skips)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// A queued session's place in the queue: 1 + the sessions ahead of it (higher priority,
    /// or the same priority queued earlier).
    pub async fn queue_position(&self, k: &KernelRow) -> Result<i64, StoreError> {
        // Three ranges of the queue's index rather than one `OR` (which SQLite filters row by
        // row): higher priorities, then earlier at its own, then the same instant's lower ids.
        let ahead: i64 = sqlx::query_scalar(
            "SELECT (SELECT COUNT(*) FROM kernels WHERE status = 'PENDING' AND priority > $1) \
             + (SELECT COUNT(*) FROM kernels WHERE status = 'PENDING' AND priority = $1 AND queued_at < $2) \
             + (SELECT COUNT(*) FROM kernels WHERE status = 'PENDING' AND priority = $1 AND queued_at = $2 AND id < $3)",
        )
        .bind(k.priority)
        .bind(k.queued_at.unwrap_or(0.0))
        .bind(&k.id)
        .fetch_one(&self.reads)
        .await?;
        Ok(ahead + 1)
    }

    /// Every queued session's place in the queue (1 = next): kernel id → position.
    pub async fn queue_positions(&self) -> Result<HashMap<String, i64>, StoreError> {
        let ids: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT id FROM kernels WHERE status = 'PENDING' {ORDER}"
        ))
        .fetch_all(&self.reads)
        .await?;
        Ok(ids.into_iter().zip(1..).collect())
    }

    /// Queued sessions per priority: `(priority, count)`, highest priority first.
    pub async fn queue_depth(&self) -> Result<Vec<(i64, i64)>, StoreError> {
        let rows: Vec<(i64, i64)> = sqlx::query_as(
            "SELECT priority, COUNT(*) FROM kernels WHERE status = 'PENDING' GROUP BY priority ORDER BY priority DESC",
        )
        .fetch_all(&self.reads)
        .await?;
        self.depth.install(&rows);
        Ok(rows)
    }

    /// [`Store::queue_depth`] from the in-memory depth while it is fresh (`depth.rs`: exact for
    /// one manager's own changes; re-read after 1 s on PostgreSQL, 60 s on SQLite), else read.
    /// An admission round's metric: counting 100,000 queued rows four times a second held
    /// SQLite's one connection for milliseconds each time.
    ///
    /// Errors: the database.
    pub async fn queue_depth_cached(&self) -> Result<Vec<(i64, i64)>, StoreError> {
        match self.depth.counts() {
            Some(counts) => Ok(counts),
            None => self.queue_depth().await,
        }
    }

    /// Whether any session is queued: one row looked at.
    ///
    /// Errors: the database.
    pub async fn any_queued(&self) -> Result<bool, StoreError> {
        self.queued_at_or_above(i64::MIN).await
    }

    /// Where a session just queued at `priority` stands: the sessions queued at its priority
    /// or higher, itself included (it is the newest of its priority), from the in-memory depth
    /// (`depth.rs`: read from the database when stale, moved by this replica's own changes;
    /// not a count per create). [`Store::queue_position`] counts in the database.
    pub async fn new_queue_position(&self, priority: i64) -> Result<i64, StoreError> {
        if let Some(n) = self.depth.at_or_above(priority) {
            return Ok(n.max(1));
        }
        self.queue_depth().await?;
        Ok(self.depth.at_or_above(priority).unwrap_or(0).max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{NewKernel, ReserveError, Store};
    use crate::model::queue::{PendingCode, PendingReason};
    use crate::model::session::{KernelStatus, RestartPolicy, SessionType};
    use crate::slots::{Amount, ResourceSlots};

    fn cpu(units: u64) -> ResourceSlots {
        [("cpu".to_owned(), Amount::from_units(units))]
            .into_iter()
            .collect()
    }

    async fn enqueue(store: &Store, id: &str, key: &str, units: u64, priority: i64) {
        let k = NewKernel {
            cluster_mode: crate::model::cluster::ClusterMode::SingleNode,
            cluster_size: 1,
            cluster: crate::model::cluster::ClusterSlot::main(),
            id: id.into(),
            session_id: id.into(),
            agent_id: String::new(),
            access_key: key.into(),
            image: "img".into(),
            resource_slots: cpu(units),
            session_type: SessionType::Interactive,
            command: None,
            batch_timeout: None,
            mounts: Vec::new(),
            restart_policy: RestartPolicy::default(),
            priority,
            request: Some("{}".into()),
            stop_signal: None,
            grace_period: None,
            preemptible: false,
        };
        let why = PendingReason::new(PendingCode::NoCapacity, "full");
        store.enqueue_kernel(&k, &why).await.unwrap();
    }

    /// One transaction admits a round's sessions, each judged on its own: room re-checked
    /// with the ones admitted before it in the batch, the key's limit, a cancelled one; what
    /// is admitted shows in the usage ledger, the key's concurrency and the queue's depth.
    #[actix_rt::test]
    async fn a_batch_admits_each_on_its_own() {
        let (dir, store) = super::super::test_store_with_key().await;
        store
            .create_access_key("LIM", "hash2", "user", "", 1)
            .await
            .unwrap();
        for (id, key, units) in [
            ("a", "AK", 2),
            ("b", "AK", 2),
            ("c", "AK", 1),
            ("l1", "LIM", 1),
            ("l2", "LIM", 1),
            ("gone", "AK", 1),
        ] {
            enqueue(&store, id, key, units, 10).await;
        }
        assert_eq!(store.new_queue_position(10).await.unwrap(), 6);
        assert_eq!(store.new_queue_position(11).await.unwrap(), 1);
        assert!(store
            .cancel_pending("gone", "user-requested")
            .await
            .unwrap());
        let window = store.pending_window(10).await.unwrap();
        let ids: Vec<&str> = window.iter().map(|q| q.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c", "l1", "l2"], "the queue's order");
        let (four, big) = (cpu(4), cpu(100));
        let batch = [
            (&window[0], "x", &four), // a: 2 of 4
            (&window[1], "x", &four), // b: 4 of 4
            (&window[2], "x", &four), // c: no room beside a and b
            (&window[3], "y", &big),  // l1: LIM's one
            (&window[4], "y", &big),  // l2: LIM at its limit
        ];
        let out = store.admit_kernels(&batch).await.unwrap();
        let admitted: Vec<bool> = out.iter().map(|r| matches!(r, Ok(Some(_)))).collect();
        assert_eq!(admitted, [true, true, false, true, false], "{out:?}");
        assert!(matches!(out[2], Err(ReserveError::NoRoom(_))), "{out:?}");
        assert!(
            matches!(out[4], Err(ReserveError::ConcurrencyLimit(_, 1))),
            "{out:?}"
        );
        let usage = store.usage_by_agent().await.unwrap();
        assert_eq!((usage["x"].slots.clone(), usage["x"].kernels), (cpu(4), 2));
        assert_eq!(usage["y"].kernels, 1);
        let key = |k: &'static str| {
            let store = store.clone();
            async move { store.access_key(k).await.unwrap().unwrap().concurrency_used }
        };
        assert_eq!((key("AK").await, key("LIM").await), (2, 1));
        assert_eq!(store.new_queue_position(10).await.unwrap(), 2);
        let c = store.kernel("c").await.unwrap().unwrap();
        assert_eq!(
            (c.status, store.queue_position(&c).await.unwrap()),
            (KernelStatus::Pending, 1)
        );
        // Ended: out of the ledger; a fresh store (another start) reads the same from the rows.
        assert!(store
            .terminate_kernel("a", "user-requested", None)
            .await
            .unwrap());
        let usage = store.usage_by_agent().await.unwrap();
        assert_eq!((usage["x"].slots.clone(), usage["x"].kernels), (cpu(2), 1));
        let again = Store::connect(&format!("sqlite://{}/m.db", dir.path().display()))
            .await
            .unwrap();
        assert_eq!(again.usage_by_agent().await.unwrap(), usage);
        assert_eq!(again.new_queue_position(0).await.unwrap(), 2);
    }
}

//! Idle reclaim in the store (`migrations/manager/0015_reclaim.sql`, `docs/design.md` "Idle
//! reclaim"): each session's policy and what its agent reported (last activity, the runs of
//! utilization readings under its floor), the sessions the leader's reclaim duty looks at,
//! its once-per-deadline warnings, and the access keys' defaults.
//!
//! The facts live in the kernel rows, not in a replica's memory: whichever replica's intake
//! takes a heartbeat writes them, and whichever replica leads (after a restart or a failover
//! too) decides from them.

use std::collections::BTreeMap;

use super::columns::json_text;
use super::kernels::{KernelRow, COLUMNS};
use super::{Store, StoreError};
use crate::model::event::{Event, EventType};
use crate::model::reclaim::{
    meets_floor, ActivityReport, Facts, ReclaimPolicy, ReclaimReason, ReclaimState,
};
use crate::model::session::SessionType;

impl KernelRow {
    /// What its reclaim deadlines are computed from ([`crate::model::reclaim::Deadlines`]):
    /// its policy, its placement (`admitted_at`, else `created_at`), when it started running
    /// (a `RUNNING` row's `status_changed_at`), its type, its last activity and its run of low
    /// readings.
    pub fn reclaim_state(&self) -> ReclaimState {
        ReclaimState {
            policy: self.reclaim.policy(),
            placed_at: self.admitted_at.unwrap_or(self.created_at),
            // A `RUNNING` row's last status change is when it started running.
            running_since: if self.status == crate::model::session::KernelStatus::Running {
                self.status_changed_at
            } else {
                self.admitted_at.unwrap_or(self.created_at)
            },
            batch: self.session_type == SessionType::Batch,
            last_activity: self.reclaim.last_activity,
            low_since: self.reclaim.low_since,
        }
    }

    /// This (main) kernel's row with its session's reported facts in its reclaim columns:
    /// those of every kernel of `kernels` in its session combined ([`Facts::of_session`]), so
    /// activity on a sub kernel counts for the session. `kernels` may include this row.
    pub fn with_session_facts<'a>(
        &'a self,
        kernels: impl IntoIterator<Item = &'a KernelRow>,
    ) -> KernelRow {
        let own = std::iter::once(self);
        let others = kernels
            .into_iter()
            .filter(|k| k.session_id == self.session_id && k.id != self.id);
        let f = Facts::of_session(own.chain(others).map(|k| Facts {
            last_activity: k.reclaim.last_activity,
            activity_at: k.reclaim.activity_at,
            low_since: k.reclaim.low_since,
        }));
        let mut row = self.clone();
        row.reclaim.last_activity = f.last_activity;
        row.reclaim.activity_at = f.activity_at;
        row.reclaim.low_since = f.low_since;
        row
    }
}

/// Reports written per statement batch (one transaction each).
const CHUNK: usize = 500;

impl Store {
    /// Sets the reclaim policy of every kernel row of `session_id` (at its creation). An
    /// empty policy writes nothing.
    ///
    /// Errors: the database.
    pub async fn set_reclaim_policy(
        &self,
        session_id: &str,
        p: &ReclaimPolicy,
    ) -> Result<(), StoreError> {
        if p.is_empty() {
            return Ok(());
        }
        // -1 stands for NULL: never a NULL f64 parameter (see agents.rs).
        sqlx::query(
            "UPDATE kernels SET max_lifetime = NULLIF($2, -1.0), idle_timeout = NULLIF($3, -1.0), \
             utilization_window = NULLIF($4, -1.0), min_utilization = NULLIF($5, '') \
             WHERE session_id = $1",
        )
        .bind(session_id)
        .bind(p.max_lifetime.unwrap_or(-1.0))
        .bind(p.idle_timeout.unwrap_or(-1.0))
        .bind(p.utilization_window.unwrap_or(-1.0))
        .bind(if p.min_utilization.is_empty() {
            String::new()
        } else {
            json_text(&p.min_utilization, "")
        })
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Writes the heartbeats' facts into the rows of the `RUNNING` kernels that have a reclaim
    /// policy (one query per chunk finds them; the others cost no write): `activity_at` (the
    /// agent's word that nothing it did not report happened until then) and `last_activity`
    /// only move forward; a reading that meets the row's floor ([`meets_floor`]) clears
    /// `low_since`, one under it starts it (at the heartbeat's time) unless a run is going.
    ///
    /// Errors: the database.
    pub async fn record_activity(&self, reports: &[ActivityReport]) -> Result<(), StoreError> {
        for chunk in reports.chunks(CHUNK) {
            let mut tx = self.pool.begin().await?;
            let list = (1..=chunk.len())
                .map(|i| format!("${i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "SELECT id, min_utilization FROM kernels WHERE id IN ({list}) AND status = 'RUNNING' \
                 AND (max_lifetime IS NOT NULL OR idle_timeout IS NOT NULL OR min_utilization IS NOT NULL)"
            );
            let mut q = sqlx::query_as::<_, (String, Option<String>)>(&sql);
            for r in chunk {
                q = q.bind(r.kernel_id.as_str());
            }
            // Each kernel with a policy, and its floor (empty: none).
            let policed: std::collections::HashMap<String, BTreeMap<String, f64>> = q
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .map(|(id, floor)| {
                    let floor = floor
                        .and_then(|t| serde_json::from_str(&t).ok())
                        .unwrap_or_default();
                    (id, floor)
                })
                .collect();
            for r in chunk {
                let Some(floor) = policed.get(&r.kernel_id) else {
                    continue;
                };
                let verdict = meets_floor(floor, &r.utilization);
                sqlx::query(
                    "UPDATE kernels SET \
                     last_activity = CASE WHEN $2 > COALESCE(last_activity, -1.0) THEN $2 ELSE last_activity END, \
                     activity_at = CASE WHEN $3 > COALESCE(activity_at, -1.0) THEN $3 ELSE activity_at END, \
                     low_since = CASE WHEN $4 = 1 THEN NULL WHEN $4 = 0 THEN COALESCE(low_since, $3) ELSE low_since END \
                     WHERE id = $1 AND status = 'RUNNING'",
                )
                .bind(r.kernel_id.as_str())
                .bind(r.last_activity.unwrap_or(-1.0))
                .bind(r.at)
                .bind(match verdict {
                    Some(true) => 1i64,
                    Some(false) => 0,
                    None => -1,
                })
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
        }
        Ok(())
    }

    /// The `RUNNING` main kernels with a reclaim policy, each with its session's facts
    /// ([`KernelRow::with_session_facts`]: a cluster session's sub kernels' activity and
    /// readings count): what the reclaim duty looks at.
    ///
    /// Errors: the database.
    pub async fn reclaim_candidates(&self) -> Result<Vec<KernelRow>, StoreError> {
        // Every kernel of a policed session carries the policy (`set_reclaim_policy`), so one
        // query reads the main kernels and their sub kernels.
        let rows: Vec<KernelRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM kernels WHERE status = 'RUNNING' \
             AND (max_lifetime IS NOT NULL OR idle_timeout IS NOT NULL OR min_utilization IS NOT NULL)"
        ))
        .fetch_all(&self.pool)
        .await?;
        let mut by_session: std::collections::HashMap<&str, Vec<&KernelRow>> =
            std::collections::HashMap::new();
        for k in &rows {
            by_session.entry(k.session_id.as_str()).or_default().push(k);
        }
        Ok(rows
            .iter()
            .filter(|k| k.is_main())
            .map(|k| {
                let kernels = by_session.get(k.session_id.as_str());
                k.with_session_facts(kernels.into_iter().flatten().copied())
            })
            .collect())
    }

    /// Records that `k`'s warning for `deadline` goes out, and publishes its
    /// `reclaim_warning` event, unless one was already recorded for that deadline (by this
    /// replica or a leader before it). Returns whether it went out.
    ///
    /// Errors: the database.
    pub async fn warn_reclaim(
        &self,
        k: &KernelRow,
        reason: ReclaimReason,
        deadline: f64,
    ) -> Result<bool, StoreError> {
        let changed = sqlx::query(
            "UPDATE kernels SET reclaim_warned = $2 WHERE id = $1 AND status = 'RUNNING' \
             AND (reclaim_warned IS NULL OR reclaim_warned <> $2)",
        )
        .bind(k.id.as_str())
        .bind(deadline)
        .execute(&self.pool)
        .await?
        .rows_affected()
            > 0;
        if changed {
            self.events().publish(Event {
                session_id: Some(k.session_id.clone()),
                kernel_id: Some(k.id.clone()),
                agent_id: Some(k.agent_id.clone()),
                access_key: Some(k.access_key.clone()),
                status: Some(k.status.as_str().to_owned()),
                reason: Some(reason.as_str().to_owned()),
                deadline: Some(deadline),
                ..Event::of(EventType::ReclaimWarning)
            });
        }
        Ok(changed)
    }

    /// Access key `key`'s defaults for its sessions' reclaim policy (empty when it has none,
    /// or no such key).
    ///
    /// Errors: the database.
    pub async fn key_reclaim_defaults(&self, key: &str) -> Result<ReclaimPolicy, StoreError> {
        let text: Option<Option<String>> = sqlx::query_scalar(
            "SELECT reclaim_defaults FROM access_keys WHERE access_key = $1 AND deleted_at IS NULL",
        )
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(text
            .flatten()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default())
    }

    /// Sets access key `key`'s reclaim defaults (an empty policy: none). Returns whether the
    /// key exists.
    ///
    /// Errors: the database.
    pub async fn set_key_reclaim_defaults(
        &self,
        key: &str,
        p: &ReclaimPolicy,
    ) -> Result<bool, StoreError> {
        // '' stands for NULL (no NULL parameter: see agents.rs).
        let text = if p.is_empty() {
            String::new()
        } else {
            json_text(p, "")
        };
        Ok(sqlx::query(
            "UPDATE access_keys SET reclaim_defaults = NULLIF($2, '') WHERE access_key = $1 AND deleted_at IS NULL",
        )
        .bind(key)
        .bind(text)
        .execute(&self.pool)
        .await?
        .rows_affected()
            > 0)
    }
}

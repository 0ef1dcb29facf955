//! Kernels (one per session): placement reservations against their access key's concurrency,
//! status updates, and the one way out of the live set.

use std::collections::HashMap;

use sqlx::{Any, Row, Transaction};

use super::columns::{
    json_text, legacy_columns, slots_column, IntFlag, JsonText, NullableJsonText, SlotColumns,
};
use super::usage::{Placed, Usage};
use super::{now, Store, StoreError};
use crate::model::agent::AgentStatus;
use crate::model::cluster::{ClusterMode, ClusterSlot, MAIN_ROLE};
use crate::model::event::{Event, EventType};
use crate::model::pull::PullProgress;
use crate::model::queue::PendingReason;
use crate::model::session::{
    KernelStatus, MountSpec, RestartPolicy, SessionMount, SessionResult, SessionType,
};
use crate::slots::ResourceSlots;

/// One kernel row, as the store reads it (`sqlx::FromRow` over [`COLUMNS`]; the enums are TEXT
/// columns of their names, the JSON columns read leniently: see `columns.rs`).
#[derive(Clone, Debug, PartialEq, sqlx::FromRow)]
pub struct KernelRow {
    /// Kernel UUID.
    pub id: String,
    /// Session UUID.
    pub session_id: String,
    /// The agent it is placed on.
    pub agent_id: String,
    /// The access key that owns it.
    pub access_key: String,
    /// Image reference.
    pub image: String,
    /// `PENDING` (queued, no agent yet), `SCHEDULED` (placed, agent not answered yet),
    /// `PREPARING` … `RUNNING` … `TERMINATED`, or `CANCELLED` (deleted while queued).
    pub status: KernelStatus,
    /// Why it terminated (`user-requested`, `agent-lost`, …).
    pub status_reason: Option<String>,
    /// Exit code when it terminated by itself.
    pub exit_code: Option<i64>,
    /// The slots it asked for and holds while live: every slot of the request (`cpu` cores,
    /// `mem` bytes, accelerator slots in their units).
    #[sqlx(flatten, try_from = "SlotColumns")]
    pub resource_slots: ResourceSlots,
    /// Unix seconds.
    pub created_at: f64,
    /// Unix seconds; `None` while live.
    pub terminated_at: Option<f64>,
    /// Interactive or batch.
    pub session_type: SessionType,
    /// The `sh -c` command it runs as its main process, if one was given.
    pub command: Option<String>,
    /// Seconds a batch session may run.
    pub batch_timeout: Option<f64>,
    /// `UNDEFINED`, or a batch session's `SUCCESS` / `FAILURE` once it ended.
    pub result: SessionResult,
    /// Its vfolders as asked for (stored as JSON `[{"name", "permission"}]`; text that does not
    /// parse reads as none).
    #[sqlx(try_from = "JsonText")]
    pub mounts: Vec<SessionMount>,
    /// Its restart policy as asked for (stored as JSON `{"mode", "max_restarts", "window",
    /// "backoff"}`; text that does not parse reads as the default).
    #[sqlx(try_from = "JsonText")]
    pub restart_policy: RestartPolicy,
    /// Restarts by its restart policy so far (`kernel_restarting` events).
    pub restart_count: i64,
    /// Its image pull's progress, while (and after) it was `PULLING`; `None` when it never
    /// pulled (or its JSON does not parse).
    #[sqlx(try_from = "NullableJsonText")]
    pub pull_progress: Option<PullProgress>,
    /// 0 (lowest) to 100.
    pub priority: i64,
    /// Unix seconds it entered the queue; `None` when it was placed at once.
    pub queued_at: Option<f64>,
    /// Unix seconds it left the queue; `None` while `PENDING` or when never queued.
    pub admitted_at: Option<f64>,
    /// While `PENDING`: why it waits (JSON; `None` when it does not parse).
    #[sqlx(try_from = "NullableJsonText")]
    pub pending_reason: Option<PendingReason>,
    /// Unix seconds of its last status change (the transient states' deadlines count from it).
    pub status_changed_at: f64,
    /// `single-node` or `multi-node` (every kernel of the session the same).
    pub cluster_mode: ClusterMode,
    /// Kernels in its session (every kernel of the session the same).
    pub cluster_size: i64,
    /// `main` or `sub`.
    pub cluster_role: String,
    /// 1-based within its role.
    pub cluster_idx: i64,
    /// `main1`, `sub1`, …
    pub cluster_hostname: String,
    /// The main kernel's row of a cluster session: its network (`bai-singlenode-<session
    /// id>` on its agent, `bai-multinode-<session id>` a Swarm overlay), once made; `None`
    /// otherwise.
    pub network: Option<String>,
    /// Names of the service ports its agent published (stored as JSON; the main kernel's
    /// are the session's, a sub kernel publishes none).
    #[sqlx(try_from = "JsonText")]
    pub service_ports: Vec<String>,
    // -- graceful termination (issue 41) --
    /// The signal its workload gets when it is ended; `None`: the agent's default (`SIGTERM`,
    /// `SIGINT` for a runner kernel).
    pub stop_signal: Option<String>,
    /// Seconds its workload has to exit after the stop signal; `None` for a row stored before
    /// grace periods (the agent's `[container] grace-period` then).
    pub grace_period: Option<f64>,
    /// While `TERMINATING`: Unix seconds by which its agent kills what still runs.
    pub terminate_deadline: Option<f64>,
    // Idle reclaim.
    /// Its reclaim policy and what its agent reported (`reclaim.rs`).
    #[sqlx(flatten)]
    pub reclaim: super::columns::ReclaimColumns,
    // Preemption (issue 41 item 2).
    /// Whether a higher-priority session may evict it.
    #[sqlx(try_from = "IntFlag")]
    pub preemptible: bool,
    /// The kernel id of the row that requeued this one after a preemption; `None` for the
    /// session's current row (a superseded row is history: lists and look-ups skip it).
    pub superseded_by: Option<String>,
    /// Unix seconds of the session's last preemption (carried to its requeued row).
    pub preempted_at: Option<f64>,
}

impl KernelRow {
    /// How it is ended when its end names no grace of its own: its stop signal and grace
    /// period, `default` for a row stored without one.
    pub fn grace(&self, default: std::time::Duration) -> crate::workload::Grace {
        crate::workload::Grace {
            signal: self
                .stop_signal
                .clone()
                .unwrap_or_else(|| crate::workload::grace::DEFAULT_STOP_SIGNAL.into()),
            period: self
                .grace_period
                .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
                .unwrap_or(default),
        }
    }

    /// Whether the kernel is in the live set (anything but `TERMINATED` and `CANCELLED`; a
    /// `PENDING` session is live but holds no agent's slots).
    pub fn is_live(&self) -> bool {
        match self.status {
            KernelStatus::Terminated | KernelStatus::Cancelled => false,
            KernelStatus::Pending
            | KernelStatus::Scheduled
            | KernelStatus::Preparing
            | KernelStatus::Pulling
            | KernelStatus::Creating
            | KernelStatus::Running
            | KernelStatus::Restarting
            | KernelStatus::Terminating
            | KernelStatus::Preempted => true,
        }
    }

    /// A main kernel's row of a cluster of 2 in `status` with every optional column empty,
    /// for unit tests of code that reads rows.
    #[cfg(test)]
    pub(crate) fn for_tests(id: &str, status: KernelStatus) -> KernelRow {
        KernelRow {
            id: id.into(),
            session_id: format!("{id}-s"),
            agent_id: "a".into(),
            access_key: "AK".into(),
            image: "img".into(),
            status,
            status_reason: None,
            exit_code: None,
            resource_slots: ResourceSlots::new(),
            created_at: 1.0,
            terminated_at: None,
            session_type: SessionType::Interactive,
            command: None,
            batch_timeout: None,
            result: SessionResult::Undefined,
            mounts: Vec::new(),
            restart_policy: RestartPolicy::default(),
            restart_count: 0,
            pull_progress: None,
            priority: 10,
            queued_at: None,
            admitted_at: None,
            pending_reason: None,
            status_changed_at: 1.0,
            cluster_mode: ClusterMode::SingleNode,
            cluster_size: 2,
            cluster_role: MAIN_ROLE.into(),
            cluster_idx: 1,
            cluster_hostname: "main1".into(),
            network: None,
            service_ports: Vec::new(),
            stop_signal: None,
            grace_period: None,
            terminate_deadline: None,
            reclaim: Default::default(),
            preemptible: false,
            superseded_by: None,
            preempted_at: None,
        }
    }

    /// Whether it waits in the queue (`PENDING`: no agent, no concurrency taken).
    pub fn is_pending(&self) -> bool {
        self.status == KernelStatus::Pending
    }

    /// Whether it is its session's main kernel (the one that stands for the session: its
    /// queue entry, its concurrency, its service ports).
    pub fn is_main(&self) -> bool {
        self.cluster_role == MAIN_ROLE
    }
}

/// A kernel to reserve on an agent before `create_kernels` is called.
#[derive(Clone, Debug)]
pub struct NewKernel {
    /// Kernel UUID.
    pub id: String,
    /// Session UUID.
    pub session_id: String,
    /// Chosen agent.
    pub agent_id: String,
    /// Owner.
    pub access_key: String,
    /// Image reference.
    pub image: String,
    /// The slots it asks for (every slot of the request, checked by the scheduler).
    pub resource_slots: ResourceSlots,
    /// Interactive or batch.
    pub session_type: SessionType,
    /// Main-process command, if any.
    pub command: Option<String>,
    /// Seconds (batch only).
    pub batch_timeout: Option<f64>,
    /// vfolders as asked for (stored as JSON `[{"name", "permission"}]`).
    pub mounts: Vec<MountSpec>,
    /// Restart policy (stored as JSON `{"mode", "max_restarts", "window", "backoff"}`).
    pub restart_policy: RestartPolicy,
    /// 0 (lowest) to 100.
    pub priority: i64,
    /// The request it was made from (`SessionRequest` JSON), kept while it is live: the
    /// reconcile sweep creates an orphaned pull's kernel from it (`Store::orphaned_pulls`, for
    /// sessions of one kernel: a cluster session's kernel stuck `PULLING` meets its state's
    /// deadline, which ends the whole session).
    /// `None` stores nothing (such a kernel is left to its state's deadline).
    pub request: Option<String>,
    /// The session's cluster mode.
    pub cluster_mode: ClusterMode,
    /// Kernels in the session (1: not a cluster).
    pub cluster_size: u32,
    /// Its place in the cluster (`main1` for a session of one kernel).
    pub cluster: ClusterSlot,
    /// Its stop signal (`None`: the agent's default).
    pub stop_signal: Option<String>,
    /// Its grace period in seconds (`None`: `[scheduler] grace-period` when it ends).
    pub grace_period: Option<f64>,
    // Preemption (issue 41 item 2).
    /// Whether a higher-priority session may evict it.
    pub preemptible: bool,
}

/// Why a reservation was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReserveError {
    /// No such access key.
    #[error("access key `{0}` does not exist")]
    UnknownAccessKey(String),
    /// The key already has `limit` live kernels.
    #[error("access key `{0}` is at its concurrency limit ({1})")]
    ConcurrencyLimit(String, i64),
    /// The agent's free slots no longer fit the request (another replica, or another create,
    /// placed there first): place again.
    #[error("agent `{0}` no longer has room for the request")]
    NoRoom(String),
    /// The store holds the agent `LOST` or `PENDING` (the leader's word): place elsewhere.
    #[error("agent `{0}` is {1}")]
    AgentNotAlive(String, AgentStatus),
    /// The database failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

pub(super) const COLUMNS: &str = "id, session_id, agent_id, access_key, image, status, status_reason, exit_code, cpu_millis, mem_bytes, cuda_devices, created_at, terminated_at, session_type, command, batch_timeout, result, mounts, restart_policy, restart_count, resource_slots, pull_progress, priority, queued_at, admitted_at, pending_reason, status_changed_at, cluster_mode, cluster_size, cluster_role, cluster_idx, cluster_hostname, network, service_ports, stop_signal, grace_period, terminate_deadline, max_lifetime, idle_timeout, utilization_window, min_utilization, last_activity, activity_at, low_since, reclaim_warned, preemptible, superseded_by, preempted_at";

/// The live set in SQL: every status but the two final ones.
pub(super) const LIVE: &str = "status NOT IN ('TERMINATED', 'CANCELLED')";

/// The `session_status` (or `pull_progress`) event of the kernel a `RETURNING session_id,
/// agent_id, access_key` row names.
pub(super) fn session_event(
    kind: EventType,
    kernel_id: &str,
    (session_id, agent_id, access_key): (String, String, String),
) -> Event {
    Event {
        session_id: Some(session_id),
        kernel_id: Some(kernel_id.to_owned()),
        agent_id: Some(agent_id),
        access_key: Some(access_key),
        ..Event::of(kind)
    }
}

/// The `session_status` event of a kernel that was placed on an agent (`SCHEDULED`, reason
/// `placed` for a direct create, `admitted` for one from the queue).
pub(super) fn scheduled_event(
    kernel_id: &str,
    (session_id, agent_id, access_key): (&str, &str, &str),
    reason: &str,
) -> Event {
    Event {
        status: Some(KernelStatus::Scheduled.as_str().into()),
        reason: Some(reason.to_owned()),
        ..session_event(
            EventType::SessionStatus,
            kernel_id,
            (
                session_id.to_owned(),
                agent_id.to_owned(),
                access_key.to_owned(),
            ),
        )
    }
}

/// Whether a reservation refuses an agent the store holds in `status`: `LOST` or `PENDING`
/// (the leader's word). `ALIVE` and `TERMINATED` are not refused, nor is an agent without a
/// row (one the store has not saved yet).
pub(super) fn refuses_placement(status: AgentStatus) -> bool {
    match status {
        AgentStatus::Lost | AgentStatus::Pending => true,
        AgentStatus::Alive | AgentStatus::Terminated => false,
    }
}

/// Takes one unit of `access_key`'s concurrency inside `tx`: `false` when the key is unknown,
/// disabled, deleted or at its `concurrency_limit` (nothing taken).
pub(super) async fn take_concurrency_in(
    tx: &mut Transaction<'_, Any>,
    access_key: &str,
) -> Result<bool, StoreError> {
    let taken = sqlx::query(
        "UPDATE access_keys SET concurrency_used = concurrency_used + 1 \
         WHERE access_key = $1 AND enabled = 1 AND deleted_at IS NULL \
         AND (concurrency_limit = 0 OR concurrency_used < concurrency_limit)",
    )
    .bind(access_key)
    .execute(&mut **tx)
    .await?
    .rows_affected();
    Ok(taken > 0)
}

/// Inside a reservation or an admission on PostgreSQL: a transaction-scoped advisory lock on
/// the agent id (which needs no agent row yet), serializing every reservation on that agent
/// across replicas.
pub(super) async fn lock_agent_in(
    tx: &mut Transaction<'_, Any>,
    agent_id: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query("SELECT 1 FROM (SELECT pg_advisory_xact_lock(1, hashtext($1))) AS agent_lock")
        .bind(agent_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// Moves one kernel out of the live set inside `tx`, releasing its access key's concurrency.
/// Returns its `TERMINATED` event when it was live (a second call for the same kernel is a
/// no-op and returns `None`); the caller publishes it once `tx` commits.
pub(super) async fn terminate_in(
    tx: &mut Transaction<'_, Any>,
    kernel_id: &str,
    reason: &str,
    exit_code: Option<i64>,
) -> Result<Option<Event>, sqlx::Error> {
    // A batch session that ends without a session_success / session_failure of its agent (destroyed
    // by its user, its agent lost) failed.
    // A `PENDING` row is never placed and holds no concurrency: only `cancel_pending` ends it.
    // A `PREEMPTED` row ended any way but by its user (by its eviction, its agent's
    // `kernel_terminated` for it, its agent lost, a drain) ends `preempted` and keeps its
    // request until its session is requeued from it (`Store::finish_preempted` clears it): its
    // eviction was decided, its end is the preemption's. Its user's destroy ends it for good.
    // A cluster session's main row ended any way but by its user keeps its request too: the
    // leader decides whether its restart policy requeues the gang from it (`cluster::restart`),
    // and clears it otherwise.
    let owner: Option<(String, String, String, String)> = sqlx::query_as(&format!(
        "UPDATE kernels SET status = 'TERMINATED', \
         status_reason = CASE WHEN status = 'PREEMPTED' AND $2 <> 'user-requested' THEN 'preempted' ELSE $2 END, \
         exit_code = $3, terminated_at = $4, status_changed_at = $4, \
         request = CASE WHEN (status = 'PREEMPTED' OR (cluster_size > 1 AND cluster_role = 'main')) \
                   AND $2 <> 'user-requested' THEN request ELSE NULL END, \
         result = CASE WHEN session_type = 'batch' AND result = 'UNDEFINED' THEN 'FAILURE' ELSE result END \
         WHERE id = $1 AND {LIVE} AND status <> 'PENDING' RETURNING session_id, agent_id, access_key, cluster_role",
    ))
    .bind(kernel_id)
    .bind(reason)
    .bind(exit_code)
    .bind(now())
    .fetch_optional(&mut **tx)
    .await?;
    let Some((session_id, agent_id, access_key, role)) = owner else {
        return Ok(None);
    };
    let owner = (session_id, agent_id, access_key);
    // A session takes one unit of concurrency, held by its main kernel's row.
    if role == MAIN_ROLE {
        sqlx::query("UPDATE access_keys SET concurrency_used = concurrency_used - 1 WHERE access_key = $1 AND concurrency_used > 0")
            .bind(&owner.2)
            .execute(&mut **tx)
            .await?;
    }
    Ok(Some(Event {
        status: Some(KernelStatus::Terminated.as_str().into()),
        reason: Some(reason.to_owned()),
        exit_code,
        ..session_event(EventType::SessionStatus, kernel_id, owner)
    }))
}

/// The statuses a kernel may move to `status` from ([`KernelStatus::rank`]): every earlier
/// one but `PENDING` (only an admission places a queued session), and for `RUNNING` also
/// `RESTARTING` (a restart, by the restart policy or `restart_kernel`, ends in
/// `kernel_started`). None for `TERMINATED`: a kernel ends only through [`terminate_in`],
/// which frees its concurrency.
fn advances_from(status: KernelStatus) -> Vec<KernelStatus> {
    if status == KernelStatus::Terminated {
        return Vec::new();
    }
    let mut earlier: Vec<KernelStatus> = KernelStatus::ALL
        .into_iter()
        .filter(|s| s.rank() < status.rank() && *s != KernelStatus::Pending)
        .collect();
    if status == KernelStatus::Running {
        earlier.push(KernelStatus::Restarting);
    }
    earlier
}

/// Moves a kernel's status forward (never back, never out of `TERMINATED`: see
/// [`advances_from`]) through `ex`. Returns its `session_status` event when the status changed.
pub(super) async fn advance_in<'c>(
    ex: impl sqlx::Executor<'c, Database = Any>,
    kernel_id: &str,
    status: KernelStatus,
) -> Result<Option<Event>, sqlx::Error> {
    let earlier = advances_from(status);
    if earlier.is_empty() {
        return Ok(None);
    }
    let list: Vec<String> = (0..earlier.len()).map(|i| format!("${}", i + 4)).collect();
    let sql = format!(
        "UPDATE kernels SET status = $2, status_changed_at = $3 WHERE id = $1 AND status IN ({}) \
         RETURNING session_id, agent_id, access_key",
        list.join(", ")
    );
    let mut q = sqlx::query_as(&sql)
        .bind(kernel_id)
        .bind(status)
        .bind(now());
    for s in earlier {
        q = q.bind(s);
    }
    let owner: Option<(String, String, String)> = q.fetch_optional(ex).await?;
    Ok(owner.map(|owner| Event {
        status: Some(status.as_str().to_owned()),
        ..session_event(EventType::SessionStatus, kernel_id, owner)
    }))
}

/// Records that a live kernel's container is restarting by its restart policy, inside `tx`:
/// status `RESTARTING` (from `CREATING`, `RUNNING` or `RESTARTING`) and one more restart (the
/// event is applied once: ids are deduplicated). Counted here rather than taken from the event's
/// `restart_count`, which starts again from 0 when the agent restarts. Returns the
/// `session_status` event (`RESTARTING`, reason `restart-policy: restart N`) when the kernel is
/// now `RESTARTING`.
pub(super) async fn restarting_in(
    tx: &mut Transaction<'_, Any>,
    kernel_id: &str,
) -> Result<Option<Event>, sqlx::Error> {
    let row: Option<(KernelStatus, i64, String, String, String)> = sqlx::query_as(&format!(
        "UPDATE kernels SET \
         status_changed_at = CASE WHEN status IN ('RUNNING', 'CREATING') THEN $2 ELSE status_changed_at END, \
         status = CASE WHEN status IN ('RUNNING', 'RESTARTING', 'CREATING') THEN 'RESTARTING' ELSE status END, \
         restart_count = restart_count + 1 WHERE id = $1 AND {LIVE} AND status <> 'PENDING' \
         RETURNING status, restart_count, session_id, agent_id, access_key",
    ))
    .bind(kernel_id)
    .bind(now())
    .fetch_optional(&mut **tx)
    .await?;
    Ok(row.filter(|r| r.0 == KernelStatus::Restarting).map(
        |(status, count, session, agent, key)| Event {
            status: Some(status.as_str().to_owned()),
            reason: Some(format!("restart-policy: restart {count}")),
            ..session_event(EventType::SessionStatus, kernel_id, (session, agent, key))
        },
    ))
}

/// Records a batch session's result (`SUCCESS` / `FAILURE`) inside `tx`, once: a result already
/// recorded stays. Returns whether it changed.
pub(super) async fn set_result_in(
    tx: &mut Transaction<'_, Any>,
    kernel_id: &str,
    result: SessionResult,
) -> Result<bool, sqlx::Error> {
    let r = sqlx::query("UPDATE kernels SET result = $2 WHERE id = $1 AND result = $3")
        .bind(kernel_id)
        .bind(result)
        .bind(SessionResult::Undefined)
        .execute(&mut **tx)
        .await?;
    Ok(r.rows_affected() > 0)
}

/// How a new kernel row starts ([`insert_in`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Start<'a> {
    /// Placed on its agent and reserved: `SCHEDULED`, its request kept when given.
    Placed,
    /// Queued for this reason: `PENDING`, no agent (`''`), `queued_at` set, its request kept
    /// (`{}` when none was given).
    Queued(&'a PendingReason),
}

/// Inserts `k`'s row through `ex`, as `start` says, created (and its status changed, and when
/// queued, queued) at `at` (Unix seconds): the one INSERT of a kernel, for a direct create's
/// reservation and a queued session alike. `restart_count` and `head_skips` start at 0, the
/// result `UNDEFINED`; the slots are written as JSON and in the old columns.
///
/// Errors: the database (a duplicate id among them).
pub(super) async fn insert_in<'c>(
    ex: impl sqlx::Executor<'c, Database = Any>,
    k: &NewKernel,
    start: Start<'_>,
    at: f64,
) -> Result<(), sqlx::Error> {
    let (status, agent_id, queued_at, pending_reason, request) = match start {
        // -1 stands for a NULL `queued_at`: never a NULL f64 parameter (see agents.rs).
        Start::Placed => (
            KernelStatus::Scheduled,
            k.agent_id.as_str(),
            -1.0,
            None,
            k.request.as_deref(),
        ),
        Start::Queued(reason) => (
            KernelStatus::Pending,
            "",
            at,
            Some(json_text(reason, "")),
            Some(k.request.as_deref().unwrap_or("{}")),
        ),
    };
    let (cpu_millis, mem_bytes, cuda_devices) = legacy_columns(&k.resource_slots);
    sqlx::query(&format!(
        "INSERT INTO kernels ({COLUMNS}, head_skips, request) VALUES ($1, $2, $3, $4, $5, $6, \
         NULL, NULL, $7, $8, $9, $10, NULL, $11, $12, NULLIF($13, -1.0), $14, $15, $16, 0, $17, \
         NULL, $18, NULLIF($19, -1.0), NULL, $20, $10, $22, $23, $24, $25, $26, NULL, '[]', $27, NULLIF($28, -1.0), NULL, \
         NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, $29, NULL, NULL, 0, $21)"
    ))
    .bind(&k.id)
    .bind(&k.session_id)
    .bind(agent_id)
    .bind(&k.access_key)
    .bind(&k.image)
    .bind(status)
    .bind(cpu_millis)
    .bind(mem_bytes)
    .bind(cuda_devices)
    .bind(at)
    .bind(k.session_type)
    .bind(&k.command)
    .bind(k.batch_timeout.unwrap_or(-1.0))
    .bind(SessionResult::Undefined)
    .bind(json_text(&k.mounts, "[]"))
    .bind(json_text(&k.restart_policy, r#"{"mode":"never"}"#))
    .bind(json_text(&k.resource_slots, "{}"))
    .bind(k.priority)
    .bind(queued_at)
    .bind(pending_reason)
    .bind(request)
    .bind(k.cluster_mode)
    .bind(i64::from(k.cluster_size))
    .bind(k.cluster.role)
    .bind(i64::from(k.cluster.idx))
    .bind(&k.cluster.hostname)
    .bind(&k.stop_signal)
    .bind(k.grace_period.unwrap_or(-1.0))
    .bind(i64::from(k.preemptible))
    .execute(ex)
    .await?;
    Ok(())
}

impl Store {
    /// Records a placed kernel as `SCHEDULED` and takes one unit of its key's concurrency, in one
    /// transaction.
    ///
    /// Errors: unknown key, key at its limit, the database.
    pub async fn reserve_kernel(
        &self,
        k: &NewKernel,
        agent_total: &ResourceSlots,
    ) -> Result<(), ReserveError> {
        let mut tx = self.pool.begin().await.map_err(StoreError::from)?;
        if !take_concurrency_in(&mut tx, &k.access_key).await? {
            drop(tx);
            return Err(self.concurrency_refused(&k.access_key).await);
        }
        self.check_room_in(&mut tx, &k.agent_id, &k.resource_slots, agent_total)
            .await?;
        insert_in(&mut *tx, k, Start::Placed, now())
            .await
            .map_err(StoreError::from)?;
        tx.commit().await.map_err(StoreError::from)?;
        self.usage.add(
            &k.id,
            Placed {
                agent_id: k.agent_id.clone(),
                access_key: k.access_key.clone(),
                slots: k.resource_slots.clone(),
            },
        );
        self.events.publish(scheduled_event(
            &k.id,
            (&k.session_id, &k.agent_id, &k.access_key),
            "placed",
        ));
        Ok(())
    }

    /// Records a placed cluster session's kernels as `SCHEDULED`, every one or none, in one
    /// transaction: one unit of the key's concurrency (a session's, held by its main kernel),
    /// each agent's room checked for all the kernels placed on it together. `totals` holds
    /// each chosen agent's slots in total. With `admitted` (the main kernel's row queued
    /// `PENDING`), the main row moves to `SCHEDULED` instead of being inserted; `None` when it
    /// was no longer `PENDING` (cancelled meanwhile), nothing changed.
    ///
    /// Errors: as [`Store::reserve_kernel`]'s, for whichever kernel failed first (nothing
    /// reserved).
    pub async fn reserve_gang(
        &self,
        kernels: &[NewKernel],
        totals: &HashMap<String, ResourceSlots>,
        admitted: bool,
    ) -> Result<Option<()>, ReserveError> {
        let Some(main) = kernels.first() else {
            return Ok(Some(()));
        };
        let mut tx = self.pool.begin().await.map_err(StoreError::from)?;
        if !take_concurrency_in(&mut tx, &main.access_key).await? {
            drop(tx);
            return Err(self.concurrency_refused(&main.access_key).await);
        }
        // Each agent once, in id order (PostgreSQL's advisory locks: never crosswise), with
        // the sum of the slots of the kernels the gang places there.
        let mut by_agent: std::collections::BTreeMap<&str, ResourceSlots> = Default::default();
        for k in kernels {
            let sum = by_agent.entry(k.agent_id.as_str()).or_default();
            *sum = sum
                .checked_add(&k.resource_slots)
                .map_err(|_| ReserveError::NoRoom(k.agent_id.clone()))?;
        }
        for (agent, slots) in &by_agent {
            let total = totals.get(*agent).cloned().unwrap_or_default();
            self.check_room_in(&mut tx, agent, slots, &total).await?;
        }
        let at = now();
        for (i, k) in kernels.iter().enumerate() {
            if i == 0 && admitted {
                let moved = sqlx::query(
                    "UPDATE kernels SET status = 'SCHEDULED', agent_id = $2, admitted_at = $3, \
                     status_changed_at = $3, pending_reason = NULL WHERE id = $1 AND status = 'PENDING'",
                )
                .bind(&k.id)
                .bind(&k.agent_id)
                .bind(at)
                .execute(&mut *tx)
                .await
                .map_err(StoreError::from)?
                .rows_affected();
                if moved == 0 {
                    return Ok(None);
                }
            } else {
                insert_in(&mut *tx, k, Start::Placed, at)
                    .await
                    .map_err(StoreError::from)?;
            }
        }
        tx.commit().await.map_err(StoreError::from)?;
        if admitted {
            self.depth.add(main.priority, -1);
        }
        for k in kernels {
            self.usage.add(
                &k.id,
                Placed {
                    agent_id: k.agent_id.clone(),
                    access_key: k.access_key.clone(),
                    slots: k.resource_slots.clone(),
                },
            );
            self.events.publish(scheduled_event(
                &k.id,
                (&k.session_id, &k.agent_id, &k.access_key),
                if admitted { "admitted" } else { "placed" },
            ));
        }
        Ok(Some(()))
    }

    /// Every kernel of a session, `main1` first then by role index (any status).
    ///
    /// Errors: the database.
    pub async fn session_kernels(&self, session_id: &str) -> Result<Vec<KernelRow>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM kernels WHERE session_id = $1 AND superseded_by IS NULL \
             ORDER BY CASE WHEN cluster_role = 'main' THEN 0 ELSE 1 END, cluster_idx, created_at"
        ))
        .bind(session_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Up to `limit` cluster sessions the reconcile sweep must act on, each as its kernels
    /// (`main1` first): those with a kernel ended while another is live and not already
    /// `TERMINATING` (the session ends whole), and those whose kernels all ended that still
    /// have a network (it is removed) or whose main row still holds its request (its restart
    /// policy is yet to be applied: requeued, or the request cleared).
    ///
    /// Errors: the database.
    pub async fn unsettled_clusters(&self, limit: u32) -> Result<Vec<Vec<KernelRow>>, StoreError> {
        let ids: Vec<(String,)> = sqlx::query_as(
            "SELECT session_id FROM kernels WHERE cluster_size > 1 AND superseded_by IS NULL AND session_id IN \
             (SELECT session_id FROM kernels WHERE cluster_size > 1 AND superseded_by IS NULL \
              AND (status NOT IN ('TERMINATED', 'CANCELLED') OR network IS NOT NULL \
                   OR (cluster_role = 'main' AND request IS NOT NULL))) \
             GROUP BY session_id HAVING \
             (SUM(CASE WHEN status IN ('TERMINATED', 'CANCELLED') THEN 1 ELSE 0 END) > 0 \
              AND SUM(CASE WHEN status NOT IN ('TERMINATED', 'CANCELLED', 'TERMINATING', 'PENDING', 'PREEMPTED') THEN 1 ELSE 0 END) > 0) \
             OR (SUM(CASE WHEN status IN ('TERMINATED', 'CANCELLED') THEN 0 ELSE 1 END) = 0 \
              AND (MAX(network) IS NOT NULL \
                   OR SUM(CASE WHEN cluster_role = 'main' AND request IS NOT NULL THEN 1 ELSE 0 END) > 0)) \
             LIMIT $1",
        )
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        let mut out = Vec::with_capacity(ids.len());
        for (id,) in ids {
            out.push(self.session_kernels(&id).await?);
        }
        Ok(out)
    }

    /// The kernels of each of `session_ids` that is a cluster session, `main1` first (the
    /// session list's `kernels`; one query).
    ///
    /// Errors: the database.
    pub async fn cluster_kernels(
        &self,
        session_ids: &[&str],
    ) -> Result<HashMap<String, Vec<KernelRow>>, StoreError> {
        let mut out: HashMap<String, Vec<KernelRow>> = HashMap::new();
        for chunk in session_ids.chunks(500) {
            let list = (1..=chunk.len())
                .map(|i| format!("${i}"))
                .collect::<Vec<_>>()
                .join(", ");
            let sql = format!(
                "SELECT {COLUMNS} FROM kernels WHERE session_id IN ({list}) AND superseded_by IS NULL \
                 ORDER BY session_id, CASE WHEN cluster_role = 'main' THEN 0 ELSE 1 END, cluster_idx, created_at"
            );
            let mut q = sqlx::query_as::<_, KernelRow>(&sql);
            for id in chunk {
                q = q.bind(*id);
            }
            for k in q.fetch_all(&self.pool).await? {
                out.entry(k.session_id.clone()).or_default().push(k);
            }
        }
        Ok(out)
    }

    /// Records the names of the service ports a kernel's agent published (its
    /// `create_kernels` answer).
    ///
    /// Errors: the database.
    pub async fn set_service_ports(
        &self,
        kernel_id: &str,
        names: &[String],
    ) -> Result<(), StoreError> {
        // None is what a new row holds: no write (a create's latency is its statements on
        // SQLite; `just bench scheduler` saw this one).
        if names.is_empty() {
            return Ok(());
        }
        sqlx::query("UPDATE kernels SET service_ports = $2 WHERE id = $1")
            .bind(kernel_id)
            .bind(json_text(&names, "[]"))
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Records the network a cluster session's kernels join (on its main kernel's row), so
    /// that it is removed after the last kernel ends, by whichever replica sees that.
    ///
    /// Errors: the database.
    pub async fn set_session_network(
        &self,
        session_id: &str,
        network: Option<&str>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE kernels SET network = $2 WHERE session_id = $1 AND cluster_role = 'main' AND superseded_by IS NULL",
        )
        .bind(session_id)
        .bind(network)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Why [`take_concurrency_in`] took nothing for `access_key`: its limit, or a key that is
    /// unknown, disabled or deleted (read after the transaction was dropped).
    pub(super) async fn concurrency_refused(&self, access_key: &str) -> ReserveError {
        match self.access_key(access_key).await {
            Ok(Some(key)) if key.enabled => {
                ReserveError::ConcurrencyLimit(access_key.to_owned(), key.concurrency_limit)
            }
            Ok(_) => ReserveError::UnknownAccessKey(access_key.to_owned()),
            Err(e) => ReserveError::Store(e),
        }
    }

    /// Inside a reservation (or an admission): serializes every reservation on `k.agent_id` across replicas
    /// (PostgreSQL: a transaction-scoped advisory lock on the agent id, which needs no agent row
    /// yet; SQLite has one writer), then checks the agent is not `LOST`/`PENDING` and that its
    /// live kernels plus this one fit `agent_total`.
    pub(super) async fn check_room_in(
        &self,
        tx: &mut Transaction<'_, Any>,
        agent_id: &str,
        slots: &ResourceSlots,
        agent_total: &ResourceSlots,
    ) -> Result<(), ReserveError> {
        if self.backend == super::Backend::Postgres {
            lock_agent_in(tx, agent_id)
                .await
                .map_err(StoreError::from)?;
        }
        let status: Option<AgentStatus> =
            sqlx::query_scalar("SELECT status FROM agents WHERE id = $1")
                .bind(agent_id)
                .fetch_optional(&mut **tx)
                .await
                .map_err(StoreError::from)?;
        if let Some(st) = status.filter(|st| refuses_placement(*st)) {
            return Err(ReserveError::AgentNotAlive(agent_id.to_owned(), st));
        }
        let rows = sqlx::query(&format!(
            "SELECT resource_slots, cpu_millis, mem_bytes, cuda_devices FROM kernels \
             WHERE agent_id = $1 AND {LIVE}",
        ))
        .bind(agent_id)
        .fetch_all(&mut **tx)
        .await
        .map_err(StoreError::from)?;
        let mut used = slots.clone();
        for r in &rows {
            let slots = slots_column(r, "resource_slots").map_err(StoreError::from)?;
            used = used
                .checked_add(&slots)
                .map_err(|_| ReserveError::NoRoom(agent_id.to_owned()))?;
        }
        if used.fits_in(agent_total).is_err() {
            return Err(ReserveError::NoRoom(agent_id.to_owned()));
        }
        Ok(())
    }

    /// Undoes a reservation the agent refused (nothing was created there): the row goes and the
    /// concurrency comes back, in one transaction. Returns whether it was still live. A row
    /// that already ended (the reconcile sweep resolved it past its deadline while the call was
    /// out) stays, with the reason it was given: its end was on the event stream.
    pub async fn discard_reservation(&self, kernel_id: &str) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let ended = terminate_in(&mut tx, kernel_id, "failed-to-create", None).await?;
        if ended.is_some() {
            sqlx::query("DELETE FROM kernels WHERE id = $1")
                .bind(kernel_id)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        // Its `SCHEDULED` was on the stream: a watcher learns it ended too.
        Ok(self.publish(ended))
    }

    /// Takes a kernel out of the live set (releasing its concurrency). Returns whether it was live.
    pub async fn terminate_kernel(
        &self,
        kernel_id: &str,
        reason: &str,
        exit_code: Option<i64>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        let ended = terminate_in(&mut tx, kernel_id, reason, exit_code).await?;
        tx.commit().await?;
        Ok(self.publish(ended))
    }

    /// As [`Store::terminate_kernel`], recording first a batch session's `result` as its
    /// agent answered a graceful end (the workload's exit within its grace), in the same
    /// transaction; a result already recorded (the agent's `session_success` /
    /// `session_failure` heard first) stays.
    ///
    /// Errors: the database.
    pub async fn terminate_with_result(
        &self,
        kernel_id: &str,
        reason: &str,
        exit_code: Option<i64>,
        result: Option<SessionResult>,
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await?;
        if let Some(result) = result {
            set_result_in(&mut tx, kernel_id, result).await?;
        }
        let ended = terminate_in(&mut tx, kernel_id, reason, exit_code).await?;
        tx.commit().await?;
        Ok(self.publish(ended))
    }

    /// Records that a placed kernel is being destroyed for `reason`: status `TERMINATING` (from
    /// `SCHEDULED` … `RESTARTING`; a queued, final or already terminating kernel is left as
    /// it is, but that a `TERMINATING` one takes the earlier deadline of its own and this
    /// one), `status_reason` = `reason`, and its `session_status` event. From then on the
    /// `[scheduler] terminating-timeout` deadline applies, counted from its `terminate_deadline`
    /// (now + `grace`, when its agent kills what still runs): a destroy whose answer is lost is
    /// resolved by the reconcile sweep. Returns whether it changed.
    ///
    /// Errors: the database.
    pub async fn terminating_kernel(
        &self,
        kernel_id: &str,
        reason: &str,
        grace: std::time::Duration,
    ) -> Result<bool, StoreError> {
        let at = now();
        let deadline = at + grace.as_secs_f64();
        let owner: Option<(String, String, String)> = sqlx::query_as(
            "UPDATE kernels SET status = 'TERMINATING', status_reason = $2, status_changed_at = $3, \
             terminate_deadline = $4 \
             WHERE id = $1 AND status IN ('SCHEDULED', 'PREPARING', 'PULLING', 'CREATING', 'RUNNING', 'RESTARTING') \
             RETURNING session_id, agent_id, access_key",
        )
        .bind(kernel_id)
        .bind(reason)
        .bind(at)
        .bind(deadline)
        .fetch_optional(&self.pool)
        .await?;
        // Already ending: a shorter grace (`rm --now` during one) brings its deadline forward.
        let owner = match owner {
            Some(o) => Some(o),
            None => {
                sqlx::query_as(
                    "UPDATE kernels SET terminate_deadline = $2 WHERE id = $1 AND status = 'TERMINATING' \
                     AND (terminate_deadline IS NULL OR terminate_deadline > $2) \
                     RETURNING session_id, agent_id, access_key",
                )
                .bind(kernel_id)
                .bind(deadline)
                .fetch_optional(&self.pool)
                .await?
            }
        };
        Ok(self.publish(owner.map(|owner| Event {
            status: Some(KernelStatus::Terminating.as_str().into()),
            reason: Some(reason.to_owned()),
            terminate_deadline: Some(deadline),
            ..session_event(EventType::SessionStatus, kernel_id, owner)
        })))
    }

    /// Moves a kernel's status forward to `status` (never back: see [`advances_from`]) and
    /// publishes each step. Every creation passes `PREPARING` and, before `RUNNING`,
    /// `CREATING`: a later step heard first (the agent's outbox compacts a status its next one
    /// supersedes, and a create answer travels apart from the event stream) records those
    /// steps first, in order, so a session's timeline never skips them; a step's own event
    /// arriving afterwards is a no-op. Returns whether `status` itself was recorded.
    pub async fn advance_kernel(
        &self,
        kernel_id: &str,
        status: KernelStatus,
    ) -> Result<bool, StoreError> {
        let skippable: &[KernelStatus] = match status {
            KernelStatus::Pulling | KernelStatus::Creating => &[KernelStatus::Preparing],
            KernelStatus::Running => &[KernelStatus::Preparing, KernelStatus::Creating],
            _ => &[],
        };
        for step in skippable {
            // One statement each: no transaction around them (on SQLite each statement is a
            // round trip to its worker thread).
            let changed = advance_in(&self.pool, kernel_id, *step).await?;
            self.publish(changed);
        }
        let changed = advance_in(&self.pool, kernel_id, status).await?;
        Ok(self.publish(changed))
    }

    /// Records the image pull progress of a live kernel (`PULLING`), and that its pull is
    /// followed now (`pull_seen_at`, see [`Store::touch_pull`]). Returns whether the row
    /// changed.
    pub async fn set_pull_progress(
        &self,
        kernel_id: &str,
        progress: &PullProgress,
    ) -> Result<bool, StoreError> {
        let json = serde_json::to_string(progress).unwrap_or_default();
        let owner: Option<(String, String, String)> = sqlx::query_as(&format!(
            "UPDATE kernels SET pull_progress = $2, pull_seen_at = $3 WHERE id = $1 AND {LIVE} \
             RETURNING session_id, agent_id, access_key",
        ))
        .bind(kernel_id)
        .bind(json)
        .bind(now())
        .fetch_optional(&self.pool)
        .await?;
        Ok(self.publish(owner.map(|owner| Event {
            pull_progress: Some(*progress),
            ..session_event(EventType::PullProgress, kernel_id, owner)
        })))
    }

    /// Up to `limit` distinct session ids starting with `prefix`, of `access_key`'s sessions when
    /// given, any status. `prefix` must be hex digits and dashes (a UUID's alphabet: nothing
    /// `LIKE` would read as a pattern); anything else matches nothing.
    pub async fn session_ids_with_prefix(
        &self,
        prefix: &str,
        access_key: Option<&str>,
        limit: i64,
    ) -> Result<Vec<String>, StoreError> {
        if prefix.is_empty() || !prefix.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
            return Ok(Vec::new());
        }
        let rows: Vec<(String,)> = sqlx::query_as(
            "SELECT DISTINCT session_id FROM kernels WHERE session_id LIKE $1 AND ($2 = '' OR access_key = $2) LIMIT $3",
        )
        .bind(format!("{}%", prefix.to_ascii_lowercase()))
        .bind(access_key.unwrap_or(""))
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(id,)| id).collect())
    }

    /// One kernel by its kernel id or its session id.
    pub async fn kernel(&self, id: &str) -> Result<Option<KernelRow>, StoreError> {
        Ok(sqlx::query_as(&format!("SELECT {COLUMNS} FROM kernels WHERE id = $1 OR session_id = $1 ORDER BY CASE WHEN id = $1 THEN 0 WHEN superseded_by IS NOT NULL THEN 3 WHEN cluster_role = 'main' THEN 1 ELSE 2 END, created_at DESC LIMIT 1"))
            .bind(id)
            .fetch_optional(&self.pool)
            .await?)
    }

    /// Sessions as their main kernels' rows, newest first: live only unless `all`; only
    /// `access_key`'s when given (a cluster session's other kernels: [`Store::cluster_kernels`]).
    pub async fn kernels(
        &self,
        access_key: Option<&str>,
        all: bool,
    ) -> Result<Vec<KernelRow>, StoreError> {
        let sql = format!(
            "SELECT {COLUMNS} FROM kernels WHERE ($1 OR {LIVE}) AND ($2 = '' OR access_key = $2) AND cluster_role = 'main' AND superseded_by IS NULL ORDER BY created_at DESC"
        );
        // `$1` as an integer comparison: Any binds booleans differently per backend.
        let sql = sql.replace("($1 OR", "($1 = 1 OR");
        Ok(sqlx::query_as(&sql)
            .bind(all as i64)
            .bind(access_key.unwrap_or(""))
            .fetch_all(&self.pool)
            .await?)
    }

    /// Live kernels by status: `(status, count)`, each live status once at most.
    pub async fn live_kernel_counts(&self) -> Result<Vec<(KernelStatus, i64)>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "SELECT status, COUNT(*) FROM kernels WHERE {LIVE} GROUP BY status",
        ))
        .fetch_all(&self.pool)
        .await?)
    }

    /// Live kernels on one agent.
    pub async fn live_kernels_of(&self, agent_id: &str) -> Result<Vec<KernelRow>, StoreError> {
        Ok(sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM kernels WHERE agent_id = $1 AND {LIVE}"
        ))
        .bind(agent_id)
        .fetch_all(&self.pool)
        .await?)
    }

    /// Every placed live kernel (not `PENDING`), by agent: one query for the whole fleet (the grace's reconciliation).
    pub async fn live_kernels_by_agent(
        &self,
    ) -> Result<HashMap<String, Vec<KernelRow>>, StoreError> {
        let rows: Vec<KernelRow> = sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM kernels WHERE {LIVE} AND status <> 'PENDING'"
        ))
        .fetch_all(&self.pool)
        .await?;
        let mut out: HashMap<String, Vec<KernelRow>> = HashMap::new();
        for k in rows {
            out.entry(k.agent_id.clone()).or_default().push(k);
        }
        Ok(out)
    }

    /// Slots the manager has placed on each agent: the exact sum of its live kernels'
    /// `resource_slots`, from the usage ledger (`usage.rs`; reloaded first when stale).
    pub async fn usage_by_agent(&self) -> Result<HashMap<String, Usage>, StoreError> {
        self.with_usage(HashMap::clone).await
    }

    /// Runs `f` over [`Store::usage_by_agent`]'s map without copying it (placement reads it
    /// once per create; at 10,000 agents a copy is not free).
    pub async fn with_usage<R>(
        &self,
        f: impl FnOnce(&HashMap<String, Usage>) -> R,
    ) -> Result<R, StoreError> {
        self.fresh_usage().await?;
        Ok(self.usage.with_by_agent(f))
    }

    /// Makes the next usage read reload the ledger from the database: called when a
    /// reservation or admission lost a race for an agent's room (another replica's placement
    /// the ledger has not seen yet), so that the next try does not choose the same agent.
    pub fn expire_usage(&self) {
        self.usage.expire();
    }

    /// Each access key's placed live slots, from the usage ledger.
    pub(super) async fn slots_by_key(&self) -> Result<HashMap<String, ResourceSlots>, StoreError> {
        self.fresh_usage().await?;
        Ok(self.usage.by_key())
    }

    /// Reloads the usage ledger from every placed live kernel when it is older than its
    /// refresh period (waiting for a reload another caller runs).
    async fn fresh_usage(&self) -> Result<(), StoreError> {
        let Some(reload) = self.usage.begin_reload().await else {
            return Ok(());
        };
        let rows = sqlx::query(&format!(
            "SELECT id, agent_id, access_key, resource_slots, cpu_millis, mem_bytes, cuda_devices \
             FROM kernels WHERE {LIVE} AND status <> 'PENDING'",
        ))
        .fetch_all(&self.reads)
        .await?;
        let placed = rows
            .iter()
            .map(|r| {
                Ok((
                    r.try_get::<String, _>("id")?,
                    Placed {
                        agent_id: r.try_get("agent_id")?,
                        access_key: r.try_get("access_key")?,
                        slots: slots_column(r, "resource_slots")?,
                    },
                ))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()?;
        reload.finish(placed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{advances_from, NewKernel};
    use crate::model::session::{KernelStatus, RestartPolicy, SessionType};
    use crate::slots::{Amount, ResourceSlots};

    /// A later step heard first (a create answer that outruns the agent's `kernel_preparing`
    /// and `kernel_creating`, a `kernel_creating` whose `kernel_preparing` the agent's outbox
    /// compacted away) still gives the session every step, in order, and those events,
    /// arriving after it, change nothing (a session's timeline once lacked `PREPARING` this
    /// way, in readme_tour).
    #[actix_rt::test]
    async fn a_later_step_heard_first_records_the_steps_before_it() {
        let (_dir, store) = super::super::test_store_with_key().await;
        let roomy: ResourceSlots = [("cpu".to_owned(), Amount::from_units(100))]
            .into_iter()
            .collect();
        for id in ["early", "late", "compacted"] {
            store
                .reserve_kernel(
                    &NewKernel {
                        cluster_mode: crate::model::cluster::ClusterMode::SingleNode,
                        cluster_size: 1,
                        cluster: crate::model::cluster::ClusterSlot::main(),
                        id: id.into(),
                        session_id: id.into(),
                        agent_id: "a".into(),
                        access_key: "AK".into(),
                        image: "img".into(),
                        resource_slots: ResourceSlots::default(),
                        session_type: SessionType::Interactive,
                        command: None,
                        batch_timeout: None,
                        mounts: Vec::new(),
                        restart_policy: RestartPolicy::default(),
                        priority: 10,
                        request: None,
                        stop_signal: None,
                        grace_period: None,
                        preemptible: false,
                    },
                    &roomy,
                )
                .await
                .unwrap();
        }
        let steps = |id: &str| -> Vec<String> {
            let filter = crate::manager::event_hub::Filter {
                owner: None,
                session_id: Some(id.to_owned()),
                agent_id: None,
                types: Vec::new(),
            };
            store
                .events()
                .recent(&filter, None)
                .iter()
                .filter_map(|e| e.status.clone())
                .collect()
        };
        // The answer first: every step is recorded; the late events are no-ops.
        assert!(store
            .advance_kernel("late", KernelStatus::Running)
            .await
            .unwrap());
        for step in [KernelStatus::Preparing, KernelStatus::Creating] {
            assert!(!store.advance_kernel("late", step).await.unwrap());
        }
        assert_eq!(
            steps("late"),
            ["SCHEDULED", "PREPARING", "CREATING", "RUNNING"]
        );
        // The events first (with a pull): only `RUNNING` is left to the answer.
        for step in [
            KernelStatus::Preparing,
            KernelStatus::Pulling,
            KernelStatus::Creating,
        ] {
            assert!(store.advance_kernel("early", step).await.unwrap());
        }
        assert!(store
            .advance_kernel("early", KernelStatus::Running)
            .await
            .unwrap());
        assert_eq!(
            steps("early"),
            ["SCHEDULED", "PREPARING", "PULLING", "CREATING", "RUNNING"]
        );
        // `kernel_creating` first (its `kernel_preparing` compacted), then the answer.
        assert!(store
            .advance_kernel("compacted", KernelStatus::Creating)
            .await
            .unwrap());
        assert!(store
            .advance_kernel("compacted", KernelStatus::Running)
            .await
            .unwrap());
        assert_eq!(
            steps("compacted"),
            ["SCHEDULED", "PREPARING", "CREATING", "RUNNING"]
        );
        assert_eq!(
            store.kernel("late").await.unwrap().unwrap().status,
            KernelStatus::Running
        );
    }

    /// Rows written before `0005_resource_slots` (no JSON slots) read from the old columns, and
    /// count in the usage with new rows' slots of any name, summed exactly.
    #[actix_rt::test]
    async fn old_rows_read_from_the_old_columns() {
        let (_dir, store) = super::super::test_store_with_key().await;
        sqlx::query(
            "INSERT INTO agents (id, status, cpu_millis, mem_bytes, cuda_devices, first_contact, status_changed) \
             VALUES ('a', 'ALIVE', 1500, 4096, 2, 0, 0)",
        )
        .execute(&store.pool)
        .await
        .unwrap();
        sqlx::query(
            "INSERT INTO kernels (id, session_id, agent_id, access_key, image, status, cpu_millis, mem_bytes, cuda_devices, created_at) \
             VALUES ('old', 's', 'a', 'AK', 'img', 'RUNNING', 250, 1024, 1, 0)",
        )
        .execute(&store.pool)
        .await
        .unwrap();
        let agent = store.agents().await.unwrap().remove(0);
        assert_eq!(
            agent.slots_total.to_string(),
            "cpu=1.5 cuda.device=2 mem=4096"
        );
        assert_eq!(
            agent.slot_types,
            crate::manager::registry::heartbeat::slot_types(None)
        );
        let old = store.kernel("old").await.unwrap().unwrap();
        assert_eq!(
            old.resource_slots.to_string(),
            "cpu=0.25 cuda.device=1 mem=1024"
        );
        let slots: ResourceSlots = [
            ("cpu".to_owned(), Amount::from_milli(100)),
            ("mem".to_owned(), Amount::from_units(2048)),
            ("cuda.shares".to_owned(), Amount::from_milli(300)),
        ]
        .into_iter()
        .collect();
        let roomy: ResourceSlots = [
            ("cpu".to_owned(), Amount::from_units(100)),
            ("mem".to_owned(), Amount::from_units(1 << 40)),
            ("cuda.shares".to_owned(), Amount::from_units(10)),
            ("cuda.device".to_owned(), Amount::from_units(10)),
        ]
        .into_iter()
        .collect();
        for id in ["n1", "n2"] {
            store
                .reserve_kernel(
                    &NewKernel {
                        cluster_mode: crate::model::cluster::ClusterMode::SingleNode,
                        cluster_size: 1,
                        cluster: crate::model::cluster::ClusterSlot::main(),
                        id: id.into(),
                        session_id: id.into(),
                        agent_id: "a".into(),
                        access_key: "AK".into(),
                        image: "img".into(),
                        resource_slots: slots.clone(),
                        session_type: SessionType::Interactive,
                        command: None,
                        batch_timeout: None,
                        mounts: Vec::new(),
                        restart_policy: RestartPolicy::default(),
                        priority: 10,
                        request: None,
                        stop_signal: None,
                        grace_period: None,
                        preemptible: false,
                    },
                    &roomy,
                )
                .await
                .unwrap();
        }
        assert_eq!(
            store.kernel("n1").await.unwrap().unwrap().resource_slots,
            slots
        );
        let usage = store.usage_by_agent().await.unwrap().remove("a").unwrap();
        assert_eq!(usage.kernels, 3);
        assert_eq!(
            usage.slots.to_string(),
            "cpu=0.45 cuda.device=1 cuda.shares=0.6 mem=5120"
        );
        store
            .terminate_kernel("old", "user-requested", None)
            .await
            .unwrap();
        let usage = store.usage_by_agent().await.unwrap().remove("a").unwrap();
        assert_eq!(usage.slots.to_string(), "cpu=0.2 cuda.shares=0.6 mem=4096");
    }

    #[test]
    fn status_order_moves_forward_only() {
        use KernelStatus::*;
        let rank = |s: &str| KernelStatus::parse(s).map(KernelStatus::rank);
        assert!(rank("PENDING") < rank("SCHEDULED"));
        assert!(rank("SCHEDULED") < rank("PREPARING"));
        assert_eq!(rank("CANCELLED"), rank("TERMINATED"));
        assert!(rank("CREATING") < rank("RUNNING"));
        assert_eq!(rank("RESTARTING"), rank("RUNNING"));
        assert!(rank("RUNNING") < rank("TERMINATING"));
        assert!(rank("TERMINATING") < rank("TERMINATED"));
        assert_eq!(rank("BOGUS"), None);
        // Each status's predecessors: never from `PENDING`, never to `TERMINATED`.
        assert_eq!(advances_from(Pending), []);
        assert_eq!(advances_from(Scheduled), []);
        assert_eq!(advances_from(Preparing), [Scheduled]);
        assert_eq!(advances_from(Pulling), [Scheduled, Preparing]);
        assert_eq!(advances_from(Creating), [Scheduled, Preparing, Pulling]);
        assert_eq!(
            advances_from(Running),
            [Scheduled, Preparing, Pulling, Creating, Restarting]
        );
        assert_eq!(
            advances_from(Restarting),
            [Scheduled, Preparing, Pulling, Creating]
        );
        assert_eq!(
            advances_from(Terminating),
            [Scheduled, Preparing, Pulling, Creating, Running, Restarting]
        );
        assert_eq!(advances_from(Terminated), []);
    }
}

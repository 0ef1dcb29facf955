//! The durable event outbox: every event is a SQLite row (`migrations/agent/0002_outbox.sql`)
//! before the event sender may send it, and stays until the manager acks its id (`docs/design.md`, the event path:
//! never drop a message; ack after durable enqueue).
//!
//! [`OutboxWriter`] takes events off the agent's [`EventBus`](super::events::EventBus), drops
//! a kernel status that repeats the kernel's last one (unless deliberately sent again,
//! [`EventBus::emit_again`](super::events::EventBus::emit_again)), and appends the rest in
//! one transaction per batch (group commit). The outbox is bounded: when full it first drops
//! superseded status events (a kernel's older states, when a later one of the same kernel is
//! pending: the manager's end state is unchanged), then the newest events, with a warning and
//! `kernelvisor_outbox_dropped_events_total`.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use actors::{ChildSpec, Shutdown, StopSignal};
use sqlx::{Row, SqlitePool};
use tokio::sync::{mpsc, Notify};

use super::events::{AgentEvent, Queued};
use super::metrics::AgentMetrics;
use super::store::{now, Store};

/// How every outbox transaction begins: `IMMEDIATE` takes the write lock first, so a second
/// writer waits in the busy handler (`busy_timeout`). A deferred transaction that reads, then
/// writes, cannot wait: in WAL mode its upgrade fails at once with `SQLITE_BUSY` ("database is
/// locked") when another connection wrote since its read began, which is what the writer hit
/// while several kernels were created at once.
const BEGIN_WRITE: &str = "BEGIN IMMEDIATE";

/// An event in the outbox.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingEvent {
    /// Send order (SQLite rowid; grows across restarts).
    pub seq: i64,
    /// The event's id (UUID v4), the same on every resend.
    pub id: String,
    /// When it was enqueued, Unix seconds.
    pub created_at: f64,
    /// The event.
    pub event: AgentEvent,
}

/// What one append did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AppendReport {
    /// Events written.
    pub appended: u64,
    /// Older pending states of kernels deleted to make room.
    pub dropped_superseded: u64,
    /// New events not written because the outbox was full.
    pub dropped_newest: u64,
}

/// One outbox table, holding at most `capacity` events: `outbox` (0002, towards our manager)
/// or `bus_outbox` (0003, towards Backend.AI's bus).
#[derive(Clone, Debug)]
pub struct Outbox {
    pool: SqlitePool,
    capacity: u64,
    table: &'static str,
}

impl Outbox {
    /// The manager's outbox in the agent's database, bounded to `capacity` events (`[manager]
    /// outbox-max-events`).
    pub fn new(store: &Store, capacity: u64) -> Outbox {
        Outbox {
            pool: store.pool().clone(),
            capacity: capacity.max(1),
            table: "outbox",
        }
    }

    /// The outbox towards Backend.AI's bus (`bus_outbox`), bounded to `capacity` events
    /// (`[redis] outbox-max-events`).
    pub fn bus(store: &Store, capacity: u64) -> Outbox {
        Outbox {
            table: "bus_outbox",
            ..Outbox::new(store, capacity)
        }
    }

    /// Most events it keeps.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Its table's name.
    pub fn table(&self) -> &'static str {
        self.table
    }

    /// Appends `events` in order, in one transaction, each with a fresh id.
    ///
    /// Errors: the database fails (nothing of this batch is written).
    pub async fn append(&self, events: &[AgentEvent]) -> anyhow::Result<AppendReport> {
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        let report = self.append_in(&mut tx, events.iter()).await?;
        tx.commit().await?;
        Ok(report)
    }

    /// Appends `events` in order inside the caller's transaction `tx` (which must have begun
    /// with `BEGIN IMMEDIATE`), each with a fresh id.
    ///
    /// Errors: the database fails (the caller rolls back).
    pub async fn append_in<'e>(
        &self,
        tx: &mut sqlx::SqliteConnection,
        events: impl Iterator<Item = &'e AgentEvent>,
    ) -> anyhow::Result<AppendReport> {
        let table = self.table;
        let mut report = AppendReport::default();
        let depth: i64 = sqlx::query(&format!("SELECT COUNT(*) FROM {table}"))
            .fetch_one(&mut *tx)
            .await?
            .get(0);
        let mut free = self.capacity.saturating_sub(depth as u64);
        let t = now();
        for event in events {
            if free == 0 {
                // Make room by dropping the oldest superseded state, if any (also one this
                // very batch superseded).
                let r = sqlx::query(&format!(
                    "DELETE FROM {table} WHERE seq IN (SELECT o.seq FROM {table} o WHERE o.kernel_id IS NOT NULL \
                     AND o.name IN ('kernel_preparing', 'kernel_pulling', 'kernel_creating', 'kernel_started') AND EXISTS (SELECT 1 FROM {table} n WHERE n.kernel_id = o.kernel_id AND n.seq > o.seq) \
                     ORDER BY o.seq LIMIT 1)",
                ))
                    .execute(&mut *tx)
                    .await?;
                report.dropped_superseded += r.rows_affected();
                free += r.rows_affected();
            }
            if free == 0 {
                report.dropped_newest += 1;
                continue;
            }
            sqlx::query(&format!("INSERT INTO {table} (id, name, kernel_id, event, created_at) VALUES (?, ?, ?, ?, ?)"))
                .bind(uuid::Uuid::new_v4().to_string())
                .bind(event.name())
                .bind(event.kernel_id())
                .bind(serde_json::to_string(event)?)
                .bind(t)
                .execute(&mut *tx)
                .await?;
            free -= 1;
            report.appended += 1;
        }
        Ok(report)
    }

    /// Up to `limit` pending events, oldest first.
    ///
    /// Errors: the database fails, or a row cannot be read (written by a newer agent).
    pub async fn pending(&self, limit: u32) -> anyhow::Result<Vec<PendingEvent>> {
        let rows = sqlx::query(&format!(
            "SELECT seq, id, event, created_at FROM {} ORDER BY seq LIMIT ?",
            self.table
        ))
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.into_iter()
            .map(|r| {
                let id: String = r.get("id");
                let event = serde_json::from_str(r.get("event"))
                    .map_err(|e| anyhow::anyhow!("outbox event {id}: {e}"))?;
                Ok(PendingEvent {
                    seq: r.get("seq"),
                    id,
                    created_at: r.get("created_at"),
                    event,
                })
            })
            .collect()
    }

    /// Deletes the acked events; returns how many were pending. Unknown ids are ignored (an
    /// ack of an earlier resend).
    pub async fn ack(&self, ids: &[String]) -> anyhow::Result<u64> {
        let mut tx = self.pool.begin_with(BEGIN_WRITE).await?;
        let mut n = 0;
        for id in ids {
            n += sqlx::query(&format!("DELETE FROM {} WHERE id = ?", self.table))
                .bind(id)
                .execute(&mut *tx)
                .await?
                .rows_affected();
        }
        tx.commit().await?;
        Ok(n)
    }

    /// How many events are pending.
    pub async fn depth(&self) -> anyhow::Result<i64> {
        Ok(sqlx::query(&format!("SELECT COUNT(*) FROM {}", self.table))
            .fetch_one(&self.pool)
            .await?
            .get(0))
    }
}

/// Remembers each kernel's last enqueued state, to drop repeats; bounded to the most recent
/// 16384 kernels so that a long-lived agent does not grow. A `kernel_started` naming another
/// container than the last (a `restart_kernel` recreated it) is a new state.
#[derive(Default)]
struct LastStates {
    state: HashMap<String, (&'static str, Option<String>)>,
    order: VecDeque<String>,
}

impl LastStates {
    const MAX: usize = 16384;

    /// `false` when `event` repeats its kernel's last state.
    fn is_new(&mut self, event: &AgentEvent) -> bool {
        let Some(kernel_id) = event.kernel_id() else {
            return true;
        };
        if !event.is_kernel_status() {
            return true;
        }
        let container = match event {
            AgentEvent::KernelStarted {
                creation_info: Some(info),
                ..
            } => Some(info.container_id.clone()),
            _ => None,
        };
        let state = (event.name(), container);
        match self.state.insert(kernel_id.to_owned(), state.clone()) {
            Some(previous) => previous != state,
            None => {
                self.order.push_back(kernel_id.to_owned());
                if self.order.len() > Self::MAX {
                    if let Some(old) = self.order.pop_front() {
                        self.state.remove(&old);
                    }
                }
                true
            }
        }
    }

    /// Whether `q` is written: new, or sent again on purpose (its state recorded either way).
    fn keeps(&mut self, q: &Queued) -> bool {
        self.is_new(&q.event) || q.again
    }
}

/// Which events a destination takes, and how its depth is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DestinationKind {
    /// Our manager's intake (`[manager]`): every event but the bus-only ones
    /// ([`AgentEvent::is_bus_only`]); depth in `kernelvisor_outbox_depth`.
    Manager,
    /// Backend.AI's bus (`[redis]`): the events upstream has a class for
    /// ([`crate::agent::bus::encode::on_bus`]); depth in `kernelvisor_bus_outbox_depth`.
    Bus,
}

impl DestinationKind {
    /// Whether this destination takes `event`.
    pub fn takes(self, event: &AgentEvent) -> bool {
        match self {
            DestinationKind::Manager => !event.is_bus_only(),
            DestinationKind::Bus => super::bus::encode::on_bus(event),
        }
    }
}

/// One outbox the writer fills, and the sender it wakes.
#[derive(Clone, Debug)]
pub struct Destination {
    /// What it takes.
    pub kind: DestinationKind,
    /// Its table.
    pub outbox: Outbox,
    /// Notified after every append.
    pub appended: Arc<Notify>,
}

/// Moves events from the bus's channel into every destination's outbox (one transaction per
/// batch for all of them), then wakes their senders.
pub struct OutboxWriter {
    /// The outboxes, each with the events its destination takes.
    pub destinations: Vec<Destination>,
    /// Counters and the depth gauges.
    pub metrics: Arc<AgentMetrics>,
}

/// The agent tree's `outbox-writer` child: runs `writer` on the event bus's channel `rx` until
/// stopped. A restart goes on with the same channel; its stop waits up to 10 s for the last
/// append.
pub fn child_spec(writer: OutboxWriter, rx: mpsc::UnboundedReceiver<Queued>) -> ChildSpec {
    let writer = Arc::new(writer);
    let rx = Arc::new(tokio::sync::Mutex::new(rx));
    ChildSpec::task("outbox-writer", move |stop: StopSignal| {
        let (writer, rx) = (writer.clone(), rx.clone());
        async move {
            writer.run(&mut *rx.lock().await, stop.requested()).await;
            Ok::<_, String>(())
        }
    })
    .shutdown(Shutdown::millis(10_000))
}

impl OutboxWriter {
    /// Events per transaction, at most.
    const BATCH: usize = 512;

    /// Appends every event received until `rx` closes or `stop` resolves; then appends what
    /// is already queued and returns.
    pub async fn run(
        &self,
        rx: &mut mpsc::UnboundedReceiver<Queued>,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let mut last = LastStates::default();
        let mut stop = std::pin::pin!(stop);
        loop {
            let first = tokio::select! {
                e = rx.recv() => e,
                _ = &mut stop => None,
            };
            let Some(first) = first else { break };
            let mut batch = vec![first];
            while batch.len() < Self::BATCH {
                match rx.try_recv() {
                    Ok(e) => batch.push(e),
                    Err(_) => break,
                }
            }
            self.write(&mut last, batch).await;
        }
        // Drain: whatever was emitted before the stop (agent_terminated) is kept.
        let mut rest = Vec::new();
        while let Ok(e) = rx.try_recv() {
            rest.push(e);
        }
        if !rest.is_empty() {
            self.write(&mut last, rest).await;
        }
    }

    async fn write(&self, last: &mut LastStates, batch: Vec<Queued>) {
        let before = batch.len();
        let batch: Vec<AgentEvent> = batch
            .into_iter()
            .filter(|q| last.keeps(q))
            .map(|q| q.event)
            .collect();
        for _ in batch.len()..before {
            self.metrics.event_deduplicated();
        }
        // A database error must not lose the batch: retry until it is written.
        let mut delay = std::time::Duration::from_millis(100);
        let reports = loop {
            match self.append(&batch).await {
                Ok(r) => break r,
                Err(e) => {
                    let locked = e.to_string().contains("database is locked");
                    self.metrics
                        .outbox_write_failed(if locked { "locked" } else { "other" });
                    tracing::error!(agent_id = %self.metrics.agent_id(), error = %e, events = batch.len(), "cannot write events to the outbox; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(std::time::Duration::from_secs(5));
                }
            }
        };
        for (d, report) in self.destinations.iter().zip(reports) {
            if report.dropped_superseded + report.dropped_newest > 0 {
                tracing::warn!(
                    agent_id = %self.metrics.agent_id(),
                    outbox = d.outbox.table(),
                    capacity = d.outbox.capacity(),
                    superseded = report.dropped_superseded,
                    newest = report.dropped_newest,
                    "event outbox full: dropped events (is {} reachable?)",
                    match d.kind {
                        DestinationKind::Manager => "the manager",
                        DestinationKind::Bus => "Redis",
                    }
                );
                self.metrics
                    .outbox_dropped("superseded", report.dropped_superseded);
                self.metrics.outbox_dropped("newest", report.dropped_newest);
            }
            if let Ok(depth) = d.outbox.depth().await {
                match d.kind {
                    DestinationKind::Manager => {
                        self.metrics.outbox(depth, d.outbox.capacity() as i64)
                    }
                    DestinationKind::Bus => self.metrics.bus_outbox(depth),
                }
            }
            d.appended.notify_one();
        }
    }

    /// Appends `batch` to every destination (the events each takes), all in one `BEGIN
    /// IMMEDIATE` transaction: either every outbox has the batch or none.
    async fn append(&self, batch: &[AgentEvent]) -> anyhow::Result<Vec<AppendReport>> {
        let Some(first) = self.destinations.first() else {
            return Ok(Vec::new());
        };
        let mut tx = first.outbox.pool.begin_with(BEGIN_WRITE).await?;
        let mut reports = Vec::with_capacity(self.destinations.len());
        for d in &self.destinations {
            let events = batch.iter().filter(|e| d.kind.takes(e));
            reports.push(d.outbox.append_in(&mut tx, events).await?);
        }
        tx.commit().await?;
        Ok(reports)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(k: &str) -> AgentEvent {
        AgentEvent::KernelStarted {
            kernel_id: k.into(),
            session_id: "s".into(),
            creation_info: None,
        }
    }

    fn terminated(k: &str) -> AgentEvent {
        AgentEvent::KernelTerminated {
            kernel_id: k.into(),
            session_id: "s".into(),
            reason: "user-requested".into(),
            exit_code: None,
        }
    }

    #[test]
    fn repeated_states_are_dropped() {
        let mut last = LastStates::default();
        assert!(last.is_new(&started("k1")));
        assert!(!last.is_new(&started("k1")));
        assert!(last.is_new(&started("k2")));
        assert!(last.is_new(&terminated("k1")));
        assert!(!last.is_new(&terminated("k1")));
        assert!(last.is_new(&AgentEvent::AgentStarted));
        assert!(last.is_new(&AgentEvent::AgentStarted));
        // Another container (restart_kernel recreated it): a new state.
        let in_container = |c: &str| AgentEvent::KernelStarted {
            kernel_id: "k4".into(),
            session_id: "s".into(),
            creation_info: Some(Box::new(crate::agent::events::StartedInfo {
                container_id: c.into(),
                kernel_host: "127.0.0.1".into(),
                repl_in_port: 0,
                repl_out_port: 0,
                service_ports: Vec::new(),
                used_devices: Default::default(),
            })),
        };
        assert!(last.is_new(&in_container("c1")));
        assert!(!last.is_new(&in_container("c1")));
        assert!(last.is_new(&in_container("c2")));
        // Sent again on purpose (a create_kernels retry's kernel_started): kept.
        let again = |event, again| Queued { event, again };
        assert!(last.keeps(&again(started("k3"), false)));
        assert!(!last.keeps(&again(started("k3"), false)));
        assert!(last.keeps(&again(started("k3"), true)));
        assert!(!last.keeps(&again(started("k3"), false)));
    }

    #[tokio::test]
    async fn append_ack_and_bound() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("agent.db")).await.unwrap();
        let outbox = Outbox::new(&store, 4);
        let r = outbox
            .append(&[started("k1"), started("k2"), started("k3")])
            .await
            .unwrap();
        assert_eq!(
            r,
            AppendReport {
                appended: 3,
                ..Default::default()
            }
        );
        let pending = outbox.pending(10).await.unwrap();
        assert_eq!(
            pending.iter().map(|p| p.event.clone()).collect::<Vec<_>>(),
            [started("k1"), started("k2"), started("k3")]
        );
        assert!(pending.windows(2).all(|w| w[0].seq < w[1].seq));
        // Full: a kernel's older state goes once its newer one is in.
        let r = outbox
            .append(&[terminated("k1"), terminated("k2"), terminated("k3")])
            .await
            .unwrap();
        assert_eq!(
            r,
            AppendReport {
                appended: 3,
                dropped_superseded: 2,
                dropped_newest: 0
            }
        );
        let names: Vec<_> = outbox
            .pending(10)
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.event)
            .collect();
        assert_eq!(
            names,
            [
                started("k3"),
                terminated("k1"),
                terminated("k2"),
                terminated("k3")
            ]
        );
        let r = outbox.append(&[started("k4")]).await.unwrap();
        assert_eq!(
            r,
            AppendReport {
                appended: 1,
                dropped_superseded: 1,
                dropped_newest: 0
            }
        );
        // Nothing superseded left: the newest are dropped.
        let r = outbox.append(&[started("k5")]).await.unwrap();
        assert_eq!(
            r,
            AppendReport {
                appended: 0,
                dropped_superseded: 0,
                dropped_newest: 1
            }
        );
        let names: Vec<_> = outbox
            .pending(10)
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.event)
            .collect();
        assert_eq!(
            names,
            [
                terminated("k1"),
                terminated("k2"),
                terminated("k3"),
                started("k4")
            ]
        );
        let ids: Vec<String> = outbox
            .pending(2)
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.id)
            .collect();
        assert_eq!(outbox.ack(&ids).await.unwrap(), 2);
        assert_eq!(
            outbox.ack(&ids).await.unwrap(),
            0,
            "a second ack of the same ids is harmless"
        );
        assert_eq!(outbox.depth().await.unwrap(), 2);
    }
}

//! The `bus-sender` child: publishes the bus outbox (`bus_outbox`) on Backend.AI's bus, oldest
//! first, one event at a time, and an `agent_heartbeat` every heartbeat interval.
//!
//! Each event is published by one Lua script ([`PUBLISH_SCRIPT`]) that first claims the
//! event's id (`SET kernelvisor:bus:sent:<id> 1 NX EX 86400`) and only if the claim is new
//! `XADD`s the entry (and `PUBLISH`es the broadcast message), atomically: a publish retried
//! after an ambiguous failure (the reply lost with the connection) is a no-op, so every event
//! reaches the stream exactly once. The row leaves the outbox only after the script returned
//! (published, or already published), so while Redis is down events wait, in order, bounded
//! by `[redis] outbox-max-events` (compacted by the outbox writer as the manager's outbox),
//! and go out when it is back (reconnecting with a backoff of 0.2 s doubling to `[redis]
//! retry-max`).
//!
//! Heartbeats are latest-wins: built when due, tried once (bounded by the interval), never
//! queued; one that cannot be sent is skipped and counted
//! (`kernelvisor_bus_publish_failures_total{reason="heartbeat"}`).

use std::sync::Arc;
use std::time::Duration;

use actors::{ChildSpec, Shutdown, StopSignal};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::Notify;

use super::encode::{self, AgentInfo, BusMessage, SlotEntry};
use super::logs;
use crate::agent::context::AgentContext;
use crate::agent::events::AgentEvent;
use crate::agent::metrics::AgentMetrics;
use crate::agent::outbox::{Destination, DestinationKind, Outbox, PendingEvent};
use crate::agent::store::Store;
use crate::config::{AgentConfig, RedisSection};
use crate::retry::Backoff;

/// Seconds the dedup key of a published event lives (a retry comes long before).
pub const DEDUP_TTL_SECS: u64 = 86_400;

/// The dedup key of the event `id`.
pub fn dedup_key(id: &str) -> String {
    format!("kernelvisor:bus:sent:{id}")
}

/// `KEYS[1]` the dedup key, `KEYS[2]` the stream; `ARGV[1]` the key's TTL in seconds,
/// `ARGV[2]` the stream's approximate max length, `ARGV[3]` the broadcast channel (`""`: none),
/// `ARGV[4]` the broadcast message, `ARGV[5..]` the entry's field/value pairs. Returns 1 when
/// published, 0 when the id was already published.
pub const PUBLISH_SCRIPT: &str = r"
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', ARGV[1]) then
  return 0
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', unpack(ARGV, 5))
if ARGV[3] ~= '' then
  redis.call('PUBLISH', ARGV[3], ARGV[4])
end
return 1
";

/// What the heartbeat says besides the live slots: set once at start.
#[derive(Clone)]
pub struct HeartbeatIdentity {
    /// The agent's state (slots, config).
    pub ctx: Arc<AgentContext>,
    /// The advertised RPC address, `tcp://host:port`.
    pub rpc_addr: String,
    /// The agent's CURVE public key (Z85), `None` without CURVE.
    pub public_key: Option<String>,
    /// Seconds between heartbeats.
    pub interval: Duration,
}

/// Publishes the bus outbox and heartbeats on one Redis.
pub struct BusSender {
    /// The source of every message (`[agent] id`).
    pub agent_id: String,
    /// `[redis]`.
    pub config: RedisSection,
    /// The bus outbox.
    pub outbox: Outbox,
    /// Notified when events are appended.
    pub appended: Arc<Notify>,
    /// Counters and the depth gauge.
    pub metrics: Arc<AgentMetrics>,
    /// Heartbeats.
    pub heartbeat: HeartbeatIdentity,
    /// The connection to the log lists' database (6), made when first needed.
    pub log_conn: std::sync::Mutex<Option<ConnectionManager>>,
}

/// The `bus-sender` child's sender and its outbox (a destination of the outbox writer) for a
/// `[redis]` section (`None` without one); the bus outbox in `store`, bounded by
/// `outbox-max-events`.
pub fn from_config(
    config: &AgentConfig,
    store: &Store,
    metrics: &Arc<AgentMetrics>,
    heartbeat: HeartbeatIdentity,
) -> Option<(Destination, BusSender)> {
    let r = config.redis.as_ref()?;
    let destination = Destination {
        kind: DestinationKind::Bus,
        outbox: Outbox::bus(store, r.outbox_max_events),
        appended: Arc::new(Notify::new()),
    };
    let sender = BusSender {
        agent_id: config.agent.id.clone(),
        config: r.clone(),
        outbox: destination.outbox.clone(),
        appended: destination.appended.clone(),
        metrics: metrics.clone(),
        heartbeat,
        log_conn: std::sync::Mutex::new(None),
    };
    Some((destination, sender))
}

/// The agent tree's `bus-sender` child: runs `sender` until stopped; its stop waits up to 3 s
/// for the last publish (which carries `agent_terminated`).
pub fn child_spec(sender: BusSender) -> ChildSpec {
    let sender = Arc::new(sender);
    ChildSpec::task("bus-sender", move |stop: StopSignal| {
        let sender = sender.clone();
        async move {
            sender.run(stop.requested()).await;
            Ok::<_, String>(())
        }
    })
    .shutdown(Shutdown::millis(3_000))
}

/// Why an attempt failed, as the failure metric's `reason`.
type Failure = &'static str;

/// A failed script call: `io` when the connection broke or timed out (retried on a fresh one),
/// `rejected` when Redis answered with an error.
fn failure(e: &redis::RedisError) -> Failure {
    if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() {
        "io"
    } else {
        "rejected"
    }
}

impl BusSender {
    const FIRST_RETRY: Duration = Duration::from_millis(200);
    /// Events read from the outbox at once (published one by one, in order).
    const BATCH: u32 = 64;
    /// Longest a connection attempt or a reply may take.
    const TIMEOUT: Duration = Duration::from_secs(2);
    /// How long the last delivery on shutdown may take at most.
    const SHUTDOWN_FLUSH: Duration = Duration::from_millis(1500);

    /// Publishes until `stop` resolves, then (connected) makes one bounded last attempt so
    /// that `agent_terminated` gets out; what is left stays in the outbox for the next start.
    pub async fn run(&self, stop: impl std::future::Future<Output = ()>) {
        let script = redis::Script::new(PUBLISH_SCRIPT);
        let mut conn: Option<ConnectionManager> = None;
        let mut stop = std::pin::pin!(stop);
        let mut retry = Backoff::new(Self::FIRST_RETRY, self.config.retry_max.0);
        let mut beat = tokio::time::interval(self.heartbeat.interval);
        beat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        let mut retry_at: Option<tokio::time::Instant> = Some(tokio::time::Instant::now());
        loop {
            let wake = async {
                match retry_at {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                _ = &mut stop => break,
                _ = beat.tick() => {
                    self.beat(&mut conn).await;
                    continue;
                }
                _ = self.appended.notified() => {}
                _ = wake => {}
            }
            let attempt = tokio::select! {
                biased;
                _ = &mut stop => break,
                a = self.drain(&script, &mut conn) => a,
            };
            match attempt {
                Ok(()) => {
                    retry.reset();
                    retry_at = None;
                }
                Err(reason) => {
                    self.metrics.bus_publish_failed(reason);
                    retry_at = Some(tokio::time::Instant::now() + retry.next_wait());
                }
            }
        }
        if conn.is_some() {
            let _ =
                tokio::time::timeout(Self::SHUTDOWN_FLUSH, self.drain(&script, &mut conn)).await;
        }
    }

    /// A connection to the streams' database, made if needed.
    async fn connection(
        &self,
        conn: &mut Option<ConnectionManager>,
    ) -> Result<ConnectionManager, Failure> {
        self.connection_to(conn, encode::STREAM_DB).await
    }

    /// A connection to logical database `db`, made if needed.
    async fn connection_to(
        &self,
        conn: &mut Option<ConnectionManager>,
        db: i64,
    ) -> Result<ConnectionManager, Failure> {
        if let Some(c) = conn {
            return Ok(c.clone());
        }
        let client = self.config.client(db).map_err(|_| "connect")?;
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Self::TIMEOUT)
            .set_response_timeout(Self::TIMEOUT)
            .set_number_of_retries(1)
            .set_max_delay(1000);
        match tokio::time::timeout(
            Self::TIMEOUT * 2,
            ConnectionManager::new_with_config(client, cfg),
        )
        .await
        {
            Ok(Ok(c)) => {
                tracing::info!(agent_id = %self.agent_id, addr = %self.config.addr, db, "connected to Backend.AI's event bus");
                *conn = Some(c.clone());
                Ok(c)
            }
            Ok(Err(e)) => {
                tracing::debug!(agent_id = %self.agent_id, error = %e, "Redis unreachable; events wait in the bus outbox");
                Err(if e.kind() == redis::ErrorKind::AuthenticationFailed {
                    "rejected"
                } else {
                    "connect"
                })
            }
            Err(_) => Err("connect"),
        }
    }

    /// Publishes every pending event in order, each removed once Redis took it.
    async fn drain(
        &self,
        script: &redis::Script,
        conn: &mut Option<ConnectionManager>,
    ) -> Result<(), Failure> {
        loop {
            let batch = self.outbox.pending(Self::BATCH).await.map_err(|e| {
                tracing::error!(agent_id = %self.agent_id, error = %e, "cannot read the bus outbox");
                "outbox"
            })?;
            if batch.is_empty() {
                return Ok(());
            }
            let mut c = self.connection(conn).await?;
            for p in &batch {
                if let AgentEvent::DoSyncKernelLogs {
                    kernel_id,
                    container_id,
                } = &p.event
                {
                    // The logs first: the manager fetches them when it reads the event.
                    self.push_logs(&p.id, kernel_id, container_id)
                        .await
                        .inspect_err(|_| *self.log_conn.lock().expect("log connection") = None)?;
                }
                // On the bus now, or by an earlier attempt whose reply was lost (the script
                // answered "already published"): counted once either way.
                let on_bus = match encode::encode(&p.event, &self.agent_id) {
                    Some(msg) => self
                        .publish(script, &mut c, p, &msg)
                        .await
                        .map(|_| true)
                        .inspect_err(|_| {
                            // A fresh connection next time.
                            *conn = None;
                        })?,
                    // Written by an agent that put it on the bus; this one does not: drop it.
                    None => false,
                };
                self.outbox.ack(std::slice::from_ref(&p.id)).await.map_err(|e| {
                    tracing::error!(agent_id = %self.agent_id, error = %e, "cannot delete a published event");
                    "outbox"
                })?;
                if on_bus {
                    self.metrics.bus_published(1);
                }
            }
            if let Ok(depth) = self.outbox.depth().await {
                self.metrics.bus_outbox(depth);
            }
        }
    }

    /// Pushes the logs the agent keeps of `kernel_id` to `containerlog.<container_id>` (see
    /// [`super::logs`]), at most once per event `id`. No log kept (retention passed, or none
    /// written): nothing pushed, the event still goes.
    async fn push_logs(
        &self,
        id: &str,
        kernel_id: &str,
        container_id: &str,
    ) -> Result<(), Failure> {
        let logs = match self
            .heartbeat
            .ctx
            .logs
            .read(kernel_id, Some(0), logs::MAX_BYTES, None)
            .await
        {
            Ok(Some(chunk)) => chunk.data,
            Ok(None) => Vec::new(),
            Err(e) => {
                tracing::warn!(agent_id = %self.agent_id, %kernel_id, error = %e, "cannot read the kernel's log for do_sync_kernel_logs; handing over none");
                Vec::new()
            }
        };
        let mut slot = self.log_conn.lock().expect("log connection").clone();
        let mut c = self
            .connection_to(&mut slot, logs::CONTAINER_LOG_DB)
            .await?;
        *self.log_conn.lock().expect("log connection") = slot;
        let script = redis::Script::new(logs::PUSH_SCRIPT);
        let mut inv = script.key(logs::dedup_key(id));
        inv.key(logs::list_key(container_id))
            .arg(DEDUP_TTL_SECS)
            .arg(logs::LIST_TTL_SECS);
        for chunk in logs::chunks(&logs) {
            inv.arg(chunk);
        }
        match tokio::time::timeout(Self::TIMEOUT * 2, inv.invoke_async::<i64>(&mut c)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                tracing::warn!(agent_id = %self.agent_id, %kernel_id, error = %e, "pushing the kernel's logs failed; will retry");
                Err(failure(&e))
            }
            Err(_) => Err("io"),
        }
    }

    /// Runs the publish script for `p`; `Ok(true)` published now, `Ok(false)` published before.
    async fn publish(
        &self,
        script: &redis::Script,
        c: &mut ConnectionManager,
        p: &PendingEvent,
        msg: &BusMessage,
    ) -> Result<bool, Failure> {
        let mut inv = script.key(dedup_key(&p.id));
        inv.key(encode::STREAM_KEY)
            .arg(DEDUP_TTL_SECS)
            .arg(encode::STREAM_MAXLEN)
            .arg(if msg.broadcast {
                encode::BROADCAST_CHANNEL
            } else {
                ""
            })
            .arg(if msg.broadcast {
                msg.broadcast_json(&self.agent_id)
            } else {
                String::new()
            });
        for (k, v) in msg.stream_fields(&self.agent_id) {
            inv.arg(k).arg(v);
        }
        match tokio::time::timeout(Self::TIMEOUT * 2, inv.invoke_async::<i64>(c)).await {
            Ok(Ok(n)) => Ok(n == 1),
            Ok(Err(e)) => {
                tracing::warn!(agent_id = %self.agent_id, error = %e, event = msg.name, id = %p.id, "bus publish failed; will retry");
                Err(failure(&e))
            }
            Err(_) => Err("io"),
        }
    }

    /// One heartbeat, tried once.
    async fn beat(&self, conn: &mut Option<ConnectionManager>) {
        let msg = encode::heartbeat(&self.agent_info());
        let sent = tokio::time::timeout(self.heartbeat.interval.min(Self::TIMEOUT * 2), async {
            let mut c = self.connection(conn).await?;
            let fields = msg.stream_fields(&self.agent_id);
            redis::cmd("XADD")
                .arg(encode::STREAM_KEY)
                .arg("MAXLEN")
                .arg("~")
                .arg(encode::STREAM_MAXLEN)
                .arg("*")
                .arg(&fields[..])
                .query_async::<String>(&mut c)
                .await
                .map_err(|e| {
                    tracing::debug!(agent_id = %self.agent_id, error = %e, "bus heartbeat not sent (skipped)");
                    "heartbeat"
                })
        })
        .await;
        if !matches!(sent, Ok(Ok(_))) {
            self.metrics.bus_publish_failed("heartbeat");
        }
    }

    /// The `AgentInfo` of a heartbeat now (`AbstractAgent.heartbeat`, agent.py).
    pub fn agent_info(&self) -> AgentInfo {
        let h = &self.heartbeat;
        let cfg = &h.ctx.config;
        let (capacity, types) = {
            let s = h.ctx.slots.lock().expect("slot allocator lock");
            (s.capacity(), s.slot_types().clone())
        };
        let version = env!("CARGO_PKG_VERSION");
        let mut plugins = std::collections::BTreeMap::new();
        plugins.insert(
            "cpu".to_owned(),
            serde_json::json!({
                "version": version, "agent_version": version,
                "machine": encode::architecture(), "os_type": "Linux",
            }),
        );
        for (slot, _) in types.iter() {
            let device = slot.split('.').next().unwrap_or(slot);
            plugins
                .entry(device.to_owned())
                .or_insert_with(|| serde_json::json!({ "version": version }));
        }
        let host = h
            .rpc_addr
            .strip_prefix("tcp://")
            .and_then(|a| a.rsplit_once(':'))
            .map_or(h.rpc_addr.as_str(), |(host, _)| host);
        let c = &cfg.container;
        AgentInfo {
            ip: host.trim_matches(['[', ']']).to_owned(),
            region: Some(cfg.agent.region.clone()),
            scaling_group: Some(cfg.agent.scaling_group().to_owned()),
            addr: h.rpc_addr.clone(),
            public_key: h.public_key.clone(),
            public_host: c
                .advertised_host
                .clone()
                .unwrap_or_else(|| c.bind_host.clone()),
            available_resource_slots: capacity
                .iter()
                .map(|(k, v)| SlotEntry {
                    resource_type: k.to_owned(),
                    quantity: v.to_string(),
                })
                .collect(),
            slot_key_and_units: types
                .iter()
                .map(|(k, t)| (k.to_string(), t.as_str().to_owned()))
                .collect(),
            version: version.to_owned(),
            compute_plugins: plugins,
            architecture: encode::architecture().to_owned(),
            auto_terminate_abusing_kernel: false,
        }
    }
}

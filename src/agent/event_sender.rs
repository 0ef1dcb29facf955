//! The event sender: delivers the outbox to the manager's event intake, oldest first, until
//! each event's id is acked (`docs/events.md`).
//!
//! One batch is in flight at a time, so the manager sees every kernel's events in order; a
//! batch whose ack does not come (manager down, ack lost) is resent with the same ids after a
//! backoff (0.2 s doubling to `event-retry-max`), and the manager drops the duplicates by id.
//! With several intakes (`event-addrs`), a connection failure or a missing ack moves the agent to
//! the next intake ([`super::intakes::Intakes`]) and the batch is resent there at once.

use std::sync::Arc;
use std::time::Duration;

use actors::{ChildSpec, Shutdown, StopSignal};
use rmpv::Value;
use tokio::sync::Notify;

use super::intakes::Intakes;
use super::metrics::AgentMetrics;
use super::outbox::{Destination, DestinationKind, Outbox, PendingEvent};
use super::store::Store;
use crate::config::{AgentConfig, AgentManagerSection};
use crate::retry::Backoff;
use crate::rpc::curve::{load_certificate, KeyPair};
use crate::rpc::socket::ClientCurve;
use crate::rpc::{intake_api, Call, CallError, Peer, PeerOptions};

/// How long the last delivery on shutdown may take at most, whatever `event-ack-timeout`: an
/// agent whose manager is gone stops within about this (what is not acked stays in the outbox
/// for the next start).
pub const SHUTDOWN_FLUSH: Duration = Duration::from_millis(1000);

/// The intake method that takes a batch: `agent_events(agent_id, events)` → `{"acked": [id]}`.
pub const EVENTS_METHOD: &str = crate::rpc::intake_api::EVENTS_METHOD;

/// Encodes one pending event for the wire ([`intake_api::events::encode`]): its fields (less
/// the bus-only `image` of `kernel_pulling` and `creation_info` of `kernel_started`) plus `id`,
/// `seq` and `ts` (Unix seconds).
pub fn encode_event(p: &PendingEvent) -> Value {
    intake_api::events::encode(&p.id, p.seq, p.created_at, &p.event)
}

/// Delivers the outbox to one manager.
pub struct EventSender {
    /// This agent's id (the batch's first argument).
    pub agent_id: String,
    /// How to connect (keys, keepalive, handshake timeout); the endpoint is `intakes`' current.
    pub peer: PeerOptions,
    /// The intakes, in failover order, shared with the heartbeat loop.
    pub intakes: Arc<Intakes>,
    /// `[manager]` settings: batch size, ack timeout, retry cap.
    pub config: AgentManagerSection,
    /// The events to deliver.
    pub outbox: Outbox,
    /// Notified when events are appended.
    pub appended: Arc<Notify>,
    /// Send counters, failures and the depth gauge.
    pub metrics: Arc<AgentMetrics>,
}

/// The agent tree's `event-sender` child: runs `sender` until stopped. Its stop waits the ack
/// timeout plus 2 s, room for the last delivery attempt (which carries `agent_terminated`).
pub fn child_spec(sender: EventSender) -> ChildSpec {
    let grace = sender.config.event_ack_timeout.0 + Duration::from_secs(2);
    let sender = Arc::new(sender);
    ChildSpec::task("event-sender", move |stop: StopSignal| {
        let sender = sender.clone();
        async move {
            sender.run(stop.requested()).await;
            Ok::<_, String>(())
        }
    })
    .shutdown(Shutdown::Graceful(grace))
}

/// With a `[manager]` section: how the agent reaches the manager's intakes (events and
/// heartbeats), the event sender, and its outbox (a destination of the outbox writer).
pub struct ManagerLink {
    /// How the heartbeat connects (the event sender's options).
    pub peer: PeerOptions,
    /// The intakes, in failover order, shared by the sender and the heartbeat.
    pub intakes: Arc<Intakes>,
    /// The `event-sender` child's sender.
    pub sender: EventSender,
    /// Its outbox, for the outbox writer.
    pub destination: Destination,
}

/// The [`ManagerLink`] of a `[manager]` section (`None` without one): CURVE with
/// `agent_keypair` and `[agent] rpc-auth-manager-public-key` when both are set; the outbox in
/// `store`.
///
/// Errors: the manager's public key file is unreadable.
pub fn link(
    config: &AgentConfig,
    agent_keypair: Option<&KeyPair>,
    store: &Store,
    metrics: &Arc<AgentMetrics>,
) -> anyhow::Result<Option<ManagerLink>> {
    let Some(m) = &config.manager else {
        return Ok(None);
    };
    let a = &config.agent;
    let intakes = Arc::new(Intakes::new(m.intake_endpoints()));
    let peer = PeerOptions {
        endpoint: m.intake_endpoints()[0].clone(),
        curve: match (&a.rpc_auth_manager_public_key, agent_keypair) {
            (Some(manager), Some(pair)) => Some(ClientCurve {
                keypair: pair.clone(),
                server_key: load_certificate(manager)?.public,
            }),
            _ => None,
        },
        keepalive: Some(Default::default()),
        handshake_timeout: m.event_ack_timeout.0.min(Duration::from_secs(5)),
    };
    let outbox = Outbox::new(store, m.outbox_max_events);
    let appended = Arc::new(Notify::new());
    Ok(Some(ManagerLink {
        destination: Destination {
            kind: DestinationKind::Manager,
            outbox: outbox.clone(),
            appended: appended.clone(),
        },
        sender: EventSender {
            agent_id: a.id.clone(),
            peer: peer.clone(),
            intakes: intakes.clone(),
            config: m.clone(),
            outbox,
            appended,
            metrics: metrics.clone(),
        },
        peer,
        intakes,
    }))
}

enum Attempt {
    /// Everything pending was acked (or nothing was pending).
    Drained,
    /// Some events were acked; go on at once.
    Progress,
    /// Nothing was acked; wait before retrying (`true`: moved to another intake, retry now).
    Failed(&'static str, bool),
}

impl EventSender {
    const FIRST_RETRY: Duration = Duration::from_millis(200);

    /// Delivers until `stop` resolves; then, if connected, makes one last attempt (bounded by
    /// the ack timeout) so that `agent_terminated` reaches the manager, and returns. What is left stays
    /// in the outbox for the next start.
    pub async fn run(&self, stop: impl std::future::Future<Output = ()>) {
        let zmq = zmq::Context::new();
        let mut peer: Option<Peer> = None;
        let mut stop = std::pin::pin!(stop);
        let mut retry = Backoff::new(Self::FIRST_RETRY, self.config.event_retry_max.0);
        loop {
            // A stop does not wait for an attempt in flight (an ack that may never come): what it
            // sent is resent later, and the managers drop duplicates by id.
            let attempt = tokio::select! {
                biased;
                _ = &mut stop => break,
                a = self.attempt(&zmq, &mut peer) => a,
            };
            match attempt {
                Attempt::Progress => continue,
                Attempt::Drained => {
                    retry.reset();
                    tokio::select! {
                        _ = self.appended.notified() => {}
                        _ = &mut stop => break,
                    }
                }
                Attempt::Failed(reason, moved) => {
                    self.metrics.event_send_failed(reason);
                    if moved {
                        // A fresh intake: try it at once.
                        retry.reset();
                        continue;
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(retry.next_wait()) => {}
                        _ = &mut stop => break,
                    }
                }
            }
        }
        // Last delivery on the way out (agent_terminated, kernels destroyed on shutdown),
        // bounded, and only over a live connection: a down manager must not delay shutdown.
        if peer.as_ref().is_some_and(|p| !p.is_closed()) {
            let bound = SHUTDOWN_FLUSH.min(self.config.event_ack_timeout.0);
            let last = tokio::time::timeout(bound, async {
                while let Attempt::Progress = self.attempt(&zmq, &mut peer).await {}
            });
            let _ = last.await;
        }
        if let Some(p) = peer {
            p.close();
        }
    }

    async fn attempt(&self, zmq: &zmq::Context, peer: &mut Option<Peer>) -> Attempt {
        let batch = match self.outbox.pending(self.config.event_batch_size).await {
            Ok(b) if b.is_empty() => return Attempt::Drained,
            Ok(b) => b,
            Err(e) => {
                tracing::error!(agent_id = %self.agent_id, error = %e, "cannot read the outbox");
                return Attempt::Failed("outbox", false);
            }
        };
        let (index, endpoint) = self.intakes.current();
        let p = match peer {
            Some(p) if !p.is_closed() && p.endpoint() == endpoint => p.clone(),
            _ => {
                if let Some(old) = peer.take() {
                    old.close();
                }
                let opts = PeerOptions {
                    endpoint: endpoint.to_owned(),
                    ..self.peer.clone()
                };
                match Peer::connect(zmq, &opts).await {
                    Ok(p) => {
                        tracing::info!(agent_id = %self.agent_id, %endpoint, "connected to the manager's event intake");
                        *peer = Some(p.clone());
                        p
                    }
                    Err(e) => {
                        tracing::debug!(agent_id = %self.agent_id, error = %e, pending = batch.len(), "manager's event intake unreachable");
                        return Attempt::Failed("connect", self.intakes.failed(index));
                    }
                }
            }
        };
        let events = Value::Array(batch.iter().map(encode_event).collect());
        let call = Call {
            args: vec![self.agent_id.clone().into(), events],
            kwargs: Vec::new(),
            peer_user_id: None,
        };
        let acked = match p
            .call(EVENTS_METHOD, &call, self.config.event_ack_timeout.0)
            .await
        {
            Ok(reply) => acked_ids(&reply),
            Err(e) => {
                let reason = match &e {
                    CallError::Timeout { .. } => "timeout",
                    CallError::Disconnected(_) => "disconnected",
                    _ => "rejected",
                };
                let mut moved = false;
                if e.is_connection_error() {
                    p.close();
                    *peer = None;
                    moved = self.intakes.failed(index);
                }
                tracing::warn!(agent_id = %self.agent_id, error = %e, events = batch.len(), %endpoint, "event batch not acked; will resend");
                return Attempt::Failed(reason, moved);
            }
        };
        let done = match self.outbox.ack(&acked).await {
            Ok(n) => n,
            Err(e) => {
                tracing::error!(agent_id = %self.agent_id, error = %e, "cannot delete acked events");
                return Attempt::Failed("outbox", false);
            }
        };
        self.metrics.events_sent(done);
        if let Ok(depth) = self.outbox.depth().await {
            self.metrics.outbox(depth, self.outbox.capacity() as i64);
        }
        match done {
            0 => Attempt::Failed("rejected", false),
            n if (n as usize) < batch.len()
                || batch.len() == self.config.event_batch_size as usize =>
            {
                Attempt::Progress
            }
            _ => Attempt::Drained,
        }
    }
}

/// The ids in an `{"acked": [id, …]}` reply (anything else acks nothing).
fn acked_ids(reply: &Value) -> Vec<String> {
    let Value::Map(m) = reply else {
        return Vec::new();
    };
    m.iter()
        .find(|(k, _)| k.as_str() == Some("acked"))
        .and_then(|(_, v)| v.as_array())
        .map(|ids| {
            ids.iter()
                .filter_map(|i| i.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::events::AgentEvent;

    #[test]
    fn wire_shape() {
        let p = PendingEvent {
            seq: 7,
            id: "e1".into(),
            created_at: 1.5,
            event: AgentEvent::KernelTerminated {
                kernel_id: "k".into(),
                session_id: "s".into(),
                reason: "oom-killed".into(),
                exit_code: Some(137),
            },
        };
        let v = encode_event(&p);
        let get = |k: &str| {
            v.as_map()
                .unwrap()
                .iter()
                .find(|(key, _)| key.as_str() == Some(k))
                .map(|(_, v)| v.clone())
        };
        assert_eq!(get("name"), Some("kernel_terminated".into()));
        assert_eq!(get("kernel_id"), Some("k".into()));
        assert_eq!(get("exit_code"), Some(137.into()));
        assert_eq!(get("id"), Some("e1".into()));
        assert_eq!(get("seq"), Some(7.into()));
        assert_eq!(get("ts"), Some(1.5.into()));
        let back: AgentEvent = rmpv::ext::from_value(v).unwrap();
        assert_eq!(
            back, p.event,
            "extra keys are ignored when decoding the event"
        );
    }

    #[test]
    fn acks_are_read_leniently() {
        let reply = Value::Map(vec![(
            "acked".into(),
            Value::Array(vec!["a".into(), 3.into(), "b".into()]),
        )]);
        assert_eq!(acked_ids(&reply), ["a", "b"]);
        assert!(acked_ids(&Value::Nil).is_empty());
    }
}

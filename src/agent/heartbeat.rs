//! The heartbeat: every `heartbeat-interval` (default 20 s) the agent tells the manager who it
//! is, what it has and which kernels it runs (`docs/events.md`).
//!
//! Latest-wins: a heartbeat goes on its own connection, never behind events, and one that
//! cannot be delivered is dropped, never queued or replayed: the next one supersedes it.

use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use actors::{ChildSpec, StopSignal};
use rmpv::Value;

use super::context::AgentContext;
use super::intakes::Intakes;
use super::kernels::CurrentRegistry;
use super::registry::{KernelRegistry, ListKernels};
use crate::rpc::{Call, Peer, PeerOptions};

/// The intake method that takes a heartbeat: `agent_heartbeat(agent_id, info)`.
pub const HEARTBEAT_METHOD: &str = "agent_heartbeat";

/// What a heartbeat says besides the live facts: set once at start.
#[derive(Clone, Debug)]
pub struct Identity {
    /// `[agent] region`.
    pub region: String,
    /// The RPC endpoint the manager should call, `tcp://host:port`.
    pub rpc_addr: String,
    /// The agent's CURVE public key (Z85), when CURVE is on.
    pub public_key: Option<String>,
}

/// Builds the heartbeat map: `agent_id`, `region`, `addr`, `public_key`, `version`,
/// `architecture`, `ts` (Unix seconds), `slots` (`total`, `available`, `occupied`, each
/// `{slot: "decimal string"}` over every slot: `cpu` cores, `mem` bytes, and each accelerator
/// slot such as `cuda.device` / `cuda.shares`), `slot_key_and_units` (`{slot: "count" |
/// "bytes" | "unique"}`, Backend.AI's name) and `kernels` (`[{"id", "session_id", "status"}]`,
/// every kernel not `TERMINATED`).
pub async fn build(ctx: &AgentContext, registry: &Addr<KernelRegistry>, who: &Identity) -> Value {
    let (total, available, occupied, units) = {
        let slots = ctx.slots.lock().expect("slot allocator lock");
        (
            slots.capacity().to_msgpack(),
            slots.available().to_msgpack(),
            slots.used().to_msgpack(),
            slot_key_and_units(slots.slot_types()),
        )
    };
    let kernels = registry.send(ListKernels).await.unwrap_or_default();
    let live: Vec<Value> = kernels
        .iter()
        .filter(|k| k.status != super::kernel::KernelStatus::Terminated)
        .map(|k| {
            Value::Map(vec![
                ("id".into(), k.id.clone().into()),
                ("session_id".into(), k.session_id.clone().into()),
                ("status".into(), k.status.as_str().into()),
            ])
        })
        .collect();
    let str_or_nil = |s: &Option<String>| s.clone().map_or(Value::Nil, Value::from);
    Value::Map(vec![
        ("agent_id".into(), ctx.agent_id.clone().into()),
        ("region".into(), who.region.clone().into()),
        ("addr".into(), who.rpc_addr.clone().into()),
        ("public_key".into(), str_or_nil(&who.public_key)),
        ("version".into(), env!("CARGO_PKG_VERSION").into()),
        ("architecture".into(), std::env::consts::ARCH.into()),
        ("ts".into(), super::store::now().into()),
        (
            "slots".into(),
            Value::Map(vec![
                ("total".into(), total),
                ("available".into(), available),
                ("occupied".into(), occupied),
            ]),
        ),
        ("slot_key_and_units".into(), units),
        ("kernels".into(), Value::Array(live)),
    ])
}

/// `{slot: "count" | "bytes" | "unique"}`.
pub fn slot_key_and_units(types: &crate::slots::SlotTypes) -> Value {
    Value::Map(
        types
            .iter()
            .map(|(k, t)| (k.as_str().into(), t.as_str().into()))
            .collect(),
    )
}

/// The agent tree's `heartbeat` child: [`run`] with the current registry until stopped.
pub fn child_spec(
    ctx: Arc<AgentContext>,
    registry: CurrentRegistry,
    who: Identity,
    peer: Option<(PeerOptions, Arc<Intakes>)>,
    interval: Duration,
) -> ChildSpec {
    ChildSpec::task("heartbeat", move |stop: StopSignal| {
        let run = run(
            ctx.clone(),
            registry.get(),
            who.clone(),
            peer.clone(),
            interval,
            async move { stop.requested().await },
        );
        async move {
            run.await;
            Ok::<_, String>(())
        }
    })
}

/// Sends a heartbeat every `interval` until `stop`. Without `peer` (standalone) it still
/// refreshes `backendai_agent_heartbeat`.
pub async fn run(
    ctx: Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
    who: Identity,
    peer: Option<(PeerOptions, Arc<Intakes>)>,
    interval: Duration,
    stop: impl std::future::Future<Output = ()>,
) {
    let zmq = zmq::Context::new();
    let mut conn: Option<Peer> = None;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut stop = std::pin::pin!(stop);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = &mut stop => break,
        }
        let beat = build(&ctx, &registry, &who).await;
        ctx.metrics.heartbeat(super::store::now());
        let Some((opts, intakes)) = &peer else {
            continue;
        };
        // The intake the event sender uses too; a failed beat moves both on.
        let (index, endpoint) = intakes.current();
        // Bounded by the interval: a slow manager never makes heartbeats pile up.
        let timeout = interval.min(Duration::from_secs(5));
        let delivery = tokio::time::timeout(interval, async {
            let p = match &conn {
                Some(p) if !p.is_closed() && p.endpoint() == endpoint => p.clone(),
                _ => {
                    if let Some(old) = conn.take() {
                        old.close();
                    }
                    let mut o = opts.clone();
                    o.endpoint = endpoint.to_owned();
                    o.handshake_timeout = timeout;
                    let p = Peer::connect(&zmq, &o)
                        .await
                        .map_err(|e| ("connect", e.to_string()))?;
                    conn = Some(p.clone());
                    p
                }
            };
            let call = Call {
                args: vec![ctx.agent_id.clone().into(), beat],
                kwargs: Vec::new(),
                peer_user_id: None,
            };
            p.call(HEARTBEAT_METHOD, &call, timeout).await.map_err(|e| {
                (
                    if e.is_connection_error() {
                        "unreachable"
                    } else {
                        "rejected"
                    },
                    e.to_string(),
                )
            })
        });
        // Stopping does not wait for a beat in flight.
        let delivered = tokio::select! {
            biased;
            _ = &mut stop => break,
            d = delivery => d,
        };
        let failure = match delivered {
            Ok(Ok(_)) => None,
            Ok(Err(f)) => Some(f),
            Err(_) => Some((
                "timeout",
                "no answer within the heartbeat interval".to_owned(),
            )),
        };
        if let Some((reason, error)) = failure {
            ctx.metrics.heartbeat_failed(reason);
            tracing::debug!(agent_id = %ctx.agent_id, reason, error, "heartbeat not delivered (dropped; the next one supersedes it)");
            if reason != "rejected" {
                if let Some(p) = conn.take() {
                    p.close();
                }
                intakes.failed(index);
            }
        }
    }
    if let Some(p) = conn {
        p.close();
    }
}

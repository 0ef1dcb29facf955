//! `AgentPool`: one persistent ZeroMQ peer per agent, with ping health checks (Backend.AI's
//! agent RPC connection pooling, as an actor).
//!
//! - An entry is created on first use: a DEALER, CURVE when the agent has a public key, TCP
//!   keepalive, and callosum's PING/PONG handshake. Concurrent first callers share one handshake.
//! - Any number of callers share the entry's [`Peer`]; replies are routed by request id.
//! - Connection errors (timeouts, I/O) count toward `failure_threshold`; FAILURE replies never do.
//!   At the threshold the entry is unhealthy and refuses calls with [`AgentConnectionUnavailable`].
//! - Every `health_check_interval` each entry is pinged: an answer heals it, a connection error
//!   marks it unhealthy; one unhealthy for longer than `recovery_timeout` is closed and evicted,
//!   so the next call reconnects from scratch (e.g. after the agent restarted).
//! - [`Invalidate`] marks an entry unhealthy (the registry calls it when an agent is lost).
//! - Fleet scale: every agent's connection is a route of one ROUTER ([`Mux`]), one
//!   file descriptor each where a DEALER costs two and a socket of the context's 1,023; the
//!   context has `io-threads`. The periodic sweep keeps at most `health-check-concurrency`
//!   pings in flight and paces their start over half the interval, so 10,000 agents are not
//!   pinged in one burst.

mod error;
mod spec;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::future::{LocalBoxFuture, Shared};
use futures::FutureExt;
use rmpv::Value;

pub use error::{AgentCallError, AgentConnectionUnavailable};
pub use spec::PoolSpec;

use crate::rpc::codec::Call;
use crate::rpc::context::SizedContext;
use crate::rpc::curve::{CurveKey, KeyPair};
use crate::rpc::mux::{Mux, MuxPeer};
use crate::rpc::peer::{ConnectError, PeerOptions};
use crate::rpc::socket::ClientCurve;

/// Where an agent's RPC endpoint is and which key it proves itself with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentEndpoint {
    /// `tcp://host:port`.
    pub addr: String,
    /// The agent's CURVE public key; `None` for an unauthenticated agent.
    pub public_key: Option<CurveKey>,
}

type Connecting = Shared<LocalBoxFuture<'static, Result<MuxPeer, ConnectError>>>;

enum Conn {
    Connecting(Connecting),
    Ready(MuxPeer),
}

struct Entry {
    conn: Conn,
    /// Distinguishes this entry from a later one for the same agent, so late results of an
    /// evicted entry's calls do not touch its successor.
    generation: u64,
    healthy: bool,
    failure_count: u32,
    unhealthy_since: Option<Instant>,
    probing: bool,
}

/// The pool actor. Start it with [`AgentPool::new`] + `Actor::start`.
pub struct AgentPool {
    spec: PoolSpec,
    zmq: SizedContext,
    /// Made when the actor starts (its I/O task needs the actor's runtime).
    mux: Option<Mux>,
    keypair: Option<KeyPair>,
    directory: HashMap<String, AgentEndpoint>,
    /// Agents that keep a persistent peer ([`Connect`]): one whose handshake failed or whose
    /// entry was evicted is connected again at the next sweep.
    persistent: HashSet<String>,
    entries: HashMap<String, Entry>,
    next_generation: u64,
    /// Wall time and size of the newest finished health-check sweep.
    last_sweep: Option<(Duration, usize)>,
}

impl AgentPool {
    /// A pool with `spec`; `keypair` is the manager's CURVE key pair, needed for agents that
    /// have a public key.
    ///
    /// Errors: the ZeroMQ context refuses the I/O thread count.
    pub fn new(spec: PoolSpec, keypair: Option<KeyPair>) -> Result<Self, zmq::Error> {
        // One ROUTER for every agent: the context needs few sockets, and `io-threads`.
        let zmq = SizedContext::new(64, i32::from(spec.io_threads.max(1)))?;
        Ok(AgentPool {
            spec,
            zmq,
            mux: None,
            keypair,
            directory: HashMap::new(),
            persistent: HashSet::new(),
            entries: HashMap::new(),
            next_generation: 0,
            last_sweep: None,
        })
    }

    fn unavailable(agent_id: &str, reason: impl Into<String>) -> AgentConnectionUnavailable {
        AgentConnectionUnavailable {
            agent_id: agent_id.to_owned(),
            reason: reason.into(),
        }
    }

    /// Returns the entry's connection, ready or being made (creating the entry on first use) and its generation.
    fn acquire(
        &mut self,
        agent_id: &str,
        ctx: &mut Context<Self>,
    ) -> Result<(Conn, u64), AgentConnectionUnavailable> {
        if let Some(e) = self.entries.get(agent_id) {
            if !e.healthy {
                return Err(Self::unavailable(agent_id, "connection unhealthy"));
            }
            let conn = match &e.conn {
                Conn::Ready(p) => Conn::Ready(p.clone()),
                Conn::Connecting(c) => Conn::Connecting(c.clone()),
            };
            return Ok((conn, e.generation));
        }
        let endpoint = self
            .directory
            .get(agent_id)
            .ok_or_else(|| Self::unavailable(agent_id, "unknown agent"))?;
        let curve = match (&endpoint.public_key, &self.keypair) {
            (Some(server_key), Some(keypair)) => Some(ClientCurve {
                keypair: keypair.clone(),
                server_key: *server_key,
            }),
            (Some(_), None) => {
                return Err(Self::unavailable(
                    agent_id,
                    "agent requires CURVE but the manager has no key pair",
                ))
            }
            (None, _) => None,
        };
        let opts = PeerOptions {
            endpoint: endpoint.addr.clone(),
            curve,
            keepalive: Some(self.spec.keepalive),
            handshake_timeout: self.spec.handshake_timeout,
        };
        let Some(mux) = self.mux.clone() else {
            return Err(Self::unavailable(
                agent_id,
                "the pool's connection mux is not running",
            ));
        };
        let connecting: Connecting =
            FutureExt::shared(FutureExt::boxed_local(
                async move { mux.connect(&opts).await },
            ));
        self.next_generation += 1;
        let generation = self.next_generation;
        self.entries.insert(
            agent_id.to_owned(),
            Entry {
                conn: Conn::Connecting(connecting.clone()),
                generation,
                healthy: true,
                failure_count: 0,
                unhealthy_since: None,
                probing: false,
            },
        );
        let id = agent_id.to_owned();
        ctx.spawn(connecting.clone().into_actor(self).map(move |res, act, _| {
            let current = act.entries.get(&id).map(|e| e.generation) == Some(generation);
            match res {
                Ok(peer) if current => {
                    tracing::debug!(agent_id = %id, "agent connection established");
                    act.entries.get_mut(&id).expect("current entry").conn = Conn::Ready(peer);
                }
                Ok(peer) => peer.close(),
                Err(e) => {
                    tracing::warn!(agent_id = %id, error = %e, "agent connection failed");
                    if current {
                        act.entries.remove(&id);
                    }
                }
            }
        }));
        Ok((Conn::Connecting(connecting), generation))
    }

    fn record(&mut self, agent_id: &str, generation: u64, connection_error: bool) {
        let threshold = self.spec.failure_threshold;
        let Some(e) = self
            .entries
            .get_mut(agent_id)
            .filter(|e| e.generation == generation)
        else {
            return;
        };
        if connection_error {
            e.failure_count += 1;
            if e.failure_count >= threshold && e.healthy {
                tracing::warn!(
                    agent_id,
                    failures = e.failure_count,
                    "agent connection marked unhealthy"
                );
                e.healthy = false;
                e.unhealthy_since.get_or_insert_with(Instant::now);
            }
        } else {
            e.failure_count = 0;
            e.healthy = true;
            e.unhealthy_since = None;
        }
    }

    fn evict(&mut self, agent_id: &str) {
        if let Some(e) = self.entries.remove(agent_id) {
            if let Conn::Ready(peer) = e.conn {
                peer.close();
            }
        }
    }

    /// Connects again every persistent agent that has no entry (its handshake failed, or its
    /// entry was evicted): once per sweep, so an agent that is down costs one handshake attempt
    /// per `health_check_interval`.
    fn reconnect_persistent(&mut self, ctx: &mut Context<Self>) {
        let missing: Vec<String> = self
            .persistent
            .iter()
            .filter(|id| !self.entries.contains_key(*id) && self.directory.contains_key(*id))
            .cloned()
            .collect();
        if !missing.is_empty() {
            tracing::debug!(
                agents = missing.len(),
                "reconnecting persistent agent peers"
            );
        }
        for id in missing {
            let _ = self.acquire(&id, ctx);
        }
    }

    /// Pings every ready entry once, at most `health_check_concurrency` at a time, starting
    /// them evenly over `spread` (zero: as fast as the bound allows); resolves when every ping
    /// has answered or timed out.
    fn sweep(&mut self, spread: Duration) -> impl ActorFuture<Self, Output = SweepReport> {
        let timeout = self.spec.ping_timeout;
        let concurrency = self.spec.health_check_concurrency.max(1) as usize;
        let started = Instant::now();
        let mut probes = Vec::new();
        for (id, e) in self.entries.iter_mut() {
            if let (Conn::Ready(peer), false) = (&e.conn, e.probing) {
                e.probing = true;
                let (id, peer, generation) = (id.clone(), peer.clone(), e.generation);
                probes.push(async move {
                    let ping = Call {
                        args: vec![Value::from("health-check")],
                        kwargs: vec![],
                        peer_user_id: None,
                    };
                    let res = peer.call("ping", &ping, timeout).await;
                    // Any answer from the server, even a FAILURE, proves the connection works.
                    (
                        id,
                        generation,
                        res.err().filter(|e| e.is_connection_error()),
                    )
                });
            }
        }
        let gap = spread / u32::try_from(probes.len().max(1)).unwrap_or(u32::MAX);
        let paced = probes
            .into_iter()
            .enumerate()
            .map(move |(i, probe)| async move {
                if !gap.is_zero() {
                    tokio::time::sleep_until((started + gap * i as u32).into()).await;
                }
                probe.await
            });
        let all = futures::StreamExt::collect::<Vec<_>>(futures::StreamExt::buffer_unordered(
            futures::stream::iter(paced),
            concurrency,
        ));
        all.into_actor(self).map(move |results, act, _| {
            let mut report = SweepReport::default();
            let now = Instant::now();
            for (id, generation, err) in results {
                let recovery = act.spec.recovery_timeout;
                let Some(e) = act.entries.get_mut(&id).filter(|e| e.generation == generation) else { continue };
                e.probing = false;
                report.pinged += 1;
                match err {
                    None => {
                        if !e.healthy {
                            tracing::info!(agent_id = %id, "agent connection recovered");
                        }
                        e.healthy = true;
                        e.failure_count = 0;
                        e.unhealthy_since = None;
                        report.healthy += 1;
                    }
                    Some(err) => {
                        tracing::debug!(agent_id = %id, error = %err, "health check failed");
                        e.healthy = false;
                        let since = *e.unhealthy_since.get_or_insert(now);
                        if now.duration_since(since) > recovery {
                            tracing::info!(agent_id = %id, ?recovery, "evicting unrecoverable agent connection");
                            act.evict(&id);
                            report.evicted += 1;
                        }
                    }
                }
            }
            act.last_sweep = Some((started.elapsed(), report.pinged));
            report
        })
    }
}

impl Actor for AgentPool {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        match Mux::start(&self.zmq) {
            Ok(mux) => self.mux = Some(mux),
            Err(e) => {
                tracing::error!(error = %e, "the agent pool could not make its ROUTER; every agent call will fail")
            }
        }
        let interval = self.spec.health_check_interval;
        let spread = self
            .spec
            .health_check_spread
            .unwrap_or(interval / 2)
            .min(interval);
        ctx.run_interval(self.spec.health_check_interval, move |act, ctx| {
            act.reconnect_persistent(ctx);
            ctx.spawn(act.sweep(spread).map(|_, _, _| ()));
        });
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        let ids: Vec<String> = self.entries.keys().cloned().collect();
        ids.iter().for_each(|id| self.evict(id));
    }
}

/// Adds or updates an agent's endpoint. A changed endpoint closes the old connection.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct RegisterAgent {
    /// The agent's id.
    pub agent_id: String,
    /// Where it listens.
    pub endpoint: AgentEndpoint,
}

impl Handler<RegisterAgent> for AgentPool {
    type Result = ();
    fn handle(&mut self, msg: RegisterAgent, _: &mut Context<Self>) {
        if self.directory.get(&msg.agent_id) != Some(&msg.endpoint) {
            self.evict(&msg.agent_id);
        }
        self.directory.insert(msg.agent_id, msg.endpoint);
    }
}

/// Calls `method(*args, **kwargs)` on an agent and waits up to `timeout` for its value.
///
/// Errors: [`AgentCallError::Unavailable`] without sending (unknown agent, unhealthy entry,
/// failed handshake); [`AgentCallError::Call`] after sending.
#[derive(Message, Debug, Clone)]
#[rtype(result = "Result<Value, AgentCallError>")]
pub struct AgentCall {
    /// The agent to call.
    pub agent_id: String,
    /// callosum method name, e.g. `ping`, `gather_hwinfo`.
    pub method: String,
    /// Positional arguments.
    pub args: Vec<Value>,
    /// Keyword arguments.
    pub kwargs: Vec<(String, Value)>,
    /// Reply deadline; on expiry a CANCEL is sent and the call counts as a connection error.
    pub timeout: Duration,
}

impl AgentCall {
    /// A call with positional arguments only.
    pub fn new(
        agent_id: impl Into<String>,
        method: impl Into<String>,
        args: Vec<Value>,
        timeout: Duration,
    ) -> Self {
        AgentCall {
            agent_id: agent_id.into(),
            method: method.into(),
            args,
            kwargs: Vec::new(),
            timeout,
        }
    }
}

impl Handler<AgentCall> for AgentPool {
    type Result = ResponseActFuture<Self, Result<Value, AgentCallError>>;

    fn handle(&mut self, msg: AgentCall, ctx: &mut Context<Self>) -> Self::Result {
        let (conn, generation) = match self.acquire(&msg.agent_id, ctx) {
            Ok(found) => found,
            Err(e) => return Box::pin(fut::ready(Err(e.into()))),
        };
        let AgentCall {
            agent_id,
            method,
            args,
            kwargs,
            timeout,
        } = msg;
        let id = agent_id.clone();
        let call = async move {
            let peer = match conn {
                Conn::Ready(peer) => peer,
                Conn::Connecting(c) => c.await.map_err(|e| {
                    AgentCallError::Unavailable(Self::unavailable(&agent_id, e.to_string()))
                })?,
            };
            let call = Call {
                args,
                kwargs,
                peer_user_id: None,
            };
            peer.call(&method, &call, timeout)
                .await
                .map_err(|source| AgentCallError::Call { agent_id, source })
        };
        Box::pin(call.into_actor(self).map(move |res, act, _| {
            match &res {
                Ok(_) => act.record(&id, generation, false),
                Err(AgentCallError::Call { source, .. }) => {
                    act.record(&id, generation, source.is_connection_error())
                }
                // The handshake's own outcome is handled where the entry is created.
                Err(AgentCallError::Unavailable(_)) => {}
            }
            res
        }))
    }
}

/// Marks an agent's entry unhealthy now (e.g. its heartbeats stopped); the health check heals
/// or evicts it. No-op without an entry.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Invalidate {
    /// The agent.
    pub agent_id: String,
}

impl Handler<Invalidate> for AgentPool {
    type Result = ();
    fn handle(&mut self, msg: Invalidate, _: &mut Context<Self>) {
        if let Some(e) = self.entries.get_mut(&msg.agent_id) {
            e.healthy = false;
            e.unhealthy_since.get_or_insert_with(Instant::now);
        }
    }
}

/// A snapshot of one entry, for tests, metrics and the CLI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryState {
    /// Whether the handshake finished.
    pub connected: bool,
    /// Whether calls are accepted.
    pub healthy: bool,
    /// Consecutive connection errors.
    pub failure_count: u32,
}

/// Reads an agent's entry; `None` when there is none (never used, or evicted).
#[derive(Message, Debug, Clone)]
#[rtype(result = "Option<EntryState>")]
pub struct InspectEntry {
    /// The agent.
    pub agent_id: String,
}

impl Handler<InspectEntry> for AgentPool {
    type Result = Option<EntryState>;
    fn handle(&mut self, msg: InspectEntry, _: &mut Context<Self>) -> Self::Result {
        self.entries.get(&msg.agent_id).map(|e| EntryState {
            connected: matches!(e.conn, Conn::Ready(_)),
            healthy: e.healthy,
            failure_count: e.failure_count,
        })
    }
}

/// What one health-check sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Entries pinged.
    pub pinged: usize,
    /// Entries that answered.
    pub healthy: usize,
    /// Entries evicted for exceeding the recovery timeout.
    pub evicted: usize,
}

/// Runs a health-check sweep now, unpaced (bounded concurrency only), resolving when it is
/// done (the periodic sweep runs regardless).
#[derive(Message, Debug, Clone)]
#[rtype(result = "SweepReport")]
pub struct SweepNow;

impl Handler<SweepNow> for AgentPool {
    type Result = ResponseActFuture<Self, SweepReport>;
    fn handle(&mut self, _: SweepNow, ctx: &mut Context<Self>) -> Self::Result {
        self.reconnect_persistent(ctx);
        Box::pin(self.sweep(Duration::ZERO))
    }
}

/// Closes every connection (100 ms linger each) and stops the pool.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct ClosePool;

impl Handler<ClosePool> for AgentPool {
    type Result = ();
    fn handle(&mut self, _: ClosePool, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// Opens an agent's connection now if it has none (the registry sends it when it learns an
/// agent's endpoint), so every known agent has its persistent peer and health checks from its
/// first heartbeat, not from its first call; kept from then on (reconnected at each sweep while it
/// has no entry). No-op for an unknown agent.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Connect {
    /// The agent.
    pub agent_id: String,
}

impl Handler<Connect> for AgentPool {
    type Result = ();
    fn handle(&mut self, msg: Connect, ctx: &mut Context<Self>) {
        if !self.directory.contains_key(&msg.agent_id) {
            return;
        }
        self.persistent.insert(msg.agent_id.clone());
        if !self.entries.contains_key(&msg.agent_id) {
            // A failed handshake removes the entry again (logged); the next sweep or call retries.
            let _ = self.acquire(&msg.agent_id, ctx);
        }
    }
}

/// Closes an agent's entry now so that the next call reconnects from scratch (the agent's
/// endpoint stays known). The registry sends it when a lost agent comes back: its old
/// connection was invalidated and must not wait for the health check to heal.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub struct Reconnect {
    /// The agent.
    pub agent_id: String,
}

impl Handler<Reconnect> for AgentPool {
    type Result = ();
    fn handle(&mut self, msg: Reconnect, _: &mut Context<Self>) {
        self.evict(&msg.agent_id);
    }
}

/// Entry counts, for the manager's `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Agents with a known endpoint.
    pub known: usize,
    /// Entries whose handshake is still running.
    pub connecting: usize,
    /// Ready entries accepting calls.
    pub healthy: usize,
    /// Entries refusing calls until a health check heals them (or eviction).
    pub unhealthy: usize,
    /// Wall time of the newest finished health-check sweep and how many entries it pinged.
    pub last_sweep: Option<(Duration, usize)>,
}

/// Reads [`PoolStats`].
#[derive(Message, Debug, Clone)]
#[rtype(result = "PoolStats")]
pub struct GetPoolStats;

impl Handler<GetPoolStats> for AgentPool {
    type Result = MessageResult<GetPoolStats>;
    fn handle(&mut self, _: GetPoolStats, _: &mut Context<Self>) -> Self::Result {
        let mut s = PoolStats {
            known: self.directory.len(),
            last_sweep: self.last_sweep,
            ..PoolStats::default()
        };
        for e in self.entries.values() {
            match (&e.conn, e.healthy) {
                (_, false) => s.unhealthy += 1,
                (Conn::Connecting(_), true) => s.connecting += 1,
                (Conn::Ready(_), true) => s.healthy += 1,
            }
        }
        MessageResult(s)
    }
}

//! `RpcServer`: the agent's callosum-compatible ROUTER endpoint, as an actor.
//!
//! One I/O loop owns the socket; every FUNCTION that awaits runs in its own task, so a slow
//! handler never delays a `ping`, and its reply comes back to the loop through a channel; one
//! that finishes without waiting is answered inline. CANCEL aborts the running
//! handler and answers CANCELLED. Frames that are not callosum messages are dropped and counted;
//! a message whose header decodes but whose body does not gets an ERROR reply. Nothing a peer
//! sends stops the loop. With CURVE, every call carries the ZAP user id its connection was
//! admitted under (`Call::peer_user_id`), so handlers can tell who is calling.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use actix::prelude::*;
use futures::future::AbortHandle;
use futures::{FutureExt, StreamExt};
use tmq::{AsZmqSocket, FromZmqSocket, Multipart};
use tokio::sync::mpsc;

use super::codec::{self, Call, CodecError, ErrorMeta, Frames, Message, MsgType, OrderKey};
use super::curve::{CurveKey, KeyPair};
use super::dispatch::{Dispatcher, HandlerResult};
use super::failure::Failure;
use super::socket;
use super::zap::ZapHandler;

/// CURVE settings of the server: its key pair and the client keys it admits, each with the
/// user id ZAP reports (`manager` for the manager's key).
#[derive(Clone, Debug)]
pub struct ServerCurve {
    /// The agent's key pair (`rpc-auth-agent-keypair`).
    pub keypair: KeyPair,
    /// Admitted client public keys (`rpc-auth-manager-public-key`) with their user ids.
    pub allowed_clients: Vec<(CurveKey, String)>,
    /// Where to look again when an unknown key connects (at most once a second), e.g. the
    /// manager's `agent-keys-dir`: a new agent's key file is admitted without a restart.
    pub reload: Option<super::zap::KeyReload>,
}

/// Counters of the RPC endpoint, shared with whoever reports them (metrics, tests).
#[derive(Debug, Default)]
pub struct ServerStats {
    /// FUNCTION messages received.
    pub requests: AtomicU64,
    /// Replies of type FAILURE sent (handler errors, unknown methods).
    pub failures: AtomicU64,
    /// Replies of type ERROR sent (undecodable bodies, unsupported extensions, handler panics).
    pub errors: AtomicU64,
    /// Handlers cancelled by a CANCEL.
    pub cancelled: AtomicU64,
    /// Frame sets dropped because they were not callosum messages.
    pub malformed_frames: AtomicU64,
}

impl ServerStats {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum RpcServerError {
    /// Binding the ROUTER (or the ZAP endpoint) failed, e.g. the address is in use.
    #[error("cannot bind RPC endpoint {endpoint}: {source}")]
    Bind {
        /// The `tcp://host:port` endpoint.
        endpoint: String,
        /// libzmq's error.
        source: zmq::Error,
    },
}

/// The agent's RPC server actor. Stop it (or drop its address) to close the socket.
pub struct RpcServer {
    socket: Option<zmq::Socket>,
    endpoint: String,
    dispatcher: Arc<Dispatcher>,
    stats: Arc<ServerStats>,
    // Keeps the ZAP thread alive as long as the server; dropped after the socket.
    _zap: Option<ZapHandler>,
    /// Requests whose handlers await, at most (see [`RpcServer::max_in_flight`]).
    max_in_flight: usize,
}

impl RpcServer {
    /// Binds a ROUTER at `endpoint` (`tcp://host:port`; port 0 picks a free one). With `curve`,
    /// starts a ZAP handler admitting only the allowed client keys; without, the endpoint is
    /// unauthenticated and a warning is logged.
    pub fn bind(
        endpoint: &str,
        curve: Option<ServerCurve>,
        dispatcher: Dispatcher,
    ) -> Result<Self, RpcServerError> {
        let bind_err = |source| RpcServerError::Bind {
            endpoint: endpoint.to_owned(),
            source,
        };
        // One context per server: ZAP's inproc endpoint is per context.
        let ctx = zmq::Context::new();
        let zap = match &curve {
            Some(c) => Some(
                ZapHandler::start(&ctx, c.allowed_clients.clone(), c.reload.clone())
                    .map_err(bind_err)?,
            ),
            None => {
                tracing::warn!(
                    endpoint,
                    "RPC endpoint is UNAUTHENTICATED: no CURVE keys configured"
                );
                None
            }
        };
        let sock =
            socket::router(&ctx, endpoint, curve.as_ref().map(|c| &c.keypair)).map_err(bind_err)?;
        let bound = sock
            .get_last_endpoint()
            .map_err(bind_err)?
            .unwrap_or_else(|_| endpoint.to_owned());
        tracing::info!(endpoint = %bound, curve = curve.is_some(), methods = ?dispatcher.methods(), "RPC server bound");
        Ok(RpcServer {
            socket: Some(sock),
            endpoint: bound,
            dispatcher: Arc::new(dispatcher),
            stats: Arc::default(),
            _zap: zap,
            max_in_flight: usize::MAX,
        })
    }

    /// Binds an unauthenticated ROUTER at `endpoint` in `ctx`, a context shared with other
    /// servers (one context's I/O thread for many endpoints: a host of simulated agents in a
    /// bench; a server with CURVE needs a context of its own for ZAP, see [`RpcServer::bind`]).
    ///
    /// Errors: the address is in use or invalid; the context's socket limit is reached.
    pub fn bind_in(
        ctx: &impl super::context::SocketSource,
        endpoint: &str,
        dispatcher: Dispatcher,
    ) -> Result<Self, RpcServerError> {
        let bind_err = |source| RpcServerError::Bind {
            endpoint: endpoint.to_owned(),
            source,
        };
        let sock = socket::router(ctx, endpoint, None).map_err(bind_err)?;
        let bound = sock
            .get_last_endpoint()
            .map_err(bind_err)?
            .unwrap_or_else(|_| endpoint.to_owned());
        Ok(RpcServer {
            socket: Some(sock),
            endpoint: bound,
            dispatcher: Arc::new(dispatcher),
            stats: Arc::default(),
            _zap: None,
            max_in_flight: usize::MAX,
        })
    }

    /// Handles at most `n` (≥ 1) awaiting requests at once; with `n` running the server stops
    /// reading its socket until one is answered, so callers queue in ZeroMQ (bounded by its
    /// high-water marks) rather than in this process's memory. Requests answered without
    /// awaiting (`ping`) never count. Unbounded by default.
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n.max(1);
        self
    }

    /// The bound endpoint, `tcp://host:port` with the real port.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The server's counters.
    pub fn stats(&self) -> Arc<ServerStats> {
        self.stats.clone()
    }
}

impl Actor for RpcServer {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        let sock = self.socket.take().expect("RpcServer started twice");
        match tmq::router::Router::from_zmq_socket(sock) {
            Ok(router) => {
                let io = serve(
                    router,
                    self.dispatcher.clone(),
                    self.stats.clone(),
                    self.max_in_flight,
                );
                // Spawned in the actor's context: stopping the actor drops the loop and the socket.
                ctx.spawn(io.into_actor(self).map(|_, _, ctx| ctx.stop()));
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot register the RPC socket with the runtime");
                ctx.stop();
            }
        }
    }
}

/// Asks the server to stop; in-flight handlers are aborted.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

impl Handler<Shutdown> for RpcServer {
    type Result = ();
    fn handle(&mut self, _: Shutdown, ctx: &mut Context<Self>) {
        ctx.stop();
    }
}

/// libzmq's message property holding the ZAP user id of the connection (`zmq_msg_gets`).
const USER_ID: &str = "User-Id";

/// Identifies a running request: callosum's `(peer, (meth, okey, seq))`.
type RequestKey = (Vec<u8>, String, OrderKey, u32);

/// A reply of a handler that awaited, sent back to the loop that owns the socket; it carries its
/// request's key so a reply to a cancelled request is dropped.
struct Outgoing {
    key: RequestKey,
    frames: Vec<Vec<u8>>,
}

/// Running handlers; aborts whatever is left when the loop ends.
#[derive(Default)]
struct Running(HashMap<RequestKey, AbortHandle>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.values().for_each(AbortHandle::abort);
    }
}

fn reply_frames(peer: &[u8], msg: &Message) -> Vec<Vec<u8>> {
    let (h, b) = codec::encode_message(msg);
    vec![peer.to_vec(), codec::UPPER.to_vec(), h, b]
}

/// Sends a reply now. A ROUTER never waits: libzmq drops what it cannot route (the peer left, or
/// its queue is at the high-water mark), as callosum's server does.
fn send(sock: &zmq::Socket, frames: &[Vec<u8>]) {
    if let Err(e) = socket::try_send(sock, frames) {
        tracing::warn!(error = %e, "RPC socket send error");
    }
}

/// What the server's loop keeps besides its socket.
struct Serving {
    dispatcher: Arc<Dispatcher>,
    stats: Arc<ServerStats>,
    /// Where awaiting handlers send their replies.
    tx: mpsc::UnboundedSender<Outgoing>,
    running: Running,
}

async fn serve(
    mut router: tmq::router::Router,
    dispatcher: Arc<Dispatcher>,
    stats: Arc<ServerStats>,
    max_in_flight: usize,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
    let mut serving = Serving {
        dispatcher,
        stats,
        tx,
        running: Running::default(),
    };
    loop {
        tokio::select! {
            // At the limit only replies are taken: backpressure into the callers' queues.
            incoming = router.next(), if serving.running.0.len() < max_in_flight => match incoming {
                Some(Ok(frames)) => serving.on_frames(router.get_socket(), frames),
                Some(Err(e)) => tracing::warn!(error = %e, "RPC socket receive error"),
                None => break,
            },
            Some(out) = rx.recv() => {
                // A reply to a request cancelled meanwhile is dropped: CANCELLED was already sent.
                if serving.running.0.remove(&out.key).is_some() {
                    send(router.get_socket(), &out.frames);
                }
            }
        }
    }
    tracing::info!("RPC server loop ended");
}

impl Serving {
    fn on_frames(&mut self, sock: &zmq::Socket, mut frames: Multipart) {
        // The ZAP user id is metadata of the frames the peer sent; libzmq 4.3 does not copy it
        // onto the routing id frame the ROUTER prepends, so it is read from the second frame.
        // None without CURVE.
        let user_id = frames
            .0
            .get_mut(1)
            .and_then(|m| m.gets(USER_ID))
            .map(str::to_owned);
        let parts: Vec<&[u8]> = frames.iter().map(|m| &m[..]).collect();
        let Some((peer, rest)) = parts.split_first() else {
            return;
        };
        match codec::classify(rest) {
            Ok(Frames::Ping(h, b)) => send(
                sock,
                &[peer.to_vec(), codec::PONG.to_vec(), h.to_vec(), b.to_vec()],
            ),
            Ok(Frames::Upper(h, b)) => self.on_message(sock, peer, user_id, h, b),
            Ok(Frames::Pong) => {
                ServerStats::bump(&self.stats.malformed_frames);
                tracing::debug!("dropped an unexpected PONG");
            }
            Err(e) => {
                ServerStats::bump(&self.stats.malformed_frames);
                tracing::debug!(reason = %e, "dropped malformed frames");
            }
        }
    }

    fn on_message(
        &mut self,
        sock: &zmq::Socket,
        peer: &[u8],
        user_id: Option<String>,
        header: &[u8],
        body: &[u8],
    ) {
        let Serving {
            dispatcher,
            stats,
            tx,
            running,
        } = self;
        let reply = |msg: &Message| send(sock, &reply_frames(peer, msg));
        let header = match codec::decode_header(header) {
            Ok(h) => h,
            Err(e) => {
                // Without a header there is no (meth, okey, seq) to reply to.
                ServerStats::bump(&stats.malformed_frames);
                tracing::debug!(error = %e, "dropped message with undecodable header");
                return;
            }
        };
        let reply_error = |e: String| {
            ServerStats::bump(&stats.errors);
            tracing::debug!(method = %header.method, error = %e, "RPC ERROR reply");
            reply(&Message::error(
                &header,
                ErrorMeta::new("RPCInternalError", e),
            ));
        };
        let msg = match codec::decode_body(&header, body) {
            Ok(m) => m,
            Err(CodecError::Body(e)) | Err(CodecError::Header(e)) | Err(CodecError::Frames(e)) => {
                return reply_error(e)
            }
        };
        let key: RequestKey = (
            peer.to_vec(),
            header.method.clone(),
            header.okey.clone(),
            header.seq,
        );
        match header.msg_type {
            MsgType::Function => {
                ServerStats::bump(&stats.requests);
                let call = match Call::decode_payload(msg.payload.as_deref().unwrap_or_default()) {
                    Ok(c) => Call {
                        peer_user_id: user_id,
                        ..c
                    },
                    // A value the call carries that we refuse to read (a pickle naming a class
                    // outside the allow-list, an unknown ext type) is the caller's error:
                    // FAILURE with its name (`PickleRefused`, `UnsupportedExtType`, …).
                    Err(e @ crate::rpc::codec::PayloadError::Ext(_)) => {
                        ServerStats::bump(&stats.failures);
                        return reply(&Message::failure(&header, e.to_meta()));
                    }
                    Err(e) => return reply_error(format!("bad call payload: {e}")),
                };
                let (handler, call) = match dispatcher.resolve(&header.method, call) {
                    Ok(found) => found,
                    Err(failure) => {
                        ServerStats::bump(&stats.failures);
                        return reply(&Message::failure(&header, failure));
                    }
                };
                // Most handlers (ping, health) finish without waiting: answer those inline, on the
                // socket, and spawn a task only for the ones that await.
                let mut work = AssertUnwindSafe(handler(call)).catch_unwind().boxed_local();
                if let Some(outcome) = (&mut work).now_or_never() {
                    return reply(&reply_for(&header, outcome, stats));
                }
                let (tx, stats, peer, key2) =
                    (tx.clone(), stats.clone(), peer.to_vec(), key.clone());
                let task = async move {
                    let reply = reply_for(&header, work.await, &stats);
                    let _ = tx.send(Outgoing {
                        key: key2,
                        frames: reply_frames(&peer, &reply),
                    });
                };
                let (task, abort) = futures::future::abortable(task);
                running.0.insert(key, abort);
                actix_rt::spawn(task);
            }
            MsgType::Cancel => {
                // As callosum: a CANCEL for nothing running is ignored.
                if let Some(abort) = running.0.remove(&key) {
                    abort.abort();
                    ServerStats::bump(&stats.cancelled);
                    reply(&Message::cancelled(&header));
                }
            }
            other => {
                ServerStats::bump(&stats.malformed_frames);
                tracing::debug!(?other, "dropped a message type a server does not accept");
            }
        }
    }
}

/// Turns a handler's outcome (value, failure, or panic) into the reply message.
fn reply_for(
    header: &codec::Header,
    outcome: std::thread::Result<HandlerResult>,
    stats: &ServerStats,
) -> Message {
    match outcome {
        Ok(Ok(value)) => Message::result(header, codec::to_msgpack(&value)),
        Ok(Err(failure)) => {
            ServerStats::bump(&stats.failures);
            Message::failure(header, failure)
        }
        Err(panic) => {
            ServerStats::bump(&stats.errors);
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            tracing::error!(method = %header.method, panic = %what, "RPC handler panicked");
            Message::error(
                header,
                ErrorMeta::failure(
                    Failure::HandlerPanicked,
                    format!("handler of '{}' panicked: {what}", header.method),
                ),
            )
        }
    }
}

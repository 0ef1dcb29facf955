//! `Peer`: one persistent DEALER connection to a callosum server, shared by any number of callers.
//!
//! Seed 000's finding, in Rust: a callosum peer can be shared because replies are matched by
//! request id `(meth, okey, seq)`. One I/O task owns the socket; callers hand it encoded frames
//! with a fresh `seq` and a oneshot, and the task routes each reply to its caller. A caller that
//! times out sends CANCEL, as callosum's `invoke` does, so the server stops the handler.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rmpv::Value;
use tmq::FromZmqSocket;
use tokio::sync::{mpsc, oneshot};

use super::codec::{self, Call, ErrorMeta, Frames, Header, Message, MsgType, OrderKey};
use super::socket::{self, ClientCurve, Keepalive};

/// How to reach one server.
#[derive(Clone, Debug)]
pub struct PeerOptions {
    /// `tcp://host:port`.
    pub endpoint: String,
    /// CURVE client keys; `None` for an unauthenticated server.
    pub curve: Option<ClientCurve>,
    /// TCP keepalive; `None` leaves the OS default.
    pub keepalive: Option<Keepalive>,
    /// How long to wait for the PONG of the handshake (callosum: 5 s).
    pub handshake_timeout: Duration,
}

/// Why a call did not return a value.
#[derive(Debug, Clone, thiserror::Error)]
pub enum CallError {
    /// No reply within the caller's timeout (a CANCEL was sent). A connection-class error.
    #[error("'{method}' timed out after {after:?}")]
    Timeout {
        /// The method called.
        method: String,
        /// The timeout that elapsed.
        after: Duration,
    },
    /// The connection is closed or its I/O failed. A connection-class error.
    #[error("connection lost: {0}")]
    Disconnected(String),
    /// The handler failed (callosum FAILURE): a business error, the connection is fine.
    #[error("remote failure {0}")]
    Failure(ErrorMeta),
    /// The remote RPC layer failed (callosum ERROR), e.g. it could not decode our call.
    #[error("remote RPC error {0}")]
    Remote(ErrorMeta),
    /// The server cancelled the handler.
    #[error("cancelled by the server")]
    Cancelled,
    /// The reply's payload is not msgpack.
    #[error("undecodable reply: {0}")]
    BadReply(String),
}

impl CallError {
    /// Whether this error says the connection is bad (timeouts, I/O), as opposed to an answer
    /// from a working server. Only these count toward a pool entry's failure threshold (`docs/design.md`, agent pool).
    pub fn is_connection_error(&self) -> bool {
        matches!(self, CallError::Timeout { .. } | CallError::Disconnected(_))
    }
}

/// Why a connection could not be opened.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnectError {
    /// The socket could not be made (bad endpoint, bad keys).
    #[error("socket setup failed: {0}")]
    Socket(String),
    /// No PONG in time: the server is down, unreachable, or refused our CURVE key.
    #[error("no handshake answer from {endpoint} within {after:?} (server down, unreachable, or our CURVE key was refused)")]
    Handshake {
        /// The endpoint tried.
        endpoint: String,
        /// The handshake timeout.
        after: Duration,
    },
}

enum Command {
    /// Send a FUNCTION; route the reply matching `(method, seq)` to `reply`.
    Send {
        frames: Vec<Vec<u8>>,
        method: String,
        seq: u32,
        reply: oneshot::Sender<Message>,
    },
    /// The caller gave up on `seq`: forget it and send these CANCEL frames.
    Cancel { seq: u32, frames: Vec<Vec<u8>> },
    /// Send a PING; resolve `reply` on the PONG.
    Ping { reply: oneshot::Sender<()> },
    /// Close the socket; pending callers see their reply channel drop.
    Close,
}

/// A handle on one persistent connection. Clones share the connection; the connection closes
/// (with callosum's 100 ms linger) when the last handle is dropped or [`Peer::close`] is called.
#[derive(Clone)]
pub struct Peer {
    commands: mpsc::UnboundedSender<Command>,
    seq: Arc<AtomicU32>,
    endpoint: Arc<str>,
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl Peer {
    /// Connects a DEALER and performs callosum's handshake (PING → PONG). Must run inside an
    /// actix/tokio `LocalSet` runtime: the I/O task is spawned locally.
    pub async fn connect(
        ctx: &impl super::context::SocketSource,
        opts: &PeerOptions,
    ) -> Result<Peer, ConnectError> {
        let sock = socket::dealer(
            ctx,
            &opts.endpoint,
            opts.curve.as_ref(),
            opts.keepalive,
            None,
        )
        .map_err(|e| ConnectError::Socket(format!("{}: {e}", opts.endpoint)))?;
        let dealer = tmq::dealer::Dealer::from_zmq_socket(sock)
            .map_err(|e| ConnectError::Socket(e.to_string()))?;
        let (commands, rx) = mpsc::unbounded_channel();
        actix_rt::spawn(io_loop(dealer, rx));
        let peer = Peer {
            commands,
            seq: Arc::new(AtomicU32::new(0)),
            endpoint: opts.endpoint.as_str().into(),
        };
        let handshake_failed = ConnectError::Handshake {
            endpoint: opts.endpoint.clone(),
            after: opts.handshake_timeout,
        };
        match tokio::time::timeout(opts.handshake_timeout, peer.handshake()).await {
            Ok(true) => Ok(peer),
            _ => {
                peer.close();
                Err(handshake_failed)
            }
        }
    }

    async fn handshake(&self) -> bool {
        let (tx, rx) = oneshot::channel();
        self.commands.send(Command::Ping { reply: tx }).is_ok() && rx.await.is_ok()
    }

    /// The endpoint this peer is connected to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Calls `method` with `call` and waits up to `timeout` for the value.
    ///
    /// Errors: [`CallError`]; on timeout a CANCEL is sent to the server.
    pub async fn call(
        &self,
        method: &str,
        call: &Call,
        timeout: Duration,
    ) -> Result<Value, CallError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let (msg, frames) = function_frames(method, seq, call);
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Send {
                frames,
                method: method.to_owned(),
                seq,
                reply: tx,
            })
            .map_err(|_| CallError::Disconnected("connection closed".into()))?;
        let reply = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => {
                return Err(CallError::Disconnected(
                    "connection closed while waiting".into(),
                ))
            }
            Err(_) => {
                let _ = self.commands.send(Command::Cancel {
                    seq,
                    frames: cancel_frames(&msg),
                });
                return Err(CallError::Timeout {
                    method: method.to_owned(),
                    after: timeout,
                });
            }
        };
        reply_value(reply)
    }

    /// Closes the connection now (for every clone); pending callers get [`CallError::Disconnected`].
    pub fn close(&self) {
        let _ = self.commands.send(Command::Close);
    }

    /// Whether the connection's I/O task has ended.
    pub fn is_closed(&self) -> bool {
        self.commands.is_closed()
    }
}

/// The FUNCTION message of a call and its frames (callosum's upper-layer envelope).
/// The returned message is kept only for its header (a CANCEL names it): its payload is left
/// empty, the call written once, straight into the body frame.
pub(super) fn function_frames(method: &str, seq: u32, call: &Call) -> (Message, Vec<Vec<u8>>) {
    let msg = Message::function(method, OrderKey::default(), seq, Vec::new());
    let h = codec::encode_header(&msg.header);
    let b = codec::encode_function_body(call);
    (msg, vec![codec::UPPER.to_vec(), h, b])
}

/// The CANCEL frames for a FUNCTION a caller gave up on.
pub(super) fn cancel_frames(msg: &Message) -> Vec<Vec<u8>> {
    let (h, b) = codec::encode_message(&Message::cancel(&msg.header));
    vec![codec::UPPER.to_vec(), h, b]
}

/// callosum's PING frames (the handshake).
pub(super) fn ping_frames() -> Vec<Vec<u8>> {
    vec![codec::PING.to_vec(), vec![], vec![]]
}

/// A reply message as the call's outcome.
pub(super) fn reply_value(reply: Message) -> Result<Value, CallError> {
    match reply.header.msg_type {
        MsgType::Result => codec::from_msgpack(reply.payload.as_deref().unwrap_or_default())
            .map_err(CallError::BadReply),
        MsgType::Failure => Err(CallError::Failure(
            reply.error.unwrap_or_else(|| ErrorMeta::new("Unknown", "")),
        )),
        MsgType::Error => Err(CallError::Remote(
            reply.error.unwrap_or_else(|| ErrorMeta::new("Unknown", "")),
        )),
        MsgType::Cancelled => Err(CallError::Cancelled),
        other => Err(CallError::BadReply(format!(
            "unexpected reply type {other:?}"
        ))),
    }
}

async fn io_loop(mut dealer: tmq::dealer::Dealer, mut commands: mpsc::UnboundedReceiver<Command>) {
    let mut pending: HashMap<u32, (String, oneshot::Sender<Message>)> = HashMap::new();
    let mut pings: Vec<oneshot::Sender<()>> = Vec::new();
    loop {
        tokio::select! {
            // Commands first: polling tmq's stream costs a `ZMQ_EVENTS` syscall, so it is polled
            // only when no command is ready. Replies cannot starve: callers wait for them, so
            // the commands run out.
            biased;
            cmd = commands.recv() => {
                let Some(cmd) = cmd else { break };
                let frames = match cmd {
                    Command::Send { frames, method, seq, reply } => {
                        pending.insert(seq, (method, reply));
                        frames
                    }
                    Command::Cancel { seq, frames } => {
                        pending.remove(&seq);
                        frames
                    }
                    Command::Ping { reply } => {
                        pings.push(reply);
                        ping_frames()
                    }
                    Command::Close => return,
                };
                if let Err(e) = socket::send_frames(&mut dealer, frames).await {
                    tracing::warn!(error = %e, "RPC client send error");
                }
            }
            incoming = dealer.next() => match incoming {
                Some(Ok(frames)) => {
                    let parts: Vec<&[u8]> = frames.iter().map(|m| &m[..]).collect();
                    on_reply(&parts, &mut pending, &mut pings)
                }
                Some(Err(e)) => tracing::warn!(error = %e, "RPC client receive error"),
                None => break,
            },
        }
    }
}

/// Routes one server message (its callosum frames) to the caller waiting for it: a PONG to
/// every pending handshake, a reply by `seq` (and method) to its call.
pub(super) fn on_reply(
    parts: &[&[u8]],
    pending: &mut HashMap<u32, (String, oneshot::Sender<Message>)>,
    pings: &mut Vec<oneshot::Sender<()>>,
) {
    match codec::classify(parts) {
        Ok(Frames::Pong) => pings.drain(..).for_each(|p| {
            let _ = p.send(());
        }),
        Ok(Frames::Upper(h, b)) => match codec::decode_message(h, b) {
            Ok(msg) => {
                let Header {
                    seq, ref method, ..
                } = msg.header;
                match pending.remove(&seq) {
                    Some((m, reply)) if &m == method => {
                        let _ = reply.send(msg);
                    }
                    Some(entry) => {
                        tracing::debug!(seq, %method, expected = %entry.0, "reply names another method; ignored");
                        pending.insert(seq, entry);
                    }
                    None => tracing::debug!(seq, "reply for an unknown or cancelled request"),
                }
            }
            Err(e) => tracing::debug!(error = %e, "dropped undecodable reply"),
        },
        Ok(Frames::Ping(..)) | Err(_) => tracing::debug!("dropped unexpected frames from server"),
    }
}

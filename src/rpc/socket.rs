//! ZeroMQ socket construction with the options callosum and the agent-pool design (`docs/design.md`) prescribe.
//!
//! Sockets are made with the `zmq` crate (system libzmq, which has CURVE) and handed to `tmq`
//! for async I/O (`docs/wire-protocol.md`). Options that must precede `bind`/`connect` are set here.

use std::time::Duration;

use futures::SinkExt;
use tmq::{AsZmqSocket, Multipart, TmqError};

use super::curve::{CurveKey, KeyPair};

/// callosum's `LINGER` for every socket, in ms: pending frames get 100 ms on close, no more.
pub const LINGER_MS: i32 = 100;

/// TCP keepalive for the manager's persistent DEALERs (`docs/design.md`, agent pool: idle 60 s, interval 20 s, 3 probes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keepalive {
    /// Idle time before the first probe, in seconds.
    pub idle_secs: i32,
    /// Interval between probes, in seconds.
    pub interval_secs: i32,
    /// Unanswered probes before the connection is dropped.
    pub count: i32,
}

impl Default for Keepalive {
    fn default() -> Self {
        Keepalive {
            idle_secs: 60,
            interval_secs: 20,
            count: 3,
        }
    }
}

/// The client side of CURVE: our key pair and the server's public key.
#[derive(Clone, Debug)]
pub struct ClientCurve {
    /// Our (the manager's) key pair.
    pub keypair: KeyPair,
    /// The agent's public key.
    pub server_key: CurveKey,
}

/// Messages a ROUTER queues per peer in each direction before it drops (send) or stops reading
/// (receive). libzmq's default of 1,000 is reachable by one manager that has 1,000 calls in
/// flight to one agent: the 1,001st reply queued for a slow reader is silently dropped and its
/// caller times out. Each queued message answers a call in flight, so the bound still holds
/// memory to what callers are waiting for.
pub const ROUTER_HWM: i32 = 100_000;

/// Makes a ROUTER bound at `endpoint` (`tcp://host:port`). With `curve`, it is a CURVE server
/// in ZAP domain `local` whose clients a [`super::zap::ZapHandler`] in `ctx` must admit.
///
/// Errors: the address is in use or invalid, or libzmq lacks CURVE.
pub fn router(
    ctx: &impl super::context::SocketSource,
    endpoint: &str,
    curve: Option<&KeyPair>,
) -> Result<zmq::Socket, zmq::Error> {
    let sock = ctx.socket(zmq::ROUTER)?;
    sock.set_linger(LINGER_MS)?;
    sock.set_sndhwm(ROUTER_HWM)?;
    sock.set_rcvhwm(ROUTER_HWM)?;
    if let Some(pair) = curve {
        sock.set_zap_domain("local")?;
        sock.set_curve_server(true)?;
        sock.set_curve_secretkey(&pair.secret.0)?;
    }
    sock.bind(endpoint)?;
    Ok(sock)
}

/// Makes a DEALER connected to `endpoint`, with CURVE client keys and TCP keepalive when given.
///
/// The connection itself is made in the background by libzmq; the callosum PING/PONG handshake
/// ([`super::peer::Peer::connect`]) is what proves it works.
pub fn dealer(
    ctx: &impl super::context::SocketSource,
    endpoint: &str,
    curve: Option<&ClientCurve>,
    keepalive: Option<Keepalive>,
    reconnect_ivl: Option<Duration>,
) -> Result<zmq::Socket, zmq::Error> {
    let sock = ctx.socket(zmq::DEALER)?;
    sock.set_linger(LINGER_MS)?;
    if let Some(c) = curve {
        sock.set_zap_domain("local")?;
        sock.set_curve_serverkey(&c.server_key.0)?;
        sock.set_curve_publickey(&c.keypair.public.0)?;
        sock.set_curve_secretkey(&c.keypair.secret.0)?;
    }
    if let Some(k) = keepalive {
        sock.set_tcp_keepalive(1)?;
        sock.set_tcp_keepalive_idle(k.idle_secs)?;
        sock.set_tcp_keepalive_intvl(k.interval_secs)?;
        sock.set_tcp_keepalive_cnt(k.count)?;
    }
    if let Some(ivl) = reconnect_ivl {
        sock.set_reconnect_ivl(ivl.as_millis().min(i32::MAX as u128) as i32)?;
    }
    sock.connect(endpoint)?;
    Ok(sock)
}

/// Sends one multipart message on a tmq socket, without waiting when libzmq can queue it (the
/// usual case), else through tmq's sink, which waits for room (a DEALER at its high-water mark).
///
/// Why not always the sink: it asks libzmq for `ZMQ_EVENTS` twice per message (`poll_ready`,
/// `poll_flush`), two `poll` syscalls each side of every call; a round trip is short enough on
/// loopback for that to show (`just bench rpc`). libzmq queues a multipart message whole or not at
/// all, so an `EAGAIN` here has sent nothing and the retry cannot duplicate a frame.
///
/// Not cancel-safe once it waits: tmq's sink keeps the frames and sends them on its next use, so
/// callers await it to completion (the peer's I/O loop does).
///
/// Errors: libzmq's, e.g. the socket is closed.
pub async fn send_frames<S>(sock: &mut S, frames: Vec<Vec<u8>>) -> Result<(), TmqError>
where
    S: AsZmqSocket + futures::Sink<Multipart, Error = TmqError> + Unpin,
{
    match try_send(sock.get_socket(), &frames) {
        Err(zmq::Error::EAGAIN) => sock.send(Multipart::from(frames)).await,
        other => other.map_err(TmqError::from),
    }
}

/// Sends one multipart message if libzmq can queue it now, else `EAGAIN` (nothing sent). A
/// ROUTER always can: it drops what it cannot route, as callosum's server does.
///
/// Errors: libzmq's, e.g. `EAGAIN` or a closed socket.
pub fn try_send(sock: &zmq::Socket, frames: &[Vec<u8>]) -> Result<(), zmq::Error> {
    sock.send_multipart(frames.iter().map(|f| &f[..]), zmq::DONTWAIT)
}

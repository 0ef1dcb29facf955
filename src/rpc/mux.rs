//! `Mux`: one ROUTER socket connected to many callosum servers, one route per server.
//!
//! Why: a DEALER per server costs two file descriptors (its TCP connection and its mailbox's
//! eventfd) and a socket of the context's limit; at fleet scale (10,000 agents) that is
//! the process's whole open-file limit on common hosts. A ROUTER that `connect`s to every server
//! costs one descriptor per connection. Each connection gets its own routing id
//! (`ZMQ_CONNECT_ROUTING_ID`), CURVE server key and keepalive (socket options are copied into a
//! connection when it is made), so the server sees exactly what a DEALER would send. libzmq
//! creates the route's pipe at `connect`, so frames sent before the TCP connection is up wait
//! in it, as with a DEALER, and it keeps the route across reconnects.
//!
//! A [`MuxPeer`] is used like a [`super::Peer`]: shared by any number of callers, replies
//! routed by request id, CANCEL on timeout, callosum's PING/PONG handshake on connect.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rmpv::Value;
use tmq::{AsZmqSocket, FromZmqSocket};
use tokio::sync::{mpsc, oneshot};

use super::codec::{Call, Message};
use super::context::SocketSource;
use super::peer::{
    cancel_frames, function_frames, on_reply, ping_frames, reply_value, CallError, ConnectError,
    PeerOptions,
};
use super::socket::{self, LINGER_MS, ROUTER_HWM};

type Pending = HashMap<u32, (String, oneshot::Sender<Message>)>;

enum Command {
    Connect {
        route: Vec<u8>,
        opts: PeerOptions,
        reply: oneshot::Sender<Result<(), String>>,
    },
    Disconnect {
        route: Vec<u8>,
    },
    Send {
        route: Vec<u8>,
        frames: Vec<Vec<u8>>,
        method: String,
        seq: u32,
        reply: oneshot::Sender<Message>,
    },
    Cancel {
        route: Vec<u8>,
        seq: u32,
        frames: Vec<Vec<u8>>,
    },
    Ping {
        route: Vec<u8>,
        reply: oneshot::Sender<()>,
    },
}

/// The shared ROUTER. Cheap to clone; the socket closes when the last clone and every
/// [`MuxPeer`] are gone.
#[derive(Clone)]
pub struct Mux {
    commands: mpsc::UnboundedSender<Command>,
    next_route: Arc<AtomicU64>,
}

impl std::fmt::Debug for Mux {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mux").finish_non_exhaustive()
    }
}

impl Mux {
    /// A ROUTER from `ctx` whose I/O task runs on the current actix/tokio `LocalSet`.
    ///
    /// Errors: libzmq's (no socket could be made).
    pub fn start(ctx: &impl SocketSource) -> Result<Mux, zmq::Error> {
        let mut sock = ctx.socket(zmq::ROUTER)?;
        sock.set_linger(LINGER_MS)?;
        sock.set_sndhwm(ROUTER_HWM)?;
        sock.set_rcvhwm(ROUTER_HWM)?;
        // An unknown route is an error (EHOSTUNREACH), not a silent drop.
        sock.set_router_mandatory(true)?;
        let raw = RawSocket(sock.as_mut_ptr());
        let router = tmq::router::Router::from_zmq_socket(sock).map_err(|e| match e {
            tmq::TmqError::Zmq(z) => z,
            _ => zmq::Error::EINVAL,
        })?;
        let (commands, rx) = mpsc::unbounded_channel();
        actix_rt::spawn(io_loop(router, raw, rx));
        Ok(Mux {
            commands,
            next_route: Arc::new(AtomicU64::new(1)),
        })
    }

    /// Connects a new route to `opts.endpoint` and performs callosum's handshake (PING → PONG
    /// within `opts.handshake_timeout`).
    ///
    /// Errors: [`ConnectError::Socket`] (bad endpoint or keys, mux closed),
    /// [`ConnectError::Handshake`] (no PONG in time; the route is closed again).
    pub async fn connect(&self, opts: &PeerOptions) -> Result<MuxPeer, ConnectError> {
        let route = self
            .next_route
            .fetch_add(1, Ordering::Relaxed)
            .to_be_bytes()
            .to_vec();
        let (tx, rx) = oneshot::channel();
        self.commands
            .send(Command::Connect {
                route: route.clone(),
                opts: opts.clone(),
                reply: tx,
            })
            .map_err(|_| ConnectError::Socket("the connection mux is closed".into()))?;
        match rx.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(ConnectError::Socket(format!("{}: {e}", opts.endpoint))),
            Err(_) => return Err(ConnectError::Socket("the connection mux is closed".into())),
        }
        let peer = MuxPeer {
            inner: Arc::new(PeerInner {
                commands: self.commands.clone(),
                route,
                seq: AtomicU32::new(0),
                endpoint: opts.endpoint.as_str().into(),
            }),
        };
        let (tx, rx) = oneshot::channel();
        let asked = peer
            .inner
            .commands
            .send(Command::Ping {
                route: peer.inner.route.clone(),
                reply: tx,
            })
            .is_ok();
        match tokio::time::timeout(opts.handshake_timeout, rx).await {
            Ok(Ok(())) if asked => Ok(peer),
            _ => {
                peer.close();
                Err(ConnectError::Handshake {
                    endpoint: opts.endpoint.clone(),
                    after: opts.handshake_timeout,
                })
            }
        }
    }
}

struct PeerInner {
    commands: mpsc::UnboundedSender<Command>,
    route: Vec<u8>,
    seq: AtomicU32,
    endpoint: Arc<str>,
}

impl Drop for PeerInner {
    /// The last handle gone: the route is disconnected (as a DEALER peer closes).
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Disconnect {
            route: std::mem::take(&mut self.route),
        });
    }
}

/// One server's route through a [`Mux`]. Clones share it; [`MuxPeer::close`] disconnects it,
/// as does dropping the last clone.
#[derive(Clone)]
pub struct MuxPeer {
    inner: Arc<PeerInner>,
}

impl std::fmt::Debug for MuxPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MuxPeer")
            .field("endpoint", &self.inner.endpoint)
            .finish()
    }
}

impl MuxPeer {
    /// The endpoint this route is connected to.
    pub fn endpoint(&self) -> &str {
        &self.inner.endpoint
    }

    /// Calls `method` with `call` and waits up to `timeout` for the value, as
    /// [`super::Peer::call`].
    ///
    /// Errors: [`CallError`]; on timeout a CANCEL is sent to the server.
    pub async fn call(
        &self,
        method: &str,
        call: &Call,
        timeout: Duration,
    ) -> Result<Value, CallError> {
        let i = &self.inner;
        let seq = i.seq.fetch_add(1, Ordering::Relaxed);
        let (msg, frames) = function_frames(method, seq, call);
        let (tx, rx) = oneshot::channel();
        i.commands
            .send(Command::Send {
                route: i.route.clone(),
                frames,
                method: method.to_owned(),
                seq,
                reply: tx,
            })
            .map_err(|_| CallError::Disconnected("connection closed".into()))?;
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(reply)) => reply_value(reply),
            Ok(Err(_)) => Err(CallError::Disconnected(
                "connection closed while waiting".into(),
            )),
            Err(_) => {
                let _ = i.commands.send(Command::Cancel {
                    route: i.route.clone(),
                    seq,
                    frames: cancel_frames(&msg),
                });
                Err(CallError::Timeout {
                    method: method.to_owned(),
                    after: timeout,
                })
            }
        }
    }

    /// Disconnects the route now (for every clone); pending callers get
    /// [`CallError::Disconnected`].
    pub fn close(&self) {
        let _ = self.inner.commands.send(Command::Disconnect {
            route: self.inner.route.clone(),
        });
    }
}

/// The ROUTER's raw handle, for the one option `zmq` 0.9 has no setter for
/// (`ZMQ_CONNECT_ROUTING_ID`). Used only on the I/O task, which owns the socket.
struct RawSocket(*mut std::ffi::c_void);

struct Route {
    endpoint: String,
    pending: Pending,
    pings: Vec<oneshot::Sender<()>>,
}

fn connect(
    sock: &zmq::Socket,
    raw: &RawSocket,
    route: &[u8],
    opts: &PeerOptions,
) -> Result<(), zmq::Error> {
    match &opts.curve {
        Some(c) => {
            sock.set_curve_publickey(&c.keypair.public.0)?;
            sock.set_curve_secretkey(&c.keypair.secret.0)?;
            sock.set_curve_serverkey(&c.server_key.0)?;
        }
        // Back to the NULL mechanism for this connection (libzmq: CURVE_SERVER = 0).
        None => sock.set_curve_server(false)?,
    }
    match opts.keepalive {
        Some(k) => {
            sock.set_tcp_keepalive(1)?;
            sock.set_tcp_keepalive_idle(k.idle_secs)?;
            sock.set_tcp_keepalive_intvl(k.interval_secs)?;
            sock.set_tcp_keepalive_cnt(k.count)?;
        }
        None => sock.set_tcp_keepalive(-1)?,
    }
    // SAFETY: the socket is alive (owned by the caller's I/O task, on this thread); the value is
    // a byte string libzmq copies.
    let rc = unsafe {
        zmq_sys::zmq_setsockopt(
            raw.0,
            zmq_sys::ZMQ_CONNECT_ROUTING_ID as i32,
            route.as_ptr().cast(),
            route.len(),
        )
    };
    if rc != 0 {
        return Err(zmq::Error::from_raw(unsafe { zmq_sys::zmq_errno() }));
    }
    sock.connect(&opts.endpoint)
}

async fn io_loop(
    mut router: tmq::router::Router,
    raw: RawSocket,
    mut commands: mpsc::UnboundedReceiver<Command>,
) {
    let mut routes: HashMap<Vec<u8>, Route> = HashMap::new();
    loop {
        tokio::select! {
            // Commands first (as the DEALER peer's loop): replies cannot starve, callers wait
            // for them.
            biased;
            cmd = commands.recv() => {
                let Some(cmd) = cmd else { break };
                let (route, frames) = match cmd {
                    Command::Connect { route, opts, reply } => {
                        let res = connect(router.get_socket(), &raw, &route, &opts);
                        if res.is_ok() {
                            routes.insert(route, Route { endpoint: opts.endpoint.clone(), pending: HashMap::new(), pings: Vec::new() });
                        }
                        let _ = reply.send(res.map_err(|e| e.to_string()));
                        continue;
                    }
                    Command::Disconnect { route } => {
                        if let Some(r) = routes.remove(&route) {
                            // Dropping `r` drops its callers' reply senders: they see Disconnected.
                            let _ = router.get_socket().disconnect(&r.endpoint);
                        }
                        continue;
                    }
                    Command::Send { route, frames, method, seq, reply } => {
                        let Some(r) = routes.get_mut(&route) else { continue };
                        r.pending.insert(seq, (method, reply));
                        (route, frames)
                    }
                    Command::Cancel { route, seq, frames } => {
                        let Some(r) = routes.get_mut(&route) else { continue };
                        r.pending.remove(&seq);
                        (route, frames)
                    }
                    Command::Ping { route, reply } => {
                        let Some(r) = routes.get_mut(&route) else { continue };
                        r.pings.push(reply);
                        (route, ping_frames())
                    }
                };
                let mut msg = Vec::with_capacity(frames.len() + 1);
                msg.push(route.clone());
                msg.extend(frames);
                // A ROUTER never blocks: it queues in the route's pipe or fails at once.
                if let Err(e) = socket::try_send(router.get_socket(), &msg) {
                    tracing::debug!(error = %e, "mux send failed; the caller times out");
                }
            }
            incoming = router.next() => match incoming {
                Some(Ok(frames)) => {
                    let parts: Vec<&[u8]> = frames.iter().map(|m| &m[..]).collect();
                    let Some((route, rest)) = parts.split_first() else { continue };
                    if let Some(r) = routes.get_mut(*route) {
                        on_reply(rest, &mut r.pending, &mut r.pings);
                    }
                }
                Some(Err(e)) => tracing::warn!(error = %e, "mux receive error"),
                None => break,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Mux;
    use crate::rpc::context::SizedContext;
    use crate::rpc::{Call, Dispatcher, PeerOptions, RpcServer};
    use actix::Actor;

    fn opts(endpoint: &str) -> PeerOptions {
        PeerOptions {
            endpoint: endpoint.to_owned(),
            curve: None,
            keepalive: None,
            handshake_timeout: Duration::from_secs(2),
        }
    }

    #[actix_rt::test]
    async fn one_router_calls_several_servers_and_a_dead_one_fails_its_handshake() {
        let ctx = SizedContext::new(16, 1).unwrap();
        let mux = Mux::start(&ctx).unwrap();
        let mut peers = Vec::new();
        for name in ["a", "b", "c"] {
            let mut d = Dispatcher::new(None);
            d.register("who", move |_| async move { Ok(rmpv::Value::from(name)) });
            let server = RpcServer::bind("tcp://127.0.0.1:0", None, d).unwrap();
            let endpoint = server.endpoint().to_owned();
            let _ = server.start();
            peers.push((name, mux.connect(&opts(&endpoint)).await.unwrap()));
        }
        let call = Call {
            args: vec![],
            kwargs: vec![],
            peer_user_id: None,
        };
        for _ in 0..3 {
            for (name, p) in &peers {
                let v = p.call("who", &call, Duration::from_secs(2)).await.unwrap();
                assert_eq!(v.as_str(), Some(*name));
            }
        }
        // Closed: a call fails at once.
        peers[0].1.close();
        assert!(peers[0]
            .1
            .call("who", &call, Duration::from_secs(1))
            .await
            .is_err());
        assert_eq!(
            peers[1]
                .1
                .call("who", &call, Duration::from_secs(2))
                .await
                .unwrap()
                .as_str(),
            Some("b")
        );
        // Nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = mux
            .connect(&PeerOptions {
                handshake_timeout: Duration::from_millis(300),
                ..opts(&format!("tcp://127.0.0.1:{port}"))
            })
            .await
            .unwrap_err();
        assert!(err.to_string().contains("no handshake answer"), "{err}");
    }
}

//! `just bench rpc`: the agent pool against its baselines, all measured in one run.
//!
//! Rows, each without and with CURVE, over loopback TCP to one agent RPC server:
//! - raw libzmq DEALER/ROUTER echo (blocking sockets, no codec): the floor;
//! - the layers of a pooled call, each added to the one before: a blocking callosum client
//!   against our agent server (the server's cost), our [`Peer`] without the pool (the client's),
//!   then the `AgentPool` actor (the pooled call: p50, p99);
//! - pooled throughput with 64 concurrent callers sharing one peer;
//! - per-call connection (new context + socket, connect, CURVE handshake, callosum PING/PONG,
//!   call, close), the pattern seed 000 replaced.
//!
//! The whole table is measured twice: with every thread of the run pinned to one core, then as
//! the OS schedules them over all cores. A loopback round trip crosses six threads (caller,
//! client libzmq I/O, server libzmq I/O, server, and back). On a VM whose idle vCPUs halt, each
//! hop to another vCPU pays a hypervisor wake-up, which dwarfs the software being measured and
//! varies run to run; on one core the hops are plain context switches. The targets are judged on
//! the pinned figures; the unpinned ones are printed beside them.
//!
//! Ends with one JSON line: the pinned CURVE figures (the five keys), the two target
//! ratios, and the unpinned CURVE figures under `"unpinned"`.

use std::time::{Duration, Instant};

use actix::prelude::*;
use rmpv::Value;

use kernelvisor::manager::pool::{AgentCall, AgentEndpoint, AgentPool, PoolSpec, RegisterAgent};
use kernelvisor::rpc::codec::{self, Call, Message, OrderKey};
use kernelvisor::rpc::curve::KeyPair;
use kernelvisor::rpc::peer::{Peer, PeerOptions};
use kernelvisor::rpc::socket::{self, ClientCurve};
use kernelvisor::rpc::{Dispatcher, RpcServer, ServerCurve};

const SEQ_CALLS: usize = 5000;
const CONC_CALLERS: usize = 64;
const CONC_CALLS: usize = 30_000;
const PER_CALL: usize = 400;
const ROUNDS: usize = 10;

struct Keys {
    manager: KeyPair,
    agent: KeyPair,
}

/// One column of the table. Latencies in microseconds.
#[derive(Default, Debug, Clone, Copy)]
struct Figures {
    raw_p50: f64,
    server_p50: f64,
    peer_p50: f64,
    seq_p50: f64,
    seq_p99: f64,
    conc_per_s: f64,
    per_call_p50: f64,
}

impl Figures {
    fn pooled_over_raw(&self) -> f64 {
        self.seq_p50 / self.raw_p50
    }

    fn per_call_over_pooled(&self) -> f64 {
        self.per_call_p50 / self.seq_p50
    }

    fn json(&self) -> String {
        format!(
            "\"seq_p50_us\": {:.1}, \"seq_p99_us\": {:.1}, \"conc64_per_s\": {:.0}, \"per_call_p50_us\": {:.1}, \"raw_zmq_p50_us\": {:.1}, \"pooled_over_raw\": {:.2}, \"per_call_over_pooled\": {:.1}",
            self.seq_p50,
            self.seq_p99,
            self.conc_per_s,
            self.per_call_p50,
            self.raw_p50,
            self.pooled_over_raw(),
            self.per_call_over_pooled()
        )
    }
}

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i].as_secs_f64() * 1e6
}

fn client_curve(keys: Option<&Keys>) -> Option<ClientCurve> {
    keys.map(|k| ClientCurve {
        keypair: k.manager.clone(),
        server_key: k.agent.public,
    })
}

/// Starts an agent RPC server with the agent's methods on its own thread and actix System;
/// returns its endpoint. The thread inherits the caller's CPU affinity.
fn spawn_agent(curve: Option<ServerCurve>) -> String {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        actix_rt::System::new().block_on(async move {
            let mut d = Dispatcher::new(None);
            kernelvisor::agent::methods::register(&mut d, "bench-agent");
            let server = RpcServer::bind("tcp://127.0.0.1:0", curve, d).expect("bind");
            tx.send(server.endpoint().to_owned()).unwrap();
            let _addr = server.start();
            futures::future::pending::<()>().await;
        });
    });
    rx.recv().unwrap()
}

/// A blocking DEALER that sends the same frames and waits for one reply, timing each round trip.
struct BlockingClient {
    dealer: zmq::Socket,
    frames: Vec<Vec<u8>>,
    _ctx: zmq::Context,
}

impl BlockingClient {
    /// The floor: a ROUTER thread echoes frames back, no codec on either side.
    ///
    /// The echo server has its own context, as the agent server has: a manager and an agent are
    /// separate processes, each with its own libzmq I/O thread. (Client and server in one context
    /// would share one I/O thread and save two of the six thread hops of a round trip, a floor no
    /// deployment can reach.)
    fn raw_echo(keys: Option<&Keys>) -> Self {
        let server_ctx = zmq::Context::new();
        let zap = keys.map(|k| {
            kernelvisor::rpc::zap::ZapHandler::start(
                &server_ctx,
                vec![(k.manager.public, "manager".into())],
                None,
            )
            .unwrap()
        });
        let router =
            socket::router(&server_ctx, "tcp://127.0.0.1:0", keys.map(|k| &k.agent)).unwrap();
        let endpoint = router.get_last_endpoint().unwrap().unwrap();
        std::thread::spawn(move || {
            let (_ctx, _zap) = (server_ctx, zap);
            loop {
                let frames = router.recv_multipart(0).unwrap();
                router.send_multipart(frames, 0).unwrap();
            }
        });
        let payload = Call {
            args: vec![Value::from("x")],
            kwargs: vec![],
            peer_user_id: None,
        }
        .encode();
        Self::start(
            &endpoint,
            keys,
            vec![codec::UPPER.to_vec(), payload.clone(), payload],
        )
    }

    /// A callosum `ping` FUNCTION against our agent server: the raw floor plus the server's cost.
    fn callosum(endpoint: &str, keys: Option<&Keys>) -> Self {
        let msg = Message::function(
            "ping",
            OrderKey::default(),
            1,
            Call {
                args: vec![Value::from("x")],
                kwargs: vec![],
                peer_user_id: None,
            }
            .encode(),
        );
        let (h, b) = codec::encode_message(&msg);
        Self::start(endpoint, keys, vec![codec::UPPER.to_vec(), h, b])
    }

    fn start(endpoint: &str, keys: Option<&Keys>, frames: Vec<Vec<u8>>) -> Self {
        let ctx = zmq::Context::new();
        let dealer =
            socket::dealer(&ctx, endpoint, client_curve(keys).as_ref(), None, None).unwrap();
        let mut client = BlockingClient {
            dealer,
            frames,
            _ctx: ctx,
        };
        client.samples(200);
        client
    }

    fn samples(&mut self, n: usize) -> Vec<Duration> {
        (0..n)
            .map(|_| {
                let t = Instant::now();
                self.dealer
                    .send_multipart(self.frames.iter().map(|f| &f[..]), 0)
                    .unwrap();
                self.dealer.recv_multipart(0).unwrap();
                t.elapsed()
            })
            .collect()
    }
}

async fn pool_for(endpoint: &str, keys: Option<&Keys>) -> Addr<AgentPool> {
    let pool = AgentPool::new(PoolSpec::default(), keys.map(|k| k.manager.clone()))
        .expect("pool")
        .start();
    let endpoint = AgentEndpoint {
        addr: endpoint.to_owned(),
        public_key: keys.map(|k| k.agent.public),
    };
    pool.send(RegisterAgent {
        agent_id: "a".into(),
        endpoint,
    })
    .await
    .unwrap();
    for _ in 0..200 {
        pool.send(ping()).await.unwrap().unwrap();
    }
    pool
}

fn ping() -> AgentCall {
    AgentCall::new("a", "ping", vec![Value::from("x")], Duration::from_secs(10))
}

fn ping_call() -> Call {
    Call {
        args: vec![Value::from("x")],
        kwargs: vec![],
        peer_user_id: None,
    }
}

async fn peer_seq(peer: &Peer, n: usize) -> Vec<Duration> {
    let call = ping_call();
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        peer.call("ping", &call, Duration::from_secs(10))
            .await
            .unwrap();
        samples.push(t.elapsed());
    }
    samples
}

async fn pooled_seq(pool: &Addr<AgentPool>, n: usize) -> Vec<Duration> {
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        pool.send(ping()).await.unwrap().unwrap();
        samples.push(t.elapsed());
    }
    samples
}

async fn pooled_concurrent(pool: &Addr<AgentPool>) -> f64 {
    let t = Instant::now();
    let callers = (0..CONC_CALLERS).map(|_| {
        let pool = pool.clone();
        async move {
            for _ in 0..CONC_CALLS / CONC_CALLERS {
                pool.send(ping()).await.unwrap().unwrap();
            }
        }
    });
    futures::future::join_all(callers).await;
    (CONC_CALLS / CONC_CALLERS * CONC_CALLERS) as f64 / t.elapsed().as_secs_f64()
}

async fn per_call(opts: &PeerOptions, n: usize) -> Vec<Duration> {
    let call = ping_call();
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        // As upstream's per-call PeerInvoker: a fresh transport (context), connect, handshake, call, close.
        let ctx = zmq::Context::new();
        let peer = Peer::connect(&ctx, opts).await.unwrap();
        peer.call("ping", &call, Duration::from_secs(10))
            .await
            .unwrap();
        peer.close();
        drop(peer);
        samples.push(t.elapsed());
    }
    samples
}

/// Measures one column: every row in interleaved rounds, so a noisy neighbour hits all alike.
/// Servers, sockets and threads are made fresh, so they inherit the calling thread's affinity.
fn measure(keys: Option<&Keys>) -> Figures {
    let curve = keys.map(|k| ServerCurve {
        keypair: k.agent.clone(),
        allowed_clients: vec![(k.manager.public, "manager".into())],
        reload: None,
    });
    let endpoint = spawn_agent(curve);
    let mut raw = BlockingClient::raw_echo(keys);
    let mut server = BlockingClient::callosum(&endpoint, keys);
    let opts = PeerOptions {
        endpoint: endpoint.clone(),
        curve: client_curve(keys),
        keepalive: None,
        handshake_timeout: Duration::from_secs(5),
    };
    let keys = keys.map(|k| Keys {
        manager: k.manager.clone(),
        agent: k.agent.clone(),
    });
    actix_rt::System::new().block_on(async move {
        // Callers run as spawned tasks, as the manager's actors do: waking the System's
        // top-level future from a task costs an extra runtime wake-up that no caller pays.
        actix_rt::spawn(async move {
            let pool = pool_for(&endpoint, keys.as_ref()).await;
            let peer_ctx = zmq::Context::new();
            let peer = Peer::connect(&peer_ctx, &opts).await.unwrap();
            peer_seq(&peer, 200).await;
            per_call(&opts, 5).await; // warm-up
            let (mut raw_s, mut server_s, mut peer_s, mut seq_s, mut per_call_s) =
                (vec![], vec![], vec![], vec![], vec![]);
            for _ in 0..ROUNDS {
                raw_s.extend(raw.samples(SEQ_CALLS / ROUNDS));
                server_s.extend(server.samples(SEQ_CALLS / ROUNDS));
                peer_s.extend(peer_seq(&peer, SEQ_CALLS / ROUNDS).await);
                seq_s.extend(pooled_seq(&pool, SEQ_CALLS / ROUNDS).await);
                per_call_s.extend(per_call(&opts, PER_CALL / ROUNDS).await);
            }
            let conc_per_s = pooled_concurrent(&pool).await;
            peer.close();
            Figures {
                raw_p50: percentile(&mut raw_s, 0.5),
                server_p50: percentile(&mut server_s, 0.5),
                peer_p50: percentile(&mut peer_s, 0.5),
                seq_p50: percentile(&mut seq_s, 0.5),
                seq_p99: percentile(&mut seq_s, 0.99),
                conc_per_s,
                per_call_p50: percentile(&mut per_call_s, 0.5),
            }
        })
        .await
        .expect("measurement task")
    })
}

fn main() {
    let keys = Keys {
        manager: KeyPair::generate().unwrap(),
        agent: KeyPair::generate().unwrap(),
    };
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    // Unpinned first: pinning the main thread is inherited by every thread made after it.
    let spread = [measure(None), measure(Some(&keys))];
    let pinned_core = cores.last().copied();
    let pinned = match pinned_core {
        Some(core) if cores.len() > 1 && core_affinity::set_for_current(core) => {
            [measure(None), measure(Some(&keys))]
        }
        _ => {
            eprintln!("cannot pin to one core; the pinned columns repeat the unpinned run");
            spread
        }
    };
    let cols = [pinned[0], pinned[1], spread[0], spread[1]];
    println!(
        "\nkernelvisor rpc bench: one agent RPC server over loopback TCP ({} cores)",
        cores.len()
    );
    println!(
        "{:<58} {:>23}   {:>23}",
        "",
        "pinned to one core",
        format!("all {} cores", cores.len())
    );
    println!(
        "{:<58} {:>11} {:>11}   {:>11} {:>11}",
        "measure", "plain", "CURVE", "plain", "CURVE"
    );
    let row = |name: &str, unit: &str, f: &dyn Fn(&Figures) -> f64| {
        let v: Vec<f64> = cols.iter().map(f).collect();
        println!(
            "{:<58} {:>11.1} {:>11.1}   {:>11.1} {:>11.1}",
            format!("{name} ({unit})"),
            v[0],
            v[1],
            v[2],
            v[3]
        );
    };
    row("raw libzmq DEALER/ROUTER echo p50", "us", &|f| f.raw_p50);
    row(
        "  + agent server (blocking callosum client) p50",
        "us",
        &|f| f.server_p50,
    );
    row("  + Peer, no pool (persistent DEALER) p50", "us", &|f| {
        f.peer_p50
    });
    row(
        "  + AgentPool actor = pooled sequential ping p50",
        "us",
        &|f| f.seq_p50,
    );
    row("pooled sequential ping p99", "us", &|f| f.seq_p99);
    row(
        &format!("pooled, {CONC_CALLERS} concurrent callers, one peer"),
        "calls/s",
        &|f| f.conc_per_s,
    );
    row(
        "per-call connection (connect+handshake+call+close) p50",
        "us",
        &|f| f.per_call_p50,
    );
    row("pooled p50 / raw echo p50 (target <= 1.5)", "x", &|f| {
        f.pooled_over_raw()
    });
    row(
        "per-call p50 / pooled p50 (target >= 20 with CURVE)",
        "x",
        &|f| f.per_call_over_pooled(),
    );
    let met = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "targets (pinned, CURVE): pooled <= 1.5x raw: {}; per-call >= 20x pooled: {}",
        met(pinned[1].pooled_over_raw() <= 1.5),
        met(pinned[1].per_call_over_pooled() >= 20.0)
    );
    println!(
        "{{{}, \"pinned_core\": {}, \"cores\": {}, \"unpinned\": {{{}}}}}",
        pinned[1].json(),
        pinned_core
            .map(|c| c.id.to_string())
            .unwrap_or_else(|| "null".into()),
        cores.len(),
        spread[1].json()
    );
}

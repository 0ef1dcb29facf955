//! `just bench rpc`: the agent pool against its baselines, all measured in one run.
//!
//! Rows, each without and with CURVE, over loopback TCP to one agent RPC server:
//! - raw libzmq DEALER/ROUTER echo (blocking sockets, no codec): the floor;
//! - pooled sequential `ping` through the `AgentPool` actor (p50, p99);
//! - pooled throughput with 64 concurrent callers sharing one peer;
//! - per-call connection (new context + socket, connect, callosum handshake, call, close), the
//!   pattern seed 000 replaced.
//!
//! Ends with one JSON line of the CURVE figures.

use std::time::{Duration, Instant};

use actix::prelude::*;
use rmpv::Value;

use kernelvisor::manager::pool::{AgentCall, AgentEndpoint, AgentPool, PoolSpec, RegisterAgent};
use kernelvisor::rpc::codec::Call;
use kernelvisor::rpc::curve::KeyPair;
use kernelvisor::rpc::peer::{Peer, PeerOptions};
use kernelvisor::rpc::socket::{self, ClientCurve};
use kernelvisor::rpc::{Dispatcher, RpcServer, ServerCurve};

const SEQ_CALLS: usize = 5000;
const CONC_CALLERS: usize = 64;
const CONC_CALLS: usize = 30_000;
const PER_CALL: usize = 200;
const ROUNDS: usize = 10;

struct Keys {
    manager: KeyPair,
    agent: KeyPair,
}

#[derive(Default, Debug, Clone, Copy)]
struct Figures {
    raw_p50: f64,
    seq_p50: f64,
    seq_p99: f64,
    conc_per_s: f64,
    per_call_p50: f64,
}

fn percentile(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i].as_secs_f64() * 1e6
}

/// Starts an agent RPC server with `ping` on its own thread and actix System; returns its endpoint.
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

/// Raw echo floor: a ROUTER thread echoes frames back; a blocking DEALER measures round trips.
struct RawEcho {
    dealer: zmq::Socket,
    payload: Vec<u8>,
    _zap: Option<kernelvisor::rpc::zap::ZapHandler>,
}

impl RawEcho {
    fn start(curve: Option<&Keys>) -> Self {
        let ctx = zmq::Context::new();
        let zap = curve.map(|k| kernelvisor::rpc::zap::ZapHandler::start(&ctx, vec![(k.manager.public, "manager".into())], None).unwrap());
        let router = socket::router(&ctx, "tcp://127.0.0.1:0", curve.map(|k| &k.agent)).unwrap();
        let endpoint = router.get_last_endpoint().unwrap().unwrap();
        std::thread::spawn(move || loop {
            let frames = router.recv_multipart(0).unwrap();
            router.send_multipart(frames, 0).unwrap();
        });
        let client_curve = curve.map(|k| ClientCurve { keypair: k.manager.clone(), server_key: k.agent.public });
        let dealer = socket::dealer(&ctx, &endpoint, client_curve.as_ref(), None, None).unwrap();
        let payload = Call { args: vec![Value::from("x")], kwargs: vec![] }.encode();
        let mut echo = RawEcho { dealer, payload, _zap: zap };
        echo.samples(200);
        echo
    }

    fn samples(&mut self, n: usize) -> Vec<Duration> {
        (0..n)
            .map(|_| {
                let t = Instant::now();
                self.dealer.send_multipart([&b"UPPER"[..], &self.payload[..], &self.payload[..]], 0).unwrap();
                self.dealer.recv_multipart(0).unwrap();
                t.elapsed()
            })
            .collect()
    }
}

async fn pool_for(endpoint: &str, keys: Option<&Keys>) -> Addr<AgentPool> {
    let pool = AgentPool::new(PoolSpec::default(), keys.map(|k| k.manager.clone())).start();
    let endpoint = AgentEndpoint { addr: endpoint.to_owned(), public_key: keys.map(|k| k.agent.public) };
    pool.send(RegisterAgent { agent_id: "a".into(), endpoint }).await.unwrap();
    for _ in 0..200 {
        pool.send(ping()).await.unwrap().unwrap();
    }
    pool
}

fn ping() -> AgentCall {
    AgentCall::new("a", "ping", vec![Value::from("x")], Duration::from_secs(10))
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
    let call = Call { args: vec![Value::from("x")], kwargs: vec![] };
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        // As upstream's per-call PeerInvoker: a fresh transport (context), connect, handshake, call, close.
        let ctx = zmq::Context::new();
        let peer = Peer::connect(&ctx, opts).await.unwrap();
        peer.call("ping", &call, Duration::from_secs(10)).await.unwrap();
        peer.close();
        drop(peer);
        samples.push(t.elapsed());
    }
    samples
}

/// Measures every row in interleaved rounds, so a noisy neighbour hits all rows alike.
fn measure(keys: Option<&Keys>) -> Figures {
    let curve = keys.map(|k| ServerCurve { keypair: k.agent.clone(), allowed_clients: vec![(k.manager.public, "manager".into())], reload: None });
    let endpoint = spawn_agent(curve);
    let mut raw = RawEcho::start(keys);
    let opts = PeerOptions {
        endpoint: endpoint.clone(),
        curve: keys.map(|k| ClientCurve { keypair: k.manager.clone(), server_key: k.agent.public }),
        keepalive: None,
        handshake_timeout: Duration::from_secs(5),
    };
    actix_rt::System::new().block_on(async {
        let pool = pool_for(&endpoint, keys).await;
        let (mut raw_s, mut seq_s, mut per_call_s) = (Vec::new(), Vec::new(), Vec::new());
        per_call(&opts, 5).await; // warm-up
        for _ in 0..ROUNDS {
            raw_s.extend(raw.samples(SEQ_CALLS / ROUNDS));
            seq_s.extend(pooled_seq(&pool, SEQ_CALLS / ROUNDS).await);
            per_call_s.extend(per_call(&opts, PER_CALL / ROUNDS).await);
        }
        let conc_per_s = pooled_concurrent(&pool).await;
        Figures {
            raw_p50: percentile(&mut raw_s, 0.5),
            seq_p50: percentile(&mut seq_s, 0.5),
            seq_p99: percentile(&mut seq_s, 0.99),
            conc_per_s,
            per_call_p50: percentile(&mut per_call_s, 0.5),
        }
    })
}

fn main() {
    let keys = Keys { manager: KeyPair::generate().unwrap(), agent: KeyPair::generate().unwrap() };
    let plain = measure(None);
    let curve = measure(Some(&keys));
    println!("\nkernelvisor rpc bench: one agent RPC server over loopback TCP ({} cores)", std::thread::available_parallelism().map(usize::from).unwrap_or(0));
    println!("{:<52} {:>12} {:>12}", "measure", "plain", "CURVE");
    let row = |name: &str, f: &dyn Fn(&Figures) -> f64, unit: &str| {
        println!("{:<52} {:>12.1} {:>12.1}", format!("{name} ({unit})"), f(&plain), f(&curve));
    };
    row("raw libzmq DEALER/ROUTER echo p50", &|f| f.raw_p50, "us");
    row("pooled sequential ping p50", &|f| f.seq_p50, "us");
    row("pooled sequential ping p99", &|f| f.seq_p99, "us");
    row(&format!("pooled, {CONC_CALLERS} concurrent callers, one peer"), &|f| f.conc_per_s, "calls/s");
    row("per-call connection (connect+handshake+call+close) p50", &|f| f.per_call_p50, "us");
    row("pooled p50 / raw echo p50 (target <= 1.5)", &|f| f.seq_p50 / f.raw_p50, "x");
    row("per-call p50 / pooled p50 (target >= 20 with CURVE)", &|f| f.per_call_p50 / f.seq_p50, "x");
    println!(
        "{{\"seq_p50_us\": {:.1}, \"seq_p99_us\": {:.1}, \"conc64_per_s\": {:.0}, \"per_call_p50_us\": {:.1}, \"raw_zmq_p50_us\": {:.1}}}",
        curve.seq_p50, curve.seq_p99, curve.conc_per_s, curve.per_call_p50, curve.raw_p50
    );
}

//! Helpers shared by the integration tests: servers on free loopback ports, CURVE keys, pools.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use actix::prelude::*;
use rmpv::Value;

use kernelvisor::manager::pool::{AgentEndpoint, AgentPool, PoolSpec, RegisterAgent};
use kernelvisor::rpc::curve::{CurveKey, KeyPair};
use kernelvisor::rpc::server::ServerStats;
use kernelvisor::rpc::{Dispatcher, ErrorMeta, RpcServer, ServerCurve};

/// A started server: its address, endpoint and counters.
pub struct TestServer {
    pub addr: Addr<RpcServer>,
    pub endpoint: String,
    pub stats: std::sync::Arc<ServerStats>,
}

/// How many `sleep` handlers of [`dispatcher`] have started (in this test's process: nextest
/// runs each test in its own), for a test to wait until its slow call is being handled.
pub static SLEEPS_STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The foundation's methods plus test ones: `sleep(secs)`, `fail()`, `panic(after_await)`.
pub fn dispatcher() -> Dispatcher {
    let mut d = Dispatcher::new(Some("test-agent".into()));
    kernelvisor::agent::methods::register(&mut d, "test-agent");
    d.register("sleep", |call| async move {
        SLEEPS_STARTED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let secs = call.arg(0, "secs").and_then(Value::as_f64).unwrap_or(1.0);
        actix_rt::time::sleep(Duration::from_secs_f64(secs)).await;
        Ok(Value::from("slept"))
    })
    .register("fail", |_| async {
        Err(ErrorMeta::new("KernelNotFound", "no such kernel"))
    })
    .register("panic", |call| async move {
        if call
            .arg(0, "after_await")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            actix_rt::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("deliberate handler panic")
    });
    d
}

/// Binds and starts a server at `endpoint` (use `tcp://127.0.0.1:0` for a free port).
pub fn start_server(endpoint: &str, curve: Option<ServerCurve>) -> TestServer {
    let server = RpcServer::bind(endpoint, curve, dispatcher()).expect("bind");
    let (endpoint, stats) = (server.endpoint().to_owned(), server.stats());
    TestServer {
        addr: server.start(),
        endpoint,
        stats,
    }
}

/// Manager and agent key pairs, with the agent's CURVE server settings admitting the manager.
pub struct Keys {
    pub manager: KeyPair,
    pub agent: KeyPair,
}

impl Keys {
    pub fn new() -> Self {
        Keys {
            manager: KeyPair::generate().unwrap(),
            agent: KeyPair::generate().unwrap(),
        }
    }

    pub fn server_curve(&self) -> ServerCurve {
        ServerCurve {
            keypair: self.agent.clone(),
            allowed_clients: vec![(self.manager.public, "manager".into())],
            reload: None,
        }
    }

    /// Writes all four certificate files into `dir`.
    pub fn write(&self, dir: &std::path::Path) {
        kernelvisor::rpc::curve::write_certificates(dir, "manager", &self.manager).unwrap();
        kernelvisor::rpc::curve::write_certificates(dir, "agent", &self.agent).unwrap();
    }
}

/// A pool with test-sized intervals, knowing `agent_id` at `endpoint`.
pub async fn pool_for(
    agent_id: &str,
    endpoint: &str,
    agent_key: Option<CurveKey>,
    manager: Option<KeyPair>,
    spec: PoolSpec,
) -> Addr<AgentPool> {
    let pool = AgentPool::new(spec, manager).expect("pool").start();
    let endpoint = AgentEndpoint {
        addr: endpoint.to_owned(),
        public_key: agent_key,
    };
    pool.send(RegisterAgent {
        agent_id: agent_id.into(),
        endpoint,
    })
    .await
    .unwrap();
    pool
}

/// Short intervals for tests.
pub fn fast_spec() -> PoolSpec {
    PoolSpec {
        health_check_interval: Duration::from_millis(200),
        ping_timeout: Duration::from_millis(300),
        failure_threshold: 3,
        recovery_timeout: Duration::from_millis(800),
        handshake_timeout: Duration::from_secs(2),
        ..PoolSpec::default()
    }
}

/// Polls `check` every 50 ms until it returns true; panics with `what` after `limit`.
/// (A liveness bound for the test, not a performance assertion.)
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < limit, "timed out waiting for: {what}");
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `probe` every 50 ms until its value satisfies `done` or `limit` has passed; returns the
/// last value seen, for the caller's own assertion (which then shows what was seen on failure).
/// (A liveness bound for the test, not a performance assertion.)
pub async fn settle<T, F, Fut>(limit: Duration, mut probe: F, done: impl Fn(&T) -> bool) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let start = Instant::now();
    loop {
        let v = probe().await;
        if done(&v) || start.elapsed() >= limit {
            return v;
        }
        actix_rt::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether nothing listens at `endpoint` (`tcp://host:port`) any more: a TCP connect is refused.
pub fn port_closed(endpoint: &str) -> bool {
    let addr = endpoint.trim_start_matches("tcp://");
    let addr: std::net::SocketAddr = addr.parse().expect("a tcp://ip:port endpoint");
    matches!(
        std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

/// The Python interpreter of the venv that has callosum (`KV_PYTHON`, else `.venv/bin/python`).
pub fn python() -> PathBuf {
    let p = std::env::var_os("KV_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    assert!(
        p.exists(),
        "{} not found: run `just setup` (it installs callosum into .venv)",
        p.display()
    );
    p
}

/// Path of a file under `tests/interop/`.
pub fn interop_script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/interop")
        .join(name)
}
pub mod agent;
pub mod bai;
pub mod browser;
pub mod cluster;
pub mod dev;
pub mod engines;
pub mod halfstack;
pub mod intake;
pub mod pty;
pub mod registry;

/// A `/proc/<pid>/status` size field (`VmHWM`, `VmRSS`), in bytes.
pub fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb * 1024
}

/// `VmHWM` (peak resident set) of `pid`, in bytes.
pub fn peak_rss(pid: u32) -> u64 {
    status_bytes(pid, "VmHWM")
}

/// Asserts that the agent's and the manager's peak RSS (VmHWM) stayed under 150 MB, printing
/// both after `what`.
pub fn assert_bounded_memory(agent_pid: u32, manager_pid: u32, what: &str) {
    let (agent, manager) = (peak_rss(agent_pid), peak_rss(manager_pid));
    eprintln!(
        "{what}: agent VmHWM {} MB, manager VmHWM {} MB",
        agent >> 20,
        manager >> 20
    );
    assert!(agent < 150 << 20, "agent VmHWM {} MB", agent >> 20);
    assert!(manager < 150 << 20, "manager VmHWM {} MB", manager >> 20);
}

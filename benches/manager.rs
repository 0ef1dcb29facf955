//! `just bench manager`: one manager process (the real `kernelvisor manager` binary) with 1,000
//! and then 10,000 agents on the `dummy` container backend (issue 17). Per agent count:
//!
//! - `heartbeats_real_per_s`: heartbeats the manager took per second at the fleet's real rate
//!   (every agent every `KV_BENCH_HEARTBEAT_INTERVAL`, default 20 s); `heartbeats_per_s` the
//!   same at flood (every agent resends as soon as answered, for `KV_BENCH_WINDOW` s, default
//!   5). Counted with the manager's own `kernelvisor_manager_heartbeats_total`: what the intake
//!   took; the registry applies the newest per agent every 100 ms (`HeartbeatInbox`).
//! - `sweep_ms`: one agent-pool health-check sweep over every pool peer
//!   (`kernelvisor_manager_pool_last_sweep_seconds` once `…_entries` equals the agent count;
//!   median of 3, `health-check-interval = KV_BENCH_SWEEP_INTERVAL` (10 s), unpaced), with the
//!   bench's heartbeats paused. The pool connects to each agent from its first heartbeat; the
//!   bench waits for every peer to be healthy first.
//! - `create_p50_ms` / `create_p99_ms`: `POST /v1/sessions` latency of `KV_BENCH_SESSIONS`
//!   (default 50) sequential sessions (cpu 0.1, mem 64m) at the real heartbeat rate;
//!   `create_flood_p50_ms` of 10 under the flood.
//! - `rss_mb`: the manager's VmRSS after the flood.
//! - `grace_exit_s`: SIGTERM, restart on the same store, until `/health` is `normal` with every
//!   agent `ALIVE` (the agents beat at the real rate meanwhile).
//!
//! Agents: up to `KV_BENCH_REAL_AGENTS` (default 100) are real `kernelvisor::agent::Agent`s
//! (dummy backend, own SQLite store, outbox, event sender and heartbeats) in this process; the
//! rest are simulated at the wire level in child processes of 2,500 (`KV_BENCH_SIM_HOST`): an
//! `RpcServer` per agent answering `ping`, `create_kernels`, `destroy_kernel` and
//! `reset_instance`, and heartbeats in the `docs/events.md` format over 16 shared intake
//! connections per process (this machine's hard `RLIMIT_NOFILE` is 20,000). No CURVE.
//! Everything runs on one machine, so the bench's agents and load compete with the manager
//! for the same cores; the table shows the manager's CPU share during the flood.
//! The bench's HTTP requests (all but `GET /health`) carry the bootstrap admin key's secret as
//! their bearer token: the manager writes it to `[api] admin-token-file` in the phase's temp dir.
//!
//! `KV_BENCH_AGENTS` (default `1000,10000`) picks the agent counts. A fresh manager (and fresh
//! agents) per count. Prints a table and ends with one JSON line: `[{"agents",
//! "heartbeats_per_s", "heartbeats_real_per_s", "sweep_ms", "create_p50_ms", "create_p99_ms",
//! "create_flood_p50_ms", "rss_mb", "grace_exit_s", "heartbeat_interval_s"}, …]`.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::{Actor, Addr};
use anyhow::{anyhow, bail, Context as _};
use futures::StreamExt;
use rmpv::Value;
use tokio::sync::watch;

use kernelvisor::agent::context::AgentContext;
use kernelvisor::agent::heartbeat::{self, Identity};
use kernelvisor::agent::registry::KernelRegistry;
use kernelvisor::agent::Agent;
use kernelvisor::config::{AgentConfig, OnShutdown};
use kernelvisor::rpc::{Call, Dispatcher, ErrorMeta, Peer, PeerOptions, RpcServer};

/// Every agent's slots (real ones through `[resource]`, simulated ones in their heartbeats).
const AGENT_CPU: &str = "8";
const AGENT_MEM: u64 = 16 << 30;
const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

fn kv(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Runs blocking work (HTTP) off the actix thread, so this process's agents keep answering.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    actix_rt::task::spawn_blocking(f)
        .await
        .expect("blocking task panicked")
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

// ---------------------------------------------------------------------------------------------
// The manager process.

/// The manager child; killed (SIGTERM, then SIGKILL) when dropped, also on failure.
struct ManagerProc {
    child: Child,
    api: String,
    intake_port: u16,
    log: PathBuf,
    /// `[api] admin-token-file`, in the bench's directory.
    token_file: PathBuf,
    config: PathBuf,
}

impl ManagerProc {
    /// A manager on a fresh SQLite store in `dir`, agents beating every `interval`.
    fn spawn(bin: &str, dir: &Path, interval: Duration) -> anyhow::Result<ManagerProc> {
        let (intake_port, api_port) = (free_port()?, free_port()?);
        let token_file = dir.join("admin-token");
        let secs = interval.as_secs_f64();
        // Timeout 3 intervals (as 40 s of 20 s); the grace is capped at 4 intervals, so a restart
        // measures when the grace ends because every agent reported, not the cap.
        let config = format!(
            "[manager]\nevent-listen-addr = {{ host = \"127.0.0.1\", port = {intake_port} }}\n\
             heartbeat-interval = {secs}\nheartbeat-timeout = {timeout}\nstartup-grace = {grace}\n\n\
             [agent-pool]\nhealth-check-interval = {sweep}\nhealth-check-spread = 0.001\nping-timeout = 5\n\n\
             [store]\nurl = \"sqlite://{db}\"\n\n\
             [api]\nlisten-addr = {{ host = \"127.0.0.1\", port = {api_port} }}\n\
             admin-token-file = \"{token_file}\"\n\n\
             [logging]\nlevel = \"warn\"\n",
            timeout = 3.0 * secs,
            grace = 4.0 * secs,
            sweep = env_or("KV_BENCH_SWEEP_INTERVAL", 10.0),
            db = dir.join("manager.db").display(),
            token_file = token_file.display()
        );
        let path = dir.join("manager.toml");
        std::fs::write(&path, config)?;
        let log = dir.join("manager.log");
        let child = common::spawn(bin, &["manager", "--config", &path.to_string_lossy()], &log)?;
        Ok(ManagerProc {
            child,
            api: format!("http://127.0.0.1:{api_port}"),
            intake_port,
            log,
            token_file,
            config: path,
        })
    }

    /// Stops the process (SIGTERM) and starts it again on the same store, config and ports;
    /// returns when the new one is spawned.
    fn restart(&mut self, bin: &str) -> anyhow::Result<()> {
        self.terminate();
        self.child = common::spawn(
            bin,
            &["manager", "--config", &self.config.to_string_lossy()],
            &self.log,
        )?;
        Ok(())
    }

    /// The bootstrap admin key's secret (`[api] admin-token-file`), there once `/health` answers.
    fn admin_token(&self) -> anyhow::Result<String> {
        common::read_token(&self.token_file)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log_tail(&self) -> String {
        let raw = std::fs::read_to_string(&self.log).unwrap_or_default();
        // Without ANSI colour sequences.
        let mut text = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            if c == '\u{1b}' {
                chars.by_ref().find(|c| c.is_ascii_alphabetic());
            } else {
                text.push(c);
            }
        }
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// VmRSS in MiB.
    fn rss_mb(&self) -> anyhow::Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| anyhow!("no VmRSS"))?;
        Ok(kb / 1024.0)
    }

    /// User + system CPU seconds so far.
    fn cpu_s(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))?;
        // Fields after the `(comm)`: state is field 3; utime and stime are fields 14 and 15.
        let rest = &stat[stat.rfind(')').ok_or_else(|| anyhow!("bad stat"))? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Ok(ticks / hz)
    }

    fn stop(mut self) {
        self.terminate();
    }

    fn terminate(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(8);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

impl Drop for ManagerProc {
    fn drop(&mut self) {
        self.terminate();
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP (blocking ureq, always called through `blocking`).

#[derive(Clone)]
struct Http {
    base: String,
    agent: ureq::Agent,
    /// `Authorization: Bearer …` for every request (none for `/health` before the token is read).
    auth: Option<String>,
}

impl Http {
    fn new(base: &str) -> Http {
        Http {
            base: base.to_owned(),
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(60))
                .build(),
            auth: None,
        }
    }

    /// The same client, sending `token` as the bearer token.
    fn with_token(&self, token: &str) -> Http {
        Http {
            auth: Some(format!("Bearer {token}")),
            ..self.clone()
        }
    }

    /// A `method` request to `path`, with the `Authorization` header when there is a token.
    fn request(&self, method: &str, path: &str) -> ureq::Request {
        let r = self.agent.request(method, &format!("{}{path}", self.base));
        match &self.auth {
            Some(a) => r.set("Authorization", a),
            None => r,
        }
    }

    fn text(r: Result<ureq::Response, ureq::Error>) -> Result<String, String> {
        match r {
            Ok(r) => r.into_string().map_err(|e| e.to_string()),
            Err(ureq::Error::Status(code, r)) => Err(format!(
                "HTTP {code}: {}",
                r.into_string().unwrap_or_default()
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    fn get(&self, path: &str) -> Result<String, String> {
        Self::text(self.request("GET", path).call())
    }

    fn get_json(&self, path: &str) -> Result<serde_json::Value, String> {
        serde_json::from_str(&self.get(path)?).map_err(|e| e.to_string())
    }

    /// `POST /v1/sessions`: the session id and the request's wall time in ms.
    fn create_session(&self) -> Result<(String, f64), String> {
        let body = serde_json::json!({"image": "bench/any:latest", "resource_slots": {"cpu": 0.1, "mem": "64m"}});
        let t = Instant::now();
        let text = Self::text(self.request("POST", "/v1/sessions").send_json(body))?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let id = v["session_id"]
            .as_str()
            .ok_or_else(|| format!("no session_id in {text}"))?
            .to_owned();
        Ok((id, ms))
    }

    fn delete_session(&self, id: &str) -> Result<(), String> {
        Self::text(self.request("DELETE", &format!("/v1/sessions/{id}")).call()).map(|_| ())
    }
}

/// Samples (unlabelled) of the Prometheus text, by metric name.
fn parse_metrics(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

async fn metrics(http: &Http) -> anyhow::Result<HashMap<String, f64>> {
    let h = http.clone();
    let text = blocking(move || h.get("/metrics"))
        .await
        .map_err(|e| anyhow!("GET /metrics: {e}"))?;
    Ok(parse_metrics(&text))
}

async fn metric(http: &Http, name: &str) -> anyhow::Result<f64> {
    metrics(http)
        .await?
        .get(name)
        .copied()
        .ok_or_else(|| anyhow!("{name} not in /metrics"))
}

async fn delete_many(http: &Http, ids: Vec<String>, concurrency: usize) -> anyhow::Result<()> {
    let results: Vec<Result<(), String>> = futures::stream::iter(ids)
        .map(|id| {
            let h = http.clone();
            blocking(move || h.delete_session(&id))
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let failed: Vec<String> = results.into_iter().filter_map(Result::err).collect();
    if let Some(e) = failed.first() {
        bail!("{} DELETE /v1/sessions failed, e.g. {e}", failed.len());
    }
    Ok(())
}

/// `count` sequential `POST /v1/sessions`, each timed, then deleted: sorted latencies (ms)
/// and the number that failed.
async fn timed_creates(
    http: &Http,
    count: usize,
    n: usize,
    what: &str,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let (mut lat, mut created, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..count {
        let h = http.clone();
        match blocking(move || h.create_session()).await {
            Ok((id, ms)) => {
                lat.push(ms);
                created.push(id);
            }
            Err(e) => errors.push(e),
        }
    }
    if lat.is_empty() {
        bail!(
            "every POST /v1/sessions {what} failed, e.g. {}",
            errors.first().cloned().unwrap_or_default()
        );
    }
    if let Some(e) = errors.first() {
        eprintln!(
            "[{n} agents] {} of {count} creates {what} failed, e.g. {e}",
            errors.len()
        );
    }
    delete_many(http, created, 8)
        .await
        .with_context(|| format!("deleting the sessions created {what}"))?;
    lat.sort_by(f64::total_cmp);
    Ok((lat, errors.len()))
}

// ---------------------------------------------------------------------------------------------
// Agents.

/// A simulated agent's kernels: kernel id → session id.
type SimKernels = Arc<Mutex<HashMap<String, String>>>;

fn sim_dispatcher(agent_id: &str, kernels: SimKernels) -> Dispatcher {
    let mut d = Dispatcher::new(Some(agent_id.to_owned()));
    kernelvisor::agent::methods::register(&mut d, agent_id); // ping, health, gather_hwinfo
    let (k, id) = (kernels.clone(), agent_id.to_owned());
    d.register("create_kernels", move |call| {
        let (k, agent_id) = (k.clone(), id.clone());
        async move {
            let session = call
                .arg(0, "session_id")
                .and_then(Value::as_str)
                .ok_or_else(|| ErrorMeta::new("TypeError", "session_id"))?
                .to_owned();
            let ids = call
                .arg(1, "kernel_ids")
                .and_then(Value::as_array)
                .ok_or_else(|| ErrorMeta::new("TypeError", "kernel_ids"))?;
            let configs = call
                .arg(2, "configs")
                .and_then(Value::as_array)
                .ok_or_else(|| ErrorMeta::new("TypeError", "configs"))?;
            let field = |c: &Value, key: &str| {
                c.as_map()
                    .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(key)))
                    .map(|(_, v)| v.clone())
                    .unwrap_or(Value::Nil)
            };
            let mut infos = Vec::new();
            for (kid, config) in ids.iter().zip(configs) {
                let kid = kid.as_str().unwrap_or_default().to_owned();
                k.lock().unwrap().insert(kid.clone(), session.clone());
                // Backend.AI's `KernelCreationResult` keys, then kernelvisor's info keys.
                infos.push(kv(vec![
                    ("kernel_host", "127.0.0.1".into()),
                    ("repl_in_port", 0.into()),
                    ("repl_out_port", 0.into()),
                    ("stdin_port", 0.into()),
                    ("stdout_port", 0.into()),
                    ("resource_spec", Value::Map(vec![])),
                    ("attached_devices", Value::Map(vec![])),
                    ("agent_addr", "tcp://127.0.0.1:0".into()),
                    ("scaling_group", "default".into()),
                    ("id", kid.clone().into()),
                    ("kernel_id", kid.clone().into()),
                    ("session_id", session.clone().into()),
                    ("agent_id", agent_id.clone().into()),
                    ("status", "RUNNING".into()),
                    ("container_id", format!("sim-{kid}").into()),
                    ("image", field(config, "image")),
                    ("host_ports", Value::Array(vec![])),
                    ("service_ports", Value::Array(vec![])),
                    ("resource_slots", field(config, "resource_slots")),
                    ("gpus", Value::Array(vec![])),
                    ("reason", Value::Nil),
                    ("exit_code", Value::Nil),
                ]));
            }
            Ok(Value::Array(infos))
        }
    });
    let k = kernels.clone();
    d.register("destroy_kernel", move |call| {
        let k = k.clone();
        async move {
            let kid = call
                .arg(0, "kernel_id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            match k.lock().unwrap().remove(&kid) {
                Some(_) => Ok(Value::Nil),
                None => Err(ErrorMeta::new("KernelNotFound", kid)),
            }
        }
    });
    d.register("reset_agent", move |_| {
        let k = kernels.clone();
        async move {
            let n = std::mem::take(&mut *k.lock().unwrap()).len();
            Ok(kv(vec![("destroyed", (n as u64).into())]))
        }
    });
    d.alias("reset_instance", "reset_agent");
    d
}

/// Where an agent's heartbeats come from.
enum Source {
    /// A real agent: its own `heartbeat::build`.
    Real {
        id: String,
        ctx: Arc<AgentContext>,
        registry: Addr<KernelRegistry>,
        identity: Identity,
        images: Box<heartbeat::LocalImages>,
    },
    /// A simulated one: the documented map, built here.
    Sim {
        id: String,
        addr: String,
        kernels: SimKernels,
    },
}

impl Source {
    fn id(&self) -> &str {
        match self {
            Source::Real { id, .. } | Source::Sim { id, .. } => id,
        }
    }

    /// The heartbeat map; a real agent's is rebuilt at most once a second (its kernel list),
    /// otherwise the cached one gets a fresh `ts`.
    async fn info(&self, cache: &mut Option<(Instant, Value)>) -> Value {
        match self {
            Source::Real {
                ctx,
                registry,
                identity,
                images,
                ..
            } => {
                if cache
                    .as_ref()
                    .is_none_or(|(at, _)| at.elapsed() > Duration::from_secs(1))
                {
                    *cache = Some((
                        Instant::now(),
                        heartbeat::build(ctx, registry, identity, images).await,
                    ));
                }
                let mut v = cache.as_ref().expect("cached").1.clone();
                if let Value::Map(m) = &mut v {
                    for (k, val) in m.iter_mut() {
                        if k.as_str() == Some("ts") {
                            *val = Value::F64(now_unix());
                        }
                    }
                }
                v
            }
            Source::Sim { id, addr, kernels } => {
                let live: Vec<Value> = kernels
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(k, s)| {
                        kv(vec![
                            ("id", k.clone().into()),
                            ("session_id", s.clone().into()),
                            ("status", "RUNNING".into()),
                        ])
                    })
                    .collect();
                let slots = |cpu: &str, mem: u64| {
                    kv(vec![
                        ("cpu", cpu.into()),
                        ("mem", mem.to_string().into()),
                        ("cuda.device", "0".into()),
                    ])
                };
                kv(vec![
                    ("agent_id", id.clone().into()),
                    ("region", "local".into()),
                    ("addr", addr.clone().into()),
                    ("public_key", Value::Nil),
                    ("version", env!("CARGO_PKG_VERSION").into()),
                    ("architecture", std::env::consts::ARCH.into()),
                    ("ts", Value::F64(now_unix())),
                    (
                        "slots",
                        kv(vec![
                            ("total", slots(AGENT_CPU, AGENT_MEM)),
                            ("available", slots(AGENT_CPU, AGENT_MEM)),
                            ("occupied", slots("0", 0)),
                        ]),
                    ),
                    ("kernels", Value::Array(live)),
                ])
            }
        }
    }
}

fn real_agent_config(
    dir: &Path,
    id: &str,
    intake_port: u16,
    interval: Duration,
) -> anyhow::Result<AgentConfig> {
    let d = dir.join(id);
    std::fs::create_dir_all(&d)?;
    let toml = format!(
        "[agent]\nid = \"{id}\"\nrpc-listen-addr = {{ host = \"127.0.0.1\", port = 0 }}\nservice-addr = {{ host = \"127.0.0.1\", port = 0 }}\n\
         var-base-path = \"{v}\"\nbackend = \"dummy\"\non-shutdown = \"terminate\"\n\n\
         [manager]\nevent-addr = {{ host = \"127.0.0.1\", port = {intake_port} }}\nheartbeat-interval = {hb}\nevent-ack-timeout = 2\nevent-retry-max = 1\n\n\
         [container]\nport-range = [31900, 31999]\nbind-host = \"127.0.0.1\"\nscratch-root = \"{s}\"\n\n\
         [resource]\nreserved-cpu = 0\nreserved-mem = 0\ncpu = {AGENT_CPU}\nmem = {AGENT_MEM}\n\n\
         [stats]\nnode-interval = 60\ncontainer-interval = 60\ngpu-interval = 60\n\n[logging]\nlevel = \"error\"\n",
        v = d.join("var").display(),
        s = d.join("scratches").display(),
        hb = interval.as_secs_f64(),
    );
    let path = d.join("agent.toml");
    std::fs::write(&path, toml)?;
    Ok(AgentConfig::load(&path)?)
}

// ---------------------------------------------------------------------------------------------
// Heartbeat load, on its own arbiter thread.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// The bench sends nothing (real agents still beat every second on their own).
    Paused,
    /// Simulated agents beat every second (real ones on their own).
    Paced,
    /// Every agent beats again as soon as the manager answered.
    Fast,
    Stop,
}

#[derive(Default)]
struct LoadStats {
    connected: AtomicU64,
    sent: AtomicU64,
    failed: AtomicU64,
    done: AtomicU64,
}

struct Load {
    mode: watch::Sender<Mode>,
    stats: Arc<LoadStats>,
    arbiter: actix_rt::Arbiter,
    agents: u64,
}

impl Load {
    /// Heartbeats of `sources` to `intake`: paced every `interval` (spread over it), or as fast
    /// as answered. Sources share `groups` connections (DEALERs), source i the (i mod groups)-th:
    /// the manager's intake takes any agent's heartbeat on any connection (no CURVE here), and a
    /// connection per simulated agent would cost the manager a descriptor each on top of its
    /// pool's one (this machine's hard RLIMIT_NOFILE is 20,000).
    fn start(sources: Vec<Source>, intake: String, interval: Duration, groups: usize) -> Load {
        let (mode, rx) = watch::channel(Mode::Paced);
        let stats = Arc::new(LoadStats::default());
        let arbiter = actix_rt::Arbiter::new();
        let n = sources.len();
        let st = stats.clone();
        arbiter.spawn_fn(move || {
            let zmq = kernelvisor::rpc::context::SizedContext::new(groups as i32 + 64, 1)
                .expect("a ZeroMQ context");
            let conns: Vec<Conn> = (0..groups.max(1)).map(|_| Conn::default()).collect();
            for (i, src) in sources.into_iter().enumerate() {
                // Paced beats spread over the interval.
                let offset = interval.mul_f64(i as f64 / n as f64);
                actix_rt::spawn(beat_loop(
                    src,
                    intake.clone(),
                    zmq.clone(),
                    conns[i % conns.len()].clone(),
                    rx.clone(),
                    st.clone(),
                    offset,
                    interval,
                ));
            }
        });
        Load {
            mode,
            stats,
            arbiter,
            agents: n as u64,
        }
    }

    fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    fn sent(&self) -> u64 {
        self.stats.sent.load(Ordering::Relaxed)
    }

    async fn stop(self) {
        self.set(Mode::Stop);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.stats.done.load(Ordering::Relaxed) < self.agents && Instant::now() < deadline {
            actix_rt::time::sleep(Duration::from_millis(20)).await;
        }
        // Let the peers' I/O tasks see their Close.
        actix_rt::time::sleep(Duration::from_millis(150)).await;
        self.arbiter.stop();
        let arbiter = self.arbiter;
        blocking(move || arbiter.join()).await.ok();
    }
}

/// A connection to the intake shared by a group of sources (one arbiter thread).
type Conn = std::rc::Rc<std::cell::RefCell<Option<Peer>>>;

#[allow(clippy::too_many_arguments)]
async fn beat_loop(
    src: Source,
    intake: String,
    zmq: kernelvisor::rpc::context::SizedContext,
    conn: Conn,
    mut mode: watch::Receiver<Mode>,
    stats: Arc<LoadStats>,
    offset: Duration,
    interval: Duration,
) {
    let opts = PeerOptions {
        endpoint: intake,
        curve: None,
        keepalive: None,
        handshake_timeout: Duration::from_secs(10),
    };
    let mut cache = None;
    let mut next = tokio::time::Instant::now() + offset;
    let real = matches!(src, Source::Real { .. });
    loop {
        let m = *mode.borrow_and_update();
        match m {
            Mode::Stop => break,
            Mode::Paused => {
                if mode.changed().await.is_err() {
                    break;
                }
                continue;
            }
            Mode::Paced if real => {
                if mode.changed().await.is_err() {
                    break;
                }
                continue;
            }
            Mode::Paced => {
                tokio::select! {
                    _ = tokio::time::sleep_until(next) => {
                        let now = tokio::time::Instant::now();
                        next += interval;
                        if next < now {
                            next = now + interval;
                        }
                    }
                    r = mode.changed() => {
                        if r.is_err() {
                            break;
                        }
                        continue;
                    }
                }
            }
            Mode::Fast => {}
        }
        let shared = conn.borrow().clone();
        let p = match shared {
            Some(p) => p,
            None => match Peer::connect(&zmq, &opts).await {
                Ok(p) => {
                    stats.connected.fetch_add(1, Ordering::Relaxed);
                    *conn.borrow_mut() = Some(p.clone());
                    p
                }
                Err(_) => {
                    stats.failed.fetch_add(1, Ordering::Relaxed);
                    actix_rt::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            },
        };
        let info = src.info(&mut cache).await;
        let call = Call {
            args: vec![src.id().into(), info],
            kwargs: vec![],
            peer_user_id: None,
        };
        match p
            .call(heartbeat::HEARTBEAT_METHOD, &call, HEARTBEAT_TIMEOUT)
            .await
        {
            Ok(_) => {
                stats.sent.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                stats.failed.fetch_add(1, Ordering::Relaxed);
                if e.is_connection_error() {
                    // Whoever notices first reconnects the group.
                    if let Some(old) = conn.borrow_mut().take() {
                        old.close();
                    }
                }
            }
        }
    }
    if let Some(p) = conn.borrow_mut().take() {
        p.close();
    }
    stats.done.fetch_add(1, Ordering::Relaxed);
}

// ---------------------------------------------------------------------------------------------
// Simulated agents in child processes (this bench binary again, `KV_BENCH_SIM_HOST` set): one
// process holds at most SIM_PER_HOST agents' sockets (listener, mailbox and the manager's
// connection each), within this machine's 20,000 open files per process.

const SIM_PER_HOST: usize = 2500;
/// Heartbeat connections per host.
const SIM_CONNS: usize = 16;

/// A child's part: `first:count:intake:interval_secs`.
fn sim_host_main(spec: &str) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let f: Vec<&str> = spec.split('|').collect();
    let [first, count, intake, interval] = f[..] else {
        bail!("KV_BENCH_SIM_HOST={spec}: expected first|count|intake|interval");
    };
    let (first, count): (usize, usize) = (first.parse()?, count.parse()?);
    let interval = Duration::from_secs_f64(interval.parse()?);
    kernelvisor::limits::ensure_open_files((count * 4 + 1024) as u64, "a bench sim host")?;
    actix_rt::System::new().block_on(async move {
        let ctx = kernelvisor::rpc::context::SizedContext::new(count as i32 + 64, 1)?;
        let mut servers = Vec::with_capacity(count);
        let mut sources = Vec::with_capacity(count);
        for i in first..first + count {
            let id = format!("bench-s{i:05}");
            let kernels = SimKernels::default();
            let server = RpcServer::bind_in(
                &ctx,
                "tcp://127.0.0.1:0",
                sim_dispatcher(&id, kernels.clone()),
            )
            .with_context(|| format!("simulated agent {id}"))?;
            let addr = server.endpoint().to_owned();
            servers.push(server.start());
            sources.push(Source::Sim { id, addr, kernels });
        }
        let load = Load::start(sources, intake.to_owned(), interval, SIM_CONNS);
        println!("ready");
        std::io::stdout().flush()?;
        // Commands on stdin, counters on stdout.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        loop {
            tokio::select! {
                cmd = rx.recv() => match cmd.as_deref() {
                    Some("paced") => load.set(Mode::Paced),
                    Some("fast") => load.set(Mode::Fast),
                    Some("paused") => load.set(Mode::Paused),
                    _ => break,
                },
                _ = tick.tick() => {
                    println!("sent {} failed {}", load.sent(), load.stats.failed.load(Ordering::Relaxed));
                    std::io::stdout().flush()?;
                }
            }
        }
        load.stop().await;
        for s in servers {
            let _ = s.send(kernelvisor::rpc::server::Shutdown).await;
        }
        anyhow::Ok(())
    })
}

/// The child processes holding the simulated agents.
struct SimHosts {
    hosts: Vec<SimHost>,
}

struct SimHost {
    child: Child,
    stdin: std::process::ChildStdin,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl SimHosts {
    /// Starts hosts for agents `first..first + count` (SIM_PER_HOST each) and waits until each
    /// has bound its agents.
    fn start(
        first: usize,
        count: usize,
        intake: &str,
        interval: Duration,
        log_dir: &Path,
    ) -> anyhow::Result<SimHosts> {
        use std::io::BufRead;
        let exe = std::env::current_exe()?;
        let mut hosts = Vec::new();
        let mut start = first;
        while start < first + count {
            let n = SIM_PER_HOST.min(first + count - start);
            let log = std::fs::File::create(log_dir.join(format!("sim-{start}.log")))?;
            let mut cmd = std::process::Command::new(&exe);
            cmd.env(
                "KV_BENCH_SIM_HOST",
                format!("{start}|{n}|{intake}|{}", interval.as_secs_f64()),
            )
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(log);
            // SAFETY: prctl is async-signal-safe; the host dies with the bench (with the thread
            // that spawns it, to be exact: call this from a thread that lives as long).
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
            let mut child = cmd.spawn()?;
            let stdin = child.stdin.take().expect("piped");
            let mut lines = std::io::BufReader::new(child.stdout.take().expect("piped")).lines();
            match lines.next() {
                Some(Ok(l)) if l == "ready" => {}
                other => bail!("sim host {start}: {other:?} instead of ready (see its log)"),
            }
            let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
            let (s2, f2) = (sent.clone(), failed.clone());
            std::thread::spawn(move || {
                for line in lines.map_while(Result::ok) {
                    let f: Vec<&str> = line.split_whitespace().collect();
                    if let ["sent", s, "failed", fl] = f[..] {
                        s2.store(s.parse().unwrap_or(0), Ordering::Relaxed);
                        f2.store(fl.parse().unwrap_or(0), Ordering::Relaxed);
                    }
                }
            });
            hosts.push(SimHost {
                child,
                stdin,
                sent,
                failed,
            });
            start += n;
        }
        Ok(SimHosts { hosts })
    }

    fn set(&mut self, mode: Mode) {
        use std::io::Write;
        let cmd = match mode {
            Mode::Paced => "paced",
            Mode::Fast => "fast",
            Mode::Paused => "paused",
            Mode::Stop => "stop",
        };
        for h in &mut self.hosts {
            let _ = writeln!(h.stdin, "{cmd}");
            let _ = h.stdin.flush();
        }
    }

    fn sent(&self) -> u64 {
        self.hosts
            .iter()
            .map(|h| h.sent.load(Ordering::Relaxed))
            .sum()
    }

    fn failed(&self) -> u64 {
        self.hosts
            .iter()
            .map(|h| h.failed.load(Ordering::Relaxed))
            .sum()
    }

    fn stop(mut self) {
        self.set(Mode::Stop);
        let deadline = Instant::now() + Duration::from_secs(15);
        for h in &mut self.hosts {
            while Instant::now() < deadline {
                if let Ok(Some(_)) = h.child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = h.child.kill();
            let _ = h.child.wait();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One phase.

struct Row {
    agents: usize,
    real: usize,
    interval: f64,
    hb_real_per_s: f64,
    hb_per_s: f64,
    hb_sent_per_s: f64,
    mgr_cpu_pct: f64,
    sweep_ms: f64,
    sweeps: Vec<f64>,
    sweep_entries: usize,
    create_p50: f64,
    create_p99: f64,
    flood_p50: f64,
    flood_p99: f64,
    creates_ok: usize,
    create_errors: usize,
    warm_s: f64,
    alive_s: f64,
    rss_mb: f64,
    grace_exit_s: f64,
    hb_failed: u64,
}

/// What a phase started, torn down in reverse whatever happened.
#[derive(Default)]
struct World {
    real: Vec<Agent>,
    hosts: Option<SimHosts>,
    load: Option<Load>,
}

impl World {
    async fn teardown(mut self) {
        if let Some(load) = self.load.take() {
            load.stop().await;
        }
        // Real agents first, while the manager still takes their last events.
        futures::future::join_all(
            self.real
                .drain(..)
                .map(|a| a.shutdown(OnShutdown::Terminate)),
        )
        .await;
        if let Some(hosts) = self.hosts.take() {
            blocking(move || hosts.stop()).await;
        }
    }
}

async fn wait_for<F, Fut>(limit: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let start = Instant::now();
    let mut last_err = None;
    loop {
        match check().await {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last_err = Some(e),
        }
        if start.elapsed() > limit {
            bail!(
                "timed out after {limit:?} waiting for {what}{}",
                last_err
                    .map(|e| format!(" (last error: {e:#})"))
                    .unwrap_or_default()
            );
        }
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn run_phase(
    bin: &str,
    n: usize,
    real_max: usize,
    sessions: usize,
    window: Duration,
    interval: Duration,
) -> anyhow::Result<Row> {
    let dir = tempfile::Builder::new()
        .prefix("kv-bench-manager-")
        .tempdir()?;
    let mut mgr = ManagerProc::spawn(bin, dir.path(), interval)?;
    let http = Http::new(&mgr.api);
    let mut world = World::default();
    let result = measure(
        bin,
        &mut mgr,
        &http,
        &mut world,
        dir.path(),
        (n, real_max, sessions),
        window,
        interval,
    )
    .await;
    world.teardown().await;
    let result = result.map_err(|e| {
        anyhow!(
            "{e:#}\n--- manager log tail ({}) ---\n{}",
            mgr.log.display(),
            mgr.log_tail()
        )
    });
    mgr.stop();
    drop(dir);
    result
}

/// `kernelvisor_manager_heartbeats_total` per second over `window`, and the manager's CPU share
/// and the bench's sent heartbeats per second over it.
async fn heartbeat_rate(
    http: &Http,
    mgr: &ManagerProc,
    sent: impl Fn() -> u64,
    window: Duration,
) -> anyhow::Result<(f64, f64, f64)> {
    let (hb0, cpu0, sent0, w0) = (
        metric(http, "kernelvisor_manager_heartbeats_total").await?,
        mgr.cpu_s()?,
        sent(),
        Instant::now(),
    );
    actix_rt::time::sleep(window).await;
    let (hb1, cpu1, sent1, w1) = (
        metric(http, "kernelvisor_manager_heartbeats_total").await?,
        mgr.cpu_s()?,
        sent(),
        Instant::now(),
    );
    let secs = (w1 - w0).as_secs_f64();
    Ok((
        (hb1 - hb0) / secs,
        (cpu1 - cpu0) / secs * 100.0,
        sent1.saturating_sub(sent0) as f64 / secs,
    ))
}

/// Waits until the manager's `/health` is `normal` with `n` agents ALIVE.
async fn wait_all_alive(http: &Http, n: usize, limit: Duration, what: &str) -> anyhow::Result<()> {
    wait_for(limit, what, || {
        let h = http.clone();
        async move {
            let v = blocking(move || h.get_json("/health"))
                .await
                .map_err(|e| anyhow!(e))?;
            Ok(v["mode"] == "normal" && v["agents_alive"].as_u64() == Some(n as u64))
        }
    })
    .await
}

#[allow(clippy::too_many_arguments)]
async fn measure(
    bin: &str,
    mgr: &mut ManagerProc,
    http: &Http,
    world: &mut World,
    dir: &Path,
    (n, real_max, sessions): (usize, usize, usize),
    window: Duration,
    interval: Duration,
) -> anyhow::Result<Row> {
    let t0 = Instant::now();
    wait_for(Duration::from_secs(30), "the manager's /health", || {
        let h = http.clone();
        async move { Ok(blocking(move || h.get("/health")).await.is_ok()) }
    })
    .await?;
    // Every other route wants a token: act as the bootstrap admin key from here on.
    let http = &http.with_token(&mgr.admin_token()?);
    let intake = format!("tcp://127.0.0.1:{}", mgr.intake_port);

    // Agents: real ones first (their ids sort first, so placement uses them first), then
    // simulated ones in child processes.
    let real = real_max.min(n);
    let mut sources = Vec::with_capacity(real);
    for i in 0..real {
        let id = format!("bench-r{i:04}");
        let config = real_agent_config(&dir.join("agents"), &id, mgr.intake_port, interval)?;
        let agent = Agent::start(config, None)
            .await
            .with_context(|| format!("real agent {id}"))?;
        let identity = Identity {
            region: "local".into(),
            rpc_addr: agent.endpoint().to_owned(),
            public_key: None,
        };
        sources.push(Source::Real {
            id,
            ctx: agent.ctx.clone(),
            registry: agent.registry(),
            identity,
            images: Box::default(),
        });
        world.real.push(agent);
    }
    if n > real {
        // Spawned from this (the System's, long-lived) thread: the hosts die with the thread that
        // spawned them (PR_SET_PDEATHSIG), and a blocking-pool thread exits when idle.
        let hosts =
            SimHosts::start(real, n - real, &intake, interval, dir).context("simulated agents")?;
        world.hosts = Some(hosts);
    }
    let started_agents = t0.elapsed();
    // The real agents' heartbeats, for the flood (paced, they beat on their own).
    world.load = Some(Load::start(sources, intake.clone(), interval, real.max(1)));
    let limit = Duration::from_secs(60) + interval * 3;
    wait_all_alive(http, n, limit, &format!("{n} ALIVE agents")).await?;
    let alive_s = t0.elapsed().as_secs_f64();
    eprintln!(
        "[{n} agents] {real} real + {} simulated started in {:.1} s; all ALIVE after {alive_s:.1} s",
        n - real,
        started_agents.as_secs_f64(),
    );

    // The pool connects to every agent from its first heartbeat: wait for all n peers.
    let t = Instant::now();
    wait_for(limit, &format!("{n} healthy pool entries"), || {
        let h = http.clone();
        async move {
            let m = metrics(&h).await?;
            let healthy = m
                .iter()
                .find(|(k, _)| {
                    k.starts_with("kernelvisor_manager_pool_entries")
                        && k.contains("healthy")
                        && !k.contains("unhealthy")
                })
                .map_or(0.0, |(_, v)| *v);
            Ok(healthy as usize >= n)
        }
    })
    .await?;
    let warm_s = t.elapsed().as_secs_f64();
    eprintln!("[{n} agents] every agent has a healthy pool peer {warm_s:.1} s later");

    let set = |world: &mut World, mode: Mode| {
        if let Some(l) = &world.load {
            l.set(mode);
        }
        if let Some(h) = &mut world.hosts {
            h.set(mode);
        }
    };
    let sent = |world: &World| {
        world.load.as_ref().map_or(0, Load::sent) + world.hosts.as_ref().map_or(0, SimHosts::sent)
    };

    // The fleet's real rate: creates, then the heartbeats applied per second.
    let (lat, errors) = timed_creates(http, sessions, n, "at the real heartbeat rate").await?;
    let (hb_real_per_s, _, _) = {
        let w: &World = world;
        heartbeat_rate(http, mgr, || sent(w), window.max(interval)).await?
    };

    // Sweeps: with the bench's heartbeats paused, after one full interval, the next 3 sweeps.
    let sweep_every = Duration::from_secs_f64(env_or("KV_BENCH_SWEEP_INTERVAL", 10.0));
    set(world, Mode::Paused);
    actix_rt::time::sleep(sweep_every + Duration::from_millis(200)).await;
    let key = |m: &HashMap<String, f64>| {
        (
            m.get("kernelvisor_manager_pool_last_sweep_seconds")
                .copied(),
            m.get("kernelvisor_manager_pool_last_sweep_entries")
                .copied(),
        )
    };
    let mut last = key(&metrics(http).await?);
    let mut sweeps = Vec::new();
    let mut sweep_entries = 0usize;
    let deadline = Instant::now() + sweep_every * 4 + Duration::from_secs(5);
    while sweeps.len() < 3 && Instant::now() < deadline {
        actix_rt::time::sleep(Duration::from_millis(150)).await;
        let k = key(&metrics(http).await?);
        if k != last {
            if let (Some(s), Some(e)) = k {
                sweep_entries = e as usize;
                if sweep_entries == n {
                    sweeps.push(s * 1e3);
                }
            }
            last = k;
        }
    }
    if sweeps.is_empty() {
        bail!("no health-check sweep over {n} entries (last sweep pinged {sweep_entries})");
    }
    let mut sorted = sweeps.clone();
    sorted.sort_by(f64::total_cmp);
    let sweep_ms = sorted[sorted.len() / 2];

    // Flood: every agent beats again as soon as answered; creates under it.
    set(world, Mode::Fast);
    actix_rt::time::sleep(Duration::from_secs(1)).await;
    let (hb_per_s, mgr_cpu_pct, hb_sent_per_s) = {
        let w: &World = world;
        heartbeat_rate(http, mgr, || sent(w), window).await?
    };
    // Fewer: under the flood each create queues behind heartbeats for the one thread.
    let (flood, flood_errors) = timed_creates(http, sessions.min(10), n, "under the flood").await?;
    set(world, Mode::Paced);
    let rss_mb = mgr.rss_mb()?;
    let hb_failed = world
        .load
        .as_ref()
        .map_or(0, |l| l.stats.failed.load(Ordering::Relaxed))
        + world.hosts.as_ref().map_or(0, SimHosts::failed);

    // A restarted manager: out of its grace once every agent (known ALIVE) has reported and the
    // store is reconciled; the agents beat at the real rate meanwhile.
    actix_rt::time::sleep(Duration::from_secs(1)).await;
    // (Blocks this thread, the real agents' too, for the few ms the manager takes to stop.)
    mgr.restart(bin).context("restarting the manager")?;
    let restarted = Instant::now();
    wait_all_alive(
        http,
        n,
        interval * 6,
        "the restarted manager to leave its grace with every agent",
    )
    .await?;
    let grace_exit_s = restarted.elapsed().as_secs_f64();
    eprintln!("[{n} agents] restarted manager out of its grace after {grace_exit_s:.1} s; done in {:.1} s", t0.elapsed().as_secs_f64());
    Ok(Row {
        agents: n,
        real,
        interval: interval.as_secs_f64(),
        hb_real_per_s,
        hb_per_s,
        hb_sent_per_s,
        mgr_cpu_pct,
        sweep_ms,
        sweeps,
        sweep_entries,
        create_p50: percentile(&lat, 0.5),
        create_p99: percentile(&lat, 0.99),
        flood_p50: percentile(&flood, 0.5),
        flood_p99: percentile(&flood, 0.99),
        creates_ok: lat.len() + flood.len(),
        create_errors: errors + flood_errors,
        warm_s,
        alive_s,
        rss_mb,
        grace_exit_s,
        hb_failed,
    })
}

fn main() {
    if let Ok(spec) = std::env::var("KV_BENCH_SIM_HOST") {
        if let Err(e) = sim_host_main(&spec) {
            eprintln!("sim host: {e:#}");
            std::process::exit(1);
        }
        return;
    }
    if let Err(e) = kernelvisor::limits::raise_open_files() {
        eprintln!("could not raise the open-file limit: {e}");
    }
    let counts: Vec<usize> = std::env::var("KV_BENCH_AGENTS")
        .ok()
        .map(|s| s.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .filter(|v: &Vec<usize>| !v.is_empty())
        .unwrap_or_else(|| vec![1000, 10000]);
    let real_max: usize = env_or("KV_BENCH_REAL_AGENTS", 100);
    let sessions: usize = env_or("KV_BENCH_SESSIONS", 50);
    let window = Duration::from_secs_f64(env_or("KV_BENCH_WINDOW", 5.0));
    let interval = Duration::from_secs_f64(env_or("KV_BENCH_HEARTBEAT_INTERVAL", 20.0));
    let bin = env!("CARGO_BIN_EXE_kernelvisor");

    let started = Instant::now();
    let rows = actix_rt::System::new().block_on(async move {
        let mut rows = Vec::new();
        for n in counts {
            match run_phase(bin, n, real_max, sessions, window, interval).await {
                Ok(r) => rows.push(r),
                Err(e) => {
                    eprintln!("manager bench failed at {n} agents: {e:#}");
                    return Err(());
                }
            }
        }
        Ok(rows)
    });
    let Ok(rows) = rows else {
        std::process::exit(1)
    };

    println!(
        "\nkernelvisor manager bench: one manager process (SQLite store, event intake and agents WITHOUT CURVE), dummy container backend, {} cores, {:.0} s",
        std::thread::available_parallelism().map(usize::from).unwrap_or(0),
        started.elapsed().as_secs_f64()
    );
    println!(
        "real rate: every agent beats every {:.0} s; flood: each resends on the answer, for {:.0} s; heartbeats counted by kernelvisor_manager_heartbeats_total",
        interval.as_secs_f64(),
        window.as_secs_f64()
    );
    let sweep_every: f64 = env_or("KV_BENCH_SWEEP_INTERVAL", 10.0);
    println!("sweep: [agent-pool] health-check-interval = {sweep_every} unpaced (health-check-spread = 0.001: only the 256-in-flight bound; a manager's default spreads a sweep's pings over half the interval), median of 3; creates: {sessions} sequential POST /v1/sessions (cpu 0.1, mem 64m) at the real rate, {} under the flood; grace: SIGTERM, restart on the same store, until /health is normal with every agent ALIVE\n", sessions.min(10));
    println!(
        "{:>7} {:>20} {:>11} {:>11} {:>8} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "agents",
        "kind",
        "hb/s real",
        "hb/s flood",
        "mgr CPU",
        "sweep ms",
        "create50",
        "create99",
        "flood50",
        "flood99",
        "RSS MiB",
        "grace s"
    );
    for r in &rows {
        let kind = if r.real == r.agents {
            format!("{} real", r.real)
        } else {
            format!("{} real + {} sim", r.real, r.agents - r.real)
        };
        println!(
            "{:>7} {:>20} {:>11.0} {:>11.0} {:>7.0}% {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>9.2} {:>8.1} {:>8.1}",
            r.agents,
            kind,
            r.hb_real_per_s,
            r.hb_per_s,
            r.mgr_cpu_pct,
            r.sweep_ms,
            r.create_p50,
            r.create_p99,
            r.flood_p50,
            r.flood_p99,
            r.rss_mb,
            r.grace_exit_s
        );
    }
    println!();
    for r in &rows {
        println!(
            "{} agents: all ALIVE {:.1} s after start; flood heartbeats sent and answered {:.0}/s, {} heartbeat call failures; sweeps {:?} ms over {} entries; creates {} ok / {} failed; pool peers to all {} agents {:.1} s after ALIVE; grace exit {:.1} s = {:.2} × the interval",
            r.agents,
            r.alive_s,
            r.hb_sent_per_s,
            r.hb_failed,
            r.sweeps.iter().map(|s| (s * 100.0).round() / 100.0).collect::<Vec<_>>(),
            r.sweep_entries,
            r.creates_ok,
            r.create_errors,
            r.agents,
            r.warm_s,
            r.grace_exit_s,
            r.grace_exit_s / r.interval
        );
    }
    println!("kind: `real` = kernelvisor::agent::Agent (dummy backend) in the bench process; `sim` = wire-level agents (RpcServer + heartbeats per docs/events.md) in child processes of {SIM_PER_HOST}, their heartbeats over {SIM_CONNS} shared connections per process");
    println!("mgr CPU: the manager process's CPU during the flood (100% = one core); the bench's agents and load share the same cores");
    let json: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{{\"agents\": {}, \"heartbeats_per_s\": {:.0}, \"heartbeats_real_per_s\": {:.0}, \"sweep_ms\": {:.2}, \"create_p50_ms\": {:.2}, \"create_p99_ms\": {:.2}, \"create_flood_p50_ms\": {:.2}, \"rss_mb\": {:.1}, \"grace_exit_s\": {:.2}, \"heartbeat_interval_s\": {:.0}}}",
                r.agents, r.hb_per_s, r.hb_real_per_s, r.sweep_ms, r.create_p50, r.create_p99, r.flood_p50, r.rss_mb, r.grace_exit_s, r.interval
            )
        })
        .collect();
    println!("[{}]", json.join(", "));
}

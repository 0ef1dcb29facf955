//! The manager benches' fleet (`benches/manager.rs`, `benches/scheduler.rs`): the real
//! `kernelvisor manager` binary as a child process, its HTTP API (blocking `ureq`, called
//! through [`blocking`]), and agents: real `kernelvisor::agent::Agent`s in the bench's process
//! (dummy backend) and agents simulated at the wire level in child processes of
//! [`SIM_PER_HOST`] (`KV_BENCH_SIM_HOST`: this bench binary again, [`sim_host_main`]), an
//! `RpcServer` per agent answering `ping`, `create_kernels`, `destroy_kernel`,
//! `reset_instance` and (a single-node cluster's network, made of nothing)
//! `create_local_network` / `destroy_local_network`, and heartbeats in the `docs/events.md` format over [`SIM_CONNS`] shared
//! intake connections per process. No CURVE.

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
use kernelvisor::rpc::intake_api::heartbeat::{HeartbeatInfo, HeartbeatKernel, HeartbeatSlots};
use kernelvisor::rpc::{Call, Dispatcher, ErrorMeta, Peer, PeerOptions, RpcServer};
use kernelvisor::slots::{Amount, ResourceSlots};

use super::{env_or, free_port};

/// Every agent's slots (real ones through `[resource]`, simulated ones in their heartbeats
/// unless [`SimHosts::start`] says other cores).
pub const AGENT_CPU: u64 = 8;
pub const AGENT_MEM: u64 = 16 << 30;
pub const HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(5);

pub fn kv(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

pub fn now_unix() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// Runs blocking work (HTTP) off the actix thread, so this process's agents keep answering.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    actix_rt::task::spawn_blocking(f)
        .await
        .expect("blocking task panicked")
}

pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

// ---------------------------------------------------------------------------------------------
// The manager process.

/// `[agent-pool]` of `just bench manager`'s sweep: every pooled agent pinged every
/// `KV_BENCH_SWEEP_INTERVAL` (10 s) as fast as the 256-in-flight bound allows
/// (`health-check-spread = 0.001`), where a manager's default spreads a sweep over half its
/// interval (30 s).
pub fn unpaced_sweep() -> String {
    format!(
        "[agent-pool]\nhealth-check-interval = {}\nhealth-check-spread = 0.001\nping-timeout = 5\n\n",
        env_or("KV_BENCH_SWEEP_INTERVAL", 10.0)
    )
}

/// The manager child; killed (SIGTERM, then SIGKILL) when dropped, also on failure.
pub struct ManagerProc {
    pub child: Child,
    pub api: String,
    pub intake_port: u16,
    pub log: PathBuf,
    /// `[api] admin-token-file`, in the bench's directory.
    pub token_file: PathBuf,
    pub config: PathBuf,
}

impl ManagerProc {
    /// A manager on a fresh SQLite store in `dir`, agents beating every `interval`, its health
    /// checks unpaced ([`unpaced_sweep`]).
    pub fn spawn(bin: &str, dir: &Path, interval: Duration) -> anyhow::Result<ManagerProc> {
        Self::spawn_with(bin, dir, interval, None, &unpaced_sweep())
    }

    /// [`ManagerProc::spawn`] on the store at `store_url` (a fresh SQLite file in `dir` when
    /// `None`), with `extra` (TOML sections) appended to its config; the `[agent-pool]`
    /// section is `extra`'s (the manager's defaults when it has none).
    pub fn spawn_with(
        bin: &str,
        dir: &Path,
        interval: Duration,
        store_url: Option<&str>,
        extra: &str,
    ) -> anyhow::Result<ManagerProc> {
        let (intake_port, api_port) = (free_port()?, free_port()?);
        let token_file = dir.join("admin-token");
        let secs = interval.as_secs_f64();
        // Timeout 3 intervals (as 40 s of 20 s); the grace is capped at 4 intervals, so a restart
        // measures when the grace ends because every agent reported, not the cap.
        let config = format!(
            "[manager]\nevent-listen-addr = {{ host = \"127.0.0.1\", port = {intake_port} }}\n\
             heartbeat-interval = {secs}\nheartbeat-timeout = {timeout}\nstartup-grace = {grace}\n\n\
             [store]\nurl = \"{db}\"\n\n\
             [api]\nlisten-addr = {{ host = \"127.0.0.1\", port = {api_port} }}\n\
             admin-token-file = \"{token_file}\"\n\n\
             [logging]\nlevel = \"warn\"\n\n{extra}",
            timeout = 3.0 * secs,
            grace = 4.0 * secs,
            db = store_url.map_or_else(
                || format!("sqlite://{}", dir.join("manager.db").display()),
                str::to_owned
            ),
            token_file = token_file.display()
        );
        let path = dir.join("manager.toml");
        std::fs::write(&path, config)?;
        let log = dir.join("manager.log");
        let child = super::spawn(bin, &["manager", "--config", &path.to_string_lossy()], &log)?;
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
    pub fn restart(&mut self, bin: &str) -> anyhow::Result<()> {
        self.terminate();
        self.child = super::spawn(
            bin,
            &["manager", "--config", &self.config.to_string_lossy()],
            &self.log,
        )?;
        Ok(())
    }

    /// The bootstrap admin key's secret (`[api] admin-token-file`), there once `/health` answers.
    pub fn admin_token(&self) -> anyhow::Result<String> {
        super::read_token(&self.token_file)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_tail(&self) -> String {
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
    pub fn rss_mb(&self) -> anyhow::Result<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        let kb: f64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .ok_or_else(|| anyhow!("no VmRSS"))?;
        Ok(kb / 1024.0)
    }

    /// User + system CPU seconds so far.
    pub fn cpu_s(&self) -> anyhow::Result<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))?;
        // Fields after the `(comm)`: state is field 3; utime and stime are fields 14 and 15.
        let rest = &stat[stat.rfind(')').ok_or_else(|| anyhow!("bad stat"))? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: f64 = f[11].parse::<f64>()? + f[12].parse::<f64>()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        Ok(ticks / hz)
    }

    pub fn stop(mut self) {
        self.terminate();
    }

    pub fn terminate(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // SAFETY: signalling our own child by pid.
            unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
            if exited_by(&mut self.child, Instant::now() + Duration::from_secs(8)) {
                return;
            }
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Whether `child` exited by `deadline` (polled every 50 ms).
fn exited_by(child: &mut Child, deadline: Instant) -> bool {
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for ManagerProc {
    fn drop(&mut self) {
        self.terminate();
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP (blocking ureq, always called through `blocking`).

/// A `POST /v1/sessions` answered 201.
pub struct Created {
    /// Session id.
    pub id: String,
    /// `RUNNING`, `PULLING`, `PENDING` (queued), …
    pub status: String,
    /// The request's wall time.
    pub ms: f64,
}

#[derive(Clone)]
pub struct Http {
    base: String,
    agent: ureq::Agent,
    /// `Authorization: Bearer …` for every request (none for `/health` before the token is read).
    auth: Option<String>,
}

impl Http {
    pub fn new(base: &str) -> Http {
        Http {
            base: base.to_owned(),
            agent: ureq::AgentBuilder::new()
                .timeout(Duration::from_secs(60))
                .build(),
            auth: None,
        }
    }

    /// The same client, sending `token` as the bearer token.
    pub fn with_token(&self, token: &str) -> Http {
        Http {
            auth: Some(format!("Bearer {token}")),
            ..self.clone()
        }
    }

    /// A `method` request to `path`, with the `Authorization` header when there is a token.
    pub fn request(&self, method: &str, path: &str) -> ureq::Request {
        let r = self.agent.request(method, &format!("{}{path}", self.base));
        match &self.auth {
            Some(a) => r.set("Authorization", a),
            None => r,
        }
    }

    pub fn text(r: Result<ureq::Response, ureq::Error>) -> Result<String, String> {
        match r {
            Ok(r) => r.into_string().map_err(|e| e.to_string()),
            Err(ureq::Error::Status(code, r)) => Err(format!(
                "HTTP {code}: {}",
                r.into_string().unwrap_or_default()
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    pub fn get(&self, path: &str) -> Result<String, String> {
        Self::text(self.request("GET", path).call())
    }

    pub fn get_json(&self, path: &str) -> Result<serde_json::Value, String> {
        serde_json::from_str(&self.get(path)?).map_err(|e| e.to_string())
    }

    /// `POST /v1/sessions` of `cpu` cores and 64 MiB: the session, its status and the
    /// request's wall time.
    pub fn create_session(&self, cpu: f64) -> Result<Created, String> {
        self.create_session_with(cpu, serde_json::json!({}))
    }

    /// As [`Http::create_session`], with `extra`'s fields in the body (`priority`,
    /// `preemptible`, `restart_policy`, …).
    pub fn create_session_with(
        &self,
        cpu: f64,
        extra: serde_json::Value,
    ) -> Result<Created, String> {
        let mut body = serde_json::json!({"image": "bench/any:latest", "resource_slots": {"cpu": cpu, "mem": "64m"}});
        if let serde_json::Value::Object(m) = extra {
            for (k, v) in m {
                body[k] = v;
            }
        }
        let t = Instant::now();
        let text = Self::text(self.request("POST", "/v1/sessions").send_json(body))?;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        let field = |k: &str| {
            v[k].as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("no {k} in {text}"))
        };
        Ok(Created {
            id: field("session_id")?,
            status: field("status")?,
            ms,
        })
    }

    /// `GET path` read as it comes (server-sent events): no overall deadline, 120 s at most
    /// between two reads.
    pub fn stream(
        &self,
        path: &str,
    ) -> Result<std::io::BufReader<Box<dyn std::io::Read + Send + Sync>>, String> {
        let agent = ureq::AgentBuilder::new()
            .timeout_read(Duration::from_secs(120))
            .build();
        let mut r = agent.get(&format!("{}{path}", self.base));
        if let Some(a) = &self.auth {
            r = r.set("Authorization", a);
        }
        let resp = r.call().map_err(|e| e.to_string())?;
        Ok(std::io::BufReader::new(resp.into_reader()))
    }

    pub fn delete_session(&self, id: &str) -> Result<(), String> {
        Self::text(self.request("DELETE", &format!("/v1/sessions/{id}")).call()).map(|_| ())
    }
}

/// Samples (unlabelled) of the Prometheus text, by metric name.
pub fn parse_metrics(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

pub async fn metrics(http: &Http) -> anyhow::Result<HashMap<String, f64>> {
    let h = http.clone();
    let text = blocking(move || h.get("/metrics"))
        .await
        .map_err(|e| anyhow!("GET /metrics: {e}"))?;
    Ok(parse_metrics(&text))
}

pub async fn metric(http: &Http, name: &str) -> anyhow::Result<f64> {
    metrics(http)
        .await?
        .get(name)
        .copied()
        .ok_or_else(|| anyhow!("{name} not in /metrics"))
}

pub async fn delete_many(http: &Http, ids: Vec<String>, concurrency: usize) -> anyhow::Result<()> {
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

/// `count` sequential `POST /v1/sessions` of `cpu` cores, each timed, then deleted: sorted latencies (ms)
/// and the number that failed.
pub async fn timed_creates(
    http: &Http,
    count: usize,
    cpu: f64,
    n: usize,
    what: &str,
) -> anyhow::Result<(Vec<f64>, usize)> {
    let (mut lat, mut created, mut errors) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..count {
        let h = http.clone();
        match blocking(move || h.create_session(cpu)).await {
            Ok(c) => {
                lat.push(c.ms);
                created.push(c.id);
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
pub type SimKernels = Arc<Mutex<HashMap<String, String>>>;

pub fn sim_dispatcher(agent_id: &str, kernels: SimKernels) -> Dispatcher {
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
    // A single-node cluster session's bridge (`benches/cluster.rs`): nothing to make here.
    d.register("create_local_network", |_| async { Ok(Value::Nil) });
    d.register("destroy_local_network", |_| async { Ok(Value::Nil) });
    d
}

/// Where an agent's heartbeats come from.
pub enum Source {
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
        /// The cores it reports in total (its host's, changed by the `cpu N` command).
        cpu: Arc<AtomicU64>,
    },
}

impl Source {
    pub fn id(&self) -> &str {
        match self {
            Source::Real { id, .. } | Source::Sim { id, .. } => id,
        }
    }

    /// The heartbeat; a real agent's is rebuilt at most once a second (its kernel list),
    /// otherwise the cached one gets a fresh `ts`.
    pub async fn info(&self, cache: &mut Option<(Instant, HeartbeatInfo)>) -> Value {
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
                let beat = &mut cache.as_mut().expect("cached").1;
                beat.ts = now_unix();
                beat.to_value()
            }
            Source::Sim {
                id,
                addr,
                kernels,
                cpu,
            } => {
                let live = kernels
                    .lock()
                    .unwrap()
                    .iter()
                    .map(|(k, s)| HeartbeatKernel {
                        id: k.clone(),
                        session_id: s.clone(),
                        status: "RUNNING".into(),
                        ..Default::default()
                    })
                    .collect();
                let cores = cpu.load(Ordering::Relaxed);
                let slots = |cpu: u64, mem: u64| -> ResourceSlots {
                    [
                        ("cpu".to_owned(), Amount::from_units(cpu)),
                        ("mem".to_owned(), Amount::from_units(mem)),
                        ("cuda.device".to_owned(), Amount::ZERO),
                    ]
                    .into_iter()
                    .collect()
                };
                // As an agent that predates `slot_key_and_units` and `images` (none sent).
                HeartbeatInfo {
                    agent_id: id.clone(),
                    region: "local".into(),
                    addr: addr.clone(),
                    public_key: None,
                    version: env!("CARGO_PKG_VERSION").into(),
                    architecture: std::env::consts::ARCH.into(),
                    ts: now_unix(),
                    slots: HeartbeatSlots {
                        total: slots(cores, AGENT_MEM),
                        available: slots(cores, AGENT_MEM),
                        occupied: slots(0, 0),
                    },
                    slot_key_and_units: None,
                    kernels: live,
                    images: Vec::new(),
                }
                .to_value()
            }
        }
    }
}

pub fn real_agent_config(
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
pub enum Mode {
    /// The bench sends nothing (real agents still beat every second on their own).
    Paused,
    /// Simulated agents beat every second (real ones on their own).
    Paced,
    /// Every agent beats again as soon as the manager answered.
    Fast,
    /// As `Paced`, after one heartbeat now from every simulated agent (once per generation:
    /// a new number beats them again).
    Burst(u32),
    Stop,
}

#[derive(Default)]
pub struct LoadStats {
    pub connected: AtomicU64,
    pub sent: AtomicU64,
    pub failed: AtomicU64,
    pub done: AtomicU64,
}

pub struct Load {
    mode: watch::Sender<Mode>,
    pub stats: Arc<LoadStats>,
    arbiter: actix_rt::Arbiter,
    agents: u64,
}

impl Load {
    /// Heartbeats of `sources` to `intake`: paced every `interval` (spread over it), or as fast
    /// as answered. Sources share `groups` connections (DEALERs), source i the (i mod groups)-th:
    /// the manager's intake takes any agent's heartbeat on any connection (no CURVE here), and a
    /// connection per simulated agent would cost the manager a descriptor each on top of its
    /// pool's one (this machine's hard RLIMIT_NOFILE is 20,000).
    pub fn start(sources: Vec<Source>, intake: String, interval: Duration, groups: usize) -> Load {
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

    pub fn set(&self, mode: Mode) {
        self.mode.send_replace(mode);
    }

    pub fn sent(&self) -> u64 {
        self.stats.sent.load(Ordering::Relaxed)
    }

    pub async fn stop(self) {
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
pub type Conn = std::rc::Rc<std::cell::RefCell<Option<Peer>>>;

#[allow(clippy::too_many_arguments)]
pub async fn beat_loop(
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
    // The last burst this agent beat for.
    let mut burst = 0;
    loop {
        let mut m = *mode.borrow_and_update();
        if let Mode::Burst(g) = m {
            m = if g == burst || real {
                Mode::Paced
            } else {
                burst = g;
                Mode::Fast
            };
        }
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
            Mode::Fast | Mode::Burst(_) => {}
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

pub const SIM_PER_HOST: usize = 2500;
/// Heartbeat connections per host.
pub const SIM_CONNS: usize = 16;

/// A child's part: `first:count:intake:interval_secs`.
pub fn sim_host_main(spec: &str) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let f: Vec<&str> = spec.split('|').collect();
    let [first, count, intake, interval, cpu] = f[..] else {
        bail!("KV_BENCH_SIM_HOST={spec}: expected first|count|intake|interval|cpu");
    };
    let (first, count): (usize, usize) = (first.parse()?, count.parse()?);
    let cpu = Arc::new(AtomicU64::new(cpu.parse()?));
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
            sources.push(Source::Sim {
                id,
                addr,
                kernels,
                cpu: cpu.clone(),
            });
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
                cmd = rx.recv() => match cmd.as_deref().map(|c| c.split_once(' ').unwrap_or((c, ""))) {
                    Some(("paced", _)) => load.set(Mode::Paced),
                    Some(("fast", _)) => load.set(Mode::Fast),
                    Some(("paused", _)) => load.set(Mode::Paused),
                    Some(("burst", g)) => load.set(Mode::Burst(g.parse()?)),
                    Some(("cpu", n)) => cpu.store(n.parse()?, Ordering::Relaxed),
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
pub struct SimHosts {
    hosts: Vec<SimHost>,
}

pub struct SimHost {
    child: Child,
    stdin: std::process::ChildStdin,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
}

impl SimHosts {
    /// Starts hosts for agents `first..first + count` (SIM_PER_HOST each), each agent
    /// reporting `cpu` cores in total, and waits until each host has bound its agents.
    pub fn start(
        first: usize,
        count: usize,
        intake: &str,
        interval: Duration,
        cpu: u64,
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
                format!("{start}|{n}|{intake}|{}|{cpu}", interval.as_secs_f64()),
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

    pub fn set(&mut self, mode: Mode) {
        let cmd = match mode {
            Mode::Paced => "paced".to_owned(),
            Mode::Fast => "fast".to_owned(),
            Mode::Burst(g) => format!("burst {g}"),
            Mode::Paused => "paused".to_owned(),
            Mode::Stop => "stop".to_owned(),
        };
        self.command(&cmd);
    }

    /// Every simulated agent reports `cpu` cores in total from its next heartbeat on.
    pub fn set_cpu(&mut self, cpu: u64) {
        self.command(&format!("cpu {cpu}"));
    }

    fn command(&mut self, cmd: &str) {
        use std::io::Write;
        for h in &mut self.hosts {
            let _ = writeln!(h.stdin, "{cmd}");
            let _ = h.stdin.flush();
        }
    }

    pub fn sent(&self) -> u64 {
        self.hosts
            .iter()
            .map(|h| h.sent.load(Ordering::Relaxed))
            .sum()
    }

    pub fn failed(&self) -> u64 {
        self.hosts
            .iter()
            .map(|h| h.failed.load(Ordering::Relaxed))
            .sum()
    }

    pub fn stop(mut self) {
        self.set(Mode::Stop);
        let deadline = Instant::now() + Duration::from_secs(15);
        for h in &mut self.hosts {
            exited_by(&mut h.child, deadline);
            let _ = h.child.kill();
            let _ = h.child.wait();
        }
    }
}

/// What a phase started, torn down in reverse whatever happened.
#[derive(Default)]
pub struct World {
    pub real: Vec<Agent>,
    pub hosts: Option<SimHosts>,
    pub load: Option<Load>,
}

impl World {
    /// Sets every heartbeat source's mode.
    pub fn set(&mut self, mode: Mode) {
        if let Some(l) = &self.load {
            l.set(mode);
        }
        if let Some(h) = &mut self.hosts {
            h.set(mode);
        }
    }

    /// Heartbeats answered so far, every source's.
    pub fn sent(&self) -> u64 {
        self.load.as_ref().map_or(0, Load::sent) + self.hosts.as_ref().map_or(0, SimHosts::sent)
    }

    /// Heartbeat calls that failed so far.
    pub fn failed(&self) -> u64 {
        self.load
            .as_ref()
            .map_or(0, |l| l.stats.failed.load(Ordering::Relaxed))
            + self.hosts.as_ref().map_or(0, SimHosts::failed)
    }

    pub async fn teardown(mut self) {
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

pub async fn wait_for<F, Fut>(limit: Duration, what: &str, mut check: F) -> anyhow::Result<()>
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

/// `kernelvisor_manager_heartbeats_total` per second over `window`, and the manager's CPU share
/// and the bench's sent heartbeats per second over it.
pub async fn heartbeat_rate(
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
pub async fn wait_all_alive(
    http: &Http,
    n: usize,
    limit: Duration,
    what: &str,
) -> anyhow::Result<()> {
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

/// A fleet started by [`start_fleet`].
pub struct FleetStarted {
    /// The API client with the bootstrap admin key's token.
    pub http: Http,
    /// Real agents (the rest are simulated).
    pub real: usize,
    /// Seconds from the call to every agent `ALIVE`.
    pub alive_s: f64,
    /// Seconds after that to a healthy pool peer for every agent.
    pub warm_s: f64,
}

/// Waits for the manager's `/health`, reads its admin token, then starts `n` agents into
/// `world`: up to `real_max` real ones first (their ids sort first, so placement uses them
/// first; `[resource] cpu` [`AGENT_CPU`]), the rest simulated in child processes reporting
/// `cpu` cores each; their heartbeat load paced every `interval`. Returns once every agent is
/// `ALIVE` with a healthy pool peer.
pub async fn start_fleet(
    mgr: &ManagerProc,
    http: &Http,
    world: &mut World,
    dir: &Path,
    (n, real_max): (usize, usize),
    interval: Duration,
    cpu: u64,
) -> anyhow::Result<FleetStarted> {
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
        let hosts = SimHosts::start(real, n - real, &intake, interval, cpu, dir)
            .context("simulated agents")?;
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

    Ok(FleetStarted {
        http: http.clone(),
        real,
        alive_s,
        warm_s,
    })
}

/// A fleet bench's `main` starts here: as a simulated agents' host when `KV_BENCH_SIM_HOST`
/// says so (the process ends with it), otherwise with the open-file limit raised.
pub fn fleet_bench_start() {
    if let Ok(spec) = std::env::var("KV_BENCH_SIM_HOST") {
        if let Err(e) = sim_host_main(&spec) {
            eprintln!("sim host: {e:#}");
            std::process::exit(1);
        }
        std::process::exit(0);
    }
    if let Err(e) = kernelvisor::limits::raise_open_files() {
        eprintln!("could not raise the open-file limit: {e}");
    }
}

/// Runs `phase` for each of `phases` in turn on one actix System: the rows, or (the error
/// printed) exit 1 at the first that fails.
pub fn run_phases<P, R, F, Fut>(bench: &str, phases: Vec<P>, mut phase: F) -> Vec<R>
where
    P: std::fmt::Display + Copy,
    F: FnMut(P) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<R>>,
{
    let rows = actix_rt::System::new().block_on(async {
        let mut rows = Vec::new();
        for p in phases {
            match phase(p).await {
                Ok(r) => rows.push(r),
                Err(e) => {
                    eprintln!("{bench} bench failed ({p}): {e:#}");
                    return Err(());
                }
            }
        }
        Ok(rows)
    });
    rows.unwrap_or_else(|()| std::process::exit(1))
}

/// Ends a phase whatever `result` is: `world`'s agents torn down, then the manager stopped; an
/// error gets the tail of the manager's log.
pub async fn end_phase<R>(
    mgr: ManagerProc,
    world: World,
    result: anyhow::Result<R>,
) -> anyhow::Result<R> {
    world.teardown().await;
    let result = result.map_err(|e| {
        anyhow!(
            "{e:#}\n--- manager log tail ({}) ---\n{}",
            mgr.log.display(),
            mgr.log_tail()
        )
    });
    mgr.stop();
    result
}

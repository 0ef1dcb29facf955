//! The agent's events on Backend.AI's event bus, read by the real Backend.AI 26.9.6 consumer.
//!
//! A real `redis-server` (Debian's package, `just redis`; its path from `KV_REDIS_SERVER`, else
//! `redis-server` on `PATH`) is started per test on a free port with its own data directory and
//! the append-only file on (`appendfsync always`), so a server stopped and started again keeps
//! the stream and the consumer group, as a production Redis/Valkey does. The agent is configured
//! with `[redis] addr`; the consumer is `tests/bai_compat/consumer.py`: the manager-side
//! `RedisQueue` + `EventDispatcher` of `backend.ai-common` 26.9.6 with a consumer for every
//! anycast event class and a subscriber for every broadcast one, run with the Python of the
//! Debian trixie root `just bai-env` builds (`chroot $KV_BAI_ROOT /opt/bai/bin/python`, which
//! shares the host's network, so it reaches the server on 127.0.0.1). It prints one JSON line per
//! event it decoded (with the manager's own view of heartbeats and `kernel_started`), and one per
//! message it could not decode; every test fails on any of the latter.
//!
//! `KV_BAI_ROOT` names the root; `just test-all` always sets it. Without it the tests that need
//! the consumer are skipped (said on stderr), as in tests/it/bai_compat.rs.
//!
//! What is shown:
//! - `agent_started`, then heartbeats whose `AgentInfo` the manager's own
//!   `AgentHeartbeatUpsert.from_agent_info` takes, with the agent's RPC address, public key and
//!   slots;
//! - a kernel created by the real 26.x agent client through the manager's `SessionLauncher`
//!   (`tests/bai_compat/driver.py --only ...`) and destroyed by it: `kernel_preparing` →
//!   `kernel_creating` → `kernel_started` (its `creation_info` a valid `KernelCreationInfo`
//!   naming the kernel's container and the slots it holds) → `kernel_terminated`, on the stream
//!   and on the broadcast channel;
//! - Redis stopped while a kernel is created and destroyed, then started again: every event of
//!   the kernel arrives, in order, each exactly once, and heartbeats resume;
//! - the agent's memory and its bus outbox stay bounded while Redis is down under a stream of
//!   events.

use crate::common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmpv::Value;
use serde_json::Value as Json;

use common::agent::{
    call, client, create_one, docker, free_port, kernel_config, read, run_id, spawn_agent_process,
    AgentFixture,
};
use common::bai::{is_root, tail, wait_for_port, KillOnDrop, RemoveOnDrop};
use common::Keys;

// ------------------------------------------------------------------------------------------
// redis-server

/// A `redis-server` of our own on a free loopback port, its data in a temp dir (append-only
/// file, fsynced on every write), stopped with SIGTERM and started again on the same port and
/// data.
pub(crate) struct Redis {
    pub(crate) port: u16,
    dir: tempfile::TempDir,
    child: Option<KillOnDrop>,
}

impl Redis {
    fn bin() -> PathBuf {
        let bin = std::env::var_os("KV_REDIS_SERVER")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("redis-server"));
        let found = Command::new(&bin)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success());
        assert!(
            found,
            "{} does not run: install it with `just redis` (Debian's redis-server), or name it \
             with KV_REDIS_SERVER",
            bin.display()
        );
        bin
    }

    pub(crate) fn start() -> Redis {
        let mut r = Redis {
            port: free_port(),
            dir: tempfile::Builder::new()
                .prefix("kv-redis-")
                .tempdir()
                .unwrap(),
            child: None,
        };
        r.up();
        r
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// Starts the server and waits until it accepts connections (its log says so after loading
    /// the append-only file).
    fn up(&mut self) {
        assert!(self.child.is_none(), "redis-server already running");
        let before = read(&self.log())
            .matches("Ready to accept connections")
            .count();
        let child = Command::new(Self::bin())
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args([
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log())
            .args(["--daemonize", "no", "--protected-mode", "no"])
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let mut child = KillOnDrop(child);
        let start = Instant::now();
        loop {
            let log = read(&self.log());
            if log.matches("Ready to accept connections").count() > before
                && TcpStream::connect(("127.0.0.1", self.port)).is_ok()
            {
                break;
            }
            if let Ok(Some(status)) = child.0.try_wait() {
                panic!("redis-server exited ({status}); log:\n{}", tail(&log, 20));
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "redis-server on {} not ready in 20 s; log:\n{}",
                self.port,
                tail(&log, 20)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        self.child = Some(child);
    }

    /// Makes the server sleep `d` (`DEBUG SLEEP`: it neither reads nor answers anything
    /// meanwhile), from a thread; returns once a `PING` goes unanswered for 200 ms.
    pub(crate) fn stall(&self, d: Duration) -> std::thread::JoinHandle<()> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).unwrap();
        let mut con = client.get_connection().expect("connect to redis-server");
        let h = std::thread::spawn(move || {
            redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(d.as_secs_f64())
                .query::<()>(&mut con)
                .expect("DEBUG SLEEP");
        });
        let start = Instant::now();
        loop {
            let ping = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut c| {
                    c.set_read_timeout(Some(Duration::from_millis(200)))?;
                    redis::cmd("PING").query::<String>(&mut c)
                });
            if ping.is_err() {
                return h;
            }
            assert!(
                start.elapsed() < Duration::from_secs(5),
                "redis-server still answers 5 s after DEBUG SLEEP"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM (a clean shutdown) and wait for the port to close.
    fn down(&mut self) {
        let mut child = self.child.take().expect("redis-server running");
        common::cluster::signal(child.0.id(), "TERM");
        assert!(
            common::cluster::wait_exit(&mut child.0, Duration::from_secs(20)),
            "redis-server did not stop in 20 s"
        );
        assert!(TcpStream::connect(("127.0.0.1", self.port)).is_err());
    }
}

// ------------------------------------------------------------------------------------------
// The Backend.AI environment: the consumer and the driver

/// The Debian trixie root with Backend.AI 26.9.6, or `None` (the test is skipped, said on stderr).
pub(crate) fn bai_root(test: &str) -> Option<PathBuf> {
    let Some(root) = std::env::var_os("KV_BAI_ROOT").map(PathBuf::from) else {
        eprintln!(
            "SKIPPED bai_events::{test}: KV_BAI_ROOT is not set. `just test-all` sets it (after \
             `just bai-env` builds the Backend.AI 26.9.6 environment); by hand: \
             KV_BAI_ROOT=$(scripts/bai-compat-env.sh) cargo test --test it bai_events::"
        );
        return None;
    };
    assert!(
        root.join("opt/bai/bin/python").exists(),
        "KV_BAI_ROOT={} has no /opt/bai/bin/python: run `just bai-env` (scripts/bai-compat-env.sh)",
        root.display()
    );
    Some(root)
}

/// A directory inside the root (`inner`, as the chroot sees it) holding copies of the scripts
/// of `tests/bai_compat/` and of `files`.
pub(crate) struct RootDir {
    root: PathBuf,
    inner: String,
    _cleanup: RemoveOnDrop,
}

impl RootDir {
    pub(crate) fn new(root: &Path, files: &[PathBuf]) -> RootDir {
        let inner = format!("/tmp/kv-bai-events-{}", run_id());
        let host_dir = root.join(inner.trim_start_matches('/'));
        std::fs::create_dir_all(&host_dir).unwrap();
        let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bai_compat");
        for name in ["consumer.py", "driver.py", "sidechannels.py"] {
            std::fs::copy(scripts.join(name), host_dir.join(name)).unwrap();
        }
        for f in files {
            std::fs::copy(f, host_dir.join(f.file_name().unwrap())).unwrap();
        }
        RootDir {
            root: root.to_owned(),
            inner,
            _cleanup: RemoveOnDrop(host_dir),
        }
    }

    /// `chroot <root> /opt/bai/bin/python <inner>/<script>` (through `sudo -n` when not root).
    pub(crate) fn python(&self, script: &str) -> Command {
        let mut cmd = if is_root() {
            Command::new("chroot")
        } else {
            let mut c = Command::new("sudo");
            c.args(["-n", "chroot"]);
            c
        };
        cmd.arg(&self.root)
            .arg("/opt/bai/bin/python")
            .arg(format!("{}/{script}", self.inner))
            .env("PYTHONUNBUFFERED", "1");
        cmd
    }

    pub(crate) fn path(&self, name: &str) -> String {
        format!("{}/{name}", self.inner)
    }
}

/// The real 26.9.6 consumer reading a server's stream `events` (group `manager`) and channel
/// `events_all`; its JSON lines collected as they come.
struct Consumer {
    lines: Arc<Mutex<Vec<Json>>>,
    stderr: PathBuf,
    _child: KillOnDrop,
}

impl Consumer {
    /// Starts it and waits for its `ready` line (the group exists, the channel is subscribed).
    fn start(dir: &RootDir, redis: &Redis, stderr: PathBuf) -> Consumer {
        let mut child = KillOnDrop(
            dir.python("consumer.py")
                .args(["--consume", "--redis-port", &redis.port.to_string()])
                .args([
                    "--timeout",
                    "1200",
                    "--node-id",
                    &format!("kv-test-{}", run_id()),
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(std::fs::File::create(&stderr).unwrap()))
                .spawn()
                .expect("chroot the Backend.AI consumer"),
        );
        let stdout = child.0.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v = serde_json::from_str::<Json>(&line)
                    .unwrap_or_else(|_| serde_json::json!({"kind": "garbage", "line": line}));
                sink.lock().unwrap().push(v);
            }
        });
        let c = Consumer {
            lines,
            stderr,
            _child: child,
        };
        c.wait(Duration::from_secs(60), "the consumer's ready line", |ls| {
            ls.iter().any(|l| l["kind"] == "ready")
        });
        c
    }

    fn lines(&self) -> Vec<Json> {
        self.lines.lock().unwrap().clone()
    }

    /// Events (decoded messages) from agent `source`.
    fn events(&self, source: &str) -> Vec<Json> {
        self.lines()
            .into_iter()
            .filter(|l| l["kind"] == "event" && l["source"] == source)
            .collect()
    }

    /// Lines reporting a message the consumer could not decode or has no class for.
    fn failures(&self) -> Vec<Json> {
        self.lines()
            .into_iter()
            .filter(|l| !matches!(l["kind"].as_str(), Some("ready" | "event" | "done")))
            .collect()
    }

    /// Polls `check` on the lines so far every 100 ms; panics with them after `limit`.
    fn wait(&self, limit: Duration, what: &str, check: impl Fn(&[Json]) -> bool) {
        let start = Instant::now();
        loop {
            if check(&self.lines()) {
                return;
            }
            if start.elapsed() > limit {
                panic!(
                    "timed out after {limit:?} waiting for {what}; consumer lines:\n{}\n\nconsumer \
                     stderr (tail):\n{}",
                    self.lines()
                        .iter()
                        .map(|l| clip(&l.to_string(), 400))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    tail(&read(&self.stderr), 30)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn assert_no_failures(&self, agent_log: &Path) {
        let failures = self.failures();
        assert!(
            failures.is_empty(),
            "the real 26.9.6 consumer could not handle {} message(s):\n{}\n\nagent log (tail):\n{}",
            failures.len(),
            failures
                .iter()
                .map(|l| clip(&l.to_string(), 1500))
                .collect::<Vec<_>>()
                .join("\n"),
            tail(&read(agent_log), 40)
        );
    }
}

pub(crate) fn clip(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_owned();
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len())
}

// ------------------------------------------------------------------------------------------
// The agent

/// Agent config text: the fixture's, `/metrics` on `metrics_port`, `[redis]` at `redis_port`,
/// and `[manager]` pointing at an intake nobody serves, for its `heartbeat-interval` of 1 s (the
/// interval heartbeats go on the bus at; our own manager's intake stays unreachable throughout,
/// which must not hold the bus back). `agent_extra` goes into `[agent]`, `redis_extra` into
/// `[redis]`.
pub(crate) fn agent_config(
    fx: &AgentFixture,
    metrics_port: u16,
    redis_port: u16,
    agent_extra: &str,
    redis_extra: &str,
    manager: bool,
) -> PathBuf {
    let mut text = fx.config_toml(agent_extra).replace(
        "service-addr = { host = \"127.0.0.1\", port = 0 }",
        &format!("service-addr = {{ host = \"127.0.0.1\", port = {metrics_port} }}"),
    );
    assert!(text.contains(&format!("port = {metrics_port} }}")));
    text += &format!(
        "\n[redis]\naddr = {{ host = \"127.0.0.1\", port = {redis_port} }}\nretry-max = 0.5\n{redis_extra}\n"
    );
    if manager {
        text += &format!(
            "\n[manager]\nevent-addr = {{ host = \"127.0.0.1\", port = {} }}\nheartbeat-interval = 1.0\n\
             event-retry-max = 1.0\n",
            free_port()
        );
    }
    let path = fx.dir.path().join("agent.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `GET /metrics` over plain HTTP/1.0: the body.
fn scrape(port: u16) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to /metrics");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.contains(" 200"), "{head}");
    body.to_owned()
}

/// The sum of metric `name`'s samples (all label sets) in `text`; `None` when absent.
fn metric(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        let v: f64 = rest.rsplit(' ').next().unwrap().parse().unwrap();
        *found.get_or_insert(0.0) += v;
    }
    found
}

/// The outbox and bus lines of a `/metrics` text (for failure messages).
fn outbox_lines(text: &str) -> String {
    text.lines()
        .filter(|l| !l.starts_with('#') && (l.contains("_bus_") || l.contains("_outbox_")))
        .collect::<Vec<_>>()
        .join("\n")
}

fn bus_depth(metrics_port: u16) -> f64 {
    let text = scrape(metrics_port);
    metric(&text, "kernelvisor_bus_outbox_depth")
        .unwrap_or_else(|| panic!("kernelvisor_bus_outbox_depth not in /metrics:\n{text}"))
}

// ------------------------------------------------------------------------------------------
// What the consumer saw

/// The anycast (stream) events of kernel `kernel_id`, in the order the consumer read them.
fn kernel_events(events: &[Json], kernel_id: &str, delivery: &str) -> Vec<Json> {
    events
        .iter()
        .filter(|e| e["delivery"] == delivery && e["fields"]["kernel_id"] == kernel_id)
        .cloned()
        .collect()
}

fn names(events: &[Json]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["name"].as_str().unwrap_or("?").to_owned())
        .collect()
}

/// The kernel lifecycle every kernel goes through here on the stream (a local image: no
/// `kernel_pulling`; its logs handed over before it ends, as upstream's `clean_kernel` does).
const LIFECYCLE: [&str; 5] = [
    "kernel_preparing",
    "kernel_creating",
    "kernel_started",
    "do_sync_kernel_logs",
    "kernel_terminated",
];

/// The same on the channel `events_all` (`do_sync_kernel_logs` is anycast only).
const BROADCAST_LIFECYCLE: [&str; 4] = [
    "kernel_preparing",
    "kernel_creating",
    "kernel_started",
    "kernel_terminated",
];

/// Stream entry ids (`<ms>-<seq>`) as sortable pairs.
fn entry_id(e: &Json) -> (u64, u64) {
    let id = e["msg_id"]
        .as_str()
        .expect("an anycast event has its entry id");
    let (ms, seq) = id.split_once('-').unwrap();
    (ms.parse().unwrap(), seq.parse().unwrap())
}

/// Asserts that `events` (one kernel's anycast events) are exactly the lifecycle, each once,
/// in stream order, for `session_id`.
fn assert_lifecycle(events: &[Json], session_id: &str, what: &str) {
    assert_eq!(
        names(events),
        LIFECYCLE,
        "{what}: the kernel's events on the stream, in order, each once"
    );
    let ids: Vec<(u64, u64)> = events.iter().map(entry_id).collect();
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "{what}: entry ids not increasing: {ids:?}"
    );
    for e in events.iter().filter(|e| e["name"] != "do_sync_kernel_logs") {
        assert_eq!(e["fields"]["session_id"], session_id, "{what}: {e}");
        assert_eq!(e["retry_count"], 0, "{what}: delivered once: {e}");
    }
}

/// The heartbeats' checks: the manager's own view of the `AgentInfo`.
fn assert_heartbeat(hb: &Json, rpc_port: u16, public_key: Option<&str>) {
    let view = &hb["manager_view"];
    assert_eq!(view["addr"], format!("tcp://127.0.0.1:{rpc_port}"), "{hb}");
    match public_key {
        Some(k) => assert_eq!(view["public_key"], k, "{hb}"),
        None => assert!(view["public_key"].is_null(), "{hb}"),
    }
    assert_eq!(view["resource_group"], "default", "{hb}");
    // Upstream's `get_arch_name()` spells them as Rust does (`x86_64`, not Docker's `amd64`).
    assert_eq!(view["architecture"], std::env::consts::ARCH, "{hb}");
    let slots = &view["available_slots"];
    for slot in ["cpu", "mem"] {
        let v: f64 = slots[slot]
            .as_str()
            .unwrap_or_else(|| panic!("no {slot} in available_slots: {hb}"))
            .parse()
            .unwrap();
        assert!(v > 0.0, "{slot} = {v}: {hb}");
    }
    assert_eq!(view["slot_key_and_units"]["cpu"], "count", "{hb}");
    assert_eq!(view["slot_key_and_units"]["mem"], "bytes", "{hb}");
}

// ------------------------------------------------------------------------------------------
// The tests

#[test]
fn the_real_26_consumer_reads_the_agent_and_a_kernel_created_by_the_real_client() {
    let Some(root) = bai_root("the_real_26_consumer_reads_the_agent_and_a_kernel") else {
        return;
    };
    let redis = Redis::start();

    // The agent (CURVE on, as the 26.x client needs), its keys copied for the driver.
    let fx = AgentFixture::new("bai-events", 34_200, 8);
    let keys = Keys::new();
    keys.write(fx.dir.path());
    let files: Vec<PathBuf> = ["manager.key", "manager.key_secret", "agent.key"]
        .iter()
        .map(|f| fx.dir.path().join(f))
        .collect();
    let dir = RootDir::new(&root, &files);
    let consumer = Consumer::start(&dir, &redis, fx.dir.path().join("consumer.stderr"));

    let d = fx.dir.path().display();
    let metrics_port = free_port();
    let config = agent_config(
        &fx,
        metrics_port,
        redis.port,
        &format!(
            "rpc-auth-manager-public-key = \"{d}/manager.key\"\nrpc-auth-agent-keypair = \"{d}/agent.key_secret\"\n"
        ),
        "",
        true,
    );
    let agent_log = fx.dir.path().join("agent.log");
    let mut agent = KillOnDrop(spawn_agent_process(&fx, &config));
    wait_for_port(fx.rpc_port, &mut agent.0, &agent_log);

    // agent_started, then heartbeats.
    let id = fx.agent_id.clone();
    consumer.wait(
        Duration::from_secs(60),
        "agent_started and two heartbeats",
        |_| {
            let ev = consumer.events(&id);
            ev.iter().filter(|e| e["name"] == "agent_heartbeat").count() >= 2
        },
    );
    let ev = consumer.events(&fx.agent_id);
    // `agent_started` once, at the start. Not necessarily before the first heartbeat: upstream's
    // agent produces it at the end of `AbstractAgent.__ainit__` while its `HeartbeatTask`
    // (initial delay 0) sends the first heartbeat in parallel (ai/backend/agent/agent.py,
    // agent/health/heartbeat.py), and the manager registers an agent from its heartbeat only.
    let started: Vec<usize> = (0..ev.len())
        .filter(|&i| ev[i]["name"] == "agent_started")
        .collect();
    let second_beat = (0..ev.len())
        .filter(|&i| ev[i]["name"] == "agent_heartbeat")
        .nth(1)
        .unwrap();
    assert!(
        started.len() == 1 && started[0] < second_beat,
        "agent_started once, before the second heartbeat: {:?}",
        names(&ev)
    );
    assert_eq!(ev[started[0]]["delivery"], "anycast");
    assert_eq!(ev[started[0]]["fields"]["reason"], "self-started");
    let public = keys.agent.public.to_z85();
    for hb in ev.iter().filter(|e| e["name"] == "agent_heartbeat") {
        assert_eq!(hb["delivery"], "anycast", "{hb}");
        assert_heartbeat(hb, fx.rpc_port, Some(&public));
    }

    // One kernel created and destroyed by the real 26.x client, through the SessionLauncher.
    let session_id = uuid::Uuid::new_v4().to_string();
    let kernel_id = uuid::Uuid::new_v4().to_string();
    let image = common::agent::TEST_IMAGE;
    let digest = docker(&["image", "inspect", "-f", "{{.Id}}", image]);
    assert!(
        digest.starts_with("sha256:"),
        "no image {image}: run `just test-image`"
    );
    let labels = docker(&["image", "inspect", "-f", "{{json .Config.Labels}}", image]);
    let driver_stderr = fx.dir.path().join("driver.stderr");
    let out = dir
        .python("driver.py")
        .args(["--addr", &format!("tcp://127.0.0.1:{}", fx.rpc_port)])
        .args(["--agent-id", &fx.agent_id])
        .args(["--manager-keypair", &dir.path("manager.key_secret")])
        .args(["--agent-public-key", &dir.path("agent.key")])
        .args(["--session-id", &session_id, "--kernel-id", &kernel_id])
        .args(["--image", image, "--image-digest", &digest])
        .args(["--image-labels", &labels])
        .args([
            "--only",
            "ping,check_and_pull,check_running,destroy_kernel,check_running_after_destroy",
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::from(std::fs::File::create(&driver_stderr).unwrap()))
        .output()
        .expect("chroot the Backend.AI driver");
    let driver_out = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("driver:\n{driver_out}");
    let steps: Vec<Json> = driver_out
        .lines()
        .filter_map(|l| serde_json::from_str::<Json>(l).ok())
        .filter(|v| v.get("step").is_some())
        .collect();
    let step_names: Vec<&str> = steps.iter().filter_map(|s| s["step"].as_str()).collect();
    assert_eq!(
        step_names,
        [
            "ping",
            "check_and_pull",
            "create_kernels",
            "check_running",
            "destroy_kernel",
            "check_running_after_destroy"
        ],
        "driver steps; stderr:\n{}",
        tail(&read(&driver_stderr), 30)
    );
    for s in &steps {
        assert_eq!(
            s["ok"],
            true,
            "driver step failed: {s}\nagent log:\n{}",
            tail(&read(&agent_log), 40)
        );
    }
    assert!(out.status.success(), "driver exited with {}", out.status);
    let created = &steps[2]["value"][0];
    let container_id = created["container_id"]
        .as_str()
        .unwrap_or_else(|| panic!("create_kernels answered no container_id: {created}"))
        .to_owned();

    // The kernel's life on the stream, and on the channel.
    consumer.wait(
        Duration::from_secs(60),
        "kernel_terminated of the kernel, on the stream and the channel",
        |_| {
            let ev = consumer.events(&id);
            ["anycast", "broadcast"].iter().all(|d| {
                kernel_events(&ev, &kernel_id, d)
                    .iter()
                    .any(|e| e["name"] == "kernel_terminated")
            })
        },
    );
    // A negative check: a moment for anything that would follow (a duplicate, a stray event).
    std::thread::sleep(Duration::from_secs(2));
    let ev = consumer.events(&fx.agent_id);
    let anycast = kernel_events(&ev, &kernel_id, "anycast");
    assert_lifecycle(&anycast, &session_id, "real client");
    let broadcast = kernel_events(&ev, &kernel_id, "broadcast");
    assert_eq!(
        names(&broadcast),
        BROADCAST_LIFECYCLE,
        "the kernel's events on the channel events_all"
    );
    for e in &anycast {
        assert!(
            e["class"]
                .as_str()
                .unwrap()
                .starts_with("ai.backend.common.events.event_types.kernel.anycast."),
            "{e}"
        );
    }

    // check_and_pull of the (local, present) image: `image_pull_finished`, `Image already
    // exists`, read by upstream's own class.
    let pulled: Vec<&Json> = ev
        .iter()
        .filter(|e| e["name"] == "image_pull_finished")
        .collect();
    assert_eq!(pulled.len(), 1, "one image_pull_finished: {pulled:?}");
    assert_eq!(
        pulled[0]["class"],
        "ai.backend.common.events.event_types.image.anycast.ImagePullFinishedEvent",
        "{}",
        pulled[0]
    );
    assert_eq!(pulled[0]["delivery"], "anycast", "{}", pulled[0]);
    assert_eq!(
        pulled[0]["fields"]["msg"], "Image already exists",
        "{}",
        pulled[0]
    );
    assert_eq!(
        pulled[0]["fields"]["agent_id"],
        fx.agent_id.as_str(),
        "{}",
        pulled[0]
    );

    // kernel_started: a valid KernelCreationInfo naming the kernel's container, its host and
    // the slots the launcher asked for (cpu 1, mem 256 MiB: driver.py).
    let started = &anycast[2];
    let view = &started["manager_view"];
    assert_eq!(
        view["creation_info_class"],
        "ai.backend.common.events.event_types.kernel.types.KernelCreationInfo"
    );
    assert_eq!(view["container_id"], container_id.as_str(), "{started}");
    assert_eq!(
        container_id.len(),
        64,
        "the full container id: {container_id}"
    );
    assert_eq!(view["kernel_host"], "127.0.0.1", "{started}");
    // The ports the create call answered (0 here: no kernel runner runs in the container).
    for port in ["repl_in_port", "repl_out_port"] {
        assert!(view[port].is_u64(), "{port}: {started}");
        assert_eq!(view[port], created[port], "{port}: {started}");
    }
    assert_eq!(
        started["fields"]["creation_info"]["service_ports"]
            .as_array()
            .map(Vec::len),
        created["service_ports"].as_array().map(Vec::len),
        "service ports: {started}"
    );
    assert_eq!(view["occupied_slots"]["cpu"], "1", "{started}");
    assert_eq!(view["occupied_slots"]["mem"], "268435456", "{started}");
    assert_eq!(
        broadcast[2]["fields"]["creation_info"], started["fields"]["creation_info"],
        "the broadcast twin carries the same creation_info"
    );

    // kernel_terminated: the destroy call's reason.
    // do_sync_kernel_logs: the container's logs are in `containerlog.<id>` (none printed here).
    assert_eq!(
        anycast[3]["fields"]["container_id"],
        container_id.as_str(),
        "{}",
        anycast[3]
    );
    let terminated = &anycast[4];
    assert_eq!(
        terminated["fields"]["reason"], "user-requested",
        "{terminated}"
    );
    assert!(terminated["fields"]["exit_code"].is_i64(), "{terminated}");

    // Heartbeats go on; nothing undecodable; nothing of ours without an upstream class.
    let hbs = ev.iter().filter(|e| e["name"] == "agent_heartbeat").count();
    consumer.wait(Duration::from_secs(30), "more heartbeats", |_| {
        consumer
            .events(&id)
            .iter()
            .filter(|e| e["name"] == "agent_heartbeat")
            .count()
            > hbs
    });
    consumer.assert_no_failures(&agent_log);
    let depth = bus_depth(metrics_port);
    assert!(
        depth <= 1.0,
        "bus outbox depth {depth} after everything was read"
    );
    drop(agent);
}

/// Creates a kernel of the test image on the agent at `rpc_port` and destroys it (our own RPC
/// client); returns its session id, kernel id and container id.
async fn create_and_destroy(rpc_port: u16, agent_log: &Path) -> (String, String, String) {
    let peer = client(&format!("tcp://127.0.0.1:{rpc_port}")).await;
    let session_id = uuid::Uuid::new_v4().to_string();
    let kernel_id = uuid::Uuid::new_v4().to_string();
    let info = create_one(
        &peer,
        &session_id,
        &kernel_id,
        kernel_config(
            "0.5",
            64 << 20,
            vec![(
                "startup_command",
                Value::from("echo kv-bus-log-line; exec sleep infinity"),
            )],
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("create_kernels: {e}; log:\n{}", tail(&read(agent_log), 40)));
    let container_id = common::agent::field(&info, "container_id")
        .as_str()
        .unwrap()
        .to_owned();
    // Its line in the agent's log of it before it goes (the kernel's logs are handed over).
    let start = Instant::now();
    loop {
        let logs = call(&peer, "get_logs", vec![Value::from(kernel_id.as_str())]).await;
        if format!("{logs:?}").contains("kv-bus-log-line")
            || start.elapsed() > Duration::from_secs(10)
        {
            break;
        }
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    call(
        &peer,
        "destroy_kernel",
        vec![kernel_id.clone().into(), session_id.clone().into()],
    )
    .await
    .unwrap_or_else(|e| panic!("destroy_kernel: {e}; log:\n{}", tail(&read(agent_log), 40)));
    peer.close();
    (session_id, kernel_id, container_id)
}

/// The stream `events` of database 4 as Redis holds it: `(entry id, name, payload)` of every
/// entry from `source`, read with XRANGE (independently of the consumer).
fn stream_entries(redis: &Redis, source: &str) -> Vec<(String, String, Json)> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/4", redis.port)).unwrap();
    let mut con = client.get_connection().expect("connect to redis-server");
    let entries: Vec<(String, HashMap<String, String>)> = redis::cmd("XRANGE")
        .arg("events")
        .arg("-")
        .arg("+")
        .query(&mut con)
        .expect("XRANGE events");
    entries
        .into_iter()
        .filter(|(_, f)| f.get("source").map(String::as_str) == Some(source))
        .map(|(id, f)| {
            let payload = serde_json::from_str(&f["payload"]).unwrap_or(Json::Null);
            (id, f["name"].clone(), payload)
        })
        .collect()
}

/// The logs handed over for `container_id` (`containerlog.<id>` in database 6), decoded as
/// upstream's `ContainerLogData.get_content` does: base64, then zlib.
fn container_logs(redis: &Redis, container_id: &str) -> Vec<u8> {
    use base64::Engine;
    use std::io::Read as _;
    let client = redis::Client::open(format!("redis://127.0.0.1:{}/6", redis.port)).unwrap();
    let mut con = client.get_connection().expect("connect to redis-server");
    let chunks: Vec<String> = redis::cmd("LRANGE")
        .arg(format!("containerlog.{container_id}"))
        .arg(0)
        .arg(-1)
        .query(&mut con)
        .expect("LRANGE");
    let mut out = Vec::new();
    for c in chunks {
        let v: Json = serde_json::from_str(&c).expect("a ContainerLogData JSON");
        assert_eq!(v["compress_type"], "zlib", "{v}");
        let raw = base64::engine::general_purpose::STANDARD
            .decode(v["content"].as_str().unwrap())
            .unwrap();
        flate2::read::ZlibDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .unwrap();
    }
    out
}

/// Kernel ids of the rows named `name` in table `table` (`outbox`: towards our manager;
/// `bus_outbox`: towards Backend.AI's bus) of the agent's store, read while it runs.
async fn outbox_rows(fx: &AgentFixture, table: &str, name: &str) -> Vec<String> {
    let db = fx.dir.path().join("var/agent.db");
    let start = Instant::now();
    loop {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(
                sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(&db)
                    .read_only(true),
            )
            .await
            .expect("open the agent's store");
        let rows: Vec<(Option<String>,)> =
            sqlx::query_as(&format!("SELECT kernel_id FROM {table} WHERE name = ?"))
                .bind(name)
                .fetch_all(&pool)
                .await
                .expect("read the outbox");
        pool.close().await;
        let ids: Vec<String> = rows.into_iter().filter_map(|r| r.0).collect();
        // The `outbox` row is written at the agent's start; wait for it.
        if !ids.is_empty() || table != "outbox" || start.elapsed() > Duration::from_secs(30) {
            return ids;
        }
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Asserts that the stream holds kernel `kernel_id`'s lifecycle exactly once, in order.
fn assert_stream_lifecycle(redis: &Redis, source: &str, kernel_id: &str, what: &str) {
    let on_stream: Vec<String> = stream_entries(redis, source)
        .into_iter()
        .filter(|(_, _, p)| p["kernel_id"] == kernel_id)
        .map(|(_, name, _)| name)
        .collect();
    assert_eq!(
        on_stream, LIFECYCLE,
        "{what}: the kernel's entries in Redis's stream `events`"
    );
}

#[actix_rt::test]
async fn a_kernel_created_and_destroyed_while_redis_is_down_arrives_once_in_order() {
    let Some(root) = bai_root("a_kernel_created_and_destroyed_while_redis_is_down") else {
        return;
    };
    let mut redis = Redis::start();
    let fx = AgentFixture::new("bai-events-outage", 34_220, 8);
    let dir = RootDir::new(&root, &[]);
    let consumer = Consumer::start(&dir, &redis, fx.dir.path().join("consumer.stderr"));
    let metrics_port = free_port();
    let config = agent_config(&fx, metrics_port, redis.port, "", "", true);
    let agent_log = fx.dir.path().join("agent.log");
    // A container labelled as this agent's that its store does not know: reported at start as
    // `kernel_dangling`, which upstream has no class for, so it must stay off the bus.
    let ghost_kernel = uuid::Uuid::new_v4().to_string();
    common::agent::ghost_container(&fx.agent_id, &ghost_kernel);
    let mut agent = KillOnDrop(spawn_agent_process(&fx, &config));
    wait_for_port(fx.rpc_port, &mut agent.0, &agent_log);
    let id = fx.agent_id.clone();
    let heartbeats = || {
        consumer
            .events(&id)
            .iter()
            .filter(|e| e["name"] == "agent_heartbeat")
            .count()
    };
    consumer.wait(
        Duration::from_secs(60),
        "agent_started and a heartbeat",
        |_| {
            let ev = consumer.events(&id);
            ev.iter().any(|e| e["name"] == "agent_started")
                && ev.iter().any(|e| e["name"] == "agent_heartbeat")
        },
    );
    for hb in consumer
        .events(&id)
        .iter()
        .filter(|e| e["name"] == "agent_heartbeat")
    {
        assert_heartbeat(hb, fx.rpc_port, None);
    }
    let dangling = outbox_rows(&fx, "outbox", "kernel_dangling").await;
    assert_eq!(
        dangling,
        vec![ghost_kernel.clone()],
        "the ghost container reported as kernel_dangling (to our manager's outbox)"
    );
    assert!(
        outbox_rows(&fx, "bus_outbox", "kernel_dangling")
            .await
            .is_empty()
            && !stream_entries(&redis, &id)
                .iter()
                .any(|(_, name, p)| name == "kernel_dangling" || p["kernel_id"] == ghost_kernel),
        "kernel_dangling went towards Backend.AI's bus"
    );

    // Redis goes away; a kernel lives and dies meanwhile (our own RPC client, Docker engine).
    redis.down();
    let down_at = Instant::now();
    let (session_id, kernel_id, container_id) = create_and_destroy(fx.rpc_port, &agent_log).await;
    // Every event of the kernel waits in the bus outbox (heartbeats are never queued).
    let start = Instant::now();
    loop {
        let depth = bus_depth(metrics_port);
        if depth >= LIFECYCLE.len() as f64 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "bus outbox depth {depth} while Redis is down, want ≥ {}",
            LIFECYCLE.len()
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    let hbs_before = heartbeats();
    // Down for a few seconds at least (several failed attempts), then back: a deliberate outage.
    let left = Duration::from_secs(4).saturating_sub(down_at.elapsed());
    actix_rt::time::sleep(left).await;
    redis.up();
    let up_at = Instant::now();

    consumer.wait(
        Duration::from_secs(60),
        "the kernel's kernel_terminated within a minute of Redis being back",
        |_| {
            kernel_events(&consumer.events(&id), &kernel_id, "anycast")
                .iter()
                .any(|e| e["name"] == "kernel_terminated")
        },
    );
    eprintln!(
        "the kernel's events arrived {:.1} s after Redis was back",
        up_at.elapsed().as_secs_f64()
    );
    consumer.wait(Duration::from_secs(30), "heartbeats resume", |_| {
        heartbeats() >= hbs_before + 2
    });
    let anycast = kernel_events(&consumer.events(&id), &kernel_id, "anycast");
    assert_lifecycle(&anycast, &session_id, "Redis down");
    assert_eq!(
        anycast[2]["manager_view"]["container_id"],
        container_id.as_str(),
        "{}",
        anycast[2]
    );
    assert_stream_lifecycle(&redis, &id, &kernel_id, "Redis down");

    // Nothing of the agent's came twice: every entry read once, agent_started once.
    let ev = consumer.events(&id);
    let mut seen: HashMap<String, usize> = HashMap::new();
    for e in ev.iter().filter(|e| e["delivery"] == "anycast") {
        *seen
            .entry(e["msg_id"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    assert!(
        seen.values().all(|n| *n == 1),
        "an entry read twice: {seen:?}"
    );
    let started = stream_entries(&redis, &id)
        .iter()
        .filter(|(_, name, _)| name == "agent_started")
        .count();
    assert_eq!(started, 1, "agent_started once on the stream");

    // A call whose handler fails is an `agent_error` (upstream's `collect_error` →
    // `produce_error_event`), read by the consumer with upstream's class.
    let peer = client(&format!("tcp://127.0.0.1:{}", fx.rpc_port)).await;
    let missing = uuid::Uuid::new_v4().to_string();
    let failed = call(&peer, "get_logs", vec![Value::from(missing.as_str())]).await;
    assert!(failed.is_err(), "get_logs of no kernel: {failed:?}");
    consumer.wait(
        Duration::from_secs(30),
        "agent_error of the failed call",
        |_| {
            consumer.events(&id).iter().any(|e| {
                e["name"] == "agent_error"
                    && e["fields"]["message"]
                        .as_str()
                        .is_some_and(|m| m.contains(&missing))
            })
        },
    );
    let errors: Vec<Json> = consumer
        .events(&id)
        .into_iter()
        .filter(|e| e["name"] == "agent_error")
        .collect();
    assert_eq!(
        errors[0]["class"], "ai.backend.common.events.event_types.agent.anycast.AgentErrorEvent",
        "{}",
        errors[0]
    );
    assert!(
        errors[0]["fields"]["message"]
            .as_str()
            .unwrap()
            .contains("(in get_logs)"),
        "{}",
        errors[0]
    );
    consumer.assert_no_failures(&agent_log);
    let text = scrape(metrics_port);
    assert!(
        metric(&text, "kernelvisor_bus_publish_failures_total").unwrap_or(0.0) >= 1.0,
        "publishes failed while Redis was down:\n{}",
        outbox_lines(&text)
    );
    // The counter counts each event on the stream once: agent_started, the kernel's four and
    // the failed call's agent_error (heartbeats are not outbox events).
    let entries = stream_entries(&redis, &id);
    let events_on_stream = entries
        .iter()
        .filter(|(_, name, _)| name != "agent_heartbeat")
        .count();
    assert_eq!(events_on_stream, 1 + LIFECYCLE.len() + 1);
    // The kernel's logs, handed over before its do_sync_kernel_logs: what it printed, in
    // upstream's `ContainerLogData` chunks.
    let logs = container_logs(&redis, &container_id);
    assert!(
        String::from_utf8_lossy(&logs).contains("kv-bus-log-line"),
        "containerlog.{container_id}: {:?}",
        String::from_utf8_lossy(&logs)
    );
    assert_eq!(
        metric(&text, "kernelvisor_bus_events_published_total"),
        Some(events_on_stream as f64),
        "kernelvisor_bus_events_published_total vs the agent's events in the stream:\n{}",
        outbox_lines(&text)
    );
    assert!(bus_depth(metrics_port) <= 1.0);
    drop(agent);
}

#[actix_rt::test]
async fn the_agents_memory_and_bus_outbox_stay_bounded_while_redis_is_down() {
    // Redis and the agent only (dummy engine); no Backend.AI environment needed.
    let mut redis = Redis::start();
    let fx = AgentFixture::new("bai-events-memory", 34_240, 4);
    let metrics_port = free_port();
    const CAPACITY: f64 = 200.0;
    let config = agent_config(
        &fx,
        metrics_port,
        redis.port,
        "backend = \"dummy\"\n",
        &format!("outbox-max-events = {CAPACITY}\n"),
        false,
    );
    let agent_log = fx.dir.path().join("agent.log");
    let mut agent = KillOnDrop(spawn_agent_process(&fx, &config));
    wait_for_port(fx.rpc_port, &mut agent.0, &agent_log);
    let pid = agent.0.id();
    redis.down();

    let peer = client(&format!("tcp://127.0.0.1:{}", fx.rpc_port)).await;
    let mut max_depth = 0.0f64;
    let mut rss = Vec::new();
    // Rounds of 20 sessions of 10 kernels each created and destroyed: 800 events a round.
    for round in 0..4 {
        for s in 0..20 {
            let session = uuid::Uuid::new_v4().to_string();
            let kernels: Vec<String> = (0..10).map(|_| uuid::Uuid::new_v4().to_string()).collect();
            call(
                &peer,
                "create_kernels",
                vec![
                    session.clone().into(),
                    Value::Array(kernels.iter().map(|k| k.clone().into()).collect()),
                    Value::Array(
                        kernels
                            .iter()
                            .map(|_| kernel_config("0.01", 8 << 20, vec![]))
                            .collect(),
                    ),
                ],
            )
            .await
            .unwrap_or_else(|e| panic!("round {round} session {s}: create_kernels: {e}"));
            for k in &kernels {
                call(
                    &peer,
                    "destroy_kernel",
                    vec![k.clone().into(), session.clone().into()],
                )
                .await
                .unwrap();
            }
            let depth = bus_depth(metrics_port);
            max_depth = max_depth.max(depth);
            assert!(
                depth <= CAPACITY,
                "bus outbox depth {depth} > its capacity {CAPACITY} (round {round})"
            );
        }
        rss.push(common::status_bytes(pid, "VmRSS"));
        eprintln!(
            "round {round}: agent VmRSS {} KiB, bus outbox depth {}",
            rss[round] >> 10,
            bus_depth(metrics_port)
        );
    }
    peer.close();
    let text = scrape(metrics_port);
    assert!(
        max_depth >= CAPACITY * 0.9,
        "the bus outbox never filled (max depth {max_depth}): is [redis] outbox-max-events honoured?"
    );
    assert!(
        metric(&text, "kernelvisor_outbox_dropped_events_total").unwrap_or(0.0) > 0.0,
        "a full bus outbox drops (superseded states first):\n{}",
        outbox_lines(&text)
    );
    // After the first round warmed everything up, three more rounds (2400 events) add little.
    let growth = rss[3].saturating_sub(rss[0]);
    assert!(
        growth < 16 << 20,
        "agent VmRSS grew {} KiB over 2400 events with Redis down ({:?} KiB)",
        growth >> 10,
        rss.iter().map(|r| r >> 10).collect::<Vec<_>>()
    );

    // Redis back: the outbox drains.
    redis.up();
    let start = Instant::now();
    while bus_depth(metrics_port) > 1.0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the bus outbox did not drain in 60 s after Redis came back; log:\n{}",
            tail(&read(&agent_log), 40)
        );
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        agent.0.try_wait().unwrap().is_none(),
        "the agent is still up"
    );
    // What was kept went out once each, each kernel's states in lifecycle order.
    let entries = stream_entries(&redis, &fx.agent_id);
    let mut per_kernel: HashMap<String, Vec<String>> = HashMap::new();
    for (_, name, payload) in &entries {
        if let Some(k) = payload["kernel_id"].as_str() {
            per_kernel
                .entry(k.to_owned())
                .or_default()
                .push(name.clone());
        }
    }
    assert!(!per_kernel.is_empty(), "no kernel event reached the stream");
    for (k, names) in &per_kernel {
        let order: Vec<usize> = names
            .iter()
            .map(|n| LIFECYCLE.iter().position(|l| l == n).unwrap_or(usize::MAX))
            .collect();
        assert!(
            order.windows(2).all(|w| w[0] < w[1]) && !order.contains(&usize::MAX),
            "kernel {k}: {names:?} on the stream (each once, in lifecycle order)"
        );
    }
    let published = metric(
        &scrape(metrics_port),
        "kernelvisor_bus_events_published_total",
    );
    let on_stream = entries
        .iter()
        .filter(|(_, n, _)| n != "agent_heartbeat")
        .count();
    eprintln!(
        "{} kernels' events and {} entries in all on the stream; published_total {published:?}",
        per_kernel.len(),
        on_stream
    );
}

#[actix_rt::test]
async fn a_publish_whose_reply_is_lost_is_not_repeated() {
    // Redis and the agent only (dummy engine, Redis's own stream read with XRANGE); no
    // Backend.AI environment needed. No `[manager]`: heartbeats every 20 s, the first at start,
    // so none competes with the events for the sender while Redis stalls below.
    let redis = Redis::start();
    let fx = AgentFixture::new("bai-events-stall", 34_260, 4);
    let metrics_port = free_port();
    let config = agent_config(
        &fx,
        metrics_port,
        redis.port,
        "backend = \"dummy\"\n",
        "",
        false,
    );
    let agent_log = fx.dir.path().join("agent.log");
    let mut agent = KillOnDrop(spawn_agent_process(&fx, &config));
    wait_for_port(fx.rpc_port, &mut agent.0, &agent_log);
    let id = fx.agent_id.clone();
    let start = Instant::now();
    while !stream_entries(&redis, &id)
        .iter()
        .any(|(_, name, _)| name == "agent_started")
    {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no agent_started on the stream; log:\n{}",
            tail(&read(&agent_log), 40)
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }

    // Redis stalls (DEBUG SLEEP) past the agent's wait for a reply (4 s) while a kernel lives
    // and dies: the publishes sent meanwhile get no reply, so the agent cannot know whether they
    // happened and publishes again on a new connection; when Redis wakes up it runs the first
    // attempt too. Each event must be on the stream once.
    let failures = |text: &str| {
        // Failed publishes of events (a heartbeat is tried once and skipped: not counted).
        metric(text, "kernelvisor_bus_publish_failures_total").unwrap_or(0.0)
            - metric(
                text,
                "kernelvisor_bus_publish_failures_total{reason=\"heartbeat\"}",
            )
            .unwrap_or(0.0)
    };
    let failures_before = failures(&scrape(metrics_port));
    let stall = redis.stall(Duration::from_secs(7));
    let peer = client(&format!("tcp://127.0.0.1:{}", fx.rpc_port)).await;
    let session_id = uuid::Uuid::new_v4().to_string();
    let kernel_id = uuid::Uuid::new_v4().to_string();
    create_one(
        &peer,
        &session_id,
        &kernel_id,
        kernel_config("0.01", 8 << 20, vec![]),
    )
    .await
    .unwrap();
    call(
        &peer,
        "destroy_kernel",
        vec![kernel_id.clone().into(), session_id.clone().into()],
    )
    .await
    .unwrap();
    peer.close();
    stall.join().unwrap();
    let start = Instant::now();
    while bus_depth(metrics_port) > 0.0 {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the bus outbox did not drain in 60 s after the stall; log:\n{}",
            tail(&read(&agent_log), 40)
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    let text = scrape(metrics_port);
    assert!(
        failures(&text) > failures_before,
        "no publish failed while Redis stalled, so no retry was shown:\n{}",
        outbox_lines(&text)
    );
    // A negative check: a moment for anything that would follow (a duplicate).
    actix_rt::time::sleep(Duration::from_secs(1)).await;
    assert_stream_lifecycle(&redis, &id, &kernel_id, "Redis stalled");
    let entries = stream_entries(&redis, &id);
    let events_on_stream = entries
        .iter()
        .filter(|(_, name, _)| name != "agent_heartbeat")
        .count();
    assert_eq!(
        events_on_stream,
        1 + LIFECYCLE.len(),
        "agent_started and the kernel's five, once each: {:?}",
        entries.iter().map(|(_, n, _)| n).collect::<Vec<_>>()
    );
    // The counter counts each event on the stream once, including one whose publish only the
    // retry confirmed (the script answering "already published").
    assert_eq!(
        metric(&text, "kernelvisor_bus_events_published_total"),
        Some(events_on_stream as f64),
        "kernelvisor_bus_events_published_total vs the agent's events in the stream:\n{}",
        outbox_lines(&text)
    );
    drop(agent);
}

/// Backend.AI's retries, answered as the real 26.9.6 manager expects them
/// (`tests/bai_compat/driver.py --scenario retries`), with the agent's resource group given in
/// the 26.8+ spelling `initial-resource-group-name`:
/// - the heartbeats' `AgentInfo`, read by the manager's `AgentHeartbeatUpsert.from_agent_info`,
///   name that resource group;
/// - the launcher's `create_kernels` sent twice at once: the first call's creation is held at
///   the container stage (the `fault-injection` build's `hold_before`) until the agent counts
///   the second as joined (`kernelvisor_create_kernels_retries_total{answer="joined"}`); both
///   answers are the same, and one `kernel_started` is published;
/// - the launcher's `create_kernels` again once the kernel runs: the same creation result, one
///   container, and `kernel_started` published again (a valid `KernelCreationInfo` naming the
///   same container);
/// - `restart_kernel` with only `environ` in `updated_config`: merged over the stored config, a
///   new container that sees the new environment (its own `kernel_started`).
#[cfg(feature = "fault-injection")]
#[test]
fn the_real_26_clients_retries_are_answered_and_kernel_started_is_sent_again() {
    let Some(root) = bai_root("the_real_26_clients_retries_are_answered") else {
        return;
    };
    let redis = Redis::start();
    let fx = AgentFixture::new("bai-retries", 37_310, 8);
    let keys = Keys::new();
    keys.write(fx.dir.path());
    let files: Vec<PathBuf> = ["manager.key", "manager.key_secret", "agent.key"]
        .iter()
        .map(|f| fx.dir.path().join(f))
        .collect();
    let dir = RootDir::new(&root, &files);
    let consumer = Consumer::start(&dir, &redis, fx.dir.path().join("consumer.stderr"));
    let d = fx.dir.path().display();
    // Not a fixed port: the fixture's range lies in the ephemeral range, where an outbound
    // connection may hold any one of them.
    let metrics_port = free_port();
    let config = agent_config(
        &fx,
        metrics_port,
        redis.port,
        &format!(
            "rpc-auth-manager-public-key = \"{d}/manager.key\"\nrpc-auth-agent-keypair = \"{d}/agent.key_secret\"\n\
             initial-resource-group-name = \"kv-retries\"\n"
        ),
        "",
        true,
    );
    let agent_log = fx.dir.path().join("agent.log");
    let mut agent = KillOnDrop(spawn_agent_process(&fx, &config));
    wait_for_port(fx.rpc_port, &mut agent.0, &agent_log);

    // The resource group as the manager reads it from a heartbeat.
    let id = fx.agent_id.clone();
    consumer.wait(Duration::from_secs(60), "a heartbeat", |_| {
        consumer
            .events(&id)
            .iter()
            .any(|e| e["name"] == "agent_heartbeat")
    });
    for hb in consumer
        .events(&id)
        .iter()
        .filter(|e| e["name"] == "agent_heartbeat")
    {
        assert_eq!(hb["manager_view"]["resource_group"], "kv-retries", "{hb}");
    }

    let session_id = uuid::Uuid::new_v4().to_string();
    let kernel_id = uuid::Uuid::new_v4().to_string();
    let image = common::agent::TEST_IMAGE;
    let digest = docker(&["image", "inspect", "-f", "{{.Id}}", image]);
    assert!(
        digest.starts_with("sha256:"),
        "no image {image}: run `just test-image`"
    );
    let labels = docker(&["image", "inspect", "-f", "{{json .Config.Labels}}", image]);
    let gate = fx.dir.path().join("release-create");
    let driver_stderr = fx.dir.path().join("driver.stderr");
    let mut driver = KillOnDrop(
        dir.python("driver.py")
            .args(["--addr", &format!("tcp://127.0.0.1:{}", fx.rpc_port)])
            .args(["--agent-id", &fx.agent_id])
            .args(["--manager-keypair", &dir.path("manager.key_secret")])
            .args(["--agent-public-key", &dir.path("agent.key")])
            .args(["--session-id", &session_id, "--kernel-id", &kernel_id])
            .args(["--image", image, "--image-digest", &digest])
            .args(["--image-labels", &labels])
            .args(["--scenario", "retries"])
            .args(["--hold-file", &gate.display().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(std::fs::File::create(&driver_stderr).unwrap()))
            .spawn()
            .expect("chroot the Backend.AI driver"),
    );
    let mut stdin = driver.0.stdin.take().unwrap();
    let containers = || {
        docker(&[
            "ps",
            "-aq",
            "--filter",
            &format!("label=ai.backend.kernel-id={kernel_id}"),
        ])
        .lines()
        .count()
    };
    let joined = "kernelvisor_create_kernels_retries_total{answer=\"joined\"}";
    let mut steps: Vec<Json> = Vec::new();
    let mut lines = Vec::new();
    for line in BufReader::new(driver.0.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        eprintln!("driver: {line}");
        let v: Json = serde_json::from_str(&line).unwrap_or(Json::Null);
        let answer = match v["pause"].as_str() {
            // Both creates sent: released once the agent has the second joined to the first.
            Some("creates_sent") => {
                let start = Instant::now();
                let seen = loop {
                    if metric(&scrape(metrics_port), joined).is_some_and(|n| n >= 1.0) {
                        break true;
                    }
                    if start.elapsed() > Duration::from_secs(120) {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                };
                if seen {
                    assert_eq!(containers(), 0, "the creation is held before its container");
                    std::fs::write(&gate, "").unwrap();
                    "ok".to_owned()
                } else {
                    std::fs::write(&gate, "").unwrap();
                    format!("no create_kernels joined in 120 s: {joined} absent or 0")
                }
            }
            Some("count_containers") => containers().to_string(),
            Some(other) => format!("unknown pause {other}"),
            None => {
                if v.get("step").is_some() {
                    steps.push(v);
                }
                lines.push(line);
                continue;
            }
        };
        writeln!(stdin, "{answer}").unwrap();
        stdin.flush().unwrap();
    }
    let status = driver.0.wait().unwrap();
    let step_names: Vec<&str> = steps.iter().filter_map(|s| s["step"].as_str()).collect();
    assert_eq!(
        step_names,
        [
            "ping",
            "health",
            "gather_hwinfo",
            "check_and_pull",
            "create_kernels",
            "create_kernels_joined",
            "check_running",
            "create_kernels_again",
            "one_container",
            "restart_kernel_partial",
            "check_running_after_restart",
            "destroy_kernel",
            "check_running_after_destroy",
        ],
        "driver steps; stderr:\n{}",
        tail(&read(&driver_stderr), 30)
    );
    for s in &steps {
        assert_eq!(
            s["ok"],
            true,
            "driver step failed: {s}\nagent log:\n{}",
            tail(&read(&agent_log), 40)
        );
    }
    assert!(status.success(), "driver exited with {status}");
    let text = scrape(metrics_port);
    assert_eq!(metric(&text, joined), Some(1.0));
    assert_eq!(
        metric(
            &text,
            "kernelvisor_create_kernels_retries_total{answer=\"running\"}"
        ),
        Some(1.0)
    );
    let created = &steps[4]["value"][0];
    let first_container = created["container_id"].as_str().unwrap().to_owned();
    let restarted = steps[9]["value"]["container_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // The kernel's life on the stream: one creation, kernel_started again for the retry, the
    // restart's new container, the end.
    consumer.wait(
        Duration::from_secs(60),
        "kernel_terminated of the kernel",
        |_| {
            kernel_events(&consumer.events(&id), &kernel_id, "anycast")
                .iter()
                .any(|e| e["name"] == "kernel_terminated")
        },
    );
    let anycast = kernel_events(&consumer.events(&id), &kernel_id, "anycast");
    assert_eq!(
        names(&anycast),
        [
            "kernel_preparing",
            "kernel_creating",
            "kernel_started",
            "kernel_started",
            "kernel_started",
            "do_sync_kernel_logs",
            "kernel_terminated",
        ],
        "the kernel's events on the stream"
    );
    for (i, container) in [
        (2, &first_container),
        (3, &first_container),
        (4, &restarted),
    ] {
        let view = &anycast[i]["manager_view"];
        assert_eq!(
            view["creation_info_class"],
            "ai.backend.common.events.event_types.kernel.types.KernelCreationInfo",
            "{}",
            anycast[i]
        );
        assert_eq!(view["container_id"], container.as_str(), "{}", anycast[i]);
        assert_eq!(anycast[i]["fields"]["session_id"], session_id.as_str());
    }
    assert_eq!(
        anycast[3]["fields"]["creation_info"], anycast[2]["fields"]["creation_info"],
        "the retry's kernel_started says what the first did"
    );
    consumer.assert_no_failures(&agent_log);
    drop(agent);
}

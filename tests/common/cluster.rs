//! A manager and agents as real processes (the `kernelvisor` binary) with CURVE on both
//! channels, the real Docker engine, and short intervals (1 s heartbeat, 3 s timeout, 2.5 s
//! grace); the manager's store on SQLite or on a fresh PostgreSQL database. Checks the four
//! invariants of `docs/scenarios.md` against the store, the engine and the agents.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rmpv::Value;
use serde_json::Value as Json;

use super::agent::{docker, free_port, run_id, AgentFixture};
use kernelvisor::manager::store::Store;
use kernelvisor::rpc::curve::{write_certificates, KeyPair};
use kernelvisor::rpc::socket::ClientCurve;
use kernelvisor::rpc::{Call, Peer, PeerOptions};

/// Which database the manager uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

/// The PostgreSQL server for tests: `KV_TEST_POSTGRES_URL` (the justfile starts one and sets it).
pub fn postgres_admin_url() -> String {
    std::env::var("KV_TEST_POSTGRES_URL").expect("KV_TEST_POSTGRES_URL is not set: run the tests through `just test-all` (it starts a local PostgreSQL), or set it to a server where the user may CREATE DATABASE")
}

/// A single-threaded actix runtime (the RPC peer spawns local tasks).
fn rt() -> actix_rt::Runtime {
    actix_rt::Runtime::new().unwrap()
}

fn with_database(admin: &str, db: &str) -> String {
    let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(admin);
    format!("{base}/{db}")
}

/// Sends `sig` (`TERM`, `KILL`, `STOP`, `CONT`) to `pid`.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// Waits up to `limit` for `child` to exit; returns whether it did.
pub fn wait_exit(child: &mut Child, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Polls `check` every 100 ms until it gives `Some`; panics naming `what` after `limit`.
pub fn wait_for<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls `probe` every 100 ms until its value satisfies `done` or `limit` has passed; returns the
/// last value seen, for the caller's own assertion (which then shows what was seen on failure).
pub fn settle<T>(limit: Duration, mut probe: impl FnMut() -> T, done: impl Fn(&T) -> bool) -> T {
    let start = Instant::now();
    loop {
        let v = probe();
        if done(&v) || start.elapsed() >= limit {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A replica (or any manager) process killed when the test ends, failed or not: no manager
/// outlives its test.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// An HTTP answer: status and JSON body (Null when not JSON), `Retry-After` if any.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Json,
    pub retry_after: Option<String>,
}

impl Answer {
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// One test cluster: a manager process and agent processes.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub db: Db,
    pub store_url: String,
    /// The user key the tests act as (created through the API at the first manager start).
    pub access_key: String,
    /// Its secret key, sent as the bearer token by [`Cluster::get`], `post`, `delete`.
    pub token: String,
    /// The bootstrap admin key's secret (`[api] admin-token-file`).
    pub admin_token: String,
    pub api: String,
    pub intake_port: u16,
    pub manager: Option<Child>,
    pub agents: Vec<ClusterAgent>,
    /// Extra `[manager]` lines of the manager's config (e.g. `dangling-grace = 3`), used from
    /// the next [`Cluster::start_manager`].
    pub manager_extra: String,
    /// Extra `[scheduler]` lines of the manager's config (e.g. `create-timeout = 2`).
    pub scheduler_extra: String,
    /// Further tables appended to the manager's config (e.g. `[[registry]]`).
    pub manager_tail: String,
    /// `[manager] startup-grace` of the next manager start, seconds (2.5).
    pub startup_grace: f64,
    /// `[manager] heartbeat-timeout` of the next manager start, seconds (3).
    pub heartbeat_timeout: f64,
    /// The agents' `[manager] heartbeat-interval` (agents added from now on) and the manager's
    /// (its next start), seconds (1).
    pub heartbeat_interval: f64,
    /// `[agent-pool] health-check-interval` of the next manager start, seconds (1).
    pub health_check_interval: f64,
    /// The intake ports agents added from now on report to (`event-addrs`, in order); empty:
    /// the cluster's one intake (`event-addr`).
    pub agent_intakes: Vec<u16>,
    /// The address the manager's intake listens on and agents report to (`127.0.0.1`; the host's
    /// address on a Swarm fixture's bridge when agents run in an engine's network namespace).
    pub manager_host: String,
    keys: (KeyPair, PathBuf),
    pg_drop: Option<(String, String)>,
}

/// An agent of the cluster.
pub struct ClusterAgent {
    pub fixture: AgentFixture,
    pub metrics_port: u16,
    pub config: PathBuf,
    pub process: Option<Child>,
    pub keypair: KeyPair,
    /// The network namespace it runs in (`None`: the host's).
    pub netns: Option<String>,
    /// The address its RPC listens on and is dialled at.
    pub rpc_host: String,
}

impl ClusterAgent {
    pub fn id(&self) -> &str {
        &self.fixture.agent_id
    }

    pub fn pid(&self) -> u32 {
        self.process.as_ref().expect("agent running").id()
    }
}

fn log_file(dir: &Path, name: &str) -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{name}.log")))
            .unwrap(),
    )
}

impl Cluster {
    /// A cluster directory with keys and a store; nothing started yet.
    pub fn new(db: Db) -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("kv-cluster-")
            .tempdir()
            .unwrap();
        let keys_dir = dir.path().join("keys");
        let agent_keys = dir.path().join("agent-keys");
        std::fs::create_dir_all(&agent_keys).unwrap();
        let manager = KeyPair::generate().unwrap();
        write_certificates(&keys_dir, "manager", &manager).unwrap();
        let (store_url, pg_drop) = match db {
            Db::Sqlite => (
                format!("sqlite://{}/manager.db", dir.path().display()),
                None,
            ),
            Db::Postgres => {
                let admin = postgres_admin_url();
                let name = format!("kv_test_{}", run_id());
                rt().block_on(async {
                    use sqlx::{Connection, Executor};
                    let mut c = sqlx::PgConnection::connect(&admin)
                        .await
                        .expect("connect to the test PostgreSQL");
                    c.execute(format!("CREATE DATABASE {name}").as_str())
                        .await
                        .unwrap();
                });
                (with_database(&admin, &name), Some((admin, name)))
            }
        };
        Cluster {
            store_url,
            db,
            access_key: String::new(),
            token: String::new(),
            admin_token: String::new(),
            api: String::new(),
            intake_port: free_port(),
            manager: None,
            agents: Vec::new(),
            manager_extra: String::new(),
            scheduler_extra: String::new(),
            manager_tail: String::new(),
            startup_grace: 2.5,
            heartbeat_timeout: 3.0,
            heartbeat_interval: 1.0,
            health_check_interval: 1.0,
            agent_intakes: Vec::new(),
            manager_host: "127.0.0.1".into(),
            keys: (manager, keys_dir),
            pg_drop,
            dir,
        }
    }

    /// Fractional liveness intervals for the managers and agents started from now on: a
    /// heartbeat and a health check every 0.5 s, `LOST` after 2 s of silence (four missed
    /// heartbeats, one more than the whole-second default allows, as a loaded machine delays a
    /// beat more often when beats are closer). The start-up grace stays 2.5 s, so that a test
    /// started on a loaded machine still sees it. A scenario proves the same in less time, and
    /// the config's fractional seconds are exercised on the way.
    pub fn fractional_intervals(&mut self) {
        self.heartbeat_interval = 0.5;
        self.heartbeat_timeout = 2.0;
        self.health_check_interval = 0.5;
    }

    fn manager_config(&self, api_port: u16) -> PathBuf {
        self.replica_config("manager", api_port, self.intake_port)
    }

    /// A manager config named `name` (`<name>.toml`) with its own API and intake ports, on the
    /// cluster's store, keys and intervals.
    fn replica_config(&self, name: &str, api_port: u16, intake_port: u16) -> PathBuf {
        let d = self.dir.path().display();
        let text = format!(
            "[manager]\nrpc-keypair = \"{d}/keys/manager.key_secret\"\nevent-listen-addr = {{ host = \"{manager_host}\", port = {intake} }}\n\
             agent-keys-dir = \"{d}/agent-keys\"\nheartbeat-interval = {interval}\nheartbeat-timeout = {timeout}\nstartup-grace = {grace}\n{extra}\n\
             [store]\nurl = \"{url}\"\n\n[api]\nlisten-addr = {{ host = \"127.0.0.1\", port = {api_port} }}\nworkers = 1\nadmin-token-file = \"{d}/admin-token\"\n\n\
             [agent-pool]\nhealth-check-interval = {health}\nping-timeout = 1\nrecovery-timeout = 2\n\n\
             [scheduler]\nreset-timeout = 30\n{scheduler}\n\n[logging]\nlevel = \"info\"\n{tail}",
            intake = intake_port,
            manager_host = self.manager_host,
            url = self.store_url,
            extra = self.manager_extra,
            scheduler = self.scheduler_extra,
            tail = self.manager_tail,
            grace = self.startup_grace,
            timeout = self.heartbeat_timeout,
            interval = self.heartbeat_interval,
            health = self.health_check_interval,
        );
        let p = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Starts (or restarts) the manager process on the same store and ports, and waits for its API.
    pub fn start_manager(&mut self) {
        // A first start picks free ports; one taken meanwhile (a port is free only until
        // someone binds it) is picked again rather than failing the test.
        let first = self.api.is_empty() && self.agents.is_empty();
        for attempt in 1.. {
            let port = if self.api.is_empty() {
                free_port()
            } else {
                self.api.rsplit(':').next().unwrap().parse().unwrap()
            };
            self.api = format!("http://127.0.0.1:{port}");
            let config = self.manager_config(port);
            // Ready only when this start says so in its own log: the port may have been taken
            // meanwhile by another test's manager, whose /health would answer for ours.
            let log_path = self.dir.path().join("manager.log");
            let starts = || {
                std::fs::read_to_string(&log_path)
                    .unwrap_or_default()
                    .matches("manager started api=")
                    .count()
            };
            let starts_before = starts();
            let child = Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
                .args(["manager", "--config"])
                .arg(&config)
                .stdout(log_file(self.dir.path(), "manager"))
                .stderr(log_file(self.dir.path(), "manager"))
                .spawn()
                .unwrap();
            self.manager = Some(child);
            let started = Instant::now();
            let mut exited = None;
            while starts() == starts_before
                || self
                    .get("/health")
                    .ok()
                    .filter(|a| a.status == 200)
                    .is_none()
            {
                exited = self.manager.as_mut().unwrap().try_wait().unwrap();
                if exited.is_some() || started.elapsed() > Duration::from_secs(30) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let log =
                std::fs::read_to_string(self.dir.path().join("manager.log")).unwrap_or_default();
            match exited {
                None if started.elapsed() <= Duration::from_secs(30) => break,
                Some(_) if first && attempt < 3 && log.contains("in use") => {
                    eprintln!("the manager's ports were taken meanwhile; picking others");
                    self.api.clear();
                    self.intake_port = free_port();
                    continue;
                }
                _ => {}
            }
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!(
                "the manager's API did not answer within {:?} (exit: {exited:?}); its log ends:\n{}",
                started.elapsed(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        if self.token.is_empty() {
            self.admin_token = std::fs::read_to_string(self.dir.path().join("admin-token"))
                .expect("the manager wrote its admin token")
                .trim()
                .to_owned();
            let (key, secret) = self.new_key(false);
            (self.access_key, self.token) = (key, secret);
        }
    }

    /// Starts another manager process on the cluster's store (a replica; PostgreSQL) with its
    /// own API and intake ports; its log is `<name>.log` in the cluster directory. Returns the
    /// process once its API answers.
    pub fn spawn_replica(&self, name: &str, api_port: u16, intake_port: u16) -> Child {
        let child = self.spawn_replica_unchecked(name, api_port, intake_port);
        let api = format!("http://127.0.0.1:{api_port}");
        wait_for(Duration::from_secs(30), "the replica's API", || {
            self.get_at(&api, "/health")
                .ok()
                .filter(|a| a.status == 200)
        });
        child
    }

    /// As [`Cluster::spawn_replica`], without waiting for anything.
    pub fn spawn_replica_unchecked(&self, name: &str, api_port: u16, intake_port: u16) -> Child {
        let config = self.replica_config(name, api_port, intake_port);
        Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
            .args(["manager", "--config"])
            .arg(&config)
            .stdout(log_file(self.dir.path(), name))
            .stderr(log_file(self.dir.path(), name))
            .spawn()
            .unwrap()
    }

    /// A new access key through the API (as the admin): `(access key, secret key)`.
    pub fn new_key(&self, admin: bool) -> (String, String) {
        let role = if admin { "admin" } else { "user" };
        let a = self.post_as(
            Some(&self.admin_token),
            "/v1/access-keys",
            &serde_json::json!({"role": role, "name": "test"}),
        );
        assert_eq!(a.status, 201, "create an access key: {a:?}");
        (
            a.body["access_key"].as_str().unwrap().to_owned(),
            a.body["secret_key"].as_str().unwrap().to_owned(),
        )
    }

    /// Stops the manager with `sig` (`TERM` or `KILL`) and waits for it to exit.
    pub fn stop_manager(&mut self, sig: &str) {
        let mut child = self.manager.take().expect("manager running");
        signal(child.id(), sig);
        assert!(
            wait_exit(&mut child, Duration::from_secs(20)),
            "manager did not exit on SIG{sig}"
        );
    }

    /// Adds an agent (Docker backend, CURVE, reporting to the manager) and starts it.
    /// `agent_extra` goes into `[agent]` (e.g. `on-shutdown = "terminate"`).
    pub fn add_agent(&mut self, name: &str, ports_lo: u16, agent_extra: &str) -> usize {
        self.add_agent_with(name, ports_lo, agent_extra, "")
    }

    /// As [`Cluster::add_agent`], with `tail` appended to the config file (further tables, e.g.
    /// `[[accelerator.mock.devices]]`).
    pub fn add_agent_with(
        &mut self,
        name: &str,
        ports_lo: u16,
        agent_extra: &str,
        tail: &str,
    ) -> usize {
        self.add_agent_edited(name, (ports_lo, 20), agent_extra, tail, None, |text| text)
    }

    /// As [`Cluster::add_agent`] with `len` host ports from `ports_lo` (not 20): for a test
    /// whose kernels publish few or no ports (runner-less, no service ports).
    pub fn add_agent_ports(&mut self, name: &str, ports_lo: u16, len: u16) -> usize {
        self.add_agent_edited(name, (ports_lo, len), "", "", None, |text| text)
    }

    /// As [`Cluster::add_agent`], as a host of its own with a private engine would run it: in
    /// network namespace `netns` (a Swarm fixture's engine's, `tests/common/engines.rs`) on the
    /// engine at `docker_host` (`unix://…`), with `host` (the engine's address there) as its
    /// RPC's listening and advertised address and its published ports' (`bind-host`,
    /// `advertised-host`). Its intake is [`Cluster::manager_host`], which must be reachable from
    /// that namespace (the host's address on the fixture's bridge). `tail` is appended to its
    /// config (further tables, e.g. `[kernel-runner]`).
    pub fn add_agent_on_engine(
        &mut self,
        name: &str,
        ports_lo: u16,
        (netns, docker_host, host): (&str, &str, &str),
        tail: &str,
    ) -> usize {
        let edit = |text: String| {
            let replace = |text: String, from: &str, to: &str| {
                let edited = text.replacen(from, to, 1);
                assert_ne!(edited, text, "the agent config's `{from}`");
                edited
            };
            let text = replace(
                text,
                "rpc-listen-addr = { host = \"127.0.0.1\",",
                &format!("rpc-listen-addr = {{ host = \"{host}\","),
            );
            let text = replace(
                text,
                "advertised-rpc-addr = { host = \"localhost\",",
                &format!("advertised-rpc-addr = {{ host = \"{host}\","),
            );
            replace(
                text,
                "bind-host = \"127.0.0.1\"\n",
                &format!(
                    "bind-host = \"{host}\"\nadvertised-host = \"{host}\"\ndocker-host = \"{docker_host}\"\n"
                ),
            )
        };
        let netns = Some((netns.to_owned(), host.to_owned()));
        self.add_agent_edited(name, (ports_lo, 20), "", tail, netns, edit)
    }

    fn add_agent_edited(
        &mut self,
        name: &str,
        (ports_lo, ports_len): (u16, u16),
        agent_extra: &str,
        tail: &str,
        netns: Option<(String, String)>,
        edit: impl FnOnce(String) -> String,
    ) -> usize {
        let fixture = AgentFixture::new(name, ports_lo, ports_len);
        let keypair = KeyPair::generate().unwrap();
        let keys = fixture.dir.path().join("keys");
        write_certificates(&keys, "agent", &keypair).unwrap();
        std::fs::copy(
            keys.join("agent.key"),
            self.dir
                .path()
                .join("agent-keys")
                .join(format!("{}.key", fixture.agent_id)),
        )
        .unwrap();
        let metrics_port = free_port();
        // The manager dials the advertised address (a host name here), not the bound one.
        let curve = format!(
            "rpc-auth-manager-public-key = \"{}/manager.key\"\nrpc-auth-agent-keypair = \"{}/agent.key_secret\"\n\
             advertised-rpc-addr = {{ host = \"localhost\", port = {} }}\n{agent_extra}",
            self.keys.1.display(),
            keys.display(),
            fixture.rpc_port
        );
        let mut text = fixture.config_toml(&curve).replace(
            "service-addr = { host = \"127.0.0.1\", port = 0 }",
            &format!("service-addr = {{ host = \"127.0.0.1\", port = {metrics_port} }}"),
        );
        let intake = if self.agent_intakes.is_empty() {
            format!(
                "event-addr = {{ host = \"{}\", port = {} }}",
                self.manager_host, self.intake_port
            )
        } else {
            let list: Vec<String> = self
                .agent_intakes
                .iter()
                .map(|p| format!("{{ host = \"{}\", port = {p} }}", self.manager_host))
                .collect();
            format!("event-addrs = [{}]", list.join(", "))
        };
        text.push_str(&format!("\n[manager]\n{intake}\nheartbeat-interval = {}\nevent-retry-max = 1\nevent-ack-timeout = 5\n", self.heartbeat_interval));
        text = text.replace("[logging]\nlevel = \"warn\"", "[logging]\nlevel = \"info\"");
        text.push_str(tail);
        let text = edit(text);
        let config = fixture.dir.path().join("agent.toml");
        std::fs::write(&config, text).unwrap();
        self.agents.push(ClusterAgent {
            fixture,
            metrics_port,
            config,
            process: None,
            keypair,
            rpc_host: netns
                .as_ref()
                .map_or_else(|| "127.0.0.1".to_owned(), |(_, h)| h.clone()),
            netns: netns.map(|(ns, _)| ns),
        });
        let i = self.agents.len() - 1;
        self.start_agent(i);
        i
    }

    /// (Re)starts agent `i` with its config.
    pub fn start_agent(&mut self, i: usize) {
        let a = &mut self.agents[i];
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kernelvisor"));
        cmd.args(["agent", "--config"])
            .arg(&a.config)
            .stdout(log_file(a.fixture.dir.path(), "agent"))
            .stderr(log_file(a.fixture.dir.path(), "agent"));
        if let Some(ns) = &a.netns {
            super::engines::enter_netns(&mut cmd, ns, None);
        }
        let child = cmd.spawn().unwrap();
        a.process = Some(child);
    }

    /// Stops agent `i` with SIGTERM (as Ctrl+C would) and waits for it.
    pub fn stop_agent(&mut self, i: usize) {
        let mut child = self.agents[i].process.take().expect("agent running");
        signal(child.id(), "TERM");
        assert!(
            wait_exit(&mut child, Duration::from_secs(60)),
            "agent did not exit on SIGTERM"
        );
    }

    // ---- HTTP ----

    fn answer(r: Result<ureq::Response, ureq::Error>) -> Result<Answer, String> {
        let resp = match r {
            Ok(resp) => resp,
            Err(ureq::Error::Status(_, resp)) => resp,
            Err(e) => return Err(e.to_string()),
        };
        let status = resp.status();
        let retry_after = resp.header("Retry-After").map(str::to_owned);
        let text = resp.into_string().unwrap_or_default();
        Ok(Answer {
            status,
            body: serde_json::from_str(&text).unwrap_or(Json::Null),
            retry_after,
        })
    }

    /// `Authorization` header value of the cluster's user key.
    pub fn auth(&self) -> String {
        Self::bearer(&self.token)
    }

    /// `Authorization` header value for `token`.
    pub fn bearer(token: &str) -> String {
        format!("Bearer {token}")
    }

    /// GET `path` of the manager at `base` (`http://host:port`) as the cluster's user key.
    pub fn get_at(&self, base: &str, path: &str) -> Result<Answer, String> {
        self.call_at(base, "GET", path, Some(&self.token), None)
    }

    /// `method path` (JSON `body` when given) at the manager at `base` with `token`; `Err` only
    /// when no HTTP answer came (connection refused, timeout).
    pub fn call_at(
        &self,
        base: &str,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&Json>,
    ) -> Result<Answer, String> {
        let mut r =
            ureq::request(method, &format!("{base}{path}")).timeout(Duration::from_secs(60));
        if let Some(t) = token {
            r = r.set("Authorization", &Self::bearer(t));
        }
        Self::answer(match body {
            Some(b) => r.send_json(b),
            None => r.call(),
        })
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        timeout: u64,
    ) -> ureq::Request {
        let r = ureq::request(method, &format!("{}{path}", self.api))
            .timeout(Duration::from_secs(timeout));
        match token {
            Some(t) => r.set("Authorization", &Self::bearer(t)),
            None => r,
        }
    }

    /// GET as the cluster's user key.
    pub fn get(&self, path: &str) -> Result<Answer, String> {
        self.get_as(Some(&self.token), path)
    }

    /// GET with `token` (`None`: no Authorization header).
    pub fn get_as(&self, token: Option<&str>, path: &str) -> Result<Answer, String> {
        Self::answer(self.request("GET", path, token, 60).call())
    }

    /// GET `path` with no Authorization header and the extra `headers` (name, value).
    pub fn raw_get_with(&self, path: &str, headers: &[(&str, &str)]) -> Result<Answer, String> {
        let mut r = self.request("GET", path, None, 60);
        for (name, value) in headers {
            r = r.set(name, value);
        }
        Self::answer(r.call())
    }

    /// POST JSON as the cluster's user key.
    pub fn post(&self, path: &str, body: &Json) -> Answer {
        self.post_as(Some(&self.token), path, body)
    }

    /// POST JSON with `token`.
    pub fn post_as(&self, token: Option<&str>, path: &str, body: &Json) -> Answer {
        Self::answer(
            self.request("POST", path, token, 120)
                .send_json(body.clone()),
        )
        .unwrap()
    }

    /// A request with any method and JSON body (or none) with `token`.
    pub fn call_as(
        &self,
        token: Option<&str>,
        method: &str,
        path: &str,
        body: Option<&Json>,
    ) -> Answer {
        let r = self.request(method, path, token, 60);
        Self::answer(match body {
            Some(b) => r.send_json(b.clone()),
            None => r.call(),
        })
        .unwrap()
    }

    pub fn post_raw(&self, path: &str, body: &str) -> Answer {
        Self::answer(
            self.request("POST", path, Some(&self.token), 60)
                .set("Content-Type", "application/json")
                .send_string(body),
        )
        .unwrap()
    }

    /// Runs `code` through `POST /v1/sessions/{sid}/execute` (query mode, continued until it
    /// finishes) in the kernel `kernel` selects (the main kernel when `None`): its stdout and
    /// exit code, or the refusal's (status, body) of any call that is not a 200.
    pub fn execute(
        &self,
        sid: &str,
        kernel: Option<&str>,
        code: &str,
    ) -> Result<(String, i64), (u16, Json)> {
        let path = format!("/v1/sessions/{sid}/execute");
        let mut body = serde_json::json!({"mode": "query", "code": code});
        if let Some(k) = kernel {
            body["kernel"] = k.into();
        }
        let mut out = String::new();
        loop {
            let a = self.post(&path, &body);
            if a.status != 200 {
                return Err((a.status, a.body));
            }
            for piece in a.body["console"].as_array().into_iter().flatten() {
                if piece[0] == "stdout" {
                    out.push_str(piece[1].as_str().unwrap_or_default());
                }
            }
            match a.body["status"].as_str() {
                Some("continued") => {
                    body = serde_json::json!({"mode": "continue", "run_id": a.body["runId"]});
                    if let Some(k) = kernel {
                        body["kernel"] = k.into();
                    }
                }
                Some("finished") => return Ok((out, a.body["exitCode"].as_i64().unwrap_or(-1))),
                _ => panic!("execute ended: {}", a.body),
            }
        }
    }

    /// Creates the user's vfolder `name` and returns its directory on agent 0, made writable
    /// by the kernel's user (a job writes its checkpoint there).
    pub fn writable_vfolder(&self, name: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let r = self.post("/v1/vfolders", &serde_json::json!({"name": name}));
        assert_eq!(r.status, 201, "{r:?}");
        let dir = self.agents[0]
            .fixture
            .vfolder_root()
            .join(&self.access_key)
            .join(name);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        dir
    }

    /// DELETE as the cluster's user key.
    pub fn delete(&self, path: &str) -> Answer {
        self.delete_as(Some(&self.token), path)
    }

    /// DELETE with `token`.
    pub fn delete_as(&self, token: Option<&str>, path: &str) -> Answer {
        Self::answer(self.request("DELETE", path, token, 60).call()).unwrap()
    }

    /// The agent's entry in `GET /v1/agents`.
    pub fn agent_view(&self, agent_id: &str) -> Option<Json> {
        let a = self.get_as(Some(&self.admin_token), "/v1/agents").ok()?;
        a.body["agents"]
            .as_array()?
            .iter()
            .find(|x| x["agent_id"] == agent_id)
            .cloned()
    }

    /// Waits until the manager shows `agent_id` with `status` (for `ALIVE`: and a heartbeat's slots).
    pub fn wait_agent_status(&self, agent_id: &str, status: &str, limit: Duration) -> Json {
        wait_for(limit, &format!("agent {agent_id} {status}"), || {
            self.agent_view(agent_id).filter(|a| {
                a["status"] == status && (status != "ALIVE" || !a["last_heartbeat"].is_null())
            })
        })
    }

    /// Creates a session (small slots, the test image) and returns its JSON; asserts 201.
    pub fn create_session(&self) -> Json {
        let body = serde_json::json!({"image": super::agent::TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}});
        let a = self.post("/v1/sessions", &body);
        assert_eq!(a.status, 201, "create session: {a:?}");
        a.body
    }

    /// `concurrency_used` of the cluster's access key.
    pub fn concurrency_used(&self) -> i64 {
        self.get(&format!("/v1/access-keys/{}", self.access_key))
            .unwrap()
            .body["concurrency_used"]
            .as_i64()
            .unwrap()
    }

    /// A counter of the manager's `/metrics` (summed over its label sets matching `labels`).
    pub fn manager_metric(&self, name: &str, labels: &str) -> f64 {
        let text = self
            .request("GET", "/metrics", Some(&self.admin_token), 60)
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        text.lines()
            .filter(|l| l.starts_with(name) && l.contains(labels))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }

    // ---- the agents' own state ----

    /// A CURVE client to agent `i`'s RPC server, as the manager would connect.
    pub fn agent_peer(&self, i: usize) -> (actix_rt::Runtime, Peer) {
        let rt = rt();
        let a = &self.agents[i];
        let curve = ClientCurve {
            keypair: self.keys.0.clone(),
            server_key: a.keypair.public,
        };
        let opts = PeerOptions {
            endpoint: format!("tcp://{}:{}", a.rpc_host, a.fixture.rpc_port),
            curve: Some(curve),
            keepalive: None,
            handshake_timeout: Duration::from_secs(5),
        };
        let peer = rt
            .block_on(async { Peer::connect(&zmq::Context::new(), &opts).await })
            .expect("connect to the agent");
        (rt, peer)
    }

    /// Calls `method(*args)` on agent `i`.
    pub fn agent_call(&self, i: usize, method: &str, args: Vec<Value>) -> Value {
        let (rt, peer) = self.agent_peer(i);
        let v = rt
            .block_on(peer.call(
                method,
                &Call {
                    args,
                    kwargs: vec![],
                    peer_user_id: None,
                },
                Duration::from_secs(60),
            ))
            .unwrap_or_else(|e| panic!("{method} on agent {i}: {e}"));
        peer.close();
        v
    }

    /// Kernel ids agent `i` holds (not `TERMINATED`), from `list_kernels()`.
    pub fn agent_kernels(&self, i: usize) -> BTreeSet<String> {
        let v = self.agent_call(i, "list_kernels", vec![]);
        let kernels = super::agent::field(&v, "kernels")
            .as_array()
            .cloned()
            .unwrap_or_default();
        kernels
            .iter()
            .filter(|k| super::agent::field(k, "status").as_str() != Some("TERMINATED"))
            .filter_map(|k| super::agent::field(k, "id").as_str().map(str::to_owned))
            .collect()
    }

    /// Kernel ids of running containers carrying agent `i`'s id label (from the docker CLI).
    pub fn running_containers(&self, i: usize) -> BTreeSet<String> {
        docker(&[
            "ps",
            "--filter",
            &format!("label=ai.backend.agent-id={}", self.agents[i].id()),
            "--format",
            "{{.Label \"ai.backend.kernel-id\"}}",
        ])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
    }

    /// The agent's `/metrics` value of `name` (first sample).
    pub fn agent_metric(&self, i: usize, name: &str) -> Option<f64> {
        let text = ureq::get(&format!(
            "http://127.0.0.1:{}/metrics",
            self.agents[i].metrics_port
        ))
        .call()
        .ok()?
        .into_string()
        .ok()?;
        text.lines()
            .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    /// The store, opened read-side by the test (same URL as the manager).
    pub fn store<T>(
        &self,
        f: impl for<'a> FnOnce(
            &'a Store,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + 'a>>,
    ) -> T {
        rt().block_on(async {
            let store = Store::connect(&self.store_url)
                .await
                .expect("open the manager's store");
            let out = f(&store).await;
            store.close().await;
            out
        })
    }

    /// Live kernels in the manager's store: `kernel id → (agent id, access key)`.
    pub fn store_live(&self) -> BTreeMap<String, (String, String)> {
        self.store(|s| Box::pin(async move { s.kernels(None, false).await.unwrap() }))
            .into_iter()
            .map(|k| (k.id, (k.agent_id, k.access_key)))
            .collect()
    }

    /// One kernel row.
    pub fn store_kernel(&self, id: &str) -> kernelvisor::manager::store::KernelRow {
        let id = id.to_owned();
        self.store(move |s| Box::pin(async move { s.kernel(&id).await.unwrap() }))
            .expect("kernel row")
    }

    /// Asserts the four invariants once the system has settled (polls up to 30 s for in-flight
    /// events; then every check must hold at once).
    pub fn check_invariants(&self) {
        let start = Instant::now();
        loop {
            match self.invariant_violation() {
                None => return,
                Some(v) if start.elapsed() > Duration::from_secs(30) => {
                    panic!("invariant violated: {v}")
                }
                Some(_) => std::thread::sleep(Duration::from_millis(250)),
            }
        }
    }

    fn invariant_violation(&self) -> Option<String> {
        // Every placed live kernel (a cluster session's each): queued sessions hold no agent,
        // slots or concurrency.
        let rows: Vec<_> = self
            .store(|s| Box::pin(async move { s.live_kernels_by_agent().await.unwrap() }))
            .into_values()
            .flatten()
            .collect();
        // A session takes one unit of concurrency, held by its main kernel.
        let sessions_of_key = rows
            .iter()
            .filter(|k| k.is_main() && k.access_key == self.access_key)
            .count() as i64;
        // The slots the store's live kernels hold, per agent: every slot, summed exactly.
        let mut held_slots: BTreeMap<String, kernelvisor::slots::ResourceSlots> = BTreeMap::new();
        for k in &rows {
            let sum = held_slots.entry(k.agent_id.clone()).or_default();
            *sum = sum.checked_add(&k.resource_slots).expect("slot sum");
        }
        let live: BTreeMap<String, (String, String)> = rows
            .into_iter()
            .map(|k| (k.id, (k.agent_id, k.access_key)))
            .collect();
        for (i, a) in self.agents.iter().enumerate() {
            if a.process.is_none() {
                continue;
            }
            let store_side: BTreeSet<String> = live
                .iter()
                .filter(|(_, (agent, _))| agent == a.id())
                .map(|(k, _)| k.clone())
                .collect();
            // 1. store-live = running containers = the agent's kernels.
            let containers = self.running_containers(i);
            if store_side != containers {
                return Some(format!(
                    "1: agent {} store live {store_side:?} != running containers {containers:?}",
                    a.id()
                ));
            }
            let held = self.agent_kernels(i);
            if held != containers {
                return Some(format!(
                    "1: agent {} holds {held:?} != running containers {containers:?}",
                    a.id()
                ));
            }
            // 3. no allocation held by a kernel that is not live: the agent's occupied slots are
            // the store's live kernels' slots (every slot, non-zero amounts), scratch dirs.
            let usage = self.agent_call(i, "resource_usage", vec![]);
            let nonzero = |s: &kernelvisor::slots::ResourceSlots| -> BTreeMap<String, String> {
                s.nonzero()
                    .map(|(k, v)| (k.to_owned(), v.to_string()))
                    .collect()
            };
            let occupied = nonzero(&kernelvisor::slots::ResourceSlots::from_wire_msgpack(
                super::agent::field(&usage, "occupied"),
            ));
            let expected = nonzero(&held_slots.get(a.id()).cloned().unwrap_or_default());
            if occupied != expected {
                return Some(format!(
                    "3: agent {} occupies {occupied:?}, live kernels hold {expected:?}",
                    a.id()
                ));
            }
            let scratch: BTreeSet<String> = a.fixture.scratch_entries().into_iter().collect();
            if scratch != store_side {
                return Some(format!(
                    "3: agent {} scratch dirs {scratch:?} != live kernels {store_side:?}",
                    a.id()
                ));
            }
            // 4. nothing left undelivered (every event acked by the manager).
            match self.agent_metric(i, "kernelvisor_outbox_depth") {
                Some(0.0) => {}
                other => return Some(format!("4: agent {} outbox depth {other:?}", a.id())),
            }
        }
        // 2. concurrency_used = live sessions of the key.
        let used = self.concurrency_used();
        if used != sessions_of_key {
            return Some(format!(
                "2: concurrency_used {used} != live sessions {sessions_of_key}"
            ));
        }
        None
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for a in &mut self.agents {
            if let Some(mut c) = a.process.take() {
                let _ = Command::new("kill")
                    .args(["-CONT", &c.id().to_string()])
                    .status();
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        if let Some(mut c) = self.manager.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!(
                "---- manager.log (tail) ----\n{}",
                tail(&self.dir.path().join("manager.log"))
            );
            for a in &self.agents {
                eprintln!(
                    "---- agent {} log (tail) ----\n{}",
                    a.id(),
                    tail(&a.fixture.dir.path().join("agent.log"))
                );
            }
        }
        if let Some((admin, name)) = self.pg_drop.take() {
            rt().block_on(async {
                use sqlx::{Connection, Executor};
                if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                    let _ = c
                        .execute(format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)").as_str())
                        .await;
                }
            });
        }
    }
}

/// The last 40 lines of a log, without the API's audit lines (one per request: under a burst of
/// requests they would be all a failed test shows) and without the frames of a backtrace (a
/// process that ended with an error under `RUST_BACKTRACE` prints dozens of them after the
/// error, which would leave the error itself out of the tail).
fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let frame = |l: &str| {
        let l = l.trim_start();
        l.starts_with("at ")
            || l.split_once(": ")
                .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| !l.contains(" audit: ") && !frame(l))
        .collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

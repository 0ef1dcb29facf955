//! Agent fixtures for the kernel tests: a per-run agent id, a temp dir with config, scratch
//! and vfolder roots, an RPC client, and a guard that removes every container the agent made
//! (by its `ai.backend.agent-id` label) even when the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rmpv::Value;

use kernelvisor::config::AgentConfig;
use kernelvisor::rpc::{Call, CallError, Peer, PeerOptions};

/// The local test image `just test-image` builds.
pub const TEST_IMAGE: &str = "kernelvisor-test:latest";

/// A short random id tagging everything one test run creates.
pub fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..10].to_owned()
}

/// Where [`free_port`] picks from: below Linux's ephemeral range (32768–60999) and below the
/// agents' host port ranges (18000 up, [`PORT_SHIFT`]).
const FREE_PORTS: std::ops::Range<u16> = 10_000..18_000;

/// A free TCP port on loopback (bound and released), outside the ephemeral range: a process
/// restarted on it (an agent's RPC or metrics port, a manager's API) must find it free again,
/// and a port from the ephemeral range may meanwhile be the local end of any outgoing
/// connection on the host (an agent restarted in a test died of `Address already in use` on
/// its metrics port so). Picked at random in [`FREE_PORTS`] so tests running side by side
/// rarely try the same one, and checked by binding it.
pub fn free_port() -> u16 {
    let span = FREE_PORTS.end - FREE_PORTS.start;
    for _ in 0..1000 {
        let b = uuid::Uuid::new_v4().into_bytes();
        let port = FREE_PORTS.start + u16::from_le_bytes([b[0], b[1]]) % span;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FREE_PORTS:?} after 1000 tries");
}

/// Starts a container of the test image labelled as agent `agent_id`'s kernel `kernel_id`
/// (one no manager placed: reported `kernel_dangling` at the agent's next start). Returns its id.
#[allow(dead_code)]
pub fn ghost_container(agent_id: &str, kernel_id: &str) -> String {
    let id = docker(&[
        "run",
        "-d",
        "--label",
        &format!("ai.backend.agent-id={agent_id}"),
        "--label",
        &format!("ai.backend.kernel-id={kernel_id}"),
        TEST_IMAGE,
    ]);
    assert!(!id.is_empty(), "docker run the unknown container");
    id
}

/// An agent's directory, config and cleanup guard.
pub struct AgentFixture {
    pub dir: tempfile::TempDir,
    pub agent_id: String,
    pub rpc_port: u16,
    pub port_range: (u16, u16),
}

/// Tests name their agents' host port ranges from 30000 up; they are moved down by this much,
/// below Linux's ephemeral range (32768–60999), where an outgoing connection or a
/// [`free_port`] could take one of them meanwhile (CI once saw `bind: address already in use`).
const PORT_SHIFT: u16 = 12_000;

impl AgentFixture {
    /// A fixture for agent `<name>-<run id>` with host ports `lo - PORT_SHIFT` and the
    /// `range_len - 1` after it (`lo` ≥ 30000, distinct per test as before). A range that ends
    /// above 44768 reaches the ephemeral range once shifted (`address already in use`, seen
    /// with 44800); the halfstack test does so on purpose, on ports its harness reserves.
    pub fn new(name: &str, lo: u16, range_len: u16) -> AgentFixture {
        assert!(lo >= 30_000, "test port ranges start at 30000 or above");
        let lo = lo - PORT_SHIFT;
        let dir = tempfile::Builder::new()
            .prefix(&format!("kv-{name}-"))
            .tempdir()
            .unwrap();
        std::fs::create_dir_all(dir.path().join("vfolders")).unwrap();
        AgentFixture {
            agent_id: format!("test-{name}-{}", run_id()),
            rpc_port: free_port(),
            port_range: (lo, lo + range_len - 1),
            dir,
        }
    }

    pub fn scratch_root(&self) -> PathBuf {
        self.dir.path().join("scratches")
    }

    pub fn vfolder_root(&self) -> PathBuf {
        self.dir.path().join("vfolders")
    }

    /// The agent's config file text (`extra` appended, e.g. `on-shutdown`).
    pub fn config_toml(&self, agent_extra: &str) -> String {
        let d = self.dir.path().display();
        format!(
            "[agent]\nid = \"{id}\"\nrpc-listen-addr = {{ host = \"127.0.0.1\", port = {port} }}\nservice-addr = {{ host = \"127.0.0.1\", port = 0 }}\nvar-base-path = \"{d}/var\"\n{agent_extra}\n\
             [container]\nport-range = [{lo}, {hi}]\nport-reuse-cooldown = 0.1\nbind-host = \"127.0.0.1\"\nscratch-root = \"{d}/scratches\"\nvfolder-root = \"{d}/vfolders\"\n\
             [resource]\nreserved-cpu = 0\nreserved-mem = 0\n\n[logging]\nlevel = \"warn\"\n",
            id = self.agent_id,
            port = self.rpc_port,
            lo = self.port_range.0,
            hi = self.port_range.1,
        )
    }

    /// Writes the config and returns its path.
    pub fn write_config(&self, agent_extra: &str) -> PathBuf {
        let p = self.dir.path().join("agent.toml");
        std::fs::write(&p, self.config_toml(agent_extra)).unwrap();
        p
    }

    /// The parsed config (through the real loader).
    pub fn config(&self, agent_extra: &str) -> AgentConfig {
        AgentConfig::load(&self.write_config(agent_extra)).unwrap()
    }

    /// Container ids (running or not) carrying this agent's id.
    pub fn containers(&self) -> Vec<String> {
        docker(&[
            "ps",
            "-aq",
            "--filter",
            &format!("label=ai.backend.agent-id={}", self.agent_id),
        ])
        .lines()
        .map(str::to_owned)
        .collect()
    }

    /// Entries left in the scratch root.
    pub fn scratch_entries(&self) -> Vec<String> {
        match std::fs::read_dir(self.scratch_root()) {
            Ok(d) => d
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

impl Drop for AgentFixture {
    fn drop(&mut self) {
        let ids = self.containers();
        if !ids.is_empty() {
            let mut args = vec!["rm", "-f"];
            args.extend(ids.iter().map(String::as_str));
            let _ = Command::new("docker").args(&args).output();
        }
    }
}

/// Runs the docker CLI (to check the engine independently of our backend); stdout trimmed.
pub fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `docker inspect -f FORMAT id`, or `None` if the container does not exist.
pub fn inspect(id: &str, format: &str) -> Option<String> {
    let out = Command::new("docker")
        .args(["inspect", "-f", format, id])
        .output()
        .expect("docker CLI");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A plain (no CURVE) client to `endpoint`.
pub async fn client(endpoint: &str) -> Peer {
    let ctx = zmq::Context::new();
    let opts = PeerOptions {
        endpoint: endpoint.to_owned(),
        curve: None,
        keepalive: None,
        handshake_timeout: Duration::from_secs(5),
    };
    Peer::connect(&ctx, &opts).await.expect("connect to agent")
}

/// Calls `method(*args)` with a generous timeout.
pub async fn call(peer: &Peer, method: &str, args: Vec<Value>) -> Result<Value, CallError> {
    peer.call(
        method,
        &Call {
            args,
            kwargs: vec![],
            peer_user_id: None,
        },
        Duration::from_secs(120),
    )
    .await
}

/// Calls `method(*args, **kwargs)` with a generous timeout.
#[allow(dead_code)]
pub async fn call_kw(
    peer: &Peer,
    method: &str,
    args: Vec<Value>,
    kwargs: Vec<(&str, Value)>,
) -> Result<Value, CallError> {
    peer.call(
        method,
        &Call {
            args,
            kwargs: kwargs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
            peer_user_id: None,
        },
        Duration::from_secs(120),
    )
    .await
}

/// The FAILURE name of a failed call.
pub fn failure_name(r: &Result<Value, CallError>) -> String {
    match r {
        Err(CallError::Failure(meta)) => meta.name.clone(),
        other => panic!("expected a FAILURE, got {other:?}"),
    }
}

/// `{"k": v, …}`.
pub fn map(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(
        pairs
            .into_iter()
            .map(|(k, v)| (Value::from(k), v))
            .collect(),
    )
}

/// Field `key` of a map value.
pub fn field<'a>(v: &'a Value, key: &str) -> &'a Value {
    v.as_map()
        .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(key)))
        .map(|(_, v)| v)
        .unwrap_or(&Value::Nil)
}

/// An `ImageConfig` (Backend.AI's shape) for local image `name`: registry `local`, never pulled.
pub fn image(name: &str) -> Value {
    kernelvisor::rpc::agent_api::to_value(&kernelvisor::rpc::agent_api::kernel::ImageConfig::local(
        name,
    ))
}

/// A `KernelCreationConfig` (Backend.AI's shape) for the test image: `cpu` cores (decimal
/// string), `mem` bytes, owned by user `u-1` of project `p-1` with access key `AKTEST` (in
/// `environ`, as Backend.AI's manager passes it), plus extra keys; an extra `environ` is merged.
pub fn kernel_config(cpu: &str, mem: u64, extra: Vec<(&str, Value)>) -> Value {
    let mut environ = vec![(Value::from("BACKENDAI_ACCESS_KEY"), Value::from("AKTEST"))];
    let mut pairs = vec![
        ("image", image(TEST_IMAGE)),
        (
            "resource_slots",
            map(vec![("cpu", cpu.into()), ("mem", mem.into())]),
        ),
        ("owner_user_id", "u-1".into()),
        ("owner_project_id", "p-1".into()),
    ];
    for (k, v) in extra {
        if k == "environ" {
            environ.extend(v.as_map().cloned().unwrap_or_default());
            continue;
        }
        pairs.retain(|(x, _)| *x != k);
        pairs.push((k, v));
    }
    pairs.push(("environ", Value::Map(environ)));
    map(pairs)
}

/// `create_kernels(session, [id], [config])` → the kernel's info.
pub async fn create_one(
    peer: &Peer,
    session: &str,
    id: &str,
    config: Value,
) -> Result<Value, CallError> {
    call(
        peer,
        "create_kernels",
        vec![
            session.into(),
            Value::Array(vec![id.into()]),
            Value::Array(vec![config]),
        ],
    )
    .await
    .map(|v| {
        v.as_array()
            .and_then(|a| a.first().cloned())
            .expect("one kernel info")
    })
}

/// `resource_usage()["occupied"]["cpu"]`, `["mem"]`, and free host ports.
pub async fn usage(peer: &Peer) -> (String, String, u64) {
    let u = call(peer, "resource_usage", vec![]).await.unwrap();
    let occ = field(&u, "occupied");
    (
        field(occ, "cpu").as_str().unwrap().to_owned(),
        field(occ, "mem").as_str().unwrap().to_owned(),
        field(&u, "free_host_ports").as_u64().unwrap(),
    )
}

/// Reads a file under `path` to a string ("" if missing).
pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The agent binary (built with `fault-injection` by `just test-all`) on config file `config`,
/// its output appended to `<fixture dir>/agent.log`.
#[allow(dead_code)] // Not every test binary that includes `common` starts agent processes.
pub fn spawn_agent_process(fx: &AgentFixture, config: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(fx.dir.path().join("agent.log"))
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .args(["agent", "--config"])
        .arg(config)
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn the agent")
}

/// A client of an agent process once its RPC endpoint takes a connection (60 tries of 0.5 s);
/// panics with the agent's log otherwise.
#[allow(dead_code)]
pub async fn connect_process(fx: &AgentFixture) -> Peer {
    let endpoint = format!("tcp://127.0.0.1:{}", fx.rpc_port);
    for _ in 0..60 {
        let ctx = zmq::Context::new();
        let opts = PeerOptions {
            endpoint: endpoint.clone(),
            curve: None,
            keepalive: None,
            handshake_timeout: Duration::from_millis(500),
        };
        if let Ok(peer) = Peer::connect(&ctx, &opts).await {
            return peer;
        }
    }
    panic!(
        "agent did not come up; log:\n{}",
        read(&fx.dir.path().join("agent.log"))
    );
}

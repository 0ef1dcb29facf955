//! `just bench exec`'s kernel-runner rows: Backend.AI's kernel runner (PyPI `backend.ai-kernel`
//! 26.9.6, provisioned by `just krunner`) in kernels of `kernelvisor-test-py:latest` (`just
//! test-image-py`), on in-process agents, each on its own thread and actix System (as its own
//! process would be: the bench's client never shares the agent's thread), CURVE on the RPC, the
//! local Docker engine. Kernels of 1 core and 512 MiB, run as uid/gid 1000.
//!
//! 1. `execute` round trip: `execute(session, kernel, 2, <a fresh run id>, "query", "pass", {},
//!    2.0)` over the agent's RPC, as Backend.AI's manager calls it (one call answers `finished`
//!    for `pass`), against the runner's own round trip: a plain ZeroMQ client (PUSH connected
//!    to `repl_in_port`, PULL connected to `repl_out_port`, `[code, pass]` sent, frames read
//!    until `finished`) on the SAME kernel.
//!
//!    The runner's PUSH deals its messages round-robin over every PULL connected to it, and
//!    the agent connects one to each runner kernel it serves, so the two clients must never be
//!    connected at once. They take turns, in rounds: an agent phase with the agent up; then the
//!    agent stops gracefully with `OnShutdown::Preserve` (its runner connection closes; the
//!    container and its REPL keep running, as on an agent upgrade) and the plain client has
//!    the kernel to itself; then a new agent starts on the same state and re-attaches the
//!    kernel (its runner client reconnects from the container's published ports at the first
//!    call). Before a phase starts, no connection to the kernel's repl-out port may be left;
//!    at its end exactly one must be ESTABLISHED (the phase's own): both read off
//!    `/proc/net/tcp`, so no phase shares the runner's output with another socket. Same
//!    kernel, same REPL, same ports, same Docker port publishing: the difference is the
//!    agent (RPC, CURVE, codec, dispatch, the runner client's queue and reader).
//!    `KV_BENCH_RUNNER_ROUNDS` (10) rounds of an agent phase then a plain phase, so that a
//!    change in the machine's load meets both paths; a path's first phase runs
//!    `KV_BENCH_RUNNER_WARMUP` (20) untimed calls, its later ones 3 (after the reconnect), then
//!    its share of `KV_BENCH_RUNNER_CALLS` (300 per path). p50 and p99 over each path's calls;
//!    the 1-minute load average before and after is printed with them. Targets: the agent adds
//!    ≤ 1 ms at p50 and ≤ 2 ms at p99.
//! 2. create → `RUNNING`: `create_kernels` of one kernel (it answers once the kernel is
//!    `RUNNING`; a runner kernel is `RUNNING` once its runner answered `status` and then
//!    `get-apps`) on an agent with `[kernel-runner] mode = "auto"` (the runner) and on a second
//!    agent with `mode = "off"` (the process path; the image has no command of its own, so
//!    these kernels get `startup_command = "exec sleep infinity"`), alternating which goes first,
//!    `KV_BENCH_RUNNER_CREATES` (5) each after one untimed warm-up each; every kernel is
//!    destroyed (untimed) before the next create. Each runner create is split into phases: the
//!    agent's stages (`get_kernel`'s `setup_seconds`, in setup order; `runner` is the wait for
//!    the runner), and that wait split by the container's log (`docker logs -t`, the engine's
//!    clock): start → the entrypoint execs the runner (`Executing the main program`) → the runner's
//!    intrinsic services are up (its last `Service … has started`: it serves right after) → the
//!    agent's `RUNNING` (the create's answer, this host's clock). p50 of each over the creates.
//!
//! `KV_BENCH_RUNNER_ONLY_CREATES=1` runs only 2 (and `exec.rs` nothing else): a focused run of
//! the create path. `KV_BENCH_RUNNER_PORTS` moves the agents' host ports (default 17600: 60
//! ports from there).
//!
//! [`krunner_dir`] says where the runner is; without one these rows are skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context as _};
use rmpv::Value;

use kernelvisor::agent::runner::protocol::{decode, FromRunner, Step, ToRunner};
use kernelvisor::agent::runner::RunnerPorts;
use kernelvisor::agent::Agent;
use kernelvisor::config::{AgentConfig, OnShutdown};
use kernelvisor::rpc::agent_api::exec::{Execute, ExecuteArgs};
use kernelvisor::rpc::agent_api::kernel::{
    CreateKernels, CreateKernelsArgs, DestroyKernel, DestroyKernelArgs, GetKernel, ImageConfig,
    KernelCreationConfig, KernelCreationResult, KernelIdArgs,
};
use kernelvisor::rpc::agent_api::{decode_reply, encode_args, to_value, Method};
use kernelvisor::rpc::curve::{write_certificates, KeyPair};
use kernelvisor::rpc::socket::ClientCurve;
use kernelvisor::rpc::{Peer, PeerOptions};

use crate::common::env_or;
use crate::common::fleet::percentile;

/// The Python kernel image (`just test-image-py`).
pub const PY_IMAGE: &str = "kernelvisor-test-py:latest";

/// Where the kernel runner's provisioned copy lives when `KV_KRUNNER_DIR` does not say.
const DEFAULT_KRUNNER_DIR: &str = "/var/cache/kernelvisor/krunner";

/// Untimed calls at the start of a path's later phases (the first call reconnects).
const RECONNECT_WARMUP: usize = 3;

/// How long one `execute` or one plain round trip may take before the bench fails.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// `KV_KRUNNER_DIR`, else [`DEFAULT_KRUNNER_DIR`] when it exists; `Err` says why there is none.
pub fn krunner_dir() -> Result<PathBuf, String> {
    match std::env::var_os("KV_KRUNNER_DIR") {
        Some(d) if !d.is_empty() => Ok(PathBuf::from(d)),
        _ if Path::new(DEFAULT_KRUNNER_DIR).is_dir() => Ok(PathBuf::from(DEFAULT_KRUNNER_DIR)),
        _ => Err(format!(
            "KV_KRUNNER_DIR is not set and {DEFAULT_KRUNNER_DIR} does not exist (run `just krunner`)"
        )),
    }
}

/// What the runner rows measured; times in milliseconds.
pub struct RunnerFigures {
    /// Timed calls per path.
    pub calls: usize,
    /// Alternating rounds (agent phase, plain phase).
    pub rounds: usize,
    /// `execute` over the agent's RPC: p50, p99.
    pub agent: (f64, f64),
    /// The plain ZeroMQ client on the same kernel: p50, p99.
    pub plain: (f64, f64),
    /// The 1-minute load average before and after the round trips.
    pub load: (f64, f64),
    /// create → `RUNNING` with the runner, each create.
    pub create_runner: Vec<f64>,
    /// create → `RUNNING` on the process path (`mode = "off"`), each create.
    pub create_off: Vec<f64>,
    /// Each runner create's phases (name, ms), in order.
    pub phases: Vec<Vec<(String, f64)>>,
}

impl RunnerFigures {
    /// What the agent adds at p50 and p99.
    pub fn added(&self) -> (f64, f64) {
        (self.agent.0 - self.plain.0, self.agent.1 - self.plain.1)
    }

    /// Whether the agent adds ≤ 1 ms at p50 and ≤ 2 ms at p99.
    pub fn met(&self) -> bool {
        let (p50, p99) = self.added();
        p50 <= 1.0 && p99 <= 2.0
    }

    /// Prints the tables (the `execute` one only when it was measured).
    pub fn print(&self) {
        if self.calls > 0 {
            self.print_execute();
        }
        self.print_creates();
    }

    fn print_execute(&self) {
        let r2 = |x: f64| format!("{x:.2}");
        println!(
            "\nkernel runner (backend.ai-kernel 26.9.6) on {PY_IMAGE}: `execute` query `pass`, {} calls per path on one kernel, {} alternating rounds",
            self.calls, self.rounds
        );
        println!("{:<46} {:>8} {:>8}", "path", "p50 ms", "p99 ms");
        let row = |name: &str, (a, b): (f64, f64)| println!("{name:<46} {:>8} {:>8}", r2(a), r2(b));
        row("runner alone (plain ZeroMQ PUSH/PULL)", self.plain);
        row("agent `execute` over RPC (CURVE)", self.agent);
        row("added by the agent (target ≤ 1 / ≤ 2)", self.added());
        row(
            "ratio (agent / runner alone)",
            (self.agent.0 / self.plain.0, self.agent.1 / self.plain.1),
        );
        println!(
            "target (added p50 ≤ 1 ms, p99 ≤ 2 ms): {}; load average {:.2} before, {:.2} after ({} cores)",
            if self.met() { "met" } else { "NOT met" },
            self.load.0,
            self.load.1,
            std::thread::available_parallelism().map_or(0, usize::from)
        );
    }

    fn print_creates(&self) {
        let (with, without) = (
            crate::common::median(self.create_runner.clone()),
            crate::common::median(self.create_off.clone()),
        );
        let runs = |v: &[f64]| {
            v.iter()
                .map(|x| format!("{x:.0}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "\ncreate → RUNNING on {PY_IMAGE}, {} each, alternating",
            self.create_runner.len()
        );
        println!("{:<46} {:>8} {:>30}", "path", "p50 ms", "runs (ms)");
        println!(
            "{:<46} {:>8.0} {:>30}",
            "with the runner (mode auto)",
            with,
            runs(&self.create_runner)
        );
        println!(
            "{:<46} {:>8.0} {:>30}",
            "process path (mode off)",
            without,
            runs(&self.create_off)
        );
        println!(
            "{:<46} {:>8.2}",
            "ratio (runner / process path)",
            with / without
        );
        let (min, max) = self
            .create_runner
            .iter()
            .fold((f64::INFINITY, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        println!(
            "{:<46} {:>8.0} {:>8.0}",
            "with the runner: min, max", min, max
        );
        println!("\nwith the runner, by phase (p50 over the creates, ms)");
        for (name, p50) in self.phase_p50() {
            println!("  {name:<44} {p50:>8.0}");
        }
    }

    /// Each phase's p50, in the order of the first create's phases.
    pub fn phase_p50(&self) -> Vec<(String, f64)> {
        let Some(first) = self.phases.first() else {
            return Vec::new();
        };
        first
            .iter()
            .map(|(name, _)| {
                let v: Vec<f64> = self
                    .phases
                    .iter()
                    .filter_map(|p| p.iter().find(|(n, _)| n == name).map(|(_, ms)| *ms))
                    .collect();
                (name.clone(), crate::common::median(v))
            })
            .collect()
    }

    /// The figures for the bench's JSON line.
    pub fn json(&self) -> serde_json::Value {
        let r = |x: f64| (x * 100.0).round() / 100.0;
        let (added50, added99) = self.added();
        let (with, without) = (
            crate::common::median(self.create_runner.clone()),
            crate::common::median(self.create_off.clone()),
        );
        let phases: serde_json::Map<String, serde_json::Value> = self
            .phase_p50()
            .into_iter()
            .map(|(n, ms)| (n, r(ms).into()))
            .collect();
        serde_json::json!({
            "create_runner_phases_p50_ms": phases,
            "calls": self.calls,
            "exec_p50_ms": r(self.agent.0), "exec_p99_ms": r(self.agent.1),
            "zmq_p50_ms": r(self.plain.0), "zmq_p99_ms": r(self.plain.1),
            "added_p50_ms": r(added50), "added_p99_ms": r(added99),
            "ratio_p50": r(self.agent.0 / self.plain.0), "ratio_p99": r(self.agent.1 / self.plain.1),
            "create_runner_p50_ms": r(with), "create_off_p50_ms": r(without),
            "create_ratio": r(with / without),
            "load_before": self.load.0, "load_after": self.load.1,
        })
    }
}

/// Runs both measurements with the runner in `krunner`.
///
/// Errors: an agent that does not start, a create or call that fails or answers other than
/// `finished` with exit code 0, a phase that finds another connection to the runner.
pub fn run(krunner: &Path) -> anyhow::Result<RunnerFigures> {
    let calls: usize = env_or("KV_BENCH_RUNNER_CALLS", 300usize).max(1);
    let rounds: usize = env_or("KV_BENCH_RUNNER_ROUNDS", 10usize).clamp(1, calls);
    let warmup: usize = env_or("KV_BENCH_RUNNER_WARMUP", 20usize);
    let creates: usize = env_or("KV_BENCH_RUNNER_CREATES", 5usize).max(1);
    let only_creates = env_or("KV_BENCH_RUNNER_ONLY_CREATES", 0u8) == 1;
    // Host port ranges below the tests' (18000 and up) and Linux's ephemeral range.
    let base: u16 = env_or("KV_BENCH_RUNNER_PORTS", 17600u16);
    let auto = Fixture::new("runner", krunner, "auto", (base, base + 39))?;
    let off = Fixture::new("plain", krunner, "off", (base + 40, base + 59))?;
    let _ = AgentConfig::load(&auto.config)?.logging.init();

    actix_rt::System::new().block_on(async move {
        // 2. create → RUNNING, both agents up.
        let (a, o) = (AgentThread::start(&auto)?, AgentThread::start(&off)?);
        let (pa, po) = (a.peer(&auto).await?, o.peer(&off).await?);
        let (mut create_runner, mut create_off, mut phases) = (Vec::new(), Vec::new(), Vec::new());
        // Round 0 is the warm-up (the image's glibc probe, the engine's caches).
        for i in 0..=creates {
            let order = if i % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for with_runner in order {
                let (peer, out) = if with_runner {
                    (&pa, &mut create_runner)
                } else {
                    (&po, &mut create_off)
                };
                let (ms, phased) = create_timed(peer, with_runner).await?;
                if i > 0 {
                    out.push(ms);
                    if with_runner {
                        phases.push(phased);
                    }
                }
            }
        }
        po.close();
        o.stop(OnShutdown::Terminate);
        if only_creates {
            pa.close();
            a.stop(OnShutdown::Terminate);
            return Ok(RunnerFigures {
                calls: 0,
                rounds: 0,
                agent: (f64::NAN, f64::NAN),
                plain: (f64::NAN, f64::NAN),
                load: (f64::NAN, f64::NAN),
                create_runner,
                create_off,
                phases,
            });
        }

        // 1. execute round trips on one runner kernel, the agent and the plain client in turns.
        let kid = uuid::Uuid::new_v4().to_string();
        let created = create(&pa, &kid, None).await?;
        let ports = RunnerPorts {
            repl_in: created.repl_in_port,
            repl_out: created.repl_out_port,
        };
        ensure!(
            ports.repl_in > 0 && ports.repl_out > 0,
            "the kernel got no runner (repl ports {ports:?})"
        );
        let (mut agent_ms, mut plain_ms) = (Vec::new(), Vec::new());
        let (mut agent, mut peer) = (Some(a), Some(pa));
        let load_before = load_average();
        for round in 0..rounds {
            let n = calls / rounds + usize::from(round < calls % rounds);
            let warmup = if round == 0 { warmup } else { RECONNECT_WARMUP };
            // The agent's phase.
            if agent.is_none() {
                expect_connections(ports.repl_out, 0, "before the agent's phase")?;
                let a = AgentThread::start(&auto)?;
                peer = Some(a.peer(&auto).await?);
                agent = Some(a);
            }
            let p = peer.take().expect("a peer with the agent");
            for _ in 0..warmup {
                execute_pass(&p, &kid).await?;
            }
            for _ in 0..n {
                agent_ms.push(execute_pass(&p, &kid).await?);
            }
            expect_connections(ports.repl_out, 1, "at the end of the agent's phase")?;
            p.close();
            agent.take().expect("the agent").stop(OnShutdown::Preserve);

            // The plain client's phase: the agent is gone, its runner socket closed.
            expect_connections(ports.repl_out, 0, "before the plain client's phase")?;
            let plain = PlainClient::connect(ports)?;
            for _ in 0..warmup {
                plain.pass()?;
            }
            for _ in 0..n {
                plain_ms.push(plain.pass()?);
            }
            expect_connections(ports.repl_out, 1, "at the end of the plain client's phase")?;
        }
        let load_after = load_average();
        // A new agent re-attaches the kernel and destroys it.
        expect_connections(ports.repl_out, 0, "before the last agent start")?;
        let a = AgentThread::start(&auto)?;
        let p = a.peer(&auto).await?;
        destroy(&p, &kid).await?;
        p.close();
        a.stop(OnShutdown::Terminate);

        let p = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (percentile(v, 0.5), percentile(v, 0.99))
        };
        Ok(RunnerFigures {
            calls,
            rounds,
            agent: p(&mut agent_ms),
            plain: p(&mut plain_ms),
            load: (load_before, load_after),
            create_runner,
            create_off,
            phases,
        })
    })
}

// ---------------------------------------------------------------------------------------------
// Agents.

/// One agent's directory, keys and config; removes its containers when dropped (also when the
/// bench fails).
struct Fixture {
    /// Config, keys, state, scratch; deleted with the fixture.
    _dir: tempfile::TempDir,
    agent_id: String,
    config: PathBuf,
    curve: ClientCurve,
}

impl Fixture {
    /// Agent `bench-exec-<name>-<pid>` with CURVE, `[kernel-runner] dir = krunner` in `mode`,
    /// host ports `lo..=hi` on 127.0.0.1.
    fn new(name: &str, krunner: &Path, mode: &str, (lo, hi): (u16, u16)) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("kv-bench-exec-{name}-"))
            .tempdir()?;
        let (manager, agent) = (KeyPair::generate()?, KeyPair::generate()?);
        let keys = dir.path().join("keys");
        let (manager_public, _) = write_certificates(&keys, "manager", &manager)?;
        let (_, agent_secret) = write_certificates(&keys, "agent", &agent)?;
        let agent_id = format!("bench-exec-{name}-{}", std::process::id());
        let d = dir.path().display();
        let config = dir.path().join("agent.toml");
        std::fs::write(
            &config,
            format!(
                "[agent]\nid = \"{agent_id}\"\nrpc-listen-addr = {{ host = \"127.0.0.1\", port = 0 }}\n\
                 service-addr = {{ host = \"127.0.0.1\", port = 0 }}\nvar-base-path = \"{d}/var\"\n\
                 rpc-auth-manager-public-key = \"{mp}\"\nrpc-auth-agent-keypair = \"{ak}\"\n\n\
                 [container]\nport-range = [{lo}, {hi}]\nport-reuse-cooldown = 0.1\nbind-host = \"127.0.0.1\"\n\
                 scratch-root = \"{d}/scratches\"\n\n\
                 [resource]\nreserved-cpu = 0\nreserved-mem = 0\n\n\
                 [kernel-runner]\ndir = \"{k}\"\nmode = \"{mode}\"\ninit-timeout = 60\n\n\
                 [logging]\nlevel = \"warn\"\n",
                mp = manager_public.display(),
                ak = agent_secret.display(),
                k = krunner.display(),
            ),
        )?;
        Ok(Fixture {
            _dir: dir,
            agent_id,
            config,
            curve: ClientCurve {
                keypair: manager,
                server_key: agent.public,
            },
        })
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let label = format!("label=ai.backend.agent-id={}", self.agent_id);
        let ids = Command::new("docker")
            .args(["ps", "-aq", "--filter", &label])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let ids: Vec<&str> = ids.split_whitespace().collect();
        if !ids.is_empty() {
            let _ = Command::new("docker")
                .args(["rm", "-f"])
                .args(&ids)
                .output();
        }
    }
}

/// An agent on its own thread and actix System; stopped (destroying its kernels) when dropped.
struct AgentThread {
    endpoint: String,
    stop: Option<tokio::sync::oneshot::Sender<OnShutdown>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl AgentThread {
    /// Starts the agent of `fx` and waits until it serves RPC.
    fn start(fx: &Fixture) -> anyhow::Result<AgentThread> {
        let path = fx.config.clone();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<anyhow::Result<String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let thread = std::thread::spawn(move || {
            actix_rt::System::new().block_on(async move {
                let agent = match AgentConfig::load(&path) {
                    Ok(c) => Agent::start(c, None).await,
                    Err(e) => Err(e.into()),
                };
                match agent {
                    Ok(agent) => {
                        let _ = ready_tx.send(Ok(agent.endpoint().to_owned()));
                        let mode = stop_rx.await.unwrap_or(OnShutdown::Terminate);
                        agent.shutdown(mode).await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
        });
        let endpoint = ready_rx
            .recv()
            .map_err(|_| anyhow!("the agent thread ended before it started"))?
            .context("start an agent (is the Docker engine up?)")?;
        Ok(AgentThread {
            endpoint,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// A client as a manager's (CURVE with the fixture's keys).
    async fn peer(&self, fx: &Fixture) -> anyhow::Result<Peer> {
        let opts = PeerOptions {
            endpoint: self.endpoint.clone(),
            curve: Some(fx.curve.clone()),
            keepalive: None,
            handshake_timeout: Duration::from_secs(5),
        };
        Peer::connect(&zmq::Context::new(), &opts)
            .await
            .map_err(|e| anyhow!("connect to the agent at {}: {e}", self.endpoint))
    }

    /// Shuts the agent down (`mode`) and waits until it has.
    fn stop(mut self, mode: OnShutdown) {
        self.halt(mode);
    }

    fn halt(&mut self, mode: OnShutdown) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(mode);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AgentThread {
    fn drop(&mut self) {
        self.halt(OnShutdown::Terminate);
    }
}

// ---------------------------------------------------------------------------------------------
// Calls, typed as the manager makes them (`kernelvisor::rpc::agent_api`).

async fn call<M: Method>(peer: &Peer, args: &M::Args) -> anyhow::Result<M::Reply> {
    let v = peer
        .call(M::NAME, &encode_args::<M>(args), Duration::from_secs(120))
        .await
        .map_err(|e| anyhow!("{}: {e}", M::NAME))?;
    decode_reply::<M>(v).map_err(|e| anyhow!("{} reply: {e}", M::NAME))
}

const SESSION: &str = "bench-exec-runner";

/// `create_kernels` of kernel `kid` on [`PY_IMAGE`]: 1 core, 512 MiB, uid/gid 1000, with
/// `startup_command` (`sh -c`) when given.
async fn create(
    peer: &Peer,
    kid: &str,
    startup_command: Option<&str>,
) -> anyhow::Result<KernelCreationResult> {
    let config = KernelCreationConfig {
        image: ImageConfig::local(PY_IMAGE),
        kernel_id: Some(kid.to_owned()),
        session_id: Some(SESSION.to_owned()),
        owner_user_id: Some("u-bench".into()),
        owner_project_id: Some("p-bench".into()),
        uid: Some(1000),
        main_gid: Some(1000),
        resource_slots: BTreeMap::from([
            ("cpu".to_owned(), Value::from("1")),
            ("mem".to_owned(), Value::from((512u64 << 20).to_string())),
        ]),
        environ: BTreeMap::from([("BACKENDAI_ACCESS_KEY".to_owned(), Value::from("AKBENCH"))]),
        startup_command: startup_command.map(str::to_owned),
        ..KernelCreationConfig::default()
    };
    let args = CreateKernelsArgs {
        session_id: SESSION.to_owned(),
        kernel_ids: vec![kid.to_owned()],
        configs: vec![to_value(&config)],
        ..CreateKernelsArgs::default()
    };
    let mut reply = call::<CreateKernels>(peer, &args).await.with_context(|| {
        format!("create a kernel of {PY_IMAGE} (is `just test-image-py` built?)")
    })?;
    ensure!(reply.len() == 1, "{} kernels created, not 1", reply.len());
    let created = reply.remove(0);
    let status = created.info.get("status").and_then(Value::as_str);
    ensure!(
        status == Some("RUNNING"),
        "created as {status:?}, not RUNNING"
    );
    Ok(created)
}

async fn destroy(peer: &Peer, kid: &str) -> anyhow::Result<()> {
    let args = DestroyKernelArgs {
        kernel_id: kid.to_owned(),
        session_id: Some(SESSION.to_owned()),
        reason: Some("bench".into()),
        suppress_events: None,
        grace_period: None,
    };
    call::<DestroyKernel>(peer, &args).await.map(drop)
}

/// One timed create (ms) with the runner (`runner`) or on the process path, checked to be
/// which it should, and its phases (a runner create's: see the module doc; none otherwise),
/// then an untimed destroy. The image has no command of its own (upstream's kernel images get
/// theirs from the runner), so a process-path kernel is given `sleep infinity` as its
/// `startup_command`, the least a kernel without the runner runs.
async fn create_timed(peer: &Peer, runner: bool) -> anyhow::Result<(f64, Vec<(String, f64)>)> {
    let kid = uuid::Uuid::new_v4().to_string();
    let startup = (!runner).then_some("exec sleep infinity");
    let t0 = Instant::now();
    let created = create(peer, &kid, startup).await?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let running_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    let has_runner = created.repl_in_port > 0;
    let phases = if has_runner {
        phases(peer, &kid, ms, running_at).await?
    } else {
        Vec::new()
    };
    destroy(peer, &kid).await?;
    if has_runner != runner {
        bail!(
            "a create expected {} the runner got the other path",
            if runner { "with" } else { "without" }
        );
    }
    Ok((ms, phases))
}

/// A runner create's phases (see the module doc): its stages' setup times from `get_kernel`,
/// the runner stage split by kernel `kid`'s container log, and what is left of `total_ms`
/// (the RPC, the kernel actor, events); `running_at`: when the create answered.
async fn phases(
    peer: &Peer,
    kid: &str,
    total_ms: f64,
    running_at: f64,
) -> anyhow::Result<Vec<(String, f64)>> {
    let args = KernelIdArgs {
        kernel_id: kid.to_owned(),
    };
    let info = call::<GetKernel>(peer, &args).await?;
    let mut out = Vec::new();
    let stages = info
        .rest
        .get("stages")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("get_kernel has no stages"))?;
    for st in stages {
        let get = |k: &str| {
            st.as_map()
                .and_then(|m| m.iter().find(|(n, _)| n.as_str() == Some(k)))
                .map(|(_, v)| v.clone())
        };
        let name = get("name")
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let secs = get("setup_seconds").and_then(|v| v.as_f64()).unwrap_or(0.0);
        out.push((format!("stage {name}"), secs * 1e3));
    }
    let staged: f64 = out.iter().map(|(_, ms)| ms).sum();
    // The container's log, by the engine's clock.
    let container = format!("kernel.{kid}");
    let started = Command::new("docker")
        .args(["inspect", "-f", "{{.State.StartedAt}}", &container])
        .output()?;
    let started = utc_secs(String::from_utf8_lossy(&started.stdout).trim())
        .ok_or_else(|| anyhow!("{container}'s StartedAt is not a UTC time"))?;
    let logs = Command::new("docker")
        .args(["logs", "-t", &container])
        .output()?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&logs.stdout),
        String::from_utf8_lossy(&logs.stderr)
    );
    let at = |needle: &str, last: bool| {
        let mut hits = text
            .lines()
            .filter(|l| l.contains(needle))
            .filter_map(|l| utc_secs(l.split_whitespace().next()?));
        if last {
            hits.next_back()
        } else {
            hits.next()
        }
    };
    let ms = |a: f64, b: f64| (b - a) * 1e3;
    if let (Some(exec), Some(serving)) = (
        at("Executing the main program", false),
        at("has started (pid", true),
    ) {
        out.push((
            "  runner: start → entrypoint execs it".into(),
            ms(started, exec),
        ));
        out.push((
            "  runner: its Python, ipykernel, services".into(),
            ms(exec, serving),
        ));
        out.push((
            "  runner: serving → agent's RUNNING".into(),
            ms(serving, running_at),
        ));
    }
    out.push((
        "other (RPC, kernel actor, events)".into(),
        total_ms - staged,
    ));
    Ok(out)
}

/// Seconds since the epoch of the engine's UTC times (`2026-11-28T15:45:16.254050391Z`).
fn utc_secs(t: &str) -> Option<f64> {
    let (date, time) = t.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let mut hms = time.splitn(3, ':');
    let (h, min) = (
        hms.next()?.parse::<f64>().ok()?,
        hms.next()?.parse::<f64>().ok()?,
    );
    let sec = hms.next()?.parse::<f64>().ok()?;
    // Days from 1970-01-01 to y-m-day (the proleptic Gregorian calendar's civil-from-days).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((m + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + sec)
}

/// One `execute` of `pass` in query mode with a fresh run id, as Backend.AI's manager sends
/// it; its round trip in ms. The call is built, and the answer checked, off the clock.
async fn execute_pass(peer: &Peer, kid: &str) -> anyhow::Result<f64> {
    let run_id = uuid::Uuid::new_v4().simple().to_string();
    let args = ExecuteArgs {
        session_id: Some(SESSION.to_owned()),
        kernel_id: kid.to_owned(),
        api_version: Some(2.into()),
        run_id: Some(run_id.clone()),
        mode: "query".into(),
        code: "pass".into(),
        opts: Some(BTreeMap::new()),
        flush_timeout: Some(2.0),
    };
    let call = encode_args::<Execute>(&args);
    let t0 = Instant::now();
    let v = peer
        .call(Execute::NAME, &call, CALL_TIMEOUT)
        .await
        .map_err(|e| anyhow!("execute: {e}"))?;
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let a = decode_reply::<Execute>(v).map_err(|e| anyhow!("execute reply: {e}"))?;
    ensure!(
        a.status == "finished" && a.exit_code == Some(0) && a.run_id == run_id,
        "execute `pass` answered {} (exit code {:?}, run {})",
        a.status,
        a.exit_code,
        a.run_id
    );
    Ok(ms)
}

// ---------------------------------------------------------------------------------------------
// The baseline: the runner's own round trip.

/// A plain ZeroMQ client of a runner (blocking libzmq sockets, no agent in between): PUSH to
/// repl-in, PULL from repl-out, as upstream's `AbstractCodeRunner` connects.
struct PlainClient {
    push: zmq::Socket,
    pull: zmq::Socket,
    _ctx: zmq::Context,
}

impl PlainClient {
    fn connect(ports: RunnerPorts) -> anyhow::Result<PlainClient> {
        let ctx = zmq::Context::new();
        let timeout = CALL_TIMEOUT.as_millis() as i32;
        let push = ctx.socket(zmq::PUSH)?;
        push.set_linger(0)?;
        push.set_sndtimeo(timeout)?;
        push.connect(&format!("tcp://127.0.0.1:{}", ports.repl_in))?;
        let pull = ctx.socket(zmq::PULL)?;
        pull.set_linger(0)?;
        pull.set_rcvtimeo(timeout)?;
        pull.connect(&format!("tcp://127.0.0.1:{}", ports.repl_out))?;
        Ok(PlainClient {
            push,
            pull,
            _ctx: ctx,
        })
    }

    /// `[code, pass]`, then frames until `finished` (anything else read and dropped, as stdout
    /// would be); the round trip in ms. The exit code is checked off the clock.
    fn pass(&self) -> anyhow::Result<f64> {
        let frames = ToRunner::Code("pass".into()).frames();
        let t0 = Instant::now();
        self.push
            .send_multipart(frames.iter().map(Vec::as_slice), 0)
            .context("send `code` to the runner")?;
        let last = loop {
            let msg = self
                .pull
                .recv_multipart(0)
                .context("no `finished` from the runner")?;
            if msg.first().map(Vec::as_slice) == Some(b"finished".as_slice()) {
                break msg;
            }
        };
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let parts: Vec<&[u8]> = last.iter().map(Vec::as_slice).collect();
        match decode(&parts) {
            Ok(FromRunner::Finished(Step::Run, Some(0))) => Ok(ms),
            other => bail!("the runner answered `pass` with {other:?}"),
        }
    }
}

/// The 1-minute load average (`/proc/loadavg`; NaN when unreadable).
fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Waits (up to 10 s) until exactly `want` TCP connections to 127.0.0.1:`port` are
/// ESTABLISHED on this host (`/proc/net/tcp`: this network namespace, every process), else
/// fails naming `when`.
fn expect_connections(port: u16, want: usize, when: &str) -> anyhow::Result<()> {
    let peer = format!("0100007F:{port:04X}");
    let count = || {
        std::fs::read_to_string("/proc/net/tcp")
            .unwrap_or_default()
            .lines()
            .skip(1)
            .filter(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[2] == peer && f[3] == "01"
            })
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = count();
        if n == want {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("{when}: {n} connections to the runner's repl-out port {port}, not {want}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

//! `just bench cluster`: cluster sessions (issue 40) against sessions of one kernel, on one
//! manager process (the real `kernelvisor manager` binary, SQLite) with `KV_BENCH_AGENTS`
//! (default 16) agents simulated at the wire level (`benches/common/fleet.rs`, as `just bench
//! scheduler`'s: they answer `create_kernels`, `destroy_kernel` and, for single-node clusters,
//! `create_local_network` / `destroy_local_network` at once, without containers), each
//! reporting 16 cores. Every figure is compared with a baseline measured in the same run, on the
//! same fleet and manager (a ratio, never a time limit: this machine's load varies).
//!
//! 1. `multi_node_*`: a `multi-node` cluster session of `KV_BENCH_CLUSTER_SIZE` (16) kernels of
//!    1 core, one per agent (placement spreads them: each agent is the least loaded in turn),
//!    timed from its `POST /v1/sessions` (which answers once every agent answered its
//!    `create_kernels`) to a `GET /v1/sessions/{id}` that shows the session `RUNNING` with every
//!    kernel `RUNNING`; then deleted (the `DELETE` ends every kernel and removes the overlay).
//!    The manager makes the session's Docker Swarm overlay `bai-multinode-<id>` on the local
//!    engine and an RSA-2048 SSH keypair first: both are part of the time.
//! 2. `singles_*`, the baseline: as many sessions of one kernel of 1 core, `POST`ed at once from
//!    as many concurrent clients, timed from the first `POST` to a `GET /v1/sessions` that shows
//!    every one `RUNNING`; then deleted.
//! 3. `single_node_*`: a `single-node` cluster of the same size on one agent (its 16 cores), the
//!    bridge network asked of that agent (`create_local_network`, answered at once here).
//!
//!    1–3 run interleaved, `KV_BENCH_TRIALS` (20) times each, after one untimed warm-up of each;
//!    p50 / p99 over the trials, and each cluster's p50 / p99 over the baseline's.
//! 4. The queue: every agent reports 1 core and the fleet is filled with one session each; then
//!    `KV_BENCH_GANGS` (32) `multi-node` clusters of 4 kernels are queued, then (once those are
//!    done and deleted) 4 × as many sessions of one kernel. Each time every agent then reports
//!    enough cores for the whole queue in one heartbeat; `*_admissions_per_s`: the sessions queued
//!    over the time from that heartbeat to the last one's `admitted_at` (the manager's clock,
//!    the same host's), `*_running_s` until every one is `RUNNING` (polled). Clusters are
//!    admitted one by one (one transaction each), sessions of one kernel in one batch.
//! 5. `rsa2048_keygen_*`: an RSA-2048 key made `KV_BENCH_TRIALS` times in this process (the
//!    `rsa` crate, as the manager makes each cluster's keypair): how much of 1 and 3 that is.
//!
//! `[scheduler] admission-interval = KV_BENCH_ADMISSION_INTERVAL` (0.05 s: room that a
//! heartbeat makes is taken at the next round, and with a queue this small the wait for it
//! would otherwise be most of the time measured). Heartbeats every `KV_BENCH_HEARTBEAT_INTERVAL`
//! (2 s).
//!
//! The overlay needs the local Docker engine to be a Swarm manager: when `docker info` says
//! Swarm is `inactive`, the bench runs `docker swarm init --advertise-addr 127.0.0.1` and, at
//! the end, `docker swarm leave --force` (also when it fails, and on SIGINT / SIGTERM); an
//! engine already a Swarm manager is used as it is (and left so; overlays the bench's sessions
//! left behind are removed); an engine that is a Swarm worker is refused. Everything runs on one
//! machine: the simulated agents and the HTTP clients compete with the manager for the same
//! cores. Prints a table and ends with one JSON line.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use futures::StreamExt;
use serde_json::{json, Value};

use common::env_or;
use common::fleet::*;

/// Cores of every kernel.
const KERNEL_CPU: u64 = 1;

/// Kernels of each queued cluster session (phase 4).
const QUEUED_GANG_SIZE: usize = 4;

/// Longest one session (or one batch) may take to be `RUNNING`.
const RUNNING_LIMIT: Duration = Duration::from_secs(60);

struct Knobs {
    agents: usize,
    size: usize,
    trials: usize,
    gangs: usize,
    interval: Duration,
    admission_interval: f64,
}

/// p50 and p99 of a series, in its unit.
#[derive(Clone, Copy, Default)]
struct Pct {
    p50: f64,
    p99: f64,
}

impl Pct {
    fn of(mut v: Vec<f64>) -> Pct {
        v.sort_by(f64::total_cmp);
        Pct {
            p50: percentile(&v, 0.5),
            p99: percentile(&v, 0.99),
        }
    }
}

/// One kind of queued session's admission (phase 4).
#[derive(Clone, Copy, Default)]
struct Admission {
    /// Sessions queued (and admitted).
    sessions: usize,
    /// Kernels they hold.
    kernels: usize,
    /// From the heartbeat that made room to the first / last `admitted_at`, seconds.
    first_s: f64,
    last_s: f64,
    /// From that heartbeat until every one was seen `RUNNING`, seconds.
    running_s: f64,
}

impl Admission {
    fn per_s(&self) -> f64 {
        self.sessions as f64 / self.last_s
    }

    fn kernels_per_s(&self) -> f64 {
        self.kernels as f64 / self.last_s
    }
}

#[derive(Default)]
struct Results {
    multi: Pct,
    singles: Pct,
    single_node: Pct,
    keygen: Pct,
    queue_gangs: Admission,
    queue_singles: Admission,
    total_s: f64,
}

// ---------------------------------------------------------------------------------------------
// The Swarm the overlays need.

/// Whether this run made the local engine a Swarm manager (and so must leave the Swarm).
static SWARM_OURS: AtomicBool = AtomicBool::new(false);

/// Overlays of this run's sessions, removed at the end when the Swarm was not this run's
/// (leaving a Swarm removes its overlays).
static OVERLAYS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// The local engine as a Swarm manager for the run; dropping it undoes what [`Swarm::ensure`]
/// did.
struct Swarm;

impl Swarm {
    /// Makes sure the local engine is a Swarm manager: used as it is when it already is one,
    /// `docker swarm init --advertise-addr 127.0.0.1` when Swarm is inactive (left again when
    /// dropped, or on SIGINT / SIGTERM).
    ///
    /// Errors: `docker info` failed, the engine is a Swarm worker (a multi-node session's
    /// overlay can only be made on a manager), or the Swarm is in another state.
    fn ensure() -> anyhow::Result<Swarm> {
        let out = std::process::Command::new("docker")
            .args([
                "info",
                "--format",
                "{{.Swarm.LocalNodeState}} {{.Swarm.ControlAvailable}}",
            ])
            .output()
            .context("docker info (is the Docker engine running?)")?;
        if !out.status.success() {
            bail!(
                "docker info failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        match text.split_once(' ').unwrap_or((&text, "")) {
            ("active", "true") => {
                eprintln!("[swarm] the local engine is already a Swarm manager: used as it is");
                Ok(Swarm)
            }
            ("active", _) => bail!(
                "the local Docker engine is a Swarm worker: a multi-node session's overlay can \
                 only be made on a Swarm manager's engine. Run the bench where the engine is a \
                 manager, or with Swarm inactive (the bench then makes it a manager for the run)"
            ),
            ("inactive", _) => {
                // Marked first: a signal from here on leaves the Swarm whatever init did.
                SWARM_OURS.store(true, Ordering::SeqCst);
                let out = std::process::Command::new("docker")
                    .args(["swarm", "init", "--advertise-addr", "127.0.0.1"])
                    .output()
                    .context("docker swarm init")?;
                if !out.status.success() {
                    SWARM_OURS.store(false, Ordering::SeqCst);
                    bail!(
                        "docker swarm init --advertise-addr 127.0.0.1 failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
                eprintln!("[swarm] `docker swarm init --advertise-addr 127.0.0.1`: the local engine is a Swarm manager until the bench ends");
                Ok(Swarm)
            }
            (state, _) => bail!(
                "the local engine's Swarm is `{state}`: expected `inactive` (the bench makes it a \
                 manager for the run) or `active` as a manager"
            ),
        }
    }
}

/// Undoes [`Swarm::ensure`] once: `docker swarm leave --force` when this run made the Swarm,
/// else the overlays this run's sessions may have left.
fn swarm_cleanup() {
    if SWARM_OURS.swap(false, Ordering::SeqCst) {
        let ok = std::process::Command::new("docker")
            .args(["swarm", "leave", "--force"])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        match ok {
            true => eprintln!("[swarm] `docker swarm leave --force`: Swarm inactive again"),
            false => eprintln!(
                "[swarm] `docker swarm leave --force` failed: run it by hand to undo the bench's `docker swarm init`"
            ),
        }
        return;
    }
    let names = std::mem::take(&mut *OVERLAYS.lock().unwrap_or_else(|p| p.into_inner()));
    for name in names {
        // Already gone (the session's DELETE removed it) is the normal case.
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &name])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

impl Drop for Swarm {
    fn drop(&mut self) {
        swarm_cleanup();
    }
}

/// On SIGINT / SIGTERM: [`swarm_cleanup`], then exit 130 (the manager and the simulated
/// agents die with this process).
fn cleanup_on_signal() -> anyhow::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])?;
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            eprintln!("cluster bench: signal {sig}; cleaning up");
            swarm_cleanup();
            std::process::exit(130);
        }
    });
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Sessions.

/// `POST /v1/sessions` of kernels of [`KERNEL_CPU`] core and 64 MiB, `size` of them in `mode`
/// when `size` > 1, placed now or refused (`enqueue` as given): the answer.
fn post(http: &Http, size: usize, mode: &str, enqueue: bool) -> Result<Value, String> {
    let mut body = json!({
        "image": "bench/any:latest",
        "resource_slots": {"cpu": KERNEL_CPU, "mem": "64m"},
        "enqueue": enqueue,
    });
    if size > 1 {
        body["cluster_size"] = json!(size);
        body["cluster_mode"] = json!(mode);
    }
    let text = Http::text(http.request("POST", "/v1/sessions").send_json(body))?;
    serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))
}

fn session_id(v: &Value) -> Result<String, String> {
    v["session_id"]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("no session_id in {v}"))
}

/// Whether a session as the API shows it is `RUNNING` with all of its `size` kernels
/// `RUNNING`.
fn all_running(s: &Value, size: usize) -> bool {
    let kernels = s["kernels"].as_array().map_or(&[][..], Vec::as_slice);
    s["status"] == "RUNNING"
        && kernels.len() == size
        && kernels.iter().all(|k| k["status"] == "RUNNING")
}

/// One cluster session of `size` kernels in `mode`: milliseconds from its `POST` to a `GET`
/// showing it and every kernel `RUNNING`, and the number of agents its kernels are on. The
/// session is deleted afterwards (not timed).
async fn cluster_trial(
    http: &Http,
    size: usize,
    mode: &'static str,
) -> anyhow::Result<(f64, usize)> {
    let h = http.clone();
    let t = Instant::now();
    let created = blocking(move || post(&h, size, mode, false))
        .await
        .map_err(|e| anyhow!("POST /v1/sessions ({mode}, {size} kernels): {e}"))?;
    let sid = session_id(&created).map_err(|e| anyhow!(e))?;
    if mode == "multi-node" {
        OVERLAYS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(format!("bai-multinode-{sid}"));
    }
    let mut agents = 0;
    let mut seen = None;
    while t.elapsed() < RUNNING_LIMIT {
        let (h, path) = (http.clone(), format!("/v1/sessions/{sid}"));
        let s = blocking(move || h.get_json(&path))
            .await
            .map_err(|e| anyhow!("GET /v1/sessions/{sid}: {e}"))?;
        if all_running(&s, size) {
            seen = Some(t.elapsed());
            let mut ids: Vec<&str> = s["kernels"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|k| k["agent_id"].as_str())
                .collect();
            ids.sort_unstable();
            ids.dedup();
            agents = ids.len();
            break;
        }
        if ["TERMINATING", "TERMINATED", "CANCELLED", "ERROR"]
            .iter()
            .any(|e| s["status"] == *e)
        {
            bail!(
                "{mode} session {sid} is {} ({})",
                s["status"],
                s["status_reason"]
            );
        }
        actix_rt::time::sleep(Duration::from_millis(5)).await;
    }
    let h = http.clone();
    let s2 = sid.clone();
    blocking(move || h.delete_session(&s2))
        .await
        .map_err(|e| anyhow!("DELETE /v1/sessions/{sid}: {e}"))?;
    let seen =
        seen.ok_or_else(|| anyhow!("{mode} session {sid} not RUNNING after {RUNNING_LIMIT:?}"))?;
    Ok((seen.as_secs_f64() * 1e3, agents))
}

/// `n` sessions of one kernel `POST`ed at once from `n` clients: milliseconds from the first
/// `POST` to a `GET /v1/sessions` showing every one `RUNNING`; then deleted (not timed).
async fn singles_trial(http: &Http, n: usize) -> anyhow::Result<f64> {
    let t = Instant::now();
    let answers: Vec<Result<Value, String>> = futures::future::join_all((0..n).map(|_| {
        let h = http.clone();
        blocking(move || post(&h, 1, "single-node", false))
    }))
    .await;
    let mut ids = Vec::with_capacity(n);
    let mut errors = Vec::new();
    for a in answers {
        match a.and_then(|v| session_id(&v)) {
            Ok(id) => ids.push(id),
            Err(e) => errors.push(e),
        }
    }
    let seen = match errors.first() {
        Some(e) => Err(anyhow!(
            "{} of {n} POST /v1/sessions failed, e.g. {e}",
            errors.len()
        )),
        None => wait_running(http, &ids, t, RUNNING_LIMIT).await,
    };
    delete_many(http, ids, n).await?;
    Ok(seen?.as_secs_f64() * 1e3)
}

/// Polls `GET /v1/sessions` until every one of `ids` is `RUNNING` (every kernel): the time from
/// `since` then. Fails past `limit`, or when one ended.
async fn wait_running(
    http: &Http,
    ids: &[String],
    since: Instant,
    limit: Duration,
) -> anyhow::Result<Duration> {
    loop {
        let h = http.clone();
        let list = blocking(move || h.get_json("/v1/sessions"))
            .await
            .map_err(|e| anyhow!("GET /v1/sessions: {e}"))?;
        let sessions = list["sessions"].as_array().map_or(&[][..], Vec::as_slice);
        let running = ids
            .iter()
            .filter(|id| {
                sessions.iter().any(|s| {
                    s["session_id"] == id.as_str()
                        && s["status"] == "RUNNING"
                        && s["kernels"]
                            .as_array()
                            .is_none_or(|ks| ks.iter().all(|k| k["status"] == "RUNNING"))
                })
            })
            .count();
        if running == ids.len() {
            return Ok(since.elapsed());
        }
        let gone = ids
            .iter()
            .filter(|id| !sessions.iter().any(|s| s["session_id"] == id.as_str()))
            .count();
        if gone > 0 {
            bail!("{gone} of the {} sessions ended before RUNNING", ids.len());
        }
        if since.elapsed() > limit {
            bail!(
                "{running} of {} sessions RUNNING after {limit:?}",
                ids.len()
            );
        }
        actix_rt::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `count` sessions (`size` kernels each, `multi-node` when more than one) `POST`ed from 16
/// clients, each to be answered `status`: their ids.
async fn create_all(
    http: &Http,
    count: usize,
    size: usize,
    status: &str,
) -> anyhow::Result<Vec<String>> {
    let answers: Vec<Result<Value, String>> = futures::stream::iter(0..count)
        .map(|_| {
            let h = http.clone();
            blocking(move || post(&h, size, "multi-node", true))
        })
        .buffer_unordered(16)
        .collect()
        .await;
    let mut ids = Vec::with_capacity(count);
    for a in answers {
        let v = a.map_err(|e| anyhow!("POST /v1/sessions: {e}"))?;
        if v["status"] != status {
            bail!(
                "a session of {size} was answered {} where {status} was expected: {v}",
                v["status"]
            );
        }
        let id = session_id(&v).map_err(|e| anyhow!(e))?;
        if size > 1 {
            OVERLAYS
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(format!("bai-multinode-{id}"));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// Every simulated agent reports `cpu` cores from a heartbeat sent now (burst `generation`,
/// which must be new); returns once the manager shows every agent with that many.
async fn set_agent_cpu(
    world: &mut World,
    http: &Http,
    n: usize,
    cpu: u64,
    generation: u32,
) -> anyhow::Result<f64> {
    let hosts = world
        .hosts
        .as_mut()
        .ok_or_else(|| anyhow!("no simulated agents"))?;
    hosts.set_cpu(cpu);
    let at = now_unix();
    hosts.set(Mode::Burst(generation));
    wait_for(
        Duration::from_secs(30),
        &format!("{n} agents of {cpu} cores"),
        || {
            let h = http.clone();
            async move {
                let v = blocking(move || h.get_json("/v1/agents"))
                    .await
                    .map_err(|e| anyhow!(e))?;
                let with = v["agents"].as_array().map_or(0, |a| {
                    a.iter()
                        .filter(|x| {
                            x["slots_total"]["cpu"]
                                .as_str()
                                .and_then(|c| c.parse::<f64>().ok())
                                == Some(cpu as f64)
                        })
                        .count()
                });
                Ok(with == n)
            }
        },
    )
    .await?;
    Ok(at)
}

/// Phase 4 for one kind: `count` sessions of `size` kernels queued on a full fleet, then room
/// for them all from one heartbeat; timed until every one is admitted and `RUNNING`, then
/// deleted, and the fleet back to 1 core per agent.
async fn queue_admission(
    http: &Http,
    world: &mut World,
    k: &Knobs,
    count: usize,
    size: usize,
    generation: &mut u32,
) -> anyhow::Result<Admission> {
    let what = match size {
        1 => "sessions of one kernel".to_owned(),
        _ => format!("multi-node clusters of {size}"),
    };
    let ids = create_all(http, count, size, "PENDING").await?;
    // Room for the whole queue on top of the one core each agent's filler holds.
    let kernels = count * size;
    let cpu = 1 + kernels.div_ceil(k.agents) as u64;
    *generation += 1;
    let hosts = world
        .hosts
        .as_mut()
        .ok_or_else(|| anyhow!("no simulated agents"))?;
    hosts.set_cpu(cpu);
    let t = Instant::now();
    let room_at = now_unix();
    hosts.set(Mode::Burst(*generation));
    let running = wait_running(http, &ids, t, Duration::from_secs(120))
        .await
        .with_context(|| format!("{count} queued {what}"))?;
    let h = http.clone();
    let list = blocking(move || h.get_json("/v1/sessions"))
        .await
        .map_err(|e| anyhow!("GET /v1/sessions: {e}"))?;
    let admitted: Vec<f64> = list["sessions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| ids.iter().any(|id| s["session_id"] == id.as_str()))
        .filter_map(|s| s["admitted_at"].as_f64())
        .collect();
    if admitted.len() != count {
        bail!(
            "{} of {count} queued {what} show an admitted_at",
            admitted.len()
        );
    }
    let first = admitted.iter().copied().fold(f64::MAX, f64::min);
    let last = admitted.iter().copied().fold(f64::MIN, f64::max);
    let a = Admission {
        sessions: count,
        kernels,
        first_s: first - room_at,
        last_s: last - room_at,
        running_s: running.as_secs_f64(),
    };
    eprintln!(
        "[queue] {count} {what}: admitted {:.3}–{:.3} s after the room appeared ({:.0} sessions/s, {:.0} kernels/s), all RUNNING after {:.2} s",
        a.first_s,
        a.last_s,
        a.per_s(),
        a.kernels_per_s(),
        a.running_s
    );
    delete_many(http, ids, 16).await?;
    *generation += 1;
    set_agent_cpu(world, http, k.agents, 1, *generation).await?;
    Ok(a)
}

async fn measure(
    mgr: &ManagerProc,
    http: &Http,
    world: &mut World,
    dir: &std::path::Path,
    k: &Knobs,
) -> anyhow::Result<Results> {
    let t0 = Instant::now();
    let n = k.agents;
    let started = start_fleet(mgr, http, world, dir, (n, 0), k.interval, 16).await?;
    let http = &started.http;

    // 1–3, interleaved (a load change on this machine hits every kind alike), after a warm-up.
    let (mut multi, mut singles, mut single_node) = (Vec::new(), Vec::new(), Vec::new());
    for trial in 0..=k.trials {
        let (ms, agents) = cluster_trial(http, k.size, "multi-node").await?;
        if agents != k.size.min(n) {
            bail!(
                "a multi-node cluster of {} went to {agents} agents (expected one each)",
                k.size
            );
        }
        let s = singles_trial(http, k.size).await?;
        let (sn, agents) = cluster_trial(http, k.size, "single-node").await?;
        if agents != 1 {
            bail!("a single-node cluster went to {agents} agents");
        }
        if trial == 0 {
            eprintln!("[warm-up] multi-node {ms:.1} ms, singles {s:.1} ms, single-node {sn:.1} ms (not counted)");
            continue;
        }
        multi.push(ms);
        singles.push(s);
        single_node.push(sn);
        if trial % 5 == 0 {
            eprintln!("  trial {trial}/{}: multi-node {ms:.1} ms, singles {s:.1} ms, single-node {sn:.1} ms", k.trials);
        }
    }
    let mut r = Results {
        multi: Pct::of(multi),
        singles: Pct::of(singles),
        single_node: Pct::of(single_node),
        ..Results::default()
    };

    // 4. The queue: a full fleet of 1 core per agent, then gangs, then singles.
    let mut generation = 0;
    generation += 1;
    set_agent_cpu(world, http, n, 1, generation).await?;
    let fillers = create_all(http, n, 1, "RUNNING")
        .await
        .context("filling the fleet")?;
    r.queue_gangs =
        queue_admission(http, world, k, k.gangs, QUEUED_GANG_SIZE, &mut generation).await?;
    r.queue_singles = queue_admission(
        http,
        world,
        k,
        k.gangs * QUEUED_GANG_SIZE,
        1,
        &mut generation,
    )
    .await?;
    delete_many(http, fillers, 16).await?;

    // 5. What an RSA-2048 keypair costs here.
    let keygen: Vec<f64> = (0..k.trials.max(1))
        .map(|_| {
            let t = Instant::now();
            let _key =
                rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 2048).expect("an RSA-2048 key");
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    r.keygen = Pct::of(keygen);
    r.total_s = t0.elapsed().as_secs_f64();
    Ok(r)
}

async fn run(bin: &str, k: &Knobs) -> anyhow::Result<Results> {
    let dir = tempfile::Builder::new()
        .prefix("kv-bench-cluster-")
        .tempdir()?;
    let extra = format!(
        "[scheduler]\nadmission-interval = {}\n",
        k.admission_interval
    );
    let mgr = ManagerProc::spawn_with(bin, dir.path(), k.interval, None, &extra)?;
    let http = Http::new(&mgr.api);
    let mut world = World::default();
    let result = measure(&mgr, &http, &mut world, dir.path(), k).await;
    end_phase(mgr, world, result).await
}

fn ratio(a: f64, b: f64) -> f64 {
    a / b
}

fn main() {
    fleet_bench_start();
    let k = Knobs {
        agents: env_or("KV_BENCH_AGENTS", 16),
        size: env_or("KV_BENCH_CLUSTER_SIZE", 16),
        trials: env_or("KV_BENCH_TRIALS", 20),
        gangs: env_or("KV_BENCH_GANGS", 32),
        interval: Duration::from_secs_f64(env_or("KV_BENCH_HEARTBEAT_INTERVAL", 2.0)),
        admission_interval: env_or("KV_BENCH_ADMISSION_INTERVAL", 0.05),
    };
    if !(2..=16).contains(&k.size) || k.size > k.agents || k.trials == 0 || k.gangs == 0 {
        eprintln!(
            "cluster bench: KV_BENCH_CLUSTER_SIZE must be 2–16 and at most KV_BENCH_AGENTS (one kernel per agent; a single-node cluster takes an agent's 16 cores), KV_BENCH_TRIALS and KV_BENCH_GANGS at least 1"
        );
        std::process::exit(2);
    }
    if let Err(e) = cleanup_on_signal() {
        eprintln!("cluster bench: cannot catch SIGINT / SIGTERM: {e}");
        std::process::exit(1);
    }
    let swarm = match Swarm::ensure() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cluster bench: {e:#}");
            std::process::exit(1);
        }
    };
    let bin = env!("CARGO_BIN_EXE_kernelvisor");
    let result = actix_rt::System::new().block_on(run(bin, &k));
    drop(swarm);
    let r = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cluster bench failed: {e:#}");
            std::process::exit(1);
        }
    };

    println!(
        "\nkernelvisor cluster bench: one manager process, {} simulated agents (wire level, no CURVE) of 16 cores; kernels of {KERNEL_CPU} core; {} trials each, interleaved; {} cores on this machine, {:.0} s",
        k.agents,
        k.trials,
        std::thread::available_parallelism().map(usize::from).unwrap_or(0),
        r.total_s
    );
    println!(
        "POST /v1/sessions → every kernel RUNNING (ms); ratio: over the baseline ({} sessions of one kernel from {} concurrent clients)\n",
        k.size, k.size
    );
    println!(
        "{:<34} {:>9} {:>9} {:>10} {:>10}",
        "kind", "p50 ms", "p99 ms", "p50 ratio", "p99 ratio"
    );
    let rows = [
        (format!("multi-node cluster of {}", k.size), r.multi),
        (format!("single-node cluster of {}", k.size), r.single_node),
        (format!("{} sessions of 1 (baseline)", k.size), r.singles),
    ];
    for (name, p) in &rows {
        println!(
            "{name:<34} {:>9.1} {:>9.1} {:>10.2} {:>10.2}",
            p.p50,
            p.p99,
            ratio(p.p50, r.singles.p50),
            ratio(p.p99, r.singles.p99)
        );
    }
    println!(
        "{:<34} {:>9.1} {:>9.1}",
        "RSA-2048 keygen (this process)", r.keygen.p50, r.keygen.p99
    );
    println!(
        "\nqueue (fleet full, then room for the whole queue in one heartbeat; admission-interval {} s):",
        k.admission_interval
    );
    println!(
        "{:<34} {:>8} {:>8} {:>10} {:>10} {:>12} {:>11}",
        "queued", "sessions", "kernels", "first s", "last s", "admitted/s", "RUNNING s"
    );
    for (name, a) in [
        (
            format!("multi-node clusters of {QUEUED_GANG_SIZE}"),
            r.queue_gangs,
        ),
        ("sessions of 1".to_owned(), r.queue_singles),
    ] {
        println!(
            "{name:<34} {:>8} {:>8} {:>10.3} {:>10.3} {:>12.0} {:>11.2}",
            a.sessions,
            a.kernels,
            a.first_s,
            a.last_s,
            a.per_s(),
            a.running_s
        );
    }
    println!(
        "kernels admitted/s, clusters over singles: {:.2}; sessions admitted/s: {:.2}",
        ratio(
            r.queue_gangs.kernels_per_s(),
            r.queue_singles.kernels_per_s()
        ),
        ratio(r.queue_gangs.per_s(), r.queue_singles.per_s())
    );
    println!("first s / last s: from the heartbeat that made the room to the first / last admitted_at; admitted/s: sessions over last s");
    println!(
        "{}",
        json!({
            "agents": k.agents,
            "cluster_size": k.size,
            "trials": k.trials,
            "multi_node_p50_ms": round1(r.multi.p50),
            "multi_node_p99_ms": round1(r.multi.p99),
            "single_node_p50_ms": round1(r.single_node.p50),
            "single_node_p99_ms": round1(r.single_node.p99),
            "singles_p50_ms": round1(r.singles.p50),
            "singles_p99_ms": round1(r.singles.p99),
            "multi_node_vs_singles_p50": round2(ratio(r.multi.p50, r.singles.p50)),
            "multi_node_vs_singles_p99": round2(ratio(r.multi.p99, r.singles.p99)),
            "single_node_vs_singles_p50": round2(ratio(r.single_node.p50, r.singles.p50)),
            "single_node_vs_singles_p99": round2(ratio(r.single_node.p99, r.singles.p99)),
            "rsa2048_keygen_p50_ms": round1(r.keygen.p50),
            "rsa2048_keygen_p99_ms": round1(r.keygen.p99),
            "queued_clusters": r.queue_gangs.sessions,
            "queued_cluster_size": QUEUED_GANG_SIZE,
            "queued_singles": r.queue_singles.sessions,
            "cluster_admissions_per_s": round1(r.queue_gangs.per_s()),
            "cluster_kernel_admissions_per_s": round1(r.queue_gangs.kernels_per_s()),
            "single_admissions_per_s": round1(r.queue_singles.per_s()),
            "cluster_vs_single_kernel_admissions": round2(ratio(r.queue_gangs.kernels_per_s(), r.queue_singles.kernels_per_s())),
            "cluster_queue_running_s": round2(r.queue_gangs.running_s),
            "single_queue_running_s": round2(r.queue_singles.running_s),
        })
    );
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

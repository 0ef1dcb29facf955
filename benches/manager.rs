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
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

use common::env_or;
use common::fleet::*;

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
    let result = end_phase(mgr, world, result).await;
    drop(dir);
    result
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
    let started = start_fleet(mgr, http, world, dir, (n, real_max), interval, AGENT_CPU).await?;
    let http = &started.http;
    let (real, alive_s, warm_s) = (started.real, started.alive_s, started.warm_s);

    // The fleet's real rate: creates, then the heartbeats applied per second.
    let (lat, errors) = timed_creates(http, sessions, 0.1, n, "at the real heartbeat rate").await?;
    let (hb_real_per_s, _, _) = {
        let w: &World = world;
        heartbeat_rate(http, mgr, || w.sent(), window.max(interval)).await?
    };

    // Sweeps: with the bench's heartbeats paused, after one full interval, the next 3 sweeps.
    let sweep_every = Duration::from_secs_f64(env_or("KV_BENCH_SWEEP_INTERVAL", 10.0));
    world.set(Mode::Paused);
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
    world.set(Mode::Fast);
    actix_rt::time::sleep(Duration::from_secs(1)).await;
    let (hb_per_s, mgr_cpu_pct, hb_sent_per_s) = {
        let w: &World = world;
        heartbeat_rate(http, mgr, || w.sent(), window).await?
    };
    // Fewer: under the flood each create queues behind heartbeats for the one thread.
    let (flood, flood_errors) =
        timed_creates(http, sessions.min(10), 0.1, n, "under the flood").await?;
    world.set(Mode::Paced);
    let rss_mb = mgr.rss_mb()?;
    let hb_failed = world.failed();

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
    fleet_bench_start();
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
    let rows = run_phases("manager", counts, |n| {
        run_phase(bin, n, real_max, sessions, window, interval)
    });

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

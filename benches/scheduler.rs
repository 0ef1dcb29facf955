//! `just bench scheduler`: the session queue (issue 27) at fleet scale. One manager process (the
//! real `kernelvisor manager` binary, SQLite; PostgreSQL too when `KV_BENCH_POSTGRES_URL` is
//! set, a fresh database on that server) with `KV_BENCH_AGENTS` (default 10,000) agents
//! simulated at the wire level (`benches/common/fleet.rs`, as `just bench manager`'s), each
//! reporting 1 core at first:
//!
//! 1. `fill_per_s`: the fleet filled with one 1-core session per agent, `POST /v1/sessions`
//!    from `KV_BENCH_CLIENTS` (16) concurrent clients (direct creates: placed at once).
//! 2. `enqueue_per_s`, `enqueue_p50_ms` / `enqueue_p99_ms`: `KV_BENCH_QUEUED` (default
//!    100,000) more sessions the same way, through the API, each answered 201 `PENDING`;
//!    `rss_queued_mb`: the manager's VmRSS then.
//! 3. `create_p50_ms` / `create_p99_ms` with the queue present at the real heartbeat rate
//!    (every agent every `KV_BENCH_HEARTBEAT_INTERVAL`, 20 s), then `create_flood_*` under the
//!    heartbeat flood (every agent resends as soon as answered): `KV_BENCH_SESSIONS` (200)
//!    sequential creates each (they queue, since sessions wait; then cancelled). Goal: p99 ≤
//!    100 ms under the flood.
//! 4. `admissions_per_s`: every agent reports `KV_BENCH_AGENT_CPU` (4) cores in one heartbeat
//!    at once (room for agents × (cores − 1) queued sessions appears); from then until every one
//!    of them is admitted (`kernelvisor_manager_admissions_total`) and created
//!    (`…_sessions_created_total`: the agent answered, `RUNNING`). Goal ≥ 1,000/s.
//! 5. `free_to_running_p50_ms` / `…_p99_ms`: with the fleet full and sessions queued,
//!    `KV_BENCH_TRIALS` (30) times one running session is deleted; the time from its
//!    `TERMINATED` event (its room freed) to the next `RUNNING` event (the admitted head), both
//!    by the manager's clock (`time` of `GET /v1/events`). Goal p50 ≤ 1 s.
//! 6. `rss_mb`: VmRSS at the end (the rest still queued).
//! 7. `preempt_to_running_p50_ms` / `…_p99_ms` (issue 41): every session above is preemptible
//!    (priority 10, `restart_policy` `on-failure`) and `[scheduler] preemption = true` in every
//!    phase (so `admissions_per_s` is measured with it on); with the fleet full,
//!    `KV_BENCH_PREEMPT_TRIALS` (20) times a 1-core priority-50 session is submitted: from just
//!    before its `POST` to its `RUNNING` event (the manager's clock), through one victim's
//!    eviction (`PREEMPTED`, `destroy_kernel`, requeued) with no grace. Goal p50 ≤ 1 s.
//!    `KV_BENCH_PREEMPTION=0` runs every phase with preemption off and skips this one (to
//!    compare admissions/s with it on and off).
//!
//! `[scheduler] admission-interval = KV_BENCH_ADMISSION_INTERVAL` (0.25 s; rounds also start when
//! a kernel ends or a session is queued). `[agent-pool]` is the manager's default (each agent
//! pinged every 30 s, a sweep's pings spread over 15 s); `KV_BENCH_UNPACED_SWEEP=1` pings the
//! whole fleet at once every 10 s instead, as `just bench manager` does to time a sweep. Everything runs on one machine: the simulated agents
//! and the HTTP clients compete with the manager for the same cores. Prints a table and ends
//! with one JSON line: `[{"store", "agents", "queued", …}, …]`.

mod common;

use std::io::BufRead;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use futures::StreamExt;

use common::env_or;
use common::fleet::*;

/// Cores of one session.
const SESSION_CPU: f64 = 1.0;

struct Knobs {
    agents: usize,
    queued: usize,
    cpu_after: u64,
    clients: usize,
    sessions: usize,
    trials: usize,
    window: Duration,
    interval: Duration,
    admission_interval: f64,
    preempt_trials: usize,
    preemption: bool,
}

#[derive(Default)]
struct Row {
    store: String,
    agents: usize,
    queued: usize,
    fill_per_s: f64,
    enqueue_per_s: f64,
    enqueue_p50: f64,
    enqueue_p99: f64,
    enqueue_not_pending: usize,
    rss_queued_mb: f64,
    create_p50: f64,
    create_p99: f64,
    flood_p50: f64,
    flood_p99: f64,
    hb_flood_per_s: f64,
    room: usize,
    admitted: usize,
    admit_s: f64,
    first_admit_s: f64,
    admissions_per_s: f64,
    created_per_s: f64,
    free_p50: f64,
    free_p99: f64,
    free_trials: usize,
    free_failed: usize,
    rss_mb: f64,
    queue_left: f64,
    total_s: f64,
    preempt_p50: f64,
    preempt_p99: f64,
    preempt_trials: usize,
    preempt_failed: usize,
    preemptions: f64,
}

/// `count` `POST /v1/sessions` of one core from `clients` concurrent clients: the answers in
/// completion order, the errors, and the seconds it took. Prints progress every 10 %.
async fn create_many(
    http: &Http,
    count: usize,
    clients: usize,
    what: &str,
) -> (Vec<Created>, Vec<String>, f64) {
    let t = Instant::now();
    let step = (count / 10).max(1);
    let mut out = Vec::with_capacity(count);
    let mut errors = Vec::new();
    let mut results = futures::stream::iter(0..count)
        .map(|_| {
            let h = http.clone();
            // Preemptible and requeued when preempted (phase 7's victims).
            blocking(move || h.create_session_with(SESSION_CPU, low_priority()))
        })
        .buffer_unordered(clients);
    let mut done = 0;
    while let Some(r) = results.next().await {
        match r {
            Ok(c) => out.push(c),
            Err(e) => errors.push(e),
        }
        done += 1;
        if done % step == 0 {
            eprintln!(
                "  {what}: {done}/{count} in {:.1} s",
                t.elapsed().as_secs_f64()
            );
        }
    }
    (out, errors, t.elapsed().as_secs_f64())
}

/// The fill's and the queue's sessions: priority 10 (the default), preemptible, requeued when
/// preempted (`restart_policy` `on-failure`).
fn low_priority() -> serde_json::Value {
    serde_json::json!({"preemptible": true, "restart_policy": {"mode": "on-failure", "max_restarts": 100}})
}

/// Seconds since the Unix epoch (the manager's events' clock, on this machine).
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// Submits a 1-core priority-50 session to a fleet full of priority-10 preemptible ones and
/// measures, by this machine's clock against the manager's event time, from just before the
/// `POST` to its `RUNNING` event (through a victim's eviction, with no grace): milliseconds,
/// or `None` past `limit`.
async fn preempt_to_running(
    http: &Http,
    events: &mut mpsc::Receiver<StatusEvent>,
    limit: Duration,
) -> anyhow::Result<Option<f64>> {
    while events.try_recv().is_ok() {}
    let h = http.clone();
    let submitted = unix_now();
    let created =
        blocking(move || h.create_session_with(SESSION_CPU, serde_json::json!({"priority": 50})))
            .await
            .map_err(|e| anyhow!("POST /v1/sessions (priority 50): {e}"))?;
    if created.status == "RUNNING" {
        bail!("the priority-50 session found room without an eviction: the fleet is not full");
    }
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match events.try_recv() {
            Ok((time, session, status)) if session == created.id && status == "RUNNING" => {
                return Ok(Some((time - submitted) * 1e3));
            }
            Ok(_) => {}
            Err(mpsc::TryRecvError::Empty) => {
                actix_rt::time::sleep(Duration::from_millis(5)).await;
            }
            Err(mpsc::TryRecvError::Disconnected) => bail!("the event stream ended"),
        }
    }
    Ok(None)
}

/// A session status change off `GET /v1/events`: (manager's time, session id, status).
type StatusEvent = (f64, String, String);

/// Follows `GET /v1/events` (session statuses only, from now) on a thread of its own.
fn follow_statuses(http: &Http) -> anyhow::Result<mpsc::Receiver<StatusEvent>> {
    let reader = http
        .stream("/v1/events?follow=true&history=false&type=session_status")
        .map_err(|e| anyhow!("GET /v1/events: {e}"))?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in reader.lines().map_while(Result::ok) {
            let Some(data) = line.strip_prefix("data:") else {
                continue;
            };
            let Ok(v) = serde_json::from_str::<serde_json::Value>(data.trim()) else {
                continue;
            };
            let field = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
            let event = (
                v["time"].as_f64().unwrap_or_default(),
                field("session_id"),
                field("status"),
            );
            if tx.send(event).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// Deletes `victim` and measures, by the manager's clock, from its `TERMINATED` event to the
/// next session's `RUNNING` event: milliseconds, or `None` past `limit`.
async fn free_to_running(
    http: &Http,
    events: &mut mpsc::Receiver<StatusEvent>,
    victim: String,
    limit: Duration,
) -> anyhow::Result<Option<f64>> {
    // Whatever came before belongs to earlier work.
    while events.try_recv().is_ok() {}
    let h = http.clone();
    let v = victim.clone();
    blocking(move || h.delete_session(&v))
        .await
        .map_err(|e| anyhow!("DELETE /v1/sessions/{victim}: {e}"))?;
    let deadline = Instant::now() + limit;
    let mut freed = None;
    while Instant::now() < deadline {
        match events.try_recv() {
            Ok((time, session, status)) => match (&freed, status.as_str()) {
                (None, "TERMINATED") if session == victim => freed = Some(time),
                (Some(at), "RUNNING") if session != victim => {
                    return Ok(Some((time - at) * 1e3));
                }
                _ => {}
            },
            Err(mpsc::TryRecvError::Empty) => {
                actix_rt::time::sleep(Duration::from_millis(5)).await;
            }
            Err(mpsc::TryRecvError::Disconnected) => bail!("the event stream ended"),
        }
    }
    Ok(None)
}

/// Sum of a metric's samples (every label set), `0` when absent.
async fn metric_sum(http: &Http, name: &str) -> anyhow::Result<f64> {
    Ok(metrics(http)
        .await?
        .iter()
        .filter(|(k, _)| *k == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| v)
        .sum())
}

async fn measure(
    mgr: &mut ManagerProc,
    http: &Http,
    world: &mut World,
    dir: &Path,
    store: &str,
    k: &Knobs,
) -> anyhow::Result<Row> {
    let t0 = Instant::now();
    let n = k.agents;
    let mut row = Row {
        store: store.to_owned(),
        agents: n,
        queued: k.queued,
        ..Row::default()
    };
    let started = start_fleet(mgr, http, world, dir, (n, 0), k.interval, 1).await?;
    let http = &started.http;

    // 1. Fill: one session per agent, placed at once.
    let (running, errors, secs) = create_many(http, n, k.clients, "fill").await;
    if let Some(e) = errors.first() {
        bail!(
            "{} of {n} creates to fill the fleet failed, e.g. {e}",
            errors.len()
        );
    }
    let not_running = running.iter().filter(|c| c.status != "RUNNING").count();
    if not_running > 0 {
        bail!("{not_running} of the {n} sessions filling the fleet are not RUNNING");
    }
    row.fill_per_s = n as f64 / secs;
    eprintln!("[{store}] fleet full: {n} sessions in {secs:.1} s");

    // 2. The queue.
    let (queued, errors, secs) = create_many(http, k.queued, k.clients, "enqueue").await;
    if let Some(e) = errors.first() {
        bail!(
            "{} of {} creates to queue failed, e.g. {e}",
            errors.len(),
            k.queued
        );
    }
    row.enqueue_not_pending = queued.iter().filter(|c| c.status != "PENDING").count();
    row.enqueue_per_s = k.queued as f64 / secs;
    let mut lat: Vec<f64> = queued.iter().map(|c| c.ms).collect();
    lat.sort_by(f64::total_cmp);
    (row.enqueue_p50, row.enqueue_p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
    row.rss_queued_mb = mgr.rss_mb()?;
    eprintln!(
        "[{store}] {} queued in {secs:.1} s ({} not PENDING); depth {}",
        k.queued,
        row.enqueue_not_pending,
        metric_sum(http, "kernelvisor_manager_queue_depth").await?
    );

    // 3. Creates with the queue present: at the real heartbeat rate, then under the flood.
    let (lat, _) = timed_creates(http, k.sessions, SESSION_CPU, n, "with the queue").await?;
    (row.create_p50, row.create_p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
    world.set(Mode::Fast);
    actix_rt::time::sleep(Duration::from_secs(1)).await;
    let (hb, _, _) = {
        let w: &World = world;
        heartbeat_rate(http, mgr, || w.sent(), k.window).await?
    };
    row.hb_flood_per_s = hb;
    let (lat, _) = timed_creates(
        http,
        k.sessions,
        SESSION_CPU,
        n,
        "with the queue under the flood",
    )
    .await?;
    (row.flood_p50, row.flood_p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
    world.set(Mode::Paced);
    eprintln!(
        "[{store}] create p99 {:.1} ms at the real rate, {:.1} ms under the flood ({hb:.0} heartbeats/s)",
        row.create_p99, row.flood_p99
    );
    // Let the flood's backlog drain.
    actix_rt::time::sleep(Duration::from_secs(2)).await;

    // 4. Admissions: room for n × (cpu − 1) sessions appears at once.
    row.room = (n * (k.cpu_after as usize).saturating_sub(1)).min(k.queued);
    let (a0, c0) = (
        metric_sum(http, "kernelvisor_manager_admissions_total").await?,
        metric_sum(http, "kernelvisor_manager_sessions_created_total").await?,
    );
    let hosts = world
        .hosts
        .as_mut()
        .ok_or_else(|| anyhow!("no simulated agents"))?;
    hosts.set_cpu(k.cpu_after);
    let burst = Instant::now();
    hosts.set(Mode::Burst(1));
    let (mut first, mut admitted_at, mut created_at) = (None, None, None);
    let (mut last, mut last_change) = ((0.0, 0.0), Instant::now());
    let limit = Duration::from_secs(env_or("KV_BENCH_ADMIT_LIMIT", 600));
    while created_at.is_none() {
        actix_rt::time::sleep(Duration::from_millis(100)).await;
        let m = metrics(http).await?;
        let get = |name: &str| m.get(name).copied().unwrap_or_default();
        let (a, c) = (
            get("kernelvisor_manager_admissions_total") - a0,
            get("kernelvisor_manager_sessions_created_total") - c0,
        );
        if a > 0.0 && first.is_none() {
            first = Some(burst.elapsed());
        }
        if a as usize >= row.room && admitted_at.is_none() {
            admitted_at = Some(burst.elapsed());
        }
        if c as usize >= row.room {
            created_at = Some(burst.elapsed());
        }
        if (a, c) != last {
            (last, last_change) = ((a, c), Instant::now());
        }
        if burst.elapsed() > limit || last_change.elapsed() > Duration::from_secs(30) {
            bail!(
                "{a} admitted and {c} created of {} after {:.0} s",
                row.room,
                burst.elapsed().as_secs_f64()
            );
        }
    }
    let (admitted_at, created_at) = (
        admitted_at.unwrap_or_default().as_secs_f64(),
        created_at.unwrap_or_default().as_secs_f64(),
    );
    row.admitted = last.0 as usize;
    row.first_admit_s = first.unwrap_or_default().as_secs_f64();
    row.admit_s = admitted_at;
    row.admissions_per_s = row.room as f64 / admitted_at;
    row.created_per_s = row.room as f64 / created_at;
    eprintln!(
        "[{store}] {} admitted in {admitted_at:.1} s, created in {created_at:.1} s (first after {:.2} s)",
        row.room, row.first_admit_s
    );

    // 5. Room for one: from a session's end to the next one RUNNING.
    let mut events = follow_statuses(http)?;
    let mut free = Vec::new();
    // (Only while sessions wait: the room takes the whole queue when it is larger.)
    let trials = if k.queued > row.room { k.trials } else { 0 };
    for c in running.into_iter().take(trials) {
        match free_to_running(http, &mut events, c.id, Duration::from_secs(30)).await? {
            Some(ms) => free.push(ms),
            None => row.free_failed += 1,
        }
    }
    free.sort_by(f64::total_cmp);
    row.free_trials = free.len();
    (row.free_p50, row.free_p99) = (percentile(&free, 0.5), percentile(&free, 0.99));

    // 7. Preemption: a priority-50 session into the full fleet of preemptible priority-10
    // ones, each evicting one (no grace yet), `KV_BENCH_PREEMPT_TRIALS` times.
    let p0 = metric_sum(http, "kernelvisor_manager_preemptions_total").await?;
    let mut took = Vec::new();
    // (Only with the fleet full: the queue outlasted the room.)
    let preempt_trials = if k.queued > row.room && k.preemption {
        k.preempt_trials
    } else {
        0
    };
    for _ in 0..preempt_trials {
        match preempt_to_running(http, &mut events, Duration::from_secs(30)).await? {
            Some(ms) => took.push(ms),
            None => row.preempt_failed += 1,
        }
    }
    took.sort_by(f64::total_cmp);
    row.preempt_trials = took.len();
    (row.preempt_p50, row.preempt_p99) = (percentile(&took, 0.5), percentile(&took, 0.99));
    row.preemptions = metric_sum(http, "kernelvisor_manager_preemptions_total").await? - p0;
    eprintln!(
        "[{store}] preemption: submit → RUNNING p50 {:.1} ms, p99 {:.1} ms over {} trials ({} timed out), {} victims",
        row.preempt_p50, row.preempt_p99, row.preempt_trials, row.preempt_failed, row.preemptions
    );

    // 6. What the manager holds.
    row.rss_mb = mgr.rss_mb()?;
    row.queue_left = metric_sum(http, "kernelvisor_manager_queue_depth").await?;
    row.total_s = t0.elapsed().as_secs_f64();
    Ok(row)
}

/// A fresh database on the PostgreSQL server of `url` (its user may create databases): its URL.
async fn fresh_postgres(url: &str) -> anyhow::Result<String> {
    use sqlx::{Connection, Executor};
    let name = format!("kv_bench_scheduler_{}", std::process::id());
    let mut c = sqlx::PgConnection::connect(url)
        .await
        .context("connect to KV_BENCH_POSTGRES_URL")?;
    c.execute(format!("DROP DATABASE IF EXISTS {name}").as_str())
        .await?;
    c.execute(format!("CREATE DATABASE {name}").as_str())
        .await?;
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let base = base.rsplit_once('/').map_or(base, |(b, _)| b);
    Ok(match query {
        "" => format!("{base}/{name}"),
        q => format!("{base}/{name}?{q}"),
    })
}

async fn run_phase(bin: &str, store: &str, k: &Knobs) -> anyhow::Result<Row> {
    let dir = tempfile::Builder::new()
        .prefix("kv-bench-scheduler-")
        .tempdir()?;
    let url = match store {
        "postgresql" => {
            let admin = std::env::var("KV_BENCH_POSTGRES_URL")?;
            Some(fresh_postgres(&admin).await?)
        }
        _ => None,
    };
    // The manager's own health-check pacing (pings spread over half of 30 s), unless
    // KV_BENCH_UNPACED_SWEEP=1 asks for `just bench manager`'s burst of every ping at once
    // every 10 s (what this bench ran with before).
    let pool = match env_or("KV_BENCH_UNPACED_SWEEP", 0) {
        0 => String::new(),
        _ => unpaced_sweep(),
    };
    // Preemption on in every phase (`KV_BENCH_PREEMPTION=0`: off, and no phase 7):
    // admissions/s is measured with it.
    let extra = format!(
        "{pool}[scheduler]\nadmission-interval = {}\npreemption = {}\n",
        k.admission_interval, k.preemption
    );
    let mut mgr = ManagerProc::spawn_with(bin, dir.path(), k.interval, url.as_deref(), &extra)?;
    let http = Http::new(&mgr.api);
    let mut world = World::default();
    let result = measure(&mut mgr, &http, &mut world, dir.path(), store, k).await;
    let result = end_phase(mgr, world, result).await;
    drop(dir);
    result
}

fn main() {
    fleet_bench_start();
    let k = Knobs {
        agents: env_or("KV_BENCH_AGENTS", 10_000),
        queued: env_or("KV_BENCH_QUEUED", 100_000),
        cpu_after: env_or("KV_BENCH_AGENT_CPU", 4),
        clients: env_or("KV_BENCH_CLIENTS", 16),
        sessions: env_or("KV_BENCH_SESSIONS", 200),
        trials: env_or("KV_BENCH_TRIALS", 30),
        window: Duration::from_secs_f64(env_or("KV_BENCH_WINDOW", 5.0)),
        interval: Duration::from_secs_f64(env_or("KV_BENCH_HEARTBEAT_INTERVAL", 20.0)),
        admission_interval: env_or("KV_BENCH_ADMISSION_INTERVAL", 0.25),
        preempt_trials: env_or("KV_BENCH_PREEMPT_TRIALS", 20),
        preemption: env_or("KV_BENCH_PREEMPTION", 1) != 0,
    };
    let mut stores = vec!["sqlite"];
    if std::env::var("KV_BENCH_POSTGRES_URL").is_ok_and(|u| !u.is_empty()) {
        stores.push("postgresql");
    }
    let bin = env!("CARGO_BIN_EXE_kernelvisor");
    let started = Instant::now();
    let rows = run_phases("scheduler", stores, |store| run_phase(bin, store, &k));

    println!(
        "\nkernelvisor scheduler bench: one manager process, {} simulated agents (wire level, no CURVE) of 1 core, then {} cores; sessions of 1 core; {} cores on this machine, {:.0} s",
        k.agents,
        k.cpu_after,
        std::thread::available_parallelism().map(usize::from).unwrap_or(0),
        started.elapsed().as_secs_f64()
    );
    println!(
        "fill and queue: POST /v1/sessions from {} concurrent clients; creates: {} sequential POSTs with the queue present, at the real rate (every agent beats every {:.0} s) and under the heartbeat flood; [scheduler] admission-interval = {} s\n",
        k.clients,
        k.sessions,
        k.interval.as_secs_f64(),
        k.admission_interval
    );
    println!(
        "{:>10} {:>7} {:>8} {:>7} {:>9} {:>8} {:>15} {:>10} {:>11} {:>11} {:>9} {:>9} {:>8} {:>8}",
        "store",
        "agents",
        "queued",
        "fill/s",
        "enqueue/s",
        "enq p99",
        "admissions/s",
        "created/s",
        "free→RUN 50",
        "free→RUN 99",
        "create99",
        "flood99",
        "RSS q",
        "RSS end"
    );
    for r in &rows {
        println!(
            "{:>10} {:>7} {:>8} {:>7.0} {:>9.0} {:>8.1} {:>8.0} ({:>3.0}%) {:>10.0} {:>11.1} {:>11.1} {:>9.1} {:>9.1} {:>8.1} {:>8.1}",
            r.store,
            r.agents,
            r.queued,
            r.fill_per_s,
            r.enqueue_per_s,
            r.enqueue_p99,
            r.admissions_per_s,
            r.admissions_per_s / 1000.0 * 100.0,
            r.created_per_s,
            r.free_p50,
            r.free_p99,
            r.create_p99,
            r.flood_p99,
            r.rss_queued_mb,
            r.rss_mb
        );
    }
    println!();
    for r in &rows {
        println!(
            "{}: enqueue p50 {:.1} ms, {} answered other than PENDING; creates with the queue p50 {:.1} ms, under the flood p50 {:.1} ms ({:.0} heartbeats/s taken); {} admitted (room for {}) in {:.1} s, the first {:.2} s after the room appeared; free→RUNNING over {} trials ({} timed out); {:.0} still queued at the end; {:.0} s",
            r.store,
            r.enqueue_p50,
            r.enqueue_not_pending,
            r.create_p50,
            r.flood_p50,
            r.hb_flood_per_s,
            r.admitted,
            r.room,
            r.admit_s,
            r.first_admit_s,
            r.free_trials,
            r.free_failed,
            r.queue_left,
            r.total_s
        );
    }
    for r in &rows {
        println!(
            "{}: preemption (issue 41): a priority-50 session into the full fleet, submit → RUNNING through one eviction p50 {:.1} ms, p99 {:.1} ms over {} trials ({} timed out); {} sessions evicted",
            r.store, r.preempt_p50, r.preempt_p99, r.preempt_trials, r.preempt_failed, r.preemptions
        );
    }
    println!("goals (issue 27): admissions ≥ 1,000/s (the % is of that); free→RUNNING p50 ≤ 1,000 ms; create p99 under the flood ≤ 100 ms. admissions/s and created/s: from the heartbeat burst that made the room to the last admitted / created. free→RUN: a running session's TERMINATED event to the next RUNNING one, by the manager's clock (ms). RSS q: the manager's VmRSS with the whole queue, MiB; RSS end: at the end");
    let json: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{{\"store\": \"{}\", \"agents\": {}, \"queued\": {}, \"fill_per_s\": {:.0}, \"enqueue_per_s\": {:.0}, \"enqueue_p99_ms\": {:.1}, \"admissions_per_s\": {:.0}, \"created_per_s\": {:.0}, \"free_to_running_p50_ms\": {:.1}, \"free_to_running_p99_ms\": {:.1}, \"create_p50_ms\": {:.1}, \"create_p99_ms\": {:.1}, \"create_flood_p50_ms\": {:.1}, \"create_flood_p99_ms\": {:.1}, \"rss_queued_mb\": {:.1}, \"rss_mb\": {:.1}, \"preempt_to_running_p50_ms\": {:.1}, \"preempt_to_running_p99_ms\": {:.1}}}",
                r.store, r.agents, r.queued, r.fill_per_s, r.enqueue_per_s, r.enqueue_p99, r.admissions_per_s, r.created_per_s, r.free_p50, r.free_p99, r.create_p50, r.create_p99, r.flood_p50, r.flood_p99, r.rss_queued_mb, r.rss_mb, r.preempt_p50, r.preempt_p99
            )
        })
        .collect();
    println!("[{}]", json.join(", "));
}

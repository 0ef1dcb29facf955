//! `just bench console`: the web console's sessions page (issue 42) in a real headless
//! Chromium (Debian's, through chromedriver) against a manager and an agent process (the
//! release `kernelvisor` binary, CURVE, SQLite, the local Docker engine).
//!
//! - `first_paint_p50_ms` / `_max_ms`: a fresh load of `/ui/#/sessions` (module scripts, the
//!   sign-in's role check, the event stream, `GET /v1/sessions`) until the list of
//!   `KV_BENCH_CONSOLE_SESSIONS` (default 1,000) queued sessions plus one running is drawn and
//!   the next frame painted (the page's `kvConsoleStats.firstPaintMs`: milliseconds since the
//!   navigation started, `performance.now()`), over `KV_BENCH_TRIALS` (default 5) loads.
//!   Baseline in the same run: `list_read_p50_ms`, the same `GET /v1/sessions` read by the bench
//!   itself (what the page cannot be faster than). Goal: ≤ 1,000 ms.
//! - The live list under `KV_BENCH_CONSOLE_RATE` (default 100) status changes a second: every
//!   queued session is cancelled (`DELETE`, a real `PENDING` → `CANCELLED` change of the
//!   manager's, on its event stream) on a fixed schedule from 4 threads while the page is open.
//!   `changes_per_s`: the rate the manager took them at; `lag_p50_ms` / `lag_p99_ms`: from a
//!   change's time (the event's `time`) to its row drawn (the page's `kvConsoleStats.lags`, its
//!   last 1,000); `settle_ms`: from the last change's answer to the list showing only the running
//!   session. Goal: it keeps up: `changes_per_s` ≥ the rate, `lag_p99_ms` and `settle_ms` ≤
//!   1,000.
//!
//! Prints a table and ends with one JSON line of these figures.

mod common;

#[path = "../tests/common/browser.rs"]
mod browser;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use browser::Browser;
use common::{env_or, median, BenchCluster};

const IMAGE: &str = "kernelvisor-test:latest";

/// The `q` quantile of unsorted figures (NaN for none).
fn percentile(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    common::fleet::percentile(&v, q)
}

/// How many session rows the page shows.
fn rows(b: &Browser) -> usize {
    b.js("return document.querySelectorAll('#sessions tr[data-session]').length")
        .as_u64()
        .unwrap_or(0) as usize
}

fn main() -> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_kernelvisor");
    let n: usize = env_or("KV_BENCH_CONSOLE_SESSIONS", 1000usize).max(1);
    let trials: usize = env_or("KV_BENCH_TRIALS", 5usize).max(1);
    let rate: f64 = env_or("KV_BENCH_CONSOLE_RATE", 100.0f64).max(1.0);
    let c = BenchCluster::start(bin, "console", IMAGE)?;
    let (api, token) = (c.api.clone(), c.token.clone());
    let auth = format!("Bearer {token}");

    // Queued sessions: each asks for every core of the agent, which the running session holds
    // one of, so they wait PENDING `no-capacity`.
    let agents = common::get(&format!("{api}/v1/agents"), Some(&token)).context("agents")?;
    let cpu = agents["agents"][0]["slots_total"]["cpu"].clone();
    let made = Instant::now();
    let ids: Vec<String> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let (api, auth, cpu) = (&api, &auth, &cpu);
                s.spawn(move || -> anyhow::Result<Vec<String>> {
                    let mut ids = Vec::new();
                    for _ in (w..n).step_by(4) {
                        let r: Value = ureq::post(&format!("{api}/v1/sessions"))
                            .set("Authorization", auth)
                            .send_json(json!({"image": IMAGE,
                                "resource_slots": {"cpu": cpu, "mem": "64m"}}))?
                            .into_json()?;
                        if r["status"] != "PENDING" {
                            bail!("a session meant to wait is {r}");
                        }
                        ids.push(r["session_id"].as_str().unwrap_or_default().to_owned());
                    }
                    Ok(ids)
                })
            })
            .collect();
        let mut all = Vec::new();
        for w in workers {
            all.extend(w.join().expect("creator thread")?);
        }
        Ok::<_, anyhow::Error>(all)
    })?;
    eprintln!(
        "bench console: {n} queued sessions made in {:.1} s",
        made.elapsed().as_secs_f64()
    );

    // The bench's own read of the list: the page's floor.
    let mut reads = Vec::new();
    for _ in 0..trials {
        let t = Instant::now();
        let body = ureq::get(&format!("{api}/v1/sessions"))
            .set("Authorization", &auth)
            .call()?
            .into_string()?;
        reads.push(t.elapsed().as_secs_f64() * 1000.0);
        if body.len() < n * 100 {
            bail!("the list is short: {} bytes", body.len());
        }
    }

    let port = common::free_port()?;
    let b = Browser::start(c.dir.path(), port);
    b.goto(&format!("{api}/ui/"));
    b.js(&format!(
        "sessionStorage.setItem('kernelvisor.secret', {}); return null",
        json!(token)
    ));
    let mut paints = Vec::new();
    for t in 0..trials {
        // A query that changes makes it a new navigation (a hash change alone would not).
        b.goto(&format!("{api}/ui/?load={t}#/sessions"));
        let start = Instant::now();
        let painted = loop {
            let v =
                b.js("return window.kvConsoleStats ? window.kvConsoleStats.firstPaintMs : null");
            if let Some(ms) = v.as_f64() {
                break ms;
            }
            if start.elapsed() > Duration::from_secs(60) {
                bail!("no list drawn in 60 s; the page reads:\n{}", b.page_text());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let shown = rows(&b);
        if shown != n + 1 {
            bail!("the page shows {shown} sessions, not {}", n + 1);
        }
        paints.push(painted);
    }

    // The live list: every queued session cancelled on a fixed schedule.
    let done = Arc::new(AtomicUsize::new(0));
    let period = Duration::from_secs_f64(1.0 / rate);
    let t0 = Instant::now() + Duration::from_millis(200);
    let (finished, took) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|w| {
                let (api, auth, ids, done) = (&api, &auth, &ids, done.clone());
                s.spawn(move || -> anyhow::Result<()> {
                    for k in (w..ids.len()).step_by(4) {
                        let at = t0 + period * k as u32;
                        if let Some(wait) = at.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        ureq::delete(&format!("{api}/v1/sessions/{}", ids[k]))
                            .set("Authorization", auth)
                            .call()?;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().expect("canceller thread")?;
        }
        let finished = Instant::now();
        Ok::<_, anyhow::Error>((finished, finished.duration_since(t0)))
    })?;
    let changes_per_s = done.load(Ordering::Relaxed) as f64 / took.as_secs_f64();
    let settle_ms = loop {
        if rows(&b) == 1 {
            break finished.elapsed().as_secs_f64() * 1000.0;
        }
        if finished.elapsed() > Duration::from_secs(60) {
            bail!(
                "the list still shows {} sessions 60 s after the last change",
                rows(&b)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let stats = b.js("return window.kvConsoleStats");
    let lags: Vec<f64> = stats["lags"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    let applied = stats["applied"].as_u64().unwrap_or(0);
    let page_reads = stats["reads"].as_u64().unwrap_or(0);
    drop(b);
    c.stop();

    let figures = json!({
        "sessions": n,
        "first_paint_p50_ms": median(paints.clone()),
        "first_paint_max_ms": percentile(paints, 1.0),
        "list_read_p50_ms": median(reads),
        "rate_asked": rate,
        "changes_per_s": changes_per_s,
        "events_applied": applied,
        "list_reads": page_reads,
        "lag_p50_ms": percentile(lags.clone(), 0.5),
        "lag_p99_ms": percentile(lags, 0.99),
        "settle_ms": settle_ms,
    });
    let f = |k: &str| figures[k].as_f64().unwrap_or(f64::NAN);
    println!("console bench: {n} sessions, {trials} loads, {rate} changes/s asked");
    println!("{:<34} {:>10} {:>10}", "figure", "value", "goal");
    for (k, goal) in [
        ("list_read_p50_ms", "(floor)"),
        ("first_paint_p50_ms", "<= 1000"),
        ("first_paint_max_ms", ""),
        ("changes_per_s", ">= rate"),
        ("lag_p50_ms", ""),
        ("lag_p99_ms", "<= 1000"),
        ("settle_ms", "<= 1000"),
    ] {
        println!("{k:<34} {:>10.1} {goal:>10}", f(k));
    }
    println!(
        "{:<34} {:>10} {:>10}",
        "events applied / list reads",
        format!("{applied}/{page_reads}"),
        ""
    );
    println!("{figures}");
    Ok(())
}

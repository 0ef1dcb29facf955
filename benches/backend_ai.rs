//! `just bench backend-ai`: kernelvisor's agent against upstream's own Backend.AI 26.9.6 agent,
//! one after the other on the same real halfstack, image and client, in one run.
//!
//! `tests/bai_halfstack/halfstack.sh` brings up the halfstack (PostgreSQL 17, Valkey, etcd and
//! `backend.ai mgr start-server` in the trixie root of `just bai-env`, loopback ports
//! 38000–38099, apart from the halfstack test's). Then, for each agent:
//! - upstream's (`halfstack.py agent-up`, ports 38500–38999, `BACKEND_CPU_OVERCOMMIT_FACTOR=10`:
//!   its CPU plugin allocates whole cores, and the one-core kernels must fit this node);
//! - kernelvisor's (this build's `kernelvisor agent`, the halfstack's CURVE keys and Valkey, the
//!   runner at `KV_KRUNNER_DIR`, `[resource] cpu = 20` for the same twenty slots, ports
//!   38100–38499; each kernel publishes about five host ports on either agent),
//!
//! both running their kernels as uid and gid 1000 ([`KERNEL_UID`]),
//!
//! `halfstack.py bench` (tests/bai_halfstack/bench.py, whose doc says how each figure is taken)
//! measures, on the image `local/kernelvisor/test-py:bash` (`just test-image-py`; `/bin/bash` as
//! its command): agent RSS idle; `KV_BENCH_BAI_SESSIONS` (16: upstream's agent on this 2-core VM
//! left its 19th kernel in PREPARING for 3 minutes in a run of 20) interactive sessions created one
//! after the other, create → RUNNING through the manager and the agent's part (`kernel_preparing`
//! → `kernel_started` on the bus, split at the engine's own `Created` and `StartedAt` of the
//! container: the agent's work before the create, the engine's create → start, the runner's boot
//! and the readiness check); `KV_BENCH_BAI_QUERIES` (200) query round trips through the
//! manager's own agent client and 30 through its REST API; `KV_BENCH_BAI_FILE_MIB` (256) MiB
//! up and down through the agent client against `docker cp`; a batch session of `true` end to
//! end (3 runs); agent RSS and CPU over `KV_BENCH_BAI_CPU_SECS` (60) seconds with all sessions
//! running. Everything is stopped by pid and every container of both agents removed.
//! `KV_BENCH_BAI_AGENTS=kernelvisor` (or `upstream`) runs one agent alone, its column only.
//!
//! Prints a table (each figure on both agents, kernelvisor / upstream, the goal and whether it
//! is met) and ends with one JSON line of the figures.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use halfstack::Halfstack;

mod common;
#[path = "../tests/common/halfstack.rs"]
mod halfstack;

const IMAGE: &str = "local/kernelvisor/test-py:bash";
const ENGINE_IMAGE: &str = "kernelvisor/test-py:bash";
const HALFSTACK_PORTS: &str = "38000-38099";
const RESERVED_PORTS: &str = "38000-38999";
const KV_RPC_PORT: u16 = 38_100;
const KV_CONTAINER_PORTS: (u16, u16) = (38_110, 38_499);
const UPSTREAM_PORTS: &str = "38500-38999";
/// The kernels' uid and gid on both agents (kernelvisor's default `kernel-uid`). Upstream's
/// `-1` would be its own, root here, and its runner's entrypoint takes a shorter path for
/// root (no user made, no `su-exec`): a different kernel, not a faster agent.
const KERNEL_UID: u32 = 1000;

/// Runs a subcommand of the halfstack: its stdout's JSON lines (its other lines and its stderr,
/// the progress, pass through).
fn run(hs: &Halfstack, args: &[&str]) -> anyhow::Result<Vec<Value>> {
    let (lines, status) = hs
        .lines(args, Stdio::inherit(), |line, json| {
            if !json {
                eprintln!("{line}");
            }
        })
        .context("run halfstack.sh")?;
    if !status.success() {
        bail!("halfstack.sh {}: {status}", args.join(" "));
    }
    Ok(lines)
}

/// The `bench` subcommand's arguments from the environment.
fn bench_args(agent_id: &str, label: &str) -> Vec<String> {
    let knob = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    [
        "bench",
        "--agent-id",
        agent_id,
        "--label",
        label,
        "--image",
        IMAGE,
        "--sessions",
        &knob("KV_BENCH_BAI_SESSIONS", "16"),
        "--queries",
        &knob("KV_BENCH_BAI_QUERIES", "200"),
        "--file-mib",
        &knob("KV_BENCH_BAI_FILE_MIB", "256"),
        "--cpu-secs",
        &knob("KV_BENCH_BAI_CPU_SECS", "60"),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn last_figures(lines: Vec<Value>) -> anyhow::Result<Value> {
    lines
        .into_iter()
        .rev()
        .find(|v| v.get("create_total_s").is_some())
        .context("the bench printed no figures")
}

/// kernelvisor's agent on the halfstack: its config, the process, and its id.
fn start_kernelvisor(hs: &Halfstack, state: &Value, dir: &Path) -> anyhow::Result<(Child, String)> {
    let id = format!("bench-kv-{}", std::process::id());
    let krunner =
        std::env::var("KV_KRUNNER_DIR").unwrap_or_else(|_| "/var/cache/kernelvisor/krunner".into());
    let keys = &state["keys"];
    let config = format!(
        "[agent]\nid = \"{id}\"\nrpc-listen-addr = {{ host = \"127.0.0.1\", port = {KV_RPC_PORT} }}\n\
         service-addr = {{ host = \"127.0.0.1\", port = 0 }}\nvar-base-path = \"{d}/var\"\n\
         rpc-auth-manager-public-key = {mk}\nrpc-auth-agent-keypair = {ak}\nscaling-group = \"default\"\n\n\
         [redis]\naddr = {{ host = \"127.0.0.1\", port = {valkey} }}\n\n\
         [kernel-runner]\ndir = \"{krunner}\"\n\n\
         [container]\nport-range = [{lo}, {hi}]\nbind-host = \"127.0.0.1\"\nscratch-root = \"{d}/scratches\"\n\
         vfolder-root = \"{d}/vfolders\"\nkernel-uid = {KERNEL_UID}\nkernel-gid = {KERNEL_UID}\n\n\
         [resource]\nreserved-cpu = 0\nreserved-mem = 0\ncpu = 20\n\n[logging]\nlevel = \"warn\"\n",
        d = dir.display(),
        mk = keys["manager.key"],
        ak = keys["agent.key_secret"],
        valkey = state["ports"]["valkey"],
        lo = KV_CONTAINER_PORTS.0,
        hi = KV_CONTAINER_PORTS.1,
    );
    let path = dir.join("agent.toml");
    std::fs::write(&path, config)?;
    let child = common::spawn(
        env!("CARGO_BIN_EXE_kernelvisor"),
        &["agent", "--config", path.to_str().unwrap()],
        &dir.join("agent.log"),
    )?;
    let _ = hs;
    Ok((child, id))
}

fn f(v: &Value) -> Vec<f64> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default()
}

fn pct(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[((q * (v.len() - 1) as f64).round() as usize).min(v.len() - 1)]
}

fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(
        std::env::var("KV_BAI_ROOT").unwrap_or_else(|_| "/var/cache/kernelvisor/bai-trixie".into()),
    );
    if !root.join("usr/lib/postgresql/17/bin/postgres").exists() {
        bail!("{} has no halfstack: run `just bai-env`", root.display());
    }
    let out = Command::new("docker")
        .args(["image", "inspect", "-f", "{{.Id}}", ENGINE_IMAGE])
        .output()?;
    if !out.status.success() {
        bail!("no image {ENGINE_IMAGE}: run `just test-image-py`");
    }
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let mut hs = Halfstack::new(
        &root,
        std::env::temp_dir().join(format!("kv-bench-bai-{}", std::process::id())),
    );
    run(
        &hs,
        &[
            "up",
            "--ports",
            HALFSTACK_PORTS,
            "--reserve",
            RESERVED_PORTS,
        ],
    )?;
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(hs.work.join("halfstack.json"))?)?;

    // `KV_BENCH_BAI_AGENTS` (`upstream,kernelvisor`): which agents run; one alone leaves the
    // other's column empty (for looking into one side without the other's 5 minutes).
    let agents =
        std::env::var("KV_BENCH_BAI_AGENTS").unwrap_or_else(|_| "upstream,kernelvisor".into());
    let runs = |name: &str| agents.split(',').any(|a| a.trim() == name);

    // Upstream's agent first.
    let upstream = if runs("upstream") {
        let up_id = format!("bench-upstream-{}", std::process::id());
        hs.agent_ids.push(up_id.clone());
        run(
            &hs,
            &[
                "agent-up",
                "--agent-id",
                &up_id,
                "--ports",
                UPSTREAM_PORTS,
                "--cpu-overcommit",
                "10",
                "--kernel-uid",
                &KERNEL_UID.to_string(),
            ],
        )?;
        let args = bench_args(&up_id, "upstream");
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let figures = last_figures(run(&hs, &args)?)?;
        run(&hs, &["agent-down"])?;
        figures
    } else {
        json!({})
    };
    if !runs("kernelvisor") {
        drop(hs);
        report(&upstream, &json!({}), started.elapsed());
        return Ok(());
    }

    // Then kernelvisor's.
    let (mut agent, kv_id) = start_kernelvisor(&hs, &state, dir.path())?;
    hs.agent_ids.push(kv_id.clone());
    let kv = (|| {
        run(&hs, &["wait-agent", "--agent-id", &kv_id, "--limit", "90"])?;
        let pid = agent.id().to_string();
        let mut args = bench_args(&kv_id, "kernelvisor");
        args.extend(["--agent-pid".to_owned(), pid]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        last_figures(run(&hs, &args)?)
    })();
    // SIGTERM as an operator stops it, then its containers go with the halfstack's `down`.
    unsafe { libc::kill(agent.id() as i32, libc::SIGTERM) };
    let deadline = Instant::now() + Duration::from_secs(30);
    while agent.try_wait()?.is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = agent.kill();
    let kv = kv.with_context(|| {
        format!(
            "kernelvisor's agent log:\n{}",
            std::fs::read_to_string(dir.path().join("agent.log")).unwrap_or_default()
        )
    })?;
    drop(hs);

    report(&upstream, &kv, started.elapsed());
    Ok(())
}

/// One row: the figure on both agents, kernelvisor / upstream, the goal and whether it holds.
struct Row {
    name: &'static str,
    unit: &'static str,
    upstream: f64,
    kv: f64,
    /// `Some((limit, lower_is_better))`: the goal on the ratio kernelvisor / upstream.
    goal: Option<(f64, bool)>,
}

fn report(up: &Value, kv: &Value, took: Duration) {
    let files = |v: &Value, k: &str| v["files"][k].as_f64().unwrap_or(f64::NAN);
    let rows = [
        Row {
            name: "create → RUNNING, total p50",
            unit: "s",
            upstream: pct(f(&up["create_total_s"]), 0.5),
            kv: pct(f(&kv["create_total_s"]), 0.5),
            goal: None,
        },
        Row {
            name: "create, the agent's part p50",
            unit: "s",
            upstream: pct(f(&up["create_agent_s"]), 0.5),
            kv: pct(f(&kv["create_agent_s"]), 0.5),
            goal: Some((0.5, true)),
        },
        Row {
            name: "create, the agent's part max",
            unit: "s",
            upstream: pct(f(&up["create_agent_s"]), 1.0),
            kv: pct(f(&kv["create_agent_s"]), 1.0),
            goal: None,
        },
        Row {
            name: "— preparing → container created p50",
            unit: "s",
            upstream: pct(f(&up["create_prepare_s"]), 0.5),
            kv: pct(f(&kv["create_prepare_s"]), 0.5),
            goal: None,
        },
        Row {
            name: "— container created → started p50",
            unit: "s",
            upstream: pct(f(&up["create_engine_s"]), 0.5),
            kv: pct(f(&kv["create_engine_s"]), 0.5),
            goal: None,
        },
        Row {
            name: "— started → kernel_started p50",
            unit: "s",
            upstream: pct(f(&up["create_boot_s"]), 0.5),
            kv: pct(f(&kv["create_boot_s"]), 0.5),
            goal: None,
        },
        Row {
            name: "query, agent client p50",
            unit: "ms",
            upstream: pct(f(&up["query_rpc_ms"]), 0.5),
            kv: pct(f(&kv["query_rpc_ms"]), 0.5),
            goal: Some((0.5, true)),
        },
        Row {
            name: "query, agent client p99",
            unit: "ms",
            upstream: pct(f(&up["query_rpc_ms"]), 0.99),
            kv: pct(f(&kv["query_rpc_ms"]), 0.99),
            goal: None,
        },
        Row {
            name: "— `ping` through the same client p50",
            unit: "ms",
            upstream: pct(f(&up["ping_rpc_ms"]), 0.5),
            kv: pct(f(&kv["ping_rpc_ms"]), 0.5),
            goal: None,
        },
        Row {
            name: "query, REST API p50",
            unit: "ms",
            upstream: pct(f(&up["query_rest_ms"]), 0.5),
            kv: pct(f(&kv["query_rest_ms"]), 0.5),
            goal: None,
        },
        Row {
            name: "batch `true` end to end p50",
            unit: "s",
            upstream: pct(f(&up["batch_s"]), 0.5),
            kv: pct(f(&kv["batch_s"]), 0.5),
            goal: None,
        },
        Row {
            name: "agent RSS idle",
            unit: "MiB",
            upstream: up["rss_idle_mib"].as_f64().unwrap_or(f64::NAN),
            kv: kv["rss_idle_mib"].as_f64().unwrap_or(f64::NAN),
            goal: Some((0.15, true)),
        },
        Row {
            name: "agent RSS with the kernels",
            unit: "MiB",
            upstream: up["rss_loaded_mib"].as_f64().unwrap_or(f64::NAN),
            kv: kv["rss_loaded_mib"].as_f64().unwrap_or(f64::NAN),
            goal: Some((0.15, true)),
        },
        Row {
            name: "agent CPU with the kernels",
            unit: "% core",
            upstream: up["cpu_pct"].as_f64().unwrap_or(f64::NAN),
            kv: kv["cpu_pct"].as_f64().unwrap_or(f64::NAN),
            goal: Some((0.5, true)),
        },
        Row {
            name: "upload (agent client)",
            unit: "MiB/s",
            upstream: files(up, "upload_mib_s"),
            kv: files(kv, "upload_mib_s"),
            goal: None,
        },
        Row {
            name: "download (agent client)",
            unit: "MiB/s",
            upstream: files(up, "download_mib_s"),
            kv: files(kv, "download_mib_s"),
            goal: None,
        },
    ];
    println!(
        "Backend.AI 26.9.6 halfstack, {} sessions of {IMAGE} per agent ({:.0} s in all)",
        kv["kernels"],
        took.as_secs_f64()
    );
    println!(
        "{:<32} {:>7} {:>10} {:>12} {:>8} {:>12}",
        "figure", "unit", "upstream", "kernelvisor", "kv/up", "goal"
    );
    let mut goals = serde_json::Map::new();
    for r in &rows {
        let ratio = r.kv / r.upstream;
        let goal = match r.goal {
            Some((limit, true)) => {
                let met = ratio <= limit;
                goals.insert(
                    r.name.into(),
                    json!({"ratio": round2(ratio), "limit": limit, "met": met}),
                );
                format!("≤ {limit} {}", if met { "met" } else { "MISSED" })
            }
            Some((limit, false)) => {
                let met = ratio >= limit;
                goals.insert(
                    r.name.into(),
                    json!({"ratio": round2(ratio), "limit": limit, "met": met}),
                );
                format!("≥ {limit} {}", if met { "met" } else { "MISSED" })
            }
            None => String::new(),
        };
        println!(
            "{:<32} {:>7} {:>10.2} {:>12.2} {:>8.2} {:>12}",
            r.name, r.unit, r.upstream, r.kv, ratio, goal
        );
    }
    // Files against `docker cp` of the same bytes, each agent on its own container.
    for (label, v) in [("upstream", up), ("kernelvisor", kv)] {
        let (upl, down) = (files(v, "upload_mib_s"), files(v, "download_mib_s"));
        let (cp_in, cp_out) = (
            files(v, "docker_cp_in_mib_s"),
            files(v, "docker_cp_out_mib_s"),
        );
        println!(
            "{label:<12} {} MiB: upload {upl:.1} MiB/s ({:.2}× docker cp in, {cp_in:.1}), download {down:.1} MiB/s ({:.2}× docker cp out, {cp_out:.1}){}",
            v["files"]["mib"], upl / cp_in, down / cp_out,
            v["files"]["download_error"].as_str().map(|e| format!("; download refused: {e}")).unwrap_or_default()
        );
        // Where the upload's wall time went: the CPU each party spent on it.
        println!(
            "{label:<12} upload of {} MiB: {:.2} s, CPU of the agent {:.2} s, of the client (callosum, pyzmq, CURVE) {:.2} s",
            v["files"]["mib"],
            files(v, "upload_s"),
            files(v, "upload_agent_cpu_s"),
            files(v, "upload_client_cpu_s"),
        );
    }
    let kv_files = (
        files(kv, "upload_mib_s") / files(kv, "docker_cp_in_mib_s"),
        files(kv, "download_mib_s") / files(kv, "docker_cp_out_mib_s"),
    );
    println!(
        "kernelvisor files vs docker cp: up {:.2}×, down {:.2}× (goal ≥ 0.8× both)",
        kv_files.0, kv_files.1
    );
    goals.insert(
        "files up vs docker cp".into(),
        json!({"ratio": round2(kv_files.0), "limit": 0.8, "met": kv_files.0 >= 0.8}),
    );
    goals.insert(
        "files down vs docker cp".into(),
        json!({"ratio": round2(kv_files.1), "limit": 0.8, "met": kv_files.1 >= 0.8}),
    );
    let summary = |v: &Value| {
        json!({
            "create_total_p50_s": round2(pct(f(&v["create_total_s"]), 0.5)),
            "create_agent_p50_s": round2(pct(f(&v["create_agent_s"]), 0.5)),
            "query_rpc_p50_ms": round2(pct(f(&v["query_rpc_ms"]), 0.5)),
            "query_rpc_p99_ms": round2(pct(f(&v["query_rpc_ms"]), 0.99)),
            "ping_rpc_p50_ms": round2(pct(f(&v["ping_rpc_ms"]), 0.5)),
            "query_rest_p50_ms": round2(pct(f(&v["query_rest_ms"]), 0.5)),
            "batch_p50_s": round2(pct(f(&v["batch_s"]), 0.5)),
            "rss_idle_mib": v["rss_idle_mib"],
            "rss_loaded_mib": v["rss_loaded_mib"],
            "cpu_pct": v["cpu_pct"],
            "kernels": v["kernels"],
            "files": v["files"],
        })
    };
    println!(
        "{}",
        json!({"upstream": summary(up), "kernelvisor": summary(kv), "goals": goals})
    );
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

//! `just bench exec`: end-to-end output throughput of `kernelvisor ctl session exec` against raw
//! `docker exec`, and the agent's and the manager's peak memory.
//!
//! One manager and one agent process (the release `kernelvisor` binary, CURVE on both channels,
//! SQLite, the local Docker engine) and one session on the test image. The same command,
//! `yes abcdefghij | head -c N` (N = `KV_BENCH_EXEC_BYTES`, default 1 GiB), runs
//! `KV_BENCH_RUNS` times (default 3) each way, alternating:
//! - `raw docker exec`: `docker exec <container> sh -c CMD`, stdout read by this process;
//! - `ctl session exec`: `kernelvisor ctl session exec SID CMD` (as the manager's bootstrap admin
//!   key, `KERNELVISOR_TOKEN`), stdout read by this process:
//!   the output goes agent (exec stream → bounded buffer) → RPC over CurveZMQ → manager → HTTP
//!   → ctl, in `continue` rounds of at most `exec-buffer-size` (1 MiB).
//!
//! Each way's figure is the median of its runs, in MB/s (10^6 bytes); the bytes are counted and
//! must equal N. Peak RSS is the processes' `VmHWM` after all runs; then the session is deleted
//! and both processes stop.
//!
//! Then Backend.AI's kernel runner (`runner`, whose doc says how): `execute` of `pass` through
//! the agent's RPC against the runner's own round trip on the same kernel (p50, p99, what the
//! agent adds; targets ≤ 1 ms and ≤ 2 ms), and create → `RUNNING` with the runner and without.
//! Skipped, said on stderr, without a provisioned runner (`KV_KRUNNER_DIR`, else
//! /var/cache/kernelvisor/krunner; `just bench exec` runs `just krunner` and `just
//! test-image-py` first).
//!
//! Prints a table per part and ends with one JSON line: `{"bytes", "exec_mb_s",
//! "raw_docker_mb_s", "ratio", "agent_peak_mb", "manager_peak_mb", "runner"}`, `runner` being
//! `{"calls", "exec_p50_ms", "exec_p99_ms", "zmq_p50_ms", "zmq_p99_ms", "added_p50_ms",
//! "added_p99_ms", "ratio_p50", "ratio_p99", "create_runner_p50_ms", "create_off_p50_ms",
//! "create_ratio", "load_before", "load_after"}` or null when skipped.

mod common;
#[path = "exec/runner.rs"]
mod runner;

use std::process::Command;

use anyhow::bail;
use common::{median, peak_rss_mb, timed_bytes, BenchCluster};

const IMAGE: &str = "kernelvisor-test:latest";

fn main() -> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_kernelvisor");
    let bytes: u64 = common::env_or("KV_BENCH_EXEC_BYTES", 1u64 << 30);
    let runs: usize = common::env_or("KV_BENCH_RUNS", 3usize).max(1);
    if common::env_or("KV_BENCH_RUNNER_ONLY_CREATES", 0u8) == 1 {
        // The focused run of the runner's create path (runner.rs).
        let dir = runner::krunner_dir().map_err(anyhow::Error::msg)?;
        let figures = runner::run(&dir)?;
        figures.print();
        println!("{}", serde_json::json!({ "runner": figures.json() }));
        return Ok(());
    }
    let c = BenchCluster::start(bin, "exec", IMAGE)?;
    let (sid, kid) = (&c.sid, &c.kid);
    let cmd = format!("yes abcdefghij | head -c {bytes}");

    let (mut raw, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..runs {
        let mut docker = Command::new("docker");
        docker.args(["exec", &format!("kernel.{kid}"), "sh", "-c", &cmd]);
        let (n, secs) = timed_bytes(docker)?;
        if n != bytes {
            bail!("raw docker exec gave {n} bytes, not {bytes}");
        }
        raw.push(n as f64 / 1e6 / secs);
        let mut ctl = c.ctl(bin);
        ctl.args(["session", "exec", sid, &cmd]);
        let (n, secs) = timed_bytes(ctl)?;
        if n != bytes {
            bail!("ctl session exec gave {n} bytes, not {bytes}");
        }
        ours.push(n as f64 / 1e6 / secs);
    }
    let (raw_mb_s, exec_mb_s) = (median(raw.clone()), median(ours.clone()));
    let (agent_peak, manager_peak) = (peak_rss_mb(c.agent.id()), peak_rss_mb(c.manager.id()));
    c.stop();

    println!(
        "exec throughput, {} MiB of `yes abcdefghij`, median of {runs} runs each",
        bytes >> 20
    );
    println!("{:<22} {:>10} {:>30}", "path", "MB/s", "runs (MB/s)");
    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "{:<22} {:>10.0} {:>30}",
        "raw docker exec",
        raw_mb_s,
        fmt(&raw)
    );
    println!(
        "{:<22} {:>10.0} {:>30}",
        "ctl session exec",
        exec_mb_s,
        fmt(&ours)
    );
    println!("{:<22} {:>10.2}", "ratio (ctl / raw)", exec_mb_s / raw_mb_s);
    println!("{:<22} {:>10.1}", "agent peak RSS (MB)", agent_peak);
    println!("{:<22} {:>10.1}", "manager peak RSS (MB)", manager_peak);

    let runner = match runner::krunner_dir() {
        Ok(dir) => {
            let figures = runner::run(&dir)?;
            figures.print();
            Some(figures.json())
        }
        Err(why) => {
            eprintln!("SKIPPED the kernel runner rows: {why}");
            None
        }
    };
    println!(
        "{}",
        serde_json::json!({"bytes": bytes, "exec_mb_s": (exec_mb_s * 10.0).round() / 10.0, "raw_docker_mb_s": (raw_mb_s * 10.0).round() / 10.0,
            "ratio": (exec_mb_s / raw_mb_s * 100.0).round() / 100.0, "agent_peak_mb": (agent_peak * 10.0).round() / 10.0, "manager_peak_mb": (manager_peak * 10.0).round() / 10.0,
            "runner": runner})
    );
    Ok(())
}

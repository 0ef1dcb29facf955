//! `just bench files`: file transfer throughput of `kernelvisor ctl session cp` against raw
//! `docker cp`, both ways, and the agent's and the manager's peak memory.
//!
//! One manager and one agent process (`common::BenchCluster`: release binary, CURVE, SQLite, the
//! local Docker engine) and one session on the test image. A local file of N pseudo-random bytes
//! (N = `KV_BENCH_FILE_BYTES`, default 256 MiB) is moved `KV_BENCH_RUNS` times (default 3) each
//! way, alternating:
//! - `docker cp`: `docker cp FILE kernel.<id>:/home/work/raw.bin` and back (the engine's archive
//!   API, tar made and read by the docker CLI);
//! - `ctl session cp`: `kernelvisor ctl session cp FILE SID:ours.bin` and back (as the manager's
//!   bootstrap admin key, `KERNELVISOR_TOKEN`): HTTP → manager → chunks over CurveZMQ →
//!   agent → the file in the kernel's filesystem, through the container's root
//!   (`src/agent/files/direct.rs`; the engine's archive API only where that is unavailable).
//!
//! Each figure is the median of its runs, in MB/s (10^6 bytes); every copy back is checked to
//! equal the original (SHA-256). Peak RSS is the processes' `VmHWM` after all runs. Prints a table
//! and ends with one JSON line: `{"bytes", "upload_mb_s", "raw_upload_mb_s", "upload_ratio",
//! "download_mb_s", "raw_download_mb_s", "download_ratio", "agent_peak_mb", "manager_peak_mb"}`.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::bail;
use common::{median, peak_rss_mb, BenchCluster};
use sha2::{Digest, Sha256};

const IMAGE: &str = "kernelvisor-test:latest";

/// Runs `cmd` to success; its seconds.
fn timed(mut cmd: Command) -> anyhow::Result<f64> {
    let start = Instant::now();
    let status = cmd.stdout(Stdio::null()).status()?;
    let secs = start.elapsed().as_secs_f64();
    if !status.success() {
        bail!("{cmd:?} exited with {status}");
    }
    Ok(secs)
}

fn sha256(path: &Path) -> anyhow::Result<Vec<u8>> {
    let mut h = Sha256::new();
    std::io::copy(&mut std::fs::File::open(path)?, &mut h)?;
    Ok(h.finalize().to_vec())
}

/// Writes `bytes` pseudo-random bytes (xorshift64*) to `path`.
fn write_noise(path: &Path, bytes: u64) -> anyhow::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut left = bytes;
    let mut block = vec![0u8; 1 << 16];
    while left > 0 {
        for chunk in block.chunks_mut(8) {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            chunk.copy_from_slice(&state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])?;
        left -= n as u64;
    }
    f.flush()?;
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_kernelvisor");
    let bytes: u64 = common::env_or("KV_BENCH_FILE_BYTES", 256u64 << 20);
    let runs: usize = common::env_or("KV_BENCH_RUNS", 3usize).max(1);
    let c = BenchCluster::start(bin, "files", IMAGE)?;
    let work = tempfile::Builder::new()
        .prefix("kv-bench-files-")
        .tempdir()?;
    let src = work.path().join("src.bin");
    write_noise(&src, bytes)?;
    let want = sha256(&src)?;
    let container = format!("kernel.{}", c.kid);
    let mb_s = |secs: f64| bytes as f64 / 1e6 / secs;

    let (mut raw_up, mut raw_down, mut up, mut down) = (vec![], vec![], vec![], vec![]);
    for i in 0..runs {
        let back = work.path().join(format!("raw-{i}.bin"));
        let mut cmd = Command::new("docker");
        cmd.arg("cp")
            .arg(&src)
            .arg(format!("{container}:/home/work/raw.bin"));
        raw_up.push(mb_s(timed(cmd)?));
        let mut cmd = Command::new("docker");
        cmd.arg("cp")
            .arg(format!("{container}:/home/work/raw.bin"))
            .arg(&back);
        raw_down.push(mb_s(timed(cmd)?));
        if sha256(&back)? != want {
            bail!("docker cp gave other bytes back");
        }
        std::fs::remove_file(&back)?;

        let back = work.path().join(format!("ours-{i}.bin"));
        let mut cmd = c.ctl(bin);
        cmd.args(["session", "cp"])
            .arg(&src)
            .arg(format!("{}:ours.bin", c.sid));
        up.push(mb_s(timed(cmd)?));
        let mut cmd = c.ctl(bin);
        cmd.args(["session", "cp"])
            .arg(format!("{}:ours.bin", c.sid))
            .arg(&back);
        down.push(mb_s(timed(cmd)?));
        if sha256(&back)? != want {
            bail!("ctl session cp gave other bytes back");
        }
        std::fs::remove_file(&back)?;
    }
    let (agent_peak, manager_peak) = (peak_rss_mb(c.agent.id()), peak_rss_mb(c.manager.id()));
    c.finish();

    let fmt = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{x:.0}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (ru, rd, u, d) = (
        median(raw_up.clone()),
        median(raw_down.clone()),
        median(up.clone()),
        median(down.clone()),
    );
    println!(
        "file transfer, {} MiB of pseudo-random bytes, median of {runs} runs each",
        bytes >> 20
    );
    println!("{:<28} {:>10} {:>24}", "path", "MB/s", "runs (MB/s)");
    for (name, m, v) in [
        ("docker cp (upload)", ru, &raw_up),
        ("ctl session cp (upload)", u, &up),
        ("docker cp (download)", rd, &raw_down),
        ("ctl session cp (download)", d, &down),
    ] {
        println!("{name:<28} {m:>10.0} {:>24}", fmt(v));
    }
    println!("{:<28} {:>10.2}", "upload ratio (ctl / docker)", u / ru);
    println!("{:<28} {:>10.2}", "download ratio (ctl / docker)", d / rd);
    println!("{:<28} {:>10.1}", "agent peak RSS (MB)", agent_peak);
    println!("{:<28} {:>10.1}", "manager peak RSS (MB)", manager_peak);
    let r1 = |x: f64| (x * 10.0).round() / 10.0;
    let r2 = |x: f64| (x * 100.0).round() / 100.0;
    println!(
        "{}",
        serde_json::json!({"bytes": bytes, "upload_mb_s": r1(u), "raw_upload_mb_s": r1(ru), "upload_ratio": r2(u / ru),
            "download_mb_s": r1(d), "raw_download_mb_s": r1(rd), "download_ratio": r2(d / rd),
            "agent_peak_mb": r1(agent_peak), "manager_peak_mb": r1(manager_peak)})
    );
    Ok(())
}

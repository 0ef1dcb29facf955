//! `just bench exec`: end-to-end output throughput of `kernelvisor ctl session exec` against raw
//! `docker exec`, and the agent's and the manager's peak memory.
//!
//! One manager and one agent process (the release `kernelvisor` binary, CURVE on both channels,
//! SQLite, the local Docker engine) and one session on the test image. The same command,
//! `yes abcdefghij | head -c N` (N = `KV_BENCH_EXEC_BYTES`, default 1 GiB), runs
//! `KV_BENCH_RUNS` times (default 3) each way, alternating:
//! - `raw docker exec`: `docker exec <container> sh -c CMD`, stdout read by this process;
//! - `ctl session exec`: `kernelvisor ctl session exec SID CMD`, stdout read by this process:
//!   the output goes agent (exec stream → bounded buffer) → RPC over CurveZMQ → manager → HTTP
//!   → ctl, in `continue` rounds of at most `exec-buffer-size` (1 MiB).
//!
//! Each way's figure is the median of its runs, in MB/s (10^6 bytes); the bytes are counted and
//! must equal N. Peak RSS is the processes' `VmHWM` after all runs. Prints a table and ends with
//! one JSON line: `{"bytes", "exec_mb_s", "raw_docker_mb_s", "ratio", "agent_peak_mb", "manager_peak_mb"}`.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

const ACCESS_KEY: &str = "AKBENCHEXEC";
const IMAGE: &str = "kernelvisor-test:latest";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Spawns `kernelvisor <args>` logging to `log`, killed when this process dies.
fn spawn(bin: &str, args: &[&str], log: &Path) -> anyhow::Result<Child> {
    let out = std::fs::File::create(log)?;
    let mut cmd = Command::new(bin);
    cmd.args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: prctl is async-signal-safe; the child dies with this process even on SIGKILL.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    cmd.spawn().with_context(|| format!("spawn {bin} {args:?}"))
}

fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

fn get(url: &str) -> Option<serde_json::Value> {
    ureq::get(url)
        .timeout(Duration::from_secs(5))
        .call()
        .ok()?
        .into_json()
        .ok()
}

/// Runs `cmd`, reads its stdout to the end; (bytes, seconds).
fn timed_bytes(mut cmd: Command) -> anyhow::Result<(u64, f64)> {
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let mut out = child.stdout.take().expect("piped");
    let (mut n, mut buf) = (0u64, vec![0u8; 1 << 17]);
    loop {
        let k = out.read(&mut buf)?;
        if k == 0 {
            break;
        }
        n += k as u64;
    }
    let status = child.wait()?;
    let secs = start.elapsed().as_secs_f64();
    if !status.success() {
        bail!("{cmd:?} exited with {status}");
    }
    Ok((n, secs))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_kernelvisor");
    let bytes: u64 = env_or("KV_BENCH_EXEC_BYTES", 1u64 << 30);
    let runs: usize = env_or("KV_BENCH_RUNS", 3usize).max(1);
    let dir = tempfile::Builder::new()
        .prefix("kv-bench-exec-")
        .tempdir()?;
    let d = dir.path();
    for name in ["manager", "agent"] {
        let ok = Command::new(bin)
            .args(["keygen", name, "--dir"])
            .arg(d.join("keys"))
            .stdout(Stdio::null())
            .status()?
            .success();
        if !ok {
            bail!("keygen {name} failed");
        }
    }
    std::fs::create_dir_all(d.join("agent-keys"))?;
    std::fs::copy(
        d.join("keys/agent.key"),
        d.join("agent-keys/bench-exec-agent.key"),
    )?;

    let (intake, api_port, rpc, metrics) = (free_port()?, free_port()?, free_port()?, free_port()?);
    let dd = d.display();
    std::fs::write(
        d.join("manager.toml"),
        format!(
            "[manager]\nrpc-keypair = \"{dd}/keys/manager.key_secret\"\nevent-listen-addr = {{ host = \"127.0.0.1\", port = {intake} }}\n\
             agent-keys-dir = \"{dd}/agent-keys\"\nheartbeat-interval = 1\nheartbeat-timeout = 10\nstartup-grace = 2.5\n\n\
             [store]\nurl = \"sqlite://{dd}/manager.db\"\n\n[api]\nlisten-addr = {{ host = \"127.0.0.1\", port = {api_port} }}\n\n\
             [[access-keys]]\naccess-key = \"{ACCESS_KEY}\"\n\n[logging]\nlevel = \"warn\"\n"
        ),
    )?;
    std::fs::write(
        d.join("agent.toml"),
        format!(
            "[agent]\nid = \"bench-exec-agent\"\nrpc-listen-addr = {{ host = \"127.0.0.1\", port = {rpc} }}\nservice-addr = {{ host = \"127.0.0.1\", port = {metrics} }}\n\
             var-base-path = \"{dd}/var\"\nrpc-auth-manager-public-key = \"{dd}/keys/manager.key\"\nrpc-auth-agent-keypair = \"{dd}/keys/agent.key_secret\"\n\n\
             [container]\nport-range = [33500, 33519]\nbind-host = \"127.0.0.1\"\nscratch-root = \"{dd}/scratches\"\n\n\
             [resource]\nreserved-cpu = 0\nreserved-mem = 0\n\n\
             [manager]\nevent-addr = {{ host = \"127.0.0.1\", port = {intake} }}\nheartbeat-interval = 1\n\n[logging]\nlevel = \"warn\"\n"
        ),
    )?;
    let manager = spawn(
        bin,
        &["manager", "--config", &format!("{dd}/manager.toml")],
        &d.join("manager.log"),
    )?;
    let agent = spawn(
        bin,
        &["agent", "--config", &format!("{dd}/agent.toml")],
        &d.join("agent.log"),
    )?;
    let api = format!("http://127.0.0.1:{api_port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let alive = get(&format!("{api}/v1/agents")).is_some_and(|v| {
            v["agents"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|x| x["status"] == "ALIVE" && !x["last_heartbeat"].is_null())
            })
        });
        if alive && get(&format!("{api}/v1/sessions")).is_some() {
            break;
        }
        if Instant::now() > deadline {
            let tail = |name: &str| {
                std::fs::read_to_string(d.join(name))
                    .unwrap_or_default()
                    .lines()
                    .rev()
                    .take(15)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            bail!(
                "the agent did not become ALIVE\n--- manager.log ---\n{}\n--- agent.log ---\n{}",
                tail("manager.log"),
                tail("agent.log")
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let created: serde_json::Value = ureq::post(&format!("{api}/v1/sessions"))
        .send_json(serde_json::json!({"image": IMAGE, "resource_slots": {"cpu": 1, "mem": "256m"}, "access_key": ACCESS_KEY}))
        .context("create a session (is `just test-image` built?)")?
        .into_json()?;
    let (sid, kid) = (
        created["session_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        created["kernel_id"].as_str().unwrap_or_default().to_owned(),
    );
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
        let mut ctl = Command::new(bin);
        ctl.args(["ctl", "--api", &api, "session", "exec", &sid, &cmd]);
        let (n, secs) = timed_bytes(ctl)?;
        if n != bytes {
            bail!("ctl session exec gave {n} bytes, not {bytes}");
        }
        ours.push(n as f64 / 1e6 / secs);
    }
    let (raw_mb_s, exec_mb_s) = (median(raw.clone()), median(ours.clone()));
    let (agent_peak, manager_peak) = (peak_rss_mb(agent.id()), peak_rss_mb(manager.id()));
    let _ = ureq::delete(&format!("{api}/v1/sessions/{sid}")).call();

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
    println!(
        "{}",
        serde_json::json!({"bytes": bytes, "exec_mb_s": (exec_mb_s * 10.0).round() / 10.0, "raw_docker_mb_s": (raw_mb_s * 10.0).round() / 10.0,
            "ratio": (exec_mb_s / raw_mb_s * 100.0).round() / 100.0, "agent_peak_mb": (agent_peak * 10.0).round() / 10.0, "manager_peak_mb": (manager_peak * 10.0).round() / 10.0})
    );
    Ok(())
}

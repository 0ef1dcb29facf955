//! What the end-to-end benches share: a manager and an agent process (the release `kernelvisor`
//! binary, CURVE on both channels, SQLite, the local Docker engine) with one session. The API
//! wants a bearer token on every route but `GET /health`: the benches act as the bootstrap admin
//! key, whose secret the manager writes to `[api] admin-token-file` (in the bench's directory).
#![allow(dead_code)]

pub mod fleet;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// A manager and an agent with one RUNNING session; both processes die with the bench.
pub struct BenchCluster {
    /// Config, keys, logs and state.
    pub dir: tempfile::TempDir,
    /// The manager process.
    pub manager: Child,
    /// The agent process.
    pub agent: Child,
    /// `http://127.0.0.1:<port>`.
    pub api: String,
    /// The bootstrap admin key's secret, sent as `Authorization: Bearer …` (and given to every
    /// `ctl` as `KERNELVISOR_TOKEN`).
    pub token: String,
    /// The session.
    pub sid: String,
    /// Its kernel (container `kernel.<kid>`).
    pub kid: String,
}

impl BenchCluster {
    /// Starts both processes (`name` prefixes the directory and the agent id), waits for the
    /// manager's `/health`, reads its admin token, waits for the agent to be ALIVE, and creates
    /// a session on `image` with 1 core and 256 MiB.
    pub fn start(bin: &str, name: &str, image: &str) -> anyhow::Result<BenchCluster> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("kv-bench-{name}-"))
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
            d.join("agent-keys/bench-agent.key"),
        )?;

        let (intake, api_port, rpc, metrics) =
            (free_port()?, free_port()?, free_port()?, free_port()?);
        let dd = d.display();
        std::fs::write(
        d.join("manager.toml"),
        format!(
            "[manager]\nrpc-keypair = \"{dd}/keys/manager.key_secret\"\nevent-listen-addr = {{ host = \"127.0.0.1\", port = {intake} }}\n\
             agent-keys-dir = \"{dd}/agent-keys\"\nheartbeat-interval = 1\nheartbeat-timeout = 10\nstartup-grace = 2.5\n\n\
             [store]\nurl = \"sqlite://{dd}/manager.db\"\n\n[api]\nlisten-addr = {{ host = \"127.0.0.1\", port = {api_port} }}\n\
             admin-token-file = \"{dd}/admin-token\"\n\n[logging]\nlevel = \"warn\"\n"
        ),
    )?;
        std::fs::write(
        d.join("agent.toml"),
        format!(
            "[agent]\nid = \"bench-agent\"\nrpc-listen-addr = {{ host = \"127.0.0.1\", port = {rpc} }}\nservice-addr = {{ host = \"127.0.0.1\", port = {metrics} }}\n\
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
        let mut found = None;
        let token = loop {
            // The token file is written before the API listens, so `/health` means it is there.
            if found.is_none() && get(&format!("{api}/health"), None).is_some() {
                found = Some(read_token(&d.join("admin-token"))?);
            }
            if let Some(t) = found.as_deref() {
                let alive = get(&format!("{api}/v1/agents"), Some(t)).is_some_and(|v| {
                    v["agents"].as_array().is_some_and(|a| {
                        a.iter()
                            .any(|x| x["status"] == "ALIVE" && !x["last_heartbeat"].is_null())
                    })
                });
                if alive && get(&format!("{api}/v1/sessions"), Some(t)).is_some() {
                    break t.to_owned();
                }
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
                    "{}\n--- manager.log ---\n{}\n--- agent.log ---\n{}",
                    if found.is_none() {
                        "the manager's /health did not answer"
                    } else {
                        "the agent did not become ALIVE"
                    },
                    tail("manager.log"),
                    tail("agent.log")
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let created: serde_json::Value = ureq::post(&format!("{api}/v1/sessions"))
            .set("Authorization", &format!("Bearer {token}"))
            .send_json(
                serde_json::json!({"image": image, "resource_slots": {"cpu": 1, "mem": "256m"}}),
            )
            .context("create a session (is `just test-image` built?)")?
            .into_json()?;
        let (sid, kid) = (
            created["session_id"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            created["kernel_id"].as_str().unwrap_or_default().to_owned(),
        );
        Ok(BenchCluster {
            manager,
            agent,
            api,
            token,
            sid,
            kid,
            dir,
        })
    }

    /// `kernelvisor ctl --api <api>` with `KERNELVISOR_TOKEN` set to the admin token; the
    /// caller adds the subcommand.
    pub fn ctl(&self, bin: &str) -> Command {
        let mut cmd = Command::new(bin);
        cmd.args(["ctl", "--api", &self.api])
            .env("KERNELVISOR_TOKEN", &self.token);
        cmd
    }

    /// Deletes the session.
    pub fn finish(&self) {
        let _ = ureq::delete(&format!("{}/v1/sessions/{}", self.api, self.sid))
            .set("Authorization", &format!("Bearer {}", self.token))
            .call();
    }

    /// Deletes the session, waits (up to 30 s) until its container is gone, then kills both
    /// processes: what the bench measures next runs without them.
    pub fn stop(mut self) {
        self.finish();
        let deadline = Instant::now() + Duration::from_secs(30);
        let container = format!("kernel.{}", self.kid);
        while Instant::now() < deadline {
            let exists = Command::new("docker")
                .args(["inspect", "-f", "{{.Id}}", &container])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !exists {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        for child in [&mut self.agent, &mut self.manager] {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The secret in a manager's `[api] admin-token-file` (one line).
pub fn read_token(path: &Path) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(path)
        .with_context(|| format!("read the manager's admin token {}", path.display()))?
        .trim()
        .to_owned();
    if token.is_empty() {
        bail!("{}: empty admin token", path.display());
    }
    Ok(token)
}

pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(default)
}

pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Spawns `kernelvisor <args>` logging to `log`, killed when this process dies.
pub fn spawn(bin: &str, args: &[&str], log: &Path) -> anyhow::Result<Child> {
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

pub fn peak_rss_mb(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0.0);
    kb / 1024.0
}

/// `GET url` (with `Authorization: Bearer <token>` when given): its JSON body, `None` on any
/// failure.
pub fn get(url: &str, token: Option<&str>) -> Option<serde_json::Value> {
    let mut req = ureq::get(url).timeout(Duration::from_secs(5));
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    req.call().ok()?.into_json().ok()
}

/// Runs `cmd`, reads its stdout to the end; (bytes, seconds).
pub fn timed_bytes(mut cmd: Command) -> anyhow::Result<(u64, f64)> {
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

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

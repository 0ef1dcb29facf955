//! Compatibility with the real Backend.AI 26.x agent client: the agent
//! client of `backend.ai-manager` 26.9.6 (`AgentRPCCache` → `AgentClientPool` → `AgentClient` →
//! callosum, CURVE on, `ai.backend.common.msgpack`) drives one kernel's whole life on an agent
//! process on the real Docker engine, with `create_kernels` arguments built by the manager's own
//! `SessionLauncher`; and saves the kernel as an image (`commit`, `get_commit_status`), pushes
//! it to a real registry (`push_image`; the test checks the registry lists it) and purges images
//! (`purge_images`), each reply checked against upstream's shape. The Python side is
//! `tests/bai_compat/driver.py`, run with the venv of the Debian trixie root
//! `scripts/bai-compat-env.sh` builds (`just bai-env`; Backend.AI 26.x needs Python 3.13):
//! `chroot $KV_BAI_ROOT /opt/bai/bin/python driver.py ...`. The root shares the host's network
//! namespace, so the driver reaches the agent (and the agent's engine the registry) on
//! 127.0.0.1. The registry is Debian's `docker-registry` (`just registry`, `KV_REGISTRY_SERVER`).
//!
//! `KV_BAI_ROOT` names the root; `just test-all` always sets it. Without it the test is skipped
//! (said on stderr). `KV_BAI_WRITE_FIXTURES=DIR` (relative to the crate root, e.g.
//! `tests/fixtures/bai/calls`) also copies the real `packb` bytes of every request body the
//! client sent (`<method>.msgpack`, with a readable `<method>.json`) into `DIR`.
//! `KV_BAI_DIAGNOSE=1` makes the driver call `create_kernels` / `restart_kernel` /
//! `destroy_kernel` again without their pickled values when they fail (extra steps
//! `<name>:without_pickles`), so one run also shows what fails after them; the test still fails.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::agent::{docker, read, run_id, spawn_agent_process, AgentFixture, TEST_IMAGE};
use common::bai::{is_root, tail, wait_for_port, KillOnDrop, RemoveOnDrop};
use common::registry::{TestRegistry, PASSWORD, USER};
use common::Keys;

/// The steps the driver reports, in order; each must be `ok`.
const STEPS: &[&str] = &[
    "ping",
    "health",
    "gather_hwinfo",
    "check_and_pull",
    "create_kernels",
    "check_running",
    "remove_find",
    "execute",
    "upload_file",
    "download_single",
    "list_files",
    "get_logs",
    "interrupt_kernel",
    "sync_kernel_registry",
    "scan_gpu_alloc_map",
    "commit",
    "get_commit_status",
    "push_image",
    "purge_images",
    "restart_kernel",
    "check_running_after_restart",
    "destroy_kernel",
    "check_running_after_destroy",
];

/// The whole driver run may take this long (each of its steps has its own, shorter, limit).
const DRIVER_LIMIT: Duration = Duration::from_secs(600);

/// Container ids (running or not) labelled as kernel `kernel_id`.
fn kernel_containers(kernel_id: &str) -> Vec<String> {
    docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=ai.backend.kernel-id={kernel_id}"),
    ])
    .lines()
    .map(str::to_owned)
    .collect()
}

/// The driver's `--host-hook` pause: removes the image's `find` from the kernel's container (as
/// root, with `docker exec`), so `list_files` is shown to work without it; answers the driver.
fn remove_find(kernel_id: &str, stdin: &mut ChildStdin) {
    let answer = match kernel_containers(kernel_id).first() {
        None => format!("no container labelled ai.backend.kernel-id={kernel_id}"),
        Some(cid) => {
            let out = Command::new("docker")
                .args(["exec", "-u", "0", cid, "rm", "-f", "/bin/find"])
                .output()
                .expect("docker CLI");
            let gone = Command::new("docker")
                .args(["exec", cid, "test", "-e", "/bin/find"])
                .status()
                .map(|s| !s.success())
                .unwrap_or(false);
            if out.status.success() && gone {
                "ok".to_owned()
            } else {
                format!(
                    "docker exec rm /bin/find: {} {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                )
            }
        }
    };
    let _ = writeln!(stdin, "{}", answer.replace('\n', " "));
    let _ = stdin.flush();
}

fn copy_dir(from: &Path, to: &Path) -> Vec<String> {
    std::fs::create_dir_all(to).unwrap();
    let mut names = Vec::new();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    names
}

/// Removes the local images of the test registry `host` on drop (what `commit` made, should
/// the driver's `purge_images` not have run).
struct RemoveRegistryImages(String);

impl Drop for RemoveRegistryImages {
    fn drop(&mut self) {
        let ids = docker(&[
            "images",
            "-q",
            "--filter",
            &format!("reference={}/*/*", self.0),
        ]);
        for id in ids.lines() {
            let _ = Command::new("docker").args(["rmi", "-f", id]).output();
        }
    }
}

/// Whether the registry lists `canonical`'s tag (`GET /v2/<repo>/tags/list`, basic auth).
fn registry_has(registry: &TestRegistry, canonical: &str) -> Result<(), String> {
    use base64::Engine as _;
    let rest = canonical
        .strip_prefix(&format!("{}/", registry.host))
        .ok_or_else(|| format!("{canonical} is not in {}", registry.host))?;
    let (repo, tag) = rest.rsplit_once(':').unwrap_or((rest, "latest"));
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    let body: serde_json::Value = ureq::get(&format!("{}/v2/{repo}/tags/list", registry.url()))
        .set("Authorization", &format!("Basic {basic}"))
        .call()
        .map_err(|e| format!("GET /v2/{repo}/tags/list: {e}"))?
        .into_json()
        .map_err(|e| e.to_string())?;
    let listed = body["tags"]
        .as_array()
        .is_some_and(|t| t.iter().any(|x| x == tag));
    listed
        .then_some(())
        .ok_or_else(|| format!("the registry lists {body} for {repo}, not tag {tag}"))
}

#[test]
fn the_real_backend_ai_26_agent_client_drives_a_kernel_lifecycle() {
    let Some(root) = std::env::var_os("KV_BAI_ROOT").map(PathBuf::from) else {
        eprintln!(
            "SKIPPED bai_compat: KV_BAI_ROOT is not set. `just test-all` sets it (after `just \
             bai-env` builds the Backend.AI 26.9.6 client environment); by hand: \
             KV_BAI_ROOT=$(scripts/bai-compat-env.sh) cargo test --test it bai_compat::"
        );
        return;
    };
    let python = root.join("opt/bai/bin/python");
    assert!(
        python.exists(),
        "KV_BAI_ROOT={} has no /opt/bai/bin/python: run `just bai-env` (scripts/bai-compat-env.sh)",
        root.display()
    );

    // A registry for `commit` / `push_image` (basic auth).
    let registry = TestRegistry::start();
    let _committed = RemoveRegistryImages(registry.host.clone());

    // An agent process, CURVE on, on the real engine.
    let fx = AgentFixture::new("bai-compat", 34_000, 8);
    let keys = Keys::new();
    keys.write(fx.dir.path());
    let d = fx.dir.path().display();
    let config = fx.dir.path().join("agent.toml");
    std::fs::write(
        &config,
        fx.config_toml(&format!(
            "rpc-auth-manager-public-key = \"{d}/manager.key\"\nrpc-auth-agent-keypair = \"{d}/agent.key_secret\"\n"
        )),
    )
    .unwrap();
    let agent_log = fx.dir.path().join("agent.log");
    let mut agent = KillOnDrop(spawn_agent_process(&fx, &config));
    wait_for_port(fx.rpc_port, &mut agent.0, &agent_log);

    // The driver and the manager's key files, inside the root.
    let inner = format!("/tmp/kv-bai-compat-{}", run_id());
    let host_dir = root.join(inner.trim_start_matches('/'));
    std::fs::create_dir_all(&host_dir).unwrap();
    let _cleanup = RemoveOnDrop(host_dir.clone());
    let driver_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bai_compat/driver.py");
    std::fs::copy(&driver_src, host_dir.join("driver.py")).unwrap();
    for f in ["manager.key", "manager.key_secret", "agent.key"] {
        std::fs::copy(fx.dir.path().join(f), host_dir.join(f)).unwrap();
    }

    let session_id = uuid::Uuid::new_v4().to_string();
    let kernel_id = uuid::Uuid::new_v4().to_string();
    let digest = docker(&["image", "inspect", "-f", "{{.Id}}", TEST_IMAGE]);
    assert!(
        digest.starts_with("sha256:"),
        "no image {TEST_IMAGE}: run `just test-image`"
    );
    let labels = docker(&[
        "image",
        "inspect",
        "-f",
        "{{json .Config.Labels}}",
        TEST_IMAGE,
    ]);

    let mut cmd = if is_root() {
        Command::new("chroot")
    } else {
        let mut c = Command::new("sudo");
        c.args(["-n", "chroot"]);
        c
    };
    let driver_stderr = fx.dir.path().join("driver.stderr");
    cmd.arg(&root)
        .arg("/opt/bai/bin/python")
        .arg(format!("{inner}/driver.py"))
        .args(["--addr", &format!("tcp://127.0.0.1:{}", fx.rpc_port)])
        .args(["--agent-id", &fx.agent_id])
        .args(["--manager-keypair", &format!("{inner}/manager.key_secret")])
        .args(["--agent-public-key", &format!("{inner}/agent.key")])
        .args(["--session-id", &session_id, "--kernel-id", &kernel_id])
        .args(["--image", TEST_IMAGE, "--image-digest", &digest])
        .args(["--image-labels", &labels])
        .arg("--host-hook")
        .args(["--registry", &registry.host, "--registry-user", USER])
        .env("KV_REGISTRY_PASSWORD", PASSWORD)
        .args(["--write-fixtures", &format!("{inner}/fixtures")])
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::piped());
    if std::env::var_os("KV_BAI_DIAGNOSE").is_some() {
        cmd.arg("--diagnose-without-pickles");
    }
    cmd.stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&driver_stderr).unwrap()));
    let mut driver = KillOnDrop(cmd.spawn().expect("chroot the Backend.AI driver"));
    let mut stdin = driver.0.stdin.take().unwrap();
    let stdout = driver.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });

    // Read its lines until it ends, answering its pause.
    let start = Instant::now();
    let mut lines: Vec<String> = Vec::new();
    let mut timed_out = false;
    loop {
        let left = DRIVER_LIMIT.saturating_sub(start.elapsed());
        if left.is_zero() {
            timed_out = true;
            break;
        }
        match rx.recv_timeout(left) {
            Ok(line) => {
                eprintln!("driver: {line}");
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
                    if v["pause"] == "remove_find" {
                        remove_find(&kernel_id, &mut stdin);
                    }
                }
                lines.push(line);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                timed_out = true;
                break;
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    drop(stdin);
    if timed_out {
        let _ = driver.0.kill();
    }
    let status = driver.0.wait().expect("the driver's exit status");

    // What the driver packed, kept as fixtures when asked.
    let fixtures = host_dir.join("fixtures");
    if let Some(dest) = std::env::var_os("KV_BAI_WRITE_FIXTURES").filter(|_| fixtures.is_dir()) {
        let dest = Path::new(env!("CARGO_MANIFEST_DIR")).join(dest);
        let names = copy_dir(&fixtures, &dest);
        eprintln!(
            "bai_compat: wrote {} fixture files to {}",
            names.len(),
            dest.display()
        );
    }

    let left = kernel_containers(&kernel_id);

    // Every step ok, none missing, nothing of the kernel left on the engine.
    let mut problems: Vec<String> = Vec::new();
    let reported: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("step").is_some())
        .collect();
    for step in STEPS {
        match reported.iter().find(|v| v["step"] == *step) {
            None => problems.push(format!("{step}: not reported")),
            Some(v) if v["ok"] != true => problems.push(format!("{step}: FAILED: {}", v["error"])),
            Some(_) => {}
        }
    }
    for v in &reported {
        let name = v["step"].as_str().unwrap_or_default();
        if !STEPS.contains(&name) && v["ok"] != true {
            problems.push(format!("{name}: FAILED: {}", v["error"]));
        }
    }
    if timed_out {
        problems.push(format!(
            "the driver did not finish in {} s",
            DRIVER_LIMIT.as_secs()
        ));
    }
    if !status.success() {
        problems.push(format!("the driver exited with {status}"));
    }
    if !left.is_empty() {
        problems.push(format!(
            "containers of kernel {kernel_id} left after destroy_kernel: {left:?}"
        ));
    }
    // What push_image pushed is in the registry.
    let pushed: Vec<String> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["pushed"].as_str().map(str::to_owned))
        .collect();
    for canonical in &pushed {
        if let Err(e) = registry_has(&registry, canonical) {
            problems.push(format!("push_image: {e}"));
        }
    }
    drop(agent);
    assert!(
        problems.is_empty(),
        "Backend.AI 26.9.6 client against kernelvisor: {} problem(s):\n  {}\n\ndriver output:\n{}\n\n\
         driver stderr (tail):\n{}\n\nagent log (tail):\n{}",
        problems.len(),
        problems.join("\n  "),
        lines.join("\n"),
        tail(&read(&driver_stderr), 40),
        tail(&read(&agent_log), 60),
    );
}

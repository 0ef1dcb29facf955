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
//! A second test drives a kernel that Backend.AI's own kernel runner serves (`[kernel-runner]`
//! on `KV_KRUNNER_DIR`, `just krunner`; the image `kernelvisor-test-py`, `just test-image-py`)
//! the same way (`driver.py --scenario runner`): a persistent Python REPL through the real
//! client's `execute`, `interrupt_kernel`, `get_completions` and the services.
//!
//! `KV_BAI_ROOT` names the root; `just test-all` always sets it. Without it (or, for the runner
//! test, without `KV_KRUNNER_DIR`) a test is skipped (said on stderr).
//! `KV_BAI_WRITE_FIXTURES=DIR` (relative to the crate root, e.g. `tests/fixtures/bai/calls`)
//! also copies the real `packb` bytes of every request body the lifecycle test's client sent
//! (`<method>.msgpack`, with a readable `<method>.json`) into `DIR`.
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

/// The Debian trixie root with the Backend.AI 26.9.6 client (`$KV_BAI_ROOT`), or `None`: the
/// test `test` is skipped (said on stderr).
pub(crate) fn bai_root(test: &str) -> Option<PathBuf> {
    let Some(root) = std::env::var_os("KV_BAI_ROOT").map(PathBuf::from) else {
        eprintln!(
            "SKIPPED {test}: KV_BAI_ROOT is not set. `just test-all` sets it (after `just \
             bai-env` builds the Backend.AI 26.9.6 client environment); by hand: \
             KV_BAI_ROOT=$(scripts/bai-compat-env.sh) cargo test --test it bai_compat::"
        );
        return None;
    };
    assert!(
        root.join("opt/bai/bin/python").exists(),
        "KV_BAI_ROOT={} has no /opt/bai/bin/python: run `just bai-env` (scripts/bai-compat-env.sh)",
        root.display()
    );
    Some(root)
}

/// An agent process, CURVE on, on the real engine.
pub(crate) struct BaiAgent {
    pub(crate) fx: AgentFixture,
    pub(crate) process: KillOnDrop,
    pub(crate) log: PathBuf,
}

/// Starts agent `name` (host ports from `lo`, `range` of them) with `extra` config text after
/// its key settings (further `[agent]` lines, then whole sections), and waits for its RPC port.
pub(crate) fn start_agent(name: &str, lo: u16, range: u16, extra: &str) -> BaiAgent {
    start_agent_edited(name, lo, range, extra, |text| text)
}

/// As [`start_agent`], its config text passed through `edit` first (a key of a section the
/// fixture writes, e.g. `[container] grace-period`).
pub(crate) fn start_agent_edited(
    name: &str,
    lo: u16,
    range: u16,
    extra: &str,
    edit: impl FnOnce(String) -> String,
) -> BaiAgent {
    let fx = AgentFixture::new(name, lo, range);
    let keys = Keys::new();
    keys.write(fx.dir.path());
    let d = fx.dir.path().display();
    let config = fx.dir.path().join("agent.toml");
    std::fs::write(
        &config,
        edit(fx.config_toml(&format!(
            "rpc-auth-manager-public-key = \"{d}/manager.key\"\nrpc-auth-agent-keypair = \"{d}/agent.key_secret\"\n{extra}"
        ))),
    )
    .unwrap();
    let log = fx.dir.path().join("agent.log");
    let mut process = KillOnDrop(spawn_agent_process(&fx, &config));
    wait_for_port(fx.rpc_port, &mut process.0, &log);
    BaiAgent { fx, process, log }
}

/// `image`'s config digest (its Id) and labels (JSON), as the manager's image table holds them;
/// `recipe` builds the image.
pub(crate) fn image_facts(image: &str, recipe: &str) -> (String, String) {
    let digest = docker(&["image", "inspect", "-f", "{{.Id}}", image]);
    assert!(
        digest.starts_with("sha256:"),
        "no image {image}: run `{recipe}`"
    );
    let labels = docker(&["image", "inspect", "-f", "{{json .Config.Labels}}", image]);
    (digest, labels)
}

/// The driver and the manager's key files copied into a directory of the root.
pub(crate) struct DriverFiles {
    /// The directory, as seen inside the root.
    inner: String,
    /// The directory on this host (removed on drop).
    host: RemoveOnDrop,
}

pub(crate) fn driver_files(root: &Path, fx: &AgentFixture) -> DriverFiles {
    let inner = format!("/tmp/kv-bai-compat-{}", run_id());
    let host_dir = root.join(inner.trim_start_matches('/'));
    std::fs::create_dir_all(&host_dir).unwrap();
    let host = RemoveOnDrop(host_dir.clone());
    let driver_src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bai_compat/driver.py");
    std::fs::copy(&driver_src, host_dir.join("driver.py")).unwrap();
    for f in ["manager.key", "manager.key_secret", "agent.key"] {
        std::fs::copy(fx.dir.path().join(f), host_dir.join(f)).unwrap();
    }
    DriverFiles { inner, host }
}

/// `chroot ROOT /opt/bai/bin/python driver.py` with the agent's address and keys, the kernel's
/// ids and the image (`image`, with its digest and labels); the caller adds its own options.
pub(crate) fn driver_command(
    root: &Path,
    files: &DriverFiles,
    agent: &BaiAgent,
    ids: (&str, &str),
    image: (&str, &str, &str),
) -> Command {
    let (session_id, kernel_id) = ids;
    let (image, digest, labels) = image;
    let inner = &files.inner;
    let mut cmd = if is_root() {
        Command::new("chroot")
    } else {
        let mut c = Command::new("sudo");
        c.args(["-n", "chroot"]);
        c
    };
    cmd.arg(root)
        .arg("/opt/bai/bin/python")
        .arg(format!("{inner}/driver.py"))
        .args(["--addr", &format!("tcp://127.0.0.1:{}", agent.fx.rpc_port)])
        .args(["--agent-id", &agent.fx.agent_id])
        .args(["--manager-keypair", &format!("{inner}/manager.key_secret")])
        .args(["--agent-public-key", &format!("{inner}/agent.key")])
        .args(["--session-id", session_id, "--kernel-id", kernel_id])
        .args(["--image", image, "--image-digest", digest])
        .args(["--image-labels", labels])
        .env("PYTHONUNBUFFERED", "1");
    cmd
}

/// What one driver run printed.
pub(crate) struct DriverRun {
    pub(crate) lines: Vec<String>,
    pub(crate) status: std::process::ExitStatus,
    pub(crate) timed_out: bool,
    pub(crate) stderr: PathBuf,
}

/// Runs the driver `cmd` (its stderr to `stderr`) until it ends or `DRIVER_LIMIT` passes, each
/// of its JSON lines also given to `on_line` with its stdin (to answer a pause).
pub(crate) fn run_driver(
    mut cmd: Command,
    stderr: PathBuf,
    mut on_line: impl FnMut(&serde_json::Value, &mut ChildStdin),
) -> DriverRun {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::from(std::fs::File::create(&stderr).unwrap()));
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

    // Read its lines until it ends.
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
                    on_line(&v, &mut stdin);
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
    DriverRun {
        lines,
        status,
        timed_out,
        stderr,
    }
}

impl DriverRun {
    /// The reported steps.
    pub(crate) fn reported(&self) -> Vec<serde_json::Value> {
        self.lines
            .iter()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v.get("step").is_some())
            .collect()
    }

    /// What is wrong: a step of `steps` not reported or not `ok`, any other step not `ok`, the
    /// driver timed out or failed, a container of `kernel_id` left.
    fn problems(&self, steps: &[&str], kernel_id: &str) -> Vec<String> {
        let reported = self.reported();
        let mut problems: Vec<String> = Vec::new();
        for step in steps {
            match reported.iter().find(|v| v["step"] == *step) {
                None => problems.push(format!("{step}: not reported")),
                Some(v) if v["ok"] != true => {
                    problems.push(format!("{step}: FAILED: {}", v["error"]))
                }
                Some(_) => {}
            }
        }
        for v in &reported {
            let name = v["step"].as_str().unwrap_or_default();
            if !steps.contains(&name) && v["ok"] != true {
                problems.push(format!("{name}: FAILED: {}", v["error"]));
            }
        }
        if self.timed_out {
            problems.push(format!(
                "the driver did not finish in {} s",
                DRIVER_LIMIT.as_secs()
            ));
        }
        if !self.status.success() {
            problems.push(format!("the driver exited with {}", self.status));
        }
        let left = kernel_containers(kernel_id);
        if !left.is_empty() {
            problems.push(format!(
                "containers of kernel {kernel_id} left after destroy_kernel: {left:?}"
            ));
        }
        problems
    }

    /// Panics listing `problems` with the driver's output and stderr and the agent's log.
    fn assert_no_problems(&self, problems: &[String], agent_log: &Path) {
        assert!(
            problems.is_empty(),
            "Backend.AI 26.9.6 client against kernelvisor: {} problem(s):\n  {}\n\ndriver output:\n{}\n\n\
             driver stderr (tail):\n{}\n\nagent log (tail):\n{}",
            problems.len(),
            problems.join("\n  "),
            self.lines.join("\n"),
            tail(&read(&self.stderr), 40),
            tail(&read(agent_log), 60),
        );
    }
}

#[test]
fn the_real_backend_ai_26_agent_client_drives_a_kernel_lifecycle() {
    let Some(root) = bai_root("bai_compat") else {
        return;
    };

    // A registry for `commit` / `push_image` (basic auth).
    let registry = TestRegistry::start();
    let _committed = RemoveRegistryImages(registry.host.clone());

    let agent = start_agent("bai-compat", 34_000, 8, "");
    let files = driver_files(&root, &agent.fx);
    let session_id = uuid::Uuid::new_v4().to_string();
    let kernel_id = uuid::Uuid::new_v4().to_string();
    let (digest, labels) = image_facts(TEST_IMAGE, "just test-image");

    let mut cmd = driver_command(
        &root,
        &files,
        &agent,
        (&session_id, &kernel_id),
        (TEST_IMAGE, &digest, &labels),
    );
    cmd.arg("--host-hook")
        .args(["--registry", &registry.host, "--registry-user", USER])
        .env("KV_REGISTRY_PASSWORD", PASSWORD)
        .args(["--write-fixtures", &format!("{}/fixtures", files.inner)]);
    if std::env::var_os("KV_BAI_DIAGNOSE").is_some() {
        cmd.arg("--diagnose-without-pickles");
    }
    // Its pause answered: the image's `find` removed.
    let run = run_driver(
        cmd,
        agent.fx.dir.path().join("driver.stderr"),
        |v, stdin| {
            if v["pause"] == "remove_find" {
                remove_find(&kernel_id, stdin);
            }
        },
    );

    // What the driver packed, kept as fixtures when asked.
    let fixtures = files.host.0.join("fixtures");
    if let Some(dest) = std::env::var_os("KV_BAI_WRITE_FIXTURES").filter(|_| fixtures.is_dir()) {
        let dest = Path::new(env!("CARGO_MANIFEST_DIR")).join(dest);
        let names = copy_dir(&fixtures, &dest);
        eprintln!(
            "bai_compat: wrote {} fixture files to {}",
            names.len(),
            dest.display()
        );
    }

    // Every step ok, none missing, nothing of the kernel left on the engine.
    let mut problems = run.problems(STEPS, &kernel_id);
    // What push_image pushed is in the registry.
    let pushed: Vec<String> = run
        .lines
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["pushed"].as_str().map(str::to_owned))
        .collect();
    for canonical in &pushed {
        if let Err(e) = registry_has(&registry, canonical) {
            problems.push(format!("push_image: {e}"));
        }
    }
    let BaiAgent {
        process,
        log,
        fx: _fx,
    } = agent;
    drop(process);
    run.assert_no_problems(&problems, &log);
}

/// The Python kernel image with upstream's labels (`just test-image-py`).
pub(crate) const PY_IMAGE: &str = "kernelvisor-test-py:latest";

/// The steps of the driver's `--scenario runner`, in order; each must be `ok`.
const RUNNER_STEPS: &[&str] = &[
    "ping",
    "health",
    "gather_hwinfo",
    "check_and_pull",
    "create_kernels",
    "check_running",
    "kernel_uid",
    "query_state",
    "query_error",
    "query_input",
    "query_continuation",
    "interrupt",
    "batch",
    "get_completions",
    "start_service_ttyd",
    "start_service_hello",
    "shutdown_service_hello",
    "start_service_hello_again",
    "destroy_kernel",
    "check_running_after_destroy",
];

/// Backend.AI's own kernel runner (`[kernel-runner]`, `$KV_KRUNNER_DIR`, `just krunner`) in a
/// kernel of `kernelvisor-test-py`, created by the manager's `SessionLauncher` and driven by
/// the real 26.9.6 `AgentClient` as a persistent Python REPL: state across runs, an error,
/// `input()`, continuation, an interrupt that keeps the REPL, batch steps, `get_completions`,
/// the services, then destroyed with nothing left (see `runner_steps` in the driver).
#[test]
fn the_real_backend_ai_26_agent_client_drives_a_runner_kernel() {
    let Some(root) = bai_root("bai_compat (runner)") else {
        return;
    };
    let Ok(krunner) = std::env::var("KV_KRUNNER_DIR") else {
        eprintln!(
            "SKIPPED bai_compat (runner): KV_KRUNNER_DIR is not set (`just test-all` sets it \
             after `just krunner`)"
        );
        return;
    };

    let agent = start_agent(
        "bai-compat-runner",
        36_300,
        16,
        &format!("\n[kernel-runner]\ndir = \"{krunner}\"\nmode = \"auto\"\ninit-timeout = 60\n"),
    );
    let files = driver_files(&root, &agent.fx);
    let session_id = uuid::Uuid::new_v4().to_string();
    let kernel_id = uuid::Uuid::new_v4().to_string();
    let (digest, labels) = image_facts(PY_IMAGE, "just test-image-py");

    let mut cmd = driver_command(
        &root,
        &files,
        &agent,
        (&session_id, &kernel_id),
        (PY_IMAGE, &digest, &labels),
    );
    cmd.args(["--scenario", "runner"]);
    let run = run_driver(cmd, agent.fx.dir.path().join("driver.stderr"), |_, _| {});

    let problems = run.problems(RUNNER_STEPS, &kernel_id);
    let BaiAgent {
        process,
        log,
        fx: _fx,
    } = agent;
    drop(process);
    run.assert_no_problems(&problems, &log);
}

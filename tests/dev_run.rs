//! `just run` as a person runs it (issue 26): `scripts/dev-run.sh … 2>&1 | tee run.log` typed into
//! an interactive shell on a pseudo-terminal, then Ctrl+C. Within 10 s both processes are gone,
//! the demo session's container is removed and the ports are free. A pair an earlier run left
//! (its script killed) is stopped by the next start, which says so; a port held by something
//! else is named and nothing starts.
//!
//! Each test runs the script in a copy of `scripts/` and `configs/dev/` in a temporary root, with
//! free ports, so it never meets a developer's own `just run`.

mod common;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::agent::free_port;
use common::pty::Pty;

/// A copy of the dev setup on free ports.
struct DevRoot {
    dir: tempfile::TempDir,
    api: u16,
    ports: Vec<u16>,
}

impl DevRoot {
    fn new() -> DevRoot {
        let dir = tempfile::tempdir().unwrap();
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        std::fs::create_dir_all(dir.path().join("scripts")).unwrap();
        std::fs::create_dir_all(dir.path().join("configs/dev")).unwrap();
        std::fs::copy(
            repo.join("scripts/dev-run.sh"),
            dir.path().join("scripts/dev-run.sh"),
        )
        .unwrap();
        let (api, event, rpc, metrics) = (free_port(), free_port(), free_port(), free_port());
        let base = 30_000 + (free_port() % 20) * 100 + 5_000;
        let manager = std::fs::read_to_string(repo.join("configs/dev/manager.toml"))
            .unwrap()
            .replace("port = 8081", &format!("port = {api}"))
            .replace("port = 16021", &format!("port = {event}"));
        let agent = std::fs::read_to_string(repo.join("configs/dev/agent.toml"))
            .unwrap()
            .replace("port = 16011", &format!("port = {rpc}"))
            .replace("port = 16021", &format!("port = {event}"))
            .replace(
                "port-range = [30000, 30100]",
                &format!("port-range = [{base}, {}]", base + 99),
            )
            .replace(
                "[manager]",
                &format!(
                    "service-addr = {{ host = \"127.0.0.1\", port = {metrics} }}\n\n[manager]"
                ),
            );
        assert!(
            agent.contains(&format!("port = {rpc}")) && manager.contains(&format!("port = {api}"))
        );
        std::fs::write(dir.path().join("configs/dev/manager.toml"), manager).unwrap();
        std::fs::write(dir.path().join("configs/dev/agent.toml"), agent).unwrap();
        DevRoot {
            dir,
            api,
            ports: vec![api, event, rpc, metrics],
        }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().to_owned()
    }

    /// The pid in `var/dev/NAME.pid`.
    fn pid(&self, name: &str) -> Option<i32> {
        std::fs::read_to_string(self.dir.path().join(format!("var/dev/{name}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// A shell in the root, the script's binary the one under test.
    fn shell(&self) -> Pty {
        Pty::shell(
            self.dir.path(),
            40,
            200,
            &[("KV_BIN", env!("CARGO_BIN_EXE_kernelvisor"))],
        )
    }
}

impl Drop for DevRoot {
    fn drop(&mut self) {
        // A failed test must not leave a pair or its kernels behind.
        for name in ["agent", "manager"] {
            if let Some(pid) = self.pid(name) {
                // SAFETY: signalling a pid.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let root = self.path();
        let _ = std::process::Command::new("docker")
            .args([
                "ps",
                "-aq",
                "--filter",
                "label=ai.backend.agent-id=agent-dev",
            ])
            .output()
            .map(|o| {
                for id in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                    let mounts = std::process::Command::new("docker")
                        .args(["inspect", "-f", "{{json .Mounts}}", id])
                        .output()
                        .map(|m| String::from_utf8_lossy(&m.stdout).into_owned())
                        .unwrap_or_default();
                    if mounts.contains(&root.to_string_lossy().into_owned()) {
                        let _ = std::process::Command::new("docker")
                            .args(["rm", "-f", id])
                            .output();
                    }
                }
            });
    }
}

fn alive(pid: i32) -> bool {
    // A zombie still answers kill -0: look at its state too.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && stat.split_whitespace().nth(2) != Some("Z")
}

fn port_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

/// Containers of session `sid` (any state).
fn session_containers(sid: &str) -> usize {
    let out = std::process::Command::new("docker")
        .args([
            "ps",
            "-aq",
            "--filter",
            &format!("label=ai.backend.session-id={sid}"),
        ])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .count()
}

/// Starts the script piped to tee in `pty`; waits until it says it runs. Answers the demo
/// session's id.
fn start(pty: &mut Pty, from: usize) -> (usize, String) {
    pty.send("./scripts/dev-run.sh 2>&1 | tee run.log\n");
    let Some(end) = pty.expect_from(from, "Ctrl+C stops both.", Duration::from_secs(120)) else {
        panic!("the dev pair did not start:\n{}", pty.output());
    };
    let out = pty.output();
    let sid = out[from..]
        .split("created the demo session ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .unwrap_or_else(|| panic!("no demo session:\n{out}"))
        .to_owned();
    (end, sid)
}

/// Ctrl+C; then within 10 s: both processes gone, "stopped" said, the demo session's container
/// removed, every port free.
fn interrupt_and_check(pty: &mut Pty, root: &DevRoot, from: usize, sid: &str) -> usize {
    let (manager, agent) = (root.pid("manager").unwrap(), root.pid("agent").unwrap());
    assert!(alive(manager) && alive(agent));
    let t0 = Instant::now();
    pty.send("\x03");
    let end = pty
        .expect_from(
            from,
            "kernelvisor dev pair stopped.",
            Duration::from_secs(10),
        )
        .unwrap_or_else(|| panic!("no stop within 10 s:\n{}", pty.output()));
    while (alive(manager) || alive(agent)) && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !alive(manager) && !alive(agent),
        "a process outlived the stop"
    );
    assert!(
        pty.output()[from..].contains(&format!("removed the demo session {sid}")),
        "{}",
        pty.output()
    );
    assert_eq!(
        session_containers(sid),
        0,
        "the demo session's container stayed"
    );
    for p in &root.ports {
        assert!(port_free(*p), "port {p} still held");
    }
    assert!(
        root.pid("manager").is_none(),
        "pid files are removed on stop"
    );
    // The prompt comes back: nothing hangs.
    pty.send("echo back-$((40+2))\n");
    pty.expect_from(end, "back-42", Duration::from_secs(5))
        .unwrap_or_else(|| panic!("the shell did not come back:\n{}", pty.output()))
}

#[test]
fn ctrl_c_stops_the_pair_with_its_output_piped() {
    let root = DevRoot::new();
    let mut pty = root.shell();
    let (from, sid) = start(&mut pty, 0);
    let log = std::fs::read_to_string(root.path().join("run.log")).unwrap();
    assert!(log.contains("hello from"), "the demo exec ran: {log}");
    // The API answers with the token the script wrote.
    assert!(!port_free(root.api));
    interrupt_and_check(&mut pty, &root, from, &sid);
}

#[test]
fn a_stale_pair_is_stopped_and_a_foreign_port_refused() {
    let root = DevRoot::new();
    let mut pty = root.shell();
    let (_, _) = start(&mut pty, 0);
    let (manager, agent) = (root.pid("manager").unwrap(), root.pid("agent").unwrap());
    // The script dies without its trap (kill -9): the pair goes on, as a hung `just run` left it.
    let script = std::fs::read_to_string(format!("/proc/{manager}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .unwrap()
        .trim()
        .parse::<i32>()
        .unwrap();
    // SAFETY: signalling a pid.
    unsafe { libc::kill(script, libc::SIGKILL) };
    let mark = pty.mark();
    pty.send("\n");
    pty.expect_from(mark, "$ ", Duration::from_secs(10))
        .unwrap();
    assert!(
        alive(manager) && alive(agent),
        "the pair outlives its script"
    );

    // The next start stops it, naming it, and runs a pair of its own.
    let mark = pty.mark();
    let (after, sid) = start(&mut pty, mark);
    let out = pty.output();
    assert!(
        out[mark..].contains(&format!(
            "a manager an earlier `just run` left is still running (pid {manager}): stopping it"
        )),
        "{out}"
    );
    assert!(out[mark..].contains(&format!("(pid {agent})")), "{out}");
    assert!(!alive(manager) && !alive(agent));
    assert_ne!(root.pid("manager"), Some(manager));
    let end = interrupt_and_check(&mut pty, &root, after, &sid);

    // Something else on the API port: named, and nothing starts.
    let held = TcpListener::bind(("127.0.0.1", root.api)).unwrap();
    pty.send("./scripts/dev-run.sh 2>&1 | tee run.log; echo status=${PIPESTATUS[0]}\n");
    pty.expect_from(end, "status=1", Duration::from_secs(30))
        .unwrap_or_else(|| panic!("exit status 1 expected:\n{}", pty.output()));
    let out = pty.output();
    assert!(
        out[end..].contains(&format!(
            "port {} (manager API) is in use by pid {}",
            root.api,
            std::process::id()
        )),
        "{}",
        &out[end..]
    );
    assert!(out[end..].contains("Nothing was started."));
    assert!(
        !out[end..].contains("stopped"),
        "nothing started, nothing to call stopped"
    );
    assert!(root.pid("manager").is_none() && root.pid("agent").is_none());
    drop(held);
}

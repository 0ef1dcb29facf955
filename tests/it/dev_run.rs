//! `just run` as a person runs it (issue 26): `scripts/dev-run.sh … 2>&1 | tee run.log` typed into
//! an interactive shell on a pseudo-terminal, then Ctrl+C. Within 10 s both processes are gone,
//! the demo session's container is removed and the ports are free. A pair an earlier run left
//! (its script killed) is stopped by the next start, which says so; a port held by something
//! else is named and nothing starts.
//!
//! Each test runs the script in a copy of `scripts/` and `configs/dev/` in a temporary root, with
//! free ports, so it never meets a developer's own `just run`.

use crate::common;

use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::dev::DevRoot;
use common::pty::Pty;

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
    // Log files are for reading with less and grep: no colour codes (the terminal gets them).
    for name in ["manager", "agent"] {
        let text =
            std::fs::read_to_string(root.path().join(format!("var/dev/logs/{name}.log"))).unwrap();
        assert!(text.contains("INFO"), "{name}.log has lines: {text}");
        assert!(!text.contains('\x1b'), "{name}.log carries ANSI codes");
    }
}

#[test]
fn a_failed_start_shows_the_failing_log_lines() {
    let root = DevRoot::new();
    let config = root.path().join("configs/dev/manager.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("[store]", "heartbeat-intervall = 2\n\n[store]"),
    )
    .unwrap();
    let out = std::process::Command::new("./scripts/dev-run.sh")
        .current_dir(root.path())
        .env("KV_BIN", env!("CARGO_BIN_EXE_kernelvisor"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(
        stderr.contains("the manager exited; from var/dev/logs/manager.log:"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("backtrace"),
        "the reason, not a backtrace: {stderr}"
    );
    assert!(
        stderr.contains("heartbeat-intervall"),
        "the config error is shown: {stderr}"
    );
    assert!(
        root.pid("manager").is_none() && root.pid("agent").is_none(),
        "nothing left running"
    );
}

#[test]
fn shell_completions_for_each_shell() {
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
            .args(["completions", shell])
            .output()
            .unwrap();
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{shell}");
        assert!(
            script.contains("kernelvisor") && script.contains("session"),
            "{shell}: {script}"
        );
    }
    // Piped into a reader that stops early: no panic, no error.
    let out = std::process::Command::new("bash")
        .args([
            "-c",
            &format!(
                "{} completions bash | head -1 >/dev/null; echo ${{PIPESTATUS[0]}}",
                env!("CARGO_BIN_EXE_kernelvisor")
            ),
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "0",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_stale_pair_is_stopped_and_a_foreign_port_refused() {
    let root = DevRoot::new();
    let mut pty = root.shell();
    let (_, _) = start(&mut pty, 0);
    let (manager, agent) = (root.pid("manager").unwrap(), root.pid("agent").unwrap());
    // A second `just run` while the first runs: refused, naming it; the first pair untouched.
    let second = std::process::Command::new("./scripts/dev-run.sh")
        .current_dir(root.path())
        .env("KV_BIN", env!("CARGO_BIN_EXE_kernelvisor"))
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(1), "{said}");
    assert!(
        said.contains("`just run` is already running here (pid "),
        "{said}"
    );
    assert!(
        alive(manager) && alive(agent),
        "the running pair was left alone"
    );
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

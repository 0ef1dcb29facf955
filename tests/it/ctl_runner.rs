//! `kernelvisor ctl` on a session Backend.AI's kernel runner serves, end to end: a manager and
//! an agent process (CURVE on) whose config has `[kernel-runner]`, the real Docker engine, the
//! real 26.9.6 runner in `kernelvisor-test-py` (`just test-image-py`, `just krunner`), and the real
//! `ctl` binary: state across `exec`s in the REPL, `input()` fed from ctl's stdin, Ctrl+C
//! interrupting a run (not the session; a second one leaving it), `exec --shell`, `session
//! show`'s exec path, `session services`, and an SSH login with the session's own key through
//! its `sshd` service port (the key fetched with `session cp`, the host's OpenSSH client); and
//! beside it a process-path session, where Ctrl+C leaves the run. `KV_KRUNNER_DIR` names the
//! runner; without it the test is skipped (said on stderr).
//!
//! Agent host ports: 36600–36619.

use crate::common;

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster::{signal, wait_exit, wait_for, Cluster, Db};

const LONG: Duration = Duration::from_secs(60);

/// The Python kernel image (`just test-image-py`).
const PY_IMAGE: &str = "kernelvisor-test-py:latest";

/// `kernelvisor ctl --api <api>` with the cluster's user token.
fn ctl(c: &Cluster, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kernelvisor"));
    cmd.arg("ctl")
        .arg("--api")
        .arg(&c.api)
        .env("KERNELVISOR_TOKEN", &c.token)
        .args(args);
    cmd
}

/// Starts `cmd` with pipes on all three streams.
fn spawn(mut cmd: Command) -> Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads `child`'s stdout and stderr to their ends on threads; waits for it (killed after
/// `limit`): its exit code (`None`: killed), stdout, stderr.
fn finish(mut child: Child, limit: Duration) -> (Option<i32>, String, String) {
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let ended = wait_exit(&mut child, limit);
    if !ended {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    (
        status.code().filter(|_| ended),
        out.join().unwrap(),
        err.join().unwrap(),
    )
}

/// Starts `ctl args` (stdin a pipe left open) and, for each of `markers` in turn, reads its
/// stdout until the marker has come and sends it SIGINT; then waits for it: exit code, stdout,
/// stderr.
fn interrupted(c: &Cluster, args: &[&str], markers: &[&str]) -> (Option<i32>, String, String) {
    let mut child = spawn(ctl(c, args));
    let mut stdout = child.stdout.take().unwrap();
    let mut seen = Vec::new();
    let mut byte = [0u8; 1];
    for marker in markers {
        let from = seen.len();
        while !String::from_utf8_lossy(&seen[from..]).contains(marker) {
            assert_eq!(
                stdout.read(&mut byte).unwrap(),
                1,
                "ctl's stdout ended before {marker:?}: {}",
                String::from_utf8_lossy(&seen)
            );
            seen.push(byte[0]);
        }
        signal(child.id(), "INT");
    }
    child.stdout = Some(stdout);
    let (code, out, err) = finish(child, LONG);
    (
        code,
        String::from_utf8_lossy(&seen).into_owned() + &out,
        err,
    )
}

/// Runs `ctl args` with `input` on its stdin (then closed): exit code, stdout, stderr.
fn run(c: &Cluster, args: &[&str], input: &str) -> (Option<i32>, String, String) {
    let mut child = spawn(ctl(c, args));
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    finish(child, Duration::from_secs(120))
}

/// `ctl session exec SID CODE` (with `extra` flags before the id), stdin empty.
fn exec(c: &Cluster, sid: &str, extra: &[&str], code: &str) -> (Option<i32>, String, String) {
    let mut args = vec!["session", "exec"];
    args.extend_from_slice(extra);
    args.extend([sid, code]);
    run(c, &args, "")
}

#[test]
fn ctl_runs_code_in_a_kernel_runners_repl_and_logs_in_over_its_sshd() {
    let Ok(dir) = std::env::var("KV_KRUNNER_DIR") else {
        eprintln!("SKIPPED ctl_runner: KV_KRUNNER_DIR is not set (`just test-all` sets it after `just krunner`)");
        return;
    };
    let started = Instant::now();
    let mut c = Cluster::new(Db::Sqlite);
    c.start_manager();
    let runner =
        format!("\n[kernel-runner]\ndir = \"{dir}\"\nmode = \"auto\"\ninit-timeout = 60\n");
    let a = c.add_agent_with("ctl-runner", 36_600, "", &runner);
    let agent_id = c.agents[a].id().to_owned();
    c.wait_agent_status(&agent_id, "ALIVE", LONG);
    wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });

    let (code, out, err) = run(
        &c,
        &[
            "-o", "json", "session", "create", "--image", PY_IMAGE, "--cpu", "1", "--mem", "512m",
        ],
        "",
    );
    assert_eq!(code, Some(0), "create: {out}{err}");
    let created: serde_json::Value = serde_json::from_str(&out).unwrap();
    let sid = created["session_id"].as_str().unwrap().to_owned();
    eprintln!("session {sid} created after {:?}", started.elapsed());

    // `session show` says which path the kernel has.
    let (code, out, err) = run(&c, &["session", "show", &sid], "");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("Exec path:") && l.ends_with(" kernel-runner")),
        "{out}"
    );

    // The REPL keeps its state from one exec to the next.
    let (code, out, err) = exec(&c, &sid, &[], "x = 41");
    assert_eq!((code, out.as_str()), (Some(0), ""), "{err}");
    let (code, out, err) = exec(&c, &sid, &[], "print(x + 1)");
    assert_eq!((code, out.as_str()), (Some(0), "42\n"), "{err}");
    // An error: the traceback on stderr, exit 1.
    let (code, _, err) = exec(&c, &sid, &[], "1/0");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("ZeroDivisionError"), "{err}");

    // input(): the prompt on stdout, a line of ctl's stdin as the answer (without its line
    // break); the end of stdin is EOFError.
    let (code, out, err) = run(
        &c,
        &["session", "exec", &sid, "name = input('who? ')"],
        "bob\n",
    );
    assert_eq!((code, out.as_str()), (Some(0), "who? "), "{err}");
    let (code, out, err) = exec(&c, &sid, &[], "print(repr(name))");
    assert_eq!((code, out.as_str()), (Some(0), "'bob'\n"), "{err}");
    let (code, out, err) = run(
        &c,
        &[
            "session",
            "exec",
            &sid,
            "a = input('a? '); b = input('b? '); print(a + b)",
        ],
        "one\ntwo\n",
    );
    assert_eq!((code, out.as_str()), (Some(0), "a? b? onetwo\n"), "{err}");
    let (code, _, err) = exec(&c, &sid, &[], "input('more? ')");
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("EOFError"), "{err}");

    // Ctrl+C interrupts the run, not ctl: KeyboardInterrupt, the rest of the answer, exit 1;
    // the REPL keeps `x`.
    let looping = "import time\nprint('looping', flush=True)\nwhile True:\n    time.sleep(0.1)";
    let (code, out, err) = interrupted(&c, &["session", "exec", &sid, looping], &["looping\n"]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("KeyboardInterrupt"), "{err}");
    let (code, out, err) = exec(&c, &sid, &[], "print(x)");
    assert_eq!((code, out.as_str()), (Some(0), "41\n"), "{err}");
    // Also while input() waits for a line that does not come.
    let (code, out, err) = interrupted(
        &c,
        &["session", "exec", &sid, "input('wait? ')"],
        &["wait? "],
    );
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("KeyboardInterrupt"), "{err}");
    let (code, out, err) = exec(&c, &sid, &[], "print(x)");
    assert_eq!((code, out.as_str()), (Some(0), "41\n"), "{err}");

    // --shell: a shell command line in a process of its own (`sh -c`, not the REPL, whose
    // Python would not take it). It runs as the container's user, as every process-path run.
    let (code, out, err) = exec(&c, &sid, &["--shell"], "id -u; echo $0");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(
        lines.len() == 2 && lines[0].parse::<u32>().is_ok() && lines[1] == "sh",
        "{out}{err}"
    );

    // The intrinsic sshd and ttyd run; the image's service-def `hello` is not started.
    let (code, out, err) = run(&c, &["session", "services", &sid], "");
    assert_eq!(code, Some(0), "{err}");
    let status_of = |name: &str| {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("{name} in {out}"))
            .to_owned()
    };
    for name in ["sshd", "ttyd"] {
        assert!(status_of(name).contains("running"), "{out}");
    }
    assert!(status_of("hello").contains("stopped"), "{out}");
    let (code, json, err) = run(&c, &["-o", "json", "session", "services", &sid], "");
    assert_eq!(code, Some(0), "{err}");
    let services: serde_json::Value = serde_json::from_str(&json).unwrap();
    let sshd_port = services["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "sshd")
        .and_then(|s| s["host_ports"][0].as_u64())
        .unwrap_or_else(|| panic!("sshd's host port in {json}"));

    // SSH in as `work` (the user the entrypoint made for uid 1000) with the session's key.
    let local = tempfile::tempdir().unwrap();
    let key = local.path().join("id_container");
    let (code, out, err) = run(
        &c,
        &[
            "session",
            "cp",
            &format!("{sid}:id_container"),
            key.to_str().unwrap(),
        ],
        "",
    );
    assert_eq!(code, Some(0), "{out}{err}");
    let text = std::fs::read_to_string(&key).unwrap();
    assert!(
        text.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----"),
        "{text}"
    );
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let ssh = Command::new("/usr/bin/ssh")
        .arg("-i")
        .arg(&key)
        .args([
            "-p",
            &sshd_port.to_string(),
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=20",
            "work@127.0.0.1",
            "echo ssh-ok; id -un",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&ssh.stdout),
        String::from_utf8_lossy(&ssh.stderr),
    );
    assert!(ssh.status.success(), "ssh: {out}{err}");
    assert_eq!(out, "ssh-ok\nwork\n", "{err}");

    // A run that takes KeyboardInterrupt and goes on: a second Ctrl+C leaves it (exit 130).
    let stubborn = "import time\nprint('stubborn', flush=True)\nwhile True:\n    try:\n        time.sleep(0.1)\n    except KeyboardInterrupt:\n        print('caught', flush=True)";
    let (code, out, err) = interrupted(
        &c,
        &["session", "exec", &sid, stubborn],
        &["stubborn\n", "caught\n"],
    );
    assert_eq!(code, Some(130), "{out}{err}");
    assert!(out.contains("caught"), "{out}{err}");
    assert!(err.contains("interrupted again"), "{err}");
    let (code, _, err) = run(&c, &["session", "rm", &sid], "");
    assert_eq!(code, Some(0), "{err}");

    // A session of an image the runner does not serve (no runner labels): the process path,
    // where Ctrl+C leaves the run (exit 130) and says so.
    let (code, out, err) = run(
        &c,
        &[
            "-o",
            "json",
            "session",
            "create",
            "--image",
            common::agent::TEST_IMAGE,
            "--cpu",
            "0.25",
            "--mem",
            "64m",
        ],
        "",
    );
    assert_eq!(code, Some(0), "create: {out}{err}");
    let created: serde_json::Value = serde_json::from_str(&out).unwrap();
    let plain = created["session_id"].as_str().unwrap().to_owned();
    let (code, out, err) = run(&c, &["session", "show", &plain], "");
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("Exec path:") && l.ends_with(" process")),
        "{out}"
    );
    let (code, out, err) = interrupted(
        &c,
        &["session", "exec", &plain, "echo sleeping; sleep 30"],
        &["sleeping\n"],
    );
    assert_eq!(code, Some(130), "{out}{err}");
    assert!(err.contains("cannot be interrupted"), "{err}");
    let (code, _, err) = run(&c, &["session", "rm", &plain], "");
    assert_eq!(code, Some(0), "{err}");
    c.check_invariants();
    eprintln!("done after {:?}", started.elapsed());
}

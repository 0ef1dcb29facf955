//! Workloads end to end: a manager process and an agent process (the `kernelvisor` binary, CURVE
//! on both channels), the real Docker engine, the HTTP API and the `kernelvisor ctl` CLI.
//! - batch sessions: `TERMINATED` with `result` and `exit_code`, `batch-timeout`, logs read after
//!   the job ended, each result event applied once (SQLite and PostgreSQL);
//! - streaming `ctl session exec` (the first line before the run ends), `input` through the API,
//!   `ctl session logs -f` of a running batch job (each line within 1 s of being printed);
//! - a GiB through `ctl session exec` with the agent's and the manager's peak RSS (VmHWM) bounded,
//!   and a run nobody continues killed after `exec-idle-timeout`.
//!
//! - restart policies: a batch job retried by `on-failure`, `restart-limit-exceeded`, the stage
//!   actors of a running session, bad policies refused (SQLite and PostgreSQL).
//!
//! Agent host ports: 32300–32419 (20 per agent).

use crate::common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::agent::TEST_IMAGE;
use common::cluster::{wait_exit, wait_for, Cluster, Db};
use common::{assert_bounded_memory, peak_rss, status_bytes};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

fn cluster(db: Db, name: &str, ports: u16, agent_extra: &str) -> Cluster {
    let mut c = Cluster::new(db);
    c.start_manager();
    let a = c.add_agent(name, ports, agent_extra);
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);
    wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    c
}

fn ctl(c: &Cluster) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kernelvisor"));
    cmd.arg("ctl")
        .arg("--api")
        .arg(&c.api)
        .env("KERNELVISOR_TOKEN", &c.token);
    cmd
}

fn create(c: &Cluster, extra: Value) -> Value {
    let mut body = json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}, "access_key": c.access_key});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let a = c.post("/v1/sessions", &body);
    assert_eq!(a.status, 201, "create: {a:?}");
    a.body
}

fn wait_terminated(c: &Cluster, sid: &str) -> Value {
    wait_for(LONG, &format!("session {sid} TERMINATED"), || {
        let s = c.get(&format!("/v1/sessions/{sid}")).ok()?.body;
        (s["status"] == "TERMINATED").then_some(s)
    })
}

fn logs(c: &Cluster, sid: &str) -> String {
    let r = ureq::get(&format!("{}/v1/sessions/{sid}/logs", c.api))
        .set("Authorization", &c.auth())
        .call()
        .expect("logs");
    assert!(r.content_type().starts_with("text/plain"));
    r.into_string().unwrap()
}

/// A local image without `sh` (one file, imported from a tar): `command` cannot run there.
fn no_shell_image() -> &'static str {
    const NAME: &str = "kernelvisor-test-noshell:latest";
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("README"), "no shell here\n").unwrap();
    let tar = Command::new("tar")
        .arg("-C")
        .arg(dir.path())
        .args(["-c", "."])
        .output()
        .unwrap();
    let mut import = Command::new("docker")
        .args(["import", "-c", "CMD [\"/nothing\"]", "-", NAME])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(import.stdin.as_mut().unwrap(), &tar.stdout).unwrap();
    drop(import.stdin.take());
    assert!(import.wait().unwrap().success(), "docker import");
    NAME
}

fn batch_sessions(db: Db, ports: u16) {
    let c = cluster(db, "batch", ports, "");
    let agent_id = c.agents[0].id().to_owned();

    let cmd = "echo start; sleep 2; echo done; exit 3";
    let s = create(&c, json!({"type": "batch", "command": cmd}));
    let sid = s["session_id"].as_str().unwrap().to_owned();
    let s = wait_terminated(&c, &sid);
    assert_eq!(
        (
            s["type"].as_str(),
            s["command"].as_str(),
            s["result"].as_str()
        ),
        (Some("batch"), Some(cmd), Some("FAILURE")),
        "{s}"
    );
    assert_eq!(
        (s["exit_code"].as_i64(), s["status_reason"].as_str()),
        (Some(3), Some("self-terminated")),
        "{s}"
    );
    // Read after the job ended and its container is gone.
    let text = logs(&c, &sid);
    assert!(
        text.contains("start\n") && text.contains("done\n"),
        "{text:?}"
    );

    let ok = create(&c, json!({"type": "batch", "command": "exit 0"}));
    let ok = wait_terminated(&c, ok["session_id"].as_str().unwrap());
    assert_eq!(
        (ok["result"].as_str(), ok["exit_code"].as_i64()),
        (Some("SUCCESS"), Some(0)),
        "{ok}"
    );

    let slow = create(
        &c,
        json!({"type": "batch", "command": "sleep 60", "batch_timeout": 2}),
    );
    let slow = wait_terminated(&c, slow["session_id"].as_str().unwrap());
    assert_eq!(
        (slow["result"].as_str(), slow["status_reason"].as_str()),
        (Some("FAILURE"), Some("batch-timeout")),
        "{slow}"
    );
    assert_eq!(slow["batch_timeout"].as_f64(), Some(2.0));

    // An interactive session's result stays UNDEFINED; its command replaces the image's.
    let i = create(
        &c,
        json!({"command": "echo custom-main; exec sleep infinity"}),
    );
    let isid = i["session_id"].as_str().unwrap().to_owned();
    wait_for(LONG, "the interactive command's output", || {
        logs(&c, &isid).contains("custom-main").then_some(())
    });
    assert_eq!(
        c.get(&format!("/v1/sessions/{isid}")).unwrap().body["result"],
        "UNDEFINED"
    );
    assert_eq!(
        c.delete(&format!("/v1/sessions/{isid}")).body["result"],
        "UNDEFINED"
    );

    // Each result event was applied exactly once.
    c.check_invariants();
    let count = |name: &'static str| {
        let agent_id = agent_id.clone();
        c.store(move |s| {
            Box::pin(async move { s.processed_event_count(&agent_id, name).await.unwrap() })
        })
    };
    assert_eq!((count("session_failure"), count("session_success")), (2, 1));

    // Bad requests: clear codes, nothing left reserved.
    for (body, what) in [
        (json!({"type": "batch"}), "batch without a command"),
        (json!({"type": "cron", "command": "true"}), "unknown type"),
        (
            json!({"command": "true", "batch_timeout": 5}),
            "batch_timeout on an interactive session",
        ),
        (
            json!({"type": "batch", "command": "true", "batch_timeout": -1}),
            "negative batch_timeout",
        ),
    ] {
        let mut full = json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}, "access_key": c.access_key});
        full.as_object_mut()
            .unwrap()
            .extend(body.as_object().unwrap().clone());
        let a = c.post("/v1/sessions", &full);
        assert_eq!(
            (a.status, a.code()),
            (400, "invalid-request"),
            "{what}: {a:?}"
        );
    }
    let image = no_shell_image();
    let a = c.post("/v1/sessions", &json!({"image": image, "resource_slots": {"cpu": 0.25, "mem": "64m"}, "access_key": c.access_key, "type": "batch", "command": "true"}));
    assert_eq!((a.status, a.code()), (400, "invalid-request"), "{a:?}");
    assert!(
        a.body["error"]["message"].as_str().unwrap().contains("sh"),
        "{a:?}"
    );
    assert_eq!(c.concurrency_used(), 0);
    assert_eq!(
        c.get("/v1/sessions/00000000-0000-0000-0000-000000000000/logs")
            .unwrap()
            .code(),
        "session-not-found"
    );
    c.check_invariants();
}

/// A session's restart policy through the API: a batch job retried by `on-failure` until it
/// succeeds (`restart_count` in the session), the stage actors of a running session, and a bad
/// policy refused naming its field.
fn restart_policy(db: Db, ports: u16) {
    let c = cluster(db, "restart", ports, "");
    // Fails twice, then succeeds: each try appends to a scratch file, so it succeeds only if
    // the file survives the restarts.
    let cmd = "echo try >> tries; [ $(wc -l < tries) -ge 3 ] && exit 0; sleep 1; exit 1";
    let s = create(
        &c,
        json!({"type": "batch", "command": cmd,
               "restart_policy": {"mode": "on-failure", "max_restarts": 3, "window": 60, "backoff": 0.2}}),
    );
    let sid = s["session_id"].as_str().unwrap().to_owned();
    let s = wait_terminated(&c, &sid);
    assert_eq!(
        (
            s["result"].as_str(),
            s["status_reason"].as_str(),
            s["exit_code"].as_i64()
        ),
        (Some("SUCCESS"), Some("self-terminated"), Some(0)),
        "{s}"
    );
    assert_eq!(s["restart_count"].as_i64(), Some(2), "{s}");
    assert_eq!(s["restart_policy"]["mode"], "on-failure", "{s}");
    assert_eq!(s["restart_policy"]["max_restarts"], 3, "{s}");
    assert!(
        s["stages"].is_null(),
        "an ended session has no live stages: {s}"
    );

    // A job that keeps failing ends at the limit.
    let doomed = create(
        &c,
        json!({"type": "batch", "command": "sleep 1; exit 2",
               "restart_policy": {"mode": "on-failure", "max_restarts": 1, "backoff": 0}}),
    );
    let doomed = wait_terminated(&c, doomed["session_id"].as_str().unwrap());
    assert_eq!(
        (
            doomed["result"].as_str(),
            doomed["status_reason"].as_str(),
            doomed["exit_code"].as_i64(),
            doomed["restart_count"].as_i64()
        ),
        (
            Some("FAILURE"),
            Some("restart-limit-exceeded"),
            Some(2),
            Some(1)
        ),
        "{doomed}"
    );

    // A running session shows its eight stage actors, in order, all ready (`runner` holds
    // nothing on the process path).
    let live = create(&c, json!({}));
    let lid = live["session_id"].as_str().unwrap().to_owned();
    let got = wait_for(LONG, "the session RUNNING", || {
        let s = c.get(&format!("/v1/sessions/{lid}")).ok()?.body;
        (s["status"] == "RUNNING").then_some(s)
    });
    let stages: Vec<(&str, &str)> = got["stages"]
        .as_array()
        .unwrap_or_else(|| panic!("stages: {got}"))
        .iter()
        .map(|st| (st["name"].as_str().unwrap(), st["status"].as_str().unwrap()))
        .collect();
    assert_eq!(
        stages,
        [
            ("image", "ready"),
            ("slots", "ready"),
            ("ports", "ready"),
            ("scratch", "ready"),
            ("mounts", "ready"),
            ("container", "ready"),
            ("service-ports", "ready"),
            ("runner", "ready")
        ],
        "{got}"
    );
    assert!(
        got["stages"][5]["setup_seconds"].as_f64().is_some(),
        "{got}"
    );
    assert_eq!(got["restart_policy"]["mode"], "never", "the default: {got}");
    assert_eq!(got["restart_count"], 0);
    assert_eq!(c.delete(&format!("/v1/sessions/{lid}")).status, 200);

    // Bad policies: 400 naming the field; nothing reserved.
    for (policy, word) in [
        (json!({"mode": "sometimes"}), "mode"),
        (json!({"mode": "always", "window": -1}), "window"),
        (json!({"max_restarts": 5000}), "max_restarts"),
        (json!({"retries": 1}), "retries"),
    ] {
        let mut body = json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}});
        body["restart_policy"] = policy;
        let a = c.post("/v1/sessions", &body);
        assert_eq!(a.status, 400, "{a:?}");
        assert!(a.body.to_string().contains(word), "{a:?}");
    }
    assert_eq!(c.concurrency_used(), 0);
    c.check_invariants();
}

#[test]
fn restart_policy_sqlite() {
    restart_policy(Db::Sqlite, 32380);
}

#[test]
fn restart_policy_postgres() {
    restart_policy(Db::Postgres, 32400);
}

#[test]
fn batch_sessions_sqlite() {
    batch_sessions(Db::Sqlite, 32300);
}

#[test]
fn batch_sessions_postgres() {
    batch_sessions(Db::Postgres, 32320);
}

/// Spawns `cmd` with stdout piped; returns each stdout line with the seconds since the spawn.
fn timed_lines(mut cmd: Command) -> (Vec<(f64, String)>, i32) {
    let start = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map(|l| (start.elapsed().as_secs_f64(), l.unwrap()))
        .collect();
    let code = child.wait().unwrap().code().unwrap_or(-1);
    (lines, code)
}

#[test]
fn streaming_exec_input_and_logs_follow() {
    let c = cluster(Db::Sqlite, "stream", 32340, "");
    let sid = create(&c, json!({}))["session_id"]
        .as_str()
        .unwrap()
        .to_owned();

    // ctl session exec writes each line as it comes.
    let mut exec = ctl(&c);
    exec.args([
        "session",
        "exec",
        &sid,
        "for i in 1 2 3 4 5; do echo $i; sleep 1; done",
    ]);
    let (lines, code) = timed_lines(exec);
    assert_eq!(code, 0);
    assert_eq!(
        lines.iter().map(|(_, l)| l.as_str()).collect::<Vec<_>>(),
        ["1", "2", "3", "4", "5"]
    );
    assert!(
        lines[0].0 < 2.5,
        "the first line came {:.2} s after the start, before the run ended ({:.2} s)",
        lines[0].0,
        lines[4].0
    );
    assert!(
        lines[4].0 - lines[0].0 > 3.0,
        "lines arrive as printed: {lines:?}"
    );

    // input through the API.
    let exec = |body: Value| c.post(&format!("/v1/sessions/{sid}/execute"), &body);
    let first = exec(json!({"code": "read x; echo got $x", "stdin": true, "flush_timeout": 0.3}));
    assert_eq!(
        (first.status, first.body["status"].as_str()),
        (200, Some("continued")),
        "{first:?}"
    );
    let run = first.body["runId"].as_str().unwrap().to_owned();
    let mut out = exec(json!({"mode": "input", "run_id": run, "code": "hi\n", "flush_timeout": 2}));
    let mut text = String::new();
    loop {
        assert_eq!(out.status, 200, "{out:?}");
        for c in out.body["console"].as_array().unwrap() {
            text.push_str(c[1].as_str().unwrap());
        }
        if out.body["status"] != "continued" {
            break;
        }
        out = exec(json!({"mode": "continue", "run_id": run}));
    }
    assert_eq!(
        (text.as_str(), out.body["exitCode"].as_i64()),
        ("got hi\n", Some(0))
    );
    let gone = exec(json!({"mode": "continue", "run_id": run}));
    assert_eq!((gone.status, gone.code()), (404, "run-not-found"));
    let no_stdin = exec(json!({"code": "sleep 2", "flush_timeout": 0.1}));
    let r = exec(json!({"mode": "input", "run_id": no_stdin.body["runId"], "code": "x\n"}));
    assert_eq!((r.status, r.code()), (409, "run-has-no-stdin"));
    let r = exec(json!({"mode": "continue"}));
    assert_eq!((r.status, r.code()), (400, "invalid-request"));
    let r = exec(json!({"code": "true", "flush_timeout": -1}));
    assert_eq!((r.status, r.code()), (400, "invalid-request"));

    // logs -f of a batch job: each line reaches the CLI within a second of being printed (issue
    // 26). The job stamps each line with the kernel's uptime, which the container shares with
    // the host; the test reads the host's when the line arrives.
    let job = create(
        &c,
        json!({"type": "batch", "command": "for i in 1 2 3 4 5; do echo line$i $(cut -d' ' -f1 /proc/uptime); sleep 2; done"}),
    );
    let jid = job["session_id"].as_str().unwrap().to_owned();
    let mut follow = ctl(&c);
    follow.args(["session", "logs", &jid[..8], "-f"]);
    let mut child = follow
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let uptime = || -> f64 {
        let text = std::fs::read_to_string("/proc/uptime").unwrap();
        text.split_whitespace().next().unwrap().parse().unwrap()
    };
    let mut lines = Vec::new();
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let (line, now) = (line.unwrap(), uptime());
        let (text, printed) = line.split_once(' ').unwrap();
        lines.push((text.to_owned(), now - printed.parse::<f64>().unwrap()));
    }
    assert!(child.wait().unwrap().success());
    let texts: Vec<&str> = lines.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(
        texts,
        ["line1", "line2", "line3", "line4", "line5"],
        "by a unique id prefix"
    );
    for (text, delay) in &lines {
        assert!(
            *delay < 1.0,
            "{text} reached logs -f {delay:.2} s after it was printed: {lines:?}"
        );
    }
    let job = wait_terminated(&c, &jid);
    assert_eq!(job["result"], "SUCCESS");
    // After the end: the whole log, and -f ends at once.
    let mut again = ctl(&c);
    again.args(["session", "logs", &jid, "-f"]);
    let (lines, code) = timed_lines(again);
    assert_eq!((code, lines.len()), (0, 5));
    c.check_invariants();
}

#[test]
fn a_gigabyte_through_exec_in_bounded_memory() {
    let c = cluster(Db::Sqlite, "gib", 32360, "exec-idle-timeout = 3");
    let sid = create(&c, json!({}))["session_id"]
        .as_str()
        .unwrap()
        .to_owned();
    const GIB: u64 = 1 << 30;
    let mut child = ctl(&c)
        .args([
            "session",
            "exec",
            &sid,
            &format!("yes abcdefghij | head -c {GIB}"),
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let (mut total, mut buf, mut intact) = (0u64, vec![0u8; 1 << 16], true);
    loop {
        let n = stdout.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        // The pattern continues across reads: byte i of the stream is "abcdefghij\n"[i % 11].
        intact &= buf[..n]
            .iter()
            .enumerate()
            .all(|(i, b)| *b == b"abcdefghij\n"[((total + i as u64) % 11) as usize]);
        total += n as u64;
    }
    assert!(child.wait().unwrap().success());
    assert_eq!(total, GIB, "every byte, once");
    assert!(intact, "in order");
    let manager = c.manager.as_ref().unwrap().id();
    assert_bounded_memory(c.agents[0].pid(), manager, "peak RSS after 1 GiB");

    // A run of endless output nobody continues: killed and freed after exec-idle-timeout (3 s).
    let rss_before = status_bytes(c.agents[0].pid(), "VmRSS");
    let first = c.post(
        &format!("/v1/sessions/{sid}/execute"),
        &json!({"code": "yes", "flush_timeout": 0.5}),
    );
    assert_eq!(first.body["status"], "continued");
    let run = first.body["runId"].clone();
    // Waited for without touching the run (a `continue` would keep it alive): the reaper
    // forgets it, then kills its process; another run's `ps` sees when that is done.
    let count_yes = || {
        c.post(
            &format!("/v1/sessions/{sid}/execute"),
            &json!({"code": "ps -o comm | grep -c '^yes$' || true"}),
        )
    };
    common::cluster::settle(Duration::from_secs(60), count_yes, |ps| {
        ps.body["console"][0][1] == "0\n"
    });
    let r = c.post(
        &format!("/v1/sessions/{sid}/execute"),
        &json!({"mode": "continue", "run_id": run}),
    );
    assert_eq!((r.status, r.code()), (404, "run-not-found"));
    let ps = c.post(
        &format!("/v1/sessions/{sid}/execute"),
        &json!({"code": "ps -o comm | grep -c '^yes$' || true"}),
    );
    assert_eq!(
        ps.body["console"][0][1], "0\n",
        "the abandoned run's process was killed: {ps:?}"
    );
    assert!(peak_rss(c.agents[0].pid()) < 150 << 20);
    let rss_after = status_bytes(c.agents[0].pid(), "VmRSS");
    eprintln!(
        "agent RSS before the abandoned run {} MB, after it was reaped {} MB",
        rss_before >> 20,
        rss_after >> 20
    );
    assert!(
        rss_after < rss_before + (16 << 20),
        "the reaped run's memory is not kept: {} → {} MB",
        rss_before >> 20,
        rss_after >> 20
    );
    let mut rm = ctl(&c)
        .args(["session", "rm", &sid])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    assert!(wait_exit(&mut rm, LONG) && rm.wait().unwrap().success());
    c.check_invariants();
}

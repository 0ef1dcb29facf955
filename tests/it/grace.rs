//! Graceful termination end to end (issue 41, item 1): a manager process and Docker agents (the
//! `kernelvisor` binary, CURVE on both channels), the real engine, the HTTP API, `kernelvisor
//! ctl`, and Backend.AI 26.9.6's own agent client.
//! - a batch job that traps `SIGTERM` writes its checkpoint to its vfolder when `ctl session rm`
//!   ends it: the file is there, the session `TERMINATED`, its result the job's exit (0:
//!   `SUCCESS`); one that does not catch it ends with 143 (`FAILURE`); its logs are kept;
//! - a job that ignores `SIGTERM` with `grace_period` 3 is killed 3–4 s after the request
//!   (`kernelvisor_agent_grace_kills_total`), its `TERMINATING` event carries the deadline; a long
//!   grace answers 202 `TERMINATING` and `ctl session rm --now` cuts it; bad graces are 400s;
//! - a drain with a deadline ends a session with its grace (its checkpoint written);
//! - a manager killed and restarted during a grace, and a leader killed during one on PostgreSQL
//!   (its replica takes over): the end completes, once;
//! - `destroy_kernel` from Backend.AI 26.9.6's client gives a kernel it created the agent's
//!   `[container] grace-period`.
//!
//! Agent host ports: 44000–44099 (20 per agent).

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::agent::TEST_IMAGE;
use common::cluster::{wait_for, Cluster, Db, Reaped};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

/// A job that writes a checkpoint to its vfolder on `SIGTERM` and exits 0 (the shell runs its
/// trap between two short sleeps).
const CHECKPOINTING: &str =
    "trap 'echo checkpointing; echo saved > /home/work/ckpt/ckpt.txt; exit 0' TERM; \
     echo ready; while true; do sleep 0.1; done";

/// A job that ignores `SIGTERM`.
const IGNORING: &str = "trap '' TERM; echo ready; while true; do sleep 0.1; done";

/// A job that does not catch `SIGTERM`.
const PLAIN: &str = "echo ready; while true; do sleep 0.1; done";

fn cluster(name: &str, ports: u16) -> Cluster {
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra = "grace-period = 10\nmax-grace-period = 120".into();
    c.start_manager();
    let a = c.add_agent(name, ports, "");
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);
    wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    c
}

fn create(c: &Cluster, extra: Value) -> String {
    let mut body = json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}, "access_key": c.access_key});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let a = c.post("/v1/sessions", &body);
    assert_eq!(a.status, 201, "create: {a:?}");
    a.body["session_id"].as_str().unwrap().to_owned()
}

fn session(c: &Cluster, sid: &str) -> Value {
    c.get(&format!("/v1/sessions/{sid}")).unwrap().body
}

fn logs(c: &Cluster, sid: &str) -> String {
    ureq::get(&format!("{}/v1/sessions/{sid}/logs", c.api))
        .set("Authorization", &c.auth())
        .call()
        .map(|r| r.into_string().unwrap())
        .unwrap_or_default()
}

/// Waits until the job printed `ready` (its trap is set).
fn wait_ready(c: &Cluster, sid: &str) {
    wait_for(LONG, &format!("session {sid} ready"), || {
        logs(c, sid).contains("ready").then_some(())
    });
}

fn wait_terminated(c: &Cluster, sid: &str) -> Value {
    wait_for(LONG, &format!("session {sid} TERMINATED"), || {
        Some(session(c, sid)).filter(|s| s["status"] == "TERMINATED")
    })
}

/// `kernelvisor ctl --api … ARGS`: (exit status, stdout, stderr).
fn ctl(c: &Cluster, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .arg("ctl")
        .arg("--api")
        .arg(&c.api)
        .env("KERNELVISOR_TOKEN", &c.token)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn grace_kills(c: &Cluster) -> f64 {
    c.agent_metric(0, "kernelvisor_agent_grace_kills_total")
        .unwrap_or(0.0)
}

/// The `session_status` events the manager keeps for `sid` (`GET /v1/events`, not followed).
fn status_events(c: &Cluster, sid: &str) -> Vec<Value> {
    let text = ureq::get(&format!("{}/v1/events?session_id={sid}", c.api))
        .set("Authorization", &c.auth())
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .filter(|e| e["type"] == "session_status")
        .collect()
}

/// A checkpointing job ended by `ctl session rm` saves its checkpoint and ends by its own exit;
/// one that does not catch `SIGTERM` ends with 143; bad graces are refused with clear codes.
#[test]
fn a_batch_job_checkpoints_on_sigterm_and_its_exit_is_the_result() {
    let c = cluster("grace-ckpt", 44000);
    let dir = c.writable_vfolder("ckpt");

    let sid = create(
        &c,
        json!({"type": "batch", "command": CHECKPOINTING, "grace_period": 30,
               "mounts": [{"name": "ckpt", "permission": "rw"}]}),
    );
    wait_ready(&c, &sid);
    let s = session(&c, &sid);
    assert_eq!(
        (
            &s["grace_period"],
            &s["stop_signal"],
            &s["terminate_deadline"]
        ),
        (&json!(30.0), &Value::Null, &Value::Null),
        "{s}"
    );
    let (code, out, err) = ctl(&c, &["session", "rm", &sid]);
    assert_eq!(code, 0, "ctl session rm: {out}\n{err}");
    assert!(out.contains("TERMINATED"), "{out}");
    assert_eq!(
        std::fs::read_to_string(dir.join("ckpt.txt")).unwrap(),
        "saved\n",
        "the checkpoint the job wrote on SIGTERM"
    );
    let s = wait_terminated(&c, &sid);
    assert_eq!(
        (
            s["status_reason"].as_str(),
            s["exit_code"].as_i64(),
            s["result"].as_str()
        ),
        (Some("user-requested"), Some(0), Some("SUCCESS")),
        "{s}"
    );
    // Its logs are kept, its trap's line last.
    let text = logs(&c, &sid);
    assert!(
        text.contains("ready") && text.contains("checkpointing"),
        "{text:?}"
    );

    // Not caught: the shell dies of SIGTERM (docker-init passes it on), 128 + 15.
    let plain = create(&c, json!({"type": "batch", "command": PLAIN}));
    wait_ready(&c, &plain);
    assert_eq!(session(&c, &plain)["grace_period"], json!(10.0));
    let r = c.delete(&format!("/v1/sessions/{plain}"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        (
            r.body["status"].as_str(),
            r.body["exit_code"].as_i64(),
            r.body["result"].as_str()
        ),
        (Some("TERMINATED"), Some(143), Some("FAILURE")),
        "{}",
        r.body
    );
    assert_eq!(grace_kills(&c), 0.0, "nothing was killed at a deadline");

    // Bad graces: clear codes, nothing created.
    for (extra, code) in [
        (json!({"grace_period": 121}), "grace-period-too-long"),
        (json!({"grace_period": -1}), "invalid-request"),
        (json!({"stop_signal": "SIGKILL"}), "invalid-request"),
        (json!({"stop_signal": "15"}), "invalid-request"),
    ] {
        let mut body = json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        let r = c.post("/v1/sessions", &body);
        assert_eq!((r.status, r.code()), (400, code), "{extra} → {r:?}");
    }
    let live = create(&c, json!({"command": PLAIN, "stop_signal": "term"}));
    assert_eq!(session(&c, &live)["stop_signal"], "SIGTERM");
    for (q, code) in [
        ("grace=121", "grace-period-too-long"),
        ("grace=-1", "invalid-request"),
        ("grace=soon", "invalid-request"),
    ] {
        let r = c.delete(&format!("/v1/sessions/{live}?{q}"));
        assert_eq!((r.status, r.code()), (400, code), "{q} → {r:?}");
    }
    assert_eq!(
        session(&c, &live)["status"],
        "RUNNING",
        "a refused DELETE ends nothing"
    );
    let (code, out, err) = ctl(&c, &["session", "rm", "--now", &live]);
    assert_eq!(code, 0, "{out}\n{err}");
    c.check_invariants();
}

/// A job that ignores `SIGTERM` is killed at its grace's deadline, 3–4 s after the request; a
/// long grace answers 202 `TERMINATING` with its deadline, and `rm --now` cuts it short.
#[test]
fn a_job_that_ignores_sigterm_is_killed_at_its_deadline() {
    let c = cluster("grace-kill", 44020);
    let sid = create(
        &c,
        json!({"type": "batch", "command": IGNORING, "grace_period": 3}),
    );
    wait_ready(&c, &sid);
    let histogram_before = c.manager_metric("kernelvisor_manager_terminating_seconds_count", "");
    let asked = Instant::now();
    let asked_unix = kernelvisor::manager::store::now();
    let r = c.delete(&format!("/v1/sessions/{sid}"));
    let took = asked.elapsed();
    assert_eq!(
        (r.status, r.body["status"].as_str()),
        (200, Some("TERMINATED")),
        "{r:?}"
    );
    assert!(
        took >= Duration::from_millis(2900) && took < Duration::from_secs(8),
        "killed {took:?} after the request, want 3–4 s"
    );
    assert_eq!(grace_kills(&c), 1.0);
    assert_eq!(
        (r.body["status_reason"].as_str(), r.body["result"].as_str()),
        (Some("user-requested"), Some("FAILURE")),
        "{}",
        r.body
    );
    assert!(
        c.manager_metric("kernelvisor_manager_terminating_seconds_count", "") > histogram_before
    );
    // Its TERMINATING event said by when.
    let events = status_events(&c, &sid);
    let terminating = events
        .iter()
        .find(|e| e["status"] == "TERMINATING")
        .unwrap_or_else(|| panic!("no TERMINATING event: {events:?}"));
    let deadline = terminating["terminate_deadline"].as_f64().unwrap();
    assert!(
        (deadline - asked_unix - 3.0).abs() < 2.0,
        "deadline {deadline}, asked at {asked_unix}"
    );

    // A long grace: answered 202 while it runs, then cut by `rm --now`.
    let long = create(&c, json!({"command": IGNORING, "grace_period": 90}));
    wait_ready(&c, &long);
    let r = c.delete(&format!("/v1/sessions/{long}"));
    assert_eq!(
        (r.status, r.body["status"].as_str()),
        (202, Some("TERMINATING")),
        "{r:?}"
    );
    let deadline = r.body["terminate_deadline"].as_f64().unwrap();
    let left = deadline - kernelvisor::manager::store::now();
    assert!(left > 60.0 && left <= 90.0, "{left} s left");
    let (_, table, _) = ctl(&c, &["sessions"]);
    assert!(table.contains("TERMINATING (kill in"), "{table}");
    let (_, shown, _) = ctl(&c, &["session", "show", &long]);
    assert!(
        shown.contains("Kill deadline") && shown.contains("grace 90s"),
        "{shown}"
    );
    let cut = Instant::now();
    let (code, out, err) = ctl(&c, &["session", "rm", "--now", &long]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("TERMINATED"), "{out}");
    assert!(
        cut.elapsed() < Duration::from_secs(8),
        "{:?}",
        cut.elapsed()
    );
    assert_eq!(grace_kills(&c), 2.0);
    assert!(c.running_containers(0).is_empty());
    c.check_invariants();
}

/// A drain with a deadline ends its agent's sessions with their grace: the job checkpoints.
#[test]
fn a_drain_deadline_gives_the_grace() {
    let c = cluster("grace-drain", 44040);
    let dir = c.writable_vfolder("ckpt");
    let sid = create(
        &c,
        json!({"type": "batch", "command": CHECKPOINTING, "grace_period": 30,
               "mounts": [{"name": "ckpt", "permission": "rw"}]}),
    );
    wait_ready(&c, &sid);
    let agent = c.agents[0].id().to_owned();
    let r = c.call_as(
        Some(&c.admin_token),
        "POST",
        &format!("/v1/agents/{agent}/drain"),
        Some(&json!({"deadline": 1})),
    );
    assert_eq!(r.status, 200, "{r:?}");
    let s = wait_terminated(&c, &sid);
    assert_eq!(
        (
            s["status_reason"].as_str(),
            s["exit_code"].as_i64(),
            s["result"].as_str()
        ),
        (Some("agent-drained"), Some(0), Some("SUCCESS")),
        "{s}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("ckpt.txt")).unwrap(),
        "saved\n"
    );
    let events = status_events(&c, &sid);
    assert!(
        events
            .iter()
            .any(|e| e["status"] == "TERMINATING" && e["terminate_deadline"].is_f64()),
        "{events:?}"
    );
    c.check_invariants();
}

/// The manager killed and started again while a session's grace runs: the agent's end
/// completes at the deadline, the session ends once.
#[test]
fn a_manager_restart_during_a_grace_ends_the_session_once() {
    let mut c = cluster("grace-restart", 44060);
    let sid = create(
        &c,
        json!({"type": "batch", "command": IGNORING, "grace_period": 6}),
    );
    wait_ready(&c, &sid);
    let kernel_id = session(&c, &sid)["kernel_id"].as_str().unwrap().to_owned();
    let (api, auth) = (c.api.clone(), c.auth());
    let asked = Instant::now();
    // Its answer is lost with the manager.
    let delete = std::thread::spawn(move || {
        let _ = ureq::delete(&format!("{api}/v1/sessions/{sid_}", sid_ = kernel_id))
            .set("Authorization", &auth)
            .call();
    });
    wait_for(LONG, "TERMINATING", || {
        (session(&c, &sid)["status"] == "TERMINATING").then_some(())
    });
    c.stop_manager("KILL");
    c.start_manager();
    let s = wait_terminated(&c, &sid);
    let took = asked.elapsed();
    assert!(took >= Duration::from_millis(5900), "ended after {took:?}");
    assert_eq!(s["status_reason"], "user-requested", "{s}");
    delete.join().unwrap();
    assert_eq!(grace_kills(&c), 1.0, "killed once, at the deadline");
    let agent_id = c.agents[0].id().to_owned();
    let terminated = c.store(move |s| {
        Box::pin(async move {
            s.processed_event_count(&agent_id, "kernel_terminated")
                .await
                .unwrap()
        })
    });
    assert_eq!(terminated, 1, "one kernel_terminated");
    assert!(c.running_containers(0).is_empty());
    c.check_invariants();
}

/// On PostgreSQL with a replica: the leader killed during a session's grace (its `DELETE`
/// asked, the job ignoring `SIGTERM`); the replica takes over and the end completes at the
/// deadline, once (one kill by the agent, one `kernel_terminated`, one `TERMINATED` event).
#[test]
fn a_failover_to_a_replica_during_a_grace_ends_the_session_once() {
    let mut c = Cluster::new(Db::Postgres);
    c.heartbeat_timeout = 8.0;
    c.manager_extra = "leader-lease = 4\n".into();
    c.scheduler_extra = "grace-period = 10\nmax-grace-period = 120\nsweep-interval = 1".into();
    c.start_manager();
    let (port, intake) = (common::agent::free_port(), common::agent::free_port());
    let _replica = Reaped(c.spawn_replica("replica", port, intake));
    let replica_api = format!("http://127.0.0.1:{port}");
    c.agent_intakes = vec![c.intake_port, intake];
    // A batch job without service ports: a few host ports are enough.
    let a = c.add_agent_ports("grace-failover", 44088, 12);
    let agent_id = c.agents[a].id().to_owned();
    c.wait_agent_status(&agent_id, "ALIVE", LONG);
    wait_for(LONG, "the replica sees the agent", || {
        c.get_at(&replica_api, "/health")
            .ok()
            .filter(|h| h.body["agents_alive"] == 1)
    });
    let sid = create(
        &c,
        json!({"type": "batch", "command": IGNORING, "grace_period": 8}),
    );
    wait_ready(&c, &sid);
    let (api, auth) = (c.api.clone(), c.auth());
    let sid_ = sid.clone();
    let asked = Instant::now();
    // Its answer is lost with the leader.
    let delete = std::thread::spawn(move || {
        let _ = ureq::delete(&format!("{api}/v1/sessions/{sid_}"))
            .set("Authorization", &auth)
            .call();
    });
    wait_for(LONG, "TERMINATING", || {
        (session(&c, &sid)["status"] == "TERMINATING").then_some(())
    });
    c.stop_manager("KILL");
    c.api = replica_api;
    wait_for(LONG, "the replica leads", || {
        c.get("/health").ok().filter(|h| h.body["leader"] == true)
    });
    let s = wait_terminated(&c, &sid);
    let took = asked.elapsed();
    assert!(took >= Duration::from_millis(7900), "ended after {took:?}");
    assert_eq!(s["status_reason"], "user-requested", "{s}");
    delete.join().unwrap();
    assert_eq!(grace_kills(&c), 1.0, "killed once, at the deadline");
    let agent = agent_id.clone();
    let terminated = c.store(move |s| {
        Box::pin(async move {
            s.processed_event_count(&agent, "kernel_terminated")
                .await
                .unwrap()
        })
    });
    assert_eq!(terminated, 1, "one kernel_terminated");
    let ended: Vec<Value> = status_events(&c, &sid)
        .into_iter()
        .filter(|e| e["status"] == "TERMINATED")
        .collect();
    assert_eq!(ended.len(), 1, "one TERMINATED event: {ended:?}");
    assert!(c.running_containers(0).is_empty());
    c.check_invariants();
}

/// `destroy_kernel` from Backend.AI 26.9.6's client, for a kernel its launcher created (no
/// grace in its config): the agent's `[container] grace-period` (3 s) for a workload that
/// ignores `SIGTERM`, the answer upstream's nil.
#[test]
fn destroy_kernel_from_backend_ai_gives_the_agents_grace() {
    use crate::bai_compat::{bai_root, driver_command, driver_files, image_facts, run_driver};
    let Some(root) = bai_root("grace (Backend.AI destroy_kernel)") else {
        return;
    };
    const IMAGE: &str = "kernelvisor-test-grace:latest";
    let dockerfile = format!(
        "FROM {TEST_IMAGE}\nCMD [\"sh\", \"-c\", \"trap '' TERM; while true; do sleep 0.1; done\"]\n"
    );
    let mut build = Command::new("docker")
        .args(["build", "-q", "-t", IMAGE, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    std::io::Write::write_all(build.stdin.as_mut().unwrap(), dockerfile.as_bytes()).unwrap();
    drop(build.stdin.take());
    assert!(build.wait().unwrap().success(), "docker build {IMAGE}");

    let agent = crate::bai_compat::start_agent_edited("grace-bai", 44080, 8, "", |text| {
        text.replacen("[container]\n", "[container]\ngrace-period = 3\n", 1)
    });
    let files = driver_files(&root, &agent.fx);
    let (session_id, kernel_id) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    let (digest, labels) = image_facts(IMAGE, "docker build (this test)");
    let mut cmd = driver_command(
        &root,
        &files,
        &agent,
        (&session_id, &kernel_id),
        (IMAGE, &digest, &labels),
    );
    cmd.args(["--only", "destroy_kernel"]);
    let mut at = std::collections::HashMap::new();
    let run = run_driver(cmd, agent.fx.dir.path().join("driver.stderr"), |v, _| {
        if let Some(step) = v["step"].as_str() {
            at.insert(step.to_owned(), (Instant::now(), v.clone()));
        }
    });
    let (created, c) = at.get("create_kernels").expect("create_kernels reported");
    let (destroyed, d) = at.get("destroy_kernel").expect("destroy_kernel reported");
    assert_eq!(
        (&c["ok"], &d["ok"]),
        (&json!(true), &json!(true)),
        "{:?}",
        run.lines
    );
    let took = destroyed.duration_since(*created);
    assert!(
        took >= Duration::from_millis(2900) && took < Duration::from_secs(8),
        "destroy_kernel took {took:?}, want the agent's 3 s grace"
    );
    assert!(
        !Path::new(&format!("/proc/{}", agent.process.0.id())).exists()
            || common::agent::docker(&[
                "ps",
                "-q",
                "--filter",
                &format!("label=ai.backend.kernel-id={kernel_id}")
            ])
            .trim()
            .is_empty(),
        "the kernel's container is gone"
    );
}

//! Idle reclaim with real processes (a manager, an agent, real HTTP, the store on SQLite or
//! PostgreSQL; `docs/design.md`, "Idle reclaim"):
//! - on the real Docker engine: `idle_timeout` 5 ends a session about 5 s after its last
//!   `execute`, its `reclaim_warning` event first; a batch session is exempt; an open terminal
//!   (the pty WebSocket route) and an open TCP connection to a service port (seen by the agent
//!   in the container's network namespace) keep sessions past their timeout, which end once
//!   they close; `max_lifetime` ends a busy session at its deadline; `ctl sessions` shows
//!   `idle … / ends in …`; the metric counts each reason;
//! - on the dummy engine with the mock accelerator's fixed readings: a session under its
//!   utilization floor for the window ends `low-utilization`, one above it does not, also
//!   across a manager restart; bad policies are refused with 400;
//! - `ctl session create --idle-timeout` makes a session that ends `idle-timeout`, its policy
//!   in `ctl session show`;
//! - a cluster session is kept alive by executes on its `sub1` alone, and ends `idle-timeout`
//!   once they stop.
//!
//! Agent host ports: 44200–44279 (20 per agent).

use crate::common;

use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::agent::TEST_IMAGE;
use common::cluster::{wait_for, Cluster, Db};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

/// The test image with service ports (`web` on 8080: `tests/it/services_files.rs`).
const SERVICES_IMAGE: &str = "kernelvisor-test:services";

/// The manager's `[reclaim]`: checked twice a second, warnings 2 s ahead.
const RECLAIM: &str = "\n[reclaim]\ninterval = 0.5\nwarning-lead = 2\n";

/// The agent's samples twice a second (utilization, connections to service ports).
const STATS: &str =
    "\n[stats]\nnode-interval = 0.5\ncontainer-interval = 0.5\ngpu-interval = 0.5\n";

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// A manager with [`RECLAIM`] and one agent (`agent_extra` in `[agent]`, `tail` appended),
/// ready for sessions.
fn cluster(db: Db, name: &str, ports: u16, agent_extra: &str, tail: &str) -> Cluster {
    let mut c = Cluster::new(db);
    c.manager_tail = RECLAIM.into();
    c.start_manager();
    let a = c.add_agent_with(name, ports, agent_extra, tail);
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);
    wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    c
}

/// Creates a session of the test image with `extra` fields; its id.
fn create(c: &Cluster, extra: Value) -> String {
    let mut body = json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let a = c.post("/v1/sessions", &body);
    assert_eq!(a.status, 201, "create {body}: {a:?}");
    a.body["session_id"].as_str().unwrap().to_owned()
}

fn session(c: &Cluster, id: &str) -> Value {
    let a = c.get(&format!("/v1/sessions/{id}")).unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    a.body
}

/// Waits until session `id` is `status`; its JSON and the time it was seen so. A manager
/// starting up (503) is waited for too.
fn wait_status(c: &Cluster, id: &str, status: &str, limit: Duration) -> (Value, f64) {
    let s = wait_for(limit, &format!("session {id} {status}"), || {
        let a = c.get(&format!("/v1/sessions/{id}")).ok()?;
        (a.status == 200 && a.body["status"] == status).then_some(a.body)
    });
    (s, unix_now())
}

/// The events the manager keeps about session `id` (`GET /v1/events?session_id=…`, not
/// followed), in stream order.
fn events(c: &Cluster, id: &str) -> Vec<Value> {
    let mut resp = ureq::get(&format!("{}/v1/events?session_id={id}", c.api))
        .timeout(Duration::from_secs(30))
        .set("Authorization", &Cluster::bearer(&c.token))
        .call()
        .unwrap()
        .into_reader();
    let mut text = String::new();
    resp.read_to_string(&mut text).unwrap();
    text.split("\n\n")
        .filter_map(|f| f.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// Session `id`'s `reclaim_warning` for `reason`, which comes before its `TERMINATED` (with
/// that reason), at most the lead (2 s) before its deadline, once: an earlier warning is
/// for an earlier deadline that activity moved. Its deadline.
fn assert_warned_then_ended(c: &Cluster, id: &str, reason: &str) -> f64 {
    let seen = events(c, id);
    let warnings: Vec<&Value> = seen
        .iter()
        .filter(|e| e["type"] == "reclaim_warning")
        .collect();
    let deadlines: Vec<f64> = warnings
        .iter()
        .map(|w| w["deadline"].as_f64().unwrap())
        .collect();
    assert!(
        deadlines.windows(2).all(|d| d[0] < d[1]),
        "one warning per deadline: {seen:#?}"
    );
    let w = *warnings
        .last()
        .unwrap_or_else(|| panic!("no warning: {seen:#?}"));
    assert_eq!(w["reason"], reason, "{w}");
    assert_eq!(w["status"], "RUNNING", "{w}");
    let deadline = w["deadline"].as_f64().unwrap();
    let at = w["time"].as_f64().unwrap();
    assert!(
        at >= deadline - 2.0 - 0.1,
        "warned no sooner than the lead: at {at}, deadline {deadline}"
    );
    let warned = seen.iter().position(|e| std::ptr::eq(e, w)).unwrap();
    let ended = seen
        .iter()
        .position(|e| e["type"] == "session_status" && e["status"] == "TERMINATED")
        .unwrap_or_else(|| panic!("no TERMINATED: {seen:#?}"));
    assert!(warned < ended, "the warning first: {seen:#?}");
    assert_eq!(seen[ended]["reason"], reason, "{:?}", seen[ended]);
    deadline
}

/// No `reclaim_warning` about session `id` so far.
fn assert_never_warned(c: &Cluster, id: &str) {
    let seen = events(c, id);
    assert!(
        !seen.iter().any(|e| e["type"] == "reclaim_warning"),
        "{seen:#?}"
    );
}

fn reclaims(c: &Cluster, reason: &str) -> f64 {
    c.manager_metric(
        "kernelvisor_manager_reclaims_total",
        &format!("reason=\"{reason}\""),
    )
}

/// A terminal on session `id` over the pty WebSocket route, running `sleep 600`: open while
/// held.
fn open_terminal(
    c: &Cluster,
    id: &str,
) -> tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>> {
    use tungstenite::client::IntoClientRequest;
    let url = format!(
        "{}/v1/sessions/{id}/pty?command=sleep%20600",
        c.api.replace("http://", "ws://")
    );
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("Authorization", Cluster::bearer(&c.token).parse().unwrap());
    let (ws, resp) = tungstenite::connect(req).unwrap();
    assert_eq!(resp.status(), 101);
    ws
}

/// Starts session `id`'s `web` service ([`SERVICES_IMAGE`]'s, on container port 8080) and opens
/// a TCP connection to its host port, held open (no request sent).
fn connect_to_service(c: &Cluster, id: &str) -> TcpStream {
    let a = c.post(&format!("/v1/sessions/{id}/services/web"), &json!({}));
    assert_eq!(a.status, 200, "{a:?}");
    let list = c.get(&format!("/v1/sessions/{id}/services")).unwrap();
    let web = list.body["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "web")
        .unwrap()
        .clone();
    let port = web["host_ports"][0].as_u64().unwrap();
    TcpStream::connect(("127.0.0.1", port as u16)).unwrap()
}

/// `kernelvisor ctl ARGS` with the user's key: (exit code, stdout, stderr).
fn ctl(c: &Cluster, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .args(["ctl", "--api", &c.api])
        .args(args)
        .env("KERNELVISOR_TOKEN", &c.token)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kernelvisor ctl sessions` with the user's key: its table.
fn ctl_sessions(c: &Cluster) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .args(["ctl", "--api", &c.api, "sessions"])
        .env("KERNELVISOR_TOKEN", &c.token)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn idle_sessions_are_warned_then_ended_and_activity_keeps_them() {
    let c = cluster(Db::Sqlite, "reclaim", 44200, "", STATS);
    // A terminal and a connection, each opened as soon as its session runs.
    let term = create(&c, json!({"idle_timeout": 10}));
    wait_status(&c, &term, "RUNNING", LONG);
    let mut ws = open_terminal(&c, &term);
    let served = create(&c, json!({"image": SERVICES_IMAGE, "idle_timeout": 10}));
    wait_status(&c, &served, "RUNNING", LONG);
    let conn = connect_to_service(&c, &served);
    let batch = create(
        &c,
        json!({"type": "batch", "command": "sleep 300", "idle_timeout": 2}),
    );
    // Created last: its deadline comes well after the other two's would without activity.
    let life = create(&c, json!({"max_lifetime": 18}));
    let idle = create(&c, json!({"idle_timeout": 5}));
    // One created by `ctl session create --idle-timeout`: never used, it ends `idle-timeout`.
    let (code, out, err) = ctl(
        &c,
        &[
            "session",
            "create",
            "--image",
            TEST_IMAGE,
            "--cpu",
            "0.25",
            "--mem",
            "64m",
            "--idle-timeout",
            "5",
            "-q",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    let via_ctl = out.trim().to_owned();
    for id in [&idle, &batch, &life, &via_ctl] {
        wait_status(&c, id, "RUNNING", LONG);
    }

    // The idle session: one execute, then nothing.
    let before = unix_now();
    let out = c.post(
        &format!("/v1/sessions/{idle}/execute"),
        &json!({"code": "echo hi", "timeout": 20}),
    );
    assert_eq!(out.status, 200, "{out:?}");
    let after = unix_now();
    let s = wait_for(LONG, "the execute reported", || {
        Some(session(&c, &idle)).filter(|s| s["last_activity"].as_f64() >= Some(before - 0.5))
    });
    let last = s["last_activity"].as_f64().unwrap();
    assert_eq!(s["idle_deadline"].as_f64(), Some(last + 5.0), "{s}");
    assert_eq!(s["lifetime_deadline"], Value::Null, "{s}");
    assert_eq!(s["reclaim"], json!({"idle_timeout": 5.0}), "{s}");
    // `ctl sessions` shows how long it has been idle and when it ends.
    let table = ctl_sessions(&c);
    let row = table
        .lines()
        .find(|l| l.starts_with(&idle[..8]) || l.contains(&idle))
        .unwrap_or_else(|| panic!("no row of {idle}: {table}"));
    assert!(row.contains("idle ") && row.contains("ends in "), "{table}");

    // The busy one: an execute a second until its lifetime ends it anyway.
    let busy = std::thread::scope(|scope| {
        let busy = scope.spawn(|| loop {
            let s = session(&c, &life);
            if s["status"] != "RUNNING" {
                return s;
            }
            c.post(
                &format!("/v1/sessions/{life}/execute"),
                &json!({"code": "true", "timeout": 20}),
            );
            std::thread::sleep(Duration::from_secs(1));
        });

        let (s, ended) = wait_status(&c, &idle, "TERMINATED", LONG);
        assert_eq!(s["status_reason"], "idle-timeout", "{s}");
        // About 5 s after its last execute: not before, and within a generous window.
        assert!(
            ended - before >= 5.0,
            "ended {:.1} s after the execute began",
            ended - before
        );
        assert!(
            ended - after <= 5.0 + 10.0,
            "ended {:.1} s after the execute",
            ended - after
        );
        let deadline = assert_warned_then_ended(&c, &idle, "idle-timeout");
        assert_eq!(deadline, last + 5.0);
        eprintln!(
            "idle_timeout 5: ended {:.2} s after its execute began, {:.2} s after it answered",
            ended - before,
            ended - after
        );
        // The session `ctl` created, with its policy as `ctl session show` shows it.
        let (s, _) = wait_status(&c, &via_ctl, "TERMINATED", LONG);
        assert_eq!(s["status_reason"], "idle-timeout", "{s}");
        assert_eq!(s["reclaim"], json!({"idle_timeout": 5.0}), "{s}");
        let (code, out, err) = ctl(&c, &["session", "show", &via_ctl]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(
            out.lines()
                .any(|l| l.starts_with("Reclaim:") && l.ends_with(" idle_timeout 5s")),
            "{out}"
        );
        // The batch session, past its `idle_timeout` of 2 s: exempt.
        let b = session(&c, &batch);
        assert_eq!(
            (&b["status"], &b["idle_deadline"]),
            (&json!("RUNNING"), &Value::Null),
            "{b}"
        );
        busy.join().unwrap()
    });

    // The lifetime: ended at its deadline although busy.
    assert_eq!(busy["status_reason"], "lifetime-exceeded", "{busy}");
    let (busy, _) = wait_status(&c, &life, "TERMINATED", LONG);
    assert_eq!(busy["status_reason"], "lifetime-exceeded", "{busy}");
    let deadline = assert_warned_then_ended(&c, &life, "lifetime-exceeded");
    assert!(
        busy["terminated_at"].as_f64().unwrap() >= deadline,
        "{busy}"
    );
    assert_eq!(
        deadline,
        busy["admitted_at"]
            .as_f64()
            .unwrap_or(busy["created_at"].as_f64().unwrap())
            + 18.0
    );

    // By now (18 s after the last of them was created) the terminal's and the connection's
    // sessions are past their 10 s without activity of their own: what kept them was the open
    // terminal and the connection.
    for id in [&term, &served] {
        let s = session(&c, id);
        assert_eq!(s["status"], "RUNNING", "{s}");
        assert!(
            s["last_activity"].as_f64().unwrap() > s["created_at"].as_f64().unwrap() + 10.0,
            "{s}"
        );
        assert_never_warned(&c, id);
    }

    // Closed, they end 10 s after (the agent's last sight of them within its sampling period).
    let closed = unix_now();
    let _ = ws.close(None);
    drop(ws);
    drop(conn);
    for id in [&term, &served] {
        let (s, ended) = wait_status(&c, id, "TERMINATED", LONG);
        assert_eq!(s["status_reason"], "idle-timeout", "{s}");
        assert!(
            ended - closed >= 10.0 - 2.0 && ended - closed <= 10.0 + 15.0,
            "{id} ended {:.1} s after its terminal or connection closed",
            ended - closed
        );
        assert_warned_then_ended(&c, id, "idle-timeout");
    }
    assert_eq!(reclaims(&c, "idle-timeout"), 4.0);
    assert_eq!(reclaims(&c, "lifetime-exceeded"), 1.0);
    assert_eq!(reclaims(&c, "low-utilization"), 0.0);
    assert_eq!(session(&c, &batch)["status"], "RUNNING");
    c.delete(&format!("/v1/sessions/{batch}"));
    c.check_invariants();
}

/// A cluster session of 2 (`main1`, `sub1`, single-node) with `idle_timeout` 6: an execute
/// on `sub1` (the API's `"kernel": "sub1"`) every second keeps it `RUNNING` for twice its
/// timeout although `main1` sees nothing; once they stop, it ends `idle-timeout`, its deadline
/// from sub1's last activity.
#[test]
fn activity_on_a_sub_kernel_keeps_a_cluster_session() {
    const IDLE: f64 = 6.0;
    let c = cluster(Db::Sqlite, "reclaim-cl", 44260, "", STATS);
    let sid = create(
        &c,
        json!({"cluster_size": 2, "cluster_mode": "single-node", "idle_timeout": IDLE}),
    );
    let (s, _) = wait_status(&c, &sid, "RUNNING", LONG);
    assert_eq!(s["kernels"][1]["cluster_hostname"], "sub1", "{s}");
    let until = unix_now() + 2.0 * IDLE;
    let (mut last_start, mut last_run) = (0.0, 0.0);
    while unix_now() < until {
        let s = session(&c, &sid);
        assert_eq!(s["status"], "RUNNING", "sub1's activity must keep it: {s}");
        last_start = unix_now();
        let out = c.execute(&sid, Some("sub1"), "echo $BACKENDAI_CLUSTER_HOST");
        assert_eq!(out, Ok(("sub1\n".to_owned(), 0)));
        last_run = unix_now();
        std::thread::sleep(Duration::from_secs(1));
    }
    let (s, _) = wait_status(&c, &sid, "TERMINATED", LONG);
    assert_eq!(s["status_reason"], "idle-timeout", "{s}");
    let deadline = assert_warned_then_ended(&c, &sid, "idle-timeout");
    // Counted from sub1's last execute (main1's own idleness began 2 × IDLE earlier).
    assert!(
        deadline >= last_start - 0.5 + IDLE && deadline <= last_run + IDLE + 2.0,
        "deadline {deadline}; the last execute ran from {last_start} to {last_run}"
    );
    c.check_invariants();
}

/// The dummy engine with one mock `cuda.shares` device reading a fixed 40 %: two sessions of
/// half of it, floors 50 % (under) and 30 % (above), a window of [`WINDOW`] s. The manager
/// restarts while the low one's window runs, before its warning is due.
fn utilization_floor(db: Db, ports: u16) {
    const WINDOW: f64 = 15.0;
    let tail = format!(
        "\n[dummy]\nimages = [\"{TEST_IMAGE}\"]\n\n[accelerator]\ncuda = false\n\n\
         [[accelerator.mock.devices]]\nid = \"m0\"\nmemory = \"1g\"\nslot = \"cuda.shares\"\nutilization = 40\n{STATS}"
    );
    let mut c = cluster(db, "floor", ports, "backend = \"dummy\"", &tail);
    let slots = json!({"cpu": 0.25, "mem": "64m", "cuda.shares": 0.5});

    // Bad policies: 400 naming the field, nothing created.
    for (bad, field) in [
        (json!({"idle_timeout": 0}), "idle_timeout"),
        (json!({"max_lifetime": -3}), "max_lifetime"),
        (
            json!({"min_utilization": {"cpu": 150}}),
            "min_utilization.cpu",
        ),
        (
            json!({"min_utilization": {"cuda.device": 10}}),
            "min_utilization.cuda.device",
        ),
        (
            json!({"min_utilization": {"cpu": 5}, "utilization_window": 0}),
            "utilization_window",
        ),
    ] {
        let mut body = json!({"image": TEST_IMAGE, "resource_slots": slots});
        for (k, v) in bad.as_object().unwrap() {
            body[k] = v.clone();
        }
        let a = c.post("/v1/sessions", &body);
        assert_eq!(
            (a.status, a.code()),
            (400, "invalid-request"),
            "{bad}: {a:?}"
        );
        assert!(
            a.body["error"]["message"].as_str().unwrap().contains(field),
            "{bad}: {a:?}"
        );
    }
    assert_eq!(c.concurrency_used(), 0);

    let policy = |floor: f64| json!({"resource_slots": slots, "min_utilization": {"cuda.shares": floor}, "utilization_window": WINDOW});
    let low = create(&c, policy(50.0));
    let high = create(&c, policy(30.0));
    for id in [&low, &high] {
        wait_status(&c, id, "RUNNING", LONG);
    }
    // Its readings reach the manager: the low one's window runs.
    let s = wait_for(LONG, "the low session's window running", || {
        Some(session(&c, &low)).filter(|s| s["utilization_deadline"].is_number())
    });
    assert_eq!(
        s["reclaim"],
        json!({"min_utilization": {"cuda.shares": 50.0}, "utilization_window": WINDOW}),
        "{s}"
    );
    // A restart: the next manager carries on from the store.
    c.stop_manager("TERM");
    c.start_manager();

    let (s, _) = wait_status(&c, &low, "TERMINATED", LONG);
    assert_eq!(s["status_reason"], "low-utilization", "{s}");
    let deadline = assert_warned_then_ended(&c, &low, "low-utilization");
    assert!(s["terminated_at"].as_f64().unwrap() >= deadline, "{s}");
    assert!(
        deadline >= s["created_at"].as_f64().unwrap() + WINDOW,
        "a whole window: {s}"
    );
    // The other one, read above its floor all along: no window, no warning.
    let h = session(&c, &high);
    assert_eq!(
        (&h["status"], &h["utilization_deadline"]),
        (&json!("RUNNING"), &Value::Null),
        "{h}"
    );
    assert_never_warned(&c, &high);
    assert_eq!(reclaims(&c, "low-utilization"), 1.0);
    c.delete(&format!("/v1/sessions/{high}"));
    c.check_invariants();
}

#[test]
fn utilization_floor_sqlite() {
    utilization_floor(Db::Sqlite, 44220);
}

#[test]
fn utilization_floor_postgres() {
    utilization_floor(Db::Postgres, 44240);
}

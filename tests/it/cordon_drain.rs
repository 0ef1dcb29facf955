//! Cordon and drain with real processes (a manager, two Docker agents, real HTTP, the store on
//! SQLite or PostgreSQL): a cordoned agent gets nothing new, with every agent cordoned a new
//! session waits `PENDING` (`agents-cordoned`) until one is uncordoned; a drain with a deadline
//! ends the sessions still on the agent `agent-drained` at the deadline (their containers gone,
//! the metric counting them), one without a deadline leaves them running; the agent stays
//! cordoned after a drain. The routes are admin-only and name known agents; `kernelvisor ctl
//! agent cordon|uncordon|drain` and `ctl agents` through the real binary. On PostgreSQL a second
//! manager replica on the same store shows each change within seconds (it re-reads the row).
//!
//! Agent host ports: 36000–36079 (20 per agent).

use crate::common;

use std::time::{Duration, Instant};

use common::agent::{free_port, TEST_IMAGE};
use common::bai::KillOnDrop;
use common::cluster::{wait_for, Answer, Cluster, Db};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

/// The drain deadline the test asks for, seconds.
const DEADLINE: f64 = 2.0;

fn session_body() -> Value {
    json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}})
}

/// `POST /v1/agents/{id}/{action}` as the admin, `body` when given.
fn admin_post(c: &Cluster, id: &str, action: &str, body: Option<&Value>) -> Answer {
    c.call_as(
        Some(&c.admin_token),
        "POST",
        &format!("/v1/agents/{id}/{action}"),
        body,
    )
}

fn session(c: &Cluster, id: &str) -> Value {
    let a = c.get(&format!("/v1/sessions/{id}")).unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    a.body
}

fn wait_status(c: &Cluster, id: &str, status: &str, limit: Duration) -> Value {
    wait_for(limit, &format!("session {id} {status}"), || {
        Some(session(c, id)).filter(|s| s["status"] == status)
    })
}

/// `kernelvisor ctl --api … ARGS` with `token`: (exit status, stdout, stderr).
fn ctl(c: &Cluster, token: &str, args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .arg("ctl")
        .arg("--api")
        .arg(&c.api)
        .env("KERNELVISOR_TOKEN", token)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Waits until the manager at `api` shows agent `id` with `schedulable` and `draining`.
fn wait_flags(c: &Cluster, api: &str, id: &str, schedulable: bool, draining: bool) -> Value {
    wait_for(
        Duration::from_secs(10),
        &format!("{api} shows {id} schedulable={schedulable} draining={draining}"),
        || {
            let a = c
                .call_at(api, "GET", "/v1/agents", Some(&c.admin_token), None)
                .ok()?;
            let agent = a.body["agents"]
                .as_array()?
                .iter()
                .find(|x| x["agent_id"] == id)?
                .clone();
            (agent["schedulable"] == schedulable && agent["draining"] == draining).then_some(agent)
        },
    )
}

/// The `ctl agents` table row of agent `id`, split into its columns.
fn agents_row(c: &Cluster, id: &str) -> Vec<String> {
    let (code, table, err) = ctl(c, &c.admin_token, &["agents"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        table.lines().next().unwrap().contains("SCHEDULING"),
        "{table}"
    );
    let line = table
        .lines()
        .find(|l| l.starts_with(id))
        .unwrap_or_else(|| panic!("no row of {id}: {table}"));
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .collect()
}

fn cordon_and_drain(db: Db, ports: u16) {
    let mut c = Cluster::new(db);
    // Drain deadlines are checked every half second.
    c.scheduler_extra = "sweep-interval = 0.5\n".into();
    c.start_manager();
    let a = c.add_agent("cordon-a", ports, "");
    let b = c.add_agent("cordon-b", ports + 20, "");
    let (ida, idb) = (c.agents[a].id().to_owned(), c.agents[b].id().to_owned());
    c.wait_agent_status(&ida, "ALIVE", LONG);
    c.wait_agent_status(&idb, "ALIVE", LONG);
    wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    let view = c.agent_view(&ida).unwrap();
    assert_eq!(
        (
            &view["schedulable"],
            &view["draining"],
            &view["drain_deadline"]
        ),
        (&json!(true), &json!(false), &Value::Null),
        "{view}"
    );
    // PostgreSQL: a standby replica, which learns of each change from the store.
    let replica = (db == Db::Postgres).then(|| {
        let port = free_port();
        let child = KillOnDrop(c.spawn_replica("replica", port, free_port()));
        (format!("http://127.0.0.1:{port}"), child)
    });
    let replica_api = replica.as_ref().map(|(api, _)| api.clone());
    if let Some(api) = &replica_api {
        wait_flags(&c, api, &ida, true, false);
    }

    // Admin only, known agents only, a drain body that says what it means.
    for action in ["cordon", "uncordon", "drain"] {
        let path = format!("/v1/agents/{ida}/{action}");
        let user = c.call_as(Some(&c.token), "POST", &path, None);
        assert_eq!((user.status, user.code()), (403, "forbidden"), "{user:?}");
        let anonymous = c.call_as(None, "POST", &path, None);
        assert_eq!(anonymous.status, 401, "{anonymous:?}");
        let unknown = admin_post(&c, "no-such-agent", action, None);
        assert_eq!(
            (unknown.status, unknown.code()),
            (404, "agent-not-found"),
            "{unknown:?}"
        );
        let get = c.call_as(Some(&c.admin_token), "GET", &path, None);
        assert_eq!(get.status, 405, "{get:?}");
    }
    for bad in [
        json!({"deadline": 0}),
        json!({"deadline": -5}),
        json!({"deadline": "2"}),
        json!({"deadline": 2, "force": true}),
        json!([2]),
    ] {
        let r = admin_post(&c, &ida, "drain", Some(&bad));
        assert_eq!(
            (r.status, r.code()),
            (400, "invalid-request"),
            "{bad}: {r:?}"
        );
    }
    assert_eq!(
        c.agent_view(&ida).unwrap()["schedulable"],
        true,
        "a refused request changed nothing"
    );

    // A cordoned agent gets nothing new.
    let r = admin_post(&c, &ida, "cordon", None);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        (
            &r.body["agent_id"],
            &r.body["schedulable"],
            &r.body["draining"]
        ),
        (&json!(ida), &json!(false), &json!(false)),
        "answered as GET /v1/agents shows it: {}",
        r.body
    );
    assert_eq!(r.body["status"], "ALIVE");
    assert_eq!(c.agent_view(&ida).unwrap()["schedulable"], false);
    if let Some(api) = &replica_api {
        wait_flags(&c, api, &ida, false, false);
    }
    let mut on_b = Vec::new();
    for _ in 0..3 {
        let s = c.create_session();
        assert_eq!(
            s["agent_id"],
            idb.as_str(),
            "placed on the cordoned agent: {s}"
        );
        on_b.push(s["session_id"].as_str().unwrap().to_owned());
    }

    // Every agent cordoned: a new session waits, and says why; one that may not wait is refused.
    assert_eq!(admin_post(&c, &idb, "cordon", None).status, 200);
    let refused = c.post(
        "/v1/sessions",
        &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}, "enqueue": false}),
    );
    assert_eq!(
        (refused.status, refused.code()),
        (409, "no-capacity"),
        "{refused:?}"
    );
    let queued = c.post("/v1/sessions", &session_body());
    assert_eq!(queued.status, 201, "{queued:?}");
    assert_eq!(queued.body["status"], "PENDING", "{}", queued.body);
    assert_eq!(
        queued.body["pending_reason"]["code"], "agents-cordoned",
        "{}",
        queued.body
    );
    let waiting = queued.body["session_id"].as_str().unwrap().to_owned();
    // Still waiting a few admission rounds later (a negative check).
    std::thread::sleep(Duration::from_secs(2));
    let s = session(&c, &waiting);
    assert_eq!(
        (&s["status"], &s["pending_reason"]["code"]),
        (&json!("PENDING"), &json!("agents-cordoned")),
        "{s}"
    );

    // Uncordoned: the queued session is admitted there within a few seconds.
    let uncordoned = Instant::now();
    let r = admin_post(&c, &ida, "uncordon", None);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        (&r.body["schedulable"], &r.body["draining"]),
        (&json!(true), &json!(false))
    );
    let s = wait_status(&c, &waiting, "RUNNING", Duration::from_secs(30));
    assert_eq!(s["agent_id"], ida.as_str(), "{s}");
    assert!(
        uncordoned.elapsed() < Duration::from_secs(10),
        "admitted {:?} after the uncordon",
        uncordoned.elapsed()
    );

    // A drain without a deadline leaves B's sessions running; it stays cordoned.
    let r = admin_post(&c, &idb, "drain", None);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        (
            &r.body["schedulable"],
            &r.body["draining"],
            &r.body["drain_deadline"]
        ),
        (&json!(false), &json!(true), &Value::Null),
        "{}",
        r.body
    );
    // Drain with a deadline: A's session ends `agent-drained` at the deadline, not before.
    let drained_before = c.manager_metric("kernelvisor_manager_drained_sessions_total", "");
    let asked = Instant::now();
    let r = admin_post(&c, &ida, "drain", Some(&json!({"deadline": DEADLINE})));
    assert_eq!(r.status, 200, "{r:?}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let deadline = r.body["drain_deadline"].as_f64().expect("a deadline");
    assert!(
        (deadline - (now + DEADLINE)).abs() < 1.5,
        "deadline {deadline}, now {now}"
    );
    assert_eq!(
        (&r.body["schedulable"], &r.body["draining"]),
        (&json!(false), &json!(true))
    );
    if let Some(api) = &replica_api {
        let seen = wait_flags(&c, api, &ida, false, true);
        assert_eq!(seen["drain_deadline"], r.body["drain_deadline"]);
    }
    let ended = wait_status(&c, &waiting, "TERMINATED", Duration::from_secs(30));
    let took = asked.elapsed();
    assert_eq!(ended["status_reason"], "agent-drained", "{ended}");
    assert!(
        took >= Duration::from_secs_f64(DEADLINE - 0.5) && took < Duration::from_secs(10),
        "ended {took:?} after a drain with a {DEADLINE} s deadline"
    );
    assert_eq!(
        c.manager_metric("kernelvisor_manager_drained_sessions_total", "") - drained_before,
        1.0
    );
    // B's sessions, draining without a deadline, outlived several drain checks.
    for id in &on_b {
        assert_eq!(session(&c, id)["status"], "RUNNING", "{id}");
    }
    // A drained agent stays cordoned, and shows so.
    let view = c.agent_view(&ida).unwrap();
    assert_eq!(
        (&view["schedulable"], &view["draining"], &view["kernels"]),
        (&json!(false), &json!(true), &json!(0)),
        "{view}"
    );
    // Its container is gone, the store and the agents agree.
    c.check_invariants();

    // ctl: the SCHEDULING column, cordon/uncordon/drain with their one-line confirmations.
    let row = agents_row(&c, &ida);
    assert_eq!(row[2], "draining (deadline passed)", "{row:?}");
    assert_eq!(
        agents_row(&c, &idb)[2],
        "draining",
        "B drains without a deadline"
    );
    let (code, out, err) = ctl(&c, &c.admin_token, &["agent", "uncordon", &ida]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!("agent {ida} schedulable: new sessions may be placed on it\n")
    );
    assert_eq!(agents_row(&c, &ida)[2], "yes");
    if let Some(api) = &replica_api {
        let seen = wait_flags(&c, api, &ida, true, false);
        assert_eq!(seen["drain_deadline"], Value::Null, "{seen}");
    }
    let (code, out, err) = ctl(&c, &c.admin_token, &["agent", "cordon", &ida]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        out,
        format!("agent {ida} cordoned: no new sessions are placed on it\n")
    );
    assert_eq!(agents_row(&c, &ida)[2], "cordoned");
    let (code, out, err) = ctl(
        &c,
        &c.admin_token,
        &["agent", "drain", &idb, "--deadline", "600"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.starts_with(&format!("agent {idb} draining (deadline in 9m)"))
            || out.starts_with(&format!("agent {idb} draining (deadline in 10m)")),
        "{out}"
    );
    let row = agents_row(&c, &idb);
    assert!(row[2].starts_with("draining (deadline in "), "{row:?}");
    let (code, json_out, err) = ctl(&c, &c.admin_token, &["-o", "json", "agent", "cordon", &idb]);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&json_out).unwrap();
    assert_eq!(
        (&v["schedulable"], &v["draining"]),
        (&json!(false), &json!(true)),
        "a cordon leaves a drain as it is: {v}"
    );
    let (code, _, err) = ctl(&c, &c.token, &["agent", "cordon", &ida]);
    assert_eq!(code, 1);
    assert!(err.contains("forbidden"), "{err}");
    let (code, _, err) = ctl(&c, &c.admin_token, &["agent", "drain", "no-such-agent"]);
    assert_eq!(code, 1);
    assert!(err.contains("agent-not-found"), "{err}");

    for id in &on_b {
        assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 200);
    }
    c.check_invariants();
}

#[test]
fn cordon_and_drain_sqlite() {
    cordon_and_drain(Db::Sqlite, 36000);
}

#[test]
fn cordon_and_drain_postgres() {
    cordon_and_drain(Db::Postgres, 36040);
}

//! No state without a deadline (issue 27): the leader's reconcile sweep resolves every kernel
//! past its transient state's deadline (`[scheduler] preparing-timeout`, `creating-timeout`,
//! `terminating-timeout`, …) by asking its agent, so nothing stays in between forever and a lost
//! answer never leaks a reservation. A manager process and an agent process (CURVE on), the
//! real Docker engine and the test image, the manager's store on SQLite (and PostgreSQL for the
//! sweep's conditional writes); the agent's create is held up with the `fault-injection`
//! feature's `pause_before`.
//!
//! - an agent that does not answer `create_kernels` within the deadline: the kernel ends
//!   `preparing-timeout`, its concurrency comes back, and the session queued behind it is
//!   admitted and runs;
//! - a manager killed while a create is out and started again: no in-flight create remains,
//!   the sweep ends the kernel after its deadline, and the kernel its agent finished creating
//!   meanwhile is destroyed there (every invariant holds);
//! - a row whose answer was lost while its agent runs the kernel is resolved to `RUNNING`;
//! - a DELETE records `TERMINATING` before `TERMINATED` (on the event stream).
//!
//! Agent host ports: 36500–36579 (20 per agent).
#![cfg(feature = "fault-injection")]

use crate::common;

use std::sync::mpsc;
use std::time::Duration;

use common::agent::TEST_IMAGE;
use common::cluster::{wait_for, Cluster, Db};
use kernelvisor::model::session::KernelStatus;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(90);

/// A cluster on SQLite with `scheduler` as its `[scheduler]` lines and one agent ALIVE.
/// Returns it with the agent's cpu total.
fn cluster(ports: u16, scheduler: &str) -> (Cluster, f64) {
    cluster_on(Db::Sqlite, ports, scheduler)
}

/// As [`cluster`], with the manager's store on `db`.
fn cluster_on(db: Db, ports: u16, scheduler: &str) -> (Cluster, f64) {
    let mut c = Cluster::new(db);
    c.scheduler_extra = scheduler.to_owned();
    c.start_manager();
    let a = c.add_agent("stuck", ports, "");
    let id = c.agents[a].id().to_owned();
    let view = c.wait_agent_status(&id, "ALIVE", LONG);
    let cpu = view["slots_total"]["cpu"]
        .as_str()
        .unwrap()
        .parse::<f64>()
        .unwrap();
    (c, cpu)
}

/// The body of a session of `cpu` cores of the test image; its agent pauses `pause` seconds
/// before the `image` stage (before it holds anything) when given.
fn session_body(cpu: f64, pause: Option<f64>) -> Value {
    let mut body =
        json!({"image": TEST_IMAGE, "resource_slots": {"cpu": format!("{cpu:.2}"), "mem": "64m"}});
    if let Some(s) = pause {
        body["_inject"] = json!({"pause_before": ["image", s]});
    }
    body
}

/// POSTs `body` from a thread (the call waits for an agent that does not answer); the HTTP
/// status comes on the channel once it answers (0: no answer).
fn post_in_background(c: &Cluster, body: Value) -> mpsc::Receiver<u16> {
    let (api, token) = (c.api.clone(), c.token.clone());
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let status = match ureq::post(&format!("{api}/v1/sessions"))
            .timeout(Duration::from_secs(300))
            .set("Authorization", &Cluster::bearer(&token))
            .send_json(body)
        {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(_) => 0,
        };
        let _ = tx.send(status);
    });
    rx
}

/// The one live kernel of the store, once there is one in `states`: its id.
fn live_kernel_in(c: &Cluster, states: &[&str]) -> String {
    wait_for(LONG, &format!("a live kernel in {states:?}"), || {
        let live = c.store_live();
        let id = live.keys().next()?.clone();
        let k = c.store_kernel(&id);
        states.contains(&k.status.as_str()).then_some(id)
    })
}

/// The kernel's row once it is `TERMINATED`.
fn terminated(c: &Cluster, id: &str) -> kernelvisor::manager::store::KernelRow {
    wait_for(LONG, &format!("kernel {id} TERMINATED"), || {
        Some(c.store_kernel(id)).filter(|k| k.status == KernelStatus::Terminated)
    })
}

/// The sweep's counter for `state` and `outcome`.
fn resolved(c: &Cluster, state: &str, outcome: &str) -> f64 {
    c.manager_metric(
        "kernelvisor_manager_stuck_kernels_resolved_total",
        &format!("outcome=\"{outcome}\",state=\"{state}\""),
    )
}

#[test]
fn an_agent_that_never_answers_create_ends_at_the_deadline_and_the_queue_moves() {
    let (c, cpu) = cluster(
        36500,
        "create-timeout = 60\npreparing-timeout = 2\ncreating-timeout = 2\nsweep-interval = 0.5",
    );
    // Two sessions of 60% of the agent's cpu: the second fits only once the first is gone.
    let big = cpu * 0.6;
    let answer = post_in_background(&c, session_body(big, Some(30.0)));
    let first = live_kernel_in(&c, &["SCHEDULED", "PREPARING"]);
    let second = c.post("/v1/sessions", &session_body(big, None));
    assert_eq!(second.status, 201, "{second:?}");
    assert_eq!(second.body["status"], "PENDING", "queued: {second:?}");
    let second = second.body["session_id"].as_str().unwrap().to_owned();

    // The agent never answers within `create-timeout`; the sweep ends the kernel after its
    // deadline (never before), whatever the in-flight create call still waits for.
    let k = terminated(&c, &first);
    assert_eq!(
        k.status_reason.as_deref(),
        Some("preparing-timeout"),
        "{k:?}"
    );
    let since = k.admitted_at.unwrap_or(k.created_at);
    assert!(
        k.terminated_at.unwrap() >= since + 2.0,
        "ended before its deadline: {k:?}"
    );
    assert!(
        resolved(&c, "PREPARING", "terminated") + resolved(&c, "SCHEDULED", "terminated") >= 1.0
    );

    // Its reservation is back: the queued session is admitted onto the agent and runs.
    let s = wait_for(LONG, "the queued session RUNNING", || {
        Some(c.store_kernel(&second)).filter(|k| k.status == KernelStatus::Running)
    });
    assert!(s.admitted_at.is_some(), "{s:?}");
    assert_eq!(c.concurrency_used(), 1, "only the second session holds one");
    // The agent goes on after its pause and refuses the first kernel (the second holds the
    // room now): the create call that still waited answers an error, and what the sweep
    // decided stands (the row is kept, not discarded).
    let status = answer.recv_timeout(LONG).expect("the first create answers");
    assert!(status >= 400, "the late create failed: {status}");
    let k = c.store_kernel(&first);
    assert_eq!(
        (k.status.as_str(), k.status_reason.as_deref()),
        ("TERMINATED", Some("preparing-timeout"))
    );
    assert_eq!(c.store_kernel(&second).status, KernelStatus::Running);
    assert_eq!(c.concurrency_used(), 1);
    let d = c.delete(&format!("/v1/sessions/{second}"));
    assert_eq!(d.status, 200, "{d:?}");
    assert_eq!(c.concurrency_used(), 0);
}

#[test]
fn a_manager_restarted_mid_create_ends_the_kernel_and_its_agent_drops_it() {
    let (mut c, _) = cluster(
        36520,
        "preparing-timeout = 3\ncreating-timeout = 3\nsweep-interval = 0.5",
    );
    let _answer = post_in_background(&c, session_body(0.25, Some(10.0)));
    let id = live_kernel_in(&c, &["PREPARING"]);
    // The create call dies with the manager; nothing will ever answer it.
    c.stop_manager("KILL");
    c.start_manager();
    let k = terminated(&c, &id);
    assert_eq!(
        k.status_reason.as_deref(),
        Some("preparing-timeout"),
        "{k:?}"
    );
    assert_eq!(c.concurrency_used(), 0, "the reservation is released");
    // The agent finishes the create after its pause; the sweep's destroy (queued behind the
    // create on the agent) removes it: store, agent and engine agree again.
    c.check_invariants();
    assert!(c.agent_kernels(0).is_empty());
    assert!(resolved(&c, "PREPARING", "terminated") >= 1.0);
}

#[test]
fn a_lost_answer_of_a_running_kernel_resolves_to_running_sqlite() {
    lost_answer_resolves_to_running(Db::Sqlite, 36540);
}

#[test]
fn a_lost_answer_of_a_running_kernel_resolves_to_running_postgres() {
    lost_answer_resolves_to_running(Db::Postgres, 36560);
}

fn lost_answer_resolves_to_running(db: Db, ports: u16) {
    let (c, _) = cluster_on(
        db,
        ports,
        "creating-timeout = 2\nterminating-timeout = 2\nsweep-interval = 0.5",
    );
    let s = c.post("/v1/sessions", &session_body(0.25, None));
    assert_eq!(s.status, 201, "{s:?}");
    let sid = s.body["session_id"].as_str().unwrap().to_owned();
    let id = wait_for(LONG, "RUNNING", || {
        Some(c.store_kernel(&sid)).filter(|k| k.status == KernelStatus::Running)
    })
    .id;
    // `kernel_started` applied first: arriving after the row is rewound below, it would move it
    // to RUNNING itself and the sweep would have nothing to resolve (seen once in a clean run).
    wait_for(LONG, "kernel_started applied", || {
        (c.manager_metric(
            "kernelvisor_manager_events_applied_total",
            "name=\"kernel_started\"",
        ) >= 1.0)
            .then_some(())
    });
    // The row as if neither `create_kernels`' answer nor `kernel_started` ever reached the
    // store: `CREATING` since long ago.
    let url = c.store_url.clone();
    let kid = id.clone();
    c.store(move |_| {
        Box::pin(async move {
            use sqlx::{Connection, Executor};
            let mut conn = sqlx::AnyConnection::connect(&url).await.unwrap();
            conn.execute(
                sqlx::query(
                    "UPDATE kernels SET status = 'CREATING', status_changed_at = 1 WHERE id = $1",
                )
                .bind(kid),
            )
            .await
            .unwrap();
        })
    });
    let k = wait_for(LONG, "the sweep resolves it RUNNING", || {
        Some(c.store_kernel(&id)).filter(|k| k.status == KernelStatus::Running)
    });
    assert!(k.status_changed_at > 1.0, "{k:?}");
    assert!(resolved(&c, "CREATING", "running") >= 1.0);
    assert_eq!(
        c.concurrency_used(),
        1,
        "the reservation stays with the running kernel"
    );

    // A DELETE records `TERMINATING` before `TERMINATED` (the stream's history shows both).
    let d = c.delete(&format!("/v1/sessions/{sid}"));
    assert_eq!(d.status, 200, "{d:?}");
    assert_eq!(d.body["status"], "TERMINATED", "{d:?}");
    let body = ureq::get(&format!("{}/v1/events?session_id={sid}", c.api))
        .timeout(Duration::from_secs(30))
        .set("Authorization", &c.auth())
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let statuses: Vec<String> = body
        .split("\n\n")
        .filter_map(|f| f.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter(|e| e["type"] == "session_status")
        .filter_map(|e| e["status"].as_str().map(str::to_owned))
        .collect();
    let at = |s: &str| statuses.iter().position(|x| x == s);
    assert!(
        at("TERMINATING").is_some() && at("TERMINATING") < at("TERMINATED"),
        "{statuses:?}"
    );
    assert_eq!(
        c.store_kernel(&id).status_reason.as_deref(),
        Some("user-requested")
    );
    c.check_invariants();
}

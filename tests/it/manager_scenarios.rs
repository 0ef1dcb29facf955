//! The four scenarios of `docs/scenarios.md` end to end: a manager process and agent processes
//! (the `kernelvisor` binary, CURVE on), the real Docker engine, 0.5 s heartbeats and health
//! checks, a 2 s heartbeat timeout and a 2.5 s start-up grace ([`Cluster::fractional_intervals`]);
//! scenario 4 on SQLite keeps whole seconds (1 s heartbeats, a 3 s timeout), the intervals of
//! every other cluster test. Each runs with the manager on SQLite and on PostgreSQL and
//! ends with every invariant checked against the store, the engine and the agents.
//! Also: bad API requests get 4xx with a stable code and leave nothing half-created.
//!
//! Agent host ports: 32000–32259 (20 per agent).

use crate::common;

use std::time::Duration;

use common::agent::TEST_IMAGE;
use common::cluster::{signal, Cluster, Db};
use kernelvisor::model::session::KernelStatus;
use serde_json::json;

const LONG: Duration = Duration::from_secs(60);

/// A cluster on `db` at fractional intervals.
fn cluster(db: Db) -> Cluster {
    let mut c = Cluster::new(db);
    c.fractional_intervals();
    c
}

/// Scenario 1: the manager runs; an agent starts → agent_started, then heartbeats every
/// interval; the agent is ALIVE with its slots. Then a session runs code on it.
fn agent_start(db: Db, ports: u16) {
    let mut c = cluster(db);
    c.start_manager();
    let a = c.add_agent("start", ports, "");
    let id = c.agents[a].id().to_owned();
    let view = c.wait_agent_status(&id, "ALIVE", LONG);
    assert!(
        view["slots_total"]["cpu"]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap()
            > 0.0,
        "slots reported: {view}"
    );
    assert!(
        view["slots_total"]["mem"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert_eq!(
        view["addr"],
        format!("tcp://localhost:{}", c.agents[a].fixture.rpc_port),
        "the advertised RPC address"
    );
    common::cluster::wait_for(LONG, "agent_started applied", || {
        (c.manager_metric("kernelvisor_manager_events_applied_total", "agent_started") >= 1.0)
            .then_some(())
    });
    let hb0 = c.manager_metric("kernelvisor_manager_heartbeats_total", "");
    let t0 = c.agent_view(&id).unwrap()["last_heartbeat"]
        .as_f64()
        .unwrap();
    // Two more heartbeats, their spacing read on the agent's own clock (the `ts` each carries,
    // kept as `last_heartbeat`), not on this test's: a heartbeat every interval, however slowly a
    // loaded machine lets the test poll. (`t0` is read after `hb0` and `t1` before `hb1`, so
    // `hb1 - hb0` beats cover at least `t1 - t0`.)
    let (t1, hb1) = common::cluster::wait_for(LONG, "two more heartbeats", || {
        let t1 = c.agent_view(&id)?["last_heartbeat"].as_f64()?;
        let hb1 = c.manager_metric("kernelvisor_manager_heartbeats_total", "");
        (hb1 >= hb0 + 2.0 && t1 > t0).then_some((t1, hb1))
    });
    assert!(
        hb1 >= hb0 + 2.0 && (t1 - t0) / (hb1 - hb0) <= 1.5 * c.heartbeat_interval,
        "a heartbeat every {} s: {} beats over {:.2} s of the agent's clock",
        c.heartbeat_interval,
        hb1 - hb0,
        t1 - t0
    );
    assert!(t1 > t0);

    let s = c.create_session();
    assert_eq!(s["agent_id"], id.as_str());
    assert_eq!(s["status"], "RUNNING");
    let sid = s["session_id"].as_str().unwrap();
    let out = c.post(
        &format!("/v1/sessions/{sid}/execute"),
        &json!({"code": "echo hello from $((6*7))", "timeout": 20}),
    );
    assert_eq!(out.status, 200, "{out:?}");
    assert_eq!(out.body["exitCode"], 0);
    assert_eq!(out.body["console"][0][1], "hello from 42\n");
    assert_eq!(c.concurrency_used(), 1);
    c.check_invariants();
    assert_eq!(
        c.delete(&format!("/v1/sessions/{sid}")).body["status"],
        "TERMINATED"
    );
    assert_eq!(c.concurrency_used(), 0);
    c.check_invariants();
}

/// Scenario 2: an agent with a few kernels is stopped with SIGTERM and started again.
fn agent_restart(db: Db, ports: u16, terminate: bool) {
    let mut c = cluster(db);
    c.start_manager();
    let a = c.add_agent(
        "restart",
        ports,
        if terminate {
            "on-shutdown = \"terminate\""
        } else {
            ""
        },
    );
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);
    let kernels: Vec<String> = (0..3)
        .map(|_| c.create_session()["kernel_id"].as_str().unwrap().to_owned())
        .collect();
    c.check_invariants();
    let terminated_before = c.manager_metric(
        "kernelvisor_manager_events_applied_total",
        "kernel_terminated",
    );
    let started_before =
        c.manager_metric("kernelvisor_manager_events_applied_total", "agent_started");

    c.stop_agent(a);
    c.wait_agent_status(&id, "TERMINATED", LONG);
    if terminate {
        // kernel_terminated for each, then agent_terminated: nothing is live, nothing runs.
        assert!(
            c.store_live().is_empty(),
            "every kernel terminated: {:?}",
            c.store_live()
        );
        for k in &kernels {
            assert_eq!(
                c.store_kernel(k).status_reason.as_deref(),
                Some("agent-shutdown")
            );
        }
        assert_eq!(
            c.manager_metric(
                "kernelvisor_manager_events_applied_total",
                "kernel_terminated"
            ),
            terminated_before + 3.0
        );
        assert_eq!(c.concurrency_used(), 0);
        assert!(c.running_containers(a).is_empty());
    } else {
        // Containers keep running; the kernels stay RUNNING on the manager.
        assert_eq!(c.running_containers(a).len(), 3);
        for k in &kernels {
            assert_eq!(c.store_kernel(k).status, KernelStatus::Running);
        }
    }

    c.start_agent(a);
    c.wait_agent_status(&id, "ALIVE", LONG);
    common::cluster::wait_for(LONG, "agent_started applied again", || {
        (c.manager_metric("kernelvisor_manager_events_applied_total", "agent_started")
            > started_before)
            .then_some(())
    });
    if !terminate {
        for k in &kernels {
            assert_eq!(
                c.store_kernel(k).status,
                KernelStatus::Running,
                "re-attached, still running"
            );
        }
        assert_eq!(
            c.manager_metric(
                "kernelvisor_manager_events_applied_total",
                "kernel_terminated"
            ),
            terminated_before,
            "no kernel_terminated"
        );
        assert_eq!(c.concurrency_used(), 3);
        // The re-attached kernels still serve. The pool may still hold the entry it marked
        // unhealthy while the agent was down: 502 `agent-unavailable` until its next health check
        // heals it (`health-check-interval`), so a client retries that code.
        let out = common::cluster::wait_for(LONG, "execute on a re-attached kernel", || {
            let out = c.post(
                &format!("/v1/sessions/{}/execute", kernels[0]),
                &json!({"code": "echo still here"}),
            );
            (out.code() != "agent-unavailable").then_some(out)
        });
        assert_eq!(out.body["console"][0][1], "still here\n", "{out:?}");
    }
    c.check_invariants();
}

/// Scenario 3: the manager restarts while agents run kernels; a kernel ends while it is down.
fn manager_restart(db: Db, ports: u16) {
    let mut c = cluster(db);
    c.start_manager();
    let a = c.add_agent("mgr", ports, "");
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);
    let sessions: Vec<serde_json::Value> = (0..3).map(|_| c.create_session()).collect();
    c.check_invariants();

    c.stop_manager("KILL");
    // While it is down: one kernel ends on the agent (its kernel_terminated waits in the outbox).
    let gone = sessions[0]["kernel_id"].as_str().unwrap().to_owned();
    c.agent_call(
        a,
        "destroy_kernel",
        vec![
            gone.clone().into(),
            sessions[0]["session_id"].as_str().unwrap().into(),
            "user-requested".into(),
        ],
    );
    common::cluster::wait_for(LONG, "the agent queues its events", || {
        (c.agent_metric(a, "kernelvisor_outbox_depth")? >= 1.0).then_some(())
    });
    // The manager stays down a while (a deliberate outage: the agent retries meanwhile).
    std::thread::sleep(Duration::from_secs(2));

    c.start_manager();
    // Start-up grace: kernel API calls get 503 with Retry-After.
    let during = c.get("/v1/sessions").unwrap();
    assert_eq!(during.status, 503, "{during:?}");
    assert_eq!(during.code(), "starting-up");
    assert!(
        during
            .retry_after
            .as_deref()
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|s| s >= 1),
        "{during:?}"
    );
    let create = c.post("/v1/sessions", &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}, "access_key": c.access_key}));
    assert_eq!(create.status, 503);
    assert_eq!(c.get("/health").unwrap().body["mode"], "grace");

    common::cluster::wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    common::cluster::wait_for(LONG, "the ended kernel released", || {
        (c.store_kernel(&gone).status == KernelStatus::Terminated).then_some(())
    });
    for s in &sessions[1..] {
        assert_eq!(
            c.store_kernel(s["kernel_id"].as_str().unwrap()).status,
            KernelStatus::Running
        );
    }
    assert_eq!(c.concurrency_used(), 2);
    assert_eq!(c.agent_view(&id).unwrap()["status"], "ALIVE");
    c.check_invariants();
    // Normal service: a new session.
    c.create_session();
    c.check_invariants();
}

/// Scenario 4: the agent is suspended past the heartbeat timeout, then resumed.
fn agent_suspended(db: Db, ports: u16, fractional: bool) {
    let mut c = if fractional {
        cluster(db)
    } else {
        Cluster::new(db)
    };
    c.start_manager();
    let a = c.add_agent("stop", ports, "");
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);
    let kernels: Vec<String> = (0..2)
        .map(|_| c.create_session()["kernel_id"].as_str().unwrap().to_owned())
        .collect();
    c.check_invariants();
    let terminated_before = c.manager_metric(
        "kernelvisor_manager_events_applied_total",
        "kernel_terminated",
    );
    let started_before =
        c.manager_metric("kernelvisor_manager_events_applied_total", "agent_started");

    let pid = c.agents[a].pid();
    signal(pid, "STOP");
    c.wait_agent_status(&id, "LOST", Duration::from_secs(20));
    // Its kernels left the live set and their concurrency came back.
    assert!(c.store_live().is_empty());
    for k in &kernels {
        assert_eq!(
            c.store_kernel(k).status_reason.as_deref(),
            Some("agent-lost")
        );
    }
    assert_eq!(c.concurrency_used(), 0);
    assert_eq!(
        c.manager_metric("kernelvisor_manager_agents_lost_total", ""),
        1.0
    );
    // No placement on a lost agent: a session waits for one (`no-alive-agent`), or with
    // `enqueue: false` is refused.
    let refused = c.post("/v1/sessions", &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}, "access_key": c.access_key, "enqueue": false}));
    assert_eq!(refused.code(), "no-agents", "{refused:?}");
    let queued = c.post(
        "/v1/sessions",
        &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}}),
    );
    assert_eq!(queued.body["status"], "PENDING", "{queued:?}");
    assert_eq!(
        queued.body["pending_reason"]["code"], "no-alive-agent",
        "{queued:?}"
    );
    let cancelled = c.delete(&format!(
        "/v1/sessions/{}",
        queued.body["session_id"].as_str().unwrap()
    ));
    assert_eq!(cancelled.body["status"], "CANCELLED", "{cancelled:?}");

    signal(pid, "CONT");
    // PENDING until reset_instance returns, then ALIVE with no kernels.
    c.wait_agent_status(&id, "ALIVE", LONG);
    assert_eq!(
        c.manager_metric("kernelvisor_manager_agent_resets_total", "ok"),
        1.0
    );
    assert!(c.agent_kernels(a).is_empty(), "a fresh agent");
    assert!(
        c.running_containers(a).is_empty(),
        "its containers are gone"
    );
    assert_eq!(
        c.manager_metric("kernelvisor_manager_events_applied_total", "agent_started"),
        started_before,
        "no agent_started"
    );
    assert_eq!(
        c.manager_metric(
            "kernelvisor_manager_events_applied_total",
            "kernel_terminated"
        ),
        terminated_before,
        "no kernel_terminated"
    );
    assert_eq!(c.concurrency_used(), 0, "never negative");
    c.check_invariants();
    // It takes kernels again.
    let s = c.create_session();
    assert_eq!(s["agent_id"], id.as_str());
    c.check_invariants();
}

/// Bad requests: 4xx with a stable code; nothing half-created.
fn bad_requests(db: Db, ports: u16) {
    let mut c = cluster(db);
    c.start_manager();
    let a = c.add_agent("bad", ports, "");
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);
    common::cluster::wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    let ak = c.access_key.clone();
    let cases = [
        (
            // A registry nobody listens on (a missing image in a registry that answers is
            // `image-not-found`: tests/it/images.rs).
            json!({"image": "127.0.0.1:1/kernelvisor-no-such-image:9", "resource_slots": {"cpu": 0.25, "mem": "64m"}, "access_key": ak}),
            502,
            "registry-unreachable",
        ),
        (
            json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 4096, "mem": "64m"}, "access_key": ak}),
            400,
            "slots-exceed-capacity",
        ),
        (
            json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m", "tpu": 1}, "access_key": ak}),
            400,
            "unknown-slot",
        ),
        (
            json!({"image": TEST_IMAGE, "resource_slots": {"cpu": -1, "mem": "64m"}, "access_key": ak}),
            400,
            "invalid-request",
        ),
        (
            json!({"resource_slots": {"cpu": 0.25, "mem": "64m"}}),
            400,
            "invalid-request",
        ),
        (
            // Only an admin creates on behalf of another key.
            json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}, "access_key": "AKNOSUCHKEY"}),
            403,
            "forbidden",
        ),
        (
            json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}, "access_key": ak, "mounts": [{"name": "../etc", "host_path": "/etc"}]}),
            400,
            "invalid-request",
        ),
    ];
    for (body, status, code) in cases {
        let r = c.post("/v1/sessions", &body);
        assert_eq!((r.status, r.code()), (status, code), "{body} → {r:?}");
        assert!(!r.body["error"]["message"].as_str().unwrap().is_empty());
    }
    let r = c.post_raw("/v1/sessions", "{\"image\": ");
    assert_eq!((r.status, r.code()), (400, "invalid-request"), "{r:?}");
    for (r, code) in [
        (
            c.get("/v1/sessions/00000000-0000-0000-0000-000000000000")
                .unwrap(),
            "session-not-found",
        ),
        (
            c.delete("/v1/sessions/00000000-0000-0000-0000-000000000000"),
            "session-not-found",
        ),
        (
            c.post(
                "/v1/sessions/00000000-0000-0000-0000-000000000000/execute",
                &json!({"code": "true"}),
            ),
            "session-not-found",
        ),
        (
            c.get_as(Some(&c.admin_token), "/v1/access-keys/AKNOSUCHKEY")
                .unwrap(),
            "access-key-not-found",
        ),
        (c.get("/v1/nothing-here").unwrap(), "not-found"),
    ] {
        assert_eq!((r.status, r.code()), (404, code), "{r:?}");
    }
    // Nothing half-created: no live kernel, no container, no concurrency taken, no reservation row.
    assert!(c.store_live().is_empty());
    assert_eq!(c.concurrency_used(), 0);
    assert!(c.running_containers(a).is_empty());
    assert!(
        c.store(|s| Box::pin(async move { s.kernels(None, true).await.unwrap() }))
            .is_empty(),
        "refused requests leave no rows"
    );
    // The manager still serves: a good request after the bad ones.
    let s = c.create_session();
    let sid = s["session_id"].as_str().unwrap();
    let bad_exec = c.post(&format!("/v1/sessions/{sid}/execute"), &json!({"code": 42}));
    assert_eq!((bad_exec.status, bad_exec.code()), (400, "invalid-request"));
    let timed_out = c.post(
        &format!("/v1/sessions/{sid}/execute"),
        &json!({"code": "sleep 30", "timeout": 1}),
    );
    assert_eq!(timed_out.body["status"], "exec-timeout", "{timed_out:?}");
    c.delete(&format!("/v1/sessions/{sid}"));
    let again = c.post(
        &format!("/v1/sessions/{sid}/execute"),
        &json!({"code": "true"}),
    );
    assert_eq!((again.status, again.code()), (409, "session-not-running"));
    c.check_invariants();
}

/// Resource slots as data through the real API, against an agent without accelerators (it
/// advertises `slot_key_and_units` `{cpu, mem}`): its slots and types as the manager shows them,
/// a slot no agent has (`rocm.device`, `cuda.device`, even at 0) → 400 `unknown-slot`, more
/// than any agent has → 400 `slots-exceed-capacity`, bad amounts → 400 `invalid-request` naming
/// the slot, and a session's slots held and released.
fn resource_slots(db: Db, ports: u16) {
    let mut c = cluster(db);
    c.start_manager();
    let a = c.add_agent("slots", ports, "");
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);
    common::cluster::wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    let view = c.agent_view(&id).unwrap();
    assert_eq!(
        view["slot_types"],
        json!({"cpu": "count", "mem": "bytes"}),
        "{view}"
    );
    assert!(view["slots_total"].get("cuda.device").is_none(), "{view}");
    assert!(
        view["slots_total"]["cpu"]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap()
            > 0.0
    );
    assert_eq!(view["slots_used"]["cpu"], "0", "{view}");
    let ak = c.access_key.clone();
    let body = |slots: serde_json::Value| json!({"image": TEST_IMAGE, "resource_slots": slots, "access_key": ak});
    for (slots, status, code, word) in [
        (
            json!({"cpu": 0.25, "mem": "64m", "rocm.device": 1}),
            400,
            "unknown-slot",
            "rocm.device",
        ),
        (
            json!({"cpu": 0.25, "mem": "64m", "cuda.device": 1}),
            400,
            "unknown-slot",
            "cuda.device",
        ),
        (
            json!({"cpu": 0.25, "mem": "64m", "cuda.device": 0}),
            400,
            "unknown-slot",
            "cuda.device",
        ),
        (
            json!({"cpu": 4096, "mem": "64m"}),
            400,
            "slots-exceed-capacity",
            "cpu",
        ),
        (
            json!({"cpu": "0.0001", "mem": "64m"}),
            400,
            "invalid-request",
            "cpu",
        ),
        (
            json!({"cpu": 0.25, "mem": -1}),
            400,
            "invalid-request",
            "mem",
        ),
    ] {
        let r = c.post("/v1/sessions", &body(slots.clone()));
        assert_eq!((r.status, r.code()), (status, code), "{slots} → {r:?}");
        let message = r.body["error"]["message"].as_str().unwrap();
        assert!(message.contains(word), "{slots} → {message}");
    }
    assert!(c.store_live().is_empty());
    // The session shows every slot it asked for, as decimal strings.
    let r = c.post("/v1/sessions", &body(json!({"cpu": "0.25", "mem": "64m"})));
    assert_eq!(r.status, 201, "{r:?}");
    let sid = r.body["session_id"].as_str().unwrap().to_owned();
    let shown = c.get(&format!("/v1/sessions/{sid}")).unwrap();
    assert_eq!(
        shown.body["resource_slots"],
        json!({"cpu": "0.25", "mem": "67108864"}),
        "{shown:?}"
    );
    let view = c.agent_view(&id).unwrap();
    assert_eq!(
        (&view["slots_used"]["cpu"], &view["slots_used"]["mem"]),
        (&json!("0.25"), &json!("67108864")),
        "{view}"
    );
    c.check_invariants();
    c.delete(&format!("/v1/sessions/{sid}"));
    c.check_invariants();
    assert_eq!(c.agent_view(&id).unwrap()["slots_used"]["cpu"], "0");
}

#[test]
fn resource_slots_sqlite() {
    resource_slots(Db::Sqlite, 33300);
}

#[test]
fn resource_slots_postgres() {
    resource_slots(Db::Postgres, 33320);
}

#[test]
fn scenario_1_agent_start_sqlite() {
    agent_start(Db::Sqlite, 32000);
}

#[test]
fn scenario_1_agent_start_postgres() {
    agent_start(Db::Postgres, 32020);
}

#[test]
fn scenario_2_agent_restart_preserve_sqlite() {
    agent_restart(Db::Sqlite, 32040, false);
}

#[test]
fn scenario_2_agent_restart_preserve_postgres() {
    agent_restart(Db::Postgres, 32060, false);
}

#[test]
fn scenario_2_agent_restart_terminate_sqlite() {
    agent_restart(Db::Sqlite, 32080, true);
}

#[test]
fn scenario_2_agent_restart_terminate_postgres() {
    agent_restart(Db::Postgres, 32100, true);
}

#[test]
fn scenario_3_manager_restart_sqlite() {
    manager_restart(Db::Sqlite, 32120);
}

#[test]
fn scenario_3_manager_restart_postgres() {
    manager_restart(Db::Postgres, 32140);
}

/// The one liveness scenario kept at whole seconds (1 s heartbeats, a 3 s timeout).
#[test]
fn scenario_4_agent_suspended_sqlite() {
    agent_suspended(Db::Sqlite, 32160, false);
}

#[test]
fn scenario_4_agent_suspended_postgres() {
    agent_suspended(Db::Postgres, 32180, true);
}

#[test]
fn bad_requests_sqlite() {
    bad_requests(Db::Sqlite, 32200);
}

#[test]
fn bad_requests_postgres() {
    bad_requests(Db::Postgres, 32220);
}

/// `kernelvisor ctl` against a live manager: tables, `-o json`, exec exit codes, errors.
#[test]
fn ctl_cli_against_a_live_manager() {
    let mut c = Cluster::new(Db::Sqlite);
    c.start_manager();
    let a = c.add_agent("ctl", 32240, "");
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);
    common::cluster::wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    let ctl = |args: &[&str]| {
        // Listing agents is an admin's; sessions are the user key's.
        let token = if args[0] == "agents" {
            &c.admin_token
        } else {
            &c.token
        };
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
    };
    let (code, table, _) = ctl(&["agents"]);
    assert_eq!(code, 0);
    assert!(
        table.contains("STATUS") && table.contains(&id) && table.contains("ALIVE"),
        "{table}"
    );

    let (code, created, err) = ctl(&[
        "-o",
        "json",
        "session",
        "create",
        "--image",
        TEST_IMAGE,
        "--cpu",
        "0.25",
        "--mem",
        "64m",
        "--env",
        "GREETING=hi",
    ]);
    assert_eq!(code, 0, "{err}");
    let created: serde_json::Value = serde_json::from_str(&created).unwrap();
    let sid = created["session_id"].as_str().unwrap().to_owned();
    assert_eq!(created["agent_id"], id.as_str());

    let (code, out, _) = ctl(&["session", "exec", &sid, "echo $GREETING; exit 3"]);
    assert_eq!(
        (code, out.as_str()),
        (3, "hi\n"),
        "exit status of the code is ctl's"
    );
    let (code, sessions, _) = ctl(&["sessions"]);
    assert_eq!(code, 0);
    assert!(
        sessions.contains(&sid) && sessions.contains("RUNNING"),
        "{sessions}"
    );
    let (code, json, _) = ctl(&["-o", "json", "access-key", "show", &c.access_key]);
    assert_eq!(code, 0);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&json).unwrap()["concurrency_used"],
        1
    );

    let (code, _, err) = ctl(&["session", "show", "no-such-session"]);
    assert_eq!(code, 1);
    assert!(err.contains("session-not-found"), "{err}");
    let (code, _, _) = ctl(&["session", "rm", &sid]);
    assert_eq!(code, 0);
    assert_eq!(c.concurrency_used(), 0);
    c.check_invariants();

    let (code, _, err) = std::process::Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .args(["ctl", "--api", "http://127.0.0.1:1", "agents"])
        .output()
        .map(|o| {
            (
                o.status.code().unwrap_or(-1),
                (),
                String::from_utf8_lossy(&o.stderr).into_owned(),
            )
        })
        .unwrap();
    assert_eq!(code, 3, "unreachable API: {err}");
}

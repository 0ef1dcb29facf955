//! Dangling kernels resolved (seed 001; issue 15, part 5), end to end: a manager process and an
//! agent process (the `kernelvisor` binary, CURVE on), the real Docker engine, the manager on
//! SQLite with `dangling-grace` shortened to 3 s.
//!
//! Store loss: an agent with three kernels is stopped, its SQLite file deleted, started again.
//! All three are reported dangling (with a description rebuilt from the engine), the manager
//! adopts them, they are `RUNNING` with their original host ports, `execute` works in them, and
//! every invariant of `docs/scenarios.md` holds; a labelled container the manager does not know
//! is destroyed after the grace.
//!
//! Agent host ports: 33000–33019.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::agent::{docker, field, inspect, run_id, TEST_IMAGE};
use common::cluster::{wait_for, Cluster, Db};
use kernelvisor::rpc::{Call, CallError};
use rmpv::Value;
use serde_json::{json, Value as Json};

const LONG: Duration = Duration::from_secs(60);
const GRACE: Duration = Duration::from_secs(3);

/// The host ports of a session's services (`GET /v1/sessions/{id}/services`), retrying the
/// transient `agent-unavailable` of a pool entry that has not healed yet.
fn host_ports(c: &Cluster, session: &str) -> Vec<Json> {
    let a = wait_for(LONG, "the session's services", || {
        let a = c.get(&format!("/v1/sessions/{session}/services")).ok()?;
        (a.code() != "agent-unavailable").then_some(a)
    });
    assert_eq!(a.status, 200, "{a:?}");
    a.body["services"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| json!({"name": s["name"], "host_ports": s["host_ports"]}))
        .collect()
}

/// A failed agent call's FAILURE name.
fn failure(c: &Cluster, method: &str, args: Vec<Value>) -> String {
    let (rt, peer) = c.agent_peer(0);
    let r = rt.block_on(peer.call(
        method,
        &Call {
            args,
            kwargs: vec![],
            peer_user_id: None,
        },
        Duration::from_secs(30),
    ));
    peer.close();
    match r {
        Err(CallError::Failure(meta)) => meta.name,
        other => panic!("{method}: expected a FAILURE, got {other:?}"),
    }
}

fn store_loss(db: Db, ports: u16) {
    let mut c = Cluster::new(db);
    c.manager_extra = format!("dangling-grace = {}", GRACE.as_secs());
    c.start_manager();
    let a = c.add_agent("dangling", ports, "");
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);

    let body = json!({
        "image": TEST_IMAGE,
        "resource_slots": {"cpu": 0.25, "mem": "64m"},
        "service_ports": [{"name": "p", "protocol": "tcp", "container_ports": [8000]}],
    });
    let mut sessions = Vec::new();
    let mut kernels = BTreeSet::new();
    for _ in 0..3 {
        let s = c.post("/v1/sessions", &body);
        assert_eq!(s.status, 201, "create session: {s:?}");
        assert_eq!(s.body["status"], "RUNNING");
        sessions.push(s.body["session_id"].as_str().unwrap().to_owned());
        kernels.insert(s.body["kernel_id"].as_str().unwrap().to_owned());
    }
    let ports_before: Vec<Vec<Json>> = sessions.iter().map(|s| host_ports(&c, s)).collect();
    for p in &ports_before {
        assert!(
            p.iter()
                .any(|s| s["name"] == "p" && s["host_ports"][0].is_u64()),
            "service port p is published: {p:?}"
        );
    }
    c.check_invariants();

    // Stop the agent (containers preserved), lose its store, and add a container with its id
    // label that the manager never placed.
    c.stop_agent(a);
    c.wait_agent_status(&id, "TERMINATED", LONG);
    assert_eq!(c.running_containers(a), kernels, "containers kept running");
    let var = c.agents[a].fixture.dir.path().join("var");
    for f in ["agent.db", "agent.db-wal", "agent.db-shm"] {
        let _ = std::fs::remove_file(var.join(f));
    }
    assert!(!var.join("agent.db").exists(), "the store is gone");
    let ghost_kernel = format!("ghost-{}", run_id());
    let ghost = docker(&[
        "run",
        "-d",
        "--label",
        &format!("ai.backend.agent-id={id}"),
        "--label",
        &format!("ai.backend.kernel-id={ghost_kernel}"),
        TEST_IMAGE,
    ]);
    assert!(!ghost.is_empty(), "docker run the unknown container");
    let reported_before = c.manager_metric(
        "kernelvisor_manager_events_applied_total",
        "kernel_dangling",
    );

    c.start_agent(a);
    let started = Instant::now();
    c.wait_agent_status(&id, "ALIVE", LONG);
    // Four reports: the three kernels and the unknown container.
    wait_for(LONG, "four kernel_dangling events applied", || {
        (c.manager_metric(
            "kernelvisor_manager_events_applied_total",
            "kernel_dangling",
        ) >= reported_before + 4.0)
            .then_some(())
    });
    if started.elapsed() < GRACE {
        assert_eq!(
            inspect(&ghost, "{{.State.Running}}").as_deref(),
            Some("true"),
            "the unknown container is left alone during the grace"
        );
    }
    wait_for(LONG, "three dangling kernels adopted", || {
        (c.manager_metric(
            "kernelvisor_manager_dangling_kernels_total",
            "action=\"adopted\"",
        ) >= 3.0)
            .then_some(())
    });
    assert_eq!(
        c.agent_kernels(a),
        kernels,
        "the agent runs them as kernels"
    );
    for (s, before) in sessions.iter().zip(&ports_before) {
        let k = c.store_kernel(s);
        assert_eq!(k.status, "RUNNING", "{s}");
        assert_eq!(&host_ports(&c, s), before, "{s}: original host ports");
        let out = wait_for(LONG, "execute in an adopted kernel", || {
            let out = c.post(
                &format!("/v1/sessions/{s}/execute"),
                &json!({"code": "echo adopted $((6*7))", "timeout": 20}),
            );
            (out.code() != "agent-unavailable").then_some(out)
        });
        assert_eq!(out.status, 200, "{out:?}");
        assert_eq!(out.body["console"][0][1], "adopted 42\n", "{out:?}");
    }
    assert_eq!(c.concurrency_used(), 3);

    // The unknown container goes once the grace is over; nothing else does.
    wait_for(
        Duration::from_secs(30),
        "the unknown container destroyed",
        || inspect(&ghost, "{{.Id}}").is_none().then_some(()),
    );
    assert!(
        started.elapsed() >= GRACE,
        "destroyed only after dangling-grace"
    );
    assert!(
        c.manager_metric(
            "kernelvisor_manager_dangling_kernels_total",
            "action=\"destroyed\""
        ) >= 1.0
    );
    assert_eq!(
        failure(&c, "adopt_kernel", vec![ghost_kernel.clone().into()]),
        "KernelNotFound",
        "nothing dangling is left to adopt"
    );
    assert_eq!(
        failure(&c, "destroy_dangling_kernel", vec![ghost_kernel.into()]),
        "KernelNotFound"
    );
    let listed = c.agent_call(a, "list_dangling_kernels", vec![]);
    assert_eq!(listed, Value::Array(vec![]), "no dangling kernel left");
    // Every adopted kernel holds its port again: 20 in the range, 3 held.
    let usage = c.agent_call(a, "resource_usage", vec![]);
    assert_eq!(field(&usage, "free_host_ports").as_u64(), Some(17));
    c.check_invariants();

    // An adopted kernel is an ordinary kernel: destroying it releases everything.
    let gone = c.delete(&format!("/v1/sessions/{}", sessions[0]));
    assert_eq!(gone.body["status"], "TERMINATED", "{gone:?}");
    assert_eq!(c.concurrency_used(), 2);
    c.check_invariants();
}

#[test]
fn store_loss_adopts_known_kernels_and_destroys_unknown_containers_sqlite() {
    store_loss(Db::Sqlite, 33000);
}

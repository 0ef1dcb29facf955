//! Dangling kernels resolved (`docs/design.md`, kernels as supervision trees), end to end: a manager process and an
//! agent process (the `kernelvisor` binary, CURVE on), the real Docker engine, the manager on
//! SQLite and on PostgreSQL, with `dangling-grace` shortened to 3 s.
//!
//! Store loss: an agent with three kernels is stopped, its SQLite file deleted, started again.
//! All three are reported dangling (with a description rebuilt from the engine), the manager
//! adopts them, they are `RUNNING` with their original host ports, `execute` works in them, and
//! every invariant of `docs/scenarios.md` holds; a labelled container the manager does not know
//! is destroyed after the grace.
//!
//! The agent alone: after a SIGKILL and the loss of its store, `list_dangling_kernels` shows what
//! it rebuilt from the engine (slots, host ports, owner, session), holds those slots and ports
//! while the containers wait, `adopt_kernel` makes a kernel of one again (same container, host
//! ports, scratch files and environment), `destroy_dangling_kernel` removes the others, and
//! unknown or unadoptable ids get clear FAILUREs.
//!
//! Agent host ports: 33000–33039 (cluster), 33100–33105 (agent alone).

use crate::common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use std::process::Child;

use common::agent::spawn_agent_process;
use common::agent::{
    call, client, create_one, docker, failure_name, field, ghost_container, inspect, kernel_config,
    map, read, run_id, usage, AgentFixture, TEST_IMAGE,
};
use common::cluster::{wait_for, Cluster, Db};
use kernelvisor::model::session::KernelStatus;
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
    let ghost = ghost_container(&id, &ghost_kernel);
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
        assert_eq!(k.status, KernelStatus::Running, "{s}");
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

const MIB: u64 = 1 << 20;

/// A standalone agent process (no manager) logging to `agent.log`.
fn spawn_agent(fx: &AgentFixture) -> Child {
    spawn_agent_process(fx, &fx.write_config(""))
}

/// A client once the agent's RPC answers `ping`.
async fn connect(fx: &AgentFixture) -> kernelvisor::rpc::Peer {
    let endpoint = format!("tcp://127.0.0.1:{}", fx.rpc_port);
    for _ in 0..100 {
        let peer = client(&endpoint).await;
        if call(&peer, "ping", vec!["x".into()]).await.is_ok() {
            return peer;
        }
        peer.close();
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!(
        "agent did not come up; log:\n{}",
        read(&fx.dir.path().join("agent.log"))
    );
}

fn console(out: &Value) -> String {
    field(out, "console")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_array()?.get(1)?.as_str().map(str::to_owned))
        .collect()
}

async fn execute(peer: &kernelvisor::rpc::Peer, session: &str, kernel: &str, code: &str) -> String {
    let out = call(
        peer,
        "execute",
        vec![
            session.into(),
            kernel.into(),
            "v4".into(),
            format!("r-{}", run_id()).into(),
            "query".into(),
            code.into(),
            map(vec![]),
            0.into(),
        ],
    )
    .await
    .unwrap();
    console(&out)
}

#[actix_rt::test]
async fn agent_rebuilds_adopts_and_destroys_dangling_kernels() {
    let fx = AgentFixture::new("dangl-agent", 33100, 6);
    let mut agent = spawn_agent(&fx);
    let peer = connect(&fx).await;
    let (session, kid) = ("s-dangling", format!("k-{}", run_id()));
    let config = kernel_config(
        "0.5",
        48 * MIB,
        vec![
            (
                "service_ports",
                Value::Array(vec![
                    map(vec![
                        ("name", "p".into()),
                        ("container_ports", Value::Array(vec![8000.into()])),
                    ]),
                    map(vec![
                        ("name", "q".into()),
                        (
                            "container_ports",
                            Value::Array(vec![8001.into(), 8002.into()]),
                        ),
                    ]),
                ]),
            ),
            ("environ", map(vec![("FOO", "bar".into())])),
        ],
    );
    let info = create_one(&peer, session, &kid, config).await.unwrap();
    let container = field(&info, "container_id").as_str().unwrap().to_owned();
    let ports = field(&info, "host_ports").clone();
    let services = field(&info, "service_ports").clone();
    assert_eq!(ports.as_array().unwrap().len(), 3);
    std::fs::write(fx.scratch_root().join(&kid).join("work/kept.txt"), "kept\n").unwrap();
    peer.close();

    // SIGKILL, and the store is lost; a container with our id but no session label appears.
    agent.kill().unwrap();
    agent.wait().unwrap();
    for f in ["agent.db", "agent.db-wal", "agent.db-shm"] {
        let _ = std::fs::remove_file(fx.dir.path().join("var").join(f));
    }
    let ghost_kernel = format!("ghost-{}", run_id());
    let ghost = docker(&[
        "run",
        "-d",
        "--label",
        &format!("ai.backend.agent-id={}", fx.agent_id),
        "--label",
        &format!("ai.backend.kernel-id={ghost_kernel}"),
        TEST_IMAGE,
    ]);

    let mut agent = spawn_agent(&fx);
    let peer = connect(&fx).await;
    assert_eq!(
        failure_name(&call(&peer, "get_kernel", vec![kid.clone().into()]).await),
        "KernelNotFound",
        "not a kernel until adopted"
    );
    // What the dangling containers hold stays reserved: nothing can double-book it.
    assert_eq!(
        usage(&peer).await,
        ("0.5".into(), (48 * MIB).to_string(), 3)
    );
    let listed = call(&peer, "list_dangling_kernels", vec![]).await.unwrap();
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 2, "{listed:?}");
    let mine = listed
        .iter()
        .find(|k| field(k, "id").as_str() == Some(kid.as_str()))
        .expect("the kernel is listed");
    assert_eq!(field(mine, "session_id").as_str(), Some(session));
    assert_eq!(
        field(mine, "container_id").as_str(),
        Some(container.as_str())
    );
    assert_eq!(field(mine, "running"), &Value::from(true));
    assert_eq!(
        field(mine, "host_ports"),
        &ports,
        "host ports in service-port order"
    );
    assert_eq!(
        field(field(mine, "resource_slots"), "cpu").as_str(),
        Some("0.5")
    );
    assert_eq!(
        field(field(mine, "resource_slots"), "mem").as_str(),
        Some((48 * MIB).to_string().as_str())
    );
    assert_eq!(field(mine, "access_key").as_str(), Some("AKTEST"));
    assert_eq!(field(mine, "adoptable"), &Value::from(true), "{mine:?}");
    let other = listed
        .iter()
        .find(|k| field(k, "id").as_str() == Some(ghost_kernel.as_str()))
        .expect("the unknown container is listed");
    assert_eq!(field(other, "adoptable"), &Value::from(false));
    assert!(field(other, "reason")
        .as_str()
        .unwrap()
        .contains("session-id"));

    assert_eq!(
        failure_name(&call(&peer, "adopt_kernel", vec![ghost_kernel.clone().into()]).await),
        "KernelNotAdoptable"
    );
    assert_eq!(
        failure_name(&call(&peer, "adopt_kernel", vec!["no-such-kernel".into()]).await),
        "KernelNotFound"
    );
    let adopted = call(&peer, "adopt_kernel", vec![kid.clone().into()])
        .await
        .unwrap();
    assert_eq!(field(&adopted, "status").as_str(), Some("RUNNING"));
    assert_eq!(
        field(&adopted, "container_id").as_str(),
        Some(container.as_str())
    );
    assert_eq!(field(&adopted, "host_ports"), &ports);
    assert_eq!(field(&adopted, "service_ports"), &services);
    assert_eq!(
        failure_name(&call(&peer, "adopt_kernel", vec![kid.clone().into()]).await),
        "KernelNotFound",
        "adopted once"
    );
    assert_eq!(
        call(&peer, "check_running", vec![kid.clone().into()])
            .await
            .unwrap(),
        Value::from(true)
    );
    assert_eq!(
        execute(&peer, session, &kid, "cat /home/work/kept.txt; echo $FOO").await,
        "kept\nbar\n"
    );
    assert_eq!(
        usage(&peer).await,
        ("0.5".into(), (48 * MIB).to_string(), 3),
        "adoption takes over the reservation, nothing twice"
    );

    let destroyed = call(
        &peer,
        "destroy_dangling_kernel",
        vec![ghost_kernel.clone().into()],
    )
    .await
    .unwrap();
    assert_eq!(field(&destroyed, "destroyed").as_u64(), Some(1));
    assert_eq!(inspect(&ghost, "{{.Id}}"), None);
    assert_eq!(
        call(&peer, "list_dangling_kernels", vec![]).await.unwrap(),
        Value::Array(vec![])
    );

    // The adopted kernel is an ordinary one: destroying it releases everything.
    call(
        &peer,
        "destroy_kernel",
        vec![kid.clone().into(), session.into()],
    )
    .await
    .unwrap();
    assert_eq!(inspect(&container, "{{.Id}}"), None);
    assert!(fx.scratch_entries().is_empty());
    tokio::time::sleep(Duration::from_millis(150)).await; // port cooldown of the fixture
    assert_eq!(usage(&peer).await, ("0".into(), "0".into(), 6));
    peer.close();
    common::cluster::signal(agent.id(), "TERM");
    assert!(common::cluster::wait_exit(
        &mut agent,
        Duration::from_secs(30)
    ));
}

#[test]
fn store_loss_adopts_known_kernels_and_destroys_unknown_containers_postgres() {
    store_loss(Db::Postgres, 33020);
}

//! Issue 40: cluster sessions through the manager, on a manager process and agent processes
//! (the `kernelvisor` binary, CURVE on), the real Docker engine and the test image.
//!
//! - A single-node cluster of 3 on one agent is one session: `main1`, `sub1`, `sub2` on that
//!   agent, each with its role and index in its environment, on the session's own bridge
//!   network (`bai-singlenode-<session id>`, labelled), where `main1` reaches `sub2` by name; `RUNNING` once every kernel is; it
//!   survives a manager restart; destroying it leaves no container, no network, no
//!   reservation and no concurrency (the store invariants).
//! - A gang waits whole: with room for 4 kernels and 2 taken, a multi-node cluster of 3 waits
//!   `PENDING` as one queue entry holding nothing, names the kernel that does not fit, holds a
//!   single session behind it for the head-skip rounds only, and starts whole once room frees.
//! - A create failing on one kernel (fault injection on `sub2`) rolls the whole gang back: no
//!   container, network, reservation or concurrency left, every kernel `TERMINATED` with
//!   `failed-to-create`, and the events say so.
//! - A kernel of a running cluster that ends (its container killed) ends the session: the
//!   others are destroyed with its reason, and the network goes.
//! - On PostgreSQL, the leader killed: its replica takes over a running cluster session (ending
//!   it whole when a kernel dies) and a queued one (admitting it whole).
//! - A batch cluster session runs its job on `main1` (the others wait for it) and ends with
//!   the main kernel's exit code and result.
//!
//! Agent host ports: 36000–36099.

use crate::common;

use std::collections::BTreeSet;
use std::process::Command;
use std::time::Duration;

use common::agent::TEST_IMAGE;
use common::cluster::{wait_for, Cluster, Db, Reaped};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(90);

/// The host's cores, as the agent reports them.
fn host_cores(c: &Cluster, agent: &str) -> f64 {
    let view = c.wait_agent_status(agent, "ALIVE", LONG);
    view["slots_total"]["cpu"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

fn session(c: &Cluster, id: &str) -> Value {
    c.get(&format!("/v1/sessions/{id}")).unwrap().body
}

fn wait_status(c: &Cluster, id: &str, want: &str) -> Value {
    wait_for(LONG, &format!("session {id} {want}"), || {
        let s = session(c, id);
        (s["status"] == want).then_some(s)
    })
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker").args(args).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Containers of the session's kernels on the engine (any state).
fn containers_of(sid: &str) -> BTreeSet<String> {
    docker(&[
        "ps",
        "-a",
        "--filter",
        &format!("label=ai.backend.session-id={sid}"),
        "--format",
        "{{.Names}}",
    ])
    .lines()
    .map(str::to_owned)
    .collect()
}

fn network_exists(name: &str) -> bool {
    !docker(&["network", "ls", "-q", "--filter", &format!("name=^{name}$")]).is_empty()
}

/// A kernel's environment variable, read off its container.
fn kernel_env(kernel_id: &str, name: &str) -> Option<String> {
    let cid = docker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=ai.backend.kernel-id={kernel_id}"),
    ]);
    let env = docker(&[
        "inspect",
        "-f",
        "{{range .Config.Env}}{{println .}}{{end}}",
        &cid,
    ]);
    env.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}=")).map(str::to_owned))
}

/// The kernels of a session's JSON as `(host name, role, index, agent, status)`.
fn kernels(s: &Value) -> Vec<(String, String, i64, String, String)> {
    s["kernels"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|k| {
            (
                k["cluster_hostname"].as_str().unwrap_or("").to_owned(),
                k["cluster_role"].as_str().unwrap_or("").to_owned(),
                k["cluster_idx"].as_i64().unwrap_or(0),
                k["agent_id"].as_str().unwrap_or("").to_owned(),
                k["status"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

fn body(cpu: f64, extra: Value) -> Value {
    let mut b = json!({"image": TEST_IMAGE, "resource_slots": {"cpu": cpu, "mem": "32m"}});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            b[k] = v;
        }
    }
    b
}

#[test]
fn a_single_node_cluster_of_three_is_one_session_on_its_own_network() {
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra = "sweep-interval = 1".into();
    c.start_manager();
    let a = c.add_agent("cl-single", 36000, "");
    let agent = c.agents[a].id().to_owned();
    let cores = host_cores(&c, &agent);
    let created = c.post(
        "/v1/sessions",
        &body(
            cores / 8.0,
            json!({"cluster_size": 3, "cluster_mode": "single-node"}),
        ),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let s = created.body;
    assert_eq!(s["status"], "RUNNING", "{s}");
    assert_eq!(
        (s["cluster_size"].as_i64(), s["cluster_mode"].as_str()),
        (Some(3), Some("single-node"))
    );
    let sid = s["session_id"].as_str().unwrap().to_owned();
    let ks = kernels(&s);
    let hosts: Vec<&str> = ks.iter().map(|k| k.0.as_str()).collect();
    assert_eq!(hosts, ["main1", "sub1", "sub2"], "{s}");
    for (i, k) in ks.iter().enumerate() {
        assert_eq!(k.1, if i == 0 { "main" } else { "sub" });
        assert_eq!(k.2, if i == 0 { 1 } else { i as i64 });
        assert_eq!(k.3, agent, "every kernel on the one agent: {s}");
        assert_eq!(k.4, "RUNNING");
    }
    // One container per kernel, each told its place in the cluster.
    assert_eq!(containers_of(&sid).len(), 3);
    for k in s["kernels"].as_array().unwrap() {
        let id = k["kernel_id"].as_str().unwrap();
        assert_eq!(
            kernel_env(id, "BACKENDAI_CLUSTER_HOSTS").as_deref(),
            Some("main1,sub1,sub2")
        );
        assert_eq!(
            kernel_env(id, "BACKENDAI_CLUSTER_HOST").as_deref(),
            k["cluster_hostname"].as_str()
        );
        assert_eq!(
            kernel_env(id, "BACKENDAI_CLUSTER_ROLE").as_deref(),
            k["cluster_role"].as_str()
        );
        assert_eq!(
            kernel_env(id, "BACKENDAI_CLUSTER_SIZE").as_deref(),
            Some("3")
        );
    }
    let net = format!("bai-singlenode-{sid}");
    assert!(network_exists(&net), "the session's network {net}");
    assert_eq!(
        docker(&[
            "network",
            "inspect",
            "-f",
            "{{index .Labels \"ai.backend.cluster-network\"}}",
            &net
        ]),
        "1"
    );
    // The kernels reach each other by name on it: from main1, sub2 resolves and answers.
    let (out, code) = c
        .execute(&sid, None, "ping -c 1 -W 5 sub2 && hostname")
        .unwrap();
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("PING sub2 (") && out.trim_end().ends_with("main1"),
        "{out}"
    );
    // One session: listed once, one unit of concurrency.
    let list = c.get("/v1/sessions").unwrap().body;
    let listed: Vec<&Value> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|x| x["session_id"] == sid.as_str())
        .collect();
    assert_eq!(listed.len(), 1, "{list}");
    assert_eq!(kernels(listed[0]).len(), 3);
    assert_eq!(c.concurrency_used(), 1);
    c.check_invariants();
    // A manager restart: the same session, every kernel still there.
    c.stop_manager("TERM");
    c.start_manager();
    let after = wait_status(&c, &sid, "RUNNING");
    assert_eq!(kernels(&after).len(), 3, "{after}");
    // Destroyed whole: nothing left.
    let d = c.delete(&format!("/v1/sessions/{sid}"));
    assert_eq!(d.status, 200, "{d:?}");
    assert_eq!(d.body["status"], "TERMINATED", "{}", d.body);
    for k in kernels(&d.body) {
        assert_eq!(k.4, "TERMINATED", "{}", d.body);
    }
    assert!(containers_of(&sid).is_empty());
    wait_for(LONG, "the session's network removed", || {
        (!network_exists(&net)).then_some(())
    });
    assert_eq!(c.concurrency_used(), 0);
    c.check_invariants();
}

#[test]
fn a_gang_waits_whole_holding_nothing_and_starts_whole() {
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra = "sweep-interval = 1\nhead-skip-rounds = 2".into();
    c.start_manager();
    let a = c.add_agent("cl-gang", 36020, "");
    let agent = c.agents[a].id().to_owned();
    let quarter = host_cores(&c, &agent) / 4.0;
    // Room for 4 kernels; 2 taken.
    let taken: Vec<String> = (0..2)
        .map(|_| {
            let a = c.post("/v1/sessions", &body(quarter, json!({})));
            assert_eq!(
                (a.status, a.body["status"].as_str()),
                (201, Some("RUNNING")),
                "{a:?}"
            );
            a.body["session_id"].as_str().unwrap().to_owned()
        })
        .collect();
    // A gang of 3 does not fit the 2 left. (Multi-node places the same way here, one agent,
    // but needs a Swarm: tests/it/swarm_overlay.rs.)
    let g = c.post("/v1/sessions", &body(quarter, json!({"cluster_size": 3})));
    assert_eq!(g.status, 201, "{g:?}");
    assert_eq!(g.body["status"], "PENDING", "{}", g.body);
    assert_eq!(g.body["queue_position"], 1);
    let gid = g.body["session_id"].as_str().unwrap().to_owned();
    // The round names what is short: the gang's slots on one agent.
    let waiting = wait_for(LONG, "the gang's reason", || {
        let s = session(&c, &gid);
        s["pending_reason"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("`cpu`"))
            .then_some(s)
    });
    assert_eq!(
        waiting["pending_reason"]["code"], "no-capacity",
        "{waiting}"
    );
    // Holding nothing: no container of it, the agent's room as before, concurrency 2.
    assert!(containers_of(&gid).is_empty());
    assert_eq!(c.concurrency_used(), 2);
    c.check_invariants();
    // A single session behind it waits for the head, then (head-skip rounds spent) takes a
    // gap the gang cannot use.
    let single = c.post("/v1/sessions", &body(quarter, json!({})));
    assert_eq!(single.body["status"], "PENDING", "{}", single.body);
    let single = single.body["session_id"].as_str().unwrap().to_owned();
    wait_status(&c, &single, "RUNNING");
    assert_eq!(session(&c, &gid)["status"], "PENDING");
    // Room for 3 once two end: the gang starts whole.
    for id in taken.iter().take(2) {
        assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 200);
    }
    let running = wait_status(&c, &gid, "RUNNING");
    let ks = kernels(&running);
    assert_eq!(ks.len(), 3, "{running}");
    assert!(
        ks.iter().all(|k| k.4 == "RUNNING" && k.3 == agent),
        "{running}"
    );
    assert_eq!(containers_of(&gid).len(), 3);
    assert_eq!(c.concurrency_used(), 2, "the gang and the single session");
    c.check_invariants();
    for id in [&gid, &single] {
        assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 200);
    }
    assert!(containers_of(&gid).is_empty());
    c.check_invariants();
}

#[test]
fn a_create_failing_on_one_kernel_rolls_the_gang_back() {
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra = "sweep-interval = 1".into();
    c.start_manager();
    let a = c.add_agent("cl-rollback", 36040, "");
    let agent = c.agents[a].id().to_owned();
    let cores = host_cores(&c, &agent);
    let f = c.post(
        "/v1/sessions",
        &body(
            cores / 8.0,
            json!({"cluster_size": 3, "_inject": {"kernels": {"sub2": {"fail_at": "container"}}}}),
        ),
    );
    assert!(f.status >= 400, "the create fails: {f:?}");
    // Every kernel ended with the failure's code; nothing left anywhere.
    let list = c.get("/v1/sessions?all=true").unwrap().body;
    let s = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["cluster_size"] == 3)
        .cloned()
        .unwrap_or_else(|| panic!("the failed session is listed: {list}"));
    let sid = s["session_id"].as_str().unwrap().to_owned();
    assert_eq!(s["status"], "TERMINATED", "{s}");
    let reasons: BTreeSet<String> = s["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["status_reason"].as_str().unwrap_or("").to_owned())
        .collect();
    assert_eq!(reasons.len(), 1, "one reason on every kernel: {s}");
    assert_eq!(s["kernels"].as_array().unwrap().len(), 3);
    assert_eq!(f.code(), "agent-error", "{f:?}");
    assert_eq!(
        reasons.into_iter().next().unwrap(),
        "failed-to-create",
        "{s}"
    );
    assert!(containers_of(&sid).is_empty());
    wait_for(LONG, "no network left", || {
        (!network_exists(&format!("bai-singlenode-{sid}"))).then_some(())
    });
    assert_eq!(c.concurrency_used(), 0);
    c.check_invariants();
    // The events said why, for each kernel.
    let text = ureq::get(&format!(
        "{}/v1/events?session_id={sid}&follow=false",
        c.api
    ))
    .timeout(Duration::from_secs(30))
    .set("Authorization", &Cluster::bearer(&c.token))
    .call()
    .unwrap()
    .into_string()
    .unwrap();
    let ended: BTreeSet<String> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter(|e| e["status"] == "TERMINATED" && e["reason"] == "failed-to-create")
        .map(|e| e["kernel_id"].as_str().unwrap_or("").to_owned())
        .collect();
    let ids: BTreeSet<String> = s["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kernel_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        ended, ids,
        "a TERMINATED event with the reason per kernel: {text}"
    );
}

#[test]
fn a_kernel_that_ends_ends_its_cluster_session() {
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra = "sweep-interval = 1".into();
    c.start_manager();
    let a = c.add_agent("cl-lost", 36060, "");
    let agent = c.agents[a].id().to_owned();
    let cores = host_cores(&c, &agent);
    let s = c.post(
        "/v1/sessions",
        &body(cores / 8.0, json!({"cluster_size": 2})),
    );
    assert_eq!(
        (s.status, s.body["status"].as_str()),
        (201, Some("RUNNING")),
        "{s:?}"
    );
    let sid = s.body["session_id"].as_str().unwrap().to_owned();
    let sub = s.body["kernels"][1]["kernel_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // sub1's container killed: its kernel ends (restart policy `never`), and the session with it.
    let cid = docker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=ai.backend.kernel-id={sub}"),
    ]);
    assert!(!cid.is_empty());
    docker(&["kill", &cid]);
    let ended = wait_status(&c, &sid, "TERMINATED");
    let ks = kernels(&ended);
    assert!(ks.iter().all(|k| k.4 == "TERMINATED"), "{ended}");
    // The main kernel ended with the sub kernel's reason.
    let reasons: Vec<&str> = ended["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["status_reason"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(reasons[0], reasons[1], "{ended}");
    wait_for(LONG, "no container and no network left", || {
        (containers_of(&sid).is_empty() && !network_exists(&format!("bai-singlenode-{sid}")))
            .then_some(())
    });
    assert_eq!(c.concurrency_used(), 0);
    c.check_invariants();
}

#[test]
fn a_batch_cluster_session_ends_with_its_main_kernels_exit_code() {
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra = "sweep-interval = 1".into();
    c.start_manager();
    let a = c.add_agent("cl-batch", 36070, "");
    let agent = c.agents[a].id().to_owned();
    let cores = host_cores(&c, &agent);
    // The job names the host it runs on (main1) and exits 3 a moment later.
    let s = c.post(
        "/v1/sessions",
        &body(
            cores / 8.0,
            json!({"cluster_size": 2, "type": "batch",
                   "command": "echo job-on-$BACKENDAI_CLUSTER_HOST; sleep 2; exit 3"}),
        ),
    );
    assert_eq!(s.status, 201, "{s:?}");
    let sid = s.body["session_id"].as_str().unwrap().to_owned();
    let ended = wait_status(&c, &sid, "TERMINATED");
    assert_eq!(ended["exit_code"], 3, "{ended}");
    assert_eq!(ended["result"], "FAILURE", "{ended}");
    let ks = kernels(&ended);
    assert_eq!(ks.len(), 2);
    assert!(ks.iter().all(|k| k.4 == "TERMINATED"), "{ended}");
    // The sub kernel ran no job: it ended because main1 did, with main1's reason.
    assert_eq!(
        ended["kernels"][1]["status_reason"], ended["kernels"][0]["status_reason"],
        "{ended}"
    );
    assert!(ended["kernels"][1]["exit_code"].is_null(), "{ended}");
    let logs = ureq::get(&format!("{}/v1/sessions/{sid}/logs", c.api))
        .timeout(Duration::from_secs(30))
        .set("Authorization", &Cluster::bearer(&c.token))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(logs.contains("job-on-main1"), "{logs}");
    wait_for(LONG, "no container and no network left", || {
        (containers_of(&sid).is_empty() && !network_exists(&format!("bai-singlenode-{sid}")))
            .then_some(())
    });
    c.check_invariants();
}

/// On PostgreSQL with a replica: the leader killed, the replica takes over a running cluster
/// session (it ends it whole when one of its kernels dies) and a queued one (it admits it whole
/// once room frees).
#[test]
fn cluster_sessions_survive_a_failover_to_a_replica() {
    let mut c = Cluster::new(Db::Postgres);
    c.heartbeat_timeout = 8.0;
    c.manager_extra = "leader-lease = 4\n".into();
    c.scheduler_extra = "sweep-interval = 1".into();
    c.start_manager();
    let (port, intake) = (common::agent::free_port(), common::agent::free_port());
    let _replica = Reaped(c.spawn_replica("replica", port, intake));
    let replica_api = format!("http://127.0.0.1:{port}");
    c.agent_intakes = vec![c.intake_port, intake];
    let a = c.add_agent("cl-failover", 36080, "");
    let agent = c.agents[a].id().to_owned();
    let quarter = host_cores(&c, &agent) / 4.0;
    wait_for(LONG, "the replica sees the agent", || {
        c.get_at(&replica_api, "/health")
            .ok()
            .filter(|h| h.body["agents_alive"] == 1)
    });
    // A running gang of 2 (half the room) and a queued gang of 3.
    let r = c.post("/v1/sessions", &body(quarter, json!({"cluster_size": 2})));
    assert_eq!(
        (r.status, r.body["status"].as_str()),
        (201, Some("RUNNING")),
        "{r:?}"
    );
    let running = r.body["session_id"].as_str().unwrap().to_owned();
    let q = c.post("/v1/sessions", &body(quarter, json!({"cluster_size": 3})));
    assert_eq!(q.body["status"], "PENDING", "{q:?}");
    let queued = q.body["session_id"].as_str().unwrap().to_owned();
    c.stop_manager("KILL");
    c.api = replica_api;
    wait_for(LONG, "the replica leads", || {
        c.get("/health").ok().filter(|h| h.body["leader"] == true)
    });
    let s = wait_status(&c, &running, "RUNNING");
    assert_eq!(kernels(&s).len(), 2, "{s}");
    assert_eq!(session(&c, &queued)["status"], "PENDING");
    // The running gang's sub kernel dies: the new leader ends the gang whole, and the queued
    // gang (3 quarters) starts whole in the room that frees.
    let sub = s["kernels"][1]["kernel_id"].as_str().unwrap().to_owned();
    let cid = docker(&[
        "ps",
        "-q",
        "--filter",
        &format!("label=ai.backend.kernel-id={sub}"),
    ]);
    docker(&["kill", &cid]);
    let ended = wait_status(&c, &running, "TERMINATED");
    assert!(
        kernels(&ended).iter().all(|k| k.4 == "TERMINATED"),
        "{ended}"
    );
    let started = wait_status(&c, &queued, "RUNNING");
    assert_eq!(kernels(&started).len(), 3, "{started}");
    wait_for(LONG, "the ended gang's network removed", || {
        (!network_exists(&format!("bai-singlenode-{running}"))).then_some(())
    });
    assert_eq!(c.delete(&format!("/v1/sessions/{queued}")).status, 200);
    assert!(containers_of(&queued).is_empty());
    c.check_invariants();
}

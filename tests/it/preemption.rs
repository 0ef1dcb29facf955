//! Issue 41 item 2: preemption. A manager process with `[scheduler] preemption = true` and two
//! agent processes (the `kernelvisor` binary, CURVE on) on the real Docker engine and the test
//! image; each agent's room is its host's cores, each session asks for half of them, so the
//! fleet holds four.
//!
//! - (On SQLite and on PostgreSQL.) A fleet full of priority-10 sessions (three preemptible, one not): a priority-50 session
//!   evicts exactly one, the youngest preemptible one; it shows `PREEMPTED`, then `PENDING`
//!   again with `restart_count` 1, AHEAD of a priority-10 session queued before the eviction
//!   (its original queue time kept); the `preemption` event names the preemptor and the
//!   victim; `kernelvisor_manager_preemptions_total{reason="priority"}` counts it.
//! - A second priority-50 session: the last victim is in its cooldown, the non-preemptible one
//!   is never a victim: the next youngest goes, and as its restart policy is `never` it ends
//!   `TERMINATED` `preempted`.
//! - A session that could not fit even with every preemptible session evicted evicts nobody.
//! - When room frees, the requeued victim runs again, before the later arrival, with
//!   `KERNELVISOR_RESTART_COUNT=1` in its environment; no further eviction happens (no loop);
//!   the store's invariants hold.
//! - A manager killed mid-preemption (the victim `PREEMPTED`; the `fault-injection` build holds
//!   the eviction until a file exists) and started again: its sweep completes it, once.
//!
//! - A victim gets its grace: on one agent full of preemptible batch jobs (restart policy
//!   `on-failure`, `grace_period` 5) that checkpoint to their vfolder on `SIGTERM`, a
//!   priority-50 session evicts exactly the youngest; its checkpoint is written (its trap ran,
//!   nothing killed at a deadline), it returns `PENDING` with `restart_count` 1, and once the
//!   preemptor is deleted it runs again with `KERNELVISOR_RESTART_COUNT=1` (its next checkpoint
//!   says so); the event and the metric name it.
//! - A gang victim: a preemptible single-node cluster of 2 is evicted whole: both kernels end,
//!   it is requeued as one `PENDING` session (one queue entry), its network is removed, the
//!   invariants hold; once room frees it runs again whole, on a network of its own (`…-r1`).
//!
//! Agent host ports: 44100–44199 (20 per agent unless said): SQLite 44100–44139, the restart
//! 44140–44149, the checkpointing victim 44150–44154, the gang 44155–44159, PostgreSQL
//! 44160–44199.

use crate::common;

use std::time::Duration;

use common::agent::TEST_IMAGE;
use common::cluster::{wait_for, Cluster, Db};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

fn body(cpu: f64, extra: Value) -> Value {
    let mut b = json!({"image": TEST_IMAGE, "resource_slots": {"cpu": cpu, "mem": "32m"}});
    if let Value::Object(m) = extra {
        for (k, v) in m {
            b[k] = v;
        }
    }
    b
}

fn create(c: &Cluster, b: &Value) -> Value {
    let a = c.post("/v1/sessions", b);
    assert_eq!(a.status, 201, "create: {a:?}");
    a.body
}

fn session(c: &Cluster, id: &str) -> Value {
    let a = c.get(&format!("/v1/sessions/{id}")).unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    a.body
}

fn wait_status(c: &Cluster, id: &str, want: &str) -> Value {
    wait_for(LONG, &format!("session {id} {want}"), || {
        Some(session(c, id)).filter(|s| s["status"] == want)
    })
}

fn id(s: &Value) -> String {
    s["session_id"].as_str().unwrap().to_owned()
}

/// The pending sessions in queue order.
fn queue(c: &Cluster) -> Vec<String> {
    let list = c.get("/v1/sessions").unwrap().body;
    let mut out: Vec<(i64, String)> = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["status"] == "PENDING")
        .map(|s| (s["queue_position"].as_i64().unwrap(), id(s)))
        .collect();
    out.sort();
    out.into_iter().map(|(_, s)| s).collect()
}

/// The `preemption` events the manager keeps.
fn preemptions(c: &Cluster) -> Vec<Value> {
    let text = ureq::get(&format!("{}/v1/events?type=preemption&follow=false", c.api))
        .timeout(Duration::from_secs(30))
        .set("Authorization", &Cluster::bearer(&c.token))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter(|e| e["type"] == "preemption")
        .collect()
}

fn metric(c: &Cluster) -> f64 {
    c.manager_metric(
        "kernelvisor_manager_preemptions_total",
        "reason=\"priority\"",
    )
}

/// Runs `code` in the session (query mode, continued until it finishes): its stdout.
fn exec(c: &Cluster, sid: &str, code: &str) -> String {
    let path = format!("/v1/sessions/{sid}/execute");
    let mut body = json!({"mode": "query", "code": code});
    let mut out = String::new();
    loop {
        let a = c.post(&path, &body);
        assert_eq!(a.status, 200, "{a:?}");
        for piece in a.body["console"].as_array().unwrap() {
            if piece[0] == "stdout" {
                out.push_str(piece[1].as_str().unwrap());
            }
        }
        match a.body["status"].as_str().unwrap() {
            "continued" => body = json!({"mode": "continue", "run_id": a.body["runId"]}),
            "finished" => return out,
            other => panic!("execute ended {other}: {}", a.body),
        }
    }
}

#[test]
fn a_higher_priority_session_evicts_the_minimal_set_and_the_victims_return_to_the_queue() {
    evicts_the_minimal_set(Db::Sqlite, 44100);
}

#[test]
fn a_higher_priority_session_evicts_the_minimal_set_on_postgres() {
    evicts_the_minimal_set(Db::Postgres, 44160);
}

fn evicts_the_minimal_set(db: Db, ports: u16) {
    let mut c = Cluster::new(db);
    c.scheduler_extra =
        "preemption = true\npreemption-cooldown = 600\nadmission-interval = 0.5\nsweep-interval = 0.5\n"
            .into();
    c.start_manager();
    let a = c.add_agent("preempt-a", ports, "");
    let b = c.add_agent("preempt-b", ports + 20, "");
    let (ida, idb) = (c.agents[a].id().to_owned(), c.agents[b].id().to_owned());
    let view = c.wait_agent_status(&ida, "ALIVE", LONG);
    c.wait_agent_status(&idb, "ALIVE", LONG);
    let cores: f64 = view["slots_total"]["cpu"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let half = cores / 2.0;
    let requeue = json!({"mode": "on-failure", "max_restarts": 3});
    // The fleet, full: s1 oldest … s4 youngest; s2 is not requeued when preempted, s4 is not
    // preemptible.
    let s1 = create(
        &c,
        &body(
            half,
            json!({"preemptible": true, "restart_policy": requeue}),
        ),
    );
    let s2 = create(&c, &body(half, json!({"preemptible": true})));
    let s3 = create(
        &c,
        &body(
            half,
            json!({"preemptible": true, "restart_policy": requeue}),
        ),
    );
    let s4 = create(&c, &body(half, json!({})));
    for s in [&s1, &s2, &s3, &s4] {
        assert_eq!(s["status"], "RUNNING", "{s}");
    }
    let (s1, s2, s3, s4) = (id(&s1), id(&s2), id(&s3), id(&s4));
    assert_eq!(session(&c, &s1)["preemptible"], true);
    assert_eq!(session(&c, &s4)["preemptible"], false, "the key's default");
    // A later priority-10 arrival waits.
    let later = create(&c, &body(half, json!({"preemptible": true})));
    assert_eq!(later["status"], "PENDING", "{later}");
    let later = id(&later);
    assert_eq!(metric(&c), 0.0);
    // Priority 50: exactly one victim, the youngest preemptible one (s3).
    let high = id(&create(&c, &body(half, json!({"priority": 50}))));
    wait_status(&c, &high, "RUNNING");
    let v = wait_status(&c, &s3, "PENDING");
    assert_eq!(v["restart_count"], 1, "{v}");
    assert_eq!(v["priority"], 10, "{v}");
    for s in [&s1, &s2, &s4] {
        assert_eq!(session(&c, s)["status"], "RUNNING", "{s} is no victim");
    }
    assert_eq!(metric(&c), 1.0);
    // Ahead of the later arrival: its original queue time.
    assert_eq!(queue(&c), [s3.clone(), later.clone()]);
    let ev = preemptions(&c);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["session_id"], high.as_str());
    assert_eq!(ev[0]["victims"], json!([s3]));
    assert_eq!(ev[0]["reason"], "preempted");
    // Another priority 50: s3 is in its cooldown (and pending), s4 is not preemptible: s2,
    // the youngest left, goes; its restart policy (`never`) ends it.
    let high2 = id(&create(&c, &body(half, json!({"priority": 50}))));
    wait_status(&c, &high2, "RUNNING");
    let ended = wait_status(&c, &s2, "TERMINATED");
    assert_eq!(ended["status_reason"], "preempted", "{ended}");
    assert_eq!(session(&c, &s1)["status"], "RUNNING");
    assert_eq!(session(&c, &s4)["status"], "RUNNING");
    assert_eq!(metric(&c), 2.0);
    // A whole agent at priority 60: each agent holds a session that is not preemptible (s4,
    // high, high2): it would not fit even with every victim gone, so nobody is evicted.
    let whole = id(&create(&c, &body(cores, json!({"priority": 60}))));
    let rounds_before = c.manager_metric("kernelvisor_manager_admission_rounds_total", "");
    wait_for(LONG, "rounds that looked at it", || {
        let s = session(&c, &whole);
        (s["pending_reason"]["code"] == "no-capacity"
            && c.manager_metric("kernelvisor_manager_admission_rounds_total", "")
                >= rounds_before + 3.0)
            .then_some(())
    });
    assert_eq!(
        metric(&c),
        2.0,
        "nobody evicted for a session that cannot fit"
    );
    assert_eq!(session(&c, &s1)["status"], "RUNNING");
    assert_eq!(c.delete(&format!("/v1/sessions/{whole}")).status, 200);
    // Room frees: the requeued victim runs again first, told its restart count.
    assert_eq!(c.delete(&format!("/v1/sessions/{high}")).status, 200);
    let back = wait_status(&c, &s3, "RUNNING");
    assert_eq!(back["restart_count"], 1, "{back}");
    assert_eq!(exec(&c, &s3, "echo $KERNELVISOR_RESTART_COUNT").trim(), "1");
    assert_eq!(queue(&c), [later]);
    // No eviction loop: the victim (priority 10) never evicts its preemptor, nor anyone.
    assert_eq!(metric(&c), 2.0);
    assert_eq!(preemptions(&c).len(), 2);
    c.check_invariants();
    // The sessions list shows each session once.
    let list = c.get("/v1/sessions?all=true").unwrap().body;
    let n = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["session_id"] == s3.as_str())
        .count();
    assert_eq!(n, 1, "{list}");
}

/// A manager killed in the middle of a preemption (the victim `PREEMPTED`, not yet ended: the
/// `fault-injection` build holds every eviction until a file exists) and started again: the
/// new manager's reconcile sweep completes it, once. The victim is requeued one time
/// (`restart_count` 1, one superseded row), the preemptor runs, nobody else is evicted, and
/// the invariants hold.
#[test]
fn a_preemption_interrupted_by_a_manager_restart_completes_once() {
    let dir = tempfile::tempdir().unwrap();
    let release = dir.path().join("release");
    // Read by the manager processes this test starts (nextest runs each test in a process of
    // its own).
    std::env::set_var("KV_FAULT_HOLD_PREEMPTION", &release);
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra =
        "preemption = true\nadmission-interval = 0.5\nsweep-interval = 0.5\ndestroy-timeout = 2\n"
            .into();
    c.start_manager();
    let a = c.add_agent_ports("preempt-r", 44140, 10);
    let view = c.wait_agent_status(c.agents[a].id(), "ALIVE", LONG);
    let cores: f64 = view["slots_total"]["cpu"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let half = cores / 2.0;
    let victim = id(&create(
        &c,
        &body(
            half,
            json!({"preemptible": true, "restart_policy": {"mode": "always", "max_restarts": 3}}),
        ),
    ));
    let keeper = id(&create(&c, &body(half, json!({}))));
    assert_eq!(session(&c, &victim)["status"], "RUNNING");
    let old_kernel = session(&c, &victim)["kernel_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let high = id(&create(&c, &body(half, json!({"priority": 50}))));
    wait_status(&c, &victim, "PREEMPTED");
    assert_eq!(metric(&c), 1.0);
    // Killed mid-preemption; a new manager on the same store.
    c.stop_manager("KILL");
    c.start_manager();
    wait_for(LONG, "the start-up grace ends", || {
        c.get("/v1/sessions").ok().filter(|a| a.status == 200)
    });
    assert_eq!(session(&c, &victim)["status"], "PREEMPTED");
    std::fs::write(&release, b"").unwrap();
    wait_status(&c, &high, "RUNNING");
    let v = wait_status(&c, &victim, "PENDING");
    assert_eq!(v["restart_count"], 1, "requeued once: {v}");
    assert_ne!(v["kernel_id"], old_kernel.as_str());
    let old = c.store_kernel(&old_kernel);
    assert_eq!(old.status_reason.as_deref(), Some("preempted"));
    assert_eq!(
        old.superseded_by.as_deref(),
        v["kernel_id"].as_str(),
        "the old row names its one successor"
    );
    assert_eq!(session(&c, &keeper)["status"], "RUNNING");
    // The new manager evicted nobody: it completed the eviction it found.
    assert_eq!(metric(&c), 0.0);
    c.check_invariants();
    // Still the one requeued row after more sweeps.
    let rounds = c.manager_metric("kernelvisor_manager_admission_rounds_total", "");
    wait_for(LONG, "more rounds", || {
        (c.manager_metric("kernelvisor_manager_admission_rounds_total", "") >= rounds + 3.0)
            .then_some(())
    });
    let again = session(&c, &victim);
    assert_eq!(
        (again["restart_count"].clone(), again["kernel_id"].clone()),
        (v["restart_count"].clone(), v["kernel_id"].clone())
    );
}

/// A batch job that writes a checkpoint (`$NAME.txt`, with the restart count it was told) to
/// its vfolder on `SIGTERM` and exits 0.
const CHECKPOINTING: &str =
    "trap 'echo \"restart=${KERNELVISOR_RESTART_COUNT:-0}\" > /home/work/ckpt/$NAME.txt; exit 0' TERM; \
     echo ready; while true; do sleep 0.1; done";

/// Waits until the session's job printed `ready` (its trap is set).
fn wait_ready(c: &Cluster, sid: &str) {
    wait_for(LONG, &format!("session {sid} ready"), || {
        let text = ureq::get(&format!("{}/v1/sessions/{sid}/logs", c.api))
            .set("Authorization", &c.auth())
            .call()
            .map(|r| r.into_string().unwrap())
            .unwrap_or_default();
        text.contains("ready").then_some(())
    });
}

/// One agent: the cluster (preemption on, a fast sweep) and the agent's cores.
fn one_agent(name: &str, ports: u16) -> (Cluster, f64) {
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra =
        "preemption = true\nadmission-interval = 0.5\nsweep-interval = 0.5\ngrace-period = 10\nmax-grace-period = 120\n"
            .into();
    c.start_manager();
    let a = c.add_agent_ports(name, ports, 5);
    let view = c.wait_agent_status(c.agents[a].id(), "ALIVE", LONG);
    let cores: f64 = view["slots_total"]["cpu"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    (c, cores)
}

#[test]
fn a_victim_checkpoints_in_its_grace_and_runs_again_with_its_restart_count() {
    let (c, cores) = one_agent("preempt-ckpt", 44150);
    let dir = c.writable_vfolder("ckpt");
    let half = cores / 2.0;
    let job = |name: &str| {
        body(
            half,
            json!({"type": "batch", "command": CHECKPOINTING, "grace_period": 5,
                   "access_key": c.access_key, "environ": {"NAME": name},
                   "mounts": [{"name": "ckpt", "permission": "rw"}],
                   "preemptible": true,
                   "restart_policy": {"mode": "on-failure", "max_restarts": 3}}),
        )
    };
    // The agent full: s1 oldest, s2 youngest.
    let s1 = create(&c, &job("s1"));
    let s2 = create(&c, &job("s2"));
    for s in [&s1, &s2] {
        assert_eq!(s["status"], "RUNNING", "{s}");
    }
    let (s1, s2) = (id(&s1), id(&s2));
    wait_ready(&c, &s1);
    wait_ready(&c, &s2);
    let old_kernel = session(&c, &s2)["kernel_id"].as_str().unwrap().to_owned();
    // Priority 50: exactly one victim, the youngest; it ends by its own trap in its grace.
    let high = id(&create(&c, &body(half, json!({"priority": 50}))));
    let v = wait_status(&c, &s2, "PENDING");
    assert_eq!(v["restart_count"], 1, "{v}");
    assert_eq!(
        std::fs::read_to_string(dir.join("s2.txt"))
            .expect("the victim's checkpoint: it saw SIGTERM and had its grace"),
        "restart=0\n",
        "the victim's checkpoint, written on SIGTERM"
    );
    assert!(!dir.join("s1.txt").exists(), "s1 is no victim");
    assert_eq!(
        c.agent_metric(0, "kernelvisor_agent_grace_kills_total")
            .unwrap_or(0.0),
        0.0,
        "the victim ended by its own exit, not at its deadline"
    );
    let old = c.store_kernel(&old_kernel);
    assert_eq!(old.status_reason.as_deref(), Some("preempted"));
    assert_eq!(old.superseded_by.as_deref(), v["kernel_id"].as_str());
    wait_status(&c, &high, "RUNNING");
    assert_eq!(session(&c, &s1)["status"], "RUNNING");
    assert_eq!(metric(&c), 1.0);
    let ev = preemptions(&c);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["session_id"], high.as_str());
    assert_eq!(ev[0]["victims"], json!([s2]));
    // Room frees: the victim runs again, told its restart count.
    assert_eq!(c.delete(&format!("/v1/sessions/{high}")).status, 200);
    let back = wait_status(&c, &s2, "RUNNING");
    assert_eq!(back["restart_count"], 1, "{back}");
    assert_eq!(back["grace_period"], json!(5.0), "its grace kept: {back}");
    wait_ready(&c, &s2);
    let r = c.delete(&format!("/v1/sessions/{s2}"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(dir.join("s2.txt")).unwrap(),
        "restart=1\n",
        "the rerun's checkpoint: KERNELVISOR_RESTART_COUNT=1"
    );
    assert_eq!(metric(&c), 1.0, "no further eviction");
    assert_eq!(session(&c, &s1)["status"], "RUNNING");
    c.check_invariants();
}

fn docker(args: &[&str]) -> String {
    let out = std::process::Command::new("docker")
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Running containers of a session's kernels.
fn running_containers(sid: &str) -> usize {
    docker(&[
        "ps",
        "--filter",
        &format!("label=ai.backend.session-id={sid}"),
        "--format",
        "{{.Names}}",
    ])
    .lines()
    .count()
}

fn network_exists(name: &str) -> bool {
    !docker(&["network", "ls", "-q", "--filter", &format!("name=^{name}$")]).is_empty()
}

fn kernel_ids(s: &Value) -> Vec<String> {
    s["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["kernel_id"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_gang_victim_is_evicted_whole_and_requeued_as_one_session() {
    let (c, cores) = one_agent("preempt-gang", 44155);
    let quarter = cores / 4.0;
    // The agent full: a preemptible gang of 2 (half the agent) and a session that is not
    // preemptible (the other half).
    let gang = create(
        &c,
        &body(
            quarter,
            json!({"cluster_size": 2, "cluster_mode": "single-node", "preemptible": true,
                   "restart_policy": {"mode": "on-failure", "max_restarts": 3}}),
        ),
    );
    assert_eq!(gang["status"], "RUNNING", "{gang}");
    let keeper = id(&create(&c, &body(cores / 2.0, json!({}))));
    let gid = id(&gang);
    let old_kernels = kernel_ids(&gang);
    assert_eq!(old_kernels.len(), 2, "{gang}");
    let net = format!("bai-singlenode-{gid}");
    assert!(network_exists(&net), "{net}");
    assert_eq!(running_containers(&gid), 2);
    // Priority 50 for half the agent: the gang goes, whole.
    let high = id(&create(&c, &body(cores / 2.0, json!({"priority": 50}))));
    let v = wait_status(&c, &gid, "PENDING");
    assert_eq!(v["restart_count"], 1, "{v}");
    assert_eq!(v["cluster_size"], 2, "{v}");
    wait_status(&c, &high, "RUNNING");
    assert_eq!(running_containers(&gid), 0, "both kernels ended");
    wait_for(LONG, "the gang's network removed", || {
        (!network_exists(&net)).then_some(())
    });
    for k in &old_kernels {
        let row = c.store_kernel(k);
        assert_eq!(
            (row.status.as_str(), row.status_reason.as_deref()),
            ("TERMINATED", Some("preempted")),
            "{k}"
        );
        assert_eq!(row.superseded_by.as_deref(), v["kernel_id"].as_str(), "{k}");
    }
    // One queue entry, one session in the list.
    assert_eq!(queue(&c), std::slice::from_ref(&gid));
    let list = c.get("/v1/sessions?all=true").unwrap().body;
    let n = list["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["session_id"] == gid.as_str())
        .count();
    assert_eq!(n, 1, "{list}");
    assert_eq!(metric(&c), 1.0);
    let ev = preemptions(&c);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0]["victims"], json!([gid]));
    assert_eq!(session(&c, &keeper)["status"], "RUNNING");
    c.check_invariants();
    // Room frees: the gang runs again, whole, on a network of its own.
    assert_eq!(c.delete(&format!("/v1/sessions/{high}")).status, 200);
    let back = wait_status(&c, &gid, "RUNNING");
    assert_eq!(kernel_ids(&back).len(), 2, "{back}");
    assert_eq!(running_containers(&gid), 2);
    // The requeued generation's network is named after its restart.
    let net1 = format!("{net}-r1");
    assert!(network_exists(&net1), "{net1}");
    assert!(!network_exists(&net), "{net}");
    c.check_invariants();
    let d = c.delete(&format!("/v1/sessions/{gid}"));
    assert_eq!(d.status, 200, "{d:?}");
    wait_for(LONG, "the gang's network removed", || {
        (!network_exists(&net1)).then_some(())
    });
    c.check_invariants();
}

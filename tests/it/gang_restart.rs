//! Issue 40: a cluster session's restart policy, on a manager process and agent processes (the
//! `kernelvisor` binary, CURVE on), the real Docker engine and the test image.
//!
//! - A create failing on one kernel (fault injection on `sub2`) with `on-failure` and one
//!   restart: the create answers the session queued again (`PENDING`, `restart_count` 1), its
//!   second create fails the same way and ends it `TERMINATED` `failed-to-create` for good;
//!   each attempt rolled back whole (no container, network, reservation or concurrency left),
//!   `kernelvisor_manager_gang_restarts_total{reason="failed-to-create"}` 1, and the events
//!   show the restart.
//! - A gang whose agent is lost (the agent SIGKILLed) is restarted whole on the other agent:
//!   `RUNNING` again as the same session, `restart_count` 1 and `KERNELVISOR_RESTART_COUNT=1`
//!   in its kernels, on a network of its own (`…-r1`); when the lost agent comes back its old
//!   containers are destroyed (dangling) and the old network removed; the session's destroy
//!   then leaves nothing.
//!
//! Agent host ports: 44300–44399.

use crate::common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::agent::{docker, TEST_IMAGE};
use common::cluster::{signal, wait_exit, wait_for, Cluster, Db};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(90);

fn session(c: &Cluster, id: &str) -> Value {
    c.get(&format!("/v1/sessions/{id}")).unwrap().body
}

/// Containers of the session's kernels on the engine (any state), by kernel id.
fn containers_of(sid: &str) -> BTreeSet<String> {
    docker(&[
        "ps",
        "-a",
        "--filter",
        &format!("label=ai.backend.session-id={sid}"),
        "--format",
        "{{.Label \"ai.backend.kernel-id\"}}",
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

/// The session's kernels as `(kernel id, agent, status)`.
fn kernels(s: &Value) -> Vec<(String, String, String)> {
    s["kernels"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|k| {
            (
                k["kernel_id"].as_str().unwrap_or("").to_owned(),
                k["agent_id"].as_str().unwrap_or("").to_owned(),
                k["status"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Every event of a session so far (`GET /v1/events`, not followed).
fn events_of(c: &Cluster, sid: &str) -> Vec<Value> {
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
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .collect()
}

#[test]
fn a_gang_whose_create_fails_is_requeued_once_by_its_restart_policy() {
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra = "sweep-interval = 1".into();
    c.start_manager();
    let a = c.add_agent("gr-create", 44300, "");
    let agent = c.agents[a].id().to_owned();
    c.wait_agent_status(&agent, "ALIVE", LONG);
    let f = c.post(
        "/v1/sessions",
        &json!({
            "image": TEST_IMAGE,
            "resource_slots": {"cpu": 0.1, "mem": "32m"},
            "cluster_size": 3,
            // A backoff the create's answer comes well within: it shows the queued session.
            "restart_policy": {"mode": "on-failure", "max_restarts": 1, "backoff": 2},
            "_inject": {"kernels": {"sub2": {"fail_at": "container"}}},
        }),
    );
    // The first create failed and was rolled back; the policy queued the session again.
    assert_eq!(
        (f.status, f.body["status"].as_str()),
        (201, Some("PENDING")),
        "{f:?}"
    );
    let reason = f.body["pending_reason"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        reason.contains("failed-to-create") && reason.contains("restart 1"),
        "the reason names the failure and the restart: {f:?}"
    );
    let sid = f.body["session_id"].as_str().unwrap().to_owned();
    // The second create fails the same way, and the session ends for good.
    let ended = wait_for(LONG, "the session ended for good", || {
        let s = session(&c, &sid);
        (s["status"] == "TERMINATED").then_some(s)
    });
    assert_eq!(ended["restart_count"], 1, "{ended}");
    assert_eq!(ended["status_reason"], "failed-to-create", "{ended}");
    assert_eq!(kernels(&ended).len(), 3, "{ended}");
    assert!(
        kernels(&ended).iter().all(|k| k.2 == "TERMINATED"),
        "{ended}"
    );
    // Stays ended: no third attempt however long the sweep runs.
    std::thread::sleep(Duration::from_secs(3));
    let later = session(&c, &sid);
    assert_eq!(
        (later["status"].as_str(), later["restart_count"].as_i64()),
        (Some("TERMINATED"), Some(1)),
        "{later}"
    );
    assert_eq!(
        c.manager_metric(
            "kernelvisor_manager_gang_restarts_total",
            "reason=\"failed-to-create\""
        ),
        1.0
    );
    // Both attempts rolled back whole.
    let left = || {
        let mut left: Vec<String> = containers_of(&sid).into_iter().collect();
        for n in [
            format!("bai-singlenode-{sid}"),
            format!("bai-singlenode-{sid}-r1"),
        ] {
            if network_exists(&n) {
                left.push(n);
            }
        }
        left
    };
    let gone = common::cluster::settle(LONG, left, Vec::is_empty);
    assert!(gone.is_empty(), "left behind: {gone:?}");
    assert_eq!(c.concurrency_used(), 0);
    c.check_invariants();
    // The events tell it: the first attempt's kernels ended, the session queued again with
    // reason `restart`, the second attempt's kernels ended.
    let events = events_of(&c, &sid);
    let statuses: Vec<(String, String)> = events
        .iter()
        .filter(|e| e["status"].is_string())
        .map(|e| {
            (
                e["status"].as_str().unwrap().to_owned(),
                e["reason"].as_str().unwrap_or("").to_owned(),
            )
        })
        .collect();
    let requeued = statuses
        .iter()
        .position(|s| *s == ("PENDING".to_owned(), "restart".to_owned()))
        .unwrap_or_else(|| panic!("a PENDING event with reason `restart`: {statuses:?}"));
    let failed = |range: &[(String, String)]| {
        range
            .iter()
            .filter(|s| s.0 == "TERMINATED" && s.1 == "failed-to-create")
            .count()
    };
    assert_eq!(failed(&statuses[..requeued]), 3, "{statuses:?}");
    assert_eq!(failed(&statuses[requeued..]), 3, "{statuses:?}");
}

#[test]
fn a_gang_on_a_lost_agent_is_restarted_whole_on_another() {
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra = "sweep-interval = 1".into();
    c.manager_extra = "dangling-grace = 1\n".into();
    c.start_manager();
    let a = c.add_agent("gr-lost", 44320, "");
    let lost = c.agents[a].id().to_owned();
    c.wait_agent_status(&lost, "ALIVE", LONG);
    let s = c.post(
        "/v1/sessions",
        &json!({
            "image": TEST_IMAGE,
            "resource_slots": {"cpu": 0.1, "mem": "32m"},
            "cluster_size": 2,
            "restart_policy": {"mode": "on-failure", "max_restarts": 2, "backoff": 0},
        }),
    );
    assert_eq!(
        (s.status, s.body["status"].as_str()),
        (201, Some("RUNNING")),
        "{s:?}"
    );
    let sid = s.body["session_id"].as_str().unwrap().to_owned();
    let first: BTreeSet<String> = kernels(&s.body).into_iter().map(|k| k.0).collect();
    assert_eq!(first.len(), 2);
    assert!(network_exists(&format!("bai-singlenode-{sid}")));
    // The other agent joins; then the first one dies without a word.
    let b = c.add_agent("gr-other", 44340, "");
    let other = c.agents[b].id().to_owned();
    c.wait_agent_status(&other, "ALIVE", LONG);
    let mut child = c.agents[a].process.take().expect("agent running");
    signal(child.id(), "KILL");
    assert!(wait_exit(&mut child, Duration::from_secs(30)));
    // Lost, ended whole, restarted whole on the other agent: the same session.
    let again = wait_for(LONG, "the session RUNNING again on the other agent", || {
        let s = session(&c, &sid);
        let ks = kernels(&s);
        (s["status"] == "RUNNING"
            && ks.len() == 2
            && ks.iter().all(|k| k.1 == other && !first.contains(&k.0)))
        .then_some(s)
    });
    assert_eq!(again["restart_count"], 1, "{again}");
    for (id, _, _) in kernels(&again) {
        assert_eq!(
            kernel_env(&id, "KERNELVISOR_RESTART_COUNT").as_deref(),
            Some("1"),
            "kernel {id}"
        );
    }
    assert!(network_exists(&format!("bai-singlenode-{sid}-r1")));
    assert_eq!(
        c.manager_metric(
            "kernelvisor_manager_gang_restarts_total",
            "reason=\"agent-lost\""
        ),
        1.0
    );
    let events = events_of(&c, &sid);
    assert!(
        events
            .iter()
            .any(|e| e["status"] == "PENDING" && e["reason"] == "restart"),
        "{events:?}"
    );
    // The lost agent comes back: its old containers are destroyed and the old network goes.
    c.start_agent(a);
    c.wait_agent_status(&lost, "ALIVE", LONG);
    wait_for(
        LONG,
        "the old generation's containers and network gone",
        || {
            let left = containers_of(&sid);
            (left.is_disjoint(&first) && !network_exists(&format!("bai-singlenode-{sid}")))
                .then_some(())
        },
    );
    // Still one session, still running; its destroy leaves nothing.
    assert_eq!(session(&c, &sid)["status"], "RUNNING");
    let d = c.delete(&format!("/v1/sessions/{sid}"));
    assert_eq!(d.status, 200, "{d:?}");
    wait_for(LONG, "nothing left", || {
        (containers_of(&sid).is_empty() && !network_exists(&format!("bai-singlenode-{sid}-r1")))
            .then_some(())
    });
    assert_eq!(c.concurrency_used(), 0);
    c.check_invariants();
}

//! Availability (`docs/design.md`, high availability), with real processes: the start-up grace that ends when its work is
//! done, and several managers on one PostgreSQL with leader failover and intake failover.

use crate::common;

use std::process::Child;
use std::time::{Duration, Instant};

use common::agent::free_port;
use common::cluster::{signal, wait_exit, wait_for, Cluster, Db};
use serde_json::Value as Json;

fn health(c: &Cluster, api: &str) -> Option<Json> {
    c.call_at(api, "GET", "/health", None, None)
        .ok()
        .filter(|a| a.status == 200)
        .map(|a| a.body)
}

/// A fresh manager has no grace: a session can be created as soon as the agent is ALIVE. After
/// a restart with two known agents, the grace (60 s here) ends as soon as both have reported.
#[test]
fn grace_ends_when_every_known_agent_reported() {
    let mut c = Cluster::new(Db::Sqlite);
    c.startup_grace = 60.0;
    c.start_manager();
    assert_eq!(
        health(&c, &c.api).expect("health")["mode"],
        "normal",
        "an empty store needs no grace"
    );
    let a = c.add_agent("grace-a", 33600, "");
    let id_a = c.agents[a].id().to_owned();
    c.wait_agent_status(&id_a, "ALIVE", Duration::from_secs(30));
    // No 503: created at once.
    let s = c.create_session();
    let b = c.add_agent("grace-b", 33620, "");
    let id_b = c.agents[b].id().to_owned();
    c.wait_agent_status(&id_b, "ALIVE", Duration::from_secs(30));

    c.stop_manager("TERM");
    let restarted = Instant::now();
    c.start_manager();
    let first = health(&c, &c.api).expect("health");
    let normal = wait_for(Duration::from_secs(20), "the grace to end", || {
        health(&c, &c.api).filter(|h| h["mode"] == "normal")
    });
    let took = restarted.elapsed();
    assert_eq!(normal["agents_alive"], 2, "{normal}");
    assert!(
        took < Duration::from_secs(20),
        "grace lasted {took:?}, far less than startup-grace (60 s) expected"
    );
    let log = std::fs::read_to_string(c.dir.path().join("manager.log")).unwrap();
    assert!(
        log.contains("every agent the store had ALIVE has reported"),
        "the grace should end because both agents reported (first health: {first})"
    );
    // The restarted manager serves: the old session is still there, a new one can be made.
    let sid = s["session_id"].as_str().unwrap();
    assert_eq!(c.get(&format!("/v1/sessions/{sid}")).unwrap().status, 200);
    c.create_session();
    c.check_invariants();
}

/// A second manager on the same SQLite file refuses to start, naming the lock.
#[test]
fn a_second_manager_on_one_sqlite_file_is_refused() {
    let mut c = Cluster::new(Db::Sqlite);
    c.start_manager();
    let mut second = c.spawn_replica_unchecked("second", free_port(), free_port());
    assert!(
        wait_exit(&mut second, Duration::from_secs(20)),
        "the second manager should exit"
    );
    let log = std::fs::read_to_string(c.dir.path().join("second.log")).unwrap();
    assert!(log.contains("manager.db.lock"), "{log}");
    assert!(log.contains("in use by another manager"), "{log}");
    // The first one still serves.
    assert!(health(&c, &c.api).is_some());
}

struct Replica {
    api: String,
    intake: u16,
    child: Option<Child>,
    log: std::path::PathBuf,
}

impl Drop for Replica {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // Without the audit lines: a burst of creates would leave nothing else in the tail.
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().filter(|l| !l.contains(" audit: ")).collect();
            eprintln!(
                "---- {} (tail) ----\n{}",
                self.log.display(),
                lines[lines.len().saturating_sub(30)..].join("\n")
            );
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn leaders(c: &Cluster, replicas: &[Replica]) -> Vec<usize> {
    replicas
        .iter()
        .enumerate()
        .filter(|(_, r)| r.child.is_some())
        .filter(|(_, r)| health(c, &r.api).is_some_and(|h| h["leader"] == true))
        .map(|(i, _)| i)
        .collect()
}

fn metric_sum(c: &Cluster, replicas: &[Replica], name: &str, labels: &str) -> f64 {
    replicas
        .iter()
        .filter(|r| r.child.is_some())
        .map(|r| metric_at(c, &r.api, name, labels))
        .sum()
}

fn metric_at(c: &Cluster, api: &str, name: &str, labels: &str) -> f64 {
    let text = ureq::get(&format!("{api}/metrics"))
        .set("Authorization", &Cluster::bearer(&c.admin_token))
        .timeout(Duration::from_secs(30))
        .call()
        .map(|r| r.into_string().unwrap_or_default())
        .unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(labels))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Three managers on one PostgreSQL, two agents listing all three intakes.
#[test]
fn three_managers_on_postgres_fail_over() {
    let mut c = Cluster::new(Db::Postgres);
    let lease = 4;
    // Replicas see each other's heartbeats within about 2 s (1 s write-behind, 1 s re-read).
    c.heartbeat_timeout = 8.0;
    c.manager_extra = format!("leader-lease = {lease}\n");
    c.start_manager();
    let mut replicas = vec![Replica {
        api: c.api.clone(),
        intake: c.intake_port,
        child: c.manager.take(),
        log: c.dir.path().join("manager.log"),
    }];
    for name in ["replica-1", "replica-2"] {
        let (api, intake) = (free_port(), free_port());
        let child = c.spawn_replica(name, api, intake);
        replicas.push(Replica {
            api: format!("http://127.0.0.1:{api}"),
            intake,
            child: Some(child),
            log: c.dir.path().join(format!("{name}.log")),
        });
    }
    c.agent_intakes = replicas.iter().map(|r| r.intake).collect();
    let a = c.add_agent("ha-a", 33640, "");
    let b = c.add_agent("ha-b", 33660, "");
    let (id_a, id_b) = (c.agents[a].id().to_owned(), c.agents[b].id().to_owned());
    for id in [&id_a, &id_b] {
        c.wait_agent_status(id, "ALIVE", Duration::from_secs(30));
    }
    // Every replica sees both agents ALIVE with a heartbeat's facts (liveness is in the store).
    // `agents_alive` alone is not enough: a replica may hold a row written at the agent's first
    // event, before its first heartbeat (no address, no slots: nothing to place on), until its
    // next re-read of the store.
    for r in &replicas {
        wait_for(
            Duration::from_secs(15),
            "every replica sees both agents",
            || health(&c, &r.api).filter(|h| h["agents_alive"] == 2),
        );
        wait_for(
            Duration::from_secs(15),
            "every replica knows both agents' slots",
            || {
                let list = c
                    .call_at(&r.api, "GET", "/v1/agents", Some(&c.admin_token), None)
                    .ok()?;
                let agents = list.body["agents"].as_array()?;
                let ready = agents
                    .iter()
                    .filter(|a| a["status"] == "ALIVE" && !a["last_heartbeat"].is_null())
                    .count();
                (ready == 2).then_some(())
            },
        );
    }
    let first_leaders = wait_for(Duration::from_secs(15), "one leader", || {
        Some(leaders(&c, &replicas)).filter(|l| l.len() == 1)
    });

    // 200 creates spread concurrently over the three APIs: each asks for 0.5 cpu, so only a
    // few fit on each agent; none may over-commit.
    let apis: Vec<String> = replicas.iter().map(|r| r.api.clone()).collect();
    let token = c.token.clone();
    let results: Vec<(u16, Json)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..20)
            .map(|t| {
                let (apis, token) = (apis.clone(), token.clone());
                scope.spawn(move || {
                    (0..10)
                        .map(|i| {
                            let api = &apis[(t + i) % apis.len()];
                            let r = ureq::post(&format!("{api}/v1/sessions"))
                                .set("Authorization", &Cluster::bearer(&token))
                                .timeout(Duration::from_secs(120))
                                .send_json(serde_json::json!({
                                    "image": "kernelvisor-test:latest",
                                    "resource_slots": {"cpu": "0.5", "mem": "32m"},
                                    // Racing replicas for the same room (not the queue).
                                    "enqueue": false,
                                }));
                            match r {
                                Ok(resp) => (resp.status(), resp.into_json().unwrap_or(Json::Null)),
                                Err(ureq::Error::Status(code, resp)) => {
                                    (code, resp.into_json().unwrap_or(Json::Null))
                                }
                                Err(e) => panic!("no answer from {api}: {e}"),
                            }
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let created = results.iter().filter(|(s, _)| *s == 201).count();
    for (status, body) in &results {
        assert!(
            *status == 201 || (*status == 409 && body["error"]["code"] == "no-capacity"),
            "a create answered {status}: {body}"
        );
    }
    assert!(created > 0, "some creates must succeed");
    for id in [&id_a, &id_b] {
        let view = c.agent_view(id).expect("agent view");
        let total: f64 = view["slots_total"]["cpu"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let used: f64 = view["slots_used"]["cpu"].as_str().unwrap().parse().unwrap();
        assert!(used <= total, "agent {id} over-committed: {used} > {total}");
    }
    eprintln!("{created} of 200 creates fit");
    c.check_invariants();

    // SIGKILL the leader: another replica leads within the lease.
    let old = first_leaders[0];
    let killed_at = Instant::now();
    let mut child = replicas[old].child.take().unwrap();
    signal(child.id(), "KILL");
    wait_exit(&mut child, Duration::from_secs(10));
    let new = wait_for(Duration::from_secs(lease + 10), "a new leader", || {
        Some(leaders(&c, &replicas)).filter(|l| l.len() == 1)
    })[0];
    let took = killed_at.elapsed();
    eprintln!("leader {old} killed; replica {new} leads after {took:?} (lease {lease} s)");
    assert_ne!(new, old);
    assert!(
        took <= Duration::from_secs(lease + 2),
        "the lead moved after {took:?} (lease {lease} s)"
    );
    c.api = replicas[new].api.clone();

    // An agent SIGSTOPped past its timeout is LOST exactly once, reset once on SIGCONT.
    let pid_b = c.agents[b].pid();
    signal(pid_b, "STOP");
    c.wait_agent_status(&id_b, "LOST", Duration::from_secs(20));
    wait_for(Duration::from_secs(20), "the LOST counted", || {
        (metric_sum(&c, &replicas, "kernelvisor_manager_agents_lost_total", "") >= 1.0)
            .then_some(())
    });
    // A negative check: no other replica marks it LOST again meanwhile.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        metric_sum(&c, &replicas, "kernelvisor_manager_agents_lost_total", ""),
        1.0,
        "LOST exactly once across the replicas"
    );
    signal(pid_b, "CONT");
    c.wait_agent_status(&id_b, "ALIVE", Duration::from_secs(40));
    let reset_oks = || -> f64 {
        replicas
            .iter()
            .filter(|r| r.child.is_some())
            .map(|r| {
                metric_at(
                    &c,
                    &r.api,
                    "kernelvisor_manager_agent_resets_total",
                    "result=\"ok\"",
                )
            })
            .sum()
    };
    wait_for(Duration::from_secs(20), "the reset counted", || {
        (reset_oks() >= 1.0).then_some(())
    });
    // A negative check: no other replica resets it again meanwhile.
    std::thread::sleep(Duration::from_secs(3));
    let resets: Vec<f64> = replicas
        .iter()
        .filter(|r| r.child.is_some())
        .map(|r| {
            metric_at(
                &c,
                &r.api,
                "kernelvisor_manager_agent_resets_total",
                "result=\"ok\"",
            )
        })
        .collect();
    assert_eq!(
        resets.iter().sum::<f64>(),
        1.0,
        "reset exactly once: {resets:?}"
    );

    // SIGKILL the replica the agents now report to (after the first kill, the next intake):
    // their events reach the last replica, none lost or applied twice.
    let survivors: Vec<usize> = (0..3).filter(|i| replicas[*i].child.is_some()).collect();
    assert_eq!(survivors.len(), 2);
    let reporting = survivors
        .iter()
        .copied()
        .find(|&i| i == (old + 1) % 3)
        .unwrap_or(survivors[0]);
    let last = survivors.iter().copied().find(|&i| i != reporting).unwrap();
    let mut child = replicas[reporting].child.take().unwrap();
    signal(child.id(), "KILL");
    wait_exit(&mut child, Duration::from_secs(10));
    c.api = replicas[last].api.clone();
    wait_for(
        Duration::from_secs(lease + 10),
        "the last replica leads",
        || Some(leaders(&c, &replicas)).filter(|l| l == &vec![last]),
    );
    // The API answers on the survivor throughout: destroy every session there; each
    // kernel_terminated event must come back through the last intake.
    let live: Vec<String> = c
        .store_live()
        .keys()
        .map(|k| c.store_kernel(k).session_id)
        .collect();
    for sid in &live {
        let r = c.delete(&format!("/v1/sessions/{sid}"));
        assert!(r.status == 200 || r.status == 204, "destroy {sid}: {r:?}");
    }
    let s = c.create_session();
    assert_eq!(s["status"].as_str().map(|_| ()), Some(()));
    c.check_invariants();
    let duplicates = metric_at(&c, &c.api, "kernelvisor_manager_events_duplicate_total", "");
    eprintln!("events acked as duplicates on the last replica: {duplicates}");
}

/// A dangling report taken by a standby replica is resolved by the leader: reports live in the
/// store (`dangling_reports`), not in the memory of the replica the agent happened to report to.
#[test]
fn a_dangling_report_taken_by_a_standby_is_resolved_by_the_leader() {
    let mut c = Cluster::new(Db::Postgres);
    c.manager_extra = "dangling-grace = 2\nleader-lease = 4\n".into();
    // The leader sees the standby's heartbeats within about 2 s (write-behind, re-read).
    c.heartbeat_timeout = 8.0;
    c.start_manager();
    let leader_api = c.api.clone();
    wait_for(Duration::from_secs(15), "the first manager leads", || {
        health(&c, &leader_api).filter(|h| h["leader"] == true)
    });
    let (api, intake) = (free_port(), free_port());
    let mut standby = c.spawn_replica("standby", api, intake);
    let standby_api = format!("http://127.0.0.1:{api}");
    assert_eq!(
        health(&c, &standby_api).expect("standby health")["leader"],
        false
    );
    // The agent reports to the standby only.
    c.agent_intakes = vec![intake];
    let a = c.add_agent("dangling-ha", 33680, "");
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", Duration::from_secs(30));

    // A container with the agent's id label that no manager placed: reported dangling at the
    // agent's next start, to the standby.
    c.stop_agent(a);
    c.wait_agent_status(&id, "TERMINATED", Duration::from_secs(30));
    let ghost_kernel = format!("ghost-{}", common::agent::run_id());
    let ghost = common::agent::ghost_container(&id, &ghost_kernel);
    c.start_agent(a);
    c.wait_agent_status(&id, "ALIVE", Duration::from_secs(30));
    c.api = standby_api.clone();
    wait_for(
        Duration::from_secs(30),
        "the standby applies the report",
        || {
            (c.manager_metric(
                "kernelvisor_manager_events_applied_total",
                "kernel_dangling",
            ) >= 1.0)
                .then_some(())
        },
    );
    // The leader destroys it once dangling-grace (2 s) is over.
    c.api = leader_api.clone();
    wait_for(
        Duration::from_secs(30),
        "the leader destroys the unknown container",
        || {
            (c.manager_metric("kernelvisor_manager_dangling_kernels_total", "destroyed") >= 1.0)
                .then_some(())
        },
    );
    let left = common::agent::docker(&["ps", "-aq", "--filter", &format!("id={ghost}")]);
    assert!(left.is_empty(), "the ghost container is gone: {left}");
    let pending = c.store(|s| Box::pin(async move { s.dangling_reports().await.unwrap() }));
    assert!(
        pending.is_empty(),
        "resolved reports leave the store: {pending:?}"
    );
    c.api = standby_api;
    assert_eq!(
        c.manager_metric("kernelvisor_manager_dangling_kernels_total", "destroyed"),
        0.0,
        "the standby leaves it to the leader"
    );
    c.api = leader_api;
    c.check_invariants();
    signal(standby.id(), "TERM");
    wait_exit(&mut standby, Duration::from_secs(15));
}

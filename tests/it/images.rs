//! Images from a real registry (issue 28): a manager and an agent as processes, the real Docker
//! engine, and Debian's `docker-registry` with basic auth (`tests/common/registry.rs`), the
//! images pushed into it by the tests. Each test pushes under its own repository name and
//! removes what the engine pulled, so no test finds another's image cached.
//!
//! A slow registry is the real one behind [`SlowProxy`], a loopback TCP proxy that passes the
//! registry's answers on at a fixed rate: a pull that outlasts `create-timeout`, progress that
//! can be watched rising, and five sessions that start while one pull is under way.

use crate::common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{json, Value as Json};

use common::agent::{run_id, TEST_IMAGE};
use common::cluster::{wait_for, Answer, Cluster, Db};
use common::registry::{TestRegistry, PASSWORD, USER};

/// A TCP proxy on a free loopback port to `target`, passing the target's bytes back at
/// `bytes_per_sec` (requests go through at full speed).
struct SlowProxy {
    host: String,
}

impl SlowProxy {
    fn start(target: &str, bytes_per_sec: usize) -> SlowProxy {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let host = listener.local_addr().unwrap().to_string();
        let target = target.to_owned();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(upstream) = TcpStream::connect(&target) else {
                    continue;
                };
                let (mut c_read, mut u_write) =
                    (client.try_clone().unwrap(), upstream.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_read, &mut u_write);
                    let _ = u_write.shutdown(std::net::Shutdown::Write);
                });
                let (mut u_read, mut c_write) = (upstream, client);
                std::thread::spawn(move || {
                    // 10 slices a second of bytes_per_sec / 10 each.
                    let mut buf = vec![0u8; (bytes_per_sec / 10).max(1)];
                    loop {
                        match u_read.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => {
                                if c_write.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                                std::thread::sleep(Duration::from_millis(100));
                            }
                        }
                    }
                    let _ = c_write.shutdown(std::net::Shutdown::Write);
                });
            }
        });
        SlowProxy { host }
    }
}

/// A cluster with one agent whose manager knows `registry_host` with `password`.
fn cluster_with_registry(
    registry_host: &str,
    password: &str,
    scheduler: &str,
    ports: u16,
) -> Cluster {
    cluster_with_registry_on(Db::Sqlite, registry_host, password, scheduler, ports)
}

/// [`cluster_with_registry`] on `db`.
fn cluster_with_registry_on(
    db: Db,
    registry_host: &str,
    password: &str,
    scheduler: &str,
    ports: u16,
) -> Cluster {
    let mut c = Cluster::new(db);
    let pw = c.dir.path().join("registry-password");
    std::fs::write(&pw, format!("{password}\n")).unwrap();
    c.manager_tail = format!(
        "\n[[registry]]\nname = \"team\"\nurl = \"http://{registry_host}\"\nusername = \"{USER}\"\npassword-file = \"{}\"\n",
        pw.display()
    );
    c.scheduler_extra = scheduler.to_owned();
    c.start_manager();
    let i = c.add_agent("img", ports, "");
    c.wait_agent_status(c.agents[i].id(), "ALIVE", Duration::from_secs(30));
    c
}

fn create(c: &Cluster, image: &str) -> Answer {
    c.post(
        "/v1/sessions",
        &json!({"image": image, "resource_slots": {"cpu": 0.1, "mem": "64m"}}),
    )
}

fn session(c: &Cluster, id: &str) -> Json {
    c.get(&format!("/v1/sessions/{id}")).unwrap().body
}

/// Waits until the session leaves the pull and create phases; its JSON then.
fn settled(c: &Cluster, id: &str, limit: Duration) -> Json {
    wait_for(limit, "the session to settle", || {
        let s = session(c, id);
        matches!(s["status"].as_str(), Some("RUNNING" | "TERMINATED")).then_some(s)
    })
}

/// A create that fails in the pull phase: answered as an error with `code`, or (when the
/// failure came after the call answered `PULLING`) a session that ends `TERMINATED` with
/// `code` as its reason. Nothing stays held either way.
fn assert_create_fails(c: &Cluster, image: &str, code: &str) {
    let a = create(c, image);
    if a.status == 201 {
        let id = a.body["session_id"].as_str().unwrap().to_owned();
        let s = settled(c, &id, Duration::from_secs(60));
        assert_eq!(s["status"], "TERMINATED", "{s}");
        assert_eq!(s["status_reason"], code, "{s}");
    } else {
        assert_eq!(a.code(), code, "{a:?}");
        assert!(a.status >= 400, "{a:?}");
        assert!(
            a.body["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains(image.rsplit('/').next().unwrap().split(':').next().unwrap()),
            "the message names the image: {a:?}"
        );
    }
    assert!(c.store_live().is_empty(), "nothing stays live");
    assert_eq!(c.concurrency_used(), 0, "concurrency released");
}

fn remove_image(reference: &str) {
    let _ = std::process::Command::new("docker")
        .args(["rmi", "-f", reference])
        .output();
}

#[test]
fn a_private_image_is_pulled_with_the_registrys_credentials_and_errors_name_the_cause() {
    let rt = actix_rt::Runtime::new().unwrap();
    let mut registry = TestRegistry::start();
    let repo = format!("team/private-{}", run_id());
    let image = rt.block_on(registry.push_unique(TEST_IMAGE, &repo, "1", 200_000));
    let c = cluster_with_registry(&registry.host, PASSWORD, "", 34500);

    // With the credentials: pulled, then RUNNING (fast here: it may answer RUNNING at once).
    let a = create(&c, &image);
    assert_eq!(a.status, 201, "{a:?}");
    let id = a.body["session_id"].as_str().unwrap().to_owned();
    let s = settled(&c, &id, Duration::from_secs(60));
    assert_eq!(s["status"], "RUNNING", "{s}");
    assert_eq!(
        c.agent_metric(0, "kernelvisor_image_pulls_total{result=\"pulled\"}"),
        Some(1.0)
    );
    assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 200);
    remove_image(&image);

    // A tag the registry lacks.
    assert_create_fails(
        &c,
        &format!("{}/{repo}:no-such-tag", registry.host),
        "image-not-found",
    );
    // The registry stopped.
    registry.stop();
    assert_create_fails(&c, &image, "registry-unreachable");
    registry.up();
    drop(c);

    // A wrong password.
    let c = cluster_with_registry(&registry.host, "wrong-password", "", 34520);
    assert_create_fails(&c, &image, "registry-auth-failed");
    c.check_invariants();
    remove_image(&image);
}

#[test]
fn a_slow_pull_outlasts_create_timeout_shows_progress_and_is_shared() {
    let rt = actix_rt::Runtime::new().unwrap();
    let registry = TestRegistry::start();
    let repo = format!("team/slow-{}", run_id());
    rt.block_on(registry.push_unique(TEST_IMAGE, &repo, "1", 2_000_000));
    // A layer of 2 MB (random: it does not compress) at 80 kB/s: a pull of ~25 s, longer than
    // create-timeout (10 s). The timeout also bounds the five creates once the image is there,
    // which took over 2 s with other tests beside this one on 2 cores, and over 5 s (the
    // earlier setting, CI 2026-11-29) with runner kernels booting beside it.
    let proxy = SlowProxy::start(&registry.host, 80_000);
    let image = format!("{}/{repo}:1", proxy.host);
    let c = cluster_with_registry(&proxy.host, PASSWORD, "create-timeout = 10", 34540);

    let started = Instant::now();
    let ids: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..5).map(|_| s.spawn(|| create(&c, &image))).collect();
        handles
            .into_iter()
            .map(|h| {
                let a = h.join().unwrap();
                assert_eq!(a.status, 201, "{a:?}");
                assert_eq!(
                    a.body["status"], "PULLING",
                    "a pull this long answers PULLING: {a:?}"
                );
                a.body["session_id"].as_str().unwrap().to_owned()
            })
            .collect()
    });

    // Progress in bytes rises while PULLING, and ends at the total.
    let mut seen: Vec<u64> = Vec::new();
    let first = loop {
        let s = session(&c, &ids[0]);
        if s["status"] != "PULLING" {
            break s;
        }
        if let Some(cur) = s["pull_progress"]["current_bytes"].as_u64() {
            if seen.last() != Some(&cur) {
                seen.push(cur);
            }
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "still pulling: {s}"
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    let s = settled(&c, &ids[0], Duration::from_secs(60));
    assert_eq!(s["status"], "RUNNING", "{first} / {s}");
    assert!(
        started.elapsed() > Duration::from_secs(10),
        "the pull outlasted create-timeout"
    );
    let p = &s["pull_progress"];
    assert!(p["total_bytes"].as_u64().unwrap() > 0, "{s}");
    assert_eq!(p["current_bytes"], p["total_bytes"], "{s}");
    assert_eq!(p["layers_done"], p["layers_total"], "{s}");
    assert!(
        seen.len() >= 2 && seen.windows(2).all(|w| w[0] < w[1]),
        "progress rose in steps: {seen:?}"
    );
    // The event stream told the same story, in order: PULLING, rising progress, RUNNING.
    let body = ureq::get(&format!("{}/v1/events?session_id={}", c.api, ids[0]))
        .set("Authorization", &c.auth())
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let events: Vec<serde_json::Value> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let at = |status: &str| {
        events
            .iter()
            .position(|e| e["type"] == "session_status" && e["status"] == status)
            .unwrap_or_else(|| panic!("no {status} event: {body}"))
    };
    let (pulling, running) = (at("PULLING"), at("RUNNING"));
    let progress: Vec<u64> = events[pulling..running]
        .iter()
        .filter(|e| e["type"] == "pull_progress")
        .map(|e| e["pull_progress"]["current_bytes"].as_u64().unwrap())
        .collect();
    assert!(
        progress.len() >= 2
            && progress.windows(2).all(|w| w[0] <= w[1])
            && progress[0] < progress[progress.len() - 1],
        "pull_progress events between PULLING and RUNNING, rising: {progress:?}"
    );
    assert_eq!(
        progress.last().copied(),
        p["total_bytes"].as_u64(),
        "the last one at the total"
    );

    // Five sessions, one pull.
    for id in &ids {
        assert_eq!(
            settled(&c, id, Duration::from_secs(60))["status"],
            "RUNNING"
        );
    }
    assert_eq!(
        c.agent_metric(0, "kernelvisor_image_pulls_total{result=\"pulled\"}"),
        Some(1.0),
        "one engine pull for five sessions"
    );
    for id in &ids {
        assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 200);
    }
    c.check_invariants();
    remove_image(&image);
}

/// A manager killed while two sessions pull (issue 27: no state without a deadline): nobody
/// follows their pulls any more, and without a take-over they would sit `PULLING` until
/// `image-pull-timeout` (10 minutes here). The restarted manager's sweep finds them unseen for
/// 30 s and creates both from their stored requests: the one whose pull ended meanwhile
/// (`redriven`) and the one still pulling (`adopted`: its pull joined, not started again).
#[test]
fn pulls_a_killed_manager_followed_are_taken_over_sqlite() {
    pulls_a_killed_manager_followed_are_taken_over(Db::Sqlite, 34580);
}

#[test]
fn pulls_a_killed_manager_followed_are_taken_over_postgres() {
    pulls_a_killed_manager_followed_are_taken_over(Db::Postgres, 34600);
}

fn pulls_a_killed_manager_followed_are_taken_over(db: Db, ports: u16) {
    let rt = actix_rt::Runtime::new().unwrap();
    let registry = TestRegistry::start();
    let run = run_id();
    let (short_repo, long_repo) = (format!("team/short-{run}"), format!("team/long-{run}"));
    rt.block_on(registry.push_unique(TEST_IMAGE, &short_repo, "1", 100_000));
    rt.block_on(registry.push_unique(TEST_IMAGE, &long_repo, "1", 1_000_000));
    // 25 kB/s: ~4 s for the short image (it ends while no manager follows it), ~40 s for the
    // long one (still in flight when the next manager takes it over, ~30 s after the kill).
    let proxy = SlowProxy::start(&registry.host, 25_000);
    let short = format!("{}/{short_repo}:1", proxy.host);
    let long = format!("{}/{long_repo}:1", proxy.host);
    let mut c = cluster_with_registry_on(
        db,
        &proxy.host,
        PASSWORD,
        "image-pull-timeout = 600\nsweep-interval = 1",
        ports,
    );

    let started = Instant::now();
    let ids: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = [&short, &long]
            .into_iter()
            .map(|image| s.spawn(|| create(&c, image)))
            .collect();
        handles
            .into_iter()
            .map(|h| {
                let a = h.join().unwrap();
                assert_eq!(a.status, 201, "{a:?}");
                assert_eq!(a.body["status"], "PULLING", "{a:?}");
                a.body["session_id"].as_str().unwrap().to_owned()
            })
            .collect()
    });
    c.stop_manager("KILL");
    c.start_manager();

    for id in &ids {
        let s = settled(&c, id, Duration::from_secs(120));
        assert_eq!(s["status"], "RUNNING", "{s}");
    }
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(120),
        "taken over well before image-pull-timeout: {took:?}"
    );
    let taken = |outcome: &str| {
        c.manager_metric(
            "kernelvisor_manager_stuck_kernels_resolved_total",
            &format!("outcome=\"{outcome}\",state=\"PULLING\""),
        )
    };
    assert_eq!(taken("redriven"), 1.0, "the short pull had ended");
    assert_eq!(taken("adopted"), 1.0, "the long pull was in flight");
    assert_eq!(
        c.agent_metric(0, "kernelvisor_image_pulls_total{result=\"pulled\"}"),
        Some(2.0),
        "one engine pull per image: the adopted pull was joined, not started again"
    );
    for id in &ids {
        assert_eq!(c.delete(&format!("/v1/sessions/{id}")).status, 200);
    }
    c.check_invariants();
    remove_image(&short);
    remove_image(&long);
}

//! The kernel as a supervision tree, on the real Docker engine through the agent's RPC: its
//! eight stage actors, and the restart policy (`never`, `on-failure`, `always`, a failing
//! `HEALTHCHECK`) restarting the container in place until the limit, leaking nothing.
//! Needs the local test images (`just test-image`).

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use rmpv::Value;

use common::agent::*;
use kernelvisor::agent::events::AgentEvent;
use kernelvisor::agent::kernel::stages::STAGES;
use kernelvisor::agent::registry::KernelStages;
use kernelvisor::agent::Agent;
use kernelvisor::config::OnShutdown;
use tokio::sync::broadcast;

const MIB: u64 = 1 << 20;

async fn start(fx: &AgentFixture) -> Agent {
    Agent::start(fx.config(""), None)
        .await
        .expect("agent starts (is the Docker engine up?)")
}

fn policy(mode: &str, max_restarts: u32, backoff: f64) -> (&'static str, Value) {
    (
        "restart_policy",
        map(vec![
            ("mode", mode.into()),
            ("max_restarts", max_restarts.into()),
            ("window", 120.into()),
            ("backoff", Value::F64(backoff)),
        ]),
    )
}

fn command(cmd: &str) -> (&'static str, Value) {
    ("environ", map(vec![("KERNEL_CMD", cmd.into())]))
}

fn http_port() -> (&'static str, Value) {
    (
        "service_ports",
        Value::Array(vec![map(vec![
            ("name", "http".into()),
            ("protocol", "http".into()),
            ("container_ports", Value::Array(vec![8080.into()])),
        ])]),
    )
}

/// What happened to one kernel: its restart events `(count, reason, exit code)` and its end.
#[derive(Debug, Default)]
struct Story {
    restarts: Vec<(u32, String, Option<i64>)>,
    end: Option<(String, Option<i64>)>,
}

/// Collects events until every kernel in `ids` has ended (60 s at most).
async fn stories(
    events: &mut broadcast::Receiver<AgentEvent>,
    ids: &[&str],
) -> HashMap<String, Story> {
    let mut out: HashMap<String, Story> = HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while ids
        .iter()
        .any(|id| out.get(*id).is_none_or(|s| s.end.is_none()))
    {
        let e = tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("kernels did not end in time: {out:?}"))
            .unwrap();
        match e {
            AgentEvent::KernelRestarting {
                kernel_id,
                restart_count,
                reason,
                exit_code,
                ..
            } => {
                out.entry(kernel_id)
                    .or_default()
                    .restarts
                    .push((restart_count, reason, exit_code))
            }
            AgentEvent::KernelTerminated {
                kernel_id,
                reason,
                exit_code,
                ..
            } => out.entry(kernel_id).or_default().end = Some((reason, exit_code)),
            _ => {}
        }
    }
    out
}

fn stage_names(info: &Value) -> Vec<String> {
    field(info, "stages")
        .as_array()
        .unwrap()
        .iter()
        .map(|s| field(s, "name").as_str().unwrap().to_owned())
        .collect()
}

fn restarts_of(info: &Value, stage: &str) -> u64 {
    field(info, "stages")
        .as_array()
        .unwrap()
        .iter()
        .find(|s| field(s, "name").as_str() == Some(stage))
        .map(|s| field(s, "restarts").as_u64().unwrap())
        .unwrap()
}

#[actix_rt::test]
async fn on_failure_restarts_the_container_in_place_then_ends_at_the_limit() {
    let fx = AgentFixture::new("onfailure", 36200, 4);
    let agent = start(&fx).await;
    let mut events = agent.ctx.events.subscribe();
    let peer = client(agent.endpoint()).await;
    // Each life appends to a scratch file, then fails; the first life leaves a marker.
    let config = kernel_config(
        "0.2",
        32 * MIB,
        vec![
            command("[ -f marker ] || echo first > marker; echo life >> lives; sleep 2; exit 1"),
            http_port(),
            policy("on-failure", 2, 0.2),
        ],
    );
    let kid = format!("k-of-{}", run_id());
    let info = create_one(&peer, "s-onfailure", &kid, config)
        .await
        .unwrap();
    let host_ports = field(&info, "host_ports").clone();
    let first_container = field(&info, "container_id").as_str().unwrap().to_owned();
    assert_eq!(stage_names(&info), STAGES);
    assert_eq!(field(&info, "restart_count").as_u64(), Some(0));

    // The supervision tree: eight stage actors, in order, all running.
    let sup = agent
        .registry()
        .send(KernelStages(kid.clone()))
        .await
        .unwrap()
        .expect("a running kernel has a stage supervisor");
    let children = sup.send(actors::WhichChildren).await.unwrap();
    assert_eq!(
        children.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(),
        STAGES
    );
    assert!(children.iter().all(|c| c.running));

    // Wait for the first restart to complete: same kernel, same host ports, a new container,
    // the scratch file of the first life still there.
    let work = fx.scratch_root().join(&kid).join("work");
    let mut restarted = None;
    for _ in 0..300 {
        let i = call(&peer, "get_kernel", vec![kid.as_str().into()]).await;
        if let Ok(i) = i {
            if field(&i, "restart_count").as_u64() == Some(1)
                && field(&i, "status").as_str() == Some("RUNNING")
            {
                restarted = Some(i);
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let restarted = restarted.expect("restarted once and RUNNING again");
    assert_eq!(field(&restarted, "id").as_str(), Some(kid.as_str()));
    assert_eq!(
        field(&restarted, "host_ports"),
        &host_ports,
        "host ports kept"
    );
    assert_ne!(
        field(&restarted, "container_id").as_str(),
        Some(first_container.as_str())
    );
    assert_eq!(restarts_of(&restarted, "image"), 0);
    assert_eq!(restarts_of(&restarted, "scratch"), 0);
    assert_eq!(restarts_of(&restarted, "container"), 1);
    assert_eq!(restarts_of(&restarted, "service-ports"), 1);
    assert_eq!(read(&work.join("marker")), "first\n", "scratch survives");
    // RUNNING means the container started, not that its shell has run its first line yet.
    let mut lives = 0;
    for _ in 0..100 {
        lives = read(&work.join("lives")).lines().count();
        if lives >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(lives >= 2, "the second life wrote its line: {lives}");
    assert_eq!(fx.containers().len(), 1, "one container at a time");

    let story = stories(&mut events, &[&kid]).await.remove(&kid).unwrap();
    assert_eq!(
        story.restarts,
        [
            (1, "self-terminated".to_owned(), Some(1)),
            (2, "self-terminated".to_owned(), Some(1))
        ]
    );
    assert_eq!(
        story.end,
        Some(("restart-limit-exceeded".to_owned(), Some(1)))
    );
    assert!(fx.containers().is_empty(), "nothing leaked: containers");
    assert!(fx.scratch_entries().is_empty(), "nothing leaked: scratch");
    tokio::time::sleep(Duration::from_millis(150)).await; // port cooldown of the fixture
    let (cpu, mem, free_ports) = usage(&peer).await;
    assert_eq!((cpu.as_str(), mem.as_str(), free_ports), ("0", "0", 4));
    let metrics = agent.ctx.metrics.render();
    assert!(
        metrics.contains("kernelvisor_kernel_restarts_total{reason=\"self-terminated\"} 2"),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("restarts"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn never_ends_at_the_first_exit_and_always_restarts_after_a_clean_one() {
    let fx = AgentFixture::new("modes", 36220, 4);
    let agent = start(&fx).await;
    let mut events = agent.ctx.events.subscribe();
    let peer = client(agent.endpoint()).await;
    let never = kernel_config(
        "0.2",
        32 * MIB,
        vec![command("sleep 1; exit 3"), policy("never", 5, 0.0)],
    );
    let always = kernel_config(
        "0.2",
        32 * MIB,
        vec![command("sleep 1; exit 0"), policy("always", 1, 0.0)],
    );
    let fail_default = kernel_config("0.2", 32 * MIB, vec![command("sleep 1; exit 4")]);
    let (k_never, k_always, k_default) = (
        format!("k-nv-{}", run_id()),
        format!("k-al-{}", run_id()),
        format!("k-df-{}", run_id()),
    );
    create_one(&peer, "s-modes", &k_never, never).await.unwrap();
    create_one(&peer, "s-modes", &k_always, always)
        .await
        .unwrap();
    create_one(&peer, "s-modes", &k_default, fail_default)
        .await
        .unwrap();
    let mut s = stories(&mut events, &[&k_never, &k_always, &k_default]).await;
    let never = s.remove(&k_never).unwrap();
    assert!(never.restarts.is_empty(), "{never:?}");
    assert_eq!(never.end, Some(("self-terminated".to_owned(), Some(3))));
    let default = s.remove(&k_default).unwrap();
    assert!(
        default.restarts.is_empty(),
        "the default is `never`: {default:?}"
    );
    assert_eq!(default.end, Some(("self-terminated".to_owned(), Some(4))));
    let always = s.remove(&k_always).unwrap();
    assert_eq!(
        always.restarts,
        [(1, "self-terminated".to_owned(), Some(0))]
    );
    assert_eq!(
        always.end,
        Some(("restart-limit-exceeded".to_owned(), Some(0)))
    );
    assert!(fx.containers().is_empty());
    assert!(fx.scratch_entries().is_empty());
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn a_failing_healthcheck_restarts_the_container_under_on_failure() {
    let fx = AgentFixture::new("health", 36240, 4);
    let agent = start(&fx).await;
    let mut events = agent.ctx.events.subscribe();
    let peer = client(agent.endpoint()).await;
    // Healthy for about two seconds, then the image's HEALTHCHECK fails; the process lives on.
    let config = kernel_config(
        "0.2",
        32 * MIB,
        vec![
            ("image", image("kernelvisor-test:healthcheck")),
            command("touch /tmp/healthy; sleep 2; rm /tmp/healthy; exec sleep 1000"),
            policy("on-failure", 1, 0.0),
        ],
    );
    let kid = format!("k-hc-{}", run_id());
    create_one(&peer, "s-health", &kid, config).await.unwrap();
    let story = stories(&mut events, &[&kid]).await.remove(&kid).unwrap();
    assert_eq!(story.restarts, [(1, "unhealthy".to_owned(), None)]);
    assert_eq!(story.end, Some(("restart-limit-exceeded".to_owned(), None)));
    assert!(fx.containers().is_empty());
    assert!(fx.scratch_entries().is_empty());

    // Under `never` an unhealthy container is only reported: the kernel keeps running.
    let kept = kernel_config(
        "0.2",
        32 * MIB,
        vec![
            ("image", image("kernelvisor-test:healthcheck")),
            command("exec sleep 1000"),
        ],
    );
    let k2 = format!("k-hc2-{}", run_id());
    let info = create_one(&peer, "s-health", &k2, kept).await.unwrap();
    let cid = field(&info, "container_id").as_str().unwrap().to_owned();
    for _ in 0..100 {
        if inspect(&cid, "{{.State.Health.Status}}").as_deref() == Some("unhealthy") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        inspect(&cid, "{{.State.Health.Status}}").as_deref(),
        Some("unhealthy")
    );
    // A negative check: unhealthy for a while, yet neither restarted nor ended.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let i = call(&peer, "get_kernel", vec![k2.as_str().into()])
        .await
        .unwrap();
    assert_eq!(field(&i, "status").as_str(), Some("RUNNING"));
    assert_eq!(field(&i, "restart_count").as_u64(), Some(0));
    agent.shutdown(OnShutdown::Terminate).await;
    assert!(fx.containers().is_empty());
}

#[actix_rt::test]
async fn a_bad_restart_policy_is_refused_with_its_field() {
    let fx = AgentFixture::new("badpolicy", 36260, 2);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    for (bad, word) in [
        (map(vec![("mode", "sometimes".into())]), "mode"),
        (map(vec![("window", 0.into())]), "window"),
        (map(vec![("retries", 1.into())]), "retries"),
    ] {
        let config = kernel_config("0.2", 32 * MIB, vec![("restart_policy", bad)]);
        let r = create_one(&peer, "s-bad", &format!("k-bad-{}", run_id()), config).await;
        assert_eq!(failure_name(&r), "InvalidKernelConfig");
        assert!(format!("{r:?}").contains(word), "{r:?}");
    }
    assert!(fx.containers().is_empty());
    agent.shutdown(OnShutdown::Terminate).await;
}

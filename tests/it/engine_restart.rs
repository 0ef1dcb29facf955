//! The agent across a Docker engine restart, on a private engine the test starts itself (its
//! own containerd, socket, data and exec roots, `--bridge=none --iptables=false`): five
//! running kernels, dockerd SIGKILLed (containerd and the shims live on) and started again.
//! Throughout, the agent answers `ping`; during the outage `health` is `degraded` and
//! `create_kernels` fails within 5 s with `ContainerEngineUnavailable`, leaving nothing behind.
//! With `--live-restore` the five kernels are `RUNNING` afterwards, each with its one container,
//! and `execute` works in them; without it their containers die with the engine's restart and
//! the kernels with restart policy `never` (the default) end, every resource released, and those
//! with `on-failure` get a new container (same kernel, `restart_count` 1, no duplicate).
//!
//! Needs root, `dockerd` and `containerd` (Debian's `docker.io`; `just docker` installs it), and
//! the test image on the main engine (`just test-image`); it is copied into the private one
//! (`tests/common/engines.rs`).

use crate::common;

use std::process::Child;
use std::time::{Duration, Instant};

use rmpv::Value;

use common::agent::*;
use common::engines::{host_has_docker0, EngineNetwork, EngineSpec, PrivateEngine};
use common::wait_until;
use kernelvisor::rpc::{Call, Peer};

const MIB: u64 = 1 << 20;
const KERNELS: usize = 5;

/// A private engine for this test: its daemons in a fresh network namespace, no bridge.
fn private_engine(live_restore: bool) -> PrivateEngine {
    PrivateEngine::start(EngineSpec {
        live_restore,
        network: EngineNetwork::Isolated,
    })
}

/// The agent process, SIGKILLed on drop (its kernels are the engine's to clean up).
struct AgentProcess(Child);

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The agent binary on `engine`, logging to `agent.log`.
fn spawn_agent(fx: &AgentFixture, engine: &PrivateEngine) -> AgentProcess {
    let config = fx.config_toml("").replacen(
        "[container]\n",
        &format!("[container]\ndocker-host = \"{}\"\n", engine.host()),
        1,
    );
    let path = fx.dir.path().join("agent.toml");
    std::fs::write(&path, config).unwrap();
    let child = spawn_agent_process(fx, &path);
    AgentProcess(child)
}

async fn connect(fx: &AgentFixture) -> Peer {
    connect_process(fx).await
}

/// `method(*args)` answered within `limit` (a FAILURE is an answer).
async fn call_within(
    peer: &Peer,
    method: &str,
    args: Vec<Value>,
    limit: Duration,
) -> Result<Value, kernelvisor::rpc::CallError> {
    let call = Call {
        args,
        kwargs: vec![],
        peer_user_id: None,
    };
    peer.call(method, &call, limit).await
}

/// `ping` answers within 2 s.
async fn assert_pings(peer: &Peer) {
    let out = call_within(peer, "ping", vec!["hi".into()], Duration::from_secs(2)).await;
    assert_eq!(out.unwrap(), Value::from("hi"), "ping");
}

/// `health()["status"]`, answered within 2 s, and the whole reply.
async fn health(peer: &Peer) -> (String, Value) {
    let h = call_within(peer, "health", vec![], Duration::from_secs(2))
        .await
        .expect("health answers");
    (field(&h, "status").as_str().unwrap().to_owned(), h)
}

/// Every kernel the agent holds: id → (status, container id).
async fn kernels(peer: &Peer) -> Vec<(String, String, String)> {
    let synced = call_within(peer, "list_kernels", vec![], Duration::from_secs(5))
        .await
        .unwrap();
    let mut out: Vec<_> = field(&synced, "kernels")
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            let s = |key| field(k, key).as_str().unwrap_or_default().to_owned();
            (s("kernel_id"), s("status"), s("container_id"))
        })
        .collect();
    out.sort();
    out
}

/// `config` with restart policy `on-failure` (3 restarts in 60 s, 0.2 s backoff).
fn on_failure(mut config: Value) -> Value {
    if let Value::Map(m) = &mut config {
        m.push((
            "restart_policy".into(),
            map(vec![
                ("mode", "on-failure".into()),
                ("max_restarts", 3.into()),
                ("backoff", Value::F64(0.2)),
            ]),
        ));
    }
    config
}

/// A kernel config whose container prints `tick-<unix seconds>` every 0.5 s.
fn ticking() -> Value {
    kernel_config(
        "0.1",
        32 * MIB,
        vec![(
            "environ",
            map(vec![(
                "KERNEL_CMD",
                "while :; do echo tick-$(date +%s); sleep 0.5; done".into(),
            )]),
        )],
    )
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The newest `tick-<t>` in the kernel's kept log (`get_logs`), 0 when none.
async fn newest_tick(peer: &Peer, kernel_id: &str) -> u64 {
    let r = call(peer, "get_logs", vec![kernel_id.into()])
        .await
        .unwrap();
    field(&r, "logs")
        .as_str()
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tick-")?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// An agent on `engine` with five RUNNING kernels of one session; returns the fixture, the
/// agent, a client and the kernels as `kernels` lists them.
async fn five_kernels(
    name: &str,
    ports_lo: u16,
    engine: &PrivateEngine,
    configs: Vec<Value>,
) -> (
    AgentFixture,
    AgentProcess,
    Peer,
    Vec<(String, String, String)>,
) {
    let fx = AgentFixture::new(name, ports_lo, 4);
    let agent = spawn_agent(&fx, engine);
    let peer = connect(&fx).await;
    let ids: Vec<Value> = (0..KERNELS)
        .map(|i| format!("k{i}-{}", run_id()).into())
        .collect();
    let created = call(
        &peer,
        "create_kernels",
        vec!["s1".into(), Value::Array(ids), Value::Array(configs)],
    )
    .await;
    assert!(
        created.is_ok(),
        "create_kernels: {created:?}; agent log:\n{}",
        read(&fx.dir.path().join("agent.log"))
    );
    let ks = kernels(&peer).await;
    assert_eq!(ks.len(), KERNELS);
    assert!(ks.iter().all(|(_, s, c)| s == "RUNNING" && !c.is_empty()));
    let mut cids: Vec<String> = ks.iter().map(|(_, _, c)| c.clone()).collect();
    cids.sort();
    assert_eq!(engine.containers(&fx.agent_id, true), cids);
    assert_eq!(health(&peer).await.0, "ok");
    (fx, agent, peer, ks)
}

/// SIGKILLs dockerd and checks the agent through the outage: `ping` answers, `health` turns
/// `degraded` with the engine's error, a `create_kernels` fails within 5 s with
/// `ContainerEngineUnavailable` and reserves nothing, `destroy_kernel` is refused the same way.
async fn outage(engine: &mut PrivateEngine, peer: &Peer, kernel_id: &str) {
    let before = usage(peer).await;
    engine.kill_dockerd();
    assert_pings(peer).await;
    wait_until(Duration::from_secs(10), "health degraded", || async {
        health(peer).await.0 == "degraded"
    })
    .await;
    let (_, h) = health(peer).await;
    let error = field(&h, "engine_error").as_str().unwrap_or_default();
    assert!(!error.is_empty(), "health names the engine's error: {h}");
    assert!(field(&h, "engine_down_seconds").as_f64().is_some(), "{h}");
    assert_pings(peer).await;

    let started = Instant::now();
    let created = call_within(
        peer,
        "create_kernels",
        vec![
            "s2".into(),
            Value::Array(vec![format!("k-outage-{}", run_id()).into()]),
            Value::Array(vec![kernel_config("0.1", 32 * MIB, vec![])]),
        ],
        Duration::from_secs(30),
    )
    .await;
    let took = started.elapsed();
    assert_eq!(failure_name(&created), "ContainerEngineUnavailable");
    assert!(
        took < Duration::from_secs(5),
        "create_kernels took {took:?}"
    );
    assert_eq!(
        usage(peer).await,
        before,
        "the refused create reserved nothing"
    );
    assert_eq!(kernels(peer).await.len(), KERNELS);

    let destroyed = call_within(
        peer,
        "destroy_kernel",
        vec![kernel_id.into(), "s1".into()],
        Duration::from_secs(5),
    )
    .await;
    assert_eq!(failure_name(&destroyed), "ContainerEngineUnavailable");
    let reset = call_within(peer, "reset_agent", vec![], Duration::from_secs(5)).await;
    assert_eq!(failure_name(&reset), "ContainerEngineUnavailable");
    assert_pings(peer).await;
}

#[actix_rt::test]
async fn live_restore_keeps_every_kernel_running_across_an_engine_restart() {
    let docker0 = host_has_docker0();
    let mut engine = private_engine(true);
    let (fx, agent, peer, before) =
        five_kernels("engine-live", 32700, &engine, vec![ticking(); KERNELS]).await;

    outage(&mut engine, &peer, &before[0].0).await;
    // The containers outlive dockerd (their shims and containerd run on).
    engine.start_dockerd();
    let back = unix_now();
    assert_pings(&peer).await;
    wait_until(Duration::from_secs(30), "health ok again", || async {
        health(&peer).await.0 == "ok"
    })
    .await;
    // The watcher has resubscribed and asked for a reconciliation; give it time to act on
    // every kernel, checking throughout that none is lost.
    let settle = Instant::now();
    while settle.elapsed() < Duration::from_secs(4) {
        assert_pings(&peer).await;
        assert_eq!(
            kernels(&peer).await,
            before,
            "all five kernels kept as they were"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let mut cids: Vec<String> = before.iter().map(|(_, _, c)| c.clone()).collect();
    cids.sort();
    assert_eq!(
        engine.containers(&fx.agent_id, false),
        cids,
        "exactly the five containers, no duplicate"
    );
    assert_eq!(engine.containers(&fx.agent_id, true), cids, "all running");
    for (kernel_id, _, _) in &before {
        assert_eq!(
            call(&peer, "check_running", vec![kernel_id.clone().into()])
                .await
                .unwrap(),
            Value::from(true)
        );
    }
    let out = call(
        &peer,
        "execute",
        vec![
            "s1".into(),
            before[0].0.clone().into(),
            "v4".into(),
            "r".into(),
            "query".into(),
            "echo survived".into(),
            map(vec![]),
            0.into(),
        ],
    )
    .await
    .unwrap();
    assert_eq!(field(&out, "status").as_str(), Some("finished"), "{out}");
    assert!(format!("{:?}", field(&out, "console")).contains("survived"));

    // Their logs are kept again: output written after the engine came back reaches get_logs.
    wait_until(
        Duration::from_secs(20),
        "the kernel's log follows again",
        || async { newest_tick(&peer, &before[0].0).await > back + 1 },
    )
    .await;

    assert_eq!(kernels(&peer).await, before);
    assert_eq!(engine.containers(&fx.agent_id, false), cids);

    // Destroyable again once the engine is back; nothing left.
    for (kernel_id, _, _) in &before {
        call(
            &peer,
            "destroy_kernel",
            vec![kernel_id.clone().into(), "s1".into()],
        )
        .await
        .unwrap();
    }
    assert!(engine.containers(&fx.agent_id, false).is_empty());
    assert!(fx.scratch_entries().is_empty());
    assert!(
        !read(&fx.dir.path().join("agent.log")).contains("panicked"),
        "agent log:\n{}",
        read(&fx.dir.path().join("agent.log"))
    );
    peer.close();
    drop(agent);
    drop(engine);
    assert_eq!(
        host_has_docker0(),
        docker0,
        "the private engine left the host's docker0 alone"
    );
}

#[actix_rt::test]
async fn without_live_restore_the_kernels_follow_their_restart_policy() {
    let docker0 = host_has_docker0();
    let mut engine = private_engine(false);
    let (fx, agent, peer, before) = five_kernels("engine-dies", 32710, &engine, {
        // Three with the default policy (`never`), two with `on-failure`.
        let mut c = vec![ticking(); KERNELS - 2];
        c.extend(vec![on_failure(ticking()); 2]);
        c
    })
    .await;

    outage(&mut engine, &peer, &before[0].0).await;
    // Without live-restore the engine kills the containers it finds running as it starts.
    engine.start_dockerd();
    wait_until(Duration::from_secs(30), "health ok again", || async {
        health(&peer).await.0 == "ok"
    })
    .await;
    // Restart policy `never` (the default): each kernel ends, torn down, and is forgotten;
    // `on-failure`: its container is created again, same kernel.
    let restarted: Vec<String> = before[KERNELS - 2..].iter().map(|k| k.0.clone()).collect();
    let ended = &before[..KERNELS - 2];
    wait_until(
        Duration::from_secs(60),
        "three kernels ended and two restarted",
        || async {
            assert_pings(&peer).await;
            let now = kernels(&peer).await;
            now.len() == 2
                && now.iter().all(|(id, status, c)| {
                    restarted.contains(id) && status == "RUNNING" && !c.is_empty()
                })
        },
    )
    .await;
    for (kernel_id, _, old_container) in &before[KERNELS - 2..] {
        let info = call(&peer, "get_kernel", vec![kernel_id.clone().into()])
            .await
            .unwrap();
        assert_eq!(field(&info, "restart_count").as_u64(), Some(1), "{info:?}");
        assert_ne!(
            field(&info, "container_id").as_str(),
            Some(old_container.as_str()),
            "a new container"
        );
    }
    let mut running = engine.containers(&fx.agent_id, true);
    running.sort();
    let mut expected: Vec<String> = kernels(&peer).await.into_iter().map(|k| k.2).collect();
    expected.sort();
    assert_eq!(
        running, expected,
        "one container per restarted kernel, no duplicate"
    );
    for id in &restarted {
        call(
            &peer,
            "destroy_kernel",
            vec![id.clone().into(), "s1".into()],
        )
        .await
        .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(150)).await; // port cooldown of the fixture
    for (kernel_id, _, _) in ended {
        assert_eq!(
            failure_name(&call(&peer, "get_kernel", vec![kernel_id.clone().into()]).await),
            "KernelNotFound"
        );
    }
    assert!(
        engine.containers(&fx.agent_id, false).is_empty(),
        "no container left"
    );
    assert!(fx.scratch_entries().is_empty(), "no scratch dir left");
    let (cpu, mem, free) = usage(&peer).await;
    assert_eq!(
        (cpu.as_str(), mem.as_str(), free),
        ("0", "0", 4),
        "slots and ports released"
    );
    peer.close();
    drop(agent);
    drop(engine);
    assert_eq!(
        host_has_docker0(),
        docker0,
        "the private engine left the host's docker0 alone"
    );
}

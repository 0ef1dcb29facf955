//! The agent's event path: durable outbox, delivery with acks, resend of unacked
//! batches with the same ids, delivery across an agent restart, and latest-wins heartbeats;
//! over real ZeroMQ with CURVE, real SQLite, kernels on the dummy backend.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use rmpv::Value;

use common::agent::{free_port, kernel_config, AgentFixture};
use common::intake::{int_field, start_intake, str_field, Received};
use common::{wait_until, Keys};
use kernelvisor::agent::backend::dummy::{DummyBackend, DummyDelays};
use kernelvisor::agent::backend::ContainerBackend;
use kernelvisor::agent::events::AgentEvent;
use kernelvisor::agent::Agent;
use kernelvisor::config::{AgentConfig, OnShutdown};
use kernelvisor::rpc::socket::ClientCurve;
use kernelvisor::rpc::{Call, Peer, PeerOptions};

fn config(fx: &AgentFixture, intake_port: u16) -> AgentConfig {
    let d = fx.dir.path().display();
    let toml = fx.config_toml(&format!(
        "rpc-auth-manager-public-key = \"{d}/manager.key\"\nrpc-auth-agent-keypair = \"{d}/agent.key_secret\"\nbackend = \"dummy\"\n"
    )) + &format!(
        "[manager]\nevent-addr = {{ host = \"127.0.0.1\", port = {intake_port} }}\nevent-ack-timeout = 1.0\nevent-retry-max = 0.3\n\
         event-batch-size = 64\nheartbeat-interval = 0.3\n"
    );
    let path = fx.dir.path().join("agent.toml");
    std::fs::write(&path, toml).unwrap();
    AgentConfig::load(&path).unwrap()
}

async fn manager_client(agent: &Agent, keys: &Keys) -> Peer {
    let opts = PeerOptions {
        endpoint: agent.endpoint().to_owned(),
        curve: Some(ClientCurve {
            keypair: keys.manager.clone(),
            server_key: keys.agent.public,
        }),
        keepalive: None,
        handshake_timeout: Duration::from_secs(5),
    };
    Peer::connect(&zmq::Context::new(), &opts)
        .await
        .expect("CURVE connect to the agent")
}

/// A gauge's value from the agent's own `/metrics` text.
fn gauge(agent: &Agent, name: &str) -> f64 {
    let text = agent.ctx.metrics.render();
    text.lines()
        .find_map(|l| {
            l.strip_prefix(name)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("{name} not in {text}"))
}

/// Creates and destroys `n` kernels (4 events each with a local image: preparing, creating,
/// started, terminated) through the agent's RPC, 10 per `create_kernels` call.
async fn churn(peer: &Peer, tag: &str, n: usize) -> Vec<String> {
    let call = |method: &str, args: Vec<Value>| {
        let (peer, method) = (peer.clone(), method.to_owned());
        async move {
            peer.call(
                &method,
                &Call {
                    args,
                    kwargs: vec![],
                    peer_user_id: None,
                },
                Duration::from_secs(60),
            )
            .await
            .unwrap_or_else(|e| panic!("{method}: {e}"))
        }
    };
    let mut ids = Vec::new();
    for batch in 0..n.div_ceil(10) {
        let session = format!("s-{tag}-{batch}");
        let kernels: Vec<String> = (0..10.min(n - batch * 10))
            .map(|i| format!("k-{tag}-{batch}-{i}"))
            .collect();
        let configs = kernels
            .iter()
            .map(|_| kernel_config("0.01", 8 << 20, vec![]))
            .collect();
        call(
            "create_kernels",
            vec![
                session.clone().into(),
                Value::Array(kernels.iter().map(|k| k.clone().into()).collect()),
                Value::Array(configs),
            ],
        )
        .await;
        for k in &kernels {
            call(
                "destroy_kernel",
                vec![k.clone().into(), session.clone().into()],
            )
            .await;
        }
        ids.extend(kernels);
    }
    ids
}

/// The events the manager's outbox takes (bus-only ones, such as `do_sync_kernel_logs`, go to
/// Backend.AI's bus alone).
fn collect(events: &mut tokio::sync::broadcast::Receiver<AgentEvent>, into: &mut Vec<AgentEvent>) {
    while let Ok(e) = events.try_recv() {
        if !e.is_bus_only() {
            into.push(e);
        }
    }
}

#[actix_rt::test]
async fn a_thousand_events_survive_an_outage_a_lost_ack_and_an_agent_restart() {
    let fx = AgentFixture::new("outbox", 31700, 4);
    let keys = Keys::new();
    keys.write(fx.dir.path());
    let intake_port = free_port();
    let dummy =
        || Some(Arc::new(DummyBackend::new(DummyDelays::default())) as Arc<dyn ContainerBackend>);

    // Receiver down: the first agent produces events and stops with them pending.
    let mut produced = Vec::new();
    let agent = Agent::start(config(&fx, intake_port), dummy())
        .await
        .unwrap();
    let mut bus = agent.ctx.events.subscribe();
    produced.push(AgentEvent::AgentStarted); // emitted before we could subscribe
    let peer = manager_client(&agent, &keys).await;
    churn(&peer, "a", 125).await;
    collect(&mut bus, &mut produced);
    wait_until(
        Duration::from_secs(10),
        "the outbox holds every event",
        || {
            let depth = gauge(&agent, "kernelvisor_outbox_depth");
            let n = produced.len();
            async move { depth as usize == n }
        },
    )
    .await;
    peer.close();
    agent.shutdown(OnShutdown::Preserve).await;
    produced.push(AgentEvent::AgentTerminated {
        reason: "shutdown".into(),
    });

    // Restarted agent, receiver still down: more events on top of the pending ones.
    let agent = Agent::start(config(&fx, intake_port), dummy())
        .await
        .unwrap();
    let mut bus = agent.ctx.events.subscribe();
    produced.push(AgentEvent::AgentStarted);
    let peer = manager_client(&agent, &keys).await;
    churn(&peer, "b", 125).await;
    collect(&mut bus, &mut produced);
    assert!(produced.len() >= 1000, "{} events produced", produced.len());
    wait_until(
        Duration::from_secs(10),
        "the outbox holds both runs' events",
        || {
            let depth = gauge(&agent, "kernelvisor_outbox_depth");
            let n = produced.len();
            async move { depth as usize == n }
        },
    )
    .await;

    // The receiver comes back and loses the ack of the first batch it gets.
    let received = Received::default();
    received.lose_acks.store(1, Ordering::SeqCst);
    let intake_up_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let _intake = start_intake(
        &format!("tcp://127.0.0.1:{intake_port}"),
        &keys.manager,
        keys.agent.public,
        &received,
    );
    wait_until(Duration::from_secs(60), "the outbox drains", || {
        let depth = gauge(&agent, "kernelvisor_outbox_depth");
        async move { depth == 0.0 }
    })
    .await;

    let events = received.events.lock().unwrap().clone();
    // Every produced event arrived (as a multiset of (name, kernel)), none invented.
    let mut by_id: HashMap<String, Value> = HashMap::new();
    let mut first_seen: Vec<String> = Vec::new();
    for e in &events {
        let id = str_field(e, "id")
            .expect("every event has an id")
            .to_owned();
        match by_id.get(&id) {
            Some(earlier) => assert_eq!(
                earlier, e,
                "a resend carries the same id and the same content"
            ),
            None => {
                by_id.insert(id.clone(), e.clone());
                first_seen.push(id);
            }
        }
    }
    let key = |name: &str, kernel: Option<&str>| (name.to_owned(), kernel.map(str::to_owned));
    let mut want: HashMap<(String, Option<String>), usize> = HashMap::new();
    for e in &produced {
        *want.entry(key(e.name(), e.kernel_id())).or_default() += 1;
    }
    let mut got: HashMap<(String, Option<String>), usize> = HashMap::new();
    for e in by_id.values() {
        *got.entry(key(
            str_field(e, "name").unwrap(),
            str_field(e, "kernel_id"),
        ))
        .or_default() += 1;
    }
    assert_eq!(got, want, "every event arrives exactly once by id");
    assert!(
        events.len() > by_id.len(),
        "the batch whose ack was lost was resent ({} deliveries, {} ids)",
        events.len(),
        by_id.len()
    );

    // Order: seq grows in first-arrival order, and each kernel's events come in lifecycle order.
    let seqs: Vec<i64> = first_seen
        .iter()
        .map(|id| int_field(&by_id[id], "seq").unwrap())
        .collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "events arrive in outbox order"
    );
    let mut per_kernel: HashMap<String, Vec<String>> = HashMap::new();
    for id in &first_seen {
        let e = &by_id[id];
        if let Some(k) = str_field(e, "kernel_id") {
            per_kernel
                .entry(k.to_owned())
                .or_default()
                .push(str_field(e, "name").unwrap().to_owned());
        }
    }
    assert_eq!(per_kernel.len(), 250);
    for (k, names) in &per_kernel {
        assert_eq!(
            names.first().map(String::as_str),
            Some("kernel_preparing"),
            "{k}: {names:?}"
        );
        assert_eq!(
            names.last().map(String::as_str),
            Some("kernel_terminated"),
            "{k}: {names:?}"
        );
        let started = names.iter().position(|n| n == "kernel_started").unwrap();
        let creating = names.iter().position(|n| n == "kernel_creating").unwrap();
        assert!(creating < started, "{k}: {names:?}");
    }
    let agent_events: Vec<&str> = first_seen
        .iter()
        .filter_map(|id| str_field(&by_id[id], "name"))
        .filter(|n| n.starts_with("agent_"))
        .collect();
    assert_eq!(
        agent_events,
        ["agent_started", "agent_terminated", "agent_started"]
    );

    // Heartbeats resume with the receiver, latest-wins: none of those missed is replayed.
    wait_until(Duration::from_secs(10), "heartbeats arrive", || {
        let n = received.heartbeat_count();
        async move { n >= 2 }
    })
    .await;
    let beats = received.heartbeats.lock().unwrap().clone();
    // Each heartbeat carries its build time: none built during the ~10 s outage arrives (one
    // interval plus the handshake is the most a fresh one can be old).
    for (_, hb) in &beats {
        let ts = hb
            .as_map()
            .unwrap()
            .iter()
            .find(|(k, _)| k.as_str() == Some("ts"))
            .and_then(|(_, v)| v.as_f64())
            .unwrap();
        assert!(
            ts >= intake_up_unix - 1.0,
            "a heartbeat from before the receiver came back was replayed: {ts} < {intake_up_unix}"
        );
    }
    let (_, hb) = beats.last().unwrap();
    assert_eq!(str_field(hb, "agent_id"), Some(fx.agent_id.as_str()));
    assert_eq!(str_field(hb, "region"), Some("local"));
    assert_eq!(str_field(hb, "addr"), Some(agent.endpoint()));
    assert_eq!(
        str_field(hb, "public_key"),
        Some(keys.agent.public.to_z85().as_str())
    );
    assert_eq!(str_field(hb, "architecture"), Some(std::env::consts::ARCH));
    let slots = hb
        .as_map()
        .unwrap()
        .iter()
        .find(|(k, _)| k.as_str() == Some("slots"))
        .unwrap()
        .1
        .clone();
    let total = slots
        .as_map()
        .unwrap()
        .iter()
        .find(|(k, _)| k.as_str() == Some("total"))
        .unwrap()
        .1
        .clone();
    // Slot amounts are decimal strings, as Backend.AI writes them.
    let amount = |k: &str| {
        str_field(&total, k)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    assert!(amount("cpu") > 0.0 && amount("mem") > 0.0, "{slots}");
    let ids: HashSet<String> = by_id.keys().cloned().collect();
    assert_eq!(ids.len(), produced.len());

    // With the intake up, a shutdown delivers its own agent_terminated before the agent exits.
    peer.close();
    agent.shutdown(OnShutdown::Terminate).await;
    let last = received.events.lock().unwrap().last().cloned().unwrap();
    assert_eq!(str_field(&last, "name"), Some("agent_terminated"), "{last}");
}

/// Two intakes (`event-addrs`): when the first stops answering, events and heartbeats go to the
/// second, nothing lost; with every intake gone, the agent still stops within about 2 s
/// although its ack timeout is 10 s.
#[actix_rt::test]
async fn events_and_heartbeats_fail_over_and_shutdown_is_bounded() {
    let fx = AgentFixture::new("failover", 31740, 4);
    let keys = Keys::new();
    keys.write(fx.dir.path());
    let (pa, pb) = (free_port(), free_port());
    let d = fx.dir.path().display();
    let toml = fx.config_toml(&format!(
        "rpc-auth-manager-public-key = \"{d}/manager.key\"\nrpc-auth-agent-keypair = \"{d}/agent.key_secret\"\nbackend = \"dummy\"\n"
    )) + &format!(
        "[manager]\nevent-addrs = [{{ host = \"127.0.0.1\", port = {pa} }}, {{ host = \"127.0.0.1\", port = {pb} }}]\n\
         event-ack-timeout = 10.0\nevent-retry-max = 0.3\nheartbeat-interval = 0.3\n"
    );
    let path = fx.dir.path().join("agent.toml");
    std::fs::write(&path, toml).unwrap();
    let config = AgentConfig::load(&path).unwrap();
    let (ra, rb) = (Received::default(), Received::default());
    let a = start_intake(
        &format!("tcp://127.0.0.1:{pa}"),
        &keys.manager,
        keys.agent.public,
        &ra,
    );
    let b = start_intake(
        &format!("tcp://127.0.0.1:{pb}"),
        &keys.manager,
        keys.agent.public,
        &rb,
    );
    let dummy = Arc::new(DummyBackend::new(DummyDelays::default())) as Arc<dyn ContainerBackend>;
    let agent = Agent::start(config, Some(dummy)).await.unwrap();
    wait_until(
        Duration::from_secs(10),
        "the first intake's heartbeats and agent_started",
        || {
            let (h, e) = (ra.heartbeat_count(), ra.event_count());
            async move { h >= 2 && e >= 1 }
        },
    )
    .await;
    assert_eq!(
        rb.event_count() + rb.heartbeat_count(),
        0,
        "the second intake is a standby"
    );

    // The first intake goes away; what happens next reaches the second.
    let _ = a.send(kernelvisor::rpc::server::Shutdown).await;
    let peer = manager_client(&agent, &keys).await;
    let kernels = churn(&peer, "f", 10).await;
    // `destroy_kernel` answers before the teardown's last event is in the outbox, so the outbox
    // depth alone can read 0 too early: wait for the events themselves.
    let terminated_at_b = |k: &str| {
        rb.events.lock().unwrap().iter().any(|e| {
            str_field(e, "name") == Some("kernel_terminated")
                && str_field(e, "kernel_id") == Some(k)
        })
    };
    wait_until(
        Duration::from_secs(30),
        "every kernel_terminated at the second intake",
        || {
            let all = kernels.iter().all(|k| terminated_at_b(k));
            async move { all }
        },
    )
    .await;
    wait_until(
        Duration::from_secs(10),
        "the outbox drains into the second intake",
        || {
            let depth = gauge(&agent, "kernelvisor_outbox_depth");
            async move { depth == 0.0 }
        },
    )
    .await;
    let beats = rb.heartbeat_count();
    wait_until(
        Duration::from_secs(5),
        "heartbeats at the second intake",
        || {
            let n = rb.heartbeat_count();
            async move { n >= beats + 2 }
        },
    )
    .await;

    // Every intake gone: shutdown does not wait out the 10 s ack timeout.
    let _ = b.send(kernelvisor::rpc::server::Shutdown).await;
    peer.close();
    let b_endpoint = format!("tcp://127.0.0.1:{pb}");
    wait_until(
        Duration::from_secs(10),
        "the second intake's port closed",
        || {
            let closed = common::port_closed(&b_endpoint);
            async move { closed }
        },
    )
    .await;
    let started = std::time::Instant::now();
    agent.shutdown(OnShutdown::Preserve).await;
    let took = started.elapsed();
    eprintln!("the agent stopped in {took:?} with no manager (event-ack-timeout 10 s)");
    // Issue 17 asks for 2 s; the bound leaves room for a loaded machine, the figure is printed.
    assert!(
        took < Duration::from_secs(3),
        "the agent took {took:?} to stop with no manager"
    );
}

/// Fifty kernels created at once, then destroyed at once, on the dummy engine: the outbox
/// writer, the kernel store and the sender's acks write one SQLite file concurrently, and no
/// write fails with "database is locked" (`kernelvisor_outbox_write_failures_total` stays
/// absent); every event reaches the intake, each id once after de-duplication, every kernel's
/// whole story among them.
#[actix_rt::test]
async fn fifty_kernels_at_once_never_lock_the_outbox() {
    let fx = AgentFixture::new("locked", 31760, 4);
    let keys = Keys::new();
    keys.write(fx.dir.path());
    let intake_port = free_port();
    let received = Received::default();
    let _intake = start_intake(
        &format!("tcp://127.0.0.1:{intake_port}"),
        &keys.manager,
        keys.agent.public,
        &received,
    );
    let dummy = Arc::new(DummyBackend::new(DummyDelays::default())) as Arc<dyn ContainerBackend>;
    let agent = Agent::start(config(&fx, intake_port), Some(dummy))
        .await
        .unwrap();
    let peer = manager_client(&agent, &keys).await;
    let call = |method: &'static str, args: Vec<Value>| {
        let peer = peer.clone();
        async move {
            let call = Call {
                args,
                kwargs: vec![],
                peer_user_id: None,
            };
            peer.call(method, &call, Duration::from_secs(120))
                .await
                .unwrap_or_else(|e| panic!("{method}: {e}"))
        }
    };
    let kernels: Vec<String> = (0..50).map(|i| format!("k-locked-{i}")).collect();
    futures::future::join_all(kernels.iter().map(|k| {
        call(
            "create_kernels",
            vec![
                format!("s-{k}").into(),
                Value::Array(vec![k.clone().into()]),
                Value::Array(vec![kernel_config("0.01", 8 << 20, vec![])]),
            ],
        )
    }))
    .await;
    futures::future::join_all(kernels.iter().map(|k| {
        call(
            "destroy_kernel",
            vec![k.clone().into(), format!("s-{k}").into()],
        )
    }))
    .await;
    // `destroy_kernel` answers before its teardown's last event is in the outbox: wait for
    // every kernel_terminated at the intake, then for the outbox to drain.
    wait_until(
        Duration::from_secs(60),
        "every kernel_terminated arrives",
        || {
            let terminated: HashSet<String> = received
                .events
                .lock()
                .unwrap()
                .iter()
                .filter(|e| str_field(e, "name") == Some("kernel_terminated"))
                .filter_map(|e| str_field(e, "kernel_id").map(str::to_owned))
                .collect();
            async move { terminated.len() == 50 }
        },
    )
    .await;
    wait_until(Duration::from_secs(60), "the outbox drains", || {
        let depth = gauge(&agent, "kernelvisor_outbox_depth");
        async move { depth == 0.0 }
    })
    .await;

    let metrics = agent.ctx.metrics.render();
    let failures: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("kernelvisor_outbox_write_failures_total{"))
        .collect();
    assert!(failures.is_empty(), "outbox writes failed: {failures:?}");

    let events = received.events.lock().unwrap().clone();
    let mut seen = HashSet::new();
    let mut stories: HashMap<String, Vec<String>> = HashMap::new();
    for e in &events {
        let id = str_field(e, "id")
            .expect("every event has an id")
            .to_owned();
        if !seen.insert(id) {
            continue; // a resend: the manager drops it by id
        }
        if let Some(k) = str_field(e, "kernel_id") {
            let name = str_field(e, "name").unwrap_or("-").to_owned();
            stories.entry(k.to_owned()).or_default().push(name);
        }
    }
    for k in &kernels {
        let story = stories.get(k).map(Vec::as_slice).unwrap_or_default();
        for name in [
            "kernel_preparing",
            "kernel_creating",
            "kernel_started",
            "kernel_terminated",
        ] {
            assert_eq!(
                story.iter().filter(|n| n.as_str() == name).count(),
                1,
                "{k}: {name} once in {story:?}"
            );
        }
    }
    peer.close();
    agent.shutdown(OnShutdown::Preserve).await;
}

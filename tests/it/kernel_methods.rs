//! The kernel RPC methods beyond create/destroy, through the agent's real ZeroMQ RPC on an
//! in-process agent (real SQLite store): `restart_kernel`, `interrupt_kernel`, `get_logs`,
//! `ping_kernel` / `check_running`, `sync_kernel_registry`, `reset_agent` (and its alias
//! `reset_instance`) and `execute`'s argument checks, against the real Docker engine and the
//! local test image (`just test-image`: its command evals `$KERNEL_CMD`); plus a scale test
//! on the in-memory dummy backend: 200 kernels created concurrently, one OOM-killed, the rest
//! destroyed concurrently, with the slot accounting checked at every step.
//!
//! Every test has its own agent (own id, temp dir and host-port range in 31000–31999), and the
//! fixture's guard removes any container the agent left, even when the test fails.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rmpv::Value;
use tokio::sync::broadcast;

use common::agent::*;
use common::wait_until;
use kernelvisor::agent::backend::dummy::{DummyBackend, DummyDelays};
use kernelvisor::agent::backend::{labels, ContainerBackend};
use kernelvisor::agent::events::AgentEvent;
use kernelvisor::agent::Agent;
use kernelvisor::config::OnShutdown;
use kernelvisor::rpc::Peer;

const MIB: u64 = 1 << 20;

/// A kernel whose main process (the shell, PID 1) exits at once on SIGTERM: `docker restart`
/// and removal are quick instead of waiting out the stop timeout.
const TERM_QUICKLY: &str = "trap 'exit 0' TERM; while true; do sleep 0.2; done";

async fn start(fx: &AgentFixture) -> Agent {
    Agent::start(fx.config(""), None)
        .await
        .expect("agent starts (is the Docker engine up?)")
}

/// A kernel config for the test image with `KERNEL_CMD` set to `cmd`.
fn with_cmd(cmd: &str) -> Value {
    kernel_config(
        "0.1",
        32 * MIB,
        vec![("environ", map(vec![("KERNEL_CMD", cmd.into())]))],
    )
}

/// Waits (at most `limit`) for `kernel_terminated` of `kernel_id`; its reason and exit code.
async fn terminated(
    events: &mut broadcast::Receiver<AgentEvent>,
    kernel_id: &str,
    limit: Duration,
) -> (String, Option<i64>) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, events.recv())
            .await
            .unwrap_or_else(|_| panic!("no kernel_terminated for {kernel_id} within {limit:?}"))
        {
            Ok(AgentEvent::KernelTerminated {
                kernel_id: k,
                reason,
                exit_code,
                ..
            }) if k == kernel_id => return (reason, exit_code),
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(n)) => {
                panic!("the test's event subscriber lagged by {n}")
            }
            Err(broadcast::error::RecvError::Closed) => panic!("event bus closed"),
        }
    }
}

/// Every event received so far (non-blocking).
fn drain(events: &mut broadcast::Receiver<AgentEvent>) -> Vec<AgentEvent> {
    let mut seen = Vec::new();
    loop {
        match events.try_recv() {
            Ok(e) => seen.push(e),
            Err(broadcast::error::TryRecvError::Lagged(n)) => {
                panic!("the test's event subscriber lagged by {n}")
            }
            Err(_) => return seen,
        }
    }
}

/// Waits until `kernel_id` is no longer known to the agent (its actor stopped and the
/// registry forgot it): `get_kernel` fails with `KernelNotFound`.
async fn wait_forgotten(peer: &Peer, kernel_id: &str) {
    wait_until(Duration::from_secs(10), &format!("{kernel_id} forgotten"), move || async move {
        matches!(call(peer, "get_kernel", vec![kernel_id.into()]).await, Err(kernelvisor::rpc::CallError::Failure(m)) if m.name == "KernelNotFound")
    })
    .await;
}

/// `execute(session, kernel, "v4", run_id, mode, code, opts, flush_timeout)` arguments.
fn exec_args(session: &str, kernel_id: &str, mode: &str, code: &str) -> Vec<Value> {
    vec![
        session.into(),
        kernel_id.into(),
        "v4".into(),
        "run-1".into(),
        mode.into(),
        code.into(),
        map(vec![]),
        0.into(),
    ]
}

#[actix_rt::test]
async fn restart_keeps_the_container_and_the_kernel_running() {
    let fx = AgentFixture::new("restart", 31000, 4);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    let kid = format!("k-{}", run_id());
    let info = create_one(&peer, "s-restart", &kid, with_cmd(TERM_QUICKLY))
        .await
        .unwrap();
    let cid = field(&info, "container_id").as_str().unwrap().to_owned();
    let started_before = inspect(&cid, "{{.State.StartedAt}}").unwrap();
    // Docker's StartedAt has sub-second precision, but make sure a restart cannot land on
    // the same instant.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut events = agent.ctx.events.subscribe();

    let t0 = std::time::Instant::now();
    let restarted = call(
        &peer,
        "restart_kernel",
        vec!["s-restart".into(), kid.clone().into()],
    )
    .await
    .unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(8),
        "the container stops on SIGTERM at once; restart took {:?}",
        t0.elapsed()
    );
    assert_eq!(
        field(&restarted, "status").as_str(),
        Some("RUNNING"),
        "{restarted:?}"
    );
    assert_eq!(field(&restarted, "id").as_str(), Some(kid.as_str()));
    assert_eq!(
        field(&restarted, "container_id").as_str(),
        Some(cid.as_str()),
        "same container"
    );

    // The engine's view: the same container, started again, running.
    assert_eq!(inspect(&cid, "{{.State.Running}}").as_deref(), Some("true"));
    let started_after = inspect(&cid, "{{.State.StartedAt}}").unwrap();
    assert_ne!(started_before, started_after, "the container was restarted");
    assert_eq!(
        fx.containers(),
        vec![cid[..12].to_owned()],
        "no other container"
    );

    // The restart's `die` event reaches the agent, which must not take it for an exit.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        call(&peer, "check_running", vec![kid.clone().into()])
            .await
            .unwrap(),
        Value::from(true)
    );
    assert_eq!(inspect(&cid, "{{.State.Running}}").as_deref(), Some("true"));
    let seen = drain(&mut events);
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e, AgentEvent::KernelTerminated { .. })),
        "restart tore the kernel down: {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|e| matches!(e, AgentEvent::KernelStarted { kernel_id, .. } if *kernel_id == kid)),
        "RUNNING again is published: {seen:?}"
    );
    // The kernel is usable: execute reaches the restarted container.
    let out = call(
        &peer,
        "execute",
        exec_args("s-restart", &kid, "query", "echo after-restart"),
    )
    .await
    .unwrap();
    assert_eq!(field(&out, "exitCode").as_i64(), Some(0));
    assert!(format!("{:?}", field(&out, "console")).contains("after-restart"));
    // And it restarts again.
    let again = call(
        &peer,
        "restart_kernel",
        vec!["s-restart".into(), kid.clone().into()],
    )
    .await
    .unwrap();
    assert_eq!(field(&again, "status").as_str(), Some("RUNNING"));
    assert_ne!(
        inspect(&cid, "{{.State.StartedAt}}").unwrap(),
        started_after
    );

    assert_eq!(
        failure_name(
            &call(
                &peer,
                "restart_kernel",
                vec!["s-restart".into(), "k-no-such-kernel".into()]
            )
            .await
        ),
        "KernelNotFound"
    );
    agent.shutdown(OnShutdown::Terminate).await;
    assert!(
        fx.containers().is_empty(),
        "terminate on shutdown removes the container"
    );
}

#[actix_rt::test]
async fn interrupt_ends_a_kernel_that_exits_on_sigint_and_logs_are_readable() {
    let fx = AgentFixture::new("interrupt", 31100, 4);
    let agent = start(&fx).await;
    let mut events = agent.ctx.events.subscribe();
    let peer = client(agent.endpoint()).await;

    // get_logs: what the main process printed, read while the kernel runs.
    let k_logs = format!("k-logs-{}", run_id());
    create_one(
        &peer,
        "s-int",
        &k_logs,
        with_cmd("echo booted; echo to-stderr >&2; exec sleep infinity"),
    )
    .await
    .unwrap();
    let mut logs = String::new();
    for _ in 0..100 {
        let r = call(&peer, "get_logs", vec![k_logs.clone().into()])
            .await
            .unwrap();
        logs = field(&r, "logs").as_str().expect("logs is text").to_owned();
        // stdout and stderr are copied separately: wait for both.
        if logs.contains("booted") && logs.contains("to-stderr") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        logs.contains("booted"),
        "the kernel's output in get_logs: {logs:?}"
    );
    assert!(
        logs.contains("to-stderr"),
        "stderr is in the logs too: {logs:?}"
    );
    assert_eq!(
        failure_name(&call(&peer, "get_logs", vec!["k-no-such-kernel".into()]).await),
        "LogsNotFound"
    );

    // interrupt_kernel: SIGINT to PID 1, whose trap exits 5.
    let k_int = format!("k-int-{}", run_id());
    let info = create_one(
        &peer,
        "s-int",
        &k_int,
        with_cmd("trap 'echo got-int; exit 5' INT; echo trap-set; while true; do sleep 0.2; done"),
    )
    .await
    .unwrap();
    let cid = field(&info, "container_id").as_str().unwrap().to_owned();
    // PID 1 ignores SIGINT until its trap is set (no default action in a PID namespace): a
    // signal sent before that would be lost, so wait for the shell to say it is set.
    for _ in 0..100 {
        let r = call(&peer, "get_logs", vec![k_int.clone().into()])
            .await
            .unwrap();
        if field(&r, "logs")
            .as_str()
            .unwrap_or("")
            .contains("trap-set")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        call(&peer, "interrupt_kernel", vec![k_int.clone().into()])
            .await
            .unwrap(),
        Value::Map(vec![]),
        "upstream answers an empty map"
    );
    assert_eq!(
        terminated(&mut events, &k_int, Duration::from_secs(20)).await,
        ("self-terminated".to_owned(), Some(5))
    );
    assert_eq!(
        inspect(&cid, "{{.Id}}"),
        None,
        "the exited kernel's container is removed"
    );
    wait_forgotten(&peer, &k_int).await;
    assert_eq!(
        failure_name(&call(&peer, "interrupt_kernel", vec![k_int.clone().into()]).await),
        "KernelNotFound"
    );
    assert_eq!(
        failure_name(&call(&peer, "interrupt_kernel", vec!["k-no-such-kernel".into()]).await),
        "KernelNotFound"
    );

    // The other kernel is untouched.
    assert_eq!(
        call(&peer, "check_running", vec![k_logs.clone().into()])
            .await
            .unwrap(),
        Value::from(true)
    );
    assert_eq!(fx.containers().len(), 1);
    assert_eq!(usage(&peer).await.0, "0.1");
    agent.shutdown(OnShutdown::Terminate).await;
    assert!(fx.containers().is_empty());
}

#[actix_rt::test]
async fn ping_and_check_running_answer_for_live_and_unknown_kernels() {
    let fx = AgentFixture::new("ping", 31200, 4);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    let kid = format!("k-{}", run_id());
    create_one(
        &peer,
        "s-ping",
        &kid,
        kernel_config("0.1", 32 * MIB, vec![]),
    )
    .await
    .unwrap();
    for method in ["ping_kernel", "check_running"] {
        assert_eq!(
            call(&peer, method, vec![kid.clone().into()]).await.unwrap(),
            Value::from(true),
            "{method}"
        );
        // Upstream: `check_running` answers false for a kernel the agent does not hold;
        // `ping_kernel` raises.
        let unknown = call(&peer, method, vec!["k-no-such-kernel".into()]).await;
        if method == "check_running" {
            assert_eq!(unknown.unwrap(), Value::from(false));
        } else {
            assert_eq!(failure_name(&unknown), "KernelNotFound", "{method}");
        }
        assert_eq!(
            failure_name(&call(&peer, method, vec![]).await),
            "TypeError",
            "{method} without a kernel id"
        );
    }
    call(
        &peer,
        "destroy_kernel",
        vec![kid.clone().into(), "s-ping".into()],
    )
    .await
    .unwrap();
    wait_forgotten(&peer, &kid).await;
    assert_eq!(
        failure_name(&call(&peer, "ping_kernel", vec![kid.clone().into()]).await),
        "KernelNotFound"
    );
    agent.shutdown(OnShutdown::Terminate).await;
    assert!(fx.containers().is_empty());
}

#[actix_rt::test]
async fn sync_kernel_registry_reports_unknown_kernels_and_destroys_unlisted_ones() {
    let fx = AgentFixture::new("sync", 31300, 4);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    let (live, orphan) = (
        format!("k-live-{}", run_id()),
        format!("k-orphan-{}", run_id()),
    );
    for k in [&live, &orphan] {
        create_one(&peer, "s-sync", k, kernel_config("0.1", 32 * MIB, vec![]))
            .await
            .unwrap();
    }
    let mut events = agent.ctx.events.subscribe();

    // Upstream's semantics (`AgentRPCServer.sync_kernel_registry`): a listed kernel this agent
    // does not hold is reported terminated (`already-terminated`); a kernel it holds that the
    // manager did not list is destroyed without events (`not-found-in-manager`).
    let ghost = format!("k-ghost-{}", run_id());
    let pairs = Value::Array(vec![
        Value::Array(vec![ghost.clone().into(), "s-ghost".into()]),
        Value::Array(vec![live.clone().into(), "s-sync".into()]),
    ]);
    let r = call(&peer, "sync_kernel_registry", vec![pairs])
        .await
        .unwrap();
    assert_eq!(r, Value::Nil, "upstream answers None");
    let r = call(&peer, "list_kernels", vec![]).await.unwrap();
    let kernels = field(&r, "kernels")
        .as_array()
        .expect("{\"kernels\": [...]}");
    assert_eq!(kernels.len(), 1, "{r:?}");
    assert_eq!(field(&kernels[0], "id").as_str(), Some(live.as_str()));
    assert_eq!(field(&kernels[0], "status").as_str(), Some("RUNNING"));
    assert_eq!(
        field(&kernels[0], "agent_id").as_str(),
        Some(fx.agent_id.as_str())
    );
    let e = tokio::time::timeout(Duration::from_secs(5), events.recv())
        .await
        .expect("kernel_terminated for the unknown kernel")
        .unwrap();
    match e {
        AgentEvent::KernelTerminated {
            kernel_id,
            session_id,
            reason,
            exit_code,
        } => assert_eq!(
            (kernel_id, session_id, reason.as_str(), exit_code),
            (
                ghost.clone(),
                "s-ghost".to_owned(),
                "already-terminated",
                None
            )
        ),
        other => panic!("unexpected {other:?}"),
    }
    wait_forgotten(&peer, &orphan).await;
    tokio::time::sleep(Duration::from_millis(500)).await; // a negative check: nothing follows
    let later = drain(&mut events);
    assert!(
        !later
            .iter()
            .any(|e| matches!(e, AgentEvent::KernelTerminated { .. })),
        "the unlisted kernel goes without events: {later:?}"
    );
    assert_eq!(
        call(&peer, "check_running", vec![live.clone().into()])
            .await
            .unwrap(),
        Value::from(true)
    );
    assert_eq!(
        call(&peer, "check_running", vec![orphan.clone().into()])
            .await
            .unwrap(),
        Value::from(false)
    );

    // No argument (kernelvisor): only the listing; `list_kernels` says the same.
    let r = call(&peer, "sync_kernel_registry", vec![]).await.unwrap();
    assert_eq!(field(&r, "kernels").as_array().map(Vec::len), Some(1));
    let r = call(&peer, "list_kernels", vec![]).await.unwrap();
    assert_eq!(field(&r, "kernels").as_array().map(Vec::len), Some(1));
    assert!(drain(&mut events).is_empty());
    agent.shutdown(OnShutdown::Terminate).await;
    assert!(fx.containers().is_empty());
}

#[actix_rt::test]
async fn reset_agent_destroys_every_kernel_without_events() {
    let fx = AgentFixture::new("reset", 31400, 8);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    let port = |n: u16| {
        Value::Array(vec![map(vec![
            ("name", "p".into()),
            ("container_ports", Value::Array(vec![(7000 + n).into()])),
        ])])
    };
    let ids: Vec<String> = (0..2).map(|i| format!("k{i}-{}", run_id())).collect();
    let configs = ids
        .iter()
        .enumerate()
        .map(|(i, _)| kernel_config("0.1", 32 * MIB, vec![("service_ports", port(i as u16))]))
        .collect();
    let created = call(
        &peer,
        "create_kernels",
        vec![
            "s-reset".into(),
            Value::Array(ids.iter().map(|i| i.clone().into()).collect()),
            Value::Array(configs),
        ],
    )
    .await
    .unwrap();
    assert_eq!(created.as_array().unwrap().len(), 2);
    assert_eq!(fx.containers().len(), 2);
    assert_eq!(
        usage(&peer).await,
        ("0.2".into(), (64 * MIB).to_string(), 6)
    );
    let mut events = agent.ctx.events.subscribe();

    let r = call(&peer, "reset_agent", vec![]).await.unwrap();
    assert_eq!(field(&r, "destroyed").as_u64(), Some(2), "{r:?}");
    assert!(fx.containers().is_empty(), "containers removed");
    assert!(fx.scratch_entries().is_empty(), "scratch removed");
    for id in &ids {
        wait_forgotten(&peer, id).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await; // port cooldown of the fixture
    assert_eq!(usage(&peer).await, ("0".into(), "0".into(), 8));

    // The alias, on a fresh kernel.
    let kid = format!("k-{}", run_id());
    create_one(
        &peer,
        "s-reset",
        &kid,
        kernel_config("0.1", 32 * MIB, vec![]),
    )
    .await
    .unwrap();
    let r = call(&peer, "reset_instance", vec![]).await.unwrap();
    assert_eq!(field(&r, "destroyed").as_u64(), Some(1), "{r:?}");
    assert!(fx.containers().is_empty());
    wait_forgotten(&peer, &kid).await;
    // Nothing left: a no-op.
    assert_eq!(
        field(
            &call(&peer, "reset_agent", vec![]).await.unwrap(),
            "destroyed"
        )
        .as_u64(),
        Some(0)
    );

    // The containers' `die` events have had time to arrive: still no termination reported.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let seen = drain(&mut events);
    assert!(
        !seen
            .iter()
            .any(|e| matches!(e, AgentEvent::KernelTerminated { .. })),
        "reset published terminations: {seen:?}"
    );
    assert!(
        agent.ctx.store.live_kernels().await.unwrap().is_empty(),
        "no store row left live"
    );
    assert_eq!(usage(&peer).await.0, "0");
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn execute_rejects_unsupported_modes_and_unknown_kernels() {
    let fx = AgentFixture::new("execmode", 31500, 4);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    let kid = format!("k-{}", run_id());
    create_one(
        &peer,
        "s-exec",
        &kid,
        kernel_config("0.1", 32 * MIB, vec![]),
    )
    .await
    .unwrap();

    let r = call(
        &peer,
        "execute",
        exec_args("s-exec", &kid, "complete", "echo no"),
    )
    .await;
    assert_eq!(failure_name(&r), "UnsupportedExecutionMode");
    // Continuation modes need a run that exists.
    for mode in ["input", "continue"] {
        let r = call(&peer, "execute", exec_args("s-exec", &kid, mode, "echo no")).await;
        assert_eq!(failure_name(&r), "RunNotFound", "mode {mode}");
    }
    assert_eq!(
        failure_name(
            &call(
                &peer,
                "execute",
                exec_args("s-exec", "k-no-such-kernel", "query", "echo hi")
            )
            .await
        ),
        "KernelNotFound"
    );
    assert_eq!(
        failure_name(
            &call(
                &peer,
                "execute",
                exec_args("s-exec", "k-no-such-kernel", "batch", "echo hi")
            )
            .await
        ),
        "KernelNotFound"
    );
    // The supported modes work on the live kernel, which the refusals left alone.
    for mode in ["query", "batch"] {
        let out = call(
            &peer,
            "execute",
            exec_args("s-exec", &kid, mode, "echo ran-$((6*7))"),
        )
        .await
        .unwrap();
        assert_eq!(
            field(&out, "status").as_str(),
            Some("finished"),
            "{mode}: {out:?}"
        );
        assert_eq!(field(&out, "exitCode").as_i64(), Some(0));
        assert_eq!(field(&out, "runId").as_str(), Some("run-1"));
        assert!(
            format!("{:?}", field(&out, "console")).contains("ran-42"),
            "{mode}: {out:?}"
        );
    }
    assert_eq!(
        call(&peer, "check_running", vec![kid.clone().into()])
            .await
            .unwrap(),
        Value::from(true)
    );
    agent.shutdown(OnShutdown::Terminate).await;
    assert!(fx.containers().is_empty());
}

#[actix_rt::test]
async fn two_hundred_dummy_kernels_oom_and_concurrent_teardown() {
    const CALLS: usize = 20;
    const PER_CALL: usize = 10;
    const N: usize = CALLS * PER_CALL;
    let fx = AgentFixture::new("dummy200", 31600, 4);
    let dummy = Arc::new(DummyBackend::new(DummyDelays {
        create: Duration::from_millis(20),
        start: Duration::from_millis(20),
        ..Default::default()
    }));
    // The fixture's config names the docker backend; the override wins.
    let agent = Agent::start(
        fx.config(""),
        Some(dummy.clone() as Arc<dyn ContainerBackend>),
    )
    .await
    .unwrap();
    assert_eq!(agent.ctx.backend.kind(), "dummy");
    let mut events = agent.ctx.events.subscribe();
    let peer = client(agent.endpoint()).await;

    // 200 × 0.01 cores = 2 cores: the whole capacity of a 2-core host (the fixture reserves
    // none). On a 1-core host use half as much per kernel.
    let total = call(&peer, "resource_usage", vec![]).await.unwrap();
    let total_cpu: f64 = field(field(&total, "total"), "cpu")
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let (per_kernel, occupied) = if total_cpu >= 2.0 {
        ("0.01", "2")
    } else {
        ("0.005", "1")
    };

    let run = run_id();
    let sessions: Vec<(String, Vec<String>)> = (0..CALLS)
        .map(|c| {
            (
                format!("s{c}-{run}"),
                (0..PER_CALL).map(|k| format!("k{c}x{k}-{run}")).collect(),
            )
        })
        .collect();
    let t0 = std::time::Instant::now();
    let creates = sessions.iter().map(|(session, ids)| {
        let configs = ids
            .iter()
            .map(|_| kernel_config(per_kernel, 8 * MIB, vec![]))
            .collect();
        call(
            &peer,
            "create_kernels",
            vec![
                session.clone().into(),
                Value::Array(ids.iter().map(|i| i.clone().into()).collect()),
                Value::Array(configs),
            ],
        )
    });
    let mut containers = HashMap::new(); // kernel id → container id
    for (r, (session, ids)) in futures::future::join_all(creates)
        .await
        .into_iter()
        .zip(&sessions)
    {
        let infos = r.unwrap_or_else(|e| panic!("create_kernels for {session}: {e:?}"));
        let infos = infos.as_array().unwrap();
        assert_eq!(infos.len(), PER_CALL);
        for (info, id) in infos.iter().zip(ids) {
            assert_eq!(
                field(info, "id").as_str(),
                Some(id.as_str()),
                "infos come back in request order"
            );
            assert_eq!(field(info, "session_id").as_str(), Some(session.as_str()));
            assert_eq!(field(info, "status").as_str(), Some("RUNNING"), "{info:?}");
            containers.insert(
                id.clone(),
                field(info, "container_id").as_str().unwrap().to_owned(),
            );
        }
    }
    let created_in = t0.elapsed();
    assert_eq!(containers.len(), N);
    let running = dummy
        .list_containers(labels::AGENT_ID, &fx.agent_id)
        .await
        .unwrap();
    assert_eq!(running.len(), N);
    assert!(running.iter().all(|c| c.running));
    let (cpu, mem, _) = usage(&peer).await;
    assert_eq!(
        (cpu.as_str(), mem),
        (occupied, (N as u64 * 8 * MIB).to_string())
    );
    let listed = call(&peer, "sync_kernel_registry", vec![]).await.unwrap();
    assert_eq!(field(&listed, "kernels").as_array().unwrap().len(), N);
    assert_eq!(fx.scratch_entries().len(), N);

    // The OOM killer takes one kernel's main process.
    let (victim_session, victim_ids) = &sessions[7];
    let victim = &victim_ids[3];
    dummy.kill(&containers[victim], 137, true);
    assert_eq!(
        terminated(&mut events, victim, Duration::from_secs(10)).await,
        ("oom-killed".to_owned(), Some(137))
    );
    wait_forgotten(&peer, victim).await;
    assert!(
        dummy
            .inspect_container(&containers[victim])
            .await
            .unwrap()
            .is_none(),
        "its container is removed"
    );
    assert_eq!(
        dummy
            .list_containers(labels::AGENT_ID, &fx.agent_id)
            .await
            .unwrap()
            .len(),
        N - 1
    );
    let (cpu, mem, _) = usage(&peer).await;
    let per_millis: u64 = if per_kernel == "0.01" { 10 } else { 5 };
    assert_eq!(
        cpu,
        kernelvisor::agent::resources::slots::format_cores(per_millis * (N as u64 - 1))
    );
    assert_eq!(mem, ((N as u64 - 1) * 8 * MIB).to_string());
    // Its session-mates are unaffected.
    for id in victim_ids.iter().filter(|i| *i != victim) {
        assert_eq!(
            call(&peer, "check_running", vec![id.clone().into()])
                .await
                .unwrap(),
            Value::from(true),
            "{id} of {victim_session}"
        );
    }

    // Destroy the other 199 concurrently.
    let t1 = std::time::Instant::now();
    let destroys = sessions
        .iter()
        .flat_map(|(session, ids)| {
            ids.iter()
                .filter(|i| *i != victim)
                .map(move |id| (session, id))
        })
        .map(|(session, id)| {
            call(
                &peer,
                "destroy_kernel",
                vec![id.clone().into(), session.clone().into()],
            )
        });
    for r in futures::future::join_all(destroys).await {
        r.unwrap();
    }
    let destroyed_in = t1.elapsed();
    assert!(
        dummy
            .list_containers(labels::AGENT_ID, &fx.agent_id)
            .await
            .unwrap()
            .is_empty(),
        "every container removed"
    );
    assert!(fx.scratch_entries().is_empty(), "every scratch removed");
    let (cpu, mem, _) = usage(&peer).await;
    assert_eq!((cpu.as_str(), mem.as_str()), ("0", "0"));

    // One kernel_terminated per destroyed kernel, as user-requested; the OOM was the only other.
    let mut reasons: HashMap<String, usize> = HashMap::new();
    let mut ended = std::collections::HashSet::new();
    for e in drain(&mut events) {
        if let AgentEvent::KernelTerminated {
            kernel_id, reason, ..
        } = e
        {
            assert!(
                ended.insert(kernel_id.clone()),
                "{kernel_id} terminated twice"
            );
            *reasons.entry(reason).or_default() += 1;
        }
    }
    assert_eq!(
        reasons,
        HashMap::from([("user-requested".to_owned(), N - 1)])
    );
    for id in containers.keys() {
        if id != victim {
            assert!(ended.contains(id), "{id}: no kernel_terminated");
        }
    }
    assert!(
        agent.ctx.store.live_kernels().await.unwrap().is_empty(),
        "no store row left live"
    );
    eprintln!(
        "dummy: {N} kernels created in {created_in:?}, {} destroyed in {destroyed_in:?}",
        N - 1
    );
    agent.shutdown(OnShutdown::Terminate).await;
}

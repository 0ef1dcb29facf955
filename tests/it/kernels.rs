//! Kernel lifecycle against the real Docker engine, through the agent's RPC (in-process
//! agent, real ZeroMQ, real SQLite). Needs the local test image (`just test-image`).

use crate::common;

use std::io::{Read, Write};
use std::time::Duration;

use rmpv::Value;

use common::agent::*;
use kernelvisor::agent::events::AgentEvent;
use kernelvisor::agent::Agent;
use kernelvisor::config::OnShutdown;

const MIB: u64 = 1 << 20;

async fn start(fx: &AgentFixture) -> Agent {
    Agent::start(fx.config(""), None)
        .await
        .expect("agent starts (is the Docker engine up?)")
}

#[actix_rt::test]
async fn create_execute_destroy_on_the_real_engine() {
    let fx = AgentFixture::new("lifecycle", 30100, 20);
    let agent = start(&fx).await;
    let mut events = agent.ctx.events.subscribe();
    let peer = client(agent.endpoint()).await;
    let vf = fx.vfolder_root().join("data");
    std::fs::create_dir(&vf).unwrap();
    std::fs::write(vf.join("f.txt"), "from-the-vfolder").unwrap();

    let config = kernel_config(
        "0.5",
        64 * MIB,
        vec![
            ("resource_opts", map(vec![("shmem", (32 * MIB).into())])),
            ("environ", map(vec![("GREETING", "hello".into())])),
            (
                "mounts",
                Value::Array(vec![map(vec![
                    ("name", "data".into()),
                    ("host_path", vf.display().to_string().into()),
                    ("permission", "rw".into()),
                ])]),
            ),
            (
                "service_ports",
                Value::Array(vec![map(vec![
                    ("name", "http".into()),
                    ("protocol", "http".into()),
                    ("container_ports", Value::Array(vec![8080.into()])),
                ])]),
            ),
        ],
    );
    let kid = format!("k-{}", run_id());
    let info = create_one(&peer, "s-lifecycle", &kid, config)
        .await
        .unwrap();
    assert_eq!(field(&info, "status").as_str(), Some("RUNNING"));
    assert_eq!(field(&info, "id").as_str(), Some(kid.as_str()));
    let cid = field(&info, "container_id").as_str().unwrap().to_owned();
    let host_port = field(&info, "host_ports").as_array().unwrap()[0]
        .as_u64()
        .unwrap() as u16;
    assert!((fx.port_range.0..=fx.port_range.1).contains(&host_port));
    let sp = &field(&info, "service_ports").as_array().unwrap()[0];
    assert_eq!(
        field(sp, "host_ports").as_array().unwrap()[0].as_u64(),
        Some(host_port as u64)
    );

    // The engine's own view: running, labelled, limited, not privileged, port published.
    assert_eq!(inspect(&cid, "{{.State.Running}}").as_deref(), Some("true"));
    assert_eq!(
        inspect(&cid, "{{index .Config.Labels \"ai.backend.kernel-id\"}}").unwrap(),
        kid
    );
    assert_eq!(
        inspect(&cid, "{{index .Config.Labels \"ai.backend.session-id\"}}").unwrap(),
        "s-lifecycle"
    );
    assert_eq!(
        inspect(&cid, "{{index .Config.Labels \"ai.backend.agent-id\"}}").unwrap(),
        fx.agent_id
    );
    assert!(
        inspect(&cid, "{{index .Config.Labels \"ai.backend.owner\"}}")
            .unwrap()
            .contains("AKTEST")
    );
    assert!(inspect(
        &cid,
        "{{index .Config.Labels \"ai.backend.service-ports\"}}"
    )
    .unwrap()
    .contains("8080"));
    assert_eq!(
        inspect(&cid, "{{.HostConfig.Memory}}").unwrap(),
        (64 * MIB).to_string()
    );
    assert_eq!(
        inspect(&cid, "{{.HostConfig.NanoCpus}}").unwrap(),
        "500000000"
    );
    assert_eq!(inspect(&cid, "{{.HostConfig.PidsLimit}}").unwrap(), "4096");
    assert_eq!(
        inspect(&cid, "{{.HostConfig.ShmSize}}").unwrap(),
        (32 * MIB).to_string()
    );
    assert_eq!(
        inspect(&cid, "{{.HostConfig.Privileged}}").unwrap(),
        "false"
    );
    assert!(docker(&["port", &cid, "8080/tcp"]).contains(&format!(":{host_port}")));

    // Scratch and its config files.
    let scratch = fx.scratch_root().canonicalize().unwrap().join(&kid);
    assert!(read(&scratch.join("config/environ.txt")).contains("GREETING=hello"));
    assert!(read(&scratch.join("config/environ.txt")).contains(&format!("BACKEND_KERNEL_ID={kid}")));
    assert!(read(&scratch.join("config/resource.txt")).contains("cpu=0.5"));
    assert!(read(&scratch.join("config/resource.txt")).contains(&format!("HOST_PORTS={host_port}")));

    // execute: real code, both streams, exit code; the vfolder and env are there.
    let exec = |code: &str, opts: Value| {
        vec![
            "s-lifecycle".into(),
            kid.clone().into(),
            "v4".into(),
            "run-1".into(),
            "query".into(),
            code.into(),
            opts,
            0.into(),
        ]
    };
    let out = call(
        &peer,
        "execute",
        exec(
            "echo $GREETING; cat /home/work/data/f.txt; echo oops >&2; exit 3",
            map(vec![]),
        ),
    )
    .await
    .unwrap();
    assert_eq!(field(&out, "status").as_str(), Some("finished"));
    assert_eq!(field(&out, "exitCode").as_i64(), Some(3));
    let console = format!("{:?}", field(&out, "console"));
    assert!(
        console.contains("hello") && console.contains("from-the-vfolder"),
        "{console}"
    );
    assert!(
        console.contains("\"stderr\"") && console.contains("oops"),
        "{console}"
    );

    // The published port reaches a server inside the container.
    call(
        &peer,
        "execute",
        exec(
            "echo served-by-kernel > /home/work/index.html; httpd -p 8080 -h /home/work",
            map(vec![]),
        ),
    )
    .await
    .unwrap();
    let mut body = String::new();
    for _ in 0..50 {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", host_port)) {
            s.write_all(b"GET /index.html HTTP/1.0\r\n\r\n").unwrap();
            let _ = s.read_to_string(&mut body);
            if body.contains("served-by-kernel") {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        body.contains("served-by-kernel"),
        "no answer through host port {host_port}: {body:?}"
    );

    // A timeout in opts is honoured: the process is killed, not waited for.
    let t0 = std::time::Instant::now();
    let out = call(
        &peer,
        "execute",
        exec("sleep 30", map(vec![("timeout", 1.into())])),
    )
    .await
    .unwrap();
    assert_eq!(field(&out, "status").as_str(), Some("exec-timeout"));
    assert!(t0.elapsed() < Duration::from_secs(20));
    assert_eq!(
        call(&peer, "check_running", vec![kid.clone().into()])
            .await
            .unwrap(),
        Value::from(true)
    );
    assert!(field(
        &call(&peer, "get_logs", vec![kid.clone().into()])
            .await
            .unwrap(),
        "logs"
    )
    .is_str());
    let (cpu, mem, _) = usage(&peer).await;
    assert_eq!((cpu.as_str(), mem), ("0.5", (64 * MIB).to_string()));

    // destroy: container, scratch, ports and slots all gone.
    call(
        &peer,
        "destroy_kernel",
        vec![kid.clone().into(), "s-lifecycle".into()],
    )
    .await
    .unwrap();
    assert_eq!(inspect(&cid, "{{.Id}}"), None, "container removed");
    assert!(!scratch.exists(), "scratch removed");
    assert_eq!(
        read(&vf.join("f.txt")),
        "from-the-vfolder",
        "the vfolder itself is kept"
    );
    tokio::time::sleep(Duration::from_millis(150)).await; // port cooldown of the fixture
    assert_eq!(usage(&peer).await, ("0".into(), "0".into(), 20));
    assert_eq!(
        failure_name(
            &call(
                &peer,
                "destroy_kernel",
                vec![kid.clone().into(), "s".into()]
            )
            .await
        ),
        "KernelNotFound"
    );

    // Bus-only events (Backend.AI's: `do_sync_kernel_logs` as the kernel ends, `agent_error` for
    // the refused second destroy) are checked apart.
    let mut seen = Vec::new();
    let mut bus_only = Vec::new();
    while let Ok(e) = events.try_recv() {
        if e.is_bus_only() {
            bus_only.push(e.name());
            continue;
        }
        seen.push(e.name());
        if let AgentEvent::KernelTerminated { reason, .. } = &e {
            assert_eq!(reason, "user-requested");
        }
    }
    assert_eq!(bus_only, ["do_sync_kernel_logs", "agent_error"]);
    assert_eq!(
        seen,
        [
            "kernel_preparing",
            "kernel_creating",
            "kernel_started",
            // The three runs: two exited, one killed by its timeout.
            "execution_started",
            "execution_finished",
            "execution_started",
            "execution_finished",
            "execution_started",
            "execution_timeout",
            "kernel_terminated"
        ]
    );
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn bad_specs_get_clear_failures_and_leave_nothing() {
    let fx = AgentFixture::new("badspec", 30200, 4);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    let outside = tempfile::tempdir().unwrap();
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "negative memory",
            kernel_config(
                "1",
                0,
                vec![(
                    "resource_slots",
                    map(vec![("cpu", 1.into()), ("mem", Value::from(-5))]),
                )],
            ),
            "InvalidKernelConfig",
        ),
        (
            "unknown slot",
            kernel_config(
                "1",
                0,
                vec![(
                    "resource_slots",
                    map(vec![
                        ("cpu", 1.into()),
                        ("mem", (64 * MIB).into()),
                        ("tpu", 1.into()),
                    ]),
                )],
            ),
            "InvalidKernelConfig",
        ),
        (
            "traversal in a vfolder name",
            kernel_config(
                "0.1",
                64 * MIB,
                vec![(
                    "mounts",
                    Value::Array(vec![map(vec![
                        ("name", "../etc".into()),
                        ("host_path", "/etc".into()),
                    ])]),
                )],
            ),
            "InvalidKernelConfig",
        ),
        (
            "host path outside the vfolder root",
            kernel_config(
                "0.1",
                64 * MIB,
                vec![(
                    "mounts",
                    Value::Array(vec![map(vec![
                        ("name", "x".into()),
                        ("host_path", outside.path().display().to_string().into()),
                    ])]),
                )],
            ),
            "InvalidKernelConfig",
        ),
        (
            "traversal in a host path",
            kernel_config(
                "0.1",
                64 * MIB,
                vec![(
                    "mounts",
                    Value::Array(vec![map(vec![
                        ("name", "x".into()),
                        (
                            "host_path",
                            format!("{}/../../etc", fx.vfolder_root().display()).into(),
                        ),
                    ])]),
                )],
            ),
            "InvalidKernelConfig",
        ),
        (
            "more memory than the node",
            kernel_config("0.1", 1 << 50, vec![]),
            "ResourceExhausted",
        ),
        (
            "more ports than the range",
            kernel_config(
                "0.1",
                64 * MIB,
                vec![(
                    "service_ports",
                    Value::Array(vec![map(vec![
                        ("name", "many".into()),
                        (
                            "container_ports",
                            Value::Array((1..=5).map(|p| Value::from(8000 + p)).collect()),
                        ),
                    ])]),
                )],
            ),
            "ResourceExhausted",
        ),
        (
            "unknown image",
            kernel_config(
                "0.1",
                64 * MIB,
                vec![("image", image("kernelvisor-no-such-image:never"))],
            ),
            "ImageNotFound",
        ),
    ];
    for (what, config, expected) in cases {
        let r = create_one(&peer, "s-bad", &format!("k-{}", run_id()), config).await;
        assert_eq!(failure_name(&r), expected, "{what}: {r:?}");
        assert!(fx.containers().is_empty(), "{what}: container left");
        assert!(
            fx.scratch_entries().is_empty(),
            "{what}: scratch left: {:?}",
            fx.scratch_entries()
        );
        assert_eq!(
            usage(&peer).await,
            ("0".into(), "0".into(), 4),
            "{what}: slots or ports left"
        );
    }
    // Duplicate kernel ids: within one request, and against a live kernel.
    let id = format!("k-{}", run_id());
    let two = call(
        &peer,
        "create_kernels",
        vec![
            "s".into(),
            Value::Array(vec![id.clone().into(), id.clone().into()]),
            Value::Array(vec![
                kernel_config("0.1", 64 * MIB, vec![]),
                kernel_config("0.1", 64 * MIB, vec![]),
            ]),
        ],
    )
    .await;
    assert_eq!(failure_name(&two), "InvalidKernelConfig");
    let first = create_one(&peer, "s", &id, kernel_config("0.1", 64 * MIB, vec![]))
        .await
        .unwrap();
    // The same session's kernel again is a retry, answered as the first call was; another
    // session's is refused.
    let again = create_one(&peer, "s", &id, kernel_config("0.1", 64 * MIB, vec![]))
        .await
        .unwrap();
    assert_eq!(
        field(&again, "container_id"),
        field(&first, "container_id"),
        "the retry answers the same container"
    );
    assert_eq!(
        failure_name(
            &create_one(&peer, "other", &id, kernel_config("0.1", 64 * MIB, vec![])).await
        ),
        "InvalidKernelConfig"
    );
    assert_eq!(fx.containers().len(), 1, "the duplicates made nothing");
    assert_eq!(
        failure_name(
            &create_one(
                &peer,
                "s",
                "../../etc",
                kernel_config("0.1", 64 * MIB, vec![])
            )
            .await
        ),
        "InvalidKernelConfig"
    );
    assert_eq!(
        failure_name(&call(&peer, "no_such_method", vec![]).await),
        "UnknownMethod"
    );
    // The agent still serves.
    assert_eq!(
        call(&peer, "check_running", vec![id.clone().into()])
            .await
            .unwrap(),
        Value::from(true)
    );
    call(&peer, "reset_instance", vec![]).await.unwrap();
    assert!(fx.containers().is_empty());
    agent.shutdown(OnShutdown::Terminate).await;
}

#[cfg(feature = "fault-injection")]
#[actix_rt::test]
async fn a_failure_at_any_stage_leaks_nothing_and_names_the_stage() {
    let fx = AgentFixture::new("inject", 30300, 4);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    let vf = fx.vfolder_root().join("v");
    std::fs::create_dir(&vf).unwrap();
    for stage in kernelvisor::agent::kernel::stages::STAGES {
        let config = kernel_config(
            "0.2",
            32 * MIB,
            vec![
                ("_inject", map(vec![("fail_at", stage.into())])),
                (
                    "mounts",
                    Value::Array(vec![map(vec![
                        ("name", "v".into()),
                        ("host_path", vf.display().to_string().into()),
                    ])]),
                ),
                (
                    "service_ports",
                    Value::Array(vec![map(vec![
                        ("name", "p".into()),
                        (
                            "container_ports",
                            Value::Array(vec![9000.into(), 9001.into()]),
                        ),
                    ])]),
                ),
            ],
        );
        let r = create_one(&peer, "s-inject", &format!("k-{}", run_id()), config).await;
        let Err(kernelvisor::rpc::CallError::Failure(meta)) = &r else {
            panic!("{stage}: expected a FAILURE, got {r:?}")
        };
        assert!(
            meta.repr.contains(&format!("stage `{stage}`")),
            "{stage}: {}",
            meta.repr
        );
        assert!(fx.containers().is_empty(), "{stage}: container leaked");
        assert!(fx.scratch_entries().is_empty(), "{stage}: scratch leaked");
        tokio::time::sleep(Duration::from_millis(150)).await; // port cooldown of the fixture
        assert_eq!(
            usage(&peer).await,
            ("0".into(), "0".into(), 4),
            "{stage}: slots or ports leaked"
        );
        assert!(
            agent.ctx.store.live_kernels().await.unwrap().is_empty(),
            "{stage}: store row left live"
        );
    }
    agent.shutdown(OnShutdown::Terminate).await;
}

/// `kernelvisor_create_kernels_retries_total{answer}` of `agent`.
#[cfg(feature = "fault-injection")]
fn retries(agent: &Agent, answer: &str) -> u64 {
    let label = format!("kernelvisor_create_kernels_retries_total{{answer=\"{answer}\"}} ");
    agent
        .ctx
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&label).map(|v| v.trim().parse().unwrap()))
        .unwrap_or(0)
}

/// `create_kernels` sent again for the same kernel, as Backend.AI's manager re-sends it after a
/// lost event: while the first call's creation is held (its container stage waits for a file),
/// a second call joins it: the same answer, one container, one `kernel_started`. Once the kernel
/// runs, a third is answered as it runs and `kernel_started` is published again. Another
/// session's call for the id is refused.
#[cfg(feature = "fault-injection")]
#[actix_rt::test]
async fn a_create_kernels_retry_joins_the_creation_or_answers_the_running_kernel() {
    let fx = AgentFixture::new("retries", 37_300, 4);
    let agent = start(&fx).await;
    let mut events = agent.ctx.events.subscribe();
    let peer = client(agent.endpoint()).await;
    let gate = fx.dir.path().join("release-create");
    let config = kernel_config(
        "0.1",
        64 * MIB,
        vec![(
            "_inject",
            map(vec![(
                "hold_before",
                Value::Array(vec!["container".into(), gate.display().to_string().into()]),
            )]),
        )],
    );
    let id = format!("k-{}", run_id());
    let send = |config: Value| {
        let (peer, id) = (peer.clone(), id.clone());
        actix_rt::spawn(async move { create_one(&peer, "s-retry", &id, config).await })
    };
    let first = send(config.clone());
    // The first call holds the id (its creation waits at the gate)...
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while call(&peer, "check_creating", vec![id.clone().into()])
        .await
        .unwrap()
        != Value::from(true)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the first create never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ...the second joins it...
    let joined = send(config.clone());
    while retries(&agent, "joined") == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the second create never joined"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(fx.containers().is_empty(), "the creation is still held");
    // ...and both get the creation's answer once it is let go.
    std::fs::write(&gate, "").unwrap();
    let first = first.await.unwrap().unwrap();
    let joined = joined.await.unwrap().unwrap();
    assert_eq!(joined, first, "the joined call answers what the first did");
    assert_eq!(field(&first, "status").as_str(), Some("RUNNING"));
    assert_eq!(fx.containers().len(), 1, "one container for both calls");
    let mut names = Vec::new();
    while let Ok(e) = events.try_recv() {
        names.push(e.name());
    }
    assert_eq!(
        names,
        ["kernel_preparing", "kernel_creating", "kernel_started"],
        "one creation's events"
    );

    // Running: answered as it runs, `kernel_started` again with the same container.
    let again = send(config.clone()).await.unwrap().unwrap();
    assert_eq!(
        field(&again, "container_id"),
        field(&first, "container_id"),
        "{again}"
    );
    assert_eq!(field(&again, "status").as_str(), Some("RUNNING"));
    let e = events.try_recv().expect("kernel_started sent again");
    let AgentEvent::KernelStarted {
        kernel_id,
        creation_info: Some(info),
        ..
    } = &e
    else {
        panic!("{e:?} is not kernel_started");
    };
    assert_eq!(kernel_id, &id);
    assert_eq!(
        Some(info.container_id.as_str()),
        field(&first, "container_id").as_str()
    );
    assert!(events.try_recv().is_err(), "nothing more");
    assert_eq!(
        (retries(&agent, "joined"), retries(&agent, "running")),
        (1, 1)
    );
    assert_eq!(fx.containers().len(), 1, "still one container");

    // Another session's kernel of that id, or a call naming it with a new one: refused.
    assert_eq!(
        failure_name(
            &create_one(
                &peer,
                "s-other",
                &id,
                kernel_config("0.1", 64 * MIB, vec![])
            )
            .await
        ),
        "InvalidKernelConfig"
    );
    let mixed = call(
        &peer,
        "create_kernels",
        vec![
            "s-retry".into(),
            Value::Array(vec![id.clone().into(), format!("k-{}", run_id()).into()]),
            Value::Array(vec![
                kernel_config("0.1", 64 * MIB, vec![]),
                kernel_config("0.1", 64 * MIB, vec![]),
            ]),
        ],
    )
    .await;
    assert_eq!(failure_name(&mixed), "InvalidKernelConfig");
    assert_eq!(fx.containers().len(), 1, "the refused calls made nothing");
    call(&peer, "reset_instance", vec![]).await.unwrap();
    assert!(fx.containers().is_empty());
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn oom_and_self_termination_are_reported_and_torn_down() {
    let fx = AgentFixture::new("exit", 30400, 4);
    let agent = start(&fx).await;
    let mut events = agent.ctx.events.subscribe();
    let peer = client(agent.endpoint()).await;
    // The test image's entrypoint evals $KERNEL_CMD: allocate past 16 MiB as PID 1.
    let oom = kernel_config(
        "0.2",
        16 * MIB,
        vec![(
            "environ",
            map(vec![(
                "KERNEL_CMD",
                "sleep 1; x=$(head -c 100000000 /dev/zero | tr '\\0' a)".into(),
            )]),
        )],
    );
    let bye = kernel_config(
        "0.2",
        32 * MIB,
        vec![(
            "environ",
            map(vec![("KERNEL_CMD", "sleep 1; exit 7".into())]),
        )],
    );
    let (k_oom, k_bye) = (format!("k-oom-{}", run_id()), format!("k-bye-{}", run_id()));
    create_one(&peer, "s-exit", &k_oom, oom).await.unwrap();
    create_one(&peer, "s-exit", &k_bye, bye).await.unwrap();
    let mut reasons = std::collections::HashMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while reasons.len() < 2 {
        let e = tokio::time::timeout_at(deadline, events.recv())
            .await
            .expect("both kernels end")
            .unwrap();
        if let AgentEvent::KernelTerminated {
            kernel_id,
            reason,
            exit_code,
            ..
        } = e
        {
            reasons.insert(kernel_id, (reason, exit_code));
        }
    }
    assert_eq!(reasons[&k_oom].0, "oom-killed", "{reasons:?}");
    assert_eq!(reasons[&k_bye], ("self-terminated".to_owned(), Some(7)));
    assert!(
        fx.containers().is_empty(),
        "exited kernels' containers are removed"
    );
    assert!(fx.scratch_entries().is_empty());
    assert_eq!(usage(&peer).await.0, "0");
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn twenty_concurrent_kernels_run_and_clean_up() {
    let fx = AgentFixture::new("twenty", 30500, 40);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    let ids: Vec<String> = (0..20).map(|i| format!("k{i}-{}", run_id())).collect();
    let creates = ids.iter().map(|id| {
        create_one(
            &peer,
            "s-twenty",
            id,
            kernel_config(
                "0.05",
                16 * MIB,
                vec![(
                    "service_ports",
                    Value::Array(vec![map(vec![
                        ("name", "p".into()),
                        ("container_ports", Value::Array(vec![7000.into()])),
                    ])]),
                )],
            ),
        )
    });
    for r in futures::future::join_all(creates).await {
        assert_eq!(field(&r.unwrap(), "status").as_str(), Some("RUNNING"));
    }
    assert_eq!(fx.containers().len(), 20);
    assert_eq!(
        docker(&[
            "ps",
            "-q",
            "--filter",
            &format!("label=ai.backend.agent-id={}", fx.agent_id)
        ])
        .lines()
        .count(),
        20,
        "all running"
    );
    let (cpu, _, free) = usage(&peer).await;
    assert_eq!((cpu.as_str(), free), ("1", 20));
    let destroys = ids.iter().map(|id| {
        call(
            &peer,
            "destroy_kernel",
            vec![id.clone().into(), "s-twenty".into()],
        )
    });
    for r in futures::future::join_all(destroys).await {
        r.unwrap();
    }
    assert!(fx.containers().is_empty());
    assert!(fx.scratch_entries().is_empty());
    tokio::time::sleep(Duration::from_millis(150)).await; // port cooldown of the fixture
    assert_eq!(usage(&peer).await, ("0".into(), "0".into(), 40));
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn scratch_size_quota_is_a_tmpfs_that_teardown_unmounts() {
    let fx = AgentFixture::new("quota", 30800, 2);
    let text = fx
        .config_toml("")
        .replace("[container]\n", "[container]\nscratch-size = \"8m\"\n");
    let path = fx.dir.path().join("quota.toml");
    std::fs::write(&path, text).unwrap();
    let agent = Agent::start(kernelvisor::config::AgentConfig::load(&path).unwrap(), None)
        .await
        .unwrap();
    let peer = client(agent.endpoint()).await;
    let kid = format!("k-{}", run_id());
    create_one(
        &peer,
        "s-quota",
        &kid,
        kernel_config("0.1", 32 * MIB, vec![]),
    )
    .await
    .unwrap();
    let work = fx
        .scratch_root()
        .canonicalize()
        .unwrap()
        .join(&kid)
        .join("work");
    let mounts = || read(std::path::Path::new("/proc/mounts"));
    assert!(
        mounts().contains(&format!("tmpfs {} tmpfs", work.display())),
        "work/ is a tmpfs"
    );
    let exec = |code: &str| {
        vec![
            "s-quota".into(),
            kid.clone().into(),
            "v4".into(),
            "r".into(),
            "query".into(),
            code.into(),
            map(vec![]),
            0.into(),
        ]
    };
    let out = call(
        &peer,
        "execute",
        exec("dd if=/dev/zero of=/home/work/big bs=1M count=16"),
    )
    .await
    .unwrap();
    assert_ne!(
        field(&out, "exitCode").as_i64(),
        Some(0),
        "writing 16 MiB into an 8 MiB scratch fails"
    );
    assert!(format!("{:?}", field(&out, "console")).contains("No space left"));
    call(
        &peer,
        "destroy_kernel",
        vec![kid.clone().into(), "s-quota".into()],
    )
    .await
    .unwrap();
    assert!(!mounts().contains(&work.display().to_string()), "unmounted");
    assert!(fx.scratch_entries().is_empty());
    agent.shutdown(OnShutdown::Terminate).await;
}

//! The agent as a real process on the real engine: SIGTERM keeps kernels running and the next
//! start re-attaches them; a container killed while the agent was down is cleaned up; SIGKILL
//! in the middle of a create leaks nothing; containers the agent does not own are not touched.

use crate::common;

use std::process::Child;
use std::time::Duration;

use rmpv::Value;

use common::agent::*;
use common::wait_until;
use kernelvisor::rpc::Peer;

const MIB: u64 = 1 << 20;

/// The agent binary on the fixture's config with `agent_extra`, logging to `agent.log`.
fn spawn_agent(fx: &AgentFixture, agent_extra: &str) -> Child {
    spawn_agent_process(fx, &fx.write_config(agent_extra))
}

async fn connect(fx: &AgentFixture) -> Peer {
    connect_process(fx).await
}

fn sigterm(child: &mut Child) {
    // SAFETY: signalling our own child process by pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    for _ in 0..300 {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(status.success(), "agent exited with {status} after SIGTERM");
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    panic!("agent did not stop within 30 s of SIGTERM");
}

fn config_with_port(mem: u64) -> Value {
    kernel_config(
        "0.1",
        mem,
        vec![(
            "service_ports",
            Value::Array(vec![map(vec![
                ("name", "p".into()),
                ("container_ports", Value::Array(vec![8000.into()])),
            ])]),
        )],
    )
}

#[actix_rt::test]
async fn sigterm_preserves_kernels_and_restart_reattaches_them() {
    let fx = AgentFixture::new("restart", 30600, 10);
    let mut agent = spawn_agent(&fx, "");
    let peer = connect(&fx).await;
    let (k1, k2) = (format!("k1-{}", run_id()), format!("k2-{}", run_id()));
    let c1 = field(
        &create_one(&peer, "s1", &k1, config_with_port(32 * MIB))
            .await
            .unwrap(),
        "container_id",
    )
    .as_str()
    .unwrap()
    .to_owned();
    let c2 = field(
        &create_one(&peer, "s1", &k2, config_with_port(32 * MIB))
            .await
            .unwrap(),
        "container_id",
    )
    .as_str()
    .unwrap()
    .to_owned();
    peer.close();

    // Graceful stop keeps the containers (on-shutdown = "preserve", the default).
    sigterm(&mut agent);
    assert_eq!(inspect(&c1, "{{.State.Running}}").as_deref(), Some("true"));
    assert_eq!(inspect(&c2, "{{.State.Running}}").as_deref(), Some("true"));
    // While the agent is down: k2's container dies; a container with our id but unknown to the
    // agent appears (dangling), and one of another agent (foreign).
    docker(&["kill", &c2]);
    let ghost = docker(&[
        "run",
        "-d",
        "--label",
        &format!("ai.backend.agent-id={}", fx.agent_id),
        "--label",
        "ai.backend.kernel-id=ghost",
        TEST_IMAGE,
    ]);
    let foreign = docker(&[
        "run",
        "-d",
        "--label",
        "ai.backend.agent-id=someone-else",
        "--label",
        &format!("kernelvisor.test-run={}", fx.agent_id),
        TEST_IMAGE,
    ]);

    let mut agent = spawn_agent(&fx, "");
    let peer = connect(&fx).await;
    assert_eq!(
        call(&peer, "check_running", vec![k1.clone().into()])
            .await
            .unwrap(),
        Value::from(true)
    );
    let out = call(
        &peer,
        "execute",
        vec![
            "s1".into(),
            k1.clone().into(),
            "v4".into(),
            "r".into(),
            "query".into(),
            "echo reattached".into(),
            map(vec![]),
            0.into(),
        ],
    )
    .await
    .unwrap();
    assert!(format!("{:?}", field(&out, "console")).contains("reattached"));
    // k2 is torn down: container, scratch and its port and slots.
    wait_until(Duration::from_secs(30), "k2 cleaned up", || async {
        inspect(&c2, "{{.Id}}").is_none()
    })
    .await;
    wait_until(Duration::from_secs(10), "k2 forgotten", || async {
        failure_name(&call(&peer, "get_kernel", vec![k2.clone().into()]).await) == "KernelNotFound"
    })
    .await;
    assert_eq!(fx.scratch_entries(), vec![k1.clone()]);
    // k2's release is asynchronous (and its port rests 0.1 s): wait for the expected usage.
    let (cpu, mem, free) = common::settle(
        Duration::from_secs(10),
        || usage(&peer),
        |(cpu, mem, free)| (cpu.as_str(), mem.clone(), *free) == ("0.1", (32 * MIB).to_string(), 9),
    )
    .await;
    assert_eq!(
        (cpu.as_str(), mem, free),
        ("0.1", (32 * MIB).to_string(), 9),
        "k1's slots and port re-reserved, k2's released"
    );
    let synced = call(&peer, "list_kernels", vec![]).await.unwrap();
    let kernels = field(&synced, "kernels").as_array().unwrap().clone();
    assert_eq!(kernels.len(), 1);
    assert_eq!(field(&kernels[0], "status").as_str(), Some("RUNNING"));
    // Dangling and foreign containers are reported / ignored, never touched.
    assert_eq!(
        inspect(&ghost, "{{.State.Running}}").as_deref(),
        Some("true")
    );
    assert_eq!(
        inspect(&foreign, "{{.State.Running}}").as_deref(),
        Some("true")
    );
    assert!(read(&fx.dir.path().join("agent.log")).contains("dangling container"));
    docker(&["rm", "-f", &ghost, &foreign]);
    peer.close();

    // on-shutdown = "terminate" destroys the kernels on SIGTERM.
    sigterm(&mut agent);
    let mut agent = spawn_agent(&fx, "on-shutdown = \"terminate\"");
    let peer = connect(&fx).await;
    assert_eq!(
        call(&peer, "check_running", vec![k1.clone().into()])
            .await
            .unwrap(),
        Value::from(true)
    );
    peer.close();
    sigterm(&mut agent);
    assert_eq!(inspect(&c1, "{{.Id}}"), None);
    assert!(fx.scratch_entries().is_empty());
}

#[cfg(feature = "fault-injection")]
#[actix_rt::test]
async fn sigkill_in_the_middle_of_a_create_leaks_nothing() {
    let fx = AgentFixture::new("sigkill", 30700, 4);
    for stage in ["container", "service-ports"] {
        let mut agent = spawn_agent(&fx, "");
        let peer = connect(&fx).await;
        let kid = format!("k-{}", run_id());
        let mut config = config_with_port(32 * MIB);
        if let Value::Map(m) = &mut config {
            m.push((
                "_inject".into(),
                map(vec![(
                    "pause_before",
                    Value::Array(vec![stage.into(), 60.into()]),
                )]),
            ));
        }
        let pending = {
            let (peer, kid) = (peer.clone(), kid.clone());
            actix_rt::spawn(async move { create_one(&peer, "s", &kid, config).await })
        };
        // Wait until the kernel holds everything up to `stage`, then kill the agent outright.
        let want_container = stage == "service-ports";
        wait_until(Duration::from_secs(30), "create in progress", || async {
            fx.scratch_entries().len() == 1 && (fx.containers().len() == 1) == want_container
        })
        .await;
        agent.kill().unwrap();
        agent.wait().unwrap();
        pending.abort(); // its reply will never come: the agent is dead

        let mut agent = spawn_agent(&fx, "");
        let peer = connect(&fx).await;
        assert!(fx.containers().is_empty(), "{stage}: container leaked");
        assert!(fx.scratch_entries().is_empty(), "{stage}: scratch leaked");
        assert_eq!(
            usage(&peer).await,
            ("0".into(), "0".into(), 4),
            "{stage}: slots or ports leaked"
        );
        assert_eq!(
            failure_name(&call(&peer, "get_kernel", vec![kid.clone().into()]).await),
            "KernelNotFound"
        );
        // The same id can be used again: its row is TERMINATED, not live.
        create_one(&peer, "s", &kid, kernel_config("0.1", 32 * MIB, vec![]))
            .await
            .unwrap();
        call(
            &peer,
            "destroy_kernel",
            vec![kid.clone().into(), "s".into()],
        )
        .await
        .unwrap();
        peer.close();
        sigterm(&mut agent);
    }
}

//! Interop with the real callosum 1.0 (PyPI), both directions, with and without CURVE:
//! a stock `callosum.rpc.Peer` calls our agent, and our `AgentPool` calls a callosum server.

use crate::common;

use std::process::Stdio;
use std::time::Duration;

use rmpv::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use common::*;
use kernelvisor::manager::pool::{AgentCall, AgentCallError, InspectEntry};
use kernelvisor::rpc::CallError;

/// Runs the callosum client against `endpoint`; returns (exit code, parsed JSON line).
async fn callosum_client(
    endpoint: &str,
    keys: Option<(&std::path::Path, &str)>,
) -> (i32, serde_json::Value) {
    let mut cmd = Command::new(python());
    cmd.arg(interop_script("callosum_client.py")).arg(endpoint);
    if let Some((dir, client)) = keys {
        cmd.arg("--server-key")
            .arg(dir.join("agent.key"))
            .arg("--keypair")
            .arg(dir.join(format!("{client}.key_secret")));
    }
    let out = cmd.output().await.expect("running the callosum client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_else(|| {
        panic!(
            "no output; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (
        out.status.code().unwrap_or(-1),
        serde_json::from_str(line).expect("JSON line"),
    )
}

fn check_client_results(v: &serde_json::Value) {
    assert_eq!(v["ping"], "hello");
    assert_eq!(
        v["ping_str_okey"], "k",
        "str okey must be echoed as str or the caller hangs"
    );
    assert_eq!(v["health"]["status"], "ok");
    assert_eq!(v["health"]["agent_id"], "test-agent");
    let cpu = &v["gather_hwinfo"]["cpu"]["metadata"];
    let cores: usize = cpu["cores"].as_str().unwrap().parse().unwrap();
    let procfs_cores = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap()
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    assert_eq!(cores, procfs_cores, "hwinfo core count must be the host's");
    let mem: u64 = v["gather_hwinfo"]["mem"]["metadata"]["total_bytes"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(mem > 64 * 1024 * 1024, "memory total {mem}");
    assert_eq!(
        v["gather_hwinfo"]["os"]["metadata"]["arch"],
        std::env::consts::ARCH
    );
    assert_eq!(v["unknown"]["name"], "UnknownMethod");
    assert!(v["unknown"]["repr"]
        .as_str()
        .unwrap()
        .contains("no_such_method"));
}

#[actix_rt::test]
async fn callosum_client_calls_our_agent_without_curve() {
    let server = start_server("tcp://127.0.0.1:0", None);
    let (code, v) = callosum_client(&server.endpoint, None).await;
    assert_eq!(code, 0, "{v}");
    check_client_results(&v);
}

#[actix_rt::test]
async fn callosum_client_calls_our_agent_with_curve_and_a_wrong_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::new();
    keys.write(dir.path());
    let server = start_server("tcp://127.0.0.1:0", Some(keys.server_curve()));
    let (code, v) = callosum_client(&server.endpoint, Some((dir.path(), "manager"))).await;
    assert_eq!(code, 0, "{v}");
    check_client_results(&v);
    // The agent's own key pair is not the manager's: ZAP refuses it, the handshake fails.
    let (code, v) = callosum_client(&server.endpoint, Some((dir.path(), "agent"))).await;
    assert_eq!(code, 3, "{v}");
    assert!(v["connect_error"]
        .as_str()
        .unwrap()
        .contains("handshake failed"));
}

/// A callosum server subprocess, killed on drop.
struct CallosumServer {
    child: Child,
    endpoint: String,
}

impl Drop for CallosumServer {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
    }
}

async fn callosum_server(keys_dir: Option<&std::path::Path>) -> CallosumServer {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cmd = Command::new(python());
    cmd.arg(interop_script("callosum_server.py"))
        .arg(port.to_string())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    if let Some(dir) = keys_dir {
        cmd.arg("--keypair")
            .arg(dir.join("agent.key_secret"))
            .arg("--client-key")
            .arg(dir.join("manager.key"));
    }
    let mut child = cmd.spawn().expect("starting the callosum server");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    assert!(
        matches!(ready, Ok(Ok(Some(ref l))) if l == "READY"),
        "callosum server did not start: {ready:?}"
    );
    CallosumServer {
        child,
        endpoint: format!("tcp://127.0.0.1:{port}"),
    }
}

async fn pool_calls_callosum(curve: bool) {
    let dir = tempfile::tempdir().unwrap();
    let keys = Keys::new();
    keys.write(dir.path());
    let server = callosum_server(curve.then(|| dir.path())).await;
    let (agent_key, manager) = if curve {
        (Some(keys.agent.public), Some(keys.manager.clone()))
    } else {
        (None, None)
    };
    let pool = pool_for("py", &server.endpoint, agent_key, manager, fast_spec()).await;
    let call = |method: &str, args: Vec<Value>, timeout_ms| {
        pool.send(AgentCall::new(
            "py",
            method,
            args,
            Duration::from_millis(timeout_ms),
        ))
    };

    assert_eq!(
        call("ping", vec![Value::from("hi")], 5000)
            .await
            .unwrap()
            .unwrap(),
        Value::from("hi")
    );
    assert_eq!(
        call("add", vec![Value::from(40), Value::from(2)], 5000)
            .await
            .unwrap()
            .unwrap(),
        Value::from(42)
    );
    let concurrent = futures::future::join_all(
        (0..50).map(|i| call("add", vec![Value::from(i), Value::from(1000)], 5000)),
    )
    .await;
    for (i, r) in concurrent.into_iter().enumerate() {
        assert_eq!(r.unwrap().unwrap(), Value::from(i as i64 + 1000));
    }
    let err = call("fail", vec![], 5000).await.unwrap().unwrap_err();
    let meta = err.failure().expect("a callosum FAILURE");
    assert_eq!(meta.name, "ValueError");
    assert!(
        meta.repr.contains("deliberate failure") && meta.traceback.contains("Traceback"),
        "{meta:?}"
    );
    let err = call("slow", vec![Value::from(3)], 200)
        .await
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(
            err,
            AgentCallError::Call {
                source: CallError::Timeout { .. },
                ..
            }
        ),
        "{err}"
    );
    // The server is still fine after our CANCEL, and the connection was the same throughout.
    assert_eq!(
        call("ping", vec![Value::from("after")], 5000)
            .await
            .unwrap()
            .unwrap(),
        Value::from("after")
    );
    let entry = pool
        .send(InspectEntry {
            agent_id: "py".into(),
        })
        .await
        .unwrap()
        .unwrap();
    assert!(entry.connected && entry.healthy, "{entry:?}");
}

#[actix_rt::test]
async fn our_pool_calls_a_callosum_server_without_curve() {
    pool_calls_callosum(false).await;
}

#[actix_rt::test]
async fn our_pool_calls_a_callosum_server_with_curve() {
    pool_calls_callosum(true).await;
}

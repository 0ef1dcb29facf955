//! `just bench kernel`: create→`RUNNING` latency of a kernel through the agent (called over
//! RPC: ZeroMQ, codec, registry, kernel actor, all seven stages, SQLite) against raw bollard
//! create+start of the same image with the same limits, interleaved in one run on the local
//! Docker engine. Target: agent p50 at most 10% above raw p50.
//!
//! `KV_BENCH_KERNELS` sets the samples per side (default 40, after 3 warm-ups each). Prints a
//! table and ends with one JSON line: `{"agent_p50_ms", "agent_p90_ms", "raw_p50_ms", "raw_p90_ms"}`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use bollard::container::{Config, CreateContainerOptions, RemoveContainerOptions};
use bollard::models::HostConfig;
use rmpv::Value;

use kernelvisor::agent::Agent;
use kernelvisor::config::{AgentConfig, OnShutdown};
use kernelvisor::rpc::{Call, Peer, PeerOptions};

const IMAGE: &str = "kernelvisor-test:latest";
const MEM: i64 = 64 << 20;

fn ms(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort_unstable();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i].as_secs_f64() * 1e3
}

fn kv(pairs: Vec<(&str, Value)>) -> Value {
    Value::Map(pairs.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

async fn call(peer: &Peer, method: &str, args: Vec<Value>) -> Value {
    peer.call(
        method,
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

/// One kernel through the agent: the timed create, then an untimed destroy.
async fn agent_once(peer: &Peer, i: usize) -> Duration {
    let id = format!("bench-{}-{i}", std::process::id());
    let config = kv(vec![
        (
            "image",
            kernelvisor::rpc::agent_api::to_value(
                &kernelvisor::rpc::agent_api::kernel::ImageConfig::local(IMAGE),
            ),
        ),
        (
            "resource_slots",
            kv(vec![("cpu", "0.5".into()), ("mem", (MEM as u64).into())]),
        ),
    ]);
    let t0 = Instant::now();
    let info = call(
        peer,
        "create_kernels",
        vec![
            "bench".into(),
            Value::Array(vec![id.clone().into()]),
            Value::Array(vec![config]),
        ],
    )
    .await;
    let took = t0.elapsed();
    assert!(format!("{info:?}").contains("RUNNING"));
    call(peer, "destroy_kernel", vec![id.into(), "bench".into()]).await;
    took
}

/// The same container straight through bollard: create + start, then an untimed removal.
async fn raw_once(docker: &bollard::Docker, agent_id: &str, i: usize) -> Duration {
    let name = format!("bench-raw-{}-{i}", std::process::id());
    let labels = HashMap::from([("ai.backend.agent-id".to_owned(), agent_id.to_owned())]);
    let config = Config {
        image: Some(IMAGE.to_owned()),
        labels: Some(labels),
        host_config: Some(HostConfig {
            memory: Some(MEM),
            memory_swap: Some(MEM),
            nano_cpus: Some(500_000_000),
            pids_limit: Some(4096),
            shm_size: Some(64 << 20),
            ..Default::default()
        }),
        ..Default::default()
    };
    let t0 = Instant::now();
    let c = docker
        .create_container(
            Some(CreateContainerOptions {
                name: name.clone(),
                platform: None,
            }),
            config,
        )
        .await
        .expect("create");
    docker
        .start_container::<String>(&c.id, None)
        .await
        .expect("start");
    let took = t0.elapsed();
    docker
        .remove_container(
            &c.id,
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await
        .expect("remove");
    took
}

fn main() {
    let n: usize = std::env::var("KV_BENCH_KERNELS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40);
    let dir = tempfile::tempdir().unwrap();
    let agent_id = format!("bench-agent-{}", std::process::id());
    let d = dir.path().display();
    let toml = format!(
        "[agent]\nid = \"{agent_id}\"\nrpc-listen-addr = {{ host = \"127.0.0.1\", port = 0 }}\nservice-addr = {{ host = \"127.0.0.1\", port = 0 }}\nvar-base-path = \"{d}/var\"\n\
         [container]\nport-range = [31900, 31999]\nscratch-root = \"{d}/scratches\"\n[resource]\nreserved-cpu = 0\nreserved-mem = 0\n[logging]\nlevel = \"warn\"\n"
    );
    std::fs::write(dir.path().join("agent.toml"), toml).unwrap();
    let config = AgentConfig::load(&dir.path().join("agent.toml")).unwrap();
    let _ = config.logging.init();

    actix_rt::System::new().block_on(async move {
        let agent = Agent::start(config, None).await.expect("agent (is the Docker engine up and `just test-image` built?)");
        let ctx = zmq::Context::new();
        let opts = PeerOptions { endpoint: agent.endpoint().to_owned(), curve: None, keepalive: None, handshake_timeout: Duration::from_secs(5) };
        let peer = Peer::connect(&ctx, &opts).await.unwrap();
        let docker = bollard::Docker::connect_with_local_defaults().unwrap().negotiate_version().await.unwrap();
        for i in 0..3 {
            agent_once(&peer, 1_000_000 + i).await;
            raw_once(&docker, &agent_id, 1_000_000 + i).await;
        }
        let (mut agent_s, mut raw_s) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n {
            // Alternate which goes first so neither always meets a warmer engine.
            if i % 2 == 0 {
                agent_s.push(agent_once(&peer, i).await);
                raw_s.push(raw_once(&docker, &agent_id, i).await);
            } else {
                raw_s.push(raw_once(&docker, &agent_id, i).await);
                agent_s.push(agent_once(&peer, i).await);
            }
        }
        let (a50, a90, r50, r90) = (ms(&mut agent_s, 0.5), ms(&mut agent_s, 0.9), ms(&mut raw_s, 0.5), ms(&mut raw_s, 0.9));
        println!("\nkernelvisor kernel bench: create→RUNNING, {n} kernels per side, interleaved ({} cores)", std::thread::available_parallelism().map(usize::from).unwrap_or(0));
        println!("{:<58} {:>10} {:>10}", "measure", "p50 ms", "p90 ms");
        println!("{:<58} {:>10.1} {:>10.1}", "raw bollard create + start (the floor)", r50, r90);
        println!("{:<58} {:>10.1} {:>10.1}", "agent create_kernels over RPC (7 stages + SQLite)", a50, a90);
        let overhead = (a50 / r50 - 1.0) * 100.0;
        println!("{:<58} {:>9.1}% {:>9.1}%", "agent overhead vs raw (target ≤ 10% at p50)", overhead, (a90 / r90 - 1.0) * 100.0);
        println!("target p50 overhead ≤ 10%: {}", if overhead <= 10.0 { "met" } else { "NOT met" });
        println!("{{\"agent_p50_ms\": {a50:.2}, \"agent_p90_ms\": {a90:.2}, \"raw_p50_ms\": {r50:.2}, \"raw_p90_ms\": {r90:.2}}}");
        peer.close();
        agent.shutdown(OnShutdown::Terminate).await;
    });
}

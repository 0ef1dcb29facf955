//! The agent's side channels in Valkey (`src/agent/valkey/`), read with the real Backend.AI
//! 26.9.6 manager's own clients and code (`tests/bai_compat/sidechannels.py`, run in the trixie
//! root as tests/it/bai_events.rs runs its consumer, against a real `redis-server` of the test's
//! own):
//!
//! - kernel presence (`ValkeyScheduleClient`), installed images (`ValkeyImageClient`), node,
//!   kernel and process stats (`ValkeyStatClient`, and the idle checker's own
//!   `get_current_utilization`) of an agent process running a real kernel;
//! - the manager's stale-kernel sweep (`SessionTerminator.check_stale_kernels`) over that
//!   kernel and one the agent never had: only the latter is asked about (`check_running`, by the
//!   manager's own agent client) and found dead;
//! - the background tasks of `check_and_pull`, `commit` and `push_image` seen to their end by
//!   the manager's own wait (`CommitSessionHandler._wait_for_agent_bgtask`: cached event, then
//!   the `events_all` channel through an `EventDispatcher` and `EventHub`);
//! - a commit's status (`AgentRegistry.get_commit_status`) `ongoing` while it runs and `ready`
//!   once it ended, and its `bgtask_done` / a push's `bgtask_failed` reaching a wait that
//!   started before the end;
//! - a stalled Valkey holding none of it up.
//!
//! Skipped (said on stderr) without `KV_BAI_ROOT`, as tests/it/bai_events.rs.

use crate::bai_events::{agent_config, bai_root, clip, Redis, RootDir};
use crate::common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmpv::Value;
use serde_json::Value as Json;

use common::agent::{
    call, call_kw, create_one, docker, field, free_port, kernel_config, map, read, run_id,
    spawn_agent_process, AgentFixture,
};
use common::bai::{tail, wait_for_port, KillOnDrop};
use common::Keys;
use kernelvisor::rpc::socket::ClientCurve;
use kernelvisor::rpc::{Peer, PeerOptions};

/// A long-running `sidechannels.py` whose JSON lines are collected as they come.
struct Script {
    lines: Arc<Mutex<Vec<Json>>>,
    stderr: PathBuf,
    _child: KillOnDrop,
}

impl Script {
    fn start(dir: &RootDir, args: &[String], stderr: PathBuf) -> Script {
        let mut child = KillOnDrop(
            dir.python("sidechannels.py")
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::from(std::fs::File::create(&stderr).unwrap()))
                .spawn()
                .expect("chroot sidechannels.py"),
        );
        let stdout = child.0.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let v = serde_json::from_str::<Json>(&line)
                    .unwrap_or_else(|_| serde_json::json!({"kind": "garbage", "line": line}));
                sink.lock().unwrap().push(v);
            }
        });
        Script {
            lines,
            stderr,
            _child: child,
        }
    }

    fn last(&self, kind: &str) -> Option<Json> {
        let lines = self.lines.lock().unwrap();
        lines.iter().rev().find(|l| l["kind"] == kind).cloned()
    }

    fn explain(&self, what: &str) -> String {
        let lines = self.lines.lock().unwrap();
        format!(
            "{what}; last lines:\n{}\n\nstderr (tail):\n{}",
            lines
                .iter()
                .rev()
                .take(3)
                .map(|l| clip(&l.to_string(), 3000))
                .collect::<Vec<_>>()
                .join("\n"),
            tail(&read(&self.stderr), 30)
        )
    }

    /// Polls (every 100 ms, without blocking the test's runtime) until the last line of `kind`
    /// passes `check`; returns it. Panics with what was seen after `limit` (a liveness bound,
    /// not a timing assertion).
    async fn wait(
        &self,
        limit: Duration,
        kind: &str,
        what: &str,
        check: impl Fn(&Json) -> bool,
    ) -> Json {
        let start = Instant::now();
        loop {
            if let Some(l) = self.last(kind).filter(|l| check(l)) {
                return l;
            }
            assert!(
                start.elapsed() < limit,
                "{}",
                self.explain(&format!("timed out after {limit:?} waiting for {what}"))
            );
            actix_rt::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The manager's CURVE client to the agent at `port`.
async fn manager_client(port: u16, keys: &Keys) -> Peer {
    let opts = PeerOptions {
        endpoint: format!("tcp://127.0.0.1:{port}"),
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

/// Runs the manager's wait for background task `id` (hyphenated UUID) to its end.
async fn wait_bgtask(dir: &RootDir, redis: &Redis, id: &str, stderr: PathBuf) -> Json {
    let s = Script::start(
        dir,
        &[
            "--wait-bgtask".into(),
            id.into(),
            "--redis-port".into(),
            redis.port.to_string(),
            "--timeout".into(),
            "60".into(),
        ],
        stderr,
    );
    s.wait(
        Duration::from_secs(90),
        "result",
        &format!("the end of bgtask {id}"),
        |_| true,
    )
    .await
}

/// A 32-hex-digit task id (`check_and_pull`'s, upstream's `task_id.hex`) as a UUID string.
fn hyphenated(hex: &str) -> String {
    uuid::Uuid::parse_str(hex).unwrap().to_string()
}

fn metric<'a>(stats: &'a Json, key: &str) -> &'a Json {
    &stats[key]
}

/// Asserts `v` is upstream's `MetricValue`: decimal strings, a unit hint.
fn assert_metric_value(v: &Json, unit: &str, what: &str) {
    assert_eq!(v["unit_hint"], unit, "{what}: {v}");
    for f in ["current", "pct"] {
        let s = v[f]
            .as_str()
            .unwrap_or_else(|| panic!("{what}.{f} not a string: {v}"));
        s.parse::<f64>()
            .unwrap_or_else(|_| panic!("{what}.{f} not a decimal: {v}"));
    }
}

#[actix_rt::test]
async fn the_real_26_manager_reads_every_side_channel_of_a_running_kernel() {
    let Some(root) = bai_root("bai_sidechannels::the_real_26_manager_reads_every_side_channel")
    else {
        return;
    };
    let redis = Redis::start();
    let fx = AgentFixture::new("bai-sc", 37_500, 8);
    let keys = Keys::new();
    keys.write(fx.dir.path());
    let files: Vec<PathBuf> = ["manager.key", "manager.key_secret", "agent.key"]
        .iter()
        .map(|f| fx.dir.path().join(f))
        .collect();
    let dir = RootDir::new(&root, &files);
    let d = fx.dir.path().display();
    let config = agent_config(
        &fx,
        free_port(),
        redis.port,
        &format!(
            "rpc-auth-manager-public-key = \"{d}/manager.key\"\nrpc-auth-agent-keypair = \"{d}/agent.key_secret\"\n"
        ),
        "",
        true,
    );
    let mut text = std::fs::read_to_string(&config).unwrap();
    text += "\n[stats]\nnode-interval = 0.5\ncontainer-interval = 0.5\nprocess-interval = 0.5\n";
    std::fs::write(&config, text).unwrap();
    let agent_log = fx.dir.path().join("agent.log");
    let mut agent = KillOnDrop(spawn_agent_process(&fx, &config));
    wait_for_port(fx.rpc_port, &mut agent.0, &agent_log);
    let peer = manager_client(fx.rpc_port, &keys).await;

    // A running kernel of the unlabelled test image, limited to 64 MiB.
    let session_id = uuid::Uuid::new_v4().to_string();
    let kernel_id = uuid::Uuid::new_v4().to_string();
    let mem = 64u64 << 20;
    let info = create_one(
        &peer,
        &session_id,
        &kernel_id,
        kernel_config(
            "0.5",
            mem,
            vec![("startup_command", Value::from("exec sleep infinity"))],
        ),
    )
    .await
    .unwrap_or_else(|e| panic!("create_kernels: {e}; log:\n{}", tail(&read(&agent_log), 40)));
    let container_id = field(&info, "container_id").as_str().unwrap().to_owned();

    let watch = Script::start(
        &dir,
        &[
            "--watch".into(),
            "--redis-port".into(),
            redis.port.to_string(),
            "--agent-id".into(),
            fx.agent_id.clone(),
            "--kernels".into(),
            kernel_id.clone(),
            "--containers".into(),
            container_id.clone(),
            "--occupied-mem".into(),
            mem.to_string(),
        ],
        fx.dir.path().join("watch.stderr"),
    );
    let services_digest = docker(&[
        "image",
        "inspect",
        "-f",
        "{{.Id}}",
        "kernelvisor-test:services",
    ]);
    assert!(
        services_digest.starts_with("sha256:"),
        "no image kernelvisor-test:services: run `just test-image`"
    );
    let k = kernel_id.clone();
    let c = container_id.clone();
    let snap = watch
        .wait(
            Duration::from_secs(60),
            "snapshot",
            "every side channel written",
            |s| {
                s["presence"][&k]["presence"] == "healthy"
                    && !s["installed_images"]
                        .as_array()
                        .is_none_or(|a| a.is_empty())
                    && s["agent_stats"]["node"]["cpu_util"].is_object()
                    && s["kernel_stats"][&k]["cpu_util"]["stats.avg"].is_string()
                    && s["process_stats"][&c]
                        .as_object()
                        .is_some_and(|p| !p.is_empty())
                    && s["utilization"]["cpu_util"].is_number()
            },
        )
        .await;

    // Presence: healthy, stamped with the server's clock.
    let p = &snap["presence"][&kernel_id];
    assert!(p["last_presence"].as_u64().unwrap() > 1_700_000_000, "{p}");

    // Installed images: the labelled images, by tag, with their ids; not the unlabelled one.
    let images = snap["installed_images"].as_array().unwrap();
    let services = images
        .iter()
        .find(|i| i["canonical"] == "kernelvisor-test:services")
        .unwrap_or_else(|| panic!("kernelvisor-test:services not installed: {images:?}"));
    assert_eq!(services["digest"], services_digest.as_str());
    assert_eq!(services["architecture"], std::env::consts::ARCH);
    assert!(
        images
            .iter()
            .all(|i| i["canonical"] != common::agent::TEST_IMAGE),
        "an image without labels is no Backend.AI image: {images:?}"
    );

    // Node stats.
    let node = &snap["agent_stats"]["node"];
    assert_metric_value(metric(node, "cpu_util"), "msec", "node cpu_util");
    assert_metric_value(metric(node, "mem"), "bytes", "node mem");
    assert!(
        node["mem"]["capacity"]
            .as_str()
            .unwrap()
            .parse::<f64>()
            .unwrap()
            > 0.0,
        "{node}"
    );
    assert!(node["mem"]["stats.max"].is_string(), "{node}");
    assert_metric_value(metric(node, "net_rx"), "bps", "node net_rx");
    assert!(node["net_rx"]["capacity"].is_null(), "{node}");
    assert_metric_value(
        &snap["agent_stats"]["devices"]["mem"]["root"],
        "bytes",
        "device mem/root",
    );

    // Kernel stats, as the idle checker and the session's live stats read them.
    let ks = &snap["kernel_stats"][&kernel_id];
    assert_metric_value(metric(ks, "cpu_util"), "millicores", "kernel cpu_util");
    assert_eq!(ks["cpu_util"]["capacity"], "1000", "{ks}");
    assert!(ks["cpu_util"]["stats.max"].is_string(), "{ks}");
    assert_metric_value(metric(ks, "cpu_used"), "msec", "kernel cpu_used");
    assert_metric_value(metric(ks, "mem"), "bytes", "kernel mem");
    assert_eq!(
        ks["mem"]["capacity"],
        mem.to_string(),
        "the kernel's limit: {ks}"
    );
    assert_metric_value(metric(ks, "io_read"), "bytes", "kernel io_read");
    assert!(ks["io_read"]["stats.rate"].is_string(), "{ks}");
    assert_metric_value(metric(ks, "net_rx"), "bps", "kernel net_rx");
    let u = &snap["utilization"];
    assert!(u["mem"].as_f64().unwrap() >= 0.0, "{u}");

    // Process stats: the container's processes by host pid.
    let procs = snap["process_stats"][&container_id].as_object().unwrap();
    for (pid, metrics) in procs {
        pid.parse::<u32>()
            .unwrap_or_else(|_| panic!("pid {pid}: {procs:?}"));
        assert_metric_value(
            metric(metrics, "cpu_util"),
            "millicores",
            "process cpu_util",
        );
        assert_metric_value(metric(metrics, "mem"), "bytes", "process mem");
    }

    // The manager's sweep over this kernel and one the agent never had: only the latter is
    // asked about, and it alone is dead.
    let ghost = uuid::Uuid::new_v4().to_string();
    let out = dir
        .python("sidechannels.py")
        .args(["--sweep", "--redis-port", &redis.port.to_string()])
        .args(["--agent-id", &fx.agent_id])
        .args(["--addr", &format!("tcp://127.0.0.1:{}", fx.rpc_port)])
        .args(["--manager-keypair", &dir.path("manager.key_secret")])
        .args(["--agent-public-key", &dir.path("agent.key")])
        .args(["--kernels", &format!("{kernel_id},{ghost}")])
        .output()
        .expect("run the sweep");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let sweep: Json = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Json>(l).ok())
        .find(|l| l["kind"] == "sweep")
        .unwrap_or_else(|| {
            panic!(
                "no sweep result: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert_eq!(
        sweep["check_running"],
        serde_json::json!([ghost]),
        "{sweep}"
    );
    assert_eq!(sweep["dead"], serde_json::json!([ghost]), "{sweep}");

    // check_and_pull of an image the node has: a pull task that is done.
    let digest = docker(&[
        "image",
        "inspect",
        "-f",
        "{{.Id}}",
        "kernelvisor-test:services",
    ]);
    let image_config = map(vec![
        ("canonical", "kernelvisor-test:services".into()),
        ("architecture", "x86_64".into()),
        ("project", Value::Nil),
        ("digest", digest.into()),
        ("repo_digest", Value::Nil),
        (
            "registry",
            map(vec![
                ("name", "local".into()),
                ("url", "http://localhost".into()),
            ]),
        ),
        ("labels", map(vec![])),
        ("is_local", true.into()),
        ("auto_pull", "digest".into()),
    ]);
    let pulls = call(
        &peer,
        "check_and_pull",
        vec![map(vec![("img", image_config)])],
    )
    .await
    .unwrap_or_else(|e| panic!("check_and_pull: {e}"));
    let pull_id = hyphenated(field(&pulls, "img").as_str().unwrap());
    let end = wait_bgtask(&dir, &redis, &pull_id, fx.dir.path().join("pull.stderr")).await;
    assert_eq!(end["result"], "done", "check_and_pull's task: {end}");

    // commit: its task done, the committed (labelled) image then installed.
    let committed = format!("kv-sc-commit-{}:1", run_id());
    let _cleanup = RemoveImage(committed.clone());
    let reply = call_kw(
        &peer,
        "commit",
        vec![kernel_id.clone().into(), "user_example.com".into()],
        vec![("canonical", committed.clone().into())],
    )
    .await
    .unwrap_or_else(|e| panic!("commit: {e}"));
    let commit_id = field(&reply, "bgtask_id").as_str().unwrap().to_owned();
    let end = wait_bgtask(
        &dir,
        &redis,
        &commit_id,
        fx.dir.path().join("commit.stderr"),
    )
    .await;
    assert_eq!(end["result"], "done", "commit's task: {end}");
    let k = kernel_id.clone();
    let name = committed.clone();
    watch
        .wait(
            Duration::from_secs(30),
            "snapshot",
            "the committed image installed, the commit ready",
            |s| {
                s["commit_status"][&k] == "ready"
                    && s["installed_images"]
                        .as_array()
                        .is_some_and(|a| a.iter().any(|i| i["canonical"] == name.as_str()))
            },
        )
        .await;

    // push_image to a registry nobody serves: its task failed, with the error.
    let image_ref = map(vec![
        ("name", format!("kv-sc-commit-{}", run_id()).into()),
        ("project", Value::Nil),
        ("tag", "1".into()),
        ("registry", format!("127.0.0.1:{}", free_port()).into()),
        ("architecture", "x86_64".into()),
        ("is_local", false.into()),
    ]);
    let registry_conf = map(vec![
        ("name", "nowhere".into()),
        ("url", format!("http://127.0.0.1:{}", free_port()).into()),
        ("username", Value::Nil),
        ("password", Value::Nil),
    ]);
    let reply = call(&peer, "push_image", vec![image_ref, registry_conf])
        .await
        .unwrap_or_else(|e| panic!("push_image: {e}"));
    let push_id = field(&reply, "bgtask_id").as_str().unwrap().to_owned();
    let end = wait_bgtask(&dir, &redis, &push_id, fx.dir.path().join("push.stderr")).await;
    assert_eq!(end["result"], "failed", "push_image's task: {end}");

    call(
        &peer,
        "destroy_kernel",
        vec![kernel_id.clone().into(), session_id.clone().into()],
    )
    .await
    .unwrap_or_else(|e| panic!("destroy_kernel: {e}"));
    peer.close();
    drop(agent);
}

/// Removes a local image on drop.
struct RemoveImage(String);

impl Drop for RemoveImage {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["image", "rm", "-f", &self.0])
            .output();
    }
}

/// An in-process agent on the dummy backend with `[redis]` at `redis_port`.
async fn dummy_agent(fx: &AgentFixture, redis_port: u16) -> kernelvisor::agent::Agent {
    let mut toml = fx.config_toml("backend = \"dummy\"\n");
    toml += &format!(
        "[redis]\naddr = {{ host = \"127.0.0.1\", port = {redis_port} }}\nretry-max = 0.5\n"
    );
    let path = fx.dir.path().join("agent.toml");
    std::fs::write(&path, toml).unwrap();
    let config = kernelvisor::config::AgentConfig::load(&path).unwrap();
    kernelvisor::agent::Agent::start(config, None)
        .await
        .unwrap()
}

#[actix_rt::test]
async fn a_commits_status_and_its_end_reach_a_manager_waiting_for_it() {
    let Some(root) = bai_root("bai_sidechannels::a_commits_status_and_its_end") else {
        return;
    };
    let redis = Redis::start();
    let fx = AgentFixture::new("bai-sc-live", 37_520, 4);
    let dir = RootDir::new(&root, &[]);
    let agent = dummy_agent(&fx, redis.port).await;
    let tasks = agent.ctx.bgtasks.clone();
    let kernel_id = uuid::Uuid::new_v4().to_string();
    let watch = Script::start(
        &dir,
        &[
            "--watch".into(),
            "--redis-port".into(),
            redis.port.to_string(),
            "--agent-id".into(),
            fx.agent_id.clone(),
            "--kernels".into(),
            kernel_id.clone(),
        ],
        fx.dir.path().join("watch.stderr"),
    );
    let k = kernel_id.clone();
    watch
        .wait(
            Duration::from_secs(60),
            "snapshot",
            "no commit in progress",
            |s| s["commit_status"][&k] == "ready",
        )
        .await;

    // A commit in progress (as the `commit` method records it), a manager waiting for its end.
    let id = tasks
        .start_commit(
            "kv/sc:1",
            &kernel_id,
            "user_example.com",
            "CommitInProgress",
        )
        .unwrap();
    let waiter = Script::start(
        &dir,
        &[
            "--wait-bgtask".into(),
            id.clone(),
            "--redis-port".into(),
            redis.port.to_string(),
        ],
        fx.dir.path().join("wait.stderr"),
    );
    waiter
        .wait(
            Duration::from_secs(60),
            "ready",
            "the waiter subscribed",
            |_| true,
        )
        .await;
    watch
        .wait(
            Duration::from_secs(30),
            "snapshot",
            "the commit ongoing",
            |s| s["commit_status"][&k] == "ongoing",
        )
        .await;
    assert!(
        waiter.last("result").is_none(),
        "{}",
        waiter.explain("the wait ended before the commit did")
    );

    tasks.done(&id, Some("sha256:00".into()));
    let end = waiter
        .wait(
            Duration::from_secs(30),
            "result",
            "the waiter's result",
            |_| true,
        )
        .await;
    assert_eq!(end["result"], "done", "{end}");
    watch
        .wait(
            Duration::from_secs(30),
            "snapshot",
            "the commit ready",
            |s| s["commit_status"][&k] == "ready",
        )
        .await;

    // A push that fails while a manager waits.
    let id = tasks.start_push("127.0.0.1:1/kv/sc:1");
    let waiter = Script::start(
        &dir,
        &[
            "--wait-bgtask".into(),
            id.clone(),
            "--redis-port".into(),
            redis.port.to_string(),
        ],
        fx.dir.path().join("wait2.stderr"),
    );
    waiter
        .wait(
            Duration::from_secs(60),
            "ready",
            "the waiter subscribed",
            |_| true,
        )
        .await;
    tasks.failed(&id, "RegistryUnreachable", "connection refused".into());
    let end = waiter
        .wait(
            Duration::from_secs(30),
            "result",
            "the waiter's result",
            |_| true,
        )
        .await;
    assert_eq!(end["result"], "failed", "{end}");
    assert!(
        end["message"]
            .as_str()
            .unwrap_or_default()
            .contains("RegistryUnreachable('connection refused')"),
        "{end}"
    );
    agent
        .shutdown(kernelvisor::config::OnShutdown::Terminate)
        .await;
}

#[actix_rt::test]
async fn a_stalled_valkey_holds_up_neither_the_agent_nor_the_other_channels() {
    let Some(_root) = bai_root("bai_sidechannels::a_stalled_valkey") else {
        return;
    };
    let redis = Redis::start();
    let fx = AgentFixture::new("bai-sc-stall", 37_530, 4);
    let agent = dummy_agent(&fx, redis.port).await;
    let peer = common::agent::client(agent.endpoint()).await;
    // Valkey neither reads nor answers for 10 s (`DEBUG SLEEP`, from a thread).
    let stalled = redis.stall(Duration::from_secs(10));
    // Meanwhile tasks start and end and a kernel is created: nothing waits for Valkey, so all
    // of it is done before the stall ends.
    let tasks = agent.ctx.bgtasks.clone();
    for _ in 0..20 {
        let id = tasks.start_push("kv/sc:1");
        tasks.done(&id, None);
    }
    let kernel = uuid::Uuid::new_v4().to_string();
    create_one(
        &peer,
        "s-stall",
        &kernel,
        kernel_config("0.1", 32 << 20, vec![]),
    )
    .await
    .unwrap();
    let pong = call(&peer, "ping", vec!["x".into()]).await.unwrap();
    assert_eq!(pong.as_str(), Some("x"));
    assert!(
        !stalled.is_finished(),
        "the agent answered only once Valkey answered again"
    );
    while !stalled.is_finished() {
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
    stalled.join().unwrap();
    // Once it answers again, what happened meanwhile is told: the kernel's presence, and the
    // end of every task.
    let live = redis::Client::open(format!("redis://127.0.0.1:{}/2", redis.port)).unwrap();
    let streams = redis::Client::open(format!("redis://127.0.0.1:{}/4", redis.port)).unwrap();
    let start = Instant::now();
    loop {
        let mut con = live.get_multiplexed_async_connection().await.unwrap();
        let present: bool = redis::cmd("EXISTS")
            .arg(format!("kernel:presence:{kernel}"))
            .query_async(&mut con)
            .await
            .unwrap();
        let mut con = streams.get_multiplexed_async_connection().await.unwrap();
        let cached: Vec<String> = redis::cmd("KEYS")
            .arg("bgtask.*")
            .query_async(&mut con)
            .await
            .unwrap();
        let mut ends = 0;
        for key in &cached {
            let v: String = redis::cmd("GET")
                .arg(key)
                .query_async(&mut con)
                .await
                .unwrap();
            if v.contains("bgtask_done") {
                ends += 1;
            }
        }
        if present && ends == 20 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "60 s after the stall: presence {present}, {ends} of 20 task ends cached"
        );
        actix_rt::time::sleep(Duration::from_millis(200)).await;
    }
    peer.close();
    agent
        .shutdown(kernelvisor::config::OnShutdown::Terminate)
        .await;
}

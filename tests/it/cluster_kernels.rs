//! Cluster sessions on one agent, as Backend.AI 26.9.6 starts them: the real manager's
//! `SessionLauncher` (its `create_local_network`, its `ClusterInfo` with the session's RSA keypair,
//! one `create_kernels` for every kernel) drives a kernelvisor agent process through the real
//! `AgentClient` (CURVE, callosum), on the real Docker engine, with Backend.AI's own kernel runner
//! in each kernel (`tests/bai_compat/cluster.py`, run in the trixie root as
//! `tests/it/bai_compat.rs` runs its driver). What the agent does with the `ClusterInfo` is
//! `src/agent/kernel/cluster.rs`.
//!
//! - `a_two_kernel_cluster_joins_its_network_and_survives_a_restart`: `main1` and `sub1` of
//!   `kernelvisor-test-py:latest` on the session's bridge network with their hostnames as aliases
//!   (`docker inspect`), the cluster keys in each scratch's `config/ssh` (mode, owner, the
//!   launcher's public key) and `cluster.json`, the image's service port (`hello`) published by
//!   `main1` only; the agent process killed and started again, then `restart_kernel` of `sub1`,
//!   plain and with an updated `environ` (a new container, made from the cluster config the agent
//!   kept in its store), keeps its network and alias (and `main1` resolves it);
//!   destroying every kernel and the network leaves nothing; a `create_kernels` naming the gone
//!   network is refused with `ContainerCreationFailedError`.
//! - `three_kernels_reach_each_other_by_name_and_ssh`: `main1`, `sub1`, `sub2` of
//!   `kernelvisor-test-py:ssh` (`just test-image-py-ssh`): from `main1`, `getent hosts sub2`
//!   resolves, `ssh -o BatchMode=yes sub1 hostname` prints `sub1` (the runner's dropbear on 2200,
//!   the cluster key, the runner's `~/.ssh/config`), the launcher's `BACKENDAI_CLUSTER_*` are in
//!   the runner's environment; then nothing is left. Each step is a batch-mode `exec`: a query
//!   fails for the kernel's life once a loaded machine keeps the runner's Jupyter kernel from
//!   being ready in 10 s.
//!
//! - `a_host_network_cluster_reaches_its_peers_by_the_assigned_ports`: network type HOST, two
//!   kernels of `kernelvisor-test-py:ssh`: the launcher's `assign_port` per kernel, both
//!   containers on the host's network with the launcher's `node-<kernel id>` names in their
//!   `/etc/hosts`, `port-mapping.json` in place, and `ssh node-<sub1's id> hostname` from `main1`
//!   prints `sub1` (its runner's sshd on the assigned host port).
//!
//! - `an_adopted_dangling_cluster_kernel_rejoins_its_network`: kernelvisor's own client, two
//!   process-path kernels of a bridge network, the agent killed and its store deleted: adopted,
//!   `sub1` restarted with an updated config joins the network under its alias again (the
//!   `cluster.json` its creation left in the scratch), and `main1` reaches it by name.
//!
//! The Backend.AI tests are skipped (said on stderr) without `KV_BAI_ROOT` or `KV_KRUNNER_DIR`,
//! as `bai_compat` is. Agent host ports (before the harness' shift): 38000–38031, 38040–38071,
//! 38080–38111, 38120–38127.

use crate::bai_compat::{bai_root, image_facts, run_driver, start_agent, BaiAgent, PY_IMAGE};
use crate::common;

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use common::agent::{docker, run_id, spawn_agent_process};
use common::bai::{is_root, tail, wait_for_port, KillOnDrop, RemoveOnDrop};

/// The Python kernel image with an ssh client (`just test-image-py-ssh`).
const SSH_IMAGE: &str = "kernelvisor-test-py:ssh";

/// The kernel's uid and gid (the agent's `[container] kernel-uid` / `kernel-gid` defaults),
/// who must own its cluster keys.
const KERNEL_UID: u32 = 1000;

/// Removes a Docker network on drop (a failed run's; `destroy_local_network` removes it
/// otherwise).
struct RemoveNetwork(Option<String>);

impl Drop for RemoveNetwork {
    fn drop(&mut self) {
        if let Some(n) = self.0.take() {
            let _ = Command::new("docker").args(["network", "rm", &n]).output();
        }
    }
}

/// The driver and the manager's key files in a directory of the root.
fn driver_files(root: &Path, agent: &BaiAgent) -> (String, RemoveOnDrop) {
    let inner = format!("/tmp/kv-cluster-{}", run_id());
    let host = root.join(inner.trim_start_matches('/'));
    std::fs::create_dir_all(&host).unwrap();
    let guard = RemoveOnDrop(host.clone());
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/bai_compat/cluster.py"),
        host.join("cluster.py"),
    )
    .unwrap();
    for f in ["manager.key", "manager.key_secret", "agent.key"] {
        std::fs::copy(agent.fx.dir.path().join(f), host.join(f)).unwrap();
    }
    (inner, guard)
}

fn driver_command(root: &Path, inner: &str, agent: &BaiAgent, image: &str) -> Command {
    let (digest, labels) = image_facts(image, "just test-image-py-ssh");
    let mut cmd = if is_root() {
        Command::new("chroot")
    } else {
        let mut c = Command::new("sudo");
        c.args(["-n", "chroot"]);
        c
    };
    cmd.arg(root)
        .arg("/opt/bai/bin/python")
        .arg(format!("{inner}/cluster.py"))
        .args(["--addr", &format!("tcp://127.0.0.1:{}", agent.fx.rpc_port)])
        .args(["--agent-id", &agent.fx.agent_id])
        .args(["--manager-keypair", &format!("{inner}/manager.key_secret")])
        .args(["--agent-public-key", &format!("{inner}/agent.key")])
        .args(["--image", image, "--image-digest", &digest])
        .args(["--image-labels", &labels])
        .env("PYTHONUNBUFFERED", "1");
    cmd
}

/// The one container labelled as kernel `kernel_id`.
fn container_of(kernel_id: &str) -> Result<String, String> {
    let ids = docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=ai.backend.kernel-id={kernel_id}"),
    ]);
    match ids.lines().collect::<Vec<_>>().as_slice() {
        [one] => Ok((*one).to_owned()),
        other => Err(format!("kernel {kernel_id} has containers {other:?}")),
    }
}

fn inspect_json(cid: &str, format: &str) -> serde_json::Value {
    serde_json::from_str(&docker(&["inspect", "-f", format, cid])).unwrap_or_default()
}

/// What is wrong with kernel `hostname`'s container on `network`: not attached there by
/// `NetworkMode` with its hostname as alias, another hostname.
fn network_problems(cid: &str, hostname: &str, network: &str) -> Vec<String> {
    let mut problems = Vec::new();
    let mode = docker(&["inspect", "-f", "{{.HostConfig.NetworkMode}}", cid]);
    if mode != network {
        problems.push(format!("{hostname}: NetworkMode {mode}, want {network}"));
    }
    let nets = inspect_json(cid, "{{json .NetworkSettings.Networks}}");
    let aliases = &nets[network]["Aliases"];
    if !aliases
        .as_array()
        .is_some_and(|a| a.iter().any(|x| x == hostname))
    {
        problems.push(format!(
            "{hostname}: on networks {:?}, aliases there {aliases}",
            nets.as_object().map(|o| o.keys().collect::<Vec<_>>())
        ));
    }
    let name = docker(&["inspect", "-f", "{{.Config.Hostname}}", cid]);
    if name != hostname {
        problems.push(format!("{hostname}: container hostname {name}"));
    }
    problems
}

/// What is wrong with a host-network kernel's container: not on the host's network, its
/// hostname, its `/etc/hosts` entries (`ExtraHosts`) other than `want_hosts`.
fn host_network_problems(cid: &str, hostname: &str, want_hosts: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let mode = docker(&["inspect", "-f", "{{.HostConfig.NetworkMode}}", cid]);
    if mode != "host" {
        problems.push(format!("{hostname}: NetworkMode {mode}, want host"));
    }
    let mut extra: Vec<String> =
        serde_json::from_value(inspect_json(cid, "{{json .HostConfig.ExtraHosts}}"))
            .unwrap_or_default();
    extra.sort();
    if extra != want_hosts {
        problems.push(format!(
            "{hostname}: ExtraHosts {extra:?}, want {want_hosts:?}"
        ));
    }
    let name = docker(&["inspect", "-f", "{{.Config.Hostname}}", cid]);
    if name != hostname {
        problems.push(format!("{hostname}: container hostname {name}"));
    }
    problems
}

/// What is wrong with kernel `kernel_id`'s cluster files in its scratch (`config/ssh/`,
/// `config/cluster.json` of network mode bridge, or host when `host_mode`).
fn key_problems(
    scratch_root: &Path,
    kernel_id: &str,
    public_key: &str,
    host_mode: bool,
) -> Vec<String> {
    let config = scratch_root.join(kernel_id).join("config");
    let mut problems = Vec::new();
    for (file, mode, owner) in [
        ("ssh/id_cluster", 0o600, KERNEL_UID),
        ("ssh/id_cluster.pub", 0o644, KERNEL_UID),
        ("cluster.json", 0o600, 0),
    ] {
        match std::fs::metadata(config.join(file)) {
            Err(e) => problems.push(format!("{kernel_id}: {file}: {e}")),
            Ok(m) => {
                let got = m.permissions().mode() & 0o777;
                if got != mode || m.uid() != owner || m.gid() != owner {
                    problems.push(format!(
                        "{kernel_id}: {file} is {got:o} {}:{}, want {mode:o} {owner}:{owner}",
                        m.uid(),
                        m.gid()
                    ));
                }
            }
        }
    }
    let public = std::fs::read_to_string(config.join("ssh/id_cluster.pub")).unwrap_or_default();
    if public.trim() != public_key.trim() || public_key.trim().is_empty() {
        problems.push(format!(
            "{kernel_id}: id_cluster.pub is {public:?}, not the launcher's key"
        ));
    }
    let private = std::fs::read_to_string(config.join("ssh/id_cluster")).unwrap_or_default();
    if !private.contains("PRIVATE KEY") {
        problems.push(format!("{kernel_id}: id_cluster is not a private key"));
    }
    let stored: serde_json::Value = std::fs::read(config.join("cluster.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let mode = if host_mode { "host" } else { "bridge" };
    if stored["network_config"]["mode"] != mode || stored["ssh_keypair"].is_null() {
        problems.push(format!("{kernel_id}: cluster.json is {stored}"));
    }
    problems
}

/// Host ports container `cid` publishes, by container port (`8090/tcp` → …).
fn published(cid: &str) -> Vec<String> {
    let bindings = inspect_json(cid, "{{json .HostConfig.PortBindings}}");
    let mut ports: Vec<String> = bindings
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    ports.sort();
    ports
}

/// The checks of the driver's `created` pause: every kernel on `network` with its alias, its
/// keys in place, and the image's service port published by main1 only.
fn check_created(
    scratch_root: &Path,
    pause: &serde_json::Value,
    containers: &mut BTreeMap<String, String>,
) -> Vec<String> {
    let network = pause["network"].as_str().unwrap_or_default();
    let public_key = pause["public_key"].as_str().unwrap_or_default();
    let host_mode = pause["mode"] == "host";
    let mut problems = Vec::new();
    if !host_mode {
        let labels = docker(&["network", "inspect", "-f", "{{json .Labels}}", network]);
        if !labels.contains("\"ai.backend.cluster-network\":\"1\"") {
            problems.push(format!("network {network}: labels {labels:?}"));
        }
    }
    // Host mode: every kernel's /etc/hosts names every peer as the launcher's mapping does.
    let mut want_hosts: Vec<String> = pause["port_mapping"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(h, to)| format!("{h}:{}", to[0].as_str().unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    want_hosts.sort();
    let kernels = pause["kernels"].as_object().cloned().unwrap_or_default();
    for (hostname, kid) in &kernels {
        let kid = kid.as_str().unwrap_or_default();
        let cid = match container_of(kid) {
            Ok(c) => c,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        containers.insert(hostname.clone(), cid.clone());
        problems.extend(key_problems(scratch_root, kid, public_key, host_mode));
        if host_mode {
            problems.extend(host_network_problems(&cid, hostname, &want_hosts));
            let mapping = scratch_root.join(kid).join("config/ssh/port-mapping.json");
            if !mapping.exists() || want_hosts.len() != kernels.len() {
                problems.push(format!(
                    "{hostname}: port-mapping.json {}, mapping {want_hosts:?}",
                    if mapping.exists() { "there" } else { "missing" }
                ));
            }
            continue;
        }
        problems.extend(network_problems(&cid, hostname, network));
        let ports = published(&cid);
        // The runner's intrinsic ports on every kernel; the image's `hello` (8090) on main1 only.
        for intrinsic in ["2200/tcp", "7681/tcp"] {
            if !ports.iter().any(|p| p == intrinsic) {
                problems.push(format!("{hostname}: {intrinsic} not published: {ports:?}"));
            }
        }
        let hello = ports.iter().any(|p| p == "8090/tcp");
        if hello != (hostname == "main1") {
            problems.push(format!("{hostname}: publishes {ports:?}"));
        }
    }
    if kernels.is_empty() {
        problems.push(format!("the pause names no kernels: {pause}"));
    }
    problems
}

/// Runs the driver with `flags` on `image`, answering its pauses with the engine's state;
/// returns its steps (panics with the logs when a step or a check failed).
fn run_cluster(test: &str, lo: u16, image: &str, flags: &[&str]) -> Vec<serde_json::Value> {
    let Some(root) = bai_root(test) else {
        return Vec::new();
    };
    let Ok(krunner) = std::env::var("KV_KRUNNER_DIR") else {
        eprintln!("SKIPPED {test}: KV_KRUNNER_DIR is not set (`just test-all` sets it after `just krunner`)");
        return Vec::new();
    };
    let mut agent = start_agent(
        test,
        lo,
        32,
        &format!("\n[kernel-runner]\ndir = \"{krunner}\"\nmode = \"auto\"\ninit-timeout = 60\n"),
    );
    let (inner, _files) = driver_files(&root, &agent);
    let mut cmd = driver_command(&root, &inner, &agent, image);
    cmd.args(flags);
    let scratch_root: PathBuf = agent.fx.scratch_root();
    let mut network = RemoveNetwork(None);
    let mut containers: BTreeMap<String, String> = BTreeMap::new();
    let run = run_driver(
        cmd,
        agent.fx.dir.path().join("driver.stderr"),
        |v, stdin| {
            let problems = match v["pause"].as_str() {
                Some("restart_agent") => {
                    // A crash: the kernels stay; the agent finds them in its store again.
                    let _ = agent.process.0.kill();
                    let _ = agent.process.0.wait();
                    agent.process = KillOnDrop(spawn_agent_process(
                        &agent.fx,
                        &agent.fx.dir.path().join("agent.toml"),
                    ));
                    wait_for_port(agent.fx.rpc_port, &mut agent.process.0, &agent.log);
                    Vec::new()
                }
                Some("created") => {
                    network.0 = v["network"].as_str().map(str::to_owned);
                    check_created(&scratch_root, v, &mut containers)
                }
                Some("restarted") => {
                    let kid = v["kernel_id"].as_str().unwrap_or_default();
                    let net = network.0.clone().unwrap_or_default();
                    match container_of(kid) {
                        Err(e) => vec![e],
                        Ok(cid) => {
                            let mut p = network_problems(&cid, "sub1", &net);
                            // The updated config's container is a new one, made from the stored
                            // cluster config.
                            if containers.get("sub1") == Some(&cid) {
                                p.push(format!("sub1 kept its container {cid} over the update"));
                            }
                            let env = docker(&["inspect", "-f", "{{json .Config.Env}}", &cid]);
                            if !env.contains("\"KV_RESTARTED=1\"") {
                                p.push(format!("sub1's new container lacks the update: {env}"));
                            }
                            p
                        }
                    }
                }
                Some("destroyed") => {
                    let mut p = Vec::new();
                    let sid = v["session_id"].as_str().unwrap_or_default();
                    let left = docker(&[
                        "ps",
                        "-aq",
                        "--filter",
                        &format!("label=ai.backend.session-id={sid}"),
                    ]);
                    if !left.is_empty() {
                        p.push(format!("containers left: {left}"));
                    }
                    // None in host mode: no network is the session's.
                    if let Some(net) = v["network"].as_str() {
                        let filter = format!("name=^{net}$");
                        if !docker(&["network", "ls", "-q", "--filter", &filter]).is_empty() {
                            p.push(format!("network {net} left"));
                        }
                    }
                    p
                }
                _ => return,
            };
            let answer = if problems.is_empty() {
                "ok".to_owned()
            } else {
                problems.join("; ").replace('\n', " ")
            };
            let _ = writeln!(stdin, "{answer}");
            let _ = stdin.flush();
        },
    );
    let reported = run.reported();
    let mut problems: Vec<String> = reported
        .iter()
        .filter(|v| v["ok"] != true)
        .map(|v| format!("{}: FAILED: {}", v["step"], v["error"]))
        .collect();
    if run.timed_out {
        problems.push("the driver did not finish in time".into());
    }
    if !run.status.success() {
        problems.push(format!("the driver exited with {}", run.status));
    }
    let BaiAgent {
        process,
        log,
        fx: _fx,
    } = agent;
    drop(process);
    assert!(
        problems.is_empty(),
        "{test}: {} problem(s):\n  {}\n\ndriver output:\n{}\n\ndriver stderr (tail):\n{}\n\nagent log (tail):\n{}",
        problems.len(),
        problems.join("\n  "),
        run.lines.join("\n"),
        tail(&common::agent::read(&run.stderr), 40),
        tail(&common::agent::read(&log), 80),
    );
    reported
}

/// The steps `steps` were all reported.
fn assert_reported(reported: &[serde_json::Value], steps: &[&str]) {
    for s in steps {
        assert!(
            reported.iter().any(|v| v["step"] == *s && v["ok"] == true),
            "step {s} not reported ok: {reported:?}"
        );
    }
}

#[test]
fn a_two_kernel_cluster_joins_its_network_and_survives_a_restart() {
    let reported = run_cluster(
        "cluster-bridge",
        38_000,
        PY_IMAGE,
        &["--kernels", "2", "--agent-restart", "--restart"],
    );
    if reported.is_empty() {
        return; // skipped
    }
    assert_reported(
        &reported,
        &[
            "create_session",
            "check_running",
            "host_created",
            "agent_restarted",
            "check_running_after_agent_restart",
            "restart_kernel",
            "restart_kernel_updated",
            "getent_after_restart",
            "host_restarted",
            "destroy_kernels",
            "destroy_local_network",
            "create_without_network",
            "host_destroyed",
        ],
    );
    // The launcher's cluster info, and the service ports as create_kernels answered them.
    let created = &reported
        .iter()
        .find(|v| v["step"] == "create_session")
        .unwrap()["value"];
    assert_eq!(created["cluster_info"]["replicas"]["sub"], 1, "{created}");
    let ports = &created["service_ports"];
    assert_eq!(
        ports["main1"],
        serde_json::json!(["hello", "sshd", "ttyd"]),
        "{created}"
    );
    assert_eq!(
        ports["sub1"],
        serde_json::json!(["sshd", "ttyd"]),
        "{created}"
    );
}

#[test]
fn a_host_network_cluster_reaches_its_peers_by_the_assigned_ports() {
    let reported = run_cluster(
        "cluster-host",
        38_080,
        SSH_IMAGE,
        &["--kernels", "2", "--ssh", "--host"],
    );
    if reported.is_empty() {
        return; // skipped
    }
    assert_reported(
        &reported,
        &[
            "create_session",
            "check_running",
            "host_created",
            "getent_hosts",
            "ssh_sub1",
            "cluster_env",
            "destroy_kernels",
            "host_destroyed",
        ],
    );
}

#[test]
fn three_kernels_reach_each_other_by_name_and_ssh() {
    let reported = run_cluster(
        "cluster-ssh",
        38_040,
        SSH_IMAGE,
        &["--kernels", "3", "--ssh"],
    );
    if reported.is_empty() {
        return; // skipped
    }
    assert_reported(
        &reported,
        &[
            "create_session",
            "check_running",
            "host_created",
            "getent_hosts",
            "ssh_sub1",
            "cluster_env",
            "destroy_kernels",
            "destroy_local_network",
            "host_destroyed",
        ],
    );
}

/// A dangling cluster kernel (its agent killed, its store lost) adopted again keeps its cluster:
/// the agent rebuilds it with the `cluster.json` its creation left in the scratch, so a
/// `restart_kernel` with an updated config (a new container) joins the session's network under
/// the same alias. kernelvisor's own client on the process path (`kernelvisor-test:latest`),
/// two kernels of a bridge network.
#[actix_rt::test]
async fn an_adopted_dangling_cluster_kernel_rejoins_its_network() {
    use common::agent::{call, client, field, kernel_config, map, AgentFixture};
    use rmpv::Value;
    const MIB: u64 = 1 << 20;

    let fx = AgentFixture::new("cluster-dangl", 38_120, 8);
    let spawn = || spawn_agent_process(&fx, &fx.write_config(""));
    let connect = || async {
        let endpoint = format!("tcp://127.0.0.1:{}", fx.rpc_port);
        for _ in 0..100 {
            let peer = client(&endpoint).await;
            if call(&peer, "ping", vec!["x".into()]).await.is_ok() {
                return peer;
            }
            peer.close();
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
        panic!(
            "the agent did not come up:\n{}",
            common::agent::read(&fx.dir.path().join("agent.log"))
        );
    };
    let agent = KillOnDrop(spawn());
    let peer = connect().await;
    let session = format!("s-{}", run_id());
    let net = format!("bai-singlenode-{session}");
    let _net = RemoveNetwork(Some(net.clone()));
    call(&peer, "create_local_network", vec![net.clone().into()])
        .await
        .unwrap();
    let (main, sub) = (format!("k1-{}", run_id()), format!("k2-{}", run_id()));
    let config = |role: &str, host: &str| {
        kernel_config(
            "0.25",
            32 * MIB,
            vec![
                ("cluster_role", role.into()),
                ("cluster_hostname", host.into()),
            ],
        )
    };
    let cluster_info = map(vec![
        ("mode", "single-node".into()),
        ("size", 2.into()),
        ("replicas", map(vec![("main", 1.into()), ("sub", 1.into())])),
        (
            "network_config",
            map(vec![
                ("mode", "bridge".into()),
                ("network_name", net.clone().into()),
            ]),
        ),
        (
            "ssh_keypair",
            map(vec![
                ("public_key", "ssh-rsa AAAA test@cluster".into()),
                (
                    "private_key",
                    "-----BEGIN RSA PRIVATE KEY-----\n-----END RSA PRIVATE KEY-----\n".into(),
                ),
            ]),
        ),
        ("cluster_ssh_port_mapping", Value::Nil),
    ]);
    let created = call(
        &peer,
        "create_kernels",
        vec![
            session.clone().into(),
            Value::Array(vec![main.clone().into(), sub.clone().into()]),
            Value::Array(vec![config("main", "main1"), config("sub", "sub1")]),
            cluster_info,
        ],
    )
    .await
    .unwrap();
    assert_eq!(created.as_array().map(Vec::len), Some(2), "{created:?}");
    let old_sub = container_of(&sub).unwrap();
    assert_eq!(
        network_problems(&old_sub, "sub1", &net),
        Vec::<String>::new()
    );
    assert!(fx
        .scratch_root()
        .join(&sub)
        .join("config/ssh/id_cluster")
        .exists());
    peer.close();

    // A crash and the store lost: the kernels are dangling, then adopted.
    drop(agent);
    for f in ["agent.db", "agent.db-wal", "agent.db-shm"] {
        let _ = std::fs::remove_file(fx.dir.path().join("var").join(f));
    }
    let _agent = KillOnDrop(spawn());
    let peer = connect().await;
    for k in [&main, &sub] {
        let adopted = call(&peer, "adopt_kernel", vec![k.clone().into()]).await;
        assert!(adopted.is_ok(), "adopt {k}: {adopted:?}");
    }

    // A new container for sub1 from the adopted config: on the network under its alias.
    let restarted = call(
        &peer,
        "restart_kernel",
        vec![
            session.clone().into(),
            sub.clone().into(),
            Value::Nil,
            map(vec![(
                "environ",
                map(vec![
                    ("BACKENDAI_ACCESS_KEY", "AKTEST".into()),
                    ("KV_RESTARTED", "1".into()),
                ]),
            )]),
        ],
    )
    .await
    .unwrap();
    let new_sub = field(&restarted, "container_id")
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(new_sub, old_sub, "a new container");
    assert_eq!(
        network_problems(&new_sub, "sub1", &net),
        Vec::<String>::new()
    );
    let main_cid = container_of(&main).unwrap();
    let ping = docker(&[
        "exec",
        &main_cid,
        "sh",
        "-c",
        "ping -c 1 -W 5 sub1 >/dev/null && echo reached",
    ]);
    assert_eq!(ping, "reached", "main1 reaches sub1 by its alias");

    for k in [&main, &sub] {
        call(
            &peer,
            "destroy_kernel",
            vec![k.clone().into(), session.clone().into()],
        )
        .await
        .unwrap();
    }
    call(&peer, "destroy_local_network", vec![net.clone().into()])
        .await
        .unwrap();
    assert!(docker(&["network", "ls", "-q", "--filter", &format!("name=^{net}$")]).is_empty());
}

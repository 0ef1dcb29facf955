//! `DockerBackend` against the real local Docker engine, with the local image
//! `kernelvisor-test:latest` (`just test-image`). Fails, never skips, when the engine is
//! unreachable. Every container carries `kernelvisor.test-run=<run id>` and is removed by a
//! guard, also when a test fails.

use crate::common::agent::free_port;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kernelvisor::agent::backend::docker::DockerBackend;
use kernelvisor::agent::backend::{
    BackendError, Bind, ContainerBackend, ContainerSpec, OutputStream, PortMapping,
};

const IMAGE: &str = "kernelvisor-test:latest";
const RUN_LABEL: &str = "kernelvisor.test-run";

/// A connected backend plus this test's run id; removes the run's containers when dropped.
struct Run {
    backend: DockerBackend,
    id: String,
}

impl Run {
    async fn new() -> Run {
        let backend = DockerBackend::connect().await.unwrap_or_else(|e| {
            panic!("no Docker engine answers ({e}); start one with `just docker`")
        });
        let image = backend.inspect_image(IMAGE).await.expect("inspect image");
        assert!(
            image.is_some(),
            "{IMAGE} is missing; build it with `just test-image`"
        );
        Run {
            backend,
            id: uuid::Uuid::new_v4().simple().to_string()[..12].to_owned(),
        }
    }

    fn spec(&self, name: &str) -> ContainerSpec {
        ContainerSpec {
            name: format!("kv-test-{}-{name}", self.id),
            image: IMAGE.to_owned(),
            labels: HashMap::from([(RUN_LABEL.to_owned(), self.id.clone())]),
            port_bind_host: "127.0.0.1".to_owned(),
            ..Default::default()
        }
    }

    async fn started(&self, spec: &ContainerSpec) -> String {
        let id = self.backend.create_container(spec).await.expect("create");
        self.backend.start_container(&id).await.expect("start");
        id
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let (backend, run) = (self.backend.clone(), self.id.clone());
        // Drop cannot await: clean up on a runtime of its own.
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                for c in backend
                    .list_containers(RUN_LABEL, &run)
                    .await
                    .unwrap_or_default()
                {
                    if let Err(e) = backend.remove_container(&c.id).await {
                        eprintln!("cleanup: cannot remove {}: {e}", c.id);
                    }
                }
            })
        });
        let _ = cleanup.join();
    }
}

fn sh(script: &str) -> Vec<String> {
    vec!["sh".into(), "-c".into(), script.into()]
}

/// What a finished (or killed) exec printed.
#[derive(Debug)]
struct ExecOutput {
    /// `None` when `timeout` killed it.
    exit_code: Option<i64>,
    /// (`"stdout"` | `"stderr"`, text) in arrival order.
    console: Vec<(&'static str, String)>,
}

/// Runs `cmd` through `exec_start`, reading its whole output (test-sized), killing it through
/// `exec_kill` after `timeout`; the exit code from `exec_status`.
async fn exec(
    b: &DockerBackend,
    id: &str,
    cmd: Vec<String>,
    timeout: Option<Duration>,
) -> Result<ExecOutput, BackendError> {
    let spec = kernelvisor::agent::backend::ExecSpec {
        cmd,
        ..Default::default()
    };
    let mut session = b.exec_start(id, spec).await?;
    let mut console = Vec::new();
    let read = async {
        while let Some(chunk) = session.output.next().await {
            let (stream, bytes) = chunk?;
            let name = if stream == OutputStream::Stdout {
                "stdout"
            } else {
                "stderr"
            };
            console.push((name, String::from_utf8_lossy(&bytes).into_owned()));
        }
        Ok::<_, BackendError>(())
    };
    let finished = match timeout {
        Some(t) => tokio::time::timeout(t, read).await.ok(),
        None => Some(read.await),
    };
    let exit_code = match finished {
        Some(r) => {
            r?;
            let mut status = b.exec_status(&session.exec_id).await?;
            for _ in 0..100 {
                if !status.running && status.exit_code.is_some() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
                status = b.exec_status(&session.exec_id).await?;
            }
            status.exit_code
        }
        None => {
            b.exec_kill(&session.exec_id).await?;
            None
        }
    };
    Ok(ExecOutput { exit_code, console })
}

#[tokio::test]
async fn lifecycle_limits_ports_binds_exec() {
    let run = Run::new().await;
    let b = &run.backend;
    let data = tempfile::tempdir().unwrap();
    std::fs::write(data.path().join("f"), "bound\n").unwrap();
    let port = PortMapping {
        container_port: 8080,
        host_port: free_port(),
    };
    let spec = ContainerSpec {
        memory_bytes: Some(64 << 20),
        nano_cpus: Some(500_000_000),
        pids_limit: Some(64),
        shm_size: Some(8 << 20),
        env: vec!["KV_GREETING=hello".into()],
        binds: vec![Bind {
            host_path: data.path().to_str().unwrap().to_owned(),
            container_path: "/mnt/data".into(),
            read_only: true,
        }],
        ports: vec![port],
        ..run.spec("life")
    };
    let id = b.create_container(&spec).await.expect("create");
    let state = b
        .inspect_container(&id)
        .await
        .unwrap()
        .expect("created container");
    assert!(!state.running && state.exit_code.is_none());

    b.start_container(&id).await.expect("start");
    b.start_container(&id)
        .await
        .expect("starting a running container is a no-op");
    let state = b.inspect_container(&id).await.unwrap().unwrap();
    assert!(state.running);
    assert_eq!(state.id, id);
    assert_eq!(state.labels[RUN_LABEL], run.id);
    assert_eq!(state.ports, spec.ports);

    // The engine's own view of the limits.
    let inspect = b.client().inspect_container(&id, None).await.unwrap();
    let host = inspect.host_config.unwrap();
    assert_eq!(host.memory, Some(64 << 20));
    assert_eq!(host.memory_swap, Some(64 << 20));
    assert_eq!(host.nano_cpus, Some(500_000_000));
    assert_eq!(host.pids_limit, Some(64));
    assert_eq!(host.shm_size, Some(8 << 20));
    assert_eq!(host.privileged, Some(false));
    assert!(host.device_requests.unwrap_or_default().is_empty());
    let bindings = &host.port_bindings.unwrap()["8080/tcp"];
    let binding = &bindings.as_ref().unwrap()[0];
    assert_eq!(binding.host_ip.as_deref(), Some("127.0.0.1"));
    assert_eq!(binding.host_port, Some(spec.ports[0].host_port.to_string()));
    assert!(inspect
        .config
        .unwrap()
        .exposed_ports
        .unwrap()
        .contains_key("8080/tcp"));

    let listed = b.list_containers(RUN_LABEL, &run.id).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].running && listed[0].id == id && listed[0].ports == spec.ports);

    // Exec: exit code, both streams, env, the read-only bind.
    let out = exec(b, &id, sh("echo hi; echo err >&2; exit 3"), None)
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(3));
    let text = |stream| {
        out.console
            .iter()
            .filter(|(s, _)| *s == stream)
            .map(|(_, t)| t.as_str())
            .collect::<String>()
    };
    assert_eq!(
        (text("stdout"), text("stderr")),
        ("hi\n".to_owned(), "err\n".to_owned())
    );
    let out = exec(
        b,
        &id,
        sh("echo $KV_GREETING; cat /mnt/data/f; touch /mnt/data/g"),
        None,
    )
    .await
    .unwrap();
    // The engine copies stdout and stderr on separate goroutines, so chunks of the two streams
    // may interleave in any order; compare each stream's whole text.
    let stdout: String = out
        .console
        .iter()
        .filter(|(s, _)| *s == "stdout")
        .map(|(_, t)| t.as_str())
        .collect();
    assert_eq!(stdout, "hello\nbound\n");
    assert_ne!(out.exit_code, Some(0), "the bind is read-only: {out:?}");

    // Exec timeout: killed, returned promptly, the process tree gone.
    let started = Instant::now();
    let out = exec(
        b,
        &id,
        sh("echo before; sleep 30; echo after"),
        Some(Duration::from_secs(1)),
    )
    .await
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(out.exit_code, None);
    assert_eq!(out.console, [("stdout", "before\n".to_owned())]);
    // The kill lands asynchronously: wait for the process tree to go.
    let ps = crate::common::settle(
        Duration::from_secs(10),
        || async {
            exec(b, &id, vec!["ps".into(), "-o".into(), "args".into()], None)
                .await
                .unwrap()
        },
        |ps| !ps.console.iter().any(|(_, t)| t.contains("sleep 30")),
    )
    .await;
    assert!(
        !ps.console.iter().any(|(_, t)| t.contains("sleep 30")),
        "left behind: {ps:?}"
    );

    // The main process (`sleep infinity`) printed nothing: the log stream has nothing to give.
    let mut logs = b.follow_logs(&id, 0);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), logs.next())
            .await
            .is_err(),
        "no output"
    );
    drop(logs);
    b.restart_container(&id, Duration::from_secs(1))
        .await
        .expect("restart");
    assert!(b.inspect_container(&id).await.unwrap().unwrap().running);

    b.remove_container(&id).await.expect("remove");
    assert!(b.inspect_container(&id).await.unwrap().is_none());
    b.remove_container(&id)
        .await
        .expect("removing a removed container is Ok");
}

#[tokio::test]
async fn signal_is_reported_as_exit() {
    let run = Run::new().await;
    let b = &run.backend;
    let mut exits = b.exits(RUN_LABEL, &run.id);
    let id = run.started(&run.spec("exit")).await;
    b.signal_container(&id, "SIGKILL").await.expect("signal");

    let exit = tokio::time::timeout(Duration::from_secs(10), exits.next())
        .await
        .expect("no exit event within 10 s")
        .expect("stream ended")
        .expect("stream error");
    assert_eq!(exit.container_id, id);
    assert_eq!(exit.labels[RUN_LABEL], run.id);
    assert_eq!(exit.labels["exitCode"], "137");
    assert!(!exit.oom, "a SIGKILL is no OOM");

    let state = b.inspect_container(&id).await.unwrap().unwrap();
    assert!(!state.running && state.exit_code == Some(137) && !state.oom_killed);
    let listed = b.list_containers(RUN_LABEL, &run.id).await.unwrap();
    assert_eq!((listed[0].running, listed[0].exit_code), (false, Some(137)));
    assert!(matches!(
        b.signal_container(&id, "SIGKILL").await,
        Err(BackendError::Engine(_))
    ));
}

/// The engine's `oom` event reaches the exit stream beside the `die` (the agent's second sign of
/// an OOM kill, for when the container's `OOMKilled` flag is missed).
#[tokio::test]
async fn an_oom_kill_is_reported_as_an_oom_event_and_an_exit() {
    let run = Run::new().await;
    let b = &run.backend;
    let mut exits = b.exits(RUN_LABEL, &run.id);
    let spec = ContainerSpec {
        memory_bytes: Some(16 << 20),
        cmd: Some(vec![
            "sh".into(),
            "-c".into(),
            "x=$(head -c 100000000 /dev/zero | tr '\\0' a)".into(),
        ]),
        ..run.spec("oom")
    };
    let id = run.started(&spec).await;
    let (mut oom, mut died) = (false, false);
    while !(oom && died) {
        let e = tokio::time::timeout(Duration::from_secs(30), exits.next())
            .await
            .expect("no oom and die events within 30 s")
            .expect("stream ended")
            .expect("stream error");
        assert_eq!(e.container_id, id);
        oom |= e.oom;
        died |= !e.oom;
    }
}

#[tokio::test]
async fn local_images_are_listed_with_their_tags_and_sizes() {
    let run = Run::new().await;
    let b = &run.backend;
    let inspected = b.inspect_image(IMAGE).await.unwrap().unwrap();
    let listed = b.list_images().await.unwrap();
    let ours = listed
        .iter()
        .find(|i| i.tags.iter().any(|t| t == IMAGE))
        .unwrap_or_else(|| panic!("{IMAGE} not listed: {listed:?}"));
    assert_eq!(ours.id, inspected.id);
    assert!(ours.size_bytes > 0, "{ours:?}");
    // The engine's placeholder for untagged images never shows.
    assert!(
        listed
            .iter()
            .flat_map(|i| &i.tags)
            .all(|t| !t.contains("<none>")),
        "{listed:?}"
    );
}

#[tokio::test]
async fn missing_things_are_classified() {
    let run = Run::new().await;
    let b = &run.backend;
    let image = b.inspect_image(IMAGE).await.unwrap().unwrap();
    assert!(image.id.starts_with("sha256:") && image.reference == IMAGE);
    assert!(b
        .inspect_image("kernelvisor-test:no-such-tag")
        .await
        .unwrap()
        .is_none());

    let ghost = format!("kv-test-{}-ghost", run.id);
    assert!(b.inspect_container(&ghost).await.unwrap().is_none());
    assert!(matches!(
        b.start_container(&ghost).await,
        Err(BackendError::ContainerNotFound(_))
    ));
    assert!(matches!(
        exec(b, &ghost, sh("true"), None).await,
        Err(BackendError::ContainerNotFound(_))
    ));
    b.remove_container(&ghost)
        .await
        .expect("removing a missing container is Ok");

    let spec = ContainerSpec {
        image: "kernelvisor-test:no-such-tag".into(),
        ..run.spec("noimage")
    };
    assert!(matches!(
        b.create_container(&spec).await,
        Err(BackendError::ImageNotFound(_))
    ));
    // A registry nobody listens on: unreachable, not a missing image.
    let pulled = b
        .pull_image("127.0.0.1:1/kernelvisor-none:1", None, &|_| {})
        .await;
    assert!(
        matches!(pulled, Err(BackendError::RegistryUnreachable(_))),
        "{pulled:?}"
    );
}

/// Removes a network on drop (the test's own, also when it fails).
struct NetworkGuard(String);

impl Drop for NetworkGuard {
    fn drop(&mut self) {
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &self.0])
            .output();
    }
}

/// A cluster kernel's attachment as the engine makes it (`ContainerSpec::network`,
/// `extra_hosts`): `NetworkMode` the named network, the alias and the endpoint's driver options
/// (an overlay kernel's `com.docker.network.endpoint.ifname`) on its endpoint, the
/// `/etc/hosts` entries; the network's subnet read back; a missing network refused as an
/// engine error, not as a missing image; the host's network with nothing published.
#[tokio::test]
async fn cluster_network_attachment_aliases_driver_opts_and_extra_hosts() {
    use kernelvisor::agent::backend::{NetworkAttachment, HOST_NETWORK};
    let run = Run::new().await;
    let b = &run.backend;
    let net = format!("kv-test-net-{}", run.id);
    let _guard = NetworkGuard(net.clone());
    assert!(b.create_network(&net, &HashMap::new()).await.unwrap());
    let subnet = b.network_subnet(&net).await.unwrap();
    assert!(
        subnet.as_deref().is_some_and(|s| s.contains('/')),
        "subnet {subnet:?}"
    );
    assert_eq!(b.network_subnet("kv-no-such-network").await.unwrap(), None);

    let spec = ContainerSpec {
        cmd: Some(vec!["sleep".into(), "60".into()]),
        hostname: Some("sub1".into()),
        network: Some(NetworkAttachment {
            mode: net.clone(),
            aliases: vec!["sub1".into()],
            driver_opts: HashMap::from([(
                "com.docker.network.endpoint.ifname".into(),
                "baimulti0".into(),
            )]),
        }),
        extra_hosts: vec!["node-a:10.1.2.3".into()],
        ports: vec![PortMapping {
            container_port: 8000,
            host_port: 0,
        }],
        ..run.spec("attached")
    };
    let id = run.started(&spec).await;
    assert_eq!(inspect_id(&id, "{{.HostConfig.NetworkMode}}"), net);
    let endpoint: serde_json::Value = serde_json::from_str(&inspect_id(
        &id,
        &format!("{{{{json (index .NetworkSettings.Networks \"{net}\")}}}}"),
    ))
    .unwrap();
    assert!(
        endpoint["Aliases"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "sub1")),
        "{endpoint}"
    );
    assert_eq!(
        endpoint["DriverOpts"]["com.docker.network.endpoint.ifname"], "baimulti0",
        "{endpoint}"
    );
    assert_eq!(
        inspect_id(&id, "{{json .HostConfig.ExtraHosts}}"),
        r#"["node-a:10.1.2.3"]"#
    );
    let state = b.inspect_container(&id).await.unwrap().unwrap();
    assert!(state.ip_address.is_some(), "an address on {net}");
    // Attached: the engine refuses to remove the network.
    assert!(b.remove_network(&net).await.is_err());
    b.remove_container(&id).await.unwrap();
    assert!(b.remove_network(&net).await.unwrap());

    // The network is gone: an engine error naming it (at the create, or at the start where the
    // engine checks it), not `ImageNotFound` nor `ContainerNotFound`.
    let missing = match b.create_container(&spec).await {
        Ok(id) => b.start_container(&id).await.map(|()| id),
        Err(e) => Err(e),
    };
    assert!(
        matches!(&missing, Err(BackendError::Engine(m)) if m.contains(&net)),
        "{missing:?}"
    );
    for c in b.list_containers(RUN_LABEL, &run.id).await.unwrap() {
        b.remove_container(&c.id).await.unwrap();
    }

    // The host's network: no endpoint, nothing published, the hosts entries still there.
    let spec = ContainerSpec {
        network: Some(NetworkAttachment {
            mode: HOST_NETWORK.into(),
            ..NetworkAttachment::default()
        }),
        ..spec
    };
    let id = run.started(&spec).await;
    assert_eq!(inspect_id(&id, "{{.HostConfig.NetworkMode}}"), "host");
    assert_eq!(inspect_id(&id, "{{json .HostConfig.PortBindings}}"), "{}");
    assert_eq!(
        inspect_id(&id, "{{json .HostConfig.ExtraHosts}}"),
        r#"["node-a:10.1.2.3"]"#
    );
}

/// `docker inspect -f format id`, trimmed.
fn inspect_id(id: &str, format: &str) -> String {
    let out = std::process::Command::new("docker")
        .args(["inspect", "-f", format, id])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

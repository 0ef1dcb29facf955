//! [`DockerBackend`]: the local Docker engine through bollard.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bollard::auth::DockerCredentials;
use bollard::container::{
    Config, CreateContainerOptions, DownloadFromContainerOptions, KillContainerOptions,
    ListContainersOptions, LogOutput, LogsOptions, RemoveContainerOptions, RestartContainerOptions,
    StartContainerOptions, UploadToContainerOptions,
};
use bollard::exec::{CreateExecOptions, ResizeExecOptions, StartExecOptions, StartExecResults};
use bollard::image::{CreateImageOptions, ListImagesOptions};
use bollard::models::{
    ContainerStateStatusEnum, DeviceMapping, DeviceRequest, HealthStatusEnum, HostConfig,
    PortBinding, PortMap, PortTypeEnum,
};
use bollard::system::EventsOptions;
use bollard::Docker;
use futures::stream::{BoxStream, StreamExt};

mod convert;
mod errors;
mod images;
mod process;

use self::convert::{listed_exit_code, port_mappings, summary, with_tag};
use self::errors::{
    archive_err, container_err, describe, engine, optional, pull_err, start_err, status,
};
use self::process::kill_tree;
use super::{
    BackendError, Bind, ContainerBackend, ContainerDescription, ContainerExit, ContainerSpec,
    ContainerState, ExecProcess, ExecSession, ExecSpec, ExecStatus, ImageInfo, ImageSummary,
    OutputStream, PortMapping, PullProgress, RegistryAuth, TtySize,
};

/// The bridge Docker puts every container on a Swarm overlay on as well (its way out to the
/// host and beyond); the only one of such a container's addresses the host reaches.
const GWBRIDGE: &str = "docker_gwbridge";

/// The local Docker engine (its default socket, `DOCKER_HOST`, or `[container] docker-host`),
/// API version negotiated.
#[derive(Clone, Debug)]
pub struct DockerBackend {
    docker: Docker,
}

/// Seconds a request may wait for the engine's response headers (bollard's own default).
/// Streamed bodies (logs, events, exec output, archives) are not bounded by it. A dead engine
/// fails a request at once (connection refused); a hung one is caught sooner by the
/// engine-health probe, whose ping waits 2 s.
const REQUEST_TIMEOUT_SECS: u64 = 120;

impl DockerBackend {
    /// The address of container `c` the host reaches: its default bridge's, else its
    /// `docker_gwbridge` one (a container on a Swarm overlay: the engine lists only the
    /// overlay in its networks, whose address lives in a namespace of its own, but gives it an
    /// interface on `docker_gwbridge` too, found in that network's containers), else its first
    /// network's by name. `None` when it has none.
    async fn host_reachable_ip(
        &self,
        c: &bollard::models::ContainerInspectResponse,
    ) -> Option<String> {
        let n = c.network_settings.as_ref()?;
        if let Some(ip) = n.ip_address.clone().filter(|a| !a.is_empty()) {
            return Some(ip);
        }
        let mut nets: Vec<_> = n.networks.as_ref()?.iter().collect();
        nets.sort_by_key(|(name, _)| name.as_str());
        if let (Some(id), Ok(gw)) = (
            c.id.as_deref(),
            self.docker.inspect_network::<String>(GWBRIDGE, None).await,
        ) {
            let ip = gw
                .containers
                .as_ref()
                .and_then(|cs| cs.get(id))
                .and_then(|e| e.ipv4_address.as_deref())
                .and_then(|a| a.split('/').next())
                .filter(|a| !a.is_empty());
            if let Some(ip) = ip {
                return Some(ip.to_owned());
            }
        }
        nets.into_iter()
            .filter_map(|(_, e)| e.ip_address.clone())
            .find(|a| !a.is_empty())
    }

    /// Connects to the local engine (the default socket, or `DOCKER_HOST`) and negotiates the
    /// API version with it.
    ///
    /// Errors: [`BackendError::Unavailable`] when no engine answers.
    pub async fn connect() -> Result<DockerBackend, BackendError> {
        DockerBackend::connect_to(None).await
    }

    /// Connects to the engine at `host` (`unix:///path/docker.sock`, or the socket's path),
    /// or the local default (`DOCKER_HOST` honoured) when `None`, and negotiates the API
    /// version with it.
    ///
    /// Errors: [`BackendError::Unavailable`] when no engine answers there; `Engine` for a
    /// `host` that is not a Unix socket.
    pub async fn connect_to(host: Option<&str>) -> Result<DockerBackend, BackendError> {
        let docker = match host {
            None => Docker::connect_with_local_defaults(),
            Some(h) if h.starts_with("unix://") || h.starts_with('/') => {
                Docker::connect_with_unix(h, REQUEST_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
            }
            Some(h) => {
                return Err(BackendError::Engine(format!(
                    "docker-host {h:?}: only unix:// sockets are supported"
                )))
            }
        }
        .map_err(engine)?;
        let docker = docker.negotiate_version().await.map_err(engine)?;
        Ok(DockerBackend { docker })
    }

    /// The bollard client, for what the trait does not cover.
    pub fn client(&self) -> &Docker {
        &self.docker
    }
}

/// `cmd` run in a terminal of `size` from its first instruction on. bollard's exec create
/// has no `ConsoleSize`, and a resize after the start comes too late for a process that reads
/// the size at once (`stty size` saw 0x0): a `sh` sets the size with `stty` (when the image has
/// it, else the resize that follows the start does) and `exec`s `cmd`.
fn sized_tty_cmd(size: TtySize, cmd: Vec<String>) -> Vec<String> {
    let mut argv = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        r#"stty rows "$1" cols "$2" 2>/dev/null; shift 2; exec "$@""#.to_owned(),
        "sh".to_owned(),
        size.rows.to_string(),
        size.cols.to_string(),
    ];
    argv.extend(cmd);
    argv
}

#[async_trait]
impl ContainerBackend for DockerBackend {
    fn kind(&self) -> &'static str {
        "docker"
    }

    async fn ping(&self, timeout: Duration) -> Result<(), BackendError> {
        match tokio::time::timeout(timeout, self.docker.ping()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(engine(e)),
            Err(_) => Err(BackendError::Unavailable(format!(
                "no answer to ping within {} ms",
                timeout.as_millis()
            ))),
        }
    }

    async fn inspect_image(&self, reference: &str) -> Result<Option<ImageInfo>, BackendError> {
        let image = optional(self.docker.inspect_image(reference).await).map_err(engine)?;
        Ok(image.map(|i| ImageInfo {
            id: i.id.unwrap_or_default(),
            reference: reference.to_owned(),
            labels: i.config.and_then(|c| c.labels).unwrap_or_default(),
        }))
    }

    async fn list_images(&self) -> Result<Vec<ImageSummary>, BackendError> {
        let options = ListImagesOptions::<String> {
            all: false,
            ..Default::default()
        };
        let images = self
            .docker
            .list_images(Some(options))
            .await
            .map_err(engine)?;
        Ok(images.into_iter().map(summary).collect())
    }

    async fn pull_image(
        &self,
        reference: &str,
        auth: Option<&RegistryAuth>,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<ImageInfo, BackendError> {
        let options = CreateImageOptions {
            from_image: with_tag(reference),
            ..Default::default()
        };
        let credentials = auth.map(|a| DockerCredentials {
            username: Some(a.username.clone()),
            password: Some(a.password.clone()),
            serveraddress: Some(a.server.clone()),
            ..DockerCredentials::default()
        });
        let mut pull = self.docker.create_image(Some(options), None, credentials);
        while let Some(item) = pull.next().await {
            match item {
                Ok(info) => progress(PullProgress {
                    layer: info.id.filter(|id| !id.is_empty() && !id.contains(':')),
                    status: info.status.unwrap_or_default(),
                    current: info.progress_detail.as_ref().and_then(|d| d.current),
                    total: info.progress_detail.and_then(|d| d.total),
                }),
                Err(e) => return Err(pull_err(reference, e)),
            }
        }
        self.inspect_image(reference)
            .await?
            .ok_or_else(|| BackendError::ImageNotFound(reference.to_owned()))
    }

    async fn create_container(&self, spec: &ContainerSpec) -> Result<String, BackendError> {
        let port_key = |p: &PortMapping| format!("{}/tcp", p.container_port);
        let loopback = "127.0.0.1".to_owned();
        let published = || {
            spec.ports
                .iter()
                .map(|p| (p, &spec.port_bind_host))
                .chain(spec.local_ports.iter().map(|p| (p, &loopback)))
        };
        // On the host's network a container publishes nothing: its ports are the host's.
        let host_network = spec
            .network
            .as_ref()
            .is_some_and(|n| n.mode == super::HOST_NETWORK);
        let port_bindings: PortMap = published()
            .filter(|_| !host_network)
            .map(|(p, host)| {
                let binding = PortBinding {
                    host_ip: Some(host.clone()),
                    host_port: Some(p.host_port.to_string()),
                };
                (port_key(p), Some(vec![binding]))
            })
            .collect();
        let device_requests = (!spec.gpu_device_ids.is_empty()).then(|| {
            vec![DeviceRequest {
                driver: Some("nvidia".to_owned()),
                device_ids: Some(spec.gpu_device_ids.clone()),
                capabilities: Some(vec![vec!["gpu".to_owned()]]),
                ..Default::default()
            }]
        });
        let binds = spec
            .binds
            .iter()
            .map(|b| {
                format!(
                    "{}:{}:{}",
                    b.host_path,
                    b.container_path,
                    if b.read_only { "ro" } else { "rw" }
                )
            })
            .collect();
        let host_config = HostConfig {
            memory: spec.memory_bytes,
            memory_swap: spec.memory_bytes,
            nano_cpus: spec.nano_cpus,
            pids_limit: spec.pids_limit,
            shm_size: spec.shm_size,
            binds: Some(binds),
            port_bindings: Some(port_bindings),
            device_requests,
            devices: (!spec.device_nodes.is_empty()).then(|| {
                spec.device_nodes
                    .iter()
                    .map(|d| DeviceMapping {
                        path_on_host: Some(d.clone()),
                        path_in_container: Some(d.clone()),
                        cgroup_permissions: Some("rwm".to_owned()),
                    })
                    .collect()
            }),
            privileged: Some(false),
            group_add: (!spec.group_add.is_empty()).then(|| spec.group_add.clone()),
            init: spec.init.then_some(true),
            cap_add: (!spec.cap_add.is_empty()).then(|| spec.cap_add.clone()),
            network_mode: spec.network.as_ref().map(|n| n.mode.clone()),
            extra_hosts: (!spec.extra_hosts.is_empty()).then(|| spec.extra_hosts.clone()),
            ..Default::default()
        };
        let networking_config = spec.network.as_ref().filter(|_| !host_network).map(|n| {
            bollard::container::NetworkingConfig {
                endpoints_config: HashMap::from([(
                    n.mode.clone(),
                    bollard::models::EndpointSettings {
                        aliases: (!n.aliases.is_empty()).then(|| n.aliases.clone()),
                        driver_opts: (!n.driver_opts.is_empty()).then(|| n.driver_opts.clone()),
                        ..Default::default()
                    },
                )]),
            }
        });
        let config = Config {
            image: Some(spec.image.clone()),
            cmd: spec.cmd.clone(),
            working_dir: spec.working_dir.clone(),
            user: spec.user.clone(),
            hostname: spec.hostname.clone(),
            env: Some(spec.env.clone()),
            labels: Some(spec.labels.clone()),
            exposed_ports: Some(
                published()
                    .filter(|_| !host_network)
                    .map(|(p, _)| (port_key(p), HashMap::new()))
                    .collect(),
            ),
            entrypoint: spec.entrypoint.clone(),
            stop_signal: spec.stop_signal.clone(),
            host_config: Some(host_config),
            networking_config,
            ..Default::default()
        };
        let options = (!spec.name.is_empty()).then(|| CreateContainerOptions {
            name: spec.name.clone(),
            platform: None,
        });
        match self.docker.create_container(options, config).await {
            Ok(created) => Ok(created.id),
            // The engine's 404 is also its answer for a missing network (`network x not
            // found`): only the image's is `ImageNotFound`.
            Err(e) if status(&e) == Some(404) && !describe(&e).contains("network") => {
                Err(BackendError::ImageNotFound(spec.image.clone()))
            }
            Err(e) => Err(engine(e)),
        }
    }

    async fn start_container(&self, id: &str) -> Result<(), BackendError> {
        self.docker
            .start_container(id, None::<StartContainerOptions<String>>)
            .await
            .map_err(start_err(id))
    }

    async fn inspect_container(&self, id: &str) -> Result<Option<ContainerState>, BackendError> {
        let Some(c) = optional(self.docker.inspect_container(id, None).await).map_err(engine)?
        else {
            return Ok(None);
        };
        let ip_address = self.host_reachable_ip(&c).await;
        let state = c.state.unwrap_or_default();
        let exited = matches!(
            state.status,
            Some(ContainerStateStatusEnum::EXITED | ContainerStateStatusEnum::DEAD)
        );
        Ok(Some(ContainerState {
            id: c.id.unwrap_or_else(|| id.to_owned()),
            running: state.running.unwrap_or(false) || state.restarting.unwrap_or(false),
            exit_code: if exited { state.exit_code } else { None },
            oom_killed: state.oom_killed.unwrap_or(false),
            labels: c.config.and_then(|c| c.labels).unwrap_or_default(),
            ports: port_mappings(c.network_settings.as_ref().and_then(|n| n.ports.clone())),
            pid: state.pid.filter(|&p| p > 0).map(|p| p as u32),
            health: state
                .health
                .as_ref()
                .and_then(|h| h.status)
                .filter(|s| !matches!(s, HealthStatusEnum::EMPTY | HealthStatusEnum::NONE))
                .map(|s| s.to_string()),
            ip_address,
        }))
    }

    async fn describe_container(
        &self,
        id: &str,
    ) -> Result<Option<ContainerDescription>, BackendError> {
        let Some(c) = optional(self.docker.inspect_container(id, None).await).map_err(engine)?
        else {
            return Ok(None);
        };
        let state = c.state.unwrap_or_default();
        let config = c.config.unwrap_or_default();
        let host = c.host_config.unwrap_or_default();
        let mut port_bind_host = String::new();
        let mut ports = Vec::new();
        for (key, bindings) in host.port_bindings.unwrap_or_default() {
            let Some(container_port) = key.strip_suffix("/tcp").and_then(|p| p.parse().ok()) else {
                continue;
            };
            for b in bindings.unwrap_or_default() {
                if let Some(host_port) = b.host_port.and_then(|p| p.parse().ok()) {
                    if let Some(ip) = b.host_ip.filter(|ip| !ip.is_empty()) {
                        port_bind_host = ip;
                    }
                    ports.push(PortMapping {
                        container_port,
                        host_port,
                    });
                }
            }
        }
        ports.sort_by_key(|p| (p.container_port, p.host_port));
        ports.dedup();
        let gpu_device_ids = host
            .device_requests
            .unwrap_or_default()
            .into_iter()
            .filter(|d| d.driver.as_deref() == Some("nvidia"))
            .flat_map(|d| d.device_ids.unwrap_or_default())
            .collect();
        let device_nodes = host
            .devices
            .unwrap_or_default()
            .into_iter()
            .filter_map(|d| d.path_on_host)
            .collect();
        let spec = ContainerSpec {
            name: c
                .name
                .unwrap_or_default()
                .trim_start_matches('/')
                .to_owned(),
            image: c.image.unwrap_or_default(),
            env: config.env.unwrap_or_default(),
            labels: config.labels.unwrap_or_default(),
            memory_bytes: host.memory.filter(|m| *m > 0),
            nano_cpus: host.nano_cpus.filter(|n| *n > 0),
            pids_limit: host.pids_limit.filter(|p| *p > 0),
            shm_size: host.shm_size,
            binds: host
                .binds
                .unwrap_or_default()
                .iter()
                .filter_map(|b| Bind::parse(b))
                .collect(),
            ports,
            port_bind_host,
            gpu_device_ids,
            device_nodes,
            cmd: config.cmd,
            working_dir: config.working_dir.filter(|w| !w.is_empty()),
            user: config.user.filter(|u| !u.is_empty()),
            group_add: host.group_add.unwrap_or_default(),
            // The engine's own is the id's first 12 characters: only one that was asked for.
            hostname: config.hostname.clone().filter(|h| {
                !h.is_empty() && !c.id.as_deref().unwrap_or(id).starts_with(h.as_str())
            }),
            entrypoint: config.entrypoint.filter(|e| !e.is_empty()),
            init: host.init.unwrap_or(false),
            stop_signal: config.stop_signal.filter(|s| !s.is_empty()),
            // Every published port is in `ports` (with the loopback ones): what adoption needs.
            local_ports: Vec::new(),
            cap_add: host.cap_add.unwrap_or_default(),
            network: None,
            extra_hosts: host.extra_hosts.unwrap_or_default(),
        };
        Ok(Some(ContainerDescription {
            id: c.id.unwrap_or_else(|| id.to_owned()),
            running: state.running.unwrap_or(false) || state.restarting.unwrap_or(false),
            spec,
        }))
    }

    async fn remove_container(&self, id: &str) -> Result<(), BackendError> {
        let options = RemoveContainerOptions {
            force: true,
            v: true,
            ..Default::default()
        };
        optional(self.docker.remove_container(id, Some(options)).await).map_err(engine)?;
        Ok(())
    }

    async fn restart_container(&self, id: &str, timeout: Duration) -> Result<(), BackendError> {
        let options = RestartContainerOptions {
            t: timeout.as_secs() as isize,
        };
        self.docker
            .restart_container(id, Some(options))
            .await
            .map_err(container_err(id))
    }

    async fn signal_container(&self, id: &str, signal: &str) -> Result<(), BackendError> {
        let options = KillContainerOptions { signal };
        self.docker
            .kill_container(id, Some(options))
            .await
            .map_err(container_err(id))
    }

    async fn list_containers(
        &self,
        key: &str,
        value: &str,
    ) -> Result<Vec<ContainerState>, BackendError> {
        let filters = HashMap::from([("label".to_owned(), vec![format!("{key}={value}")])]);
        let options = ListContainersOptions {
            all: true,
            filters,
            ..Default::default()
        };
        let listed = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(engine)?;
        Ok(listed
            .into_iter()
            .map(|c| {
                let state = c.state.unwrap_or_default();
                let mut ports: Vec<_> = c
                    .ports
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|p| p.typ == Some(PortTypeEnum::TCP))
                    .filter_map(|p| {
                        Some(PortMapping {
                            container_port: p.private_port,
                            host_port: p.public_port?,
                        })
                    })
                    .collect();
                ports.sort_by_key(|p| (p.container_port, p.host_port));
                ports.dedup();
                ContainerState {
                    id: c.id.unwrap_or_default(),
                    running: state == "running" || state == "restarting",
                    exit_code: c.status.as_deref().and_then(listed_exit_code),
                    oom_killed: false,
                    labels: c.labels.unwrap_or_default(),
                    ports,
                    pid: None,
                    ip_address: None,
                    health: None,
                }
            })
            .collect())
    }

    async fn exec_start(&self, id: &str, spec: ExecSpec) -> Result<ExecSession, BackendError> {
        let attach = !spec.detach;
        let tty = spec.tty.is_some();
        let cmd = match spec.tty {
            Some(size) => sized_tty_cmd(size, spec.cmd),
            None => spec.cmd,
        };
        let options = CreateExecOptions {
            cmd: Some(cmd),
            attach_stdin: Some(spec.stdin && attach),
            attach_stdout: Some(attach),
            attach_stderr: Some(attach),
            tty: Some(tty),
            working_dir: spec.working_dir,
            env: (!spec.env.is_empty()).then_some(spec.env),
            user: spec.user,
            ..Default::default()
        };
        let exec_id = self
            .docker
            .create_exec(id, options)
            .await
            .map_err(container_err(id))?
            .id;
        let start = StartExecOptions {
            detach: spec.detach,
            tty,
            output_capacity: None,
        };
        let started = self
            .docker
            .start_exec(&exec_id, Some(start))
            .await
            .map_err(engine)?;
        if let Some(size) = spec.tty {
            // Also from outside, for an image without `stty` (see `sized_tty_cmd`). Best effort:
            // a command may be done already ("cannot resize a stopped container").
            if let Err(e) = self.exec_resize(&exec_id, size).await {
                tracing::debug!(%exec_id, error = %e, "resizing a new terminal");
            }
        }
        match started {
            StartExecResults::Attached { output, input } => {
                let output = output
                    .filter_map(|chunk| {
                        futures::future::ready(match chunk {
                            Ok(LogOutput::StdErr { message }) => {
                                Some(Ok((OutputStream::Stderr, message)))
                            }
                            Ok(LogOutput::StdOut { message } | LogOutput::Console { message }) => {
                                Some(Ok((OutputStream::Stdout, message)))
                            }
                            Ok(LogOutput::StdIn { .. }) => None,
                            Err(e) => Some(Err(engine(e))),
                        })
                    })
                    .boxed();
                Ok(ExecSession {
                    exec_id,
                    output,
                    stdin: spec.stdin.then_some(input),
                })
            }
            StartExecResults::Detached if spec.detach => Ok(ExecSession {
                exec_id,
                output: futures::stream::empty().boxed(),
                stdin: None,
            }),
            StartExecResults::Detached => Err(BackendError::Engine(
                "the engine started the exec detached".into(),
            )),
        }
    }

    async fn exec_processes(&self, id: &str) -> Result<Vec<ExecProcess>, BackendError> {
        let c = self
            .docker
            .inspect_container(id, None)
            .await
            .map_err(container_err(id))?;
        let mut out = Vec::new();
        for exec_id in c.exec_ids.unwrap_or_default() {
            // An exec may be garbage-collected between the two calls: skip it.
            let Ok(info) = self.docker.inspect_exec(&exec_id).await else {
                continue;
            };
            let process = info.process_config.unwrap_or_default();
            let mut cmd: Vec<String> = process.entrypoint.into_iter().collect();
            cmd.extend(process.arguments.unwrap_or_default());
            out.push(ExecProcess {
                exec_id,
                running: info.running == Some(true),
                cmd,
            });
        }
        Ok(out)
    }

    fn archive_get(
        &self,
        id: &str,
        path: &str,
    ) -> BoxStream<'static, Result<bytes::Bytes, BackendError>> {
        let options = DownloadFromContainerOptions {
            path: path.to_owned(),
        };
        let to_err = archive_err(id, path);
        self.docker
            .download_from_container(id, Some(options))
            .map(move |r| r.map_err(&to_err))
            .boxed()
    }

    async fn archive_put(
        &self,
        id: &str,
        dir: &str,
        tar: BoxStream<'static, bytes::Bytes>,
    ) -> Result<(), BackendError> {
        let options = UploadToContainerOptions {
            path: dir,
            no_overwrite_dir_non_dir: "true",
        };
        self.docker
            .upload_to_container_streaming(id, Some(options), tar)
            .await
            .map_err(archive_err(id, dir))
    }

    async fn exec_status(&self, exec_id: &str) -> Result<ExecStatus, BackendError> {
        let info = self.docker.inspect_exec(exec_id).await.map_err(engine)?;
        let running = info.running == Some(true);
        Ok(ExecStatus {
            running,
            exit_code: if running { None } else { info.exit_code },
        })
    }

    async fn exec_kill(&self, exec_id: &str) -> Result<(), BackendError> {
        let info = self.docker.inspect_exec(exec_id).await.map_err(engine)?;
        if let Some(pid) = info.pid.filter(|&p| p > 0 && info.running == Some(true)) {
            kill_tree(pid as i32);
        }
        Ok(())
    }

    async fn exec_resize(&self, exec_id: &str, size: TtySize) -> Result<(), BackendError> {
        let options = ResizeExecOptions {
            height: size.rows,
            width: size.cols,
        };
        self.docker
            .resize_exec(exec_id, options)
            .await
            .map_err(engine)
    }

    fn follow_logs(
        &self,
        id: &str,
        since: i64,
    ) -> BoxStream<'static, Result<bytes::Bytes, BackendError>> {
        let options = LogsOptions::<String> {
            follow: true,
            stdout: true,
            stderr: true,
            since,
            ..Default::default()
        };
        let id = id.to_owned();
        self.docker
            .logs(&id, Some(options))
            .map(move |chunk| chunk.map(LogOutput::into_bytes).map_err(container_err(&id)))
            .boxed()
    }

    async fn inspect_network(
        &self,
        name: &str,
    ) -> Result<Option<HashMap<String, String>>, BackendError> {
        let found =
            optional(self.docker.inspect_network::<String>(name, None).await).map_err(engine)?;
        // The engine also matches an id prefix: only the network of exactly that name counts.
        Ok(found
            .filter(|n| n.name.as_deref() == Some(name))
            .map(|n| n.labels.unwrap_or_default()))
    }

    async fn create_network(
        &self,
        name: &str,
        labels: &HashMap<String, String>,
    ) -> Result<bool, BackendError> {
        if self.inspect_network(name).await?.is_some() {
            return Ok(false);
        }
        let options = bollard::network::CreateNetworkOptions {
            name: name.to_owned(),
            check_duplicate: true,
            driver: "bridge".to_owned(),
            labels: labels.clone(),
            ..Default::default()
        };
        match self.docker.create_network(options).await {
            Ok(_) => Ok(true),
            // Created meanwhile by a concurrent call.
            Err(e) if status(&e) == Some(409) => Ok(false),
            Err(e) => Err(engine(e)),
        }
    }

    async fn network_subnet(&self, name: &str) -> Result<Option<String>, BackendError> {
        let found =
            optional(self.docker.inspect_network::<String>(name, None).await).map_err(engine)?;
        Ok(found
            .filter(|n| n.name.as_deref() == Some(name))
            .and_then(|n| n.ipam)
            .and_then(|i| i.config)
            .and_then(|c| c.into_iter().find_map(|c| c.subnet)))
    }

    async fn remove_network(&self, name: &str) -> Result<bool, BackendError> {
        match self.docker.remove_network(name).await {
            Ok(()) => Ok(true),
            Err(e) if status(&e) == Some(404) => Ok(false),
            Err(e) => Err(engine(e)),
        }
    }

    async fn remove_image(
        &self,
        reference: &str,
        force: bool,
        noprune: bool,
    ) -> Result<Vec<String>, BackendError> {
        images::remove_image(&self.docker, reference, force, noprune).await
    }

    async fn commit_container(
        &self,
        id: &str,
        reference: &str,
        labels: &HashMap<String, String>,
    ) -> Result<ImageInfo, BackendError> {
        images::commit_container(&self.docker, id, reference, labels).await
    }

    async fn push_image(
        &self,
        reference: &str,
        auth: Option<&RegistryAuth>,
        progress: &(dyn Fn(PullProgress) + Send + Sync),
    ) -> Result<(), BackendError> {
        images::push_image(&self.docker, reference, auth, progress).await
    }

    async fn stats(&self, id: &str) -> Result<Option<super::EngineStats>, BackendError> {
        use bollard::container::{MemoryStatsStats, StatsOptions};
        let options = StatsOptions {
            stream: false,
            one_shot: true,
        };
        let mut stream = self.docker.stats(id, Some(options));
        let Some(stats) = optional(stream.next().await.transpose())
            .map_err(engine)?
            .flatten()
        else {
            return Ok(None);
        };
        let m = &stats.memory_stats;
        // The stats API does not report swap (bollard has no field for it).
        let (rss, cache, swap, inactive) = match m.stats {
            Some(MemoryStatsStats::V1(v1)) => {
                (v1.total_rss, v1.total_cache, 0, v1.total_inactive_file)
            }
            Some(MemoryStatsStats::V2(v2)) => (v2.anon, v2.file, 0, v2.inactive_file),
            None => (0, 0, 0, 0),
        };
        let io = |op: &str| {
            stats
                .blkio_stats
                .io_service_bytes_recursive
                .iter()
                .flatten()
                .filter(|e| e.op.eq_ignore_ascii_case(op))
                .map(|e| e.value)
                .sum()
        };
        let (rx, tx) = stats
            .networks
            .iter()
            .flatten()
            .filter(|(name, _)| name.as_str() != "lo")
            .fold((0, 0), |(rx, tx), (_, n)| {
                (rx + n.rx_bytes, tx + n.tx_bytes)
            });
        Ok(Some(super::EngineStats {
            cgroup: crate::agent::stats::cgroup::ContainerSample {
                cpu_used_ns: stats.cpu_stats.cpu_usage.total_usage,
                mem_usage_bytes: m.usage.unwrap_or(0).saturating_sub(inactive),
                mem_rss_bytes: rss,
                mem_cache_bytes: cache,
                mem_swap_bytes: swap,
                mem_limit_bytes: m.limit.filter(|&l| l < 1 << 62),
                io_read_bytes: io("read"),
                io_write_bytes: io("write"),
            },
            net_rx_bytes: rx,
            net_tx_bytes: tx,
        }))
    }

    /// The engine's `die` events from the moment of this call (replayed from then when the
    /// stream is first polled later), each with the container's attributes as `labels`: its
    /// labels plus the engine's `exitCode`, `image` and `name`. Ends after the first error.
    fn exits(
        &self,
        key: &str,
        value: &str,
    ) -> BoxStream<'static, Result<ContainerExit, BackendError>> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let filters = HashMap::from([
            ("type".to_owned(), vec!["container".to_owned()]),
            ("event".to_owned(), vec!["die".to_owned(), "oom".to_owned()]),
            ("label".to_owned(), vec![format!("{key}={value}")]),
        ]);
        let options = EventsOptions {
            since: Some(format!("{}.{:09}", now.as_secs(), now.subsec_nanos())),
            until: None,
            filters,
        };
        let mut failed = false;
        self.docker
            .events(Some(options))
            .map(|event| {
                let event = event.map_err(engine)?;
                let actor = event.actor.unwrap_or_default();
                Ok(ContainerExit {
                    container_id: actor.id.unwrap_or_default(),
                    labels: actor.attributes.unwrap_or_default(),
                    oom: event.action.as_deref() == Some("oom"),
                })
            })
            .take_while(move |item| {
                let go = !failed;
                failed |= item.is_err();
                futures::future::ready(go)
            })
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A socket nobody listens on (an engine that was SIGKILLed leaves its socket file):
    /// refused at once, as `Unavailable`, by the probe and by an ordinary call; a missing
    /// socket refuses the connection.
    #[tokio::test]
    async fn a_dead_engine_fails_fast_as_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("docker.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        let docker = Docker::connect_with_unix(
            sock.to_str().unwrap(),
            REQUEST_TIMEOUT_SECS,
            bollard::API_DEFAULT_VERSION,
        )
        .unwrap();
        let backend = DockerBackend { docker };
        let started = std::time::Instant::now();
        let e = backend.ping(Duration::from_secs(2)).await.unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        let e = backend.inspect_container("c").await.unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        assert!(e.to_string().contains("refused"), "{e}");
        assert!(started.elapsed() < Duration::from_secs(2));
        std::fs::remove_file(&sock).unwrap();
        let e = backend.list_containers("k", "v").await.unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        let e = DockerBackend::connect_to(Some(&format!("unix://{}", sock.display())))
            .await
            .unwrap_err();
        assert!(e.is_unavailable(), "{e}");
        let e = DockerBackend::connect_to(Some("tcp://127.0.0.1:2375"))
            .await
            .unwrap_err();
        assert!(!e.is_unavailable(), "{e}");
    }
}

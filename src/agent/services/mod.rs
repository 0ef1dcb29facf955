//! Services on a kernel's service ports: Backend.AI's `start_service` / `shutdown_service`.
//!
//! A service runs as a detached exec in the kernel's container: its `prestart` commands to
//! completion, then its `command` through `sh`, with its output in
//! `/tmp/.kernelvisor/service-<name>.log` inside the container (so it never blocks on a pipe
//! nobody reads, and its tail can be reported when it fails). Whether it runs is asked of the
//! engine each time: the running execs of the container whose `$0` is
//! `kernelvisor-service-<name>`. So nothing here is lost when the agent restarts: a service
//! started before keeps running, is reported, and can be stopped.
//!
//! Readiness: the service's first container port accepts TCP connections on the container's
//! address (the host port would accept through Docker's userland proxy before the service
//! listens), within `[container] service-start-timeout`.

pub mod defs;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;

use self::defs::DefError;
use crate::agent::backend::{exec_exit_code, BackendError, ContainerBackend, ExecSpec};
use crate::agent::files::tar::TarReader;
use crate::agent::files::WORK_DIR;
use crate::agent::kernel::stages::ServicePortInfo;
use crate::rpc::failure::Failure;

/// Bytes of a failed service's output reported.
pub const OUTPUT_TAIL: usize = 4096;

/// Why a service call failed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The kernel has no service port of this name.
    #[error("the kernel has no service `{0}` (its service ports: {1})")]
    NotFound(String, String),
    /// The service could not be started, or did not become ready.
    #[error("service `{name}` failed to start: {reason}")]
    StartFailed {
        /// Service name.
        name: String,
        /// What went wrong.
        reason: String,
        /// The last [`OUTPUT_TAIL`] bytes of its output.
        output: String,
    },
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] BackendError),
}

impl ServiceError {
    /// The FAILURE name on the wire.
    pub fn name(&self) -> Failure {
        match self {
            ServiceError::NotFound(..) => Failure::ServiceNotFound,
            ServiceError::StartFailed { .. } => Failure::ServiceStartFailed,
            ServiceError::Engine(BackendError::ContainerNotFound(_)) => Failure::KernelNotRunning,
            ServiceError::Engine(BackendError::Unavailable(_)) => {
                Failure::ContainerEngineUnavailable
            }
            ServiceError::Engine(_) => Failure::ContainerEngineError,
        }
    }

    /// The output tail of a failed start.
    pub fn output(&self) -> Option<&str> {
        match self {
            ServiceError::StartFailed { output, .. } => Some(output),
            _ => None,
        }
    }
}

/// A service's state as reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceStatus {
    /// Its process runs.
    Running,
    /// Not started, stopped, or exited.
    Stopped,
}

impl ServiceStatus {
    /// `running` or `stopped`.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceStatus::Running => "running",
            ServiceStatus::Stopped => "stopped",
        }
    }
}

/// What `start` did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartOutcome {
    /// It was started and accepts connections.
    Started,
    /// It was already running.
    Running,
}

impl StartOutcome {
    /// `started` or `running` (Backend.AI's answers).
    pub fn as_str(self) -> &'static str {
        match self {
            StartOutcome::Started => "started",
            StartOutcome::Running => "running",
        }
    }
}

/// The kernel facts a service call needs.
#[derive(Clone, Debug)]
pub struct ServiceTarget {
    /// Kernel id.
    pub kernel_id: String,
    /// Its container.
    pub container_id: String,
    /// Its service ports.
    pub service_ports: Vec<ServicePortInfo>,
}

impl ServiceTarget {
    fn port(&self, name: &str) -> Result<&ServicePortInfo, ServiceError> {
        self.service_ports
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = self.service_ports.iter().map(|s| s.name.as_str()).collect();
                ServiceError::NotFound(
                    name.to_owned(),
                    if names.is_empty() {
                        "none".into()
                    } else {
                        names.join(", ")
                    },
                )
            })
    }
}

/// The `$0` that marks a service's process among the container's execs.
fn marker(name: &str) -> String {
    format!("kernelvisor-service-{name}")
}

fn log_path(name: &str) -> String {
    format!("/tmp/.kernelvisor/service-{name}.log")
}

/// One lock per (kernel id, service name): calls on one service take turns.
type ServiceLocks = HashMap<(String, String), Arc<tokio::sync::Mutex<()>>>;

/// Starts and stops services; one call at a time per (kernel, service).
pub struct Services {
    locks: Mutex<ServiceLocks>,
    start_timeout: Duration,
}

impl Services {
    /// Services whose readiness is awaited up to `start_timeout`.
    pub fn new(start_timeout: Duration) -> Services {
        Services {
            locks: Mutex::default(),
            start_timeout,
        }
    }

    fn lock_of(&self, kernel_id: &str, name: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .expect("service locks")
            .entry((kernel_id.to_owned(), name.to_owned()))
            .or_default()
            .clone()
    }

    /// Forgets the lock once nobody else holds it (the table never grows with old kernels).
    fn release(&self, kernel_id: &str, name: &str) {
        let mut locks = self.locks.lock().expect("service locks");
        let key = (kernel_id.to_owned(), name.to_owned());
        if locks.get(&key).is_some_and(|l| Arc::strong_count(l) == 1) {
            locks.remove(&key);
        }
    }

    /// Every service port of the kernel with its status.
    ///
    /// Errors: [`ServiceError::Engine`].
    pub async fn list(
        &self,
        backend: &Arc<dyn ContainerBackend>,
        target: &ServiceTarget,
    ) -> Result<Vec<(ServicePortInfo, ServiceStatus)>, ServiceError> {
        let running = running_services(backend, &target.container_id).await?;
        Ok(target
            .service_ports
            .iter()
            .map(|sp| {
                let status = if running.contains_key(&sp.name) {
                    ServiceStatus::Running
                } else {
                    ServiceStatus::Stopped
                };
                (sp.clone(), status)
            })
            .collect())
    }

    /// Starts service `name` unless it runs; answers once its port accepts connections. A second
    /// call while the first is starting waits for it and answers `Running`.
    ///
    /// Errors: [`ServiceError::NotFound`]; [`ServiceError::StartFailed`] (no def file, a failed
    /// prestart, the process exited, not ready within the timeout: it is then killed) with the
    /// output's tail; [`ServiceError::Engine`].
    pub async fn start(
        &self,
        backend: &Arc<dyn ContainerBackend>,
        target: &ServiceTarget,
        name: &str,
    ) -> Result<(StartOutcome, ServicePortInfo), ServiceError> {
        let port = target.port(name)?.clone();
        let lock = self.lock_of(&target.kernel_id, name);
        let result = async {
            let _held = lock.lock().await;
            if running_services(backend, &target.container_id)
                .await?
                .contains_key(name)
            {
                return Ok((StartOutcome::Running, port.clone()));
            }
            self.launch(backend, target, &port).await?;
            Ok((StartOutcome::Started, port.clone()))
        }
        .await;
        drop(lock);
        self.release(&target.kernel_id, name);
        result
    }

    async fn launch(
        &self,
        backend: &Arc<dyn ContainerBackend>,
        target: &ServiceTarget,
        port: &ServicePortInfo,
    ) -> Result<(), ServiceError> {
        let name = port.name.as_str();
        let failed = |reason: String, output: String| ServiceError::StartFailed {
            name: name.to_owned(),
            reason,
            output,
        };
        let def = match defs::read(backend, &target.container_id, name).await {
            Ok(def) => def.render(&port.container_ports, WORK_DIR),
            Err(DefError::Engine(e)) => return Err(e.into()),
            Err(e) => return Err(failed(e.to_string(), String::new())),
        };
        let env: Vec<String> = def.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        for cmd in &def.prestart {
            let (code, output) = run_to_end(backend, &target.container_id, cmd, &env).await?;
            if code != Some(0) {
                return Err(failed(
                    format!("prestart `{}` {}", cmd.join(" "), exit_words(code)),
                    output,
                ));
            }
        }
        let log = log_path(name);
        let mut cmd = vec![
            "sh".to_owned(),
            "-c".to_owned(),
            format!("mkdir -p /tmp/.kernelvisor && exec \"$@\" > {log} 2>&1"),
            marker(name),
        ];
        cmd.extend(def.command.iter().cloned());
        let session = backend
            .exec_start(
                &target.container_id,
                ExecSpec {
                    cmd,
                    working_dir: Some(WORK_DIR.into()),
                    env,
                    detach: true,
                    ..Default::default()
                },
            )
            .await?;
        let addr = probe_addr(backend, &target.container_id, port).await?;
        let deadline = Instant::now() + self.start_timeout;
        loop {
            let status = backend.exec_status(&session.exec_id).await?;
            if !status.running {
                // It may have exited between the two checks after all: a last connect would
                // only reach a dead port, so report the exit.
                return Err(failed(
                    format!("its process {}", exit_words(status.exit_code)),
                    log_tail(backend, &target.container_id, &log).await,
                ));
            }
            let connect = tokio::net::TcpStream::connect(&addr);
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_secs(1), connect).await {
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = backend.exec_kill(&session.exec_id).await;
                return Err(failed(
                    format!(
                        "port {} did not accept connections within {} s",
                        port.container_ports.first().copied().unwrap_or(0),
                        self.start_timeout.as_secs_f64()
                    ),
                    log_tail(backend, &target.container_id, &log).await,
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops service `name` (its process tree is killed); answers once it no longer runs.
    /// Stopping a stopped service is not an error.
    ///
    /// Errors: [`ServiceError::NotFound`], [`ServiceError::Engine`].
    pub async fn stop(
        &self,
        backend: &Arc<dyn ContainerBackend>,
        target: &ServiceTarget,
        name: &str,
    ) -> Result<ServicePortInfo, ServiceError> {
        let port = target.port(name)?.clone();
        let lock = self.lock_of(&target.kernel_id, name);
        let result = async {
            let _held = lock.lock().await;
            let Some(exec_id) = running_services(backend, &target.container_id)
                .await?
                .remove(name)
            else {
                return Ok(port.clone());
            };
            backend.exec_kill(&exec_id).await?;
            for _ in 0..100 {
                if !backend.exec_status(&exec_id).await?.running {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(port.clone())
        }
        .await;
        drop(lock);
        self.release(&target.kernel_id, name);
        result
    }
}

/// Running services of the container: name → exec id.
async fn running_services(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
) -> Result<HashMap<String, String>, BackendError> {
    Ok(backend
        .exec_processes(container_id)
        .await?
        .into_iter()
        .filter(|p| p.running)
        .filter_map(|p| {
            let name = p
                .cmd
                .get(3)?
                .strip_prefix("kernelvisor-service-")?
                .to_owned();
            (p.cmd.first().map(String::as_str) == Some("sh")).then_some((name, p.exec_id))
        })
        .collect())
}

/// Where readiness is probed: the first container port on the container's address, or the
/// first host port on the loopback when the engine gives no address.
async fn probe_addr(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    port: &ServicePortInfo,
) -> Result<String, ServiceError> {
    let state = backend
        .inspect_container(container_id)
        .await?
        .ok_or_else(|| BackendError::ContainerNotFound(container_id.to_owned()))?;
    Ok(match (state.ip_address, port.container_ports.first()) {
        (Some(ip), Some(p)) => format!("{ip}:{p}"),
        _ => format!(
            "127.0.0.1:{}",
            port.host_ports.first().copied().unwrap_or(0)
        ),
    })
}

/// Runs `cmd` to its end, keeping the tail of its output: (exit code, tail).
async fn run_to_end(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    cmd: &[String],
    env: &[String],
) -> Result<(Option<i64>, String), BackendError> {
    let mut session = backend
        .exec_start(
            container_id,
            ExecSpec {
                cmd: cmd.to_vec(),
                working_dir: Some(WORK_DIR.into()),
                env: env.to_vec(),
                ..Default::default()
            },
        )
        .await?;
    let mut tail = Tail::default();
    while let Some(chunk) = session.output.next().await {
        tail.push(&chunk?.1);
    }
    let code = exec_exit_code(backend.as_ref(), &session.exec_id).await;
    Ok((code, tail.text()))
}

/// The last [`OUTPUT_TAIL`] bytes of the service's log file (empty when it cannot be read).
async fn log_tail(backend: &Arc<dyn ContainerBackend>, container_id: &str, path: &str) -> String {
    let mut reader = TarReader::new(backend.archive_get(container_id, path));
    let mut tail = Tail::default();
    if let Ok(Some(_)) = reader.next_entry().await {
        while let Ok(Some(chunk)) = reader.read_data(64 << 10).await {
            tail.push(&chunk);
        }
    }
    tail.text()
}

/// The last [`OUTPUT_TAIL`] bytes pushed.
#[derive(Default)]
struct Tail(Vec<u8>);

impl Tail {
    fn push(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
        if self.0.len() > OUTPUT_TAIL {
            self.0.drain(..self.0.len() - OUTPUT_TAIL);
        }
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }
}

/// How a process ended, in words: "exited with code 3", or "ended without an exit code" when
/// the engine did not say (the container went away under it).
fn exit_words(code: Option<i64>) -> String {
    match code {
        Some(c) => format!("exited with code {c}"),
        None => "ended without an exit code".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_bytes() {
        let mut t = Tail::default();
        t.push(&vec![b'a'; OUTPUT_TAIL]);
        t.push(b"end");
        assert_eq!(t.0.len(), OUTPUT_TAIL);
        assert!(t.text().ends_with("aend"));
    }
}

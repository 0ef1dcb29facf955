//! Service methods (the typed contract of [`crate::rpc::agent_api::services`]):
//! `start_service(kernel_id, service, opts=None)`, `shutdown_service(kernel_id, service)`, and
//! kernelvisor's `list_services(kernel_id)`.
//!
//! `start_service` answers as upstream's kernel runner does: `{"status": "started" |
//! "running", "error": nil, …}`, or `{"status": "failed", "error": why, "error_name":
//! "ServiceNotFound" | "ServiceStartFailed", "output": its output's tail}` for a service the
//! kernel does not have or one that did not start. Its other answers, and `shutdown_service`'s
//! and `list_services`', carry the service port (`name`, `protocol`, `container_ports`,
//! `host_ports`), its `status` (`running` | `stopped`) and the agent's `advertised_host`
//! (`[container] advertised-host`, nil when unset). FAILURE names: `ServiceNotFound`
//! (`shutdown_service`), `KernelNotFound`, `KernelNotRunning`, `ContainerEngineError`,
//! `ContainerEngineUnavailable`.

use std::time::Duration;

use actix::Addr;

use super::args::running;
use super::{Ctx, Table};
use crate::agent::context::AgentContext;
use crate::agent::kernel::stages::ServicePortInfo;
use crate::agent::registry::KernelRegistry;
use crate::agent::services::{ServiceError, ServiceStatus, ServiceTarget};
use crate::rpc::agent_api::services as api;
use crate::rpc::{Dispatcher, ErrorMeta, Failure};

fn to_meta(e: ServiceError) -> ErrorMeta {
    let mut meta = ErrorMeta::new(e.name(), e.to_string());
    if let Some(output) = e.output() {
        meta.traceback = output.to_owned();
    }
    meta
}

fn service_value(
    ctx: &AgentContext,
    sp: &ServicePortInfo,
    status: ServiceStatus,
) -> api::ServiceState {
    api::ServiceState {
        name: sp.name.clone(),
        protocol: sp.protocol.clone(),
        container_ports: sp.container_ports.clone(),
        host_ports: sp.host_ports.clone(),
        is_inference: false,
        status: status.as_str().to_owned(),
        advertised_host: ctx.config.container.advertised_host.clone(),
    }
}

async fn target(
    registry: &Addr<KernelRegistry>,
    kernel_id: &str,
) -> Result<ServiceTarget, ErrorMeta> {
    let info = running(registry, kernel_id).await?;
    Ok(ServiceTarget {
        kernel_id: kernel_id.to_owned(),
        container_id: info.container_id.clone().unwrap_or_default(),
        service_ports: info.service_ports.clone(),
    })
}

/// Registers the service methods on `dispatcher`.
pub(crate) fn register(dispatcher: &mut Dispatcher, cx: &Ctx) {
    Table::new(dispatcher, cx.clone())
        .method::<api::StartService, _, _>(start_service)
        .method::<api::ShutdownService, _, _>(shutdown_service)
        .method::<api::ListServices, _, _>(list_services);
}

/// `start_service(kernel_id, service, opts=None)`: a service the kernel does not have, or one
/// that did not start, is an answer (`status` `failed`), not a FAILURE.
async fn start_service(
    cx: Ctx,
    args: api::StartServiceArgs,
) -> Result<api::StartServiceReply, ErrorMeta> {
    cx.engine.check()?;
    let info = running(&cx.registry, &args.kernel_id).await?;
    if let Some(ports) = info.runner {
        let (status, error) =
            super::runner::start_service(&cx, &info, ports, &args.service, args.opts.as_ref())
                .await?;
        let sp = info.service_ports.iter().find(|s| s.name == args.service);
        let failed = status == "failed";
        return Ok(api::StartServiceReply {
            error_name: failed.then(|| {
                if sp.is_none() {
                    Failure::ServiceNotFound.as_str().into()
                } else {
                    Failure::ServiceStartFailed.as_str().into()
                }
            }),
            status,
            error,
            host_ports: sp.filter(|_| !failed).map(|s| s.host_ports.clone()),
            service: sp
                .filter(|_| !failed)
                .map(|s| service_value(&cx, s, ServiceStatus::Running)),
            ..Default::default()
        });
    }
    let t = target(&cx.registry, &args.kernel_id).await?;
    match cx.services.start(&cx.backend, &t, &args.service).await {
        Ok((outcome, sp)) => Ok(api::StartServiceReply {
            status: outcome.as_str().into(),
            error: None,
            host_ports: Some(sp.host_ports.clone()),
            service: Some(service_value(&cx, &sp, ServiceStatus::Running)),
            ..Default::default()
        }),
        Err(e @ (ServiceError::NotFound(..) | ServiceError::StartFailed { .. })) => {
            Ok(api::StartServiceReply {
                status: "failed".into(),
                error: Some(e.to_string()),
                error_name: Some(e.name().into()),
                output: e.output().map(str::to_owned),
                ..Default::default()
            })
        }
        Err(e) => Err(to_meta(e)),
    }
}

/// `shutdown_service(kernel_id, service)`.
async fn shutdown_service(
    cx: Ctx,
    args: api::ShutdownServiceArgs,
) -> Result<api::ServiceStopped, ErrorMeta> {
    cx.engine.check()?;
    let info = running(&cx.registry, &args.kernel_id).await?;
    let sp = match info.runner {
        Some(ports) => {
            let sp = info
                .service_ports
                .iter()
                .find(|s| s.name == args.service)
                .cloned()
                .ok_or_else(|| {
                    let names: Vec<&str> =
                        info.service_ports.iter().map(|s| s.name.as_str()).collect();
                    to_meta(ServiceError::NotFound(
                        args.service.clone(),
                        names.join(", "),
                    ))
                })?;
            super::runner::shutdown_service(&cx, &info, ports, &args.service).await?;
            sp
        }
        None => {
            let t = target(&cx.registry, &args.kernel_id).await?;
            cx.services
                .stop(&cx.backend, &t, &args.service)
                .await
                .map_err(to_meta)?
        }
    };
    Ok(api::ServiceStopped {
        status: "stopped".into(),
        service: service_value(&cx, &sp, ServiceStatus::Stopped),
    })
}

/// How long [`answers`] waits for a service port's connection.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a connection [`answers`] made must stay open to count.
const PROBE_HOLD: Duration = Duration::from_millis(500);

/// Whether a service takes TCP connections on the agent's `host_port` (bound on `[container]
/// bind-host`; a wildcard is reached on loopback). The engine's userland proxy (docker-proxy)
/// accepts every connection to a published port and closes it at once when nothing listens in
/// the container: so a connection counts when it stays open for [`PROBE_HOLD`] (a service
/// waiting for its client to speak, as HTTP does) or the service speaks first (an SSH banner),
/// not when it is closed or reset.
async fn answers(bind_host: &str, host_port: u16) -> bool {
    use tokio::io::AsyncReadExt;
    let host = match bind_host {
        "" | "0.0.0.0" => "127.0.0.1",
        "::" | "[::]" => "::1",
        h => h.trim_matches(|c| c == '[' || c == ']'),
    };
    let connect = tokio::net::TcpStream::connect((host, host_port));
    let Ok(Ok(mut stream)) = tokio::time::timeout(PROBE_TIMEOUT, connect).await else {
        return false;
    };
    let mut byte = [0u8; 1];
    match tokio::time::timeout(PROBE_HOLD, stream.read(&mut byte)).await {
        Err(_) => true,
        Ok(Ok(n)) => n > 0,
        Ok(Err(_)) => false,
    }
}

/// `list_services(kernel_id)` (kernelvisor). On a kernel Backend.AI's kernel runner serves
/// (whose runner starts and stops the services itself), a service is `running` when its first
/// host port takes a TCP connection ([`answers`]), else `stopped`.
async fn list_services(
    cx: Ctx,
    args: crate::rpc::agent_api::kernel::KernelIdArgs,
) -> Result<api::ServiceList, ErrorMeta> {
    cx.engine.check()?;
    let info = running(&cx.registry, &args.kernel_id).await?;
    if info.runner.is_some() {
        let (cx, bind_host) = (&cx, cx.config.container.bind_host.as_str());
        let probes = info.service_ports.iter().map(|sp| async move {
            let up = match sp.host_ports.first() {
                Some(&port) => answers(bind_host, port).await,
                None => false,
            };
            let status = match up {
                true => ServiceStatus::Running,
                false => ServiceStatus::Stopped,
            };
            service_value(cx, sp, status)
        });
        return Ok(api::ServiceList {
            services: futures::future::join_all(probes).await,
        });
    }
    let t = target(&cx.registry, &args.kernel_id).await?;
    let list = cx.services.list(&cx.backend, &t).await.map_err(to_meta)?;
    Ok(api::ServiceList {
        services: list
            .iter()
            .map(|(sp, status)| service_value(&cx, sp, *status))
            .collect(),
    })
}

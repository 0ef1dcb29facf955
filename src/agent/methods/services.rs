//! Service methods (Backend.AI's names): `start_service(kernel_id, service, opts=None)`,
//! `shutdown_service(kernel_id, service)`, and `list_services(kernel_id)`.
//!
//! Each service answer carries the service port (`name`, `protocol`, `container_ports`,
//! `host_ports`), its `status` (`running` | `stopped`) and the agent's `advertised_host`
//! (`[container] advertised-host`, nil when unset). FAILURE names: `ServiceNotFound`,
//! `ServiceStartFailed` (its traceback field carries the tail of the service's output),
//! `KernelNotFound`, `KernelNotRunning`, `ContainerEngineError`.

use std::sync::Arc;

use actix::Addr;
use rmpv::Value;

use super::args::{running, str_arg};
use crate::agent::context::AgentContext;
use crate::agent::kernel::stages::ServicePortInfo;
use crate::agent::registry::KernelRegistry;
use crate::agent::services::{ServiceError, ServiceStatus, ServiceTarget};
use crate::rpc::{Call, Dispatcher, ErrorMeta};

fn to_meta(e: ServiceError) -> ErrorMeta {
    let mut meta = ErrorMeta::new(e.name(), e.to_string());
    if let Some(output) = e.output() {
        meta.traceback = output.to_owned();
    }
    meta
}

fn service_value(ctx: &AgentContext, sp: &ServicePortInfo, status: ServiceStatus) -> Value {
    let Value::Map(mut map) = sp.to_value() else {
        unreachable!("a service port is a map")
    };
    map.push(("status".into(), status.as_str().into()));
    map.push((
        "advertised_host".into(),
        ctx.config
            .container
            .advertised_host
            .clone()
            .map_or(Value::Nil, Value::from),
    ));
    Value::Map(map)
}

async fn target(registry: &Addr<KernelRegistry>, call: &Call) -> Result<ServiceTarget, ErrorMeta> {
    let kernel_id = str_arg(call, 0, "kernel_id")?;
    let info = running(registry, &kernel_id).await?;
    Ok(ServiceTarget {
        kernel_id,
        container_id: info.container_id.clone().unwrap_or_default(),
        service_ports: info.service_ports.clone(),
    })
}

/// Registers the service methods on `dispatcher`.
pub fn register(
    dispatcher: &mut Dispatcher,
    ctx: Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
) {
    // start_service(kernel_id, service, opts=None) → {"status": "started"|"running",
    // "host_ports", "service": {…}}
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("start_service", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            c.engine.check()?;
            let t = target(&r, &call).await?;
            let name = str_arg(&call, 1, "service")?;
            let (outcome, sp) = c
                .services
                .start(&c.backend, &t, &name)
                .await
                .map_err(to_meta)?;
            Ok(Value::Map(vec![
                ("status".into(), outcome.as_str().into()),
                (
                    "host_ports".into(),
                    Value::Array(sp.host_ports.iter().map(|&p| p.into()).collect()),
                ),
                (
                    "service".into(),
                    service_value(&c, &sp, ServiceStatus::Running),
                ),
            ]))
        }
    });

    // shutdown_service(kernel_id, service) → {"status": "stopped", "service": {…}}
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register("shutdown_service", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            c.engine.check()?;
            let t = target(&r, &call).await?;
            let name = str_arg(&call, 1, "service")?;
            let sp = c
                .services
                .stop(&c.backend, &t, &name)
                .await
                .map_err(to_meta)?;
            Ok(Value::Map(vec![
                ("status".into(), "stopped".into()),
                (
                    "service".into(),
                    service_value(&c, &sp, ServiceStatus::Stopped),
                ),
            ]))
        }
    });

    // list_services(kernel_id) → {"services": [{…}]}
    let (r, c) = (registry, ctx);
    dispatcher.register("list_services", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            c.engine.check()?;
            let t = target(&r, &call).await?;
            let list = c.services.list(&c.backend, &t).await.map_err(to_meta)?;
            Ok(Value::Map(vec![(
                "services".into(),
                Value::Array(
                    list.iter()
                        .map(|(sp, status)| service_value(&c, sp, *status))
                        .collect(),
                ),
            )]))
        }
    });
}

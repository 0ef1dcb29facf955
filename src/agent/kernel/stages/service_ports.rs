//! `service-ports`: the kernel's service ports as the engine mapped them, checked and reported.

use actors::{BoxError, Provisioner, StageKey};
use rmpv::Value;
use serde::{Deserialize, Serialize};

use crate::agent::kernel::config::ServicePortRequest;
use crate::agent::kernel::{KernelError, KernelHandle};

/// A published service port: Backend.AI's `{"name", "protocol", "container_ports", "host_ports"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePortInfo {
    /// Service name.
    pub name: String,
    /// Protocol as requested.
    pub protocol: String,
    /// Ports in the container.
    pub container_ports: Vec<u16>,
    /// The host ports they are published on, index for index.
    pub host_ports: Vec<u16>,
}

impl ServicePortInfo {
    /// As the wire map, Backend.AI's `ServicePort` shape:
    /// `{name, protocol, container_ports, host_ports, is_inference}`.
    pub fn to_value(&self) -> Value {
        let ports = |p: &[u16]| Value::Array(p.iter().map(|&x| x.into()).collect());
        Value::Map(vec![
            ("name".into(), self.name.clone().into()),
            ("protocol".into(), self.protocol.clone().into()),
            ("container_ports".into(), ports(&self.container_ports)),
            ("host_ports".into(), ports(&self.host_ports)),
            // Backend.AI's `ServicePort` carries it; no inference endpoints here.
            ("is_inference".into(), false.into()),
        ])
    }
}

/// Pairs service ports with host ports in order: the container stage publishes
/// `container_ports[i]` on the i-th allocated host port.
pub fn assign(requests: &[ServicePortRequest], host_ports: &[u16]) -> Vec<ServicePortInfo> {
    let mut host = host_ports.iter().copied();
    requests
        .iter()
        .map(|r| ServicePortInfo {
            name: r.name.clone(),
            protocol: r.protocol.clone(),
            container_ports: r.container_ports.clone(),
            host_ports: r
                .container_ports
                .iter()
                .map_while(|_| host.next())
                .collect(),
        })
        .collect()
}

/// Checks with the engine that every service port is published where planned.
pub struct ServicePortStage(pub KernelHandle);

/// This stage's key: its name, typed with its resource.
pub const SERVICE_PORTS: StageKey<Vec<ServicePortInfo>> =
    StageKey::of::<ServicePortStage>("service-ports");

impl Provisioner for ServicePortStage {
    /// (container id, planned service ports).
    type Spec = (String, Vec<ServicePortInfo>);
    type Resource = Vec<ServicePortInfo>;

    fn name(&self) -> &'static str {
        SERVICE_PORTS.name()
    }

    async fn setup(
        &self,
        (container_id, planned): Self::Spec,
    ) -> Result<Vec<ServicePortInfo>, BoxError> {
        if !planned.is_empty() {
            let state = self
                .0
                .ctx
                .backend
                .inspect_container(&container_id)
                .await
                .map_err(KernelError::from)?
                .ok_or_else(|| KernelError::Engine(format!("container {container_id} vanished")))?;
            for sp in &planned {
                for (c, h) in sp.container_ports.iter().zip(&sp.host_ports) {
                    if !state
                        .ports
                        .iter()
                        .any(|m| m.container_port == *c && m.host_port == *h)
                    {
                        return Err(KernelError::Engine(format!(
                            "service port {} ({c}) is not published on host port {h}",
                            sp.name
                        ))
                        .into());
                    }
                }
            }
        }
        self.0.update(|i| i.service_ports = planned.clone());
        Ok(planned)
    }

    async fn teardown(&self, _ports: Vec<ServicePortInfo>) -> Result<(), BoxError> {
        Ok(())
    }
}

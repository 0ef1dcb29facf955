//! `service-ports`: the kernel's service ports as the engine mapped them, checked and reported.

use actors::{BoxError, Provisioner, Resources, StageKey};

use super::{Found, KernelStage, Plan, CONTAINER, IMAGE, PORTS};

use crate::agent::kernel::config::ServicePortRequest;
pub use crate::agent::kernel::resources::ServicePortInfo;
use crate::agent::kernel::{KernelError, KernelHandle};

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
    /// The container, its service ports, and whether the engine publishes them.
    type Spec = (String, Vec<ServicePortInfo>, bool);
    type Resource = Vec<ServicePortInfo>;

    fn name(&self) -> &'static str {
        SERVICE_PORTS.name()
    }

    async fn setup(
        &self,
        (container_id, planned, published): Self::Spec,
    ) -> Result<Vec<ServicePortInfo>, BoxError> {
        if published && !planned.is_empty() {
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

impl KernelStage for ServicePortStage {
    fn new(handle: KernelHandle) -> Self {
        ServicePortStage(handle)
    }

    /// The container's id and the kernel's service ports paired with its host ports.
    /// On the host's network (a host-mode cluster kernel) nothing is published: its services
    /// listen on their host ports themselves (`ClusterConfig::on_host_network`), and the check
    /// against the engine's port mappings is skipped.
    fn spec(plan: &Plan, r: &Resources<'_>) -> Result<Self::Spec, BoxError> {
        let container = r.of(CONTAINER)?;
        let all = plan.service_ports(r.of(IMAGE)?)?;
        let mut ports = assign(&all, r.of(PORTS)?);
        let config = &plan.config;
        let host = config.cluster.as_ref().filter(|c| c.on_host());
        if let Some(c) = host {
            c.on_host_network(&mut ports, config.cluster_hostname.as_deref(), &plan.handle.id);
        }
        Ok((container.id.clone(), ports, host.is_none()))
    }

    /// The container's service ports paired with the host ports they are published on.
    fn rebuild(found: &Found<'_>) -> Result<Vec<ServicePortInfo>, String> {
        Ok(assign(
            found.service_ports,
            &found.host_ports[..found.service_host_ports],
        ))
    }
}

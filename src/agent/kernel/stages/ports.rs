//! `ports`: host ports from `[container] port-range`.

use actors::{BoxError, Provisioner};

use crate::agent::kernel::{KernelError, KernelHandle};

/// Takes one host port per service container port; released ports cool down before reuse.
pub struct PortStage(pub KernelHandle);

impl Provisioner for PortStage {
    type Spec = usize;
    type Resource = Vec<u16>;

    fn name(&self) -> &'static str {
        "ports"
    }

    async fn setup(&self, count: usize) -> Result<Vec<u16>, BoxError> {
        let ports = self
            .0
            .ctx
            .ports
            .lock()
            .expect("ports lock")
            .allocate(count)
            .map_err(KernelError::from)?;
        self.0.update(|i| i.host_ports = ports.clone());
        Ok(ports)
    }

    async fn teardown(&self, ports: Vec<u16>) -> Result<(), BoxError> {
        self.0.ctx.ports.lock().expect("ports lock").release(&ports);
        Ok(())
    }
}

//! `ports`: host ports from `[container] port-range`.

use actors::{BoxError, Provisioner, Resources, StageKey};

use super::{Found, KernelStage, Plan, IMAGE};

use crate::agent::kernel::{KernelError, KernelHandle};

/// Takes one host port per service container port; released ports cool down before reuse.
pub struct PortStage(pub KernelHandle);

/// This stage's key: its name, typed with its resource.
pub const PORTS: StageKey<Vec<u16>> = StageKey::of::<PortStage>("ports");

impl Provisioner for PortStage {
    type Spec = usize;
    type Resource = Vec<u16>;

    fn name(&self) -> &'static str {
        PORTS.name()
    }

    /// The manager's `allocated_host_ports` come first (each one handed out by `assign_port`,
    /// or free in the range), then ports from the range.
    ///
    /// Errors: `InvalidKernelConfig` for an allocated port that is neither;
    /// `ResourceExhausted` when the range has too few free. Nothing is held then.
    async fn setup(&self, count: usize) -> Result<Vec<u16>, BoxError> {
        let ctx = &self.0.ctx;
        let wanted = self.0.info().config.allocated_host_ports.clone();
        let mut pool = ctx.ports.lock().expect("ports lock");
        let mut ports = Vec::with_capacity(count);
        for &p in wanted.iter().take(count) {
            if ctx.node.port_unassigned(p) || pool.take(p) {
                ports.push(p);
            } else {
                pool.release(&ports);
                return Err(KernelError::InvalidConfig(format!(
                    "allocated host port {p} is neither assigned by `assign_port` nor free on this agent"
                ))
                .into());
            }
        }
        match pool.allocate(count - ports.len()) {
            Ok(more) => ports.extend(more),
            Err(e) => {
                pool.release(&ports);
                return Err(KernelError::from(e).into());
            }
        }
        drop(pool);
        self.0.update(|i| i.host_ports = ports.clone());
        Ok(ports)
    }

    async fn teardown(&self, ports: Vec<u16>) -> Result<(), BoxError> {
        self.0.ctx.ports.lock().expect("ports lock").release(&ports);
        Ok(())
    }
}

impl KernelStage for PortStage {
    fn new(handle: KernelHandle) -> Self {
        PortStage(handle)
    }

    /// One host port per container port of the kernel's service ports, then two for a runner
    /// kernel's repl-in and repl-out (the last two).
    fn spec(plan: &Plan, r: &Resources<'_>) -> Result<usize, BoxError> {
        let image = r.of(IMAGE)?;
        let all = plan.service_ports(image)?;
        let repl = match plan.gate(image) {
            crate::agent::runner::Gate::Runner { .. } => 2,
            _ => 0,
        };
        Ok(all.iter().map(|s| s.container_ports.len()).sum::<usize>() + repl)
    }

    /// Every host port the container publishes: all of them are its while it runs.
    fn rebuild(found: &Found<'_>) -> Result<Vec<u16>, String> {
        Ok(found.host_ports.to_vec())
    }
}

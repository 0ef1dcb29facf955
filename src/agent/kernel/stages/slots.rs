//! `slots`: cpu / mem / cuda.device from the agent's capacity.

use actors::{BoxError, Provisioner};

use crate::agent::kernel::{KernelError, KernelHandle};
use crate::agent::resources::{SlotAllocation, SlotRequest};

/// Takes the kernel's slots from the agent's [`SlotAllocator`](crate::agent::resources::SlotAllocator);
/// `ResourceExhausted` when short.
pub struct SlotStage(pub KernelHandle);

impl Provisioner for SlotStage {
    type Spec = SlotRequest;
    type Resource = SlotAllocation;

    fn name(&self) -> &'static str {
        "slots"
    }

    async fn setup(&self, request: SlotRequest) -> Result<SlotAllocation, BoxError> {
        let alloc = self
            .0
            .ctx
            .slots
            .lock()
            .expect("slots lock")
            .allocate(request)
            .map_err(KernelError::from)?;
        self.0.update(|i| i.gpus = alloc.gpus.clone());
        Ok(alloc)
    }

    async fn teardown(&self, alloc: SlotAllocation) -> Result<(), BoxError> {
        self.0.ctx.slots.lock().expect("slots lock").release(&alloc);
        Ok(())
    }
}

//! `slots`: every slot asked for (cpu, mem, accelerator devices) from the agent's capacity.

use actors::{BoxError, Provisioner, Resources, StageKey};

use super::{Found, KernelStage, Plan};

use crate::agent::kernel::{KernelError, KernelHandle};
use crate::agent::resources::SlotAllocation;
use crate::slots::ResourceSlots;

/// Takes the kernel's slots from the agent's [`SlotAllocator`](crate::agent::resources::SlotAllocator);
/// `ResourceExhausted` when short.
pub struct SlotStage(pub KernelHandle);

/// This stage's key: its name, typed with its resource.
pub const SLOTS: StageKey<SlotAllocation> = StageKey::of::<SlotStage>("slots");

impl Provisioner for SlotStage {
    type Spec = ResourceSlots;
    type Resource = SlotAllocation;

    fn name(&self) -> &'static str {
        SLOTS.name()
    }

    async fn setup(&self, request: ResourceSlots) -> Result<SlotAllocation, BoxError> {
        let alloc = self
            .0
            .ctx
            .slots
            .lock()
            .expect("slots lock")
            .allocate(&self.0.id, &request)
            .map_err(KernelError::from)?;
        self.0.update(|i| i.gpus = alloc.device_ids());
        Ok(alloc)
    }

    async fn teardown(&self, alloc: SlotAllocation) -> Result<(), BoxError> {
        self.0
            .ctx
            .slots
            .lock()
            .expect("slots lock")
            .release(&self.0.id, &alloc);
        Ok(())
    }
}

impl KernelStage for SlotStage {
    fn new(handle: KernelHandle) -> Self {
        SlotStage(handle)
    }

    /// The config's slots.
    fn spec(plan: &Plan, _: &Resources<'_>) -> Result<ResourceSlots, BoxError> {
        Ok(plan.config.slots.clone())
    }

    /// The slots and devices the container is described with.
    fn rebuild(found: &Found<'_>) -> Result<SlotAllocation, String> {
        Ok(found.slots.clone())
    }
}

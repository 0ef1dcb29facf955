//! The kernel's stages, one provisioner per resource, in setup order (`docs/design.md`). Each holds
//! the kernel's [`KernelHandle`](super::KernelHandle) for the agent context and status
//! reports, and no per-resource state: what it made is its `Resource`, owned by the chain.

pub mod container;
mod image;
pub mod mounts;
mod ports;
pub mod scratch;
pub mod service_ports;
mod slots;

pub use container::{
    container_spec, recreate_container, ContainerHandle, ContainerStage, CONTAINER,
};
pub use image::{ImageStage, IMAGE};
pub use mounts::{MountStage, MOUNTS};
pub use ports::{PortStage, PORTS};
pub use scratch::{ScratchDir, ScratchSpec, ScratchStage, SCRATCH};
pub use service_ports::{ServicePortInfo, ServicePortStage, SERVICE_PORTS};
pub use slots::{SlotStage, SLOTS};

/// Stage names, in setup order: the chain's names, metric labels and error prefixes.
pub const STAGES: [&str; 7] = [
    IMAGE.name(),
    SLOTS.name(),
    PORTS.name(),
    SCRATCH.name(),
    MOUNTS.name(),
    CONTAINER.name(),
    SERVICE_PORTS.name(),
];

//! The kernel's stages, one provisioner per resource, in setup order (seed 001). Each holds
//! the kernel's [`KernelHandle`](super::KernelHandle) for the agent context and status
//! reports, and no per-resource state: what it made is its `Resource`, owned by the chain.

pub mod container;
mod image;
pub mod mounts;
mod ports;
pub mod scratch;
pub mod service_ports;
mod slots;

pub use container::{container_spec, recreate_container, ContainerHandle, ContainerStage};
pub use image::ImageStage;
pub use mounts::MountStage;
pub use ports::PortStage;
pub use scratch::{ScratchDir, ScratchSpec, ScratchStage};
pub use service_ports::{ServicePortInfo, ServicePortStage};
pub use slots::SlotStage;

/// Stage names, in setup order: the chain's names, metric labels and error prefixes.
pub const STAGES: [&str; 7] = [
    "image",
    "slots",
    "ports",
    "scratch",
    "mounts",
    "container",
    "service-ports",
];

//! The node's allocatable resources: resource slots and host ports. Each allocator is plain
//! data behind a mutex owned by the agent; the kernel stages take from it and give back.

pub mod ports;
pub mod slots;

pub use crate::slots::SlotError;
pub use ports::{PortPool, PortsExhausted};
pub use slots::{RequestError, SlotAllocation, SlotAllocator, SlotRequest};

//! The kernel: one supervised actor per kernel owning one child actor per resource stage
//! (seed 001), under a `rest_for_one` supervisor whose intensity is the restart policy.
//!
//! ```text
//! Kernel <id>            actor owning a StageTree; stages stopped in reverse
//! ├─ image               ImageStage: local image, or pull (status PULLING)
//! ├─ slots               SlotStage: cpu / mem / cuda.device from the agent's capacity
//! ├─ ports               PortStage: host ports from [container] port-range
//! ├─ scratch             ScratchStage: <scratch-root>/<id>/{config,work}
//! ├─ mounts              MountStage: vfolders → /home/work/<name>, paths checked
//! ├─ container           ContainerStage: create + start (status CREATING); watches
//! │                      the container's exits and HEALTHCHECK (watch.rs)
//! └─ service-ports       ServicePortStage: the mapped ports, checked and reported
//! ```

pub mod actor;
pub mod config;
pub mod error;
pub mod messages;
pub mod stages;
mod status;
pub mod tree;
pub mod watch;

pub use actor::Kernel;
pub use config::{KernelConfig, Owner, SessionType};
pub use error::KernelError;
pub use status::{KernelHandle, KernelInfo, KernelStatus};

use serde::{Deserialize, Serialize};

use self::stages::{ContainerHandle, ScratchDir, ServicePortInfo};
use super::backend::{Bind, ImageInfo};
use super::resources::SlotAllocation;

/// Every stage's resource of a set-up kernel, as persisted in the store and re-adopted on
/// restart. Field names are the JSON layout of `resources_version` 1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct KernelResources {
    /// `image` stage.
    pub image: ImageInfo,
    /// `slots` stage.
    pub slots: SlotAllocation,
    /// `ports` stage.
    pub ports: Vec<u16>,
    /// `scratch` stage.
    pub scratch: ScratchDir,
    /// `mounts` stage.
    pub mounts: Vec<Bind>,
    /// `container` stage.
    pub container: ContainerHandle,
    /// `service-ports` stage.
    pub service_ports: Vec<ServicePortInfo>,
}

//! The kernel: one supervised actor per kernel owning one child actor per resource stage
//! (`docs/design.md`), under a `rest_for_one` supervisor whose intensity is the restart policy.
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
//! ├─ service-ports       ServicePortStage: the mapped ports, checked and reported
//! └─ runner              RunnerStage: Backend.AI's kernel runner serving (runner kernels;
//!                        a no-op on the process path)
//! ```

pub mod actor;
pub mod cluster;
pub mod config;
pub mod error;
pub mod handle;
pub mod messages;
pub mod resources;
pub mod stages;
pub mod started;
mod status;
pub mod tree;
pub mod watch;

pub use actor::Kernel;
pub use config::{KernelConfig, Owner, SessionType};
pub use error::KernelError;
pub use handle::KernelHandle;
pub use resources::KernelResources;
pub use status::{KernelInfo, KernelStatus, Stopped};

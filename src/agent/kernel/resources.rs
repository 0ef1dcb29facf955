//! What the stages of a kernel hold once set up, as plain data: the store persists it
//! ([`KernelResources`], one field per stage), the dangling table and the agent's services read
//! it, none of them needing the stages' code or the agent context (which is why it lives apart
//! from the stage files, each of which re-exports its own). The one list of stages is here too
//! ([`with_kernel_stages!`]), so that this plain data and the stages come from the same lines.

use std::path::PathBuf;

use rmpv::Value;
use serde::{Deserialize, Serialize};

use crate::agent::backend::{Bind, ImageInfo};
use crate::agent::resources::SlotAllocation;
pub use crate::agent::runner::RunnerPorts;

/// The one ordered list of a kernel's resource stages, in setup (`rest_for_one`) order, handed
/// to `$callback`: per line, the stage's module under `stages/` (its field in
/// [`KernelResources`]), its resource type, its provisioner and its key. Attributes before a
/// line go on its field (`#[serde(default)]` for a stage added after agents already persisted
/// rows without it). A new stage is its file under `stages/` plus one line here
/// (`docs/layout.md`, "How to add").
macro_rules! with_kernel_stages {
    ($callback:ident) => {
        $callback! {
            image: ImageInfo => ImageStage, IMAGE;
            slots: SlotAllocation => SlotStage, SLOTS;
            ports: Vec<u16> => PortStage, PORTS;
            scratch: ScratchDir => ScratchStage, SCRATCH;
            mounts: Vec<Bind> => MountStage, MOUNTS;
            container: ContainerHandle => ContainerStage, CONTAINER;
            service_ports: Vec<ServicePortInfo> => ServicePortStage, SERVICE_PORTS;
            #[serde(default)]
            runner: Option<RunnerPorts> => RunnerStage, RUNNER;
        }
    };
}
pub(crate) use with_kernel_stages;

/// [`KernelResources`] from the list.
macro_rules! kernel_resources {
    ($($(#[$attr:meta])* $module:ident: $resource:ty => $stage:ident, $key:ident;)+) => {
        /// Every stage's resource of a set-up kernel, as persisted in the store and re-adopted
        /// on restart: one field per stage, named as its module, in setup order. The field
        /// names and order are the JSON layout of `resources_version` 1 (`store.rs`).
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        pub struct KernelResources {
            $(
                #[doc = concat!("The `", stringify!($module), "` stage's resource.")]
                $(#[$attr])*
                pub $module: $resource,
            )+
        }
    };
}

with_kernel_stages!(kernel_resources);

/// A created and started container.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerHandle {
    /// Engine id.
    pub id: String,
    /// Engine name (`kernel.<kernel-id>`).
    pub name: String,
}

/// A kernel's scratch directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScratchDir {
    /// Absolute path `<scratch-root>/<kernel-id>`.
    pub path: PathBuf,
    /// `work/` is a tmpfs mount (size quota) that teardown unmounts.
    pub tmpfs: bool,
}

impl ScratchDir {
    /// `<path>/config`.
    pub fn config_dir(&self) -> PathBuf {
        self.path.join("config")
    }

    /// `<path>/work`.
    pub fn work_dir(&self) -> PathBuf {
        self.path.join("work")
    }
}

/// A published service port: Backend.AI's `{"name", "protocol", "container_ports", "host_ports"}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServicePortInfo {
    /// Service name.
    pub name: String,
    /// Protocol as requested.
    pub protocol: String,
    /// Ports in the container.
    pub container_ports: Vec<u16>,
    /// The host ports they are published on, index for index.
    pub host_ports: Vec<u16>,
}

impl ServicePortInfo {
    /// As the wire map, Backend.AI's `ServicePort` shape:
    /// `{name, protocol, container_ports, host_ports, is_inference}`.
    pub fn to_value(&self) -> Value {
        let ports = |p: &[u16]| Value::Array(p.iter().map(|&x| x.into()).collect());
        Value::Map(vec![
            ("name".into(), self.name.clone().into()),
            ("protocol".into(), self.protocol.clone().into()),
            ("container_ports".into(), ports(&self.container_ports)),
            ("host_ports".into(), ports(&self.host_ports)),
            // Backend.AI's `ServicePort` carries it; no inference endpoints here.
            ("is_inference".into(), false.into()),
        ])
    }
}

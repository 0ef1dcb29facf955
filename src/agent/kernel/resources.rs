//! What some stages of a kernel hold once set up, as plain data: the store persists it (in
//! [`KernelResources`](super::KernelResources), one field per stage), the dangling table and
//! the agent's services read it, none of them needing the stages' code or the agent context
//! (which is why it lives apart from the stage files, each of which re-exports its own).

use std::path::PathBuf;

use rmpv::Value;
use serde::{Deserialize, Serialize};

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

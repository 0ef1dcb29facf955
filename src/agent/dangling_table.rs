//! The table of dangling kernels (see `dangling.rs`): what recovery found of each container
//! its store does not know, kept apart from the adopt/destroy logic so that the agent's
//! context can hold the table without depending on that logic.

use std::sync::Mutex;

use rmpv::Value;

use super::events::AgentEvent;
use super::kernel::{KernelConfig, KernelResources, Owner};
use super::resources::SlotAllocation;

/// A kernel rebuilt from its container: what the registry's `Adopt` needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Rebuilt {
    /// Its config, as far as the engine tells it (`image` is the image id; `session_type` is
    /// `interactive`: the engine does not record it).
    pub config: KernelConfig,
    /// Every stage's resource.
    pub resources: KernelResources,
}

/// A container carrying this agent's id that no live store record claims.
#[derive(Clone, Debug)]
pub struct DanglingKernel {
    /// Its `ai.backend.kernel-id` label (empty when absent).
    pub kernel_id: String,
    /// Its `ai.backend.session-id` label (empty when absent).
    pub session_id: String,
    /// The engine's container id.
    pub container_id: String,
    /// Running when recovery found it.
    pub running: bool,
    /// The image id it runs.
    pub image: String,
    /// Its slots and devices: from its labels, else `NanoCpus` / 10⁶ millicores, `Memory` bytes,
    /// `nvidia` device requests as `cuda.device` (0 when unlimited).
    pub slots: SlotAllocation,
    /// Its published host ports, in service-port order.
    pub host_ports: Vec<u16>,
    /// The owner from `ai.backend.owner` (default when absent or unreadable).
    pub owner: Owner,
    /// The kernel rebuilt, or why it cannot be (then it can only be destroyed).
    pub rebuilt: Result<Rebuilt, String>,
    /// `slots` and `host_ports` are reserved in the agent's allocators for it.
    pub reserved: bool,
}

impl DanglingKernel {
    /// The `kernel_dangling` event describing it.
    pub fn event(&self) -> AgentEvent {
        AgentEvent::KernelDangling {
            kernel_id: self.kernel_id.clone(),
            session_id: self.session_id.clone(),
            container_id: self.container_id.clone(),
            running: self.running,
            image: self.image.clone(),
            host_ports: self.host_ports.clone(),
            resource_slots: self.slots.slots.clone(),
            access_key: self.owner.access_key.clone(),
            adoptable: self.rebuilt.is_ok(),
            not_adoptable_reason: self.rebuilt.as_ref().err().cloned(),
        }
    }

    /// As the wire map of `list_dangling_kernels`: `{"id", "session_id", "container_id",
    /// "running", "image", "host_ports": [int], "resource_slots": {name: "decimal"},
    /// "access_key", "adoptable", "reason" (str or nil)}`.
    pub fn to_value(&self) -> Value {
        let ports = Value::Array(self.host_ports.iter().map(|&p| p.into()).collect());
        Value::Map(vec![
            ("id".into(), self.kernel_id.clone().into()),
            ("session_id".into(), self.session_id.clone().into()),
            ("container_id".into(), self.container_id.clone().into()),
            ("running".into(), self.running.into()),
            ("image".into(), self.image.clone().into()),
            ("host_ports".into(), ports),
            ("resource_slots".into(), self.slots.slots.to_msgpack()),
            ("access_key".into(), self.owner.access_key.clone().into()),
            ("adoptable".into(), self.rebuilt.is_ok().into()),
            (
                "reason".into(),
                self.rebuilt
                    .as_ref()
                    .err()
                    .map_or(Value::Nil, |r| r.clone().into()),
            ),
        ])
    }
}

/// The agent's dangling kernels, waiting for the manager's decision. Filled by recovery
/// (replacing what a previous run of it left), emptied by `dangling::adopt` and
/// `dangling::destroy`.
#[derive(Debug, Default)]
pub struct DanglingTable {
    entries: Mutex<Vec<DanglingKernel>>,
}

impl DanglingTable {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<DanglingKernel>> {
        self.entries.lock().expect("dangling table lock")
    }

    /// Replaces the whole table (recovery; the allocators were reset before it).
    pub fn replace(&self, entries: Vec<DanglingKernel>) {
        *self.lock() = entries;
    }

    /// Every entry, in the order recovery found them.
    pub fn list(&self) -> Vec<DanglingKernel> {
        self.lock().clone()
    }

    /// Removes and returns the entries of `kernel_id` (several containers may claim one id).
    pub fn take(&self, kernel_id: &str) -> Vec<DanglingKernel> {
        let mut entries = self.lock();
        let (taken, kept) = std::mem::take(&mut *entries)
            .into_iter()
            .partition(|k| k.kernel_id == kernel_id);
        *entries = kept;
        taken
    }

    /// Returns entries [`DanglingTable::take`] took (adopting or destroying them failed).
    pub fn put_back(&self, mut entries: Vec<DanglingKernel>) {
        self.lock().append(&mut entries);
    }
}

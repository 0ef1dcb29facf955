//! Messages the kernel actor ([`super::actor::Kernel`]) receives from the other kernel modules:
//! from its stage tree (`tree.rs`) and the container watcher (`watch.rs`). They live here,
//! apart from the actor, so that those modules need not depend on it.

use actix::Message;

/// The container stage's watcher saw the container end, and the restart policy does not
/// restart it: the kernel ends with `reason` (`self-terminated`, `oom-killed`, `shm-exceeded`).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ContainerEnded {
    /// Why the container ended.
    pub reason: String,
    /// Its exit code, when it exited.
    pub exit_code: Option<i64>,
}

/// A stage's status changed (the stage tree's observer): a restart by the restart policy
/// began, or finished.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StagesChanged;

//! Workload terms the agent and the manager share: what a session asks for that both sides
//! parse (the manager from JSON, the agent from the kernel config's msgpack).

pub mod grace;
pub mod restart_policy;

pub use grace::Grace;
pub use restart_policy::{RestartMode, RestartPolicy};

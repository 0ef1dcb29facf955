//! The manager actor host. Now: the agent pool (seed 000); the store, event intake, agent
//! registry, scheduler and HTTP API arrive with the manager issue.

pub mod pool;

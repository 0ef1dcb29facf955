//! kernelvisor: an actor-model node agent and control plane for running compute kernels on GPU
//! clusters, compatible with Backend.AI's agent RPC (callosum over ZeroMQ with CurveZMQ).
//!
//! See `README.md` and `docs/` for the architecture; the supervision toolkit is the `actors` crate.

pub mod agent;
pub mod config;
pub mod ctl;
pub mod limits;
pub mod made_ahead;
pub mod manager;
pub mod model;
pub mod retry;
pub mod rpc;
pub mod signals;
pub mod slots;
pub mod workload;

//! The callosum-compatible RPC layer over ZeroMQ (`docs/wire-protocol.md`).
//!
//! - [`codec`]: the wire format as pure functions.
//! - [`curve`] and [`zap`]: CurveZMQ keys, certificate files, and the ZAP handler.
//! - [`socket`]: socket options (LINGER, CURVE, TCP keepalive).
//! - [`dispatch`] and [`server`]: the agent's ROUTER endpoint and its method table.
//! - [`peer`]: one persistent DEALER connection, shared by concurrent callers.
//! - [`intake_api`]: the manager's event intake (`agent_events`, `agent_heartbeat`), typed.
//! - [`failure`]: the FAILURE names kernelvisor's ends answer with, one enum both read.

pub mod agent_api;
pub mod bai_ext;
pub mod codec;
pub mod context;
pub mod curve;
pub mod dispatch;
pub mod failure;
pub mod intake_api;
pub mod mux;
pub mod peer;
pub mod server;
pub mod socket;
pub mod zap;

pub use codec::{Call, ErrorMeta};
pub use curve::{CurveKey, KeyPair};
pub use dispatch::{Dispatcher, RequestObserver};
pub use failure::Failure;
pub use peer::{CallError, Peer, PeerOptions};
pub use server::{RpcServer, ServerCurve};

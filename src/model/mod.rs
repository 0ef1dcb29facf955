//! The HTTP API's request and reply types, one file per noun: the manager's handlers return
//! them (`manager::api`), its OpenAPI document is generated from them
//! (`manager::api::openapi`), and `kernelvisor ctl` reads the replies back into them
//! (`ctl::render`). The contract in words: `docs/manager-api.md`.
//!
//! Reply types carry `#[serde(default)]` so that an older CLI reads a newer manager's answer
//! (a missing key is its default, an unknown key is ignored); the document still says what
//! the manager writes: `#[schema(required = true)]` on every key it always writes, and
//! [`CLOSED_REPLIES`] for the answers that have exactly these keys (additionalProperties
//! false). Request bodies are strict (`deny_unknown_fields`).
//!
//! Nothing here depends on the HTTP layer or the manager's actors: the scheduler takes a
//! [`session::SessionRequest`] as the handler decoded it.

pub mod access_key;
pub mod agent;
pub mod cluster;
pub mod error;
pub mod event;
pub mod exec;
pub mod file;
pub mod health;
pub mod image;
pub mod object;
pub mod pull;
pub mod queue;
pub mod reclaim;
pub mod service;
pub mod session;
pub mod slots;
pub mod terminal;
pub mod vfolder;

/// Reply schemas whose keys are exactly the type's fields (the handler writes nothing else):
/// the document marks them `additionalProperties: false`, which serde's
/// `deny_unknown_fields` cannot say for a type a reader must also read leniently. The others
/// (services) pass through what the agent answers and stay open.
pub const CLOSED_REPLIES: &[&str] = &[
    "AccessKey",
    "AccessKeyList",
    "Agent",
    "AgentList",
    "Commit",
    "ErrorBody",
    "ErrorDetail",
    "Event",
    "ExecuteAnswer",
    "FileEntry",
    "FileList",
    "Health",
    "NewAccessKey",
    "PullProgress",
    "PurgedImage",
    "PurgedImages",
    "ServiceList",
    "Session",
    "SessionCreated",
    "SessionKernel",
    "SessionList",
    "SessionMount",
    "Stage",
    "Uploaded",
    "Vfolder",
    "VfolderList",
];

/// Reply schemas whose `#[serde(default)]` is for readers only: the document lists no
/// `default` values for their properties (the manager always writes them).
pub const REPLIES: &[&str] = &[
    "AccessKey",
    "AccessKeyList",
    "Agent",
    "AgentList",
    "Commit",
    "ErrorBody",
    "ErrorDetail",
    "Event",
    "ExecuteAnswer",
    "FileEntry",
    "FileList",
    "Health",
    "NewAccessKey",
    "PullProgress",
    "PurgedImage",
    "PurgedImages",
    "Service",
    "ServiceList",
    "ServiceStarted",
    "Session",
    "SessionCreated",
    "SessionKernel",
    "SessionList",
    "SessionMount",
    "Stage",
    "Uploaded",
    "Vfolder",
    "VfolderList",
];

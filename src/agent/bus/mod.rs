//! Backend.AI's event bus (`[redis]`): what a 26.x manager learns of this agent and its kernels
//! (issue 25). The bus is Redis streams and pub/sub, as `ai.backend.common.message_queue.
//! redis_queue` uses them: every event is `XADD`ed to the stream `events` (anycast, read by the
//! manager's consumer group `manager`) of logical database 4 (`REDIS_STREAM_DB`), and kernel
//! and session events are also `PUBLISH`ed on the channel `events_all` (broadcast), as
//! `AbstractAgent.anycast_and_broadcast_event` does (`ai/backend/agent/agent.py`).
//!
//! - [`encode`]: our [`AgentEvent`](super::events::AgentEvent)s as upstream's event classes
//!   (names, JSON bodies, stream fields, broadcast JSON), and `AgentInfo`;
//! - [`logs`]: a finished kernel's logs as upstream's `ContainerLogData` chunks, pushed before
//!   its `do_sync_kernel_logs`;
//! - [`sender`]: the `bus-sender` child, which publishes the bus outbox (`bus_outbox`) oldest
//!   first, each event exactly once (dedup by event id in Redis, atomically with the publish),
//!   and a heartbeat every heartbeat interval.

pub mod encode;
pub mod logs;
pub mod sender;

#[cfg(test)]
mod fixtures;

//! Kernel presence: every running kernel's hash `kernel:presence:<kernel_id>` in the live
//! database (2), `presence` `"1"` and `last_presence` the server's clock in Unix seconds, its TTL
//! 300 s — `ValkeyScheduleClient.update_kernel_presence_batch`
//! (`ai/backend/common/clients/valkey_client/valkey_schedule/client.py`), as upstream's
//! `KernelPresenceObserver` (`ai/backend/agent/observer/kernel_presence.py`) writes it every
//! 60 s for its running containers.
//!
//! The manager's stale-kernel sweep (`SessionTerminator.check_stale_kernels`,
//! `ai/backend/manager/sokovan/scheduler/terminator/terminator.py`) reads these with
//! `check_kernel_presence_status_batch`: a kernel whose hash is missing, or whose
//! `last_presence` is over 120 s old, is asked about with one `check_running` call. Besides the
//! 60-second refresh, a kernel is written at once when it starts, so the sweep never has to ask
//! about a kernel that is running here.

use super::conn::{Conns, Failure};

/// The live database (`ai.backend.common.defs.REDIS_LIVE_DB`).
pub const DB: i64 = 2;

/// Seconds between two writes of every running kernel (`KernelPresenceObserver.
/// observe_interval`).
pub const INTERVAL_SECS: u64 = 60;

/// The hash's TTL in seconds (`KERNEL_HEALTH_TTL_SEC`).
pub const TTL_SECS: i64 = 300;

/// The hash of kernel `kernel_id`.
pub fn key(kernel_id: &str) -> String {
    format!("kernel:presence:{kernel_id}")
}

/// Writes `kernel_ids` as present now (nothing for none).
///
/// Errors: the [`Failure`] of the `TIME` or of the writes.
pub async fn write(conns: &mut Conns, kernel_ids: &[String]) -> Result<(), Failure> {
    if kernel_ids.is_empty() {
        return Ok(());
    }
    let now = conns.time(DB).await?.to_string();
    let mut pipe = redis::pipe();
    for id in kernel_ids {
        let key = key(id);
        pipe.hset_multiple(&key, &[("presence", "1"), ("last_presence", now.as_str())])
            .ignore()
            .expire(&key, TTL_SECS)
            .ignore();
    }
    conns.pipe::<()>(DB, &pipe).await
}

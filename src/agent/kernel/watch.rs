//! What the container stage watches while its kernel lives: the engine's events for its
//! container (the exit watcher routes them here through [`KernelHandle::poke_container`]) and,
//! when the image has a Docker `HEALTHCHECK`, its health status.
//!
//! A container that ended (or turned `unhealthy`) is classified; if the session's restart
//! policy restarts it, the watcher fails, so that the container stage releases the dead
//! container and its supervisor restarts `container` and `service-ports` (`rest_for_one`, within
//! the policy's intensity). Otherwise the kernel actor is told ([`ContainerEnded`]) and ends the
//! kernel with the reason.

use std::time::Duration;

use actix::Recipient;
use actors::BoxError;
use futures::future::{FutureExt, LocalBoxFuture};

use super::messages::ContainerEnded;
use super::stages::ContainerHandle;
use super::{KernelHandle, KernelStatus};

/// Re-inspections (100 ms apart) of a container that died by SIGKILL without an OOM sign.
const OOM_FLAG_RECHECKS: usize = 20;

/// How often a container with a `HEALTHCHECK` has its health status read.
const HEALTH_POLL: Duration = Duration::from_secs(1);

/// Why a container exited (ARCHITECTURE.md, "Kernel status"): OOM → `oom-killed`; 135
/// (SIGBUS) with a `/dev/shm` → `shm-exceeded`; otherwise `self-terminated`.
pub fn exit_reason(exit_code: Option<i64>, oom_killed: bool) -> &'static str {
    match (oom_killed, exit_code) {
        (true, _) => "oom-killed",
        // Every kernel has a /dev/shm (`resource_opts.shmem` or the agent default).
        (false, Some(135)) => "shm-exceeded",
        _ => "self-terminated",
    }
}

/// The container stage's watcher for kernel `h`: `ended` learns of an end that is not
/// restarted.
pub fn container_watcher(
    h: KernelHandle,
    ended: Recipient<ContainerEnded>,
) -> impl Fn(&ContainerHandle) -> LocalBoxFuture<'static, Result<(), BoxError>> + Send + Sync + 'static
{
    move |c: &ContainerHandle| watch(h.clone(), ended.clone(), c.id.clone()).boxed_local()
}

/// What one look at the container found.
enum Seen {
    Running {
        has_health: bool,
    },
    Unhealthy,
    Ended {
        reason: &'static str,
        exit_code: Option<i64>,
    },
    /// The engine did not answer: look again on the next event.
    Unknown,
}

async fn watch(
    h: KernelHandle,
    ended: Recipient<ContainerEnded>,
    container_id: String,
) -> Result<(), BoxError> {
    let mut events = h.container_events.subscribe();
    let policy = h.info().config.restart_policy;
    let (mut has_health, mut unhealthy_reported) = (false, false);
    loop {
        // Looked at once at start too: it may have ended before this watcher subscribed.
        match look(&h, &container_id).await {
            Seen::Running { has_health: hc } => {
                has_health = hc;
                unhealthy_reported = false;
            }
            Seen::Unknown => {}
            Seen::Unhealthy if policy.restarts_after(true) => {
                h.update(|i| {
                    i.last_exit = Some(("unhealthy".into(), None));
                    i.status = KernelStatus::Restarting;
                });
                return Err("container is unhealthy (its HEALTHCHECK failed)".into());
            }
            Seen::Unhealthy => {
                if !unhealthy_reported {
                    tracing::warn!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, "container is unhealthy; restart policy `never` keeps it");
                    unhealthy_reported = true;
                }
            }
            Seen::Ended { reason, exit_code } => {
                let failed = !(reason == "self-terminated" && exit_code == Some(0));
                h.update(|i| i.last_exit = Some((reason.to_owned(), exit_code)));
                if policy.restarts_after(failed) {
                    h.update(|i| i.status = KernelStatus::Restarting);
                    return Err(
                        format!("container ended: {reason} (exit code {exit_code:?})").into(),
                    );
                }
                ended.do_send(ContainerEnded {
                    reason: reason.to_owned(),
                    exit_code,
                });
                return Ok(());
            }
        }
        tokio::select! {
            changed = events.changed() => {
                if changed.is_err() {
                    // The kernel handle is gone: nothing will ask again.
                    std::future::pending::<()>().await;
                }
            }
            _ = tokio::time::sleep(HEALTH_POLL), if has_health => {}
        }
    }
}

/// Inspects the container and classifies what it finds.
async fn look(h: &KernelHandle, container_id: &str) -> Seen {
    let info = h.info();
    if info.manual_restart {
        // `restart_kernel` stops and starts it: its exit meanwhile is not an end.
        return Seen::Unknown;
    }
    if matches!(
        info.status,
        KernelStatus::Terminating | KernelStatus::Terminated
    ) {
        // The kernel is being ended (its container stopped with its grace): the workload's
        // exit is that end's, never one to restart after.
        return Seen::Unknown;
    }
    let state = match h.ctx.backend.inspect_container(container_id).await {
        Ok(Some(s)) if s.running => {
            return if s.health.as_deref() == Some("unhealthy") {
                Seen::Unhealthy
            } else {
                Seen::Running {
                    has_health: s.health.is_some(),
                }
            };
        }
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %e, "cannot inspect the kernel's container");
            return Seen::Unknown;
        }
    };
    let (exit_code, flag) = state.map_or((None, false), |s| (s.exit_code, s.oom_killed));
    let mut oom = flag || h.info().oom_event;
    // SIGKILL with neither the OOM flag nor the engine's `oom` event yet: the engine may
    // deliver the OOM just after the exit, and with cgroup v1 may then never set the flag
    // (seen on CI). Wait briefly for either before calling it self-terminated.
    for _ in 0..OOM_FLAG_RECHECKS {
        if oom || exit_code != Some(137) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        oom = h.info().oom_event
            || matches!(h.ctx.backend.inspect_container(container_id).await, Ok(Some(s)) if s.oom_killed);
    }
    Seen::Ended {
        reason: exit_reason(exit_code, oom),
        exit_code,
    }
}

#[cfg(test)]
mod tests {
    use super::exit_reason;

    #[test]
    fn exit_reasons_follow_the_architecture() {
        assert_eq!(exit_reason(Some(137), true), "oom-killed");
        assert_eq!(exit_reason(Some(135), false), "shm-exceeded");
        assert_eq!(exit_reason(Some(0), false), "self-terminated");
        assert_eq!(exit_reason(None, false), "self-terminated");
    }
}

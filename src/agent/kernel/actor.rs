//! The kernel actor: owns the kernel's [`StageChain`] and runs its lifecycle. Operations on
//! one kernel run one at a time (setup, restart, teardown); status queries never reach the
//! actor (the registry reads the shared [`KernelInfo`]).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::actors::StageChain;
use actix::prelude::*;

use super::chain;
use super::{KernelError, KernelHandle, KernelInfo, KernelStatus};
use crate::agent::events::AgentEvent;

/// Sets the kernel up (every stage in order). On failure everything set up is torn down in
/// reverse, the kernel ends `TERMINATED` (`failed-to-create`) and the error names the stage.
#[derive(Debug, Message)]
#[rtype(result = "Result<KernelInfo, KernelError>")]
pub struct Setup;

/// Tears the kernel down and ends it `TERMINATED` with `reason`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Terminate {
    /// `user-requested`, `agent-reset`, … as given by the caller.
    pub reason: String,
    /// Exit code to report, if known.
    pub exit_code: Option<i64>,
    /// Publish no `kernel_terminated` (`reset_agent`, or `destroy_kernel(suppress_events=True)`).
    pub suppress_events: bool,
}

/// The engine says the container exited: confirm, classify (`oom-killed`, `shm-exceeded`,
/// `self-terminated`) and tear down. Ignored unless the kernel is `RUNNING` and its container
/// really is not running (a restart also produces a `die`).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ContainerDied;

/// Restarts the container (`RESTARTING` → `RUNNING`).
#[derive(Debug, Message)]
#[rtype(result = "Result<KernelInfo, KernelError>")]
pub struct Restart;

/// Stops the actor without tearing anything down: the container keeps running and the next
/// agent start re-attaches it from the store (graceful shutdown, `on-shutdown = "preserve"`).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Detach;

/// A batch session's `batch_timeout` passed: the kernel ends with reason `batch-timeout`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct BatchTimedOut;

/// Sent to the registry when a kernel actor has stopped, for whatever reason.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct KernelGone(pub String);

/// One kernel: a supervised actor owning one stage per resource.
pub struct Kernel {
    handle: KernelHandle,
    /// `None` only while an operation has lent it.
    chain: Option<StageChain>,
    /// Torn down or detached: nothing left to do but stop.
    done: bool,
    gone: Recipient<KernelGone>,
    /// Follows the container's output into the agent's log store while it runs; taken by
    /// [`finish`] to drain it after the container is removed.
    log_keeper: Keeper,
}

type Keeper = Arc<Mutex<Option<crate::agent::logs::LogKeeper>>>;

/// The kernel became `RUNNING` (`arm_timeout`: for the first time in this actor) or its
/// container was restarted: keep its logs, arm a batch timeout.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct NowRunning {
    arm_timeout: bool,
}

impl Kernel {
    /// A kernel actor around `chain` (new, or rebuilt on recovery); `gone` learns when it stops.
    pub fn new(handle: KernelHandle, chain: StageChain, gone: Recipient<KernelGone>) -> Kernel {
        Kernel {
            handle,
            chain: Some(chain),
            done: false,
            gone,
            log_keeper: Keeper::default(),
        }
    }

    /// What a kernel does once it is `RUNNING` (set up, or adopted after an agent restart): keep
    /// its logs, and arm a batch session's timeout (after a restart, from then: the agent does
    /// not record when the job started).
    fn on_running(&mut self, ctx: &mut Context<Self>, arm_timeout: bool) {
        let info = self.handle.info();
        if self.done || info.status != KernelStatus::Running {
            return;
        }
        let mut keeper = self.log_keeper.lock().expect("log keeper lock");
        if let (Some(container_id), true) = (
            &info.container_id,
            keeper.as_ref().is_none_or(|k| k.is_finished()),
        ) {
            *keeper = Some(self.handle.ctx.logs.keep(
                self.handle.ctx.backend.clone(),
                &self.handle.id,
                container_id,
            ));
        }
        // A timeout longer than a `Duration` holds (≥ 2^64 s) never fires.
        if let (Some(Ok(t)), true) = (
            info.config.batch_timeout.map(Duration::try_from_secs_f64),
            arm_timeout,
        ) {
            ctx.notify_later(BatchTimedOut, t);
        }
    }

    /// Lends the chain to `work`, puts it back after; atomic, so the kernel's operations never
    /// interleave. `work` returns whether the kernel is finished (then the actor stops).
    fn lend<R, Fut>(
        &mut self,
        work: impl FnOnce(KernelHandle, StageChain) -> Fut,
    ) -> AtomicResponse<Self, R>
    where
        R: 'static,
        Fut: Future<Output = (StageChain, bool, R)> + 'static,
    {
        let chain = self
            .chain
            .take()
            .expect("the kernel holds its chain between operations");
        let lent = work(self.handle.clone(), chain);
        AtomicResponse::new(Box::pin(lent.into_actor(self).map(
            |(chain, finished, result), act, ctx| {
                act.chain = Some(chain);
                if finished {
                    act.done = true;
                    ctx.stop();
                }
                result
            },
        )))
    }
}

/// Longest wait for the log keeper to take a removed container's last output.
const LOG_KEEPER_DRAIN: Duration = Duration::from_secs(3);

/// Tears `chain` down and records the end; shared by every way a kernel ends. A batch session
/// reports its result first (`session_success` when its command exited 0, else
/// `session_failure` with the reason), then `kernel_terminated`.
async fn finish(
    h: &KernelHandle,
    chain: &mut StageChain,
    keeper: &Keeper,
    reason: &str,
    exit_code: Option<i64>,
    suppress_events: bool,
) {
    h.set_status(KernelStatus::Terminating);
    if let Err(e) = h
        .ctx
        .store
        .set_status(&h.id, KernelStatus::Terminating, None)
        .await
    {
        tracing::error!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %e, "store: cannot record TERMINATING");
    }
    if let Err(e) = chain.teardown().await {
        tracing::error!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %e, "kernel teardown incomplete");
    }
    let keeper = keeper.lock().expect("log keeper lock").take();
    if let Some(keeper) = keeper {
        // The container is gone, so the keeper's stream ends once it has written the last bytes.
        keeper.finish(LOG_KEEPER_DRAIN).await;
    }
    if h.info().config.session_type == super::SessionType::Batch && !suppress_events {
        let (kernel_id, session_id) = (h.id.clone(), h.session_id.clone());
        h.ctx
            .events
            .emit(if reason == "self-terminated" && exit_code == Some(0) {
                AgentEvent::SessionSuccess {
                    kernel_id,
                    session_id,
                    exit_code,
                }
            } else {
                AgentEvent::SessionFailure {
                    kernel_id,
                    session_id,
                    reason: reason.to_owned(),
                    exit_code,
                }
            });
    }
    if let Err(e) = h.ctx.store.set_terminated(&h.id, reason, exit_code).await {
        tracing::error!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %e, "store: cannot record TERMINATED");
    }
    h.terminated(reason, exit_code, suppress_events);
}

/// Re-inspections (100 ms apart) of a container that died by SIGKILL without an OOM sign.
const OOM_FLAG_RECHECKS: usize = 20;

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

impl Actor for Kernel {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Adopted after an agent restart: already running.
        if self.handle.info().status == KernelStatus::Running {
            self.on_running(ctx, true);
        }
    }

    fn stopping(&mut self, _: &mut Context<Self>) -> Running {
        if !self.done {
            // Stopped by its supervisor without a Terminate: keep the resources (the store has
            // them) so the next start re-attaches, as a detach would.
            tracing::info!(agent_id = %self.handle.ctx.agent_id, kernel_id = %self.handle.id, "kernel actor stopped without teardown; resources kept");
        }
        Running::Stop
    }

    fn stopped(&mut self, _: &mut Context<Self>) {
        self.gone.do_send(KernelGone(self.handle.id.clone()));
    }
}

impl Handler<Setup> for Kernel {
    type Result = AtomicResponse<Self, Result<KernelInfo, KernelError>>;

    fn handle(&mut self, _: Setup, ctx: &mut Context<Self>) -> Self::Result {
        let (me, keeper) = (ctx.address(), self.log_keeper.clone());
        let response = self.lend(move |h, mut chain| async move {
            h.set_status(KernelStatus::Preparing);
            let failure = match chain.setup().await {
                Ok(()) => {
                    let resources = chain::resources(&chain).expect("a set-up chain holds every resource");
                    match h.ctx.store.set_status(&h.id, KernelStatus::Running, Some(&resources)).await {
                        Ok(()) => {
                            h.update(|i| i.runtime_path = resources.image.labels.get(crate::agent::backend::labels::RUNTIME_PATH).cloned());
                            h.set_status(KernelStatus::Running);
                            me.do_send(NowRunning { arm_timeout: true });
                            return (chain, false, Ok(h.info()));
                        }
                        Err(e) => KernelError::Engine(format!("store: {e}")),
                    }
                }
                Err(e) => KernelError::from_setup(&e),
            };
            tracing::warn!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %failure, "kernel creation failed");
            finish(&h, &mut chain, &keeper, "failed-to-create", None, false).await;
            (chain, true, Err(failure))
        });
        response
    }
}

impl Handler<Terminate> for Kernel {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, t: Terminate, _: &mut Context<Self>) -> Self::Result {
        let (done, keeper) = (self.done, self.log_keeper.clone());
        self.lend(move |h, mut chain| async move {
            if !done {
                finish(
                    &h,
                    &mut chain,
                    &keeper,
                    &t.reason,
                    t.exit_code,
                    t.suppress_events,
                )
                .await;
            }
            (chain, true, ())
        })
    }
}

impl Handler<ContainerDied> for Kernel {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: ContainerDied, _: &mut Context<Self>) -> Self::Result {
        let (done, keeper) = (self.done, self.log_keeper.clone());
        self.lend(move |h, mut chain| async move {
            let info = h.info();
            let (Some(container_id), KernelStatus::Running, false) = (info.container_id, info.status, done) else {
                return (chain, done, ());
            };
            let state = match h.ctx.backend.inspect_container(&container_id).await {
                Ok(Some(s)) if s.running => return (chain, false, ()),
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %e, "cannot inspect an exited container");
                    return (chain, false, ());
                }
            };
            let (exit_code, flag) = state.map_or((None, false), |s| (s.exit_code, s.oom_killed));
            let mut oom = flag || h.info().oom_event;
            // SIGKILL with neither the OOM flag nor the engine's `oom` event yet: the engine may
            // deliver the OOM just after the exit, and with cgroup v1 may then never set the
            // flag (seen on CI). Wait briefly for either before calling it self-terminated.
            for _ in 0..OOM_FLAG_RECHECKS {
                if oom || exit_code != Some(137) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                oom = h.info().oom_event
                    || matches!(h.ctx.backend.inspect_container(&container_id).await, Ok(Some(s)) if s.oom_killed);
            }
            finish(&h, &mut chain, &keeper, exit_reason(exit_code, oom), exit_code, false).await;
            (chain, true, ())
        })
    }
}

impl Handler<Restart> for Kernel {
    type Result = AtomicResponse<Self, Result<KernelInfo, KernelError>>;

    fn handle(&mut self, _: Restart, ctx: &mut Context<Self>) -> Self::Result {
        let me = ctx.address();
        self.lend(move |h, chain| async move {
            let info = h.info();
            let Some(container_id) = info
                .container_id
                .filter(|_| info.status == KernelStatus::Running)
            else {
                return (
                    chain,
                    false,
                    Err(KernelError::NotRunning(h.id.clone(), info.status.as_str())),
                );
            };
            h.set_status(KernelStatus::Restarting);
            match h
                .ctx
                .backend
                .restart_container(&container_id, Duration::from_secs(10))
                .await
            {
                Ok(()) => {
                    h.update(|i| i.oom_event = false);
                    h.set_status(KernelStatus::Running);
                    me.do_send(NowRunning { arm_timeout: false });
                    (chain, false, Ok(h.info()))
                }
                Err(e) => {
                    // Back to RUNNING without a `kernel_started`; if the container is in fact
                    // gone, the check below ends the kernel the usual way.
                    h.update(|i| i.status = KernelStatus::Running);
                    me.do_send(ContainerDied);
                    (chain, false, Err(KernelError::from(e)))
                }
            }
        })
    }
}

impl Handler<NowRunning> for Kernel {
    type Result = ();

    fn handle(&mut self, m: NowRunning, ctx: &mut Context<Self>) {
        self.on_running(ctx, m.arm_timeout);
    }
}

impl Handler<BatchTimedOut> for Kernel {
    type Result = ();

    fn handle(&mut self, _: BatchTimedOut, ctx: &mut Context<Self>) {
        if self.done || self.handle.info().status != KernelStatus::Running {
            return;
        }
        tracing::info!(agent_id = %self.handle.ctx.agent_id, kernel_id = %self.handle.id, "batch session exceeded its batch_timeout");
        ctx.notify(Terminate {
            reason: "batch-timeout".into(),
            exit_code: None,
            suppress_events: false,
        });
    }
}

impl Handler<Detach> for Kernel {
    type Result = ();

    fn handle(&mut self, _: Detach, ctx: &mut Context<Self>) {
        if let Some(chain) = self.chain.as_mut() {
            let kept = chain.detach();
            tracing::info!(agent_id = %self.handle.ctx.agent_id, kernel_id = %self.handle.id, stages = ?kept, "kernel detached");
        }
        // The next agent start follows the container's logs again from the file's last write.
        if let Some(k) = self.log_keeper.lock().expect("log keeper lock").take() {
            k.abort();
        }
        self.done = true;
        ctx.stop();
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

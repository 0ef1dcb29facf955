//! The kernel actor: owns the kernel's [`StageTree`] (one supervised actor per stage) and runs
//! its lifecycle. Operations on one kernel run one at a time (setup, restart, teardown);
//! status queries never reach the actor (the registry reads the shared [`KernelInfo`]).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ::actors::{ExitReason, StageStatus, StageTree, Supervisor};
use actix::prelude::*;

use super::messages::{ContainerEnded, StagesChanged};
use super::tree::{self, KernelRecipients};
use super::{KernelError, KernelHandle, KernelInfo, KernelStatus};
use crate::agent::events::AgentEvent;

/// Sets the kernel up (every stage in order). On failure everything set up is torn down in
/// reverse, the kernel ends `TERMINATED` (`failed-to-create`) and the error names the stage.
#[derive(Debug, Message)]
#[rtype(result = "Result<KernelInfo, KernelError>")]
pub struct Setup;

/// Tears the kernel down and ends it `TERMINATED` with `reason`; answers how its workload
/// ended (default when it had no running container or was already ended).
#[derive(Debug, Message)]
#[rtype(result = "super::Stopped")]
pub struct Terminate {
    /// `user-requested`, `agent-reset`, … as given by the caller.
    pub reason: String,
    /// Exit code to report, if known.
    pub exit_code: Option<i64>,
    /// Publish no `kernel_terminated` (`reset_agent`, or `destroy_kernel(suppress_events=True)`).
    pub suppress_events: bool,
    /// The end's own grace period (`destroy_kernel`'s `grace_period`); `None`: the kernel's own.
    pub grace: Option<Duration>,
}

/// The stage tree's supervisor exited (`Failed`: its restart intensity ran out).
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct TreeExited(ExitReason);

/// The kernel's stage supervisor, while the tree runs (for `WhichChildren`).
#[derive(Debug, Message)]
#[rtype(result = "Option<Addr<Supervisor>>")]
pub struct StageSupervisor;

/// Restarts the container (`RESTARTING` → `RUNNING`).
#[derive(Debug, Message)]
#[rtype(result = "Result<KernelInfo, KernelError>")]
pub struct Restart;

/// Recreates the container with an updated config (`restart_kernel` with `updated_config`):
/// same kernel id, image, slots, host ports, scratch and vfolders; a new container. The caller
/// has checked that nothing allocated changes.
#[derive(Debug, Message)]
#[rtype(result = "Result<KernelInfo, KernelError>")]
pub struct Recreate(pub Box<super::KernelConfig>);

/// Starts the stage tree rebuilt by [`Recreate`].
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct StartRebuilt;

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

/// One kernel: a supervised actor owning its stage tree, one child actor per resource.
pub struct Kernel {
    handle: KernelHandle,
    /// `None` only while an operation has lent it.
    tree: Option<StageTree>,
    /// The tree's supervisor once started (the tree may be lent when asked).
    stage_supervisor: Option<Addr<Supervisor>>,
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
    /// A kernel actor in context `ctx` (new, or with `resources` adopted on recovery); `gone`
    /// learns when it stops.
    ///
    /// Errors: the tree refuses an adopted resource (a programming error).
    pub fn new(
        ctx: &mut Context<Kernel>,
        handle: KernelHandle,
        resources: Option<super::KernelResources>,
        gone: Recipient<KernelGone>,
    ) -> Result<Kernel, ::actors::StageError> {
        let me = ctx.address();
        let recipients = KernelRecipients {
            stages_changed: me.clone().recipient(),
            container_ended: me.recipient(),
        };
        let tree = match resources {
            Some(r) => tree::rebuild(&handle, &recipients, r)?,
            None => tree::build(&handle, &recipients),
        };
        Ok(Kernel {
            handle,
            tree: Some(tree),
            stage_supervisor: None,
            done: false,
            gone,
            log_keeper: Keeper::default(),
        })
    }

    /// Starts the stage tree (every stage sets up in order, or adopts its resource).
    fn start_tree(&mut self, ctx: &mut Context<Self>) {
        let me = ctx.address();
        if let Some(tree) = self.tree.as_mut() {
            tree.start(move |reason| me.do_send(TreeExited(reason)));
            self.stage_supervisor = tree.supervisor();
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

    /// Lends the tree to `work`, puts it back after; atomic, so the kernel's operations never
    /// interleave. `work` returns whether the kernel is finished (then the actor stops).
    fn lend<R, Fut>(
        &mut self,
        work: impl FnOnce(KernelHandle, StageTree) -> Fut,
    ) -> AtomicResponse<Self, R>
    where
        R: 'static,
        Fut: Future<Output = (StageTree, bool, R)> + 'static,
    {
        let tree = self
            .tree
            .take()
            .expect("the kernel holds its tree between operations");
        let lent = work(self.handle.clone(), tree);
        AtomicResponse::new(Box::pin(lent.into_actor(self).map(
            |(tree, finished, result), act, ctx| {
                act.tree = Some(tree);
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

/// Tears the tree down (every stage in reverse) and records the end; shared by every way a
/// kernel ends. A batch session
/// reports its result first (`session_success` when its command exited 0, else
/// `session_failure` with the reason), then `kernel_terminated`.
async fn finish(
    h: &KernelHandle,
    tree: &mut StageTree,
    keeper: &Keeper,
    reason: &str,
    exit_code: Option<i64>,
    suppress_events: bool,
    grace: Option<Duration>,
) -> super::Stopped {
    h.update(|i| {
        if let Some(g) = grace {
            i.grace_override = Some(g);
        }
    });
    h.set_status(KernelStatus::Terminating);
    if let Err(e) = h
        .ctx
        .store
        .set_status(&h.id, KernelStatus::Terminating, None)
        .await
    {
        tracing::error!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %e, "store: cannot record TERMINATING");
    }
    let stages = tree.teardown().await;
    tracing::debug!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, %stages, "kernel stages stopped");
    let keeper = keeper.lock().expect("log keeper lock").take();
    if let Some(keeper) = keeper {
        // The container is gone, so the keeper's stream ends once it has written the last bytes.
        keeper.finish(LOG_KEEPER_DRAIN).await;
    }
    // A batch job that exited within its grace (or had just exited) ended by itself: its exit
    // code is the kernel's, and its result follows it. An interactive kernel's workload only
    // answered the signal: no exit code of its own, as before grace periods.
    let batch = h.info().config.session_type == super::SessionType::Batch;
    let stopped = h.info().stopped.filter(|_| batch).unwrap_or_default();
    let exit_code = exit_code.or(stopped.exit_code);
    let by_itself = reason == "self-terminated" || stopped.exit_code.is_some();
    if batch && !suppress_events {
        let (kernel_id, session_id) = (h.id.clone(), h.session_id.clone());
        h.ctx.events.emit(if by_itself && exit_code == Some(0) {
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
    stopped
}

impl Actor for Kernel {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Adopted after an agent restart: already running; its stages adopt their resources
        // and the container stage checks the container at once.
        if self.handle.info().status == KernelStatus::Running {
            self.start_tree(ctx);
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
        self.handle.set_status(KernelStatus::Preparing);
        self.start_tree(ctx);
        let response = self.lend(move |h, mut tree| async move {
            let failure = match tree.ready().await {
                Ok(()) => {
                    let resources = tree::resources(&tree).expect("a set-up tree holds every resource");
                    match h.ctx.store.set_status(&h.id, KernelStatus::Running, Some(&resources)).await {
                        Ok(()) => {
                            h.update(|i| {
                                i.runtime_path = resources.image.labels.get(crate::agent::backend::labels::RUNTIME_PATH).cloned();
                                i.runner = resources.runner;
                            });
                            h.set_status(KernelStatus::Running);
                            me.do_send(NowRunning { arm_timeout: true });
                            return (tree, false, Ok(h.info()));
                        }
                        Err(e) => KernelError::Engine(format!("store: {e}")),
                    }
                }
                Err(e) => KernelError::from_setup(&e),
            };
            tracing::warn!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %failure, "kernel creation failed");
            // Nothing of it ran for anyone yet: no grace.
            finish(&h, &mut tree, &keeper, "failed-to-create", None, false, Some(Duration::ZERO)).await;
            (tree, true, Err(failure))
        });
        response
    }
}

impl Handler<Terminate> for Kernel {
    type Result = AtomicResponse<Self, super::Stopped>;

    fn handle(&mut self, t: Terminate, _: &mut Context<Self>) -> Self::Result {
        let (done, keeper) = (self.done, self.log_keeper.clone());
        self.lend(move |h, mut tree| async move {
            let mut stopped = super::Stopped::default();
            if !done {
                stopped = finish(
                    &h,
                    &mut tree,
                    &keeper,
                    &t.reason,
                    t.exit_code,
                    t.suppress_events,
                    t.grace,
                )
                .await;
            }
            (tree, true, stopped)
        })
    }
}

impl Handler<ContainerEnded> for Kernel {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, m: ContainerEnded, _: &mut Context<Self>) -> Self::Result {
        let (done, keeper) = (self.done, self.log_keeper.clone());
        self.lend(move |h, mut tree| async move {
            if !done {
                finish(&h, &mut tree, &keeper, &m.reason, m.exit_code, false, None).await;
            }
            (tree, true, ())
        })
    }
}

impl Handler<TreeExited> for Kernel {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, TreeExited(reason): TreeExited, _: &mut Context<Self>) -> Self::Result {
        let (done, keeper) = (self.done, self.log_keeper.clone());
        self.lend(move |h, mut tree| async move {
            if done || !reason.is_abnormal() {
                return (tree, done, ());
            }
            // Every stage is already released in reverse by the supervisor giving up.
            let info = h.info();
            let policy = info.config.restart_policy;
            tracing::warn!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, %reason, restarts = info.restart_count, max_restarts = policy.max_restarts, window = policy.window, "kernel restart limit exceeded");
            let exit_code = info.last_exit.and_then(|(_, code)| code);
            finish(&h, &mut tree, &keeper, "restart-limit-exceeded", exit_code, false, None).await;
            (tree, true, ())
        })
    }
}

impl Handler<StagesChanged> for Kernel {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: StagesChanged, ctx: &mut Context<Self>) -> Self::Result {
        let (done, me) = (self.done, ctx.address());
        self.lend(move |h, tree| async move {
            let info = h.info();
            if done || matches!(info.status, KernelStatus::Terminating | KernelStatus::Terminated) {
                return (tree, done, ());
            }
            let container_restarts = info
                .stages
                .iter()
                .find(|s| s.name == super::stages::CONTAINER.name())
                .map_or(0, |s| s.restarts);
            if container_restarts > info.restart_count {
                // The supervisor began a restart of `container` (and the stages after it).
                let (reason, exit_code) = info.last_exit.clone().unwrap_or(("unknown".into(), None));
                h.update(|i| {
                    i.restart_count = container_restarts;
                    i.status = KernelStatus::Restarting;
                    i.oom_event = false;
                });
                h.ctx.metrics.kernel_restarted(&reason);
                tracing::info!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, restart_count = container_restarts, %reason, ?exit_code, "kernel container restarting by its restart policy");
                h.ctx.events.emit(AgentEvent::KernelRestarting {
                    kernel_id: h.id.clone(),
                    session_id: h.session_id.clone(),
                    restart_count: container_restarts,
                    reason,
                    exit_code,
                });
            }
            let info = h.info();
            let all_ready = !info.stages.is_empty()
                && info.stages.iter().all(|s| s.status == StageStatus::Ready);
            if info.status == KernelStatus::Restarting && !info.manual_restart && all_ready {
                if let Some(resources) = tree::resources(&tree) {
                    if let Err(e) = h.ctx.store.set_status(&h.id, KernelStatus::Running, Some(&resources)).await {
                        tracing::error!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %e, "store: cannot record the restarted container");
                    }
                    h.update(|i| i.container_id = Some(resources.container.id.clone()));
                    h.set_status(KernelStatus::Running);
                    me.do_send(NowRunning { arm_timeout: false });
                }
            }
            (tree, false, ())
        })
    }
}

impl Handler<StageSupervisor> for Kernel {
    type Result = Option<Addr<Supervisor>>;

    fn handle(&mut self, _: StageSupervisor, _: &mut Context<Self>) -> Self::Result {
        self.stage_supervisor.clone()
    }
}

impl Handler<Restart> for Kernel {
    type Result = AtomicResponse<Self, Result<KernelInfo, KernelError>>;

    fn handle(&mut self, _: Restart, ctx: &mut Context<Self>) -> Self::Result {
        let me = ctx.address();
        self.lend(move |h, tree| async move {
            let info = h.info();
            let grace = info.grace(h.ctx.config.container.grace_period.0).period;
            let Some(container_id) = info
                .container_id
                .filter(|_| info.status == KernelStatus::Running)
            else {
                return (
                    tree,
                    false,
                    Err(KernelError::NotRunning(h.id.clone(), info.status.as_str())),
                );
            };
            // The container's exit during the restart is expected: its watcher skips it.
            h.update(|i| i.manual_restart = true);
            h.set_status(KernelStatus::Restarting);
            let restarted = h.ctx.backend.restart_container(&container_id, grace).await;
            // A runner kernel is `RUNNING` again once its runner serves, as at its creation.
            let restarted = match (restarted, info.runner) {
                (Ok(()), Some(ports)) => {
                    super::stages::runner::wait_serving(&h, &container_id, ports).await
                }
                (r, _) => r.map_err(KernelError::from),
            };
            h.update(|i| i.manual_restart = false);
            match restarted {
                Ok(()) => {
                    h.update(|i| i.oom_event = false);
                    h.set_status(KernelStatus::Running);
                    me.do_send(NowRunning { arm_timeout: false });
                    h.poke_container();
                    (tree, false, Ok(h.info()))
                }
                Err(e) => {
                    // Back to RUNNING without a `kernel_started`; if the container is in fact
                    // gone, its watcher ends the kernel the usual way.
                    h.update(|i| i.status = KernelStatus::Running);
                    h.poke_container();
                    (tree, false, Err(e))
                }
            }
        })
    }
}

impl Handler<StartRebuilt> for Kernel {
    type Result = ();

    fn handle(&mut self, _: StartRebuilt, ctx: &mut Context<Self>) {
        if !self.done {
            self.start_tree(ctx);
        }
    }
}

impl Handler<Recreate> for Kernel {
    type Result = AtomicResponse<Self, Result<KernelInfo, KernelError>>;

    /// Detaches the tree (its stages stop, nothing is released), replaces the container with one
    /// made from the new config, and rebuilds the tree around the same resources; the rebuilt
    /// tree is started right after, and its observer records the new container and turns the
    /// kernel `RUNNING` again (see [`StagesChanged`]).
    fn handle(&mut self, Recreate(config): Recreate, ctx: &mut Context<Self>) -> Self::Result {
        let me = ctx.address();
        let recipients = KernelRecipients {
            stages_changed: me.clone().recipient(),
            container_ended: me.clone().recipient(),
        };
        self.lend(move |h, mut tree| async move {
            let info = h.info();
            let resources = tree::resources(&tree).filter(|_| info.status == KernelStatus::Running);
            let Some(mut res) = resources else {
                return (
                    tree,
                    false,
                    Err(KernelError::NotRunning(h.id.clone(), info.status.as_str())),
                );
            };
            h.update(|i| i.manual_restart = true);
            h.set_status(KernelStatus::Restarting);
            let _ = tree.detach().await;
            let old = res.container.clone();
            let previous = info.config.clone();
            h.update(|i| i.config = std::sync::Arc::new(*config));
            let made = super::stages::recreate_container(&h, &res, &old.id).await;
            // A runner kernel is `RUNNING` again once its new container's runner serves, as
            // at its creation.
            let made = match (made, res.runner) {
                (Ok(container), Some(ports)) => {
                    super::stages::runner::wait_serving(&h, &container.id, ports)
                        .await
                        .map(|()| container)
                }
                (made, _) => made,
            };
            let result = match made {
                Ok(container) => {
                    res.container = container;
                    if let Err(e) = h.ctx.store.set_config(&h.id, &h.info().config).await {
                        tracing::error!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %e, "store: cannot record the updated config");
                    }
                    Ok(())
                }
                Err(e) => {
                    // The old container may be gone: the rebuilt tree's watcher finds out and
                    // ends the kernel the usual way.
                    tracing::warn!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %e, "recreating the container failed");
                    h.update(|i| i.config = previous);
                    Err(e)
                }
            };
            h.update(|i| {
                i.container_id = Some(res.container.id.clone());
                i.oom_event = false;
                i.manual_restart = false;
            });
            let rebuilt = match tree::rebuild(&h, &recipients, res) {
                Ok(t) => t,
                Err(e) => {
                    // A programming error: the same resources were just accepted by this tree.
                    tracing::error!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %e, "rebuilding the kernel's tree failed");
                    return (tree, false, Err(KernelError::Engine(e.to_string())));
                }
            };
            me.do_send(StartRebuilt);
            let reply = result.map(|()| h.info());
            (rebuilt, false, reply)
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
        // With the kernel's grace: a job that checkpoints on its stop signal may.
        ctx.notify(Terminate {
            reason: "batch-timeout".into(),
            exit_code: None,
            suppress_events: false,
            grace: None,
        });
    }
}

impl Handler<Detach> for Kernel {
    type Result = AtomicResponse<Self, ()>;

    fn handle(&mut self, _: Detach, _: &mut Context<Self>) -> Self::Result {
        // The next agent start follows the container's logs again from the file's last write.
        if let Some(k) = self.log_keeper.lock().expect("log keeper lock").take() {
            k.abort();
        }
        self.lend(move |h, mut tree| async move {
            let kept = tree.detach().await;
            tracing::info!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, stages = ?kept, "kernel detached");
            (tree, true, ())
        })
    }
}

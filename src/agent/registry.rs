//! The kernel registry: the agent's index of kernel actors (id → actor and shared facts).
//! The actors themselves are children of a one_for_one `kernels` [`Supervisor`]; the
//! registry adds them, routes operations and engine exits to them, and forgets them when
//! they stop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ::actors::{AddChild, ChildSpec, RestartType, Shutdown, Supervisor};
use actix::prelude::*;
use futures::future::{join_all, FutureExt, LocalBoxFuture, Shared};
use tokio::sync::{oneshot, Semaphore};

use super::context::AgentContext;
use super::kernel::actor::{Detach, KernelGone, Restart, Setup, StageSupervisor, Terminate};
use super::kernel::config::check_kernel_id;
use super::kernel::{
    Kernel, KernelConfig, KernelError, KernelHandle, KernelInfo, KernelResources, KernelStatus,
};
use crate::config::OnShutdown;

/// Creates the kernels of one session; all or nothing: if one fails, the others are
/// destroyed and the first error is returned.
///
/// A retry (every kernel id already held here, for the same session) creates nothing: a kernel
/// still being created is joined (the answer is its creation's, when it ends), a `RUNNING` one
/// is answered as it is now and its `kernel_started` published again. Backend.AI's 26.x
/// manager re-sends `create_kernels` for a session whose kernels it has not seen start
/// (`SessionLauncher._start_single_session`, `ai/backend/manager/sokovan/scheduler/launcher/
/// launcher.py`, leaves a failed start to the coordinator's timeout, which starts it again).
/// Upstream's agent itself (`AbstractAgent.create_kernel`, `ai/backend/agent/agent.py`, 26.9.6)
/// refuses a second creation in progress (`track_create`: `ResourceError("Kernel creation
/// already in progress")`) and would run a second creation over a running kernel; answering
/// the retry is what makes the manager's re-send safe.
#[derive(Debug, Message)]
#[rtype(result = "Result<Vec<KernelInfo>, KernelError>")]
pub struct CreateKernels {
    /// Session id.
    pub session_id: String,
    /// `(kernel id, config)` per kernel.
    pub kernels: Vec<(String, KernelConfig)>,
}

/// Destroys a kernel; replies once every stage is torn down, with how its workload ended (its
/// exit code as the kernel ended with it, and whether its grace ran out).
#[derive(Debug, Message)]
#[rtype(result = "Result<crate::agent::kernel::Stopped, KernelError>")]
pub struct DestroyKernel {
    /// Kernel id.
    pub kernel_id: String,
    /// Reported in `kernel_terminated` (default `user-requested`).
    pub reason: String,
    /// No `kernel_terminated` event.
    pub suppress_events: bool,
    /// The end's own grace period (`destroy_kernel`'s `grace_period`); `None`: the kernel's
    /// own. A kernel already stopping takes it when it is shorter than the one under way.
    pub grace: Option<std::time::Duration>,
}

/// Restarts a kernel's container.
#[derive(Debug, Message)]
#[rtype(result = "Result<KernelInfo, KernelError>")]
pub struct RestartKernel(pub String, pub Option<Box<KernelConfig>>);

/// The facts of one kernel.
#[derive(Debug, Message)]
#[rtype(result = "Option<KernelInfo>")]
pub struct GetKernel(pub String);

/// The facts of every kernel the agent holds.
#[derive(Debug, Message)]
#[rtype(result = "Vec<KernelInfo>")]
pub struct ListKernels;

/// A container carrying this agent's id exited (from the exit watcher).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ContainerExited(pub String);

/// The engine's `oom` event for a container carrying this agent's id (from the exit watcher).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ContainerOom(pub String);

/// Asks every `RUNNING` kernel's container stage to check its container (after the engine's event stream was
/// re-subscribed, or on `sync_kernel_registry`): exits missed meanwhile are handled.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Reconcile;

/// The stage supervisor of a kernel (its eight stage actors), while its tree runs.
#[derive(Debug, Message)]
#[rtype(result = "Option<Addr<::actors::Supervisor>>")]
pub struct KernelStages(pub String);

/// `reset_agent`: destroys every kernel without termination events; replies with how many.
#[derive(Debug, Message)]
#[rtype(result = "usize")]
pub struct ResetAgent;

/// Graceful agent shutdown: detach (`preserve`) or destroy (`terminate`) every kernel.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ShutdownKernels(pub OnShutdown);

/// Recovery: re-attaches a kernel that was `RUNNING` before the restart, owning `resources`
/// again (its slots and ports already re-reserved by the caller).
#[derive(Debug, Message)]
#[rtype(result = "Result<(), KernelError>")]
pub struct Adopt {
    /// Kernel id.
    pub kernel_id: String,
    /// Session id.
    pub session_id: String,
    /// Its config.
    pub config: KernelConfig,
    /// Its resources from the store.
    pub resources: KernelResources,
}

#[derive(Message)]
#[rtype(result = "()")]
struct Attached(String, Addr<Kernel>);

struct Entry {
    addr: Option<Addr<Kernel>>,
    handle: KernelHandle,
    /// The `create_kernels` call that made the kernel and the kernel's place in its answer
    /// (`None` for a kernel adopted at start-up): a retry joins it.
    creation: Option<(Creation, usize)>,
}

/// One `create_kernels` call's outcome, shared by its retries.
type Creation = Shared<LocalBoxFuture<'static, Result<Vec<KernelInfo>, KernelError>>>;

/// How a kernel named again by a `create_kernels` retry is answered.
enum Retry {
    /// Its creation has not ended: its outcome, when it does.
    Join(Creation, usize),
    /// Created and `RUNNING`: as it is now, with `kernel_started` again.
    Running(KernelHandle),
}

/// The agent's kernel index.
pub struct KernelRegistry {
    ctx: Arc<AgentContext>,
    kernels_sup: Addr<Supervisor>,
    kernels: HashMap<String, Entry>,
    creation: Arc<Semaphore>,
}

impl KernelRegistry {
    /// A registry adding kernel actors to `kernels_sup`; at most
    /// `[agent] kernel-creation-concurrency` set up at once.
    pub fn new(ctx: Arc<AgentContext>, kernels_sup: Addr<Supervisor>) -> KernelRegistry {
        let creation = Arc::new(Semaphore::new(ctx.config.agent.kernel_creation_concurrency));
        KernelRegistry {
            ctx,
            kernels_sup,
            kernels: HashMap::new(),
            creation,
        }
    }

    fn handle_for(&self, kernel_id: &str, session_id: &str, config: KernelConfig) -> KernelHandle {
        KernelHandle::new(kernel_id, session_id, config, self.ctx.clone())
    }

    /// Adds a kernel actor as a temporary child of the `kernels` supervisor (new, or rebuilt
    /// from `resources`) and resolves to its address.
    fn spawn(
        sup: Addr<Supervisor>,
        handle: KernelHandle,
        resources: Option<KernelResources>,
        me: Addr<KernelRegistry>,
    ) -> impl std::future::Future<Output = Result<Addr<Kernel>, KernelError>> {
        let (tx, rx) = oneshot::channel();
        let tx = Mutex::new(Some(tx));
        let resources = Mutex::new(resources);
        let gone = me.clone().recipient();
        let id = handle.id.clone();
        let spec = ChildSpec::actor(id.clone(), move |ctx: &mut Context<Kernel>, _exit| {
            let resources = resources.lock().expect("lock").take();
            if let Some(tx) = tx.lock().expect("lock").take() {
                let _ = tx.send(ctx.address());
            }
            Kernel::new(ctx, handle.clone(), resources, gone.clone())
                .expect("a kernel tree adopts its own stages")
        })
        .restart(RestartType::Temporary)
        // Long enough for a teardown that removes a container.
        .shutdown(Shutdown::millis(60_000));
        async move {
            sup.send(AddChild(spec))
                .await
                .map_err(|e| KernelError::Engine(e.to_string()))?
                .map_err(|e| KernelError::Engine(e.to_string()))?;
            let addr = rx
                .await
                .map_err(|_| KernelError::Engine(format!("kernel actor {id} failed to start")))?;
            me.do_send(Attached(id, addr.clone()));
            Ok(addr)
        }
    }
}

impl Actor for KernelRegistry {
    type Context = Context<Self>;
}

impl Handler<Attached> for KernelRegistry {
    type Result = ();
    fn handle(&mut self, Attached(id, addr): Attached, _: &mut Context<Self>) {
        if let Some(e) = self.kernels.get_mut(&id) {
            e.addr = Some(addr);
        }
    }
}

impl Handler<KernelGone> for KernelRegistry {
    type Result = ();
    fn handle(&mut self, KernelGone(id): KernelGone, _: &mut Context<Self>) {
        self.kernels.remove(&id);
    }
}

impl KernelRegistry {
    /// How `create_kernels` names kernel `id` of session `session_id` again, when it is held
    /// here (`None`: it is not).
    ///
    /// Errors: [`KernelError::InvalidConfig`] for another session's kernel;
    /// [`KernelError::NotRunning`] for one that was created and is no longer `RUNNING`
    /// (restarting, terminating).
    fn retry_of(&self, id: &str, session_id: &str) -> Result<Option<Retry>, KernelError> {
        let Some(e) = self.kernels.get(id) else {
            return Ok(None);
        };
        if e.handle.session_id != session_id {
            return Err(KernelError::InvalidConfig(format!(
                "duplicate kernel id {id}: a kernel of session {} holds it",
                e.handle.session_id
            )));
        }
        match &e.creation {
            // Still being created (or its failure is being cleaned up): its outcome.
            Some((c, i)) if c.peek().is_none_or(Result::is_err) => {
                Ok(Some(Retry::Join(c.clone(), *i)))
            }
            _ => match e.handle.info().status {
                KernelStatus::Running => Ok(Some(Retry::Running(e.handle.clone()))),
                status => Err(KernelError::NotRunning(id.to_owned(), status.as_str())),
            },
        }
    }

    /// A retry's answer: every kernel as its creation answered it, or as it runs now.
    fn answer_retry(&self, retries: Vec<Retry>) -> LocalBoxFuture<'static, CreateResult> {
        for r in &retries {
            self.ctx.metrics.create_retried(match r {
                Retry::Join(..) => "joined",
                Retry::Running(_) => "running",
            });
        }
        async move {
            let mut infos = Vec::with_capacity(retries.len());
            for r in retries {
                infos.push(match r {
                    Retry::Join(creation, i) => creation.await?.swap_remove(i),
                    Retry::Running(handle) => {
                        let info = handle.info();
                        if info.status != KernelStatus::Running {
                            // Ended meanwhile: its own events say so.
                            return Err(KernelError::NotRunning(info.id, info.status.as_str()));
                        }
                        handle.announce_started();
                        info
                    }
                });
            }
            Ok(infos)
        }
        .boxed_local()
    }
}

type CreateResult = Result<Vec<KernelInfo>, KernelError>;

impl Handler<CreateKernels> for KernelRegistry {
    type Result = ResponseActFuture<Self, CreateResult>;

    fn handle(&mut self, msg: CreateKernels, ctx: &mut Context<Self>) -> Self::Result {
        let checked = (|| {
            let mut seen = std::collections::HashSet::new();
            let mut retries = Vec::new();
            for (id, _) in &msg.kernels {
                check_kernel_id(id)?;
                if !seen.insert(id.as_str()) {
                    return Err(KernelError::InvalidConfig(format!(
                        "duplicate kernel id {id}"
                    )));
                }
                retries.extend(self.retry_of(id, &msg.session_id)?);
            }
            match retries.len() {
                0 => Ok(None),
                n if n == msg.kernels.len() => Ok(Some(retries)),
                // A retry names the kernels of its first call, all of them.
                _ => Err(KernelError::InvalidConfig(format!(
                    "{} of the {} kernel ids are already held here for session {}, the others \
                     not: a retry of create_kernels names the kernels of its first call",
                    retries.len(),
                    msg.kernels.len(),
                    msg.session_id
                ))),
            }
        })();
        match checked {
            Err(e) => return Box::pin(fut::ready(Err(e))),
            Ok(Some(retries)) => {
                tracing::info!(agent_id = %self.ctx.agent_id, session_id = %msg.session_id, kernels = retries.len(), "create_kernels retried: answered from the kernels held here");
                return Box::pin(self.answer_retry(retries).into_actor(self));
            }
            Ok(None) => {}
        }
        let me = ctx.address();
        let handles: Vec<KernelHandle> = msg
            .kernels
            .into_iter()
            .map(|(id, config)| self.handle_for(&id, &msg.session_id, config))
            .collect();
        let (store, creation, sup) = (
            self.ctx.store.clone(),
            self.creation.clone(),
            self.kernels_sup.clone(),
        );
        let setups: Vec<_> = handles
            .iter()
            .cloned()
            .map(|handle| {
                let (store, creation, sup, me) =
                    (store.clone(), creation.clone(), sup.clone(), me.clone());
                // Per kernel: record it (before any resource exists, so a crash is cleaned up on
                // the next start), start its actor, set it up under the concurrency limit.
                async move {
                    let refused = match store
                        .insert_kernel(&handle.id, &handle.session_id, &handle.info().config)
                        .await
                    {
                        Ok(true) => None,
                        Ok(false) => Some(KernelError::InvalidConfig(format!(
                            "duplicate kernel id {}",
                            handle.id
                        ))),
                        Err(e) => Some(KernelError::Engine(format!("store: {e}"))),
                    };
                    if let Some(e) = refused {
                        me.do_send(KernelGone(handle.id.clone()));
                        return Err(e);
                    }
                    let addr = KernelRegistry::spawn(sup, handle, None, me).await?;
                    let _permit = creation
                        .acquire_owned()
                        .await
                        .expect("the semaphore is never closed");
                    let info = addr
                        .send(Setup)
                        .await
                        .map_err(|e| KernelError::Engine(e.to_string()))??;
                    Ok((addr, info))
                }
            })
            .collect();
        let created: Creation = async move {
            let mut ok = Vec::new();
            let mut first_error = None;
            for r in join_all(setups).await {
                match r {
                    Ok(x) => ok.push(x),
                    Err(e) => first_error = first_error.or(Some(e)),
                }
            }
            if let Some(e) = first_error {
                // All or nothing: the kernels that did come up go too, with upstream's
                // reason for a kernel that never came up (`failed-to-create`, as its
                // `kernel_terminated` says): the manager's rollback ends the same rows with
                // it, and whichever lands first, every kernel of the session has one reason.
                let stop = || Terminate {
                    reason: "failed-to-create".into(),
                    exit_code: None,
                    suppress_events: false,
                    grace: Some(std::time::Duration::ZERO),
                };
                join_all(ok.iter().map(|(a, _)| a.send(stop()))).await;
                return Err(e);
            }
            Ok(ok.into_iter().map(|(_, info)| info).collect())
        }
        .boxed_local()
        .shared();
        for (i, handle) in handles.into_iter().enumerate() {
            // Entered now so that a concurrent request with the same id joins this one.
            self.kernels.insert(
                handle.id.clone(),
                Entry {
                    addr: None,
                    handle,
                    creation: Some((created.clone(), i)),
                },
            );
        }
        Box::pin(created.into_actor(self))
    }
}

impl Handler<Adopt> for KernelRegistry {
    type Result = ResponseFuture<Result<(), KernelError>>;

    fn handle(&mut self, a: Adopt, ctx: &mut Context<Self>) -> Self::Result {
        let handle = self.handle_for(&a.kernel_id, &a.session_id, a.config);
        let r = &a.resources;
        handle.update(|i| {
            i.status = KernelStatus::Running;
            i.container_id = Some(r.container.id.clone());
            i.host_ports = r.ports.clone();
            i.service_ports = r.service_ports.clone();
            i.gpus = r.slots.device_ids();
            i.runtime_path = r
                .image
                .labels
                .get(crate::agent::backend::labels::RUNTIME_PATH)
                .cloned();
            i.runner = r.runner;
        });
        self.kernels.insert(
            a.kernel_id.clone(),
            Entry {
                addr: None,
                handle: handle.clone(),
                creation: None,
            },
        );
        let spawned = KernelRegistry::spawn(
            self.kernels_sup.clone(),
            handle,
            Some(a.resources),
            ctx.address(),
        );
        Box::pin(async move { spawned.await.map(|_| ()) })
    }
}

impl KernelRegistry {
    fn addr_of(&self, kernel_id: &str) -> Result<Addr<Kernel>, KernelError> {
        let entry = self
            .kernels
            .get(kernel_id)
            .ok_or_else(|| KernelError::NotFound(kernel_id.to_owned()))?;
        entry.addr.clone().ok_or_else(|| {
            KernelError::NotRunning(kernel_id.to_owned(), entry.handle.info().status.as_str())
        })
    }
}

impl Handler<DestroyKernel> for KernelRegistry {
    type Result = ResponseFuture<Result<crate::agent::kernel::Stopped, KernelError>>;

    fn handle(&mut self, d: DestroyKernel, _: &mut Context<Self>) -> Self::Result {
        let addr = self.addr_of(&d.kernel_id);
        let handle = self.kernels.get(&d.kernel_id).map(|e| e.handle.clone());
        if let (Some(h), Some(g)) = (&handle, &d.grace) {
            // Already stopping (a second destroy: `rm --now` during a grace, a manager's retry):
            // the end under way reads the shorter grace on its next look; it ends once.
            let default = h.ctx.config.container.grace_period.0;
            h.update(|i| {
                if i.status == KernelStatus::Terminating && *g < i.grace(default).period {
                    i.grace_override = Some(*g);
                }
            });
        }
        Box::pin(async move {
            // A kernel that stopped meanwhile (or while this waited behind an end under way) is
            // gone: that is what was asked; its facts tell how it ended.
            let _ = addr?
                .send(Terminate {
                    reason: d.reason,
                    exit_code: None,
                    suppress_events: d.suppress_events,
                    grace: d.grace,
                })
                .await;
            let info = handle.map(|h| h.info());
            Ok(crate::agent::kernel::Stopped {
                exit_code: info.as_ref().and_then(|i| i.exit_code),
                killed: info.and_then(|i| i.stopped).is_some_and(|s| s.killed),
            })
        })
    }
}

impl Handler<RestartKernel> for KernelRegistry {
    type Result = ResponseFuture<Result<KernelInfo, KernelError>>;

    fn handle(
        &mut self,
        RestartKernel(id, config): RestartKernel,
        _: &mut Context<Self>,
    ) -> Self::Result {
        let addr = self.addr_of(&id);
        Box::pin(async move {
            let addr = addr?;
            let sent = match config {
                None => addr.send(Restart).await,
                Some(config) => addr.send(super::kernel::actor::Recreate(config)).await,
            };
            sent.map_err(|_| KernelError::NotFound(id))?
        })
    }
}

impl Handler<GetKernel> for KernelRegistry {
    type Result = Option<KernelInfo>;
    fn handle(&mut self, GetKernel(id): GetKernel, _: &mut Context<Self>) -> Option<KernelInfo> {
        self.kernels.get(&id).map(|e| e.handle.info())
    }
}

impl Handler<ListKernels> for KernelRegistry {
    type Result = MessageResult<ListKernels>;
    fn handle(&mut self, _: ListKernels, _: &mut Context<Self>) -> Self::Result {
        MessageResult(self.kernels.values().map(|e| e.handle.info()).collect())
    }
}

impl Handler<ContainerExited> for KernelRegistry {
    type Result = ();
    fn handle(&mut self, ContainerExited(container_id): ContainerExited, _: &mut Context<Self>) {
        // To the kernel's container stage, which watches its container.
        if let Some(e) = self
            .kernels
            .values()
            .find(|e| e.handle.info().container_id.as_deref() == Some(&container_id))
        {
            e.handle.poke_container();
        }
    }
}

impl Handler<ContainerOom> for KernelRegistry {
    type Result = ();
    fn handle(&mut self, ContainerOom(container_id): ContainerOom, _: &mut Context<Self>) {
        // Recorded on the shared info, not sent to the actor: it may be busy classifying the
        // exit this OOM explains (see `kernel::watch`).
        if let Some(e) = self
            .kernels
            .values()
            .find(|e| e.handle.info().container_id.as_deref() == Some(&container_id))
        {
            e.handle.update(|i| i.oom_event = true);
        }
    }
}

impl Handler<Reconcile> for KernelRegistry {
    type Result = ();
    fn handle(&mut self, _: Reconcile, _: &mut Context<Self>) {
        let mut checked = 0;
        for e in self.kernels.values() {
            if let (Some(_), KernelStatus::Running) = (&e.addr, e.handle.info().status) {
                e.handle.poke_container();
                checked += 1;
            }
        }
        // Seed 002's container lifecycle sync: one trigger, `checked` kernels synchronized.
        self.ctx.metrics.lifecycle_sync(Ok(checked));
    }
}

impl Handler<KernelStages> for KernelRegistry {
    type Result = ResponseFuture<Option<Addr<::actors::Supervisor>>>;
    fn handle(&mut self, KernelStages(id): KernelStages, _: &mut Context<Self>) -> Self::Result {
        let addr = self.kernels.get(&id).and_then(|e| e.addr.clone());
        Box::pin(async move { addr?.send(StageSupervisor).await.ok().flatten() })
    }
}

impl Handler<ResetAgent> for KernelRegistry {
    type Result = ResponseFuture<usize>;
    fn handle(&mut self, _: ResetAgent, _: &mut Context<Self>) -> Self::Result {
        let addrs: Vec<_> = self
            .kernels
            .values()
            .filter_map(|e| e.addr.clone())
            .collect();
        Box::pin(async move {
            let n = addrs.len();
            join_all(addrs.iter().map(|a| {
                a.send(Terminate {
                    reason: "agent-reset".into(),
                    exit_code: None,
                    suppress_events: true,
                    grace: None,
                })
            }))
            .await;
            n
        })
    }
}

impl Handler<ShutdownKernels> for KernelRegistry {
    type Result = ResponseFuture<()>;
    fn handle(
        &mut self,
        ShutdownKernels(mode): ShutdownKernels,
        _: &mut Context<Self>,
    ) -> Self::Result {
        let addrs: Vec<_> = self
            .kernels
            .values()
            .filter_map(|e| e.addr.clone())
            .collect();
        Box::pin(async move {
            match mode {
                OnShutdown::Preserve => {
                    join_all(addrs.iter().map(|a| a.send(Detach))).await;
                }
                OnShutdown::Terminate => {
                    join_all(addrs.iter().map(|a| {
                        a.send(Terminate {
                            reason: "agent-shutdown".into(),
                            exit_code: None,
                            suppress_events: false,
                            grace: None,
                        })
                    }))
                    .await;
                }
            }
        })
    }
}

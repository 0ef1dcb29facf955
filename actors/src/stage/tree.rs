//! The stage tree: an owner's stages as supervised children, one actor per resource (seed
//! 001's stages under OTP's `rest_for_one`).
//!
//! A [`StageChain`](crate::StageChain) sets stages up and tears them down, and nothing watches
//! a resource in between. A [`StageTree`] runs each stage as a child of a `rest_for_one`
//! [`Supervisor`]: the child sets its resource up once the stages before it hold theirs,
//! publishes it on the tree's board (where later stages' spec generators read it), may watch
//! it while the owner lives, and releases it when stopped. A watched resource that fails
//! (its watcher resolves `Err`) makes its stage release what is left of it and exit
//! abnormally; the supervisor then restarts that stage and every stage after it, in order,
//! after the tree's [`Backoff`], within its [`Intensity`] (the owner's restart policy). The
//! stages before it keep their resources. Past the intensity the supervisor stops every stage
//! in reverse (each releasing its resource) and exits [`ExitReason::Failed`], which the owner
//! learns through the callback given to [`StageTree::start`].

use std::any::Any;
use std::panic::{self, AssertUnwindSafe};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use actix::Addr;
use futures::future::LocalBoxFuture;
use tokio::sync::watch;

use super::chain::{Detached, Resources, SetupError};
use super::hook::{NoopHook, StageHook};
use super::owned::{timed, Phase, StageError};
use super::provisioner::{BoxError, Provisioner};
use crate::child::{panic_message, ExitReason, StopSignal};
use crate::supervisor::{
    Backoff, ChildSpec, Intensity, RestartType, Root, Shutdown, Strategy, Supervisor,
};

/// Where one stage of a [`StageTree`] stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageStatus {
    /// Waiting for the stages before it.
    Pending,
    /// Its provisioner's setup is running.
    SettingUp,
    /// Holds its resource (and watches it, if it has a watcher).
    Ready,
    /// Its setup failed, or its resource failed and was released (a restart may follow).
    Failed,
    /// Released its resource after a stop.
    Stopped,
    /// Let go of its resource without releasing it ([`StageTree::detach`]).
    Detached,
}

impl StageStatus {
    /// The lower-case wire name: `pending`, `setting-up`, `ready`, `failed`, `stopped`,
    /// `detached`.
    pub fn as_str(self) -> &'static str {
        match self {
            StageStatus::Pending => "pending",
            StageStatus::SettingUp => "setting-up",
            StageStatus::Ready => "ready",
            StageStatus::Failed => "failed",
            StageStatus::Stopped => "stopped",
            StageStatus::Detached => "detached",
        }
    }
}

/// One stage as [`StageTree::stages`] and the tree's observer see it.
#[derive(Debug, Clone, PartialEq)]
pub struct StageInfo {
    /// The provisioner's name.
    pub name: &'static str,
    /// Where it stands.
    pub status: StageStatus,
    /// How many times its supervisor restarted it.
    pub restarts: u32,
    /// Seconds its last successful setup took (`None`: never set up here, e.g. adopted).
    pub setup_seconds: Option<f64>,
}

/// Watches a stage's fresh resource: returns a future that resolves when the resource has
/// ended. `Ok(())`: it ended and the stage keeps it until stopped (the owner decides what
/// follows); `Err`: it failed, the stage tears it down and exits abnormally (a restart).
pub type WatchFn<R> =
    Arc<dyn Fn(&R) -> LocalBoxFuture<'static, Result<(), BoxError>> + Send + Sync>;

/// Called with every stage's [`StageInfo`], in order, after each change (on the arbiter; it
/// must not block).
pub type Observer = Arc<dyn Fn(&[StageInfo]) + Send + Sync>;

type SpecFn<S> = Arc<dyn Fn(&Resources<'_>) -> Result<S, BoxError> + Send + Sync>;

struct Slot {
    info: StageInfo,
    resource: Option<Box<dyn Any + Send>>,
    lives: u32,
}

struct BoardState {
    slots: Vec<Slot>,
    /// The first setup failure of the initial setup, until [`StageTree::ready`] takes it.
    failure: Option<StageError>,
    /// The initial setup failed: waiting stages give up.
    gave_up: bool,
    /// Every stage has held its resource at once: later setup failures are restarts.
    ready_once: bool,
    /// Stops leave resources in place ([`StageTree::detach`]).
    detaching: bool,
    /// The supervisor has exited, and why.
    exited: Option<ExitReason>,
}

/// The stages' shared state: published resources and statuses, with change notification.
#[derive(Clone)]
struct Board {
    state: Arc<Mutex<BoardState>>,
    changed: Arc<watch::Sender<u64>>,
    observer: Option<Observer>,
}

impl Board {
    fn lock(&self) -> MutexGuard<'_, BoardState> {
        self.state.lock().expect("stage board lock")
    }

    /// Changes the state, then wakes waiters and tells the observer (outside the lock).
    fn update<T>(&self, f: impl FnOnce(&mut BoardState) -> T) -> T {
        let (out, infos) = {
            let mut st = self.lock();
            let out = f(&mut st);
            let infos: Vec<StageInfo> = st.slots.iter().map(|s| s.info.clone()).collect();
            (out, infos)
        };
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
        if let Some(observer) = &self.observer {
            observer(&infos);
        }
        out
    }

    fn set_status(&self, index: usize, status: StageStatus) {
        self.update(|st| st.slots[index].info.status = status);
    }

    /// Resolves with `f`'s first `Some` over the state, re-checked after every change.
    async fn wait_for<T>(&self, mut f: impl FnMut(&mut BoardState) -> Option<T>) -> T {
        let mut rx = self.changed.subscribe();
        loop {
            if let Some(t) = f(&mut self.lock()) {
                return t;
            }
            // The sender lives as long as `self`: `changed` cannot fail here.
            let _ = rx.changed().await;
        }
    }
}

/// A stage's description with its provisioner's types erased.
trait Def: Send + Sync {
    fn name(&self) -> &'static str;
    fn accepts(&self, resource: &(dyn Any + Send)) -> bool;
    fn life(
        self: Arc<Self>,
        tree: Arc<TreeShared>,
        index: usize,
        stop: StopSignal,
    ) -> LocalBoxFuture<'static, Result<(), String>>;
}

struct StageDef<P: Provisioner> {
    provisioner: P,
    spec: SpecFn<P::Spec>,
    watch: Option<WatchFn<P::Resource>>,
}

/// What every stage of one tree shares.
struct TreeShared {
    board: Board,
    hook: Arc<dyn StageHook>,
}

impl<P: Provisioner + Send + Sync> Def for StageDef<P> {
    fn name(&self) -> &'static str {
        self.provisioner.name()
    }

    fn accepts(&self, resource: &(dyn Any + Send)) -> bool {
        resource.is::<P::Resource>()
    }

    fn life(
        self: Arc<Self>,
        tree: Arc<TreeShared>,
        index: usize,
        stop: StopSignal,
    ) -> LocalBoxFuture<'static, Result<(), String>> {
        Box::pin(async move { self.run(&tree, index, &stop).await })
    }
}

impl<P: Provisioner + Send + Sync> StageDef<P> {
    /// One life of the stage's actor: wait for the stages before it, set up (unless it still
    /// holds an adopted resource), watch, release when stopped.
    async fn run(&self, tree: &TreeShared, index: usize, stop: &StopSignal) -> Result<(), String> {
        let (board, name) = (&tree.board, self.name());
        board.update(|st| {
            let slot = &mut st.slots[index];
            slot.lives += 1;
            if slot.lives > 1 {
                slot.info.restarts += 1;
            }
            slot.info.status = StageStatus::Pending;
        });
        let go = tokio::select! {
            _ = stop.requested() => false,
            go = board.wait_for(|st| {
                if st.gave_up {
                    Some(false)
                } else {
                    st.slots[..index].iter().all(|s| s.resource.is_some()).then_some(true)
                }
            }) => go,
        };
        if !go {
            return self.release(tree, index).await;
        }
        let held = board.lock().slots[index].resource.is_some();
        if !held {
            board.set_status(index, StageStatus::SettingUp);
            match self.setup(tree, index).await {
                Ok(()) => {}
                Err(source) => {
                    let text = source.to_string();
                    let first = board.update(|st| {
                        st.slots[index].info.status = StageStatus::Failed;
                        let first = !st.ready_once;
                        if first && !st.gave_up {
                            st.gave_up = true;
                            st.failure = Some(StageError {
                                stage: name,
                                phase: Phase::Setup,
                                source,
                            });
                        }
                        first
                    });
                    // The initial setup failing is the owner's to handle (it tears the tree
                    // down); a setup failing in a restart is this stage failing again.
                    return if first {
                        Ok(())
                    } else {
                        Err(format!("stage `{name}`: setup failed: {text}"))
                    };
                }
            }
        }
        board.update(|st| {
            st.slots[index].info.status = StageStatus::Ready;
            if st.slots.iter().all(|s| s.resource.is_some()) {
                st.ready_once = true;
            }
        });
        let watching = self.watch.as_ref().and_then(|w| {
            let st = board.lock();
            let resource = st.slots[index].resource.as_ref()?;
            resource.downcast_ref::<P::Resource>().map(|r| w(r))
        });
        let ended = match watching {
            None => {
                stop.requested().await;
                None
            }
            Some(watching) => tokio::select! {
                _ = stop.requested() => None,
                ended = watching => Some(ended),
            },
        };
        match ended {
            Some(Err(e)) => {
                tracing::warn!(stage = name, error = %e, "stage resource failed; releasing it");
                let taken = board.update(|st| st.slots[index].resource.take());
                if let Some(r) = taken {
                    self.teardown(tree, r).await;
                }
                board.set_status(index, StageStatus::Failed);
                return Err(format!("stage `{name}`: {e}"));
            }
            Some(Ok(())) => stop.requested().await,
            None => {}
        }
        self.release(tree, index).await
    }

    /// Builds the spec from the published resources before this stage and sets up.
    async fn setup(&self, tree: &TreeShared, index: usize) -> Result<(), BoxError> {
        let name = self.name();
        let spec = {
            let st = tree.board.lock();
            let view: Vec<(&'static str, Option<&(dyn Any + Send)>)> = st.slots[..index]
                .iter()
                .map(|s| (s.info.name, s.resource.as_deref()))
                .collect();
            panic::catch_unwind(AssertUnwindSafe(|| (self.spec)(&Resources::board(&view))))
                .unwrap_or_else(|p| Err(format!("spec panicked: {}", panic_message(&*p)).into()))
        };
        let spec = match spec {
            Ok(spec) => spec,
            Err(e) => {
                tree.hook.on_setup(name, Duration::ZERO, Err(&e));
                return Err(e);
            }
        };
        let (took, result) = timed(self.provisioner.setup(spec)).await;
        tree.hook.on_setup(name, took, result.as_ref().map(drop));
        let resource = result?;
        tree.board.update(|st| {
            let slot = &mut st.slots[index];
            slot.resource = Some(Box::new(resource));
            slot.info.setup_seconds = Some(took.as_secs_f64());
        });
        Ok(())
    }

    /// After a stop: leave the resource in place when the tree is detaching, else release it.
    async fn release(&self, tree: &TreeShared, index: usize) -> Result<(), String> {
        let (detaching, taken) = tree.board.update(|st| {
            if st.detaching {
                (true, None)
            } else {
                (false, st.slots[index].resource.take())
            }
        });
        let status = if detaching {
            StageStatus::Detached
        } else {
            if let Some(r) = taken {
                self.teardown(tree, r).await;
            }
            StageStatus::Stopped
        };
        tree.board.update(|st| {
            let slot = &mut st.slots[index];
            // A stage whose setup failed stays `failed`.
            if slot.info.status != StageStatus::Failed || detaching {
                slot.info.status = status;
            }
        });
        Ok(())
    }

    async fn teardown(&self, tree: &TreeShared, resource: Box<dyn Any + Send>) {
        let name = self.name();
        let Ok(resource) = resource.downcast::<P::Resource>() else {
            tracing::error!(
                stage = name,
                "stage held a resource of another type; dropped"
            );
            return;
        };
        let (took, result) = timed(self.provisioner.teardown(*resource)).await;
        tree.hook.on_teardown(name, took, result.as_ref().map(drop));
        if let Err(e) = result {
            tracing::warn!(stage = name, error = %e, "stage teardown failed");
        }
    }
}

/// An owner's stages as supervised children of one `rest_for_one` [`Supervisor`]; built with
/// [`StageTree::builder`].
///
/// Lifecycle: [`start`](StageTree::start) (every stage sets up in order), then
/// [`ready`](StageTree::ready) to learn that all hold their resources or which failed; then
/// either [`teardown`](StageTree::teardown) (stages stop in reverse, each releasing its
/// resource) or [`detach`](StageTree::detach) (they stop and leave the resources in place).
/// [`StageTreeBuilder::rebuild`] owns existing resources again (recovery): those stages do
/// not set up again.
pub struct StageTree {
    name: String,
    defs: Vec<Arc<dyn Def>>,
    shared: Arc<TreeShared>,
    intensity: Intensity,
    backoff: Backoff,
    stage_shutdown: Duration,
    root: Option<Root>,
}

impl StageTree {
    /// Starts describing a tree named `name` (its supervisor's name in logs).
    pub fn builder(name: impl Into<String>) -> StageTreeBuilder {
        StageTreeBuilder {
            name: name.into(),
            defs: Vec::new(),
            hook: Arc::new(NoopHook),
            observer: None,
            intensity: Intensity::new(0, 1),
            backoff: Backoff::None,
            stage_shutdown: Duration::from_secs(60),
        }
    }

    /// Starts the supervisor and so every stage; `on_exit` runs once with the supervisor's
    /// exit reason ([`ExitReason::Failed`] when the restart intensity ran out). A second call
    /// does nothing.
    pub fn start(&mut self, on_exit: impl FnOnce(ExitReason) + 'static) {
        if self.root.is_some() {
            return;
        }
        let mut sup = Supervisor::build(self.name.clone())
            .strategy(Strategy::RestForOne)
            .intensity(self.intensity)
            .backoff(self.backoff);
        for (index, def) in self.defs.iter().enumerate() {
            let (def, shared) = (def.clone(), self.shared.clone());
            sup = sup.child(
                ChildSpec::task(def.name(), move |stop| {
                    def.clone().life(shared.clone(), index, stop)
                })
                .restart(RestartType::Transient)
                .shutdown(Shutdown::Graceful(self.stage_shutdown)),
            );
        }
        let board = self.shared.board.clone();
        self.root = Some(sup.start_with_exit(move |reason| {
            board.update(|st| st.exited = Some(reason.clone()));
            on_exit(reason);
        }));
    }

    /// Resolves once every stage holds its resource, or with the first stage whose initial
    /// setup failed (the stages after it gave up; the owner then calls
    /// [`teardown`](StageTree::teardown), which releases what the others hold).
    ///
    /// # Errors
    /// [`SetupError`] naming the failed stage; also when the supervisor exited first.
    pub async fn ready(&self) -> Result<(), SetupError> {
        let name = self.name.clone();
        self.shared
            .board
            .wait_for(|st| {
                if let Some(failed) = st.failure.take() {
                    return Some(Err(failed));
                }
                if st.ready_once && st.slots.iter().all(|s| s.resource.is_some()) {
                    return Some(Ok(()));
                }
                st.exited.as_ref().map(|reason| {
                    Err(StageError {
                        stage: "supervisor",
                        phase: Phase::Setup,
                        source: format!("stage tree `{name}` exited: {reason}").into(),
                    })
                })
            })
            .await
            .map_err(|failed| SetupError {
                failed,
                rollback: Vec::new(),
            })
    }

    /// Reads the published resources (by stage name, as spec generators do).
    pub fn resources<T>(&self, f: impl FnOnce(&Resources<'_>) -> T) -> T {
        let st = self.shared.board.lock();
        let view: Vec<(&'static str, Option<&(dyn Any + Send)>)> = st
            .slots
            .iter()
            .map(|s| (s.info.name, s.resource.as_deref()))
            .collect();
        f(&Resources::board(&view))
    }

    /// Every stage's state, in order.
    pub fn stages(&self) -> Vec<StageInfo> {
        let st = self.shared.board.lock();
        st.slots.iter().map(|s| s.info.clone()).collect()
    }

    /// The stages' supervisor, once started (for [`WhichChildren`](crate::WhichChildren)).
    pub fn supervisor(&self) -> Option<Addr<Supervisor>> {
        self.root.as_ref().map(Root::addr)
    }

    /// Stops every stage in reverse order; each releases its resource. Resolves with the
    /// supervisor's exit reason (`Shutdown`; `Failed` if it had already given up). A tree
    /// never started releases only what it adopted.
    pub async fn teardown(&mut self) -> ExitReason {
        self.stop().await
    }

    /// Stops every stage in reverse order without releasing anything, and hands the resources
    /// out by stage name, for the owner to persist.
    pub async fn detach(&mut self) -> Detached {
        self.shared.board.update(|st| st.detaching = true);
        self.stop().await;
        let resources = self.shared.board.update(|st| {
            st.slots
                .iter_mut()
                .filter_map(|s| Some((s.info.name, s.resource.take()?)))
                .collect()
        });
        Detached { resources }
    }

    async fn stop(&mut self) -> ExitReason {
        let held = self
            .shared
            .board
            .lock()
            .slots
            .iter()
            .any(|s| s.resource.is_some());
        if self.root.is_none() && held {
            // Adopted and never started: start it so each stage releases what it holds.
            self.shared.board.update(|st| st.gave_up = true);
            self.start(|_| ());
        }
        match self.root.take() {
            Some(root) => root.shutdown().await,
            None => ExitReason::Shutdown,
        }
    }
}

/// Describes a [`StageTree`]: its stages in order, hook, observer, restart intensity and
/// backoff.
pub struct StageTreeBuilder {
    name: String,
    defs: Vec<Arc<dyn Def>>,
    hook: Arc<dyn StageHook>,
    observer: Option<Observer>,
    intensity: Intensity,
    backoff: Backoff,
    stage_shutdown: Duration,
}

impl StageTreeBuilder {
    /// Reports every stage's setup and teardown to `hook` (default [`NoopHook`]).
    pub fn hook(mut self, hook: Arc<dyn StageHook>) -> Self {
        self.hook = hook;
        self
    }

    /// Calls `observer` after every change of a stage's [`StageInfo`].
    pub fn observer(mut self, observer: Observer) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The restart intensity: more than `max_restarts` restarts within `max_window` and the
    /// tree gives up (default 0: the first failure ends it).
    pub fn intensity(mut self, intensity: Intensity) -> Self {
        self.intensity = intensity;
        self
    }

    /// The delay before each restart (default none).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// How long a stopping stage may take to release its resource before it is forced
    /// (default 60 s).
    pub fn stage_shutdown(mut self, timeout: Duration) -> Self {
        self.stage_shutdown = timeout;
        self
    }

    /// Appends a stage run by `provisioner`, whose spec `spec(earlier)` builds from the
    /// resources of the stages before it, as in [`StageChainBuilder::stage`](crate::StageChainBuilder::stage).
    ///
    /// # Panics
    /// If a stage with the same name was already added (a programming error).
    pub fn stage<P, F>(self, provisioner: P, spec: F) -> Self
    where
        P: Provisioner + Send + Sync,
        F: Fn(&Resources<'_>) -> Result<P::Spec, BoxError> + Send + Sync + 'static,
    {
        self.add(provisioner, spec, None)
    }

    /// As [`stage`](StageTreeBuilder::stage), with a watcher of the stage's resource: its
    /// future is polled while the stage holds the resource (see [`WatchFn`]).
    pub fn watched_stage<P, F, W>(self, provisioner: P, spec: F, watch: W) -> Self
    where
        P: Provisioner + Send + Sync,
        F: Fn(&Resources<'_>) -> Result<P::Spec, BoxError> + Send + Sync + 'static,
        W: Fn(&P::Resource) -> LocalBoxFuture<'static, Result<(), BoxError>>
            + Send
            + Sync
            + 'static,
    {
        self.add(provisioner, spec, Some(Arc::new(watch)))
    }

    fn add<P, F>(mut self, provisioner: P, spec: F, watch: Option<WatchFn<P::Resource>>) -> Self
    where
        P: Provisioner + Send + Sync,
        F: Fn(&Resources<'_>) -> Result<P::Spec, BoxError> + Send + Sync + 'static,
    {
        let name = provisioner.name();
        assert!(
            self.defs.iter().all(|d| d.name() != name),
            "duplicate stage name `{name}`"
        );
        self.defs.push(Arc::new(StageDef {
            provisioner,
            spec: Arc::new(spec),
            watch,
        }));
        self
    }

    /// The tree, holding nothing yet (not started).
    pub fn build(self) -> StageTree {
        let slots = self
            .defs
            .iter()
            .map(|d| Slot {
                info: StageInfo {
                    name: d.name(),
                    status: StageStatus::Pending,
                    restarts: 0,
                    setup_seconds: None,
                },
                resource: None,
                lives: 0,
            })
            .collect();
        let board = Board {
            state: Arc::new(Mutex::new(BoardState {
                slots,
                failure: None,
                gave_up: false,
                ready_once: false,
                detaching: false,
                exited: None,
            })),
            changed: Arc::new(watch::channel(0).0),
            observer: self.observer,
        };
        StageTree {
            name: self.name,
            defs: self.defs,
            shared: Arc::new(TreeShared {
                board,
                hook: self.hook,
            }),
            intensity: self.intensity,
            backoff: self.backoff,
            stage_shutdown: self.stage_shutdown,
            root: None,
        }
    }

    /// The tree owning `existing` resources (recovery): those stages do not set up when the
    /// tree starts.
    ///
    /// # Errors
    /// [`Phase::Adopt`] if `existing` names a stage this tree lacks or gives a resource of the
    /// wrong type.
    pub fn rebuild(self, existing: Detached) -> Result<StageTree, StageError> {
        let tree = self.build();
        let adopted = existing.resources.len();
        {
            let mut st = tree.shared.board.lock();
            for (stage, resource) in existing.resources {
                let error = |source: &str| StageError {
                    stage,
                    phase: Phase::Adopt,
                    source: source.to_owned().into(),
                };
                let index = tree
                    .defs
                    .iter()
                    .position(|d| d.name() == stage)
                    .ok_or_else(|| error("no such stage in this tree"))?;
                if !tree.defs[index].accepts(&*resource) {
                    return Err(error("resource of the wrong type"));
                }
                st.slots[index].resource = Some(resource);
                st.slots[index].info.status = StageStatus::Ready;
            }
            st.ready_once = adopted == st.slots.len();
        }
        Ok(tree)
    }
}

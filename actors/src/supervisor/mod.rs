//! The supervisor actor: ordered start, restart strategies and intensity, reverse shutdown,
//! dynamic children (OTP's `supervisor`).

mod intensity;
mod spec;
mod strategy;

use std::sync::Arc;

use actix::prelude::*;
use tokio::time::Instant;

pub use intensity::{Backoff, Intensity};
pub use spec::{ChildSpec, RestartType, Shutdown};
pub use strategy::Strategy;

use crate::child::{launch_actor, ExitHandle, ExitReason, Running};
use intensity::RestartLog;

/// Errors of the supervisor's dynamic-children messages.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SupervisorError {
    /// [`AddChild`] with an id a sibling already has.
    #[error("a child with id `{0}` already exists")]
    DuplicateId(String),
    /// [`RemoveChild`] with an id no child has.
    #[error("no child with id `{0}`")]
    NotFound(String),
    /// [`AddChild`] reached a supervisor that is shutting down.
    #[error("the supervisor is shutting down")]
    ShuttingDown,
}

/// A supervisor's configuration and initial children; [`Supervisor::build`] makes one.
///
/// Start it as the root of a tree with [`SupervisorBuilder::start`], or as a child of another
/// supervisor with [`ChildSpec::supervisor`]. Cloning it clones the child specs (cheap:
/// their start functions are shared).
#[derive(Debug, Clone)]
pub struct SupervisorBuilder {
    name: String,
    strategy: Strategy,
    intensity: Intensity,
    backoff: Backoff,
    children: Vec<ChildSpec>,
}

impl SupervisorBuilder {
    /// Sets the restart strategy (default [`Strategy::OneForOne`]).
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Sets the restart intensity (default 1 restart in 5 s, as in OTP).
    pub fn intensity(mut self, intensity: Intensity) -> Self {
        self.intensity = intensity;
        self
    }

    /// Sets the delay between restarts (default [`Backoff::None`]).
    pub fn backoff(mut self, backoff: Backoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// Appends a child; children start in the order they are added.
    ///
    /// # Panics
    /// If a child with the same id was already added (a programming error).
    pub fn child(mut self, spec: ChildSpec) -> Self {
        assert!(
            self.children.iter().all(|c| c.id != spec.id),
            "supervisor `{}`: duplicate child id `{}`",
            self.name,
            spec.id
        );
        self.children.push(spec);
        self
    }

    /// Starts this supervisor as the root of a tree on the current actix arbiter (call it
    /// inside an actix system). Every start function of the tree has run, in order, when this
    /// returns; the children's tasks then run as the arbiter polls them, in the same order.
    ///
    /// Dropping the returned [`Root`] forces the whole tree down, so keep it as long as the
    /// tree should run.
    pub fn start(self) -> Root {
        self.start_with_exit(|_| ())
    }

    /// As [`start`](SupervisorBuilder::start), and calls `on_exit` once, on the arbiter, with
    /// the root's exit reason when it ends (by itself, or after [`Root::shutdown`]): how an
    /// owner that is not a supervisor learns that the tree gave up ([`ExitReason::Failed`]).
    pub fn start_with_exit(self, on_exit: impl FnOnce(ExitReason) + 'static) -> Root {
        let mut addr = None;
        let running = Running::spawn(
            |stop| {
                let (a, life) = launch_actor(stop, |ctx, exit| {
                    Supervisor::new(self, exit).started_in(ctx)
                });
                addr = Some(a);
                life
            },
            on_exit,
        );
        Root {
            addr: addr.expect("supervisor constructed"),
            running,
        }
    }
}

impl ChildSpec {
    /// A child that is itself a supervisor, built from `builder` on every (re)start: this is
    /// how trees nest. Intensity exhaustion inside it is an abnormal exit
    /// ([`ExitReason::Failed`]) that its own supervisor handles: escalation.
    ///
    /// Defaults: [`RestartType::Permanent`] and [`Shutdown::Infinity`] (OTP's for
    /// supervisors), so the subtree always completes its ordered shutdown.
    pub fn supervisor(id: impl Into<String>, builder: SupervisorBuilder) -> ChildSpec {
        let start: spec::StartFn = Arc::new(move |stop| {
            launch_actor(stop, |ctx, exit| {
                Supervisor::new(builder.clone(), exit).started_in(ctx)
            })
            .1
        });
        ChildSpec::with_start(id.into(), start, Shutdown::Infinity)
    }
}

/// The top of a supervision tree, as returned by [`SupervisorBuilder::start`].
///
/// Holds the tree: dropping it forces the root supervisor (and so every child) down at once.
pub struct Root {
    addr: Addr<Supervisor>,
    running: Running,
}

impl Root {
    /// The root supervisor's address, for [`AddChild`], [`RemoveChild`], [`WhichChildren`].
    pub fn addr(&self) -> Addr<Supervisor> {
        self.addr.clone()
    }

    /// Shuts the tree down (children in reverse start order, each per its [`Shutdown`]) and
    /// resolves with the root's exit reason, [`ExitReason::Shutdown`] when all went well.
    pub async fn shutdown(self) -> ExitReason {
        self.running.shutdown(Shutdown::Infinity).await
    }

    /// Resolves when the root supervisor exits by itself, which is when its restart intensity
    /// is exhausted: then [`ExitReason::Failed`].
    pub async fn join(self) -> ExitReason {
        self.running.join().await
    }
}

/// Adds and starts a child at run time (OTP `start_child`), after the existing ones; replies
/// `Err(DuplicateId)` if a sibling has the same id, `Err(ShuttingDown)` if the supervisor is
/// stopping.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), SupervisorError>")]
pub struct AddChild(pub ChildSpec);

/// Stops a child per its [`Shutdown`] policy and forgets its spec (OTP `terminate_child` then
/// `delete_child`); replies once it is stopped, with how it ended (`None` when it was not
/// running), or `Err(NotFound)`.
#[derive(Debug, Message)]
#[rtype(result = "Result<Option<ExitReason>, SupervisorError>")]
pub struct RemoveChild(pub String);

/// Lists the children in start order (OTP `which_children`).
#[derive(Debug, Message)]
#[rtype(result = "Vec<ChildInfo>")]
pub struct WhichChildren;

/// One entry of [`WhichChildren`]'s reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildInfo {
    /// The child's id.
    pub id: String,
    /// Its restart type.
    pub restart: RestartType,
    /// Whether it is running now (a transient child that exited normally is not).
    pub running: bool,
}

/// A child ended; `generation` tells this life from earlier and later ones of the same id.
#[derive(Message)]
#[rtype(result = "()")]
struct ChildExited {
    generation: u64,
    reason: ExitReason,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    ShuttingDown,
    Terminated,
}

struct Child {
    spec: ChildSpec,
    /// The current life and its generation; `None` while not running.
    running: Option<(u64, Running)>,
}

/// A supervisor actor (OTP `supervisor`): starts its children in order, restarts them per
/// [`Strategy`], [`RestartType`] and [`Intensity`], and stops them in reverse order.
///
/// Built with [`Supervisor::build`]; children are [`ChildSpec`]s. It is busy (its mailbox
/// waits) while it restarts or stops children, as an OTP supervisor is; a stop request from
/// its own supervisor is honoured once the restart in progress is done.
pub struct Supervisor {
    name: String,
    strategy: Strategy,
    intensity: Intensity,
    backoff: Backoff,
    children: Vec<Child>,
    restarts: RestartLog,
    exit: ExitHandle,
    phase: Phase,
    generations: u64,
}

impl Supervisor {
    /// Starts describing a supervisor named `name` (used in logs): one_for_one, OTP's default
    /// intensity (1 restart in 5 s), no backoff, no children yet.
    pub fn build(name: impl Into<String>) -> SupervisorBuilder {
        SupervisorBuilder {
            name: name.into(),
            strategy: Strategy::default(),
            intensity: Intensity::default(),
            backoff: Backoff::default(),
            children: Vec::new(),
        }
    }

    fn new(builder: SupervisorBuilder, exit: ExitHandle) -> Supervisor {
        Supervisor {
            name: builder.name,
            strategy: builder.strategy,
            intensity: builder.intensity,
            backoff: builder.backoff,
            children: builder
                .children
                .into_iter()
                .map(|spec| Child {
                    spec,
                    running: None,
                })
                .collect(),
            restarts: RestartLog::default(),
            exit,
            phase: Phase::Running,
            generations: 0,
        }
    }

    /// Starts every child, in order, before the supervisor's own context first runs: like
    /// OTP's synchronous `start_link`, a whole subtree's start functions have run by the time
    /// the supervisor's next sibling starts.
    fn started_in(mut self, ctx: &mut Context<Self>) -> Supervisor {
        for i in 0..self.children.len() {
            self.start_child(i, ctx);
        }
        self
    }

    fn start_child(&mut self, index: usize, ctx: &mut Context<Self>) {
        self.generations += 1;
        let generation = self.generations;
        let child = &mut self.children[index];
        tracing::debug!(supervisor = %self.name, child = %child.spec.id, "starting child");
        let addr = ctx.address();
        let running = Running::spawn(
            |stop| (child.spec.start)(stop),
            move |reason| addr.do_send(ChildExited { generation, reason }),
        );
        child.running = Some((generation, running));
    }

    fn position(&self, id: &str) -> Option<usize> {
        self.children.iter().position(|c| c.spec.id == id)
    }

    /// Takes the running children among `indices` (given in start order) for a reverse-order
    /// stop.
    fn take_running(
        &mut self,
        indices: impl DoubleEndedIterator<Item = usize>,
    ) -> Vec<(Shutdown, Running)> {
        indices
            .rev()
            .filter_map(|i| {
                let child = &mut self.children[i];
                child
                    .running
                    .take()
                    .map(|(_, running)| (child.spec.shutdown, running))
            })
            .collect()
    }

    /// Restarts the strategy's group around the child at `failed`, after `delay`.
    fn restart_group(
        &mut self,
        failed: usize,
        delay: std::time::Duration,
        ctx: &mut Context<Self>,
    ) {
        let group = self.strategy.group(failed, self.children.len());
        let ids: Vec<String> = group
            .clone()
            .map(|i| self.children[i].spec.id.clone())
            .collect();
        let stopping = self.take_running(group);
        let stop_and_wait = async move {
            stop_all(stopping).await;
            // Even a zero sleep waits for the next timer tick; restart at once instead.
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
        };
        ctx.wait(stop_and_wait.into_actor(self).map(move |(), act, ctx| {
            // Temporary siblings stopped for the group restart are not brought back (OTP).
            act.children.retain(|c| {
                !(c.spec.restart == RestartType::Temporary && ids.contains(&c.spec.id))
            });
            for id in &ids {
                if let Some(i) = act.position(id) {
                    act.start_child(i, ctx);
                }
            }
        }));
    }

    /// Stops every child in reverse start order, then the supervisor itself; with `failure`,
    /// the supervisor exits abnormally (escalation).
    fn terminate(&mut self, failure: Option<String>, ctx: &mut Context<Self>) {
        if self.phase != Phase::Running {
            return;
        }
        self.phase = Phase::ShuttingDown;
        let stopping = self.take_running(0..self.children.len());
        ctx.wait(
            stop_all(stopping)
                .into_actor(self)
                .map(move |(), act, ctx| {
                    act.phase = Phase::Terminated;
                    if let Some(reason) = failure {
                        act.exit.fail(reason);
                    }
                    ctx.stop();
                }),
        );
    }
}

/// Stops children one after the other, in the order given.
async fn stop_all(children: Vec<(Shutdown, Running)>) {
    for (policy, running) in children {
        running.shutdown(policy).await;
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn stopping(&mut self, ctx: &mut Context<Self>) -> actix::Running {
        if self.phase == Phase::Terminated {
            return actix::Running::Stop;
        }
        // A stop request (or `ctx.stop()` from anywhere): shut the children down first.
        self.terminate(None, ctx);
        actix::Running::Continue
    }
}

impl Handler<ChildExited> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: ChildExited, ctx: &mut Context<Self>) {
        // Exits of children this supervisor stopped itself are stale here: their life was
        // taken out of `running` before the stop.
        let Some(index) = self
            .children
            .iter()
            .position(|c| matches!(c.running, Some((g, _)) if g == msg.generation))
        else {
            return;
        };
        let child = &mut self.children[index];
        child.running = None;
        let (id, restart) = (child.spec.id.clone(), child.spec.restart);
        if !restart.restarts_after(&msg.reason) {
            tracing::debug!(supervisor = %self.name, child = %id, reason = %msg.reason, "child ended");
            if restart == RestartType::Temporary {
                self.children.remove(index);
            }
            return;
        }
        tracing::warn!(supervisor = %self.name, child = %id, reason = %msg.reason, "child ended; restarting");
        if !self.restarts.record(Instant::now(), self.intensity) {
            let reason = format!(
                "supervisor `{}`: restart intensity exceeded ({} restarts in {:?}); last: `{id}` {}",
                self.name, self.intensity.max_restarts, self.intensity.max_window, msg.reason
            );
            tracing::error!("{reason}");
            self.terminate(Some(reason), ctx);
            return;
        }
        let delay = self.backoff.delay(self.restarts.recent());
        self.restart_group(index, delay, ctx);
    }
}

impl Handler<AddChild> for Supervisor {
    type Result = Result<(), SupervisorError>;

    fn handle(&mut self, AddChild(spec): AddChild, ctx: &mut Context<Self>) -> Self::Result {
        if self.phase != Phase::Running {
            return Err(SupervisorError::ShuttingDown);
        }
        if self.position(&spec.id).is_some() {
            return Err(SupervisorError::DuplicateId(spec.id));
        }
        self.children.push(Child {
            spec,
            running: None,
        });
        self.start_child(self.children.len() - 1, ctx);
        Ok(())
    }
}

impl Handler<RemoveChild> for Supervisor {
    type Result = AtomicResponse<Self, Result<Option<ExitReason>, SupervisorError>>;

    fn handle(&mut self, RemoveChild(id): RemoveChild, _ctx: &mut Context<Self>) -> Self::Result {
        let stopped = match self.position(&id) {
            None => Err(SupervisorError::NotFound(id)),
            Some(i) => {
                let child = self.children.remove(i);
                Ok(child
                    .running
                    .map(|(_, running)| (child.spec.shutdown, running)))
            }
        };
        AtomicResponse::new(Box::pin(
            async move {
                match stopped? {
                    Some((policy, running)) => Ok(Some(running.shutdown(policy).await)),
                    None => Ok(None),
                }
            }
            .into_actor(self),
        ))
    }
}

impl Handler<WhichChildren> for Supervisor {
    type Result = Vec<ChildInfo>;

    fn handle(&mut self, _: WhichChildren, _ctx: &mut Context<Self>) -> Vec<ChildInfo> {
        self.children
            .iter()
            .map(|c| ChildInfo {
                id: c.spec.id.clone(),
                restart: c.spec.restart,
                running: c.running.is_some(),
            })
            .collect()
    }
}

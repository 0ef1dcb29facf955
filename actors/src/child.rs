//! A running child: how it is started, asked to stop, forced, and how its end is observed.
//!
//! Every child, whatever it is (a plain future, an actix actor, a nested supervisor), runs as
//! one local task on the supervisor's arbiter. The task wraps the child's life in
//! `catch_unwind`, so a panic ends that child with [`ExitReason::Panicked`] and nothing else:
//! the arbiter, its other actors and the process carry on.

use std::any::Any;
use std::cell::RefCell;
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::rc::Rc;

use actix::{Actor, ActorContext, ActorFutureExt, Addr, AsyncContext, Context};
use futures::channel::oneshot;
use futures::future::{self, Either, LocalBoxFuture};
use futures::FutureExt;
use tokio::sync::watch;

/// Why a child ended, as its supervisor sees it (OTP's exit reasons).
///
/// [`Normal`](ExitReason::Normal) and [`Shutdown`](ExitReason::Shutdown) are normal exits;
/// the others are abnormal and make a [`Transient`](crate::RestartType::Transient) child
/// restart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExitReason {
    /// The child finished on its own without error (OTP `normal`).
    Normal,
    /// The child finished after its supervisor asked it to stop (OTP `shutdown`).
    Shutdown,
    /// The child was forced: its task was dropped, either because it outlived its
    /// [`Shutdown`](crate::Shutdown) timeout or because the policy was
    /// [`Shutdown::Immediate`](crate::Shutdown::Immediate) (OTP `killed`).
    Killed,
    /// The child reported an error: a task child returned `Err`, or an actor child called
    /// [`ExitHandle::fail`] before stopping. Carries the error's text.
    Failed(String),
    /// The child panicked while starting or running. Carries the panic message.
    Panicked(String),
}

impl ExitReason {
    /// `true` for [`Failed`](ExitReason::Failed), [`Panicked`](ExitReason::Panicked) and
    /// [`Killed`](ExitReason::Killed): the exits that restart a transient child.
    pub fn is_abnormal(&self) -> bool {
        !matches!(self, ExitReason::Normal | ExitReason::Shutdown)
    }
}

impl fmt::Display for ExitReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExitReason::Normal => f.write_str("normal"),
            ExitReason::Shutdown => f.write_str("shutdown"),
            ExitReason::Killed => f.write_str("killed"),
            ExitReason::Failed(e) => write!(f, "failed: {e}"),
            ExitReason::Panicked(m) => write!(f, "panicked: {m}"),
        }
    }
}

/// The supervisor's request that a child stop gracefully; given to every child at start.
///
/// A task child should finish soon after [`requested`](StopSignal::requested) resolves; if it
/// has not finished when its [`Shutdown`](crate::Shutdown) timeout runs out, it is dropped.
/// Actor children need not look at it: the supervisor turns the request into `ctx.stop()`.
#[derive(Debug, Clone)]
pub struct StopSignal(watch::Receiver<bool>);

impl StopSignal {
    /// Resolves once the supervisor has asked the child to stop (or is gone).
    pub async fn requested(&self) {
        let mut rx = self.0.clone();
        // An error means the sender is gone, i.e. the supervisor no longer exists: stop too.
        let _ = rx.wait_for(|stop| *stop).await;
    }

    /// `true` once a stop was requested (or the supervisor is gone).
    pub fn is_requested(&self) -> bool {
        *self.0.borrow() || self.0.has_changed().is_err()
    }
}

/// Lets an actor child end with [`ExitReason::Failed`] instead of [`ExitReason::Normal`].
///
/// actix actors have no exit reasons; an actor started by
/// [`ChildSpec::actor`](crate::ChildSpec::actor) receives this handle in its factory, calls
/// [`fail`](ExitHandle::fail) and then `ctx.stop()`. It is `!Send` on purpose: it belongs to
/// the one actor it was given to.
#[derive(Debug, Clone, Default)]
pub struct ExitHandle(Rc<RefCell<Option<String>>>);

impl ExitHandle {
    /// Records that the actor is failing with `reason`; the last call wins.
    pub fn fail(&self, reason: impl Into<String>) {
        *self.0.borrow_mut() = Some(reason.into());
    }

    /// The recorded failure, as the result of the child's life.
    pub(crate) fn outcome(&self) -> Result<(), String> {
        self.0.borrow_mut().take().map_or(Ok(()), Err)
    }
}

/// How a child's life is started: given its stop signal, returns the future that *is* the
/// child. `Err` ends it with [`ExitReason::Failed`].
pub(crate) type ChildLife = LocalBoxFuture<'static, Result<(), String>>;

/// Whatever is left of a started child for its supervisor: the means to stop or force it and
/// to learn how it ended.
///
/// Dropping it forces the child, like an Erlang link: a supervisor that dies takes its
/// children with it instead of leaving them orphaned.
pub(crate) struct Running {
    stop: watch::Sender<bool>,
    kill: Option<oneshot::Sender<()>>,
    done: oneshot::Receiver<ExitReason>,
}

impl Running {
    /// Starts a child on the current arbiter and returns at once.
    ///
    /// `start` runs here, synchronously, so children start in the order the supervisor calls
    /// this. `on_exit` runs once, in the child's task, with the reason it ended; the
    /// supervisor tells a stop it asked for from an unexpected exit by generation.
    pub(crate) fn spawn(
        start: impl FnOnce(StopSignal) -> ChildLife,
        on_exit: impl FnOnce(ExitReason) + 'static,
    ) -> Running {
        let (stop_tx, stop_rx) = watch::channel(false);
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let (done_tx, done_rx) = oneshot::channel();
        let signal = StopSignal(stop_rx);
        let life = panic::catch_unwind(AssertUnwindSafe(|| start(signal.clone())));
        actix_rt::spawn(async move {
            let reason = match life {
                Err(payload) => ExitReason::Panicked(panic_message(&*payload)),
                Ok(life) => {
                    let mut life = AssertUnwindSafe(life).catch_unwind();
                    let reason = match future::select(&mut life, kill_rx).await {
                        Either::Left((Ok(Ok(())), _)) if signal.is_requested() => {
                            ExitReason::Shutdown
                        }
                        Either::Left((Ok(Ok(())), _)) => ExitReason::Normal,
                        Either::Left((Ok(Err(e)), _)) => ExitReason::Failed(e),
                        Either::Left((Err(payload), _)) => {
                            ExitReason::Panicked(panic_message(&*payload))
                        }
                        Either::Right(_) => ExitReason::Killed,
                    };
                    // Dropping an unfinished actix context polls it once more (`stopping`,
                    // `stopped`); a panic there must not skip the exit report.
                    let _ = panic::catch_unwind(AssertUnwindSafe(move || drop(life)));
                    reason
                }
            };
            let _ = done_tx.send(reason.clone());
            on_exit(reason);
        });
        Running {
            stop: stop_tx,
            kill: Some(kill_tx),
            done: done_rx,
        }
    }

    /// Stops the child per `policy` and resolves with how it ended.
    ///
    /// Graceful: raise the stop signal, wait up to the timeout, then force. Immediate: force
    /// at once. Infinity: raise the stop signal and wait for as long as it takes.
    pub(crate) async fn shutdown(mut self, policy: crate::Shutdown) -> ExitReason {
        match policy {
            crate::Shutdown::Immediate => self.force(),
            crate::Shutdown::Infinity => {
                self.stop.send_replace(true);
            }
            // While the runtime itself is being torn down (e.g. a test's system dropped during
            // a panic) no timer can be armed: force the child rather than panic in a drop.
            crate::Shutdown::Graceful(_) if tokio::runtime::Handle::try_current().is_err() => {
                self.force()
            }
            crate::Shutdown::Graceful(timeout) => {
                self.stop.send_replace(true);
                match tokio::time::timeout(timeout, &mut self.done).await {
                    Ok(reason) => return reason.unwrap_or(ExitReason::Killed),
                    Err(_) => {
                        tracing::warn!(?timeout, "child ignored the stop request; forcing it");
                        self.force();
                    }
                }
            }
        }
        (&mut self.done).await.unwrap_or(ExitReason::Killed)
    }

    /// Resolves when the child ends by itself, with its reason (the top-level supervisor's
    /// way of being joined).
    pub(crate) async fn join(mut self) -> ExitReason {
        (&mut self.done).await.unwrap_or(ExitReason::Killed)
    }

    fn force(&mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
    }
}

/// Builds an actor with `factory(ctx, exit)` and returns its address and its life: the
/// actor's context as a future, which a stop request turns into `ctx.stop()` and whose result
/// is what the actor recorded through its [`ExitHandle`].
///
/// Polling the context inside the child's own task (instead of `Context::run`) is what puts
/// the actor's handlers under the task's `catch_unwind`.
pub(crate) fn launch_actor<A>(
    stop: StopSignal,
    factory: impl FnOnce(&mut Context<A>, ExitHandle) -> A,
) -> (Addr<A>, ChildLife)
where
    A: Actor<Context = Context<A>>,
{
    let exit = ExitHandle::default();
    let mut ctx = Context::<A>::new();
    let actor = factory(&mut ctx, exit.clone());
    // A future spawned on the context may call `ctx.stop()` without the actor handling any
    // message type, so any actor can be asked to stop.
    ctx.spawn(
        actix::fut::wrap_future::<_, A>(async move { stop.requested().await })
            .map(|(), _actor, ctx: &mut Context<A>| ctx.stop()),
    );
    let life = ctx.into_future(actor);
    let addr = life.address();
    let life = async move {
        life.await;
        exit.outcome()
    };
    (addr, life.boxed_local())
}

/// The text of a panic payload (`&str` or `String`, as `panic!` makes them).
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned())
}

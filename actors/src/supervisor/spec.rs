//! Child specifications: what a supervisor needs to know to start, restart and stop a child
//! (OTP's `child_spec()`).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Context};
use futures::FutureExt;

use crate::child::{launch_actor, ChildLife, ExitHandle, ExitReason, StopSignal};

/// When a child that ended is restarted (OTP's `restart` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartType {
    /// Always restarted, whatever the exit (OTP `permanent`).
    Permanent,
    /// Restarted only after an abnormal exit ([`ExitReason::is_abnormal`]); a normal exit
    /// leaves its spec in place, not running (OTP `transient`).
    Transient,
    /// Never restarted; its spec is forgotten when it ends, and it is not brought back when a
    /// sibling's failure restarts a group under `one_for_all`/`rest_for_one` (OTP `temporary`).
    Temporary,
}

impl RestartType {
    /// Whether a child of this type that ended with `reason` is restarted.
    pub fn restarts_after(self, reason: &ExitReason) -> bool {
        match self {
            RestartType::Permanent => true,
            RestartType::Transient => reason.is_abnormal(),
            RestartType::Temporary => false,
        }
    }
}

/// How a child is stopped (OTP's `shutdown` values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Ask the child to stop, wait up to this long, then force it (OTP's timeout in ms;
    /// use [`Shutdown::millis`]).
    Graceful(Duration),
    /// Force the child at once, without asking (OTP `brutal_kill`).
    Immediate,
    /// Ask the child to stop and wait as long as it takes (OTP `infinity`); the default for
    /// nested supervisors, so a subtree always finishes its own ordered shutdown.
    Infinity,
}

impl Shutdown {
    /// [`Shutdown::Graceful`] with a timeout of `ms` milliseconds.
    pub fn millis(ms: u64) -> Shutdown {
        Shutdown::Graceful(Duration::from_millis(ms))
    }
}

/// Starts one instance of a child: given its stop signal, returns the child's life.
pub(crate) type StartFn = Arc<dyn Fn(StopSignal) -> ChildLife + Send + Sync>;

/// How to start, restart and stop one child of a [`Supervisor`](crate::Supervisor)
/// (OTP's `child_spec()`).
///
/// Built by [`ChildSpec::task`], [`ChildSpec::actor`] or [`ChildSpec::supervisor`], then
/// tuned with [`restart`](ChildSpec::restart) and [`shutdown`](ChildSpec::shutdown). The
/// start function is called once per (re)start on the supervisor's arbiter; it must be
/// `Send + Sync` so a spec can travel in an actix message, but what it starts need not be.
#[derive(Clone)]
pub struct ChildSpec {
    pub(crate) id: String,
    pub(crate) start: StartFn,
    pub(crate) restart: RestartType,
    pub(crate) shutdown: Shutdown,
}

impl ChildSpec {
    /// A child that is a future: `start(stop)` is called on every (re)start and the child
    /// lives until the returned future resolves. `Ok(())` is a normal exit
    /// ([`ExitReason::Shutdown`] if a stop had been requested), `Err(e)` is
    /// [`ExitReason::Failed`] with `e`'s text, a panic is [`ExitReason::Panicked`].
    ///
    /// The future should finish soon after [`StopSignal::requested`] resolves.
    /// Defaults: [`RestartType::Permanent`], [`Shutdown::Graceful`] of 5000 ms (OTP's).
    pub fn task<F, Fut, E>(id: impl Into<String>, start: F) -> ChildSpec
    where
        F: Fn(StopSignal) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + 'static,
        E: fmt::Display,
    {
        let start: StartFn = Arc::new(move |stop| {
            start(stop)
                .map(|result| result.map_err(|e| e.to_string()))
                .boxed_local()
        });
        ChildSpec::with_start(id.into(), start, Shutdown::millis(5000))
    }

    /// A child that is an actix actor, built by `factory(ctx, exit)` on every (re)start, like
    /// [`Actor::create`]. Publish `ctx.address()` from the factory if siblings need it.
    ///
    /// A stop request becomes `ctx.stop()` (the actor may refuse it in `stopping`, and is
    /// forced after its shutdown timeout). The actor stopping by itself is a normal exit,
    /// unless it called [`ExitHandle::fail`] first; a panic in any handler is
    /// [`ExitReason::Panicked`]. Defaults: [`RestartType::Permanent`], [`Shutdown::Graceful`]
    /// of 5000 ms.
    pub fn actor<A, F>(id: impl Into<String>, factory: F) -> ChildSpec
    where
        A: Actor<Context = Context<A>>,
        F: Fn(&mut Context<A>, ExitHandle) -> A + Send + Sync + 'static,
    {
        let start: StartFn = Arc::new(move |stop| launch_actor(stop, &factory).1);
        ChildSpec::with_start(id.into(), start, Shutdown::millis(5000))
    }

    pub(crate) fn with_start(id: String, start: StartFn, shutdown: Shutdown) -> ChildSpec {
        ChildSpec {
            id,
            start,
            restart: RestartType::Permanent,
            shutdown,
        }
    }

    /// Sets the restart type (default [`RestartType::Permanent`]).
    pub fn restart(mut self, restart: RestartType) -> ChildSpec {
        self.restart = restart;
        self
    }

    /// Sets the shutdown policy (default 5000 ms graceful; [`Shutdown::Infinity`] for
    /// supervisors).
    pub fn shutdown(mut self, shutdown: Shutdown) -> ChildSpec {
        self.shutdown = shutdown;
        self
    }

    /// The child's id, unique among its siblings.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Debug for ChildSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChildSpec")
            .field("id", &self.id)
            .field("restart", &self.restart)
            .field("shutdown", &self.shutdown)
            .finish_non_exhaustive()
    }
}

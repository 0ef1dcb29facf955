//! The stage: one owner for one resource (seed 001's `ProvisionStage`).

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use futures::FutureExt;
use tokio::time::Instant;

use super::hook::{NoopHook, StageHook};
use super::provisioner::{BoxError, Provisioner};
use crate::child::panic_message;

/// Which operation of a stage failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Setting the resource up (building its spec included).
    Setup,
    /// Tearing the resource down.
    Teardown,
    /// Adopting an existing resource on rebuild (it had the wrong type for the stage).
    Adopt,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Setup => "setup",
            Phase::Teardown => "teardown",
            Phase::Adopt => "adopt",
        })
    }
}

/// A stage's operation failed: names the stage and the phase, and carries the cause.
#[derive(Debug, thiserror::Error)]
#[error("stage `{stage}`: {phase} failed: {source}")]
pub struct StageError {
    /// The stage's [`Provisioner::name`].
    pub stage: &'static str,
    /// What it was doing.
    pub phase: Phase,
    /// Why it failed (a provisioner's error, a spec error, or a panic's message).
    pub source: BoxError,
}

enum State<R> {
    /// Never set up, or its setup failed: nothing to release.
    Empty,
    /// Holds the resource.
    Ready(R),
    /// The resource was torn down or handed out by `detach`: nothing to release.
    Released,
}

/// Owns at most one resource of provisioner `P`, from setup (or adoption) to teardown (or
/// detach); seed 001's `Stage`.
///
/// Teardown is idempotent: it releases a held resource exactly once and does nothing
/// otherwise, so it is safe after a failed or missing setup and safe to repeat. Panics in
/// the provisioner are caught and become the operation's [`StageError`]. Each setup and
/// teardown is reported to the [`StageHook`] with its duration.
pub struct Stage<P: Provisioner> {
    provisioner: P,
    state: State<P::Resource>,
    hook: Arc<dyn StageHook>,
}

impl<P: Provisioner> Stage<P> {
    /// An empty stage around `provisioner`, reporting to [`NoopHook`].
    pub fn new(provisioner: P) -> Stage<P> {
        Stage {
            provisioner,
            state: State::Empty,
            hook: Arc::new(NoopHook),
        }
    }

    /// Reports setups and teardowns to `hook` instead.
    pub fn with_hook(mut self, hook: Arc<dyn StageHook>) -> Stage<P> {
        self.hook = hook;
        self
    }

    /// The provisioner's name.
    pub fn name(&self) -> &'static str {
        self.provisioner.name()
    }

    /// The resource, while the stage holds one.
    pub fn resource(&self) -> Option<&P::Resource> {
        match &self.state {
            State::Ready(r) => Some(r),
            State::Empty | State::Released => None,
        }
    }

    /// Sets the resource up from `spec` and keeps it.
    ///
    /// # Errors
    /// [`Phase::Setup`] if the provisioner fails or panics, or if the stage already holds a
    /// resource (tear it down first); the stage then holds nothing new.
    pub async fn setup(&mut self, spec: P::Spec) -> Result<&P::Resource, StageError> {
        if self.resource().is_some() {
            return Err(self.error(Phase::Setup, "already holds a resource".into()));
        }
        let (duration, result) = timed(self.provisioner.setup(spec)).await;
        self.hook
            .on_setup(self.name(), duration, result.as_ref().map(drop));
        let resource = result.map_err(|e| self.error(Phase::Setup, e))?;
        self.state = State::Ready(resource);
        Ok(self.resource().expect("just set up"))
    }

    /// Releases the resource if the stage holds one; otherwise does nothing and succeeds.
    ///
    /// # Errors
    /// [`Phase::Teardown`] if the provisioner fails or panics; the resource counts as
    /// released anyway and is never handed to `teardown` again.
    pub async fn teardown(&mut self) -> Result<(), StageError> {
        let State::Ready(resource) = std::mem::replace(&mut self.state, State::Released) else {
            return Ok(());
        };
        let (duration, result) = timed(self.provisioner.teardown(resource)).await;
        self.hook
            .on_teardown(self.name(), duration, result.as_ref().map(drop));
        result.map_err(|e| self.error(Phase::Teardown, e))
    }

    /// Hands the resource out without tearing it down (the stage then holds nothing).
    pub fn detach(&mut self) -> Option<P::Resource> {
        match std::mem::replace(&mut self.state, State::Released) {
            State::Ready(r) => Some(r),
            State::Empty => {
                self.state = State::Empty;
                None
            }
            State::Released => None,
        }
    }

    /// Takes ownership of a resource that already exists (recovery), for a later teardown.
    ///
    /// # Errors
    /// Gives `resource` back if the stage already holds one.
    pub fn adopt(&mut self, resource: P::Resource) -> Result<(), P::Resource> {
        if self.resource().is_some() {
            return Err(resource);
        }
        self.state = State::Ready(resource);
        Ok(())
    }

    /// Reports a setup that failed before the provisioner ran (its spec could not be built).
    pub(crate) fn spec_failed(&self, cause: BoxError) -> StageError {
        self.hook
            .on_setup(self.name(), std::time::Duration::ZERO, Err(&cause));
        self.error(Phase::Setup, cause)
    }

    pub(crate) fn set_hook(&mut self, hook: Arc<dyn StageHook>) {
        self.hook = hook;
    }

    fn error(&self, phase: Phase, source: BoxError) -> StageError {
        StageError {
            stage: self.name(),
            phase,
            source,
        }
    }
}

impl<P: Provisioner> fmt::Debug for Stage<P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Empty => "empty",
            State::Ready(_) => "ready",
            State::Released => "released",
        };
        f.debug_struct("Stage")
            .field("name", &self.name())
            .field("state", &state)
            .finish()
    }
}

/// Runs `op`, turning a panic into an error, and measures it (paused-clock aware).
pub(crate) async fn timed<T>(
    op: impl Future<Output = Result<T, BoxError>>,
) -> (std::time::Duration, Result<T, BoxError>) {
    let start = Instant::now();
    let result = match AssertUnwindSafe(op).catch_unwind().await {
        Ok(result) => result,
        Err(payload) => Err(format!("panicked: {}", panic_message(&*payload)).into()),
    };
    (start.elapsed(), result)
}

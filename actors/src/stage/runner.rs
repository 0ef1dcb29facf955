//! The runner: an actix actor that owns one [`StageChain`] (seed 001's `Runner`).

use actix::prelude::*;

use super::chain::{Detached, SetupError, StageChain, TeardownError};
use crate::child::ExitHandle;

/// Sets up the chain ([`StageChain::setup`]); replies with its result.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), SetupError>")]
pub struct SetupChain;

/// Tears the chain down ([`StageChain::teardown`]); the runner keeps running, empty.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), TeardownError>")]
pub struct TeardownChain;

/// Detaches the chain ([`StageChain::detach`]), replies with its resources and stops the
/// runner without tearing anything down.
#[derive(Debug, Message)]
#[rtype(result = "Detached")]
pub struct DetachChain;

/// An actor owning one [`StageChain`], so that every resource of, say, a kernel has exactly
/// one owner actor (seed 001's kernel runner).
///
/// Messages run one at a time ([`SetupChain`], [`TeardownChain`], [`DetachChain`]); others
/// wait while a setup or teardown is in progress. Stopping the runner (`ctx.stop()`, or its
/// supervisor's graceful shutdown) tears the chain down first; forcing it (dropping it, or a
/// shutdown timeout) leaves the resources in place, like [`DetachChain`] but without handing
/// them out. Give the runner an [`Shutdown`](crate::Shutdown) long enough for a teardown.
pub struct Runner {
    /// `None` only while a message's future has it.
    chain: Option<StageChain>,
    exit: Option<ExitHandle>,
    torn_down: bool,
}

impl Runner {
    /// A runner owning `chain`.
    pub fn new(chain: StageChain) -> Runner {
        Runner {
            chain: Some(chain),
            exit: None,
            torn_down: false,
        }
    }

    /// Under a supervisor: a failed teardown on stop ends the runner with
    /// [`ExitReason::Failed`](crate::ExitReason::Failed) instead of a normal exit.
    pub fn with_exit(mut self, exit: ExitHandle) -> Runner {
        self.exit = Some(exit);
        self
    }

    fn take_chain(&mut self) -> StageChain {
        self.chain
            .take()
            .expect("the runner holds its chain between messages")
    }

    /// Lends the chain to `work` and puts it back when done; atomic, so no other message
    /// sees the runner without its chain.
    fn with_chain<R, Fut>(
        &mut self,
        work: impl FnOnce(StageChain) -> Fut,
    ) -> AtomicResponse<Self, R>
    where
        R: 'static,
        Fut: std::future::Future<Output = (StageChain, R)> + 'static,
    {
        let lent = work(self.take_chain());
        AtomicResponse::new(Box::pin(lent.into_actor(self).map(
            |(chain, result), act, _| {
                act.chain = Some(chain);
                result
            },
        )))
    }
}

impl Actor for Runner {
    type Context = Context<Self>;

    fn stopping(&mut self, ctx: &mut Context<Self>) -> Running {
        if self.torn_down {
            return Running::Stop;
        }
        // `None` only if the runner is being dropped mid-operation: nothing to do then.
        let Some(mut chain) = self.chain.take() else {
            return Running::Stop;
        };
        let teardown = async move {
            let result = chain.teardown().await;
            (chain, result)
        };
        ctx.wait(teardown.into_actor(self).map(|(chain, result), act, ctx| {
            if let (Err(e), Some(exit)) = (result, &act.exit) {
                exit.fail(e.to_string());
            }
            act.chain = Some(chain);
            act.torn_down = true;
            ctx.stop();
        }));
        Running::Continue
    }
}

impl Handler<SetupChain> for Runner {
    type Result = AtomicResponse<Self, Result<(), SetupError>>;

    fn handle(&mut self, _: SetupChain, _ctx: &mut Context<Self>) -> Self::Result {
        self.with_chain(|mut chain| async move {
            let result = chain.setup().await;
            (chain, result)
        })
    }
}

impl Handler<TeardownChain> for Runner {
    type Result = AtomicResponse<Self, Result<(), TeardownError>>;

    fn handle(&mut self, _: TeardownChain, _ctx: &mut Context<Self>) -> Self::Result {
        self.with_chain(|mut chain| async move {
            let result = chain.teardown().await;
            (chain, result)
        })
    }
}

impl Handler<DetachChain> for Runner {
    type Result = MessageResult<DetachChain>;

    fn handle(&mut self, _: DetachChain, ctx: &mut Context<Self>) -> Self::Result {
        let detached = self
            .chain
            .as_mut()
            .map(StageChain::detach)
            .unwrap_or_default();
        // Nothing is left to tear down: stop without the teardown `stopping` would run.
        self.torn_down = true;
        ctx.stop();
        MessageResult(detached)
    }
}

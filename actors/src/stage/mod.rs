//! Resource stages after seed 001: [`Provisioner`], [`Stage`], [`StageChain`], [`Runner`],
//! and the [`StageHook`] they report through.

mod chain;
mod hook;
mod owned;
mod provisioner;
mod runner;

pub use chain::{
    Detached, MissingResource, Resources, SetupError, StageChain, StageChainBuilder, TeardownError,
};
pub use hook::{NoopHook, StageHook};
pub use owned::{Phase, Stage, StageError};
pub use provisioner::{BoxError, Provisioner};
pub use runner::{DetachChain, Runner, SetupChain, TeardownChain};

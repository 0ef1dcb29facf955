//! Resource stages after seed 001: [`Provisioner`], [`Stage`], [`StageChain`], [`Runner`],
//! the supervised [`StageTree`], and the [`StageHook`] they report through.

mod chain;
mod hook;
mod key;
mod owned;
mod provisioner;
mod runner;
mod tree;

pub use chain::{
    Detached, MissingResource, Resources, SetupError, StageChain, StageChainBuilder, TeardownError,
};
pub use hook::{NoopHook, StageHook};
pub use key::StageKey;
pub use owned::{Phase, Stage, StageError};
pub use provisioner::{BoxError, Provisioner};
pub use runner::{DetachChain, Runner, SetupChain, TeardownChain};
pub use tree::{Observer, StageInfo, StageStatus, StageTree, StageTreeBuilder, WatchFn};

//! The observation hook every stage reports through (seed 001: "collect metrics on the
//! preparation time … for each resource").

use std::time::Duration;

use super::provisioner::BoxError;

/// Receives every stage's setup and teardown: which stage, how long it took, and whether it
/// failed. Metrics (Prometheus histograms and failure counters) are one implementation.
///
/// Called on the stage's arbiter right after each operation, also for the rollback teardowns
/// after a failed setup. Methods have no-op defaults; [`NoopHook`] implements none.
pub trait StageHook: Send + Sync + 'static {
    /// Stage `stage` finished a setup after `duration`; `result` is its error if it failed.
    fn on_setup(&self, stage: &'static str, duration: Duration, result: Result<(), &BoxError>) {
        let _ = (stage, duration, result);
    }

    /// Stage `stage` finished a teardown after `duration`; `result` is its error if it failed.
    fn on_teardown(&self, stage: &'static str, duration: Duration, result: Result<(), &BoxError>) {
        let _ = (stage, duration, result);
    }
}

/// A [`StageHook`] that ignores everything; the default.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopHook;

impl StageHook for NoopHook {}

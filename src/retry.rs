//! Retry waits with jitter, for every retry loop of the agent and the manager (the event sender's
//! intake failover, the bus sender, the engine watcher's resubscription, the manager's dangling
//! kernel retries).
//!
//! Why jitter: when a manager restarts, every agent's sender failed at the same instant; with
//! plain doubling they all knock again at the same instants (200 ms, 400 ms, … after it went),
//! a thundering herd on the new manager. Each wait here is drawn at random within its step
//! ("equal jitter", AWS Architecture Blog, "Exponential Backoff And Jitter"): the step doubles
//! from `first` up to `max`, and the wait is uniform in `[step / 2, step)`, so waits never exceed
//! `max` (the configured `*-retry-max` keeps its meaning) and never fall below half a step.
//!
//! The steps and the randomness are backon's (`ExponentialBuilder`, jitter on); this module only
//! fixes how kernelvisor uses it.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// An endless sequence of jittered retry waits: the `n`-th (from 0) is uniform in
/// `[s/2, s)` where `s = min(first · 2ⁿ, max)`. `max` below `first` is taken as `first`.
/// Start a new one (or call [`Backoff::reset`]) after a success.
#[derive(Debug)]
pub struct Backoff {
    first: Duration,
    max: Duration,
    /// Waits handed out since the last reset.
    taken: u32,
    steps: ExponentialBackoff,
}

impl Clone for Backoff {
    /// The same step reached (backon's sequence is not `Clone`: replayed, each wait drawn anew).
    fn clone(&self) -> Backoff {
        let mut b = Backoff::new(self.first, self.max);
        // Past 64 doublings every step is `max`.
        for _ in 0..self.taken.min(64) {
            b.next_wait();
        }
        b.taken = self.taken;
        b
    }
}

impl Backoff {
    /// Waits doubling from `first` up to `max` (both the upper end of a wait's range).
    pub fn new(first: Duration, max: Duration) -> Backoff {
        let max = max.max(first);
        Backoff {
            first,
            max,
            taken: 0,
            steps: Self::steps(first, max),
        }
    }

    fn steps(first: Duration, max: Duration) -> ExponentialBackoff {
        // backon's jitter adds up to one step to the step: halving both ends makes a wait
        // `[s/2, s)` of the step `s` we mean.
        ExponentialBuilder::default()
            .with_min_delay(first / 2)
            .with_max_delay(max / 2)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times()
            .build()
    }

    /// The next wait.
    pub fn next_wait(&mut self) -> Duration {
        self.taken = self.taken.saturating_add(1);
        // Endless (`without_max_times`); `max` is the fallback should that ever change.
        self.steps.next().unwrap_or(self.max).min(self.max)
    }

    /// Back to the first step (after a success).
    pub fn reset(&mut self) {
        self.taken = 0;
        self.steps = Self::steps(self.first, self.max);
    }

    /// Waits handed out since the start or the last reset.
    pub fn attempts(&self) -> u32 {
        self.taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_within_their_step_and_never_pass_max() {
        let (first, max) = (Duration::from_millis(200), Duration::from_secs(5));
        let mut b = Backoff::new(first, max);
        let mut step = first;
        for _ in 0..12 {
            let w = b.next_wait();
            assert!(
                w >= step / 2 && w <= step,
                "{w:?} outside [{:?}, {step:?}]",
                step / 2
            );
            step = (step * 2).min(max);
        }
        b.reset();
        assert!(b.next_wait() <= first, "reset starts over");
    }

    #[test]
    fn agents_failing_together_spread_their_retries() {
        // Ten agents whose manager went away at the same instant: their third waits differ.
        let waits: Vec<Duration> = (0..10)
            .map(|_| {
                let mut b = Backoff::new(Duration::from_millis(200), Duration::from_secs(30));
                b.next_wait();
                b.next_wait();
                b.next_wait()
            })
            .collect();
        let distinct: std::collections::BTreeSet<_> = waits.iter().collect();
        assert!(distinct.len() >= 5, "lockstep retries: {waits:?}");
    }

    #[test]
    fn max_below_first_is_first() {
        let mut b = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        for _ in 0..5 {
            assert!(b.next_wait() <= Duration::from_secs(2));
        }
    }
}

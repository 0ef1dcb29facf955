//! Restart intensity (OTP's `intensity`/`period`) and the backoff between restarts.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

/// The most restarts a supervisor makes in a sliding window before it gives up.
///
/// With more than `max_restarts` restarts within `max_window`, the supervisor stops all its
/// children in reverse start order and exits with [`ExitReason::Failed`](crate::ExitReason),
/// escalating to its own supervisor (OTP's `intensity` and `period`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Intensity {
    /// Restarts allowed within the window; one more escalates.
    pub max_restarts: u32,
    /// Length of the sliding window.
    pub max_window: Duration,
}

impl Intensity {
    /// `max_restarts` restarts within `seconds` seconds.
    pub fn new(max_restarts: u32, seconds: u64) -> Intensity {
        Intensity {
            max_restarts,
            max_window: Duration::from_secs(seconds),
        }
    }
}

impl Default for Intensity {
    /// OTP's default: 1 restart within 5 seconds.
    fn default() -> Intensity {
        Intensity::new(1, 5)
    }
}

/// The restarts within the current window.
#[derive(Debug, Default)]
pub(crate) struct RestartLog(VecDeque<Instant>);

impl RestartLog {
    /// Records a restart at `now`; `false` when it is one too many for `intensity`.
    pub(crate) fn record(&mut self, now: Instant, intensity: Intensity) -> bool {
        while self
            .0
            .front()
            .is_some_and(|t| now.duration_since(*t) > intensity.max_window)
        {
            self.0.pop_front();
        }
        self.0.push_back(now);
        self.0.len() <= intensity.max_restarts as usize
    }

    /// Restarts within the window, the one just recorded included.
    pub(crate) fn recent(&self) -> u32 {
        self.0.len() as u32
    }
}

/// Delay before a restart, growing with the restarts in the current intensity window.
///
/// Not in OTP (which restarts at once); it keeps a child that fails on start from spinning
/// while its window fills. The supervisor is busy during the delay, as during any restart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Backoff {
    /// Restart at once (OTP's behaviour).
    #[default]
    None,
    /// Wait this long before every restart.
    Fixed(Duration),
    /// Wait `base` before the first restart in the window, doubling with each further one,
    /// never more than `max`.
    Exponential {
        /// Delay of the first restart in the window.
        base: Duration,
        /// Upper bound of the delay.
        max: Duration,
    },
}

impl Backoff {
    /// The delay before the `nth` restart within the window (1-based).
    pub fn delay(self, nth: u32) -> Duration {
        match self {
            Backoff::None => Duration::ZERO,
            Backoff::Fixed(d) => d,
            Backoff::Exponential { base, max } => base
                .saturating_mul(2u32.saturating_pow(nth.saturating_sub(1)))
                .min(max),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_slides() {
        let intensity = Intensity {
            max_restarts: 2,
            max_window: Duration::from_secs(10),
        };
        let t0 = Instant::now();
        let mut log = RestartLog::default();
        assert!(log.record(t0, intensity));
        assert!(log.record(t0 + Duration::from_secs(1), intensity));
        assert!(
            !log.record(t0 + Duration::from_secs(2), intensity),
            "third within 10 s"
        );
        let mut log = RestartLog::default();
        assert!(log.record(t0, intensity));
        assert!(log.record(t0 + Duration::from_secs(6), intensity));
        assert!(
            log.record(t0 + Duration::from_secs(12), intensity),
            "first one left the window"
        );
        assert_eq!(log.recent(), 2);
    }

    #[test]
    fn exponential_backoff_doubles_up_to_max() {
        let b = Backoff::Exponential {
            base: Duration::from_millis(100),
            max: Duration::from_millis(350),
        };
        let ms: Vec<u128> = (1..=4).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 350, 350]);
        assert_eq!(Backoff::None.delay(3), Duration::ZERO);
    }
}

//! A kernel's graceful termination: the signal its workload is sent when the kernel is ended
//! (`stop_signal`) and how long it has to exit before it is killed (`grace_period`), as Slurm's
//! `GraceTime` and Kubernetes' `terminationGracePeriodSeconds`.
//!
//! Both ends parse it here: the manager from a session request's JSON (and `rm --grace`), the
//! agent from the kernel config's msgpack and `destroy_kernel`'s `grace_period` keyword.

use std::time::Duration;

/// The signals a kernel may be stopped with: the ones a workload can catch to checkpoint.
/// `SIGKILL` is not one (it is what the grace's deadline sends).
pub const STOP_SIGNALS: [&str; 6] = [
    "SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2",
];

/// The default stop signal of a kernel whose image has no Backend.AI kernel runner.
pub const DEFAULT_STOP_SIGNAL: &str = "SIGTERM";

/// The stop signal of a runner kernel (upstream's agent stops its runner with `SIGINT`: the
/// runner shuts its REPL and services down and logs it).
pub const RUNNER_STOP_SIGNAL: &str = "SIGINT";

/// How one kernel is ended: `signal` to its workload, then up to `period` for it to exit, then
/// `SIGKILL` (the container removed by force).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grace {
    /// One of [`STOP_SIGNALS`], as `SIGTERM`.
    pub signal: String,
    /// Zero: killed at once, no signal first.
    pub period: Duration,
}

impl Grace {
    /// No grace: killed at once (`rm --now`, a failed creation).
    pub fn none() -> Grace {
        Grace {
            signal: DEFAULT_STOP_SIGNAL.into(),
            period: Duration::ZERO,
        }
    }

    /// `signal` (checked, `None`: [`DEFAULT_STOP_SIGNAL`]) with `secs` (checked).
    ///
    /// Errors: as [`checked_signal`] and [`checked_period`].
    pub fn new(signal: Option<&str>, secs: f64) -> Result<Grace, String> {
        Ok(Grace {
            signal: signal
                .map(checked_signal)
                .transpose()?
                .unwrap_or_else(|| DEFAULT_STOP_SIGNAL.into()),
            period: checked_period(secs)?,
        })
    }
}

/// `name` as one of [`STOP_SIGNALS`]: `TERM`, `sigterm` and `SIGTERM` are all `SIGTERM`.
///
/// Errors: any other name (numbers too: a signal's number differs between platforms), naming
/// the field and the signals allowed.
pub fn checked_signal(name: &str) -> Result<String, String> {
    let upper = name.trim().to_ascii_uppercase();
    let full = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    if STOP_SIGNALS.contains(&full.as_str()) {
        Ok(full)
    } else {
        Err(format!(
            "`stop_signal` must be one of {}, not `{name}`",
            STOP_SIGNALS.join(", ")
        ))
    }
}

/// `secs` as a grace period: finite and not negative.
///
/// Errors: anything else, naming the field.
pub fn checked_period(secs: f64) -> Result<Duration, String> {
    if secs.is_finite() && secs >= 0.0 {
        Duration::try_from_secs_f64(secs).map_err(|_| format!("`grace_period`: {secs} is too long"))
    } else {
        Err(format!(
            "`grace_period`: {secs} is not a number of seconds ≥ 0"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_named_one_way() {
        assert_eq!(checked_signal("TERM").unwrap(), "SIGTERM");
        assert_eq!(checked_signal("sigint").unwrap(), "SIGINT");
        assert_eq!(checked_signal(" SIGUSR1 ").unwrap(), "SIGUSR1");
        for bad in ["SIGKILL", "KILL", "15", "", "SIGFOO"] {
            let e = checked_signal(bad).unwrap_err();
            assert!(e.contains("stop_signal") && e.contains("SIGTERM"), "{e}");
        }
    }

    #[test]
    fn periods_are_finite_and_not_negative() {
        assert_eq!(checked_period(0.0).unwrap(), Duration::ZERO);
        assert_eq!(checked_period(2.5).unwrap(), Duration::from_millis(2500));
        for bad in [-1.0, f64::NAN, f64::INFINITY] {
            assert!(checked_period(bad).unwrap_err().contains("grace_period"));
        }
        assert!(checked_period(1e30).is_err());
        let g = Grace::new(None, 3.0).unwrap();
        assert_eq!(
            (g.signal.as_str(), g.period),
            ("SIGTERM", Duration::from_secs(3))
        );
        assert!(Grace::new(Some("KILL"), 3.0).is_err());
    }
}

//! Engine health: whether the container engine answers, as the agent last saw it.
//!
//! The exit watcher ([`super::watcher`]) owns the probing: a failed or ended event stream and a
//! failed [`probe`] mark the engine down, a successful probe (before each resubscription and
//! every [`PROBE_INTERVAL`] while up) marks it up. While it is down the agent keeps serving:
//! `ping` answers, `health` reports `status: "degraded"` with the engine's error, and kernel
//! operations that need the engine fail at once with `ContainerEngineUnavailable` instead of
//! waiting for a request timeout. The gauge `kernelvisor_agent_engine_up` follows it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::backend::{BackendError, ContainerBackend};
use super::metrics::AgentMetrics;
use crate::rpc::{ErrorMeta, Failure};

/// Longest wait for the engine's answer to a probe's ping.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Seconds between probes while the engine is up (a hung engine is noticed within this plus
/// [`PROBE_TIMEOUT`]).
pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Down {
    error: String,
    since: Instant,
}

/// Up or down, with the error that took it down. Shared (behind an `Arc` in the agent's
/// context); every method is cheap and never blocks across an await.
pub struct EngineHealth {
    down: Mutex<Option<Down>>,
    metrics: Option<Arc<AgentMetrics>>,
}

impl EngineHealth {
    /// Up (the agent starts only once the engine answered), reporting to `metrics`'
    /// `kernelvisor_agent_engine_up` when given.
    pub fn new(metrics: Option<Arc<AgentMetrics>>) -> EngineHealth {
        if let Some(m) = &metrics {
            m.engine_up(true);
        }
        EngineHealth {
            down: Mutex::new(None),
            metrics,
        }
    }

    /// `true` unless the last observation was a failure.
    pub fn is_up(&self) -> bool {
        self.down.lock().expect("engine health lock").is_none()
    }

    /// The error that took the engine down and for how long it has been down; `None` while up.
    pub fn down(&self) -> Option<(String, Duration)> {
        self.down
            .lock()
            .expect("engine health lock")
            .as_ref()
            .map(|d| (d.error.clone(), d.since.elapsed()))
    }

    /// The engine answered. Returns `true` when it was down (logged: the outage is over).
    pub fn mark_up(&self) -> bool {
        let was = self.down.lock().expect("engine health lock").take();
        if let Some(m) = &self.metrics {
            m.engine_up(true);
        }
        if let Some(d) = &was {
            tracing::info!(
                down_for_s = d.since.elapsed().as_secs_f64(),
                "container engine is back"
            );
        }
        was.is_some()
    }

    /// The engine cannot be reached (`error` says why). Returns `true` when it was up (logged
    /// once per outage); a later call while down only updates the error text.
    pub fn mark_down(&self, error: &str) -> bool {
        let mut down = self.down.lock().expect("engine health lock");
        let was_up = down.is_none();
        match down.as_mut() {
            Some(d) => d.error = error.to_owned(),
            None => {
                *down = Some(Down {
                    error: error.to_owned(),
                    since: Instant::now(),
                })
            }
        }
        drop(down);
        if let Some(m) = &self.metrics {
            m.engine_up(false);
        }
        if was_up {
            tracing::warn!(%error, "container engine unavailable; kernel operations fail until it is back");
        }
        was_up
    }

    /// Records what a backend call says about the engine: an
    /// [`Unavailable`](BackendError::Unavailable) error marks it down. Returns `r` unchanged.
    pub fn observe<T>(&self, r: Result<T, BackendError>) -> Result<T, BackendError> {
        if let Err(BackendError::Unavailable(e)) = &r {
            self.mark_down(e);
        }
        r
    }

    /// `Ok` while up; else the FAILURE an operation that needs the engine answers with:
    /// `ContainerEngineUnavailable`, its message naming the engine's error.
    pub fn check(&self) -> Result<(), ErrorMeta> {
        match self.down() {
            None => Ok(()),
            Some((error, for_)) => Err(ErrorMeta::failure(
                Failure::ContainerEngineUnavailable,
                format!(
                    "container engine unavailable for {:.1} s: {error}",
                    for_.as_secs_f64()
                ),
            )),
        }
    }
}

/// Pings the engine (at most [`PROBE_TIMEOUT`]) and records the outcome in `health`; `true`
/// when it answered.
pub async fn probe(backend: &dyn ContainerBackend, health: &EngineHealth) -> bool {
    match backend.ping(PROBE_TIMEOUT).await {
        Ok(()) => {
            health.mark_up();
            true
        }
        Err(e) => {
            health.mark_down(&e.to_string());
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn down_and_up_again() {
        let metrics = Arc::new(AgentMetrics::new("t"));
        let h = EngineHealth::new(Some(metrics.clone()));
        assert!(h.is_up() && h.check().is_ok() && h.down().is_none());
        assert!(metrics.render().contains("kernelvisor_agent_engine_up 1"));
        assert!(h.mark_down("connection refused"));
        assert!(!h.mark_down("still refused"), "one outage, logged once");
        let (error, _) = h.down().unwrap();
        assert_eq!(error, "still refused");
        let failure = h.check().unwrap_err();
        assert_eq!(failure.name, "ContainerEngineUnavailable");
        assert!(failure.repr.contains("still refused"), "{}", failure.repr);
        assert!(metrics.render().contains("kernelvisor_agent_engine_up 0"));
        assert!(h.mark_up());
        assert!(!h.mark_up());
        assert!(h.is_up() && h.check().is_ok());
    }

    #[test]
    fn only_unavailable_errors_mark_it_down() {
        let h = EngineHealth::new(None);
        let _ = h.observe::<()>(Err(BackendError::Engine("conflict".into())));
        assert!(h.is_up());
        let _ = h.observe::<()>(Err(BackendError::ContainerNotFound("c".into())));
        assert!(h.is_up());
        let _ = h.observe::<()>(Err(BackendError::Unavailable("refused".into())));
        assert!(!h.is_up());
    }
}

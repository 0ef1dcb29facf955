//! The registry's start-up grace (`docs/scenarios.md`, "Manager restart"): after a start the
//! kernel API is refused until every agent the store had `ALIVE` has been heard from since (by
//! this replica or another), or for `startup-grace` at most; none when the store had no live
//! agent. The newest heartbeat of each agent is kept meanwhile, and the store is reconciled
//! with them before the manager enters normal mode.
//!
//! ```text
//!  start ──(no ALIVE agent in the store)──────────────────────────────────────▶ Normal
//!    └──▶ Grace ──(all waited-for agents heard, or the grace ran out)──▶ Reconciling ──▶ Normal
//! ```
//!
//! Pure: the registry passes in the clock and applies what comes out.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use super::heartbeat::Heartbeat;

/// Where the registry is in its start-up.
#[derive(Debug)]
pub enum Mode {
    /// Start-up: newest heartbeat per agent, applied at the end.
    Grace {
        /// The grace ends at the latest then.
        until: Instant,
        /// The newest heartbeat of each agent heard from (by `ts`).
        latest: HashMap<String, Heartbeat>,
        /// Agents the store had `ALIVE` at start and no replica has heard from since.
        waiting: HashSet<String>,
    },
    /// Grace over, store being reconciled with the heartbeats (API still refused).
    Reconciling,
    /// Heartbeats applied as they come; the kernel API is open.
    Normal,
}

/// Why the grace ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GraceEnd {
    /// Every agent the store had `ALIVE` reported.
    AllReported,
    /// `startup-grace` ran out first; this many agents stayed silent.
    TimedOut {
        /// Agents not heard from.
        silent: usize,
    },
}

impl Mode {
    /// The mode at start: a grace until `now + grace` waiting for `alive` (the agents the store
    /// had `ALIVE`), or normal mode at once when there are none.
    pub fn at_start(alive: HashSet<String>, now: Instant, grace: Duration) -> Mode {
        if alive.is_empty() {
            Mode::Normal
        } else {
            Mode::Grace {
                until: now + grace,
                latest: HashMap::new(),
                waiting: alive,
            }
        }
    }

    /// Whether heartbeats are applied as they come (normal mode).
    pub fn is_normal(&self) -> bool {
        matches!(self, Mode::Normal)
    }

    /// A heartbeat from the inbox: kept (when newest) during the grace, only proof of life while
    /// reconciling (`None` both times), handed back to be applied in normal mode.
    pub fn receive(&mut self, hb: Heartbeat) -> Option<Heartbeat> {
        match self {
            Mode::Grace {
                latest, waiting, ..
            } => {
                waiting.remove(&hb.agent_id);
                if latest.get(&hb.agent_id).is_none_or(|old| old.ts <= hb.ts) {
                    latest.insert(hb.agent_id.clone(), hb);
                }
                None
            }
            Mode::Reconciling => None,
            Mode::Normal => Some(hb),
        }
    }

    /// `agent_id` was heard from (by this replica, or by another one since this start): the
    /// grace no longer waits for it.
    pub fn heard_from(&mut self, agent_id: &str) {
        if let Mode::Grace { waiting, .. } = self {
            waiting.remove(agent_id);
        }
    }

    /// Whether the grace is over at `now`, and why; `None` while it runs or outside it.
    pub fn grace_over(&self, now: Instant) -> Option<GraceEnd> {
        match self {
            Mode::Grace { waiting, .. } if waiting.is_empty() => Some(GraceEnd::AllReported),
            Mode::Grace { until, waiting, .. } if now >= *until => Some(GraceEnd::TimedOut {
                silent: waiting.len(),
            }),
            _ => None,
        }
    }

    /// Ends the grace: `Reconciling`, answering the newest heartbeat of each agent (empty
    /// outside the grace).
    pub fn end_grace(&mut self) -> HashMap<String, Heartbeat> {
        match std::mem::replace(self, Mode::Reconciling) {
            Mode::Grace { latest, .. } => latest,
            _ => HashMap::new(),
        }
    }

    /// The store is reconciled: normal mode.
    pub fn reconciled(&mut self) {
        *self = Mode::Normal;
    }

    /// `Some(retry after)` while the kernel API is refused (the grace's time left, at least a
    /// second; a second while reconciling), `None` in normal mode.
    pub fn refusing(&self, now: Instant) -> Option<Duration> {
        match self {
            Mode::Grace { until, .. } => Some(
                until
                    .saturating_duration_since(now)
                    .max(Duration::from_secs(1)),
            ),
            Mode::Reconciling => Some(Duration::from_secs(1)),
            Mode::Normal => None,
        }
    }
}

/// Named after the steps of `docs/scenarios.md`, "Manager restart".
#[cfg(test)]
mod tests {
    use super::*;

    fn hb(agent: &str, ts: f64) -> Heartbeat {
        Heartbeat {
            agent_id: agent.into(),
            addr: "tcp://127.0.0.1:1".into(),
            public_key: None,
            region: "local".into(),
            version: "test".into(),
            ts,
            slots_total: Default::default(),
            slot_types: Default::default(),
            kernels: vec![],
            images: vec![],
            activity: vec![],
        }
    }

    fn alive(ids: &[&str]) -> HashSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    const GRACE: Duration = Duration::from_secs(10);

    #[test]
    fn manager_restart_without_a_live_agent_has_no_grace() {
        let mut mode = Mode::at_start(alive(&[]), Instant::now(), GRACE);
        assert!(mode.is_normal());
        assert_eq!(mode.refusing(Instant::now()), None);
        assert_eq!(mode.receive(hb("a", 1.0)), Some(hb("a", 1.0)));
    }

    #[test]
    fn manager_restart_grace_refuses_the_kernel_api_with_its_time_left() {
        let t0 = Instant::now();
        let mode = Mode::at_start(alive(&["a"]), t0, GRACE);
        assert!(!mode.is_normal());
        assert_eq!(mode.refusing(t0), Some(GRACE));
        assert_eq!(
            mode.refusing(t0 + Duration::from_secs(4)),
            Some(Duration::from_secs(6))
        );
        // At least a second, even once it ran out.
        assert_eq!(mode.refusing(t0 + GRACE * 2), Some(Duration::from_secs(1)));
        assert_eq!(mode.grace_over(t0 + Duration::from_secs(4)), None);
    }

    #[test]
    fn manager_restart_heartbeats_during_the_grace_keep_the_newest_per_agent() {
        let t0 = Instant::now();
        let mut mode = Mode::at_start(alive(&["a", "b"]), t0, GRACE);
        // Several at once, out of order: the newest (`ts`) wins; none is applied yet.
        assert_eq!(mode.receive(hb("a", 2.0)), None);
        assert_eq!(mode.receive(hb("a", 3.0)), None);
        assert_eq!(mode.receive(hb("a", 1.0)), None);
        // An agent the store did not have ALIVE is kept too.
        assert_eq!(mode.receive(hb("c", 1.0)), None);
        assert_eq!(mode.grace_over(t0), None, "b not heard yet");
        assert_eq!(mode.receive(hb("b", 5.0)), None);
        assert_eq!(mode.grace_over(t0), Some(GraceEnd::AllReported));
        let mut latest: Vec<(String, f64)> = mode
            .end_grace()
            .into_iter()
            .map(|(id, hb)| (id, hb.ts))
            .collect();
        latest.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            latest,
            [("a".into(), 3.0), ("b".into(), 5.0), ("c".into(), 1.0)]
        );
    }

    #[test]
    fn manager_restart_agent_heard_by_another_replica_is_not_waited_for() {
        let t0 = Instant::now();
        let mut mode = Mode::at_start(alive(&["a"]), t0, GRACE);
        mode.heard_from("a");
        assert_eq!(mode.grace_over(t0), Some(GraceEnd::AllReported));
        // Nothing of its own to reconcile.
        assert!(mode.end_grace().is_empty());
    }

    #[test]
    fn manager_restart_grace_runs_out_before_every_agent_reported() {
        let t0 = Instant::now();
        let mut mode = Mode::at_start(alive(&["a", "b", "c"]), t0, GRACE);
        assert_eq!(mode.receive(hb("a", 1.0)), None);
        assert_eq!(mode.grace_over(t0 + GRACE - Duration::from_millis(1)), None);
        assert_eq!(
            mode.grace_over(t0 + GRACE),
            Some(GraceEnd::TimedOut { silent: 2 })
        );
        assert_eq!(mode.end_grace().len(), 1);
    }

    #[test]
    fn manager_restart_reconciling_refuses_the_api_then_normal_mode_applies_heartbeats() {
        let t0 = Instant::now();
        let mut mode = Mode::at_start(alive(&["a"]), t0, GRACE);
        assert_eq!(mode.receive(hb("a", 1.0)), None);
        let _ = mode.end_grace();
        assert!(matches!(mode, Mode::Reconciling));
        assert_eq!(mode.refusing(t0), Some(Duration::from_secs(1)));
        // Only proof of life while reconciling.
        assert_eq!(mode.receive(hb("a", 2.0)), None);
        assert_eq!(mode.grace_over(t0 + GRACE), None);
        mode.reconciled();
        assert!(mode.is_normal());
        assert_eq!(mode.refusing(t0), None);
        assert_eq!(mode.receive(hb("a", 3.0)), Some(hb("a", 3.0)));
    }
}

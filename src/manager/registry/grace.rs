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

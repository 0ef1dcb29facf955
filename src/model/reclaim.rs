//! Idle reclaim's terms (`docs/design.md`, "Idle reclaim"): a session's policy
//! ([`ReclaimPolicy`]: `max_lifetime`, `idle_timeout`, a utilization floor `min_utilization`
//! over `utilization_window`), the reasons it ends for ([`ReclaimReason`]), and the pure
//! arithmetic of its deadlines and warning ([`Deadlines`], [`warning_lead`], [`decide`]),
//! which the manager's reclaim duty acts on and the API and `ctl` show.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::error::InvalidField;

/// A session's reclaim policy, or an access key's or the `[reclaim]` table's defaults for one:
/// every field optional (absent: no limit of that kind, or the next default).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ReclaimPolicy {
    /// Seconds the session may run, counted from when it was placed (time queued does not
    /// count); it then ends `lifetime-exceeded`. Batch sessions too.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, exclusive_minimum = 0)]
    pub max_lifetime: Option<f64>,
    /// Seconds without activity (an `execute`, an open terminal, a file transfer, a connection
    /// to one of its service ports) after which it ends `idle-timeout`. Batch sessions are
    /// exempt.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, exclusive_minimum = 0)]
    pub idle_timeout: Option<f64>,
    /// Seconds its utilization must stay under `min_utilization` before it ends
    /// `low-utilization` (the `[reclaim]` default when a floor is given without one).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 0, exclusive_minimum = 0)]
    pub utilization_window: Option<f64>,
    /// `{slot: percent}`: the utilization floor (`cpu` of the cores it holds, `mem` of its
    /// limit, a `cuda.*` slot's device utilization). A reading at or above the floor on any
    /// of these slots is use; under every one of them for the whole window is idle.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub min_utilization: BTreeMap<String, f64>,
}

/// Why a session was reclaimed: its status reason, and the label of
/// `kernelvisor_manager_reclaims_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ReclaimReason {
    /// No activity for `idle_timeout`.
    IdleTimeout,
    /// Ran `max_lifetime`.
    LifetimeExceeded,
    /// Under `min_utilization` for `utilization_window`.
    LowUtilization,
}

impl ReclaimReason {
    /// Every reason.
    pub const ALL: [ReclaimReason; 3] = [
        ReclaimReason::IdleTimeout,
        ReclaimReason::LifetimeExceeded,
        ReclaimReason::LowUtilization,
    ];

    /// The wire name (`idle-timeout`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            ReclaimReason::IdleTimeout => "idle-timeout",
            ReclaimReason::LifetimeExceeded => "lifetime-exceeded",
            ReclaimReason::LowUtilization => "low-utilization",
        }
    }
}

impl std::fmt::Display for ReclaimReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn seconds(name: &str, v: Option<f64>) -> Result<(), InvalidField> {
    match v {
        Some(x) if !(x.is_finite() && x > 0.0) => Err(InvalidField(format!(
            "`{name}` must be a positive number of seconds, not {x}"
        ))),
        _ => Ok(()),
    }
}

impl ReclaimPolicy {
    /// Whether it sets nothing.
    pub fn is_empty(&self) -> bool {
        *self == ReclaimPolicy::default()
    }

    /// Checks it: positive seconds, floors over valid slot names each above 0 and at most
    /// 100 %.
    ///
    /// Errors: [`InvalidField`] naming the field (400 `invalid-request`).
    pub fn check(&self) -> Result<(), InvalidField> {
        seconds("max_lifetime", self.max_lifetime)?;
        seconds("idle_timeout", self.idle_timeout)?;
        seconds("utilization_window", self.utilization_window)?;
        for (slot, pct) in &self.min_utilization {
            crate::slots::check_name(slot).map_err(|e| {
                InvalidField(format!("`min_utilization`: {slot:?} is no slot name: {e}"))
            })?;
            if !(pct.is_finite() && *pct > 0.0 && *pct <= 100.0) {
                return Err(InvalidField(format!(
                    "`min_utilization.{slot}` must be a percent above 0 and at most 100, not {pct}"
                )));
            }
        }
        Ok(())
    }

    /// This policy with each field it leaves unset taken from `defaults` (a field at a
    /// time; `min_utilization` whole).
    pub fn or(mut self, defaults: &ReclaimPolicy) -> ReclaimPolicy {
        self.max_lifetime = self.max_lifetime.or(defaults.max_lifetime);
        self.idle_timeout = self.idle_timeout.or(defaults.idle_timeout);
        self.utilization_window = self.utilization_window.or(defaults.utilization_window);
        if self.min_utilization.is_empty() {
            self.min_utilization = defaults.min_utilization.clone();
        }
        self
    }
}

/// The lead of a deadline's warning for a limit of `timeout` seconds: `configured` (`[reclaim]
/// warning-lead`) when set, else 10 % of the timeout but at least 60 s; never longer than the
/// timeout itself.
pub fn warning_lead(timeout: f64, configured: Option<f64>) -> f64 {
    configured
        .unwrap_or_else(|| (timeout * 0.1).max(60.0))
        .min(timeout)
        .max(0.0)
}

/// What a session's deadlines are computed from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReclaimState {
    /// Its policy as created.
    pub policy: ReclaimPolicy,
    /// Unix seconds it was placed (its lifetime counts from then).
    pub placed_at: f64,
    /// Unix seconds it became `RUNNING` (its idleness counts from then at the earliest: an
    /// image pull or a slow start is not idle time).
    pub running_since: f64,
    /// Batch sessions are exempt from `idle_timeout`.
    pub batch: bool,
    /// Unix seconds of its last activity its agent reported (`None`: none yet).
    pub last_activity: Option<f64>,
    /// Unix seconds since which every utilization reading was under the floor (`None`: the
    /// last was at or above it, or none came).
    pub low_since: Option<f64>,
}

/// A session's deadlines (Unix seconds), each `None` when its policy sets no such limit.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Deadlines {
    /// `idle-timeout`: the later of its last activity and the time it became `RUNNING`, plus
    /// `idle_timeout` (none for a batch session).
    pub idle: Option<f64>,
    /// `lifetime-exceeded`: its placement plus `max_lifetime`.
    pub lifetime: Option<f64>,
    /// `low-utilization`: the start of its current run of readings under the floor plus
    /// `utilization_window` (none while a reading is at or above it).
    pub utilization: Option<f64>,
}

impl Deadlines {
    /// The deadlines of `s`.
    pub fn of(s: &ReclaimState) -> Deadlines {
        let p = &s.policy;
        let idle = p.idle_timeout.filter(|_| !s.batch).map(|t| {
            s.last_activity
                .map_or(s.running_since, |a| a.max(s.running_since))
                + t
        });
        let utilization = match (p.min_utilization.is_empty(), p.utilization_window) {
            (false, Some(w)) => s.low_since.map(|since| since + w),
            _ => None,
        };
        Deadlines {
            idle,
            lifetime: p.max_lifetime.map(|t| s.placed_at + t),
            utilization,
        }
    }

    /// The earliest deadline and its reason (the lifetime first on a tie: it needs no
    /// agent's word).
    pub fn next(&self) -> Option<(ReclaimReason, f64)> {
        [
            (ReclaimReason::LifetimeExceeded, self.lifetime),
            (ReclaimReason::IdleTimeout, self.idle),
            (ReclaimReason::LowUtilization, self.utilization),
        ]
        .into_iter()
        .filter_map(|(r, d)| d.map(|d| (r, d)))
        .min_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// What the reclaim duty does about one session now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Action {
    /// Nothing yet.
    Wait,
    /// Send its `reclaim_warning` for `deadline` (then remember it was sent).
    Warn {
        /// Why it will end.
        reason: ReclaimReason,
        /// When, Unix seconds.
        deadline: f64,
    },
    /// End it with this reason.
    End(ReclaimReason),
}

/// The duty's step for the session of `s` at `now` (Unix seconds): `lead` is `[reclaim]
/// warning-lead`, `activity_at` the newest heartbeat that reported on it, `warned` the
/// deadline its last warning was for.
///
/// The earliest deadline counts. Its warning comes first, once, from `deadline −`
/// [`warning_lead`] on; the end only after it (a warning sent late — the leader was down —
/// delays the end to the next check, never skips the warning). `lifetime-exceeded` ends at its
/// deadline; `idle-timeout` and `low-utilization` only once a heartbeat from at or after the
/// deadline has reported (`activity_at`): activity the manager has not heard of yet must not
/// be overtaken by the deadline it would have moved.
pub fn decide(
    s: &ReclaimState,
    lead: Option<f64>,
    activity_at: Option<f64>,
    warned: Option<f64>,
    now: f64,
) -> Action {
    let Some((reason, deadline)) = Deadlines::of(s).next() else {
        return Action::Wait;
    };
    let timeout = match reason {
        ReclaimReason::IdleTimeout => s.policy.idle_timeout,
        ReclaimReason::LifetimeExceeded => s.policy.max_lifetime,
        ReclaimReason::LowUtilization => s.policy.utilization_window,
    }
    .unwrap_or(0.0);
    if warned != Some(deadline) {
        return if now >= deadline - warning_lead(timeout, lead) {
            Action::Warn { reason, deadline }
        } else {
            Action::Wait
        };
    }
    let heard = match reason {
        ReclaimReason::LifetimeExceeded => true,
        _ => activity_at.is_some_and(|at| at >= deadline),
    };
    if now >= deadline && heard {
        Action::End(reason)
    } else {
        Action::Wait
    }
}

/// One kernel's facts from one heartbeat (`agent/activity.rs`), as the manager's registry
/// hands them to its store (`Store::record_activity`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ActivityReport {
    /// Kernel id.
    pub kernel_id: String,
    /// The heartbeat's `ts` (agent's clock).
    pub at: f64,
    /// Its last activity, when it had any.
    pub last_activity: Option<f64>,
    /// `{slot: percent}` means since the previous heartbeat (empty: no reading).
    pub utilization: BTreeMap<String, f64>,
}

/// Whether `readings` meet `floor`: `Some(true)` when a slot of the floor reads at or above
/// it, `Some(false)` when every slot of the floor was read and is under it, `None` when the
/// floor is empty or a slot of it was not read (no verdict: the run of low readings neither
/// starts nor ends).
pub fn meets_floor(
    floor: &BTreeMap<String, f64>,
    readings: &BTreeMap<String, f64>,
) -> Option<bool> {
    if floor.is_empty() {
        return None;
    }
    if floor
        .iter()
        .any(|(slot, min)| readings.get(slot).is_some_and(|r| r >= min))
    {
        return Some(true);
    }
    floor
        .keys()
        .all(|slot| readings.contains_key(slot))
        .then_some(false)
}

/// One kernel's reported facts, as a session's are combined from its kernels' ([`Facts::of_session`]).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Facts {
    /// Unix seconds of its last reported activity.
    pub last_activity: Option<f64>,
    /// Unix seconds of the newest heartbeat that reported on it.
    pub activity_at: Option<f64>,
    /// Unix seconds since which its readings were all under the floor.
    pub low_since: Option<f64>,
}

impl Facts {
    /// A cluster session's facts from its kernels' (`docs/design.md`, "Idle reclaim"): its
    /// last activity is the latest of any kernel (activity on `sub1` keeps it alive as well as
    /// on `main1`); it is low only while every kernel is low, since the latest of their runs
    /// began (one kernel at or above the floor, or not read yet, is use); and it is heard of
    /// up to the oldest of their heartbeats (every agent must have reported past a deadline
    /// before an idle or low end). No kernels: nothing.
    pub fn of_session(kernels: impl IntoIterator<Item = Facts>) -> Facts {
        let mut it = kernels.into_iter();
        let Some(first) = it.next() else {
            return Facts::default();
        };
        it.fold(first, |acc, k| Facts {
            last_activity: match (acc.last_activity, k.last_activity) {
                (Some(a), Some(b)) => Some(a.max(b)),
                (a, b) => a.or(b),
            },
            activity_at: acc.activity_at.zip(k.activity_at).map(|(a, b)| a.min(b)),
            low_since: acc.low_since.zip(k.low_since).map(|(a, b)| a.max(b)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(policy: ReclaimPolicy) -> ReclaimState {
        ReclaimState {
            policy,
            placed_at: 1000.0,
            running_since: 1000.0,
            ..ReclaimState::default()
        }
    }

    #[test]
    fn the_lead_is_a_tenth_at_least_a_minute_never_past_the_timeout() {
        assert_eq!(warning_lead(3600.0, None), 360.0);
        assert_eq!(warning_lead(300.0, None), 60.0);
        assert_eq!(warning_lead(30.0, None), 30.0);
        assert_eq!(warning_lead(5.0, Some(2.0)), 2.0);
        assert_eq!(warning_lead(5.0, Some(20.0)), 5.0);
    }

    #[test]
    fn checks_name_the_field() {
        for (bad, field) in [
            (
                ReclaimPolicy {
                    idle_timeout: Some(0.0),
                    ..Default::default()
                },
                "idle_timeout",
            ),
            (
                ReclaimPolicy {
                    max_lifetime: Some(f64::NAN),
                    ..Default::default()
                },
                "max_lifetime",
            ),
            (
                ReclaimPolicy {
                    utilization_window: Some(-1.0),
                    ..Default::default()
                },
                "utilization_window",
            ),
            (
                ReclaimPolicy {
                    min_utilization: [("cpu".into(), 101.0)].into(),
                    ..Default::default()
                },
                "min_utilization.cpu",
            ),
            (
                ReclaimPolicy {
                    min_utilization: [("Bad Slot".into(), 10.0)].into(),
                    ..Default::default()
                },
                "min_utilization",
            ),
        ] {
            let e = bad.check().unwrap_err();
            assert!(e.0.contains(field), "{e}");
        }
        assert!(ReclaimPolicy {
            idle_timeout: Some(5.0),
            min_utilization: [("cuda.device".into(), 10.0)].into(),
            ..Default::default()
        }
        .check()
        .is_ok());
    }

    #[test]
    fn defaults_fill_field_by_field() {
        let asked = ReclaimPolicy {
            idle_timeout: Some(5.0),
            ..Default::default()
        };
        let key = ReclaimPolicy {
            idle_timeout: Some(60.0),
            max_lifetime: Some(3600.0),
            ..Default::default()
        };
        let config = ReclaimPolicy {
            utilization_window: Some(600.0),
            min_utilization: [("cpu".into(), 5.0)].into(),
            max_lifetime: Some(7200.0),
            ..Default::default()
        };
        let p = asked.or(&key).or(&config);
        assert_eq!(p.idle_timeout, Some(5.0));
        assert_eq!(p.max_lifetime, Some(3600.0));
        assert_eq!(p.utilization_window, Some(600.0));
        assert_eq!(p.min_utilization["cpu"], 5.0);
    }

    #[test]
    fn deadlines_count_from_placement_and_activity_batch_exempt_from_idle() {
        let mut s = state(ReclaimPolicy {
            idle_timeout: Some(5.0),
            max_lifetime: Some(100.0),
            utilization_window: Some(30.0),
            min_utilization: [("cpu".into(), 10.0)].into(),
        });
        let d = Deadlines::of(&s);
        assert_eq!(
            (d.idle, d.lifetime, d.utilization),
            (Some(1005.0), Some(1100.0), None)
        );
        // Activity from before it ran (another run of the kernel) does not count; idleness
        // counts from when it runs, its lifetime from its placement.
        s.last_activity = Some(900.0);
        assert_eq!(Deadlines::of(&s).idle, Some(1005.0));
        s.running_since = 1020.0;
        let d = Deadlines::of(&s);
        assert_eq!((d.idle, d.lifetime), (Some(1025.0), Some(1100.0)));
        s.running_since = 1000.0;
        s.last_activity = Some(1050.0);
        s.low_since = Some(1010.0);
        let d = Deadlines::of(&s);
        assert_eq!((d.idle, d.utilization), (Some(1055.0), Some(1040.0)));
        assert_eq!(d.next(), Some((ReclaimReason::LowUtilization, 1040.0)));
        s.batch = true;
        assert_eq!(Deadlines::of(&s).idle, None);
        assert_eq!(Deadlines::of(&state(ReclaimPolicy::default())).next(), None);
    }

    #[test]
    fn warns_once_at_the_lead_then_ends_when_heard_past_the_deadline() {
        let s = state(ReclaimPolicy {
            idle_timeout: Some(5.0),
            ..Default::default()
        });
        let lead = Some(2.0);
        // Deadline 1005, warning from 1003.
        assert_eq!(decide(&s, lead, None, None, 1002.9), Action::Wait);
        let warn = Action::Warn {
            reason: ReclaimReason::IdleTimeout,
            deadline: 1005.0,
        };
        assert_eq!(decide(&s, lead, None, None, 1003.0), warn);
        assert_eq!(decide(&s, lead, None, Some(1005.0), 1004.0), Action::Wait);
        // Past the deadline, but no heartbeat since: activity may be on its way.
        assert_eq!(
            decide(&s, lead, Some(1004.5), Some(1005.0), 1005.5),
            Action::Wait
        );
        assert_eq!(
            decide(&s, lead, Some(1005.2), Some(1005.0), 1005.5),
            Action::End(ReclaimReason::IdleTimeout)
        );
        // Never warned (the leader was down): the warning first, even past the deadline.
        assert_eq!(decide(&s, lead, Some(1006.0), None, 1006.0), warn);
        // A warning for an older deadline is not this one's.
        assert_eq!(decide(&s, lead, Some(1006.0), Some(990.0), 1006.0), warn);
        // The lifetime needs no heartbeat.
        let s = state(ReclaimPolicy {
            max_lifetime: Some(10.0),
            ..Default::default()
        });
        assert_eq!(
            decide(&s, None, None, Some(1010.0), 1010.0),
            Action::End(ReclaimReason::LifetimeExceeded)
        );
        // Its default lead: all of a 10 s lifetime (at least 60 s, never past the timeout).
        assert!(matches!(
            decide(&s, None, None, None, 1000.0),
            Action::Warn { .. }
        ));
    }

    #[test]
    fn a_floor_is_met_by_any_slot_and_missed_only_when_every_slot_was_read_under_it() {
        let floor = BTreeMap::from([("cpu".to_owned(), 10.0), ("cuda.device".to_owned(), 50.0)]);
        let read = |pairs: &[(&str, f64)]| -> BTreeMap<String, f64> {
            pairs.iter().map(|(s, v)| ((*s).to_owned(), *v)).collect()
        };
        assert_eq!(
            meets_floor(&floor, &read(&[("cpu", 1.0), ("cuda.device", 50.0)])),
            Some(true)
        );
        assert_eq!(meets_floor(&floor, &read(&[("cpu", 10.0)])), Some(true));
        assert_eq!(
            meets_floor(&floor, &read(&[("cpu", 1.0), ("cuda.device", 49.0)])),
            Some(false)
        );
        // A slot of the floor not read: no verdict.
        assert_eq!(meets_floor(&floor, &read(&[("cpu", 1.0)])), None);
        assert_eq!(meets_floor(&BTreeMap::new(), &read(&[("cpu", 1.0)])), None);
    }

    #[test]
    fn a_session_is_as_active_as_its_most_active_kernel_and_low_only_when_all_are() {
        let main = Facts {
            last_activity: Some(100.0),
            activity_at: Some(300.0),
            low_since: Some(50.0),
        };
        let sub = Facts {
            last_activity: Some(200.0),
            activity_at: Some(250.0),
            low_since: Some(120.0),
        };
        let s = Facts::of_session([main, sub]);
        assert_eq!(
            s.last_activity,
            Some(200.0),
            "the sub kernel's activity counts"
        );
        assert_eq!(
            s.activity_at,
            Some(250.0),
            "heard up to the oldest heartbeat"
        );
        assert_eq!(s.low_since, Some(120.0), "low since every kernel is");
        // A sub kernel at or above the floor (or never read) keeps the session off its floor;
        // one never heard of holds the heartbeat condition back; no activity anywhere else.
        let quiet = Facts {
            last_activity: None,
            activity_at: None,
            low_since: None,
        };
        let s = Facts::of_session([main, quiet]);
        assert_eq!(s.low_since, None);
        assert_eq!(s.activity_at, None);
        assert_eq!(s.last_activity, Some(100.0));
        assert_eq!(Facts::of_session([main]), main);
        assert_eq!(Facts::of_session([]), Facts::default());
    }
}

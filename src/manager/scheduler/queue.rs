//! One admission round's plan, pure: which queued sessions go to which agents now, in what
//! order, and why each of the others waits.
//!
//! Order: priority first (higher first, strictly: a lower priority is looked at only after
//! every session above it was placed or passed over); within a priority `fifo` (queued time)
//! or `drf` (dominant resource fairness: the next session is the oldest of the access key whose
//! dominant share — the largest, over every slot, of its placed slots divided by the
//! schedulable agents' total — is smallest; Ghodsi et al., NSDI 2011, as Backend.AI's `drf`).
//!
//! A head that does not fit (the first session of its priority, in that order, that could not
//! be placed) holds back every session after it for `head_skip_rounds` rounds (counted per
//! session in the store): small sessions do not fill the room a large one waits for. After
//! that it is passed over and the rest fill the gaps, so a request too large for a busy fleet
//! cannot stop the queue forever. Backend.AI's `num_retries_to_skip`.

use std::collections::{BTreeMap, HashMap, VecDeque};

use super::place::place;
use crate::manager::registry::AgentImageSets;
use crate::manager::store::{AgentRow, KeyShare, QueuedSession, Usage};
use crate::model::queue::{PendingCode, PendingReason, QueuePolicy};
use crate::slots::ResourceSlots;

/// What a round decided.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// `(session, agent)` to admit, in admission order.
    pub admit: Vec<(QueuedSession, String)>,
    /// `(kernel id, reason, head_skips)` for the sessions that wait, where either changed.
    pub reasons: Vec<(String, PendingReason, i64)>,
}

/// The fleet as a round sees it.
pub struct Fleet<'a> {
    /// `ALIVE` agents with an endpoint (cordoned ones included: they tell `agents-cordoned`).
    pub candidates: &'a [AgentRow],
    /// Slots placed on each agent.
    pub usage: HashMap<String, Usage>,
    /// Images each agent holds.
    pub images: &'a AgentImageSets,
    /// Each access key's placed slots and concurrency.
    pub keys: HashMap<String, KeyShare>,
}

/// Plans one round over `window` (queued sessions in the store's order: priority descending,
/// then queued time). The fleet's usage and the keys' shares are updated as sessions are
/// placed, so one round admits as many as fit.
pub fn plan(
    window: Vec<QueuedSession>,
    mut fleet: Fleet<'_>,
    policy: QueuePolicy,
    head_skip_rounds: u32,
) -> Plan {
    let mut plan = Plan::default();
    // The schedulable total, DRF's denominator.
    let total = fleet
        .candidates
        .iter()
        .filter(|a| a.schedulable && !a.draining)
        .fold(ResourceSlots::new(), |acc, a| {
            acc.checked_add(&a.slots_total).unwrap_or(acc)
        });
    // Priorities, highest first; within each the store's order.
    let mut groups: BTreeMap<std::cmp::Reverse<i64>, Vec<QueuedSession>> = BTreeMap::new();
    for q in window {
        groups
            .entry(std::cmp::Reverse(q.priority))
            .or_default()
            .push(q);
    }
    // Set once a head holds the queue back: (its session id, its priority).
    let mut held_by: Option<(String, i64)> = None;
    for (std::cmp::Reverse(priority), group) in groups {
        let mut order = Order::new(group, policy);
        while let Some(q) = order.next(&fleet.keys, &total) {
            let mut wait = |q: &QueuedSession, reason: PendingReason, skips: i64| {
                if q.pending_reason.as_ref() != Some(&reason) || q.head_skips != skips {
                    plan.reasons.push((q.id.clone(), reason, skips));
                }
            };
            if let Some((head, p)) = &held_by {
                let why = format!(
                    "session {} (priority {p}) is ahead of it and waits for room first",
                    short(head)
                );
                wait(
                    &q,
                    PendingReason::new(PendingCode::Priority, why),
                    q.head_skips,
                );
                continue;
            }
            let key = fleet.keys.get(&q.access_key).cloned().unwrap_or_default();
            if key.limit > 0 && key.used >= key.limit {
                let why = format!(
                    "access key `{}` has {} live session(s), its concurrency limit",
                    q.access_key, key.used
                );
                wait(
                    &q,
                    PendingReason::new(PendingCode::ConcurrencyLimit, why),
                    q.head_skips,
                );
                continue;
            }
            match place(
                fleet.candidates,
                &fleet.usage,
                &q.resource_slots,
                &q.image,
                fleet.images,
            ) {
                Ok(agent) => {
                    let u = fleet.usage.entry(agent.clone()).or_default();
                    u.slots = u
                        .slots
                        .checked_add(&q.resource_slots)
                        .unwrap_or_else(|_| u.slots.clone());
                    u.kernels += 1;
                    let k = fleet.keys.entry(q.access_key.clone()).or_default();
                    k.used += 1;
                    k.slots = k
                        .slots
                        .checked_add(&q.resource_slots)
                        .unwrap_or_else(|_| k.slots.clone());
                    plan.admit.push((q, agent));
                }
                Err(e) => {
                    let reason = e.pending_reason();
                    if (q.head_skips as u64) < u64::from(head_skip_rounds) {
                        held_by = Some((q.session_id.clone(), priority));
                        wait(&q, reason, q.head_skips + 1);
                    } else {
                        wait(&q, reason, q.head_skips);
                    }
                }
            }
        }
    }
    plan
}

/// The first 8 characters of an id (what `ctl` shows).
fn short(id: &str) -> &str {
    id.get(..8).unwrap_or(id)
}

/// A key's dominant share: its largest share of any slot of `total`.
pub fn dominant_share(slots: &ResourceSlots, total: &ResourceSlots) -> f64 {
    ResourceSlots::load(slots, total)
}

/// The order within one priority.
enum Order {
    Fifo(std::vec::IntoIter<QueuedSession>),
    /// Per key, its sessions oldest first; keys in first-seen order (ties).
    Drf(Vec<(String, VecDeque<QueuedSession>)>),
}

impl Order {
    fn new(group: Vec<QueuedSession>, policy: QueuePolicy) -> Order {
        match policy {
            QueuePolicy::Fifo => Order::Fifo(group.into_iter()),
            QueuePolicy::Drf => {
                let mut by_key: Vec<(String, VecDeque<QueuedSession>)> = Vec::new();
                for q in group {
                    match by_key.iter_mut().find(|(k, _)| *k == q.access_key) {
                        Some((_, v)) => v.push_back(q),
                        None => by_key.push((q.access_key.clone(), VecDeque::from([q]))),
                    }
                }
                Order::Drf(by_key)
            }
        }
    }

    /// The next session: FIFO's next, or the oldest of the key with the smallest dominant
    /// share now (ties: the key whose oldest session is older).
    fn next(
        &mut self,
        keys: &HashMap<String, KeyShare>,
        total: &ResourceSlots,
    ) -> Option<QueuedSession> {
        match self {
            Order::Fifo(it) => it.next(),
            Order::Drf(by_key) => {
                let share = |k: &str| {
                    keys.get(k)
                        .map(|s| dominant_share(&s.slots, total))
                        .unwrap_or(0.0)
                };
                let (i, _) = by_key
                    .iter()
                    .enumerate()
                    .filter(|(_, (_, v))| !v.is_empty())
                    .min_by(|(_, (ka, va)), (_, (kb, vb))| {
                        share(ka)
                            .total_cmp(&share(kb))
                            .then(va[0].queued_at.total_cmp(&vb[0].queued_at))
                    })?;
                by_key[i].1.pop_front()
            }
        }
    }
}

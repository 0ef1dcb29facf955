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

use super::place::{place_by, place_gang, RoundPlacer};
use crate::manager::registry::AgentImageSets;
use crate::manager::store::{AgentRow, KeyShare, QueuedSession, Usage};
use crate::model::queue::{PendingCode, PendingReason, QueuePolicy};
use crate::slots::ResourceSlots;

/// What a round decided.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// `(session, agents)` to admit, in admission order: one agent per kernel, `main1`
    /// first (one for a session of one kernel).
    pub admit: Vec<(QueuedSession, Vec<String>)>,
    /// `(kernel id, reason, head_skips)` for the sessions that wait, where either changed.
    pub reasons: Vec<(String, PendingReason, i64)>,
    /// The sessions whose placement was tried and failed, in the round's order (preemption's
    /// candidates, `preempt.rs`).
    pub unplaced: Vec<QueuedSession>,
    /// Each agent's usage with this round's admissions placed (what preemption starts from).
    pub usage: HashMap<String, Usage>,
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
    /// How a `multi-node` gang's kernels spread over the candidates (`[scheduler]
    /// cluster-placement`).
    pub cluster_placement: crate::model::cluster::ClusterPlacement,
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
    let mut placer = RoundPlacer::new(fleet.candidates, fleet.images);
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
            // Each choice is `place`'s; the placer ranks the fleet once per request shape
            // and round, not once per queued session. A gang is one request, placed whole or
            // not at all (`place_gang`, by `place` itself: the round placer's heaps assume a
            // usage that only grows, and a gang that does not fit puts back what it tried).
            let placed = match q.cluster_size {
                ..=1 => placer
                    .place(&q.resource_slots, &q.image, &fleet.usage)
                    .map(|a| vec![a]),
                n => place_gang(
                    q.cluster_mode,
                    u32::try_from(n).unwrap_or(u32::MAX),
                    &q.resource_slots,
                    &mut fleet.usage,
                    |req, usage| {
                        place_by(
                            fleet.cluster_placement,
                            fleet.candidates,
                            usage,
                            req,
                            &q.image,
                            fleet.images,
                        )
                    },
                ),
            };
            match placed {
                Ok(agents) => {
                    for agent in &agents {
                        let u = fleet.usage.entry(agent.clone()).or_default();
                        u.slots = u
                            .slots
                            .checked_add(&q.resource_slots)
                            .unwrap_or_else(|_| u.slots.clone());
                        u.kernels += 1;
                    }
                    let k = fleet.keys.entry(q.access_key.clone()).or_default();
                    k.used += 1;
                    for _ in &agents {
                        k.slots = k
                            .slots
                            .checked_add(&q.resource_slots)
                            .unwrap_or_else(|_| k.slots.clone());
                    }
                    plan.admit.push((q, agents));
                }
                Err(e) => {
                    plan.unplaced.push(q.clone());
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
    plan.usage = fleet.usage;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::Amount;

    fn slots(cpu: &str, mem: u64) -> ResourceSlots {
        [
            ("cpu".to_owned(), Amount::parse(cpu).unwrap()),
            ("mem".to_owned(), Amount::from_units(mem)),
        ]
        .into_iter()
        .collect()
    }

    fn agent(id: &str, cpu: &str, mem: u64) -> AgentRow {
        AgentRow::alive(id, slots(cpu, mem), crate::slots::builtin_types())
    }

    fn queued(id: &str, key: &str, priority: i64, at: f64, cpu: &str) -> QueuedSession {
        QueuedSession {
            id: id.into(),
            session_id: format!("{id}-session"),
            access_key: key.into(),
            image: "img".into(),
            resource_slots: slots(cpu, 1),
            priority,
            queued_at: at,
            head_skips: 0,
            pending_reason: None,
            cluster_mode: crate::model::cluster::ClusterMode::SingleNode,
            cluster_size: 1,
        }
    }

    fn gang(
        id: &str,
        at: f64,
        cpu: &str,
        size: i64,
        mode: crate::model::cluster::ClusterMode,
    ) -> QueuedSession {
        QueuedSession {
            cluster_mode: mode,
            cluster_size: size,
            ..queued(id, "K", 10, at, cpu)
        }
    }

    #[test]
    fn a_multi_node_gang_spreads_or_packs_as_configured() {
        use crate::model::cluster::{ClusterMode::MultiNode, ClusterPlacement};
        // a: 4 cores, 2 taken; b and c: 4 free. A gang of 2 kernels of 1 core.
        let agents = [
            agent("a", "4", 1 << 30),
            agent("b", "4", 1 << 30),
            agent("c", "4", 1 << 30),
        ];
        let usage: HashMap<String, Usage> = [(
            "a".to_owned(),
            Usage {
                slots: slots("2", 0),
                kernels: 2,
            },
        )]
        .into_iter()
        .collect();
        let images = AgentImageSets::new();
        let on = |placement| {
            let fleet = Fleet {
                candidates: &agents,
                usage: usage.clone(),
                images: &images,
                keys: HashMap::new(),
                cluster_placement: placement,
            };
            let p = plan(
                vec![gang("g", 0.0, "1", 2, MultiNode)],
                fleet,
                QueuePolicy::Fifo,
                0,
            );
            p.admit[0].1.clone()
        };
        // Spread: the least loaded agents, one kernel each.
        assert_eq!(on(ClusterPlacement::Spread), ["b", "c"]);
        // Pack: the most loaded agent that fits, both kernels (a has 2 cores free).
        assert_eq!(on(ClusterPlacement::Pack), ["a", "a"]);
    }

    #[test]
    fn a_gang_is_placed_whole_or_waits_whole_and_holds_the_queue_as_one_head() {
        use crate::model::cluster::ClusterMode::{MultiNode, SingleNode};
        // Two agents of 3 cores, one core taken on each by the two sessions ahead: a
        // single-node gang of 3 kernels of 1 core fits neither now (2 free on each). It waits,
        // and as the head it holds back the single session behind it for the head-skip rounds.
        let agents = [agent("a", "3", 1 << 30), agent("b", "3", 1 << 30)];
        let window = vec![
            queued("s0", "K", 10, 0.0, "1"),
            queued("s0b", "K", 10, 0.5, "1"),
            gang("g3", 1.0, "1", 3, SingleNode),
            queued("s1", "K", 10, 2.0, "1"),
        ];
        let p = run(&agents, window.clone(), QueuePolicy::Fifo, 2);
        assert_eq!(admitted(&p), ["s0", "s0b"]);
        let r = reason(&p, "g3");
        assert_eq!(r.code, "no-capacity");
        assert!(r.message.contains("`cpu`"), "{}", r.message);
        assert_eq!(reason(&p, "s1").code, "priority");
        // Past its head-skip rounds the single one fills the gap.
        let skipped: Vec<QueuedSession> = window
            .into_iter()
            .map(|q| QueuedSession { head_skips: 2, ..q })
            .collect();
        let p = run(&agents, skipped, QueuePolicy::Fifo, 2);
        assert_eq!(admitted(&p), ["s0", "s0b", "s1"]);
        // A multi-node gang of 3 spreads over both agents of 2 cores, every kernel placed.
        let agents = [agent("a", "2", 1 << 30), agent("b", "2", 1 << 30)];
        let p = run(
            &agents,
            vec![gang("m3", 0.0, "1", 3, MultiNode)],
            QueuePolicy::Fifo,
            2,
        );
        assert_eq!(admitted(&p), ["m3"]);
        let mut on = p.admit[0].1.clone();
        on.sort();
        assert_eq!(on.len(), 3);
        assert!(on.contains(&"a".to_owned()) && on.contains(&"b".to_owned()));
        // A multi-node gang of 5 cannot fit 4 cores: nothing placed, and what it tried is put
        // back (the single session after it still gets its core once the head is skipped).
        let p = run(
            &agents,
            vec![
                QueuedSession {
                    head_skips: 2,
                    ..gang("m5", 0.0, "1", 5, MultiNode)
                },
                queued("s2", "K", 10, 1.0, "1"),
            ],
            QueuePolicy::Fifo,
            2,
        );
        assert_eq!(admitted(&p), ["s2"]);
        let r = reason(&p, "m5");
        assert_eq!(r.code, "no-capacity");
        assert!(r.message.contains("kernel sub4 of 5"), "{}", r.message);
    }

    /// `window` in the store's order (priority descending, then queued time).
    fn sorted(mut window: Vec<QueuedSession>) -> Vec<QueuedSession> {
        window.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(a.queued_at.total_cmp(&b.queued_at))
        });
        window
    }

    fn run(
        agents: &[AgentRow],
        window: Vec<QueuedSession>,
        policy: QueuePolicy,
        skips: u32,
    ) -> Plan {
        let images = AgentImageSets::new();
        let fleet = Fleet {
            candidates: agents,
            usage: HashMap::new(),
            images: &images,
            keys: HashMap::new(),
            cluster_placement: Default::default(),
        };
        plan(sorted(window), fleet, policy, skips)
    }

    fn admitted(p: &Plan) -> Vec<&str> {
        p.admit.iter().map(|(q, _)| q.id.as_str()).collect()
    }

    fn reason<'a>(p: &'a Plan, id: &str) -> &'a PendingReason {
        &p.reasons.iter().find(|(i, _, _)| i == id).unwrap().1
    }

    #[test]
    fn fifo_admits_what_fits_in_order_and_says_why_the_rest_wait() {
        let agents = [agent("a", "4", 1 << 30)];
        let window = (0..10)
            .map(|i| queued(&format!("s{i}"), "K", 10, i as f64, "1"))
            .collect();
        let p = run(&agents, window, QueuePolicy::Fifo, 0);
        assert_eq!(admitted(&p), ["s0", "s1", "s2", "s3"]);
        let r = reason(&p, "s4");
        assert_eq!(r.code, "no-capacity");
        assert!(
            r.message.contains("`cpu`") && r.message.contains("is 0 (agent a)"),
            "{}",
            r.message
        );
        assert_eq!(p.reasons.len(), 6);
    }

    #[test]
    fn a_higher_priority_goes_first_whenever_it_was_queued() {
        let agents = [agent("a", "2", 1 << 30)];
        let window = vec![
            queued("old", "K", 10, 1.0, "1"),
            queued("older", "K", 10, 0.0, "1"),
            queued("urgent", "K", 50, 9.0, "1"),
        ];
        let p = run(&agents, window, QueuePolicy::Fifo, 0);
        assert_eq!(admitted(&p), ["urgent", "older"]);
    }

    #[test]
    fn a_head_that_does_not_fit_holds_the_rest_back_for_its_rounds_only() {
        let agents = [agent("a", "4", 1 << 30)];
        let mut big = queued("big", "K", 10, 0.0, "8");
        // Fits nothing now but could: another agent has 8 in total.
        let agents = [agents[0].clone(), agent("b", "8", 1 << 30)];
        let usage_b: HashMap<String, Usage> = [(
            "b".to_owned(),
            Usage {
                slots: slots("1", 0),
                kernels: 1,
            },
        )]
        .into_iter()
        .collect();
        let window = |big: &QueuedSession| {
            vec![
                big.clone(),
                queued("small", "K", 10, 1.0, "1"),
                queued("low", "K", 5, 2.0, "1"),
            ]
        };
        let images = AgentImageSets::new();
        let fleet = |usage: HashMap<String, Usage>| Fleet {
            candidates: &agents,
            usage,
            images: &images,
            keys: HashMap::new(),
            cluster_placement: Default::default(),
        };
        // Round 1 of 2: the head holds everything after it (its priority and lower).
        let p = plan(window(&big), fleet(usage_b.clone()), QueuePolicy::Fifo, 2);
        assert!(p.admit.is_empty());
        let (_, r, skips) = p.reasons.iter().find(|(i, _, _)| i == "big").unwrap();
        assert_eq!((r.code.as_str(), *skips), ("no-capacity", 1));
        assert_eq!(reason(&p, "small").code, "priority");
        assert_eq!(reason(&p, "low").code, "priority");
        // Its rounds used up: passed over, the others fill the gaps.
        big.head_skips = 2;
        let p = plan(window(&big), fleet(usage_b), QueuePolicy::Fifo, 2);
        assert_eq!(admitted(&p), ["small", "low"]);
        assert_eq!(reason(&p, "big").code, "no-capacity");
    }

    #[test]
    fn concurrency_limit_keeps_a_session_waiting_without_holding_others() {
        let agents = [agent("a", "8", 1 << 30)];
        let images = AgentImageSets::new();
        let keys: HashMap<String, KeyShare> = [(
            "LIMITED".to_owned(),
            KeyShare {
                slots: ResourceSlots::new(),
                used: 1,
                limit: 2,
                enabled: true,
            },
        )]
        .into_iter()
        .collect();
        let window = vec![
            queued("l1", "LIMITED", 10, 0.0, "1"),
            queued("l2", "LIMITED", 10, 1.0, "1"),
            queued("o1", "OTHER", 10, 2.0, "1"),
        ];
        let fleet = Fleet {
            candidates: &agents,
            usage: HashMap::new(),
            images: &images,
            keys,
            cluster_placement: Default::default(),
        };
        let p = plan(window, fleet, QueuePolicy::Fifo, 5);
        assert_eq!(admitted(&p), ["l1", "o1"]);
        assert_eq!(reason(&p, "l2").code, "concurrency-limit");
    }

    #[test]
    fn cordoned_and_absent_agents_are_named_as_the_reason() {
        let mut cordoned = agent("c", "8", 1 << 30);
        cordoned.schedulable = false;
        let p = run(
            &[cordoned],
            vec![queued("s", "K", 10, 0.0, "1")],
            QueuePolicy::Fifo,
            0,
        );
        assert_eq!(reason(&p, "s").code, "agents-cordoned");
        let p = run(
            &[],
            vec![queued("s", "K", 10, 0.0, "1")],
            QueuePolicy::Fifo,
            0,
        );
        assert_eq!(reason(&p, "s").code, "no-alive-agent");
    }

    #[test]
    fn an_unchanged_reason_is_not_written_again() {
        let agents = [agent("a", "1", 1 << 30)];
        let first = run(
            &agents,
            vec![
                queued("x", "K", 10, 0.0, "1"),
                queued("y", "K", 10, 1.0, "1"),
            ],
            QueuePolicy::Fifo,
            0,
        );
        let mut y = queued("y", "K", 10, 1.0, "1");
        y.pending_reason = Some(reason(&first, "y").clone());
        let again = run(
            &agents,
            vec![queued("x", "K", 10, 0.0, "1"), y],
            QueuePolicy::Fifo,
            0,
        );
        assert!(again.reasons.is_empty(), "{:?}", again.reasons);
    }

    /// Two keys, one submitting big (4-core) sessions and one small (1-core) ones, alternately:
    /// DRF admits so that their dominant shares stay within one session's worth of each other,
    /// where FIFO hands the big key as much as its turn in the queue gives it.
    #[test]
    fn drf_equalizes_dominant_shares_across_keys() {
        let agents = [agent("a", "16", 64 << 30)];
        let mut window = Vec::new();
        for i in 0..8 {
            window.push(queued(&format!("big{i}"), "BIG", 10, (2 * i) as f64, "4"));
            window.push(queued(
                &format!("small{i}"),
                "SMALL",
                10,
                (2 * i + 1) as f64,
                "1",
            ));
        }
        let share = |p: &Plan, key: &str| {
            let cores: u64 = p
                .admit
                .iter()
                .filter(|(q, _)| q.access_key == key)
                .map(|(q, _)| {
                    q.resource_slots
                        .get("cpu")
                        .to_string()
                        .parse::<u64>()
                        .unwrap()
                })
                .sum();
            cores as f64 / 16.0
        };
        let drf = run(&agents, window.clone(), QueuePolicy::Drf, 0);
        let (big, small) = (share(&drf, "BIG"), share(&drf, "SMALL"));
        assert!(
            (big - small).abs() <= 4.0 / 16.0,
            "drf: big {big} small {small}"
        );
        assert!(big + small > 0.9, "drf fills the agent: {big} + {small}");
        let fifo = run(&agents, window, QueuePolicy::Fifo, 0);
        assert!(share(&fifo, "BIG") > share(&fifo, "SMALL") + 4.0 / 16.0);
    }
}

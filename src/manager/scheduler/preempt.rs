//! Preemption's victim choice, pure (issue 41 item 2; `[scheduler] preemption`): which
//! `RUNNING` preemptible sessions of a strictly lower priority a pending session that fits no
//! agent evicts so that it fits.
//!
//! - Only when it would fit then: the placement code ([`super::place`]) is asked with the
//!   agents' usage less the victims' slots; a session that would not fit even with every
//!   candidate evicted evicts nobody.
//! - Minimal: the fewest victims; among sets of as many, the one whose highest priority is the
//!   lowest (then the lowest sum of priorities), then the youngest (the set whose oldest
//!   member started last). A gang counts whole: evicting one kernel of a cluster session
//!   evicts all of its kernels, and it counts as one victim.
//!   For a preemptor that lands on one agent (a session of one kernel, a `single-node` gang)
//!   the search is per agent, exact for sets of up to [`EXACT_UP_TO`] victims among the
//!   agent's [`EXACT_POOL`] most evictable sessions; beyond that (and for a `multi-node` gang,
//!   whose kernels may land anywhere) the set is the most evictable sessions in order until it
//!   fits, then every one it can spare dropped again (no victim in it could be left running).
//! - Room already on its way counts: the kernels of sessions already `PREEMPTED` (a preemption
//!   in flight) are taken as gone, so a preemptor waiting for its victims to end chooses no
//!   more, and each preemptor in a round takes the room it was given out of the next one's.
//! - A session preempted less than `[scheduler] preemption-cooldown` ago is not a victim
//!   (rate limit: a session is not evicted again and again by a stream of arrivals).
//!
//! No loop is possible between two sessions: a victim's priority is strictly lower than its
//! preemptor's and it is requeued with that same priority, so it can never evict its
//! preemptor (nor any session of the preemptor's priority or higher). A gang is one session
//! with one priority, and a restart keeps the priority.

use std::collections::{BTreeMap, HashMap};

use super::place::{place_by, place_gang};
use crate::manager::registry::AgentImageSets;
use crate::manager::store::{AgentRow, PreemptCandidate, QueuedSession, Usage};
use crate::model::cluster::{ClusterMode, ClusterPlacement};
use crate::model::session::KernelStatus;

/// Victim sets up to this size are searched exactly, per agent.
pub const EXACT_UP_TO: usize = 3;

/// The most evictable sessions of an agent the exact search looks at.
pub const EXACT_POOL: usize = 16;

/// One session that may be evicted: every kernel of it.
#[derive(Clone, Debug, PartialEq)]
pub struct Victim {
    /// Session UUID.
    pub session_id: String,
    /// Its priority.
    pub priority: i64,
    /// Unix seconds its (current) row was created.
    pub created_at: f64,
    /// Each kernel: `(kernel id, agent id, slots)`.
    pub kernels: Vec<(String, String, crate::slots::ResourceSlots)>,
}

/// What the choice found for one pending session.
#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    /// It fits with the room already on its way (sessions `PREEMPTED` before): nobody more
    /// is evicted; it waits for that room (the agents it would take, one per kernel).
    Waits(Vec<String>),
    /// Evict these sessions (their kernels), then it fits (on these agents, one per kernel).
    Evict(Vec<Victim>, Vec<String>),
    /// It would not fit even with every candidate evicted: nobody is evicted.
    Nothing,
}

/// The fleet as the choice sees it.
pub struct Room<'a> {
    /// The agents placement looks at.
    pub candidates: &'a [AgentRow],
    /// Each agent's placed slots (`PREEMPTED` kernels' included: taken out here).
    pub usage: HashMap<String, Usage>,
    /// Images each agent holds.
    pub images: &'a AgentImageSets,
    /// How a `multi-node` gang spreads.
    pub placement: ClusterPlacement,
}

/// The victims a preemptor's priority may evict, grouped by session, most evictable first
/// (lowest priority, then youngest): `RUNNING` kernels of a priority below `priority`, not
/// preempted within `cooldown` seconds of `now`, of sessions whose every kernel is listed.
pub fn victims(
    candidates: &[PreemptCandidate],
    priority: i64,
    now: f64,
    cooldown: f64,
) -> Vec<Victim> {
    let mut by_session: BTreeMap<&str, (Victim, i64)> = BTreeMap::new();
    for c in candidates {
        if c.status != KernelStatus::Running || c.priority >= priority {
            continue;
        }
        if c.preempted_at.is_some_and(|at| now - at < cooldown) {
            continue;
        }
        let e = by_session.entry(&c.session_id).or_insert_with(|| {
            (
                Victim {
                    session_id: c.session_id.clone(),
                    priority: c.priority,
                    created_at: c.created_at,
                    kernels: Vec::new(),
                },
                c.cluster_size,
            )
        });
        e.0.created_at = e.0.created_at.max(c.created_at);
        e.0.kernels
            .push((c.id.clone(), c.agent_id.clone(), c.resource_slots.clone()));
    }
    let mut out: Vec<Victim> = by_session
        .into_values()
        .filter(|(v, size)| v.kernels.len() as i64 >= (*size).max(1))
        .map(|(v, _)| v)
        .collect();
    out.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.created_at.total_cmp(&a.created_at))
            .then(a.session_id.cmp(&b.session_id))
    });
    out
}

/// `usage` less the slots of the kernels that are `PREEMPTED` among `candidates`.
pub fn without_preempted(
    mut usage: HashMap<String, Usage>,
    candidates: &[PreemptCandidate],
) -> HashMap<String, Usage> {
    for c in candidates
        .iter()
        .filter(|c| c.status == KernelStatus::Preempted)
    {
        release(&mut usage, &c.agent_id, &c.resource_slots);
    }
    usage
}

fn release(usage: &mut HashMap<String, Usage>, agent: &str, slots: &crate::slots::ResourceSlots) {
    if let Some(u) = usage.get_mut(agent) {
        u.slots = u.slots.saturating_sub(slots);
        u.kernels = (u.kernels - 1).max(0);
    }
}

fn without(usage: &HashMap<String, Usage>, set: &[&Victim]) -> HashMap<String, Usage> {
    let mut u = usage.clone();
    for v in set {
        for (_, agent, slots) in &v.kernels {
            release(&mut u, agent, slots);
        }
    }
    u
}

/// Where `q` would be placed over `agents` with `usage` (one agent per kernel), if anywhere.
fn fits(
    q: &QueuedSession,
    agents: &[AgentRow],
    usage: &HashMap<String, Usage>,
    room: &Room<'_>,
) -> Option<Vec<String>> {
    let mut usage = usage.clone();
    place_gang(
        q.cluster_mode,
        u32::try_from(q.cluster_size.max(1)).unwrap_or(u32::MAX),
        &q.resource_slots,
        &mut usage,
        |req, u| place_by(room.placement, agents, u, req, &q.image, room.images),
    )
    .ok()
}

/// How a victim set ranks (lower is better): fewest, then lowest highest priority, then
/// lowest sum of priorities, then youngest (its oldest member the latest).
fn rank(set: &[&Victim]) -> (usize, i64, i64, std::cmp::Reverse<u64>) {
    let max = set.iter().map(|v| v.priority).max().unwrap_or(0);
    let sum = set.iter().map(|v| v.priority).sum();
    let oldest = set
        .iter()
        .map(|v| v.created_at)
        .fold(f64::INFINITY, f64::min);
    // Non-negative seconds order as their bits do.
    (
        set.len(),
        max,
        sum,
        std::cmp::Reverse(oldest.max(0.0).to_bits()),
    )
}

/// The victims `q` needs evicted to fit (see the module's rules), over `room` with `pool`
/// (from [`victims`], most evictable first; `room.usage` already without the `PREEMPTED`
/// kernels: [`without_preempted`]).
pub fn choose(q: &QueuedSession, pool: &[Victim], room: &Room<'_>) -> Choice {
    if let Some(agents) = fits(q, room.candidates, &room.usage, room) {
        return Choice::Waits(agents);
    }
    let all: Vec<&Victim> = pool.iter().collect();
    if pool.is_empty() || fits(q, room.candidates, &without(&room.usage, &all), room).is_none() {
        return Choice::Nothing;
    }
    let best = if lands_on_one_agent(q) {
        per_agent(q, pool, room)
    } else {
        greedy(q, room.candidates, &all, &room.usage, room)
    };
    match best {
        Some((set, agents)) => Choice::Evict(set.into_iter().cloned().collect(), agents),
        None => Choice::Nothing,
    }
}

/// Whether `choice`, made for `q` over a prefix of its victims (the first ones in
/// [`victims`]'s order, each gang whole), is the choice the whole pool gives, so that the rest
/// need not be read:
/// - `Waits`: chosen before any victim is looked at.
/// - `Evict` of one victim for a preemptor that lands on one agent: the first victim in
///   order that frees enough on one of its agents ([`per_agent`]'s first pass); every victim
///   before it is in the prefix too, and none of them was enough.
/// - `Evict` for a `multi-node` gang: the most evictable in order until it fits, then pruned
///   ([`greedy`]); over the whole pool it stops at the same victim.
///
/// Not a set of two or more for one agent (the exact search looks at each agent's most
/// evictable, which may lie past the prefix), nor `Nothing`.
pub fn settled_by_prefix(q: &QueuedSession, choice: &Choice) -> bool {
    match choice {
        Choice::Waits(_) => true,
        Choice::Evict(set, _) => set.len() == 1 || !lands_on_one_agent(q),
        Choice::Nothing => false,
    }
}

/// A session of one kernel, or a `single-node` gang: placed whole on one agent.
fn lands_on_one_agent(q: &QueuedSession) -> bool {
    q.cluster_size <= 1 || q.cluster_mode == ClusterMode::SingleNode
}

/// The best set over every agent, each agent searched on its own (the preemptor lands on one).
fn per_agent<'v>(
    q: &QueuedSession,
    pool: &'v [Victim],
    room: &Room<'_>,
) -> Option<(Vec<&'v Victim>, Vec<String>)> {
    let by_id: HashMap<&str, &AgentRow> =
        room.candidates.iter().map(|a| (a.id.as_str(), a)).collect();
    let local_of = |agent: &AgentRow| -> HashMap<String, Usage> {
        room.usage
            .get(&agent.id)
            .map(|u| (agent.id.clone(), u.clone()))
            .into_iter()
            .collect()
    };
    // One victim, when one is enough: `pool` is in the order of the ranking of single sets
    // (lowest priority, then youngest), so the first that frees enough on one of its agents
    // is the best of them, found without a pass over the fleet (10,000 agents full of
    // preemptible sessions: the usual case stops at the first victim).
    for v in pool {
        let mut seen: Vec<&str> = Vec::new();
        for (_, agent, _) in &v.kernels {
            if seen.contains(&agent.as_str()) {
                continue;
            }
            seen.push(agent);
            let Some(row) = by_id.get(agent.as_str()) else {
                continue;
            };
            let set = [v];
            if let Some(on) = fits(
                q,
                std::slice::from_ref(*row),
                &without(&local_of(row), &set),
                room,
            ) {
                return Some((vec![v], on));
            }
        }
    }
    let mut on: HashMap<&str, Vec<&'v Victim>> = HashMap::new();
    for v in pool {
        let mut seen: Vec<&str> = Vec::new();
        for (_, agent, _) in &v.kernels {
            if !seen.contains(&agent.as_str()) {
                seen.push(agent);
                on.entry(agent).or_default().push(v);
            }
        }
    }
    let mut best: Option<(Vec<&'v Victim>, Vec<String>)> = None;
    for agent in room.candidates {
        let Some(here) = on.get(agent.id.as_str()) else {
            continue;
        };
        let one = std::slice::from_ref(agent);
        // Only this agent's usage: placement over one agent reads no other (a copy of the
        // whole fleet's per try was O(agents²) with 10,000 agents).
        let local = local_of(agent);
        // Not even with every victim here gone: next agent.
        if fits(q, one, &without(&local, here), room).is_none() {
            continue;
        }
        let found =
            exact(q, one, here, &local, room).or_else(|| greedy(q, one, here, &local, room));
        if let Some((set, agents)) = found {
            if best.as_ref().is_none_or(|(b, _)| rank(&set) < rank(b)) {
                best = Some((set, agents));
            }
        }
    }
    best
}

/// The best set of at most [`EXACT_UP_TO`] victims among the first [`EXACT_POOL`] of `here`
/// that lets `q` fit on `one`, if any.
fn exact<'v>(
    q: &QueuedSession,
    one: &[AgentRow],
    here: &[&'v Victim],
    usage: &HashMap<String, Usage>,
    room: &Room<'_>,
) -> Option<(Vec<&'v Victim>, Vec<String>)> {
    let pool = &here[..here.len().min(EXACT_POOL)];
    // Single victims were tried first (`per_agent`).
    for k in 2..=EXACT_UP_TO.min(pool.len()) {
        let mut best: Option<(Vec<&'v Victim>, Vec<String>)> = None;
        let mut idx: Vec<usize> = (0..k).collect();
        loop {
            let set: Vec<&'v Victim> = idx.iter().map(|&i| pool[i]).collect();
            if best.as_ref().is_none_or(|(b, _)| rank(&set) < rank(b)) {
                if let Some(agents) = fits(q, one, &without(usage, &set), room) {
                    best = Some((set, agents));
                }
            }
            // The next combination of k indices in lexicographic order.
            let mut i = k;
            while i > 0 && idx[i - 1] == pool.len() - k + i - 1 {
                i -= 1;
            }
            if i == 0 {
                break;
            }
            idx[i - 1] += 1;
            for j in i..k {
                idx[j] = idx[j - 1] + 1;
            }
        }
        if best.is_some() {
            return best;
        }
    }
    None
}

/// The most evictable of `pool` in order until `q` fits over `agents`, then each one it can
/// spare dropped (the least evictable first): an irreducible set.
fn greedy<'v>(
    q: &QueuedSession,
    agents: &[AgentRow],
    pool: &[&'v Victim],
    usage: &HashMap<String, Usage>,
    room: &Room<'_>,
) -> Option<(Vec<&'v Victim>, Vec<String>)> {
    let mut set: Vec<&'v Victim> = Vec::new();
    let mut placed = None;
    for v in pool {
        set.push(v);
        if let Some(a) = fits(q, agents, &without(usage, &set), room) {
            placed = Some(a);
            break;
        }
    }
    let mut placed = placed?;
    let mut i = set.len();
    while i > 0 {
        i -= 1;
        let mut fewer = set.clone();
        fewer.remove(i);
        if let Some(a) = fits(q, agents, &without(usage, &fewer), room) {
            set = fewer;
            placed = a;
        }
    }
    Some((set, placed))
}

/// `usage` with `q` placed on `agents` and `evicted` gone: what the next preemptor of the
/// round sees.
pub fn take(
    usage: &mut HashMap<String, Usage>,
    q: &QueuedSession,
    agents: &[String],
    evicted: &[Victim],
) {
    for v in evicted {
        for (_, agent, slots) in &v.kernels {
            release(usage, agent, slots);
        }
    }
    for a in agents {
        let u = usage.entry(a.clone()).or_default();
        u.slots = u
            .slots
            .checked_add(&q.resource_slots)
            .unwrap_or_else(|_| u.slots.clone());
        u.kernels += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::cluster::ClusterMode::{MultiNode, SingleNode};
    use crate::slots::{Amount, ResourceSlots};

    fn cpu(n: u64) -> ResourceSlots {
        [
            ("cpu".to_owned(), Amount::from_units(n)),
            ("mem".to_owned(), Amount::from_units(1)),
        ]
        .into_iter()
        .collect()
    }

    /// An agent of `n` cores and memory for any number of sessions.
    fn agent(id: &str, n: u64) -> AgentRow {
        let mut total = cpu(n);
        total.set("mem", Amount::from_units(1 << 30));
        AgentRow::alive(id, total, crate::slots::builtin_types())
    }

    fn pending(priority: i64, n: u64, size: i64, mode: ClusterMode) -> QueuedSession {
        QueuedSession {
            id: "p".into(),
            session_id: "p".into(),
            access_key: "K".into(),
            image: "img".into(),
            resource_slots: cpu(n),
            priority,
            queued_at: 100.0,
            head_skips: 0,
            pending_reason: None,
            cluster_mode: mode,
            cluster_size: size,
        }
    }

    /// A running kernel of session `s` on `agent`.
    fn running(s: &str, agent: &str, n: u64, priority: i64, at: f64) -> PreemptCandidate {
        PreemptCandidate {
            id: format!("{s}-{agent}"),
            session_id: s.into(),
            agent_id: agent.into(),
            priority,
            created_at: at,
            resource_slots: cpu(n),
            cluster_size: 1,
            status: KernelStatus::Running,
            preempted_at: None,
        }
    }

    fn usage_of(c: &[PreemptCandidate]) -> HashMap<String, Usage> {
        let mut u: HashMap<String, Usage> = HashMap::new();
        for k in c {
            let e = u.entry(k.agent_id.clone()).or_default();
            e.slots = e.slots.checked_add(&k.resource_slots).unwrap();
            e.kernels += 1;
        }
        u
    }

    fn run(q: &QueuedSession, agents: &[AgentRow], c: &[PreemptCandidate]) -> Choice {
        let images = AgentImageSets::new();
        let room = Room {
            candidates: agents,
            usage: without_preempted(usage_of(c), c),
            images: &images,
            placement: ClusterPlacement::Spread,
        };
        choose(q, &victims(c, q.priority, 1000.0, 60.0), &room)
    }

    fn evicted(c: &Choice) -> Vec<&str> {
        match c {
            Choice::Evict(v, _) => {
                let mut s: Vec<&str> = v.iter().map(|v| v.session_id.as_str()).collect();
                s.sort();
                s
            }
            other => panic!("no eviction: {other:?}"),
        }
    }

    #[test]
    fn the_fewest_victims_then_the_lowest_priority_then_the_youngest() {
        // a: four 1-core sessions; b: one 4-core session. A 4-core preemptor: one victim (the
        // 4-core one on b) rather than four.
        let agents = [agent("a", 4), agent("b", 4)];
        let c = vec![
            running("a1", "a", 1, 10, 1.0),
            running("a2", "a", 1, 10, 2.0),
            running("a3", "a", 1, 10, 3.0),
            running("a4", "a", 1, 10, 4.0),
            running("b1", "b", 4, 10, 5.0),
        ];
        let ch = run(&pending(50, 4, 1, SingleNode), &agents, &c);
        assert_eq!(evicted(&ch), ["b1"]);
        assert!(matches!(&ch, Choice::Evict(_, on) if on == &["b"]));
        // Two agents of two 2-core sessions each, a 2-core preemptor: one victim, the lowest
        // priority; among equals the youngest.
        let c = vec![
            running("x1", "a", 2, 10, 1.0),
            running("x2", "a", 2, 5, 2.0),
            running("y1", "b", 2, 5, 3.0),
            running("y2", "b", 2, 10, 4.0),
        ];
        assert_eq!(
            evicted(&run(&pending(50, 2, 1, SingleNode), &agents, &c)),
            ["y1"]
        );
        let c = vec![
            running("x1", "a", 2, 10, 1.0),
            running("x2", "a", 2, 10, 2.0),
            running("y1", "b", 2, 10, 3.0),
            running("y2", "b", 2, 10, 4.0),
        ];
        assert_eq!(
            evicted(&run(&pending(50, 2, 1, SingleNode), &agents, &c)),
            ["y2"]
        );
        // Three cores needed on a 4-core agent of four 1-core sessions: the three youngest.
        let c: Vec<_> = (1..=4)
            .map(|i| running(&format!("s{i}"), "a", 1, 10, i as f64))
            .collect();
        assert_eq!(
            evicted(&run(&pending(50, 3, 1, SingleNode), &agents[..1], &c)),
            ["s2", "s3", "s4"]
        );
    }

    #[test]
    fn only_strictly_lower_priorities_not_in_their_cooldown_and_never_for_nothing() {
        let agents = [agent("a", 2)];
        // Equal priority: nobody.
        let c = vec![running("s", "a", 2, 50, 1.0)];
        assert_eq!(
            run(&pending(50, 2, 1, SingleNode), &agents, &c),
            Choice::Nothing
        );
        // Would not fit even with everything evicted (3 cores on a 2-core agent): nobody.
        let c = vec![running("s", "a", 2, 10, 1.0)];
        assert_eq!(
            run(&pending(50, 3, 1, SingleNode), &agents, &c),
            Choice::Nothing
        );
        // Preempted 10 s ago, cooldown 60 s: not a victim again yet.
        let mut recent = running("s", "a", 2, 10, 1.0);
        recent.preempted_at = Some(990.0);
        assert_eq!(
            run(&pending(50, 2, 1, SingleNode), &agents, &[recent]),
            Choice::Nothing
        );
        // Room already on its way (a session PREEMPTED): it waits, nobody more.
        let mut going = running("g", "a", 2, 10, 1.0);
        going.status = KernelStatus::Preempted;
        assert_eq!(
            run(&pending(50, 2, 1, SingleNode), &agents, &[going]),
            Choice::Waits(vec!["a".into()])
        );
    }

    #[test]
    fn a_gang_counts_whole_as_victim_and_as_preemptor() {
        // A multi-node gang victim `g` (priority 5) spans a and b, 1 core each; `s` (priority
        // 10) holds a's other core.
        let agents = [agent("a", 2), agent("b", 1)];
        let mut g1 = running("g", "a", 1, 5, 9.0);
        g1.cluster_size = 2;
        let mut g2 = running("g", "b", 1, 5, 9.0);
        g2.id = "g-b2".into();
        g2.cluster_size = 2;
        let c = vec![g1.clone(), g2.clone(), running("s", "a", 1, 10, 1.0)];
        // 2 cores on one agent: only a has 2, and both must go (b never fits 2).
        assert_eq!(
            evicted(&run(&pending(50, 2, 1, SingleNode), &agents, &c)),
            ["g", "s"]
        );
        // A 1-core preemptor: one victim, the gang (priority 5) counted once, whole.
        match run(&pending(50, 1, 1, SingleNode), &agents, &c) {
            Choice::Evict(v, _) => {
                assert_eq!(v.len(), 1);
                assert_eq!(v[0].session_id, "g");
                assert_eq!(v[0].kernels.len(), 2, "both kernels of the gang");
            }
            other => panic!("{other:?}"),
        }
        // A gang with a kernel not listed (not RUNNING) is no victim.
        let c = vec![g1, running("s", "a", 1, 10, 1.0)];
        assert_eq!(
            evicted(&run(&pending(50, 1, 1, SingleNode), &agents[..1], &c)),
            ["s"]
        );
        // A multi-node preemptor of 2 kernels of 1 core over a (2) and b (1), all full of
        // 1-core sessions: two victims, and an irreducible set.
        let c = vec![
            running("a1", "a", 1, 10, 1.0),
            running("a2", "a", 1, 10, 2.0),
            running("b1", "b", 1, 10, 3.0),
        ];
        let ch = run(&pending(50, 1, 2, MultiNode), &agents, &c);
        assert_eq!(evicted(&ch).len(), 2, "{ch:?}");
    }

    /// A choice over the first victims only (what a round reads first), when settled, is the
    /// one over all of them: every prefix of every pool below, for preemptors of one and of
    /// several kernels, is checked against the whole.
    #[test]
    fn a_choice_settled_by_the_first_victims_is_the_choice_over_all() {
        // Four agents of 4 cores; sessions of 1 to 3 cores, priorities 5 and 10, each agent
        // full; a multi-node gang `g` over c and d.
        let agents = [agent("a", 4), agent("b", 4), agent("c", 4), agent("d", 4)];
        let mut g1 = running("g", "c", 1, 5, 2.5);
        g1.cluster_size = 2;
        let mut g2 = running("g", "d", 1, 5, 2.5);
        g2.id = "g-d2".into();
        g2.cluster_size = 2;
        let c = vec![
            running("a1", "a", 1, 10, 1.0),
            running("a2", "a", 3, 10, 6.0),
            running("b1", "b", 2, 10, 2.0),
            running("b2", "b", 2, 5, 3.0),
            g1,
            running("c2", "c", 3, 10, 4.0),
            g2,
            running("d2", "d", 1, 10, 7.0),
            running("d3", "d", 2, 10, 8.0),
        ];
        let images = AgentImageSets::new();
        let room = Room {
            candidates: &agents,
            usage: without_preempted(usage_of(&c), &c),
            images: &images,
            placement: ClusterPlacement::Spread,
        };
        let mut settled = 0;
        for q in [
            pending(50, 1, 1, SingleNode),
            pending(50, 2, 1, SingleNode),
            pending(50, 3, 1, SingleNode),
            pending(50, 4, 1, SingleNode),
            pending(50, 2, 2, SingleNode),
            pending(50, 1, 2, MultiNode),
            pending(50, 2, 3, MultiNode),
            pending(8, 2, 1, SingleNode),
        ] {
            let all = victims(&c, q.priority, 1000.0, 60.0);
            let whole = choose(&q, &all, &room);
            for n in 0..=all.len() {
                let first = choose(&q, &all[..n], &room);
                if settled_by_prefix(&q, &first) {
                    settled += 1;
                    assert_eq!(first, whole, "{n} first victims of {q:?}");
                }
            }
        }
        assert!(
            settled > 10,
            "the cases settle often enough to test: {settled}"
        );
    }
}

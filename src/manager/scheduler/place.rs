//! Placement, pure: which agent gets a session's kernel, from the candidates' slots in total,
//! their usage and the images they hold.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::agent::node::normalize_image;
use crate::manager::error::ManagerError;
use crate::manager::registry::AgentImageSets;
use crate::manager::store::{AgentRow, Usage};
use crate::model::cluster::{cluster_slots, ClusterMode, ClusterPlacement};
use crate::model::queue::{PendingCode, PendingReason};
use crate::slots::{Amount, ResourceSlots, SlotError, SlotTypes};

/// The slot types a request may name: the built-in `cpu` / `mem` and every slot type the
/// `candidates` (the `ALIVE` agents) advertise. Where agents disagree on a slot's type, the
/// agent with the smallest id wins (deterministic; the built-ins always win).
pub fn known_slot_types(candidates: &[AgentRow]) -> SlotTypes {
    let mut types = crate::slots::builtin_types();
    let mut by_id: Vec<&AgentRow> = candidates.iter().collect();
    by_id.sort_by(|a, b| a.id.cmp(&b.id));
    for a in by_id {
        for (name, ty) in &a.slot_types {
            types.entry(name.clone()).or_insert(*ty);
        }
    }
    types
}

/// [`known_slot_types`] of the newest candidate list, computed once per list: the registry
/// hands out the same `Arc` until the fleet changes, and at 10,000 agents computing it sorts
/// them all.
#[derive(Clone, Default)]
pub struct SlotTypesMemo(Arc<Mutex<Option<Memo>>>);

/// A candidate list and its slot types.
type Memo = (Arc<Vec<AgentRow>>, Arc<SlotTypes>);

impl SlotTypesMemo {
    /// The slot types `candidates` advertise.
    pub fn of(&self, candidates: &Arc<Vec<AgentRow>>) -> Arc<SlotTypes> {
        let mut memo = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match memo.as_ref() {
            Some((list, types)) if Arc::ptr_eq(list, candidates) => types.clone(),
            _ => {
                let types = Arc::new(known_slot_types(candidates));
                *memo = Some((candidates.clone(), types.clone()));
                types
            }
        }
    }
}

/// Parses a session's `resource_slots` against the slots the `candidates` have
/// ([`known_slot_types`]): `cpu` (> 0) and `mem` required, amounts in the slot's unit (cores
/// with up to 3 decimals, whole bytes or a size such as `"256m"`, counts with up to 3 decimals,
/// whole `unique` devices).
///
/// Errors: [`ManagerError::UnknownSlot`] for a slot no candidate has (with no candidate at all,
/// [`ManagerError::NoAgents`]); [`ManagerError::InvalidRequest`] naming the slot for a bad or
/// missing amount.
pub fn parse_request(
    slots: &BTreeMap<String, serde_json::Value>,
    candidates: &[AgentRow],
) -> Result<ResourceSlots, ManagerError> {
    parse_request_typed(slots, &known_slot_types(candidates), candidates.is_empty())
}

/// [`parse_request`] against slot types already known (`known_slot_types` of the candidates,
/// computed once per fleet change rather than once per request: at 10,000 agents it sorts them
/// all); `no_agents` when there are no candidates.
pub fn parse_request_typed(
    slots: &BTreeMap<String, serde_json::Value>,
    types: &SlotTypes,
    no_agents: bool,
) -> Result<ResourceSlots, ManagerError> {
    ResourceSlots::request_from_json(slots, types).map_err(|e| match e {
        SlotError::Unknown(_) if no_agents => ManagerError::NoAgents,
        SlotError::Unknown(name) => ManagerError::UnknownSlot(name),
        other => ManagerError::InvalidRequest(other.to_string()),
    })
}

/// An agent's load after placing `req`: the fullest slot's `(used + req) / total`
/// ([`ResourceSlots::load`]; lower = less loaded).
fn load_after(total: &ResourceSlots, used: &ResourceSlots, req: &ResourceSlots) -> f64 {
    // `ResourceSlots::load(&(used + req), total)` without building the sum (asked of every
    // agent that fits, for every session placed); a sum that overflows counts as `total`.
    if req
        .nonzero()
        .any(|(k, v)| used.get(k).checked_add(v).is_none())
    {
        return ResourceSlots::load(total, total);
    }
    total
        .nonzero()
        .map(|(k, t)| {
            used.get(k)
                .checked_add(req.get(k))
                .map_or(1.0, |after| after.as_f64() / t.as_f64())
        })
        .fold(0.0, f64::max)
}

/// Why [`place`] found no agent.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum PlaceError {
    /// No `ALIVE` agent at all.
    #[error("no agent is ALIVE")]
    NoAgents,
    /// No `ALIVE` agent has that much in total (the message names the slot and the largest).
    #[error("{0}")]
    SlotsExceedCapacity(String),
    /// Only cordoned or draining agents (these ids, at most 5 named) could ever fit it.
    #[error("only cordoned agents could fit it ({})", .0.join(", "))]
    Cordoned(Vec<String>),
    /// Every schedulable agent that could fit it in total is too full now: which slot is
    /// short, and the most of it free on one agent.
    #[error("{0}")]
    NoCapacity(String),
}

impl PlaceError {
    /// The manager error's code: `no-agents`, `slots-exceed-capacity`, `no-capacity`.
    pub fn code(&self) -> &'static str {
        ManagerError::from(self.clone()).code()
    }

    /// Why a queued session that this error left unplaced waits.
    pub fn pending_reason(&self) -> PendingReason {
        match self {
            PlaceError::NoAgents => PendingReason::new(
                PendingCode::NoAliveAgent,
                "no agent is ALIVE; it is admitted when one joins",
            ),
            PlaceError::SlotsExceedCapacity(m) => PendingReason::new(
                PendingCode::NoCapacity,
                format!("{m}; it waits for such an agent to join"),
            ),
            PlaceError::Cordoned(_) => {
                PendingReason::new(PendingCode::AgentsCordoned, format!("{self}"))
            }
            PlaceError::NoCapacity(m) => PendingReason::new(PendingCode::NoCapacity, m.clone()),
        }
    }
}

impl From<PlaceError> for ManagerError {
    fn from(e: PlaceError) -> ManagerError {
        match e {
            PlaceError::NoAgents => ManagerError::NoAgents,
            PlaceError::SlotsExceedCapacity(m) => ManagerError::SlotsExceedCapacity(m),
            e @ PlaceError::Cordoned(_) => {
                ManagerError::NoCapacity(format!("{e}; retry after they are uncordoned"))
            }
            PlaceError::NoCapacity(m) => {
                ManagerError::NoCapacity(format!("{m}; retry after a session ends"))
            }
        }
    }
}

/// Picks the agent for `req` (a session of `image`) over every slot: among the schedulable
/// (not cordoned, not draining) `candidates` whose total has every non-zero slot of `req` and
/// whose free slots (`total − usage`) fit it, one that already holds `image` (`images`: agent
/// id → the references its engine holds, from its heartbeats; compared as the engine names
/// them, [`normalize_image`], so `python` matches `python:latest`), then the least loaded after
/// placing it ([`load_after`]); ties go to fewer kernels, then the id. An agent without a slot
/// the request needs (an accelerator) is never chosen, whatever it holds.
///
/// Image locality is Kubernetes' `ImageLocality` score plugin (kube-scheduler: nodes already
/// holding a pod's images score higher, weighted by the images' size and spread). Here holding
/// the image ranks first among the agents that fit: pulling a 10–20 GB image costs minutes,
/// more than any imbalance of load, so the second session of an image does not pull it again
/// on another agent. An agent that cannot fit the request still loses to one that can.
///
/// Errors ([`PlaceError`]): no candidates → `NoAgents`; none could ever fit (not in any
/// agent's total) → `SlotsExceedCapacity`, naming the slot; only cordoned ones could →
/// `Cordoned`; none fits now → `NoCapacity`, naming the slot short and the most of it free.
pub fn place(
    candidates: &[AgentRow],
    usage: &std::collections::HashMap<String, Usage>,
    req: &ResourceSlots,
    image: &str,
    images: &AgentImageSets,
) -> Result<String, PlaceError> {
    fits_some_agent(candidates, req)?;
    // Each candidate's rank computed once (10,000 agents: one pass, not one per comparison).
    ranks(candidates, usage, req, &normalize_image(image), images)
        .min()
        .map(|r| r.id.to_owned())
        .ok_or_else(|| short_of(candidates, usage, req))
}

/// A cluster session's slots on one agent: `req` (each kernel's) times `size`.
///
/// Errors: [`PlaceError::SlotsExceedCapacity`] when the sum overflows a slot's range.
pub fn gang_total(req: &ResourceSlots, size: u32) -> Result<ResourceSlots, PlaceError> {
    let mut total = req.clone();
    for _ in 1..size.max(1) {
        total = total.checked_add(req).map_err(|e| {
            PlaceError::SlotsExceedCapacity(format!("{size} kernels of {req}: {e}"))
        })?;
    }
    Ok(total)
}

/// Places a cluster session of `size` kernels of `req` each, whole or not at all, through
/// `place_one` (which places one request against a usage map: [`place`], or a round's
/// [`RoundPlacer`]). Backend.AI's `PlacementPlan.from_items`
/// (`manager/sokovan/scheduler/provisioner/selectors/selector.py`):
/// - `single-node`: one agent for the sum of every kernel's slots;
/// - `multi-node`: one placement per kernel, each seeing the ones before it (`usage` grows by
///   each, and is put back as it was when a later kernel does not fit), so an agent may hold
///   several kernels of one session when it has room.
///
/// Returns the agent of each kernel, `main1` first.
///
/// Errors: `place_one`'s, for the first kernel that did not fit, prefixed with which of the
/// gang it was (`kernel sub2 of 3: …`) for `multi-node`.
pub fn place_gang(
    mode: ClusterMode,
    size: u32,
    req: &ResourceSlots,
    usage: &mut std::collections::HashMap<String, Usage>,
    mut place_one: impl FnMut(
        &ResourceSlots,
        &std::collections::HashMap<String, Usage>,
    ) -> Result<String, PlaceError>,
) -> Result<Vec<String>, PlaceError> {
    let size = size.max(1);
    if size == 1 || mode == ClusterMode::SingleNode {
        let total = gang_total(req, size)?;
        let agent = place_one(&total, usage)?;
        return Ok(vec![agent; size as usize]);
    }
    let mut placed: Vec<String> = Vec::with_capacity(size as usize);
    for slot in cluster_slots(size) {
        match place_one(req, usage) {
            Ok(agent) => {
                add_usage(usage, &agent, req, 1);
                placed.push(agent);
            }
            Err(e) => {
                for agent in &placed {
                    add_usage(usage, agent, req, -1);
                }
                let which = format!("kernel {} of {size}", slot.hostname);
                return Err(match e {
                    PlaceError::NoCapacity(m) => PlaceError::NoCapacity(format!("{which}: {m}")),
                    PlaceError::SlotsExceedCapacity(m) => {
                        PlaceError::SlotsExceedCapacity(format!("{which}: {m}"))
                    }
                    other => other,
                });
            }
        }
    }
    // The caller adds what it places; this only looked ahead.
    for agent in &placed {
        add_usage(usage, agent, req, -1);
    }
    Ok(placed)
}

/// Adds (`sign` 1) or takes back (`sign` -1) one kernel of `req` on `agent` in `usage`.
fn add_usage(
    usage: &mut std::collections::HashMap<String, Usage>,
    agent: &str,
    req: &ResourceSlots,
    sign: i64,
) {
    let u = usage.entry(agent.to_owned()).or_default();
    u.slots = match sign {
        1 => u.slots.checked_add(req).unwrap_or_else(|_| u.slots.clone()),
        _ => u.slots.saturating_sub(req),
    };
    u.kernels += sign;
}

/// As [`place`], for a kernel of a `multi-node` gang under `[scheduler] cluster-placement =
/// "pack"`: among the schedulable candidates that fit `req` now, one holding `image` first,
/// then the *most* loaded after placing it, then more kernels, then the id (Kubernetes'
/// `MostAllocated` score): a gang fills few agents and leaves whole ones free.
///
/// Errors: as [`place`]'s.
pub fn place_packed(
    candidates: &[AgentRow],
    usage: &std::collections::HashMap<String, Usage>,
    req: &ResourceSlots,
    image: &str,
    images: &AgentImageSets,
) -> Result<String, PlaceError> {
    fits_some_agent(candidates, req)?;
    ranks(candidates, usage, req, &normalize_image(image), images)
        .min_by(|a, b| {
            a.lacks
                .cmp(&b.lacks)
                .then(b.load.cmp(&a.load))
                .then(b.kernels.cmp(&a.kernels))
                .then(a.id.cmp(b.id))
        })
        .map(|r| r.id.to_owned())
        .ok_or_else(|| short_of(candidates, usage, req))
}

/// [`place`] or [`place_packed`], as `placement` says.
pub fn place_by(
    placement: ClusterPlacement,
    candidates: &[AgentRow],
    usage: &std::collections::HashMap<String, Usage>,
    req: &ResourceSlots,
    image: &str,
    images: &AgentImageSets,
) -> Result<String, PlaceError> {
    match placement {
        ClusterPlacement::Spread => place(candidates, usage, req, image, images),
        ClusterPlacement::Pack => place_packed(candidates, usage, req, image, images),
    }
}

/// The rank of every schedulable candidate that `req` fits beside its usage ([`rank`]).
fn ranks<'a: 'b, 'b>(
    candidates: &'a [AgentRow],
    usage: &'b std::collections::HashMap<String, Usage>,
    req: &'b ResourceSlots,
    wanted: &'b str,
    images: &'b AgentImageSets,
) -> impl Iterator<Item = Rank<'a>> + 'b {
    let empty = Usage::default();
    candidates
        .iter()
        .enumerate()
        .filter(|(_, a)| a.schedulable && !a.draining)
        .filter_map(move |(i, a)| {
            rank(
                i,
                a,
                usage.get(&a.id).unwrap_or(&empty),
                req,
                wanted,
                images,
            )
        })
}

/// How [`place`] ranks an agent for `req` (lower first): holding the image (`wanted`,
/// normalized) first, then the load after placing it, then fewer kernels, then the id. `None`
/// when `req` does not fit beside its `usage`.
fn rank<'a>(
    index: usize,
    a: &'a AgentRow,
    usage: &Usage,
    req: &ResourceSlots,
    wanted: &str,
    images: &AgentImageSets,
) -> Option<Rank<'a>> {
    if !req.fits_beside(&usage.slots, &a.slots_total) {
        return None;
    }
    Some(Rank {
        lacks: !images.get(&a.id).is_some_and(|s| s.contains(wanted)),
        load: TotalF64(load_after(&a.slots_total, &usage.slots, req)),
        kernels: usage.kernels,
        id: &a.id,
        index,
    })
}

/// An agent's place in [`place`]'s order (the derived order compares the fields in turn).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Rank<'a> {
    /// `false` (holds the image) sorts first.
    lacks: bool,
    load: TotalF64,
    kernels: i64,
    id: &'a str,
    /// Its index among the candidates.
    index: usize,
}

/// An `f64` ordered by `total_cmp`.
#[derive(Clone, Copy, Debug)]
struct TotalF64(f64);

impl PartialEq for TotalF64 {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0).is_eq()
    }
}
impl Eq for TotalF64 {}
impl PartialOrd for TotalF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for TotalF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// Places many sessions, one after another, on a fleet whose usage only grows meanwhile (an
/// admission round, `queue.rs`): each choice is [`place`]'s, but a round of 1,000 admissions on
/// 10,000 agents does not rank the whole fleet 1,000 times. Per request shape (slots and image)
/// the agents that fit are ranked once, in a heap; a choice pops the best and re-ranks it
/// against the usage now. Usage only grows, so a rank only worsens and a heap entry is a lower
/// bound of its agent's rank: the first one still equal to its agent's rank now is the best.
/// O(agents) per shape, then O(log agents) per session.
pub struct RoundPlacer<'a> {
    candidates: &'a [AgentRow],
    images: &'a AgentImageSets,
    shapes: Vec<Shape<'a>>,
}

struct Shape<'a> {
    req: ResourceSlots,
    image: String,
    wanted: String,
    heap: std::collections::BinaryHeap<std::cmp::Reverse<Rank<'a>>>,
    /// Why nothing fits, once the heap ran dry (it stays dry for the round).
    dry: Option<PlaceError>,
}

impl<'a> RoundPlacer<'a> {
    /// A placer over `candidates` and the `images` they hold.
    pub fn new(candidates: &'a [AgentRow], images: &'a AgentImageSets) -> RoundPlacer<'a> {
        RoundPlacer {
            candidates,
            images,
            shapes: Vec::new(),
        }
    }

    /// [`place`] of `req` and `image` against `usage`, which the caller grows by what it
    /// places (and never shrinks while this placer lives).
    pub fn place(
        &mut self,
        req: &ResourceSlots,
        image: &str,
        usage: &std::collections::HashMap<String, Usage>,
    ) -> Result<String, PlaceError> {
        let (candidates, images) = (self.candidates, self.images);
        let empty = Usage::default();
        let i = match self
            .shapes
            .iter()
            .position(|s| s.req == *req && s.image == image)
        {
            Some(i) => i,
            None => {
                fits_some_agent(candidates, req)?;
                let wanted = normalize_image(image);
                let heap = ranks(candidates, usage, req, &wanted, images)
                    .map(std::cmp::Reverse)
                    .collect();
                self.shapes.push(Shape {
                    req: req.clone(),
                    image: image.to_owned(),
                    wanted,
                    heap,
                    dry: None,
                });
                self.shapes.len() - 1
            }
        };
        let shape = &mut self.shapes[i];
        if let Some(e) = &shape.dry {
            return Err(e.clone());
        }
        while let Some(std::cmp::Reverse(top)) = shape.heap.pop() {
            let a = &candidates[top.index];
            let u = usage.get(&a.id).unwrap_or(&empty);
            // Full now: full for the rest of the round.
            let Some(now) = rank(top.index, a, u, &shape.req, &shape.wanted, images) else {
                continue;
            };
            if now == top {
                // Back in, as a lower bound of its rank once the caller adds this session.
                shape.heap.push(std::cmp::Reverse(top));
                return Ok(a.id.clone());
            }
            shape.heap.push(std::cmp::Reverse(now));
        }
        let e = short_of(candidates, usage, req);
        shape.dry = Some(e.clone());
        Err(e)
    }
}

/// Whether some candidate could ever hold `req` (its total has that much of every slot),
/// whatever is placed on it now: a cheap check (it stops at the first agent that could) that a
/// request which must wait can wait.
///
/// Errors: no candidates → [`PlaceError::NoAgents`]; none could → `SlotsExceedCapacity`,
/// naming the first slot no agent has enough of in total, with the largest total.
pub fn fits_some_agent(candidates: &[AgentRow], req: &ResourceSlots) -> Result<(), PlaceError> {
    if candidates.is_empty() {
        return Err(PlaceError::NoAgents);
    }
    if !candidates
        .iter()
        .any(|a| req.fits_in(&a.slots_total).is_ok())
    {
        // Name the first slot that no agent has enough of in total, with the largest total.
        let (slot, largest) = req
            .nonzero()
            .map(|(slot, want)| {
                let largest = candidates
                    .iter()
                    .map(|a| a.slots_total.get(slot))
                    .max()
                    .unwrap_or_default();
                (slot, want, largest)
            })
            .find(|(_, want, largest)| want > largest)
            .map(|(slot, _, largest)| (slot.to_owned(), largest))
            .unwrap_or_else(|| ("(combined)".to_owned(), Amount::ZERO));
        return Err(PlaceError::SlotsExceedCapacity(format!(
            "requested {req}: no ALIVE agent has that much in total (largest {slot}: {largest})"
        )));
    }
    Ok(())
}

/// Why no schedulable agent fits `req` now (some agent fits it in total): only cordoned ones
/// could, or the slot most short (compared with the most of it free on one schedulable agent
/// that could fit it in total), or, when every slot alone fits somewhere, that no agent has
/// all of them free at once (naming the least loaded such agent's free slots).
fn short_of(
    candidates: &[AgentRow],
    usage: &std::collections::HashMap<String, Usage>,
    req: &ResourceSlots,
) -> PlaceError {
    let empty = Usage::default();
    let could: Vec<&AgentRow> = candidates
        .iter()
        .filter(|a| a.schedulable && !a.draining && req.fits_in(&a.slots_total).is_ok())
        .collect();
    if could.is_empty() {
        let mut ids: Vec<String> = candidates
            .iter()
            .filter(|a| req.fits_in(&a.slots_total).is_ok())
            .map(|a| a.id.clone())
            .collect();
        ids.sort();
        ids.truncate(5);
        return PlaceError::Cordoned(ids);
    }
    let free = |a: &AgentRow| {
        a.slots_total
            .saturating_sub(&usage.get(&a.id).unwrap_or(&empty).slots)
    };
    for (slot, want) in req.nonzero() {
        let (most, agent) = could
            .iter()
            .map(|a| (free(a).get(slot), a.id.as_str()))
            .max_by(|(x, ia), (y, ib)| x.cmp(y).then(ib.cmp(ia)))
            .unwrap_or((Amount::ZERO, ""));
        if want > most {
            return PlaceError::NoCapacity(format!(
                "not enough `{slot}` free: it needs {want}, the most free on one schedulable agent is {most} (agent {agent})"
            ));
        }
    }
    let best = could
        .iter()
        .min_by(|a, b| {
            let (ua, ub) = (
                usage.get(&a.id).unwrap_or(&empty),
                usage.get(&b.id).unwrap_or(&empty),
            );
            ResourceSlots::load(&ua.slots, &a.slots_total)
                .total_cmp(&ResourceSlots::load(&ub.slots, &b.slots_total))
                .then(a.id.cmp(&b.id))
        })
        .map(|a| (a.id.clone(), free(a)))
        .unwrap_or_default();
    PlaceError::NoCapacity(format!(
        "no schedulable agent has all of {req} free at once (agent {} has {} free)",
        best.0, best.1
    ))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::manager::store::Usage;
    use crate::slots::SlotType;

    fn slots(pairs: &[(&str, &str)]) -> ResourceSlots {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), Amount::parse(v).unwrap()))
            .collect()
    }

    fn agent(id: &str, total: &[(&str, &str)], accel: &[(&str, SlotType)]) -> AgentRow {
        let mut slot_types = crate::slots::builtin_types();
        for (k, t) in accel {
            slot_types.insert(k.to_string(), *t);
        }
        AgentRow::alive(id, slots(total), slot_types)
    }

    /// [`super::place`] of an image no agent holds: load, kernels and id decide.
    fn place(
        candidates: &[AgentRow],
        usage: &HashMap<String, Usage>,
        req: &ResourceSlots,
    ) -> Result<String, PlaceError> {
        super::place(
            candidates,
            usage,
            req,
            "nobody-has:1",
            &AgentImageSets::new(),
        )
    }

    /// Agent id → the images it holds.
    fn holding(pairs: &[(&str, &[&str])]) -> AgentImageSets {
        pairs
            .iter()
            .map(|(id, refs)| {
                let set = refs.iter().map(|r| r.to_string()).collect();
                (id.to_string(), std::sync::Arc::new(set))
            })
            .collect()
    }

    fn used(pairs: &[(&str, &str)], kernels: i64) -> Usage {
        Usage {
            slots: slots(pairs),
            kernels,
        }
    }

    fn request(
        json: serde_json::Value,
        candidates: &[AgentRow],
    ) -> Result<ResourceSlots, ManagerError> {
        parse_request(&serde_json::from_value(json).unwrap(), candidates)
    }

    const GIB: &str = "1073741824";

    #[test]
    fn slot_parsing() {
        let fleet = [
            agent("a", &[("cpu", "4"), ("mem", GIB)], &[]),
            agent(
                "g",
                &[("cpu", "4"), ("mem", GIB), ("cuda.shares", "2")],
                &[("cuda.shares", SlotType::Count)],
            ),
        ];
        let r = request(serde_json::json!({"cpu": 1.5, "mem": "256m"}), &fleet).unwrap();
        assert_eq!(r, slots(&[("cpu", "1.5"), ("mem", "268435456")]));
        let r = request(
            serde_json::json!({"cpu": "1", "mem": 1024, "cuda.shares": "0.25"}),
            &fleet,
        )
        .unwrap();
        assert_eq!(r.get("cuda.shares"), Amount::from_milli(250));
        for (v, word) in [
            (serde_json::json!({"cpu": 0, "mem": "1g"}), "`cpu`"),
            (serde_json::json!({"cpu": 0.0001, "mem": "1g"}), "decimals"),
            (serde_json::json!({"cpu": 1, "mem": "lots"}), "`mem`"),
            (serde_json::json!({"cpu": 1}), "`mem`"),
            (
                serde_json::json!({"cpu": 1, "mem": 1, "cuda.shares": -1}),
                "`cuda.shares`",
            ),
        ] {
            let e = request(v.clone(), &fleet).unwrap_err();
            assert_eq!(e.code(), "invalid-request", "{v}");
            assert!(e.to_string().contains(word), "{v}: {e}");
        }
        let e = request(
            serde_json::json!({"cpu": 1, "mem": 1, "tpu.device": 1}),
            &fleet,
        )
        .unwrap_err();
        assert_eq!((e.code(), e.status()), ("unknown-slot", 400), "{e}");
        assert!(e.to_string().contains("`tpu.device`"), "{e}");
        // Agents that predate `slot_key_and_units` know `cuda.device`.
        let old = [agent(
            "o",
            &[("cpu", "4"), ("mem", GIB)],
            &[("cuda.device", SlotType::Count)],
        )];
        assert!(request(
            serde_json::json!({"cpu": 1, "mem": 1, "cuda.device": 1}),
            &old
        )
        .is_ok());
        assert_eq!(
            request(
                serde_json::json!({"cpu": 1, "mem": 1, "cuda.device": 1}),
                &[]
            )
            .unwrap_err()
            .code(),
            "no-agents"
        );
    }

    #[test]
    fn placement_least_loaded_and_errors() {
        let agents = vec![
            agent("a", &[("cpu", "4"), ("mem", "8")], &[]),
            agent("b", &[("cpu", "4"), ("mem", "8")], &[]),
        ];
        let req = slots(&[("cpu", "1"), ("mem", "1")]);
        let mut usage = HashMap::new();
        usage.insert("a".to_string(), used(&[("cpu", "2"), ("mem", "1")], 2));
        assert_eq!(place(&agents, &usage, &req).unwrap(), "b");
        usage.insert("b".to_string(), used(&[("cpu", "3"), ("mem", "1")], 1));
        assert_eq!(place(&agents, &usage, &req).unwrap(), "a");
        // Equal load: fewer kernels wins.
        usage.insert("a".to_string(), used(&[("cpu", "3"), ("mem", "1")], 3));
        assert_eq!(place(&agents, &usage, &req).unwrap(), "b");
        usage.insert("a".to_string(), used(&[("cpu", "4"), ("mem", "1")], 4));
        usage.insert("b".to_string(), used(&[("cpu", "3.5"), ("mem", "1")], 1));
        assert_eq!(
            place(&agents, &usage, &req).unwrap_err().code(),
            "no-capacity"
        );
        let huge = slots(&[("cpu", "64"), ("mem", "1")]);
        let e = place(&agents, &usage, &huge).unwrap_err();
        assert_eq!(e.code(), "slots-exceed-capacity");
        assert!(e.to_string().contains("largest cpu: 4"), "{e}");
        assert_eq!(place(&[], &usage, &req).unwrap_err().code(), "no-agents");
    }

    #[test]
    fn placement_never_picks_an_agent_without_the_slot() {
        let agents = vec![
            agent("cpu-only", &[("cpu", "64"), ("mem", GIB)], &[]),
            agent(
                "gpu",
                &[("cpu", "4"), ("mem", GIB), ("cuda.device", "4")],
                &[("cuda.device", SlotType::Count)],
            ),
        ];
        let mut usage = HashMap::new();
        // The GPU agent is far busier, yet the only one with the device.
        usage.insert(
            "gpu".to_string(),
            used(&[("cpu", "3"), ("cuda.device", "2")], 2),
        );
        let gpu_req = slots(&[("cpu", "0.5"), ("mem", "1"), ("cuda.device", "2")]);
        assert_eq!(place(&agents, &usage, &gpu_req).unwrap(), "gpu");
        // A plain request goes to the least loaded one.
        let plain = slots(&[("cpu", "0.5"), ("mem", "1")]);
        assert_eq!(place(&agents, &usage, &plain).unwrap(), "cpu-only");
        // A zero amount of a slot the agent lacks does not exclude it.
        let zero = slots(&[("cpu", "0.5"), ("mem", "1"), ("cuda.device", "0")]);
        assert_eq!(place(&agents, &usage, &zero).unwrap(), "cpu-only");
        // All 4 devices in use: full now, not over capacity.
        usage.insert(
            "gpu".to_string(),
            used(&[("cpu", "1"), ("cuda.device", "4")], 2),
        );
        assert_eq!(
            place(&agents, &usage, &gpu_req).unwrap_err().code(),
            "no-capacity"
        );
        // More devices than any agent has, or an accelerator on CPU-only agents: never fits.
        let five = slots(&[("cpu", "1"), ("mem", "1"), ("cuda.device", "5")]);
        let e = place(&agents, &usage, &five).unwrap_err();
        assert_eq!(e.code(), "slots-exceed-capacity");
        assert!(e.to_string().contains("largest cuda.device: 4"), "{e}");
        assert_eq!(
            place(&agents[..1], &HashMap::new(), &gpu_req)
                .unwrap_err()
                .code(),
            "slots-exceed-capacity"
        );
    }

    #[test]
    fn placement_prefers_an_agent_that_holds_the_image() {
        let agents = vec![
            agent("a", &[("cpu", "4"), ("mem", "8")], &[]),
            agent("b", &[("cpu", "4"), ("mem", "8")], &[]),
            agent("c", &[("cpu", "4"), ("mem", "8")], &[]),
        ];
        let req = slots(&[("cpu", "1"), ("mem", "1")]);
        let images = holding(&[("b", &["python:latest", "cuda:12"]), ("c", &["cuda:12"])]);
        let mut usage = HashMap::new();
        // Idle and equal: the id would pick `a`; `b` holds the image (any spelling of it).
        for spelling in ["python", "python:latest", "docker.io/library/python:latest"] {
            assert_eq!(
                super::place(&agents, &usage, &req, spelling, &images).unwrap(),
                "b",
                "{spelling}"
            );
        }
        // Busier than the others, `b` still gets it: a pull costs more than the imbalance.
        usage.insert("b".to_string(), used(&[("cpu", "2"), ("mem", "1")], 2));
        assert_eq!(
            super::place(&agents, &usage, &req, "python", &images).unwrap(),
            "b"
        );
        // Several hold it: the least loaded of them (`c`), not the least loaded overall (`a`).
        usage.insert("c".to_string(), used(&[("cpu", "1"), ("mem", "1")], 1));
        assert_eq!(
            super::place(&agents, &usage, &req, "cuda:12", &images).unwrap(),
            "c"
        );
        usage.insert("c".to_string(), used(&[("cpu", "2.5"), ("mem", "1")], 1));
        assert_eq!(
            super::place(&agents, &usage, &req, "cuda:12", &images).unwrap(),
            "b"
        );
        // Nobody holds it (another tag of a held repository is another image): least loaded.
        for other in ["python:3.12", "cuda", "nobody:1"] {
            assert_eq!(
                super::place(&agents, &usage, &req, other, &images).unwrap(),
                "a",
                "{other}"
            );
        }
    }

    #[test]
    fn holding_the_image_never_overrides_fit() {
        let agents = vec![
            agent("a", &[("cpu", "4"), ("mem", GIB)], &[]),
            agent(
                "gpu",
                &[("cpu", "4"), ("mem", GIB), ("cuda.device", "2")],
                &[("cuda.device", SlotType::Count)],
            ),
        ];
        let images = holding(&[("a", &["cuda:12"])]);
        let mut usage = HashMap::new();
        // `a` holds the image but has no GPU: the GPU request goes where the device is.
        let gpu = slots(&[("cpu", "1"), ("mem", "1"), ("cuda.device", "1")]);
        assert_eq!(
            super::place(&agents, &usage, &gpu, "cuda:12", &images).unwrap(),
            "gpu"
        );
        // `a` holds the image but is full: the other agent, which must pull it.
        usage.insert("a".to_string(), used(&[("cpu", "3.5")], 3));
        let plain = slots(&[("cpu", "1"), ("mem", "1")]);
        assert_eq!(
            super::place(&agents, &usage, &plain, "cuda:12", &images).unwrap(),
            "gpu"
        );
        // Nobody fits: the same errors as without images.
        usage.insert("gpu".to_string(), used(&[("cpu", "3.5")], 3));
        assert_eq!(
            super::place(&agents, &usage, &plain, "cuda:12", &images)
                .unwrap_err()
                .code(),
            "no-capacity"
        );
        let huge = slots(&[("cpu", "64"), ("mem", "1")]);
        assert_eq!(
            super::place(&agents, &HashMap::new(), &huge, "cuda:12", &images)
                .unwrap_err()
                .code(),
            "slots-exceed-capacity"
        );
    }

    #[test]
    fn fractional_shares_are_exact() {
        let agents = vec![
            agent(
                "s1",
                &[("cpu", "8"), ("mem", GIB), ("cuda.shares", "1")],
                &[("cuda.shares", SlotType::Count)],
            ),
            agent(
                "s2",
                &[("cpu", "8"), ("mem", GIB), ("cuda.shares", "1")],
                &[("cuda.shares", SlotType::Count)],
            ),
        ];
        // 0.1 + 0.2 + 0.7 fill s1 exactly (no float drift): 0.3 more does not fit there.
        let mut usage = HashMap::new();
        let held = slots(&[("cuda.shares", "0.1")])
            .checked_add(&slots(&[("cuda.shares", "0.2")]))
            .unwrap()
            .checked_add(&slots(&[("cuda.shares", "0.4")]))
            .unwrap();
        usage.insert("s1".to_string(), used(&[], 3));
        usage.get_mut("s1").unwrap().slots = held;
        usage.insert("s2".to_string(), used(&[("cuda.shares", "0.8")], 1));
        let req = slots(&[("cpu", "1"), ("mem", "1"), ("cuda.shares", "0.3")]);
        // s1: 0.7 + 0.3 = 1.0 exactly fits; s2: 0.8 + 0.3 does not.
        assert_eq!(place(&agents, &usage, &req).unwrap(), "s1");
        let more = slots(&[("cpu", "1"), ("mem", "1"), ("cuda.shares", "0.301")]);
        assert_eq!(
            place(&agents, &usage, &more).unwrap_err().code(),
            "no-capacity"
        );
        // Least loaded by shares: s2 at 0.25 beats s1 at 0.5.
        usage.insert("s1".to_string(), used(&[("cuda.shares", "0.5")], 1));
        usage.insert("s2".to_string(), used(&[("cuda.shares", "0.25")], 5));
        let half = slots(&[("cpu", "1"), ("mem", "1"), ("cuda.shares", "0.5")]);
        assert_eq!(place(&agents, &usage, &half).unwrap(), "s2");
    }

    proptest::proptest! {
        /// A round's placer chooses what `place` chooses, session after session, whatever the
        /// fleet (some agents cordoned, some holding the image, some full), the request shapes
        /// and their order; and fails when `place` fails (with the same code: the message is the
        /// one of the shape's first failure in the round, as the free amounts were then).
        #[test]
        fn round_placer_chooses_as_place_does(
            agents in proptest::collection::vec((1u8..8, 0u8..4, proptest::bool::ANY, proptest::bool::ANY), 1..24),
            sessions in proptest::collection::vec((1u8..4, proptest::bool::ANY), 1..60),
        ) {
            let candidates: Vec<AgentRow> = agents
                .iter()
                .enumerate()
                .map(|(i, (cpu, used, cordoned, _))| {
                    let mut a = agent(&format!("a{i:02}"), &[("cpu", &cpu.to_string()), ("mem", "1024")], &[]);
                    a.schedulable = !cordoned;
                    let _ = used;
                    a
                })
                .collect();
            let mut usage: HashMap<String, Usage> = agents
                .iter()
                .enumerate()
                .filter(|(_, (_, used, _, _))| *used > 0)
                .map(|(i, (_, used, _, _))| {
                    (format!("a{i:02}"), Usage { slots: slots(&[("cpu", &used.to_string())]), kernels: i64::from(*used) })
                })
                .collect();
            let images: AgentImageSets = agents
                .iter()
                .enumerate()
                .filter(|(_, (_, _, _, holds))| *holds)
                .map(|(i, _)| (format!("a{i:02}"), std::sync::Arc::new(["img:latest".to_owned()].into_iter().collect())))
                .collect();
            let mut placer = RoundPlacer::new(&candidates, &images);
            for (cpu, other_image) in sessions {
                let req = slots(&[("cpu", &cpu.to_string()), ("mem", "1")]);
                let image = if other_image { "other" } else { "img" };
                let want = super::place(&candidates, &usage, &req, image, &images);
                let got = placer.place(&req, image, &usage);
                proptest::prop_assert_eq!(
                    got.as_ref().map_err(PlaceError::code),
                    want.as_ref().map_err(PlaceError::code)
                );
                if let Ok(id) = got {
                    let u = usage.entry(id).or_default();
                    u.slots = u.slots.checked_add(&req).unwrap();
                    u.kernels += 1;
                }
            }
        }
    }
}

//! Agent liveness as a state machine: the four statuses an agent goes through and the pure
//! transition functions the registry applies (the acceptance scenarios of `docs/scenarios.md`:
//! agent start, agent restart, manager restart, agent suspended past its timeout; the status
//! names are Backend.AI's `AgentStatus`, `ai/backend/manager/models/agent.py`, with `PENDING`
//! for an agent being reset).
//!
//! ```text
//!            heartbeat / agent_started                  no heartbeat for heartbeat-timeout
//! (new) ─────────────────────────────────▶ ALIVE ──────────────────────────────────────▶ LOST
//!                                          ▲  │ agent_terminated                           │ heartbeat or
//!                  heartbeat/agent_started │  ▼                                            │ agent_started
//!                                      TERMINATED            ALIVE ◀── reset_instance ── PENDING
//! ```
//!
//! Each function takes an agent's [`Liveness`] and what happened, and answers a [`Step`]: the
//! liveness after it and the [`Effect`]s the registry performs (store writes, the reset call,
//! the pool). Nothing here does I/O or reads a clock: the registry actor gathers the facts
//! (leadership, the agent's endpoint, times) and applies the answer.

pub use crate::model::agent::{AgentStatus, UnknownAgentStatus};

/// One agent's liveness as the registry holds it: its status and the leader's store calls in
/// flight for it (each runs once at a time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Liveness {
    /// The status.
    pub status: AgentStatus,
    /// The reset flow (`reset_instance` and its conditional status writes) is in flight.
    pub resetting: bool,
    /// `mark_agent_lost` is in flight.
    pub losing: bool,
}

impl Liveness {
    /// An agent in `status` with nothing in flight (a row read from the store).
    pub const fn at(status: AgentStatus) -> Liveness {
        Liveness {
            status,
            resetting: false,
            losing: false,
        }
    }

    /// An agent first heard from (heartbeat or event) that the registry did not know: `ALIVE`,
    /// its row written behind with the next flush.
    pub const fn first_contact() -> Liveness {
        Liveness::at(AgentStatus::Alive)
    }
}

/// What the registry does after a transition, besides keeping the new [`Liveness`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Effect {
    /// This replica's own status change (`ALIVE` ⇄ `TERMINATED`): stamp `status_changed` now and
    /// write the row behind (the store keeps a `LOST`/`PENDING` the leader wrote).
    Persist,
    /// The store already holds the new status (the leader's conditional update): stamp
    /// `status_changed` now, nothing to write.
    Stamp,
    /// Start the reset flow: `LOST` → `PENDING` in the store, a fresh pool connection,
    /// `reset_instance`, then `PENDING` → `ALIVE` in the store; answered by [`reset_finished`].
    StartReset,
    /// Record the loss in the store (`mark_agent_lost`: `LOST`, its live kernels leave the live
    /// set as `agent-lost` and their concurrency comes back); answered by [`loss_recorded`].
    RecordLoss,
    /// Drop the agent's pool connection: it is lost.
    InvalidatePeer,
}

/// A transition's answer: the agent's liveness after it and what to do, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub struct Step {
    /// The liveness after the transition.
    pub next: Liveness,
    /// What the registry performs.
    pub effects: Vec<Effect>,
}

impl Step {
    /// Nothing changes.
    fn stay(l: Liveness) -> Step {
        Step {
            next: l,
            effects: Vec::new(),
        }
    }

    /// `status` with `effects`, the calls in flight kept.
    fn to(l: Liveness, status: AgentStatus, effects: &[Effect]) -> Step {
        Step {
            next: Liveness { status, ..l },
            effects: effects.to_vec(),
        }
    }
}

/// What decides whether this replica may start a reset now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResetGate {
    /// This replica holds the leader lock (resets are the leader's duty; a standby leaves them
    /// to the leader, which sees the agent's newer `seen_at` in the store).
    pub leader: bool,
    /// The agent's endpoint is known (the reset call needs it).
    pub reachable: bool,
}

/// A heartbeat or `agent_started` of a known agent (in normal mode, or at the end of the
/// start-up grace for its newest heartbeat): a `TERMINATED` agent is `ALIVE` again; a lost one
/// (`LOST`/`PENDING`) is reset ([`reset_started`]); an `ALIVE` one stays.
pub fn heard(l: Liveness, gate: ResetGate) -> Step {
    match l.status {
        AgentStatus::Alive => Step::stay(l),
        AgentStatus::Terminated => Step::to(l, AgentStatus::Alive, &[Effect::Persist]),
        AgentStatus::Lost | AgentStatus::Pending => reset_started(l, gate),
    }
}

/// The leader starts resetting a lost agent heard from again: `LOST` → `PENDING` (in memory; the
/// reset flow writes it), [`Effect::StartReset`]. Nothing when this replica is not the leader,
/// the endpoint is unknown, a reset is already in flight, or the agent is not lost.
pub fn reset_started(l: Liveness, gate: ResetGate) -> Step {
    if !gate.leader || !gate.reachable || l.resetting || !l.status.needs_reset() {
        return Step::stay(l);
    }
    Step {
        next: Liveness {
            status: AgentStatus::Pending,
            resetting: true,
            ..l
        },
        effects: vec![Effect::StartReset],
    }
}

/// How a reset flow ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResetOutcome {
    /// `reset_instance` returned and the store moved the agent `PENDING` → `ALIVE`.
    Done,
    /// `reset_instance` returned but the store no longer held it `PENDING` (lost again
    /// meanwhile): the next heartbeat resets it again.
    Overtaken,
    /// The store or the call failed: retried on the leader's next sweep.
    Failed,
}

/// The reset flow ended: `ALIVE` (stamped; the store holds it) when it was done, otherwise
/// unchanged; either way no reset is in flight any more.
pub fn reset_finished(l: Liveness, outcome: ResetOutcome) -> Step {
    let l = Liveness {
        resetting: false,
        ..l
    };
    match outcome {
        ResetOutcome::Done => Step::to(l, AgentStatus::Alive, &[Effect::Stamp]),
        ResetOutcome::Overtaken | ResetOutcome::Failed => Step::stay(l),
    }
}

/// `agent_terminated` (a clean shutdown): `TERMINATED`, written behind. A lost agent stays
/// lost: it must be reset before it is used again.
pub fn terminated(l: Liveness) -> Step {
    match l.status {
        AgentStatus::Alive => Step::to(l, AgentStatus::Terminated, &[Effect::Persist]),
        AgentStatus::Terminated | AgentStatus::Lost | AgentStatus::Pending => Step::stay(l),
    }
}

/// Why an agent went from `from` to `to`, in the words of the event stream's `agent_status`
/// `reason`: `heartbeat-timeout` (lost), `resetting` (a lost agent heard from again),
/// `reset` (the reset flow made it `ALIVE`), `terminated` (its `agent_terminated`),
/// `heard-from` (a terminated agent back).
pub fn change_reason(from: AgentStatus, to: AgentStatus) -> &'static str {
    match (from, to) {
        (_, AgentStatus::Lost) => "heartbeat-timeout",
        (_, AgentStatus::Pending) => "resetting",
        (AgentStatus::Lost | AgentStatus::Pending, AgentStatus::Alive) => "reset",
        (_, AgentStatus::Terminated) => "terminated",
        (_, AgentStatus::Alive) => "heard-from",
    }
}

/// Whether no replica heard from an agent for longer than `timeout` (seconds), at `now` (Unix
/// seconds): counted from `started_at` (this replica's start) at the earliest, so a manager
/// that was down loses nobody sooner than a timeout after it comes back.
pub fn silent_too_long(seen_at: f64, started_at: f64, now: f64, timeout: f64) -> bool {
    now - seen_at.max(started_at) > timeout
}

/// What the leader's sweep knows of one agent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sweep {
    /// [`silent_too_long`].
    pub silent_too_long: bool,
    /// Some replica heard from it after its last status change (`seen_at > status_changed`).
    pub heard_since_change: bool,
    /// Whether a reset may start now.
    pub gate: ResetGate,
}

/// The leader's periodic sweep of one agent (normal mode only). Both conditions are read from
/// the liveness before the sweep:
/// - a `LOST` agent heard from since it was lost, or a `PENDING` one (a reset that failed), is
///   reset ([`reset_started`]);
/// - an `ALIVE` or `PENDING` agent silent for too long is recorded lost ([`Effect::RecordLoss`],
///   once: not while a record is in flight). `TERMINATED` agents never time out.
pub fn swept(l: Liveness, s: Sweep) -> Step {
    let back = !l.resetting
        && ((l.status == AgentStatus::Lost && s.heard_since_change)
            || l.status == AgentStatus::Pending);
    let lose = matches!(l.status, AgentStatus::Alive | AgentStatus::Pending)
        && !l.losing
        && s.silent_too_long;
    let mut step = if back {
        reset_started(l, s.gate)
    } else {
        Step::stay(l)
    };
    if lose {
        step.next.losing = true;
        step.effects.push(Effect::RecordLoss);
    }
    step
}

/// How `mark_agent_lost` ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossRecord {
    /// The store moved it to `LOST` and released its kernels.
    Recorded,
    /// The store did not hold it `ALIVE`/`PENDING`: another replica's write (a newer status)
    /// arrives with the next re-read.
    NotRecorded,
    /// The store failed: the next sweep tries again.
    Failed,
}

/// `mark_agent_lost` ended: `LOST` (stamped) and its pool connection dropped when recorded,
/// otherwise unchanged; either way no record is in flight any more.
pub fn loss_recorded(l: Liveness, record: LossRecord) -> Step {
    let l = Liveness { losing: false, ..l };
    match record {
        LossRecord::Recorded => Step::to(
            l,
            AgentStatus::Lost,
            &[Effect::Stamp, Effect::InvalidatePeer],
        ),
        LossRecord::NotRecorded | LossRecord::Failed => Step::stay(l),
    }
}

/// Whether this replica keeps its own status when it re-reads a row another replica wrote:
/// only an unflushed change of its own (`ALIVE` ⇄ `TERMINATED`) newer than theirs, and only
/// when their row replaces this replica's (`their_row_newer`: its `seen_at` is not older).
/// Otherwise their status and its `status_changed` win (the leader's transitions).
pub fn keeps_own_status(
    unflushed: bool,
    own_changed: f64,
    their_changed: f64,
    their_row_newer: bool,
) -> bool {
    their_row_newer && unflushed && own_changed > their_changed
}

/// Another replica's status for the agent is taken (see [`keeps_own_status`]): when it newly
/// says `LOST`, this replica's pool connection is dropped too.
pub fn replica_wrote(l: Liveness, theirs: AgentStatus) -> Step {
    if theirs == AgentStatus::Lost && l.status != AgentStatus::Lost {
        Step::to(l, theirs, &[Effect::InvalidatePeer])
    } else {
        Step::to(l, theirs, &[])
    }
}

#[cfg(test)]
mod tests;

//! Transition by transition, named after the step of `docs/scenarios.md` each one covers
//! (1 agent start, 2 agent restart, 3 manager restart, 4 agent suspended past its timeout).

use super::AgentStatus::{Alive, Lost, Pending, Terminated};
use super::*;

const LEADER: ResetGate = ResetGate {
    leader: true,
    reachable: true,
};
const STANDBY: ResetGate = ResetGate {
    leader: false,
    reachable: true,
};

fn at(status: AgentStatus) -> Liveness {
    Liveness::at(status)
}

fn step(status: AgentStatus, resetting: bool, losing: bool, effects: &[Effect]) -> Step {
    Step {
        next: Liveness {
            status,
            resetting,
            losing,
        },
        effects: effects.to_vec(),
    }
}

fn sweep(silent_too_long: bool, heard_since_change: bool) -> Sweep {
    Sweep {
        silent_too_long,
        heard_since_change,
        gate: LEADER,
    }
}

// Stored names.

#[test]
fn statuses_are_stored_and_shown_by_their_upper_case_names() {
    for (status, name) in [
        (Alive, "ALIVE"),
        (Lost, "LOST"),
        (Pending, "PENDING"),
        (Terminated, "TERMINATED"),
    ] {
        assert_eq!(status.as_str(), name);
        assert_eq!(status.to_string(), name);
        assert_eq!(name.parse::<AgentStatus>(), Ok(status));
        assert_eq!(serde_json::to_value(status).unwrap(), name);
        assert_eq!(
            serde_json::from_value::<AgentStatus>(name.into()).unwrap(),
            status
        );
    }
    assert_eq!(
        "alive".parse::<AgentStatus>(),
        Err(UnknownAgentStatus("alive".into()))
    );
    assert_eq!(AgentStatus::ALL.len(), 4);
}

// 1. Agent start.

#[test]
fn agent_start_first_contact_makes_it_alive() {
    assert_eq!(Liveness::first_contact(), at(Alive));
    assert!(Alive.places_kernels());
}

#[test]
fn agent_start_heartbeats_afterwards_keep_it_alive() {
    assert_eq!(heard(at(Alive), LEADER), step(Alive, false, false, &[]));
    assert_eq!(heard(at(Alive), STANDBY), step(Alive, false, false, &[]));
}

#[test]
fn agent_start_a_heartbeating_agent_is_not_swept() {
    assert_eq!(
        swept(at(Alive), sweep(false, true)),
        step(Alive, false, false, &[])
    );
}

// 2. Agent restart.

#[test]
fn agent_restart_agent_terminated_marks_it_terminated() {
    assert_eq!(
        terminated(at(Alive)),
        step(Terminated, false, false, &[Effect::Persist])
    );
    // A repeated one changes nothing.
    assert_eq!(
        terminated(at(Terminated)),
        step(Terminated, false, false, &[])
    );
}

#[test]
fn agent_restart_terminated_agent_never_times_out_and_gets_no_kernels() {
    assert_eq!(
        swept(at(Terminated), sweep(true, false)),
        step(Terminated, false, false, &[])
    );
    assert!(!Terminated.places_kernels());
    // Its kernels stay live and are not reset.
    assert!(!Terminated.needs_reset());
}

#[test]
fn agent_restart_agent_started_or_heartbeat_makes_it_alive_again() {
    for gate in [LEADER, STANDBY] {
        assert_eq!(
            heard(at(Terminated), gate),
            step(Alive, false, false, &[Effect::Persist])
        );
    }
}

// 3. Manager restart.

#[test]
fn manager_restart_nobody_is_lost_sooner_than_a_timeout_after_the_start() {
    // Last heard 100 s before this replica started, 3 s timeout.
    let (seen_at, started_at, timeout) = (1_000.0, 1_100.0, 3.0);
    assert!(!silent_too_long(seen_at, started_at, 1_102.0, timeout));
    assert!(!silent_too_long(seen_at, started_at, 1_103.0, timeout));
    assert!(silent_too_long(seen_at, started_at, 1_103.5, timeout));
    // Heard after the start: counted from then.
    assert!(!silent_too_long(1_105.0, started_at, 1_107.0, timeout));
    assert!(silent_too_long(1_105.0, started_at, 1_108.5, timeout));
}

#[test]
fn manager_restart_newest_heartbeat_of_an_alive_agent_is_reconciled() {
    // Its kernel list is diffed against the store; its status stays.
    assert!(!Alive.needs_reset());
    assert_eq!(heard(at(Alive), LEADER), step(Alive, false, false, &[]));
}

#[test]
fn manager_restart_newest_heartbeat_of_a_terminated_agent_makes_it_alive() {
    assert!(!Terminated.needs_reset());
    assert_eq!(
        heard(at(Terminated), LEADER),
        step(Alive, false, false, &[Effect::Persist])
    );
}

#[test]
fn manager_restart_newest_heartbeat_of_a_lost_agent_resets_it_instead() {
    // Its kernels were released before the restart: its list is ignored, it is reset.
    for status in [Lost, Pending] {
        assert!(status.needs_reset());
        assert_eq!(
            heard(at(status), LEADER),
            step(Pending, true, false, &[Effect::StartReset])
        );
    }
}

#[test]
fn manager_restart_replica_keeps_only_its_own_newer_unflushed_status() {
    // Unflushed TERMINATED at t=20 against their ALIVE at t=10, their row newer: kept.
    assert!(keeps_own_status(true, 20.0, 10.0, true));
    // Flushed, or older than theirs, or their row older: theirs wins.
    assert!(!keeps_own_status(false, 20.0, 10.0, true));
    assert!(!keeps_own_status(true, 10.0, 20.0, true));
    assert!(!keeps_own_status(true, 20.0, 10.0, false));
}

#[test]
fn manager_restart_replica_takes_the_leaders_transitions() {
    assert_eq!(
        replica_wrote(at(Alive), Lost),
        step(Lost, false, false, &[Effect::InvalidatePeer])
    );
    assert_eq!(
        replica_wrote(at(Pending), Lost),
        step(Lost, false, false, &[Effect::InvalidatePeer])
    );
    // Already lost here: the connection was dropped then.
    assert_eq!(replica_wrote(at(Lost), Lost), step(Lost, false, false, &[]));
    assert_eq!(
        replica_wrote(at(Lost), Pending),
        step(Pending, false, false, &[])
    );
    assert_eq!(
        replica_wrote(at(Pending), Alive),
        step(Alive, false, false, &[])
    );
    // The calls in flight here are kept.
    let busy = Liveness {
        status: Alive,
        resetting: false,
        losing: true,
    };
    assert_eq!(
        replica_wrote(busy, Lost),
        step(Lost, false, true, &[Effect::InvalidatePeer])
    );
}

// 4. Agent suspended past its timeout.

#[test]
fn agent_suspended_past_its_timeout_the_leader_records_the_loss() {
    assert_eq!(
        swept(at(Alive), sweep(true, false)),
        step(Alive, false, true, &[Effect::RecordLoss])
    );
}

#[test]
fn agent_suspended_the_loss_is_recorded_once_while_in_flight() {
    let losing = swept(at(Alive), sweep(true, false)).next;
    assert_eq!(
        swept(losing, sweep(true, false)),
        step(Alive, false, true, &[])
    );
}

#[test]
fn agent_suspended_recorded_loss_marks_it_lost_and_drops_its_connection() {
    let losing = swept(at(Alive), sweep(true, false)).next;
    assert_eq!(
        loss_recorded(losing, LossRecord::Recorded),
        step(Lost, false, false, &[Effect::Stamp, Effect::InvalidatePeer])
    );
    assert!(!Lost.places_kernels());
}

#[test]
fn agent_suspended_loss_recorded_elsewhere_or_failed_changes_nothing_here() {
    let losing = swept(at(Alive), sweep(true, false)).next;
    for record in [LossRecord::NotRecorded, LossRecord::Failed] {
        assert_eq!(
            loss_recorded(losing, record),
            step(Alive, false, false, &[])
        );
    }
    // A failed record is tried again on the next sweep.
    let after = loss_recorded(losing, LossRecord::Failed).next;
    assert_eq!(
        swept(after, sweep(true, false)).effects,
        vec![Effect::RecordLoss]
    );
}

#[test]
fn agent_suspended_lost_agent_stays_lost_while_silent() {
    assert_eq!(
        swept(at(Lost), sweep(true, false)),
        step(Lost, false, false, &[])
    );
    assert_eq!(
        swept(at(Lost), sweep(false, false)),
        step(Lost, false, false, &[])
    );
}

#[test]
fn agent_resumed_first_heartbeat_marks_it_pending_and_starts_the_reset() {
    assert_eq!(
        heard(at(Lost), LEADER),
        step(Pending, true, false, &[Effect::StartReset])
    );
    // `agent_started` takes the same transition; a pending agent gets no kernels.
    assert!(!Pending.places_kernels());
    assert!(Pending.needs_reset());
}

#[test]
fn agent_resumed_duplicate_heartbeats_during_the_reset_are_ignored() {
    let resetting = heard(at(Lost), LEADER).next;
    assert_eq!(heard(resetting, LEADER), step(Pending, true, false, &[]));
    assert_eq!(
        reset_started(resetting, LEADER),
        step(Pending, true, false, &[])
    );
}

#[test]
fn agent_resumed_a_standby_leaves_the_reset_to_the_leader() {
    assert_eq!(heard(at(Lost), STANDBY), step(Lost, false, false, &[]));
    // The leader's sweep sees the agent heard from since the loss (its `seen_at` in the store).
    assert_eq!(
        swept(at(Lost), sweep(false, true)),
        step(Pending, true, false, &[Effect::StartReset])
    );
}

#[test]
fn agent_resumed_without_a_known_endpoint_waits_for_it() {
    let unreachable = ResetGate {
        leader: true,
        reachable: false,
    };
    assert_eq!(heard(at(Lost), unreachable), step(Lost, false, false, &[]));
    assert_eq!(
        swept(
            at(Lost),
            Sweep {
                silent_too_long: false,
                heard_since_change: true,
                gate: unreachable,
            }
        ),
        step(Lost, false, false, &[])
    );
}

#[test]
fn agent_resumed_agent_terminated_while_lost_keeps_it_lost() {
    assert_eq!(terminated(at(Lost)), step(Lost, false, false, &[]));
    let resetting = heard(at(Lost), LEADER).next;
    assert_eq!(terminated(resetting), step(Pending, true, false, &[]));
}

#[test]
fn agent_resumed_reset_done_makes_it_a_fresh_alive_agent() {
    let resetting = heard(at(Lost), LEADER).next;
    assert_eq!(
        reset_finished(resetting, ResetOutcome::Done),
        step(Alive, false, false, &[Effect::Stamp])
    );
    assert!(Alive.places_kernels());
}

#[test]
fn agent_resumed_reset_failed_stays_pending_and_the_sweep_retries() {
    let resetting = heard(at(Lost), LEADER).next;
    let failed = reset_finished(resetting, ResetOutcome::Failed);
    assert_eq!(failed, step(Pending, false, false, &[]));
    assert_eq!(
        swept(failed.next, sweep(false, false)),
        step(Pending, true, false, &[Effect::StartReset])
    );
}

#[test]
fn agent_resumed_reset_overtaken_by_a_new_loss_leaves_the_status_to_the_store() {
    let resetting = heard(at(Lost), LEADER).next;
    assert_eq!(
        reset_finished(resetting, ResetOutcome::Overtaken),
        step(Pending, false, false, &[])
    );
}

#[test]
fn agent_resumed_then_silent_again_is_lost_again() {
    // Silent during its reset: recorded lost, the reset in flight left to end.
    let resetting = heard(at(Lost), LEADER).next;
    assert_eq!(
        swept(resetting, sweep(true, false)),
        step(Pending, true, true, &[Effect::RecordLoss])
    );
    // Silent after a failed reset: reset tried again and the loss recorded, in that order.
    assert_eq!(
        swept(at(Pending), sweep(true, false)),
        step(
            Pending,
            true,
            true,
            &[Effect::StartReset, Effect::RecordLoss]
        )
    );
}

#[test]
fn agent_suspended_past_its_timeout_whole_scenario() {
    let mut l = at(Alive);
    let mut effects = Vec::new();
    let mut run = |s: Step, l: &mut Liveness| {
        effects.extend(s.effects);
        *l = s.next;
    };
    run(swept(l, sweep(true, false)), &mut l);
    run(loss_recorded(l, LossRecord::Recorded), &mut l);
    assert_eq!(l.status, Lost);
    run(heard(l, LEADER), &mut l);
    run(heard(l, LEADER), &mut l);
    assert_eq!(l.status, Pending);
    run(reset_finished(l, ResetOutcome::Done), &mut l);
    assert_eq!(l, at(Alive));
    assert_eq!(
        effects,
        [
            Effect::RecordLoss,
            Effect::Stamp,
            Effect::InvalidatePeer,
            Effect::StartReset,
            Effect::Stamp
        ]
    );
}

#[test]
fn change_reasons_name_what_moved_the_agent() {
    assert_eq!(change_reason(Alive, Lost), "heartbeat-timeout");
    assert_eq!(change_reason(Pending, Lost), "heartbeat-timeout");
    assert_eq!(change_reason(Lost, Pending), "resetting");
    assert_eq!(change_reason(Pending, Alive), "reset");
    assert_eq!(change_reason(Lost, Alive), "reset");
    assert_eq!(change_reason(Alive, Terminated), "terminated");
    assert_eq!(change_reason(Terminated, Alive), "heard-from");
}

//! The event stream's events (`GET /v1/events`, server-sent events): what the manager tells a
//! watcher about sessions and agents as it changes them. The manager writes each as an SSE frame
//! (`id: <id>`, `event: <type>`, `data: <one line of JSON>`); `kernelvisor ctl events` and
//! `ctl session show --watch` read the frames back into [`Event`]. Contract:
//! `docs/manager-api.md`, "Events".

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::model::pull::PullProgress;

/// What an event is about; its SSE `event:` name and the `type` filter's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventType {
    /// A session's (its one kernel's) status changed: `status` is the new one (`PENDING`,
    /// `PREPARING`, `PULLING`, `CREATING`, `RUNNING`, `RESTARTING`, `TERMINATED`) and `reason`
    /// why, where the manager knows it (always for `TERMINATED`).
    SessionStatus,
    /// A `PULLING` session's image pull moved on: `pull_progress` in bytes and layers.
    PullProgress,
    /// An agent's liveness changed (`ALIVE`, `LOST`, `PENDING`, `TERMINATED`): admins only.
    AgentStatus,
    /// A session will be reclaimed (`docs/design.md`, "Idle reclaim"): `reason`
    /// (`idle-timeout`, `lifetime-exceeded`, `low-utilization`) and `deadline` say why and
    /// when, unless it is active again (or its utilization rises) before then. Sent once per
    /// deadline, its warning lead before it.
    ReclaimWarning,
    /// The last event of a stream whose reader fell too far behind: the manager dropped it
    /// rather than queue more (`reason` says how far). Reconnect with `Last-Event-ID` to resume
    /// from what the manager still keeps.
    Dropped,
    /// Preemption (issue 41 item 2): a pending session (`session_id`, `kernel_id`,
    /// `access_key`: the preemptor) evicts `victims` (session ids) to fit; `reason`
    /// `preempted`. Each victim's own `session_status` events follow (`PREEMPTED`, then
    /// `TERMINATED` and, requeued, `PENDING`).
    Preemption,
}

impl EventType {
    /// Every type, in the order the docs list them.
    pub const ALL: [EventType; 6] = [
        EventType::SessionStatus,
        EventType::PullProgress,
        EventType::AgentStatus,
        EventType::ReclaimWarning,
        EventType::Preemption,
        EventType::Dropped,
    ];

    /// The wire name (`session_status`, …).
    pub const fn as_str(self) -> &'static str {
        match self {
            EventType::SessionStatus => "session_status",
            EventType::PullProgress => "pull_progress",
            EventType::AgentStatus => "agent_status",
            EventType::ReclaimWarning => "reclaim_warning",
            EventType::Dropped => "dropped",
            EventType::Preemption => "preemption",
        }
    }

    /// The type of a wire name; `None` for a name that is none of them.
    pub fn parse(name: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.as_str() == name)
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event. Absent keys are not about this event (an `agent_status` has no session).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Event {
    /// Its position in this manager's stream: strictly increasing (they start from the
    /// manager's start time in microseconds, so a restarted manager's ids are higher still).
    /// The SSE `id:`, which `Last-Event-ID` names to resume after it.
    #[schema(required = true)]
    pub id: u64,
    /// When the manager made the change, Unix seconds.
    #[schema(required = true)]
    pub time: f64,
    /// What it is about.
    /// `None` only when read from a newer manager that has a type this reader does not know
    /// (the manager always writes one).
    #[serde(rename = "type", deserialize_with = "known_type")]
    #[schema(required = true, value_type = EventType)]
    pub kind: Option<EventType>,
    /// The session (UUID).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The session's kernel (UUID).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel_id: Option<String>,
    /// The agent the session is on, or whose liveness changed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    /// The access key owning the session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub access_key: Option<String>,
    /// The new status (a session's `KernelStatus` or an agent's `AgentStatus` name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// Why (`user-requested`, `self-terminated`, `agent-lost`, `oom-killed`, an error code, …).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The exit code of a session that ended by itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    /// The image pull's progress (`pull_progress`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pull_progress: Option<PullProgress>,
    /// A `TERMINATING` session's deadline: Unix seconds by which its agent kills what still
    /// runs (its grace period from when its end began).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub terminate_deadline: Option<f64>,
    // Idle reclaim.
    /// `reclaim_warning`: when the session ends, Unix seconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deadline: Option<f64>,
    // Preemption (issue 41 item 2).
    /// A `preemption`'s victims: the session ids it evicts.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub victims: Option<Vec<String>>,
}

/// A type name as [`EventType`], or `None` for one this reader does not know.
fn known_type<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<EventType>, D::Error> {
    let name = Option::<String>::deserialize(d)?;
    Ok(name.as_deref().and_then(EventType::parse))
}

impl Event {
    /// An event of `kind` with nothing else set yet (the hub stamps `id` and `time`).
    pub fn of(kind: EventType) -> Event {
        Event {
            kind: Some(kind),
            ..Event::default()
        }
    }

    /// Whether it is the last status a session reaches (`TERMINATED`, or `CANCELLED`, which
    /// Backend.AI's sessions have and a watcher may meet through a proxy).
    pub fn is_final_session_status(&self) -> bool {
        self.kind == Some(EventType::SessionStatus)
            && matches!(self.status.as_deref(), Some("TERMINATED" | "CANCELLED"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn types_round_trip_their_wire_names() {
        for t in EventType::ALL {
            assert_eq!(EventType::parse(t.as_str()), Some(t));
            assert_eq!(serde_json::to_value(t).unwrap(), t.as_str());
        }
        assert_eq!(EventType::parse("session"), None);
    }

    #[test]
    fn absent_keys_are_left_out_and_read_back() {
        let mut e = Event::of(EventType::AgentStatus);
        e.id = 7;
        e.agent_id = Some("a1".into());
        e.status = Some("LOST".into());
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"id": 7, "time": 0.0, "type": "agent_status", "agent_id": "a1", "status": "LOST"})
        );
        assert_eq!(serde_json::from_value::<Event>(json).unwrap(), e);
        // A newer manager's unknown type reads as no type, not as an error.
        let e: Event = serde_json::from_str(r#"{"id":1,"type":"quota"}"#).unwrap();
        assert_eq!((e.id, e.kind), (1, None));
    }
}

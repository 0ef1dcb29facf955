//! `HeartbeatInbox`: where the event intake leaves heartbeats for the registry, one per agent
//! (latest wins), taken by the registry in batches (a fleet's heartbeats applied in batches, memory
//! that does not grow with what agents send).
//!
//! An agent's heartbeat supersedes the previous one it sent (`docs/events.md`), so a manager
//! that falls behind keeps one heartbeat per agent, never a queue: what is held is bounded by
//! the number of agents, and `capacity` bounds that too (a flood of made-up agent ids on an
//! unauthenticated intake is refused, not stored).

use std::collections::HashMap;
use std::sync::Mutex;

use super::heartbeat::Heartbeat;

/// What [`HeartbeatInbox::put`] did with a heartbeat.
#[derive(Debug, PartialEq, Eq)]
pub enum Put {
    /// The agent had none waiting.
    New,
    /// It replaced the agent's older heartbeat that was still waiting.
    Superseded,
    /// The agent's waiting heartbeat is newer (`ts`): this one was dropped.
    Stale,
}

/// The inbox is at `capacity` agents and this heartbeat is from another one.
#[derive(Debug, thiserror::Error)]
#[error("heartbeat inbox full: {capacity} agents' heartbeats are waiting to be applied")]
pub struct InboxFull {
    /// Agents the inbox holds at most.
    pub capacity: usize,
}

/// Heartbeats waiting for the registry, at most one per agent and `capacity` agents. Shared
/// (`Arc`) by the intake, which puts, and the registry, which takes.
#[derive(Debug)]
pub struct HeartbeatInbox {
    waiting: Mutex<HashMap<String, Heartbeat>>,
    capacity: usize,
}

impl HeartbeatInbox {
    /// An empty inbox for up to `capacity` agents (at least 1).
    pub fn new(capacity: usize) -> HeartbeatInbox {
        HeartbeatInbox {
            waiting: Mutex::new(HashMap::new()),
            capacity: capacity.max(1),
        }
    }

    /// Leaves `hb` for the registry; an older one of the same agent still waiting is replaced.
    ///
    /// Errors: [`InboxFull`] when `capacity` other agents' heartbeats are waiting.
    pub fn put(&self, hb: Heartbeat) -> Result<Put, InboxFull> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = waiting.get_mut(&hb.agent_id) {
            if old.ts > hb.ts {
                return Ok(Put::Stale);
            }
            *old = hb;
            return Ok(Put::Superseded);
        }
        if waiting.len() >= self.capacity {
            return Err(InboxFull {
                capacity: self.capacity,
            });
        }
        waiting.insert(hb.agent_id.clone(), hb);
        Ok(Put::New)
    }

    /// Everything waiting, emptying the inbox (in no particular order: one per agent).
    pub fn take(&self) -> Vec<Heartbeat> {
        let mut waiting = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if waiting.is_empty() {
            return Vec::new();
        }
        // Keep the table's allocation for the next batch.
        waiting.drain().map(|(_, hb)| hb).collect()
    }

    /// Heartbeats waiting now.
    pub fn len(&self) -> usize {
        self.waiting.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

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

    #[test]
    fn keeps_the_latest_per_agent_and_refuses_agents_beyond_capacity() {
        let inbox = HeartbeatInbox::new(2);
        assert_eq!(inbox.put(hb("a", 1.0)).unwrap(), Put::New);
        assert_eq!(inbox.put(hb("a", 3.0)).unwrap(), Put::Superseded);
        // Overtaken on the way: the newer one stays.
        assert_eq!(inbox.put(hb("a", 2.0)).unwrap(), Put::Stale);
        assert_eq!(inbox.put(hb("b", 1.0)).unwrap(), Put::New);
        let full = inbox.put(hb("c", 1.0)).unwrap_err();
        assert_eq!(full.capacity, 2);
        assert!(full.to_string().contains("2 agents"), "{full}");
        // A waiting agent's newer heartbeat still gets in when full.
        assert_eq!(inbox.put(hb("b", 2.0)).unwrap(), Put::Superseded);
        assert_eq!(inbox.len(), 2);
        let mut taken = inbox.take();
        taken.sort_by(|x, y| x.agent_id.cmp(&y.agent_id));
        assert_eq!(
            taken
                .iter()
                .map(|h| (h.agent_id.as_str(), h.ts))
                .collect::<Vec<_>>(),
            vec![("a", 3.0), ("b", 2.0)]
        );
        assert!(inbox.is_empty());
        assert_eq!(inbox.put(hb("c", 1.0)).unwrap(), Put::New);
    }
}

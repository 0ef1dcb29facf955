//! The manager's event stream: every session status change, image pull progress and agent
//! liveness change this replica makes, fanned out to the `GET /v1/events` subscribers and kept
//! in a ring of the most recent ones.
//!
//! Fed at the places that make the changes, after they commit: the store's kernel status
//! writes (`store/kernels.rs`, `store/events.rs`, `store/agents.rs`: one choke point for every
//! caller, scheduler, registry and event intake alike) and the registry's liveness transitions
//! (`registry/mod.rs`). A change another replica makes is on that replica's stream only.
//!
//! Memory is bounded whatever the readers do: the ring holds `history` events, each subscriber
//! a queue of `queue` events. [`EventHub::publish`] never waits: a subscriber whose queue is
//! full is dropped on the spot (its queue still drains to the reader, then one
//! [`EventType::Dropped`] event ends its stream), so one slow reader costs at most its queue and
//! never slows the store's callers or the other readers.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::mpsc;

use super::metrics::ManagerMetrics;
use crate::model::event::{Event, EventType};

/// Ring and queue sizes (`[events] history`, `[events] queue`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HubSpec {
    /// Most recent events kept for `GET /v1/events` without `follow`, for a follower's first
    /// lines, and for `Last-Event-ID` resumes.
    pub history: usize,
    /// Events one subscriber may have queued unread before it is dropped (at least 1).
    pub queue: usize,
}

impl Default for HubSpec {
    fn default() -> Self {
        HubSpec {
            history: 1000,
            queue: 256,
        }
    }
}

/// Which events a reader sees: what its key may see, narrowed by its filters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Filter {
    /// `None`: an admin, who sees every event; `Some(key)`: only sessions `key` owns (agent
    /// liveness is an admin's concern: a user key sees no `agent_status`).
    pub owner: Option<String>,
    /// Only this session's events (its session id or its kernel id).
    pub session_id: Option<String>,
    /// Only events about sessions on, or the liveness of, this agent.
    pub agent_id: Option<String>,
    /// Only these types; empty: every type.
    pub types: Vec<EventType>,
}

impl Filter {
    /// Whether `e` passes.
    pub fn matches(&self, e: &Event) -> bool {
        let is = |want: &Option<String>, have: &Option<String>| {
            want.as_ref().is_none_or(|w| have.as_ref() == Some(w))
        };
        is(&self.owner, &e.access_key)
            && (is(&self.session_id, &e.session_id) || is(&self.session_id, &e.kernel_id))
            && is(&self.agent_id, &e.agent_id)
            && (self.types.is_empty() || e.kind.is_some_and(|k| self.types.contains(&k)))
    }
}

/// The fan-out. Cheap to clone (one shared state); every clone publishes to the same readers.
#[derive(Clone)]
pub struct EventHub {
    shared: Arc<Mutex<Shared>>,
    spec: HubSpec,
    metrics: Option<Arc<ManagerMetrics>>,
}

impl std::fmt::Debug for EventHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventHub")
            .field("spec", &self.spec)
            .finish()
    }
}

struct Shared {
    next_id: u64,
    ring: VecDeque<Arc<Event>>,
    subscribers: Vec<Subscriber>,
    next_subscriber: u64,
}

struct Subscriber {
    id: u64,
    filter: Filter,
    tx: mpsc::Sender<Arc<Event>>,
    state: Arc<SubscriberState>,
}

/// What the publisher and the reader of one subscription share.
#[derive(Default)]
struct SubscriberState {
    /// Set by the publisher when the queue was full: the reader ends with a `dropped` event.
    overflowed: AtomicBool,
    /// The newest event id put in the queue (the `dropped` event names it).
    last_queued: AtomicU64,
}

impl EventHub {
    /// A hub with `spec`'s bounds, counting into `metrics` when given. Ids start at the wall
    /// clock in microseconds, so a restarted manager's ids stay above its predecessor's.
    pub fn new(spec: HubSpec, metrics: Option<Arc<ManagerMetrics>>) -> EventHub {
        let start = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_micros() as u64);
        EventHub {
            shared: Arc::new(Mutex::new(Shared {
                next_id: start,
                ring: VecDeque::with_capacity(spec.history.min(4096)),
                subscribers: Vec::new(),
                next_subscriber: 0,
            })),
            spec: HubSpec {
                history: spec.history,
                queue: spec.queue.max(1),
            },
            metrics,
        }
    }

    /// Stamps `event` with the next id and the time now, keeps it in the ring and queues it for
    /// every subscriber whose filter it passes. Never waits; a subscriber whose queue is full is
    /// dropped (see the module doc).
    pub fn publish(&self, mut event: Event) {
        event.time = unix_now();
        let mut shared = self.shared.lock().expect("event hub lock");
        event.id = shared.next_id;
        shared.next_id += 1;
        let event = Arc::new(event);
        if self.spec.history > 0 {
            if shared.ring.len() == self.spec.history {
                shared.ring.pop_front();
            }
            shared.ring.push_back(event.clone());
        }
        let mut dropped = 0;
        shared.subscribers.retain(|s| {
            if !s.filter.matches(&event) {
                return true;
            }
            match s.tx.try_send(event.clone()) {
                Ok(()) => {
                    s.state.last_queued.store(event.id, Ordering::Relaxed);
                    true
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    // Dropping the sender ends the reader's queue after what it holds.
                    s.state.overflowed.store(true, Ordering::Relaxed);
                    dropped += 1;
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        });
        drop(shared);
        if let Some(m) = &self.metrics {
            m.events_published.inc();
            m.event_subscribers_dropped.inc_by(dropped);
        }
        if dropped > 0 {
            tracing::info!(
                dropped,
                queue = self.spec.queue,
                "event stream readers fell a whole queue behind: dropped"
            );
        }
    }

    /// The ring's events that pass `filter`, oldest first, after id `after` when given.
    pub fn recent(&self, filter: &Filter, after: Option<u64>) -> Vec<Arc<Event>> {
        let shared = self.shared.lock().expect("event hub lock");
        backlog(&shared, filter, after)
    }

    /// Starts following: `backlog` (when `with_backlog`: the ring's events passing `filter`,
    /// after `after` when given) and then every new event passing it, with nothing lost or
    /// repeated in between (both are taken under one lock).
    pub fn subscribe(
        &self,
        filter: Filter,
        with_backlog: bool,
        after: Option<u64>,
    ) -> Subscription {
        let (tx, rx) = mpsc::channel(self.spec.queue);
        let state = Arc::new(SubscriberState::default());
        let mut shared = self.shared.lock().expect("event hub lock");
        let backlog = if with_backlog {
            backlog(&shared, &filter, after)
        } else {
            Vec::new()
        };
        let id = shared.next_subscriber;
        shared.next_subscriber += 1;
        if let Some(last) = backlog.last() {
            state.last_queued.store(last.id, Ordering::Relaxed);
        }
        shared.subscribers.push(Subscriber {
            id,
            filter,
            tx,
            state: state.clone(),
        });
        drop(shared);
        if let Some(m) = &self.metrics {
            m.event_subscribers.inc();
        }
        Subscription {
            backlog: backlog.into(),
            rx,
            state,
            id,
            hub: Arc::downgrade(&self.shared),
            metrics: self.metrics.clone(),
            queue: self.spec.queue,
            ended: false,
        }
    }

    /// Subscribers following now (tests, diagnostics).
    pub fn subscribers(&self) -> usize {
        self.shared
            .lock()
            .expect("event hub lock")
            .subscribers
            .len()
    }
}

/// Unix seconds now (the hub's own: the store, which publishes here, is not its dependency).
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn backlog(shared: &Shared, filter: &Filter, after: Option<u64>) -> Vec<Arc<Event>> {
    shared
        .ring
        .iter()
        .filter(|e| after.is_none_or(|a| e.id > a) && filter.matches(e))
        .cloned()
        .collect()
}

/// One reader's stream: its backlog, then its queue, then, if it was dropped, one `dropped`
/// event. Dropping it unsubscribes.
pub struct Subscription {
    backlog: VecDeque<Arc<Event>>,
    rx: mpsc::Receiver<Arc<Event>>,
    state: Arc<SubscriberState>,
    id: u64,
    hub: Weak<Mutex<Shared>>,
    metrics: Option<Arc<ManagerMetrics>>,
    queue: usize,
    ended: bool,
}

impl Subscription {
    /// The next event; `None` once the stream is over (after a `dropped` event, or when the hub
    /// is gone).
    pub async fn next(&mut self) -> Option<Arc<Event>> {
        if let Some(e) = self.backlog.pop_front() {
            return Some(e);
        }
        if self.ended {
            return None;
        }
        match self.rx.recv().await {
            Some(e) => Some(e),
            None => {
                self.ended = true;
                self.state
                    .overflowed
                    .load(Ordering::Relaxed)
                    .then(|| Arc::new(self.dropped_event()))
            }
        }
    }

    /// The last event of a dropped stream: the id of the last event it got (so that
    /// `Last-Event-ID` resumes right after it) and why, in words.
    fn dropped_event(&self) -> Event {
        let last = self.state.last_queued.load(Ordering::Relaxed);
        Event {
            id: last,
            time: unix_now(),
            reason: Some(format!(
                "reader-too-slow: {} events were waiting unread; events after id {last} are not \
                 on this stream (reconnect with Last-Event-ID: {last} to resume from the ones \
                 the manager still keeps)",
                self.queue
            )),
            ..Event::of(EventType::Dropped)
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if let Some(shared) = self.hub.upgrade() {
            let mut shared = shared.lock().expect("event hub lock");
            shared.subscribers.retain(|s| s.id != self.id);
        }
        if let Some(m) = &self.metrics {
            m.event_subscribers.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::session::KernelStatus;

    fn status(session: &str, owner: &str, status: &str) -> Event {
        Event {
            session_id: Some(session.into()),
            kernel_id: Some(format!("k-{session}")),
            agent_id: Some("a1".into()),
            access_key: Some(owner.into()),
            status: Some(status.into()),
            ..Event::of(EventType::SessionStatus)
        }
    }

    fn hub(history: usize, queue: usize) -> EventHub {
        EventHub::new(HubSpec { history, queue }, None)
    }

    #[actix_rt::test]
    async fn a_follower_gets_the_backlog_then_new_events_in_order() {
        let hub = hub(10, 10);
        hub.publish(status("s1", "AK1", KernelStatus::Pending.as_str()));
        let mut sub = hub.subscribe(Filter::default(), true, None);
        hub.publish(status("s1", "AK1", KernelStatus::Running.as_str()));
        let a = sub.next().await.unwrap();
        let b = sub.next().await.unwrap();
        assert_eq!(a.status.as_deref(), Some(KernelStatus::Pending.as_str()));
        assert_eq!(b.status.as_deref(), Some(KernelStatus::Running.as_str()));
        assert_eq!(b.id, a.id + 1);
        assert!(b.time >= a.time && a.time > 0.0);
        // Resuming after `a` gives `b` only.
        let later = hub.recent(&Filter::default(), Some(a.id));
        assert_eq!(later.iter().map(|e| e.id).collect::<Vec<_>>(), vec![b.id]);
    }

    #[test]
    fn the_ring_keeps_only_the_newest() {
        let hub = hub(3, 10);
        for s in ["A", "B", "C", "D", "E"] {
            hub.publish(status("s1", "AK1", s));
        }
        let kept: Vec<_> = hub
            .recent(&Filter::default(), None)
            .iter()
            .map(|e| e.status.clone().unwrap())
            .collect();
        assert_eq!(kept, ["C", "D", "E"]);
    }

    #[test]
    fn filters_narrow_and_users_see_only_their_sessions() {
        let mut agent = Event::of(EventType::AgentStatus);
        agent.agent_id = Some("a1".into());
        let mine = status("s1", "AK1", KernelStatus::Running.as_str());
        let theirs = status("s2", "AK2", KernelStatus::Running.as_str());
        let user = Filter {
            owner: Some("AK1".into()),
            ..Filter::default()
        };
        assert!(user.matches(&mine));
        assert!(!user.matches(&theirs));
        assert!(!user.matches(&agent), "agent liveness is for admins");
        let admin = Filter::default();
        assert!(admin.matches(&agent) && admin.matches(&theirs));
        let by_session = Filter {
            session_id: Some("s2".into()),
            ..Filter::default()
        };
        assert!(by_session.matches(&theirs) && !by_session.matches(&mine));
        let by_kernel = Filter {
            session_id: Some("k-s1".into()),
            ..Filter::default()
        };
        assert!(by_kernel.matches(&mine) && !by_kernel.matches(&theirs));
        let by_agent = Filter {
            agent_id: Some("a2".into()),
            ..Filter::default()
        };
        assert!(!by_agent.matches(&mine) && !by_agent.matches(&agent));
        let by_type = Filter {
            types: vec![EventType::AgentStatus],
            ..Filter::default()
        };
        assert!(by_type.matches(&agent) && !by_type.matches(&mine));
    }

    #[actix_rt::test]
    async fn a_reader_a_queue_behind_is_dropped_with_a_last_event() {
        let hub = hub(100, 4);
        let mut slow = hub.subscribe(Filter::default(), false, None);
        let mut quick = hub.subscribe(Filter::default(), false, None);
        for i in 0..10 {
            hub.publish(status("s1", "AK1", &format!("S{i}")));
            // The quick reader keeps up, and is never dropped.
            assert_eq!(
                quick.next().await.unwrap().status.as_deref(),
                Some(format!("S{i}").as_str())
            );
        }
        assert_eq!(hub.subscribers(), 1, "the slow reader left the hub");
        let mut got = Vec::new();
        while let Some(e) = slow.next().await {
            got.push(e);
        }
        // Its queue (4 events), then `dropped` naming the last of them.
        assert_eq!(got.len(), 5);
        let last = got.last().unwrap();
        assert_eq!(last.kind, Some(EventType::Dropped));
        assert_eq!(last.id, got[3].id);
        assert!(last
            .reason
            .as_deref()
            .unwrap()
            .starts_with("reader-too-slow"));
        assert!(slow.next().await.is_none());
        drop(quick);
        assert_eq!(hub.subscribers(), 0, "a dropped subscription unsubscribes");
    }
}

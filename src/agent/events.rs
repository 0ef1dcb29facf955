//! Agent events (Backend.AI's names) and the in-process bus they are published on.
//!
//! Kernel actors publish every status transition here. With a manager configured, every event
//! also goes to the outbox writer (outbox.rs), which makes it durable before the event sender
//! (event_sender.rs) delivers it; subscribers (tests) each get every event in order. The wire
//! encoding is in `docs/events.md`; the event type itself is the intake's wire type
//! ([`crate::rpc::intake_api::events`]), which the manager reads.

use tokio::sync::{broadcast, mpsc};

pub use crate::rpc::intake_api::events::{AgentEvent, StartedInfo, StartedServicePort, UsedDevice};

/// Fan-out of [`AgentEvent`]s: to the outbox writer when there is one (nothing lost), and to
/// every subscriber (one that falls more than 4096 events behind loses the oldest: it sees
/// `Lagged`).
#[derive(Clone, Debug)]
pub struct EventBus {
    subscribers: broadcast::Sender<AgentEvent>,
    outbox: Option<mpsc::UnboundedSender<Queued>>,
}

/// An event on its way to the outbox writer, which drops a kernel status repeating the
/// kernel's last one unless it is sent `again` on purpose ([`EventBus::emit_again`]).
#[derive(Clone, Debug)]
pub struct Queued {
    /// The event.
    pub event: AgentEvent,
    /// A deliberate re-send: kept even when it repeats its kernel's last state.
    pub again: bool,
}

impl Default for EventBus {
    fn default() -> Self {
        EventBus {
            subscribers: broadcast::channel(4096).0,
            outbox: None,
        }
    }
}

impl EventBus {
    /// A bus that also feeds the outbox writer through `outbox`.
    pub fn with_outbox(outbox: mpsc::UnboundedSender<Queued>) -> Self {
        EventBus {
            outbox: Some(outbox),
            ..EventBus::default()
        }
    }

    /// Publishes `event` to the outbox writer and the current subscribers (none is fine).
    pub fn emit(&self, event: AgentEvent) {
        self.publish(event, false);
    }

    /// Publishes `event` as [`EventBus::emit`] does, and delivers it even when it repeats its
    /// kernel's last state: `kernel_started` sent again for a `create_kernels` retry.
    pub fn emit_again(&self, event: AgentEvent) {
        self.publish(event, true);
    }

    fn publish(&self, event: AgentEvent, again: bool) {
        tracing::debug!(
            event = event.name(),
            kernel_id = event.kernel_id(),
            again,
            ?event,
            "event"
        );
        if let Some(outbox) = &self.outbox {
            let queued = Queued {
                event: event.clone(),
                again,
            };
            if outbox.send(queued).is_err() {
                tracing::warn!(
                    event = event.name(),
                    kernel_id = event.kernel_id(),
                    "event emitted after the outbox writer stopped: not delivered"
                );
            }
        }
        let _ = self.subscribers.send(event);
    }

    /// A new subscriber, seeing events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<AgentEvent> {
        self.subscribers.subscribe()
    }
}

//! Which manager intake the agent talks to (`[manager] event-addrs`): one at a time,
//! shared by the event sender and the heartbeat loop, moving round-robin to the next when the
//! current one stops answering (as Nomad clients rotate through their server list).

use std::sync::atomic::{AtomicUsize, Ordering};

/// The intake endpoints and the one in use. Shared (`Arc`) by the senders.
#[derive(Debug)]
pub struct Intakes {
    endpoints: Vec<String>,
    current: AtomicUsize,
}

impl Intakes {
    /// Over `endpoints` (`tcp://host:port`, at least one), starting with the first.
    pub fn new(endpoints: Vec<String>) -> Intakes {
        assert!(!endpoints.is_empty(), "at least one intake endpoint");
        Intakes {
            endpoints,
            current: AtomicUsize::new(0),
        }
    }

    /// The intake in use: `(index, endpoint)`.
    pub fn current(&self) -> (usize, &str) {
        let i = self.current.load(Ordering::Acquire) % self.endpoints.len();
        (i, &self.endpoints[i])
    }

    /// Every endpoint, in order.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The intake at `index` stopped answering: moves to the next one, unless another sender
    /// already moved on from it (so two senders seeing one outage move once). Returns whether
    /// this call moved.
    pub fn failed(&self, index: usize) -> bool {
        let n = self.endpoints.len();
        if n == 1 {
            return false;
        }
        let next = (index + 1) % n;
        let moved = self
            .current
            .compare_exchange(index, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if moved {
            tracing::warn!(from = %self.endpoints[index], to = %self.endpoints[next], "manager intake not answering: failing over to the next");
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::Intakes;

    #[test]
    fn fails_over_round_robin_once_per_outage() {
        let i = Intakes::new(vec!["a".into(), "b".into(), "c".into()]);
        assert_eq!(i.current(), (0, "a"));
        assert!(i.failed(0));
        // The heartbeat loop saw the same outage of `a`: no second move.
        assert!(!i.failed(0));
        assert_eq!(i.current(), (1, "b"));
        assert!(i.failed(1));
        assert!(i.failed(2));
        assert_eq!(i.current(), (0, "a"));
        let one = Intakes::new(vec!["only".into()]);
        assert!(!one.failed(0));
        assert_eq!(one.current(), (0, "only"));
    }
}

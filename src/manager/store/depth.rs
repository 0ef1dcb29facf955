//! The queue's depth per priority, in memory: where a session just queued stands
//! ([`super::Store::new_queue_position`]) without counting the sessions ahead of it in the
//! database per create (with 100,000 queued that count was milliseconds of SQLite's one
//! connection per create).
//!
//! Installed from the database by every `queue_depth` read, made when it is older than the
//! refresh period (by a new session's position, or an admission round's gauge:
//! [`super::Store::queue_depth_cached`]); moved by this replica's own enqueues, admissions and
//! cancels in between. So on one manager it is what the database
//! holds, give or take a change that committed while a read was under way (until the next
//! read); with several replicas, what the others did since the last read is missing. The
//! session's own `queue_position` (`GET /v1/sessions/{id}`) is always counted in the database.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug, Default)]
struct Inner {
    /// priority → queued sessions.
    counts: BTreeMap<i64, i64>,
    read_at: Option<Instant>,
}

/// Queued sessions per priority (shared by the store's clones).
#[derive(Debug)]
pub(super) struct Depth {
    inner: Mutex<Inner>,
    refresh: Duration,
}

impl Depth {
    /// Unread (the first position asked reads it), re-read when older than `refresh`.
    pub(super) fn new(refresh: Duration) -> Depth {
        Depth {
            inner: Mutex::new(Inner::default()),
            refresh,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Replaces the counts with a read of the database (`(priority, count)`).
    pub(super) fn install(&self, read: &[(i64, i64)]) {
        let mut inner = self.lock();
        inner.counts = read.iter().copied().filter(|(_, n)| *n > 0).collect();
        inner.read_at = Some(Instant::now());
    }

    /// One more (`+1`) or one fewer (`-1`) session queued at `priority`.
    pub(super) fn add(&self, priority: i64, delta: i64) {
        let mut inner = self.lock();
        let n = inner.counts.entry(priority).or_default();
        *n = (*n + delta).max(0);
        if *n == 0 {
            inner.counts.remove(&priority);
        }
    }

    /// Every priority's count, highest first, `None` when the counts must be read first.
    pub(super) fn counts(&self) -> Option<Vec<(i64, i64)>> {
        let inner = self.lock();
        let fresh = inner.read_at.is_some_and(|at| at.elapsed() < self.refresh);
        fresh.then(|| inner.counts.iter().rev().map(|(p, n)| (*p, *n)).collect())
    }

    /// Sessions queued at `priority` or higher, `None` when the counts must be read first.
    pub(super) fn at_or_above(&self, priority: i64) -> Option<i64> {
        let inner = self.lock();
        let fresh = inner.read_at.is_some_and(|at| at.elapsed() < self.refresh);
        fresh.then(|| inner.counts.range(priority..).map(|(_, n)| n).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_move_with_the_queue_and_go_stale() {
        let d = Depth::new(Duration::from_secs(60));
        assert_eq!(d.at_or_above(10), None, "never read");
        d.install(&[(50, 1), (10, 3), (0, 0)]);
        assert_eq!(d.at_or_above(10), Some(4));
        assert_eq!(d.at_or_above(11), Some(1));
        d.add(10, 1);
        d.add(50, -1);
        d.add(50, -1); // never below zero
        assert_eq!(d.at_or_above(0), Some(4));
        assert_eq!(d.at_or_above(11), Some(0));
        d.add(90, 2);
        assert_eq!(d.counts(), Some(vec![(90, 2), (10, 4)]), "highest first");
        let d = Depth::new(Duration::ZERO);
        d.install(&[(10, 1)]);
        assert_eq!(d.at_or_above(10), None, "stale at once");
        assert_eq!(d.counts(), None);
    }
}

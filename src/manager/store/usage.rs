//! The usage ledger: every placed live kernel's slots, summed per agent and per access key, in
//! memory, so that placing a session and planning an admission round do not read every live
//! kernel from the database (at 10,000 agents that read was most of a create's time and every
//! round's: `docs/benchmarks.md`, `just bench scheduler`).
//!
//! The store keeps it exact for this replica's own writes: a reservation or an admission adds
//! its kernel once committed ([`Ledger::add`]), and every end of a placed kernel passes
//! `Store::publish` (its `TERMINATED` event), which removes it ([`Ledger::remove`]). Other
//! replicas' writes (PostgreSQL) arrive by a full reload from the database when the ledger is
//! older than its refresh period (1 s on PostgreSQL; 60 s on SQLite, where one manager holds
//! the file and the reload only backstops a write whose outcome was unknown).
//!
//! Changes made while a reload reads are replayed on top of what it read (keyed by kernel, so a
//! change the read already saw is a no-op). The ledger only guides placement: a reservation and
//! an admission re-check the agent's room in their transaction (`check_room_in`), so a stale
//! ledger costs a lost race or a session queued a moment longer, never an overcommit.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::slots::ResourceSlots;

/// Slots placed on one agent (or by one access key) by the manager: the sum of its live
/// kernels' `resource_slots`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Every slot any of its live kernels holds, summed exactly.
    pub slots: ResourceSlots,
    /// Live kernels.
    pub kernels: i64,
}

/// One placed live kernel as the ledger holds it.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Placed {
    /// The agent it is placed on.
    pub(super) agent_id: String,
    /// Its owner.
    pub(super) access_key: String,
    /// What it holds.
    pub(super) slots: ResourceSlots,
}

/// A change to the ledger, recorded while a reload reads.
#[derive(Clone, Debug)]
enum Change {
    Add(String, Placed),
    Remove(String),
}

#[derive(Default)]
struct Inner {
    kernels: HashMap<String, Placed>,
    by_agent: HashMap<String, Usage>,
    by_key: HashMap<String, Usage>,
    /// When the last reload finished; `None` before the first.
    loaded_at: Option<Instant>,
    /// `Some` while a reload reads: the changes made meanwhile.
    replay: Option<Vec<Change>>,
}

/// Takes one kernel's `slots` out of `map[id]`, dropping the entry with its last kernel (so that
/// the sums stay exact: nothing is left behind by saturating).
fn take(map: &mut HashMap<String, Usage>, id: &str, slots: &ResourceSlots) {
    if let Some(u) = map.get_mut(id) {
        u.kernels -= 1;
        if u.kernels <= 0 {
            map.remove(id);
        } else {
            // A slot the agent no longer holds any of is gone from the sum, as in a sum of
            // the kernels left.
            u.slots = u
                .slots
                .saturating_sub(slots)
                .nonzero()
                .map(|(k, v)| (k.to_owned(), v))
                .collect();
        }
    }
}

impl Inner {
    fn add(&mut self, kernel_id: String, p: Placed) {
        if self.kernels.contains_key(&kernel_id) {
            return;
        }
        let u = self.by_agent.entry(p.agent_id.clone()).or_default();
        // Saturates rather than fails: a sum past 1.8e16 units is no real agent.
        u.slots = u
            .slots
            .checked_add(&p.slots)
            .unwrap_or_else(|_| u.slots.clone());
        u.kernels += 1;
        let k = self.by_key.entry(p.access_key.clone()).or_default();
        k.slots = k
            .slots
            .checked_add(&p.slots)
            .unwrap_or_else(|_| k.slots.clone());
        k.kernels += 1;
        self.kernels.insert(kernel_id, p);
    }

    fn remove(&mut self, kernel_id: &str) {
        let Some(p) = self.kernels.remove(kernel_id) else {
            return;
        };
        take(&mut self.by_agent, &p.agent_id, &p.slots);
        take(&mut self.by_key, &p.access_key, &p.slots);
    }

    fn apply(&mut self, c: Change) {
        if let Some(replay) = self.replay.as_mut() {
            replay.push(c.clone());
        }
        match c {
            Change::Add(id, p) => self.add(id, p),
            Change::Remove(id) => self.remove(&id),
        }
    }
}

/// The ledger (cheap to share: the store holds it in an `Arc`).
pub(super) struct Ledger {
    inner: Mutex<Inner>,
    /// Past this age, the next read reloads from the database.
    refresh: Duration,
    /// One reload at a time; a reader that finds one running waits for it.
    reloading: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

/// Ends a reload: the replay log is dropped if the reload did not finish (its future was
/// dropped or the read failed), so it cannot grow unread.
pub(super) struct Reload<'a> {
    ledger: &'a Ledger,
    _turn: tokio::sync::MutexGuard<'a, ()>,
    done: bool,
}

impl Reload<'_> {
    /// Installs what the reload read (`(kernel id, placed)` for every placed live kernel), then
    /// replays the changes made while it read.
    pub(super) fn finish(mut self, rows: Vec<(String, Placed)>) {
        let mut inner = self.ledger.lock();
        let replay = inner.replay.take().unwrap_or_default();
        let mut fresh = Inner::default();
        for (id, p) in rows {
            fresh.add(id, p);
        }
        for c in replay {
            fresh.apply(c);
        }
        fresh.loaded_at = Some(Instant::now());
        *inner = fresh;
        self.done = true;
    }
}

impl Drop for Reload<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.ledger.lock().replay = None;
        }
    }
}

impl Ledger {
    /// An empty ledger that reloads when older than `refresh` (and on its first read).
    pub(super) fn new(refresh: Duration) -> Ledger {
        Ledger {
            inner: Mutex::new(Inner::default()),
            refresh,
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding it leaves sums that are at worst stale: the next reload fixes
        // them.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn stale(&self) -> bool {
        self.lock()
            .loaded_at
            .is_none_or(|at| at.elapsed() >= self.refresh)
    }

    /// `Some` when the ledger needs a reload and this caller is to do it (read every placed
    /// live kernel, then [`Reload::finish`]); `None` when it is fresh, possibly because the
    /// reload this caller waited for just finished.
    pub(super) async fn begin_reload(&self) -> Option<Reload<'_>> {
        if !self.stale() {
            return None;
        }
        let turn = self.reloading.lock().await;
        if !self.stale() {
            return None;
        }
        self.lock().replay = Some(Vec::new());
        Some(Reload {
            ledger: self,
            _turn: turn,
            done: false,
        })
    }

    /// Makes the next read reload (a reservation found the agent fuller than the ledger said:
    /// another replica placed there).
    pub(super) fn expire(&self) {
        self.lock().loaded_at = None;
    }

    /// A kernel placed on an agent (reserved or admitted), once committed.
    pub(super) fn add(&self, kernel_id: &str, p: Placed) {
        self.lock().apply(Change::Add(kernel_id.to_owned(), p));
    }

    /// A kernel that left the live set, once committed (unknown ids are ignored).
    pub(super) fn remove(&self, kernel_id: &str) {
        self.lock().apply(Change::Remove(kernel_id.to_owned()));
    }

    /// Runs `f` over the usage by agent (without copying it).
    pub(super) fn with_by_agent<R>(&self, f: impl FnOnce(&HashMap<String, Usage>) -> R) -> R {
        f(&self.lock().by_agent)
    }

    /// The slots each access key's placed live kernels hold.
    pub(super) fn by_key(&self) -> HashMap<String, ResourceSlots> {
        self.lock()
            .by_key
            .iter()
            .map(|(k, u)| (k.clone(), u.slots.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::Amount;

    fn cpu(n: i64) -> ResourceSlots {
        let mut s = ResourceSlots::new();
        s.set("cpu", Amount::parse(&n.to_string()).unwrap());
        s
    }

    fn placed(agent: &str, key: &str, n: i64) -> Placed {
        Placed {
            agent_id: agent.into(),
            access_key: key.into(),
            slots: cpu(n),
        }
    }

    fn usage(l: &Ledger, agent: &str) -> Option<Usage> {
        l.with_by_agent(|m| m.get(agent).cloned())
    }

    #[test]
    fn sums_per_agent_and_key_and_forgets_ended_kernels() {
        let l = Ledger::new(Duration::from_secs(60));
        l.add("k1", placed("a", "AK", 1));
        l.add("k2", placed("a", "BK", 2));
        l.add("k2", placed("a", "BK", 2)); // twice: counted once
        l.add("k3", placed("b", "AK", 4));
        assert_eq!(
            usage(&l, "a"),
            Some(Usage {
                slots: cpu(3),
                kernels: 2
            })
        );
        assert_eq!(l.by_key().get("AK"), Some(&cpu(5)));
        l.remove("k2");
        l.remove("k2"); // twice: no-op
        l.remove("nobody");
        assert_eq!(
            usage(&l, "a"),
            Some(Usage {
                slots: cpu(1),
                kernels: 1
            })
        );
        assert_eq!(l.by_key().get("BK"), None);
        l.remove("k1");
        assert_eq!(usage(&l, "a"), None);
        assert_eq!(l.by_key().get("AK"), Some(&cpu(4)));
    }

    /// A change made while a reload reads is kept whichever way the read saw it; a reload that
    /// does not finish leaves the ledger as it was and stops recording.
    #[actix_rt::test]
    async fn changes_during_a_reload_are_replayed() {
        let l = Ledger::new(Duration::from_secs(60));
        let r = l.begin_reload().await.expect("first read reloads");
        // Committed after the read: absent from the rows.
        l.add("late", placed("a", "AK", 2));
        // Committed before the read and ended after it: in the rows, then removed.
        l.remove("gone");
        r.finish(vec![
            ("old".into(), placed("a", "AK", 1)),
            ("gone".into(), placed("b", "AK", 8)),
        ]);
        assert_eq!(
            usage(&l, "a"),
            Some(Usage {
                slots: cpu(3),
                kernels: 2
            })
        );
        assert_eq!(usage(&l, "b"), None);
        assert!(l.begin_reload().await.is_none(), "fresh for 60 s");

        let l = Ledger::new(Duration::ZERO);
        l.add("k", placed("a", "AK", 1));
        drop(l.begin_reload().await.expect("stale"));
        assert!(l.lock().replay.is_none());
        assert_eq!(usage(&l, "a").map(|u| u.kernels), Some(1));
    }
}

//! Background tasks of the image methods `commit`, `push_image` and `check_and_pull`, as
//! upstream's `BackgroundTaskManager` runs them (`ai/backend/common/bgtask/bgtask.py`): the call
//! answers at once with the task's id (`bgtask_id`, a UUID), the work goes on in a tokio task,
//! and its state ([`BgtaskState`]) is kept here for `get_commit_status`, kernelvisor's
//! `get_bgtask`, and the `valkey` child, which tells Backend.AI's manager of each start and end
//! (`bgtask_updated`, `bgtask_done`, `bgtask_failed`) and of each commit in progress
//! ([`Bgtasks::changed`] wakes it).
//!
//! The table is in memory: an agent restart forgets its tasks (and the engine finishes or
//! drops the request it was serving). A task that ended is forgotten after
//! [`RETENTION`]; at most [`MAX_TASKS`] are kept (the oldest ended ones go first).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::agent::backend::PullProgress;
use crate::rpc::agent_api::images::{BgtaskKind, BgtaskState, BgtaskStatus};

/// How long a task that ended stays answerable.
pub const RETENTION: Duration = Duration::from_secs(3600);

/// The most tasks kept; past it the oldest that ended are forgotten (running ones never).
pub const MAX_TASKS: usize = 1000;

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

#[derive(Debug)]
struct Entry {
    state: BgtaskState,
    /// The commit's `subdir` (commits only), for `get_commit_status`.
    subdir: Option<String>,
    /// Push progress: bytes done per layer, keyed by the layer's size (see [`Bgtasks::progress`]).
    layers: HashMap<i64, i64>,
}

/// The agent's background tasks; cheap to clone (one shared table).
#[derive(Clone, Debug, Default)]
pub struct Bgtasks {
    inner: Arc<Mutex<HashMap<String, Entry>>>,
    changed: Arc<tokio::sync::Notify>,
}

impl Bgtasks {
    fn table(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Resolves after a task started or ended since the last time it resolved (a stored
    /// permit: a change made while nobody waits is not missed).
    pub async fn changed(&self) {
        self.changed.notified().await;
    }

    /// Every task kept, in no order.
    pub fn snapshot(&self) -> Vec<BgtaskState> {
        self.table().values().map(|e| e.state.clone()).collect()
    }

    /// Records a new running push of `image`; returns its id (a fresh UUID).
    pub fn start_push(&self, image: &str) -> String {
        self.start(BgtaskKind::Push, image)
    }

    /// Records a new running pull (`check_and_pull`) of `image`; returns its id.
    pub fn start_pull(&self, image: &str) -> String {
        self.start(BgtaskKind::Pull, image)
    }

    fn start(&self, kind: BgtaskKind, image: &str) -> String {
        let id = uuid::Uuid::new_v4().to_string();
        let at = now();
        let state = BgtaskState {
            bgtask_id: id.clone(),
            kind,
            image: image.to_owned(),
            status: BgtaskStatus::Ongoing,
            started_at: at,
            ..BgtaskState::default()
        };
        let mut table = self.table();
        prune(&mut table, at);
        table.insert(
            id.clone(),
            Entry {
                state,
                subdir: None,
                layers: HashMap::new(),
            },
        );
        drop(table);
        self.changed.notify_one();
        id
    }

    /// Records a commit of `kernel` under `subdir` as `image`: `Ok(id)` of a new running task,
    /// or, while another commit of that kernel and `subdir` runs, `Err(id)` of a task recorded
    /// as failed with `error_name` and a message saying so (upstream's commit lock does the
    /// same: the second task fails). Checked and recorded at once, so two concurrent calls
    /// never both run.
    pub fn start_commit(
        &self,
        image: &str,
        kernel: &str,
        subdir: &str,
        error_name: &str,
    ) -> Result<String, String> {
        let mut table = self.table();
        let busy = ongoing(&table, kernel, subdir);
        let id = uuid::Uuid::new_v4().to_string();
        let at = now();
        prune(&mut table, at);
        let mut state = BgtaskState {
            bgtask_id: id.clone(),
            kind: BgtaskKind::Commit,
            image: image.to_owned(),
            kernel: Some(kernel.to_owned()),
            status: BgtaskStatus::Ongoing,
            started_at: at,
            ..BgtaskState::default()
        };
        if busy {
            state.status = BgtaskStatus::Failed;
            state.error_name = Some(error_name.to_owned());
            state.message = Some(format!(
                "a commit of kernel {kernel} ({subdir}) is already in progress"
            ));
            state.finished_at = Some(at);
        }
        table.insert(
            id.clone(),
            Entry {
                state,
                subdir: Some(subdir.to_owned()),
                layers: HashMap::new(),
            },
        );
        drop(table);
        self.changed.notify_one();
        if busy {
            Err(id)
        } else {
            Ok(id)
        }
    }

    /// Whether a commit of `kernel` under `subdir` is running.
    pub fn commit_ongoing(&self, kernel: &str, subdir: &str) -> bool {
        ongoing(&self.table(), kernel, subdir)
    }

    /// Counts one engine progress line of a push: a `Pushing` line's bytes (`current` of
    /// `total`) are the progress of the layer of that size (the engine's push lines, as
    /// bollard reads them, do not name their layer; two layers of exactly one size count
    /// once); `current_bytes` and `total_bytes` are the sums over the layers seen.
    pub fn progress(&self, id: &str, p: &PullProgress) {
        let (Some(current), Some(total)) = (p.current, p.total) else {
            return;
        };
        if total <= 0 {
            return;
        }
        let mut table = self.table();
        let Some(e) = table.get_mut(id) else { return };
        let done = e.layers.entry(total).or_default();
        *done = (*done).max(current.clamp(0, total));
        e.state.total_bytes = e.layers.keys().map(|&t| t as u64).sum();
        e.state.current_bytes = e.layers.values().map(|&c| c as u64).sum();
    }

    /// Marks the task done (with the committed image's id); every layer counted as sent.
    pub fn done(&self, id: &str, image_id: Option<String>) {
        self.finish(id, |s| {
            s.status = BgtaskStatus::Done;
            s.current_bytes = s.total_bytes;
            s.image_id = image_id;
        });
    }

    /// Marks the task failed with an error name (a [`Failure`](crate::rpc::Failure)'s, or a
    /// FAILURE's name passed on) and message.
    pub fn failed(&self, id: &str, error_name: impl Into<String>, message: String) {
        self.finish(id, |s| {
            s.status = BgtaskStatus::Failed;
            s.error_name = Some(error_name.into());
            s.message = Some(message);
        });
    }

    fn finish(&self, id: &str, f: impl FnOnce(&mut BgtaskState)) {
        if let Some(e) = self.table().get_mut(id) {
            f(&mut e.state);
            e.state.finished_at = Some(now());
        }
        self.changed.notify_one();
    }

    /// The task's state, or `None` when unknown.
    pub fn get(&self, id: &str) -> Option<BgtaskState> {
        let mut table = self.table();
        prune(&mut table, now());
        table.get(id).map(|e| e.state.clone())
    }
}

fn ongoing(table: &HashMap<String, Entry>, kernel: &str, subdir: &str) -> bool {
    table.values().any(|e| {
        e.state.kind == BgtaskKind::Commit
            && e.state.status == BgtaskStatus::Ongoing
            && e.state.kernel.as_deref() == Some(kernel)
            && e.subdir.as_deref() == Some(subdir)
    })
}

/// Forgets tasks that ended more than [`RETENTION`] ago, then the oldest ended ones while
/// more than [`MAX_TASKS`] - 1 are kept.
fn prune(table: &mut HashMap<String, Entry>, now: f64) {
    let horizon = now - RETENTION.as_secs_f64();
    table.retain(|_, e| e.state.finished_at.is_none_or(|t| t >= horizon));
    if table.len() < MAX_TASKS {
        return;
    }
    let mut ended: Vec<(f64, String)> = table
        .iter()
        .filter_map(|(id, e)| e.state.finished_at.map(|t| (t, id.clone())))
        .collect();
    ended.sort_by(|a, b| a.0.total_cmp(&b.0));
    let excess = table.len() + 1 - MAX_TASKS;
    for (_, id) in ended.into_iter().take(excess) {
        table.remove(&id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(current: i64, total: i64) -> PullProgress {
        PullProgress {
            status: "Pushing".into(),
            current: Some(current),
            total: Some(total),
            ..PullProgress::default()
        }
    }

    #[test]
    fn a_push_sums_its_layers_bytes() {
        let t = Bgtasks::default();
        let id = t.start_push("r/img:1");
        t.progress(&id, &line(100, 1000));
        t.progress(&id, &line(50, 300));
        t.progress(&id, &line(600, 1000));
        t.progress(&id, &line(400, 1000)); // never backwards
        t.progress(&id, &PullProgress::default()); // `Pushed`: no bytes
        let s = t.get(&id).unwrap();
        assert_eq!((s.current_bytes, s.total_bytes), (650, 1300));
        assert_eq!(s.status, BgtaskStatus::Ongoing);
        t.done(&id, None);
        let s = t.get(&id).unwrap();
        assert_eq!((s.current_bytes, s.total_bytes), (1300, 1300));
        assert_eq!(s.status, BgtaskStatus::Done);
        assert!(s.finished_at.is_some());
    }

    #[test]
    fn commits_are_ongoing_per_kernel_and_subdir() {
        let t = Bgtasks::default();
        let id = t.start_commit("r/img:1", "k1", "a_b.c", "Busy").unwrap();
        let second = t
            .start_commit("r/img:2", "k1", "a_b.c", "Busy")
            .unwrap_err();
        let s = t.get(&second).unwrap();
        assert_eq!(s.status, BgtaskStatus::Failed);
        assert_eq!(s.error_name.as_deref(), Some("Busy"));
        assert!(s.message.unwrap().contains("already in progress"));
        assert!(t.commit_ongoing("k1", "a_b.c"));
        assert!(!t.commit_ongoing("k1", "other"));
        assert!(!t.commit_ongoing("k2", "a_b.c"));
        t.failed(&id, "ContainerEngineError", "boom".into());
        assert!(!t.commit_ongoing("k1", "a_b.c"));
        let s = t.get(&id).unwrap();
        assert_eq!(s.error_name.as_deref(), Some("ContainerEngineError"));
        assert_eq!(s.kernel.as_deref(), Some("k1"));
        assert!(t.get("nope").is_none());
    }

    #[test]
    fn ended_tasks_are_forgotten_after_the_retention_or_past_the_cap() {
        let t = Bgtasks::default();
        let old = t.start_push("a");
        t.done(&old, None);
        t.table().get_mut(&old).unwrap().state.finished_at =
            Some(now() - RETENTION.as_secs_f64() - 1.0);
        let running = t.start_push("b");
        assert!(t.get(&old).is_none());
        for _ in 0..MAX_TASKS + 5 {
            let id = t.start_push("c");
            t.done(&id, None);
        }
        assert!(t.table().len() <= MAX_TASKS);
        assert!(
            t.get(&running).is_some(),
            "a running task is never forgotten"
        );
    }
}

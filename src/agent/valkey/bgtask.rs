//! Background tasks as upstream's `BackgroundTaskManager` tells them
//! (`ai/backend/common/bgtask/bgtask.py`), and commits in progress as `get_commit_status`
//! reads them.
//!
//! **Events.** A task's start is a `bgtask_updated` (`message` `"Task started"`, progress 0 of
//! 0), its end a `bgtask_done` (`message` null) or a `bgtask_failed` (`message` the error as
//! Python's `repr` writes it, `Name('…')`) — the event classes of
//! `ai/backend/common/events/event_types/bgtask/broadcast.py`. Each is broadcast with a cache
//! (`EventProducer.broadcast_event_with_cache`, `ValkeyStreamClient.broadcast_with_cache`): in
//! one `MULTI`, `SET bgtask.<task_id> <message> EX 300` and `PUBLISH events_all <message>` on
//! the streams' database (4), the message being `BroadcastMessagePayload.to_json()`. The
//! manager's `CommitSessionHandler._wait_for_agent_bgtask` (`ai/backend/manager/bgtask/tasks/
//! commit_session.py`) reads the cached message first, then follows the channel, so an end
//! published before it looked is still seen. Upstream publishes no progress for commit, push
//! or pull tasks (their `ProgressReporter` is unused); neither does this agent.
//!
//! **Commit status.** While a commit runs, `kernel.<kernel_id>.commit` is `ongoing` in the
//! statistics database (0) with a TTL of 13 s, refreshed every 7 s
//! (`AbstractAgent.report_all_kernel_commit_status_map`, `ValkeyStatClient.
//! update_kernel_commit_statuses`); the manager's `AgentRegistry.get_commit_status` reads a
//! missing key as `ready`. Unlike upstream, which lets the key expire up to 13 s after the
//! commit ended, the key is deleted when the commit ends, so the manager reads `ready` at once.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::conn::{Conns, Failure};
use crate::agent::bus::encode::{BusMessage, BROADCAST_CHANNEL, STREAM_DB};
use crate::rpc::agent_api::images::{BgtaskKind, BgtaskState, BgtaskStatus};

/// The database of the cache and the channel (`REDIS_STREAM_DB`).
pub const DB: i64 = STREAM_DB;

/// The cached message's TTL in seconds (`_DEFAULT_CACHE_EXPIRATION`).
pub const CACHE_TTL_SECS: u64 = 300;

/// The statistics database, where commit statuses are.
pub const COMMIT_DB: i64 = super::stats::DB;

/// A commit status's TTL in seconds (`COMMIT_STATUS_EXPIRE`, `ai/backend/agent/agent.py`).
pub const COMMIT_TTL_SECS: u64 = 13;

/// Seconds between refreshes of the commit statuses (`ReportKernelCommitStatusTask`).
pub const COMMIT_INTERVAL_SECS: u64 = 7;

/// The cache key of task `id` (`EventCacheDomain.BGTASK.cache_id`).
pub fn cache_key(id: &str) -> String {
    format!("bgtask.{id}")
}

/// The commit status key of kernel `kernel_id`.
pub fn commit_key(kernel_id: &str) -> String {
    format!("kernel.{kernel_id}.commit")
}

#[derive(Serialize)]
struct Updated<'a> {
    task_id: &'a str,
    current_progress: f64,
    total_progress: f64,
    message: Option<&'a str>,
}

#[derive(Serialize)]
struct Ended<'a> {
    task_id: &'a str,
    message: Option<&'a str>,
}

/// `s` as Python's `repr` of a `str` writes it.
fn py_repr(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// What was last told of a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Told {
    /// Its start.
    Started,
    /// Its end.
    Ended,
}

/// The `bgtask_updated` of task `id`'s start.
pub fn started(id: &str) -> BusMessage {
    BusMessage {
        name: "bgtask_updated",
        payload: serde_json::to_string(&Updated {
            task_id: id,
            current_progress: 0.0,
            total_progress: 0.0,
            message: Some("Task started"),
        })
        .expect("always serializes"),
        broadcast: true,
    }
}

/// The `bgtask_done` or `bgtask_failed` of `task`'s end; `None` while it runs.
pub fn ended(task: &BgtaskState) -> Option<BusMessage> {
    let id = task.bgtask_id.as_str();
    let (name, message) = match task.status {
        BgtaskStatus::Ongoing => return None,
        BgtaskStatus::Done => ("bgtask_done", None),
        _ => (
            "bgtask_failed",
            Some(format!(
                "{}({})",
                task.error_name.as_deref().unwrap_or("Exception"),
                py_repr(task.message.as_deref().unwrap_or(""))
            )),
        ),
    };
    Some(BusMessage {
        name,
        payload: serde_json::to_string(&Ended {
            task_id: id,
            message: message.as_deref(),
        })
        .expect("always serializes"),
        broadcast: true,
    })
}

/// What has been told of each task and which commit statuses are set.
#[derive(Debug, Default)]
pub struct Tracker {
    told: HashMap<String, Told>,
    commits: HashSet<String>,
}

/// What one pass of [`Tracker::sync`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Synced {
    /// Events published.
    pub events: usize,
    /// A commit or pull ended well since the last pass (the node's images changed).
    pub images_changed: bool,
}

impl Tracker {
    /// Publishes what `tasks` hold that was not told yet (each task's start, then its end),
    /// sets the commit status of each running commit and deletes those of commits that ended.
    /// Stops at the first failure: what is left is told on a later pass.
    ///
    /// Errors: the first [`Failure`].
    pub async fn sync(
        &mut self,
        conns: &mut Conns,
        source: &str,
        tasks: &[BgtaskState],
    ) -> Result<Synced, Failure> {
        let mut done = Synced::default();
        let mut ordered: Vec<&BgtaskState> = tasks.iter().collect();
        ordered.sort_by(|a, b| a.started_at.total_cmp(&b.started_at));
        for t in &ordered {
            let id = &t.bgtask_id;
            if !self.told.contains_key(id) {
                publish(conns, source, id, &started(id)).await?;
                self.told.insert(id.clone(), Told::Started);
                done.events += 1;
            }
            if self.told.get(id) == Some(&Told::Started) {
                if let Some(msg) = ended(t) {
                    publish(conns, source, id, &msg).await?;
                    self.told.insert(id.clone(), Told::Ended);
                    done.events += 1;
                    done.images_changed |= t.status == BgtaskStatus::Done
                        && matches!(t.kind, BgtaskKind::Commit | BgtaskKind::Pull);
                }
            }
        }
        let kept: HashSet<&str> = tasks.iter().map(|t| t.bgtask_id.as_str()).collect();
        self.told.retain(|id, _| kept.contains(id.as_str()));

        let running: HashSet<String> = tasks
            .iter()
            .filter(|t| t.kind == BgtaskKind::Commit && t.status == BgtaskStatus::Ongoing)
            .filter_map(|t| t.kernel.clone())
            .collect();
        let gone: Vec<String> = self.commits.difference(&running).cloned().collect();
        if !running.is_empty() || !gone.is_empty() {
            let mut pipe = redis::pipe();
            for k in &running {
                pipe.cmd("SET")
                    .arg(commit_key(k))
                    .arg("ongoing")
                    .arg("EX")
                    .arg(COMMIT_TTL_SECS)
                    .ignore();
            }
            for k in &gone {
                pipe.cmd("DEL").arg(commit_key(k)).ignore();
            }
            conns.pipe::<()>(COMMIT_DB, &pipe).await?;
        }
        self.commits = running;
        Ok(done)
    }
}

/// Sets the cache of task `id` to `msg` and publishes it, atomically.
async fn publish(
    conns: &mut Conns,
    source: &str,
    id: &str,
    msg: &BusMessage,
) -> Result<(), Failure> {
    let json = msg.broadcast_json(source);
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("SET")
        .arg(cache_key(id))
        .arg(&json)
        .arg("EX")
        .arg(CACHE_TTL_SECS)
        .ignore()
        .cmd("PUBLISH")
        .arg(BROADCAST_CHANNEL)
        .arg(&json)
        .ignore();
    conns.pipe::<()>(DB, &pipe).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_upstreams_bodies() {
        assert_eq!(
            started("5b2c6f6e-1d2a-4c4e-9a51-0c8f3d7b9e01").payload,
            r#"{"task_id":"5b2c6f6e-1d2a-4c4e-9a51-0c8f3d7b9e01","current_progress":0.0,"total_progress":0.0,"message":"Task started"}"#
        );
        let mut t = BgtaskState {
            bgtask_id: "b".into(),
            ..BgtaskState::default()
        };
        assert!(ended(&t).is_none());
        t.status = BgtaskStatus::Done;
        let done = ended(&t).unwrap();
        assert_eq!(
            (done.name, done.payload.as_str()),
            ("bgtask_done", r#"{"task_id":"b","message":null}"#)
        );
        t.status = BgtaskStatus::Failed;
        t.error_name = Some("RegistryAuthFailed".into());
        t.message = Some("the registry's answer: 'denied'".into());
        let failed = ended(&t).unwrap();
        assert_eq!(failed.name, "bgtask_failed");
        assert_eq!(
            failed.payload,
            r#"{"task_id":"b","message":"RegistryAuthFailed(\"the registry's answer: 'denied'\")"}"#
        );
    }

    #[test]
    fn python_reprs_pick_their_quote() {
        assert_eq!(py_repr("a"), "'a'");
        assert_eq!(py_repr("it's"), "\"it's\"");
        assert_eq!(py_repr("'\"\n"), "'\\'\"\\n'");
    }
}

//! Kernel logs that outlive the kernel: each running kernel has a keeper task that follows its
//! container's stdout and stderr (merged, as `docker logs` shows them) into
//! `<var-base-path>/logs/<kernel-id>.log`, so they can be read after the container is removed, for
//! `[container] log-retention` (Backend.AI's agent keeps a finished kernel's logs for the manager
//! the same way).
//!
//! A file holds at most `2 × log-tail` bytes: past that it is cut to its last `log-tail` bytes
//! (the disk never grows with what a kernel prints). Offsets are absolute (bytes since the keeper
//! first wrote), so a follower reads on from where it was across cuts; a follower that fell
//! behind a cut resumes at the oldest byte kept. Offsets restart from 0 when the agent restarts.

use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actors::{ChildSpec, StopSignal};
use futures::StreamExt;
use tokio::sync::Notify;

use super::backend::ContainerBackend;

/// One kernel's log file.
#[derive(Debug)]
struct KernelLog {
    file: Mutex<LogFile>,
    /// Bytes were appended, or the keeper stopped.
    grew: Notify,
    /// A keeper is writing it (the kernel's container runs).
    active: AtomicBool,
}

#[derive(Debug)]
struct LogFile {
    path: PathBuf,
    /// Absolute offset of the file's first byte.
    base: u64,
    /// The file's length.
    len: u64,
}

impl LogFile {
    fn end(&self) -> u64 {
        self.base + self.len
    }

    fn append(&mut self, data: &[u8], tail: u64) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        f.write_all(data)?;
        self.len += data.len() as u64;
        if self.len > 2 * tail {
            // Keep the last `tail` bytes: write them to a new file and rename it over the old.
            let keep = self.read_range(self.end() - tail, tail as usize)?;
            let tmp = self.path.with_extension("log.tmp");
            std::fs::write(&tmp, &keep)?;
            std::fs::rename(&tmp, &self.path)?;
            self.base = self.end() - keep.len() as u64;
            self.len = keep.len() as u64;
        }
        Ok(())
    }

    /// Up to `max` bytes from absolute offset `from` (clamped to what the file holds).
    fn read_range(&self, from: u64, max: usize) -> std::io::Result<Vec<u8>> {
        let from = from.clamp(self.base, self.end());
        let n = (self.end() - from).min(max as u64) as usize;
        if n == 0 {
            // Also before the keeper's first write has created the file.
            return Ok(Vec::new());
        }
        let mut buf = vec![0; n];
        let mut f = std::fs::File::open(&self.path)?;
        f.seek(SeekFrom::Start(from - self.base))?;
        f.read_exact(&mut buf)?;
        Ok(buf)
    }
}

/// The task that follows one kernel's container into its log.
#[derive(Debug)]
pub struct LogKeeper {
    task: tokio::task::JoinHandle<()>,
    /// Told when the container is removed: stop waiting to follow it again.
    gone: Arc<Notify>,
    log: Arc<KernelLog>,
}

impl LogKeeper {
    /// It stopped (the container stopped or went).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// The container has been removed: lets the keeper write what the engine still sends (up to
    /// `limit`), then stops it. Followers then see the log end.
    pub async fn finish(mut self, limit: Duration) {
        self.gone.notify_one();
        if tokio::time::timeout(limit, &mut self.task).await.is_err() {
            self.task.abort();
        }
        self.ended();
    }

    /// Stops it now (agent shutdown: the next start follows the container again).
    pub fn abort(self) {
        self.task.abort();
        self.ended();
    }

    fn ended(&self) {
        self.log.active.store(false, Ordering::SeqCst);
        self.log.grew.notify_waiters();
    }
}

/// A read of a kernel's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogChunk {
    /// The bytes.
    pub data: Vec<u8>,
    /// Absolute offset of `data[0]`.
    pub start: u64,
    /// Where the next read goes on from.
    pub next: u64,
    /// The container still runs: more may come.
    pub active: bool,
}

/// The agent tree's `log-retention` child: [`LogStore::sweep`] every minute until stopped.
pub fn retention_spec(logs: Arc<LogStore>) -> ChildSpec {
    ChildSpec::task("log-retention", move |stop: StopSignal| {
        let logs = logs.clone();
        async move {
            logs.sweep_every(Duration::from_secs(60), stop.requested())
                .await;
            Ok::<_, String>(())
        }
    })
}

/// Every kernel's log file under `<var-base-path>/logs`.
#[derive(Debug)]
pub struct LogStore {
    dir: PathBuf,
    tail: u64,
    retention: Duration,
    logs: Mutex<HashMap<String, Arc<KernelLog>>>,
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

impl LogStore {
    /// The store in `dir` (created when missing), keeping `tail` bytes per kernel for `retention`.
    ///
    /// Errors: `dir` cannot be created.
    pub fn open(dir: &Path, tail: u64, retention: Duration) -> std::io::Result<LogStore> {
        std::fs::create_dir_all(dir)?;
        Ok(LogStore {
            dir: dir.to_owned(),
            tail: tail.max(1),
            retention,
            logs: Mutex::new(HashMap::new()),
        })
    }

    fn path(&self, kernel_id: &str) -> PathBuf {
        self.dir.join(format!("{kernel_id}.log"))
    }

    /// The kernel's log, loaded from disk when not yet in memory; `None` when it has none.
    fn get(&self, kernel_id: &str, create: bool) -> Option<Arc<KernelLog>> {
        // An id is a file name here: one that could leave the directory (`../x`) has no log.
        crate::agent::kernel::config::check_kernel_id(kernel_id).ok()?;
        let mut logs = self.logs.lock().expect("logs lock");
        if let Some(l) = logs.get(kernel_id) {
            return Some(l.clone());
        }
        let path = self.path(kernel_id);
        let len = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(_) if create => 0,
            Err(_) => return None,
        };
        let log = Arc::new(KernelLog {
            file: Mutex::new(LogFile { path, base: 0, len }),
            grew: Notify::new(),
            active: AtomicBool::new(false),
        });
        logs.insert(kernel_id.to_owned(), log.clone());
        Some(log)
    }

    /// Follows `container_id`'s output into the kernel's log until the container stops for good
    /// (a restart is followed across); the returned task ends then. Output written while no keeper
    /// ran (an agent restart) is taken from the file's last write on, to the second.
    pub fn keep(
        self: &Arc<Self>,
        backend: Arc<dyn ContainerBackend>,
        kernel_id: &str,
        container_id: &str,
    ) -> LogKeeper {
        let log = self.get(kernel_id, true).expect("created");
        log.active.store(true, Ordering::SeqCst);
        let gone = Arc::new(Notify::new());
        let (store, kernel_id, container_id) =
            (self.clone(), kernel_id.to_owned(), container_id.to_owned());
        let (task_log, task_gone) = (log.clone(), gone.clone());
        let task = tokio::spawn(async move {
            let (log, gone) = (task_log, task_gone);
            let mut since = {
                let f = log.file.lock().expect("log file lock");
                match std::fs::metadata(&f.path).and_then(|m| m.modified()) {
                    Ok(t) if f.len > 0 => t
                        .duration_since(UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs() as i64),
                    _ => 0,
                }
            };
            let mut pause = Duration::from_millis(200);
            loop {
                let mut stream = backend.follow_logs(&container_id, since);
                while let Some(item) = stream.next().await {
                    match item {
                        Ok(bytes) => {
                            if let Err(e) = log
                                .file
                                .lock()
                                .expect("log file lock")
                                .append(&bytes, store.tail)
                            {
                                tracing::warn!(%kernel_id, error = %e, "cannot write the kernel's log file");
                            }
                            log.grew.notify_waiters();
                            pause = Duration::from_millis(200);
                        }
                        Err(e) => {
                            tracing::debug!(%kernel_id, error = %e, "log stream ended");
                            break;
                        }
                    }
                }
                since = unix_now();
                // A restarted container is followed again; a stopped or removed one ends it.
                // While the engine is unreachable (restarting: with live-restore the container
                // is still there when it is back) it is asked again every 5 s at most, and the
                // output written meanwhile is taken from `since` on.
                let longest = match backend.inspect_container(&container_id).await {
                    // The stream ended under a running container (a restart in progress, an
                    // engine hiccup, or a backend without logs): ask again, not in a tight loop.
                    Ok(Some(s)) if s.running => Duration::from_secs(30),
                    Err(e) if e.is_unavailable() => Duration::from_secs(5),
                    _ => break,
                };
                tokio::select! {
                    _ = tokio::time::sleep(pause) => {}
                    _ = gone.notified() => break,
                }
                pause = (pause * 2).min(longest);
            }
            log.active.store(false, Ordering::SeqCst);
            log.grew.notify_waiters();
        });
        LogKeeper { task, gone, log }
    }

    /// Reads the kernel's log: from absolute `offset` (at most `max` bytes), or without one its
    /// last `min(log-tail, max)` bytes. With `wait`, a read at the end of an active log waits up
    /// to that long for more. `None`: the agent has no log for this kernel.
    pub async fn read(
        &self,
        kernel_id: &str,
        offset: Option<u64>,
        max: usize,
        wait: Option<Duration>,
    ) -> std::io::Result<Option<LogChunk>> {
        let Some(log) = self.get(kernel_id, false) else {
            return Ok(None);
        };
        let deadline = wait.map(|w| tokio::time::Instant::now() + w);
        loop {
            let grew = log.grew.notified();
            let active = log.active.load(Ordering::SeqCst);
            let chunk = {
                let f = log.file.lock().expect("log file lock");
                let from = match offset {
                    Some(o) => o.max(f.base),
                    None => f
                        .end()
                        .saturating_sub(self.tail.min(max as u64))
                        .max(f.base),
                };
                if from < f.end()
                    || !active
                    || deadline.is_none_or(|d| tokio::time::Instant::now() >= d)
                {
                    let data = f.read_range(from, max)?;
                    let next = from + data.len() as u64;
                    Some(LogChunk {
                        data,
                        start: from,
                        next,
                        active: active || next < f.end(),
                    })
                } else {
                    None
                }
            };
            if let Some(c) = chunk {
                return Ok(Some(c));
            }
            tokio::select! {
                _ = grew => {}
                _ = tokio::time::sleep_until(deadline.expect("checked above")) => {}
            }
        }
    }

    /// Deletes the logs of kernels that are not running and were last written more than
    /// `log-retention` ago; returns how many.
    pub fn sweep(&self) -> usize {
        let mut removed = 0;
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return 0;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(kernel_id) = name.strip_suffix(".log") else {
                continue;
            };
            let active = self
                .logs
                .lock()
                .expect("logs lock")
                .get(kernel_id)
                .is_some_and(|l| l.active.load(Ordering::SeqCst));
            let old = entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= self.retention);
            if !active && old && std::fs::remove_file(entry.path()).is_ok() {
                self.logs.lock().expect("logs lock").remove(kernel_id);
                removed += 1;
            }
        }
        removed
    }

    /// Sweeps every `period` until `stop` resolves.
    pub async fn sweep_every(&self, period: Duration, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let mut tick = tokio::time::interval(period);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let n = self.sweep();
                    if n > 0 {
                        tracing::info!(removed = n, "kernel logs past log-retention removed");
                    }
                }
                _ = &mut stop => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_file_is_cut_to_its_tail_and_offsets_stay_absolute() {
        let dir = tempfile::tempdir().unwrap();
        let mut f = LogFile {
            path: dir.path().join("k.log"),
            base: 0,
            len: 0,
        };
        for i in 0..10u8 {
            f.append(&[b'0' + i; 10], 25).unwrap();
            assert!(f.len <= 50, "never more than 2 × tail on disk");
        }
        assert_eq!(f.end(), 100);
        assert!(f.base >= 50 && f.base <= 75);
        assert_eq!(f.read_range(95, 100).unwrap(), vec![b'9'; 5]);
        // Before the cut: the oldest byte kept.
        let old = f.read_range(0, 5).unwrap();
        assert_eq!(old.len(), 5);
        assert_eq!(std::fs::metadata(&f.path).unwrap().len(), f.len);
    }

    #[tokio::test]
    async fn reads_tail_offsets_and_sweeps() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(&dir.path().join("logs"), 8, Duration::ZERO).unwrap();
        assert!(store.read("nope", None, 100, None).await.unwrap().is_none());
        std::fs::write(dir.path().join("escaped.log"), "x").unwrap();
        assert!(
            store
                .read("../escaped", None, 100, None)
                .await
                .unwrap()
                .is_none(),
            "ids never leave the directory"
        );
        let log = store.get("k1", true).unwrap();
        // Known but nothing written yet (no file): empty, not an error.
        let empty = store.read("k1", None, 100, None).await.unwrap().unwrap();
        assert!(empty.data.is_empty() && empty.next == 0);
        log.file
            .lock()
            .unwrap()
            .append(b"line one\nline two\n", 8)
            .unwrap();
        let tail = store.read("k1", None, 100, None).await.unwrap().unwrap();
        // 18 bytes > 2 × 8: the file was cut to its last 8 bytes, offsets kept.
        assert_eq!(
            (tail.data.as_slice(), tail.start, tail.next),
            (&b"ine two\n"[..], 10, 18)
        );
        assert!(!tail.active);
        let from = store.read("k1", Some(12), 3, None).await.unwrap().unwrap();
        assert_eq!(
            (from.data.as_slice(), from.start, from.next),
            (&b"e t"[..], 12, 15)
        );
        // Behind the cut: resumes at the oldest byte kept.
        let behind = store.read("k1", Some(0), 3, None).await.unwrap().unwrap();
        assert_eq!((behind.data.as_slice(), behind.start), (&b"ine"[..], 10));
        assert_eq!(store.sweep(), 1);
        assert!(store.read("k1", None, 100, None).await.unwrap().is_none());
    }
}

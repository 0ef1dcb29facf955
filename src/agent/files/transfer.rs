//! Uploads and downloads in bounded chunks across RPC calls.
//!
//! An upload is opened by its first chunk (declaring the whole size): a task takes the data from
//! a channel of at most [`QUEUE`] chunks, so a slow disk or engine slows the caller (each call
//! returns once its chunk is queued). The task writes the file straight into the kernel's
//! filesystem ([`direct`]) where it can, else streams a tar archive of it to the engine. A
//! download is the open file (or an open archive stream of it), read one chunk per call.
//! Neither holds more than a few chunks, whatever the file's size. A transfer nobody touches
//! for the idle timeout is dropped by [`Transfers::reap`] (an upload then ends short and is
//! refused: the direct path removes its partial file, the engine refuses the truncated archive).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actors::{ChildSpec, StopSignal};
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::direct::{self, KernelRoot, OpenedFile};
use super::tar::{self, Ownership, TarReader};
use super::{absolute, open_file, resolve, FileError};
use crate::agent::backend::{BackendError, ContainerBackend};

/// Chunks queued between an upload's calls and its writer.
const QUEUE: usize = 4;

/// Longest wait for a failed upload's writer to end (and clean up) before its call answers.
const CLEANUP_WAIT: Duration = Duration::from_secs(10);

/// A new upload: where, how big, owned by whom.
#[derive(Clone, Debug)]
pub struct UploadRequest {
    /// The kernel's container.
    pub container_id: String,
    /// Path relative to `/home/work`.
    pub path: String,
    /// Total bytes that will be sent.
    pub size: u64,
    /// Owner of the file and of the directories created for it.
    pub uid: u64,
    /// See `uid`.
    pub gid: u64,
}

/// A download's first answer.
#[derive(Clone, Debug)]
pub struct DownloadStart {
    /// The id for the following chunks (`None`: the first chunk was the whole file).
    pub download_id: Option<String>,
    /// The file's size in bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, Unix seconds.
    pub mtime: u64,
    /// The first bytes (at most the chunk size).
    pub data: Bytes,
}

struct Upload {
    tx: Option<mpsc::Sender<Bytes>>,
    task: Option<JoinHandle<Result<(), FileError>>>,
    size: u64,
    received: u64,
    last_touch: Instant,
}

/// An open upload and the chunks waiting for their turn.
struct UploadSlot {
    upload: tokio::sync::Mutex<Upload>,
    /// Told after each chunk, so that a chunk which came early (its offset beyond what was
    /// received) looks again.
    turn: Notify,
}

struct Download {
    source: Source,
    last_touch: Instant,
}

/// Where a download's bytes come from.
enum Source {
    /// The engine's archive of the file, positioned in its data.
    Archive(TarReader),
    /// The file itself, opened through the kernel's root, and the bytes left of it (`None`
    /// while a read is in flight on a blocking thread).
    Direct(Option<OpenedFile>, u64),
}

/// The agent tree's `transfer-reaper` child: every 5 s, [`Transfers::reap`] on the transfers
/// `transfers` finds in `owner`, so uploads and downloads nobody continues for
/// `exec-idle-timeout` are dropped. (The owner is the agent's context, which holds the
/// transfers; taking it generically keeps this module free of the context.)
pub fn reaper_spec<O: Send + Sync + 'static>(
    owner: Arc<O>,
    transfers: fn(&O) -> &Transfers,
) -> ChildSpec {
    ChildSpec::task("transfer-reaper", move |stop: StopSignal| {
        let owner = owner.clone();
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(5));
            let mut stop = std::pin::pin!(stop.requested());
            loop {
                tokio::select! {
                    _ = tick.tick() => { transfers(&owner).reap(); }
                    _ = &mut stop => return Ok::<_, String>(()),
                }
            }
        }
    })
}

/// Open transfers by id. Each is behind its own async lock: one call at a time per transfer.
pub struct Transfers {
    uploads: Mutex<HashMap<String, Arc<UploadSlot>>>,
    downloads: Mutex<HashMap<String, Arc<tokio::sync::Mutex<Download>>>>,
    idle: Duration,
}

/// A uid or gid as the kernel takes it (an out-of-range one: `nobody`'s 65534).
fn owner_id(id: u64) -> u32 {
    u32::try_from(id).unwrap_or(65534)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Transfers {
    /// An empty registry dropping transfers idle for `idle`.
    pub fn new(idle: Duration) -> Transfers {
        Transfers {
            uploads: Mutex::default(),
            downloads: Mutex::default(),
            idle,
        }
    }

    /// Opens upload `id`: resolves the path (refusing escapes and directories), then starts the
    /// task that writes the data as it is queued: into the kernel's filesystem directly
    /// ([`direct`]; the file appears, replacing any old one, only once all of it came), else as
    /// an archive streamed to the engine. Directories missing on the way are created, owned like
    /// the file.
    ///
    /// Errors: [`FileError::InvalidPath`], [`FileError::Engine`].
    pub async fn begin_upload(
        &self,
        backend: &Arc<dyn ContainerBackend>,
        id: &str,
        req: UploadRequest,
    ) -> Result<(), FileError> {
        let r = resolve(backend, &req.container_id, &req.path).await?;
        let (dir, names) = if r.exists() {
            if r.is_dir() {
                return Err(FileError::InvalidPath(format!(
                    "`{}` is a directory",
                    req.path
                )));
            }
            // Replace the (resolved) file: extract its name into its parent.
            let mut parent = r.existing.clone();
            let name = parent.pop().unwrap_or_default();
            (parent, vec![name])
        } else {
            if !r.is_dir() {
                return Err(FileError::InvalidPath(format!(
                    "`{}`: a parent is not a directory",
                    req.path
                )));
            }
            (r.existing.clone(), r.missing.clone())
        };
        if names.is_empty() || names.last().is_some_and(|n| n.is_empty()) {
            return Err(FileError::InvalidPath(format!(
                "`{}` names no file",
                req.path
            )));
        }
        let (tx, rx) = mpsc::channel::<Bytes>(QUEUE);
        let task = match self.begin_direct(backend, &req, &dir, &names).await? {
            Some(host) => {
                let size = req.size;
                tokio::task::spawn_blocking(move || host.write_all_from(rx, size))
            }
            None => archive_upload(backend, &req, &dir, &names, rx)?,
        };
        let upload = Upload {
            tx: Some(tx),
            task: Some(task),
            size: req.size,
            received: 0,
            last_touch: Instant::now(),
        };
        self.uploads.lock().expect("uploads lock").insert(
            id.to_owned(),
            Arc::new(UploadSlot {
                upload: tokio::sync::Mutex::new(upload),
                turn: Notify::new(),
            }),
        );
        Ok(())
    }

    /// The upload's file opened in the kernel's filesystem ([`direct`]): the directories
    /// `names[..n-1]` made under `/home/work/<dir>`, the file `names[n-1]` begun beside its
    /// name. `None` where the direct path is unavailable (the archive API is used instead).
    ///
    /// Errors: [`FileError::InvalidPath`] when a symlink or a non-directory turned up on the
    /// way since the path was resolved.
    async fn begin_direct(
        &self,
        backend: &Arc<dyn ContainerBackend>,
        req: &UploadRequest,
        dir: &[String],
        names: &[String],
    ) -> Result<Option<direct::HostUpload>, FileError> {
        let Some(root) = KernelRoot::open(backend, &req.container_id).await else {
            return Ok(None);
        };
        let (dir, names) = (dir.to_vec(), names.to_vec());
        let (uid, gid) = (owner_id(req.uid), owner_id(req.gid));
        let made = tokio::task::spawn_blocking(move || {
            let (name, missing) = names.split_last().expect("an upload names a file");
            let tag = uuid::Uuid::new_v4().simple().to_string();
            root.begin_upload(&dir, missing, name, uid, gid, &tag)
        })
        .await
        .map_err(|e| FileError::Io(format!("upload task: {e}")))?;
        match made {
            Ok(host) => Ok(Some(host)),
            Err(e @ FileError::InvalidPath(_)) => Err(e),
            Err(e) => {
                tracing::debug!(error = %e, container = %req.container_id,
                    "upload: the kernel's filesystem is not writable directly; through the engine");
                Ok(None)
            }
        }
    }

    /// Queues `data` for upload `id` (waiting while the writer is behind); with `eof`, waits for
    /// the file to be written and forgets the upload. With `offset`, the chunk first waits until
    /// the bytes before it came (another call may bring them meanwhile). Returns the bytes
    /// received so far.
    ///
    /// Errors: [`FileError::TransferNotFound`] (also once the upload failed by another call);
    /// [`FileError::SizeMismatch`] for more bytes than declared, fewer at `eof`, or an `offset`
    /// already past; [`FileError::Engine`] or [`FileError::Io`] when the file could not be
    /// written.
    pub async fn upload_chunk(
        &self,
        id: &str,
        data: Bytes,
        eof: bool,
        offset: Option<u64>,
    ) -> Result<u64, FileError> {
        let slot = self
            .uploads
            .lock()
            .expect("uploads lock")
            .get(id)
            .cloned()
            .ok_or_else(|| FileError::TransferNotFound(id.to_owned()))?;
        let mut up = loop {
            let up = slot.upload.lock().await;
            if up.tx.is_none() {
                return Err(FileError::TransferNotFound(id.to_owned()));
            }
            match offset {
                Some(o) if o > up.received => {
                    // Registered before the lock goes, so no chunk's notice is missed.
                    let turn = slot.turn.notified();
                    tokio::pin!(turn);
                    turn.as_mut().enable();
                    drop(up);
                    turn.await;
                }
                Some(o) if o < up.received => {
                    return Err(FileError::SizeMismatch(format!(
                        "a chunk at byte {o}, but {} bytes came already",
                        up.received
                    )))
                }
                _ => break up,
            }
        };
        up.last_touch = Instant::now();
        let result = self.feed(&mut up, data, eof).await;
        if eof || result.is_err() {
            self.uploads.lock().expect("uploads lock").remove(id);
            // Dropping the sender ends the data (short unless complete).
            up.tx = None;
            if let (Err(_), Some(task)) = (&result, up.task.take()) {
                // The writer's end is waited for, so that once the caller sees the error nothing
                // is left of the upload (the direct path removes its hidden file); an engine that
                // does not answer the cut archive is not waited for long.
                let abort = task.abort_handle();
                if tokio::time::timeout(CLEANUP_WAIT, task).await.is_err() {
                    abort.abort();
                }
            }
        }
        drop(up);
        slot.turn.notify_waiters();
        result
    }

    async fn feed(&self, up: &mut Upload, data: Bytes, eof: bool) -> Result<u64, FileError> {
        if up.received + data.len() as u64 > up.size {
            return Err(FileError::SizeMismatch(format!(
                "more than the declared {} bytes",
                up.size
            )));
        }
        if !data.is_empty() {
            up.received += data.len() as u64;
            let tx = up.tx.as_ref().expect("an open upload has its sender");
            if tx.send(data).await.is_err() {
                // The engine already ended the request: its answer says why.
                return Err(finish(up).await.err().unwrap_or_else(|| {
                    FileError::Engine(BackendError::Engine(
                        "the engine closed the upload early".into(),
                    ))
                }));
            }
        }
        if !eof {
            return Ok(up.received);
        }
        if up.received != up.size {
            return Err(FileError::SizeMismatch(format!(
                "{} bytes received of the declared {}",
                up.received, up.size
            )));
        }
        up.tx = None;
        finish(up).await?;
        Ok(up.received)
    }

    /// Opens a download of the file at `path`, returning its first `chunk` bytes; the rest come
    /// from [`download_chunk`](Transfers::download_chunk) with the returned id (none when the
    /// first chunk was all of it).
    ///
    /// Errors: [`FileError::InvalidPath`] (escapes, a directory), [`FileError::NotFound`],
    /// [`FileError::Engine`].
    pub async fn begin_download(
        &self,
        backend: &Arc<dyn ContainerBackend>,
        container_id: &str,
        path: &str,
        chunk: usize,
    ) -> Result<DownloadStart, FileError> {
        let (mut source, start) = match open_direct(backend, container_id, path).await? {
            Some(f) => (Source::Direct(Some(f.0), f.1.size), f.1),
            None => {
                let (reader, entry) = open_file(backend, container_id, path).await?;
                let start = DownloadStart {
                    download_id: None,
                    size: entry.size,
                    mode: entry.mode,
                    mtime: entry.mtime,
                    data: Bytes::new(),
                };
                (Source::Archive(reader), start)
            }
        };
        let data = source.read(chunk).await?;
        let download_id = if source.left() > 0 {
            let id = uuid::Uuid::new_v4().simple().to_string();
            let d = Download {
                source,
                last_touch: Instant::now(),
            };
            self.downloads
                .lock()
                .expect("downloads lock")
                .insert(id.clone(), Arc::new(tokio::sync::Mutex::new(d)));
            Some(id)
        } else {
            None
        };
        Ok(DownloadStart {
            download_id,
            data,
            ..start
        })
    }

    /// The next at most `chunk` bytes of download `id` and whether they were the last (the
    /// download is then forgotten).
    ///
    /// Errors: [`FileError::TransferNotFound`], [`FileError::Engine`], [`FileError::Io`].
    pub async fn download_chunk(&self, id: &str, chunk: usize) -> Result<(Bytes, bool), FileError> {
        let entry = self
            .downloads
            .lock()
            .expect("downloads lock")
            .get(id)
            .cloned()
            .ok_or_else(|| FileError::TransferNotFound(id.to_owned()))?;
        let mut d = entry.lock().await;
        d.last_touch = Instant::now();
        let result = d.source.read(chunk).await;
        let done = match &result {
            Ok(data) => data.is_empty() || d.source.left() == 0,
            Err(_) => true,
        };
        if done {
            self.downloads.lock().expect("downloads lock").remove(id);
        }
        result.map(|data| (data, done))
    }

    /// Drops transfers idle for longer than the idle timeout; returns how many are open.
    pub fn reap(&self) -> usize {
        let idle = self.idle;
        let stale = |t: Instant| t.elapsed() > idle;
        let mut uploads = self.uploads.lock().expect("uploads lock");
        uploads.retain(|id, slot| match slot.upload.try_lock() {
            Ok(mut u) if stale(u.last_touch) => {
                tracing::warn!(upload = %id, "upload idle too long: dropped");
                u.tx = None;
                if let Some(task) = u.task.take() {
                    task.abort();
                }
                drop(u);
                // Chunks waiting for their turn see it gone.
                slot.turn.notify_waiters();
                false
            }
            _ => true,
        });
        let mut downloads = self.downloads.lock().expect("downloads lock");
        downloads.retain(|_, d| !d.try_lock().is_ok_and(|d| stale(d.last_touch)));
        uploads.len() + downloads.len()
    }
}

/// The archive of an upload (the directories `names[..n-1]` and the file `names[n-1]`, to be
/// extracted into `/home/work/<dir>`) streamed to the engine as `rx` brings the data: headers,
/// the data, then padding and the end marker only once exactly `size` bytes came, so a short
/// upload ends truncated and is refused.
///
/// Errors: [`FileError::InvalidPath`] for a name a tar header cannot hold.
fn archive_upload(
    backend: &Arc<dyn ContainerBackend>,
    req: &UploadRequest,
    dir: &[String],
    names: &[String],
    rx: mpsc::Receiver<Bytes>,
) -> Result<JoinHandle<Result<(), FileError>>, FileError> {
    let owner = Ownership {
        uid: req.uid,
        gid: req.gid,
        mtime: now_secs(),
    };
    let mut head = Vec::new();
    for i in 1..names.len() {
        head.extend_from_slice(
            &tar::entry_header(&names[..i].join("/"), None, owner)
                .map_err(|e| FileError::InvalidPath(e.to_string()))?,
        );
    }
    head.extend_from_slice(
        &tar::entry_header(&names.join("/"), Some(req.size), owner)
            .map_err(|e| FileError::InvalidPath(e.to_string()))?,
    );
    let size = req.size;
    let body = futures::stream::once(async move { Bytes::from(head) })
        .chain(futures::stream::unfold(
            (rx, 0u64, false),
            move |(mut rx, sent, done)| async move {
                if done {
                    return None;
                }
                match rx.recv().await {
                    Some(chunk) => {
                        let sent = sent + chunk.len() as u64;
                        Some((chunk, (rx, sent, false)))
                    }
                    None if sent == size => {
                        let mut tail = tar::padding_for(size).to_vec();
                        tail.extend_from_slice(&tar::end_of_archive());
                        Some((Bytes::from(tail), (rx, sent, true)))
                    }
                    None => None,
                }
            },
        ))
        .boxed();
    let (backend, container, dir) = (backend.clone(), req.container_id.clone(), absolute(dir));
    Ok(tokio::spawn(async move {
        backend
            .archive_put(&container, &dir, body)
            .await
            .map_err(FileError::from)
    }))
}

impl Source {
    /// The bytes not read yet.
    fn left(&self) -> u64 {
        match self {
            Source::Archive(reader) => reader.data_left(),
            Source::Direct(_, left) => *left,
        }
    }

    /// Up to `max` bytes (fewer only at the file's end).
    async fn read(&mut self, max: usize) -> Result<Bytes, FileError> {
        match self {
            Source::Archive(reader) => read_up_to(reader, max).await,
            Source::Direct(file, left) => {
                let (mut f, n) = (
                    file.take()
                        .ok_or_else(|| FileError::Io("a read was cut short".into()))?,
                    *left,
                );
                let (f, data) = tokio::task::spawn_blocking(move || {
                    let data = direct::read_chunk(&mut f, n, max);
                    (f, data)
                })
                .await
                .map_err(|e| FileError::Io(format!("download task: {e}")))?;
                let data = data?;
                *file = Some(f);
                *left -= data.len() as u64;
                Ok(data)
            }
        }
    }
}

/// The regular file at the relative `path` opened through the kernel's root ([`direct`]), with
/// what the first answer reports of it; `None` where the direct path is unavailable.
///
/// Errors: [`FileError::NotFound`]; [`FileError::InvalidPath`] (escapes, a directory or another
/// non-file, a symlink that turned up since the path was resolved); [`FileError::Engine`].
async fn open_direct(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    path: &str,
) -> Result<Option<(OpenedFile, DownloadStart)>, FileError> {
    let r = resolve(backend, container_id, path).await?;
    if !r.exists() {
        return Err(FileError::NotFound(path.to_owned()));
    }
    if r.is_dir() {
        return Err(FileError::InvalidPath(format!(
            "`{path}` is a directory (list it instead)"
        )));
    }
    let Some(root) = KernelRoot::open(backend, container_id).await else {
        return Ok(None);
    };
    let (parts, shown) = (r.existing, path.to_owned());
    let opened = tokio::task::spawn_blocking(move || root.open_file(&parts, &shown))
        .await
        .map_err(|e| FileError::Io(format!("download task: {e}")))?;
    match opened {
        Ok(f) => {
            let start = DownloadStart {
                download_id: None,
                size: f.size,
                mode: f.mode,
                mtime: f.mtime,
                data: Bytes::new(),
            };
            Ok(Some((f, start)))
        }
        Err(e @ (FileError::InvalidPath(_) | FileError::NotFound(_))) => Err(e),
        Err(e) => {
            tracing::debug!(error = %e, container = %container_id,
                "download: the kernel's filesystem is not readable directly; through the engine");
            Ok(None)
        }
    }
}

/// Waits for the upload's engine request to end.
async fn finish(up: &mut Upload) -> Result<(), FileError> {
    match up.task.take() {
        Some(task) => match task.await {
            Ok(r) => r,
            Err(e) => Err(FileError::Io(format!("upload task: {e}"))),
        },
        None => Ok(()),
    }
}

/// Up to `max` bytes of the current file (fewer only at its end).
async fn read_up_to(reader: &mut TarReader, max: usize) -> Result<Bytes, FileError> {
    let mut out = bytes::BytesMut::new();
    while out.len() < max {
        match reader.read_data(max - out.len()).await? {
            Some(b) if out.is_empty() && b.len() == max => return Ok(b),
            Some(b) => out.extend_from_slice(&b),
            None => break,
        }
    }
    Ok(out.freeze())
}

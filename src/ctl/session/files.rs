//! `session cp`: one file between this machine and a session
//! (`PUT`/`GET /v1/sessions/{id}/files/{path}`), streamed both ways: memory stays fixed whatever
//! the file's size.
//!
//! An upload sends the file as it reads it, with its size as `Content-Length`; stdin, a pipe or
//! a device (no size known before the end) is first spooled to an unlinked temporary file. A
//! download writes the body as it arrives to a temporary file next to the destination, renamed
//! over it only once the whole body came: a failed download leaves no file behind.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use super::logs::copy_stream;
use crate::ctl::client::{file_path, Answer, Client};
use crate::ctl::Failure;

/// A finished upload.
#[derive(Debug)]
pub struct Uploaded {
    /// The manager's answer (`{"path", "size"}`).
    pub reply: Answer<crate::model::file::Uploaded>,
    /// The session path uploaded to (with the local file name appended where it named a
    /// directory).
    pub path: String,
    /// The bytes sent.
    pub size: u64,
}

/// Uploads `local` (`-`: `stdin`) to `path` of session `id` (in its kernel `kernel`, else the
/// main one); a `path` that is empty or ends in `/` gets the local file's name appended.
pub fn upload(
    client: &Client,
    local: &str,
    id: &str,
    kernel: Option<&str>,
    path: &str,
    stdin: impl Read,
) -> Result<Uploaded, Failure> {
    let mut path = path.to_owned();
    if path.is_empty() || path.ends_with('/') {
        let name = Path::new(local)
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|_| local != "-")
            .ok_or_else(|| {
                Failure::Local(format!(
                    "cannot tell a file name from '{local}': give one after '{id}:'"
                ))
            })?;
        path.push_str(name);
    }
    let (file, size) = if local == "-" {
        spool(stdin).map_err(|e| Failure::Local(format!("spooling stdin: {e}")))?
    } else {
        open_source(local)?
    };
    let reply = client.upload_file(id, kernel, &path, file, size)?;
    Ok(Uploaded { reply, path, size })
}

/// Opens a local file to upload, with its size; a pipe or device is spooled first.
fn open_source(local: &str) -> Result<(File, u64), Failure> {
    let fail = |e: io::Error| Failure::Local(format!("cannot read {local}: {e}"));
    let file = File::open(local).map_err(fail)?;
    let meta = file.metadata().map_err(fail)?;
    if meta.is_dir() {
        Err(Failure::Local(format!(
            "{local} is a directory; only files can be copied"
        )))
    } else if meta.is_file() {
        Ok((file, meta.len()))
    } else {
        spool(file).map_err(fail)
    }
}

/// Copies `from` to a temporary file that is already unlinked (it goes away with the handle),
/// answering it rewound, with its size.
pub fn spool(mut from: impl Read) -> io::Result<(File, u64)> {
    let dir = std::env::temp_dir();
    let mut file = loop {
        let path = dir.join(unique_name("kernelvisor-cp-", ""));
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(f) => {
                fs::remove_file(&path)?;
                break f;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    };
    let size = io::copy(&mut from, &mut file)?;
    file.seek(SeekFrom::Start(0))?;
    Ok((file, size))
}

/// `{prefix}{pid}-{time}-{counter}{suffix}`: a name no other ctl process picks.
fn unique_name(prefix: &str, suffix: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}-{nanos}-{n}{suffix}", std::process::id())
}

/// Where a finished download went.
#[derive(Debug, PartialEq, Eq)]
pub enum Downloaded {
    /// To stdout (`-`), this many bytes.
    Stdout(u64),
    /// To the file `path`, `size` bytes.
    File { path: PathBuf, size: u64 },
}

/// Downloads `path` of session `id` (of its kernel `kernel`, else the main one) to `local`: `-` is `stdout` (flushed after each read), an
/// existing directory gets the file under its session name, anything else is the file to write
/// (replaced when it exists, and only once the whole body came).
pub fn download(
    client: &Client,
    id: &str,
    kernel: Option<&str>,
    path: &str,
    local: &str,
    stdout: &mut impl Write,
) -> Result<Downloaded, Failure> {
    let url = client.url(&file_path(id, kernel, path));
    if local == "-" {
        let body = client.download_file(id, kernel, path)?;
        return Ok(Downloaded::Stdout(copy_stream(&url, body, stdout)?));
    }
    let target = target_of(local, path)?;
    // The temporary file first: a local problem shows before anything is asked of the manager.
    let mut partial = Partial::create(&target)?;
    let body = client.download_file(id, kernel, path)?;
    let size = copy_stream(&url, body, &mut partial.file).map_err(|f| match f {
        Failure::Io(e) => Failure::Local(format!("writing {}: {e}", partial.path.display())),
        other => other,
    })?;
    partial.finish(&target)?;
    Ok(Downloaded::File { path: target, size })
}

/// The file a download to `local` writes: `local/<name of path>` when `local` is a directory.
fn target_of(local: &str, path: &str) -> Result<PathBuf, Failure> {
    let name = path.rsplit('/').next().unwrap_or(path);
    let local_path = Path::new(local);
    if local_path.is_dir() {
        Ok(local_path.join(name))
    } else if local.ends_with('/') {
        Err(Failure::Local(format!("{local} is not a directory")))
    } else {
        Ok(local_path.to_path_buf())
    }
}

/// A download's temporary file next to its destination, removed when dropped unless
/// [`Partial::finish`] renamed it.
struct Partial {
    path: PathBuf,
    file: File,
    done: bool,
}

impl Partial {
    fn create(target: &Path) -> Result<Self, Failure> {
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let name = target
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        loop {
            let path = dir.join(unique_name(&format!(".{name}.kvpart-"), ""));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => {
                    return Ok(Partial {
                        path,
                        file,
                        done: false,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(Failure::Local(format!(
                        "cannot write to {}: {e}",
                        dir.display()
                    )))
                }
            }
        }
    }

    /// Flushes the file and renames it to `target`.
    fn finish(mut self, target: &Path) -> Result<(), Failure> {
        let fail = |e: io::Error| Failure::Local(format!("writing {}: {e}", target.display()));
        self.file.flush().map_err(fail)?;
        fs::rename(&self.path, target).map_err(fail)?;
        self.done = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.done {
            let _ = fs::remove_file(&self.path);
        }
    }
}

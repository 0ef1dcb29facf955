//! Files in and out of a kernel: Backend.AI's `upload_file`, `download_file`,
//! `download_single` and `list_files`, through the engine's archive API (no tool of the image);
//! a chunked upload's or download's bytes go straight to or from the kernel's filesystem where
//! the agent can reach it through the container's root ([`direct`]).
//!
//! Paths are relative to `/home/work` ([`WORK_DIR`]). Each is resolved inside the container one
//! component at a time ([`resolve`]): a symlink is followed only while its target stays under
//! `/home/work`, so `../etc/x`, `/etc/passwd` and a link `out -> /etc` are all refused with
//! [`FileError::InvalidPath`] before anything is read or written. (The kernel's own processes
//! may change a link between the check and the transfer; the engine confines either to the
//! kernel's own filesystem.)

pub mod direct;
pub mod listing;
pub mod tar;
pub mod transfer;
pub mod whole;

use std::collections::VecDeque;
use std::sync::Arc;

use futures::StreamExt;

use self::tar::{Entry, EntryKind, TarReader};
use crate::agent::backend::{BackendError, ContainerBackend};
use crate::rpc::failure::Failure;

/// The root every file path is relative to.
pub const WORK_DIR: &str = "/home/work";

/// Symlinks followed in one resolution before giving up (Linux's `MAXSYMLINKS`).
const MAX_SYMLINKS: usize = 40;

/// Why a file operation was refused.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The path is absolute outside `/home/work`, has `..`, or resolves outside `/home/work`;
    /// or it names a directory where a file is needed (or the reverse).
    #[error("invalid path: {0}")]
    InvalidPath(String),
    /// Nothing at the path.
    #[error("file not found: {0}")]
    NotFound(String),
    /// An upload or download id the agent does not know (finished, or idle too long).
    #[error("transfer `{0}` not found (finished, or idle too long)")]
    TransferNotFound(String),
    /// A whole-file answer was asked for a file larger than one chunk.
    #[error("{0}")]
    TooLarge(String),
    /// The upload's data does not match its declared size.
    #[error("{0}")]
    SizeMismatch(String),
    /// The engine failed.
    #[error(transparent)]
    Engine(BackendError),
    /// Reading or writing the kernel's filesystem directly failed (a full disk, a quota): see
    /// [`direct`].
    #[error("the kernel's filesystem: {0}")]
    Io(String),
}

impl From<BackendError> for FileError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::PathNotFound(p) => FileError::NotFound(relative(&p)),
            other => FileError::Engine(other),
        }
    }
}

impl FileError {
    /// The FAILURE name on the wire.
    pub fn name(&self) -> Failure {
        match self {
            FileError::InvalidPath(_) => Failure::InvalidPath,
            FileError::NotFound(_) => Failure::FileNotFound,
            FileError::TransferNotFound(_) => Failure::TransferNotFound,
            FileError::TooLarge(_) => Failure::FileTooLarge,
            FileError::SizeMismatch(_) => Failure::UploadSizeMismatch,
            FileError::Engine(BackendError::ContainerNotFound(_)) => Failure::KernelNotRunning,
            FileError::Engine(BackendError::Unavailable(_)) => Failure::ContainerEngineUnavailable,
            FileError::Engine(_) | FileError::Io(_) => Failure::ContainerEngineError,
        }
    }
}

/// `p` as the user named it: relative to `/home/work` when under it.
fn relative(p: &str) -> String {
    p.strip_prefix(WORK_DIR)
        .map(|r| r.trim_start_matches('/'))
        .map(|r| if r.is_empty() { "." } else { r })
        .unwrap_or(p)
        .to_owned()
}

/// The components of a user's path under `/home/work` (`.` and empty ones dropped): relative
/// to it, or absolute inside it (`/home/work/a` is `a`), as upstream's agent takes them (its
/// `download_file` / `download_single` join the path to `/home/work` and accept what stays
/// under it: `ai/backend/agent/docker/kernel.py`; the manager passes a user's path through).
///
/// Errors: [`FileError::InvalidPath`] for an absolute path outside `/home/work`, a `..`
/// component, a NUL byte, or more than 4096 bytes.
pub fn components(path: &str) -> Result<Vec<String>, FileError> {
    let path = match path.strip_prefix(WORK_DIR) {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => rest.trim_start_matches('/'),
        _ => path,
    };
    if path.starts_with('/') {
        return Err(FileError::InvalidPath(format!(
            "`{path}` is absolute and not under {WORK_DIR}; paths are relative to it"
        )));
    }
    if path.contains('\0') || path.len() > 4096 {
        return Err(FileError::InvalidPath(format!(
            "`{}` has a NUL byte or is too long",
            path.escape_default()
        )));
    }
    let parts: Vec<String> = path
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_owned)
        .collect();
    if parts.iter().any(|c| c == "..") {
        return Err(FileError::InvalidPath(format!(
            "`{path}` has a `..` component"
        )));
    }
    Ok(parts)
}

/// The absolute container path of `parts` under `/home/work`.
pub fn absolute(parts: &[String]) -> String {
    let mut p = WORK_DIR.to_owned();
    for c in parts {
        p.push('/');
        p.push_str(c);
    }
    p
}

/// Where a path leads inside the container.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// The deepest existing component, symlinks resolved, as components under `/home/work`.
    pub existing: Vec<String>,
    /// Its entry (`None` for `/home/work` itself, a directory).
    pub entry: Option<Entry>,
    /// The components after it that do not exist (empty: the whole path exists).
    pub missing: Vec<String>,
}

impl Resolved {
    /// The whole path exists.
    pub fn exists(&self) -> bool {
        self.missing.is_empty()
    }

    /// The existing part is a directory.
    pub fn is_dir(&self) -> bool {
        self.entry.as_ref().is_none_or(|e| e.kind == EntryKind::Dir)
    }
}

/// The first archive entry of `path` in the container: what it is (a directory's content is
/// not read: the stream is dropped after the first header). `None` when it does not exist.
///
/// Errors: [`FileError::Engine`].
pub async fn stat(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    path: &str,
) -> Result<Option<Entry>, FileError> {
    let mut reader = TarReader::new(backend.archive_get(container_id, path).boxed());
    match reader.next_entry().await {
        Ok(entry) => Ok(entry),
        Err(BackendError::PathNotFound(_)) => Ok(None),
        Err(e) => Err(FileError::Engine(e)),
    }
}

/// The regular file at the relative `path`, resolved as [`resolve`] does: its archive stream
/// positioned at its data, and its entry (size, mode). What a whole-file read and a chunked
/// download share.
///
/// Errors: [`FileError::NotFound`]; [`FileError::InvalidPath`] for a directory or another
/// non-file, and what [`resolve`] refuses; [`FileError::Engine`].
pub async fn open_file(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    path: &str,
) -> Result<(TarReader, Entry), FileError> {
    let r = resolve(backend, container_id, path).await?;
    if !r.exists() {
        return Err(FileError::NotFound(path.to_owned()));
    }
    if r.is_dir() {
        return Err(FileError::InvalidPath(format!(
            "`{path}` is a directory (list it instead)"
        )));
    }
    let mut reader = TarReader::new(backend.archive_get(container_id, &absolute(&r.existing)));
    let entry = reader
        .next_entry()
        .await?
        .ok_or_else(|| FileError::NotFound(path.to_owned()))?;
    if entry.kind != EntryKind::File {
        return Err(FileError::InvalidPath(format!(
            "`{path}` is not a regular file"
        )));
    }
    Ok((reader, entry))
}

/// Resolves the relative `path` inside the container, following symlinks only while they stay
/// under `/home/work`.
///
/// Errors: [`FileError::InvalidPath`] for what [`components`] refuses, a symlink leading out of
/// `/home/work` (or more than 40 of them), or a non-directory used as a directory;
/// [`FileError::Engine`].
pub async fn resolve(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    path: &str,
) -> Result<Resolved, FileError> {
    let mut queue: VecDeque<String> = components(path)?.into();
    let mut cur: Vec<String> = Vec::new();
    let mut entry: Option<Entry> = None;
    let mut links = 0;
    while let Some(c) = queue.pop_front() {
        if entry.as_ref().is_some_and(|e| e.kind != EntryKind::Dir) {
            return Err(FileError::InvalidPath(format!(
                "`{path}`: `{}` is not a directory",
                relative(&absolute(&cur))
            )));
        }
        let mut next = cur.clone();
        next.push(c.clone());
        let candidate = absolute(&next);
        match stat(backend, container_id, &candidate).await? {
            None => {
                let mut missing = vec![c];
                missing.extend(queue);
                return Ok(Resolved {
                    existing: cur,
                    entry,
                    missing,
                });
            }
            Some(Entry {
                kind: EntryKind::Symlink(target),
                ..
            }) => {
                links += 1;
                if links > MAX_SYMLINKS {
                    return Err(FileError::InvalidPath(format!(
                        "`{path}`: too many levels of symbolic links"
                    )));
                }
                let mut full: Vec<String> = if target.starts_with('/') {
                    Vec::new()
                } else {
                    ["home", "work"]
                        .iter()
                        .map(|s| s.to_string())
                        .chain(cur.iter().cloned())
                        .collect()
                };
                for part in target.split('/') {
                    match part {
                        "" | "." => {}
                        ".." => {
                            full.pop();
                        }
                        p => full.push(p.to_owned()),
                    }
                }
                if full.len() < 2 || full[0] != "home" || full[1] != "work" {
                    return Err(FileError::InvalidPath(format!(
                        "`{path}`: `{}` is a symlink to `{target}`, outside {WORK_DIR}",
                        relative(&candidate)
                    )));
                }
                // Walk the target again from /home/work: its own components may be links.
                for part in full.into_iter().skip(2).rev() {
                    queue.push_front(part);
                }
                cur.clear();
                entry = None;
            }
            Some(e) => {
                cur = next;
                entry = Some(e);
            }
        }
    }
    Ok(Resolved {
        existing: cur,
        entry,
        missing: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_refuse_escapes() {
        assert_eq!(components("a/./b//c").unwrap(), vec!["a", "b", "c"]);
        assert!(components("").unwrap().is_empty());
        // Absolute inside /home/work, as upstream's agent takes them.
        assert_eq!(components("/home/work/a/b").unwrap(), vec!["a", "b"]);
        assert!(components("/home/work").unwrap().is_empty());
        assert!(components("/home/work/").unwrap().is_empty());
        for bad in [
            "../etc/x",
            "a/../../x",
            "/etc/passwd",
            "a\0b",
            "/home/workx/a",
            "/home/work/../etc/passwd",
            "/home/work//etc/passwd/../..",
            "/home/w",
        ] {
            assert!(
                matches!(components(bad), Err(FileError::InvalidPath(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn relative_names_paths_as_users_do() {
        assert_eq!(relative("/home/work/a/b"), "a/b");
        assert_eq!(relative("/home/work"), ".");
        assert_eq!(relative("/etc"), "/etc");
    }
}

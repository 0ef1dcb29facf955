//! `list_files`: a directory's entries, read by `find` and `stat` run in the container.
//!
//! Why not the archive API: an archive of a directory carries everything under it (vfolders
//! mounted under `/home/work` included), so listing names that way would take time in
//! proportion to the data. The path is still resolved and checked through the archive API
//! first ([`super::resolve`]); the command gets it as an argument (no shell).

use std::sync::Arc;

use futures::StreamExt;

use super::{absolute, resolve, FileError};
use crate::agent::backend::{exec_exit_code, BackendError, ContainerBackend, ExecSpec};

/// Entries listed at most; a larger directory's listing is cut there (`truncated`).
pub const MAX_ENTRIES: usize = 10_000;

/// Output bytes read at most (about 400 bytes per entry).
const MAX_OUTPUT: usize = 4 << 20;

/// One directory entry: Backend.AI's `{"name", "type", "size", "mode", "mtime"}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileEntry {
    /// Name in the directory.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: &'static str,
    /// Bytes.
    pub size: u64,
    /// Permission bits (`0o644`).
    pub mode: u32,
    /// Modification time, Unix seconds.
    pub mtime: u64,
}

/// A listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Entries sorted by name.
    pub files: Vec<FileEntry>,
    /// More than [`MAX_ENTRIES`] entries: the rest were left out.
    pub truncated: bool,
}

/// Lists the directory `path` (relative to `/home/work`; empty for itself).
///
/// Errors: [`FileError::InvalidPath`] (escapes, not a directory), [`FileError::NotFound`],
/// [`FileError::Engine`] (also when the image has no `find` or `stat`).
pub async fn list(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    path: &str,
) -> Result<Listing, FileError> {
    let r = resolve(backend, container_id, path).await?;
    if !r.exists() {
        return Err(FileError::NotFound(path.to_owned()));
    }
    if !r.is_dir() {
        return Err(FileError::InvalidPath(format!(
            "`{path}` is not a directory"
        )));
    }
    let dir = absolute(&r.existing);
    let spec = ExecSpec {
        cmd: [
            "find",
            &dir,
            "-mindepth",
            "1",
            "-maxdepth",
            "1",
            "-exec",
            "stat",
            "-c",
            "%f %s %Y %n",
            "{}",
            "+",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        ..Default::default()
    };
    let mut session = backend.exec_start(container_id, spec).await?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut cut = false;
    while let Some(chunk) = session.output.next().await {
        let (stream, bytes) = chunk?;
        let sink = match stream {
            crate::agent::backend::OutputStream::Stdout => &mut out,
            crate::agent::backend::OutputStream::Stderr => &mut err,
        };
        if sink.len() + bytes.len() > MAX_OUTPUT {
            cut = true;
            break;
        }
        sink.extend_from_slice(&bytes);
    }
    if cut {
        let _ = backend.exec_kill(&session.exec_id).await;
    }
    let mut listing = parse(&String::from_utf8_lossy(&out), &dir);
    if !cut && listing.files.is_empty() {
        // Nothing listed: an empty directory, or a command that could not run.
        let code = exec_exit_code(backend.as_ref(), &session.exec_id).await;
        if code.is_some_and(|c| c != 0) {
            let said = [out, err].concat();
            return Err(FileError::Engine(BackendError::Engine(format!(
                "listing `{path}` failed (the image needs `find` and `stat`): {}",
                String::from_utf8_lossy(&said).trim()
            ))));
        }
    }
    listing.truncated |= cut;
    Ok(listing)
}

/// Parses `stat -c '%f %s %Y %n'` lines of entries of `dir`. A line that does not start a new
/// record continues the previous name (a name with a newline).
fn parse(text: &str, dir: &str) -> Listing {
    let prefix = format!("{dir}/");
    let mut files: Vec<FileEntry> = Vec::new();
    for line in text.split('\n') {
        let mut it = line.splitn(4, ' ');
        let record = (|| {
            let raw = u32::from_str_radix(it.next()?, 16).ok()?;
            let size = it.next()?.parse().ok()?;
            let mtime = it.next()?.parse().ok()?;
            let name = it.next()?.strip_prefix(&prefix)?.to_owned();
            let kind = match raw & 0o170000 {
                0o100000 => "file",
                0o040000 => "dir",
                0o120000 => "symlink",
                _ => "other",
            };
            Some(FileEntry {
                name,
                kind,
                size,
                mode: raw & 0o7777,
                mtime,
            })
        })();
        match (record, files.last_mut()) {
            (Some(e), _) => files.push(e),
            (None, Some(last)) if !line.is_empty() => {
                last.name.push('\n');
                last.name.push_str(line);
            }
            _ => {}
        }
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    let truncated = files.len() > MAX_ENTRIES;
    files.truncate(MAX_ENTRIES);
    Listing { files, truncated }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_busybox_stat_lines() {
        let text = "41ed 4096 1795435945 /home/work/d\n81a4 3 1795435945 /home/work/a b\na1ff 4 17 /home/work/out\n81a4 0 1 /home/work/two\nlines\n";
        let l = parse(text, "/home/work");
        let names: Vec<_> = l.files.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, vec!["a b", "d", "out", "two\nlines"]);
        assert_eq!(l.files[0].kind, "file");
        assert_eq!(l.files[0].mode, 0o644);
        assert_eq!(l.files[1].kind, "dir");
        assert_eq!(l.files[1].mode, 0o755);
        assert_eq!(l.files[2].kind, "symlink");
        assert!(!l.truncated);
    }
}

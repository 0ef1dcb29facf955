//! `list_files`: a directory's entries, read from the engine's archive API (no tool of the image
//! is used: images without `find`, `stat` or even a shell are listed alike).
//!
//! The archive of a directory carries everything under it (vfolders mounted under
//! `/home/work` included), so the listing reads its tar headers as they stream by, keeps the
//! entries one level deep and skips the rest without holding it (one engine chunk at a time).
//! Reading takes time in proportion to the data under the directory: a listing stops after
//! [`SCAN_BUDGET`] or [`MAX_ENTRIES`] entries and says it was cut (`truncated`).

use std::sync::Arc;
use std::time::Duration;

use super::tar::{EntryKind, TarReader};
use super::{absolute, resolve, FileError};
use crate::agent::backend::ContainerBackend;

/// Entries listed at most; a larger directory's listing is cut there (`truncated`).
pub const MAX_ENTRIES: usize = 10_000;

/// Longest a listing reads the archive before it answers with what it found (`truncated`).
pub const SCAN_BUDGET: Duration = Duration::from_secs(20);

/// One directory entry: Backend.AI's `{"name", "type", "size", "mode", "mtime"}`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileEntry {
    /// Name in the directory.
    pub name: String,
    /// `file`, `dir`, `symlink` or `other`.
    pub kind: &'static str,
    /// Bytes (a symlink: the length of its target, as `lstat` says; a directory: 0).
    pub size: u64,
    /// Permission bits with set-id and sticky bits (`0o644`).
    pub mode: u32,
    /// Modification time, Unix seconds.
    pub mtime: u64,
}

impl FileEntry {
    /// `stat.filemode` of the entry: `-rw-r--r--`, `drwxr-xr-x`, `lrwxrwxrwx`, `?` for the
    /// type of an `other` entry.
    pub fn filemode(&self) -> String {
        let mut s = String::with_capacity(10);
        s.push(match self.kind {
            "file" => '-',
            "dir" => 'd',
            "symlink" => 'l',
            _ => '?',
        });
        let m = self.mode;
        for (shift, special, set, unset) in [(6, 0o4000, 's', 'S'), (3, 0o2000, 's', 'S')] {
            let bits = (m >> shift) & 7;
            s.push(if bits & 4 != 0 { 'r' } else { '-' });
            s.push(if bits & 2 != 0 { 'w' } else { '-' });
            s.push(match (m & special != 0, bits & 1 != 0) {
                (true, true) => set,
                (true, false) => unset,
                (false, true) => 'x',
                (false, false) => '-',
            });
        }
        let bits = m & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (m & 0o1000 != 0, bits & 1 != 0) {
            (true, true) => 't',
            (true, false) => 'T',
            (false, true) => 'x',
            (false, false) => '-',
        });
        s
    }
}

/// A listing.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    /// Entries in the archive's order (sorted by name).
    pub files: Vec<FileEntry>,
    /// The listing was cut: more than [`MAX_ENTRIES`] entries, or [`SCAN_BUDGET`] spent.
    pub truncated: bool,
    /// Why it was cut, for a person.
    pub note: Option<String>,
}

/// Lists the directory `path` (relative to `/home/work`; empty for itself).
///
/// Errors: [`FileError::InvalidPath`] (escapes, not a directory), [`FileError::NotFound`],
/// [`FileError::Engine`].
pub async fn list(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    path: &str,
) -> Result<Listing, FileError> {
    list_within(backend, container_id, path, SCAN_BUDGET).await
}

/// [`list`] with a scan budget of `budget`.
pub async fn list_within(
    backend: &Arc<dyn ContainerBackend>,
    container_id: &str,
    path: &str,
    budget: Duration,
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
    let mut reader = TarReader::new(backend.archive_get(container_id, &dir));
    let deadline = tokio::time::Instant::now() + budget;
    let mut listing = Listing::default();
    // The archive's first entry is the directory itself, named as its last component.
    let Some(root) = reader.next_entry().await? else {
        return Ok(listing);
    };
    let prefix = format!("{}/", root.path);
    loop {
        let next = match tokio::time::timeout_at(deadline, reader.next_entry()).await {
            Ok(next) => next?,
            Err(_) => {
                listing.truncated = true;
                listing.note = Some(format!(
                    "listing cut after {} s reading the directory's archive (entries after `{}` may be missing)",
                    budget.as_secs_f64(),
                    listing.files.last().map_or("", |f| f.name.as_str())
                ));
                break;
            }
        };
        let Some(entry) = next else { break };
        let Some(name) = entry.path.strip_prefix(&prefix) else {
            continue;
        };
        if name.is_empty() || name.contains('/') {
            continue; // Deeper than one level.
        }
        if listing.files.len() == MAX_ENTRIES {
            listing.truncated = true;
            listing.note = Some(format!(
                "more than {MAX_ENTRIES} entries: the rest left out"
            ));
            break;
        }
        let (kind, size) = match &entry.kind {
            EntryKind::File => ("file", entry.size),
            EntryKind::Dir => ("dir", 0),
            EntryKind::Symlink(target) => ("symlink", target.len() as u64),
            EntryKind::Other => ("other", 0),
        };
        listing.files.push(FileEntry {
            name: name.to_owned(),
            kind,
            size,
            mode: entry.mode,
            mtime: entry.mtime,
        });
    }
    Ok(listing)
}

/// `s` as Python's `json.dumps` writes a string (`ensure_ascii`): quoted, `"` `\` and control
/// characters escaped, everything outside printable ASCII as `\uXXXX` (UTF-16 surrogate pairs above the
/// BMP).
pub fn py_json_str(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if !(' '..='~').contains(&c) => {
                let mut units = [0u16; 2];
                for u in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{u:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// `f` as Python's `repr` of a float writes it, for the values a listing has (Unix times).
fn py_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e16 {
        format!("{f:.1}")
    } else {
        format!("{f:?}")
    }
}

/// The listing as upstream's in-kernel script prints it: `json.dumps` of
/// `[{"mode", "size", "ctime", "mtime", "atime", "filename"}]` and a newline. The engine's
/// archives carry only the modification time: `ctime` and `atime` are it too.
pub fn upstream_json(files: &[FileEntry]) -> String {
    let mut out = String::from("[");
    for (i, f) in files.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let t = py_float(f.mtime as f64);
        out.push_str("{\"mode\": ");
        py_json_str(&f.filemode(), &mut out);
        out.push_str(&format!(
            ", \"size\": {}, \"ctime\": {t}, \"mtime\": {t}, \"atime\": {t}, \"filename\": ",
            f.size
        ));
        py_json_str(&f.name, &mut out);
        out.push('}');
    }
    out.push_str("]\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, kind: &'static str, mode: u32) -> FileEntry {
        FileEntry {
            name: name.into(),
            kind,
            size: 3,
            mode,
            mtime: 1_795_435_945,
        }
    }

    #[test]
    fn filemode_as_python_writes_it() {
        assert_eq!(entry("a", "file", 0o644).filemode(), "-rw-r--r--");
        assert_eq!(entry("d", "dir", 0o755).filemode(), "drwxr-xr-x");
        assert_eq!(entry("l", "symlink", 0o777).filemode(), "lrwxrwxrwx");
        assert_eq!(entry("s", "file", 0o4755).filemode(), "-rwsr-xr-x");
        assert_eq!(entry("g", "file", 0o2644).filemode(), "-rw-r-Sr--");
        assert_eq!(entry("t", "dir", 0o1777).filemode(), "drwxrwxrwt");
    }

    #[test]
    fn json_as_python_dumps_it() {
        let files = [entry("a b", "file", 0o644), entry("é\"\n😀", "dir", 0o700)];
        assert_eq!(
            upstream_json(&files),
            "[{\"mode\": \"-rw-r--r--\", \"size\": 3, \"ctime\": 1795435945.0, \"mtime\": 1795435945.0, \"atime\": 1795435945.0, \"filename\": \"a b\"}, \
             {\"mode\": \"drwx------\", \"size\": 3, \"ctime\": 1795435945.0, \"mtime\": 1795435945.0, \"atime\": 1795435945.0, \"filename\": \"\\u00e9\\\"\\n\\ud83d\\ude00\"}]\n"
        );
        assert_eq!(upstream_json(&[]), "[]\n");
        let v: serde_json::Value = serde_json::from_str(&upstream_json(&files)).unwrap();
        assert_eq!(v[1]["filename"], "é\"\n😀");
    }
}

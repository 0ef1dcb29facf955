//! The kernel's filesystem opened directly, without the engine's archive API: through
//! `/proc/<pid>/root` of the container's init process, so every path is the container's own
//! view (its `/home/work` scratch, vfolders and volumes mounted under it, the image's layers).
//!
//! Upstream's Docker agent writes an upload straight into the kernel's host-side work directory
//! (`ai/backend/agent/docker/kernel.py`, `DockerKernel.accept_file`); this does the same through
//! the container's root, which also reaches what is mounted under `/home/work`. Moving a file
//! this way is plain `read`/`write` on the agent's side: no tar is made, and the engine is not
//! in the data path (its archive API pipes every byte through a re-executed `dockerd` that
//! untars it in the container's root).
//!
//! Safety: every path is opened with `openat2(2)` relative to the container's root with
//! `RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`, after [`super::resolve`]
//! resolved its symlinks inside `/home/work`: `..` cannot climb above the container's root, and
//! a symlink the kernel puts on the way between that check and the open is refused rather than
//! followed (it never leads to the agent's own filesystem). Directories and files are made one
//! component at a time relative to an already-opened parent (`mkdirat`, `openat2` with
//! `RESOLVE_BENEATH`), never through a path the kernel could redirect.
//!
//! Where any of this is unavailable (no init pid known, the agent in another pid namespace, no
//! `openat2`, no permission), [`KernelRoot::open`] answers `None` and the caller uses the
//! archive API.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;

use super::FileError;
use crate::agent::backend::ContainerBackend;

/// Permission bits of an uploaded file (as the archive path's tar header has them).
const FILE_MODE: libc::mode_t = 0o644;
/// Permission bits of a directory made for an upload.
const DIR_MODE: libc::mode_t = 0o755;

/// The root directory of a running container, open.
#[derive(Debug)]
pub struct KernelRoot {
    fd: OwnedFd,
}

/// `openat2(dirfd, path, flags, mode, resolve)`.
fn openat2(
    dirfd: &impl AsRawFd,
    path: &str,
    flags: i32,
    mode: libc::mode_t,
    resolve: u64,
) -> io::Result<OwnedFd> {
    let path = CString::new(path).map_err(io::Error::other)?;
    // SAFETY: `open_how` is plain data (non-exhaustive in libc, so built zeroed); the kernel
    // reads `size_of` bytes of it.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (flags | libc::O_CLOEXEC) as u64;
    how.mode = u64::from(mode);
    how.resolve = resolve;
    // SAFETY: valid fd, NUL-terminated path and a live `open_how` for the call's duration.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dirfd.as_raw_fd(),
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new descriptor this function now owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Inside the container's root, no symlink followed, no `..` above the root.
const IN_ROOT: u64 =
    libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
/// One component below an open directory, no symlink followed.
const BENEATH: u64 =
    libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;

fn cstr(name: &str) -> io::Result<CString> {
    CString::new(name).map_err(io::Error::other)
}

fn check(rc: libc::c_int) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `/home/work/<parts>` as a path relative to the container's root.
fn in_work(parts: &[String]) -> String {
    let mut p = String::from("home/work");
    for c in parts {
        p.push('/');
        p.push_str(c);
    }
    p
}

/// An open file of the kernel and what the archive path reports of it.
#[derive(Debug)]
pub struct OpenedFile {
    /// The file, open for reading.
    pub file: File,
    /// Its size in bytes when opened.
    pub size: u64,
    /// Its permission bits.
    pub mode: u32,
    /// Its modification time, Unix seconds.
    pub mtime: u64,
}

impl KernelRoot {
    /// The root of `container_id` through its init process's `/proc/<pid>/root`, checked to
    /// still be that container's (the engine reports the same pid, running, after the open);
    /// `None` where it cannot be used (see the module's doc): the caller then uses the archive
    /// API.
    pub async fn open(
        backend: &Arc<dyn ContainerBackend>,
        container_id: &str,
    ) -> Option<KernelRoot> {
        let pid = backend
            .inspect_container(container_id)
            .await
            .ok()
            .flatten()
            .filter(|s| s.running)
            .and_then(|s| s.pid)
            .filter(|p| *p > 1)?;
        let root = File::open("/")
            .and_then(|slash| {
                openat2(
                    &slash,
                    &format!("proc/{pid}/root"),
                    libc::O_PATH | libc::O_DIRECTORY,
                    0,
                    0,
                )
            })
            .ok()?;
        // The pid may have been reused between the inspect and the open: the same answer after
        // it means the descriptor is this container's root.
        let again = backend
            .inspect_container(container_id)
            .await
            .ok()
            .flatten()?;
        (again.running && again.pid == Some(pid)).then_some(KernelRoot { fd: root })
    }

    /// Opens the regular file at `/home/work/<parts>` (a path already resolved: no symlink on
    /// it) for reading.
    ///
    /// Errors: [`FileError::InvalidPath`] when it is not a regular file or a symlink turned up
    /// on the way; [`FileError::NotFound`]; other I/O as [`FileError::Io`].
    pub fn open_file(&self, parts: &[String], shown: &str) -> Result<OpenedFile, FileError> {
        // O_NONBLOCK: a FIFO put there meanwhile must not block the open; it is refused below.
        let fd = openat2(
            &self.fd,
            &in_work(parts),
            libc::O_RDONLY | libc::O_NOCTTY | libc::O_NONBLOCK,
            0,
            IN_ROOT,
        )
        .map_err(|e| io_error(e, shown))?;
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| io_error(e, shown))?;
        if !meta.file_type().is_file() {
            return Err(FileError::InvalidPath(format!(
                "`{shown}` is not a regular file"
            )));
        }
        Ok(OpenedFile {
            size: meta.len(),
            mode: meta.mode() & 0o7777,
            mtime: u64::try_from(meta.mtime()).unwrap_or(0),
            file,
        })
    }

    /// Starts writing `name` in the directory `/home/work/<dir>` (resolved), making the
    /// directories `missing` below it first (each owned by `uid`:`gid`, mode 0755): the data goes
    /// to a new hidden file beside it, owned by `uid`:`gid`, mode 0644, renamed over `name` by
    /// [`HostUpload::commit`]. Until then the old file (if any) is untouched.
    ///
    /// Errors: [`FileError::InvalidPath`] for a symlink or non-directory on the way;
    /// [`FileError::Io`].
    pub fn begin_upload(
        &self,
        dir: &[String],
        missing: &[String],
        name: &str,
        uid: u32,
        gid: u32,
        tag: &str,
    ) -> Result<HostUpload, FileError> {
        let shown = || in_work(dir).trim_start_matches("home/work").to_owned();
        let mut parent = openat2(
            &self.fd,
            &in_work(dir),
            libc::O_PATH | libc::O_DIRECTORY,
            0,
            IN_ROOT,
        )
        .map_err(|e| io_error(e, &shown()))?;
        for d in missing {
            let c = cstr(d).map_err(|e| io_error(e, d))?;
            // SAFETY: valid dirfd and NUL-terminated single-component name.
            match check(unsafe { libc::mkdirat(parent.as_raw_fd(), c.as_ptr(), DIR_MODE) }) {
                Ok(()) => {
                    // SAFETY: as above; the new directory itself, never a link's target.
                    check(unsafe {
                        libc::fchownat(
                            parent.as_raw_fd(),
                            c.as_ptr(),
                            uid,
                            gid,
                            libc::AT_SYMLINK_NOFOLLOW,
                        )
                    })
                    .map_err(|e| io_error(e, d))?;
                }
                // Made meanwhile (a concurrent upload): used if it is a directory, below.
                Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {}
                Err(e) => return Err(io_error(e, d)),
            }
            parent = openat2(&parent, d, libc::O_PATH | libc::O_DIRECTORY, 0, BENEATH)
                .map_err(|e| io_error(e, d))?;
        }
        let tmp = format!(".{name}.kv-upload-{tag}");
        let fd = openat2(
            &parent,
            &tmp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOCTTY,
            FILE_MODE,
            BENEATH,
        )
        .map_err(|e| io_error(e, name))?;
        let upload = HostUpload {
            dir: parent,
            tmp,
            name: name.to_owned(),
            file: File::from(fd),
            committed: false,
        };
        // fchown(2) on the new file itself; the umask may have narrowed the mode: set it too.
        // SAFETY: valid descriptor.
        check(unsafe { libc::fchown(upload.file.as_raw_fd(), uid, gid) })
            .and_then(|()| check(unsafe { libc::fchmod(upload.file.as_raw_fd(), FILE_MODE) }))
            .map_err(|e| io_error(e, name))?;
        Ok(upload)
    }
}

/// An I/O error on `shown` (a path as the user named it) as a [`FileError`].
fn io_error(e: io::Error, shown: &str) -> FileError {
    match e.raw_os_error() {
        Some(libc::ENOENT) => FileError::NotFound(shown.to_owned()),
        Some(libc::ELOOP) | Some(libc::EXDEV) => FileError::InvalidPath(format!(
            "`{shown}`: a symbolic link turned up on the way (changed while being copied?)"
        )),
        Some(libc::ENOTDIR) => FileError::InvalidPath(format!("`{shown}`: not a directory")),
        Some(libc::EISDIR) => FileError::InvalidPath(format!("`{shown}` is a directory")),
        _ => FileError::Io(format!("`{shown}`: {e}")),
    }
}

/// An upload being written to its hidden file; removed again unless committed.
#[derive(Debug)]
pub struct HostUpload {
    dir: OwnedFd,
    tmp: String,
    name: String,
    file: File,
    committed: bool,
}

impl HostUpload {
    /// Renames the written file over its name (replacing a file there atomically).
    ///
    /// Errors: [`FileError::InvalidPath`] when a directory took its name; [`FileError::Io`].
    pub fn commit(mut self) -> Result<(), FileError> {
        let (from, to) = (
            cstr(&self.tmp).map_err(|e| io_error(e, &self.name))?,
            cstr(&self.name).map_err(|e| io_error(e, &self.name))?,
        );
        // SAFETY: valid dirfd and single-component NUL-terminated names.
        check(unsafe {
            libc::renameat(
                self.dir.as_raw_fd(),
                from.as_ptr(),
                self.dir.as_raw_fd(),
                to.as_ptr(),
            )
        })
        .map_err(|e| io_error(e, &self.name))?;
        self.committed = true;
        Ok(())
    }

    /// Writes everything `rx` brings until it closes, then commits once exactly `size` bytes
    /// came (fewer: the hidden file is removed and the old one left as it was). Blocking: run
    /// it on a blocking thread; `rx` is the bounded queue the upload's calls feed, so a slow
    /// disk slows them.
    ///
    /// Errors: [`FileError::SizeMismatch`] for a short upload; [`FileError::Io`].
    pub fn write_all_from(
        mut self,
        mut rx: mpsc::Receiver<Bytes>,
        size: u64,
    ) -> Result<(), FileError> {
        let mut written = 0u64;
        while let Some(chunk) = rx.blocking_recv() {
            self.file
                .write_all(&chunk)
                .map_err(|e| io_error(e, &self.name))?;
            written += chunk.len() as u64;
        }
        if written != size {
            return Err(FileError::SizeMismatch(format!(
                "{written} bytes received of the declared {size}"
            )));
        }
        self.commit()
    }
}

impl Drop for HostUpload {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        if let Ok(tmp) = cstr(&self.tmp) {
            // SAFETY: valid dirfd and single-component name; unlinks the entry, never follows.
            unsafe { libc::unlinkat(self.dir.as_raw_fd(), tmp.as_ptr(), 0) };
        }
    }
}

/// Reads the next at most `max` bytes of `f`, stopping at `left` (the size it had when opened).
///
/// Errors: [`FileError::Io`]; a file that ends before `left` ([`FileError::Io`]: it shrank
/// while being copied).
pub fn read_chunk(f: &mut OpenedFile, left: u64, max: usize) -> Result<Bytes, FileError> {
    let want = (left.min(max as u64)) as usize;
    let mut buf = Vec::with_capacity(want);
    (&f.file)
        .take(want as u64)
        .read_to_end(&mut buf)
        .map_err(|e| FileError::Io(e.to_string()))?;
    if buf.len() < want {
        return Err(FileError::Io(format!(
            "the file ended {} bytes early (it shrank while being copied)",
            left - buf.len() as u64
        )));
    }
    Ok(Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fake container root: a directory with `home/work` in it.
    fn root() -> (tempfile::TempDir, KernelRoot) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("home/work")).unwrap();
        let fd = File::open(dir.path()).unwrap();
        (dir, KernelRoot { fd: fd.into() })
    }

    fn parts(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    fn feed(up: HostUpload, chunks: &[&[u8]], size: u64) -> Result<(), FileError> {
        let (tx, rx) = mpsc::channel(chunks.len().max(1));
        for c in chunks {
            tx.try_send(Bytes::copy_from_slice(c)).unwrap();
        }
        drop(tx);
        up.write_all_from(rx, size)
    }

    #[test]
    fn an_upload_appears_whole_with_its_owner_or_not_at_all() {
        let (dir, root) = root();
        let work = dir.path().join("home/work");
        std::fs::write(work.join("f.txt"), b"old").unwrap();
        // Another user's ids need root; without it, the test's own.
        // SAFETY: plain getters.
        let (uid, gid) = if unsafe { libc::geteuid() } == 0 {
            (4321, 8765)
        } else {
            unsafe { (libc::getuid(), libc::getgid()) }
        };
        // Short: the old file stays, no hidden file is left.
        let up = root
            .begin_upload(&[], &[], "f.txt", uid, gid, "t1")
            .unwrap();
        assert!(matches!(
            feed(up, &[b"new"], 6),
            Err(FileError::SizeMismatch(_))
        ));
        assert_eq!(std::fs::read(work.join("f.txt")).unwrap(), b"old");
        assert_eq!(std::fs::read_dir(&work).unwrap().count(), 1);
        // Whole: replaced, into directories made on the way, all owned by the kernel's user.
        let up = root
            .begin_upload(&[], &parts(&["a", "b"]), "g.bin", uid, gid, "t2")
            .unwrap();
        feed(up, &[b"abc", b"def"], 6).unwrap();
        let g = work.join("a/b/g.bin");
        assert_eq!(std::fs::read(&g).unwrap(), b"abcdef");
        for p in [work.join("a"), work.join("a/b"), g.clone()] {
            let m = std::fs::metadata(&p).unwrap();
            assert_eq!((m.uid(), m.gid()), (uid, gid), "{}", p.display());
        }
        assert_eq!(
            std::fs::metadata(&g).unwrap().permissions().mode() & 0o7777,
            0o644
        );
        assert_eq!(
            std::fs::metadata(work.join("a"))
                .unwrap()
                .permissions()
                .mode()
                & 0o7777,
            0o755
        );
        let up = root
            .begin_upload(&[], &[], "f.txt", uid, gid, "t3")
            .unwrap();
        feed(up, &[b"newer"], 5).unwrap();
        assert_eq!(std::fs::read(work.join("f.txt")).unwrap(), b"newer");
    }

    #[test]
    fn a_symlink_on_the_way_is_refused_not_followed() {
        let (dir, root) = root();
        let work = dir.path().join("home/work");
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        std::os::unix::fs::symlink(outside.path(), work.join("out")).unwrap();
        std::os::unix::fs::symlink("/etc", work.join("etc")).unwrap();
        // As if the kernel made the links after the path was resolved.
        for d in ["out", "etc"] {
            assert!(matches!(
                root.begin_upload(&parts(&[d]), &[], "x", 0, 0, "t"),
                Err(FileError::InvalidPath(_))
            ));
            assert!(matches!(
                root.open_file(&parts(&[d, "secret"]), d),
                Err(FileError::InvalidPath(_))
            ));
        }
        assert!(matches!(
            root.begin_upload(&[], &parts(&["out"]), "x", 0, 0, "t"),
            Err(FileError::InvalidPath(_))
        ));
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
        // `..` stays inside the root (the fake root's parent is not reached).
        assert!(matches!(
            root.open_file(&parts(&["..", "..", "..", "etc", "passwd"]), "p"),
            Err(FileError::NotFound(_))
        ));
    }

    #[test]
    fn a_download_reads_the_file_in_chunks_and_refuses_non_files() {
        let (dir, root) = root();
        let work = dir.path().join("home/work");
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(work.join("d.bin"), &data).unwrap();
        std::fs::set_permissions(work.join("d.bin"), std::fs::Permissions::from_mode(0o640))
            .unwrap();
        let mut f = root.open_file(&parts(&["d.bin"]), "d.bin").unwrap();
        assert_eq!((f.size, f.mode), (10_000, 0o640));
        let (mut left, mut got) = (f.size, Vec::new());
        while left > 0 {
            let c = read_chunk(&mut f, left, 4096).unwrap();
            assert!(c.len() <= 4096);
            left -= c.len() as u64;
            got.extend_from_slice(&c);
        }
        assert_eq!(got, data);
        // A file that shrank meanwhile is an error, not a short answer.
        let mut f = root.open_file(&parts(&["d.bin"]), "d.bin").unwrap();
        std::fs::write(work.join("d.bin"), b"tiny").unwrap();
        assert!(matches!(
            read_chunk(&mut f, 10_000, 8192),
            Err(FileError::Io(_))
        ));
        // A directory or a FIFO (which would block a plain open) is not a file.
        std::fs::create_dir(work.join("sub")).unwrap();
        let fifo = CString::new(work.join("pipe").into_os_string().into_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
        for p in ["sub", "pipe"] {
            assert!(matches!(
                root.open_file(&parts(&[p]), p),
                Err(FileError::InvalidPath(_))
            ));
        }
        assert!(matches!(
            root.open_file(&parts(&["nope"]), "nope"),
            Err(FileError::NotFound(_))
        ));
    }
}

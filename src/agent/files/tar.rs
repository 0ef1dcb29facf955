//! Tar streams of the engine's archive API, read and written block by block: a file's data is
//! passed through in the chunks the engine sends, never collected.
//!
//! Formats: ustar with GNU long-name (`L`/`K`) and PAX (`x`) extension entries, as Docker
//! writes them (Go's `archive/tar`) and reads them.

use std::io;

use bytes::{Buf, Bytes, BytesMut};
use futures::stream::{BoxStream, StreamExt};
use tar::{EntryType, Header, PaxExtensions};

use crate::agent::backend::BackendError;

const BLOCK: usize = 512;

/// What an archive entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link to this target (as stored: absolute or relative).
    Symlink(String),
    /// Anything else (device, fifo, hard link).
    Other,
}

/// One archive entry's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Its path in the archive (`work/a.txt`; directories without the trailing `/`).
    pub path: String,
    /// See [`EntryKind`].
    pub kind: EntryKind,
    /// Data bytes (files).
    pub size: u64,
    /// Permission bits (`0o644`).
    pub mode: u32,
    /// Modification time, Unix seconds.
    pub mtime: u64,
}

fn bad(msg: impl Into<String>) -> BackendError {
    BackendError::Engine(format!("malformed archive from the engine: {}", msg.into()))
}

fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

/// A pull-based reader over a tar byte stream: [`next_entry`](TarReader::next_entry) then, for
/// a file, [`read_data`](TarReader::read_data) until `None`. Holds at most one engine chunk.
pub struct TarReader {
    stream: BoxStream<'static, Result<Bytes, BackendError>>,
    buf: BytesMut,
    /// Data bytes of the current entry not yet read.
    data_left: u64,
    /// Padding after them.
    pad_left: u64,
}

impl TarReader {
    /// Reads `stream`.
    pub fn new(stream: BoxStream<'static, Result<Bytes, BackendError>>) -> TarReader {
        TarReader {
            stream,
            buf: BytesMut::new(),
            data_left: 0,
            pad_left: 0,
        }
    }

    /// Makes `buf` hold at least `n` bytes; `false` when the stream ended first.
    async fn fill(&mut self, n: usize) -> Result<bool, BackendError> {
        while self.buf.len() < n {
            match self.stream.next().await {
                Some(chunk) => self.buf.extend_from_slice(&chunk?),
                None => return Ok(false),
            }
        }
        Ok(true)
    }

    /// Discards `n` bytes of the stream.
    async fn skip(&mut self, mut n: u64) -> Result<(), BackendError> {
        while n > 0 {
            if self.buf.is_empty() && !self.fill(1).await? {
                return Err(bad("truncated entry"));
            }
            let k = (self.buf.len() as u64).min(n) as usize;
            self.buf.advance(k);
            n -= k as u64;
        }
        Ok(())
    }

    /// Reads a whole extension entry's data (long names, PAX records), capped at 64 KiB.
    async fn read_small(&mut self, size: u64) -> Result<Vec<u8>, BackendError> {
        if size > 64 << 10 {
            return Err(bad(format!("extension header of {size} bytes")));
        }
        let total = (size + padding(size)) as usize;
        if !self.fill(total).await? {
            return Err(bad("truncated extension header"));
        }
        let data = self.buf.split_to(total);
        Ok(data[..size as usize].to_vec())
    }

    /// The next entry's header (skipping what is left of the current entry's data), or `None`
    /// at the end of the archive.
    ///
    /// Errors: the stream's own, or `Engine` for a malformed archive.
    pub async fn next_entry(&mut self) -> Result<Option<Entry>, BackendError> {
        let rest = self.data_left + self.pad_left;
        self.data_left = 0;
        self.pad_left = 0;
        self.skip(rest).await?;
        let (mut long_path, mut long_link, mut pax_size) = (None, None, None);
        loop {
            if !self.fill(BLOCK).await? {
                return Ok(None);
            }
            let block = self.buf.split_to(BLOCK);
            if block.iter().all(|&b| b == 0) {
                return Ok(None);
            }
            let header = Header::from_byte_slice(&block);
            let size = header
                .entry_size()
                .map_err(|e| bad(format!("entry size: {e}")))?;
            match header.entry_type() {
                EntryType::GNULongName => {
                    long_path = Some(trim_nul(self.read_small(size).await?));
                    continue;
                }
                EntryType::GNULongLink => {
                    long_link = Some(trim_nul(self.read_small(size).await?));
                    continue;
                }
                EntryType::XHeader => {
                    let data = self.read_small(size).await?;
                    for ext in PaxExtensions::new(&data).flatten() {
                        match ext.key() {
                            Ok("path") => long_path = Some(ext.value_bytes().to_vec()),
                            Ok("linkpath") => long_link = Some(ext.value_bytes().to_vec()),
                            Ok("size") => pax_size = ext.value().ok().and_then(|v| v.parse().ok()),
                            _ => {}
                        }
                    }
                    continue;
                }
                EntryType::XGlobalHeader => {
                    self.read_small(size).await?;
                    continue;
                }
                _ => {}
            }
            let path_bytes = long_path.unwrap_or_else(|| header.path_bytes().into_owned());
            let path = String::from_utf8_lossy(&path_bytes)
                .trim_end_matches('/')
                .to_owned();
            let size = pax_size.unwrap_or(size);
            let kind = match header.entry_type() {
                EntryType::Regular | EntryType::Continuous => EntryKind::File,
                EntryType::Directory => EntryKind::Dir,
                EntryType::Symlink => {
                    let target = long_link
                        .or_else(|| header.link_name_bytes().map(|c| c.into_owned()))
                        .unwrap_or_default();
                    EntryKind::Symlink(String::from_utf8_lossy(&target).into_owned())
                }
                _ => EntryKind::Other,
            };
            // Only regular files carry data in Docker's archives; a header's size is trusted
            // for them alone (a hard link's size field is zero).
            self.data_left = if kind == EntryKind::File { size } else { 0 };
            self.pad_left = padding(self.data_left);
            return Ok(Some(Entry {
                path,
                kind,
                size: self.data_left,
                mode: header.mode().unwrap_or(0) & 0o7777,
                mtime: header.mtime().unwrap_or(0),
            }));
        }
    }

    /// Data bytes of the current file not yet read.
    pub fn data_left(&self) -> u64 {
        self.data_left
    }

    /// Up to `max` bytes of the current file's data, `None` once all of it was read.
    ///
    /// Errors: the stream's own, or `Engine` when the archive ends inside the data.
    pub async fn read_data(&mut self, max: usize) -> Result<Option<Bytes>, BackendError> {
        if self.data_left == 0 {
            return Ok(None);
        }
        if self.buf.is_empty() && !self.fill(1).await? {
            return Err(bad("truncated file data"));
        }
        let k = (self.buf.len() as u64).min(self.data_left).min(max as u64) as usize;
        self.data_left -= k as u64;
        Ok(Some(self.buf.split_to(k).freeze()))
    }
}

fn trim_nul(mut v: Vec<u8>) -> Vec<u8> {
    while v.last() == Some(&0) {
        v.pop();
    }
    v
}

/// How an uploaded entry is written.
#[derive(Clone, Copy, Debug)]
pub struct Ownership {
    /// Numeric owner.
    pub uid: u64,
    /// Numeric group.
    pub gid: u64,
    /// Modification time, Unix seconds.
    pub mtime: u64,
}

/// The header block(s) of one entry: a directory (`size` `None`) or a regular file of `size`
/// bytes whose data the caller streams next, followed by [`padding_for`] zero bytes. Long
/// paths get a GNU long-name entry first (the `tar` crate's builder writes it).
///
/// Errors: `io::Error` for a path the format cannot hold (NUL bytes).
pub fn entry_header(path: &str, size: Option<u64>, owner: Ownership) -> io::Result<Bytes> {
    let mut header = Header::new_gnu();
    match size {
        None => {
            header.set_entry_type(EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
        }
        Some(n) => {
            header.set_entry_type(EntryType::Regular);
            header.set_mode(0o644);
            header.set_size(n);
        }
    }
    header.set_uid(owner.uid);
    header.set_gid(owner.gid);
    header.set_mtime(owner.mtime);
    let mut builder = tar::Builder::new(Vec::new());
    // `append_data` writes the (long-name and) header blocks, then copies zero data bytes:
    // the file's data is streamed by the caller.
    let path = match size {
        None => format!("{path}/"),
        Some(_) => path.to_owned(),
    };
    builder.append_data(&mut header, &path, io::empty())?;
    let out = Bytes::from(builder.get_ref().clone());
    Ok(out)
}

/// Zero bytes after `size` bytes of file data, up to the next block.
pub fn padding_for(size: u64) -> Bytes {
    Bytes::from(vec![0u8; padding(size) as usize])
}

/// The end-of-archive marker: two zero blocks.
pub fn end_of_archive() -> Bytes {
    Bytes::from(vec![0u8; 2 * BLOCK])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reader_of(bytes: Vec<u8>, chunk: usize) -> TarReader {
        let chunks: Vec<Result<Bytes, BackendError>> = bytes
            .chunks(chunk)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        TarReader::new(futures::stream::iter(chunks).boxed())
    }

    fn archive(long: &str) -> Vec<u8> {
        let own = Ownership {
            uid: 1000,
            gid: 1000,
            mtime: 1_700_000_000,
        };
        let data = b"hello, world".to_vec();
        let mut v = Vec::new();
        v.extend_from_slice(&entry_header("d", None, own).unwrap());
        v.extend_from_slice(&entry_header(long, Some(data.len() as u64), own).unwrap());
        v.extend_from_slice(&data);
        v.extend_from_slice(&padding_for(data.len() as u64));
        let mut h = Header::new_gnu();
        h.set_entry_type(EntryType::Symlink);
        h.set_size(0);
        h.set_cksum();
        let mut b = tar::Builder::new(Vec::new());
        b.append_link(&mut h, "d/link", "/etc").unwrap();
        v.extend_from_slice(b.get_ref());
        v.extend_from_slice(&end_of_archive());
        v
    }

    /// Our headers read back through our reader at every chunking, long names included, and
    /// the `tar` crate's own reader agrees on the bytes.
    #[tokio::test]
    async fn round_trip_at_every_chunk_size() {
        let long = format!("d/{}", "n".repeat(180));
        let bytes = archive(&long);
        let mut theirs = tar::Archive::new(&bytes[..]);
        let names: Vec<String> = theirs
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect();
        assert_eq!(names, vec!["d/".to_owned(), long.clone(), "d/link".into()]);
        for chunk in [1, 7, 511, 512, 513, 4096] {
            let mut r = reader_of(bytes.clone(), chunk);
            let d = r.next_entry().await.unwrap().unwrap();
            assert_eq!((d.path.as_str(), d.kind.clone()), ("d", EntryKind::Dir));
            let f = r.next_entry().await.unwrap().unwrap();
            assert_eq!(f.path, long);
            assert_eq!(
                (f.kind.clone(), f.size, f.mode),
                (EntryKind::File, 12, 0o644)
            );
            let mut data = Vec::new();
            while let Some(c) = r.read_data(5).await.unwrap() {
                assert!(c.len() <= 5);
                data.extend_from_slice(&c);
            }
            assert_eq!(data, b"hello, world");
            let l = r.next_entry().await.unwrap().unwrap();
            assert_eq!(l.kind, EntryKind::Symlink("/etc".into()));
            assert_eq!(r.next_entry().await.unwrap(), None);
        }
    }

    /// Unread data is skipped by the next header read.
    #[tokio::test]
    async fn unread_data_is_skipped() {
        let bytes = archive("d/f");
        let mut r = reader_of(bytes, 100);
        r.next_entry().await.unwrap();
        r.next_entry().await.unwrap();
        let l = r.next_entry().await.unwrap().unwrap();
        assert_eq!(l.path, "d/link");
    }

    /// An archive cut inside a file's data is an error, not a short file.
    #[tokio::test]
    async fn truncated_data_is_an_error() {
        let mut bytes = archive("d/f");
        bytes.truncate(512 * 2 + 5);
        let mut r = reader_of(bytes, 64);
        r.next_entry().await.unwrap();
        r.next_entry().await.unwrap();
        assert!(r.read_data(1 << 20).await.unwrap().is_some());
        assert!(r.read_data(1 << 20).await.is_err());
    }
}

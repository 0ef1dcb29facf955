//! File methods: `upload_file`, `download_file`, `download_single`, `list_files`
//! (`ai.backend.agent.server.AgentRPCServer`, `ai.backend.agent.docker.kernel.DockerKernel`),
//! paths relative to `/home/work`.
//!
//! Each takes kernelvisor's optional `opts` after upstream's parameters (upstream's manager
//! never sends it): with it, `upload_file` / `download_single` move a file in chunks and
//! `list_files` answers kernelvisor's rich listing.

use std::fmt;

use rmpv::Value;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Method;

/// Bytes, msgpack `bin` on the wire (a `str` is accepted too, as its UTF-8 bytes).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Blob(pub Vec<u8>);

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Blob, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Blob;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E>(self, v: &[u8]) -> Result<Blob, E> {
                Ok(Blob(v.to_vec()))
            }
            fn visit_byte_buf<E>(self, v: Vec<u8>) -> Result<Blob, E> {
                Ok(Blob(v))
            }
            fn visit_str<E>(self, v: &str) -> Result<Blob, E> {
                Ok(Blob(v.as_bytes().to_vec()))
            }
            fn visit_string<E>(self, v: String) -> Result<Blob, E> {
                Ok(Blob(v.into_bytes()))
            }
            fn visit_unit<E>(self) -> Result<Blob, E> {
                Ok(Blob::default())
            }
            fn visit_none<E>(self) -> Result<Blob, E> {
                Ok(Blob::default())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> Result<Blob, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = a.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(Blob(out))
            }
        }
        d.deserialize_any(V)
    }
}

/// `upload_file(kernel_id, filename, filedata, opts=None)` → nil (upstream): writes
/// `filedata` as the file (replacing it; missing directories are created, owned by the
/// kernel's user). With kernelvisor's `opts` = `{"upload_id", "size", "eof", "offset"}` the
/// file comes in chunks: the first call of an `upload_id` declares the total `size`, the call
/// with `eof` true waits for the file to be written; a chunk with an `offset` waits for the
/// bytes before it; each answers `{"received": bytes so far}`.
pub struct UploadFile;

/// Arguments of [`UploadFile`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UploadFileArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// Path relative to `/home/work`.
    pub filename: String,
    /// The file's bytes (or this chunk's).
    #[serde(default)]
    pub filedata: Blob,
    /// kernelvisor's chunked form.
    #[serde(default)]
    pub opts: Option<Value>,
}

impl Method for UploadFile {
    const NAME: &'static str = "upload_file";
    const PARAMS: &'static [&'static str] = &["kernel_id", "filename", "filedata", "opts"];
    type Args = UploadFileArgs;
    type Reply = Value;
}

/// `download_file(kernel_id, filepath)` → bytes: the engine's tar archive of the path (a file
/// or a whole directory), refused above [`DOWNLOAD_FILE_MAX`] bytes of archive as upstream
/// (FAILURE `FileTooLarge`).
pub struct DownloadFile;

/// Upstream's cap on `download_file`'s and `download_single`'s archive: 1 MiB.
pub const DOWNLOAD_FILE_MAX: usize = 1 << 20;

/// Arguments of [`DownloadFile`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadFileArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// Path relative to `/home/work`.
    pub filepath: String,
}

impl Method for DownloadFile {
    const NAME: &'static str = "download_file";
    const PARAMS: &'static [&'static str] = &["kernel_id", "filepath"];
    type Args = DownloadFileArgs;
    type Reply = Blob;
}

/// `download_single(kernel_id, filepath, opts=None)` → bytes (upstream): the content of one
/// regular file, at most [`DOWNLOAD_FILE_MAX`] bytes (else FAILURE `FileTooLarge`; a directory
/// is `InvalidPath`). With kernelvisor's `opts` = `{"download_id", "chunk_size"}` (no id: a
/// new download) → `{"download_id" (nil once done), "size", "mode", "mtime", "data", "eof"}`.
pub struct DownloadSingle;

/// Arguments of [`DownloadSingle`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DownloadSingleArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// Path relative to `/home/work`.
    pub filepath: String,
    /// kernelvisor's chunked form.
    #[serde(default)]
    pub opts: Option<Value>,
}

impl Method for DownloadSingle {
    const NAME: &'static str = "download_single";
    const PARAMS: &'static [&'static str] = &["kernel_id", "filepath", "opts"];
    type Args = DownloadSingleArgs;
    type Reply = Value;
}

/// `list_files(kernel_id, path, opts=None)` → upstream's [`ListFilesReply`]; with kernelvisor's
/// `opts` (any map) → `{"files": [{"name", "type", "size", "mode", "mtime"}], "truncated"}`.
/// Read through the engine's archive API: no tool of the image is used.
pub struct ListFiles;

/// Arguments of [`ListFiles`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ListFilesArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// Directory relative to `/home/work` (nil or empty: `/home/work`).
    #[serde(default)]
    pub path: Option<String>,
    /// kernelvisor's rich listing.
    #[serde(default)]
    pub opts: Option<Value>,
}

impl Method for ListFiles {
    const NAME: &'static str = "list_files";
    const PARAMS: &'static [&'static str] = &["kernel_id", "path", "opts"];
    type Args = ListFilesArgs;
    type Reply = Value;
}

/// Upstream's `list_files` answer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListFilesReply {
    /// JSON text of a list of [`ListedFile`], as Python's `json.dumps` writes it, and a
    /// newline (upstream prints it in the kernel); empty when the listing failed.
    pub files: String,
    /// What went wrong (upstream: the listing script's stderr), else empty.
    pub errors: String,
    /// The path as asked.
    pub abspath: String,
}

/// One entry of [`ListFilesReply::files`], in upstream's key order.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ListedFile {
    /// `stat.filemode`: `-rw-r--r--`, `drwxr-xr-x`, `lrwxrwxrwx`.
    pub mode: String,
    /// Bytes (a symlink: its target's length; a directory: 0).
    pub size: u64,
    /// Unix seconds (the engine's archives carry only the modification time: all three are it).
    pub ctime: f64,
    /// Unix seconds.
    pub mtime: f64,
    /// Unix seconds.
    pub atime: f64,
    /// The entry's name.
    pub filename: String,
}

/// kernelvisor's chunked `upload_file` (the same wire method with `opts` = [`UploadOpts`]):
/// each call answers [`UploadProgress`].
pub struct UploadChunk;

/// `opts` of [`UploadChunk`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadOpts {
    /// Names the upload across its calls.
    pub upload_id: String,
    /// Total bytes, declared by the first call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The last chunk: the call waits for the engine to take the file.
    #[serde(default)]
    pub eof: bool,
    /// Where this chunk's bytes go in the file. With it, a caller may have several chunks of
    /// one upload in flight: a chunk that arrives before the bytes ahead of it waits for them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// `{"received": bytes so far}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadProgress {
    /// Bytes received so far.
    pub received: u64,
}

impl Method for UploadChunk {
    const NAME: &'static str = "upload_file";
    const PARAMS: &'static [&'static str] = UploadFile::PARAMS;
    type Args = UploadFileArgs;
    type Reply = UploadProgress;
}

/// kernelvisor's chunked `download_single` (the same wire method with `opts` =
/// [`DownloadOpts`]): each call answers one [`DownloadChunkReply`].
pub struct DownloadChunk;

/// `opts` of [`DownloadChunk`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DownloadOpts {
    /// The download to go on with; absent: a new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_id: Option<String>,
    /// Most bytes this call answers.
    pub chunk_size: u64,
}

/// One chunk of a download.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DownloadChunkReply {
    /// Where to go on from; nil once the file is done.
    #[serde(default)]
    pub download_id: Option<String>,
    /// The file's size in bytes (first chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// The file's permission bits (first chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<u32>,
    /// The file's modification time, Unix seconds (first chunk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtime: Option<f64>,
    /// The bytes of this chunk.
    #[serde(default)]
    pub data: Blob,
    /// The last chunk.
    #[serde(default)]
    pub eof: bool,
}

impl Method for DownloadChunk {
    const NAME: &'static str = "download_single";
    const PARAMS: &'static [&'static str] = DownloadSingle::PARAMS;
    type Args = DownloadSingleArgs;
    type Reply = DownloadChunkReply;
}

/// kernelvisor's listing (`list_files` with any `opts` map): `{"files": [RichEntry],
/// "truncated"}`.
pub struct ListFilesRich;

/// One entry of [`RichListing`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RichEntry {
    /// Name in the directory.
    pub name: String,
    /// `file`, `dir`, `symlink`, `other`.
    #[serde(rename = "type")]
    pub kind: String,
    /// Bytes.
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    /// Modification time, Unix seconds.
    pub mtime: f64,
}

/// The reply of [`ListFilesRich`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RichListing {
    /// Entries, sorted by name.
    pub files: Vec<RichEntry>,
    /// More entries than the cap, or the time budget ran out.
    #[serde(default)]
    pub truncated: bool,
}

impl Method for ListFilesRich {
    const NAME: &'static str = "list_files";
    const PARAMS: &'static [&'static str] = ListFiles::PARAMS;
    type Args = ListFilesArgs;
    type Reply = RichListing;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::agent_api::{decode_args, encode_args, to_value};

    #[test]
    fn blobs_are_bin_and_read_back() {
        let args = UploadFileArgs {
            kernel_id: "k".into(),
            filename: "a".into(),
            filedata: Blob(vec![0, 1, 255]),
            opts: None,
        };
        let call = encode_args::<UploadFile>(&args);
        assert_eq!(call.args[2], Value::Binary(vec![0, 1, 255]));
        assert_eq!(decode_args::<UploadFile>(&call).unwrap(), args);
        assert_eq!(to_value(&Blob(b"x".to_vec())), Value::Binary(b"x".to_vec()));
        let mut call = call;
        call.args[2] = Value::from("text");
        assert_eq!(
            decode_args::<UploadFile>(&call).unwrap().filedata,
            Blob(b"text".to_vec())
        );
    }
}

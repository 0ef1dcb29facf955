//! Files in a session's `/home/work`: `GET /v1/sessions/{id}/files` (a listing) and `PUT
//! /v1/sessions/{id}/files/{path}` (an upload's answer). Downloads are raw bytes.

use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::openapi::RefOr;
use utoipa::{PartialSchema, ToSchema};

/// A directory entry's kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum FileType {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link.
    Symlink,
    /// Anything else.
    Other,
}

/// A directory entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct FileEntry {
    /// Its name.
    #[schema(required = true)]
    pub name: String,
    /// Its kind.
    // The agent's word, passed on.
    #[serde(rename = "type")]
    #[schema(value_type = FileType, required = true)]
    pub file_type: Option<String>,
    /// Bytes.
    #[schema(value_type = u64, required = true)]
    pub size: Option<u64>,
    /// Permission bits, octal (`"0644"`).
    #[schema(value_type = String, pattern = "^[0-7]{4,}$", required = true)]
    pub mode: Option<String>,
    /// Modification time, Unix seconds.
    #[schema(value_type = f64, required = true)]
    pub mtime: Option<f64>,
}

/// `GET /v1/sessions/{id}/files`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct FileList {
    /// Entries sorted by name (at most 10 000).
    #[schema(required = true)]
    pub files: Vec<FileEntry>,
    /// There were more.
    #[schema(required = true)]
    pub truncated: bool,
}

/// `PUT /v1/sessions/{id}/files/{path}`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Uploaded {
    /// The path, as given.
    #[schema(required = true)]
    pub path: String,
    /// Bytes written.
    #[schema(required = true)]
    pub size: u64,
}

/// Raw bytes (`application/octet-stream` bodies: uploads and downloads).
pub struct Binary;

impl PartialSchema for Binary {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::Custom("binary".into())))
            .into()
    }
}

impl ToSchema for Binary {}

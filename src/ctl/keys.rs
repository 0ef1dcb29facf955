//! `access-key …`: create, list, show, enable, disable, limit and delete access keys
//! (`/v1/access-keys`). Creating, listing and changing keys other than one's own is for admin
//! tokens; the manager answers 403 `forbidden` otherwise.

use std::io::Write;

use clap::Subcommand;
use serde_json::{json, Value};

use super::client::{segment, Client};
use super::{render, show_to, Failure, Output};

/// `kernelvisor ctl access-key …`.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum AccessKeyCommand {
    /// Create an access key and print its secret, which is shown only this once
    /// (POST /v1/access-keys).
    Create {
        /// An admin key (may manage keys and act for other keys) instead of a user key.
        #[arg(long)]
        admin: bool,
        /// At most this many live sessions (0 = unlimited) [default: the manager's].
        #[arg(long, value_name = "N")]
        concurrency_limit: Option<u32>,
        /// A name to tell the key by (free text).
        #[arg(long)]
        name: Option<String>,
    },
    /// List access keys (GET /v1/access-keys).
    List,
    /// Show an access key: role, state, concurrency used and limit (GET /v1/access-keys/{key}).
    Show {
        /// The access key.
        key: String,
    },
    /// Enable a disabled access key: its token is accepted again (PATCH /v1/access-keys/{key}).
    Enable {
        /// The access key.
        key: String,
    },
    /// Disable an access key: its token is refused (401) until it is enabled again
    /// (PATCH /v1/access-keys/{key}).
    Disable {
        /// The access key.
        key: String,
    },
    /// Set how many live sessions an access key may have (PATCH /v1/access-keys/{key}).
    SetLimit {
        /// The access key.
        key: String,
        /// At most this many live sessions; 0 = unlimited.
        #[arg(value_name = "N")]
        limit: u32,
    },
    /// Delete an access key (DELETE /v1/access-keys/{key}).
    Delete {
        /// The access key.
        key: String,
    },
}

impl AccessKeyCommand {
    /// The body of `POST /v1/access-keys` for `create`: `{"role": "user"|"admin",
    /// "concurrency_limit"?, "name"?}` (the optional ones only when given); of
    /// `PATCH /v1/access-keys/{key}` for `enable` / `disable` (`{"enabled": bool}`) and
    /// `set-limit` (`{"concurrency_limit": N}`); `None` for the others, which send no body.
    pub fn body(&self) -> Option<Value> {
        match self {
            AccessKeyCommand::Create {
                admin,
                concurrency_limit,
                name,
            } => {
                let mut body = json!({"role": if *admin { "admin" } else { "user" }});
                if let Some(n) = concurrency_limit {
                    body["concurrency_limit"] = json!(n);
                }
                if let Some(name) = name {
                    body["name"] = json!(name);
                }
                Some(body)
            }
            AccessKeyCommand::Enable { .. } => Some(json!({"enabled": true})),
            AccessKeyCommand::Disable { .. } => Some(json!({"enabled": false})),
            AccessKeyCommand::SetLimit { limit, .. } => Some(json!({"concurrency_limit": limit})),
            AccessKeyCommand::List
            | AccessKeyCommand::Show { .. }
            | AccessKeyCommand::Delete { .. } => None,
        }
    }
}

/// The API path of access key `key`.
fn key_path(key: &str) -> String {
    format!("/v1/access-keys/{}", segment(key))
}

/// Runs one `access-key` command and prints its answer to `stdout` (a table, or with `-o json`
/// the API's JSON as it is: for `create` the object with its `secret_key`).
pub(super) fn run(
    client: &Client,
    command: &AccessKeyCommand,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    let body = command.body();
    let body = body.as_ref().unwrap_or(&Value::Null);
    match command {
        AccessKeyCommand::Create { .. } => show_to(
            out,
            &client.post(
                "/v1/access-keys",
                body,
                Some(super::client::REQUEST_TIMEOUT),
            )?,
            render::access_key_created,
            stdout,
        ),
        AccessKeyCommand::List => show_to(
            out,
            &client.get("/v1/access-keys", &[])?,
            render::access_keys,
            stdout,
        ),
        AccessKeyCommand::Show { key } => show_to(
            out,
            &client.get(&key_path(key), &[])?,
            render::access_key,
            stdout,
        ),
        AccessKeyCommand::Enable { key }
        | AccessKeyCommand::Disable { key }
        | AccessKeyCommand::SetLimit { key, .. } => show_to(
            out,
            &client.patch(&key_path(key), body)?,
            render::access_key,
            stdout,
        ),
        AccessKeyCommand::Delete { key } => show_to(
            out,
            &client.delete(&key_path(key))?,
            render::access_key,
            stdout,
        ),
    }
}

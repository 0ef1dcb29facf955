//! `vfolder …`: create, list and delete the caller's vfolders (`/v1/vfolders`), the storage
//! folders `session create --mount NAME[:ro|:rw]` mounts into a session.

use std::io::Write;

use clap::Subcommand;
use serde_json::json;

use super::client::{segment, Client, REQUEST_TIMEOUT};
use super::{render, show_to, Failure, Output};

/// `kernelvisor ctl vfolder …`.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum VfolderCommand {
    /// Create a vfolder owned by the token's access key (POST /v1/vfolders).
    Create {
        /// Its name, as `session create --mount NAME` will name it.
        name: String,
    },
    /// List the token's vfolders (GET /v1/vfolders).
    List {
        /// Every key's vfolders (admin tokens only).
        #[arg(long)]
        all: bool,
    },
    /// Delete a vfolder (DELETE /v1/vfolders/{name}).
    Delete {
        /// The vfolder's name.
        name: String,
    },
}

/// Runs one `vfolder` command and prints its answer to `stdout` (a table, or with `-o json`
/// the API's JSON as it is).
pub(super) fn run(
    client: &Client,
    command: &VfolderCommand,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    match command {
        VfolderCommand::Create { name } => show_to(
            out,
            &client.post(
                "/v1/vfolders",
                &json!({"name": name}),
                Some(REQUEST_TIMEOUT),
            )?,
            render::vfolder,
            stdout,
        ),
        VfolderCommand::List { all } => show_to(
            out,
            &client.get("/v1/vfolders", if *all { &[("all", "true")] } else { &[] })?,
            render::vfolders,
            stdout,
        ),
        VfolderCommand::Delete { name } => show_to(
            out,
            &client.delete(&format!("/v1/vfolders/{}", segment(name)))?,
            |v| render::vfolder_deleted(v, name),
            stdout,
        ),
    }
}

//! `sessions` (the listing), `session show` and `session rm`: the sessions' records as the
//! manager keeps them (`GET /v1/sessions`, `GET` and `DELETE /v1/sessions/{id}`).

use clap::Args;

use crate::ctl::client::segment;
use crate::ctl::{render, show as print, unix_now, Client, Failure, Output};

/// Arguments of `kernelvisor ctl sessions`.
#[derive(Debug, Args)]
pub struct SessionsArgs {
    /// Include terminated sessions.
    #[arg(long)]
    pub all: bool,
    /// Only this access key's sessions.
    #[arg(long, value_name = "KEY")]
    pub access_key: Option<String>,
}

/// Arguments of `kernelvisor ctl session show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Session id (UUID).
    pub id: String,
}

/// Arguments of `kernelvisor ctl session rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// Session id (UUID).
    pub id: String,
}

/// `sessions`: a table of the sessions, or with `-o json` the API's JSON as it is.
pub(in crate::ctl) fn list(
    client: &Client,
    args: &SessionsArgs,
    out: Output,
) -> Result<i32, Failure> {
    let now = unix_now();
    let mut query = Vec::new();
    if args.all {
        query.push(("all", "true"));
    }
    if let Some(key) = &args.access_key {
        query.push(("access_key", key.as_str()));
    }
    print(out, &client.get("/v1/sessions", &query)?, |v| {
        render::sessions(v, now)
    })
}

/// `session show`.
pub(super) fn show(client: &Client, args: &ShowArgs, out: Output) -> Result<i32, Failure> {
    let now = unix_now();
    print(
        out,
        &client.get(&format!("/v1/sessions/{}", segment(&args.id)), &[])?,
        |v| render::session(v, now),
    )
}

/// `session rm`: the session as it is once terminated.
pub(super) fn rm(client: &Client, args: &RmArgs, out: Output) -> Result<i32, Failure> {
    let now = unix_now();
    print(
        out,
        &client.delete(&format!("/v1/sessions/{}", segment(&args.id)))?,
        |v| render::session(v, now),
    )
}

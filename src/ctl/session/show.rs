//! `sessions` (the listing), `session show [--watch]` and `session rm`: the sessions' records
//! as the manager keeps them (`GET /v1/sessions`, `GET` and `DELETE /v1/sessions/{id}`), and
//! a session's changes as they happen (`GET /v1/events`).

use std::io::{self, Write};

use clap::Args;

use crate::ctl::{events, render, show as print, show_to, unix_now, Client, Failure, Output};
use crate::model::event::EventType;

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
    /// Then print a line per change of the session (status with its reason, pull progress) as
    /// it happens, until it is TERMINATED.
    #[arg(long, short)]
    pub watch: bool,
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
    let answer = client.sessions(args.all, args.access_key.as_deref())?;
    print(out, &answer, |v| render::sessions(v, now))
}

/// `session show`; with `--watch`, the session's changes after it, one line each (as `ctl
/// events` prints them), until it is `TERMINATED`. The stream is opened before the session is
/// read, so no change falls between the two (one made in between is shown twice at worst).
pub(super) fn show(client: &Client, args: &ShowArgs, out: Output) -> Result<i32, Failure> {
    let stdout = &mut io::stdout().lock();
    if !args.watch {
        let now = unix_now();
        return show_to(
            out,
            &client.session(&args.id)?,
            |v| render::session(v, now),
            stdout,
        );
    }
    let query = [
        ("session_id", args.id.clone()),
        ("follow", "true".to_owned()),
        ("history", "false".to_owned()),
        (
            "type",
            format!("{},{}", EventType::SessionStatus, EventType::PullProgress),
        ),
    ];
    let stream = events::open(client, &query)?;
    let reply = client.session(&args.id)?;
    let now = unix_now();
    show_to(out, &reply, |v| render::session(v, now), stdout)?;
    let session = reply.lenient();
    if session.terminated() {
        return Ok(0);
    }
    if out == Output::Table {
        writeln!(stdout, "\n{}", events::header())?;
    }
    match stream.print(out, stdout, |e| e.is_final_session_status())? {
        Some(e) if e.is_final_session_status() => Ok(0),
        _ => Err(crate::ctl::ClientError::Transport {
            what: "the event stream ended early:",
            url: client.url("/v1/events"),
            detail: "the manager closed it before the session ended".into(),
        }
        .into()),
    }
}

/// `session rm`: the session as it is once terminated.
pub(super) fn rm(client: &Client, args: &RmArgs, out: Output) -> Result<i32, Failure> {
    let now = unix_now();
    print(out, &client.destroy_session(&args.id)?, |v| {
        render::session(v, now)
    })
}

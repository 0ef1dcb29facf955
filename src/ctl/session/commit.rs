//! `session commit`: save a session's container as an image, pushed to its registry with
//! `--push` (`POST /v1/sessions/{id}/commit`); with `--wait`, follow it (`GET
//! /v1/sessions/{id}/commit`) until it is `done` or `failed`.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use clap::Args;

use crate::ctl::format::human_bytes;
use crate::ctl::{parse, Client, Failure, Output};
use crate::model::image::{Commit, CommitRequest, CommitStatus};

/// Arguments of `kernelvisor ctl session commit`.
#[derive(Debug, Args)]
pub struct CommitArgs {
    /// Session id (UUID).
    pub id: String,
    /// The new image: `[host[:port]/]repo[:tag]`, e.g. `registry.example.com/team/trained:v2`.
    pub image: String,
    /// Push the image to its registry (the manager's `[[registry]]` for its host gives the
    /// credentials).
    #[arg(long)]
    pub push: bool,
    /// Follow the commit until it is done or failed, printing its progress on stderr; exit 1
    /// when it failed.
    #[arg(long)]
    pub wait: bool,
    /// Seconds between polls with --wait.
    #[arg(long, value_name = "SECS", default_value_t = 0.5, value_parser = parse::positive_seconds)]
    pub interval: f64,
}

/// The commit's state as `key: value` lines.
fn fields(c: &Commit) -> String {
    let status = match c.status {
        CommitStatus::Committing => "committing",
        CommitStatus::Pushing => "pushing",
        CommitStatus::Done => "done",
        CommitStatus::Failed => "failed",
    };
    let mut pairs = vec![
        ("session", c.session_id.clone()),
        ("image", c.image.clone()),
        ("push", c.push.to_string()),
        ("status", status.to_owned()),
    ];
    if c.push && c.total_bytes > 0 {
        pairs.push(("pushed", progress(c)));
    }
    if let Some(id) = &c.image_id {
        pairs.push(("image id", id.clone()));
    }
    if let Some(code) = &c.error_code {
        pairs.push(("error", code.clone()));
    }
    if let Some(reason) = &c.reason {
        pairs.push(("reason", reason.clone()));
    }
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    pairs
        .iter()
        .map(|(k, v)| format!("{:<width$} {v}\n", format!("{k}:")))
        .collect()
}

/// `12.5 MiB of 40 MiB (31%)`.
fn progress(c: &Commit) -> String {
    let pct = (c.current_bytes as f64 * 100.0 / c.total_bytes.max(1) as f64).min(100.0);
    format!(
        "{} of {} ({pct:.0}%)",
        human_bytes(c.current_bytes as f64),
        human_bytes(c.total_bytes as f64)
    )
}

/// One progress line for `--wait`: the status, and the bytes while pushing.
fn progress_line(c: &Commit) -> String {
    match c.status {
        CommitStatus::Pushing if c.total_bytes > 0 => format!("pushing {}", progress(c)),
        CommitStatus::Pushing => "pushing".to_owned(),
        CommitStatus::Committing => "committing".to_owned(),
        CommitStatus::Done => "done".to_owned(),
        CommitStatus::Failed => format!(
            "failed: {}: {}",
            c.error_code.as_deref().unwrap_or("-"),
            c.reason.as_deref().unwrap_or("")
        ),
    }
}

/// Starts the commit and shows its state; with `--wait` follows it (one line on stderr each
/// time it changes; in a terminal the line is rewritten in place) and shows its end. Exit 1
/// when it failed.
pub(super) fn run(client: &Client, args: &CommitArgs, out: Output) -> Result<i32, Failure> {
    let request = CommitRequest {
        image: args.image.clone(),
        push: args.push,
    };
    let mut reply = client.commit(&args.id, &request)?;
    if args.wait {
        let interval = Duration::try_from_secs_f64(args.interval).unwrap_or(Duration::ZERO);
        let tty = std::io::stderr().is_terminal();
        let mut last = String::new();
        loop {
            let c = reply.lenient();
            let line = progress_line(&c);
            if line != last {
                let mut err = std::io::stderr().lock();
                if tty {
                    write!(err, "\r\x1b[2K{line}")?;
                } else {
                    writeln!(err, "{line}")?;
                }
                err.flush()?;
                last = line;
            }
            if c.status.ended() {
                if tty {
                    writeln!(std::io::stderr())?;
                }
                break;
            }
            std::thread::sleep(interval);
            reply = client.commit_state(&args.id)?;
        }
    }
    let c = reply.lenient();
    crate::ctl::show(out, &reply, |_| fields(&c))?;
    Ok(i32::from(c.status == CommitStatus::Failed))
}

/// For tests: the JSON of a commit in `status`.
#[cfg(test)]
fn state(status: &str, current: u64, total: u64) -> serde_json::Value {
    serde_json::json!({
        "session_id": "S", "kernel_id": "K", "agent_id": "A", "image": "r.io/a:1",
        "push": true, "status": status, "image_id": null, "current_bytes": current,
        "total_bytes": total, "error_code": null, "reason": null, "started_at": 1.0,
        "finished_at": null,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::test_util::parse;
    use crate::ctl::testserver::{Answer, Server};
    use crate::ctl::{CtlCommand, SessionCommand};
    use serde_json::{json, Value};

    #[test]
    fn flags() {
        let a = parse(&["session", "commit", "S", "r.io/a:1", "--push", "--wait"]).unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Session(SessionCommand::Commit(CommitArgs { push: true, wait: true, ref image, .. })) if image == "r.io/a:1"
        ));
        assert!(
            parse(&["session", "commit", "S"]).is_err(),
            "IMAGE is required"
        );
    }

    #[test]
    fn progress_is_shown_in_bytes() {
        let c: Commit = crate::ctl::client::lenient(&state("pushing", 3 << 20, 12 << 20));
        assert_eq!(progress_line(&c), "pushing 3 MiB of 12 MiB (25%)");
        let text = fields(&c);
        assert!(text.contains("status:  pushing"), "{text}");
        assert!(text.contains("pushed:  3 MiB of 12 MiB (25%)"), "{text}");
        let mut failed = state("failed", 0, 0);
        failed["error_code"] = "registry-auth-failed".into();
        failed["reason"] = "denied".into();
        let c: Commit = crate::ctl::client::lenient(&failed);
        assert_eq!(progress_line(&c), "failed: registry-auth-failed: denied");
    }

    #[test]
    fn wait_follows_until_done_and_fails_with_1() {
        let server = Server::start(vec![
            Answer::json(202, state("committing", 0, 0).to_string()),
            Answer::json(200, state("pushing", 1, 2).to_string()),
            Answer::json(200, state("done", 2, 2).to_string()),
        ]);
        let client = Client::new(&server.url).unwrap();
        let args = CommitArgs {
            id: "S".into(),
            image: "r.io/a:1".into(),
            push: true,
            wait: true,
            interval: 0.01,
        };
        assert_eq!(run(&client, &args, Output::Json).unwrap(), 0);
        let requests = server.requests();
        assert_eq!(requests.len(), 3);
        assert!(
            requests[0].line.starts_with("POST /v1/sessions/S/commit"),
            "{}",
            requests[0].line
        );
        let body: Value = serde_json::from_str(&requests[0].body).unwrap();
        assert_eq!(body, json!({"image": "r.io/a:1", "push": true}));
        assert!(
            requests[2].line.starts_with("GET /v1/sessions/S/commit"),
            "{}",
            requests[2].line
        );

        let mut failed = state("failed", 0, 0);
        failed["error_code"] = "registry-unreachable".into();
        let server = Server::start(vec![Answer::json(202, failed.to_string())]);
        let client = Client::new(&server.url).unwrap();
        assert_eq!(run(&client, &args, Output::Json).unwrap(), 1);
    }
}

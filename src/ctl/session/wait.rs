//! `session wait`: poll a session (`GET /v1/sessions/{id}`) until it is `TERMINATED`, then show
//! it and exit with its exit code.

use std::io::{self, IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::Args;
use serde_json::Value;

use crate::ctl::client::{read, Answer};
use crate::ctl::{parse, show, unix_now, Client, ClientError, Failure, Output, EXIT_TIMEOUT};
use crate::model::session::{KernelStatus, Session, SessionResult};

/// Arguments of `kernelvisor ctl session wait`.
#[derive(Debug, Args)]
pub struct WaitArgs {
    /// Session id (UUID).
    pub id: String,
    /// Seconds between polls.
    #[arg(long, value_name = "SECS", default_value_t = 0.5, value_parser = parse::positive_seconds)]
    pub interval: f64,
    /// Give up after this many seconds (exit 124); default: wait as long as it takes.
    #[arg(long, value_name = "SECS", value_parser = parse::seconds)]
    pub timeout: Option<f64>,
}

/// Waits, then shows the session and answers [`wait_exit_code`]; when `--timeout` passes first,
/// tells so on stderr and answers [`EXIT_TIMEOUT`].
pub(super) fn run(client: &Client, args: &WaitArgs, out: Output) -> Result<i32, Failure> {
    let WaitArgs {
        id,
        interval,
        timeout,
    } = args;
    let interval = Duration::try_from_secs_f64(*interval).unwrap_or(Duration::ZERO);
    let deadline =
        timeout.and_then(|t| Instant::now().checked_add(Duration::try_from_secs_f64(t).ok()?));
    match wait_terminated(client, id, interval, deadline)? {
        Waited::Terminated(reply) => {
            show(out, &reply, |v| super::show::session(v, unix_now()))?;
            Ok(wait_exit_code(&reply.json))
        }
        Waited::TimedOut(reply) => {
            let session = reply.lenient();
            let status = if session.status.is_empty() {
                "-"
            } else {
                session.status.as_str()
            };
            let t = timeout.unwrap_or_default();
            writeln!(
                io::stderr(),
                "error: session {id} is still {status} after {t}s"
            )?;
            Ok(EXIT_TIMEOUT)
        }
    }
}

/// The exit status of `session wait` for a `TERMINATED` session: its `exit_code` when that is
/// 0–255 (other codes: 1, so a failure never reads as success); without an exit code, 0 when
/// `result` is `SUCCESS`, else 1.
pub fn wait_exit_code(session: &Value) -> i32 {
    let session: Session = read(session).unwrap_or_default();
    match session.exit_code {
        None => i32::from(session.result != Some(SessionResult::Success)),
        Some(c @ 0..=255) => c as i32,
        Some(_) => 1,
    }
}

/// How [`wait_terminated`] ended, with the last answer.
pub(super) enum Waited {
    Terminated(Answer<Session>),
    TimedOut(Answer<Session>),
}

/// Polls `GET /v1/sessions/{id}` every `interval` until the session's `status` is `TERMINATED` or
/// `CANCELLED`, or until
/// `deadline` (the last poll is at or just after it).
pub(super) fn wait_terminated(
    client: &Client,
    id: &str,
    interval: Duration,
    deadline: Option<Instant>,
) -> Result<Waited, ClientError> {
    // While the image is pulled, a live progress line on stderr when it is a terminal.
    let live = io::stderr().is_terminal();
    let mut drew = false;
    loop {
        let reply = client.session(id)?;
        let session = reply.lenient();
        let pulling = session.status == KernelStatus::Pulling.as_str();
        if live && (pulling || drew) {
            let line = match (&session.pull_progress, pulling) {
                (Some(p), true) => format!("pulling {}", crate::ctl::format::pull_bar(p)),
                (None, true) => "pulling …".to_owned(),
                (_, false) => String::new(),
            };
            // `\r` and erase-line: the bar redraws in place, and is wiped once the pull is over.
            let _ = write!(io::stderr(), "\r\x1b[2K{line}");
            let _ = io::stderr().flush();
            drew = pulling;
        }
        // `CANCELLED` (deleted while queued) is as final as `TERMINATED`.
        if session.terminated() {
            return Ok(Waited::Terminated(reply));
        }
        let now = Instant::now();
        match deadline {
            Some(d) if now >= d => return Ok(Waited::TimedOut(reply)),
            Some(d) => std::thread::sleep(interval.min(d - now)),
            None => std::thread::sleep(interval),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::ctl::testserver::{Answer, Server};

    #[test]
    fn wait_exit_codes() {
        assert_eq!(
            wait_exit_code(&json!({"exit_code": 0, "result": "SUCCESS"})),
            0
        );
        assert_eq!(
            wait_exit_code(&json!({"exit_code": 7, "result": "FAILURE"})),
            7
        );
        assert_eq!(
            wait_exit_code(&json!({"exit_code": 255, "result": "FAILURE"})),
            255
        );
        assert_eq!(
            wait_exit_code(&json!({"exit_code": 256, "result": "FAILURE"})),
            1
        );
        assert_eq!(
            wait_exit_code(&json!({"exit_code": -9, "result": "FAILURE"})),
            1
        );
        assert_eq!(
            wait_exit_code(&json!({"exit_code": null, "result": "SUCCESS"})),
            0
        );
        assert_eq!(
            wait_exit_code(&json!({"exit_code": null, "result": "FAILURE"})),
            1
        );
        assert_eq!(
            wait_exit_code(&json!({"exit_code": null, "result": "UNDEFINED"})),
            1
        );
        assert_eq!(wait_exit_code(&json!({"status": "TERMINATED"})), 1);
    }

    #[test]
    fn wait_polls_until_terminated() {
        let session = |status: &str| {
            Answer::json(
                200,
                json!({"session_id": "S", "status": status}).to_string(),
            )
        };
        let server = Server::start(vec![
            session("PENDING"),
            session("RUNNING"),
            session("TERMINATED"),
        ]);
        let client = Client::new(&server.url).unwrap();
        let waited = wait_terminated(&client, "S", Duration::from_millis(10), None).unwrap();
        assert!(matches!(waited, Waited::Terminated(ref r) if r.json["status"] == "TERMINATED"));
        let requests = server.requests();
        assert_eq!(
            requests.iter().map(|r| r.line.as_str()).collect::<Vec<_>>(),
            ["GET /v1/sessions/S"; 3]
        );

        // A deadline already passed: one poll, then the timeout.
        let server = Server::start(vec![session("RUNNING")]);
        let client = Client::new(&server.url).unwrap();
        let waited =
            wait_terminated(&client, "S", Duration::from_secs(60), Some(Instant::now())).unwrap();
        assert!(matches!(waited, Waited::TimedOut(ref r) if r.json["status"] == "RUNNING"));
        assert_eq!(server.requests().len(), 1);
    }
}

//! `session exec`: run code in a session through the execute continuation protocol
//! (`POST /v1/sessions/{id}/execute`), printing each answer as it comes.

use std::io::{self, Write};
use std::time::Duration;

use clap::Args;
use serde_json::{json, Value};

use crate::ctl::client::segment;
use crate::ctl::render::{self, Stream};
use crate::ctl::{format, parse, Client, ClientError, Failure, Output, EXIT_TIMEOUT};
use crate::model::exec::ExecuteAnswer;

/// Extra time each execute call waits beyond `flush_timeout`: the agent answers within
/// `flush_timeout`, or earlier when its output buffer fills.
const EXEC_HTTP_GRACE: Duration = Duration::from_secs(60);

/// Arguments of `kernelvisor ctl session exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Session id (UUID).
    pub id: String,
    /// The code to run (for the test image: a shell command line).
    pub code: String,
    /// Kill the execution after this many seconds (default: the manager's).
    #[arg(long, value_name = "SECS", allow_hyphen_values = true, value_parser = parse::whole_seconds)]
    pub timeout: Option<u64>,
    /// Print what came so far after at most this many seconds of waiting.
    #[arg(long, value_name = "SECS", default_value_t = 0.5, value_parser = parse::seconds)]
    pub flush_timeout: f64,
}

/// The options of one `session exec`: its request bodies and HTTP timeout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExecOptions {
    /// `timeout` of the query: the run is killed after this many seconds.
    pub timeout: Option<u64>,
    /// `flush_timeout` of every call: the agent answers after at most this long.
    pub flush_timeout: f64,
}

impl ExecOptions {
    /// The body that starts the run: `{"mode": "query", "code", "flush_timeout", "timeout"?}`.
    pub fn query_body(&self, code: &str) -> Value {
        let mut body = json!({"mode": "query", "code": code, "flush_timeout": self.flush_timeout});
        if let Some(t) = self.timeout {
            body["timeout"] = json!(t);
        }
        body
    }

    /// The body that fetches the run's next answer: `{"mode": "continue", "run_id", "flush_timeout"}`.
    pub fn continue_body(&self, run_id: &str) -> Value {
        json!({"mode": "continue", "run_id": run_id, "flush_timeout": self.flush_timeout})
    }

    /// The limit of each execute call: `flush_timeout` plus [`EXEC_HTTP_GRACE`].
    pub fn http_timeout(&self) -> Duration {
        Duration::try_from_secs_f64(self.flush_timeout)
            .unwrap_or(Duration::ZERO)
            .saturating_add(EXEC_HTTP_GRACE)
    }
}

/// Runs the code and exits as it did (see [`ExecEnd::exit_code`]); in table mode a timeout or
/// an end without exit code is told on stderr.
pub(super) fn run(client: &Client, args: &ExecArgs, out: Output) -> Result<i32, Failure> {
    let options = ExecOptions {
        timeout: args.timeout,
        flush_timeout: args.flush_timeout,
    };
    let path = format!("/v1/sessions/{}/execute", segment(&args.id));
    let (mut stdout, mut stderr) = (io::stdout().lock(), io::stderr().lock());
    let end = exec(
        client,
        &path,
        &args.code,
        &options,
        out,
        &mut stdout,
        &mut stderr,
    )?;
    if out == Output::Table {
        match &end {
            ExecEnd::Exited(_) => {}
            ExecEnd::TimedOut => match args.timeout {
                Some(t) => writeln!(stderr, "error: the execution timed out after {t}s")?,
                None => writeln!(stderr, "error: the execution timed out")?,
            },
            ExecEnd::NoExitCode(status) => writeln!(
                stderr,
                "error: the execution ended with status {status} and no exit code"
            )?,
        }
    }
    Ok(end.exit_code())
}

/// How an execution ended, from its `exitCode` and `status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEnd {
    /// The code exited; the value is the exit status ctl exits with (0–255; codes outside that
    /// range become 1, so a failure never reads as success).
    Exited(i32),
    /// `status` `exec-timeout`: the timeout killed it (ctl exits 124).
    TimedOut,
    /// No exit code and no timeout: the `status` it reported (ctl exits 1).
    NoExitCode(String),
}

impl ExecEnd {
    /// Reads an execute answer `{"runId", "status", "console", "exitCode"}` (the last of a run:
    /// a `continued` one reads as `NoExitCode`).
    pub fn of(v: &Value) -> Self {
        let answer: ExecuteAnswer = render::lenient(v);
        let status = if answer.status.is_empty() {
            "-"
        } else {
            answer.status.as_str()
        };
        match answer.exit_code {
            _ if status == "exec-timeout" => ExecEnd::TimedOut,
            Some(c @ 0..=255) => ExecEnd::Exited(c as i32),
            Some(_) => ExecEnd::Exited(1),
            None => ExecEnd::NoExitCode(status.to_owned()),
        }
    }

    /// The process exit status for this end.
    pub fn exit_code(&self) -> i32 {
        match self {
            ExecEnd::Exited(c) => *c,
            ExecEnd::TimedOut => EXIT_TIMEOUT,
            ExecEnd::NoExitCode(_) => 1,
        }
    }
}

/// Runs `code` through the execute continuation protocol at `path`: a `query`, then a
/// `continue` for as long as the answer is `continued`. Each answer is written as it arrives and
/// then dropped: table mode writes the console as-is (stdout pieces to `stdout`, stderr pieces to
/// `stderr`), JSON mode the answer as one compact line on `stdout`; both are flushed after each
/// answer. Answers how the run ended (the last answer's [`ExecEnd`]); printing a message about it
/// is left to the caller.
fn exec(
    client: &Client,
    path: &str,
    code: &str,
    options: &ExecOptions,
    out: Output,
    stdout: &mut impl Write,
    stderr: &mut impl Write,
) -> Result<ExecEnd, Failure> {
    let mut body = options.query_body(code);
    loop {
        let reply = client.post(path, &body, Some(options.http_timeout()))?;
        match out {
            Output::Json => writeln!(stdout, "{}", format::compact_json(&reply.text))?,
            Output::Table => {
                for (stream, text) in render::console(&reply.json) {
                    match stream {
                        Stream::Stdout => stdout.write_all(text.as_bytes())?,
                        Stream::Stderr => stderr.write_all(text.as_bytes())?,
                    }
                }
            }
        }
        stdout.flush()?;
        stderr.flush()?;
        let answer: ExecuteAnswer = render::lenient(&reply.json);
        if answer.status != "continued" {
            return Ok(ExecEnd::of(&reply.json));
        }
        let run_id = answer.run_id.as_str();
        if run_id.is_empty() {
            let detail = "a \"continued\" answer without a runId".to_owned();
            return Err(ClientError::InvalidResponse {
                url: client.url(path),
                detail,
            }
            .into());
        }
        body = options.continue_body(run_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::testserver::{Answer, Server};

    #[test]
    fn exec_ends() {
        let of = |v: Value| ExecEnd::of(&v);
        assert_eq!(
            of(json!({"exitCode": 0, "status": "finished"})),
            ExecEnd::Exited(0)
        );
        assert_eq!(
            of(json!({"exitCode": 3, "status": "finished"})).exit_code(),
            3
        );
        assert_eq!(
            of(json!({"exitCode": 256, "status": "finished"})).exit_code(),
            1
        );
        assert_eq!(
            of(json!({"exitCode": -9, "status": "finished"})).exit_code(),
            1
        );
        assert_eq!(
            of(json!({"exitCode": null, "status": "exec-timeout"})),
            ExecEnd::TimedOut
        );
        assert_eq!(
            of(json!({"exitCode": null, "status": "exec-timeout"})).exit_code(),
            124
        );
        assert_eq!(
            of(json!({"exitCode": null, "status": "continued"})),
            ExecEnd::NoExitCode("continued".into())
        );
    }

    #[test]
    fn exec_bodies() {
        let o = ExecOptions {
            timeout: Some(600),
            flush_timeout: 0.5,
        };
        assert_eq!(
            o.query_body("ls"),
            json!({"mode": "query", "code": "ls", "flush_timeout": 0.5, "timeout": 600})
        );
        assert_eq!(
            o.continue_body("r1"),
            json!({"mode": "continue", "run_id": "r1", "flush_timeout": 0.5})
        );
        assert_eq!(o.http_timeout(), Duration::from_millis(60_500));
        let o = ExecOptions {
            timeout: None,
            flush_timeout: 2.0,
        };
        assert_eq!(
            o.query_body("ls"),
            json!({"mode": "query", "code": "ls", "flush_timeout": 2.0})
        );
    }

    fn answer(status: &str, run: &str, console: Value, exit: Value) -> Answer {
        Answer::json(
            200,
            json!({"runId": run, "status": status, "console": console, "exitCode": exit})
                .to_string(),
        )
    }

    fn run_exec(server: &Server, out: Output) -> (Result<ExecEnd, Failure>, String, String) {
        let client = Client::new(&server.url).unwrap();
        let options = ExecOptions {
            timeout: Some(9),
            flush_timeout: 0.25,
        };
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let end = exec(
            &client,
            "/v1/sessions/S/execute",
            "work",
            &options,
            out,
            &mut stdout,
            &mut stderr,
        );
        (
            end,
            String::from_utf8(stdout).unwrap(),
            String::from_utf8(stderr).unwrap(),
        )
    }

    fn three_answers() -> Vec<Answer> {
        vec![
            answer(
                "continued",
                "r1",
                json!([["stdout", "1\n"], ["stderr", "warn\n"]]),
                Value::Null,
            ),
            answer("continued", "r1", json!([]), Value::Null),
            answer("finished", "r1", json!([["stdout", "3\n"]]), json!(3)),
        ]
    }

    #[test]
    fn exec_continues_until_finished() {
        let server = Server::start(three_answers());
        let (end, stdout, stderr) = run_exec(&server, Output::Table);
        assert_eq!(end.unwrap(), ExecEnd::Exited(3));
        assert_eq!((stdout.as_str(), stderr.as_str()), ("1\n3\n", "warn\n"));
        let requests = server.requests();
        assert!(
            requests
                .iter()
                .all(|r| r.line == "POST /v1/sessions/S/execute"),
            "{requests:?}"
        );
        let bodies: Vec<Value> = requests
            .iter()
            .map(|r| serde_json::from_str(&r.body).unwrap())
            .collect();
        assert_eq!(
            bodies,
            [
                json!({"mode": "query", "code": "work", "flush_timeout": 0.25, "timeout": 9}),
                json!({"mode": "continue", "run_id": "r1", "flush_timeout": 0.25}),
                json!({"mode": "continue", "run_id": "r1", "flush_timeout": 0.25}),
            ]
        );
    }

    #[test]
    fn exec_json_prints_one_line_per_answer() {
        let server = Server::start(three_answers());
        let (end, stdout, stderr) = run_exec(&server, Output::Json);
        assert_eq!(end.unwrap().exit_code(), 3);
        assert_eq!(stderr, "");
        let lines: Vec<Value> = stdout
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3, "{stdout}");
        assert_eq!(
            (&lines[0]["status"], &lines[2]["exitCode"]),
            (&json!("continued"), &json!(3))
        );
    }

    #[test]
    fn exec_ends_on_timeout_or_error() {
        let server = Server::start(vec![
            answer("continued", "r2", json!([["stdout", "a"]]), Value::Null),
            answer("exec-timeout", "r2", json!([["stdout", "b"]]), Value::Null),
        ]);
        let (end, stdout, _) = run_exec(&server, Output::Table);
        assert_eq!(
            (end.unwrap().exit_code(), stdout.as_str()),
            (EXIT_TIMEOUT, "ab")
        );

        let not_found = r#"{"error": {"code": "run-not-found", "message": "no run r3"}}"#;
        let server = Server::start(vec![
            answer("continued", "r3", json!([]), Value::Null),
            Answer::json(404, not_found),
        ]);
        match run_exec(&server, Output::Table).0 {
            Err(Failure::Client(ClientError::Api(e))) => {
                assert_eq!((e.status, e.code.as_str()), (404, "run-not-found"))
            }
            other => panic!("{other:?}"),
        }

        let server = Server::start(vec![Answer::json(
            200,
            r#"{"status": "continued", "console": []}"#,
        )]);
        match run_exec(&server, Output::Table).0 {
            Err(Failure::Client(e @ ClientError::InvalidResponse { .. })) => {
                assert!(e.to_string().contains("without a runId"), "{e}");
                assert_eq!(e.exit_code(), 1);
            }
            other => panic!("{other:?}"),
        }
    }
}

//! `kernelvisor ctl …`: a command-line client of the manager's HTTP API
//! (`docs/manager-api.md`).
//!
//! `session exec` streams: it prints each answer of the execute continuation protocol as it
//! comes (`-o json`: one compact JSON line per answer) and continues the run until it ends, so
//! memory does not grow with the output. `session logs` copies the kernel's logs to stdout as
//! they stream (`--follow`). `session wait` polls a session until it is `TERMINATED`.
//!
//! Exit status: 0 on success; 1 when the API answers an error (printed as
//! `error: <code>: <message> (HTTP <status>)`) or an answer is not JSON; 2 when the API cannot be
//! reached or the connection breaks (and on usage errors, from clap); 141 when stdout is closed
//! early (`| head`). `session exec` exits with the executed code's exit code, or 124 when it
//! timed out. `session wait` exits with the session's exit code (see [`wait_exit_code`]), or 124
//! when `--timeout` passed first.

mod client;
mod format;
mod parse;
mod render;
#[cfg(test)]
mod testserver;

use std::io::{self, Read, Write};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Map, Value};

pub use client::{ApiError, Client, ClientError, Reply};
pub use parse::{Mount, Permission};

use client::segment;
use render::Stream;

/// The API URL used when neither `--api` nor `KERNELVISOR_API` is given.
pub const DEFAULT_API: &str = "http://127.0.0.1:8081";
/// Exit status of `session exec` when the execution timed out, and of `session wait` when its
/// `--timeout` passed (as `timeout(1)`).
pub const EXIT_TIMEOUT: i32 = 124;
/// Extra time each execute call waits beyond `flush_timeout`: the agent answers within
/// `flush_timeout`, or earlier when its output buffer fills.
const EXEC_HTTP_GRACE: Duration = Duration::from_secs(60);
/// Read size of `session logs`; stdout is flushed after each read.
const LOG_BUFFER: usize = 64 * 1024;

/// Arguments of `kernelvisor ctl`.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Base URL of the manager's HTTP API (http:// only).
    #[arg(long, global = true, value_name = "URL", env = "KERNELVISOR_API", default_value = DEFAULT_API)]
    pub api: String,
    /// Output format (no effect on `session logs`, which prints the logs as they are).
    #[arg(long, short, global = true, value_name = "FORMAT", value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// Output format of `kernelvisor ctl`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// Aligned tables, or `key: value` lines for one object.
    Table,
    /// The API's JSON answer pretty-printed, keys and numbers as the API wrote them (session
    /// exec: each answer on one line, as it comes).
    Json,
}

/// The `kernelvisor ctl` subcommands.
#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// List agents with their slots, kernels and last heartbeat (GET /v1/agents).
    Agents,
    /// List sessions, live ones unless --all (GET /v1/sessions).
    Sessions {
        /// Include terminated sessions.
        #[arg(long)]
        all: bool,
        /// Only this access key's sessions.
        #[arg(long, value_name = "KEY")]
        access_key: Option<String>,
    },
    /// Create, inspect, run code in, wait for, read the logs of, or terminate one session.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Inspect access keys.
    #[command(subcommand)]
    AccessKey(AccessKeyCommand),
    /// The manager's health: status, mode and live agents (GET /health).
    Health,
}

/// `kernelvisor ctl session …`.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Start a session on the least-loaded agent that fits it (POST /v1/sessions).
    Create(CreateArgs),
    /// Show one session (GET /v1/sessions/{id}).
    Show {
        /// Session id (UUID).
        id: String,
    },
    /// Run code in a session, printing its output as it comes (POST /v1/sessions/{id}/execute).
    ///
    /// Exits with the code's exit code, or 124 on timeout. Stdout and stderr of the code go to
    /// ctl's stdout and stderr; with -o json each answer of the API is printed as one JSON line.
    Exec {
        /// Session id (UUID).
        id: String,
        /// The code to run (for the test image: a shell command line).
        code: String,
        /// Kill the execution after this many seconds (default: the manager's).
        #[arg(long, value_name = "SECS")]
        timeout: Option<u64>,
        /// Print what came so far after at most this many seconds of waiting.
        #[arg(long, value_name = "SECS", default_value_t = 0.5, value_parser = parse::seconds)]
        flush_timeout: f64,
    },
    /// Wait until a session is TERMINATED, then show it (polls GET /v1/sessions/{id}).
    ///
    /// Exits with the session's exit code (a batch job's; 1 when outside 0-255), or without one 0
    /// when its result is SUCCESS, else 1; 124 when --timeout passes first.
    Wait {
        /// Session id (UUID).
        id: String,
        /// Seconds between polls.
        #[arg(long, value_name = "SECS", default_value_t = 0.5, value_parser = parse::positive_seconds)]
        interval: f64,
        /// Give up after this many seconds (exit 124); default: wait as long as it takes.
        #[arg(long, value_name = "SECS", value_parser = parse::seconds)]
        timeout: Option<f64>,
    },
    /// Print a session's kernel logs (GET /v1/sessions/{id}/logs).
    ///
    /// Stdout and stderr of the kernel merged, as `docker logs` shows them: the last part the
    /// agent keeps (also for a while after the kernel ended), and with --follow everything after
    /// it as it comes, until the kernel ends.
    Logs {
        /// Session id (UUID).
        id: String,
        /// Keep printing new output as it comes, until the kernel ends.
        #[arg(long, short)]
        follow: bool,
    },
    /// Terminate a session (DELETE /v1/sessions/{id}).
    Rm {
        /// Session id (UUID).
        id: String,
    },
}

/// Session type of `session create --type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SessionType {
    /// Runs until terminated; code runs in it with `session exec`.
    Interactive,
    /// Runs --command; its exit ends the session (SUCCESS on exit 0, else FAILURE).
    Batch,
}

impl SessionType {
    /// The API's name of the type.
    pub fn as_str(self) -> &'static str {
        match self {
            SessionType::Interactive => "interactive",
            SessionType::Batch => "batch",
        }
    }
}

/// Arguments of `kernelvisor ctl session create`.
#[derive(Debug, Args)]
pub struct CreateArgs {
    /// Container image, e.g. kernelvisor-test:latest.
    #[arg(long)]
    pub image: String,
    /// CPU cores, up to 3 decimals (e.g. 1 or 0.5).
    #[arg(long, value_name = "CORES")]
    pub cpu: String,
    /// Memory: bytes, or with a unit suffix such as 256m or 1g.
    #[arg(long, value_name = "SIZE")]
    pub mem: String,
    /// Access key the session is charged to.
    #[arg(long, value_name = "KEY")]
    pub access_key: String,
    /// Environment variable for the kernel (repeatable; a later KEY wins).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse::env)]
    pub env: Vec<(String, String)>,
    /// Host directory to mount, read-write unless :ro (repeatable).
    #[arg(long = "mount", value_name = "NAME=HOST_PATH[:ro|rw]", value_parser = parse::mount)]
    pub mounts: Vec<Mount>,
    /// Session type [default: interactive]; batch needs --command.
    #[arg(long = "type", value_name = "TYPE", value_enum)]
    pub session_type: Option<SessionType>,
    /// Shell command line, run as `sh -c` in /home/work: a batch session's job (required with
    /// --type batch), or what an interactive session runs instead of the image's command.
    #[arg(long, value_name = "SHELL", required_if_eq("session_type", "batch"))]
    pub command: Option<String>,
    /// Batch sessions: end the job as FAILURE (reason batch-timeout) after this many seconds.
    #[arg(long, value_name = "SECS", value_parser = parse::positive_seconds)]
    pub batch_timeout: Option<f64>,
}

impl CreateArgs {
    /// The `POST /v1/sessions` body; `environ`, `mounts`, `type`, `command` and `batch_timeout`
    /// only when given.
    pub fn to_json(&self) -> Value {
        let mut body = json!({
            "image": self.image,
            "resource_slots": {"cpu": self.cpu, "mem": self.mem},
            "access_key": self.access_key,
        });
        if !self.env.is_empty() {
            let environ: Map<String, Value> = self
                .env
                .iter()
                .map(|(k, v)| (k.clone(), Value::from(v.as_str())))
                .collect();
            body["environ"] = Value::Object(environ);
        }
        if !self.mounts.is_empty() {
            body["mounts"] = self.mounts.iter().map(Mount::to_json).collect();
        }
        if let Some(t) = self.session_type {
            body["type"] = json!(t.as_str());
        }
        if let Some(command) = &self.command {
            body["command"] = json!(command);
        }
        if let Some(t) = self.batch_timeout {
            body["batch_timeout"] = parse::seconds_json(t);
        }
        body
    }
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

/// `kernelvisor ctl access-key …`.
#[derive(Debug, Subcommand)]
pub enum AccessKeyCommand {
    /// Show an access key's concurrency used and limit (GET /v1/access-keys/{key}).
    Show {
        /// The access key.
        key: String,
    },
}

/// Runs one `kernelvisor ctl` command against the API and answers the process exit status (see
/// the module docs). API and connection errors are printed to stderr here, not returned; `Err`
/// is left for failures to write the output.
pub fn run(args: CtlArgs) -> anyhow::Result<i32> {
    let result = Client::new(&args.api)
        .map_err(Failure::Client)
        .and_then(|client| dispatch(&client, &args));
    match result {
        Ok(code) => Ok(code),
        Err(Failure::Client(e)) => {
            if let (Output::Json, ClientError::Api(api)) = (args.output, &e) {
                if api.is_envelope() {
                    // Scripts get the error envelope on stdout, like any other answer; one line
                    // where the answers are JSON lines.
                    let text = match args.command {
                        CtlCommand::Session(SessionCommand::Exec { .. }) => {
                            format::compact_json(&api.body)
                        }
                        _ => format::pretty_json(&api.body),
                    };
                    let _ = writeln!(io::stdout(), "{text}");
                }
            }
            eprintln!("{e}");
            Ok(e.exit_code())
        }
        // The reader went away (`ctl sessions | head`): stop quietly, as SIGPIPE would.
        Err(Failure::Io(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(141),
        Err(Failure::Io(e)) => Err(anyhow::Error::new(e).context("writing the output")),
    }
}

#[derive(Debug)]
enum Failure {
    Client(ClientError),
    Io(io::Error),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure::Client(e)
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Failure::Io(e)
    }
}

fn dispatch(client: &Client, args: &CtlArgs) -> Result<i32, Failure> {
    let now = unix_now();
    let out = args.output;
    match &args.command {
        CtlCommand::Agents => show(out, &client.get("/v1/agents", &[])?, |v| {
            render::agents(v, now)
        }),
        CtlCommand::Sessions { all, access_key } => {
            let mut query = Vec::new();
            if *all {
                query.push(("all", "true"));
            }
            if let Some(key) = access_key {
                query.push(("access_key", key.as_str()));
            }
            show(out, &client.get("/v1/sessions", &query)?, |v| {
                render::sessions(v, now)
            })
        }
        CtlCommand::Session(SessionCommand::Create(create)) => show(
            out,
            &client.post("/v1/sessions", &create.to_json(), None)?,
            render::created,
        ),
        CtlCommand::Session(SessionCommand::Show { id }) => show(
            out,
            &client.get(&format!("/v1/sessions/{}", segment(id)), &[])?,
            |v| render::session(v, now),
        ),
        CtlCommand::Session(SessionCommand::Rm { id }) => show(
            out,
            &client.delete(&format!("/v1/sessions/{}", segment(id)))?,
            |v| render::session(v, now),
        ),
        CtlCommand::Session(SessionCommand::Exec {
            id,
            code,
            timeout,
            flush_timeout,
        }) => {
            let options = ExecOptions {
                timeout: *timeout,
                flush_timeout: *flush_timeout,
            };
            let path = format!("/v1/sessions/{}/execute", segment(id));
            let (mut stdout, mut stderr) = (io::stdout().lock(), io::stderr().lock());
            let end = exec(client, &path, code, &options, out, &mut stdout, &mut stderr)?;
            if out == Output::Table {
                match &end {
                    ExecEnd::Exited(_) => {}
                    ExecEnd::TimedOut => match timeout {
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
        CtlCommand::Session(SessionCommand::Wait {
            id,
            interval,
            timeout,
        }) => {
            let path = format!("/v1/sessions/{}", segment(id));
            let interval = Duration::try_from_secs_f64(*interval).unwrap_or(Duration::ZERO);
            let deadline = timeout
                .and_then(|t| Instant::now().checked_add(Duration::try_from_secs_f64(t).ok()?));
            match wait_terminated(client, &path, interval, deadline)? {
                Waited::Terminated(reply) => {
                    show(out, &reply, |v| render::session(v, unix_now()))?;
                    Ok(wait_exit_code(&reply.json))
                }
                Waited::TimedOut(reply) => {
                    let status = reply
                        .json
                        .get("status")
                        .and_then(Value::as_str)
                        .unwrap_or("-");
                    let t = timeout.unwrap_or_default();
                    writeln!(
                        io::stderr(),
                        "error: session {id} is still {status} after {t}s"
                    )?;
                    Ok(EXIT_TIMEOUT)
                }
            }
        }
        CtlCommand::Session(SessionCommand::Logs { id, follow }) => {
            let path = format!("/v1/sessions/{}/logs", segment(id));
            let (query, timeout): (&[(&str, &str)], _) = if *follow {
                (&[("follow", "true")], None)
            } else {
                (&[], Some(client::REQUEST_TIMEOUT))
            };
            let body = client.get_stream(&path, query, timeout)?;
            copy_stream(&client.url(&path), body, &mut io::stdout().lock())?;
            Ok(0)
        }
        CtlCommand::AccessKey(AccessKeyCommand::Show { key }) => show(
            out,
            &client.get(&format!("/v1/access-keys/{}", segment(key)), &[])?,
            render::access_key,
        ),
        CtlCommand::Health => show(out, &client.get("/health", &[])?, render::health),
    }
}

/// Prints a reply as JSON or through `table`, and answers exit status 0.
fn show(out: Output, reply: &Reply, table: impl FnOnce(&Value) -> String) -> Result<i32, Failure> {
    let mut stdout = io::stdout().lock();
    match out {
        Output::Json => writeln!(stdout, "{}", format::pretty_json(&reply.text))?,
        Output::Table => stdout.write_all(table(&reply.json).as_bytes())?,
    }
    stdout.flush()?;
    Ok(0)
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
        let status = v.get("status").and_then(Value::as_str).unwrap_or("-");
        match v.get("exitCode").and_then(Value::as_i64) {
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
        if reply.json.get("status").and_then(Value::as_str) != Some("continued") {
            return Ok(ExecEnd::of(&reply.json));
        }
        let Some(run_id) = reply.json.get("runId").and_then(Value::as_str) else {
            let detail = "a \"continued\" answer without a runId".to_owned();
            return Err(ClientError::InvalidResponse {
                url: client.url(path),
                detail,
            }
            .into());
        };
        body = options.continue_body(run_id);
    }
}

/// The exit status of `session wait` for a `TERMINATED` session: its `exit_code` when that is
/// 0–255 (other codes: 1, so a failure never reads as success); without an exit code, 0 when
/// `result` is `SUCCESS`, else 1.
pub fn wait_exit_code(session: &Value) -> i32 {
    match session.get("exit_code") {
        None | Some(Value::Null) => {
            i32::from(session.get("result").and_then(Value::as_str) != Some("SUCCESS"))
        }
        Some(code) => match code.as_i64() {
            Some(c @ 0..=255) => c as i32,
            _ => 1,
        },
    }
}

/// How [`wait_terminated`] ended, with the last answer.
enum Waited {
    Terminated(Reply),
    TimedOut(Reply),
}

/// Polls `GET path` every `interval` until the session's `status` is `TERMINATED`, or until
/// `deadline` (the last poll is at or just after it).
fn wait_terminated(
    client: &Client,
    path: &str,
    interval: Duration,
    deadline: Option<Instant>,
) -> Result<Waited, ClientError> {
    loop {
        let reply = client.get(path, &[])?;
        if reply.json.get("status").and_then(Value::as_str) == Some("TERMINATED") {
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

/// Copies a streamed body to `out` as it comes, flushing after each read (so a followed log shows
/// each line when it is written), in reads of at most [`LOG_BUFFER`] bytes: memory stays fixed
/// however long the stream. Answers the number of bytes copied.
fn copy_stream(url: &str, mut body: impl Read, out: &mut impl Write) -> Result<u64, Failure> {
    let mut buf = vec![0; LOG_BUFFER];
    let mut copied = 0;
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => return Ok(copied),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(client::read_error(url, &e).into()),
        };
        out.write_all(&buf[..n])?;
        out.flush()?;
        copied += n as u64;
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        ctl: CtlArgs,
    }

    fn parse(args: &[&str]) -> Result<CtlArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("ctl").chain(args.iter().copied())).map(|c| c.ctl)
    }

    #[test]
    fn global_options_anywhere() {
        let a = parse(&[
            "session",
            "show",
            "abc",
            "--api",
            "http://m:9000",
            "-o",
            "json",
        ])
        .unwrap();
        assert_eq!((a.api.as_str(), a.output), ("http://m:9000", Output::Json));
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Show { ref id }) if id == "abc")
        );
        let a = parse(&["sessions", "--all", "--access-key", "K"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Sessions { all: true, access_key: Some(ref k) } if k == "K")
        );
        assert_eq!(a.output, Output::Table);
    }

    #[test]
    fn create_body() {
        let a = parse(&[
            "session",
            "create",
            "--image",
            "img:1",
            "--cpu",
            "0.5",
            "--mem",
            "256m",
            "--access-key",
            "AK",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--mount",
            "data=/vfroot/data:ro",
        ])
        .unwrap();
        let CtlCommand::Session(SessionCommand::Create(c)) = a.command else {
            panic!("not create")
        };
        assert_eq!(
            c.to_json(),
            json!({"image": "img:1", "resource_slots": {"cpu": "0.5", "mem": "256m"}, "access_key": "AK",
                   "environ": {"A": "1", "B": "x=y"},
                   "mounts": [{"name": "data", "host_path": "/vfroot/data", "permission": "ro"}]})
        );
        let a = parse(&[
            "session",
            "create",
            "--image",
            "i",
            "--cpu",
            "1",
            "--mem",
            "1g",
            "--access-key",
            "AK",
        ])
        .unwrap();
        let CtlCommand::Session(SessionCommand::Create(c)) = a.command else {
            panic!("not create")
        };
        assert!(c.to_json().get("environ").is_none() && c.to_json().get("mounts").is_none());
    }

    fn create(extra: &[&str]) -> Result<CreateArgs, clap::Error> {
        let base = [
            "session",
            "create",
            "--image",
            "i",
            "--cpu",
            "1",
            "--mem",
            "1g",
            "--access-key",
            "AK",
        ];
        match parse(&[&base[..], extra].concat())?.command {
            CtlCommand::Session(SessionCommand::Create(c)) => Ok(c),
            other => panic!("not create: {other:?}"),
        }
    }

    #[test]
    fn create_batch_body() {
        let c = create(&[
            "--type",
            "batch",
            "--command",
            "python train.py > out.txt",
            "--batch-timeout",
            "3600",
        ])
        .unwrap();
        assert_eq!(c.session_type, Some(SessionType::Batch));
        assert_eq!(
            c.to_json(),
            json!({"image": "i", "resource_slots": {"cpu": "1", "mem": "1g"}, "access_key": "AK",
                   "type": "batch", "command": "python train.py > out.txt", "batch_timeout": 3600})
        );
        assert_eq!(
            create(&[
                "--type",
                "batch",
                "--command",
                "x",
                "--batch-timeout",
                "1.5"
            ])
            .unwrap()
            .to_json()["batch_timeout"],
            json!(1.5)
        );
        // An interactive session may replace the image's command; the type is sent when given.
        let body = create(&["--command", "sleep infinity"]).unwrap().to_json();
        assert_eq!(
            (body.get("type"), &body["command"]),
            (None, &json!("sleep infinity"))
        );
        assert_eq!(
            create(&["--type", "interactive"]).unwrap().to_json()["type"],
            "interactive"
        );
        assert!(create(&[]).unwrap().to_json().get("command").is_none());
    }

    #[test]
    fn batch_without_command_is_a_usage_error() {
        let err = create(&["--type", "batch"]).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::MissingRequiredArgument);
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("--command <SHELL>"), "{err}");
        let err = create(&["--type", "cron", "--command", "x"]).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
        let err = create(&["--batch-timeout=-5"]).err().unwrap();
        assert!(
            err.to_string()
                .contains("expected a non-negative number of seconds"),
            "{err}"
        );
        assert!(
            create(&["--batch-timeout", "0"]).is_err(),
            "the manager wants a positive batch_timeout"
        );
    }

    #[test]
    fn exec_wait_logs_flags() {
        let a = parse(&["session", "exec", "S", "echo hi"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Exec { timeout: None, flush_timeout, .. }) if flush_timeout == 0.5)
        );
        let a = parse(&[
            "session",
            "exec",
            "S",
            "echo hi",
            "--timeout",
            "30",
            "--flush-timeout",
            "2",
        ])
        .unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Exec { timeout: Some(30), flush_timeout, .. }) if flush_timeout == 2.0)
        );
        assert!(parse(&["session", "exec", "S", "x", "--flush-timeout", "-1"]).is_err());

        let a = parse(&["session", "wait", "S"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Wait { ref id, interval, timeout: None }) if id == "S" && interval == 0.5)
        );
        let a = parse(&[
            "session",
            "wait",
            "S",
            "--interval",
            "2",
            "--timeout",
            "0.25",
            "-o",
            "json",
        ])
        .unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Wait { interval, timeout: Some(t), .. }) if interval == 2.0 && t == 0.25)
        );
        assert!(
            parse(&["session", "wait", "S", "--interval", "0"]).is_err(),
            "no busy polling"
        );

        let a = parse(&["session", "logs", "S"]).unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Session(SessionCommand::Logs { follow: false, .. })
        ));
        for follow in ["-f", "--follow"] {
            let a = parse(&["session", "logs", follow, "S"]).unwrap();
            assert!(
                matches!(a.command, CtlCommand::Session(SessionCommand::Logs { ref id, follow: true }) if id == "S")
            );
        }
    }

    #[test]
    fn malformed_env_and_mount_are_usage_errors() {
        let base = [
            "session",
            "create",
            "--image",
            "i",
            "--cpu",
            "1",
            "--mem",
            "1g",
            "--access-key",
            "AK",
        ];
        let err = parse(&[&base[..], &["--env", "NOEQUALS"]].concat())
            .err()
            .unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        let text = err.to_string();
        assert!(
            text.contains("NOEQUALS") && text.contains("expected KEY=VALUE"),
            "{text}"
        );
        let text = parse(&[&base[..], &["--mount", "data"]].concat())
            .err()
            .unwrap()
            .to_string();
        assert!(text.contains("expected NAME=HOST_PATH[:ro|rw]"), "{text}");
        assert!(
            parse(&["session", "create", "--image", "i"]).is_err(),
            "cpu/mem/access-key are required"
        );
    }

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

    use testserver::{Answer, Server};

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
        let waited =
            wait_terminated(&client, "/v1/sessions/S", Duration::from_millis(10), None).unwrap();
        assert!(matches!(waited, Waited::Terminated(ref r) if r.json["status"] == "TERMINATED"));
        let requests = server.requests();
        assert_eq!(
            requests.iter().map(|r| r.line.as_str()).collect::<Vec<_>>(),
            ["GET /v1/sessions/S"; 3]
        );

        // A deadline already passed: one poll, then the timeout.
        let server = Server::start(vec![session("RUNNING")]);
        let client = Client::new(&server.url).unwrap();
        let waited = wait_terminated(
            &client,
            "/v1/sessions/S",
            Duration::from_secs(60),
            Some(Instant::now()),
        )
        .unwrap();
        assert!(matches!(waited, Waited::TimedOut(ref r) if r.json["status"] == "RUNNING"));
        assert_eq!(server.requests().len(), 1);
    }

    /// A reader that gives `chunks` one read each, then fails with `end` (or ends).
    struct Chunks(Vec<&'static str>, Option<io::ErrorKind>);

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.0.is_empty() {
                return self
                    .1
                    .map_or(Ok(0), |kind| Err(io::Error::new(kind, "connection reset")));
            }
            let chunk = self.0.remove(0);
            buf[..chunk.len()].copy_from_slice(chunk.as_bytes());
            Ok(chunk.len())
        }
    }

    /// A writer that records what each flush saw, or fails like a closed pipe.
    #[derive(Default)]
    struct Flushes {
        pending: Vec<u8>,
        flushed: Vec<String>,
        broken: bool,
    }

    impl Write for Flushes {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.broken {
                return Err(io::ErrorKind::BrokenPipe.into());
            }
            self.pending.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            self.flushed
                .push(String::from_utf8(std::mem::take(&mut self.pending)).unwrap());
            Ok(())
        }
    }

    #[test]
    fn logs_are_copied_and_flushed_per_read() {
        let mut out = Flushes::default();
        let copied = copy_stream(
            "http://m/logs",
            Chunks(vec!["line 1\n", "line 2\npart", "ial\n"], None),
            &mut out,
        )
        .unwrap();
        assert_eq!(copied, 22);
        assert_eq!(out.flushed, ["line 1\n", "line 2\npart", "ial\n"]);

        let err = copy_stream(
            "http://m/logs",
            Chunks(vec!["x"], Some(io::ErrorKind::ConnectionReset)),
            &mut out,
        )
        .unwrap_err();
        match err {
            Failure::Client(e) => {
                assert_eq!(e.exit_code(), 2);
                assert!(
                    e.to_string()
                        .starts_with("error: reading the response from http://m/logs: "),
                    "{e}"
                );
            }
            Failure::Io(e) => panic!("{e}"),
        }
        let mut broken = Flushes {
            broken: true,
            ..Flushes::default()
        };
        let err = copy_stream("http://m/logs", Chunks(vec!["x"], None), &mut broken).unwrap_err();
        assert!(
            matches!(err, Failure::Io(ref e) if e.kind() == io::ErrorKind::BrokenPipe),
            "{err:?}"
        );
    }
}

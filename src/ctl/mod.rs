//! `kernelvisor ctl …`: a command-line client of the manager's HTTP API
//! (`docs/manager-api.md`).
//!
//! Exit status: 0 on success; 1 when the API answers an error (printed as
//! `error: <code>: <message> (HTTP <status>)`) or an answer is not JSON; 2 when the API cannot be
//! reached (and on usage errors, from clap). `session exec` exits with the executed code's exit
//! code, or 124 when it timed out.

mod client;
mod format;
mod parse;
mod render;

use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Map, Value};

pub use client::{ApiError, Client, ClientError, Reply};
pub use parse::{Mount, Permission};

use client::segment;
use render::Stream;

/// The API URL used when neither `--api` nor `KERNELVISOR_API` is given.
pub const DEFAULT_API: &str = "http://127.0.0.1:8081";
/// Exit status of `session exec` when the execution timed out (as `timeout(1)`).
pub const EXIT_TIMEOUT: i32 = 124;
/// Extra time the HTTP call of `session exec --timeout` waits beyond the execution timeout.
const EXEC_HTTP_GRACE: Duration = Duration::from_secs(60);

/// Arguments of `kernelvisor ctl`.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Base URL of the manager's HTTP API (http:// only).
    #[arg(long, global = true, value_name = "URL", env = "KERNELVISOR_API", default_value = DEFAULT_API)]
    pub api: String,
    /// Output format.
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
    /// The API's JSON answer pretty-printed, keys and numbers as the API wrote them.
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
    /// Create, inspect, run code in, or terminate one session.
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
    /// Run code in a session and print its console output; exits with its exit code, or 124 on
    /// timeout (POST /v1/sessions/{id}/execute).
    Exec {
        /// Session id (UUID).
        id: String,
        /// The code to run (for the test image: a shell command line).
        code: String,
        /// Kill the execution after this many seconds (default: the manager's).
        #[arg(long, value_name = "SECS")]
        timeout: Option<u64>,
    },
    /// Terminate a session (DELETE /v1/sessions/{id}).
    Rm {
        /// Session id (UUID).
        id: String,
    },
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
}

impl CreateArgs {
    /// The `POST /v1/sessions` body; `environ` and `mounts` only when given.
    pub fn to_json(&self) -> Value {
        let mut body = json!({
            "image": self.image,
            "resource_slots": {"cpu": self.cpu, "mem": self.mem},
            "access_key": self.access_key,
        });
        if !self.env.is_empty() {
            let environ: Map<String, Value> =
                self.env.iter().map(|(k, v)| (k.clone(), Value::from(v.as_str()))).collect();
            body["environ"] = Value::Object(environ);
        }
        if !self.mounts.is_empty() {
            body["mounts"] = self.mounts.iter().map(Mount::to_json).collect();
        }
        body
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
    let result = Client::new(&args.api).map_err(Failure::Client).and_then(|client| dispatch(&client, &args));
    match result {
        Ok(code) => Ok(code),
        Err(Failure::Client(e)) => {
            if let (Output::Json, ClientError::Api(api)) = (args.output, &e) {
                if api.is_envelope() {
                    // Scripts get the error envelope on stdout, like any other answer.
                    let _ = writeln!(io::stdout(), "{}", format::pretty_json(&api.body));
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
        CtlCommand::Agents => show(out, &client.get("/v1/agents", &[])?, |v| render::agents(v, now)),
        CtlCommand::Sessions { all, access_key } => {
            let mut query = Vec::new();
            if *all {
                query.push(("all", "true"));
            }
            if let Some(key) = access_key {
                query.push(("access_key", key.as_str()));
            }
            show(out, &client.get("/v1/sessions", &query)?, |v| render::sessions(v, now))
        }
        CtlCommand::Session(SessionCommand::Create(create)) => {
            show(out, &client.post("/v1/sessions", &create.to_json(), None)?, render::created)
        }
        CtlCommand::Session(SessionCommand::Show { id }) => {
            show(out, &client.get(&format!("/v1/sessions/{}", segment(id)), &[])?, |v| render::session(v, now))
        }
        CtlCommand::Session(SessionCommand::Rm { id }) => {
            show(out, &client.delete(&format!("/v1/sessions/{}", segment(id)))?, |v| render::session(v, now))
        }
        CtlCommand::Session(SessionCommand::Exec { id, code, timeout }) => {
            let mut body = json!({"code": code});
            if let Some(t) = timeout {
                body["timeout"] = json!(t);
            }
            let http_timeout = timeout.map(|t| Duration::from_secs(t) + EXEC_HTTP_GRACE);
            let reply = client.post(&format!("/v1/sessions/{}/execute", segment(id)), &body, http_timeout)?;
            exec_output(out, &reply, *timeout)
        }
        CtlCommand::AccessKey(AccessKeyCommand::Show { key }) => {
            show(out, &client.get(&format!("/v1/access-keys/{}", segment(key)), &[])?, render::access_key)
        }
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
    /// Reads an execute answer `{"exitCode", "console", "status"}`.
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

/// Table mode: the console as-is on stdout/stderr, then a message on stderr when it did not
/// exit. JSON mode: the answer. Either way the exit status is [`ExecEnd::exit_code`].
fn exec_output(out: Output, reply: &Reply, timeout: Option<u64>) -> Result<i32, Failure> {
    let end = ExecEnd::of(&reply.json);
    if out == Output::Json {
        show(out, reply, |_| String::new())?;
        return Ok(end.exit_code());
    }
    let (mut stdout, mut stderr) = (io::stdout().lock(), io::stderr().lock());
    for (stream, text) in render::console(&reply.json) {
        match stream {
            Stream::Stdout => {
                stdout.write_all(text.as_bytes())?;
                stdout.flush()?;
            }
            Stream::Stderr => {
                stderr.write_all(text.as_bytes())?;
                stderr.flush()?;
            }
        }
    }
    match &end {
        ExecEnd::Exited(_) => {}
        ExecEnd::TimedOut => match timeout {
            Some(t) => writeln!(stderr, "error: the execution timed out after {t}s")?,
            None => writeln!(stderr, "error: the execution timed out")?,
        },
        ExecEnd::NoExitCode(status) => {
            writeln!(stderr, "error: the execution ended with status {status} and no exit code")?
        }
    }
    Ok(end.exit_code())
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
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
        let a = parse(&["session", "show", "abc", "--api", "http://m:9000", "-o", "json"]).unwrap();
        assert_eq!((a.api.as_str(), a.output), ("http://m:9000", Output::Json));
        assert!(matches!(a.command, CtlCommand::Session(SessionCommand::Show { ref id }) if id == "abc"));
        let a = parse(&["sessions", "--all", "--access-key", "K"]).unwrap();
        assert!(matches!(a.command, CtlCommand::Sessions { all: true, access_key: Some(ref k) } if k == "K"));
        assert_eq!(a.output, Output::Table);
    }

    #[test]
    fn create_body() {
        let a = parse(&[
            "session", "create", "--image", "img:1", "--cpu", "0.5", "--mem", "256m", "--access-key", "AK",
            "--env", "A=1", "--env", "B=x=y", "--mount", "data=/vfroot/data:ro",
        ])
        .unwrap();
        let CtlCommand::Session(SessionCommand::Create(c)) = a.command else { panic!("not create") };
        assert_eq!(
            c.to_json(),
            json!({"image": "img:1", "resource_slots": {"cpu": "0.5", "mem": "256m"}, "access_key": "AK",
                   "environ": {"A": "1", "B": "x=y"},
                   "mounts": [{"name": "data", "host_path": "/vfroot/data", "permission": "ro"}]})
        );
        let a = parse(&["session", "create", "--image", "i", "--cpu", "1", "--mem", "1g", "--access-key", "AK"]).unwrap();
        let CtlCommand::Session(SessionCommand::Create(c)) = a.command else { panic!("not create") };
        assert!(c.to_json().get("environ").is_none() && c.to_json().get("mounts").is_none());
    }

    #[test]
    fn malformed_env_and_mount_are_usage_errors() {
        let base = ["session", "create", "--image", "i", "--cpu", "1", "--mem", "1g", "--access-key", "AK"];
        let err = parse(&[&base[..], &["--env", "NOEQUALS"]].concat()).err().unwrap();
        assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
        let text = err.to_string();
        assert!(text.contains("NOEQUALS") && text.contains("expected KEY=VALUE"), "{text}");
        let text = parse(&[&base[..], &["--mount", "data"]].concat()).err().unwrap().to_string();
        assert!(text.contains("expected NAME=HOST_PATH[:ro|rw]"), "{text}");
        assert!(parse(&["session", "create", "--image", "i"]).is_err(), "cpu/mem/access-key are required");
    }

    #[test]
    fn exec_ends() {
        let of = |v: Value| ExecEnd::of(&v);
        assert_eq!(of(json!({"exitCode": 0, "status": "finished"})), ExecEnd::Exited(0));
        assert_eq!(of(json!({"exitCode": 3, "status": "finished"})).exit_code(), 3);
        assert_eq!(of(json!({"exitCode": 256, "status": "finished"})).exit_code(), 1);
        assert_eq!(of(json!({"exitCode": -9, "status": "finished"})).exit_code(), 1);
        assert_eq!(of(json!({"exitCode": null, "status": "exec-timeout"})), ExecEnd::TimedOut);
        assert_eq!(of(json!({"exitCode": null, "status": "exec-timeout"})).exit_code(), 124);
        assert_eq!(of(json!({"exitCode": null, "status": "continued"})), ExecEnd::NoExitCode("continued".into()));
    }
}

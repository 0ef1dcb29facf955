//! `kernelvisor ctl …`: a command-line client of the manager's HTTP API
//! (`docs/manager-api.md`).
//!
//! `session exec` streams: it prints each answer of the execute continuation protocol as it
//! comes (`-o json`: one compact JSON line per answer) and continues the run until it ends, so
//! memory does not grow with the output. `session logs` copies the kernel's logs to stdout as
//! they stream (`--follow`). `session wait` polls a session until it is `TERMINATED`.
//! `session cp` streams a file to or from a session; `session ls` lists a directory of it;
//! `session services`, `service-start` and `service-stop` manage its services; `session commit`
//! saves it as an image (pushed with `--push`, followed with `--wait`). `agent purge-images`
//! removes images from an agent; `agent cordon`, `uncordon` and `drain` stop and resume
//! placements on it. `access-key …` manages access keys, `vfolder …` the caller's
//! vfolders. `events [-f]` prints the manager's event stream, one line per event, and `session
//! show --watch` a session followed by a line per change of it until it ends.
//!
//! One module per noun, as cargo has one per command: `agent` (`agents`, `agent …`), `session` (`sessions`
//! and `session …`, one module per subcommand), `access_key`, `vfolder`, `health` and `events`
//! (with `sse`, the server-sent events reader it and `session show --watch` share). Each
//! holds its clap arguments, the function that runs it and its tests; this module parses the
//! global options, dispatches by noun and reports failures.
//!
//! Every request carries `Authorization: Bearer <token>` when `--token` (or `KERNELVISOR_TOKEN`)
//! is given; an `https://` API is checked against the webpki roots, or exactly the certificates
//! of `--ca-cert` (`KERNELVISOR_CA_CERT`).
//!
//! Exit status: 0 on success; 1 when the API answers an error (printed as
//! `error: <code>: <message> (HTTP <status>)`, followed by the error's `output` when it has one,
//! as `service-failed` does, and by a `hint: …` line on a 401), an answer is not JSON, or a local file cannot be read or written
//! (`session cp`); 2 on usage errors (clap's); 3 when the API cannot be reached or the
//! connection breaks ([`client::EXIT_UNREACHABLE`]); 141 when stdout is closed early (`| head`). `session exec` exits with the
//! executed code's exit code, or 124 when it timed out. `session wait` exits with the session's
//! exit code (see [`wait_exit_code`]), or 124 when `--timeout` passed first.

mod access_key;
mod agent;
mod client;
mod events;
mod format;
mod health;
mod parse;
mod render;
mod session;
mod sse;
#[cfg(test)]
mod test_util;
#[cfg(test)]
mod testserver;
mod vfolder;
mod websocket;

use std::io::{self, Write};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, Subcommand, ValueEnum};
use serde_json::Value;

pub use access_key::AccessKeyCommand;
pub use agent::{AgentCommand, DrainArgs, PurgeImagesArgs};
pub use client::{ApiError, Client, ClientError, ClientOptions, Reply};
pub use events::EventsArgs;
pub use parse::{Endpoint, Mount, Permission, Transfer};
pub use session::{
    wait_exit_code, CommitArgs, CpArgs, CreateArgs, ExecArgs, ExecEnd, ExecOptions, LogsArgs,
    LsArgs, RestartMode, RmArgs, ServiceArgs, ServicesArgs, SessionCommand, SessionType,
    SessionsArgs, ShowArgs, WaitArgs,
};
pub use vfolder::VfolderCommand;

/// The API URL used when neither `--api` nor `KERNELVISOR_API` is given.
pub const DEFAULT_API: &str = "http://127.0.0.1:8081";
/// Exit status of `session exec` when the execution timed out, and of `session wait` when its
/// `--timeout` passed (as `timeout(1)`).
pub const EXIT_TIMEOUT: i32 = 124;

/// Arguments of `kernelvisor ctl`.
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// Base URL of the manager's HTTP API: http://HOST:PORT, or https://HOST:PORT when the
    /// manager has [api] tls-cert. Several managers: comma-separated URLs, tried in turn when
    /// one cannot be reached (a request that reached a manager is never resent).
    #[arg(long, global = true, value_name = "URL", env = "KERNELVISOR_API", default_value = DEFAULT_API)]
    pub api: String,
    /// Access token, an access key's secret key, sent with every request as `Authorization:
    /// Bearer TOKEN`; none by default.
    #[arg(
        long,
        global = true,
        value_name = "TOKEN",
        env = "KERNELVISOR_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
    /// PEM certificate(s) to trust for an https:// API (its self-signed certificate, or the CA
    /// that issued it) instead of the public web roots.
    #[arg(long, global = true, value_name = "PATH", env = "KERNELVISOR_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
    /// Output format (no effect on `session logs` and on `session cp … -`, which print the
    /// logs and the file as they are).
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
    /// List agents with their scheduling (yes, cordoned, draining), slots, kernels and last
    /// heartbeat (GET /v1/agents).
    Agents,
    /// Act on one agent (admin): cordon, uncordon or drain it, remove images from it.
    #[command(subcommand)]
    Agent(AgentCommand),
    /// List sessions, live ones unless --all (GET /v1/sessions).
    Sessions(SessionsArgs),
    /// Create, inspect, run code in, wait for, read the logs of, copy files to and from, list
    /// files of, start and stop services of, or terminate one session.
    #[command(subcommand)]
    Session(SessionCommand),
    /// Create, list, show, enable, disable, limit or delete access keys.
    #[command(subcommand)]
    AccessKey(AccessKeyCommand),
    /// Create, list or delete vfolders (storage that `session create --mount` mounts).
    #[command(subcommand)]
    Vfolder(VfolderCommand),
    /// The manager's health: status, mode and live agents (GET /health).
    Health,
    /// Print the manager's recent events, and with -f each new one as it happens (GET
    /// /v1/events): session status changes with reasons, image pull progress, agent liveness
    /// (admin keys).
    ///
    /// One line per event: time, type, session, status, reason; with -o json each event as one
    /// JSON line. A user key sees its own sessions' events only.
    Events(EventsArgs),
}

/// Runs one `kernelvisor ctl` command against the API and answers the process exit status (see
/// the module docs). API and connection errors are printed to stderr here, not returned; `Err`
/// is left for failures to write the output.
pub fn run(args: CtlArgs) -> anyhow::Result<i32> {
    let options = ClientOptions {
        token: args.token.clone(),
        ca_cert: args.ca_cert.clone(),
    };
    let result = Client::with_options(&args.api, &options)
        .map_err(Failure::Client)
        .and_then(|client| dispatch(&client, &args));
    match result {
        Ok(code) => Ok(code),
        Err(Failure::Client(e)) => {
            let lines = matches!(args.command, CtlCommand::Session(SessionCommand::Exec(_)));
            report(&e, args.output, lines, &mut io::stdout(), &mut io::stderr());
            Ok(e.exit_code())
        }
        Err(Failure::Local(message)) => {
            eprintln!("error: {message}");
            Ok(1)
        }
        // The reader went away (`ctl sessions | head`): stop quietly, as SIGPIPE would.
        Err(Failure::Io(e)) if e.kind() == io::ErrorKind::BrokenPipe => Ok(141),
        Err(Failure::Io(e)) => Err(anyhow::Error::new(e).context("writing the output")),
    }
}

/// Prints a failed call: with `-o json`, the API's error envelope on `stdout` (on one line when
/// `lines`, as `session exec` prints its answers); then the error on `stderr`, followed by the
/// error's `output` (a failed service's last output) when it has one, and its `hint: …` (a 401:
/// how to give a token). Write errors are ignored: the exit status tells of the failure anyway.
fn report(
    e: &ClientError,
    out: Output,
    lines: bool,
    stdout: &mut impl Write,
    stderr: &mut impl Write,
) {
    if let (Output::Json, ClientError::Api(api)) = (out, e) {
        if api.is_envelope() {
            // Scripts get the error envelope on stdout, like any other answer; one line
            // where the answers are JSON lines.
            let text = if lines {
                format::compact_json(&api.body)
            } else {
                format::pretty_json(&api.body)
            };
            let _ = writeln!(stdout, "{text}");
            let _ = stdout.flush();
        }
    }
    let _ = writeln!(stderr, "{e}");
    if let ClientError::Api(api) = e {
        if let Some(output) = api.output().filter(|o| !o.is_empty()) {
            let _ = stderr.write_all(output.as_bytes());
            if !output.ends_with('\n') {
                let _ = writeln!(stderr);
            }
        }
        if let Some(hint) = &api.hint {
            let _ = writeln!(stderr, "hint: {hint}");
        }
    }
    let _ = stderr.flush();
}

/// Why a command failed; [`run`] reports each kind and turns it into the exit status.
#[derive(Debug)]
enum Failure {
    Client(ClientError),
    /// Output could not be written (a closed pipe: exit 141).
    Io(io::Error),
    /// A local file could not be read or written (`session cp`): printed as `error: <this>`,
    /// exit 1.
    Local(String),
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

/// Runs the command of `args` by its noun.
fn dispatch(client: &Client, args: &CtlArgs) -> Result<i32, Failure> {
    let out = args.output;
    match &args.command {
        CtlCommand::Agents => agent::run(client, out),
        CtlCommand::Agent(command) => {
            agent::run_command(client, command, out, &mut io::stdout().lock())
        }
        CtlCommand::Sessions(list) => session::list(client, list, out),
        CtlCommand::Session(command) => session::run(client, command, out),
        CtlCommand::AccessKey(command) => {
            access_key::run(client, command, out, &mut io::stdout().lock())
        }
        CtlCommand::Vfolder(command) => {
            vfolder::run(client, command, out, &mut io::stdout().lock())
        }
        CtlCommand::Health => health::run(client, out),
        CtlCommand::Events(args) => events::run(client, args, out),
    }
}

/// Prints a reply as JSON or through `table`, and answers exit status 0.
fn show(
    out: Output,
    reply: &impl AsRef<Reply>,
    table: impl FnOnce(&Value) -> String,
) -> Result<i32, Failure> {
    show_to(out, reply, table, &mut io::stdout().lock())
}

/// [`show`] to `stdout`. An answer without a body prints nothing with `-o json`.
fn show_to(
    out: Output,
    reply: &impl AsRef<Reply>,
    table: impl FnOnce(&Value) -> String,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    let reply = reply.as_ref();
    match out {
        Output::Json if reply.text.is_empty() => {}
        Output::Json => writeln!(stdout, "{}", format::pretty_json(&reply.text))?,
        Output::Table => stdout.write_all(table(&reply.json).as_bytes())?,
    }
    stdout.flush()?;
    Ok(0)
}

/// The current time in Unix seconds, which tables show times relative to.
fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::test_util::{key_command, parse, text};
    use super::testserver::{Answer, Server};
    use super::*;

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
            matches!(a.command, CtlCommand::Session(SessionCommand::Show(ShowArgs { ref id, watch: false })) if id == "abc")
        );
        let a = parse(&["sessions", "--all", "--access-key", "K"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Sessions(SessionsArgs { all: true, access_key: Some(ref k) }) if k == "K")
        );
        assert_eq!(a.output, Output::Table);
    }

    #[test]
    fn token_and_ca_cert_flags() {
        let a = parse(&["agents"]).unwrap();
        assert_eq!((a.token.as_deref(), a.ca_cert.as_deref()), (None, None));
        let a = parse(&[
            "session",
            "show",
            "S",
            "--token",
            "AK:sk",
            "--ca-cert",
            "/etc/ca.pem",
        ])
        .unwrap();
        assert_eq!(a.token.as_deref(), Some("AK:sk"));
        assert_eq!(
            a.ca_cert.as_deref(),
            Some(std::path::Path::new("/etc/ca.pem"))
        );
        let a = parse(&["--token=T", "--api", "https://m:8081", "vfolder", "list"]).unwrap();
        assert_eq!(
            (a.token.as_deref(), a.api.as_str()),
            (Some("T"), "https://m:8081")
        );
        assert!(matches!(
            a.command,
            CtlCommand::Vfolder(VfolderCommand::List { all: false })
        ));
    }

    #[test]
    fn unauthorized_and_forbidden_are_reported_with_a_hint_on_401() {
        let unauthorized =
            r#"{"error": {"code": "unauthorized", "message": "missing or invalid token"}}"#;
        let forbidden = r#"{"error": {"code": "forbidden", "message": "admin only"}}"#;
        let server = Server::start(vec![
            Answer::json(401, unauthorized),
            Answer::json(401, unauthorized),
            Answer::json(403, forbidden),
        ]);
        let fail = |client: &Client, out: Output| {
            let Err(Failure::Client(e)) =
                access_key::run(client, &key_command(&["list"]), out, &mut Vec::new())
            else {
                panic!("not an API error")
            };
            let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
            report(&e, out, false, &mut stdout, &mut stderr);
            (e.exit_code(), text(stdout), text(stderr))
        };
        let client = Client::new(&server.url).unwrap();
        let (code, stdout, stderr) = fail(&client, Output::Table);
        assert_eq!((code, stdout.as_str()), (1, ""));
        assert_eq!(
            stderr,
            "error: unauthorized: missing or invalid token (HTTP 401)\n\
             hint: the API wants an access token: pass --token TOKEN or set KERNELVISOR_TOKEN\n"
        );
        let (_, stdout, stderr) = fail(&client, Output::Json);
        let v: Value = serde_json::from_str(&stdout).unwrap();
        assert_eq!(v["error"]["code"], "unauthorized");
        assert!(stderr.contains("hint: "), "{stderr}");
        let options = ClientOptions {
            token: Some("user-token".to_owned()),
            ca_cert: None,
        };
        let client = Client::with_options(&server.url, &options).unwrap();
        let (code, _, stderr) = fail(&client, Output::Table);
        assert_eq!(
            (code, stderr.as_str()),
            (1, "error: forbidden: admin only (HTTP 403)\n"),
            "no hint on 403"
        );
    }
}

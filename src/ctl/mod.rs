//! `kernelvisor ctl …`: a command-line client of the manager's HTTP API
//! (`docs/manager-api.md`).
//!
//! `session exec` streams: it prints each answer of the execute continuation protocol as it
//! comes (`-o json`: one compact JSON line per answer) and continues the run until it ends, so
//! memory does not grow with the output. `session logs` copies the kernel's logs to stdout as
//! they stream (`--follow`). `session wait` polls a session until it is `TERMINATED`.
//! `session cp` streams a file to or from a session (module `files`); `session ls` lists a
//! directory of it; `session services`, `service-start` and `service-stop` manage its services.
//! `access-key …` manages access keys (module `keys`), `vfolder …` the caller's vfolders (module
//! `vfolders`).
//!
//! Every request carries `Authorization: Bearer <token>` when `--token` (or `KERNELVISOR_TOKEN`)
//! is given; an `https://` API is checked against the webpki roots, or exactly the certificates
//! of `--ca-cert` (`KERNELVISOR_CA_CERT`).
//!
//! Exit status: 0 on success; 1 when the API answers an error (printed as
//! `error: <code>: <message> (HTTP <status>)`, followed by the error's `output` when it has one,
//! as `service-failed` does, and by a `hint: …` line on a 401), an answer is not JSON, or a local file cannot be read or written
//! (`session cp`); 2 when the API cannot be reached or the connection breaks (and on usage
//! errors, from clap); 141 when stdout is closed early (`| head`). `session exec` exits with the
//! executed code's exit code, or 124 when it timed out. `session wait` exits with the session's
//! exit code (see [`wait_exit_code`]), or 124 when `--timeout` passed first.

mod client;
mod files;
mod format;
mod keys;
mod parse;
mod render;
#[cfg(test)]
mod testserver;
mod vfolders;

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::{ArgMatches, Args, FromArgMatches, Subcommand, ValueEnum};
use serde_json::{json, Map, Value};

pub use client::{ApiError, Client, ClientError, ClientOptions, Reply};
pub use keys::AccessKeyCommand;
pub use parse::{Endpoint, Mount, Permission, Transfer};
pub use vfolders::VfolderCommand;

use client::segment;
use files::Downloaded;
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
}

/// `kernelvisor ctl session …`.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Start a session on the least-loaded agent that fits it (POST /v1/sessions).
    Create(Box<CreateArgs>),
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
    /// List a session's services, their ports and URLs (GET /v1/sessions/{id}/services).
    Services {
        /// Session id (UUID).
        id: String,
    },
    /// Start a service of a session and print its URL (POST /v1/sessions/{id}/services/{name}).
    ///
    /// A service that runs already is no error: it is reported as already running. When the
    /// service fails to start, the end of its output is printed after the error.
    ServiceStart {
        /// Session id (UUID).
        id: String,
        /// Service name, as `session services` lists it.
        name: String,
    },
    /// Stop a service of a session (DELETE /v1/sessions/{id}/services/{name}).
    ServiceStop {
        /// Session id (UUID).
        id: String,
        /// Service name, as `session services` lists it.
        name: String,
    },
    /// Copy a file into or out of a session (PUT/GET /v1/sessions/{id}/files/{path}).
    ///
    /// Exactly one of SRC and DST is ID:PATH: the file PATH of session ID, relative to
    /// /home/work. The other side is a local path, or - for stdin/stdout. The file is streamed
    /// both ways, never held in memory; a download is written to a temporary file next to the
    /// destination and renamed when complete, so a failed one leaves no file behind.
    ///
    /// Examples: `cp data.bin ID:sub/` uploads to /home/work/sub/data.bin; `cp ID:out.txt .`
    /// downloads to ./out.txt; `cp ID:log.txt -` prints it; `cp - ID:in.txt` uploads stdin.
    Cp(CpArgs),
    /// List a directory of a session, sorted by name (GET /v1/sessions/{id}/files?dir=PATH).
    Ls {
        /// Session id (UUID).
        id: String,
        /// Directory relative to /home/work [default: /home/work itself].
        #[arg(value_parser = parse::session_path)]
        path: Option<String>,
    },
    /// Terminate a session (DELETE /v1/sessions/{id}).
    Rm {
        /// Session id (UUID).
        id: String,
    },
}

/// Arguments of `kernelvisor ctl session cp`: what to copy where. Parsing fails (a usage error)
/// unless exactly one side is `ID:PATH`.
#[derive(Debug, Clone)]
pub struct CpArgs {
    pub transfer: Transfer,
}

/// `session cp` as clap reads it, before the check that exactly one side is in a session.
#[derive(Debug, Args)]
struct CpSides {
    /// What to copy: ID:PATH (a file of session ID, PATH relative to /home/work), a local
    /// file, or - for stdin.
    #[arg(value_name = "SRC", value_parser = parse::endpoint)]
    src: Endpoint,
    /// Where to copy it: ID:PATH (PATH empty or ending in /: a directory, SRC's file name is
    /// appended), a local file or existing directory, or - for stdout.
    #[arg(value_name = "DST", value_parser = parse::endpoint)]
    dst: Endpoint,
}

impl FromArgMatches for CpArgs {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let sides = CpSides::from_arg_matches(matches)?;
        Transfer::new(sides.src, sides.dst)
            .map(|transfer| CpArgs { transfer })
            .map_err(|e| {
                // Formatted here, with the usage of `session cp` (not of the whole program).
                CpSides::augment_args(clap::Command::new("cp"))
                    .bin_name("kernelvisor ctl session cp")
                    .error(clap::error::ErrorKind::ValueValidation, e)
            })
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl Args for CpArgs {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        CpSides::augment_args(cmd)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        CpSides::augment_args_for_update(cmd)
    }
}

/// Session type of `session create --type` and the restart policy's mode of `--restart`: the
/// API's own enums (their CLI help is in `crate::model::session`).
pub use crate::model::session::{RestartMode, SessionType};

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
    /// An accelerator slot an agent advertises, e.g. cuda.device=1 or cuda.shares=0.5
    /// (repeatable; a later NAME wins). A slot no agent has is refused (unknown-slot).
    #[arg(long = "slot", value_name = "NAME=AMOUNT", value_parser = parse::slot)]
    pub slots: Vec<(String, String)>,
    /// Access key the session is charged to [default: the token's]; an admin token may name
    /// another key, to create the session on its behalf.
    #[arg(long, value_name = "KEY")]
    pub access_key: Option<String>,
    /// Environment variable for the kernel (repeatable; a later KEY wins).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse::env)]
    pub env: Vec<(String, String)>,
    /// A vfolder to mount at /home/work/NAME, read-write unless :ro (repeatable).
    #[arg(long = "mount", value_name = "NAME[:ro|:rw]", value_parser = parse::mount)]
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
    /// Restart the container when it exits [default: never]: on-failure after a non-zero exit,
    /// an OOM kill or a failing HEALTHCHECK (a batch job is retried); always after any exit.
    #[arg(long = "restart", value_name = "MODE", value_enum)]
    pub restart: Option<RestartMode>,
    /// With --restart: at most this many restarts within --restart-window [default: 3]; one
    /// more and the session ends with reason restart-limit-exceeded.
    #[arg(long, value_name = "N", requires = "restart")]
    pub max_restarts: Option<u32>,
    /// With --restart: the window of --max-restarts, in seconds [default: 60].
    #[arg(long, value_name = "SECS", value_parser = parse::positive_seconds, requires = "restart")]
    pub restart_window: Option<f64>,
    /// With --restart: seconds before the first restart, doubling with each further one up to
    /// 300 [default: 1].
    #[arg(long, value_name = "SECS", value_parser = parse::seconds, requires = "restart")]
    pub restart_backoff: Option<f64>,
}

impl CreateArgs {
    /// The `POST /v1/sessions` body; `access_key`, `environ`, `mounts` (`[{"name",
    /// "permission"}]`), `type`, `command`, `batch_timeout` and `restart_policy` (`{"mode", …}`
    /// with the limits given) only when given.
    pub fn to_json(&self) -> Value {
        let mut body = json!({
            "image": self.image,
            "resource_slots": {"cpu": self.cpu, "mem": self.mem},
        });
        for (name, amount) in &self.slots {
            body["resource_slots"][name] = json!(amount);
        }
        if let Some(key) = &self.access_key {
            body["access_key"] = json!(key);
        }
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
        if let Some(mode) = self.restart {
            let mut policy = json!({"mode": match mode {
                RestartMode::Never => "never",
                RestartMode::OnFailure => "on-failure",
                RestartMode::Always => "always",
            }});
            if let Some(n) = self.max_restarts {
                policy["max_restarts"] = json!(n);
            }
            if let Some(w) = self.restart_window {
                policy["window"] = parse::seconds_json(w);
            }
            if let Some(b) = self.restart_backoff {
                policy["backoff"] = parse::seconds_json(b);
            }
            body["restart_policy"] = policy;
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
            let lines = matches!(
                args.command,
                CtlCommand::Session(SessionCommand::Exec { .. })
            );
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
        CtlCommand::Session(SessionCommand::Services { id }) => {
            services(client, id, out, &mut io::stdout().lock())
        }
        CtlCommand::Session(SessionCommand::ServiceStart { id, name }) => {
            service_start(client, id, name, out, &mut io::stdout().lock())
        }
        CtlCommand::Session(SessionCommand::ServiceStop { id, name }) => {
            service_stop(client, id, name, out, &mut io::stdout().lock())
        }
        CtlCommand::Session(SessionCommand::Cp(CpArgs { transfer })) => cp(
            client,
            transfer,
            out,
            io::stdin().lock(),
            &mut io::stdout().lock(),
        ),
        CtlCommand::Session(SessionCommand::Ls { id, path }) => ls(
            client,
            id,
            path.as_deref().unwrap_or(""),
            out,
            &mut io::stdout().lock(),
        ),
        CtlCommand::AccessKey(command) => keys::run(client, command, out, &mut io::stdout().lock()),
        CtlCommand::Vfolder(command) => {
            vfolders::run(client, command, out, &mut io::stdout().lock())
        }
        CtlCommand::Health => show(out, &client.get("/health", &[])?, render::health),
    }
}

/// Prints a reply as JSON or through `table`, and answers exit status 0.
fn show(out: Output, reply: &Reply, table: impl FnOnce(&Value) -> String) -> Result<i32, Failure> {
    show_to(out, reply, table, &mut io::stdout().lock())
}

/// [`show`] to `stdout`. An answer without a body prints nothing with `-o json`.
fn show_to(
    out: Output,
    reply: &Reply,
    table: impl FnOnce(&Value) -> String,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    match out {
        Output::Json if reply.text.is_empty() => {}
        Output::Json => writeln!(stdout, "{}", format::pretty_json(&reply.text))?,
        Output::Table => stdout.write_all(table(&reply.json).as_bytes())?,
    }
    stdout.flush()?;
    Ok(0)
}

/// The API path of service `name` of session `id`.
fn service_path(id: &str, name: &str) -> String {
    format!("/v1/sessions/{}/services/{}", segment(id), segment(name))
}

/// `session services`.
fn services(
    client: &Client,
    id: &str,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    let reply = client.get(&format!("/v1/sessions/{}/services", segment(id)), &[])?;
    show_to(out, &reply, render::services, stdout)
}

/// `session service-start`: the service's URL, or (`-o json`) the manager's answer.
fn service_start(
    client: &Client,
    id: &str,
    name: &str,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    // Starting may wait for the service to come up: no limit beyond the manager's.
    let reply = client.post_empty(&service_path(id, name), None)?;
    show_to(out, &reply, |v| render::service_started(v, name), stdout)
}

/// `session service-stop`.
fn service_stop(
    client: &Client,
    id: &str,
    name: &str,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    let reply = client.delete(&service_path(id, name))?;
    show_to(out, &reply, |v| render::service_stopped(v, name), stdout)
}

/// `session cp`: `uploaded N bytes to ID:PATH` / `downloaded N bytes to FILE`, or (`-o json`)
/// the manager's answer to an upload and `{"path", "size"}` for a download. A download to `-`
/// prints only the file.
fn cp(
    client: &Client,
    transfer: &Transfer,
    out: Output,
    stdin: impl Read,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    match transfer {
        Transfer::Upload { local, id, path } => {
            let up = files::upload(client, local, id, path, stdin)?;
            show_to(
                out,
                &up.reply,
                |v| {
                    let size = v.get("size").and_then(Value::as_u64).unwrap_or(up.size);
                    let path = v.get("path").and_then(Value::as_str).unwrap_or(&up.path);
                    format!("uploaded {size} bytes to {id}:{path}\n")
                },
                stdout,
            )
        }
        Transfer::Download { id, path, local } => {
            match files::download(client, id, path, local, stdout)? {
                Downloaded::Stdout(_) => {}
                Downloaded::File { path, size } => {
                    let shown = path.display();
                    match out {
                        Output::Json => {
                            let v = json!({"path": shown.to_string(), "size": size});
                            writeln!(
                                stdout,
                                "{}",
                                serde_json::to_string_pretty(&v).unwrap_or_default()
                            )?
                        }
                        Output::Table => writeln!(stdout, "downloaded {size} bytes to {shown}")?,
                    }
                    stdout.flush()?;
                }
            }
            Ok(0)
        }
    }
}

/// `session ls`.
fn ls(
    client: &Client,
    id: &str,
    dir: &str,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    let dir = dir.trim_end_matches('/');
    let reply = client.get(
        &format!("/v1/sessions/{}/files", segment(id)),
        &[("dir", dir)],
    )?;
    show_to(out, &reply, render::files, stdout)
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
            "data:ro",
            "--mount",
            "scratch",
        ])
        .unwrap();
        let CtlCommand::Session(SessionCommand::Create(c)) = a.command else {
            panic!("not create")
        };
        assert_eq!(
            c.to_json(),
            json!({"image": "img:1", "resource_slots": {"cpu": "0.5", "mem": "256m"}, "access_key": "AK",
                   "environ": {"A": "1", "B": "x=y"},
                   "mounts": [{"name": "data", "permission": "ro"},
                              {"name": "scratch", "permission": "rw"}]})
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

    #[test]
    fn create_with_accelerator_slots() {
        let c = create(&[
            "--slot",
            "cuda.device=2",
            "--slot",
            "cuda.shares=0.5",
            "--slot",
            "cuda.device=1",
        ])
        .unwrap();
        assert_eq!(
            c.to_json()["resource_slots"],
            json!({"cpu": "1", "mem": "1g", "cuda.device": "1", "cuda.shares": "0.5"})
        );
        for (bad, word) in [
            ("cuda.device", "'='"),
            ("Cuda=1", "slot name"),
            ("cpu=2", "--cpu"),
            ("mem=1g", "--mem"),
            ("cuda.device=", "empty"),
        ] {
            let e = create(&["--slot", bad]).unwrap_err().to_string();
            assert!(e.contains(word), "{bad}: {e}");
        }
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
            CtlCommand::Session(SessionCommand::Create(c)) => Ok(*c),
            other => panic!("not create: {other:?}"),
        }
    }

    #[test]
    fn create_restart_policy() {
        let c = create(&[
            "--restart",
            "on-failure",
            "--max-restarts",
            "2",
            "--restart-backoff",
            "0.5",
        ])
        .unwrap();
        assert_eq!(
            c.to_json()["restart_policy"],
            json!({"mode": "on-failure", "max_restarts": 2, "backoff": 0.5})
        );
        assert_eq!(
            create(&["--restart", "always", "--restart-window", "30"])
                .unwrap()
                .to_json()["restart_policy"],
            json!({"mode": "always", "window": 30})
        );
        assert!(create(&[])
            .unwrap()
            .to_json()
            .get("restart_policy")
            .is_none());
        assert!(
            create(&["--max-restarts", "2"]).is_err(),
            "limits need --restart"
        );
        assert!(create(&["--restart", "sometimes"]).is_err());
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
        let text = parse(&[&base[..], &["--mount", "data=/vfroot/data"]].concat())
            .err()
            .unwrap()
            .to_string();
        assert!(text.contains("expected NAME[:ro|:rw]"), "{text}");
        assert!(
            parse(&["session", "create", "--image", "i"]).is_err(),
            "cpu/mem are required"
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
            other => panic!("{other:?}"),
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

    #[test]
    fn services_cp_ls_parse() {
        let a = parse(&["session", "service-start", "S", "web"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::ServiceStart { ref id, ref name }) if id == "S" && name == "web")
        );
        let a = parse(&["session", "service-stop", "S", "web", "-o", "json"]).unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Session(SessionCommand::ServiceStop { .. })
        ));
        assert!(parse(&["session", "services", "S"]).is_ok());

        let a = parse(&["session", "ls", "S"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Ls { ref id, path: None }) if id == "S")
        );
        let a = parse(&["session", "ls", "S", "/home/work/sub/"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Ls { path: Some(ref p), .. }) if p == "sub/")
        );
        assert!(parse(&["session", "ls", "S", "../etc"]).is_err());

        let a = parse(&["session", "cp", "big.bin", "S:dir/"]).unwrap();
        let CtlCommand::Session(SessionCommand::Cp(cp)) = a.command else {
            panic!("not cp")
        };
        assert_eq!(
            cp.transfer,
            Transfer::Upload {
                local: "big.bin".into(),
                id: "S".into(),
                path: "dir/".into()
            }
        );
        let a = parse(&["session", "cp", "S:out.txt", "-"]).unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Session(SessionCommand::Cp(CpArgs {
                transfer: Transfer::Download { .. }
            }))
        ));
    }

    #[test]
    fn cp_needs_exactly_one_session_side() {
        for (src, dst, want) in [
            ("a.txt", "b.txt", "neither SRC nor DST is a session path"),
            ("./S:a", "/tmp/x", "neither SRC nor DST is a session path"),
            ("S:a", "T:b", "both SRC and DST are session paths"),
            ("-", "S:dir/", "stdin has no file name"),
            ("S:dir/", "out", "is a directory"),
        ] {
            let err = parse(&["session", "cp", src, dst]).err().unwrap();
            assert_eq!(err.kind(), clap::error::ErrorKind::ValueValidation);
            assert_eq!(err.exit_code(), 2, "a usage error");
            let text = err.to_string();
            assert!(text.contains(want), "{src} {dst}: {text}");
        }
        let err = parse(&["session", "cp", "x", "S:../y"]).err().unwrap();
        assert!(err.to_string().contains("'..' is not allowed"), "{err}");
        assert!(parse(&["session", "cp", "x"]).is_err(), "DST is required");
    }

    fn text(buf: Vec<u8>) -> String {
        String::from_utf8(buf).unwrap()
    }

    const SERVICES: &str = r#"{"services": [{"name": "web", "protocol": "http", "container_ports": [8080], "host_ports": [30001], "status": "running", "url": "http://10.0.0.5:30001"}, {"name": "jupyter", "protocol": "http", "container_ports": [8888], "host_ports": [], "status": "stopped", "url": null}]}"#;

    #[test]
    fn services_table_and_json() {
        let server = Server::start(vec![
            Answer::json(200, SERVICES),
            Answer::json(200, SERVICES),
        ]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        assert_eq!(
            services(&client, "S 1", Output::Table, &mut out).unwrap(),
            0
        );
        let table = text(out);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("NAME") && lines[0].ends_with("URL"),
            "{table}"
        );
        assert!(lines[1].starts_with("web ") && lines[1].ends_with("http://10.0.0.5:30001"));
        assert!(
            lines[2].contains("stopped") && lines[2].ends_with('-'),
            "{table}"
        );
        let mut out = Vec::new();
        services(&client, "S 1", Output::Json, &mut out).unwrap();
        assert_eq!(text(out), format::pretty_json(SERVICES) + "\n");
        let requests = server.requests();
        assert_eq!(requests[0].line, "GET /v1/sessions/S%201/services");
        assert_eq!(requests[1].line, "GET /v1/sessions/S%201/services");
    }

    #[test]
    fn service_start_started_or_already_running() {
        let service = |started: bool| {
            Answer::json(
                200,
                json!({"name": "web", "protocol": "http", "container_ports": [8080],
                       "host_ports": [30001], "status": "running",
                       "url": "http://10.0.0.5:30001", "started": started})
                .to_string(),
            )
        };
        let server = Server::start(vec![service(true), service(false), service(false)]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        service_start(&client, "S", "web", Output::Table, &mut out).unwrap();
        service_start(&client, "S", "web", Output::Table, &mut out).unwrap();
        assert_eq!(
            text(out),
            "web started: http://10.0.0.5:30001\nweb already running: http://10.0.0.5:30001\n"
        );
        let mut out = Vec::new();
        service_start(&client, "S", "web", Output::Json, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            (&v["started"], &v["status"]),
            (&json!(false), &json!("running"))
        );
        let requests = server.requests();
        for r in &requests {
            assert_eq!(r.line, "POST /v1/sessions/S/services/web");
            assert_eq!(r.header("content-length"), Some("0"));
            assert_eq!(r.body, "");
        }
    }

    #[test]
    fn service_start_failure_prints_the_output() {
        let body = json!({"error": {"code": "service-failed",
            "message": "service web exited with code 1 before listening",
            "output": "Traceback (most recent call last):\nOSError: port in use"}})
        .to_string();
        let server = Server::start(vec![
            Answer::json(409, body.clone()),
            Answer::json(409, body),
        ]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        let Err(Failure::Client(e)) = service_start(&client, "S", "web", Output::Table, &mut out)
        else {
            panic!("not an API error")
        };
        assert_eq!(e.exit_code(), 1);
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        report(&e, Output::Table, false, &mut stdout, &mut stderr);
        assert_eq!(text(stdout), "");
        assert_eq!(
            text(stderr),
            "error: service-failed: service web exited with code 1 before listening (HTTP 409)\n\
             Traceback (most recent call last):\nOSError: port in use\n"
        );
        assert!(out.is_empty());

        let Err(Failure::Client(e)) = service_start(&client, "S", "web", Output::Json, &mut out)
        else {
            panic!("not an API error")
        };
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        report(&e, Output::Json, false, &mut stdout, &mut stderr);
        let v: Value = serde_json::from_slice(&stdout).unwrap();
        assert_eq!(v["error"]["code"], "service-failed");
        assert!(text(stderr).ends_with("OSError: port in use\n"));
    }

    #[test]
    fn service_stop_prints_stopped() {
        let body = r#"{"name": "web", "protocol": "http", "container_ports": [8080], "host_ports": [30001], "status": "stopped", "url": "http://10.0.0.5:30001"}"#;
        let not_found = r#"{"error": {"code": "service-not-found", "message": "no service db"}}"#;
        let server = Server::start(vec![Answer::json(200, body), Answer::json(404, not_found)]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        assert_eq!(
            service_stop(&client, "S", "web", Output::Table, &mut out).unwrap(),
            0
        );
        assert_eq!(text(out), "web stopped\n");
        match service_stop(&client, "S", "d b", Output::Table, &mut Vec::new()) {
            Err(Failure::Client(e)) => {
                assert_eq!(e.exit_code(), 1);
                assert_eq!(
                    e.to_string(),
                    "error: service-not-found: no service db (HTTP 404)"
                );
            }
            other => panic!("{other:?}"),
        }
        let requests = server.requests();
        assert_eq!(requests[0].line, "DELETE /v1/sessions/S/services/web");
        assert_eq!(requests[1].line, "DELETE /v1/sessions/S/services/d%20b");
    }

    /// `n` bytes of every value, in an order that is not periodic in small blocks.
    fn generated(n: usize) -> Vec<u8> {
        let mut x: u32 = 0x9E37_79B9;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                (x >> 24) as u8
            })
            .collect()
    }

    fn upload(
        client: &Client,
        local: &str,
        remote: &str,
        out: Output,
        stdin: &[u8],
    ) -> Result<String, Failure> {
        let CpArgs { transfer } = match parse(&["session", "cp", local, remote]).unwrap().command {
            CtlCommand::Session(SessionCommand::Cp(cp)) => cp,
            other => panic!("{other:?}"),
        };
        let mut stdout = Vec::new();
        cp(client, &transfer, out, stdin, &mut stdout)?;
        Ok(text(stdout))
    }

    #[test]
    fn cp_upload_streams_the_file_with_its_length() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("big.bin");
        let data = generated(3 * 1024 * 1024);
        std::fs::write(&file, &data).unwrap();
        let server = Server::start(vec![
            Answer::json(201, r#"{"path": "dir/big.bin", "size": 3145728}"#),
            Answer::json(201, r#"{"path": "sub dir/a?.txt", "size": 5}"#),
        ]);
        let client = Client::new(&server.url).unwrap();
        let local = file.to_str().unwrap();
        let printed = upload(&client, local, "S:dir/", Output::Table, b"").unwrap();
        assert_eq!(printed, "uploaded 3145728 bytes to S:dir/big.bin\n");
        let printed = upload(
            &client,
            "-",
            "S:/home/work/sub dir/a?.txt",
            Output::Json,
            b"hello",
        )
        .unwrap();
        let v: Value = serde_json::from_str(&printed).unwrap();
        assert_eq!(v, json!({"path": "sub dir/a?.txt", "size": 5}));

        let requests = server.requests();
        assert_eq!(requests[0].line, "PUT /v1/sessions/S/files/dir/big.bin");
        assert_eq!(requests[0].header("content-length"), Some("3145728"));
        assert_eq!(requests[0].header("transfer-encoding"), None);
        assert_eq!(
            requests[0].header("content-type"),
            Some("application/octet-stream")
        );
        assert!(requests[0].bytes == data, "the exact bytes arrived");
        // stdin is spooled to learn its size: it is sent with a Content-Length as well.
        assert_eq!(
            requests[1].line,
            "PUT /v1/sessions/S/files/sub%20dir/a%3F.txt"
        );
        assert_eq!(requests[1].header("content-length"), Some("5"));
        assert_eq!(requests[1].bytes, b"hello");
    }

    #[test]
    fn cp_upload_refused_before_the_body_was_read() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("big.bin");
        std::fs::write(&file, generated(32 * 1024 * 1024)).unwrap();
        let not_found = r#"{"error": {"code": "session-not-found", "message": "no session S"}}"#;
        let mut refuse = Answer::json(404, not_found);
        refuse.skip_body = true;
        let server = Server::start(vec![refuse]);
        let client = Client::new(&server.url).unwrap();
        // Either the whole file fit in the socket buffers and the answer is read, or the
        // connection broke under the upload: both are errors with a hint of why.
        match upload(&client, file.to_str().unwrap(), "S:x", Output::Table, b"") {
            Err(Failure::Client(e @ ClientError::Api(_))) => {
                assert_eq!(
                    e.to_string(),
                    "error: session-not-found: no session S (HTTP 404)"
                )
            }
            Err(Failure::Client(e @ ClientError::Transport { .. })) => {
                let text = e.to_string();
                assert!(text.starts_with("error: upload cut off by "), "{text}");
                assert!(text.contains("check the session id and path"), "{text}");
                assert_eq!(e.exit_code(), 2);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(server.requests()[0].line, "PUT /v1/sessions/S/files/x");
    }

    #[test]
    fn cp_upload_local_errors() {
        // No server is asked: the local side fails first.
        let client = Client::new("http://127.0.0.1:1").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.bin");
        match upload(&client, missing.to_str().unwrap(), "S:", Output::Table, b"") {
            Err(Failure::Local(m)) => assert!(m.starts_with("cannot read "), "{m}"),
            other => panic!("{other:?}"),
        }
        match upload(
            &client,
            dir.path().to_str().unwrap(),
            "S:x",
            Output::Table,
            b"",
        ) {
            Err(Failure::Local(m)) => assert!(
                m.ends_with("is a directory; only files can be copied"),
                "{m}"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn spool_answers_a_rewound_file_and_its_size() {
        let data = generated(100_000);
        let (mut file, size) = files::spool(&data[..]).unwrap();
        assert_eq!(size, 100_000);
        let mut back = Vec::new();
        file.read_to_end(&mut back).unwrap();
        assert!(back == data);
    }

    fn download(
        client: &Client,
        remote: &str,
        local: &str,
        out: Output,
    ) -> Result<Vec<u8>, Failure> {
        let CpArgs { transfer } = match parse(&["session", "cp", remote, local]).unwrap().command {
            CtlCommand::Session(SessionCommand::Cp(cp)) => cp,
            other => panic!("{other:?}"),
        };
        let mut stdout = Vec::new();
        cp(client, &transfer, out, &b""[..], &mut stdout)?;
        Ok(stdout)
    }

    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn cp_download_writes_the_exact_bytes() {
        let data = generated(2 * 1024 * 1024 + 7);
        let chunked: Vec<Vec<u8>> = data.chunks(300_000).map(<[u8]>::to_vec).collect();
        let server = Server::start(vec![
            Answer::bytes(200, "application/octet-stream", data.clone()),
            Answer {
                parts: chunked,
                ..Answer::bytes(200, "application/octet-stream", Vec::new())
            },
            Answer::bytes(200, "application/octet-stream", b"to stdout".to_vec()),
        ]);
        let client = Client::new(&server.url).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().to_str().unwrap();

        // Into an existing directory: the file keeps its session name.
        let printed = download(&client, "S:sub/x.bin", d, Output::Table).unwrap();
        let target = dir.path().join("x.bin");
        assert_eq!(
            text(printed),
            format!("downloaded {} bytes to {}\n", data.len(), target.display())
        );
        assert!(std::fs::read(&target).unwrap() == data);

        // A chunked body to a named file, replacing it.
        let named = dir.path().join("copy.bin");
        std::fs::write(&named, b"old").unwrap();
        let printed =
            download(&client, "S:x y.bin", named.to_str().unwrap(), Output::Json).unwrap();
        let v: Value = serde_json::from_slice(&printed).unwrap();
        assert_eq!(
            v,
            json!({"path": named.to_str().unwrap(), "size": data.len()})
        );
        assert!(std::fs::read(&named).unwrap() == data);
        assert_eq!(
            names(dir.path()),
            ["copy.bin", "x.bin"],
            "no temporary file left"
        );

        // To stdout: the bytes only.
        assert_eq!(
            download(&client, "S:a.txt", "-", Output::Table).unwrap(),
            b"to stdout"
        );

        let requests = server.requests();
        assert_eq!(requests[0].line, "GET /v1/sessions/S/files/sub/x.bin");
        assert_eq!(requests[1].line, "GET /v1/sessions/S/files/x%20y.bin");
        assert_eq!(requests[2].line, "GET /v1/sessions/S/files/a.txt");
    }

    #[test]
    fn cp_download_failure_leaves_no_file() {
        let not_found = r#"{"error": {"code": "file-not-found", "message": "no file nope.bin"}}"#;
        let mut short = Answer::bytes(200, "application/octet-stream", generated(1000));
        short.announced_length = Some(5000);
        let server = Server::start(vec![Answer::json(404, not_found), short]);
        let client = Client::new(&server.url).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("keep.bin");
        std::fs::write(&target, b"before").unwrap();
        let t = target.to_str().unwrap();

        match download(
            &client,
            "S:nope.bin",
            dir.path().to_str().unwrap(),
            Output::Table,
        ) {
            Err(Failure::Client(e)) => {
                assert_eq!(e.exit_code(), 1);
                assert_eq!(
                    e.to_string(),
                    "error: file-not-found: no file nope.bin (HTTP 404)"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            names(dir.path()),
            ["keep.bin"],
            "no nope.bin, no temporary file"
        );

        // The body ends before its Content-Length: the old file stays as it was.
        match download(&client, "S:x.bin", t, Output::Table) {
            Err(Failure::Client(e)) => assert_eq!(e.exit_code(), 2, "{e}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(names(dir.path()), ["keep.bin"]);
        assert_eq!(std::fs::read(&target).unwrap(), b"before");

        // A directory that does not exist: a local error, no request.
        let missing = dir.path().join("no/such/dir/");
        match download(
            &client,
            "S:x.bin",
            &format!("{}/", missing.display()),
            Output::Table,
        ) {
            Err(Failure::Local(m)) => assert!(m.ends_with("is not a directory"), "{m}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(server.requests().len(), 2);
    }

    #[test]
    fn ls_table_sorted_and_dir_encoded() {
        let body = r#"{"files": [
            {"name": "zeta.txt", "type": "file", "size": 12, "mode": "0644", "mtime": 1700000000.0},
            {"name": "data", "type": "dir", "size": 4096, "mode": "0755", "mtime": 1700000060.5},
            {"name": "b.py", "type": "file", "size": 0, "mode": "0600", "mtime": 1699999999}
        ]}"#;
        let server = Server::start(vec![
            Answer::json(200, body),
            Answer::json(200, body),
            Answer::json(200, r#"{"files": []}"#),
        ]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        ls(&client, "S", "sub dir/a&b=ü/", Output::Table, &mut out).unwrap();
        let table = text(out);
        let rows: Vec<Vec<&str>> = table.lines().map(render::tests::cells).collect();
        assert_eq!(
            rows,
            [
                vec!["MODE", "SIZE", "MTIME", "NAME"],
                vec!["-rw-------", "0", "2023-11-14T22:13:19Z", "b.py"],
                vec!["drwxr-xr-x", "4096", "2023-11-14T22:14:20Z", "data/"],
                vec!["-rw-r--r--", "12", "2023-11-14T22:13:20Z", "zeta.txt"],
            ]
        );
        let mut out = Vec::new();
        ls(&client, "S", "", Output::Json, &mut out).unwrap();
        assert_eq!(text(out), format::pretty_json(body) + "\n");
        let mut out = Vec::new();
        ls(&client, "S", "", Output::Table, &mut out).unwrap();
        assert_eq!(text(out), "MODE  SIZE  MTIME  NAME\n");
        let requests = server.requests();
        assert_eq!(
            requests[0].line,
            "GET /v1/sessions/S/files?dir=sub+dir%2Fa%26b%3D%C3%BC"
        );
        assert_eq!(requests[1].line, "GET /v1/sessions/S/files?dir=");
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
    fn create_without_access_key_and_with_one() {
        let a = parse(&[
            "session", "create", "--image", "i", "--cpu", "1", "--mem", "1g", "--mount", "d:ro",
        ])
        .unwrap();
        let CtlCommand::Session(SessionCommand::Create(c)) = a.command else {
            panic!("not create")
        };
        assert_eq!(
            c.to_json(),
            json!({"image": "i", "resource_slots": {"cpu": "1", "mem": "1g"},
                   "mounts": [{"name": "d", "permission": "ro"}]})
        );
        assert_eq!(create(&[]).unwrap().to_json()["access_key"], "AK");
    }

    fn key_command(args: &[&str]) -> AccessKeyCommand {
        match parse(&[&["access-key"][..], args].concat())
            .unwrap()
            .command
        {
            CtlCommand::AccessKey(c) => c,
            other => panic!("{other:?}"),
        }
    }

    fn key_object(extra: Value) -> Value {
        let mut v = json!({"access_key": "AKNEW", "role": "user", "name": "ci",
                           "concurrency_limit": 4, "concurrency_used": 0, "enabled": true,
                           "created_at": 1_700_000_000.0});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    #[test]
    fn access_key_commands_send_their_requests() {
        let created = key_object(json!({"secret_key": "sk-secret"})).to_string();
        let key = key_object(json!({})).to_string();
        let server = Server::start(vec![
            Answer::json(201, created.clone()),
            Answer::json(201, created.clone()),
            Answer::json(
                200,
                json!({"access_keys": [key_object(json!({}))]}).to_string(),
            ),
            Answer::json(200, key.clone()),
            Answer::json(200, key.clone()),
            Answer::json(200, key.clone()),
            Answer::json(200, key.clone()),
            Answer::json(200, key.clone()),
        ]);
        let options = ClientOptions {
            token: Some("admin-token".to_owned()),
            ca_cert: None,
        };
        let client = Client::with_options(&server.url, &options).unwrap();
        let run = |args: &[&str], out: Output| {
            let mut stdout = Vec::new();
            let code = keys::run(&client, &key_command(args), out, &mut stdout).unwrap();
            assert_eq!(code, 0);
            text(stdout)
        };
        let table = run(
            &[
                "create",
                "--admin",
                "--concurrency-limit",
                "4",
                "--name",
                "ci",
            ],
            Output::Table,
        );
        assert!(table.contains("Secret key:  sk-secret\n"), "{table}");
        assert!(table.contains("shown only this once"), "{table}");
        let printed = run(&["create"], Output::Json);
        assert_eq!(
            printed,
            format::pretty_json(&created) + "\n",
            "as the API wrote it"
        );
        let table = run(&["list"], Output::Table);
        assert!(
            table.starts_with("ACCESS KEY") && table.contains("AKNEW"),
            "{table}"
        );
        run(&["show", "AK/1"], Output::Table);
        run(&["disable", "AKNEW"], Output::Table);
        run(&["enable", "AKNEW"], Output::Table);
        let table = run(&["set-limit", "AKNEW", "0"], Output::Table);
        assert!(table.contains("State:       enabled"), "{table}");
        run(&["delete", "AKNEW"], Output::Table);

        let requests = server.requests();
        let seen: Vec<(&str, Option<Value>)> = requests
            .iter()
            .map(|r| {
                assert_eq!(r.header("authorization"), Some("Bearer admin-token"));
                (r.line.as_str(), serde_json::from_str(&r.body).ok())
            })
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "POST /v1/access-keys",
                    Some(json!({"role": "admin", "concurrency_limit": 4, "name": "ci"}))
                ),
                ("POST /v1/access-keys", Some(json!({"role": "user"}))),
                ("GET /v1/access-keys", None),
                ("GET /v1/access-keys/AK%2F1", None),
                (
                    "PATCH /v1/access-keys/AKNEW",
                    Some(json!({"enabled": false}))
                ),
                (
                    "PATCH /v1/access-keys/AKNEW",
                    Some(json!({"enabled": true}))
                ),
                (
                    "PATCH /v1/access-keys/AKNEW",
                    Some(json!({"concurrency_limit": 0}))
                ),
                ("DELETE /v1/access-keys/AKNEW", None),
            ]
        );
        for r in &requests[..2] {
            assert_eq!(r.header("content-type"), Some("application/json"));
        }
        assert!(parse(&["access-key", "set-limit", "AK", "-1"]).is_err());
        assert!(parse(&["access-key", "create", "--concurrency-limit", "x"]).is_err());
    }

    #[test]
    fn vfolder_commands_send_their_requests() {
        let folder = r#"{"name": "data", "owner": "AKUSER", "created_at": 1700000000.0}"#;
        let server = Server::start(vec![
            Answer::json(201, folder),
            Answer::json(200, format!(r#"{{"vfolders": [{folder}]}}"#)),
            Answer::json(200, r#"{"vfolders": []}"#),
            Answer::json(200, folder),
            Answer::bytes(204, "application/json", Vec::new()),
            Answer::bytes(204, "application/json", Vec::new()),
        ]);
        let client = Client::new(&server.url).unwrap();
        let run = |args: &[&str], out: Output| {
            let command = match parse(&[&["vfolder"][..], args].concat()).unwrap().command {
                CtlCommand::Vfolder(c) => c,
                other => panic!("{other:?}"),
            };
            let mut stdout = Vec::new();
            assert_eq!(
                vfolders::run(&client, &command, out, &mut stdout).unwrap(),
                0
            );
            text(stdout)
        };
        assert_eq!(
            run(&["create", "data"], Output::Table),
            "Vfolder: data\nOwner:   AKUSER\nCreated: 2023-11-14T22:13:20Z\n"
        );
        assert_eq!(
            run(&["list"], Output::Table),
            "NAME  OWNER   CREATED\ndata  AKUSER  2023-11-14T22:13:20Z\n"
        );
        assert_eq!(
            run(&["list", "--all"], Output::Table),
            "NAME  OWNER  CREATED\n"
        );
        assert_eq!(
            run(&["delete", "data"], Output::Table),
            "vfolder data deleted\n"
        );
        // An answer without a body: the table names the folder, JSON prints nothing.
        assert_eq!(
            run(&["delete", "my data"], Output::Table),
            "vfolder my data deleted\n"
        );
        assert_eq!(run(&["delete", "x"], Output::Json), "");
        let requests = server.requests();
        assert_eq!(requests[0].line, "POST /v1/vfolders");
        assert_eq!(
            serde_json::from_str::<Value>(&requests[0].body).unwrap(),
            json!({"name": "data"})
        );
        assert_eq!(requests[1].line, "GET /v1/vfolders");
        assert_eq!(requests[2].line, "GET /v1/vfolders?all=true");
        assert_eq!(requests[3].line, "DELETE /v1/vfolders/data");
        assert_eq!(requests[4].line, "DELETE /v1/vfolders/my%20data");
        assert!(
            requests.iter().all(|r| r.header("authorization").is_none()),
            "no token, no Authorization header"
        );
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
                keys::run(client, &key_command(&["list"]), out, &mut Vec::new())
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

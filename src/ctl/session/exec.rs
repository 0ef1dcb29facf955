//! `session exec`: run code in a session through the execute continuation protocol
//! (`POST /v1/sessions/{id}/execute`), printing each answer as it comes, and forwarding ctl's
//! stdin (when it is not a terminal, or with `-i`) through the protocol's `input` mode; with
//! `-t`, a terminal instead ([`super::terminal`]).
//!
//! Where Backend.AI's kernel runner serves the session (`exec_path` `kernel-runner`), the code
//! runs in its persistent REPL: input goes a line per `input()` (`waiting-input`), and Ctrl+C
//! interrupts the run (`POST /v1/sessions/{id}/interrupt`) instead of leaving it ([`CtrlC`]);
//! `--shell` runs a shell command line in a process of its own there too.

use std::io::{self, BufRead, IsTerminal, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use clap::Args;
use serde_json::Value;

use super::stdin::{Input, StdinChunks};
use crate::ctl::client::{execute_path, read};
use crate::ctl::{format, parse, Client, ClientError, Failure, Output, EXIT_TIMEOUT};
use crate::model::exec::{ExecuteAnswer, ExecuteCall};
use crate::model::session::ExecPath;

/// Extra time each execute call waits beyond `flush_timeout`: the agent answers within
/// `flush_timeout`, or earlier when its output buffer fills.
const EXEC_HTTP_GRACE: Duration = Duration::from_secs(60);

/// Arguments of `kernelvisor ctl session exec`.
#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Session id (UUID).
    pub id: String,
    /// The code to run (for the test image: a shell command line). With -t: a shell command
    /// line, by default the image's shell (bash when it has one, else sh).
    #[arg(required_unless_present = "tty")]
    pub code: Option<String>,
    /// Forward stdin to the code (the default when stdin is not a terminal).
    #[arg(short = 'i', long)]
    pub interactive: bool,
    /// Run it in a terminal (stdin must be one): raw keys, window size, Ctrl+C to the remote
    /// process; exits with its exit code.
    #[arg(short = 't', long)]
    pub tty: bool,
    /// Run CODE as a shell command line (`sh -c`) in a process of its own, also where
    /// Backend.AI's kernel runner serves the session (whose runs otherwise go to its REPL).
    #[arg(long, conflicts_with = "tty")]
    pub shell: bool,
    /// Kill the execution after this many seconds (default: the manager's).
    #[arg(long, value_name = "SECS", allow_hyphen_values = true, value_parser = parse::whole_seconds)]
    pub timeout: Option<u64>,
    /// Print what came so far after at most this many seconds of waiting.
    #[arg(long, value_name = "SECS", default_value_t = 0.5, value_parser = parse::seconds)]
    pub flush_timeout: f64,
    /// Run it in this kernel of a cluster session: its host name (main1, sub1, …; `session
    /// show` lists them) or kernel id [default: the main kernel].
    #[arg(long, value_name = "KERNEL")]
    pub kernel: Option<String>,
}

/// The options of one `session exec`: its request bodies and HTTP timeout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ExecOptions {
    /// `timeout` of the query: the run is killed after this many seconds.
    pub timeout: Option<u64>,
    /// `flush_timeout` of every call: the agent answers after at most this long.
    pub flush_timeout: f64,
    /// `shell` of the query: `sh -c` in a process of its own, not a kernel runner's REPL.
    pub shell: bool,
}

/// `flush_timeout` of an `input` call: the agent answers it (with the output so far) this long
/// after the write, so input streams at one chunk per round trip.
const INPUT_FLUSH: f64 = 0.01;
/// `flush_timeout` of the `continue` calls made while stdin is open but has nothing to send: a
/// chunk of input waits at most this long for the call before it.
const POLL_FLUSH: f64 = 0.1;

impl ExecOptions {
    /// The call that starts the run: `{"mode": "query", "code", "flush_timeout", "timeout"?}`.
    pub fn query_body(&self, code: &str) -> ExecuteCall {
        ExecuteCall::Query {
            code: code.to_owned(),
            flush_timeout: self.flush_timeout,
            timeout: self.timeout,
            stdin: false,
            shell: self.shell,
        }
    }

    /// The call that starts a run whose stdin ctl forwards: as [`ExecOptions::query_body`] with
    /// `"stdin": true` and the short flush of forwarding.
    pub fn query_stdin_body(&self, code: &str) -> ExecuteCall {
        ExecuteCall::Query {
            code: code.to_owned(),
            flush_timeout: self.flush_timeout.min(POLL_FLUSH),
            timeout: self.timeout,
            stdin: true,
            shell: self.shell,
        }
    }

    /// The call that writes `text` to the run's stdin (closing it after when `eof`):
    /// `{"mode": "input", "run_id", "code", "eof", "flush_timeout"}`.
    pub fn input_body(&self, run_id: &str, text: &str, eof: bool) -> ExecuteCall {
        ExecuteCall::Input {
            run_id: run_id.to_owned(),
            code: text.to_owned(),
            eof,
            flush_timeout: self.flush_timeout.min(INPUT_FLUSH),
        }
    }

    /// The call that fetches the run's next answer: `{"mode": "continue", "run_id",
    /// "flush_timeout"}`.
    pub fn continue_body(&self, run_id: &str) -> ExecuteCall {
        self.poll_body(run_id, self.flush_timeout)
    }

    /// A `continue` call that waits at most `flush_timeout`.
    fn poll_body(&self, run_id: &str, flush_timeout: f64) -> ExecuteCall {
        ExecuteCall::Continue {
            run_id: run_id.to_owned(),
            flush_timeout,
        }
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
    if args.tty {
        return super::terminal::run(
            client,
            &args.id,
            args.kernel.as_deref(),
            args.code.as_deref(),
        );
    }
    let options = ExecOptions {
        timeout: args.timeout,
        flush_timeout: args.flush_timeout,
        shell: args.shell,
    };
    let stdin = io::stdin();
    let forward = args.interactive || !stdin.is_terminal();
    // Whether a kernel runner serves the run: not with --shell; asked of the manager at once
    // when stdin is forwarded (a runner takes it a line per `input()`), else when a Ctrl+C
    // first needs to know.
    let runner = Arc::new(OnceLock::new());
    if args.shell {
        let _ = runner.set(false);
    } else if forward {
        let _ = runner.set(serves_runner(client, &args.id));
    }
    let lines = runner.get() == Some(&true);
    let input = forward.then(|| StdinChunks::spawn(stdin));
    let ctrl_c = CtrlC::install(client.clone(), &args.id, args.kernel.clone(), runner)?;
    let (mut stdout, mut stderr) = (io::stdout().lock(), io::stderr().lock());
    let end = exec(
        client,
        &args.id,
        args.kernel.as_deref(),
        args.code.as_deref().unwrap_or_default(),
        &options,
        Feed {
            input,
            lines,
            presses: &ctrl_c.presses,
        },
        out,
        &mut stdout,
        &mut stderr,
    );
    drop(ctrl_c);
    let end = end?;
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

/// Exit status of `session exec` when Ctrl+C made ctl leave the run (128 + SIGINT, as a shell
/// reports a process SIGINT ended).
pub const EXIT_INTERRUPTED: i32 = 130;

/// Whether Backend.AI's kernel runner serves session `id` (its `exec_path`, from `GET
/// /v1/sessions/{id}`); `false` when the manager does not say (or cannot be asked).
fn serves_runner(client: &Client, id: &str) -> bool {
    client
        .session(id)
        .ok()
        .and_then(|a| a.lenient().exec_path)
        .flatten()
        == Some(ExecPath::KernelRunner.as_str().to_owned())
}

/// Ctrl+C (SIGINT) during `session exec`, taken on a thread of its own so that it acts while
/// the main thread waits for an answer. The first one, where a kernel runner serves the
/// session, interrupts the run (`POST /v1/sessions/{id}/interrupt`): it ends with
/// `KeyboardInterrupt`, whose answer ctl prints as any other before exiting with the run's exit
/// code; the REPL keeps its state. Otherwise (a run in a process of its own, which the API
/// cannot interrupt: it goes on until it ends, its timeout, or the agent's `exec-idle-timeout`
/// with nobody reading; a second Ctrl+C; an interrupt the manager refused) ctl leaves the run at
/// once, saying so, with exit status [`EXIT_INTERRUPTED`].
struct CtrlC {
    /// Ctrl+C presses so far (the main thread stops waiting for a line on a change).
    presses: Arc<AtomicUsize>,
    handle: signal_hook::iterator::Handle,
    thread: Option<JoinHandle<()>>,
}

impl CtrlC {
    /// Takes SIGINT until dropped; `runner` says (or will say, asked of the manager on the
    /// first Ctrl+C) whether a kernel runner serves session `id`; an interrupt goes to its
    /// kernel `kernel` (`None`: the main kernel), where the run is.
    fn install(
        client: Client,
        id: &str,
        kernel: Option<String>,
        runner: Arc<OnceLock<bool>>,
    ) -> io::Result<CtrlC> {
        let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT])?;
        let handle = signals.handle();
        let presses = Arc::new(AtomicUsize::new(0));
        let (count, id) = (presses.clone(), id.to_owned());
        let thread = std::thread::spawn(move || {
            for _ in signals.forever() {
                let first = count.fetch_add(1, Ordering::SeqCst) == 0;
                let runner = *runner.get_or_init(|| serves_runner(&client, &id));
                let why = match (first, runner) {
                    (true, true) => match client.interrupt(&id, kernel.as_deref()) {
                        Ok(()) => continue,
                        Err(e) => format!("the run could not be interrupted ({e})"),
                    },
                    (false, true) => "interrupted again".to_owned(),
                    (_, false) => "a run in a process of its own cannot be interrupted".to_owned(),
                };
                // Not through `io::stderr()`, whose lock the main thread holds while it prints
                // the run's answers.
                raw_stderr(&format!(
                    "\nctl: {why}; leaving the run, which may go on in the session\n"
                ));
                std::process::exit(EXIT_INTERRUPTED);
            }
        });
        Ok(CtrlC {
            presses,
            handle,
            thread: Some(thread),
        })
    }
}

/// Writes `text` to file descriptor 2 directly (as much as it takes).
fn raw_stderr(text: &str) {
    let mut rest = text.as_bytes();
    while !rest.is_empty() {
        // SAFETY: `rest` is valid for reads of `rest.len()` bytes for the call's duration.
        let n = unsafe { libc::write(libc::STDERR_FILENO, rest.as_ptr().cast(), rest.len()) };
        match n {
            n if n > 0 => rest = &rest[n as usize..],
            _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
            _ => return,
        }
    }
}

impl Drop for CtrlC {
    fn drop(&mut self) {
        self.handle.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// What [`exec`] feeds the run.
pub(super) struct Feed<'a> {
    /// ctl's stdin, when it is forwarded.
    pub input: Option<StdinChunks>,
    /// A kernel runner's REPL takes it: a line per `waiting-input` answer, nothing otherwise.
    pub lines: bool,
    /// Ctrl+C presses so far ([`CtrlC`]): a change stops a wait for a line.
    pub presses: &'a AtomicUsize,
}

/// A line for a kernel runner's `input()`.
#[derive(Debug, PartialEq, Eq)]
enum Line {
    /// The line, without its line break.
    Text(String),
    /// ctl's stdin has ended.
    Eof,
    /// Ctrl+C came meanwhile.
    Interrupted,
}

impl Line {
    /// The text sent for it: the line; for the end of input Ctrl+D (`\x04`, which ipykernel's
    /// `input()` raises as `EOFError`); after an interrupt an empty line, which lets the
    /// runner's prompt go (the interrupted kernel no longer waits for it).
    fn text(self) -> String {
        match self {
            Line::Text(t) => t,
            Line::Eof => "\u{4}".to_owned(),
            Line::Interrupted => String::new(),
        }
    }
}

/// The next line of the forwarded input (`pending` holds what was read past the last line),
/// waiting for it; [`Line::Interrupted`] once `presses` is no longer `seen`.
fn next_line(
    input: &mut StdinChunks,
    pending: &mut String,
    ended: &mut bool,
    presses: &AtomicUsize,
    seen: usize,
) -> Line {
    loop {
        if let Some(i) = pending.find('\n') {
            let line: String = pending.drain(..=i).collect();
            return Line::Text(line.trim_end_matches(['\n', '\r']).to_owned());
        }
        if *ended {
            return match pending.is_empty() {
                true => Line::Eof,
                false => Line::Text(std::mem::take(pending)),
            };
        }
        if presses.load(Ordering::SeqCst) != seen {
            return Line::Interrupted;
        }
        match input.next() {
            Input::Text(t) => pending.push_str(&t),
            Input::End(_) => *ended = true,
            Input::Pending => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A line typed on ctl's stdin (a terminal), waiting for it in steps of 100 ms so that a
/// Ctrl+C (`presses` no longer `seen`) ends the wait.
fn terminal_line(presses: &AtomicUsize, seen: usize) -> io::Result<Line> {
    loop {
        if presses.load(Ordering::SeqCst) != seen {
            return Ok(Line::Interrupted);
        }
        let mut fd = libc::pollfd {
            fd: libc::STDIN_FILENO,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: `fd` is one valid pollfd struct for the call's duration.
        match unsafe { libc::poll(&mut fd, 1, 100) } {
            0 => continue,
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            _ => {}
        }
        let mut line = String::new();
        return Ok(match io::stdin().lock().read_line(&mut line)? {
            0 => Line::Eof,
            _ => Line::Text(line.trim_end_matches(['\n', '\r']).to_owned()),
        });
    }
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
        let answer: ExecuteAnswer = crate::ctl::client::lenient(v);
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

/// Runs `code` in session `id` (in its kernel `kernel`, else the main one) through the execute
/// continuation protocol: a `query`, then a
/// `continue` for as long as the answer is `continued`. Each answer is written as it arrives and
/// then dropped: table mode writes the console as-is (stdout pieces to `stdout`, stderr pieces to
/// `stderr`), JSON mode the answer as one compact line on `stdout`; both are flushed after each
/// answer. Answers how the run ended (the last answer's [`ExecEnd`]); printing a message about it
/// is left to the caller.
///
/// With `feed.input`, the run's stdin is kept open and fed: each chunk ready is sent with an
/// `input` call instead of a `continue` (whose answer carries the output as well), the end with
/// `eof`. One call at a time, so answers are printed in the order the run wrote them. The run
/// may close its stdin early (`head -1`): the `invalid-request` of the next `input` ends the
/// forwarding, not the run. With `feed.lines` (a kernel runner's REPL) the input goes instead a
/// line per `waiting-input` answer (see [`Line`]), the same as a line typed on a terminal.
#[allow(clippy::too_many_arguments)]
fn exec(
    client: &Client,
    id: &str,
    kernel: Option<&str>,
    code: &str,
    options: &ExecOptions,
    feed: Feed<'_>,
    out: Output,
    stdout: &mut impl Write,
    stderr: &mut impl Write,
) -> Result<ExecEnd, Failure> {
    let Feed {
        mut input,
        lines,
        presses,
    } = feed;
    let (mut pending, mut ended) = (String::new(), false);
    let mut body = match input {
        Some(_) if !lines => options.query_stdin_body(code),
        _ => options.query_body(code),
    };
    loop {
        let feeding = matches!(body, ExecuteCall::Input { .. });
        let reply = match client.execute(id, kernel, &body, options.http_timeout()) {
            Err(ClientError::Api(e)) if feeding && e.code == "invalid-request" => {
                // Its stdin is closed (the process closed it, or ended): the rest of the
                // input has no reader; the run's output still comes.
                input = None;
                body = options.continue_body(body.run_id().unwrap_or_default());
                continue;
            }
            r => r?,
        };
        match out {
            Output::Json => writeln!(stdout, "{}", format::compact_json(&reply.text))?,
            Output::Table => {
                for (stream, text) in console(&reply.json) {
                    match stream {
                        Stream::Stdout => stdout.write_all(text.as_bytes())?,
                        Stream::Stderr => stderr.write_all(text.as_bytes())?,
                    }
                }
            }
        }
        stdout.flush()?;
        stderr.flush()?;
        let answer: ExecuteAnswer = reply.lenient();
        // A kernel runner's REPL waits for a line (`input()`), or a batch run moves on to its
        // next step: both go on; anything else but `continued` ends the run.
        let waits = answer.status == "waiting-input";
        if !matches!(
            answer.status.as_str(),
            "continued" | "waiting-input" | "clean-finished" | "build-finished"
        ) {
            return Ok(ExecEnd::of(&reply.json));
        }
        let run_id = answer.run_id.as_str();
        if run_id.is_empty() {
            let detail = "a \"continued\" answer without a runId".to_owned();
            return Err(ClientError::InvalidResponse {
                url: client.url(&execute_path(id)),
                detail,
            }
            .into());
        }
        if waits && (lines || input.is_none()) {
            // The prompt was printed with the answer's stdout; the line comes from ctl's stdin.
            let seen = presses.load(Ordering::SeqCst);
            let line = match input.as_mut() {
                Some(chunks) => next_line(chunks, &mut pending, &mut ended, presses, seen),
                None => terminal_line(presses, seen)?,
            };
            body = options.input_body(run_id, &line.text(), false);
            continue;
        }
        if lines {
            // A runner's REPL reads no input but at its prompt.
            body = options.continue_body(run_id);
            continue;
        }
        body = match input.as_mut().map(StdinChunks::next) {
            Some(Input::Text(text)) => options.input_body(run_id, &text, false),
            Some(Input::End(error)) => {
                if let Some(e) = error {
                    writeln!(
                        stderr,
                        "warning: reading stdin failed: {e}; closing the run's stdin"
                    )?;
                }
                input = None;
                options.input_body(run_id, "", true)
            }
            // Nothing to send yet: ask for output, briefly, so input is not held up.
            Some(Input::Pending) => {
                options.poll_body(run_id, options.flush_timeout.min(POLL_FLUSH))
            }
            None => options.continue_body(run_id),
        };
    }
}

/// Which stream a piece of console output belongs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// ctl's stdout (`stdout`, and kinds ctl shows as text: `media`, `html`, …).
    Stdout,
    /// ctl's stderr.
    Stderr,
}

/// The `console` of an execute answer (`[["stdout", text], ["stderr", text], …]`) as pieces in
/// order. Kinds other than stdout/stderr (`media`, `html`, …) go to stdout as `[kind] value`.
/// An answer that does not read is one stderr piece saying so.
pub fn console(v: &Value) -> Vec<(Stream, String)> {
    let answer: ExecuteAnswer = match read(v) {
        Ok(a) => a,
        Err(e) => return vec![(Stream::Stderr, e)],
    };
    answer
        .console
        .into_iter()
        .map(|(kind, data)| {
            let data_text = data
                .as_str()
                .map_or_else(|| data.to_string(), str::to_owned);
            match kind.as_str() {
                "stdout" => (Stream::Stdout, data_text),
                "stderr" => (Stream::Stderr, data_text),
                other => (Stream::Stdout, format!("[{other}] {data_text}\n")),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::testserver::{Answer, Server};
    use serde_json::json;

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

    /// A call as the JSON sent.
    fn json_of(call: &ExecuteCall) -> Value {
        serde_json::to_value(call).unwrap()
    }

    #[test]
    fn exec_bodies() {
        let o = ExecOptions {
            timeout: Some(600),
            flush_timeout: 0.5,
            shell: false,
        };
        assert_eq!(
            json_of(&o.query_body("ls")),
            json!({"mode": "query", "code": "ls", "flush_timeout": 0.5, "timeout": 600})
        );
        assert_eq!(
            json_of(&o.continue_body("r1")),
            json!({"mode": "continue", "run_id": "r1", "flush_timeout": 0.5})
        );
        assert_eq!(o.http_timeout(), Duration::from_millis(60_500));
        let o = ExecOptions {
            timeout: None,
            flush_timeout: 2.0,
            shell: false,
        };
        assert_eq!(
            json_of(&o.query_body("ls")),
            json!({"mode": "query", "code": "ls", "flush_timeout": 2.0})
        );
    }

    #[test]
    fn stdin_bodies() {
        let o = ExecOptions {
            timeout: None,
            flush_timeout: 2.0,
            shell: false,
        };
        assert_eq!(
            json_of(&o.query_stdin_body("cat")),
            json!({"mode": "query", "code": "cat", "flush_timeout": 0.1, "stdin": true})
        );
        assert_eq!(
            json_of(&o.input_body("r1", "x\n", false)),
            json!({"mode": "input", "run_id": "r1", "code": "x\n", "eof": false, "flush_timeout": 0.01})
        );
        assert_eq!(json_of(&o.input_body("r1", "", true))["eof"], json!(true));
    }

    /// stdin goes out in `input` calls; a closed stdin (`invalid-request`) ends the forwarding,
    /// not the run, whose output is read on.
    #[test]
    fn stdin_is_forwarded_until_the_run_closes_it() {
        let server = Server::start(vec![
            answer("continued", "r1", json!([]), Value::Null),
            Answer::json(
                400,
                r#"{"error": {"code": "invalid-request", "message": "stdin was closed"}}"#,
            ),
            answer("finished", "r1", json!([["stdout", "out\n"]]), json!(0)),
        ]);
        let client = Client::new(&server.url).unwrap();
        let options = ExecOptions {
            timeout: None,
            flush_timeout: 0.5,
            shell: false,
        };
        let input = StdinChunks::spawn(std::io::Cursor::new(b"abc".to_vec()));
        // The reader holds its one chunk in the channel by then (and waits to tell the end).
        std::thread::sleep(Duration::from_millis(200));
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let end = exec(
            &client,
            "S",
            None,
            "head -c 1",
            &options,
            Feed {
                input: Some(input),
                lines: false,
                presses: &AtomicUsize::new(0),
            },
            Output::Table,
            &mut stdout,
            &mut stderr,
        );
        assert_eq!(end.unwrap(), ExecEnd::Exited(0));
        assert_eq!(String::from_utf8(stdout).unwrap(), "out\n");
        let bodies: Vec<Value> = server
            .requests()
            .iter()
            .map(|r| serde_json::from_str(&r.body).unwrap())
            .collect();
        assert_eq!(
            bodies,
            [
                json!({"mode": "query", "code": "head -c 1", "flush_timeout": 0.1, "stdin": true}),
                json!({"mode": "input", "run_id": "r1", "code": "abc", "eof": false, "flush_timeout": 0.01}),
                json!({"mode": "continue", "run_id": "r1", "flush_timeout": 0.5}),
            ]
        );
    }

    /// `--kernel` goes into every call's body as `kernel` (the run lives in that kernel), and
    /// a 404 for a kernel the session lacks is the API's error as it is.
    #[test]
    fn exec_in_a_kernel() {
        let server = Server::start(vec![
            answer("continued", "r1", json!([["stdout", "sub"]]), Value::Null),
            answer("finished", "r1", json!([["stdout", "1\n"]]), json!(0)),
            Answer::json(
                404,
                r#"{"error": {"code": "session-not-found", "message": "session `S` has no kernel `sub9` (its kernels: main1, sub1)"}}"#,
            ),
        ]);
        let client = Client::new(&server.url).unwrap();
        let options = ExecOptions {
            timeout: None,
            flush_timeout: 0.5,
            shell: false,
        };
        let run = |kernel: Option<&str>| {
            let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
            let no_input = Feed {
                input: None,
                lines: false,
                presses: &AtomicUsize::new(0),
            };
            exec(
                &client,
                "S",
                kernel,
                "hostname",
                &options,
                no_input,
                Output::Table,
                &mut stdout,
                &mut stderr,
            )
            .map(|end| (end, String::from_utf8(stdout).unwrap()))
        };
        let (end, printed) = run(Some("sub1")).unwrap();
        assert_eq!((end, printed.as_str()), (ExecEnd::Exited(0), "sub1\n"));
        match run(Some("sub9")) {
            Err(Failure::Client(ClientError::Api(e))) => {
                assert_eq!((e.status, e.code.as_str()), (404, "session-not-found"));
                assert!(e.message.contains("no kernel `sub9`"), "{}", e.message);
            }
            other => panic!("{other:?}"),
        }
        let bodies: Vec<Value> = server
            .requests()
            .iter()
            .map(|r| serde_json::from_str(&r.body).unwrap())
            .collect();
        assert_eq!(
            bodies,
            [
                json!({"mode": "query", "code": "hostname", "flush_timeout": 0.5, "kernel": "sub1"}),
                json!({"mode": "continue", "run_id": "r1", "flush_timeout": 0.5, "kernel": "sub1"}),
                json!({"mode": "query", "code": "hostname", "flush_timeout": 0.5, "kernel": "sub9"}),
            ]
        );
    }

    /// `--shell` goes into the query (and only when given).
    #[test]
    fn shell_bodies() {
        let o = ExecOptions {
            timeout: None,
            flush_timeout: 0.5,
            shell: true,
        };
        assert_eq!(
            json_of(&o.query_body("id -u")),
            json!({"mode": "query", "code": "id -u", "flush_timeout": 0.5, "shell": true})
        );
        assert_eq!(json_of(&o.query_stdin_body("cat"))["shell"], json!(true));
    }

    /// Lines of the forwarded input, one at a time without their line break; the end; a
    /// Ctrl+C while waiting.
    #[test]
    fn lines_of_the_input() {
        let mut input = StdinChunks::spawn(std::io::Cursor::new(b"one\r\ntwo\nthree".to_vec()));
        let (mut pending, mut ended, presses) = (String::new(), false, AtomicUsize::new(0));
        let mut next = || next_line(&mut input, &mut pending, &mut ended, &presses, 0);
        assert_eq!(next(), Line::Text("one".into()));
        assert_eq!(next(), Line::Text("two".into()));
        assert_eq!(next(), Line::Text("three".into()));
        assert_eq!(next(), Line::Eof);
        assert_eq!(Line::Eof.text(), "\u{4}");

        // A pipe nothing is written to: only a Ctrl+C ends the wait.
        let (_keep, reader) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut input = StdinChunks::spawn(reader);
        let (mut pending, mut ended) = (String::new(), false);
        let presses = AtomicUsize::new(1);
        assert_eq!(
            next_line(&mut input, &mut pending, &mut ended, &presses, 0),
            Line::Interrupted
        );
        assert_eq!(Line::Interrupted.text(), "");
    }

    /// A kernel runner's run with forwarded stdin: no `stdin` on the query, plain `continue`s
    /// while it runs, a line (no line break) for each `waiting-input`.
    #[test]
    fn a_runners_prompt_takes_a_line() {
        let waiting = |prompt: &str| {
            Answer::json(
                200,
                json!({"runId": "r1", "status": "waiting-input", "console": [["stdout", prompt]],
                       "exitCode": null, "options": {"is_password": false}})
                .to_string(),
            )
        };
        let server = Server::start(vec![
            answer("continued", "r1", json!([]), Value::Null),
            waiting("a? "),
            waiting("b? "),
            answer("finished", "r1", json!([["stdout", "ab\n"]]), json!(0)),
        ]);
        let client = Client::new(&server.url).unwrap();
        let options = ExecOptions {
            timeout: None,
            flush_timeout: 0.5,
            shell: false,
        };
        let input = StdinChunks::spawn(std::io::Cursor::new(b"a\nb\n".to_vec()));
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let end = exec(
            &client,
            "S",
            None,
            "print(input('a? ') + input('b? '))",
            &options,
            Feed {
                input: Some(input),
                lines: true,
                presses: &AtomicUsize::new(0),
            },
            Output::Table,
            &mut stdout,
            &mut stderr,
        );
        assert_eq!(end.unwrap(), ExecEnd::Exited(0));
        assert_eq!(String::from_utf8(stdout).unwrap(), "a? b? ab\n");
        let bodies: Vec<Value> = server
            .requests()
            .iter()
            .map(|r| serde_json::from_str(&r.body).unwrap())
            .collect();
        assert_eq!(
            bodies,
            [
                json!({"mode": "query", "code": "print(input('a? ') + input('b? '))", "flush_timeout": 0.5}),
                json!({"mode": "continue", "run_id": "r1", "flush_timeout": 0.5}),
                json!({"mode": "input", "run_id": "r1", "code": "a", "eof": false, "flush_timeout": 0.01}),
                json!({"mode": "input", "run_id": "r1", "code": "b", "eof": false, "flush_timeout": 0.01}),
            ]
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
            shell: false,
        };
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        let end = exec(
            &client,
            "S",
            None,
            "work",
            &options,
            Feed {
                input: None,
                lines: false,
                presses: &AtomicUsize::new(0),
            },
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
    fn console_pieces_in_order() {
        let v = json!({"exitCode": 1, "status": "finished",
            "console": [["stdout", "hi\n"], ["stderr", "oops\n"], ["media", ["image/png", "..."]], ["stdout", "bye"]]});
        assert_eq!(
            console(&v),
            [
                (Stream::Stdout, "hi\n".to_owned()),
                (Stream::Stderr, "oops\n".to_owned()),
                (
                    Stream::Stdout,
                    "[media] [\"image/png\",\"...\"]\n".to_owned()
                ),
                (Stream::Stdout, "bye".to_owned()),
            ]
        );
        assert!(console(&json!({"exitCode": 0})).is_empty());
    }
}

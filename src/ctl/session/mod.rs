//! `sessions` and `session …`: one module per subcommand, or per tight family of them
//! (`services`, `service-start` and `service-stop`), each with its clap arguments, the function
//! that runs it and its tests.

mod commit;
mod cp;
mod create;
mod exec;
mod files;
mod logs;
mod ls;
mod rm;
mod services;
mod show;
mod stdin;
mod terminal;
mod wait;

use std::io;

use clap::Subcommand;

use super::{Client, Failure, Output};

pub use commit::CommitArgs;
pub use cp::CpArgs;
pub use create::{CreateArgs, RestartMode, SessionType};
pub use exec::{ExecArgs, ExecEnd, ExecOptions};
pub use logs::LogsArgs;
pub use ls::LsArgs;
pub use rm::RmArgs;
pub use services::{ServiceArgs, ServicesArgs};
pub use show::{SessionsArgs, ShowArgs};
pub use wait::{wait_exit_code, WaitArgs};

pub(super) use show::list;

/// `kernelvisor ctl session …`.
#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Start a session on the least-loaded agent that fits it (POST /v1/sessions).
    Create(Box<CreateArgs>),
    /// Show one session (GET /v1/sessions/{id}); with --watch, then a line per change of it
    /// until it is TERMINATED (GET /v1/events).
    Show(ShowArgs),
    /// Run code in a session, printing its output as it comes (POST /v1/sessions/{id}/execute),
    /// or a terminal in it with -t (GET /v1/sessions/{id}/pty).
    ///
    /// Exits with the code's exit code, or 124 on timeout. Stdout and stderr of the code go to
    /// ctl's stdout and stderr; with -o json each answer of the API is printed as one JSON line.
    /// When ctl's stdin is not a terminal (or with -i) it is the code's stdin, sent in chunks as
    /// it is read (text: bytes that are not UTF-8 become U+FFFD).
    ///
    /// Where Backend.AI's kernel runner serves the session (`session show`: Exec path
    /// kernel-runner) the code runs in its persistent REPL: each input() takes a line of ctl's
    /// stdin, and Ctrl+C interrupts the run (KeyboardInterrupt; the REPL keeps its state; a
    /// second Ctrl+C leaves it, exit 130); --shell runs a shell command line instead. Elsewhere
    /// Ctrl+C leaves the run (exit 130).
    ///
    /// `-it ID [CMD]`: CMD (default: the image's shell) in a terminal of the window's size;
    /// keys go as typed (Ctrl+C interrupts the remote process), window changes follow, and ctl
    /// exits with the process's exit code.
    Exec(ExecArgs),
    /// Wait until a session is TERMINATED, then show it (polls GET /v1/sessions/{id}).
    ///
    /// Exits with the session's exit code (a batch job's; 1 when outside 0-255), or without one 0
    /// when its result is SUCCESS, else 1; 124 when --timeout passes first.
    Wait(WaitArgs),
    /// Print a session's kernel logs (GET /v1/sessions/{id}/logs).
    ///
    /// Stdout and stderr of the kernel merged, as `docker logs` shows them: the last part the
    /// agent keeps (also for a while after the kernel ended), and with --follow everything after
    /// it as it comes, until the kernel ends.
    Logs(LogsArgs),
    /// List a session's services, their ports and URLs (GET /v1/sessions/{id}/services).
    Services(ServicesArgs),
    /// Start a service of a session and print its URL (POST /v1/sessions/{id}/services/{name}).
    ///
    /// A service that runs already is no error: it is reported as already running. When the
    /// service fails to start, the end of its output is printed after the error.
    ServiceStart(ServiceArgs),
    /// Stop a service of a session (DELETE /v1/sessions/{id}/services/{name}).
    ServiceStop(ServiceArgs),
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
    Ls(LsArgs),
    /// Terminate a session (DELETE /v1/sessions/{id}).
    Rm(RmArgs),
    /// Save a session's container as an image, pushed to its registry with --push (POST
    /// /v1/sessions/{id}/commit).
    ///
    /// The image holds the container's files except those of its mounts: /home/work (the
    /// scratch directory) and the vfolders are not part of it. Without --wait it prints the commit's state as it
    /// starts (`committing`); `--wait` follows it to `done` or `failed` (exit 1), printing the
    /// pushed bytes on stderr.
    Commit(CommitArgs),
}

/// Runs one `session …` command; what it prints and how it exits are told by each subcommand.
pub(super) fn run(client: &Client, command: &SessionCommand, out: Output) -> Result<i32, Failure> {
    match command {
        SessionCommand::Create(args) => create::run(client, args, out),
        SessionCommand::Show(args) => show::show(client, args, out),
        SessionCommand::Exec(args) => exec::run(client, args, out),
        SessionCommand::Wait(args) => wait::run(client, args, out),
        SessionCommand::Logs(args) => logs::run(client, args),
        SessionCommand::Services(args) => {
            services::services(client, &args.id, out, &mut io::stdout().lock())
        }
        SessionCommand::ServiceStart(args) => {
            services::service_start(client, &args.id, &args.name, out, &mut io::stdout().lock())
        }
        SessionCommand::ServiceStop(args) => {
            services::service_stop(client, &args.id, &args.name, out, &mut io::stdout().lock())
        }
        SessionCommand::Cp(CpArgs { transfer, kernel }) => cp::cp(
            client,
            transfer,
            kernel.as_deref(),
            out,
            io::stdin().lock(),
            &mut io::stdout().lock(),
        ),
        SessionCommand::Ls(args) => ls::ls(
            client,
            &args.id,
            args.kernel.as_deref(),
            args.path.as_deref().unwrap_or(""),
            out,
            &mut io::stdout().lock(),
        ),
        SessionCommand::Rm(args) => rm::run(client, args, out),
        SessionCommand::Commit(args) => commit::run(client, args, out),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::test_util::parse;
    use crate::ctl::{CtlCommand, Transfer};

    #[test]
    fn exec_wait_logs_flags() {
        let a = parse(&["session", "exec", "S", "echo hi"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Exec(ExecArgs { timeout: None, flush_timeout, .. })) if flush_timeout == 0.5)
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
            matches!(a.command, CtlCommand::Session(SessionCommand::Exec(ExecArgs { timeout: Some(30), flush_timeout, .. })) if flush_timeout == 2.0)
        );
        assert!(parse(&["session", "exec", "S", "x", "--flush-timeout", "-1"]).is_err());

        let a = parse(&["session", "wait", "S"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Wait(WaitArgs { ref id, interval, timeout: None })) if id == "S" && interval == 0.5)
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
            matches!(a.command, CtlCommand::Session(SessionCommand::Wait(WaitArgs { interval, timeout: Some(t), .. })) if interval == 2.0 && t == 0.25)
        );
        assert!(
            parse(&["session", "wait", "S", "--interval", "0"]).is_err(),
            "no busy polling"
        );

        let a = parse(&["session", "logs", "S"]).unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Session(SessionCommand::Logs(LogsArgs { follow: false, .. }))
        ));
        for follow in ["-f", "--follow"] {
            let a = parse(&["session", "logs", follow, "S"]).unwrap();
            assert!(
                matches!(a.command, CtlCommand::Session(SessionCommand::Logs(LogsArgs { ref id, follow: true, kernel: None })) if id == "S")
            );
        }
    }

    /// `--kernel` of the commands that act in one kernel of a cluster session.
    #[test]
    fn kernel_flags() {
        let a = parse(&["session", "exec", "S", "hostname", "--kernel", "sub1"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Exec(ExecArgs { kernel: Some(ref k), .. })) if k == "sub1")
        );
        let a = parse(&["session", "exec", "-t", "--kernel", "sub2", "S"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Exec(ExecArgs { kernel: Some(ref k), tty: true, .. })) if k == "sub2")
        );
        let a = parse(&["session", "logs", "S", "--kernel", "sub1", "-f"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Logs(LogsArgs { kernel: Some(ref k), follow: true, .. })) if k == "sub1")
        );
        let a = parse(&["session", "ls", "--kernel", "main1", "S", "sub/"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Ls(LsArgs { kernel: Some(ref k), path: Some(ref p), .. })) if k == "main1" && p == "sub/")
        );
        let a = parse(&["session", "cp", "--kernel", "sub1", "S:a", "-"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Cp(CpArgs { kernel: Some(ref k), .. })) if k == "sub1")
        );
        let a = parse(&["session", "exec", "S", "x"]).unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Session(SessionCommand::Exec(ExecArgs { kernel: None, .. }))
        ));
    }

    #[test]
    fn exec_terminal_flags() {
        let a = parse(&["session", "exec", "-it", "S"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Exec(ExecArgs { ref id, code: None, interactive: true, tty: true, .. })) if id == "S")
        );
        let a = parse(&["session", "exec", "-t", "S", "top"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Exec(ExecArgs { code: Some(ref c), interactive: false, tty: true, .. })) if c == "top")
        );
        let a = parse(&["session", "exec", "-i", "S", "cat"]).unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Session(SessionCommand::Exec(ExecArgs {
                interactive: true,
                tty: false,
                ..
            }))
        ));
        assert!(
            parse(&["session", "exec", "S"]).is_err(),
            "code is required without -t"
        );
        let a = parse(&["session", "exec", "--shell", "S", "id -u"]).unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Session(SessionCommand::Exec(ExecArgs {
                shell: true,
                tty: false,
                ..
            }))
        ));
        assert!(
            parse(&["session", "exec", "--shell", "-t", "S"]).is_err(),
            "a terminal runs a shell anyway"
        );
    }

    #[test]
    fn services_cp_ls_parse() {
        let a = parse(&["session", "service-start", "S", "web"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::ServiceStart(ServiceArgs { ref id, ref name })) if id == "S" && name == "web")
        );
        let a = parse(&["session", "service-stop", "S", "web", "-o", "json"]).unwrap();
        assert!(matches!(
            a.command,
            CtlCommand::Session(SessionCommand::ServiceStop(_))
        ));
        assert!(parse(&["session", "services", "S"]).is_ok());

        let a = parse(&["session", "ls", "S"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Ls(LsArgs { ref id, path: None, kernel: None })) if id == "S")
        );
        let a = parse(&["session", "ls", "S", "/home/work/sub/"]).unwrap();
        assert!(
            matches!(a.command, CtlCommand::Session(SessionCommand::Ls(LsArgs { path: Some(ref p), .. })) if p == "sub/")
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
                transfer: Transfer::Download { .. },
                kernel: None,
            }))
        ));
    }
}

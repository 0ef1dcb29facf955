//! `session rm`: `DELETE /v1/sessions/{id}` (`--grace`, `--now`), then, for a session still
//! `TERMINATING` (its workload has its grace), a wait until it is `TERMINATED`.

use std::io::{self, Write};

use clap::Args;

use super::show;
use crate::ctl::format::timestamp;
use crate::ctl::{show as print, unix_now, Client, Failure, Output};
use crate::model::session::KernelStatus;

/// Arguments of `kernelvisor ctl session rm`.
#[derive(Debug, Args)]
pub struct RmArgs {
    /// Session id (UUID).
    pub id: String,
    /// Seconds its workload has to exit after its stop signal, instead of the session's own
    /// `grace_period` (at most the manager's `[scheduler] max-grace-period`).
    #[arg(long, value_name = "SECS", value_parser = crate::ctl::parse::seconds, conflicts_with = "now")]
    pub grace: Option<f64>,
    /// No grace: the workload is killed at once (`--grace 0`).
    #[arg(long)]
    pub now: bool,
    /// Answer at once with the session as the manager has it (`TERMINATING` while its
    /// workload has its grace) instead of waiting for it to be `TERMINATED`.
    #[arg(long)]
    pub no_wait: bool,
}

/// `session rm`: `DELETE /v1/sessions/{id}` (`--grace`, `--now`); a session still
/// `TERMINATING` when the manager answers (its workload has its grace) is waited for until it is
/// `TERMINATED` (unless `--no-wait`), its deadline told on stderr, then shown.
pub(super) fn run(client: &Client, args: &RmArgs, out: Output) -> Result<i32, Failure> {
    let grace = if args.now { Some(0.0) } else { args.grace };
    let answer = client.destroy_session_with(&args.id, grace)?;
    let s = answer.lenient();
    if s.status != KernelStatus::Terminating.as_str() || args.no_wait {
        return print(out, &answer, |v| show::session(v, unix_now()));
    }
    if let Some(deadline) = s.terminate_deadline {
        writeln!(
            io::stderr(),
            "session {} is TERMINATING: its workload has until {} ({}) to exit, then it is killed",
            args.id,
            timestamp(deadline),
            show::in_seconds(deadline - unix_now()),
        )?;
    }
    let interval = std::time::Duration::from_millis(500);
    let reply = match super::wait::wait_terminated(client, &args.id, interval, None)? {
        super::wait::Waited::Terminated(r) | super::wait::Waited::TimedOut(r) => r,
    };
    print(out, &reply, |v| show::session(v, unix_now()))
}

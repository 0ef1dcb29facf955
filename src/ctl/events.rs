//! `events [-f]`: the manager's event stream (`GET /v1/events`): session status changes with
//! their reasons, image pull progress, agent liveness (admin keys). Without `-f` the recent
//! events the manager keeps, then exit; with `-f` those, then each new one as it happens, as
//! `kubectl get -w` or `nomad event stream` do. One line per event: a table row, or with
//! `-o json` the event's JSON as the manager wrote it. [`open`] also serves `session show
//! --watch`.

use std::collections::BTreeMap;
use std::io::{self, BufReader, Write};

use clap::Args;

use super::client::{self, EVENTS_PATH};
use super::sse::Frames;
use super::{format, Client, ClientError, Failure, Output};
use crate::model::event::{Event, EventType};

/// Arguments of `kernelvisor ctl events`.
#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Keep printing new events as they happen (until interrupted).
    #[arg(long, short)]
    pub follow: bool,
    /// Only this session's events (session or kernel id).
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Only events about this agent's sessions and its liveness.
    #[arg(long, value_name = "ID")]
    pub agent: Option<String>,
    /// Only these types: session_status, pull_progress, agent_status (admin keys); repeat or
    /// separate with commas.
    #[arg(long = "type", value_name = "TYPE", value_delimiter = ',')]
    pub types: Vec<String>,
}

/// Column widths of the table's lines: time, type, session (or agent), status.
const WIDTHS: [usize; 4] = [20, 14, 36, 11];

/// `events`: prints the events, one line each, as they arrive.
///
/// Errors: the API's (400 for a bad filter, 403 for `agent_status` with a user key); with
/// `-f`, a stream the manager dropped because this reader fell behind (after printing its last
/// event) is an error too (events were missed, exit 1), and so is one the manager closed
/// (exit 3).
pub(super) fn run(client: &Client, args: &EventsArgs, out: Output) -> Result<i32, Failure> {
    let mut query: Vec<(&str, String)> = Vec::new();
    if let Some(s) = &args.session {
        query.push(("session_id", s.clone()));
    }
    if let Some(a) = &args.agent {
        query.push(("agent_id", a.clone()));
    }
    if !args.types.is_empty() {
        query.push(("type", args.types.join(",")));
    }
    if args.follow {
        query.push(("follow", "true".into()));
    }
    let stdout = &mut io::stdout().lock();
    let stream = open(client, &query)?;
    if out == Output::Table {
        writeln!(stdout, "{}", header())?;
    }
    stream.print(out, stdout, |_| false)?;
    if args.follow {
        // A followed stream has no end of its own: the manager went away (stopped, restarted).
        return Err(ClientError::Transport {
            what: "the event stream ended:",
            url: client.url(EVENTS_PATH),
            detail: "the manager closed it".into(),
        }
        .into());
    }
    Ok(0)
}

/// An open `GET /v1/events` answer, its frames unread.
pub(in crate::ctl) struct EventStream {
    url: String,
    body: Box<dyn io::BufRead + Send>,
    /// Kernel id → host name (`main1`, `sub1`, …): a table line of such a kernel's event names
    /// the kernel instead of the session ([`EventStream::with_hosts`]).
    hosts: BTreeMap<String, String>,
}

/// Opens `GET /v1/events?query`: once it answers, the manager has subscribed this reader
/// (with `follow=true`, every later change is on the stream). Without `follow` the call is
/// bounded by the usual request timeout; with it, it may stream for hours.
///
/// Errors: the API's (400 for a bad filter, 403 for `agent_status` with a user key), or none
/// reached (exit 3).
pub(in crate::ctl) fn open(
    client: &Client,
    query: &[(&str, String)],
) -> Result<EventStream, Failure> {
    let pairs: Vec<(&str, &str)> = query.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let body = client.events(&pairs)?;
    Ok(EventStream {
        url: client.url(EVENTS_PATH),
        body: Box::new(BufReader::new(body)),
        hosts: BTreeMap::new(),
    })
}

impl EventStream {
    /// Names each kernel of `hosts` (kernel id → host name) by its host name in the table's
    /// lines: one cluster session's events (`session show --watch`), whose kernels' lines
    /// would otherwise all name the same session.
    pub(in crate::ctl) fn with_hosts(mut self, hosts: BTreeMap<String, String>) -> Self {
        self.hosts = hosts;
        self
    }

    /// Prints each event (see the module doc) until the stream ends or `last(event)` says the
    /// event just printed is the last one wanted. Answers the last event printed.
    ///
    /// Errors: a broken stream (exit 3); a `dropped` stream, after printing its last event
    /// (exit 1).
    pub(in crate::ctl) fn print(
        self,
        out: Output,
        stdout: &mut impl Write,
        mut last: impl FnMut(&Event) -> bool,
    ) -> Result<Option<Event>, Failure> {
        print_frames(&self.url, self.body, &self.hosts, out, stdout, &mut last)
    }
}

/// Prints the frames of `body` (see [`EventStream::print`]).
fn print_frames(
    url: &str,
    body: impl io::BufRead,
    hosts: &BTreeMap<String, String>,
    out: Output,
    stdout: &mut impl Write,
    last: &mut impl FnMut(&Event) -> bool,
) -> Result<Option<Event>, Failure> {
    let mut frames = Frames::new(body);
    let mut printed = None;
    while let Some(frame) = frames
        .next_frame()
        .map_err(|e| client::read_error(url, &e))?
    {
        let event: Event =
            serde_json::from_str(&frame.data).map_err(|e| ClientError::InvalidResponse {
                url: url.to_owned(),
                detail: format!("an event that is not JSON ({e}): {}", frame.data),
            })?;
        match out {
            Output::Json => writeln!(stdout, "{}", frame.data)?,
            Output::Table => writeln!(stdout, "{}", line_in(&event, hosts))?,
        }
        stdout.flush()?;
        if event.kind == Some(EventType::Dropped) {
            return Err(Failure::Local(format!(
                "the manager ended the event stream: {}",
                event.reason.as_deref().unwrap_or("this reader fell behind")
            )));
        }
        let done = last(&event);
        printed = Some(event);
        if done {
            break;
        }
    }
    Ok(printed)
}

/// The table's header line.
pub(in crate::ctl) fn header() -> String {
    header_naming("SESSION")
}

/// The table's header line with `subject` over the third column (`KERNEL` for one cluster
/// session's events, [`EventStream::with_hosts`]).
pub(in crate::ctl) fn header_naming(subject: &str) -> String {
    columns(["TIME", "TYPE", subject, "STATUS", "REASON"].map(str::to_owned))
}

/// [`line`], naming a kernel of `hosts` by its host name instead of its session.
fn line_in(e: &Event, hosts: &BTreeMap<String, String>) -> String {
    match e.kernel_id.as_ref().and_then(|k| hosts.get(k)) {
        Some(host) => line(&Event {
            session_id: Some(host.clone()),
            ..e.clone()
        }),
        None => line(e),
    }
}

/// One event as a table line: time (UTC), type, the session (or `agent <id>` for an agent's
/// liveness), status, and the reason (a pull's progress bar for `pull_progress`).
pub(in crate::ctl) fn line(e: &Event) -> String {
    let kind = e.kind.map_or("?", EventType::as_str);
    let subject = match (&e.session_id, &e.agent_id) {
        (Some(s), _) => s.clone(),
        (None, Some(a)) => format!("agent {a}"),
        (None, None) => "-".into(),
    };
    let (status, reason) = match (e.kind, &e.pull_progress) {
        (Some(EventType::PullProgress), Some(p)) => ("PULLING".to_owned(), format::pull_bar(p)),
        // Idle reclaim: the reason and when it ends.
        (Some(EventType::ReclaimWarning), _) => (
            e.status.clone().unwrap_or_else(|| "-".into()),
            format!(
                "{} at {}",
                e.reason.as_deref().unwrap_or("-"),
                e.deadline.map_or_else(|| "-".into(), format::timestamp)
            ),
        ),
        // A preemption names its victims (session ids).
        (Some(EventType::Preemption), _) => (
            "-".to_owned(),
            format!(
                "evicts {}",
                e.victims
                    .as_deref()
                    .map_or_else(|| "-".into(), |v| v.join(", "))
            ),
        ),
        _ => (
            e.status.clone().unwrap_or_else(|| "-".into()),
            e.reason.clone().unwrap_or_else(|| "-".into()),
        ),
    };
    // One line whatever the reason holds.
    let mut reason = reason.replace(['\r', '\n'], " ");
    // A `TERMINATING` session's grace: by when its agent kills what still runs.
    if let Some(deadline) = e.terminate_deadline {
        reason.push_str(&format!(" (kill at {})", format::timestamp(deadline)));
    }
    columns([
        format::timestamp(e.time),
        kind.to_owned(),
        subject,
        status,
        reason,
    ])
}

fn columns(cells: [String; 5]) -> String {
    let mut s = String::new();
    for (cell, width) in cells.iter().zip(WIDTHS) {
        s.push_str(&format!("{cell:<width$} "));
    }
    s.push_str(&cells[4]);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctl::test_util::{parse, text};
    use crate::ctl::CtlCommand;
    use crate::model::pull::PullProgress;

    const SID: &str = "0b0a8a3e-7a55-4a0c-9d5e-2f3b6a4c1d00";

    fn frame(e: &str) -> String {
        format!("id: 1\nevent: x\ndata: {e}\n\n")
    }

    #[test]
    fn arguments() {
        let a = parse(&[
            "events",
            "-f",
            "--session",
            SID,
            "--agent",
            "a1",
            "--type",
            "session_status",
            "--type",
            "pull_progress,agent_status",
        ])
        .unwrap();
        let CtlCommand::Events(e) = a.command else {
            panic!("{:?}", a.command)
        };
        assert!(e.follow);
        assert_eq!(e.session.as_deref(), Some(SID));
        assert_eq!(e.agent.as_deref(), Some("a1"));
        assert_eq!(e.types, ["session_status", "pull_progress", "agent_status"]);
    }

    #[test]
    fn a_terminating_line_names_its_deadline() {
        let e: Event = serde_json::from_str(&format!(
            r#"{{"id":3,"time":1700000000.5,"type":"session_status","session_id":"{SID}","status":"TERMINATING","reason":"user-requested","terminate_deadline":1700000010.5}}"#
        ))
        .unwrap();
        let l = line(&e);
        assert!(l.contains("TERMINATING"), "{l}");
        assert!(
            l.ends_with(&format!(
                "user-requested (kill at {})",
                format::timestamp(1700000010.5)
            )),
            "{l}"
        );
    }

    #[test]
    fn lines_show_time_type_session_status_reason() {
        let e: Event = serde_json::from_str(&format!(
            r#"{{"id":3,"time":1700000000.5,"type":"session_status","session_id":"{SID}","status":"TERMINATED","reason":"user-requested"}}"#
        ))
        .unwrap();
        let l = line(&e);
        assert!(l.starts_with("2023-11-14T22:13:20Z "), "{l}");
        let words: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(
            words,
            [
                "2023-11-14T22:13:20Z",
                "session_status",
                SID,
                "TERMINATED",
                "user-requested"
            ]
        );
        let mut agent = Event::of(EventType::AgentStatus);
        agent.agent_id = Some("a1".into());
        agent.status = Some("LOST".into());
        assert!(line(&agent).contains("agent a1"), "{}", line(&agent));
        let mut pull = Event::of(EventType::PullProgress);
        pull.pull_progress = Some(PullProgress {
            current_bytes: 5,
            total_bytes: 10,
            layers_done: 1,
            layers_total: 2,
        });
        assert!(line(&pull).contains("PULLING"));
        assert!(line(&pull).contains(" 50%"), "{}", line(&pull));
    }

    #[test]
    fn json_lines_are_the_events_as_written_and_last_stops() {
        let body = [
            frame(r#"{"id":1,"type":"session_status","status":"RUNNING"}"#),
            frame(r#"{"id":2,"type":"session_status","status":"TERMINATED"}"#),
            frame(r#"{"id":3,"type":"session_status","status":"never read"}"#),
        ]
        .concat();
        let mut out = Vec::new();
        let last = print_frames(
            "u",
            body.as_bytes(),
            &BTreeMap::new(),
            Output::Json,
            &mut out,
            &mut |e: &Event| e.is_final_session_status(),
        )
        .unwrap();
        assert_eq!(last.unwrap().id, 2);
        assert_eq!(
            text(out),
            "{\"id\":1,\"type\":\"session_status\",\"status\":\"RUNNING\"}\n\
             {\"id\":2,\"type\":\"session_status\",\"status\":\"TERMINATED\"}\n"
        );
    }

    /// One cluster session's lines name its kernels by host name; an event of a kernel not
    /// in the map keeps its session.
    #[test]
    fn a_clusters_lines_name_its_kernels() {
        let body = [
            frame(r#"{"id":1,"time":1700000000,"type":"session_status","session_id":"S","kernel_id":"k2","status":"TERMINATED","reason":"agent-lost"}"#),
            frame(r#"{"id":2,"time":1700000000,"type":"session_status","session_id":"S","kernel_id":"k9","status":"RUNNING"}"#),
        ]
        .concat();
        let hosts = BTreeMap::from([
            ("k1".to_owned(), "main1".to_owned()),
            ("k2".to_owned(), "sub1".to_owned()),
        ]);
        let mut out = Vec::new();
        print_frames(
            "u",
            body.as_bytes(),
            &hosts,
            Output::Table,
            &mut out,
            &mut |_| false,
        )
        .unwrap();
        let lines: Vec<Vec<String>> = text(out)
            .lines()
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .collect();
        assert_eq!(lines[0][2..], ["sub1", "TERMINATED", "agent-lost"]);
        assert_eq!(lines[1][2..], ["S", "RUNNING", "-"]);
        let header: Vec<String> = header_naming("KERNEL")
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        assert_eq!(header, ["TIME", "TYPE", "KERNEL", "STATUS", "REASON"]);
    }

    #[test]
    fn a_dropped_stream_is_printed_then_an_error() {
        let body = frame(r#"{"id":9,"type":"dropped","reason":"reader-too-slow: 4 events"}"#);
        let mut out = Vec::new();
        let r = print_frames(
            "u",
            body.as_bytes(),
            &BTreeMap::new(),
            Output::Table,
            &mut out,
            &mut |_| false,
        );
        let Err(Failure::Local(message)) = r else {
            panic!("{r:?}")
        };
        assert!(message.contains("reader-too-slow"), "{message}");
        assert!(text(out).contains("dropped"));
    }
}

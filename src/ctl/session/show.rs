//! `sessions` (the listing), `session show [--watch]` and `session rm`: the sessions' records
//! as the manager keeps them (`GET /v1/sessions`, `GET` and `DELETE /v1/sessions/{id}`), and
//! a session's changes as they happen (`GET /v1/events`).

use std::io::{self, Write};

use clap::Args;
use serde_json::Value;

use crate::ctl::format::{ago, amount, bytes, cores, duration, pull_bar, timestamp};
use crate::ctl::render::{
    extra_slots, fields, num, opt, slot, slot_label, table, text, with, word,
};
use crate::ctl::{events, show as print, show_to, unix_now, Client, Failure, Output};
use crate::model::event::{Event, EventType};
use crate::model::session::{Session, SessionList, SessionResult};

/// Arguments of `kernelvisor ctl sessions`.
#[derive(Debug, Args)]
pub struct SessionsArgs {
    /// Include terminated sessions.
    #[arg(long)]
    pub all: bool,
    /// Only this access key's sessions.
    #[arg(long, value_name = "KEY")]
    pub access_key: Option<String>,
}

/// Arguments of `kernelvisor ctl session show`.
#[derive(Debug, Args)]
pub struct ShowArgs {
    /// Session id (UUID).
    pub id: String,
    /// Then print a line per change of the session (status with its reason, pull progress) as
    /// it happens, until it is TERMINATED.
    #[arg(long, short)]
    pub watch: bool,
}

/// `sessions`: a table of the sessions, or with `-o json` the API's JSON as it is.
pub(in crate::ctl) fn list(
    client: &Client,
    args: &SessionsArgs,
    out: Output,
) -> Result<i32, Failure> {
    let now = unix_now();
    let answer = client.sessions(args.all, args.access_key.as_deref())?;
    print(out, &answer, |v| sessions(v, now))
}

/// `session show`; with `--watch`, the session's changes after it, one line each (as `ctl
/// events` prints them; a cluster session's naming the kernel, `sub1`, instead of the session),
/// until it is `TERMINATED`: a cluster session's once every one of its kernels has ended (each
/// kernel's status events come with its `kernel_id`). The stream is
/// opened before the session is read, so no change falls between the two (one made in between
/// is shown twice at worst).
pub(super) fn show(client: &Client, args: &ShowArgs, out: Output) -> Result<i32, Failure> {
    let stdout = &mut io::stdout().lock();
    if !args.watch {
        let now = unix_now();
        return show_to(out, &client.session(&args.id)?, |v| session(v, now), stdout);
    }
    let query = [
        ("session_id", args.id.clone()),
        ("follow", "true".to_owned()),
        ("history", "false".to_owned()),
        (
            "type",
            format!("{},{}", EventType::SessionStatus, EventType::PullProgress),
        ),
    ];
    let stream = events::open(client, &query)?;
    let reply = client.session(&args.id)?;
    let now = unix_now();
    show_to(out, &reply, |v| session(v, now), stdout)?;
    let session = reply.lenient();
    if session.terminated() {
        return Ok(0);
    }
    // A cluster session's lines name its kernels (`sub1`), whose events come one by one.
    let hosts: std::collections::BTreeMap<String, String> = match session.cluster_size {
        n if n > 1 => session
            .kernels
            .iter()
            .map(|k| (k.kernel_id.clone(), k.cluster_hostname.clone()))
            .collect(),
        _ => Default::default(),
    };
    if out == Output::Table {
        let subject = if hosts.is_empty() {
            "SESSION"
        } else {
            "KERNEL"
        };
        writeln!(stdout, "\n{}", events::header_naming(subject))?;
    }
    let stream = stream.with_hosts(hosts);
    let mut live = LiveKernels::of(&session);
    match stream.print(out, stdout, |e| live.ended_by(e))? {
        Some(e) if e.is_final_session_status() => Ok(0),
        _ => Err(crate::ctl::ClientError::Transport {
            what: "the event stream ended early:",
            url: client.url("/v1/events"),
            detail: "the manager closed it before the session ended".into(),
        }
        .into()),
    }
}

/// The kernels of a watched session that have not ended yet: the watch ends when the last one
/// does (a cluster session ends whole, but its kernels' final events come one by one).
struct LiveKernels(std::collections::BTreeSet<String>);

impl LiveKernels {
    /// The session's kernels that are not `TERMINATED` or `CANCELLED` (none listed, from a
    /// manager before cluster sessions: the first final event ends the watch).
    fn of(s: &Session) -> LiveKernels {
        LiveKernels(
            s.kernels
                .iter()
                .filter(|k| !matches!(k.status.as_str(), "TERMINATED" | "CANCELLED"))
                .map(|k| k.kernel_id.clone())
                .collect(),
        )
    }

    /// Whether `e` ends the last live kernel (then the watch ends).
    fn ended_by(&mut self, e: &Event) -> bool {
        if !e.is_final_session_status() {
            return false;
        }
        match &e.kernel_id {
            Some(k) if !self.0.is_empty() => {
                self.0.remove(k);
                self.0.is_empty()
            }
            _ => true,
        }
    }
}

/// `session rm`: the session as it is once terminated.
/// `in 12s`, `in 3m 5s`; `now` for no time left.
pub(super) fn in_seconds(secs: f64) -> String {
    if secs <= 0.0 {
        return "now".into();
    }
    let s = secs.ceil() as u64;
    match s {
        0..=59 => format!("in {s}s"),
        _ => format!("in {}m {}s", s / 60, s % 60),
    }
}

/// A session's status, with a batch session's outcome once it has one: `TERMINATED (FAILURE)`.
fn status_with_result(s: &Session) -> String {
    match (s.result, s.queue_position) {
        (Some(r @ (SessionResult::Success | SessionResult::Failure)), _) => {
            format!("{} ({})", text(&s.status), word(Some(&r)))
        }
        // Its place in the queue: `PENDING #3`.
        (_, Some(n)) => format!("{} #{n}", text(&s.status)),
        _ => text(&s.status),
    }
}

/// `GET /v1/sessions` (`{"sessions": [...]}`) as a table: SESSION, AGENT (a cluster
/// session's main kernel's), STATUS (with the `result` of an ended batch session), TYPE,
/// KERNELS when some session is a cluster (`3 single-node`; `1` for the others), IMAGE, CPU,
/// MEM (a kernel's), one column per accelerator slot some session holds (`GPU` for
/// `cuda.device`, else the slot name in capitals), ACCESS KEY, AGE/REASON (the age of a live
/// session, the `status_reason` of a terminated one).
pub(super) fn sessions(v: &Value, now: f64) -> String {
    with(v, |list: SessionList| {
        let extra = extra_slots(list.sessions.iter().map(|s| &s.resource_slots));
        let labels: Vec<String> = extra.iter().map(|n| slot_label(n)).collect();
        let clusters = list.sessions.iter().any(|s| s.cluster_size > 1);
        let mut header = vec!["SESSION", "AGENT", "STATUS", "TYPE"];
        if clusters {
            header.push("KERNELS");
        }
        header.extend(["IMAGE", "CPU", "MEM"]);
        header.extend(labels.iter().map(String::as_str));
        header.extend(["ACCESS KEY", "AGE/REASON"]);
        // Idle reclaim: a column when some session has a deadline.
        let reclaim = list.sessions.iter().any(|s| reclaim_cell(s, now).is_some());
        if reclaim {
            header.push("RECLAIM");
        }
        let rows = list
            .sessions
            .iter()
            .map(|s| {
                let slots = &s.resource_slots;
                let status = match s.terminate_deadline {
                    // `TERMINATING (kill in 8s)`: its workload's grace.
                    Some(d) => format!("{} (kill {})", status_with_result(s), in_seconds(d - now)),
                    None => status_with_result(s),
                };
                let mut row = vec![
                    text(&s.session_id),
                    text(&s.agent_id),
                    status,
                    word(s.session_type.as_ref()),
                ];
                if clusters {
                    row.push(cluster_size(s));
                }
                row.push(text(&s.image));
                row.push(cores(slot(slots, "cpu").as_ref()));
                row.push(bytes(slot(slots, "mem").as_ref()));
                for name in &extra {
                    row.push(cores(slot(slots, name).as_ref()));
                }
                row.push(text(&s.access_key));
                let age = s.created_at.map_or("-".to_owned(), |t| duration(now - t));
                row.push(match (&s.pending_reason, s.terminated()) {
                    // A queued session: why it waits first, then for how long.
                    (Some(r), false) => format!("{} {age}", text(&r.code)),
                    (_, true) => opt(s.status_reason.as_ref()),
                    (None, false) => age,
                });
                if reclaim {
                    row.push(reclaim_cell(s, now).unwrap_or_else(|| "-".to_owned()));
                }
                row
            })
            .collect();
        table(header, rows)
    })
}

// Idle reclaim.
/// A session's reclaim cell (`docs/design.md`, "Idle reclaim"): `idle 12m / ends in 18m` —
/// how long since its last activity (or its start) when it has an `idle_timeout`, and how
/// long to its earliest deadline (`ends now` once past it); `None` without a deadline.
fn reclaim_cell(s: &Session, now: f64) -> Option<String> {
    let next = [s.idle_deadline, s.lifetime_deadline, s.utilization_deadline]
        .into_iter()
        .flatten()
        .min_by(f64::total_cmp)?;
    let ends = ends(next, now);
    let since = s.last_activity.or(s.admitted_at).or(s.created_at);
    Some(match (s.idle_deadline, since) {
        (Some(_), Some(t)) => format!("idle {} / {ends}", duration(now - t)),
        _ => ends,
    })
}

/// `ends in 18m`, or `ends now` once `deadline` (Unix seconds) is past.
fn ends(deadline: f64, now: f64) -> String {
    if deadline > now {
        format!("ends in {}", duration(deadline - now))
    } else {
        "ends now".to_owned()
    }
}

/// A session's reclaim lines (`docs/design.md`, "Idle reclaim"): its policy (`Reclaim:
/// idle_timeout 600s, max_lifetime 3600s`), its last activity, and each deadline it has
/// (`Idle deadline: 2023-11-14T22:31:20Z (ends in 18m)`); nothing without a policy.
fn reclaim_fields(s: &Session, now: f64) -> Vec<(&'static str, String)> {
    let mut pairs = Vec::new();
    if s.reclaim.is_empty() {
        return pairs;
    }
    pairs.push((
        "Reclaim",
        crate::ctl::access_key::reclaim_defaults(&s.reclaim),
    ));
    if s.reclaim.idle_timeout.is_some() || s.last_activity.is_some() {
        pairs.push(("Last activity", when(s.last_activity, now)));
    }
    for (name, deadline) in [
        ("Idle deadline", s.idle_deadline),
        ("Lifetime deadline", s.lifetime_deadline),
        ("Utilization deadline", s.utilization_deadline),
    ] {
        if let Some(d) = deadline {
            pairs.push((name, format!("{} ({})", timestamp(d), ends(d, now))));
        }
    }
    pairs
}

/// A session's kernels in a cell: `3 multi-node` for a cluster, `1` for the others.
fn cluster_size(s: &Session) -> String {
    match s.cluster_size {
        n if n > 1 => format!("{n} {}", word(s.cluster_mode.as_ref())),
        _ => "1".to_owned(),
    }
}

/// A time as `2023-11-14T22:13:20Z (5m ago)`, or `-`.
fn when(t: Option<f64>, now: f64) -> String {
    match t {
        Some(t) => format!("{} ({})", timestamp(t), ago(Some(&num(t)), now)),
        None => "-".to_owned(),
    }
}

/// One session (`GET`/`DELETE /v1/sessions/{id}`) as `key: value` lines; memory in binary
/// units with the exact byte count, times in UTC with their age. `Type` carries a batch
/// session's `batch_timeout` (`batch (timeout 3600s)`); `Command` is shown on one line (line
/// breaks as `\n`). A cluster session adds `Cluster` (`3 kernels, multi-node`) and, after the
/// fields, a table of its kernels ([`kernels`]); its `Kernel` and `Agent` are its main
/// kernel's, its CPU and memory each kernel's.
pub(super) fn session(v: &Value, now: f64) -> String {
    with(v, |s: Session| session_fields(&s, now))
}

fn session_fields(s: &Session, now: f64) -> String {
    let slots = &s.resource_slots;
    let mem = match slot(slots, "mem") {
        Some(m) if amount(&m).is_some() => {
            format!("{} ({} bytes)", bytes(Some(&m)), cores(Some(&m)))
        }
        m => bytes(m.as_ref()),
    };
    let kind = match s.batch_timeout {
        Some(t) => format!(
            "{} (timeout {}s)",
            word(s.session_type.as_ref()),
            cores(Some(&num(t)))
        ),
        None => word(s.session_type.as_ref()),
    };
    let command = opt(s.command.as_ref())
        .replace('\r', "\\r")
        .replace('\n', "\\n");
    let mut pairs = vec![
        ("Session", text(&s.session_id)),
        ("Kernel", text(&s.kernel_id)),
        ("Agent", text(&s.agent_id)),
        ("Access key", text(&s.access_key)),
        ("Image", text(&s.image)),
        ("Type", kind),
        ("Command", command),
        ("Status", text(&s.status)),
        ("Reason", opt(s.status_reason.as_ref())),
        ("Result", word(s.result.as_ref())),
        ("Exit code", opt(s.exit_code)),
        ("CPU", cores(slot(slots, "cpu").as_ref())),
        ("Memory", mem),
    ];
    // Every other slot it asked for, by name (`GPU` for `cuda.device`).
    let extra: Vec<(String, String)> = slots
        .iter()
        .filter(|(name, _)| *name != "cpu" && *name != "mem")
        .map(|(name, v)| {
            let label = match name.as_str() {
                "cuda.device" => "GPU".to_owned(),
                other => other.to_owned(),
            };
            (label, cores(Some(&Value::from(v.as_str()))))
        })
        .collect();
    pairs.extend(extra.iter().map(|(k, v)| (k.as_str(), v.clone())));
    if let Some(p) = &s.pull_progress {
        pairs.push(("Pull", pull_bar(p)));
    }
    let p = &s.restart_policy;
    if p.mode != crate::model::session::RestartMode::Never {
        pairs.push((
            "Restarts",
            format!(
                "{} ({}, at most {} in {}s)",
                s.restart_count,
                p.mode.as_str(),
                p.max_restarts,
                cores(Some(&num(p.window)))
            ),
        ));
    }
    if let Some(Some(stages)) = &s.stages {
        let line: Vec<String> = stages
            .iter()
            .map(|st| match st.restarts {
                n if n > 0 => format!(
                    "{} {} ({n} restarts)",
                    text(&st.name),
                    word(Some(&st.status))
                ),
                _ => format!("{} {}", text(&st.name), word(Some(&st.status))),
            })
            .collect();
        pairs.push(("Stages", line.join(", ")));
    }
    // How its kernel runs code (`GET` only, when its agent says): `kernel-runner` or `process`.
    if let Some(Some(path)) = &s.exec_path {
        pairs.push(("Exec path", text(path)));
    }
    pairs.push(("Priority", s.priority.to_string()));
    // How it is ended: `SIGTERM, grace 10s`; while `TERMINATING`, by when it is killed.
    if s.stop_signal.is_some() || s.grace_period.is_some() {
        let signal = s.stop_signal.as_deref().unwrap_or("agent's default");
        let grace = s.grace_period.map_or("agent's default".to_owned(), |g| {
            format!("{}s", cores(Some(&num(g))))
        });
        pairs.push(("Stop", format!("{signal}, grace {grace}")));
    }
    if let Some(deadline) = s.terminate_deadline {
        pairs.push((
            "Kill deadline",
            format!("{} ({})", timestamp(deadline), in_seconds(deadline - now)),
        ));
    }
    // Idle reclaim: its policy and deadlines.
    pairs.extend(reclaim_fields(s, now));
    if let Some(r) = &s.pending_reason {
        pairs.push((
            "Waiting",
            format!("{}: {}", text(&r.code), text(&r.message)),
        ));
    }
    if let Some(n) = s.queue_position {
        pairs.push(("Queue position", n.to_string()));
    }
    pairs.push(("Created", when(s.created_at, now)));
    if s.queued_at.is_some() {
        pairs.push(("Queued", when(s.queued_at, now)));
        pairs.push(("Admitted", when(s.admitted_at, now)));
    }
    pairs.push(("Terminated", when(s.terminated_at, now)));
    let cluster = s.cluster_size > 1 || s.kernels.len() > 1;
    if cluster {
        let mode = word(s.cluster_mode.as_ref());
        let at = pairs
            .iter()
            .position(|(k, _)| *k == "Agent")
            .map_or(pairs.len(), |i| i + 1);
        pairs.insert(
            at,
            ("Cluster", format!("{} kernels, {mode}", s.cluster_size)),
        );
    }
    let mut out = fields(&pairs);
    if cluster {
        out.push_str("\nKernels:\n");
        for line in kernels(&s.kernels).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

/// A cluster session's kernels as a table, `main1` first: HOST (`main1`, `sub1`, …), ROLE,
/// KERNEL (its id), AGENT, STATUS (with its reason once it ended: `TERMINATED
/// (agent-lost)`), SERVICES (the service ports it publishes: the main kernel's).
fn kernels(list: &[crate::model::cluster::SessionKernel]) -> String {
    let rows = list
        .iter()
        .map(|k| {
            let status = match &k.status_reason {
                Some(r) if !r.is_empty() => format!("{} ({r})", text(&k.status)),
                _ => text(&k.status),
            };
            vec![
                text(&k.cluster_hostname),
                text(&k.cluster_role),
                text(&k.kernel_id),
                text(&k.agent_id),
                status,
                text(&k.service_ports.join(",")),
            ]
        })
        .collect();
    table(
        vec!["HOST", "ROLE", "KERNEL", "AGENT", "STATUS", "SERVICES"],
        rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::ctl::render::tests::{cells, NOW};

    #[test]
    fn sessions_show_every_slot() {
        let mut s = live_session();
        s["resource_slots"] = json!({"cpu": "1", "mem": "268435456", "cuda.shares": "0.5"});
        let out = session(&s, NOW);
        assert!(out.contains("cuda.shares: 0.5\n"), "{out}");
        assert!(!out.contains("GPU"), "{out}");
        let table = sessions(&json!({"sessions": [s, live_session()]}), NOW);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].contains("CUDA.SHARES"), "{table}");
        assert!(
            lines[1].contains("0.5") && lines[2].contains(" - "),
            "{table}"
        );
    }

    #[test]
    fn empty_lists_still_have_headers() {
        assert!(sessions(&json!({"sessions": []}), NOW).starts_with("SESSION"));
        assert!(sessions(&json!({}), NOW).starts_with("SESSION"));
    }

    fn live_session() -> Value {
        json!({"session_id": "5b1f7c6e-0000-4000-8000-000000000001", "kernel_id": "5b1f7c6e-0000-4000-8000-000000000002",
               "agent_id": "i-node1", "access_key": "AKIADEV", "image": "kernelvisor-test:latest",
               "status": "RUNNING", "status_reason": null, "exit_code": null, "type": "interactive",
               "command": null, "batch_timeout": null, "result": "UNDEFINED",
               "resource_slots": {"cpu": "1", "mem": "268435456", "cuda.device": "0"},
               "created_at": NOW - 300.0, "terminated_at": null})
    }

    #[test]
    fn sessions_table_shows_idle_and_the_next_deadline() {
        let mut idle = live_session();
        idle["last_activity"] = json!(NOW - 720.0);
        idle["idle_deadline"] = json!(NOW + 1080.0);
        idle["lifetime_deadline"] = json!(NOW + 7200.0);
        let mut life = live_session();
        life["session_id"] = json!("life");
        life["lifetime_deadline"] = json!(NOW + 90.0);
        let mut over = live_session();
        over["session_id"] = json!("over");
        over["idle_deadline"] = json!(NOW - 1.0);
        let mut plain = live_session();
        plain["session_id"] = json!("plain");
        let out = sessions(&json!({"sessions": [idle, life, over, plain]}), NOW);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].trim_end().ends_with("RECLAIM"), "{out}");
        assert!(lines[1].ends_with("idle 12m / ends in 18m"), "{out}");
        assert!(lines[2].ends_with("ends in 1m"), "{out}");
        // No activity yet: idle since it started (5 minutes ago).
        assert!(lines[3].ends_with("idle 5m / ends now"), "{out}");
        assert!(lines[4].trim_end().ends_with('-'), "{out}");
        // No session with a deadline: no column.
        let out = sessions(&json!({"sessions": [live_session()]}), NOW);
        assert!(!out.contains("RECLAIM"), "{out}");
    }

    #[test]
    fn sessions_table_age_or_reason() {
        let mut done = live_session();
        done["session_id"] = json!("dead");
        done["status"] = json!("TERMINATED");
        done["status_reason"] = json!("user-requested");
        done["terminated_at"] = json!(NOW - 10.0);
        let out = sessions(&json!({"sessions": [live_session(), done]}), NOW);
        let lines: Vec<&str> = out.lines().collect();
        for h in [
            "SESSION",
            "AGENT",
            "STATUS",
            "TYPE",
            "IMAGE",
            "CPU",
            "MEM",
            "ACCESS KEY",
            "AGE/REASON",
        ] {
            assert!(lines[0].contains(h), "missing {h}: {out}");
        }
        assert!(!lines[0].contains("GPU"));
        let cells = |l: &str| {
            l.split("  ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            cells(lines[1]),
            [
                "5b1f7c6e-0000-4000-8000-000000000001",
                "i-node1",
                "RUNNING",
                "interactive",
                "kernelvisor-test:latest",
                "1",
                "256 MiB",
                "AKIADEV",
                "5m"
            ]
        );
        assert_eq!(cells(lines[2]).last().unwrap(), "user-requested");
        assert_eq!(
            cells(lines[2])[2],
            "TERMINATED",
            "no result shown for an interactive session"
        );
        assert!(lines[2].starts_with("dead "));
    }

    fn ended_batch() -> Value {
        let mut s = live_session();
        s["session_id"] = json!("job");
        s["status"] = json!("TERMINATED");
        s["status_reason"] = json!("batch-timeout");
        s["type"] = json!("batch");
        s["command"] = json!("python train.py\necho done");
        s["batch_timeout"] = json!(3600);
        s["result"] = json!("FAILURE");
        s["exit_code"] = json!(137);
        s["terminated_at"] = json!(NOW - 10.0);
        s
    }

    #[test]
    fn session_restart_policy_stages_and_exec_path() {
        let mut s = live_session();
        s["restart_policy"] =
            json!({"mode": "on-failure", "max_restarts": 3, "window": 60, "backoff": 1});
        s["restart_count"] = json!(2);
        s["stages"] = json!([{"name": "image", "status": "ready", "restarts": 0, "setup_seconds": 0.1},
                             {"name": "container", "status": "setting-up", "restarts": 2, "setup_seconds": 0.5}]);
        s["exec_path"] = json!("kernel-runner");
        let out = session(&s, NOW);
        assert!(out.contains("Exec path:  kernel-runner\n"), "{out}");
        assert!(
            out.contains("Restarts:   2 (on-failure, at most 3 in 60s)\n"),
            "{out}"
        );
        assert!(
            out.contains("Stages:     image ready, container setting-up (2 restarts)\n"),
            "{out}"
        );
        // `never` (the default) and an ended session (stages null) add no line.
        s["restart_policy"] =
            json!({"mode": "never", "max_restarts": 3, "window": 60, "backoff": 1});
        s["stages"] = Value::Null;
        s["exec_path"] = Value::Null;
        let out = session(&s, NOW);
        assert!(
            !out.contains("Restarts") && !out.contains("Stages") && !out.contains("Exec path"),
            "{out}"
        );
    }

    #[test]
    fn sessions_table_batch_outcome() {
        let out = sessions(&json!({"sessions": [ended_batch()]}), NOW);
        let row: Vec<&str> = out
            .lines()
            .nth(1)
            .unwrap()
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            row[..4],
            ["job", "i-node1", "TERMINATED (FAILURE)", "batch"],
            "{out}"
        );
        assert_eq!(row.last(), Some(&"batch-timeout"), "{out}");
        // An older manager's answer without the new fields.
        let old = sessions(
            &json!({"sessions": [{"session_id": "s", "status": "RUNNING"}]}),
            NOW,
        );
        let row: Vec<&str> = old
            .lines()
            .nth(1)
            .unwrap()
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(row[..4], ["s", "-", "RUNNING", "-"], "{old}");
    }

    #[test]
    fn session_detail_shows_the_pull() {
        let mut v = live_session();
        v["status"] = json!("PULLING");
        v["pull_progress"] = json!({"current_bytes": 4194304, "total_bytes": 10485760, "layers_done": 1, "layers_total": 3});
        let out = session(&v, NOW);
        assert!(
            out.contains("Pull:       [########------------]  40%  4 MiB / 10 MiB, 1/3 layers\n"),
            "{out}"
        );
        assert!(!session(&live_session(), NOW).contains("Pull:"));
    }

    #[test]
    fn session_detail_batch_fields() {
        let out = session(&ended_batch(), NOW);
        assert!(out.contains("Type:       batch (timeout 3600s)\n"), "{out}");
        assert!(
            out.contains("Command:    python train.py\\necho done\n"),
            "{out}"
        );
        assert!(out.contains("Status:     TERMINATED\nReason:     batch-timeout\nResult:     FAILURE\nExit code:  137\n"), "{out}");
    }

    #[test]
    fn session_detail_fields() {
        let out = session(&live_session(), NOW);
        assert!(
            out.contains("Session:    5b1f7c6e-0000-4000-8000-000000000001\n"),
            "{out}"
        );
        assert!(
            out.contains("Memory:     256 MiB (268435456 bytes)\n"),
            "{out}"
        );
        assert!(out.contains("Reason:     -\n"), "{out}");
        assert!(
            out.contains("Created:    2023-11-14T22:08:20Z (5m ago)\n"),
            "{out}"
        );
        assert!(out.contains("Terminated: -\n"), "{out}");
        assert!(out.contains("GPU:        0\n"), "{out}");
        assert!(
            out.contains("Type:       interactive\nCommand:    -\n"),
            "{out}"
        );
        assert!(
            out.contains("Result:     UNDEFINED\nExit code:  -\n"),
            "{out}"
        );
        // A sparse answer renders without panicking, every value `-`.
        let sparse = session(&json!({"session_id": "x"}), NOW);
        assert!(
            sparse.contains("Image:      -\n")
                && sparse.contains("Memory:     -\n")
                && !sparse.contains("GPU"),
            "{sparse}"
        );
    }

    #[test]
    fn session_detail_shows_the_reclaim_policy_and_deadlines() {
        let mut s = live_session();
        s["reclaim"] = json!({"idle_timeout": 1800, "max_lifetime": 7200,
                              "min_utilization": {"cpu": 5}, "utilization_window": 600});
        s["last_activity"] = json!(NOW - 720.0);
        s["idle_deadline"] = json!(NOW + 1080.0);
        s["lifetime_deadline"] = json!(NOW + 6900.0);
        s["utilization_deadline"] = json!(NOW - 1.0);
        let out = session(&s, NOW);
        assert!(
            out.contains(
                "max_lifetime 7200s, idle_timeout 1800s, min_utilization cpu=5% over 600s\n"
            ),
            "{out}"
        );
        let line = |name: &str| {
            out.lines()
                .find(|l| l.starts_with(&format!("{name}:")))
                .unwrap_or_else(|| panic!("no {name} in {out}"))
                .to_owned()
        };
        assert!(line("Last activity").ends_with("(12m ago)"), "{out}");
        assert!(line("Idle deadline").ends_with("(ends in 18m)"), "{out}");
        assert!(line("Lifetime deadline").ends_with("(ends in 1h)"), "{out}");
        assert!(
            line("Utilization deadline").ends_with("(ends now)"),
            "{out}"
        );
        // No policy: no reclaim lines.
        let plain = session(&live_session(), NOW);
        assert!(
            !plain.contains("Reclaim") && !plain.contains("deadline"),
            "{plain}"
        );
    }

    /// A cluster session of 3 (multi-node) with sub2 lost: the session ending.
    fn cluster_session() -> Value {
        let mut s = live_session();
        s["status"] = json!("TERMINATING");
        s["status_reason"] = json!("agent-lost");
        s["cluster_size"] = json!(3);
        s["cluster_mode"] = json!("multi-node");
        let kernel = |host: &str, role: &str, idx: u32, agent: &str, status: &str| {
            json!({"kernel_id": format!("k-{host}"), "cluster_role": role, "cluster_idx": idx,
                   "cluster_hostname": host, "agent_id": agent, "status": status,
                   "status_reason": null, "exit_code": null, "service_ports": []})
        };
        let mut sub2 = kernel("sub2", "sub", 2, "i-node3", "TERMINATED");
        sub2["status_reason"] = json!("agent-lost");
        let mut main = kernel("main1", "main", 1, "i-node1", "RUNNING");
        main["service_ports"] = json!(["jupyter", "sshd"]);
        s["kernels"] = json!([main, kernel("sub1", "sub", 1, "i-node2", "RUNNING"), sub2]);
        s
    }

    #[test]
    fn session_detail_lists_a_clusters_kernels() {
        let out = session(&cluster_session(), NOW);
        assert!(
            out.contains("Agent:      i-node1\nCluster:    3 kernels, multi-node\n"),
            "{out}"
        );
        assert!(
            out.contains("Status:     TERMINATING\nReason:     agent-lost\n"),
            "{out}"
        );
        let (_, table) = out.split_once("\nKernels:\n").expect("a kernels table");
        let rows: Vec<Vec<&str>> = table.lines().map(cells).collect();
        assert_eq!(
            rows,
            [
                vec!["HOST", "ROLE", "KERNEL", "AGENT", "STATUS", "SERVICES"],
                vec![
                    "main1",
                    "main",
                    "k-main1",
                    "i-node1",
                    "RUNNING",
                    "jupyter,sshd"
                ],
                vec!["sub1", "sub", "k-sub1", "i-node2", "RUNNING", "-"],
                vec![
                    "sub2",
                    "sub",
                    "k-sub2",
                    "i-node3",
                    "TERMINATED (agent-lost)",
                    "-"
                ],
            ]
        );
        assert!(table.lines().all(|l| l.starts_with("  ")), "{table}");
        // A session of one kernel (listed as its only kernel) shows neither.
        let mut one = live_session();
        one["cluster_size"] = json!(1);
        one["kernels"] = json!([cluster_session()["kernels"][0]]);
        let out = session(&one, NOW);
        assert!(
            !out.contains("Cluster") && !out.contains("Kernels"),
            "{out}"
        );
    }

    #[test]
    fn sessions_table_shows_a_clusters_size() {
        let out = sessions(
            &json!({"sessions": [cluster_session(), live_session()]}),
            NOW,
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            cells(lines[0])[..6],
            ["SESSION", "AGENT", "STATUS", "TYPE", "KERNELS", "IMAGE"]
        );
        assert_eq!(
            cells(lines[1])[2..5],
            ["TERMINATING", "interactive", "3 multi-node"]
        );
        assert_eq!(cells(lines[2])[2..5], ["RUNNING", "interactive", "1"]);
        // No cluster listed: no column.
        let plain = sessions(&json!({"sessions": [live_session()]}), NOW);
        assert!(!plain.contains("KERNELS"), "{plain}");
    }

    /// The watch of a cluster session ends with the final event of its last live kernel, not
    /// its first (each kernel's events come with its `kernel_id`).
    #[test]
    fn a_watch_ends_when_every_kernel_has() {
        let s: Session = serde_json::from_value(cluster_session()).unwrap();
        let mut live = LiveKernels::of(&s);
        let event = |kernel: &str, status: &str| Event {
            kind: Some(EventType::SessionStatus),
            kernel_id: Some(kernel.into()),
            status: Some(status.into()),
            ..Event::of(EventType::SessionStatus)
        };
        // sub2 had ended already; main1 and sub1 are live.
        assert!(!live.ended_by(&event("k-main1", "TERMINATING")));
        assert!(!live.ended_by(&event("k-sub1", "TERMINATED")));
        assert!(
            !live.ended_by(&event("k-sub1", "TERMINATED")),
            "counted once"
        );
        assert!(live.ended_by(&event("k-main1", "TERMINATED")));
        // A session listed without kernels (an older manager): its first final event.
        let mut old = LiveKernels::of(&Session::default());
        assert!(!old.ended_by(&event("k", "RUNNING")));
        assert!(old.ended_by(&event("k", "CANCELLED")));
    }

    /// An answer whose field has another type says so (it would have been a row of `-`).
    #[test]
    fn an_answer_that_does_not_read_says_so() {
        let out = sessions(&json!({"sessions": [{"session_id": 5}]}), NOW);
        assert!(
            out.starts_with("cannot read the manager's answer as SessionList:"),
            "{out}"
        );
        assert!(out.ends_with("(see it with -o json)\n"), "{out}");
    }
}

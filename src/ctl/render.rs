//! Table-mode rendering of API answers for `kernelvisor ctl`.
//!
//! Every function takes the JSON value exactly as the API returns it (`docs/manager-api.md`),
//! reads it into the API's own reply type ([`crate::model`], lenient: a missing key is its
//! default, an unknown key is ignored) and answers the text to print, ending in a newline.
//! Missing or `null` fields show as `-`; an answer that does not read as its type (a field of
//! another type) shows as one line saying so, not as a table of `-`. Times are relative to the
//! `now` passed in (Unix seconds), so output is deterministic in tests.

use std::collections::BTreeMap;
use std::fmt::Display;

use comfy_table::{presets::NOTHING, Table};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use super::client::read;
use super::format::{ago, amount, bytes, cores, duration, file_mode, pull_bar, timestamp};
use crate::model::access_key::{AccessKey, AccessKeyList, NewAccessKey};
use crate::model::agent::{Agent, AgentList};
use crate::model::exec::ExecuteAnswer;
use crate::model::file::FileList;
use crate::model::health::Health;
use crate::model::service::{Service, ServiceList, ServiceStarted};
use crate::model::session::{Session, SessionCreated, SessionList, SessionResult};
use crate::model::slots::SlotAmounts;
use crate::model::vfolder::{Vfolder, VfolderList};

fn with<T: DeserializeOwned + Default>(v: &Value, f: impl FnOnce(T) -> String) -> String {
    read(v).map_or_else(|e| e, f)
}

/// A string, or `-` when empty.
fn text(s: &str) -> String {
    if s.is_empty() {
        "-".to_owned()
    } else {
        s.to_owned()
    }
}

/// An optional value, or `-` (an empty string too).
fn opt<T: Display>(v: Option<T>) -> String {
    v.map_or("-".to_owned(), |v| text(&v.to_string()))
}

/// An enum's wire name (`batch`, `SUCCESS`, `setting-up`), or `-`.
fn word<T: Serialize>(v: Option<&T>) -> String {
    v.and_then(|v| serde_json::to_value(v).ok())
        .and_then(|v| v.as_str().map(str::to_owned))
        .map_or("-".to_owned(), |s| text(&s))
}

/// Slot `name` of `slots` as the formatters take it (a decimal string).
fn slot(slots: &SlotAmounts, name: &str) -> Option<Value> {
    slots.get(name).map(|v| Value::from(v.as_str()))
}

/// A number as the formatters take it.
fn num(n: f64) -> Value {
    Value::from(n)
}

/// The accelerator slots (every slot but `cpu` and `mem`) some row has a non-zero amount of,
/// by name: one column each.
fn extra_slots<'a>(rows: impl Iterator<Item = &'a SlotAmounts>) -> Vec<String> {
    let mut names = std::collections::BTreeSet::new();
    for slots in rows {
        for (name, v) in slots {
            if name != "cpu"
                && name != "mem"
                && amount(&Value::from(v.as_str())).is_some_and(|n| n > 0.0)
            {
                names.insert(name.clone());
            }
        }
    }
    names.into_iter().collect()
}

/// A slot's column header or field name: `GPU` for `cuda.device` (whole GPUs), else the slot
/// name in capitals (`CUDA.SHARES`).
fn slot_label(name: &str) -> String {
    match name {
        "cuda.device" => "GPU".to_owned(),
        other => other.to_uppercase(),
    }
}

/// An amount of slot `name`: bytes in binary units when `types` (or the built-in `mem`) says
/// `bytes`, else a count.
fn slot_amount(types: &BTreeMap<String, String>, name: &str, v: Option<&Value>) -> String {
    let ty = types.get(name).map(String::as_str);
    if ty == Some("bytes") || (ty.is_none() && name == "mem") {
        bytes(v)
    } else {
        cores(v)
    }
}

/// A borderless table, columns two spaces apart, no trailing spaces.
fn table(header: Vec<&str>, rows: Vec<Vec<String>>) -> String {
    let mut t = Table::new();
    t.load_preset(NOTHING).set_header(header);
    for row in rows {
        t.add_row(row);
    }
    for column in t.column_iter_mut() {
        column.set_padding((0, 2));
    }
    let mut out: String = t.lines().map(|l| l.trim_end().to_owned() + "\n").collect();
    if out.is_empty() {
        out.push('\n');
    }
    out
}

/// `key: value` lines with the values aligned.
fn fields(pairs: &[(&str, String)]) -> String {
    let width = pairs.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    pairs
        .iter()
        .map(|(k, v)| format!("{:<width$} {v}\n", format!("{k}:")))
        .collect()
}

/// Whether an agent takes new sessions: `yes`, `cordoned`, `draining`, `draining (deadline in
/// 42s)` or `draining (deadline passed)` (its sessions are being terminated).
pub fn scheduling(a: &Agent, now: f64) -> String {
    match (a.schedulable, a.draining, a.drain_deadline) {
        (_, true, Some(d)) if d > now => format!("draining (deadline in {})", duration(d - now)),
        (_, true, Some(_)) => "draining (deadline passed)".to_owned(),
        (_, true, None) => "draining".to_owned(),
        (true, false, _) => "yes".to_owned(),
        (false, false, _) => "cordoned".to_owned(),
    }
}

/// `GET /v1/agents` (`{"agents": [...]}`) as a table: AGENT, STATUS, SCHEDULING (see
/// [`scheduling`]), ADDR, CPU and MEM as used/total, one used/total column per accelerator
/// slot some agent has (`GPU` for `cuda.device`, else the slot name in capitals:
/// `CUDA.SHARES`), KERNELS, LAST HEARTBEAT.
pub fn agents(v: &Value, now: f64) -> String {
    with(v, |list: AgentList| {
        let extra = extra_slots(list.agents.iter().map(|a| &a.slots_total));
        let labels: Vec<String> = extra.iter().map(|n| slot_label(n)).collect();
        let mut header = vec!["AGENT", "STATUS", "SCHEDULING", "ADDR", "CPU", "MEM"];
        header.extend(labels.iter().map(String::as_str));
        header.extend(["KERNELS", "LAST HEARTBEAT"]);
        let rows = list
            .agents
            .iter()
            .map(|a| {
                let used_total = |f: fn(Option<&Value>) -> String, name: &str| {
                    format!(
                        "{}/{}",
                        f(slot(&a.slots_used, name).as_ref()),
                        f(slot(&a.slots_total, name).as_ref())
                    )
                };
                let mut row = vec![
                    text(&a.agent_id),
                    text(&a.status),
                    scheduling(a, now),
                    opt(a.addr.as_ref()),
                ];
                row.push(used_total(cores, "cpu"));
                row.push(used_total(bytes, "mem"));
                for name in &extra {
                    row.push(format!(
                        "{}/{}",
                        slot_amount(&a.slot_types, name, slot(&a.slots_used, name).as_ref()),
                        slot_amount(&a.slot_types, name, slot(&a.slots_total, name).as_ref())
                    ));
                }
                row.push(opt(a.kernels));
                row.push(ago(a.last_heartbeat.map(num).as_ref(), now));
                row
            })
            .collect();
        table(header, rows)
    })
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

/// `GET /v1/sessions` (`{"sessions": [...]}`) as a table: SESSION, AGENT, STATUS (with the
/// `result` of an ended batch session), TYPE, IMAGE, CPU, MEM, one column per accelerator slot
/// some session holds (`GPU` for `cuda.device`, else the slot name in capitals), ACCESS KEY,
/// AGE/REASON (the age of a live session, the `status_reason` of a
/// terminated one).
pub fn sessions(v: &Value, now: f64) -> String {
    with(v, |list: SessionList| {
        let extra = extra_slots(list.sessions.iter().map(|s| &s.resource_slots));
        let labels: Vec<String> = extra.iter().map(|n| slot_label(n)).collect();
        let mut header = vec!["SESSION", "AGENT", "STATUS", "TYPE", "IMAGE", "CPU", "MEM"];
        header.extend(labels.iter().map(String::as_str));
        header.extend(["ACCESS KEY", "AGE/REASON"]);
        let rows = list
            .sessions
            .iter()
            .map(|s| {
                let slots = &s.resource_slots;
                let mut row = vec![
                    text(&s.session_id),
                    text(&s.agent_id),
                    status_with_result(s),
                    word(s.session_type.as_ref()),
                ];
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
                row
            })
            .collect();
        table(header, rows)
    })
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
/// breaks as `\n`).
pub fn session(v: &Value, now: f64) -> String {
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
    pairs.push(("Priority", s.priority.to_string()));
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
    fields(&pairs)
}

/// The answer of `POST /v1/sessions` (`session_id`, `kernel_id`, `agent_id`, `status`; a
/// queued session's `queue_position` and `pending_reason` too).
pub fn created(v: &Value) -> String {
    with(v, |c: SessionCreated| {
        let mut pairs = vec![
            ("Session", text(&c.session_id)),
            ("Kernel", text(&c.kernel_id)),
            ("Agent", text(&c.agent_id)),
            ("Status", text(&c.status)),
        ];
        if let Some(n) = c.queue_position {
            pairs.push(("Queue position", n.to_string()));
        }
        if let Some(r) = &c.pending_reason {
            pairs.push((
                "Waiting",
                format!("{}: {}", text(&r.code), text(&r.message)),
            ));
        }
        fields(&pairs)
    })
}

/// An access key's concurrency, `used/limit` (`unlimited` for a limit of 0).
fn concurrency(k: &AccessKey) -> String {
    let limit = match k.concurrency_limit {
        Some(0) => "unlimited".to_owned(),
        l => opt(l),
    };
    format!("{}/{limit}", opt(k.concurrency_used))
}

/// An access key's `enabled` as `enabled` / `disabled` (`-` when missing).
fn key_state(enabled: Option<bool>) -> String {
    match enabled {
        Some(true) => "enabled".to_owned(),
        Some(false) => "disabled".to_owned(),
        None => "-".to_owned(),
    }
}

/// A Unix time in UTC (`2023-11-14T22:13:20Z`), or `-`.
fn utc(t: Option<f64>) -> String {
    t.map_or("-".to_owned(), timestamp)
}

/// One access key (`GET /v1/access-keys/{key}`, and the answers of `PATCH` / `DELETE` on it)
/// as `key: value` lines: the key, then `Name`, `Role`, `State` (`enabled`/`disabled`) and
/// `Created` (UTC) when the answer has them, and its concurrency, `used/limit` (`unlimited` for
/// 0).
pub fn access_key(v: &Value) -> String {
    with(v, |k: AccessKey| fields(&key_fields(&k)))
}

fn key_fields(k: &AccessKey) -> Vec<(&'static str, String)> {
    let mut pairs = vec![("Access key", text(&k.access_key))];
    if let Some(name) = &k.name {
        pairs.push(("Name", opt(name.as_ref())));
    }
    if let Some(role) = &k.role {
        pairs.push(("Role", opt(role.as_ref())));
    }
    if let Some(enabled) = k.enabled {
        pairs.push(("State", key_state(enabled)));
    }
    pairs.push(("Concurrency", concurrency(k)));
    if let Some(created) = k.created_at {
        pairs.push(("Created", utc(created)));
    }
    pairs
}

/// The answer of `POST /v1/access-keys`: the key as [`access_key`] shows it with its
/// `Secret key`, then a note that the secret is shown only this once and is the key's token.
pub fn access_key_created(v: &Value) -> String {
    with(v, |k: NewAccessKey| {
        let mut pairs = key_fields(&k.key());
        pairs.insert(1, ("Secret key", text(&k.secret_key)));
        let mut out = fields(&pairs);
        out.push_str(
            "\nThe secret key is shown only this once: the manager keeps no copy it could show \
             again. Store it now. It is the key's token: kernelvisor ctl --token SECRET (or \
             KERNELVISOR_TOKEN=SECRET).\n",
        );
        out
    })
}

/// `GET /v1/access-keys` (`{"access_keys": [...]}`) as a table: ACCESS KEY, NAME, ROLE, STATE
/// (`enabled`/`disabled`), CONCURRENCY (`used/limit`), CREATED (UTC).
pub fn access_keys(v: &Value) -> String {
    with(v, |list: AccessKeyList| {
        let rows = list
            .access_keys
            .iter()
            .map(|k| {
                vec![
                    text(&k.access_key),
                    opt(k.name.clone().flatten()),
                    opt(k.role.clone().flatten()),
                    key_state(k.enabled.flatten()),
                    concurrency(k),
                    utc(k.created_at.flatten()),
                ]
            })
            .collect();
        table(
            vec![
                "ACCESS KEY",
                "NAME",
                "ROLE",
                "STATE",
                "CONCURRENCY",
                "CREATED",
            ],
            rows,
        )
    })
}

/// One vfolder (`{"name", "owner", "created_at"}`: the answer of `POST /v1/vfolders`) as
/// `key: value` lines, the creation time in UTC.
pub fn vfolder(v: &Value) -> String {
    with(v, |f: Vfolder| {
        fields(&[
            ("Vfolder", text(&f.name)),
            ("Owner", text(&f.owner)),
            ("Created", utc(f.created_at)),
        ])
    })
}

/// `GET /v1/vfolders` (`{"vfolders": [...]}`) as a table: NAME, OWNER (an access key),
/// CREATED (UTC).
pub fn vfolders(v: &Value) -> String {
    with(v, |list: VfolderList| {
        let rows = list
            .vfolders
            .iter()
            .map(|f| vec![text(&f.name), text(&f.owner), utc(f.created_at)])
            .collect();
        table(vec!["NAME", "OWNER", "CREATED"], rows)
    })
}

/// The answer of `DELETE /v1/vfolders/{name}`: `vfolder NAME deleted` (the name of the answer
/// when it has one, else `name`).
pub fn vfolder_deleted(v: &Value, name: &str) -> String {
    with(v, |f: Vfolder| {
        let name = if f.name.is_empty() { name } else { &f.name };
        format!("vfolder {name} deleted\n")
    })
}

/// `GET /health`: status, mode and the number of `ALIVE` agents.
pub fn health(v: &Value) -> String {
    with(v, |h: Health| {
        fields(&[
            ("Status", word(h.status.as_ref())),
            ("Mode", word(h.mode.as_ref())),
            ("Agents alive", opt(h.agents_alive)),
        ])
    })
}

/// A list of ports (`[8080, 8081]`) as `8080,8081`; empty as `-`.
fn ports(list: &[u16]) -> String {
    if list.is_empty() {
        "-".to_owned()
    } else {
        list.iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `GET /v1/sessions/{id}/services` (`{"services": [...]}`) as a table: NAME, PROTOCOL, STATUS,
/// CONTAINER-PORTS, HOST-PORTS (comma-separated), URL; in the manager's order.
pub fn services(v: &Value) -> String {
    with(v, |list: ServiceList| {
        let rows = list
            .services
            .iter()
            .map(|s| {
                vec![
                    text(&s.name),
                    text(&s.protocol),
                    text(&s.status),
                    ports(&s.container_ports),
                    ports(&s.host_ports),
                    opt(s.url.as_ref()),
                ]
            })
            .collect();
        table(
            vec![
                "NAME",
                "PROTOCOL",
                "STATUS",
                "CONTAINER-PORTS",
                "HOST-PORTS",
                "URL",
            ],
            rows,
        )
    })
}

/// The answer of `POST /v1/sessions/{id}/services/{name}`: `web started: URL`, or
/// `web already running: URL` when `started` is false (without a URL: no `: URL`). `name` is
/// used when the answer has none.
pub fn service_started(v: &Value, name: &str) -> String {
    with(v, |s: ServiceStarted| {
        let name = if s.name.is_empty() { name } else { &s.name };
        let what = if s.started == Some(false) {
            "already running"
        } else {
            "started"
        };
        match s.url.as_deref().filter(|u| !u.is_empty()) {
            Some(url) => format!("{name} {what}: {url}\n"),
            None => format!("{name} {what}\n"),
        }
    })
}

/// The answer of `DELETE /v1/sessions/{id}/services/{name}`: `web stopped`.
pub fn service_stopped(v: &Value, name: &str) -> String {
    with(v, |s: Service| {
        let name = if s.name.is_empty() { name } else { &s.name };
        format!("{name} stopped\n")
    })
}

/// `GET /v1/sessions/{id}/files` (`{"files": [...]}`) as a table sorted by name: MODE (as
/// `ls -l`: `drwxr-xr-x`), SIZE (bytes), MTIME (UTC), NAME (a directory's with a trailing `/`).
pub fn files(v: &Value) -> String {
    with(v, |mut list: FileList| {
        list.files.sort_by(|a, b| a.name.cmp(&b.name));
        let rows = list
            .files
            .iter()
            .map(|f| {
                let kind = f.file_type.as_deref();
                let mut shown = text(&f.name);
                if kind == Some("dir") {
                    shown.push('/');
                }
                vec![
                    file_mode(kind, f.mode.as_deref()),
                    opt(f.size),
                    utc(f.mtime),
                    shown,
                ]
            })
            .collect();
        table(vec!["MODE", "SIZE", "MTIME", "NAME"], rows)
    })
}

/// Which stream a piece of console output belongs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
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
pub(crate) mod tests {
    use super::*;
    use serde_json::json;

    const NOW: f64 = 1_700_000_000.0;

    #[test]
    fn scheduling_words() {
        let agent = |schedulable, draining, drain_deadline| Agent {
            schedulable,
            draining,
            drain_deadline,
            ..Agent::default()
        };
        assert_eq!(scheduling(&agent(true, false, None), NOW), "yes");
        assert_eq!(scheduling(&agent(false, false, None), NOW), "cordoned");
        assert_eq!(scheduling(&agent(false, true, None), NOW), "draining");
        assert_eq!(
            scheduling(&agent(false, true, Some(NOW + 90.0)), NOW),
            "draining (deadline in 1m)"
        );
        assert_eq!(
            scheduling(&agent(false, true, Some(NOW - 1.0)), NOW),
            "draining (deadline passed)"
        );
    }

    #[test]
    fn agents_table() {
        let v = json!({"agents": [
            {"agent_id": "i-node1", "status": "ALIVE", "addr": "tcp://10.0.0.5:6001", "region": "local",
             "version": "0.1.0", "slots_total": {"cpu": "8", "mem": "17179869184", "cuda.device": "0"},
             "slots_used": {"cpu": "1.500", "mem": "1610612736", "cuda.device": "0"},
             "kernels": 2, "last_heartbeat": NOW - 3.2, "schedulable": true, "draining": false,
             "drain_deadline": null},
            {"agent_id": "i-node2", "status": "PENDING", "addr": "tcp://10.0.0.6:6001",
             "slots_total": {"cpu": "4", "mem": "8589934592"}, "slots_used": {}, "kernels": 0,
             "last_heartbeat": null, "schedulable": false, "draining": true,
             "drain_deadline": NOW + 42.5}
        ]});
        let out = agents(&v, NOW);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 3, "{out}");
        for h in [
            "AGENT",
            "STATUS",
            "SCHEDULING",
            "ADDR",
            "CPU",
            "MEM",
            "KERNELS",
            "LAST HEARTBEAT",
        ] {
            assert!(lines[0].contains(h), "missing {h}: {out}");
        }
        assert!(
            !lines[0].contains("GPU"),
            "no GPU column without GPUs: {out}"
        );
        assert!(
            !out.contains('|') && !out.contains('─'),
            "borderless: {out}"
        );
        let row1: Vec<&str> = lines[1]
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            row1,
            [
                "i-node1",
                "ALIVE",
                "yes",
                "tcp://10.0.0.5:6001",
                "1.5/8",
                "1.5 GiB/16 GiB",
                "2",
                "3s ago"
            ]
        );
        let row2: Vec<&str> = lines[2]
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        assert_eq!(
            row2,
            [
                "i-node2",
                "PENDING",
                "draining (deadline in 42s)",
                "tcp://10.0.0.6:6001",
                "-/4",
                "-/8 GiB",
                "0",
                "-"
            ]
        );
        // Columns line up: every value starts where its header does.
        let col = lines[0].find("LAST HEARTBEAT").unwrap();
        assert_eq!(&lines[1][col..], "3s ago");
        assert!(
            lines.iter().all(|l| l == &l.trim_end()),
            "no trailing spaces: {out:?}"
        );
    }

    #[test]
    fn agents_gpu_column_when_present() {
        let v = json!({"agents": [{"agent_id": "g1", "status": "ALIVE", "addr": "a",
            "slots_total": {"cpu": "8", "mem": "1024", "cuda.device": "2"},
            "slots_used": {"cpu": "0", "mem": "0", "cuda.device": "1"}, "kernels": 1, "last_heartbeat": NOW - 90.0}]});
        let out = agents(&v, NOW);
        assert!(out.lines().next().unwrap().contains("GPU"), "{out}");
        assert!(
            out.contains("1/2") && out.contains("0 B/1 KiB") && out.contains("1m ago"),
            "{out}"
        );
    }

    #[test]
    fn agents_one_column_per_accelerator_slot() {
        let v = json!({"agents": [
            {"agent_id": "m1", "status": "ALIVE", "addr": "a",
             "slots_total": {"cpu": "8", "mem": "1024", "cuda.shares": "4", "npu.mem": "2147483648"},
             "slots_used": {"cpu": "1", "mem": "0", "cuda.shares": "1.25", "npu.mem": "1073741824"},
             "slot_types": {"cpu": "count", "mem": "bytes", "cuda.shares": "count", "npu.mem": "bytes"},
             "kernels": 2, "last_heartbeat": NOW},
            {"agent_id": "plain", "status": "ALIVE", "addr": "b",
             "slots_total": {"cpu": "4", "mem": "1024", "cuda.device": "0"},
             "slots_used": {"cpu": "0", "mem": "0", "cuda.device": "0"}, "kernels": 0,
             "last_heartbeat": NOW}
        ]});
        let out = agents(&v, NOW);
        let lines: Vec<&str> = out.lines().collect();
        assert!(
            lines[0].contains("CUDA.SHARES") && lines[0].contains("NPU.MEM"),
            "{out}"
        );
        // No agent has a GPU: no GPU column.
        assert!(!lines[0].contains("GPU"), "{out}");
        assert!(
            lines[1].contains("1.25/4") && lines[1].contains("1 GiB/2 GiB"),
            "{out}"
        );
        // An agent without the slot shows `-/-`.
        assert!(lines[2].contains("-/-"), "{out}");
    }

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
        assert!(agents(&json!({"agents": []}), NOW).starts_with("AGENT"));
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
    fn session_restart_policy_and_stages() {
        let mut s = live_session();
        s["restart_policy"] =
            json!({"mode": "on-failure", "max_restarts": 3, "window": 60, "backoff": 1});
        s["restart_count"] = json!(2);
        s["stages"] = json!([{"name": "image", "status": "ready", "restarts": 0, "setup_seconds": 0.1},
                             {"name": "container", "status": "setting-up", "restarts": 2, "setup_seconds": 0.5}]);
        let out = session(&s, NOW);
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
        let out = session(&s, NOW);
        assert!(
            !out.contains("Restarts") && !out.contains("Stages"),
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
    fn access_keys_and_vfolders() {
        let key = json!({"access_key": "AKUSER1", "role": "user", "name": "alice",
                         "concurrency_limit": 2, "concurrency_used": 1, "enabled": true,
                         "created_at": NOW});
        assert_eq!(
            access_key(&key),
            "Access key:  AKUSER1\nName:        alice\nRole:        user\nState:       enabled\n\
             Concurrency: 1/2\nCreated:     2023-11-14T22:13:20Z\n"
        );
        let mut created = key.clone();
        created["secret_key"] = json!("sk-0123");
        created["name"] = Value::Null;
        let out = access_key_created(&created);
        assert!(
            out.starts_with("Access key:  AKUSER1\nSecret key:  sk-0123\nName:        -\n"),
            "{out}"
        );
        assert!(out.contains("shown only this once"), "{out}");

        let mut admin = key.clone();
        admin["access_key"] = json!("AKADMIN");
        admin["role"] = json!("admin");
        admin["enabled"] = json!(false);
        admin["concurrency_limit"] = json!(0);
        admin["name"] = Value::Null;
        let out = access_keys(&json!({"access_keys": [key, admin]}));
        let rows: Vec<Vec<&str>> = out.lines().map(cells).collect();
        assert_eq!(
            rows,
            [
                vec![
                    "ACCESS KEY",
                    "NAME",
                    "ROLE",
                    "STATE",
                    "CONCURRENCY",
                    "CREATED"
                ],
                vec![
                    "AKUSER1",
                    "alice",
                    "user",
                    "enabled",
                    "1/2",
                    "2023-11-14T22:13:20Z"
                ],
                vec![
                    "AKADMIN",
                    "-",
                    "admin",
                    "disabled",
                    "1/unlimited",
                    "2023-11-14T22:13:20Z"
                ],
            ]
        );

        let folder = json!({"name": "data", "owner": "AKUSER1", "created_at": NOW});
        assert_eq!(
            vfolder(&folder),
            "Vfolder: data\nOwner:   AKUSER1\nCreated: 2023-11-14T22:13:20Z\n"
        );
        assert_eq!(
            vfolders(&json!({"vfolders": [folder]})),
            "NAME  OWNER    CREATED\ndata  AKUSER1  2023-11-14T22:13:20Z\n"
        );
        assert_eq!(vfolders(&json!({"vfolders": []})), "NAME  OWNER  CREATED\n");
        assert_eq!(vfolder_deleted(&Value::Null, "d"), "vfolder d deleted\n");
    }

    #[test]
    fn small_objects() {
        assert_eq!(
            access_key(
                &json!({"access_key": "AKIADEV", "concurrency_used": 1, "concurrency_limit": 0})
            ),
            "Access key:  AKIADEV\nConcurrency: 1/unlimited\n"
        );
        assert!(access_key(
            &json!({"access_key": "K", "concurrency_used": 2, "concurrency_limit": 3})
        )
        .ends_with("2/3\n"));
        assert_eq!(
            health(&json!({"status": "ok", "mode": "grace", "agents_alive": 2})),
            "Status:       ok\nMode:         grace\nAgents alive: 2\n"
        );
        assert_eq!(
            created(
                &json!({"session_id": "s", "kernel_id": "k", "agent_id": "a", "status": "RUNNING"})
            ),
            "Session: s\nKernel:  k\nAgent:   a\nStatus:  RUNNING\n"
        );
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
        // Unknown keys (a newer manager) are ignored.
        let out = health(&json!({"status": "ok", "mode": "normal", "agents_alive": 1, "new": 2}));
        assert!(out.starts_with("Status:"), "{out}");
    }

    /// A table line's cells (columns are separated by two or more spaces).
    pub(crate) fn cells(line: &str) -> Vec<&str> {
        line.split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect()
    }

    #[test]
    fn services_table() {
        let v = json!({"services": [
            {"name": "web", "protocol": "http", "container_ports": [8080], "host_ports": [30001],
             "status": "running", "url": "http://10.0.0.5:30001"},
            {"name": "ssh", "protocol": "tcp", "container_ports": [22, 2222], "host_ports": [],
             "status": "stopped", "url": null}
        ]});
        let out = services(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            cells(lines[0]),
            [
                "NAME",
                "PROTOCOL",
                "STATUS",
                "CONTAINER-PORTS",
                "HOST-PORTS",
                "URL"
            ]
        );
        assert_eq!(
            cells(lines[1]),
            [
                "web",
                "http",
                "running",
                "8080",
                "30001",
                "http://10.0.0.5:30001"
            ]
        );
        assert_eq!(
            cells(lines[2]),
            ["ssh", "tcp", "stopped", "22,2222", "-", "-"]
        );
        assert!(services(&json!({"services": []})).starts_with("NAME"));
    }

    #[test]
    fn service_lines() {
        let v = json!({"name": "web", "status": "running", "url": "http://h:1", "started": true});
        assert_eq!(service_started(&v, "x"), "web started: http://h:1\n");
        let v = json!({"name": "web", "url": "http://h:1", "started": false});
        assert_eq!(
            service_started(&v, "x"),
            "web already running: http://h:1\n"
        );
        assert_eq!(service_started(&json!({}), "x"), "x started\n");
        assert_eq!(
            service_stopped(&json!({"name": "web", "status": "stopped"}), "x"),
            "web stopped\n"
        );
    }

    #[test]
    fn files_table_sorted_with_dirs_marked() {
        let v = json!({"files": [
            {"name": "b.txt", "type": "file", "size": 12, "mode": "0644", "mtime": NOW},
            {"name": "a", "type": "dir", "size": 4096, "mode": "0755", "mtime": NOW - 60.5},
            {"name": "link", "type": "symlink", "size": 5, "mode": "0777", "mtime": NOW}
        ]});
        let out = files(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(cells(lines[0]), ["MODE", "SIZE", "MTIME", "NAME"]);
        assert_eq!(
            cells(lines[1]),
            ["drwxr-xr-x", "4096", "2023-11-14T22:12:19Z", "a/"]
        );
        assert_eq!(
            cells(lines[2]),
            ["-rw-r--r--", "12", "2023-11-14T22:13:20Z", "b.txt"]
        );
        assert_eq!(cells(lines[3])[3], "link");
        assert_eq!(lines.len(), 4);
        assert!(files(&json!({"files": []})).starts_with("MODE"));
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

//! The event stream end to end (`GET /v1/events`, `ctl events`, `ctl session show --watch`): a
//! manager process and an agent process (CURVE on), the real Docker engine, the real CLI binary.
//! - a session's statuses as they happen, in order, with reasons, on `ctl events -f` (user and
//!   admin keys) and on `ctl session show --watch`, which ends with the session;
//! - tenancy: a user key's stream never shows another key's sessions nor agent liveness; an
//!   admin's shows both, the agent's stop and return included;
//! - the filters (`session_id`, `agent_id`, `type`), `Last-Event-ID` resume, and bad values
//!   answered 400 (403 for a user asking for `agent_status`) with a message naming them.
//!
//! On SQLite and PostgreSQL (the store's `RETURNING` writes feed the stream). A slow reader being
//! dropped with a last event, in bounded memory, is tested over real HTTP where the hub can be
//! flooded: `manager::api::events`' unit tests.
//!
//! Agent host ports: 35200–35239.

use crate::common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::agent::TEST_IMAGE;
use common::cluster::{wait_exit, wait_for, Cluster, Db};
use kernelvisor::model::session::KernelStatus;
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(60);

fn ctl(c: &Cluster, token: &str) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kernelvisor"));
    cmd.arg("ctl")
        .arg("--api")
        .arg(&c.api)
        .env("KERNELVISOR_TOKEN", token);
    cmd
}

/// `ctl` run to its end: (exit code, stdout, stderr).
fn run(mut cmd: Command) -> (i32, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A running `ctl` whose stdout lines a thread collects as they come.
struct Lines {
    child: Child,
    rx: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Lines {
    fn spawn(mut cmd: Command) -> Lines {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines {
            child,
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits for a line that `f` accepts; fails naming every line seen.
    fn until(&mut self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let end = Instant::now() + LONG;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if f(&line) {
                        return line;
                    }
                }
                Err(_) => panic!(
                    "no line with {what} in {LONG:?}; seen:\n{}",
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// Every line seen so far, and those waiting, as JSON events (`-o json`).
    fn events(&mut self) -> Vec<Value> {
        self.seen.extend(self.rx.try_iter());
        self.seen
            .iter()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect()
    }
}

impl Drop for Lines {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `data:` of every frame of a server-sent events body, as JSON.
fn frames(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|f| f.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// `GET /v1/events?query` (not followed) with `token`: (status, body text).
fn events_http(c: &Cluster, token: &str, query: &str, last_id: Option<&str>) -> (u16, String) {
    let mut r = ureq::get(&format!("{}/v1/events?{query}", c.api))
        .timeout(Duration::from_secs(30))
        .set("Authorization", &Cluster::bearer(token));
    if let Some(id) = last_id {
        r = r.set("Last-Event-ID", id);
    }
    match r.call() {
        Ok(resp) => {
            assert_eq!(resp.content_type(), "text/event-stream");
            (resp.status(), resp.into_string().unwrap())
        }
        Err(ureq::Error::Status(code, resp)) => (code, resp.into_string().unwrap()),
        Err(e) => panic!("GET /v1/events?{query}: {e}"),
    }
}

fn subscribers(c: &Cluster) -> f64 {
    // The trailing space keeps `…_subscribers_dropped_total` out.
    c.manager_metric("kernelvisor_manager_event_subscribers ", "")
}

fn session(c: &Cluster, token: &str) -> String {
    let a = c.post_as(
        Some(token),
        "/v1/sessions",
        &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}}),
    );
    assert_eq!(a.status, 201, "create: {a:?}");
    a.body["session_id"].as_str().unwrap().to_owned()
}

/// The statuses of `sid`'s `session_status` events, in stream order, with their reasons.
fn statuses(events: &[Value], sid: &str) -> Vec<(String, Option<String>)> {
    events
        .iter()
        .filter(|e| e["type"] == "session_status" && e["session_id"] == sid)
        .map(|e| {
            (
                e["status"].as_str().unwrap().to_owned(),
                e["reason"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

/// A session's life seen in order: `SCHEDULED` (placed) first, `RUNNING`, `TERMINATED` with the
/// reason last, every status a step forward.
fn assert_life(seen: &[(String, Option<String>)], reason: &str) {
    let names: Vec<&str> = seen.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(names.first(), Some(&"SCHEDULED"), "{seen:?}");
    assert!(names.contains(&"RUNNING"), "{seen:?}");
    assert_eq!(
        seen.last().map(|(s, r)| (s.as_str(), r.as_deref())),
        Some(("TERMINATED", Some(reason))),
        "{seen:?}"
    );
    let ranks: Vec<u8> = names
        .iter()
        .map(|s| KernelStatus::parse(s).unwrap().rank())
        .collect();
    assert!(
        ranks.windows(2).all(|w| w[0] < w[1]),
        "each status a step forward, none twice: {seen:?}"
    );
}

fn events_end_to_end(db: Db, ports: u16) {
    let mut c = Cluster::new(db);
    c.start_manager();
    let a = c.add_agent("events", ports, "");
    let agent = c.agents[a].id().to_owned();
    c.wait_agent_status(&agent, "ALIVE", LONG);
    wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    let (user, admin) = (c.token.clone(), c.admin_token.clone());
    let (_, other) = c.new_key(false);

    // Followers first: the user's and the admin's.
    let mut mine = Lines::spawn({
        let mut cmd = ctl(&c, &user);
        cmd.args(["events", "-f", "-o", "json"]);
        cmd
    });
    let mut all = Lines::spawn({
        let mut cmd = ctl(&c, &admin);
        cmd.args(["-o", "json", "events", "--follow"]);
        cmd
    });
    wait_for(LONG, "two followers", || {
        (subscribers(&c) == 2.0).then_some(())
    });

    // The user's session and the other key's, each through its whole life.
    let sid = session(&c, &user);
    mine.until("RUNNING", |l| l.contains(&sid) && l.contains("\"RUNNING\""));
    let mut watch = Lines::spawn({
        let mut cmd = ctl(&c, &user);
        // By a prefix of its id, as the session routes take one.
        cmd.args(["session", "show", &sid[..8], "--watch"]);
        cmd
    });
    watch.until("the session shown", |l| l.contains("RUNNING"));
    watch.until("the watch's header", |l| l.starts_with("TIME"));
    let theirs = session(&c, &other);
    assert_eq!(c.delete(&format!("/v1/sessions/{sid}")).status, 200);
    assert_eq!(
        c.delete_as(Some(&other), &format!("/v1/sessions/{theirs}"))
            .status,
        200
    );
    mine.until("TERMINATED", |l| {
        l.contains(&sid) && l.contains("TERMINATED")
    });
    all.until("their TERMINATED", |l| {
        l.contains(&theirs) && l.contains("TERMINATED")
    });

    // The watch printed the end, with its reason, and exited by itself.
    let last = watch.until("TERMINATED", |l| l.contains("TERMINATED"));
    assert!(
        last.contains("session_status") && last.contains(&sid) && last.contains("user-requested"),
        "{last}"
    );
    assert!(
        wait_exit(&mut watch.child, Duration::from_secs(20)),
        "watch ends with the session"
    );
    assert_eq!(watch.child.wait().unwrap().code(), Some(0));

    // In order, with reasons, and what each key may see.
    let mine_events = mine.events();
    assert_life(&statuses(&mine_events, &sid), "user-requested");
    assert!(
        mine_events
            .iter()
            .all(|e| e["session_id"] != theirs.as_str()),
        "the user's stream shows another key's session"
    );
    assert!(
        mine_events.iter().all(|e| e["type"] != "agent_status"),
        "agent liveness is for admins"
    );
    let ids: Vec<u64> = mine_events
        .iter()
        .map(|e| e["id"].as_u64().unwrap())
        .collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase: {ids:?}");
    let all_events = all.events();
    assert_life(&statuses(&all_events, &sid), "user-requested");
    assert_life(&statuses(&all_events, &theirs), "user-requested");
    assert!(
        all_events.iter().any(|e| e["type"] == "agent_status"
            && e["agent_id"] == agent.as_str()
            && e["status"] == "ALIVE"),
        "the admin sees the agent come: {all_events:?}"
    );
    for e in all_events.iter().filter(|e| e["type"] == "session_status") {
        assert_eq!(e["agent_id"], agent.as_str(), "{e}");
        assert!(
            e["kernel_id"].is_string() && e["access_key"].is_string(),
            "{e}"
        );
    }

    // Without -f: the recent events, a table, then exit.
    let (code, table, err) = run({
        let mut cmd = ctl(&c, &user);
        cmd.arg("events");
        cmd
    });
    assert_eq!(code, 0, "{err}");
    assert!(table.starts_with("TIME"), "{table}");
    let end = table
        .lines()
        .find(|l| l.contains(&sid) && l.contains("TERMINATED"))
        .unwrap_or_else(|| panic!("{table}"));
    assert!(
        end.contains("session_status") && end.contains("user-requested"),
        "{end}"
    );
    assert!(!table.contains(&theirs), "{table}");

    filters(&c, &sid, &theirs, &agent);

    // Agent liveness as it changes, for the admin only: a clean stop, then back.
    c.stop_agent(a);
    let stopped = all.until("the agent TERMINATED", |l| {
        l.contains("\"agent_status\"") && l.contains("\"TERMINATED\"")
    });
    assert!(
        stopped.contains(&agent) && stopped.contains("\"terminated\""),
        "{stopped}"
    );
    c.start_agent(a);
    let back = all.until("the agent ALIVE again", |l| {
        l.contains("\"agent_status\"") && l.contains("\"ALIVE\"") && l.contains("heard-from")
    });
    assert!(back.contains(&agent), "{back}");
    assert!(
        mine.events().iter().all(|e| e["type"] != "agent_status"),
        "agent liveness is for admins"
    );
    c.check_invariants();
}

/// The filters, `Last-Event-ID`, and bad values, over HTTP and through the CLI.
fn filters(c: &Cluster, sid: &str, theirs: &str, agent: &str) {
    let (user, admin) = (c.token.as_str(), c.admin_token.as_str());
    let (status, body) = events_http(c, admin, &format!("session_id={sid}"), None);
    assert_eq!(status, 200);
    let only = frames(&body);
    assert!(only.len() >= 3, "{body}");
    assert!(only.iter().all(|e| e["session_id"] == sid), "{body}");
    // By its kernel id too.
    let kid = only[0]["kernel_id"].as_str().unwrap();
    let (_, by_kernel) = events_http(c, admin, &format!("session_id={kid}"), None);
    assert_eq!(frames(&by_kernel), only);
    // By a prefix of its id; a prefix of nobody's is 404.
    let (_, by_prefix) = events_http(c, admin, &format!("session_id={}", &sid[..8]), None);
    assert_eq!(frames(&by_prefix), only);
    let (status, body) = events_http(c, user, &format!("session_id={}", &theirs[..8]), None);
    assert_eq!(status, 404, "another key's session by prefix: {body}");
    assert!(body.contains("session-not-found"), "{body}");
    // A user asking for another key's session sees nothing of it.
    let (status, body) = events_http(c, user, &format!("session_id={theirs}"), None);
    assert_eq!((status, frames(&body).len()), (200, 0), "{body}");

    let (_, body) = events_http(c, admin, "type=agent_status", None);
    let liveness = frames(&body);
    assert!(!liveness.is_empty() && liveness.iter().all(|e| e["type"] == "agent_status"));
    let (_, body) = events_http(
        c,
        admin,
        &format!("agent_id={agent}&type=session_status"),
        None,
    );
    let on_agent = frames(&body);
    assert!(on_agent.len() >= 6, "both sessions' statuses: {body}");
    assert!(on_agent
        .iter()
        .all(|e| e["agent_id"] == agent && e["type"] == "session_status"));
    let (_, body) = events_http(c, admin, "agent_id=no-such-agent", None);
    assert!(frames(&body).is_empty(), "{body}");

    // Resume after the session's first event: the rest of it.
    let first = only[0]["id"].as_u64().unwrap();
    let (_, body) = events_http(
        c,
        admin,
        &format!("session_id={sid}"),
        Some(&first.to_string()),
    );
    let rest = frames(&body);
    assert_eq!(rest, only[1..], "resumed after id {first}");

    for (token, query, code, words) in [
        (
            admin,
            "type=bogus",
            400,
            "type `bogus` is not an event type",
        ),
        (admin, "session_id=nope", 400, "session_id `nope` is not"),
        (admin, "session_id=abc", 400, "at least 4 hex digits"),
        (admin, "agent_id=", 400, "agent_id is empty"),
        (admin, "follow=maybe", 400, ""),
        (admin, "colour=red", 400, "colour"),
        (
            user,
            "type=agent_status",
            403,
            "agent_status events are for admin keys",
        ),
    ] {
        let (status, body) = events_http(c, token, query, None);
        let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{query}: {body}"));
        let expected = if code == 400 {
            "invalid-request"
        } else {
            "forbidden"
        };
        assert_eq!(
            (status, v["error"]["code"].as_str()),
            (code, Some(expected)),
            "{query}: {body}"
        );
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{query}: {message}");
    }
    let (status, body) = events_http(c, admin, "", Some("yesterday"));
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("Last-Event-ID"), "{body}");

    // The CLI: a filter, and a bad one's error.
    let (code, out, err) = run({
        let mut cmd = ctl(c, admin);
        cmd.args([
            "-o",
            "json",
            "events",
            "--type",
            "agent_status",
            "--agent",
            agent,
        ]);
        cmd
    });
    assert_eq!(code, 0, "{err}");
    assert!(
        out.lines().count() >= 1 && out.lines().all(|l| l.contains("\"agent_status\"")),
        "{out}"
    );
    let (code, _, err) = run({
        let mut cmd = ctl(c, user);
        cmd.args(["events", "--type", "agent_status"]);
        cmd
    });
    assert_eq!(code, 1);
    assert!(
        err.contains("forbidden") && err.contains("HTTP 403"),
        "{err}"
    );
    let (code, _, err) = run({
        let mut cmd = ctl(c, user);
        cmd.args(["events", "--session", "nope"]);
        cmd
    });
    assert_eq!(code, 1);
    assert!(
        err.contains("invalid-request") && err.contains("session_id `nope`"),
        "{err}"
    );
}

#[test]
fn events_end_to_end_sqlite() {
    events_end_to_end(Db::Sqlite, 35200);
}

#[test]
fn events_end_to_end_postgres() {
    events_end_to_end(Db::Postgres, 35220);
}

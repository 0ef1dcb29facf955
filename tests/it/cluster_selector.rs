//! Issue 40, "users see one session": the kernel selector of a cluster session, on a manager
//! process and an agent process (the `kernelvisor` binary, CURVE on), the real Docker engine and
//! the test image, through the HTTP API and `kernelvisor ctl`.
//!
//! A single-node cluster of 2 (`main1`, `sub1`):
//! - `execute` runs in `main1` by default, in `sub1` with `"kernel": "sub1"` or sub1's kernel id
//!   (each kernel answers its own `BACKENDAI_CLUSTER_HOST`);
//! - a file uploaded with `?kernel=sub1` is in sub1's `/home/work` only (download and listing
//!   of `sub1` have it, `main1`'s do not);
//! - a selector naming no kernel of the session is 404 `session-not-found` naming it, on every
//!   kind of route;
//! - `ctl session show` lists both kernels, `ctl sessions` the size, `ctl session exec
//!   --kernel`, `ls --kernel` and `cp --kernel` act in `sub1`;
//! - once `sub1` has ended (its container killed), a route selecting it is 409
//!   `session-not-running` for that kernel, and the session ends whole: `ctl session show
//!   --watch` prints each kernel's end naming the kernel and exits once both have ended; each
//!   kernel's events carry the session's id and its own kernel id (`/v1/events?session_id=`
//!   with the session id gives every kernel's, with sub1's kernel id sub1's alone).
//!
//! Agent host ports: 43000–43019.

use crate::common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::agent::TEST_IMAGE;
use common::cluster::{wait_exit, wait_for, Cluster, Db};
use serde_json::{json, Value};

const LONG: Duration = Duration::from_secs(90);

/// `kernelvisor ctl ARGS` as the cluster's user: (exit code, stdout, stderr).
fn ctl(c: &Cluster, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .arg("ctl")
        .arg("--api")
        .arg(&c.api)
        .args(args)
        .env("KERNELVISOR_TOKEN", &c.token)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `method path` with a raw body (or none) as the cluster's user: (status, body as JSON or
/// `Null`, body as bytes).
fn raw(c: &Cluster, method: &str, path: &str, data: Option<&[u8]>) -> (u16, Value, Vec<u8>) {
    let r = ureq::request(method, &format!("{}{path}", c.api))
        .set("Authorization", &c.auth())
        .timeout(LONG);
    let sent = match data {
        Some(d) => r.send_bytes(d),
        None => r.call(),
    };
    let resp = match sent {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{method} {path}: {e}"),
    };
    let status = resp.status();
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut resp.into_reader(), &mut bytes).unwrap();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, json, bytes)
}

#[test]
fn a_selector_acts_in_one_kernel_of_a_cluster_session() {
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra = "sweep-interval = 1".into();
    c.start_manager();
    let a = c.add_agent("cl-select", 43000, "");
    let agent = c.agents[a].id().to_owned();
    c.wait_agent_status(&agent, "ALIVE", LONG);
    let created = c.post(
        "/v1/sessions",
        &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "32m"},
                "cluster_size": 2, "cluster_mode": "single-node"}),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let sid = created.body["session_id"].as_str().unwrap().to_owned();
    let s = wait_for(LONG, "the cluster RUNNING", || {
        let s = c.get(&format!("/v1/sessions/{sid}")).ok()?.body;
        (s["status"] == "RUNNING").then_some(s)
    });
    let sub1_id = s["kernels"][1]["kernel_id"].as_str().unwrap().to_owned();
    assert_eq!(s["kernels"][1]["cluster_hostname"], "sub1", "{s}");

    // execute: main1 by default, sub1 by host name or kernel id.
    let host = "echo $BACKENDAI_CLUSTER_HOST";
    assert_eq!(c.execute(&sid, None, host).unwrap(), ("main1\n".into(), 0));
    assert_eq!(
        c.execute(&sid, Some("main1"), host).unwrap(),
        ("main1\n".into(), 0)
    );
    assert_eq!(
        c.execute(&sid, Some("sub1"), host).unwrap(),
        ("sub1\n".into(), 0)
    );
    assert_eq!(
        c.execute(&sid, Some(&sub1_id), host).unwrap(),
        ("sub1\n".into(), 0)
    );

    // Files: sub1's /home/work is its own.
    let files = format!("/v1/sessions/{sid}/files");
    let (st, body, _) = raw(
        &c,
        "PUT",
        &format!("{files}/mark.txt?kernel=sub1"),
        Some(b"in sub1"),
    );
    assert_eq!(st, 201, "{body}");
    let (st, _, bytes) = raw(&c, "GET", &format!("{files}/mark.txt?kernel=sub1"), None);
    assert_eq!((st, bytes.as_slice()), (200, &b"in sub1"[..]));
    let (st, body, _) = raw(&c, "GET", &format!("{files}/mark.txt"), None);
    assert_eq!(
        (st, body["error"]["code"].as_str()),
        (404, Some("file-not-found")),
        "{body}"
    );
    let names = |kernel: &str| -> Vec<String> {
        let (st, body, _) = raw(&c, "GET", &format!("{files}?dir=&kernel={kernel}"), None);
        assert_eq!(st, 200, "{body}");
        body["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(names("sub1").contains(&"mark.txt".to_owned()));
    assert!(!names("main1").contains(&"mark.txt".to_owned()));
    let (st, _, _) = raw(
        &c,
        "GET",
        &format!("/v1/sessions/{sid}/logs?kernel=sub1"),
        None,
    );
    assert_eq!(st, 200);

    // A selector naming no kernel of the session: 404 naming it, on every kind of route.
    let (st, body) = c.execute(&sid, Some("sub2"), host).unwrap_err();
    assert_eq!(
        (st, body["error"]["code"].as_str()),
        (404, Some("session-not-found"))
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("no kernel `sub2` (its kernels: main1, sub1;"),
        "{message}"
    );
    for path in [
        format!("{files}/mark.txt?kernel=sub2"),
        format!("{files}?kernel=sub2"),
        format!("/v1/sessions/{sid}/logs?kernel=sub2"),
        format!("/v1/sessions/{sid}/services?kernel=sub2"),
    ] {
        let (st, body, _) = raw(&c, "GET", &path, None);
        assert_eq!(
            (st, body["error"]["code"].as_str()),
            (404, Some("session-not-found")),
            "{path}: {body}"
        );
    }

    // ctl: the session's kernels, and --kernel.
    let (code, out, err) = ctl(&c, &["session", "show", &sid]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Cluster:    2 kernels, single-node\n"),
        "{out}"
    );
    let rows: Vec<Vec<&str>> = out
        .split_once("\nKernels:\n")
        .expect("a kernels table")
        .1
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["HOST", "ROLE", "KERNEL", "AGENT", "STATUS", "SERVICES"],
        "{out}"
    );
    assert_eq!(
        rows[2][..5],
        ["sub1", "sub", sub1_id.as_str(), agent.as_str(), "RUNNING"],
        "{out}"
    );
    let (code, out, err) = ctl(&c, &["sessions"]);
    assert_eq!(code, 0, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with(&sid))
        .unwrap_or_default();
    assert!(line.contains("2 single-node"), "{out}");
    let (code, out, err) = ctl(&c, &["session", "exec", "--kernel", "sub1", &sid, host]);
    assert_eq!((code, out.as_str()), (0, "sub1\n"), "{err}");
    let (code, out, _) = ctl(&c, &["session", "ls", "--kernel", "sub1", &sid]);
    assert!(code == 0 && out.contains("mark.txt"), "{out}");
    let (code, out, err) = ctl(
        &c,
        &[
            "session",
            "cp",
            "--kernel",
            "sub1",
            &format!("{sid}:mark.txt"),
            "-",
        ],
    );
    assert_eq!((code, out.as_str()), (0, "in sub1"), "{err}");
    let (code, _, err) = ctl(&c, &["session", "exec", "--kernel", "sub9", &sid, host]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("session-not-found") && err.contains("sub9"),
        "{err}"
    );

    // sub1 ends (its container killed): a route selecting it is 409 for that kernel. A
    // `session show --watch` follows it: one line per kernel's change, naming the kernel, until
    // the last kernel has ended.
    let mut watch = Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .args(["ctl", "--api", &c.api, "session", "show", "--watch", &sid])
        .env("KERNELVISOR_TOKEN", &c.token)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It has read the session (and subscribed before that) once the table's header is out.
    let mut shown = BufReader::new(watch.stdout.take().unwrap());
    let mut before = String::new();
    while !before.contains("REASON") {
        assert_ne!(shown.read_line(&mut before).unwrap(), 0, "{before}");
    }
    let killed = Command::new("docker")
        .args(["kill", &format!("kernel.{sub1_id}")])
        .output()
        .unwrap();
    assert!(killed.status.success(), "{killed:?}");
    wait_for(LONG, "sub1 TERMINATED", || {
        let s = c.get(&format!("/v1/sessions/{sid}")).ok()?.body;
        (s["kernels"][1]["status"] == "TERMINATED").then_some(())
    });
    let (st, body, _) = raw(&c, "GET", &format!("{files}?kernel=sub1"), None);
    assert_eq!(
        (st, body["error"]["code"].as_str()),
        (409, Some("session-not-running")),
        "{body}"
    );
    assert_eq!(
        body["error"]["message"],
        format!("session `{sid}`'s kernel `sub1` is TERMINATED, not RUNNING")
    );
    let (st, body) = c.execute(&sid, Some("sub1"), host).unwrap_err();
    assert_eq!(
        (st, body["error"]["code"].as_str()),
        (409, Some("session-not-running"))
    );
    // The session ends whole; nothing is left.
    wait_for(LONG, "the session TERMINATED", || {
        let s = c.get(&format!("/v1/sessions/{sid}")).ok()?.body;
        (s["status"] == "TERMINATED").then_some(())
    });
    assert!(
        wait_exit(&mut watch, LONG),
        "the watch ends with the session"
    );
    assert!(watch.wait().unwrap().success());
    let mut lines = String::new();
    shown.read_to_string(&mut lines).unwrap();
    let ended: Vec<Vec<&str>> = lines
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.get(3) == Some(&"TERMINATED"))
        .collect();
    let hosts: BTreeSet<&str> = ended.iter().map(|w| w[2]).collect();
    assert_eq!(hosts, BTreeSet::from(["main1", "sub1"]), "{before}{lines}");

    // Each kernel's status events carry the session's id and its own kernel id:
    // `?session_id=` with the session id gives every kernel's, with a kernel's id that
    // kernel's alone.
    let events_of = |id: &str| -> Vec<Value> {
        let (st, _, stream) = raw(&c, "GET", &format!("/v1/events?session_id={id}"), None);
        assert_eq!(st, 200);
        String::from_utf8(stream)
            .unwrap()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .map(|d| serde_json::from_str(d).unwrap())
            .collect()
    };
    let main1_id = s["kernels"][0]["kernel_id"].as_str().unwrap();
    let ended = |events: &[Value], kernel: &str| {
        events.iter().any(|e| {
            e["kernel_id"] == kernel
                && e["session_id"] == sid.as_str()
                && e["status"] == "TERMINATED"
        })
    };
    let whole = events_of(&sid);
    assert!(
        ended(&whole, main1_id) && ended(&whole, &sub1_id),
        "{whole:?}"
    );
    assert!(
        whole.iter().all(|e| e["session_id"] == sid.as_str()),
        "{whole:?}"
    );
    let one = events_of(&sub1_id);
    assert!(ended(&one, &sub1_id), "{one:?}");
    assert!(
        one.iter().all(|e| e["kernel_id"] == sub1_id.as_str()),
        "{one:?}"
    );
    c.check_invariants();
}

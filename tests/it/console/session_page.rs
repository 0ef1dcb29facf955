//! Issue 42, the session page (`#/sessions/<id>`) in a real headless Chromium against a manager
//! process and an agent process on the real Docker engine:
//!
//! - a session whose command prints a numbered line every 0.5 s: its logs follow while it runs
//!   (a later line appears, the session still RUNNING, no reload), a log line carrying
//!   `<script>` is text; its status timeline is the API's kept events (status and reason each),
//!   and a change made meanwhile (its end) is added live; its services are listed with their
//!   `url` as a link (new tab, `noopener`), started and stopped with the page's buttons (the
//!   link then serves), a failing one shows the API's `service-failed`; its files are listed,
//!   a directory opened and left, a file uploaded from the browser (named `<script>…`, shown
//!   as text) has the same bytes through the API, downloaded through the page has the same
//!   bytes again, and a symlink out of /home/work shows the API's `invalid-path`;
//! - a cluster session of two kernels: the kernel selector sends the run box, the terminal, the
//!   files and the logs to `sub1`; the timeline names each kernel; a terminal refused (the
//!   session ended) says why.
//!
//! No console errors in either. Screenshots: `session-timeline`, `session-services`,
//! `session-files`, `session-cluster`.
//!
//! Agent host ports: 44500–44599 (20 from 44500 and 44520).

use crate::common;

use std::io::Read;

use common::agent::TEST_IMAGE;
use common::browser::{Browser, LONG};
use common::cluster::{wait_for, Cluster};
use serde_json::{json, Value};

use super::cluster;

const SERVICES_IMAGE: &str = "kernelvisor-test:services";

/// The session's kept `session_status` events, as the API gives them (history, not followed).
fn kept_events(c: &Cluster, sid: &str) -> Vec<Value> {
    let r = ureq::get(&format!(
        "{}/v1/events?session_id={sid}&type=session_status",
        c.api
    ))
    .set("Authorization", &c.auth())
    .timeout(LONG)
    .call()
    .unwrap();
    r.into_string()
        .unwrap()
        .split("\n\n")
        .filter_map(|frame| {
            let data: String = frame
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(str::trim_start)
                .collect();
            serde_json::from_str(&data).ok()
        })
        .collect()
}

/// A file of the session's kernel through the API: (status, bytes).
fn file_bytes(c: &Cluster, sid: &str, path: &str) -> (u16, Vec<u8>) {
    let r = ureq::get(&format!("{}/v1/sessions/{sid}/files/{path}", c.api))
        .set("Authorization", &c.auth())
        .timeout(LONG)
        .call();
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    let status = resp.status();
    let mut v = Vec::new();
    resp.into_reader().read_to_end(&mut v).unwrap();
    (status, v)
}

/// The names in a directory of the session's kernel, through the API.
fn names(c: &Cluster, sid: &str, query: &str) -> Vec<String> {
    let a = c.get(&format!("/v1/sessions/{sid}/files?{query}")).unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    a.body["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["name"].as_str().unwrap().to_owned())
        .collect()
}

/// Records the Blobs the page makes object URLs of (its downloads), for the test to read.
const CATCH_BLOBS: &str = "window.kvBlobs = []; const make = URL.createObjectURL.bind(URL); \
     URL.createObjectURL = (b) => { window.kvBlobs.push(b); return make(b); }; return null";

/// The bytes of the page's `i`-th download.
fn downloaded(b: &Browser, i: usize) -> Vec<u8> {
    b.js(&format!(
        "window.kvBytes = null; window.kvBlobs[{i}].arrayBuffer()\
         .then((a) => {{ window.kvBytes = Array.from(new Uint8Array(a)); }}); return null"
    ));
    let v = wait_for(LONG, "the downloaded blob read", || {
        Some(b.js("return window.kvBytes")).filter(|v| !v.is_null())
    });
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_u64().unwrap() as u8)
        .collect()
}

#[test]
fn the_session_page_follows_logs_and_shows_its_timeline_services_and_files() {
    let (c, agent) = cluster("console-session", 44500);
    // The only agent cordoned: the session waits first, with its reason.
    let cordon = c.post_as(
        Some(&c.admin_token),
        &format!("/v1/agents/{agent}/cordon"),
        &json!({}),
    );
    assert_eq!(cordon.status, 200, "{cordon:?}");
    let command = "echo '<script>window.kvInjected = 1</script> in the log'; i=0; \
                   while :; do i=$((i+1)); echo \"line $i\"; sleep 0.5; done";
    let created = c.post(
        "/v1/sessions",
        &json!({"image": SERVICES_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"},
                "command": command}),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let sid = created.body["session_id"].as_str().unwrap().to_owned();

    let mut b = super::session_page(&c, &sid);
    b.wait_text("#session-status", "the session waiting", |t| t == "PENDING");
    b.js("window.kvSamePage = 'yes'; return null");
    b.wait_text(
        "#timeline li[data-status='PENDING']",
        "its wait in the timeline, with the reason",
        |t| t.contains("agents-cordoned"),
    );
    // Uncordoned: the timeline follows it to RUNNING live.
    let uncordon = c.post_as(
        Some(&c.admin_token),
        &format!("/v1/agents/{agent}/uncordon"),
        &json!({}),
    );
    assert_eq!(uncordon.status, 200, "{uncordon:?}");
    b.wait_text("#session-status", "the session RUNNING", |t| t == "RUNNING");
    b.wait_text(
        "#timeline li[data-status='RUNNING']",
        "RUNNING in the timeline, live",
        |t| t.contains("RUNNING"),
    );
    b.wait_text(
        "#timeline li[data-status='SCHEDULED']",
        "its admission in the timeline, with the reason",
        |t| t.contains("admitted") || t.contains("placed"),
    );

    // Logs follow while it prints: a line printed after the first one seen appears, the
    // session still RUNNING, the page not reloaded.
    let first = b.wait_text("#logs", "the first numbered lines", |t| {
        t.contains("line 2\n")
    });
    let seen = first
        .lines()
        .filter_map(|l| l.strip_prefix("line ")?.trim().parse::<u32>().ok())
        .max()
        .unwrap();
    let later = format!("line {}", seen + 4);
    b.wait_text("#logs", "a later line, followed", |t| {
        t.lines().any(|l| l.trim() == later)
    });
    assert_eq!(b.text("#session-status").as_deref(), Some("RUNNING"));
    let s = c.get(&format!("/v1/sessions/{sid}")).unwrap();
    assert_eq!(s.body["status"], "RUNNING", "{s:?}");
    assert_eq!(b.js("return window.kvSamePage"), json!("yes"), "no reload");
    // Its `<script>` line is text: no element made of it, nothing run.
    let logs = b.text("#logs").unwrap_or_default();
    assert!(
        logs.contains("<script>window.kvInjected = 1</script> in the log"),
        "{logs}"
    );
    assert_eq!(b.count("#logs *"), 0, "the log holds text only");
    assert_eq!(b.js("return window.kvInjected === undefined"), json!(true));

    // The timeline: every kept status change of the session, with its reason.
    let kept = kept_events(&c, &sid);
    assert!(
        kept.iter().any(|e| e["status"] == "RUNNING"),
        "the API keeps its RUNNING: {kept:#?}"
    );
    for e in &kept {
        let item = format!("#timeline li[data-event='{}']", e["id"]);
        let text = b.wait_text(&item, "a kept status change in the timeline", |t| {
            !t.is_empty()
        });
        let status = e["status"].as_str().unwrap();
        let reason = e["reason"].as_str().unwrap_or("");
        assert!(
            text.contains(status) && text.contains(reason),
            "{item}: {text:?} for {e}"
        );
    }
    assert_eq!(b.count("#timeline li"), kept.len(), "{kept:#?}");
    let statuses: Vec<String> = kept
        .iter()
        .map(|e| e["status"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(statuses.first().map(String::as_str), Some("PENDING"));
    assert_eq!(statuses.last().map(String::as_str), Some("RUNNING"));
    b.js("document.getElementById('timeline').closest('section').scrollIntoView(); return null");
    b.screenshot("session-timeline");

    // Services: listed with their URL as a link to a new tab, started and stopped here.
    let api_services = c.get(&format!("/v1/sessions/{sid}/services")).unwrap();
    assert_eq!(api_services.status, 200, "{api_services:?}");
    let web_url = api_services.body["services"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "web")
        .unwrap()["url"]
        .as_str()
        .unwrap()
        .to_owned();
    let web = "#services tr[data-service='web']";
    b.wait_text(
        &format!("{web} .service-status"),
        "web listed stopped",
        |t| t == "stopped",
    );
    assert_eq!(
        b.js(&format!(
            "const a = document.querySelector(\"{web} a.service-link\"); \
             return [a.getAttribute('href'), a.target, a.rel, a.textContent]"
        )),
        json!([
            format!("{web_url}/"),
            "_blank",
            "noopener noreferrer",
            web_url
        ])
    );
    b.click(&format!("{web} button.service-start"));
    b.wait_text(&format!("{web} .service-status"), "web running", |t| {
        t == "running"
    });
    let served = ureq::get(&format!("{web_url}/"))
        .timeout(LONG)
        .call()
        .map(|r| r.status());
    assert!(
        matches!(served, Ok(_) | Err(ureq::Error::Status(..))),
        "the link serves: {served:?}"
    );
    // A service that fails: the API's refusal in the box.
    b.click("#services tr[data-service='broken'] button.service-start");
    b.wait_text("#services-error", "the broken service's refusal", |t| {
        t.contains("service-failed") && t.contains("409")
    });
    b.js("document.getElementById('services').closest('section').scrollIntoView(); return null");
    b.screenshot("session-services");
    b.click(&format!("{web} button.service-stop"));
    b.wait_text(&format!("{web} .service-status"), "web stopped", |t| {
        t == "stopped"
    });

    // Files: a directory made in the kernel opens and is left.
    let made = c
        .execute(
            &sid,
            None,
            "mkdir -p sub/inner && echo deep > sub/inner/deep.txt && ln -s /etc out",
        )
        .unwrap();
    assert_eq!(made.1, 0, "{made:?}");
    b.click("#files-refresh");
    b.wait_text("#files tr[data-file='sub']", "the directory listed", |t| {
        t.contains("dir")
    });
    b.click("#files tr[data-file='sub'] button.file-dir");
    b.wait_text("#files-dir", "the directory opened", |t| {
        t == "/home/work/sub"
    });
    b.wait_text("#files tr[data-file='inner']", "its entry", |t| {
        t.contains("dir")
    });
    b.click("#files-up");
    b.wait_text("#files-dir", "back home", |t| t == "/home/work");

    // A symlink out of /home/work: the API's invalid-path in the box.
    b.wait_text("#files tr[data-file='out']", "the symlink listed", |t| {
        t.contains("symlink")
    });
    b.click("#files tr[data-file='out'] button.file-dir");
    b.wait_text("#files-error", "the API's invalid-path", |t| {
        t.contains("invalid-path") && t.contains("400")
    });
    b.click("#files-up");
    b.wait_text("#files tr[data-file='sub']", "home listed again", |t| {
        t.contains("dir")
    });

    // Upload from the browser: a file named `<script>…` with every byte value.
    let name = "<script>kv.bin";
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 256) as u8).collect();
    let local = c.dir.path().join(name);
    std::fs::write(&local, &data).unwrap();
    b.type_keys("#files-upload", local.to_str().unwrap());
    b.wait_text("#files-status", "the upload done", |t| {
        t == format!("uploaded {name} (4 KiB)")
    });
    let row = format!("#files tr[data-file='{name}']");
    b.wait_text(&row, "the uploaded file listed", |t| t.contains(name));
    assert_eq!(b.count("#files script"), 0, "the name is text");
    let (st, got) = file_bytes(&c, &sid, "%3Cscript%3Ekv.bin");
    assert_eq!((st, got.len()), (200, data.len()));
    assert!(got == data, "the uploaded bytes");

    // Download through the page: the same bytes, the token in no URL.
    b.js(CATCH_BLOBS);
    b.click(&format!("{row} button.file-download"));
    b.wait_text("#files-status", "the download done", |t| {
        t == format!("downloaded {name} (4 KiB)")
    });
    assert!(downloaded(&b, 0) == data, "the downloaded bytes");
    b.js("document.getElementById('files').closest('section').scrollIntoView(); return null");
    b.screenshot("session-files");

    // At a phone's width the page does not overflow sideways (its tables scroll in their box).
    b.rt.block_on(b.client.set_window_size(390, 844)).unwrap();
    assert_eq!(
        b.js("return document.documentElement.scrollWidth <= window.innerWidth"),
        json!(true),
        "the page is wider than a phone: {}",
        b.js("return [document.documentElement.scrollWidth, window.innerWidth]")
    );
    b.rt.block_on(b.client.set_window_size(1280, 800)).unwrap();

    // Ended meanwhile (the API): the timeline adds the end live.
    let d = c.delete(&format!("/v1/sessions/{sid}?grace=0"));
    assert!(d.status == 200 || d.status == 202, "{d:?}");
    b.wait_text("#session-status", "the session ended", |t| {
        t == "TERMINATED"
    });
    b.wait_text(
        "#timeline li[data-status='TERMINATED']",
        "the end in the timeline",
        |t| t.contains("user-requested"),
    );
    assert_eq!(b.js("return window.kvSamePage"), json!("yes"), "no reload");
    let errors = b.console_errors();
    assert!(errors.is_empty(), "the console's errors: {errors:#?}");
}

#[test]
fn a_cluster_session_page_picks_the_kernel_and_a_refused_terminal_says_why() {
    let (c, _agent) = cluster("console-session-cl", 44520);
    let created = c.post(
        "/v1/sessions",
        &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.25, "mem": "32m"},
                "cluster_size": 2, "cluster_mode": "single-node",
                "command": "echo \"log of $BACKENDAI_CLUSTER_HOST\"; exec sleep infinity"}),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let sid = created.body["session_id"].as_str().unwrap().to_owned();

    let mut b = super::session_page(&c, &sid);
    b.wait_text("#session-status", "the cluster RUNNING", |t| t == "RUNNING");
    b.wait_text("#kernel-select", "the kernel selector", |t| {
        t.contains("main1") && t.contains("sub1")
    });
    // Each kernel's status changes, named by host.
    b.wait_text("#timeline", "both kernels in the timeline", |t| {
        t.contains("main1") && t.contains("sub1")
    });
    wait_for(LONG, "each kernel's RUNNING in the timeline", || {
        let hosts = b.js("return [...document.querySelectorAll(\"#timeline li[data-status='RUNNING'] .host\")].map((e) => e.textContent).sort()");
        (hosts == json!(["main1", "sub1"])).then_some(())
    });

    // The logs: main1's first, then sub1's once it is chosen.
    b.wait_text("#logs", "main1's log", |t| t.contains("log of main1"));
    // sub1 selected: the run box runs there, and the logs are its own.
    b.js(
        "const s = document.getElementById('kernel-select'); s.value = 'sub1'; \
          s.dispatchEvent(new Event('change')); return null",
    );
    b.wait_text("#logs", "sub1's log", |t| {
        t.contains("log of sub1") && !t.contains("log of main1")
    });
    b.fill("#repl-code", "echo $BACKENDAI_CLUSTER_HOST");
    b.click("#repl-run");
    b.wait_text("#repl-status", "the run's end", |t| {
        t == "finished, exit code 0"
    });
    assert_eq!(b.text("#repl-output").unwrap_or_default().trim(), "sub1");

    // Its files: an upload from the browser lands in sub1's /home/work only.
    let local = c.dir.path().join("from-the-browser.txt");
    std::fs::write(&local, b"to sub1\n").unwrap();
    b.type_keys("#files-upload", local.to_str().unwrap());
    b.wait_text("#files-status", "the upload done", |t| {
        t.starts_with("uploaded from-the-browser.txt")
    });
    b.wait_text(
        "#files tr[data-file='from-the-browser.txt']",
        "listed in sub1",
        |t| !t.is_empty(),
    );
    assert!(names(&c, &sid, "kernel=sub1").contains(&"from-the-browser.txt".to_owned()));
    assert!(!names(&c, &sid, "kernel=main1").contains(&"from-the-browser.txt".to_owned()));
    // main1 again: its own file listed, not sub1's.
    let put = ureq::put(&format!("{}/v1/sessions/{sid}/files/main1-only.txt", c.api))
        .set("Authorization", &c.auth())
        .timeout(LONG)
        .send_bytes(b"in main1")
        .map(|r| r.status());
    assert!(matches!(put, Ok(201)), "{put:?}");
    b.js(
        "const s = document.getElementById('kernel-select'); s.value = 'main1'; \
          s.dispatchEvent(new Event('change')); return null",
    );
    b.wait_text(
        "#files tr[data-file='main1-only.txt']",
        "main1's listing",
        |t| !t.is_empty(),
    );
    assert_eq!(b.count("#files tr[data-file='from-the-browser.txt']"), 0);

    // The terminal opens in the selected kernel.
    b.js(
        "const s = document.getElementById('kernel-select'); s.value = 'sub1'; \
          s.dispatchEvent(new Event('change')); return null",
    );
    b.click("#term-open");
    b.wait_text("#term-status", "the terminal connected", |t| {
        t == "connected"
    });
    b.type_keys(
        ".xterm-helper-textarea",
        "echo host=$BACKENDAI_CLUSTER_HOST\u{e007}",
    );
    b.wait_text("#terminal .xterm-rows", "sub1's answer", |t| {
        t.lines().any(|l| l.trim() == "host=sub1")
    });
    b.js("document.getElementById('kernel-pick').scrollIntoView(); return null");
    b.screenshot("session-cluster");
    b.click("#term-close");

    // Ended: a terminal asked for anyway (as by a click just before the page learned of the
    // end: its hidden box is shown again for it) is refused, and the page says why.
    let d = c.delete(&format!("/v1/sessions/{sid}?grace=0"));
    assert!(d.status == 200 || d.status == 202, "{d:?}");
    b.wait_text("#session-status", "the session ended", |t| {
        t == "TERMINATED"
    });
    b.js(
        "document.getElementById('terminal').closest('section').hidden = false; \
          document.getElementById('term-open').click(); return null",
    );
    // (Read as textContent: a later render may hide the box again.)
    let why = wait_for(LONG, "why the terminal was refused", || {
        let t = b.js("return document.getElementById('term-status').textContent");
        let t = t.as_str().unwrap_or_default().to_owned();
        t.starts_with("refused:").then_some(t)
    });
    assert!(why.contains("TERMINATED"), "{why}");
    // (Chromium logs the refused upgrade as a network entry, which is no console error.)
    let errors = b.console_errors();
    assert!(errors.is_empty(), "the console's errors: {errors:#?}");
}

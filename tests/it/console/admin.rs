//! Issue 42: the console's admin pages (agents, events, access keys) and the create form's
//! vfolders and cluster fields, in real headless Chromium against a real manager and agent on
//! the real Docker engine.
//!
//! - Two browsers at once: an admin cordons the agent on the agents page; a user key (made
//!   through the API) creates a session from the form (a vfolder mounted read-only; the API's
//!   refusal of a bad cluster size shown at that field first) and sees it wait `PENDING` with
//!   `agents-cordoned`; the admin uncordons it and the user's page shows it `RUNNING`, neither
//!   page reloaded. The user sees no admin link, and `#/keys` / `#/agents` by URL show the
//!   API's 403.
//! - A drain with a deadline from the agents page: the API's refusal of a deadline of 0 is
//!   shown; the page shows the agent draining with its deadline; the session left on it ends
//!   `TERMINATED` `agent-drained` after it.
//! - The access keys page creates a key and shows its secret once; that secret signs in in a
//!   fresh browser; the key is disabled, enabled and deleted (after the page's own confirm
//!   step) from the page; the API's refusal (an admin disabling its own key) is shown.
//! - The events page shows the recent events, then one as it happens, and filters by session
//!   and type.
//!
//! Every test ends with the browsers' consoles free of errors. Agent host ports: 44600–44699
//! (20 from 44600, 44620, 44640 and 44660).

use crate::common;

use std::time::{SystemTime, UNIX_EPOCH};

use common::agent::{free_port, TEST_IMAGE};
use common::browser::{Browser, LONG};
use common::cluster::{wait_for, Cluster, Db};
use serde_json::{json, Value};

/// A manager (with `scheduler` in its `[scheduler]`) and one agent (`tail` appended to its
/// config), `ALIVE` with its slots, past the start-up grace.
fn cluster(name: &str, ports_lo: u16, scheduler: &str, tail: &str) -> (Cluster, String) {
    let mut c = Cluster::new(Db::Sqlite);
    c.scheduler_extra = scheduler.into();
    c.start_manager();
    let a = c.add_agent_with(name, ports_lo, "", tail);
    let agent = c.agents[a].id().to_owned();
    c.wait_agent_status(&agent, "ALIVE", LONG);
    wait_for(LONG, "the start-up grace over", || {
        c.get("/v1/sessions").ok().filter(|a| a.status == 200)
    });
    (c, agent)
}

/// A browser signed in at the console with `secret` as `role`.
fn signed_in(c: &Cluster, secret: &str, role: &str) -> Browser {
    let b = Browser::start(c.dir.path(), free_port());
    b.goto(&format!("{}/ui/", c.api));
    b.sign_in(secret, role, false);
    b
}

fn no_console_errors(b: &mut Browser, who: &str) {
    let errors = b.console_errors();
    assert!(errors.is_empty(), "{who}'s console errors: {errors:#?}");
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The session's JSON as the admin reads it.
fn session(c: &Cluster, sid: &str) -> Value {
    let s = c
        .get_as(Some(&c.admin_token), &format!("/v1/sessions/{sid}"))
        .unwrap();
    assert_eq!(s.status, 200, "{s:?}");
    s.body
}

#[test]
fn two_browsers_an_admin_cordons_and_the_users_session_waits_then_runs() {
    let (c, agent) = cluster("console-adm-cordon", 44600, "", "");
    let (user_key, user) = c.new_key(false);
    let v = c.post_as(Some(&user), "/v1/vfolders", &json!({"name": "data"}));
    assert_eq!(v.status, 201, "{v:?}");

    let mut a = signed_in(&c, &c.admin_token, "admin");
    let mut u = signed_in(&c, &user, "user");

    // The user key sees no admin link; the admin pages by URL show the API's 403.
    for link in ["nav-agents", "nav-keys"] {
        assert_eq!(
            u.js(&format!("return document.getElementById('{link}').hidden")),
            json!(true),
            "{link} hidden from a user key"
        );
        assert_eq!(
            a.js(&format!("return document.getElementById('{link}').hidden")),
            json!(false),
            "{link} shown to an admin key"
        );
    }
    assert_eq!(
        u.js("return document.getElementById('nav-events').hidden"),
        json!(false)
    );
    u.goto(&format!("{}/ui/#/keys", c.api));
    u.wait_text("#keys-error", "the API's 403 on the keys page", |t| {
        t.contains("403") && t.contains("forbidden")
    });
    assert_eq!(u.count("#keys tr"), 0, "no key listed");
    assert_eq!(
        u.js("return document.getElementById('key-form').hidden"),
        json!(true),
        "no create form for a user key"
    );
    u.goto(&format!("{}/ui/#/agents", c.api));
    u.wait_text("#agents-error", "the API's 403 on the agents page", |t| {
        t.contains("403") && t.contains("forbidden")
    });
    assert_eq!(u.count("button.cordon") + u.count("button.drain"), 0);

    // The admin cordons the agent on the agents page.
    a.click("nav a[href='#/agents']");
    let row = format!("tr[data-agent='{agent}']");
    a.wait_text(&row, "the agent's row", |t| t.contains("ALIVE"));
    let images = c.agent_view(&agent).unwrap()["image_count"].to_string();
    a.wait_text(&format!("{row} .images"), "its image count", |t| {
        t == images
    });
    a.wait_text(&format!("{row} .heartbeat"), "its heartbeat's age", |t| {
        t.ends_with(" ago")
    });
    a.click(&format!("{row} button.cordon"));
    a.wait_text(&format!("{row} .scheduling"), "cordoned", |t| {
        t == "cordoned"
    });
    assert_eq!(c.agent_view(&agent).unwrap()["schedulable"], false);
    a.js("window.kvSamePage = 'admin'; return null");

    // The user's form: its vfolder listed; a cluster size the API refuses is shown at the field.
    u.click("nav a[href='#/new']");
    u.wait_text("h1", "the create form", |t| t == "New session");
    u.wait_text("#mounts-list", "the user's vfolders", |t| {
        t.contains("data")
    });
    u.fill("#image", TEST_IMAGE);
    u.fill("#cpu", "0.1");
    u.fill("#mem", "32m");
    u.fill("#cluster_size", "65");
    u.click("#create-submit");
    let refused = c.post_as(
        Some(&user),
        "/v1/sessions",
        &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": "0.1", "mem": "32m"},
                "type": "interactive", "priority": 10, "cluster_size": 65,
                "cluster_mode": "single-node"}),
    );
    assert_eq!(refused.status, 400, "{refused:?}");
    let message = refused.body["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    u.wait_text(
        "#cluster_size-error",
        "the refusal at the cluster size",
        |t| t.contains(&message) && t.contains("invalid-request"),
    );
    assert_eq!(
        u.js("return document.getElementById('cluster_size').getAttribute('aria-invalid')"),
        json!("true")
    );
    assert_eq!(
        u.js("return document.getElementById('mem-error').hidden"),
        json!(true),
        "only the field the refusal names"
    );
    u.js("window.scrollTo(0, 0); return null");
    u.screenshot("new-session");

    // Created from the form with the vfolder read-only: it waits, with the reason, live.
    u.fill("#cluster_size", "1");
    u.click("#mount-data");
    u.js("document.querySelector(\"select.mount-permission[data-vfolder='data']\").value = 'ro'; return null");
    u.click("#create-submit");
    u.wait_text("#session-status", "the user's session waiting", |t| {
        t == "PENDING"
    });
    u.wait_text("#session-reason", "the reason it waits", |t| {
        t.contains("agents-cordoned")
    });
    u.js("window.kvSamePage = 'user'; return null");
    let sid = u.url().rsplit("#/sessions/").next().unwrap().to_owned();
    let s = session(&c, &sid);
    assert_eq!(s["access_key"], user_key.as_str(), "{s}");
    assert_eq!(s["status"], "PENDING", "{s}");
    assert_eq!(
        s["mounts"],
        json!([{"name": "data", "permission": "ro"}]),
        "{s}"
    );

    // The admin uncordons it from the page: the user's page follows to RUNNING, no reload.
    a.click(&format!("{row} button.uncordon"));
    a.wait_text(&format!("{row} .scheduling"), "schedulable", |t| {
        t == "schedulable"
    });
    u.wait_text("#session-status", "the user's session RUNNING, live", |t| {
        t == "RUNNING"
    });
    assert_eq!(u.js("return window.kvSamePage"), json!("user"), "no reload");
    // The admin's agents page follows the placement: a kernel on the agent.
    a.wait_text(&format!("{row} .kernels"), "the kernel placed", |t| {
        t == "1"
    });
    assert_eq!(
        a.js("return window.kvSamePage"),
        json!("admin"),
        "no reload"
    );
    assert_eq!(session(&c, &sid)["status"], "RUNNING");

    // The user's list shows it RUNNING too.
    u.click("nav a[href='#/sessions']");
    u.wait_text(
        &format!("#sessions tr[data-session='{sid}'] .status"),
        "the session listed RUNNING",
        |t| t == "RUNNING",
    );

    no_console_errors(&mut a, "the admin");
    no_console_errors(&mut u, "the user");
}

#[test]
fn a_drain_with_a_deadline_from_the_agents_page_ends_the_session_agent_drained() {
    // A mock accelerator beside the engine's CPU and memory: shown as the agent's GPUs.
    let gpu = "\n[accelerator]\ncuda = false\n\n[[accelerator.mock.devices]]\nid = \"m0\"\n\
               memory = \"1g\"\nslot = \"cuda.shares\"\n";
    let (c, agent) = cluster("console-adm-drain", 44620, "sweep-interval = 1", gpu);
    let created = c.create_session();
    let sid = created["session_id"].as_str().unwrap().to_owned();
    wait_for(LONG, "the session RUNNING", || {
        (session(&c, &sid)["status"] == "RUNNING").then_some(())
    });

    let mut a = signed_in(&c, &c.admin_token, "admin");
    a.click("nav a[href='#/agents']");
    let row = format!("tr[data-agent='{agent}']");
    a.wait_text(&format!("{row} .kernels"), "its kernel", |t| t == "1");
    let total = c.agent_view(&agent).unwrap()["slots_total"]["cuda.shares"]
        .as_str()
        .expect("the mock device's cuda.shares")
        .to_owned();
    let shares = a.wait_text(
        &format!("{row} .gpus .slot[data-slot='cuda.shares']"),
        "the GPU slot",
        |t| !t.is_empty(),
    );
    assert_eq!(shares.trim(), format!("cuda.shares 0 / {total}"));
    assert_eq!(
        a.count(&format!("{row} .slots .slot[data-slot='cuda.shares']")),
        0
    );

    // A deadline the API refuses (0): its 400 shown, the agent untouched.
    a.fill(&format!("{row} input.drain-after"), "0");
    a.click(&format!("{row} button.drain"));
    a.wait_text("#agents-action-error", "the API's refusal", |t| {
        t.contains("400") && t.contains("invalid-request")
    });
    assert_eq!(c.agent_view(&agent).unwrap()["draining"], false);

    // Drained with a deadline of 5 s: the page shows it draining and the time left.
    a.fill(&format!("{row} input.drain-after"), "5");
    let before = now();
    a.click(&format!("{row} button.drain"));
    a.wait_text(&format!("{row} .scheduling"), "draining", |t| {
        t == "draining"
    });
    let after = now();
    let view = c.agent_view(&agent).unwrap();
    let deadline = view["drain_deadline"].as_f64().expect("a drain deadline");
    assert!(
        before + 5.0 - 0.5 <= deadline && deadline <= after + 5.0 + 0.5,
        "the deadline is 5 s after the click: {before} {deadline} {after}"
    );
    assert_eq!(view["schedulable"], false);
    assert_eq!(a.count("#agents-action-error"), 0, "the old error is gone");
    a.wait_text(
        &format!("{row} .drain-deadline"),
        "the deadline shown",
        |t| t.starts_with("deadline in ") || t.starts_with("deadline passed"),
    );
    a.js("document.querySelector('.table-wrap').scrollLeft = 0; return null");
    a.screenshot("agents");

    // The session left on it ends agent-drained after the deadline; the page says the
    // deadline has passed and the agent holds no kernel.
    a.goto(&format!("{}/ui/#/sessions/{sid}", c.api));
    a.wait_text("#session-status", "the session ended", |t| {
        t == "TERMINATED"
    });
    a.wait_text("#session-reason", "ended by the drain", |t| {
        t == "agent-drained"
    });
    let s = session(&c, &sid);
    assert_eq!(
        (s["status"].as_str(), s["status_reason"].as_str()),
        (Some("TERMINATED"), Some("agent-drained")),
        "{s}"
    );
    assert!(
        s["terminated_at"].as_f64().unwrap() >= deadline,
        "ended after the deadline: {s}"
    );
    a.click("nav a[href='#/agents']");
    a.wait_text(
        &format!("{row} .drain-deadline"),
        "the deadline passed",
        |t| t.starts_with("deadline passed"),
    );
    a.wait_text(&format!("{row} .kernels"), "no kernel left", |t| t == "0");
    a.wait_text(&format!("{row} button.uncordon"), "uncordon offered", |t| {
        t == "Uncordon"
    });
    a.click(&format!("{row} button.uncordon"));
    a.wait_text(&format!("{row} .scheduling"), "schedulable again", |t| {
        t == "schedulable"
    });
    assert_eq!(c.agent_view(&agent).unwrap()["draining"], false);

    no_console_errors(&mut a, "the admin");
}

#[test]
fn the_keys_page_creates_a_key_whose_secret_signs_in_then_disables_and_deletes_it() {
    let (c, _agent) = cluster("console-adm-keys", 44640, "", "");
    let mut a = signed_in(&c, &c.admin_token, "admin");
    a.click("nav a[href='#/keys']");
    let keys = c.get_as(Some(&c.admin_token), "/v1/access-keys").unwrap();
    let admin_key = keys.body["access_keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["role"] == "admin")
        .unwrap()["access_key"]
        .as_str()
        .unwrap()
        .to_owned();
    let admin_row = format!("#keys tr[data-key='{admin_key}']");
    a.wait_text(&format!("{admin_row} .role"), "the admin key listed", |t| {
        t == "admin"
    });

    // The API's refusal: an admin cannot disable its own key.
    a.click(&format!("{admin_row} button.disable"));
    a.wait_text("#keys-action-error", "the API's refusal", |t| {
        t.contains("400")
    });
    assert_eq!(
        a.text(&format!("{admin_row} .enabled")).as_deref(),
        Some("yes")
    );

    // A key made on the page: its secret shown once, with a warning.
    a.fill("#key-name", "from-the-console");
    a.js("document.getElementById('key-role').value = 'user'; return null");
    a.fill("#key-limit", "2");
    a.click("#key-create");
    a.wait_text("#new-key", "the new secret's warning", |t| {
        t.contains("shown only this once")
    });
    let secret = a
        .js("return document.getElementById('new-key-secret').value")
        .as_str()
        .unwrap()
        .to_owned();
    assert!(secret.starts_with("kvs_"), "{secret}");
    let key = a.text("#new-key-id").unwrap();
    let row = format!("#keys tr[data-key='{key}']");
    a.wait_text(&format!("{row} .name"), "the new key listed", |t| {
        t == "from-the-console"
    });
    assert_eq!(
        a.text(&format!("{row} .concurrency")).as_deref(),
        Some("0 / 2")
    );
    assert_eq!(a.text(&format!("{row} .role")).as_deref(), Some("user"));
    let k = c
        .get_as(Some(&c.admin_token), &format!("/v1/access-keys/{key}"))
        .unwrap();
    assert_eq!(
        (
            k.body["name"].as_str(),
            k.body["role"].as_str(),
            k.body["concurrency_limit"].as_i64()
        ),
        (Some("from-the-console"), Some("user"), Some(2)),
        "{k:?}"
    );
    assert!(
        k.body.get("secret_key").is_none(),
        "the secret is never read again"
    );
    a.screenshot("keys");
    a.click("#new-key-done");
    assert_eq!(
        a.count("#new-key-secret"),
        0,
        "the secret is gone from the page"
    );

    // The secret signs in in a fresh browser: a user key.
    let mut fresh = signed_in(&c, &secret, "user");
    no_console_errors(&mut fresh, "the fresh browser");
    drop(fresh);

    // Disabled from the page: the API refuses the secret; enabled again: it works.
    a.click(&format!("{row} button.disable"));
    a.wait_text(&format!("{row} .enabled"), "disabled", |t| t == "no");
    let refused = c.get_as(Some(&secret), "/v1/sessions").unwrap();
    assert_eq!(refused.status, 401, "{refused:?}");
    a.click(&format!("{row} button.enable"));
    a.wait_text(&format!("{row} .enabled"), "enabled", |t| t == "yes");
    assert_eq!(c.get_as(Some(&secret), "/v1/sessions").unwrap().status, 200);

    // Deleted after the page's confirm step (no window.confirm): cancelled first.
    a.click(&format!("{row} button.delete"));
    a.wait_text(&format!("{row} .confirm"), "the confirm step", |t| {
        t.contains(&format!("Delete {key}?"))
    });
    a.click(&format!("{row} button.cancel-delete"));
    assert_eq!(
        a.js(&format!(
            "return document.querySelector(\"{row} .confirm\").hidden"
        )),
        json!(true)
    );
    assert_eq!(c.get_as(Some(&secret), "/v1/sessions").unwrap().status, 200);
    a.click(&format!("{row} button.delete"));
    a.click(&format!("{row} button.confirm-delete"));
    wait_for(LONG, "the deleted key's row gone", || {
        (a.count(&row) == 0).then_some(())
    });
    assert_eq!(c.get_as(Some(&secret), "/v1/sessions").unwrap().status, 401);
    let gone = c
        .get_as(Some(&c.admin_token), &format!("/v1/access-keys/{key}"))
        .unwrap();
    assert_eq!(gone.status, 404, "{gone:?}");

    // At a phone's width the admin pages do not overflow sideways (tables scroll in their box).
    a.rt.block_on(a.client.set_window_size(390, 844)).unwrap();
    for (link, ready) in [
        ("#/keys", "#keys tr[data-key]"),
        ("#/events", "#events tr[data-event]"),
        ("#/agents", "#agents tr[data-agent]"),
        ("#/new", "#mounts-list"),
    ] {
        a.click(&format!("nav a[href='{link}']"));
        a.wait_text(ready, link, |t| !t.is_empty());
        assert_eq!(
            a.js("return document.documentElement.scrollWidth <= window.innerWidth"),
            json!(true),
            "{link} is wider than a phone: {}",
            a.js("return [document.documentElement.scrollWidth, window.innerWidth]")
        );
    }

    no_console_errors(&mut a, "the admin");
}

#[test]
fn the_events_page_shows_recent_events_then_live_ones_and_filters_them() {
    let (c, agent) = cluster("console-adm-events", 44660, "", "");
    let first = c.create_session();
    let first = first["session_id"].as_str().unwrap().to_owned();
    wait_for(LONG, "the first session RUNNING", || {
        (session(&c, &first)["status"] == "RUNNING").then_some(())
    });

    let mut a = signed_in(&c, &c.admin_token, "admin");
    a.click("nav a[href='#/events']");
    // The recent events: the first session's RUNNING and the agent's first contact.
    let running =
        |sid: &str| format!("#events tr[data-event] td.session a[href='#/sessions/{sid}']");
    wait_for(LONG, "the first session's events from the history", || {
        (a.count(&running(&first)) > 0).then_some(())
    });
    a.wait_text("#events", "the agent's liveness in the history", |t| {
        t.contains("agent_status") && t.contains(&agent) && t.contains("ALIVE")
    });
    a.js("window.kvSamePage = 'yes'; return null");

    // A session made now: its events come live, newest first.
    let second = c.create_session();
    let second = second["session_id"].as_str().unwrap().to_owned();
    wait_for(LONG, "the second session's RUNNING, live", || {
        let top = a.text("#events tr[data-event]")?;
        (top.contains(&second[..8]) && top.contains("RUNNING")).then_some(())
    });
    assert_eq!(a.js("return window.kvSamePage"), json!("yes"), "no reload");
    a.screenshot("events");

    // Filtered by the second session: its rows only.
    a.fill("#events-session", &second[..8]);
    wait_for(LONG, "only the second session's rows", || {
        let all = a.count("#events tr[data-event]");
        (all > 0 && all == a.count(&running(&second))).then_some(())
    });
    assert_eq!(a.count(&running(&first)), 0);
    // By type: the agent's liveness only.
    a.fill("#events-session", "");
    a.js(
        "const s = document.getElementById('events-type'); s.value = 'agent_status'; \
          s.dispatchEvent(new Event('change')); return null",
    );
    wait_for(LONG, "only agent_status rows", || {
        let all = a.count("#events tr[data-event]");
        (all > 0 && all == a.count("#events tr[data-event] td.type[data-type='agent_status']"))
            .then_some(())
    });

    // A user key's events page: its own session's events, nothing of the agents.
    let (_, user) = c.new_key(false);
    let mine = c.post_as(
        Some(&user),
        "/v1/sessions",
        &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 0.1, "mem": "32m"}}),
    );
    assert_eq!(mine.status, 201, "{mine:?}");
    let mine = mine.body["session_id"].as_str().unwrap().to_owned();
    let mut u = signed_in(&c, &user, "user");
    u.click("nav a[href='#/events']");
    wait_for(LONG, "the user's own session's events", || {
        (u.count(&running(&mine)) > 0).then_some(())
    });
    assert_eq!(u.count(&running(&first)), 0, "no other key's session");
    assert_eq!(
        u.count("#events tr[data-event] td.type[data-type='agent_status']"),
        0,
        "no agent events for a user key"
    );

    no_console_errors(&mut a, "the admin");
    no_console_errors(&mut u, "the user");
}

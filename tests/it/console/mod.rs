//! Issue 42: the web console (`/ui/`) in a real headless Chromium (Debian's `chromium`, driven
//! through `chromedriver` by fantoccini), against a manager process and an agent process (the
//! `kernelvisor` binary, CURVE on) on the real Docker engine and the test image.
//!
//! - An admin signs in (a wrong secret is refused at the form first), sees the agent with its
//!   slots, cordons it with the page's button, creates a session from the form (the API's
//!   refusal of a bad memory amount shown at the form first), sees it wait in the queue with
//!   the reason, and, once the agent is uncordoned, sees it go `RUNNING` without a reload (the
//!   page's state survives); its log line carrying `<script>` is shown as text and runs
//!   nothing; a command run in its run box shows its output (as text) and exit code; ended
//!   through the API, it leaves the list of live sessions without a reload. The browser's console has no error but the API's refusals the test asked for;
//!   every console answer carries the Content-Security-Policy.
//! - A user key (signed in with the keyboard) sees only its own sessions: another key's session
//!   by URL shows the API's 404, the agents page the API's 403, and no admin control is there.
//!   Its own batch job from the form shows its result, exit code and logs. The policy holds in
//!   the browser (an inline script put into the page does not run, and the violation is a
//!   console error the check would see); at a phone's width the page does not overflow
//!   sideways; signing out forgets the secret.
//!
//! The pages' screenshots go to the cluster's directory; with `KV_WRITE_CONSOLE_SCREENSHOTS=1`
//! also to `docs/console/*.png` (review and commit them).
//!
//! One test at a time (`.config/nextest.toml`, test group `browser`): each starts a chromedriver
//! and a Chromium, the heaviest processes of the suite on the 2-core machine.
//!
//! - On a kernel Backend.AI's kernel runner serves, the run box is Python in its persistent
//!   REPL: `x = 41`, then the expression `x + 1` reads 42 (its value, as the runner sends it);
//!   an HTML value reads as its text; an `input()` is asked for and answered.
//!
//! - The terminal: xterm.js over the pty WebSocket (the secret as its bearer subprotocol):
//!   `echo hi` typed reads `hi` back, a resize reaches the kernel (`stty size`).
//!
//! Agent host ports: 44400–44499 (20 from 44400, 44420, 44450 and 44470).

use crate::common;

mod admin;
mod live_list;
mod session_page;

use common::agent::{free_port, TEST_IMAGE};
use common::browser::{Browser, LONG};
use common::cluster::{wait_for, Cluster, Db};
use serde_json::{json, Value};

/// A manager and one agent, `ALIVE` with its slots, past the start-up grace (the sessions
/// list answers).
fn cluster(name: &str, ports_lo: u16) -> (Cluster, String) {
    let mut c = Cluster::new(Db::Sqlite);
    c.start_manager();
    let a = c.add_agent(name, ports_lo, "");
    let agent = c.agents[a].id().to_owned();
    c.wait_agent_status(&agent, "ALIVE", LONG);
    wait_for(LONG, "the start-up grace over", || {
        c.get("/v1/sessions").ok().filter(|a| a.status == 200)
    });
    (c, agent)
}

/// A browser on session `sid`'s page, signed in as the cluster's user key (its owner).
fn session_page(c: &Cluster, sid: &str) -> Browser {
    let b = Browser::start(c.dir.path(), free_port());
    b.goto(&format!("{}/ui/#/sessions/{sid}", c.api));
    b.sign_in(&c.token, "user", false);
    b
}

/// The console's answers carry the security headers, with no token; `/` redirects to `/ui/`.
fn check_headers(api: &str) {
    let no_redirects = ureq::AgentBuilder::new().redirects(0).build();
    let root = no_redirects.get(&format!("{api}/")).call().unwrap();
    assert_eq!(root.status(), 302);
    assert_eq!(root.header("Location"), Some("/ui/"));
    for path in [
        "/ui/",
        "/ui/console.js",
        "/ui/console.css",
        "/ui/vendor/xterm.js",
    ] {
        let r = ureq::get(&format!("{api}{path}")).call().unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let csp = r.header("Content-Security-Policy").unwrap_or_default();
        // Script from this origin only; inline style is allowed (xterm.js's `<style>`s).
        let script_src = csp
            .split(';')
            .map(str::trim)
            .find(|d| d.starts_with("script-src"));
        assert!(
            csp.contains("default-src 'self'")
                && script_src == Some("script-src 'self'")
                && !csp.contains("unsafe-eval"),
            "{path}: {csp}"
        );
        assert_eq!(r.header("X-Content-Type-Options"), Some("nosniff"));
        assert_eq!(r.header("Referrer-Policy"), Some("no-referrer"));
    }
    // The API itself still wants a token.
    let api_call = ureq::get(&format!("{api}/v1/sessions")).call();
    assert!(
        matches!(api_call, Err(ureq::Error::Status(401, _))),
        "{api_call:?}"
    );
}

#[test]
fn an_admin_sees_the_agent_queues_a_session_from_the_form_and_watches_it_run() {
    let (c, agent) = cluster("console-admin", 44400);
    check_headers(&c.api);
    let total_cpu = c.agent_view(&agent).unwrap()["slots_total"]["cpu"]
        .as_str()
        .unwrap()
        .to_owned();
    let mut b = Browser::start(c.dir.path(), free_port());

    // The root leads to the sign-in page; a wrong secret is refused there with the API's word.
    b.goto(&format!("{}/", c.api));
    assert!(b.url().ends_with("/ui/"), "{}", b.url());
    // The page is built by its script: the form is there once its heading is.
    b.wait_text("h1", "the sign-in page", |t| t == "Sign in");
    b.screenshot("sign-in");
    b.fill("#secret", "not-a-secret");
    b.click("#sign-in button[type=submit]");
    b.wait_text("#sign-in-error", "the refusal of a wrong secret", |t| {
        t.contains("malformed bearer token") && t.contains("401")
    });
    b.sign_in(&c.admin_token, "admin", false);

    // The agent with its slots, from GET /v1/agents.
    b.click("nav a[href='#/agents']");
    let row = format!("tr[data-agent='{agent}']");
    b.wait_text(&row, "the agent's row", |t| t.contains("ALIVE"));
    let cpu = b.wait_text(
        &format!("{row} .slot[data-slot='cpu']"),
        "its cpu slots",
        |t| !t.is_empty(),
    );
    assert_eq!(cpu.trim(), format!("cpu 0 / {total_cpu}"));
    assert!(b.text(&format!("{row} .slot[data-slot='mem']")).is_some());
    b.screenshot("agents");

    // Cordoned with the page's button: the API says so.
    b.click(&format!("{row} button.cordon"));
    b.wait_text(&format!("{row} .scheduling"), "cordoned", |t| {
        t == "cordoned"
    });
    assert_eq!(c.agent_view(&agent).unwrap()["schedulable"], false);
    assert_eq!(b.count(&format!("{row} button.uncordon")), 1);

    // Nothing below reloads the page: a mark set now must still be there at the end.
    b.js("window.kvSamePage = 'yes'; return null");

    // The form: the API's refusal of a bad amount is shown at it, the same message the API
    // gives for that request.
    b.click("nav a[href='#/new']");
    b.wait_text("h1", "the create form", |t| t == "New session");
    b.fill("#image", TEST_IMAGE);
    b.fill("#cpu", "0.1");
    b.fill("#mem", "lots");
    b.click("#create-submit");
    let refused = c.post_as(
        Some(&c.admin_token),
        "/v1/sessions",
        &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": "0.1", "mem": "lots"},
                "type": "interactive", "priority": 10, "cluster_size": 1}),
    );
    assert_eq!(refused.status, 400, "{refused:?}");
    let message = refused.body["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    b.wait_text("#create-refused", "the API's refusal at the form", |t| {
        t.contains(&message) && t.contains(refused.code())
    });
    assert_eq!(
        b.js("return document.getElementById('mem').getAttribute('aria-invalid')"),
        json!("true"),
        "the field the API's message names is marked"
    );
    b.screenshot("new-session");

    // Created from the form while the only agent is cordoned: it waits, with the reason.
    b.fill("#mem", "32m");
    b.fill(
        "#command",
        "echo '<script>window.kvInjected = 1</script> from the log'; exec sleep infinity",
    );
    b.click("#create-submit");
    b.wait_text("#session-status", "the new session waiting", |t| {
        t == "PENDING"
    });
    b.wait_text("#session-reason", "the reason it waits", |t| {
        t.contains("agents-cordoned")
    });
    let sid = b.url().rsplit("#/sessions/").next().unwrap().to_owned();
    let s = c
        .get_as(Some(&c.admin_token), &format!("/v1/sessions/{sid}"))
        .unwrap();
    assert_eq!(
        (s.body["status"].as_str(), s.body["image"].as_str()),
        (Some("PENDING"), Some(TEST_IMAGE)),
        "{s:?}"
    );

    // The queue shows it with the reason.
    b.click("nav a[href='#/queue']");
    b.wait_text(
        &format!("#queue tr[data-session='{sid}']"),
        "the session in the queue",
        |t| t.contains("agents-cordoned"),
    );
    b.screenshot("queue");
    b.click(&format!("#queue tr[data-session='{sid}'] a"));
    b.wait_text("#session-status", "the session page again", |t| {
        t == "PENDING"
    });

    // Uncordoned by someone else (the API): the page follows the event stream to RUNNING.
    let a = c.post_as(
        Some(&c.admin_token),
        &format!("/v1/agents/{agent}/uncordon"),
        &json!({}),
    );
    assert_eq!(a.status, 200, "{a:?}");
    b.wait_text("#session-status", "the session RUNNING, live", |t| {
        t == "RUNNING"
    });
    assert_eq!(b.js("return window.kvSamePage"), json!("yes"), "no reload");

    // Its log line, `<script>` and all, is text: no element made of it, nothing run.
    b.wait_text("#logs", "the session's log line", |t| {
        t.contains("<script>window.kvInjected = 1</script> from the log")
    });
    assert_eq!(b.count("#logs script"), 0);
    assert_eq!(b.count("#logs *"), 0, "the log holds text only");
    assert_eq!(b.js("return window.kvInjected === undefined"), json!(true));
    b.wait_text(
        "#kernels tr[data-kernel] td:nth-child(3)",
        "the kernel's agent",
        |t| t == agent,
    );

    // The run box: a shell command line on this (process-path) kernel; its output is text.
    b.wait_text("#repl-path", "the run box", |t| t.contains("shell command"));
    b.fill(
        "#repl-code",
        "echo '<b>bold</b> from exec'; echo to stderr >&2; exit 4",
    );
    b.click("#repl-run");
    b.wait_text("#repl-status", "the run's end", |t| {
        t == "finished, exit code 4"
    });
    let out = b.text("#repl-output").unwrap_or_default();
    assert!(
        out.contains("<b>bold</b> from exec") && out.contains("to stderr"),
        "{out}"
    );
    assert_eq!(b.count("#repl-output b"), 0, "output is text");
    b.screenshot("session");
    b.js("document.getElementById('repl-status').scrollIntoView(); return null");
    b.screenshot("session-run-and-logs");

    // The list shows it RUNNING.
    b.click("nav a[href='#/sessions']");
    b.wait_text(
        &format!("#sessions tr[data-session='{sid}'] .status"),
        "the session listed RUNNING",
        |t| t == "RUNNING",
    );
    b.screenshot("sessions");

    // Ended by someone else (the API): the list of live sessions follows without a reload
    // (only an event makes the page read it again).
    let d = c.delete_as(Some(&c.admin_token), &format!("/v1/sessions/{sid}"));
    assert!(d.status == 200 || d.status == 202, "{d:?}");
    wait_for(LONG, "the ended session gone from the live list", || {
        (b.count(&format!("#sessions tr[data-session='{sid}']")) == 0).then_some(())
    });
    assert_eq!(b.js("return window.kvSamePage"), json!("yes"), "no reload");

    let errors = b.console_errors();
    assert!(errors.is_empty(), "the console's errors: {errors:#?}");
    // The log was read: the refused sign-in's 401 is in it (as a network entry).
    assert!(
        b.log.iter().any(
            |e| e["source"] == "network" && e["message"].as_str().unwrap_or("").contains("401")
        ),
        "the browser's log has the refused sign-in: {:#?}",
        b.log
    );
}

#[test]
fn a_user_key_sees_only_its_own_sessions_and_no_admin_controls() {
    let (c, _agent) = cluster("console-user", 44450);
    // The cluster's user key owns a session; another user key signs in to the console.
    let theirs = c.create_session();
    let sid = theirs["session_id"].as_str().unwrap().to_owned();
    let (_, other) = c.new_key(false);
    let mut b = Browser::start(c.dir.path(), free_port());
    b.goto(&format!("{}/ui/", c.api));
    b.sign_in(&other, "user", true);
    assert_eq!(
        b.js("return document.getElementById('nav-agents').hidden"),
        json!(true),
        "no agents link for a user key"
    );

    // Its list is its own: empty.
    b.wait_text("#sessions", "the user's (empty) list", |t| {
        t.contains("No sessions.")
    });
    assert_eq!(b.count(&format!("tr[data-session='{sid}']")), 0);

    // Another key's session by URL: the API's 404, nothing of the session.
    b.goto(&format!("{}/ui/#/sessions/{sid}", c.api));
    b.wait_text("#session-error", "the API's 404", |t| {
        t.contains("404") && t.contains("session-not-found")
    });
    assert_eq!(b.count("#session-status"), 0);
    assert_eq!(b.count("#terminate"), 0);
    b.screenshot("not-yours");

    // The agents page by URL: the API's 403, and no cordon control.
    b.goto(&format!("{}/ui/#/agents", c.api));
    b.wait_text("#agents-error", "the API's 403", |t| {
        t.contains("403") && t.contains("forbidden")
    });
    assert_eq!(b.count("button.cordon") + b.count("button.uncordon"), 0);

    // Its own batch job from the form: its result, exit code and logs once it ended.
    b.click("nav a[href='#/new']");
    b.wait_text("h1", "the create form", |t| t == "New session");
    b.fill("#image", TEST_IMAGE);
    b.fill("#cpu", "0.1");
    b.fill("#mem", "32m");
    b.js("document.getElementById('type').value = 'batch'; return null");
    b.fill("#command", "echo batch output; exit 3");
    b.click("#create-submit");
    b.wait_text("#session-status", "the batch job ended", |t| {
        t == "TERMINATED"
    });
    b.wait_text("#session-result", "its result", |t| t == "FAILURE");
    b.wait_text("#session-exit-code", "its exit code", |t| t == "3");
    b.wait_text("#logs", "its logs", |t| t.contains("batch output"));
    let job = b.url().rsplit("#/sessions/").next().unwrap().to_owned();
    let s = c
        .get_as(Some(&other), &format!("/v1/sessions/{job}"))
        .unwrap();
    assert_eq!(
        (s.body["exit_code"].as_i64(), s.body["result"].as_str()),
        (Some(3), Some("FAILURE")),
        "{s:?}"
    );
    b.screenshot("batch-session");

    let errors = b.console_errors();
    assert!(errors.is_empty(), "the console's errors: {errors:#?}");

    // The policy holds in the browser: an inline script put into the page does not run, and
    // the violation is a console error the checks above would have seen.
    let ran = b.js(
        "const s = document.createElement('script'); s.textContent = 'window.kvInline = 1'; \
         document.head.append(s); return window.kvInline !== undefined",
    );
    assert_eq!(ran, json!(false), "an inline script ran");
    let errors = wait_for(LONG, "the CSP violation in the console", || {
        Some(b.console_errors()).filter(|e| !e.is_empty())
    });
    assert!(
        errors.iter().any(|e| e["message"]
            .as_str()
            .unwrap_or("")
            .contains("Content Security Policy")),
        "{errors:#?}"
    );

    // At a phone's width the page does not overflow sideways (tables scroll in their box).
    b.rt.block_on(b.client.set_window_size(390, 844)).unwrap();
    b.click("nav a[href='#/sessions']");
    b.js("document.getElementById('show-all').click(); return null");
    b.wait_text(
        &format!("#sessions tr[data-session='{job}'] .status"),
        "the ended batch job listed",
        |t| t == "TERMINATED",
    );
    assert_eq!(
        b.js("return document.documentElement.scrollWidth <= window.innerWidth"),
        json!(true),
        "the page is wider than a phone: {}",
        b.js("return [document.documentElement.scrollWidth, window.innerWidth]")
    );
    b.screenshot("sessions-phone");

    // Signing out forgets the secret.
    b.click("#sign-out");
    b.wait_text("h1", "the sign-in page", |t| t == "Sign in");
    assert_eq!(
        b.js("return sessionStorage.getItem('kernelvisor.secret')"),
        Value::Null
    );

    // The owner still has it, untouched.
    let s = c.get(&format!("/v1/sessions/{sid}")).unwrap();
    assert_eq!(s.body["status"], "RUNNING", "{s:?}");
}

/// Backend.AI's kernel runner serves the session (`kernelvisor-test-py`, `[kernel-runner]` on
/// the agent): the run box is Python in its persistent REPL, which keeps `x` from one run to
/// the next and asks for a line when `input()` waits. Named `runner_kernel` so that it is in
/// the `runner-kernels` test group (one runner boot at a time), not `browser`: a runner missing
/// its 10 s boot is the failure that group prevents; a second browser beside it is only load.
#[test]
fn a_runner_kernel_keeps_python_state_in_the_run_box_and_asks_for_input() {
    let Ok(dir) = std::env::var("KV_KRUNNER_DIR") else {
        eprintln!("SKIPPED console runner: KV_KRUNNER_DIR is not set (`just test-all` sets it after `just krunner`)");
        return;
    };
    let mut c = Cluster::new(Db::Sqlite);
    c.start_manager();
    let runner =
        format!("\n[kernel-runner]\ndir = \"{dir}\"\nmode = \"auto\"\ninit-timeout = 60\n");
    let a = c.add_agent_with("console-runner", 44470, "", &runner);
    let agent = c.agents[a].id().to_owned();
    c.wait_agent_status(&agent, "ALIVE", LONG);
    wait_for(LONG, "the start-up grace over", || {
        c.get("/v1/sessions").ok().filter(|a| a.status == 200)
    });
    let created = c.post(
        "/v1/sessions",
        &json!({"image": "kernelvisor-test-py:latest", "resource_slots": {"cpu": 1, "mem": "512m"}}),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let sid = created.body["session_id"].as_str().unwrap().to_owned();

    let mut b = session_page(&c, &sid);
    b.wait_text("#session-status", "the session RUNNING", |t| t == "RUNNING");
    b.wait_text("#repl-path", "the runner's REPL", |t| {
        t.starts_with("Python")
    });

    b.fill("#repl-code", "x = 41");
    b.click("#repl-run");
    b.wait_text("#repl-status", "the first run's end", |t| {
        t.starts_with("finished")
    });
    // An expression, not a print: its value is what the REPL shows (upstream's runner sends a
    // `text/plain` value as stdout).
    b.fill("#repl-code", "x + 1");
    b.click("#repl-run");
    b.wait_text("#repl-status", "the second run's end", |t| {
        t.starts_with("finished")
    });
    assert_eq!(b.text("#repl-output").unwrap_or_default().trim(), "42");

    // A value that is HTML (upstream's runner sends it as a `media` item, the agent as `html`):
    // shown by its text, no element made of it.
    b.fill(
        "#repl-code",
        "from IPython.display import HTML\nHTML('<b>bold</b> <img src=x>value')",
    );
    b.click("#repl-run");
    b.wait_text("#repl-status", "the HTML value's run end", |t| {
        t.starts_with("finished")
    });
    assert_eq!(
        b.text("#repl-output").unwrap_or_default().trim(),
        "bold value"
    );
    assert_eq!(b.count("#repl-output b") + b.count("#repl-output img"), 0);

    // input(): the box asks, the line typed goes to the run.
    b.fill("#repl-code", "name = input('who? ')\nprint('hello,', name)");
    b.click("#repl-run");
    b.wait_text("#repl-status", "the run waiting for input", |t| {
        t == "waiting for input"
    });
    b.fill("#repl-line", "console\u{e007}");
    b.wait_text("#repl-status", "the third run's end", |t| {
        t.starts_with("finished")
    });
    let out = b.text("#repl-output").unwrap_or_default();
    assert!(
        out.contains("who?") && out.contains("hello, console"),
        "{out}"
    );
    b.js("document.getElementById('repl-code').scrollIntoView(); return null");
    b.screenshot("session-python");

    let errors = b.console_errors();
    assert!(errors.is_empty(), "the console's errors: {errors:#?}");
}

/// The terminal in the browser: xterm.js over the session's pty WebSocket, authenticated by the
/// secret as a subprotocol (a browser's WebSocket sends no Authorization header). What is typed
/// reaches the shell and its output is shown; a resize of the terminal reaches the kernel; the
/// terminal closes cleanly.
#[test]
fn the_terminal_runs_what_is_typed_and_follows_a_resize() {
    let (c, _agent) = cluster("console-term", 44420);
    let created = c.post(
        "/v1/sessions",
        &json!({"image": TEST_IMAGE, "resource_slots": {"cpu": 1, "mem": "256m"}}),
    );
    assert_eq!(created.status, 201, "{created:?}");
    let sid = created.body["session_id"].as_str().unwrap().to_owned();

    let mut b = session_page(&c, &sid);
    b.wait_text("#session-status", "the session RUNNING", |t| t == "RUNNING");
    b.click("#term-open");
    b.wait_text("#term-status", "the terminal connected", |t| {
        t == "connected"
    });
    let keys = ".xterm-helper-textarea";
    b.type_keys(keys, "echo h\"i\"\u{e007}");
    // `echo h"i"` echoes as typed; only the shell's answer is a line that is just `hi`.
    let rows = "#terminal .xterm-rows";
    b.wait_text(rows, "the shell's answer", |t| {
        t.lines().any(|l| l.trim() == "hi")
    });

    // The terminal is fitted to its box; a smaller box (the window changed) is a smaller
    // terminal, and the kernel's pty follows.
    let size = b.js("const e = document.getElementById('terminal'); \
         e.style.height = '10em'; e.style.width = '500px'; \
         window.dispatchEvent(new Event('resize')); \
         return `${window.kvTerm.rows} ${window.kvTerm.cols}`");
    let size = size.as_str().unwrap().to_owned();
    assert_ne!(size, "24 80", "the terminal follows its box");
    b.type_keys(keys, "stty size\u{e007}");
    b.wait_text(rows, "the new size in the kernel", |t| {
        t.lines().any(|l| l.trim() == size)
    });
    b.screenshot("terminal");

    b.click("#term-close");
    b.wait_text("#term-status", "the terminal closed", |t| t == "closed");
    assert_eq!(b.count("#terminal .xterm"), 0, "the terminal is gone");
    let errors = b.console_errors();
    assert!(errors.is_empty(), "the console's errors: {errors:#?}");
}

/// A module of the console that fails to load (here blocked in the browser; in life cut off by
/// a network change, Chromium's `ERR_NETWORK_CHANGED` when an interface comes or goes, as each
/// kernel's veth does) leaves the module graph failed for the page's life: `boot.js` loads the
/// page again, and the console comes up once the file can be fetched.
#[test]
fn a_module_that_failed_to_load_makes_the_page_load_again() {
    let mut c = Cluster::new(Db::Sqlite);
    c.start_manager();
    let b = Browser::start(c.dir.path(), free_port());
    b.goto(&format!("{}/ui/", c.api));
    b.wait_text("h1", "the sign-in page", |t| t == "Sign in");
    b.cdp("Network.enable", json!({}));
    b.cdp(
        "Network.setBlockedURLs",
        json!({"urls": ["*/ui/pages/keys.js*"]}),
    );
    b.js("location.reload(); return null");
    // The graph failed: the page counts a reload and asks for it.
    wait_for(LONG, "a reload counted after the failed load", || {
        b.js("return sessionStorage.getItem('kernelvisor.boot-reloads')")
            .as_str()
            .filter(|n| *n != "0")
            .map(str::to_owned)
    });
    b.cdp("Network.setBlockedURLs", json!({"urls": []}));
    b.wait_text("h1", "the sign-in page after the reload", |t| {
        t == "Sign in"
    });
    b.sign_in(&c.admin_token, "admin", false);
    assert_eq!(
        b.js("return sessionStorage.getItem('kernelvisor.boot-reloads')"),
        Value::Null,
        "the count is cleared once the modules ran"
    );
}

//! Fuzzes the manager's HTTP API with schemathesis (PyPI, in the project venv: `just setup`)
//! against its own OpenAPI document (`GET /v1/openapi.json`): a real manager process (SQLite)
//! and a real agent process on the `dummy` container backend, schemathesis run with an admin
//! token and with a user token. Checks: no 5xx, status codes, content types, headers and bodies
//! as the document says, schema-invalid requests refused with 4xx, and auth enforced.
//!
//! Three passes per token: every operation but the event stream with generated ids (mostly
//! `session-not-found` on the session routes), the event stream (`GET /v1/events`) with
//! `follow=false` (followed, it never ends), then the session routes that work on the dummy
//! backend (show, execute, services) pinned to a real running session (`--set-path id=…`). Not
//! pinned: `files` (a dummy container has no filesystem: the agent answers 502 `agent-error`, by
//! design), `logs` (`?follow=true` on a kernel that never ends streams until the client gives up)
//! and `DELETE`.
//!
//! Negative data (requests that break the schema) must get a 4xx, checked by
//! `tests/fuzz/kv_fuzz_hooks.py` in place of schemathesis' own check: the same, but not for
//! query values (schemathesis' "negative" `5` for a string parameter is the text "5").
//!
//! `KV_PYTHON` names the venv's python (the justfile passes it); schemathesis' `st` is beside
//! it. Without it the test fails: CI runs `just setup` first. `KV_FUZZ_EXAMPLES` overrides the
//! examples per operation and data generation method (default 50: about 2 minutes here).

use crate::common::agent::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value as Json;

/// Examples per operation and data generation method (positive, negative).
const EXAMPLES: u32 = 50;

/// The manager and agent processes, killed when dropped.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// schemathesis' `st` in the venv of `KV_PYTHON` (else `.venv/bin/python`).
fn schemathesis() -> PathBuf {
    let python = std::env::var_os("KV_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python"));
    let st = python.with_file_name("st");
    assert!(
        st.exists(),
        "schemathesis is not installed: {} not found (KV_PYTHON={:?}). Run `just setup`: it \
         installs schemathesis into the project venv .venv",
        st.display(),
        std::env::var_os("KV_PYTHON")
    );
    st
}

/// `path` opened for a child's stdout and stderr.
fn log_files(path: &Path) -> (Stdio, Stdio) {
    let f = std::fs::File::create(path).unwrap();
    (Stdio::from(f.try_clone().unwrap()), Stdio::from(f))
}

/// An HTTP call: (status, JSON body or Null).
fn call(method: &str, url: &str, token: Option<&str>, body: Option<&Json>) -> (u16, Json) {
    let mut req = ureq::request(method, url).timeout(Duration::from_secs(30));
    if let Some(t) = token {
        req = req.set("Authorization", &format!("Bearer {t}"));
    }
    let res = match body {
        Some(b) => req.send_json(b.clone()),
        None => req.call(),
    };
    let resp = match res {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => return (0, Json::String(e.to_string())),
    };
    let status = resp.status();
    let text = resp.into_string().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Json::Null))
}

fn wait_for<T>(limit: Duration, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut start = text.len().saturating_sub(4000);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    text[start..].to_owned()
}

#[test]
fn schemathesis_finds_nothing() {
    let st = schemathesis();
    let dir = tempfile::Builder::new()
        .prefix("kv-api-fuzz-")
        .tempdir()
        .unwrap();
    let d = dir.path();
    let (api_port, intake_port, rpc_port, metrics_port) =
        (free_port(), free_port(), free_port(), free_port());
    let api = format!("http://127.0.0.1:{api_port}");
    // Short intervals, but a 10 s heartbeat timeout and a 5 s ping timeout: on two busy cores
    // (schemathesis takes one) a 3 s one could mark the agent LOST mid-run, and the kernel routes
    // would then answer 503 `no-agents`, which is no finding.
    std::fs::write(
        d.join("manager.toml"),
        format!(
            "[manager]\nevent-listen-addr = {{ host = \"127.0.0.1\", port = {intake_port} }}\n\
             heartbeat-interval = 1\nheartbeat-timeout = 10\nstartup-grace = 2.5\n\n\
             [store]\nurl = \"sqlite://{d}/manager.db\"\n\n\
             [api]\nlisten-addr = {{ host = \"127.0.0.1\", port = {api_port} }}\nworkers = 2\n\
             admin-token-file = \"{d}/admin-token\"\n\n\
             [agent-pool]\nhealth-check-interval = 1\nping-timeout = 5\nrecovery-timeout = 2\n\n\
             [logging]\nlevel = \"warn\"\n",
            d = d.display()
        ),
    )
    .unwrap();
    for sub in ["var", "scratches", "vfolders"] {
        std::fs::create_dir_all(d.join(sub)).unwrap();
    }
    // Plenty of slots and ports, so that fuzzed creations succeed (or hit 409 `no-capacity`).
    std::fs::write(
        d.join("agent.toml"),
        format!(
            "[agent]\nid = \"fuzz-agent\"\nrpc-listen-addr = {{ host = \"127.0.0.1\", port = {rpc_port} }}\n\
             service-addr = {{ host = \"127.0.0.1\", port = {metrics_port} }}\nvar-base-path = \"{d}/var\"\n\
             backend = \"dummy\"\non-shutdown = \"terminate\"\n\n\
             [manager]\nevent-addr = {{ host = \"127.0.0.1\", port = {intake_port} }}\nheartbeat-interval = 1\n\
             event-ack-timeout = 2\nevent-retry-max = 1\n\n\
             [container]\nport-range = [22000, 22999]\nport-reuse-cooldown = 0.1\nbind-host = \"127.0.0.1\"\n\
             scratch-root = \"{d}/scratches\"\nvfolder-root = \"{d}/vfolders\"\n\n\
             [resource]\nreserved-cpu = 0\nreserved-mem = 0\ncpu = 100000\nmem = \"64t\"\n\n\
             [stats]\nnode-interval = 60\ncontainer-interval = 60\ngpu-interval = 60\n\n\
             [logging]\nlevel = \"warn\"\n",
            d = d.display()
        ),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_kernelvisor");
    let (out, err) = log_files(&d.join("manager.log"));
    let manager = Command::new(bin)
        .args(["manager", "--config"])
        .arg(d.join("manager.toml"))
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap();
    let mut procs = Procs(vec![manager]);
    let (out, err) = log_files(&d.join("agent.log"));
    let agent = Command::new(bin)
        .args(["agent", "--config"])
        .arg(d.join("agent.toml"))
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap();
    procs.0.push(agent);

    // The agent ALIVE (its heartbeat applied: placement needs its slots) and the start-up grace
    // over: kernel routes would answer 503 before.
    wait_for(Duration::from_secs(60), "the manager's API", || {
        let (status, _) = call("GET", &format!("{api}/health"), None, None);
        (status == 200).then_some(())
    });
    let admin = std::fs::read_to_string(d.join("admin-token"))
        .expect("the manager wrote its admin token")
        .trim()
        .to_owned();
    wait_for(
        Duration::from_secs(60),
        "the agent ALIVE and /health mode normal",
        || {
            let (_, h) = call("GET", &format!("{api}/health"), None, None);
            let (_, agents) = call("GET", &format!("{api}/v1/agents"), Some(&admin), None);
            let alive = agents["agents"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|a| a["status"] == "ALIVE" && !a["last_heartbeat"].is_null())
            });
            (h["mode"] == "normal" && h["agents_alive"].as_u64() >= Some(1) && alive).then_some(())
        },
    );
    let (status, key) = call(
        "POST",
        &format!("{api}/v1/access-keys"),
        Some(&admin),
        Some(&serde_json::json!({"role": "user", "name": "fuzz"})),
    );
    assert_eq!(status, 201, "create a user key: {key}");
    let user = key["secret_key"].as_str().unwrap().to_owned();
    // The session the pinned pass works on: the user's, so both tokens may act on it.
    let (status, session) = call(
        "POST",
        &format!("{api}/v1/sessions"),
        Some(&user),
        Some(
            &serde_json::json!({"image": "kernelvisor-test:latest", "resource_slots": {"cpu": 1, "mem": "64m"}}),
        ),
    );
    assert_eq!(status, 201, "create the pinned session: {session}");
    let session_id = session["session_id"].as_str().unwrap().to_owned();

    let examples: u32 = std::env::var("KV_FUZZ_EXAMPLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(EXAMPLES);
    let schema_url = format!("{api}/v1/openapi.json");
    // `negative_data_rejection_on_the_wire` (see the file): negative data rejection, query strings
    // aside.
    let hooks_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz");
    let started = Instant::now();
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for (who, token) in [("admin", &admin), ("user", &user)] {
        let pinned_path = format!("id={session_id}");
        let passes: [(&str, Vec<&str>); 3] = [
            (
                "every operation",
                vec!["--exclude-operation-id", "stream_events"],
            ),
            // Followed, the stream lasts until the client gives up; not followed, it answers
            // the recent events and ends.
            (
                "the event stream, not followed",
                vec![
                    "--include-operation-id",
                    "stream_events",
                    "--set-query",
                    "follow=false",
                ],
            ),
            (
                "show, execute and services on a running session",
                vec![
                    "--set-path",
                    &pinned_path,
                    "--include-path-regex",
                    r"^/v1/sessions/\{id\}(/execute|/services.*)?$",
                    "--exclude-operation-id",
                    "delete_session",
                ],
            ),
        ];
        for (pass, extra) in passes {
            let t = Instant::now();
            let out = Command::new(&st)
                .current_dir(d)
                .env("SCHEMATHESIS_TELEMETRY", "false")
                .env("SCHEMATHESIS_HOOKS", "kv_fuzz_hooks")
                .env("PYTHONPATH", &hooks_dir)
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .args(["run", &schema_url])
                .args(["-H", &format!("Authorization: Bearer {token}")])
                .args(["--experimental", "openapi-3.1"])
                .args(["--checks", "all"])
                .args(["--exclude-checks", "negative_data_rejection"])
                .args(["--data-generation-method", "all"])
                .args([
                    "--experimental-negative-data-rejection-allowed-statuses",
                    "400,401,403,404,405,411,413,422",
                ])
                .args(["--hypothesis-max-examples", &examples.to_string()])
                .args(["--hypothesis-database", "none"])
                .args(["--hypothesis-suppress-health-check", "all"])
                .args(["--request-timeout", "60000"])
                .args(["--schemathesis-io-telemetry", "false"])
                .args(["--no-color", "--show-trace"])
                .args(&extra)
                .output()
                .expect("running schemathesis");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            let last = stdout
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim_matches(|c| c == '=' || c == ' ')
                .to_owned();
            // "Performed checks:" and its lines: how many responses each check passed.
            let checks: Vec<&str> = stdout
                .lines()
                .skip_while(|l| !l.starts_with("Performed checks"))
                .skip(1)
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            eprintln!(
                "schemathesis ({who} token, {pass}): {last} in {:.1} s\n    {}",
                t.elapsed().as_secs_f64(),
                checks.join("\n    ")
            );
            summary.push(format!("{who}, {pass}: {last}"));
            if !out.status.success() {
                failures.push(format!(
                    "---- schemathesis with the {who} token ({pass}) exited {}:\n{stdout}\n{stderr}",
                    out.status
                ));
            }
        }
    }
    eprintln!(
        "fuzz: {} runs in {:.1} s",
        summary.len(),
        started.elapsed().as_secs_f64()
    );
    let alive: Vec<bool> = procs
        .0
        .iter_mut()
        .map(|c| c.try_wait().unwrap().is_none())
        .collect();
    assert!(
        failures.is_empty(),
        "schemathesis found failures:\n{}\n\nmanager log (tail):\n{}\n\nagent log (tail):\n{}",
        failures.join("\n"),
        tail(&d.join("manager.log")),
        tail(&d.join("agent.log"))
    );
    assert_eq!(
        alive,
        vec![true, true],
        "manager, agent still running after the fuzz; logs: {}\n{}",
        tail(&d.join("manager.log")),
        tail(&d.join("agent.log"))
    );
}

//! Saving a session as an image, end to end: a manager and an agent as processes (CURVE, real
//! Docker engine, SQLite store), a real registry with basic auth (Debian's `docker-registry`,
//! `tests/common/registry.rs`) configured as the manager's `[[registry]]`:
//! - `ctl session commit ID IMAGE --push --wait` commits the session's container and pushes it
//!   (`committing` → `pushing` → `done`, bytes up to the total); the registry lists the tag
//!   (`GET /v2/<repo>/tags/list` with basic auth); `GET /v1/sessions/{id}/commit` shows it to
//!   its owner only; a bad reference and a session of another key are refused;
//! - a new session of the pushed image sees the file the first one wrote;
//! - `ctl agent purge-images` (admin; a user key is refused) refuses the image that session runs,
//!   naming its kernel, and removes it once the session is gone.
//!
//! - once its local copy is purged, a new session of the pushed image pulls it from the
//!   registry with the `[[registry]]` credentials and sees the file.
//!
//! Agent host ports: 34320–34339 (before the fixture's shift).

use crate::common;

use std::process::Command;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value as Json};

use common::cluster::{wait_for, Cluster, Db};
use common::registry::{TestRegistry, PASSWORD, USER};

/// Runs `kernelvisor ctl ARGS` against the cluster's manager with `token`: (exit code,
/// stdout, stderr).
fn ctl(c: &Cluster, token: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .arg("ctl")
        .args(args)
        .env("KERNELVISOR_API", &c.api)
        .env("KERNELVISOR_TOKEN", token)
        .output()
        .expect("run kernelvisor ctl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A cluster whose manager has the registry as `[[registry]]` (its password in a file) and
/// one agent, `ALIVE`.
fn cluster(registry: &TestRegistry) -> Cluster {
    let mut c = Cluster::new(Db::Sqlite);
    let pw = c.dir.path().join("registry-password");
    std::fs::write(&pw, format!("{PASSWORD}\n")).unwrap();
    // Ends the `[manager]` table of the generated config: `[store]` follows.
    c.manager_extra = format!(
        "\n[[registry]]\nname = \"test\"\nurl = \"{}\"\nusername = \"{USER}\"\npassword-file = \"{}\"\n",
        registry.url(),
        pw.display()
    );
    c.start_manager();
    let a = c.add_agent("commit-e2e", 34_320, "");
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", Duration::from_secs(30));
    c
}

/// Runs `code` in the session (one `query`, then `continue` until finished); its stdout.
fn exec(c: &Cluster, sid: &str, code: &str) -> String {
    let path = format!("/v1/sessions/{sid}/execute");
    let mut a = c.post(&path, &json!({"code": code}));
    let mut out = String::new();
    loop {
        assert_eq!(a.status, 200, "execute: {a:?}");
        for item in a.body["console"].as_array().into_iter().flatten() {
            if item[0] == "stdout" {
                out.push_str(item[1].as_str().unwrap_or_default());
            }
        }
        if a.body["status"] != "continued" {
            return out;
        }
        let run = a.body["runId"].clone();
        a = c.post(&path, &json!({"mode": "continue", "run_id": run}));
    }
}

/// A session of `image` (small slots); its id; asserts 201.
fn session_of(c: &Cluster, image: &str) -> String {
    let body = json!({"image": image, "resource_slots": {"cpu": 0.25, "mem": "64m"}});
    let a = c.post("/v1/sessions", &body);
    assert_eq!(a.status, 201, "create session of {image}: {a:?}");
    a.body["session_id"].as_str().unwrap().to_owned()
}

fn terminate(c: &Cluster, sid: &str) {
    let a = c.delete(&format!("/v1/sessions/{sid}"));
    assert_eq!(a.status, 200, "{a:?}");
}

/// `GET /v2/<repo>/tags/list` with the registry's credentials.
fn tags(registry: &TestRegistry, repo: &str) -> Json {
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    ureq::get(&format!("{}/v2/{repo}/tags/list", registry.url()))
        .set("Authorization", &format!("Basic {basic}"))
        .call()
        .expect("the registry lists the repository")
        .into_json()
        .unwrap()
}

/// Commits and pushes session `sid` as `reference` through `ctl … --push --wait`; checks the
/// commit's end and the registry.
fn commit_and_push(c: &Cluster, registry: &TestRegistry, sid: &str, repo: &str, reference: &str) {
    let (code, stdout, stderr) = ctl(
        c,
        &c.token,
        &["session", "commit", sid, reference, "--push", "--wait"],
    );
    assert_eq!(code, 0, "ctl session commit: {stdout}\n{stderr}");
    assert!(stdout.contains("done"), "{stdout}");
    assert!(
        stderr.contains("committing") && stderr.contains("done"),
        "{stderr}"
    );
    let a = c.get(&format!("/v1/sessions/{sid}/commit")).unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    let st = &a.body;
    assert_eq!(st["status"], "done", "{st}");
    assert_eq!(st["image"], reference);
    assert_eq!(st["push"], true);
    assert!(
        st["image_id"].as_str().unwrap().starts_with("sha256:"),
        "{st}"
    );
    let total = st["total_bytes"].as_u64().unwrap();
    assert!(
        total > 0 && st["current_bytes"].as_u64() == Some(total),
        "{st}"
    );
    assert!(st["finished_at"].as_f64().is_some(), "{st}");
    assert_eq!(tags(registry, repo)["tags"], json!(["1"]));
}

#[test]
fn a_session_committed_and_pushed_runs_again_and_its_image_is_purged() {
    let registry = TestRegistry::start();
    let c = cluster(&registry);
    let repo = format!("kv/e2e-{}", common::agent::run_id());
    let reference = format!("{}/{repo}:1", registry.host);
    let sid = session_of(&c, common::agent::TEST_IMAGE);
    let out = exec(
        &c,
        &sid,
        "echo kv-e2e-7 > /tmp/kv-e2e-marker && echo written",
    );
    assert!(out.contains("written"), "{out}");

    // Refusals: a bad reference, another key's session, no commit yet.
    let a = c.post(
        &format!("/v1/sessions/{sid}/commit"),
        &json!({"image": "Bad Name"}),
    );
    assert_eq!((a.status, a.code()), (400, "invalid-request"), "{a:?}");
    let a = c.get(&format!("/v1/sessions/{sid}/commit")).unwrap();
    assert_eq!((a.status, a.code()), (404, "commit-not-found"), "{a:?}");
    let (_, other) = c.new_key(false);
    let a = c.post_as(
        Some(&other),
        &format!("/v1/sessions/{sid}/commit"),
        &json!({"image": reference}),
    );
    assert_eq!((a.status, a.code()), (404, "session-not-found"), "{a:?}");

    commit_and_push(&c, &registry, &sid, &repo, &reference);
    let a = c
        .get_as(Some(&other), &format!("/v1/sessions/{sid}/commit"))
        .unwrap();
    assert_eq!(a.status, 404, "another key does not see it: {a:?}");

    // A new session of the pushed image (here the agent still has it) sees the file.
    let sid2 = session_of(&c, &reference);
    assert_eq!(exec(&c, &sid2, "cat /tmp/kv-e2e-marker").trim(), "kv-e2e-7");

    // purge-images: admin only; the image the new session runs is refused, naming its kernel.
    let agent = c.agents[0].id().to_owned();
    let (code, _, stderr) = ctl(&c, &c.token, &["agent", "purge-images", &agent, &reference]);
    assert_eq!(code, 1, "{stderr}");
    assert!(stderr.contains("forbidden"), "{stderr}");
    let (code, stdout, stderr) = ctl(
        &c,
        &c.admin_token,
        &["agent", "purge-images", &agent, &reference],
    );
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let kernel2 = c.get(&format!("/v1/sessions/{sid2}")).unwrap().body["kernel_id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        stdout.contains("not removed") && stdout.contains("in use") && stdout.contains(&kernel2),
        "{stdout}"
    );
    let a = c.post_as(
        Some(&c.admin_token),
        "/v1/agents/no-such-agent/images/purge",
        &json!({"images": [reference]}),
    );
    assert_eq!((a.status, a.code()), (404, "agent-not-found"), "{a:?}");

    // Once that session is gone, the image goes.
    terminate(&c, &sid2);
    let a = c.post_as(
        Some(&c.admin_token),
        &format!("/v1/agents/{agent}/images/purge"),
        &json!({"images": [reference]}),
    );
    assert_eq!(a.status, 200, "{a:?}");
    assert_eq!(
        a.body,
        json!({"agent_id": agent, "images": [{"image": reference, "removed": true, "error": null}]})
    );
    let gone = Command::new("docker")
        .args(["image", "inspect", &reference])
        .output()
        .unwrap();
    assert!(!gone.status.success(), "the local image is gone");
    terminate(&c, &sid);
    c.check_invariants();
}

/// The pushed image, its local copy purged, runs a new session: the agent pulls it with the
/// `[[registry]]` credentials.
#[test]
fn a_pushed_image_runs_on_an_agent_without_it() {
    let registry = TestRegistry::start();
    let c = cluster(&registry);
    let repo = format!("kv/e2e-pull-{}", common::agent::run_id());
    let reference = format!("{}/{repo}:1", registry.host);
    let sid = session_of(&c, common::agent::TEST_IMAGE);
    exec(&c, &sid, "echo kv-e2e-8 > /tmp/kv-e2e-marker");
    commit_and_push(&c, &registry, &sid, &repo, &reference);
    terminate(&c, &sid);
    let agent = c.agents[0].id().to_owned();
    let a = c.post_as(
        Some(&c.admin_token),
        &format!("/v1/agents/{agent}/images/purge"),
        &json!({"images": [reference]}),
    );
    assert_eq!(a.body["images"][0]["removed"], true, "{a:?}");
    let sid2 = session_of(&c, &reference);
    wait_for(Duration::from_secs(60), "the new session RUNNING", || {
        let s = c.get(&format!("/v1/sessions/{sid2}")).ok()?;
        (s.body["status"] == "RUNNING").then_some(())
    });
    assert_eq!(exec(&c, &sid2, "cat /tmp/kv-e2e-marker").trim(), "kv-e2e-8");
    terminate(&c, &sid2);
}

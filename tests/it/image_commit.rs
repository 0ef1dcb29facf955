//! Saving work and housekeeping through the agent's real ZeroMQ RPC on an in-process agent, the
//! real Docker engine and a real registry (Debian's `docker-registry` with basic auth,
//! `tests/common/registry.rs`; `just registry`):
//! - `commit` saves a kernel's container (a file it wrote outside `/home/work`) as an image in
//!   the background (`{"bgtask_id", "kernel", "path"}`, `get_commit_status`, `get_bgtask`);
//!   the image keeps its base's `ai.backend.service-ports` and command, the kernel's labels are
//!   emptied, the extra labels are added;
//! - `push_image` pushes it with the registry's credentials (bytes counted up to the total);
//!   the registry lists the tag (`GET /v2/<repo>/tags/list`, basic auth); a wrong password
//!   ends the task `RegistryAuthFailed`;
//! - `purge_images` removes the (unused) local copy, refuses an image a kernel uses (naming
//!   it), answers per image in upstream's shape;
//! - the image pulled back with the credentials (`ContainerBackend::pull_image` with a
//!   `RegistryAuth`: the agent-level half of a new session on another node) runs a new
//!   kernel that sees the file the first one wrote, and the image's services;
//! - the refusals: no `canonical`, `filename`, an unknown kernel or task.
//!
//! Agent host ports: 34300–34309 (before the fixture's shift).

use crate::common;

use std::time::Duration;

use base64::Engine as _;
use rmpv::Value;

use common::agent::*;
use common::registry::{TestRegistry, PASSWORD, USER};
use common::wait_until;
use kernelvisor::agent::backend::docker::DockerBackend;
use kernelvisor::agent::backend::{ContainerBackend, RegistryAuth};
use kernelvisor::agent::Agent;
use kernelvisor::config::OnShutdown;
use kernelvisor::rpc::Peer;

const MIB: u64 = 1 << 20;

/// The test image with the `ai.backend.service-ports` label (`web:http:8080,…`).
const SERVICES_IMAGE: &str = "kernelvisor-test:services";

/// Removes the named local images on drop (the test's committed and pulled copies).
struct RemoveImages(Vec<String>);

impl Drop for RemoveImages {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = std::process::Command::new("docker")
                .args(["rmi", "-f", image])
                .output();
        }
    }
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("{v} is not a string"))
}

/// The keys of a map value, sorted.
fn keys(v: &Value) -> Vec<String> {
    let mut k: Vec<String> = v
        .as_map()
        .unwrap_or_else(|| panic!("{v} is not a map"))
        .iter()
        .map(|(k, _)| s(k).to_owned())
        .collect();
    k.sort();
    k
}

/// Polls `get_bgtask` until the task ends (at most 120 s); its last state.
async fn task_end(peer: &Peer, bgtask_id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let state = call(peer, "get_bgtask", vec![bgtask_id.into()])
            .await
            .unwrap();
        if s(field(&state, "status")) != "ongoing" {
            return state;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "task {bgtask_id} still ongoing after 120 s: {state}"
        );
        actix_rt::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `GET /v2/<repo>/tags/list` on the registry, with basic auth when `auth`: (status, body).
fn tags_list(registry: &TestRegistry, repo: &str, auth: bool) -> (u16, serde_json::Value) {
    let mut req = ureq::get(&format!("{}/v2/{repo}/tags/list", registry.url()));
    if auth {
        let basic = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
        req = req.set("Authorization", &format!("Basic {basic}"));
    }
    match req.call() {
        Ok(r) => (r.status(), r.into_json().unwrap_or_default()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or_default()),
        Err(e) => panic!("the registry did not answer: {e}"),
    }
}

fn registry_conf(registry: &TestRegistry, password: &str) -> Value {
    map(vec![
        ("name", registry.host.clone().into()),
        ("url", registry.url().into()),
        ("username", USER.into()),
        ("password", password.into()),
    ])
}

fn image_ref(registry: &TestRegistry, name: &str, tag: &str) -> Value {
    map(vec![
        ("name", name.into()),
        ("project", Value::Nil),
        ("tag", tag.into()),
        ("registry", registry.host.clone().into()),
        ("architecture", std::env::consts::ARCH.into()),
        ("is_local", false.into()),
    ])
}

#[actix_rt::test]
async fn commit_push_purge_pull_and_run_from_the_registry() {
    let registry = TestRegistry::start();
    let fx = AgentFixture::new("commit", 34_300, 10);
    let agent = Agent::start(fx.config(""), None)
        .await
        .expect("agent starts (is the Docker engine up?)");
    let peer = client(agent.endpoint()).await;
    let repo = format!("kv/saved-{}", run_id());
    let reference = format!("{}/{repo}:1", registry.host);
    let _cleanup = RemoveImages(vec![reference.clone()]);

    // A kernel of the image with service ports writes a file the commit keeps, and one in
    // /home/work (its scratch bind mount) the commit does not.
    let k1 = uuid::Uuid::new_v4().to_string();
    let config = kernel_config("0.1", 32 * MIB, vec![("image", image(SERVICES_IMAGE))]);
    let created = create_one(&peer, "s-commit", &k1, config).await.unwrap();
    let cid = s(field(&created, "container_id")).to_owned();
    let out = docker(&[
        "exec",
        &cid,
        "sh",
        "-c",
        "echo kv-commit-42 > /tmp/kv-commit-marker && echo scratch > /home/work/kv-scratch && echo ok",
    ]);
    assert_eq!(out, "ok");

    // The refusals first.
    let r = call_kw(
        &peer,
        "commit",
        vec![k1.clone().into(), "kv_test".into()],
        vec![],
    )
    .await;
    assert_eq!(failure_name(&r), "InvalidArgument");
    let r = call_kw(
        &peer,
        "commit",
        vec![k1.clone().into(), "kv_test".into()],
        vec![("filename", "x.tar.gz".into())],
    )
    .await;
    assert_eq!(failure_name(&r), "NotImplemented");
    let r = call_kw(
        &peer,
        "commit",
        vec!["no-such-kernel".into(), "kv_test".into()],
        vec![("canonical", reference.clone().into())],
    )
    .await;
    assert_eq!(failure_name(&r), "KernelNotFound");
    let r = call(&peer, "get_bgtask", vec!["no-such-task".into()]).await;
    assert_eq!(failure_name(&r), "BgtaskNotFound");

    // commit: answered at once, done in the background.
    let reply = call_kw(
        &peer,
        "commit",
        vec![k1.clone().into(), "kv_test".into()],
        vec![
            ("canonical", reference.clone().into()),
            ("extra_labels", map(vec![("kv.test", "yes".into())])),
        ],
    )
    .await
    .unwrap();
    assert_eq!(keys(&reply), ["bgtask_id", "kernel", "path"], "{reply}");
    assert_eq!(s(field(&reply, "kernel")), k1);
    assert_eq!(field(&reply, "path"), &Value::Nil);
    let bgtask = s(field(&reply, "bgtask_id")).to_owned();
    uuid::Uuid::parse_str(&bgtask).expect("bgtask_id is a UUID");
    let st = call(
        &peer,
        "get_commit_status",
        vec![k1.clone().into(), "kv_test".into()],
    )
    .await
    .unwrap();
    assert_eq!(keys(&st), ["kernel", "status"], "{st}");
    assert!(
        ["ongoing", "ready"].contains(&s(field(&st, "status"))),
        "{st}"
    );
    let end = task_end(&peer, &bgtask).await;
    assert_eq!(s(field(&end, "status")), "done", "{end}");
    assert_eq!(s(field(&end, "kind")), "commit");
    assert!(s(field(&end, "image_id")).starts_with("sha256:"), "{end}");
    let st = call(
        &peer,
        "get_commit_status",
        vec![k1.clone().into(), "kv_test".into()],
    )
    .await
    .unwrap();
    assert_eq!(s(field(&st, "status")), "ready");

    // The image: the base's service ports and command, the kernel's labels emptied, ours added.
    let labels: serde_json::Value = serde_json::from_str(&docker(&[
        "image",
        "inspect",
        "-f",
        "{{json .Config.Labels}}",
        &reference,
    ]))
    .unwrap();
    assert_eq!(
        labels["ai.backend.service-ports"], "web:http:8080,broken:http:8081",
        "{labels}"
    );
    assert_eq!(labels["ai.backend.kernel-id"], "", "{labels}");
    assert_eq!(labels["ai.backend.agent-id"], "", "{labels}");
    assert_eq!(labels["kv.test"], "yes", "{labels}");
    let cmd = |image: &str| docker(&["image", "inspect", "-f", "{{json .Config.Cmd}}", image]);
    assert_eq!(cmd(&reference), cmd(SERVICES_IMAGE));

    // push_image with the registry's credentials.
    let reply = call(
        &peer,
        "push_image",
        vec![
            image_ref(&registry, &repo, "1"),
            registry_conf(&registry, PASSWORD),
        ],
    )
    .await
    .unwrap();
    assert_eq!(keys(&reply), ["bgtask_id", "canonical"], "{reply}");
    assert_eq!(s(field(&reply, "canonical")), reference);
    let end = task_end(&peer, s(field(&reply, "bgtask_id"))).await;
    assert_eq!(s(field(&end, "status")), "done", "{end}");
    let (cur, total) = (
        field(&end, "current_bytes").as_u64().unwrap(),
        field(&end, "total_bytes").as_u64().unwrap(),
    );
    assert!(total > 0 && cur == total, "{end}");
    assert_eq!(
        tags_list(&registry, &repo, false).0,
        401,
        "the registry wants credentials"
    );
    let (code, body) = tags_list(&registry, &repo, true);
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["tags"], serde_json::json!(["1"]), "{body}");

    // A wrong password: the task fails, named.
    let reply = call(
        &peer,
        "push_image",
        vec![
            image_ref(&registry, &repo, "1"),
            registry_conf(&registry, "wrong"),
        ],
    )
    .await
    .unwrap();
    let end = task_end(&peer, s(field(&reply, "bgtask_id"))).await;
    assert_eq!(s(field(&end, "status")), "failed", "{end}");
    assert_eq!(s(field(&end, "error_name")), "RegistryAuthFailed", "{end}");
    assert!(
        !s(field(&end, "message")).contains("wrong"),
        "no password in {end}"
    );

    // purge_images: the unused local copy goes; a missing image is reported, not a FAILURE.
    let r = call(
        &peer,
        "purge_images",
        vec![
            Value::Array(vec![reference.clone().into(), "kv-no-such-image:0".into()]),
            false.into(),
            false.into(),
        ],
    )
    .await
    .unwrap();
    assert_eq!(keys(&r), ["responses"], "{r}");
    let responses = field(&r, "responses").as_array().unwrap();
    assert_eq!(responses.len(), 2, "{r}");
    assert_eq!(keys(&responses[0]), ["error", "image"]);
    assert_eq!(s(field(&responses[0], "image")), reference);
    assert_eq!(field(&responses[0], "error"), &Value::Nil, "{r}");
    assert!(
        s(field(&responses[1], "error")).contains("no such local image"),
        "{r}"
    );
    assert!(
        inspect(&reference, "{{.Id}}").is_none(),
        "the local copy is gone"
    );

    // Pulled back with the credentials (what the image stage does for a new session on a node
    // without the image), then a new kernel of it sees the first kernel's file.
    let backend = DockerBackend::connect().await.unwrap();
    let auth = RegistryAuth {
        username: USER.into(),
        password: PASSWORD.into(),
        server: registry.host.clone(),
    };
    assert!(
        backend.pull_image(&reference, None, &|_| {}).await.is_err(),
        "an anonymous pull is refused"
    );
    backend
        .pull_image(&reference, Some(&auth), &|_| {})
        .await
        .unwrap();
    let k2 = uuid::Uuid::new_v4().to_string();
    let config = kernel_config("0.1", 32 * MIB, vec![("image", image(&reference))]);
    let created = create_one(&peer, "s-commit-2", &k2, config).await.unwrap();
    let cid2 = s(field(&created, "container_id")).to_owned();
    assert_eq!(
        docker(&["exec", &cid2, "cat", "/tmp/kv-commit-marker"]),
        "kv-commit-42"
    );
    assert_eq!(
        docker(&[
            "exec",
            &cid2,
            "sh",
            "-c",
            "test -e /home/work/kv-scratch && echo present || echo absent"
        ]),
        "absent",
        "the scratch mount is not part of the image"
    );
    assert_eq!(
        inspect(&cid2, "{{index .Config.Labels \"ai.backend.kernel-id\"}}").as_deref(),
        Some(k2.as_str())
    );
    let services = call(&peer, "list_services", vec![k2.clone().into()])
        .await
        .unwrap();
    assert!(services.to_string().contains("web"), "{services}");

    // purge_images refuses the image the new kernel runs, naming it; it stays.
    let r = call(
        &peer,
        "purge_images",
        vec![
            Value::Array(vec![reference.clone().into()]),
            false.into(),
            false.into(),
        ],
    )
    .await
    .unwrap();
    let e = s(field(
        &field(&r, "responses").as_array().unwrap()[0],
        "error",
    ))
    .to_owned();
    assert!(e.contains("in use") && e.contains(&k2), "{e}");
    assert!(inspect(&reference, "{{.Id}}").is_some());

    // Once the kernel is gone it may go.
    for (k, session) in [(&k1, "s-commit"), (&k2, "s-commit-2")] {
        call(
            &peer,
            "destroy_kernel",
            vec![k.as_str().into(), session.into()],
        )
        .await
        .unwrap();
    }
    wait_until(
        Duration::from_secs(30),
        "the kernels' containers are gone",
        || async { fx.containers().is_empty() },
    )
    .await;
    let r = call(
        &peer,
        "purge_images",
        vec![
            Value::Array(vec![reference.clone().into()]),
            false.into(),
            false.into(),
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        field(&field(&r, "responses").as_array().unwrap()[0], "error"),
        &Value::Nil,
        "{r}"
    );
    assert!(inspect(&reference, "{{.Id}}").is_none());
    agent.shutdown(OnShutdown::Terminate).await;
}

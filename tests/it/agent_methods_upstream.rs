//! The agent methods Backend.AI's manager calls beyond the kernel lifecycle, answered as
//! upstream (`ai.backend.agent.server.AgentRPCServer`, Backend.AI 26.x) answers them, through the
//! agent's real ZeroMQ RPC on the real Docker engine and the local test images
//! (`just test-image`):
//! - `health_v2` / `gather_hwinfo_v2` (the v3 `req` envelope) validate as `HealthResp` /
//!   `GatherHwinfoResp`; `health` and `gather_hwinfo` keep upstream's v1 shapes;
//!   `get_local_config` (agent id positional, as the manager passes it);
//! - `create_local_network` / `destroy_local_network`: a labelled bridge network, both
//!   idempotent, a network not ours left alone;
//! - `assign_port` / `release_port` from the agent's port pool;
//! - `check_pulling` is false, `check_and_pull` of no image answers no task (the image methods:
//!   tests/it/images.rs, and `purge_images`, `commit`, `push_image`: tests/it/image_commit.rs);
//! - files on a kernel whose image has no `find` (removed in the container): `upload_file`,
//!   `list_files` (JSON text as upstream's script prints it), `download_single`,
//!   `download_file` (a tar), and the 1 MiB cap;
//! - `start_service` answers `failed` with an `error` (not a FAILURE) as upstream's runner does;
//! - `shutdown_agent(terminate_kernels=True)` stops an agent process as SIGTERM does, its
//!   kernels destroyed.
//!
//! Agent host ports: 34000–34099 (before the fixture's shift).

use crate::common;

use std::io::Read;
use std::time::Duration;

use rmpv::Value;

use common::agent::*;
use common::wait_until;
use kernelvisor::agent::Agent;
use kernelvisor::config::OnShutdown;
use kernelvisor::rpc::Peer;

const MIB: u64 = 1 << 20;

async fn start(fx: &AgentFixture) -> Agent {
    Agent::start(fx.config(""), None)
        .await
        .expect("agent starts (is the Docker engine up?)")
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("{v} is not a string"))
}

/// RFC 3339 UTC as pydantic reads a `datetime`: `YYYY-MM-DDTHH:MM:SS[.ffffff]Z`.
fn is_rfc3339(t: &str) -> bool {
    let b = t.as_bytes();
    b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && t.ends_with('Z')
}

#[actix_rt::test]
async fn health_hwinfo_and_local_config_answer_upstream_shapes() {
    let fx = AgentFixture::new("up-node", 34000, 4);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    let envelope = |req: Value| vec![("req", req), ("agent_id", fx.agent_id.clone().into())];

    // health_v2: HealthResp {status, version, component, connectivity}.
    let h = call_kw(&peer, "health_v2", vec![], envelope(map(vec![])))
        .await
        .unwrap();
    assert_eq!(s(field(&h, "status")), "ok", "{h}");
    assert_eq!(s(field(&h, "component")), "agent");
    assert_eq!(s(field(&h, "version")), env!("CARGO_PKG_VERSION"));
    let conn = field(&h, "connectivity");
    assert_eq!(field(conn, "overall_healthy"), &Value::from(true));
    assert!(is_rfc3339(s(field(conn, "timestamp"))), "{conn}");
    let checks = field(conn, "connectivity_checks").as_array().unwrap();
    assert_eq!(checks.len(), 1, "{conn}");
    let docker = &checks[0];
    assert_eq!(s(field(docker, "service_group")), "container");
    assert_eq!(s(field(docker, "component_id")), "docker");
    assert_eq!(field(docker, "is_healthy"), &Value::from(true));
    assert!(is_rfc3339(s(field(docker, "last_checked_at"))));
    assert!(field(docker, "error_message").is_nil());
    // Upstream's envelope requires `req`; a call addressed to another agent is refused.
    assert_eq!(
        failure_name(&call(&peer, "health_v2", vec![]).await),
        "TypeError"
    );
    assert_eq!(
        failure_name(
            &call_kw(
                &peer,
                "health_v2",
                vec![],
                vec![("req", map(vec![])), ("agent_id", "someone-else".into())]
            )
            .await
        ),
        "AgentIdMismatch"
    );

    // health (v1): upstream's HealthResponse, plus the fields kernelvisor's tests read.
    let h1 = call(&peer, "health", vec![]).await.unwrap();
    assert_eq!(s(field(&h1, "status")), "ok");
    assert_eq!(s(field(&h1, "component")), "agent");
    assert_eq!(s(field(&h1, "agent_id")), fx.agent_id);
    let checks1 = field(field(&h1, "connectivity"), "connectivity_checks");
    assert_eq!(checks1.as_array().map(Vec::len), Some(1), "{h1}");
    assert!(field(&h1, "engine_error").is_nil());

    // gather_hwinfo (v1): {device: {status, status_info, metadata: {str: str}}}.
    let hw = call(&peer, "gather_hwinfo", vec![]).await.unwrap();
    let entries = hw.as_map().unwrap();
    assert!(
        entries.iter().any(|(k, _)| k.as_str() == Some("cpu")),
        "{hw}"
    );
    for (name, e) in entries {
        assert_eq!(s(field(e, "status")), "healthy", "{name}");
        assert!(field(e, "status_info").is_nil(), "{name}");
        for (k, v) in field(e, "metadata").as_map().unwrap() {
            assert!(k.is_str() && v.is_str(), "{name}: {k} = {v}");
        }
    }
    // gather_hwinfo_v2: {devices: [{device_name, status, status_info, metadata}]}, the same.
    let hw2 = call_kw(&peer, "gather_hwinfo_v2", vec![], envelope(map(vec![])))
        .await
        .unwrap();
    let devices = field(&hw2, "devices").as_array().unwrap();
    assert_eq!(devices.len(), entries.len(), "{hw2}");
    for d in devices {
        let name = s(field(d, "device_name"));
        let v1 = &entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .unwrap()
            .1;
        assert_eq!(field(d, "status"), field(v1, "status"));
        assert_eq!(field(d, "metadata"), field(v1, "metadata"));
    }
    let cpu = devices
        .iter()
        .find(|d| s(field(d, "device_name")) == "cpu")
        .unwrap();
    assert!(
        !s(field(field(cpu, "metadata"), "cores")).is_empty(),
        "{cpu}"
    );

    // get_local_config(agent_id): upstream's keys, and the agent's own.
    let lc = call(&peer, "get_local_config", vec![fx.agent_id.clone().into()])
        .await
        .unwrap();
    let a = field(&lc, "agent");
    assert_eq!(s(field(a, "abuse-report-path")), "");
    assert_eq!(s(field(a, "id")), fx.agent_id);
    assert_eq!(s(field(a, "backend")), "docker");
    assert_eq!(
        s(field(a, "rpc-listen-addr")),
        format!("127.0.0.1:{}", fx.rpc_port)
    );
    assert_eq!(field(&lc, "watcher"), &Value::Map(vec![]));
    let range = field(field(&lc, "container"), "port-range")
        .as_array()
        .unwrap();
    assert_eq!(range[0].as_u64(), Some(u64::from(fx.port_range.0)));
    assert!(field(field(field(&lc, "resource"), "slots"), "cpu").is_str());
    let text = lc.to_string();
    assert!(
        !text.contains("key_secret") && !text.contains("keypair"),
        "{text}"
    );
    assert_eq!(
        failure_name(&call(&peer, "get_local_config", vec!["someone-else".into()]).await),
        "AgentIdMismatch"
    );
    agent.shutdown(OnShutdown::Terminate).await;
}

fn networks(name: &str) -> Vec<String> {
    docker(&[
        "network",
        "ls",
        "--filter",
        &format!("name=^{name}$"),
        "--format",
        "{{.Name}}",
    ])
    .lines()
    .map(str::to_owned)
    .collect()
}

#[actix_rt::test]
async fn local_networks_ports_and_image_checks() {
    let fx = AgentFixture::new("up-net", 34020, 3);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;

    // A labelled bridge network, made once however often it is asked for.
    let name = format!("kv-test-net-{}", run_id());
    for _ in 0..2 {
        let r = call(&peer, "create_local_network", vec![name.clone().into()]).await;
        assert_eq!(r.unwrap(), Value::Nil);
    }
    assert_eq!(networks(&name), vec![name.clone()]);
    let labels = docker(&["network", "inspect", "-f", "{{json .Labels}}", &name]);
    let labels: serde_json::Value = serde_json::from_str(&labels).unwrap();
    assert_eq!(labels["ai.backend.cluster-network"], "1", "{labels}");
    assert_eq!(
        labels["ai.backend.agent-id"],
        fx.agent_id.as_str(),
        "{labels}"
    );
    assert_eq!(
        docker(&["network", "inspect", "-f", "{{.Driver}}", &name]),
        "bridge"
    );
    // Destroyed (by the name the manager's client passes as a keyword), then gone is fine.
    let r = call_kw(
        &peer,
        "destroy_local_network",
        vec![],
        vec![("network_ref_name", name.clone().into())],
    )
    .await;
    assert_eq!(r.unwrap(), Value::Nil);
    assert!(networks(&name).is_empty());
    let r = call(&peer, "destroy_local_network", vec![name.clone().into()]).await;
    assert_eq!(r.unwrap(), Value::Nil);
    // A network the agent did not make is left alone.
    let foreign = format!("kv-test-foreign-{}", run_id());
    docker(&["network", "create", &foreign]);
    let r = call(&peer, "destroy_local_network", vec![foreign.clone().into()]).await;
    assert_eq!(failure_name(&r), "NetworkNotOwned");
    assert_eq!(networks(&foreign), vec![foreign.clone()]);
    docker(&["network", "rm", &foreign]);

    // Host ports from the pool (3 here), held until released.
    let mut ports = Vec::new();
    for _ in 0..3 {
        let p = call(&peer, "assign_port", vec![]).await.unwrap();
        ports.push(p.as_u64().unwrap() as u16);
    }
    ports.sort_unstable();
    assert_eq!(
        ports,
        (fx.port_range.0..=fx.port_range.1).collect::<Vec<_>>()
    );
    assert_eq!(
        failure_name(&call(&peer, "assign_port", vec![]).await),
        "ResourceExhausted"
    );
    assert_eq!(usage(&peer).await.2, 0);
    let r = call(&peer, "release_port", vec![ports[1].into()]).await;
    assert_eq!(r.unwrap(), Value::Nil);
    // A port it did not hand out is not released (it may be a kernel's).
    let r = call(&peer, "release_port", vec![ports[1].into()]).await;
    assert_eq!(r.unwrap(), Value::Nil);
    tokio::time::sleep(Duration::from_millis(200)).await; // The pool's reuse cooldown.
    assert_eq!(usage(&peer).await.2, 1);
    let again = call(&peer, "assign_port", vec![]).await.unwrap();
    assert_eq!(again.as_u64(), Some(u64::from(ports[1])));

    // Image methods.
    let r = call(&peer, "check_pulling", vec!["python:3.12".into()]).await;
    assert_eq!(r.unwrap(), Value::from(false));
    let r = call(&peer, "check_and_pull", vec![map(vec![])]).await;
    assert_eq!(r.unwrap(), map(vec![]), "no image, no task");
    agent.shutdown(OnShutdown::Terminate).await;
}

/// The entries of upstream's `list_files` answer: its `files` JSON text parsed.
fn listed(reply: &Value) -> Vec<serde_json::Value> {
    let text = s(field(reply, "files"));
    assert!(text.ends_with('\n'), "{text:?}");
    serde_json::from_str::<Vec<serde_json::Value>>(text).unwrap()
}

fn entry<'a>(files: &'a [serde_json::Value], name: &str) -> &'a serde_json::Value {
    files
        .iter()
        .find(|f| f["filename"] == name)
        .unwrap_or_else(|| panic!("{name} not in {files:?}"))
}

fn bytes_of(v: Value) -> Vec<u8> {
    match v {
        Value::Binary(b) => b,
        other => panic!("not bytes: {other}"),
    }
}

async fn upload(peer: &Peer, kid: &str, path: &str, data: &[u8]) {
    let r = call(
        peer,
        "upload_file",
        vec![kid.into(), path.into(), Value::Binary(data.to_vec())],
    )
    .await;
    assert_eq!(r.unwrap(), Value::Nil, "upload {path}");
}

#[actix_rt::test]
async fn files_on_an_image_without_find() {
    let fx = AgentFixture::new("up-files", 34040, 4);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    let kid = format!("k-{}", run_id());
    let info = create_one(
        &peer,
        "s-files",
        &kid,
        kernel_config("0.1", 32 * MIB, vec![]),
    )
    .await
    .unwrap();
    let cid = s(field(&info, "container_id")).to_owned();
    // No `find` (nor `stat`) in the kernel any more.
    docker(&[
        "exec",
        "-u",
        "0",
        &cid,
        "rm",
        "-f",
        "/bin/find",
        "/bin/stat",
    ]);
    assert_eq!(
        docker(&[
            "exec",
            &cid,
            "sh",
            "-c",
            "test -e /bin/find -o -e /bin/stat || echo none"
        ]),
        "none"
    );

    let note = b"kv upstream \x00\x01\xff\n".repeat(50);
    upload(&peer, &kid, "note.bin", &note).await;
    upload(&peer, &kid, "sub/dir/deep.txt", b"deep").await;
    upload(&peer, &kid, "sub/top.txt", b"top").await;
    docker(&["exec", &cid, "ln", "-s", "note.bin", "/home/work/link"]);

    // Upstream's shape: {"files": JSON text, "errors", "abspath"}, one level deep.
    let l = call(&peer, "list_files", vec![kid.clone().into(), ".".into()])
        .await
        .unwrap();
    assert_eq!(s(field(&l, "errors")), "", "{l}");
    assert_eq!(s(field(&l, "abspath")), ".");
    let files = listed(&l);
    let names: Vec<&str> = files
        .iter()
        .map(|f| f["filename"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["link", "note.bin", "sub"], "{l}");
    let n = entry(&files, "note.bin");
    assert_eq!(n["size"], note.len());
    assert_eq!(n["mode"], "-rw-r--r--");
    let keys: Vec<&str> = n.as_object().unwrap().keys().map(String::as_str).collect();
    for k in ["mode", "size", "ctime", "mtime", "atime", "filename"] {
        assert!(keys.contains(&k), "{k} in {n}");
    }
    assert!(n["mtime"].as_f64().unwrap() > 1.6e9, "{n}");
    assert!(entry(&files, "sub")["mode"]
        .as_str()
        .unwrap()
        .starts_with('d'));
    assert_eq!(entry(&files, "link")["mode"], "lrwxrwxrwx");
    assert_eq!(entry(&files, "link")["size"], "note.bin".len());
    let sub = call(&peer, "list_files", vec![kid.clone().into(), "sub".into()])
        .await
        .unwrap();
    let sub_files = listed(&sub);
    assert_eq!(sub_files.len(), 2, "{sub}");
    assert_eq!(entry(&sub_files, "top.txt")["size"], 3);
    // A missing directory: empty `files` and the reason, as upstream's script prints it.
    let missing = call(&peer, "list_files", vec![kid.clone().into(), "nope".into()])
        .await
        .unwrap();
    assert_eq!(s(field(&missing, "files")), "");
    assert!(
        s(field(&missing, "errors")).contains("FileNotFoundError"),
        "{missing}"
    );
    // Escapes stay refused.
    let r = call(
        &peer,
        "list_files",
        vec![kid.clone().into(), "../..".into()],
    )
    .await;
    assert_eq!(failure_name(&r), "InvalidPath");
    // kernelvisor's rich listing, with `opts`.
    let rich = call(
        &peer,
        "list_files",
        vec![kid.clone().into(), "".into(), map(vec![])],
    )
    .await
    .unwrap();
    let rich_files = field(&rich, "files").as_array().unwrap();
    assert_eq!(rich_files.len(), 3, "{rich}");
    let sub_rich = rich_files
        .iter()
        .find(|f| s(field(f, "name")) == "sub")
        .unwrap();
    assert_eq!(s(field(sub_rich, "type")), "dir");
    assert_eq!(field(&rich, "truncated"), &Value::from(false));

    // download_single: the file's bytes; a directory is refused.
    let got = call(
        &peer,
        "download_single",
        vec![kid.clone().into(), "note.bin".into()],
    )
    .await
    .unwrap();
    assert_eq!(bytes_of(got), note);
    let r = call(
        &peer,
        "download_single",
        vec![kid.clone().into(), "sub".into()],
    )
    .await;
    assert_eq!(failure_name(&r), "InvalidPath");

    // download_file: a tar of the path (a directory with everything under it).
    let tar = bytes_of(
        call(
            &peer,
            "download_file",
            vec![kid.clone().into(), "sub".into()],
        )
        .await
        .unwrap(),
    );
    let mut archive = tar::Archive::new(&tar[..]);
    let mut seen = Vec::new();
    for e in archive.entries().unwrap() {
        let mut e = e.unwrap();
        let path = e.path().unwrap().display().to_string();
        let mut body = String::new();
        e.read_to_string(&mut body).unwrap();
        seen.push((path.trim_end_matches('/').to_owned(), body));
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("sub".into(), String::new()),
            ("sub/dir".into(), String::new()),
            ("sub/dir/deep.txt".into(), "deep".into()),
            ("sub/top.txt".into(), "top".into()),
        ]
    );

    // Upstream's 1 MiB cap: a larger file is refused by both, whole.
    let big = vec![7u8; (MIB + MIB / 2) as usize];
    upload(&peer, &kid, "big.bin", &big).await;
    for method in ["download_file", "download_single"] {
        let r = call(&peer, method, vec![kid.clone().into(), "big.bin".into()]).await;
        assert_eq!(failure_name(&r), "FileTooLarge", "{method}");
        let kernelvisor::rpc::CallError::Failure(meta) = r.unwrap_err() else {
            unreachable!()
        };
        assert!(meta.repr.contains("1 MiB"), "{method}: {}", meta.repr);
    }
    // Still downloadable with kernelvisor's `opts` (here in one chunk: a download left open
    // would hold the container until the agent's idle reaper drops it).
    let whole = call(
        &peer,
        "download_single",
        vec![
            kid.clone().into(),
            "big.bin".into(),
            map(vec![("chunk_size", (2 * MIB as usize).into())]),
        ],
    )
    .await
    .unwrap();
    assert_eq!(field(&whole, "size").as_u64(), Some(big.len() as u64));
    assert_eq!(field(&whole, "eof"), &Value::from(true));
    assert_eq!(bytes_of(field(&whole, "data").clone()), big);
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn start_service_answers_failed_as_upstream() {
    let fx = AgentFixture::new("up-svc", 34060, 10);
    let agent = start(&fx).await;
    let peer = client(agent.endpoint()).await;
    let kid = format!("k-{}", run_id());
    let config = kernel_config(
        "0.1",
        32 * MIB,
        vec![("image", image("kernelvisor-test:services"))],
    );
    create_one(&peer, "s-svc", &kid, config).await.unwrap();
    let start = |name: &str| {
        call(
            &peer,
            "start_service",
            vec![kid.clone().into(), name.into(), map(vec![])],
        )
    };

    let r = start("web").await.unwrap();
    assert_eq!(s(field(&r, "status")), "started", "{r}");
    assert!(field(&r, "error").is_nil(), "{r}");
    assert_eq!(s(field(&start("web").await.unwrap(), "status")), "running");
    let r = start("nope").await.unwrap();
    assert_eq!(s(field(&r, "status")), "failed", "{r}");
    assert!(s(field(&r, "error")).contains("nope"), "{r}");
    assert_eq!(s(field(&r, "error_name")), "ServiceNotFound");
    let r = start("broken").await.unwrap();
    assert_eq!(s(field(&r, "status")), "failed", "{r}");
    assert_eq!(s(field(&r, "error_name")), "ServiceStartFailed");
    assert!(s(field(&r, "output")).contains("missing config"), "{r}");

    let r = call(
        &peer,
        "shutdown_service",
        vec![kid.clone().into(), "web".into()],
    )
    .await
    .unwrap();
    assert_eq!(s(field(&r, "status")), "stopped");
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn shutdown_agent_stops_the_process_and_destroys_its_kernels() {
    let fx = AgentFixture::new("up-stop", 34080, 4);
    let config = fx.write_config("");
    let mut child = spawn_agent_process(&fx, &config);
    let peer = connect_process(&fx).await;
    let kid = format!("k-{}", run_id());
    create_one(
        &peer,
        "s-stop",
        &kid,
        kernel_config("0.1", 32 * MIB, vec![]),
    )
    .await
    .unwrap();
    assert_eq!(fx.containers().len(), 1);

    let r = call(&peer, "shutdown_agent", vec![true.into()]).await;
    assert_eq!(r.unwrap(), Value::Nil);
    wait_until(Duration::from_secs(60), "the agent process exits", || {
        let exited = child.try_wait().unwrap().is_some();
        async move { exited }
    })
    .await;
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "{status}; log:\n{}",
        read(&fx.dir.path().join("agent.log"))
    );
    assert!(fx.containers().is_empty(), "kernels destroyed");
}

//! Config files and `kernelvisor keygen`: samples parse, mistakes name their key, and the
//! certificate files are readable by pyzmq's `zmq.auth.load_certificate`.

use crate::common;

use std::path::Path;
use std::process::Command;

use kernelvisor::config::{AgentConfig, ManagerConfig};

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

#[test]
fn sample_configs_parse_with_documented_defaults() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let agent = AgentConfig::load(&root.join("configs/agent.toml")).unwrap();
    assert_eq!(
        agent.agent.rpc_listen_addr.zmq_endpoint(),
        "tcp://0.0.0.0:6011"
    );
    let manager = ManagerConfig::load(&root.join("configs/manager.toml")).unwrap();
    assert_eq!(
        manager.agent_pool.spec(),
        kernelvisor::manager::pool::PoolSpec::default()
    );
    AgentConfig::load(&root.join("configs/dev/agent.toml")).unwrap();
    ManagerConfig::load(&root.join("configs/dev/manager.toml")).unwrap();
}

#[test]
fn unknown_keys_and_bad_values_are_errors_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let typo = write(
        dir.path(),
        "a.toml",
        "[agent]\nid = \"a\"\nrpc-listen-adr = { host = \"x\", port = 1 }\n",
    );
    let err = AgentConfig::load(&typo).unwrap_err().to_string();
    assert!(err.contains("rpc-listen-adr"), "{err}");
    let bad_port = write(
        dir.path(),
        "b.toml",
        "[agent]\nid = \"a\"\nrpc-listen-addr = { host = \"x\", port = 70000 }\n",
    );
    let err = AgentConfig::load(&bad_port).unwrap_err().to_string();
    assert!(err.contains("port") && err.contains("70000"), "{err}");
    let half_curve = write(
        dir.path(),
        "c.toml",
        "[agent]\nid = \"a\"\nrpc-auth-agent-keypair = \"k\"\n",
    );
    let err = AgentConfig::load(&half_curve).unwrap_err().to_string();
    assert!(err.contains("rpc-auth-manager-public-key"), "{err}");
    let negative = write(
        dir.path(),
        "m.toml",
        "[agent-pool]\nhealth-check-interval = -1\n",
    );
    let err = ManagerConfig::load(&negative).unwrap_err().to_string();
    assert!(
        err.contains("health-check-interval") && err.contains("positive"),
        "{err}"
    );
    let zero = write(
        dir.path(),
        "n.toml",
        "[agent-pool]\nfailure-threshold = 0\n",
    );
    let err = ManagerConfig::load(&zero).unwrap_err().to_string();
    assert!(err.contains("agent-pool.failure-threshold"), "{err}");
    let unknown_section = write(dir.path(), "o.toml", "[agent-pol]\n");
    assert!(ManagerConfig::load(&unknown_section)
        .unwrap_err()
        .to_string()
        .contains("agent-pol"));
}

/// `[agent] scaling-group` and Backend.AI 26.8+'s spelling of it, `initial-resource-group-name`
/// (BEP-1059): either names the scaling group, both only when they agree.
#[test]
fn the_resource_group_is_read_in_either_spelling() {
    let dir = tempfile::tempdir().unwrap();
    let load = |name: &str, keys: &str| {
        AgentConfig::load(&write(
            dir.path(),
            name,
            &format!("[agent]\nid = \"a\"\n{keys}"),
        ))
    };
    assert_eq!(
        load("none.toml", "").unwrap().agent.scaling_group(),
        "default"
    );
    assert_eq!(
        load("old.toml", "scaling-group = \"gpu\"\n")
            .unwrap()
            .agent
            .scaling_group(),
        "gpu"
    );
    assert_eq!(
        load("new.toml", "initial-resource-group-name = \"gpu\"\n")
            .unwrap()
            .agent
            .scaling_group(),
        "gpu"
    );
    let both = "scaling-group = \"gpu\"\ninitial-resource-group-name = \"gpu\"\n";
    assert_eq!(
        load("both.toml", both).unwrap().agent.scaling_group(),
        "gpu"
    );
    let err = load(
        "disagree.toml",
        "scaling-group = \"gpu\"\ninitial-resource-group-name = \"cpu\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("initial-resource-group-name")
            && err.contains("scaling-group")
            && err.contains("\"gpu\"")
            && err.contains("\"cpu\""),
        "{err}"
    );
    let err = load("empty.toml", "initial-resource-group-name = \" \"\n")
        .unwrap_err()
        .to_string();
    assert!(err.contains("agent.initial-resource-group-name"), "{err}");
}

#[test]
fn keygen_writes_certificates_pyzmq_reads() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .args(["keygen", "manager", "--dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours =
        kernelvisor::rpc::curve::load_keypair(&dir.path().join("manager.key_secret")).unwrap();
    let script = "import sys, zmq.auth\npub, sec = zmq.auth.load_certificate(sys.argv[1])\npub2, none = zmq.auth.load_certificate(sys.argv[2])\nassert none is None and pub == pub2\nprint(pub.decode(), sec.decode())";
    let py = Command::new(common::python())
        .args(["-c", script])
        .arg(dir.path().join("manager.key_secret"))
        .arg(dir.path().join("manager.key"))
        .output()
        .unwrap();
    assert!(
        py.status.success(),
        "{}",
        String::from_utf8_lossy(&py.stderr)
    );
    let stdout = String::from_utf8(py.stdout).unwrap();
    let (public, secret) = stdout.trim().split_once(' ').unwrap();
    assert_eq!(public, ours.public.to_z85());
    assert_eq!(secret, ours.secret.to_z85());
}

#[test]
fn container_and_resource_sections_parse_sizes_and_refuse_nonsense() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let sample = AgentConfig::load(&root.join("configs/agent.toml")).unwrap();
    assert_eq!(sample.container.port_range, [30000, 31000]);
    assert_eq!(sample.resource.reserved_mem.0, 1 << 30);
    assert_eq!(sample.container.default_shmem.0, 64 << 20);
    assert_eq!(
        sample.agent.on_shutdown,
        kernelvisor::config::OnShutdown::Preserve
    );

    let dir = tempfile::tempdir().unwrap();
    let ok = write(dir.path(), "ok.toml", "[agent]\nid = \"a\"\nbackend = \"dummy\"\non-shutdown = \"terminate\"\n[resource]\nreserved-mem = 268435456\nmem = \"2g\"\n[container]\nscratch-size = \"512m\"\ndocker-host = \"unix:///run/kv/docker.sock\"\n");
    let c = AgentConfig::load(&ok).unwrap();
    assert_eq!(
        c.container.docker_host.as_deref(),
        Some("unix:///run/kv/docker.sock")
    );
    assert_eq!(sample.container.docker_host, None);
    assert_eq!(c.agent.backend, kernelvisor::config::BackendKind::Dummy);
    assert_eq!(c.resource.mem.unwrap().0, 2 << 30);
    assert_eq!(c.container.scratch_size.unwrap().0, 512 << 20);
    assert_eq!(c.accelerator.cuda, None, "auto-detect by default");
    let mock = write(dir.path(), "mock.toml", "[agent]\nid = \"a\"\n[accelerator]\ncuda = false\n[[accelerator.mock.devices]]\nid = \"g0\"\nmemory = \"16g\"\n[[accelerator.mock.devices]]\nid = \"g1\"\nmemory = 1024\nslot = \"cuda.shares\"\n");
    let m = AgentConfig::load(&mock).unwrap();
    assert_eq!(m.accelerator.cuda, Some(false));
    let d = &m.accelerator.mock.devices;
    assert_eq!(
        (
            d[0].slot.as_str(),
            d[0].memory.0,
            d[1].slot.as_str(),
            d[1].memory.0
        ),
        ("cuda.device", 16 << 30, "cuda.shares", 1024)
    );
    for (text, key) in [
        (
            "[container]\nport-range = [31000, 30000]\n",
            "container.port-range",
        ),
        ("[resource]\nreserved-mem = \"lots\"\n", "reserved-mem"),
        ("[resource]\nreserved-cpu = -1\n", "resource.reserved-cpu"),
        (
            "[agent]\nkernel-creation-concurrency = 0\n",
            "kernel-creation-concurrency",
        ),
        ("[container]\nscratch-rooot = \"/x\"\n", "scratch-rooot"),
        ("[agent]\non-shutdown = \"explode\"\n", "explode"),
        (
            "[container]\ndocker-host = \"tcp://10.0.0.1:2375\"\n",
            "container.docker-host",
        ),
        ("[accelerator]\nrocm = true\n", "rocm"),
        (
            "[[accelerator.mock.devices]]\nid = \"0\"\nmemory = \"1g\"\ncolour = 1\n",
            "colour",
        ),
        (
            "[[accelerator.mock.devices]]\nid = \"0\"\nmemory = \"1g\"\n[[accelerator.mock.devices]]\nid = \"0\"\nmemory = \"1g\"\n",
            "accelerator.mock.devices",
        ),
        (
            "[[accelerator.mock.devices]]\nid = \"0\"\nmemory = \"1g\"\nslot = \"cuda.whatever\"\n",
            "accelerator.mock.devices",
        ),
    ] {
        let text = if text.starts_with("[agent]") {
            format!("{}\nid = \"a\"\n", text.trim_end())
        } else {
            format!("[agent]\nid = \"a\"\n{text}")
        };
        let p = write(dir.path(), "bad.toml", &text);
        let err = AgentConfig::load(&p).unwrap_err().to_string();
        assert!(err.contains(key), "{key}: {err}");
    }
}

#[test]
fn manager_sections_defaults_and_checks_name_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let m = ManagerConfig::load(&root.join("configs/manager.toml")).unwrap();
    assert_eq!(
        m.manager.event_listen_addr.zmq_endpoint(),
        "tcp://0.0.0.0:6021"
    );
    assert_eq!(m.api.listen_addr.port, 8081);
    assert_eq!(
        m.manager.heartbeat_timeout.0,
        std::time::Duration::from_secs(40)
    );
    assert_eq!(m.store.url, "sqlite://var/manager/manager.db");
    assert!(m.access_keys.is_empty());
    assert_eq!(
        m.api.admin_token_file,
        std::path::PathBuf::from("var/manager/admin-token")
    );
    for (text, key) in [
        (
            "[manager]\nheartbeat-interval = 20\nstartup-grace = 30\n",
            "manager.startup-grace",
        ),
        (
            "[manager]\nheartbeat-interval = 20\nheartbeat-timeout = 10\n",
            "manager.heartbeat-timeout",
        ),
        (
            "[manager]\nrpc-keypair = \"m.key_secret\"\n",
            "manager.agent-keys-dir",
        ),
        ("[store]\nurl = \"mysql://x\"\n", "store.url"),
        ("[api]\nworkers = 0\n", "api.workers"),
        (
            "[[access-keys]]\naccess-key = \"A\"\n",
            "ctl access-key create",
        ),
        ("[scheduler]\ncreate-timeuot = 3\n", "create-timeuot"),
    ] {
        let p = write(dir.path(), "m.toml", text);
        let err = ManagerConfig::load(&p).unwrap_err().to_string();
        assert!(err.contains(key), "{text} → {err}");
    }
}

#[test]
fn redis_section_and_scaling_group() {
    let dir = tempfile::tempdir().unwrap();
    // Defaults: no bus, scaling group "default".
    let plain = write(dir.path(), "p.toml", "[agent]\nid = \"a\"\n");
    let c = AgentConfig::load(&plain).unwrap();
    assert!(c.redis.is_none());
    assert_eq!(c.agent.scaling_group(), "default");

    let full = write(
        dir.path(),
        "r.toml",
        "[agent]\nid = \"a\"\nscaling-group = \"gpu\"\n\
         [redis]\naddr = { host = \"127.0.0.1\", port = 6390 }\npassword = \"s3cret-pw\"\n",
    );
    let c = AgentConfig::load(&full).unwrap();
    assert_eq!(c.agent.scaling_group(), "gpu");
    let r = c.redis.as_ref().unwrap();
    assert_eq!((r.addr.host.as_str(), r.addr.port), ("127.0.0.1", 6390));
    assert_eq!(r.password.as_deref(), Some("s3cret-pw"));
    assert_eq!(r.outbox_max_events, 100_000);
    // The password never shows in a Debug rendering (logs of the config).
    let shown = format!("{c:?}");
    assert!(!shown.contains("s3cret-pw"), "{shown}");
    assert!(shown.contains("<redacted>"), "{shown}");

    // Unknown keys are refused, naming the key.
    let typo = write(
        dir.path(),
        "t.toml",
        "[agent]\nid = \"a\"\n[redis]\naddr = { host = \"h\", port = 1 }\ndb = 4\n",
    );
    let err = AgentConfig::load(&typo).unwrap_err().to_string();
    assert!(err.contains("db"), "{err}");
    // The address is a table like every other host/port setting.
    let flat = write(
        dir.path(),
        "f.toml",
        "[agent]\nid = \"a\"\n[redis]\naddr = \"127.0.0.1:6379\"\n",
    );
    let err = AgentConfig::load(&flat).unwrap_err().to_string();
    assert!(err.contains("addr"), "{err}");
    let no_addr = write(dir.path(), "n.toml", "[agent]\nid = \"a\"\n[redis]\n");
    let err = AgentConfig::load(&no_addr).unwrap_err().to_string();
    assert!(err.contains("addr"), "{err}");
    let empty_group = write(
        dir.path(),
        "g.toml",
        "[agent]\nid = \"a\"\nscaling-group = \" \"\n",
    );
    let err = AgentConfig::load(&empty_group).unwrap_err().to_string();
    assert!(err.contains("agent.scaling-group"), "{err}");
}

//! What a Backend.AI `KernelCreationConfig` asks for is done, on the real engine: `uid` /
//! `main_gid` / `supplementary_gids` (user code and files in a vfolder belong to that user),
//! `environ`, `bootstrap_script` (run once before `RUNNING`; a failing one fails the create and
//! leaves nothing), `startup_command`, `preopen_ports`, `allocated_host_ports`, `mounts` in
//! `VFolderMount` shape with `kernel_path`, `cluster_hostname`. Needs `just test-image`.

use crate::common;

use std::os::unix::fs::MetadataExt;

use rmpv::Value;

use common::agent::*;
use kernelvisor::agent::Agent;
use kernelvisor::config::OnShutdown;

const MIB: u64 = 1 << 20;

async fn run(peer: &kernelvisor::rpc::Peer, kernel: &str, code: &str) -> String {
    let out = call(
        peer,
        "execute",
        vec![
            "s-cfg".into(),
            kernel.into(),
            2.into(),
            format!("r-{}", run_id()).into(),
            "query".into(),
            code.into(),
            map(vec![]),
            Value::Nil,
        ],
    )
    .await
    .unwrap();
    assert_eq!(field(&out, "status").as_str(), Some("finished"), "{out:?}");
    field(&out, "console")
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c.as_array()?.get(1)?.as_str().map(str::to_owned))
        .collect()
}

/// Waits until the kernel reports `RUNNING` again (after a restart).
async fn wait_running(peer: &kernelvisor::rpc::Peer, kernel: &str) {
    for _ in 0..100 {
        let k = call(peer, "get_kernel", vec![kernel.into()]).await.unwrap();
        if field(&k, "status").as_str() == Some("RUNNING") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{kernel} not RUNNING again");
}

#[actix_rt::test]
async fn the_upstream_config_is_honoured_on_the_real_engine() {
    let fx = AgentFixture::new("bai-cfg", 34100, 8);
    let agent = Agent::start(fx.config(""), None)
        .await
        .expect("agent starts");
    let peer = client(agent.endpoint()).await;
    let vf = fx.vfolder_root().join("shared");
    std::fs::create_dir_all(&vf).unwrap();
    std::fs::set_permissions(&vf, std::os::unix::fs::PermissionsExt::from_mode(0o777)).unwrap();
    let free = {
        // A free port of the agent's range, given as the manager's `allocated_host_ports`.
        let (lo, hi) = fx.port_range;
        hi.min(lo + 7)
    };
    let kid = format!("k-{}", run_id());
    let config = kernel_config(
        "0.5",
        64 * MIB,
        vec![
            ("uid", 1234.into()),
            ("main_gid", 2345.into()),
            ("supplementary_gids", Value::Array(vec![3456.into()])),
            ("environ", map(vec![("GREETING", "hello".into())])),
            (
                "bootstrap_script",
                "echo boot:$(id -u) >> /home/work/bootstrapped".into(),
            ),
            ("cluster_hostname", "main1".into()),
            ("preopen_ports", Value::Array(vec![9000.into()])),
            ("allocated_host_ports", Value::Array(vec![free.into()])),
            (
                "mounts",
                Value::Array(vec![map(vec![
                    ("name", "shared".into()),
                    ("vfid", "qs/abc".into()),
                    ("vfsubpath", ".".into()),
                    ("host_path", vf.display().to_string().into()),
                    ("kernel_path", "/data/shared".into()),
                    ("mount_perm", "rw".into()),
                    ("usage_mode", "general".into()),
                ])]),
            ),
            ("idle_timeout", 600.into()),
            ("a_key_from_a_newer_manager", "ignored".into()),
        ],
    );
    let info = create_one(&peer, "s-cfg", &kid, config.clone())
        .await
        .unwrap();
    assert_eq!(field(&info, "status").as_str(), Some("RUNNING"));
    // Upstream's `KernelCreationResult` keys are there.
    for key in [
        "kernel_host",
        "repl_in_port",
        "container_id",
        "resource_spec",
        "agent_addr",
    ] {
        assert!(!field(&info, key).is_nil(), "{key} in {info:?}");
    }
    let preopen = field(&info, "service_ports")
        .as_array()
        .unwrap()
        .iter()
        .find(|s| field(s, "protocol").as_str() == Some("preopen"))
        .cloned()
        .expect("the preopen port is a service port");
    assert_eq!(
        field(&preopen, "container_ports").as_array().unwrap()[0],
        Value::from(9000)
    );
    assert_eq!(
        field(&preopen, "host_ports").as_array().unwrap()[0],
        Value::from(free),
        "the manager's allocated host port is used first"
    );

    assert_eq!(
        run(&peer, &kid, "id -u; id -g; id -G").await.trim(),
        "1234\n2345\n2345 3456"
    );
    assert_eq!(
        run(&peer, &kid, "echo $GREETING; hostname").await.trim(),
        "hello\nmain1"
    );
    assert_eq!(
        run(&peer, &kid, "cat /home/work/bootstrapped").await.trim(),
        "boot:1234",
        "the bootstrap script ran once, as the kernel's user"
    );
    run(&peer, &kid, "echo mine > /data/shared/out.txt").await;
    let meta = std::fs::metadata(vf.join("out.txt")).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (1234, 2345), "not root's");

    // restart_kernel with an updated config (upstream passes the whole config): a new
    // container from it, the same kernel id, host ports and scratch.
    let cid = field(&info, "container_id").as_str().unwrap().to_owned();
    let mut updated = config.clone();
    if let Value::Map(m) = &mut updated {
        for (k, v) in m.iter_mut() {
            if k.as_str() == Some("environ") {
                *v = map(vec![
                    ("GREETING", "bonjour".into()),
                    ("BACKENDAI_ACCESS_KEY", "AKTEST".into()),
                ]);
            }
        }
    }
    let restarted = call(
        &peer,
        "restart_kernel",
        vec!["s-cfg".into(), kid.clone().into(), Value::Nil, updated],
    )
    .await
    .unwrap();
    let new_cid = field(&restarted, "container_id")
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(new_cid, cid, "a new container");
    assert!(
        inspect(&cid, "{{.Id}}").is_none(),
        "the old container is gone"
    );
    wait_running(&peer, &kid).await;
    assert_eq!(run(&peer, &kid, "echo $GREETING").await.trim(), "bonjour");
    assert_eq!(
        run(&peer, &kid, "cat /home/work/bootstrapped").await.trim(),
        "boot:1234\nboot:1234",
        "the scratch is kept and the bootstrap script ran for the new container"
    );
    let again = call(&peer, "get_kernel", vec![kid.clone().into()])
        .await
        .unwrap();
    assert_eq!(field(&again, "host_ports"), field(&info, "host_ports"));
    // Changing what was allocated is refused and changes nothing.
    let bigger = kernel_config("0.75", 64 * MIB, vec![]);
    let r = call(
        &peer,
        "restart_kernel",
        vec!["s-cfg".into(), kid.clone().into(), Value::Nil, bigger],
    )
    .await;
    assert_eq!(failure_name(&r), "InvalidKernelConfig", "{r:?}");
    assert!(format!("{r:?}").contains("resource_slots"), "{r:?}");

    call(
        &peer,
        "destroy_kernel",
        vec![kid.clone().into(), "s-cfg".into()],
    )
    .await
    .unwrap();

    // A failing bootstrap script fails the create, names itself and leaves nothing.
    let bad = format!("k-bad-{}", run_id());
    let r = create_one(
        &peer,
        "s-cfg",
        &bad,
        kernel_config(
            "0.5",
            64 * MIB,
            vec![("bootstrap_script", "echo cannot-boot >&2; exit 4".into())],
        ),
    )
    .await;
    assert_eq!(failure_name(&r), "BootstrapScriptFailed", "{r:?}");
    let text = format!("{r:?}");
    assert!(
        text.contains("exited with 4") && text.contains("cannot-boot"),
        "{text}"
    );

    // A required key missing is named.
    let r = create_one(
        &peer,
        "s-cfg",
        &format!("k-noimg-{}", run_id()),
        map(vec![("resource_slots", map(vec![("cpu", "1".into())]))]),
    )
    .await;
    assert_eq!(failure_name(&r), "InvalidKernelConfig");
    assert!(format!("{r:?}").contains("image"), "{r:?}");

    agent.shutdown(OnShutdown::Terminate).await;
    assert!(fx.containers().is_empty(), "{:?}", fx.containers());
}

//! Accelerators on the real Docker engine through the agent's RPC (in-process agent): the mock
//! plugin's devices allocated exactly as real GPUs would be (whole `cuda.device`s, packed
//! `cuda.shares`), seen inside the container (`CUDA_VISIBLE_DEVICES`, scratch `resource.txt`)
//! and through `scan_gpu_alloc_map`, and kept across an agent restart. Host ports 33200–33299.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use rmpv::Value;

use common::agent::*;
use kernelvisor::agent::Agent;
use kernelvisor::config::{AgentConfig, OnShutdown};
use kernelvisor::rpc::{CallError, Peer};

const MIB: u64 = 1 << 20;

/// The fixture's config plus mock devices `ids` serving `slot`.
fn config_with_mock(fx: &AgentFixture, slot: &str, ids: &[&str]) -> AgentConfig {
    let mut text = fx.config_toml("");
    text.push_str("\n[accelerator]\ncuda = false\n");
    for id in ids {
        text.push_str(&format!(
            "[[accelerator.mock.devices]]\nid = \"{id}\"\nmemory = \"16g\"\nslot = \"{slot}\"\n"
        ));
    }
    let p = fx.dir.path().join("agent.toml");
    std::fs::write(&p, text).unwrap();
    AgentConfig::load(&p).unwrap()
}

fn with_slot(slot: &str, amount: &str) -> Value {
    kernel_config(
        "0.1",
        64 * MIB,
        vec![(
            "resource_slots",
            map(vec![
                ("cpu", "0.1".into()),
                ("mem", (64 * MIB).into()),
                (slot, amount.into()),
            ]),
        )],
    )
}

/// `scan_gpu_alloc_map()` as `{kernel: {device: amount}}`.
async fn alloc_map(peer: &Peer) -> BTreeMap<String, BTreeMap<String, String>> {
    let v = call(peer, "scan_gpu_alloc_map", vec![]).await.unwrap();
    v.as_map()
        .unwrap()
        .iter()
        .map(|(k, devs)| {
            (
                k.as_str().unwrap().to_owned(),
                devs.as_map()
                    .unwrap()
                    .iter()
                    .map(|(d, a)| {
                        (
                            d.as_str().unwrap().to_owned(),
                            a.as_str().unwrap().to_owned(),
                        )
                    })
                    .collect(),
            )
        })
        .collect()
}

/// `CUDA_VISIBLE_DEVICES` inside the kernel's container, as a set.
fn visible_devices(info: &Value) -> BTreeSet<String> {
    let cid = field(info, "container_id").as_str().unwrap();
    docker(&["exec", cid, "sh", "-c", "echo \"$CUDA_VISIBLE_DEVICES\""])
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn gpus(info: &Value) -> BTreeSet<String> {
    field(info, "gpus")
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_str().unwrap().to_owned())
        .collect()
}

async fn destroy(peer: &Peer, kid: &str) {
    call(peer, "destroy_kernel", vec![kid.into(), "s".into()])
        .await
        .unwrap();
}

async fn occupied(peer: &Peer, slot: &str) -> String {
    let u = call(peer, "resource_usage", vec![]).await.unwrap();
    field(field(&u, "occupied"), slot)
        .as_str()
        .unwrap()
        .to_owned()
}

#[actix_rt::test]
async fn mock_devices_are_whole_disjoint_exhaustible_and_survive_a_restart() {
    let fx = AgentFixture::new("accel-device", 33200, 20);
    let config = config_with_mock(&fx, "cuda.device", &["0", "1", "2", "3"]);
    let agent = Agent::start(config.clone(), None)
        .await
        .expect("agent starts");
    let peer = client(agent.endpoint()).await;

    // Advertised: 4 devices, unit `count`, in resource_usage and gather_hwinfo.
    let u = call(&peer, "resource_usage", vec![]).await.unwrap();
    assert_eq!(field(field(&u, "total"), "cuda.device").as_str(), Some("4"));
    let hw = call(&peer, "gather_hwinfo", vec![]).await.unwrap();
    assert_eq!(
        field(
            field(field(&hw, "mock"), "metadata"),
            "slot.cuda.device.unit"
        )
        .as_str(),
        Some("count")
    );
    assert_eq!(
        field(field(field(&hw, "mock"), "metadata"), "device_count").as_str(),
        Some("4")
    );

    // Two kernels of 2 devices each: disjoint sets, seen inside and through the map.
    let (k1, k2) = (format!("k1-{}", run_id()), format!("k2-{}", run_id()));
    let i1 = create_one(&peer, "s", &k1, with_slot("cuda.device", "2"))
        .await
        .unwrap();
    let i2 = create_one(&peer, "s", &k2, with_slot("cuda.device", "2"))
        .await
        .unwrap();
    let (d1, d2) = (visible_devices(&i1), visible_devices(&i2));
    assert_eq!((d1.len(), d2.len()), (2, 2), "{d1:?} {d2:?}");
    assert!(d1.is_disjoint(&d2), "{d1:?} {d2:?}");
    assert_eq!((gpus(&i1), gpus(&i2)), (d1.clone(), d2.clone()));
    assert_eq!(
        field(field(&i1, "resource_slots"), "cuda.device").as_str(),
        Some("2")
    );
    let map = alloc_map(&peer).await;
    let as_set = |k: &str| map[k].keys().cloned().collect::<BTreeSet<_>>();
    assert_eq!((as_set(&k1), as_set(&k2)), (d1.clone(), d2.clone()));
    assert!(map[&k1].values().all(|a| a == "1"), "{map:?}");
    let resource_txt = read(&fx.scratch_root().join(&k1).join("config/resource.txt"));
    let ids = d1.iter().cloned().collect::<Vec<_>>().join(",");
    assert!(
        resource_txt.contains(&format!("CUDA_GLOBAL_DEVICE_IDS={ids}")),
        "{resource_txt}"
    );
    assert!(resource_txt.contains("cuda.device=2"), "{resource_txt}");
    let labels = inspect(
        field(&i1, "container_id").as_str().unwrap(),
        "{{index .Config.Labels \"ai.kernelvisor.devices\"}}",
    )
    .unwrap();
    assert!(labels.contains("cuda.device"), "{labels}");

    // A third one finds none left.
    let r = create_one(
        &peer,
        "s",
        &format!("k3-{}", run_id()),
        with_slot("cuda.device", "2"),
    )
    .await;
    assert_eq!(failure_name(&r), "ResourceExhausted", "{r:?}");

    // Destroying one frees its devices.
    destroy(&peer, &k2).await;
    assert_eq!(alloc_map(&peer).await.keys().collect::<Vec<_>>(), [&k1]);
    assert_eq!(occupied(&peer, "cuda.device").await, "2");

    // Restart from the same dirs: the allocation is re-reserved exactly.
    let before = alloc_map(&peer).await;
    drop(peer);
    agent.shutdown(OnShutdown::Preserve).await;
    let agent = Agent::start(config, None).await.expect("agent restarts");
    let peer = client(agent.endpoint()).await;
    assert_eq!(alloc_map(&peer).await, before);
    assert_eq!(occupied(&peer, "cuda.device").await, "2");
    let k4 = format!("k4-{}", run_id());
    let i4 = create_one(&peer, "s", &k4, with_slot("cuda.device", "2"))
        .await
        .unwrap();
    assert_eq!(visible_devices(&i4), d2, "the two free ones");
    let r = create_one(
        &peer,
        "s",
        &format!("k5-{}", run_id()),
        with_slot("cuda.device", "1"),
    )
    .await;
    assert_eq!(failure_name(&r), "ResourceExhausted", "{r:?}");

    destroy(&peer, &k1).await;
    destroy(&peer, &k4).await;
    assert!(alloc_map(&peer).await.is_empty());
    assert_eq!(occupied(&peer, "cuda.device").await, "0");
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn mock_shares_pack_best_fit_and_unknown_slots_are_refused() {
    let fx = AgentFixture::new("accel-shares", 33220, 20);
    let config = config_with_mock(&fx, "cuda.shares", &["a", "b"]);
    let agent = Agent::start(config, None).await.expect("agent starts");
    let peer = client(agent.endpoint()).await;

    let (x, y, z) = (
        format!("x-{}", run_id()),
        format!("y-{}", run_id()),
        format!("z-{}", run_id()),
    );
    let ix = create_one(&peer, "s", &x, with_slot("cuda.shares", "0.5"))
        .await
        .unwrap();
    create_one(&peer, "s", &y, with_slot("cuda.shares", "0.5"))
        .await
        .unwrap();
    let iz = create_one(&peer, "s", &z, with_slot("cuda.shares", "0.75"))
        .await
        .unwrap();
    let map = alloc_map(&peer).await;
    assert_eq!(map[&x], map[&y], "two halves share one device: {map:?}");
    assert_eq!(map[&x].values().collect::<Vec<_>>(), ["0.5"]);
    assert_eq!(map[&z].values().collect::<Vec<_>>(), ["0.75"]);
    assert_ne!(
        map[&x].keys().collect::<Vec<_>>(),
        map[&z].keys().collect::<Vec<_>>()
    );
    assert_eq!(visible_devices(&ix), gpus(&ix));
    assert_eq!(visible_devices(&iz), gpus(&iz));
    assert_eq!(occupied(&peer, "cuda.shares").await, "1.75");
    // 0.25 is left on one device, so another half does not fit.
    let r = create_one(
        &peer,
        "s",
        &format!("w-{}", run_id()),
        with_slot("cuda.shares", "0.5"),
    )
    .await;
    assert_eq!(failure_name(&r), "ResourceExhausted", "{r:?}");

    // A slot nobody serves is refused by name.
    let r = create_one(
        &peer,
        "s",
        &format!("u-{}", run_id()),
        with_slot("tpu.device", "1"),
    )
    .await;
    let Err(CallError::Failure(meta)) = &r else {
        panic!("expected a FAILURE, got {r:?}")
    };
    assert_eq!(meta.name, "InvalidKernelConfig");
    assert!(
        meta.repr.contains("unknown resource slot `tpu.device`"),
        "{}",
        meta.repr
    );
    for k in [&x, &y, &z] {
        destroy(&peer, k).await;
    }
    assert!(alloc_map(&peer).await.is_empty());
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn heartbeats_advertise_every_slot_and_its_unit() {
    use common::intake::{start_intake, Received};
    use common::{wait_until, Keys};
    use std::time::Duration;

    let fx = AgentFixture::new("accel-heartbeat", 33240, 4);
    let keys = Keys::new();
    keys.write(fx.dir.path());
    let intake_port = free_port();
    let d = fx.dir.path().display();
    let mut text = fx.config_toml(&format!(
        "rpc-auth-manager-public-key = \"{d}/manager.key\"\nrpc-auth-agent-keypair = \"{d}/agent.key_secret\"\nbackend = \"dummy\"\n"
    ));
    text.push_str(&format!(
        "[manager]\nevent-addr = {{ host = \"127.0.0.1\", port = {intake_port} }}\nheartbeat-interval = 0.3\n\
         [accelerator]\ncuda = false\n\
         [[accelerator.mock.devices]]\nid = \"m0\"\nmemory = 1073741824\nslot = \"cuda.shares\"\n\
         [[accelerator.mock.devices]]\nid = \"m1\"\nmemory = \"1g\"\nslot = \"cuda.shares\"\n"
    ));
    let p = fx.dir.path().join("agent.toml");
    std::fs::write(&p, text).unwrap();
    let received = Received::default();
    let _intake = start_intake(
        &format!("tcp://127.0.0.1:{intake_port}"),
        &keys.manager,
        keys.agent.public,
        &received,
    );
    let agent = Agent::start(AgentConfig::load(&p).unwrap(), None)
        .await
        .expect("agent starts");
    wait_until(Duration::from_secs(30), "a heartbeat", || {
        let n = received.heartbeat_count();
        async move { n > 0 }
    })
    .await;
    let beat = received.heartbeats.lock().unwrap()[0].1.clone();
    let slots = field(&beat, "slots");
    assert_eq!(
        field(field(slots, "total"), "cuda.shares").as_str(),
        Some("2")
    );
    assert_eq!(
        field(field(slots, "available"), "cuda.shares").as_str(),
        Some("2")
    );
    assert_eq!(
        field(field(slots, "occupied"), "cuda.shares").as_str(),
        Some("0")
    );
    assert!(field(field(slots, "total"), "cpu").as_str().is_some());
    let units = field(&beat, "slot_key_and_units");
    assert_eq!(
        (
            field(units, "cpu").as_str(),
            field(units, "mem").as_str(),
            field(units, "cuda.shares").as_str()
        ),
        (Some("count"), Some("bytes"), Some("count"))
    );
    agent.shutdown(OnShutdown::Terminate).await;
}

#[actix_rt::test]
async fn a_dangling_kernel_keeps_its_devices_from_its_labels() {
    let fx = AgentFixture::new("accel-dangling", 33260, 20);
    let config = config_with_mock(&fx, "cuda.device", &["0", "1"]);
    let agent = Agent::start(config.clone(), None)
        .await
        .expect("agent starts");
    let peer = client(agent.endpoint()).await;
    let kid = format!("k-{}", run_id());
    let info = create_one(&peer, "s", &kid, with_slot("cuda.device", "1"))
        .await
        .unwrap();
    let devices = gpus(&info);
    drop(peer);

    // The store is lost: the container is dangling, rebuilt from its labels.
    agent.shutdown(OnShutdown::Preserve).await;
    for f in ["agent.db", "agent.db-wal", "agent.db-shm"] {
        let _ = std::fs::remove_file(fx.dir.path().join("var").join(f));
    }
    let agent = Agent::start(config, None).await.expect("agent restarts");
    let peer = client(agent.endpoint()).await;
    let listed = call(&peer, "list_dangling_kernels", vec![]).await.unwrap();
    let mine = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|k| field(k, "id").as_str() == Some(kid.as_str()))
        .expect("listed")
        .clone();
    assert_eq!(
        field(field(&mine, "resource_slots"), "cuda.device").as_str(),
        Some("1")
    );
    // Its device stays reserved while it waits: only one is left.
    let map = alloc_map(&peer).await;
    assert_eq!(
        map[&kid].keys().cloned().collect::<BTreeSet<_>>(),
        devices,
        "{map:?}"
    );
    let r = create_one(
        &peer,
        "s",
        &format!("k2-{}", run_id()),
        with_slot("cuda.device", "2"),
    )
    .await;
    assert_eq!(failure_name(&r), "ResourceExhausted", "{r:?}");

    let adopted = call(&peer, "adopt_kernel", vec![kid.clone().into()])
        .await
        .unwrap();
    assert_eq!(gpus(&adopted), devices);
    assert_eq!(visible_devices(&adopted), devices);
    destroy(&peer, &kid).await;
    assert!(alloc_map(&peer).await.is_empty());
    assert_eq!(occupied(&peer, "cuda.device").await, "0");
    agent.shutdown(OnShutdown::Terminate).await;
}

//! Fast codec tests over whole calls as the real Backend.AI 26.9.6 agent client packs them
//! (`tests/fixtures/bai/calls/`, written by `tests/it/bai_compat.rs`): each FUNCTION payload
//! decodes (ext types 1, 6, 7 included) into the typed agent contract, and a `create_kernels`
//! config into a checked kernel config. No engine, no socket.

use kernelvisor::agent::kernel::KernelConfig;
use kernelvisor::rpc::agent_api::exec::Execute;
use kernelvisor::rpc::agent_api::kernel::{
    AutoPullBehavior, CheckRunning, ClusterMode, CreateKernels, DestroyKernel,
    KernelCreationConfig, RestartKernel, SessionTypes,
};
use kernelvisor::rpc::agent_api::{decode_args, from_value, Method};
use kernelvisor::rpc::Call;

fn call(method: &str) -> Call {
    let path = format!(
        "{}/tests/fixtures/bai/calls/{method}.msgpack",
        env!("CARGO_MANIFEST_DIR")
    );
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    Call::decode(&bytes).unwrap_or_else(|e| panic!("{method}: {e}"))
}

fn args<M: Method>() -> M::Args {
    decode_args::<M>(&call(M::NAME)).unwrap_or_else(|e| panic!("{}: {e}", M::NAME))
}

#[test]
fn every_recorded_call_decodes() {
    let dir = format!("{}/tests/fixtures/bai/calls", env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "msgpack") {
            let method = path.file_stem().unwrap().to_str().unwrap().to_owned();
            let c = call(&method);
            // `AgentClient` names the agent on every call but its `ping`.
            assert_eq!(
                c.kwarg("agent_id").is_some(),
                method != "ping",
                "{method}: {c:?}"
            );
            n += 1;
        }
    }
    assert!(n >= 15, "{n} recorded calls");
}

#[test]
fn create_kernels_from_the_session_launcher_decodes_into_the_contract() {
    let a = args::<CreateKernels>();
    assert_eq!(a.kernel_ids.len(), 1);
    assert_eq!(a.configs.len(), 1);
    let info = a.cluster_info.expect("cluster_info");
    assert_eq!((info.mode, info.size), (ClusterMode::SingleNode, 1));
    // `kernel_image_refs` is keyed by a UUID ext value: read as its string.
    let refs = a.kernel_image_refs.expect("kernel_image_refs");
    let image_ref = &refs[&a.kernel_ids[0]];
    assert_eq!(
        (image_ref.registry.as_str(), image_ref.is_local),
        ("local", true)
    );

    let config: KernelCreationConfig = from_value(a.configs[0].clone()).unwrap();
    assert_eq!(config.session_type, SessionTypes::Interactive);
    assert_eq!(config.cluster_mode, ClusterMode::SingleNode);
    assert_eq!(config.auto_pull, Some(AutoPullBehavior::Digest));
    assert_eq!(config.image.canonical, "local/kernelvisor-test:latest");
    assert_eq!(config.kernel_id.as_deref(), Some(a.kernel_ids[0].as_str()));

    let checked =
        KernelConfig::from_value(&a.configs[0], &kernelvisor::slots::builtin_types()).unwrap();
    assert_eq!(
        checked.image, "kernelvisor-test:latest",
        "a local image runs by its short name"
    );
    assert!(!checked.may_pull(), "a local image is never pulled");
    assert!(
        !checked.owner.access_key.is_empty(),
        "from BACKENDAI_ACCESS_KEY"
    );
    assert_eq!(checked.cluster_hostname.as_deref(), Some("main1"));
}

#[test]
fn destroy_restart_execute_and_queries_decode() {
    let d = args::<DestroyKernel>();
    assert_eq!(
        d.reason.as_deref(),
        Some("user-requested"),
        "the enum's value"
    );
    assert_eq!(d.suppress_events, Some(false));
    let r = args::<RestartKernel>();
    let image = r.kernel_image.expect("an ImageRef");
    assert!(image.is_local && !image.name.is_empty(), "{image:?}");
    let updated = r.updated_config.expect("the whole config");
    assert!(updated.contains_key("image") && updated.contains_key("resource_slots"));
    let e = args::<Execute>();
    assert_eq!(e.mode, "query");
    assert!(!e.code.is_empty());
    assert!(!args::<CheckRunning>().kernel_id.is_empty());
}

/// `commit` (keyword-only `canonical`, `extra_labels`), `get_commit_status`, `push_image` (a
/// pickled `ImageRef`, ext 7, and the `ImageRegistry` map) and `purge_images` as
/// `AgentRegistry` sends them decode into the image contract.
#[test]
fn image_calls_decode() {
    use kernelvisor::rpc::agent_api::images::{
        canonical, Commit, GetCommitStatus, PurgeImages, PushImage,
    };
    let c = args::<Commit>();
    assert_eq!(c.subdir, "admin_lablup.com", "the e-mail, `@` as `_`");
    let image = c.canonical.expect("canonical, a keyword");
    assert_eq!(c.extra_labels.unwrap()["kv.bai"], "1");
    assert_eq!(c.filename, None);
    let s = args::<GetCommitStatus>();
    assert_eq!(
        (s.kernel_id.as_str(), s.subdir.as_str()),
        (c.kernel_id.as_str(), "admin_lablup.com")
    );
    let p = args::<PushImage>();
    assert_eq!(
        canonical(&p.image_ref),
        image,
        "the ImageRef names the committed image"
    );
    assert_eq!(p.image_ref.project.as_deref(), Some("kv"));
    assert!(!p.image_ref.is_local);
    assert_eq!(p.registry_conf.username.as_deref(), Some("kv"));
    assert_eq!(p.registry_conf.password.as_deref(), Some("<placeholder>"));
    let g = args::<PurgeImages>();
    assert_eq!(g.image_canonicals[0], image);
    assert!(!g.force && !g.noprune);
}

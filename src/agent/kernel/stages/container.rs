//! `container`: create + start with labels, limits, environment, binds, published ports and
//! GPUs, on a cluster kernel's network with its keys in the scratch
//! (`crate::agent::kernel::cluster`) (status `CREATING`). Never privileged.

use std::collections::HashMap;

use std::sync::Arc;

use actors::{BoxError, Provisioner, Resources, StageKey, StageTreeBuilder};

use super::{Found, KernelStage, Plan, ScratchDir, IMAGE, MOUNTS, PORTS, SCRATCH, SLOTS};
use super::Injected;
use crate::agent::accelerators::ContainerConfig;
use crate::agent::backend::{labels, Bind, ContainerSpec, PortMapping};
use crate::agent::kernel::cluster;
use crate::agent::kernel::config::ServicePortRequest;
pub use crate::agent::kernel::resources::ContainerHandle;
use crate::agent::kernel::{KernelError, KernelHandle, KernelStatus, Stopped};
use crate::agent::resources::SlotAllocation;
use crate::agent::runner::{launch, Gate, RunnerPorts};

/// The container's environment: the config's `environ`, then the agent's
/// `BACKEND_KERNEL_ID`, `BACKEND_SESSION_ID`, and the accelerators' variables for the devices
/// allocated (`CUDA_VISIBLE_DEVICES`: `0..n-1` for `cuda`, whose runtime renumbers the GPUs
/// from 0; the agent's ids for `mock`).
pub fn environ(handle: &KernelHandle, slots: &SlotAllocation) -> Vec<(String, String)> {
    let config = handle.info().config;
    let mut env: Vec<(String, String)> = config
        .environ
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    env.push(("BACKEND_KERNEL_ID".into(), handle.id.clone()));
    env.push(("BACKEND_SESSION_ID".into(), handle.session_id.clone()));
    env.extend(accelerator_config(handle, slots).env);
    env
}

fn accelerator_config(handle: &KernelHandle, slots: &SlotAllocation) -> ContainerConfig {
    if slots.devices.values().all(|d| d.is_empty()) {
        return ContainerConfig::default();
    }
    let accelerators = handle
        .ctx
        .slots
        .lock()
        .expect("slots lock")
        .accelerators()
        .clone();
    accelerators.container_config(&slots.devices)
}

/// Everything the container stage needs, from the config and the earlier stages' resources.
pub fn container_spec(
    handle: &KernelHandle,
    image_id: &str,
    service_ports: &[ServicePortRequest],
    slots: &SlotAllocation,
    host_ports: &[u16],
    scratch: &ScratchDir,
    mounts: &[Bind],
) -> ContainerSpec {
    let info = handle.info();
    let config = &info.config;
    let c = &handle.ctx.config.container;
    let mut label = HashMap::new();
    label.insert(labels::KERNEL_ID.to_owned(), handle.id.clone());
    label.insert(labels::SESSION_ID.to_owned(), handle.session_id.clone());
    label.insert(labels::AGENT_ID.to_owned(), handle.ctx.agent_id.clone());
    label.insert(
        labels::OWNER.to_owned(),
        serde_json::to_string(&config.owner).unwrap_or_default(),
    );
    label.insert(
        labels::SERVICE_PORTS.to_owned(),
        serde_json::to_string(service_ports).unwrap_or_default(),
    );
    label.insert(
        labels::SESSION_TYPE.to_owned(),
        config.session_type.as_str().to_owned(),
    );
    label.insert(
        labels::RESOURCE_SLOTS.to_owned(),
        serde_json::to_string(&slots.slots).unwrap_or_default(),
    );
    label.insert(
        labels::DEVICES.to_owned(),
        serde_json::to_string(&slots.devices).unwrap_or_default(),
    );
    label.insert(
        labels::RESTART_POLICY.to_owned(),
        serde_json::to_string(&config.restart_policy).unwrap_or_default(),
    );
    let mut binds = vec![
        Bind {
            host_path: scratch.config_dir().display().to_string(),
            container_path: "/home/config".into(),
            read_only: true,
        },
        Bind {
            host_path: scratch.work_dir().display().to_string(),
            container_path: "/home/work".into(),
            read_only: false,
        },
    ];
    binds.extend(mounts.iter().cloned());
    let accel = accelerator_config(handle, slots);
    binds.extend(accel.binds.iter().cloned());
    let ports = service_ports
        .iter()
        .flat_map(|s| s.container_ports.iter().copied())
        .zip(host_ports.iter().copied())
        .map(|(container_port, host_port)| PortMapping {
            container_port,
            host_port,
        })
        .collect();
    ContainerSpec {
        name: format!("kernel.{}", handle.id),
        image: image_id.to_owned(),
        env: environ(handle, slots)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect(),
        labels: label,
        memory_bytes: Some(slots.slots.get(crate::slots::MEM).units() as i64),
        nano_cpus: Some(slots.slots.get(crate::slots::CPU).milli() as i64 * 1_000_000),
        pids_limit: Some(c.pids_limit),
        shm_size: Some(config.shmem.unwrap_or(c.default_shmem.0) as i64),
        binds,
        ports,
        port_bind_host: c.bind_host.clone(),
        gpu_device_ids: accel.nvidia_device_ids,
        device_nodes: accel.device_nodes,
        cmd: config
            .command
            .as_ref()
            .map(|cmd| vec!["sh".into(), "-c".into(), cmd.clone()]),
        working_dir: config.command.as_ref().map(|_| "/home/work".into()),
        user: container_user(config, c.kernel_uid, c.kernel_gid),
        group_add: config
            .supplementary_gids
            .iter()
            .map(u32::to_string)
            .collect(),
        hostname: config.cluster_hostname.clone(),
        entrypoint: None,
        // The engine's `docker-init` as PID 1 forwards the stop signal to the workload, which
        // as PID 1 would ignore every signal it set no handler for (the kernel applies no
        // default action to a PID 1): a job that does not catch `SIGTERM` ends with 143, as
        // outside a container, and an image's `sleep infinity` ends at once instead of at the
        // grace's deadline. (`interrupt_kernel` keeps PID 1's meaning: `methods/kernels.rs`.)
        init: true,
        // `docker stop` / `docker restart` (a `restart_kernel`) send the kernel's own signal.
        stop_signal: config.stop_signal.clone(),
        local_ports: Vec::new(),
        cap_add: Vec::new(),
        // The cluster network is joined once the engine is asked (`join_network`).
        network: None,
        extra_hosts: Vec::new(),
    }
}

/// `uid:gid` for a config that names a `uid` or `main_gid` (the other one from the agent's
/// `[container] kernel-uid` / `kernel-gid`), else `None`: the image's user.
fn container_user(
    config: &crate::agent::kernel::KernelConfig,
    kernel_uid: u32,
    kernel_gid: u32,
) -> Option<String> {
    if config.uid.is_none() && config.main_gid.is_none() {
        return None;
    }
    Some(format!(
        "{}:{}",
        config.uid.unwrap_or(kernel_uid),
        config.main_gid.unwrap_or(kernel_gid)
    ))
}

/// Longest a `bootstrap_script` may run before the create fails.
pub const BOOTSTRAP_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Bytes of a failed bootstrap script's output kept for the error message (its tail).
const BOOTSTRAP_OUTPUT_TAIL: usize = 2048;

/// Runs the kernel's `bootstrap_script` once with `sh -c` in `/home/work`, as the container's
/// user, and waits for it (at most [`BOOTSTRAP_TIMEOUT`]); output is read in the engine's
/// chunks and only its last [`BOOTSTRAP_OUTPUT_TAIL`] bytes are kept.
///
/// Errors: `BootstrapScriptFailed` with the exit code and output tail, or the engine's error.
async fn run_bootstrap(handle: &KernelHandle, id: &str, script: &str) -> Result<(), KernelError> {
    use futures::StreamExt;
    let backend = &handle.ctx.backend;
    let spec = crate::agent::backend::ExecSpec {
        cmd: vec!["sh".into(), "-c".into(), script.to_owned()],
        working_dir: Some("/home/work".into()),
        ..Default::default()
    };
    let session = backend.exec_start(id, spec).await?;
    let exec_id = session.exec_id.clone();
    let mut tail: Vec<u8> = Vec::new();
    let drain = async {
        let mut output = session.output;
        while let Some(chunk) = output.next().await {
            let (_, bytes) = chunk?;
            tail.extend_from_slice(&bytes);
            if tail.len() > BOOTSTRAP_OUTPUT_TAIL {
                tail.drain(..tail.len() - BOOTSTRAP_OUTPUT_TAIL);
            }
        }
        Ok::<(), crate::agent::backend::BackendError>(())
    };
    if tokio::time::timeout(BOOTSTRAP_TIMEOUT, drain)
        .await
        .is_err()
    {
        let _ = backend.exec_kill(&exec_id).await;
        return Err(KernelError::BootstrapFailed(format!(
            "bootstrap_script ran longer than {} s",
            BOOTSTRAP_TIMEOUT.as_secs()
        )));
    }
    // The output ends with the process; its exit code may take the engine a moment.
    for _ in 0..50 {
        let status = backend.exec_status(&exec_id).await?;
        if !status.running {
            return match status.exit_code {
                Some(0) => Ok(()),
                code => Err(KernelError::BootstrapFailed(format!(
                    "bootstrap_script exited with {}: {}",
                    code.map_or("no code".into(), |c| c.to_string()),
                    String::from_utf8_lossy(&tail).trim()
                ))),
            };
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Err(KernelError::BootstrapFailed(
        "bootstrap_script's exit code never came".into(),
    ))
}

/// What the container stage makes: the process-path spec and, for a runner kernel, what
/// turns it into the runner's (`crate::agent::runner::launch`).
#[derive(Clone, Debug)]
pub struct ContainerPlan {
    /// The container as the process path makes it.
    pub spec: ContainerSpec,
    /// `Some` for a kernel Backend.AI's kernel runner serves.
    pub runner: Option<RunnerPlan>,
    /// The kernel's scratch directory (a cluster kernel's keys go into its `config/`).
    pub scratch: ScratchDir,
}

/// A runner kernel's part of [`ContainerPlan`].
#[derive(Clone, Debug)]
pub struct RunnerPlan {
    /// `ai.backend.runtime-type` (or `app`).
    pub runtime_type: String,
    /// `ai.backend.runtime-path`.
    pub runtime_path: Option<String>,
    /// Host ports for repl-in/out (the ports stage's last two).
    pub repl: RunnerPorts,
    /// The kernel's scratch directory (the runner's files go there).
    pub scratch: ScratchDir,
    /// The image's `ai.backend.envs.corecount` variables.
    pub corecount_vars: Vec<String>,
}

/// The runner part of the plan of a kernel whose gate says so; the repl ports are the last
/// two of `host_ports`.
pub fn runner_plan(
    gate: Gate,
    image: &crate::agent::backend::ImageInfo,
    host_ports: &[u16],
    scratch: &ScratchDir,
) -> Option<RunnerPlan> {
    let Gate::Runner {
        runtime_type,
        runtime_path,
    } = gate
    else {
        return None;
    };
    let [.., repl_in, repl_out] = host_ports else {
        return None;
    };
    Some(RunnerPlan {
        runtime_type,
        runtime_path,
        repl: RunnerPorts {
            repl_in: *repl_in,
            repl_out: *repl_out,
        },
        scratch: scratch.clone(),
        corecount_vars: launch::corecount_vars(image.labels.get(crate::agent::runner::gate::CORECOUNT)),
    })
}

/// The container spec `plan` describes: `plan.spec` on its cluster network
/// ([`join_network`]), with a cluster kernel's keys and `cluster.json` in its scratch
/// (`crate::agent::kernel::cluster`), and the runner's preparation and scratch files for a
/// runner kernel.
///
/// Errors: what [`join_network`] refuses; `KernelError::InvalidConfig` when the runner went
/// away since the kernel was planned; the scratch files' I/O as `KernelError::Engine`.
async fn final_spec(
    handle: &KernelHandle,
    plan: &ContainerPlan,
) -> Result<ContainerSpec, KernelError> {
    let mut spec = plan.spec.clone();
    join_network(handle, &mut spec).await?;
    let info = handle.info();
    let config = &info.config;
    let c = &handle.ctx.config.container;
    let owner = (
        config.uid.unwrap_or(c.kernel_uid),
        config.main_gid.unwrap_or(c.kernel_gid),
    );
    if let Some(cluster) = &config.cluster {
        cluster
            .write_files(&plan.scratch.config_dir(), owner)
            .map_err(|e| KernelError::Engine(format!("cluster keys in the scratch: {e}")))?;
    }
    let Some(r) = &plan.runner else {
        return Ok(spec);
    };
    let krunner = handle.ctx.runners.krunner.clone().ok_or_else(|| {
        KernelError::InvalidConfig("the kernel runner is no longer provisioned".into())
    })?;
    let cpu = config.slots.get(crate::slots::CPU).milli();
    launch::prepare(
        &mut spec,
        &launch::RunnerLaunch {
            krunner: &krunner,
            runtime_type: &r.runtime_type,
            runtime_path: r.runtime_path.as_deref(),
            repl: r.repl,
            uid: owner.0,
            gid: owner.1,
            supplementary_gids: &config.supplementary_gids,
            corecount_vars: r.corecount_vars.clone(),
            cores: cpu.div_ceil(1000).max(1),
        },
    );
    // On the blocking pool: a key the made-ahead pool does not have yet (the agent's first
    // kernels) is made on the spot, an RSA keygen of 0.1–0.5 s on a quiet machine and seconds
    // on a busy one, which on the agent's own thread held up its heartbeats past the manager's
    // limit (seen in CI: the agent declared lost while it made its first runner kernel).
    let (config_dir, work_dir) = (r.scratch.config_dir(), r.scratch.work_dir());
    let (files_spec, ctx) = (spec.clone(), handle.ctx.clone());
    let (keypair, bootstrap) = (config.ssh_keypair.clone(), config.bootstrap_script.clone());
    let scratch_error = |e: String| KernelError::Engine(format!("kernel runner's scratch files: {e}"));
    tokio::task::spawn_blocking(move || {
        launch::write_scratch(
            &config_dir,
            &work_dir,
            &files_spec,
            || ctx.runners.host_key(),
            match &keypair {
                Some(pair) => launch::UserKeys::Given(pair),
                None => launch::UserKeys::MadeAhead(|| ctx.runners.user_keypair()),
            },
            owner,
            bootstrap.as_deref(),
        )
    })
    .await
    .map_err(|e| scratch_error(e.to_string()))?
    .map_err(|e| scratch_error(e.to_string()))?;
    let on_host = config.cluster.as_ref().and_then(|c| {
        c.intrinsic_ports(
            config.cluster_hostname.as_deref(),
            &handle.id,
            r.repl,
            &spec.ports,
        )
    });
    if let Some(ports) = on_host {
        cluster::write_intrinsic_ports(&r.scratch.config_dir(), &ports)
            .map_err(|e| KernelError::Engine(format!("intrinsic-ports.json: {e}")))?;
    }
    Ok(spec)
}

/// The engine's refusal to create or start `spec`'s container as a kernel error: one naming
/// the cluster network it joins is `ContainerCreationFailed` (the network is not there, as
/// upstream's agent names that failure), any other as the engine's.
fn creation_error(spec: &ContainerSpec, e: crate::agent::backend::BackendError) -> KernelError {
    let text = e.to_string();
    match spec.network.as_ref() {
        Some(n) if n.mode != crate::agent::backend::HOST_NETWORK && text.contains(&n.mode) => {
            KernelError::ContainerCreationFailed(format!("network `{}`: {text}", n.mode))
        }
        _ => KernelError::from(e),
    }
}

/// Joins `spec` to the kernel's cluster network (`ClusterConfig::apply_network`): a bridge
/// network must exist on this engine (checked first: a clear error before the engine's), and an
/// overlay kernel gets `docker_gwbridge`'s subnet kept from MPI. An overlay network is not
/// checked: a Swarm worker's engine knows a manager's attachable overlay only once a container
/// of it joins (the engine's own refusal then is [`creation_error`]'s). Nothing for a kernel
/// without a cluster network.
///
/// Errors: `KernelError::ContainerCreationFailed` for a bridge network the engine lacks
/// (upstream's engine refuses the create, `ContainerCreationFailedError`); the engine's own
/// errors.
async fn join_network(handle: &KernelHandle, spec: &mut ContainerSpec) -> Result<(), KernelError> {
    let info = handle.info();
    let Some(c) = &info.config.cluster else {
        return Ok(());
    };
    let backend = &handle.ctx.backend;
    let bridge = c.network_config.mode == Some(cluster::NetworkMode::Bridge);
    if let Some(name) = c.joined_network().filter(|_| bridge) {
        if backend.inspect_network(name).await?.is_none() {
            return Err(KernelError::ContainerCreationFailed(format!(
                "cluster_info.network_config names network `{name}`, which this agent's \
                 engine does not have (create_local_network makes a single-node session's)"
            )));
        }
    }
    let gwbridge = match c.network_config.mode {
        Some(cluster::NetworkMode::Overlay) => backend.network_subnet(cluster::GWBRIDGE).await?,
        _ => None,
    };
    c.apply_network(
        spec,
        info.config.cluster_hostname.as_deref(),
        gwbridge.as_deref(),
    );
    Ok(())
}

/// Creates and starts the kernel's container.
pub struct ContainerStage(pub KernelHandle);

/// This stage's key: its name, typed with its resource.
pub const CONTAINER: StageKey<ContainerHandle> = StageKey::of::<ContainerStage>("container");

impl Provisioner for ContainerStage {
    type Spec = ContainerPlan;
    type Resource = ContainerHandle;

    fn name(&self) -> &'static str {
        CONTAINER.name()
    }

    async fn setup(&self, plan: ContainerPlan) -> Result<ContainerHandle, BoxError> {
        // A restart by the restart policy stays `RESTARTING` until the kernel runs again.
        if self.0.info().status != KernelStatus::Restarting {
            self.0.set_status(KernelStatus::Creating);
        }
        let spec = final_spec(&self.0, &plan).await?;
        let backend = &self.0.ctx.backend;
        let id = backend
            .create_container(&spec)
            .await
            .map_err(|e| creation_error(&spec, e))?;
        self.0.update(|i| i.container_id = Some(id.clone()));
        if spec.init && spec.cmd.is_some() && plan.runner.is_none() && !has_shell(&self.0, &id).await
        {
            // Under `docker-init` a missing `sh` no longer fails the start (the init runs, then
            // cannot exec it): looked for in the created container instead.
            let _ = backend.remove_container(&id).await;
            self.0.update(|i| i.container_id = None);
            return Err(KernelError::InvalidConfig(format!(
                "`command` runs through `sh -c`, which image `{}` lacks: no /bin/sh",
                self.0.info().config.image
            ))
            .into());
        }
        if let Err(e) = backend.start_container(&id).await {
            // Leave nothing behind: the created container goes with the failed start.
            let _ = backend.remove_container(&id).await;
            self.0.update(|i| i.container_id = None);
            let text = e.to_string();
            if spec.network.as_ref().is_some_and(|n| text.contains(&n.mode)) {
                return Err(creation_error(&spec, e).into());
            }
            if plan.runner.is_none()
                && spec.cmd.is_some()
                && (text.contains("executable file not found")
                    || text.contains("no such file or directory"))
            {
                // The engine's words for "the image has no `sh`": the request's fault, not the engine's.
                return Err(KernelError::InvalidConfig(format!(
                    "`command` runs through `sh -c`, which image `{}` lacks: {text}",
                    self.0.info().config.image
                ))
                .into());
            }
            return Err(KernelError::from(e).into());
        }
        // A runner kernel's runner runs `/home/work/bootstrap.sh` itself, before it answers.
        let script = self.0.info().config.bootstrap_script.clone();
        if let Some(script) = script.filter(|_| plan.runner.is_none()) {
            if let Err(e) = run_bootstrap(&self.0, &id, &script).await {
                let _ = backend.remove_container(&id).await;
                self.0.update(|i| i.container_id = None);
                return Err(e.into());
            }
        }
        Ok(ContainerHandle {
            id,
            name: spec.name,
        })
    }

    /// A running container is stopped gracefully first ([`stop_gracefully`]), then removed
    /// (killed, if it still runs).
    async fn teardown(&self, container: ContainerHandle) -> Result<(), BoxError> {
        stop_gracefully(&self.0, &container.id).await;
        Ok(self.0.ctx.backend.remove_container(&container.id).await?)
    }
}

/// Whether created container `id` has a `sh` to run a `command` with (`/bin/sh` or
/// `/usr/bin/sh`, as the engine's archive API finds it). A backend that cannot tell (the dummy
/// has no filesystem) counts as having one.
async fn has_shell(h: &KernelHandle, id: &str) -> bool {
    use futures::StreamExt;
    for path in ["/bin/sh", "/usr/bin/sh"] {
        match h.ctx.backend.archive_get(id, path).next().await {
            Some(Err(crate::agent::backend::BackendError::PathNotFound(_))) => continue,
            _ => return true,
        }
    }
    false
}

/// How often a stopping container is looked at while its grace runs.
const GRACE_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Stops kernel `h`'s container `id`, if it runs, with the kernel's grace
/// ([`KernelInfo::grace`](crate::agent::kernel::KernelInfo::grace)): its stop signal, then up to
/// the grace period for the workload to exit. Records how it ended in `stopped` (its exit
/// code when it exited in time; `killed` when it still ran at the deadline, counted in
/// `kernelvisor_agent_grace_kills_total`: the caller's removal then kills it). A zero grace
/// sends no signal. Every end of a kernel goes through here: `destroy_kernel`, a batch
/// timeout, the restart policy replacing an unhealthy container, the agent's shutdown.
pub async fn stop_gracefully(h: &KernelHandle, id: &str) {
    let backend = &h.ctx.backend;
    match backend.inspect_container(id).await {
        Ok(Some(s)) if s.running => {}
        // It ended already (a job that finished as it was destroyed): its exit is its own.
        Ok(Some(s)) => {
            h.update(|i| i.stopped = Some(Stopped { exit_code: s.exit_code, killed: false }));
            return;
        }
        _ => return,
    }
    let started = tokio::time::Instant::now();
    let default = h.ctx.config.container.grace_period.0;
    let grace = h.info().grace(default);
    if grace.period.is_zero() {
        h.update(|i| i.stopped = Some(Stopped { exit_code: None, killed: true }));
        return;
    }
    if let Err(e) = backend.signal_container(id, &grace.signal).await {
        tracing::warn!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, signal = %grace.signal, error = %e, "cannot send the stop signal; killing");
        return;
    }
    tracing::info!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, signal = %grace.signal, grace_s = grace.period.as_secs_f64(), "kernel stopping with its grace period");
    loop {
        match backend.inspect_container(id).await {
            Ok(Some(s)) if s.running => {}
            Ok(s) => {
                let exit_code = s.and_then(|s| s.exit_code);
                h.update(|i| i.stopped = Some(Stopped { exit_code, killed: false }));
                return;
            }
            Err(e) => {
                tracing::warn!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, error = %e, "cannot inspect the stopping container; killing");
                return;
            }
        }
        // Read again each time: a later end with a shorter grace (`rm --now`) cuts the wait.
        let period = h.info().grace(default).period;
        if started.elapsed() >= period {
            tracing::info!(agent_id = %h.ctx.agent_id, kernel_id = %h.id, grace_s = period.as_secs_f64(), "grace period over: killing the kernel's container");
            h.ctx.metrics.grace_killed();
            h.update(|i| i.stopped = Some(Stopped { exit_code: None, killed: true }));
            return;
        }
        tokio::time::sleep(GRACE_POLL.min(period - started.elapsed())).await;
    }
}

impl KernelStage for ContainerStage {
    fn new(handle: KernelHandle) -> Self {
        ContainerStage(handle)
    }

    fn spec(plan: &Plan, r: &Resources<'_>) -> Result<ContainerPlan, BoxError> {
        let image = r.of(IMAGE)?;
        let ports = r.of(PORTS)?;
        let scratch = r.of(SCRATCH)?;
        Ok(ContainerPlan {
            spec: container_spec(
                &plan.handle,
                &image.id,
                &plan.service_ports(image)?,
                r.of(SLOTS)?,
                ports,
                scratch,
                r.of(MOUNTS)?,
            ),
            runner: runner_plan(plan.gate(image), image, ports, scratch),
            scratch: scratch.clone(),
        })
    }

    /// The container itself, by its engine id and name.
    fn rebuild(found: &Found<'_>) -> Result<ContainerHandle, String> {
        Ok(ContainerHandle {
            id: found.desc.id.clone(),
            name: found.desc.spec.name.clone(),
        })
    }

    /// A watched stage: the watcher reports the container's exits and health
    /// (`crate::agent::kernel::watch`).
    fn add(plan: &Arc<Plan>, tree: StageTreeBuilder) -> StageTreeBuilder {
        let p = plan.clone();
        let watcher = crate::agent::kernel::watch::container_watcher(
            plan.handle.clone(),
            plan.recipients.container_ended.clone(),
        );
        tree.watched_stage(
            Injected::new(ContainerStage(plan.handle.clone()), plan),
            move |r| Self::spec(&p, r),
            watcher,
        )
    }
}

/// A new container for a kernel whose other resources stay (`restart_kernel` with an updated
/// config): made from the kernel's current config with the same image, slots, host ports,
/// scratch and vfolders, started, and bootstrapped as at creation, after container `old` is
/// removed.
///
/// Errors: as the container stage's setup; the new container is not left behind then (the old
/// one is gone already: the kernel's watcher then ends the kernel).
pub async fn recreate_container(
    handle: &KernelHandle,
    r: &crate::agent::kernel::KernelResources,
    old: &str,
) -> Result<ContainerHandle, KernelError> {
    let requests: Vec<ServicePortRequest> = r
        .service_ports
        .iter()
        .map(|s| ServicePortRequest {
            name: s.name.clone(),
            protocol: s.protocol.clone(),
            container_ports: s.container_ports.clone(),
        })
        .collect();
    let runner = r.runner.map(|repl| RunnerPlan {
        runtime_type: r
            .image
            .labels
            .get(crate::agent::runner::gate::RUNTIME_TYPE)
            .cloned()
            .unwrap_or_else(|| "app".into()),
        runtime_path: r.image.labels.get(labels::RUNTIME_PATH).cloned(),
        repl,
        scratch: r.scratch.clone(),
        corecount_vars: launch::corecount_vars(
            r.image.labels.get(crate::agent::runner::gate::CORECOUNT),
        ),
    });
    let plan = ContainerPlan {
        spec: container_spec(
            handle,
            &r.image.id,
            &requests,
            &r.slots,
            &r.ports,
            &r.scratch,
            &r.mounts,
        ),
        runner,
        scratch: r.scratch.clone(),
    };
    let spec = final_spec(handle, &plan).await?;
    let backend = &handle.ctx.backend;
    // The old container holds the name and the host ports: it goes first (as upstream's agent
    // destroys it before creating the new one).
    backend.remove_container(old).await?;
    let id = backend
        .create_container(&spec)
        .await
        .map_err(|e| creation_error(&spec, e))?;
    let started = match backend.start_container(&id).await {
        Ok(()) => match handle
            .info()
            .config
            .bootstrap_script
            .clone()
            .filter(|_| plan.runner.is_none())
        {
            Some(script) => run_bootstrap(handle, &id, &script).await,
            None => Ok(()),
        },
        Err(e) => Err(creation_error(&spec, e)),
    };
    if let Err(e) = started {
        let _ = backend.remove_container(&id).await;
        return Err(e);
    }
    Ok(ContainerHandle {
        id,
        name: spec.name,
    })
}

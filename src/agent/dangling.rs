//! Dangling kernels (`docs/design.md`): containers carrying this agent's id (`ai.backend.agent-id`) that
//! its store does not know, because the store was lost or an older agent made them.
//!
//! Recovery rebuilds what it can of each one from the engine alone ([`rebuild`]): the kernel and
//! session ids, owner and service ports from its labels, slots and devices from its
//! `ai.backend.resource.slots` / `ai.kernelvisor.devices` labels (else from its `HostConfig`
//! limits: `NanoCpus` → cpu, `Memory` → mem, `nvidia` device requests → `cuda.device`), host ports from its port
//! bindings, its scratch directory and vfolders from its binds, the image from its image id.
//! It keeps them in the [`DanglingTable`] and reports each with `kernel_dangling` (carrying that
//! description); the manager decides:
//!
//! - `adopt_kernel(kernel_id)` ([`adopt`]): the kernel goes into the store as `RUNNING` with the
//!   rebuilt resources and runs under a kernel actor again (registry [`Adopt`]), exactly like a
//!   kernel re-attached from the store.
//! - `destroy_dangling_kernel(kernel_id)` ([`destroy`]): its container and scratch directory go.
//!
//! **Capacity is never over-committed:** while a running dangling container waits for the
//! manager's decision, the slots and host ports it is described with are reserved in the agent's
//! allocators (a dangling container still uses them); adoption hands them to the kernel, destroying
//! releases them. A dead dangling container holds nothing.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::Addr;

use super::backend::{labels, ContainerDescription, ImageInfo};
use super::context::AgentContext;
pub use super::dangling_table::{DanglingKernel, DanglingTable, Rebuilt};
use super::events::AgentEvent;
use super::kernel::config::{check_kernel_id, Injection, ServicePortRequest};
use super::kernel::stages::scratch::{remove_scratch, scratch_path};
use super::kernel::stages::{rebuild_all, Found};
use super::kernel::{KernelConfig, KernelError, KernelInfo, KernelStatus, Owner, SessionType};
use super::registry::{Adopt, GetKernel, KernelRegistry, Reconcile};
use super::resources::{SlotAllocation, SlotRequest};
use crate::rpc::{ErrorMeta, Failure};
use crate::slots::ResourceSlots;

/// Why [`adopt`] or [`destroy`] refused; [`DanglingError::to_meta`] is the FAILURE.
#[derive(Debug, thiserror::Error)]
pub enum DanglingError {
    /// No dangling kernel has this id (`KernelNotFound`): never reported, or already adopted or
    /// destroyed.
    #[error("no dangling kernel {0} on this agent")]
    NotFound(String),
    /// The engine's description is not enough to run it as a kernel, or several containers
    /// claim the id (`KernelNotAdoptable`): it can only be destroyed.
    #[error("dangling kernel {0} cannot be adopted: {1}")]
    NotAdoptable(String, String),
    /// Adopting or destroying failed on the way (the kernel's error name, e.g.
    /// `ContainerEngineError`); the entry stays in the table.
    #[error(transparent)]
    Kernel(#[from] KernelError),
}

impl DanglingError {
    /// As a FAILURE for the wire.
    pub fn to_meta(&self) -> ErrorMeta {
        match self {
            DanglingError::NotFound(_) => {
                ErrorMeta::failure(Failure::KernelNotFound, self.to_string())
            }
            DanglingError::NotAdoptable(..) => {
                ErrorMeta::failure(Failure::KernelNotAdoptable, self.to_string())
            }
            DanglingError::Kernel(e) => e.to_meta(),
        }
    }
}

/// Describes the dangling container `desc` from the engine alone; its image is inspected for
/// the image labels (`execute`'s runtime path). Never fails: what cannot be rebuilt is in
/// [`DanglingKernel::rebuilt`].
pub async fn describe(ctx: &AgentContext, desc: &ContainerDescription) -> DanglingKernel {
    let spec = &desc.spec;
    let label = |k: &str| spec.labels.get(k).cloned().unwrap_or_default();
    let owner: Owner = spec
        .labels
        .get(labels::OWNER)
        .and_then(|o| serde_json::from_str(o).ok())
        .unwrap_or_default();
    let requests: Result<Vec<ServicePortRequest>, String> =
        match spec.labels.get(labels::SERVICE_PORTS) {
            None => Ok(Vec::new()),
            Some(j) => serde_json::from_str(j)
                .map_err(|e| format!("label {} does not parse: {e}", labels::SERVICE_PORTS)),
        };
    // Host ports in service-port order (the order the ports stage allocated them), then any
    // other published port: all of them are the container's while it runs.
    let mut host_ports: Vec<u16> = Vec::new();
    let mut missing = None;
    for c in requests
        .as_deref()
        .unwrap_or_default()
        .iter()
        .flat_map(|r| r.container_ports.iter())
    {
        match spec.ports.iter().find(|m| m.container_port == *c) {
            Some(m) => host_ports.push(m.host_port),
            None => missing = Some(*c),
        }
    }
    let service_host_ports = host_ports.len();
    for m in &spec.ports {
        if !host_ports.contains(&m.host_port) {
            host_ports.push(m.host_port);
        }
    }
    let from_labels = spec
        .labels
        .get(labels::RESOURCE_SLOTS)
        .and_then(|j| serde_json::from_str::<ResourceSlots>(j).ok())
        .map(|slots| SlotAllocation {
            slots,
            devices: spec
                .labels
                .get(labels::DEVICES)
                .and_then(|j| serde_json::from_str(j).ok())
                .unwrap_or_default(),
        });
    let slots = from_labels.unwrap_or_else(|| {
        let legacy = SlotRequest {
            cpu_millis: spec.nano_cpus.map_or(0, |n| (n.max(0) / 1_000_000) as u64),
            mem_bytes: spec.memory_bytes.map_or(0, |m| m.max(0) as u64),
            cuda_devices: spec.gpu_device_ids.len() as u32,
        };
        serde_json::from_value(serde_json::json!({
            "request": legacy, "gpus": spec.gpu_device_ids,
        }))
        .unwrap_or_default()
    });
    let mut k = DanglingKernel {
        kernel_id: label(labels::KERNEL_ID),
        session_id: label(labels::SESSION_ID),
        container_id: desc.id.clone(),
        running: desc.running,
        image: spec.image.clone(),
        slots,
        host_ports,
        owner,
        rebuilt: Err(String::new()),
        reserved: false,
    };
    let image = match ctx.backend.inspect_image(&spec.image).await {
        Ok(Some(i)) => i,
        // The image went: the container still runs it; no labels known.
        _ => ImageInfo {
            id: spec.image.clone(),
            reference: spec.image.clone(),
            labels: Default::default(),
        },
    };
    k.rebuilt = rebuild(ctx, &k, desc, requests, missing, service_host_ports, image);
    k
}

/// The kernel's config from its description and its resources stage by stage
/// (`stages::rebuild_all`, each stage's `KernelStage::rebuild`), or why not.
fn rebuild(
    ctx: &AgentContext,
    k: &DanglingKernel,
    desc: &ContainerDescription,
    requests: Result<Vec<ServicePortRequest>, String>,
    missing_port: Option<u16>,
    service_host_ports: usize,
    image: ImageInfo,
) -> Result<Rebuilt, String> {
    let spec = &desc.spec;
    check_kernel_id(&k.kernel_id).map_err(|e| e.to_string())?;
    if k.session_id.is_empty() {
        return Err(format!("no {} label", labels::SESSION_ID));
    }
    let requests = requests?;
    if let Some(c) = missing_port {
        return Err(format!(
            "service container port {c} is not published on a host port"
        ));
    }
    let resources = rebuild_all(&Found {
        kernel_id: &k.kernel_id,
        desc,
        image: &image,
        slots: &k.slots,
        host_ports: &k.host_ports,
        service_host_ports,
        service_ports: &requests,
        container: &ctx.config.container,
    })?;
    let ours = [
        "BACKEND_KERNEL_ID",
        "BACKEND_SESSION_ID",
        "CUDA_VISIBLE_DEVICES",
    ];
    let environ: BTreeMap<String, String> = spec
        .env
        .iter()
        .filter_map(|e| e.split_once('='))
        .filter(|(key, _)| !ours.contains(key))
        .map(|(key, v)| (key.to_owned(), v.to_owned()))
        .collect();
    let command = match spec.cmd.as_deref() {
        Some([sh, dash_c, cmd]) if sh == "sh" && dash_c == "-c" => Some(cmd.clone()),
        _ => None,
    };
    let config = KernelConfig {
        // The container's own stop signal (the engine keeps it); its grace is the agent's.
        stop_signal: spec
            .stop_signal
            .as_deref()
            .and_then(|s| crate::workload::grace::checked_signal(s).ok()),
        grace_period: None,
        image: resources.image.id.clone(),
        slots: k.slots.slots.clone(),
        shmem: spec.shm_size.map(|s| s.max(0) as u64),
        environ,
        mounts: resources
            .mounts
            .iter()
            .map(|b| {
                let under_work = b.container_path.strip_prefix("/home/work/");
                super::kernel::config::MountRequest {
                    name: under_work
                        .unwrap_or_else(|| b.container_path.rsplit('/').next().unwrap_or_default())
                        .to_owned(),
                    host_path: b.host_path.clone(),
                    read_only: b.read_only,
                    kernel_path: under_work.is_none().then(|| b.container_path.clone()),
                }
            })
            .collect(),
        service_ports: requests,
        owner: k.owner.clone(),
        // Labels from before these existed read as the defaults.
        session_type: match spec.labels.get(labels::SESSION_TYPE).map(String::as_str) {
            Some("batch") if command.is_some() => SessionType::Batch,
            _ => SessionType::Interactive,
        },
        command,
        batch_timeout: None,
        restart_policy: spec
            .labels
            .get(labels::RESTART_POLICY)
            .and_then(|p| serde_json::from_str::<crate::workload::RestartPolicy>(p).ok())
            .filter(|p| p.check().is_ok())
            .unwrap_or_default(),
        inject: Injection::default(),
        uid: None,
        main_gid: None,
        supplementary_gids: Vec::new(),
        // It already ran when the kernel was first created.
        bootstrap_script: None,
        allocated_host_ports: Vec::new(),
        idle_timeout: None,
        // The container's own (Backend.AI's manager also names it in the environment).
        cluster_hostname: spec.hostname.clone().or_else(|| {
            spec.env
                .iter()
                .find_map(|e| e.strip_prefix("BACKENDAI_CLUSTER_HOST="))
                .map(str::to_owned)
        }),
        image_config: None,
        // Its keys are in its scratch directory already.
        ssh_keypair: None,
        cluster_role: spec
            .env
            .iter()
            .find_map(|e| e.strip_prefix("BACKENDAI_CLUSTER_ROLE="))
            .map(str::to_owned),
        // What its creation stored beside its keys (`config/cluster.json`): a new container
        // for it joins the same network again.
        cluster: super::kernel::cluster::ClusterConfig::read(&resources.scratch.config_dir())
            .map_err(|e| format!("its cluster.json: {e}"))?,
    };
    Ok(Rebuilt { config, resources })
}

fn reserve(ctx: &AgentContext, k: &mut DanglingKernel) {
    if !k.reserved {
        ctx.slots
            .lock()
            .expect("slots lock")
            .reserve_exact(&k.kernel_id, &k.slots);
        ctx.ports
            .lock()
            .expect("ports lock")
            .reserve_exact(&k.host_ports);
        k.reserved = true;
    }
}

fn release(ctx: &AgentContext, k: &mut DanglingKernel) {
    if k.reserved {
        ctx.slots
            .lock()
            .expect("slots lock")
            .release(&k.kernel_id, &k.slots);
        ctx.ports.lock().expect("ports lock").release(&k.host_ports);
        k.reserved = false;
    }
}

/// Recovery's part: describes `containers` (this agent's, unknown to its store), reserves what
/// the running ones hold, fills the table and emits one `kernel_dangling` each. Returns how
/// many.
pub async fn report(ctx: &AgentContext, containers: Vec<ContainerDescription>) -> usize {
    let mut found = Vec::with_capacity(containers.len());
    for desc in &containers {
        let mut k = describe(ctx, desc).await;
        if k.running {
            reserve(ctx, &mut k);
        }
        tracing::warn!(
            agent_id = %ctx.agent_id, kernel_id = %k.kernel_id, container_id = %k.container_id,
            running = k.running, host_ports = ?k.host_ports, slots = %k.slots.slots,
            not_adoptable = ?k.rebuilt.as_ref().err(),
            "dangling container: carries this agent's id but no live kernel; reported to the manager"
        );
        ctx.events.emit(k.event());
        found.push(k);
    }
    let n = found.len();
    ctx.dangling.replace(found);
    n
}

/// `adopt_kernel`: the dangling kernel `kernel_id` becomes a kernel of this agent again: its
/// slots and ports reserved exactly as described, recorded `RUNNING` in the store with the
/// rebuilt resources, run under a kernel actor (registry [`Adopt`]); `kernel_started` is
/// emitted and its container checked (one that died meanwhile is torn down with
/// `kernel_terminated`, as on a re-attach). Returns its facts.
///
/// Errors: [`DanglingError::NotFound`]; [`DanglingError::NotAdoptable`] (not rebuilt, or
/// several containers with this id); [`DanglingError::Kernel`] when the id is live here or the
/// store or registry fails (nothing changes then: the entry stays).
pub async fn adopt(
    ctx: &Arc<AgentContext>,
    registry: &Addr<KernelRegistry>,
    kernel_id: &str,
) -> Result<KernelInfo, DanglingError> {
    let mut taken = ctx.dangling.take(kernel_id);
    if taken.is_empty() {
        return Err(DanglingError::NotFound(kernel_id.to_owned()));
    }
    let why = match (taken.len(), &taken[0].rebuilt) {
        (1, Ok(_)) => None,
        (1, Err(why)) => Some(why.clone()),
        (n, _) => Some(format!("{n} containers carry this kernel id")),
    };
    if let Some(why) = why {
        ctx.dangling.put_back(taken);
        return Err(DanglingError::NotAdoptable(kernel_id.to_owned(), why));
    }
    let mut k = taken.pop().expect("one entry");
    let Ok(rebuilt) = k.rebuilt.clone() else {
        unreachable!("checked above")
    };
    let refused = |ctx: &AgentContext, k: DanglingKernel, e: KernelError| {
        ctx.dangling.put_back(vec![k]);
        Err(DanglingError::Kernel(e))
    };
    let store_err = |e: anyhow::Error| KernelError::Engine(format!("store: {e}"));
    match registry.send(GetKernel(kernel_id.to_owned())).await {
        Ok(None) => {}
        Ok(Some(_)) => {
            return refused(
                ctx,
                k,
                KernelError::InvalidConfig(format!("kernel {kernel_id} is live on this agent")),
            )
        }
        Err(e) => return refused(ctx, k, KernelError::Engine(e.to_string())),
    }
    match ctx
        .store
        .insert_kernel(kernel_id, &k.session_id, &rebuilt.config)
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            return refused(
                ctx,
                k,
                KernelError::InvalidConfig(format!("kernel {kernel_id} is live in the store")),
            )
        }
        Err(e) => return refused(ctx, k, store_err(e)),
    }
    if let Err(e) = ctx
        .store
        .set_status(kernel_id, KernelStatus::Running, Some(&rebuilt.resources))
        .await
    {
        let _ = ctx
            .store
            .set_terminated(kernel_id, "adoption-failed", None)
            .await;
        return refused(ctx, k, store_err(e));
    }
    reserve(ctx, &mut k);
    let adopted = registry
        .send(Adopt {
            kernel_id: kernel_id.to_owned(),
            session_id: k.session_id.clone(),
            config: rebuilt.config,
            resources: rebuilt.resources,
        })
        .await
        .map_err(|e| KernelError::Engine(e.to_string()))
        .and_then(|r| r);
    if let Err(e) = adopted {
        let _ = ctx
            .store
            .set_terminated(kernel_id, "adoption-failed", None)
            .await;
        if !k.running {
            release(ctx, &mut k);
        }
        return refused(ctx, k, e);
    }
    tracing::info!(agent_id = %ctx.agent_id, %kernel_id, container_id = %k.container_id, host_ports = ?k.host_ports, "dangling kernel adopted");
    ctx.events.emit(AgentEvent::KernelStarted {
        creation_info: None,
        kernel_id: kernel_id.to_owned(),
        session_id: k.session_id.clone(),
    });
    // A container that died since recovery is handled like one found dead on a re-attach.
    registry.do_send(Reconcile);
    registry
        .send(GetKernel(kernel_id.to_owned()))
        .await
        .ok()
        .flatten()
        .ok_or_else(|| DanglingError::Kernel(KernelError::NotFound(kernel_id.to_owned())))
}

/// `destroy_dangling_kernel`: removes every container of the dangling kernel `kernel_id`, its
/// scratch directory (when the id is a valid one and no live kernel of this agent has it), and
/// releases what was reserved for it. Emits nothing (the manager does not hold it live).
/// Returns how many containers went.
///
/// Errors: [`DanglingError::NotFound`]; [`DanglingError::Kernel`] when the engine or the
/// filesystem fails (the entries not yet removed stay).
pub async fn destroy(
    ctx: &Arc<AgentContext>,
    registry: &Addr<KernelRegistry>,
    kernel_id: &str,
) -> Result<usize, DanglingError> {
    let mut taken = ctx.dangling.take(kernel_id);
    if taken.is_empty() {
        return Err(DanglingError::NotFound(kernel_id.to_owned()));
    }
    let mut removed = 0;
    while let Some(mut k) = taken.pop() {
        if let Err(e) = ctx.backend.remove_container(&k.container_id).await {
            taken.push(k);
            ctx.dangling.put_back(taken);
            return Err(DanglingError::Kernel(e.into()));
        }
        release(ctx, &mut k);
        removed += 1;
        tracing::info!(agent_id = %ctx.agent_id, %kernel_id, container_id = %k.container_id, "dangling container destroyed");
    }
    let live = matches!(
        registry.send(GetKernel(kernel_id.to_owned())).await,
        Ok(Some(_)) | Err(_)
    ) || ctx.store.is_live(kernel_id).await.unwrap_or(true);
    if check_kernel_id(kernel_id).is_ok() && !live {
        let c = &ctx.config.container;
        let io =
            |e: std::io::Error| DanglingError::Kernel(KernelError::Engine(format!("scratch: {e}")));
        remove_scratch(
            &scratch_path(&c.scratch_root, kernel_id).map_err(io)?,
            c.scratch_size.is_some(),
        )
        .map_err(io)?;
    }
    Ok(removed)
}

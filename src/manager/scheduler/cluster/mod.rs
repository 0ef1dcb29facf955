//! Cluster sessions (issue 40): a session of N kernels, `main1` and `sub1` … `sub{N-1}`,
//! placed as one gang and created together, as Backend.AI 26.x's manager does
//! (`manager/sokovan/scheduler/launcher/launcher.py`, `hooks/status.py`; read in
//! `docs/backend-ai.md`):
//!
//! 1. placed whole or not at all (`place::place_gang`) and reserved in one transaction
//!    (`Store::reserve_gang`: one unit of concurrency for the session, each agent's room
//!    checked for everything the gang puts there);
//! 2. its network made first (`network.rs`) and recorded on the main kernel's row;
//! 3. each agent's image pulled, a session-wide SSH keypair made (`keypair.rs`), and
//!    `create_kernels` called once per agent, concurrently, with the same `ClusterInfo`;
//! 4. any failure rolls the whole gang back: every kernel destroyed where it may exist, every
//!    row ended with the failure's code as its reason (`failed-to-create` for an agent's
//!    refusal or silence, as the agent's own events say), which frees every reservation and
//!    the concurrency, and the network removed;
//! 5. afterwards (`settle`, in the leader's reconcile sweep): a kernel that ended ends the
//!    others with its reason, and once every kernel has ended the network goes;
//! 6. a session whose kernels all ended (a lost kernel, a failed create) is requeued whole
//!    or ended for good by its restart policy (`restart.rs`); the next generation's network
//!    has its own name (`network_name`), as the old one may outlive it on a lost agent.
//!
//! The session is `RUNNING` when every kernel is (the API combines their statuses).

mod keypair;
mod network;
mod restart;

use std::collections::BTreeMap;
use std::time::Instant;

use futures::StreamExt;
use rmpv::Value;

pub use network::{network_name, OverlaySpec};

use super::launch::{end_on_agent, grace_left, kernel_config, ClusterPlace, Launcher, Placed};
use super::pull::{PullOutcome, PullPhase};
use crate::manager::calls::{agent_error, call_agent};
use crate::manager::error::ManagerError;
use crate::manager::store::{KernelRow, StoreError};
use crate::model::cluster::{cluster_slots, ClusterMode, ClusterSlot, MAIN_ROLE, SUB_ROLE};
use crate::model::session::KernelStatus;
use crate::rpc::agent_api::kernel::{ClusterInfo, CreateKernels, CreateKernelsArgs};
use crate::rpc::agent_api::{decode_reply, encode_args, to_value};

/// A cluster session placed and reserved: what its creation needs.
pub(super) struct GangPlaced {
    /// The session as its main kernel's placement (owner, request, ids, slots of one kernel,
    /// mounts).
    pub(super) placed: Placed,
    /// `single-node` or `multi-node`.
    pub(super) mode: ClusterMode,
    /// Every kernel, `main1` first.
    pub(super) kernels: Vec<GangKernel>,
    /// Its main row's `restart_count` (0 for a session never requeued): names its network.
    pub(super) generation: i64,
}

/// One kernel of a gang.
#[derive(Clone, Debug)]
pub(super) struct GangKernel {
    /// Kernel UUID.
    pub(super) kernel_id: String,
    /// The agent it is reserved on.
    pub(super) agent_id: String,
    /// Its role, index and host name.
    pub(super) slot: ClusterSlot,
}

/// A session's kernels on `agents` (one per kernel, `main1` first): the main kernel's id is
/// `main_id`, the others new.
pub(super) fn gang_kernels(main_id: &str, agents: &[String]) -> Vec<GangKernel> {
    let size = u32::try_from(agents.len()).unwrap_or(u32::MAX);
    cluster_slots(size)
        .into_iter()
        .zip(agents)
        .map(|(slot, agent)| GangKernel {
            kernel_id: match slot.local_rank {
                0 => main_id.to_owned(),
                _ => uuid::Uuid::new_v4().to_string(),
            },
            agent_id: agent.clone(),
            slot,
        })
        .collect()
}

/// How a gang's launch ended when it did not fail for good.
#[derive(Debug)]
pub(super) enum GangLaunch {
    /// Every kernel created.
    Created,
    /// Its create failed, was rolled back, and its restart policy requeued the session:
    /// its new main row (`PENDING`).
    Requeued(Box<KernelRow>),
}

/// Kernels sent to agents at once while a gang is ended (its destroys).
const CONCURRENCY: usize = 16;

impl Launcher {
    /// Creates a reserved gang (see the module's doc); on any failure rolls it back whole and
    /// returns the failure, unless its restart policy requeued it ([`GangLaunch::Requeued`]). Nobody else ends its rows meanwhile but a user's destroy or the
    /// reconcile sweep, which the rollback tolerates (ending a row twice is a no-op).
    ///
    /// Errors: the network's (`cluster-network-failed`), a pull's, the keypair's (`internal`),
    /// the first agent refusal or unknown outcome of `create_kernels`.
    pub(super) async fn launch_gang(&self, g: GangPlaced) -> Result<GangLaunch, ManagerError> {
        match self.create_gang(&g).await {
            Ok(()) => {
                self.metrics.sessions_created.inc();
                Ok(GangLaunch::Created)
            }
            Err(e) => {
                tracing::info!(session_id = %g.placed.session_id, error = %e, "cluster session could not be created; rolling it back");
                let rows = self.store.session_kernels(&g.placed.session_id).await?;
                // The agent's own reason for a kernel it could not create (its events may
                // have ended some rows with it already): one reason on every kernel.
                let reason = match e.code() {
                    "agent-error" | "agent-unavailable" => "failed-to-create",
                    code => code,
                };
                // A creation that failed has no workload to save: no grace.
                end_gang(self, &rows, reason, Some(std::time::Duration::ZERO)).await;
                // Its restart policy: requeued now when every kernel ended (else the sweep's
                // `settle` decides once the last one has).
                let rows = self.store.session_kernels(&g.placed.session_id).await?;
                if let Some(row) = restart::apply(self, &rows).await? {
                    return Ok(GangLaunch::Requeued(Box::new(row)));
                }
                // The leader's sweep may have requeued it first (it saw every kernel ended
                // while the rollback removed the network): the session was queued all the
                // same, and its new generation (perhaps placed already) answers.
                let now = self.store.session_kernels(&g.placed.session_id).await?;
                match now.into_iter().find(|k| k.is_main()) {
                    Some(k) if k.id != g.placed.kernel_id => Ok(GangLaunch::Requeued(Box::new(k))),
                    _ => Err(e),
                }
            }
        }
    }

    async fn create_gang(&self, g: &GangPlaced) -> Result<(), ManagerError> {
        let p = &g.placed;
        let size = u32::try_from(g.kernels.len()).unwrap_or(u32::MAX);
        let spec = &self.spec;
        // The network first: every kernel joins it at its creation.
        let network = match size {
            0 | 1 => None,
            _ => {
                let name = network_name(g.mode, &p.session_id, g.generation);
                // Recorded before it is made: a manager that dies now leaves it to the sweep.
                self.store
                    .set_session_network(&p.session_id, Some(&name))
                    .await?;
                let id = match g.mode {
                    ClusterMode::SingleNode => {
                        network::create_local(
                            &self.pool,
                            &self.metrics,
                            &g.kernels[0].agent_id,
                            &name,
                            spec.create_timeout,
                        )
                        .await?;
                        name.clone()
                    }
                    ClusterMode::MultiNode => network::create_overlay(&spec.overlay, &name).await?,
                };
                Some((name, id))
            }
        };
        // Each agent's image, pulled once per agent (its first kernel's row shows `PULLING`).
        let mut by_agent: BTreeMap<&str, Vec<&GangKernel>> = BTreeMap::new();
        for k in &g.kernels {
            by_agent.entry(k.agent_id.as_str()).or_default().push(k);
        }
        let main_config = kernel_config(spec, p, &ClusterPlace::single(), None)?;
        let give_up = Instant::now() + spec.image_pull_timeout;
        let pulls = by_agent.iter().map(|(agent, ks)| {
            let pull = PullPhase {
                pool: self.pool.clone(),
                metrics: self.metrics.clone(),
                store: self.store.clone(),
                agent_id: (*agent).to_owned(),
                kernel_id: ks[0].kernel_id.clone(),
                image: main_config.image.clone(),
            };
            async move {
                if !pull.start().await? {
                    return Ok(());
                }
                match pull.follow(give_up, give_up).await {
                    PullOutcome::Ready => Ok(()),
                    PullOutcome::Failed(e) => Err(e),
                    PullOutcome::Pulling => Err(ManagerError::ImagePullTimeout(format!(
                        "{}: still pulling at [scheduler] image-pull-timeout",
                        pull.image.canonical
                    ))),
                }
            }
        });
        for r in futures::future::join_all(pulls).await {
            r?;
        }
        let keys = tokio::task::spawn_blocking(keypair::take)
            .await
            .map_err(|e| ManagerError::Internal(format!("cluster keypair: {e}")))?
            .map_err(|e| ManagerError::Internal(format!("cluster keypair: {e}")))?;
        let info = ClusterInfo {
            mode: g.mode,
            size,
            replicas: BTreeMap::from_iter(
                [(MAIN_ROLE.to_owned(), 1), (SUB_ROLE.to_owned(), size - 1)]
                    .into_iter()
                    .filter(|(_, n)| *n > 0),
            ),
            network_config: network::network_config(
                g.mode,
                network.as_ref().map(|(n, i)| (n.as_str(), i.as_str())),
            ),
            ssh_keypair: Some(to_value(&keys)),
            cluster_ssh_port_mapping: None,
        };
        let creates = by_agent.iter().map(|(agent, ks)| {
            let info = info.clone();
            async move {
                let mut ids = Vec::with_capacity(ks.len());
                let mut configs = Vec::with_capacity(ks.len());
                for k in ks {
                    let place = ClusterPlace {
                        slot: k.slot.clone(),
                        mode: g.mode,
                        size,
                    };
                    configs.push(to_value(&kernel_config(
                        spec,
                        p,
                        &place,
                        Some(&k.kernel_id),
                    )?));
                    ids.push(k.kernel_id.clone());
                }
                let call = encode_args::<CreateKernels>(&CreateKernelsArgs {
                    session_id: p.session_id.clone(),
                    kernel_ids: ids.clone(),
                    configs,
                    cluster_info: Some(info),
                    kernel_image_refs: None,
                });
                let reply = call_agent(
                    &self.pool,
                    &self.metrics,
                    agent,
                    "create_kernels",
                    call.args,
                    spec.create_timeout,
                )
                .await
                .map_err(|e| match e.failure() {
                    Some(_) => agent_error(&e),
                    None => ManagerError::AgentUnavailable(e.to_string()),
                })?;
                let results = decode_reply::<CreateKernels>(reply)
                    .map_err(|e| ManagerError::Internal(e.to_string()))?;
                for id in &ids {
                    let result = results.iter().find(|r| r.id == *id);
                    if let Some(r) = result {
                        let names: Vec<String> =
                            r.service_ports.iter().map(|p| p.name.clone()).collect();
                        self.store.set_service_ports(id, &names).await?;
                    }
                    // The status the agent reports for it (`RUNNING` when it reports none).
                    let status = result
                        .and_then(|r| r.info.get("status"))
                        .and_then(Value::as_str)
                        .map_or(Some(KernelStatus::Running), KernelStatus::parse);
                    if let Some(status) = status {
                        self.store.advance_kernel(id, status).await?;
                    }
                }
                Ok::<(), ManagerError>(())
            }
        });
        for r in futures::future::join_all(creates).await {
            r?;
        }
        // Ended while it was created (a user's destroy, the sweep): the rollback ends the rest.
        let rows = self.store.session_kernels(&p.session_id).await?;
        if let Some(ended) = rows.iter().find(|k| k.status.is_ending()) {
            return Err(ManagerError::SessionNotFound(format!(
                "{}: kernel {} ended while the session was created ({})",
                p.session_id,
                ended.cluster_hostname,
                ended.status_reason.as_deref().unwrap_or("?")
            )));
        }
        Ok(())
    }
}

/// Ends every kernel of a session with `reason`, each with `grace` (`None`: its own, as
/// [`grace_left`]): each live one `TERMINATING`, destroyed on its agent (one the agent no
/// longer has counts as destroyed), then `TERMINATED` ([`end_on_agent`]); a queued main row
/// `CANCELLED`; then the session's network removed. A destroy that fails leaves its row
/// `TERMINATING` for the reconcile sweep's deadline, and the network for a later `settle`.
pub(super) async fn end_gang(
    launcher: &Launcher,
    rows: &[KernelRow],
    reason: &str,
    grace: Option<std::time::Duration>,
) {
    let store = &launcher.store;
    futures::stream::iter(rows.iter().filter(|k| k.is_live()))
        .for_each_concurrent(CONCURRENCY, |k| async move {
            let r: Result<(), String> = async {
                if k.is_pending() {
                    store
                        .cancel_pending(&k.id, reason)
                        .await
                        .map_err(|e| e.to_string())?;
                    return Ok(());
                }
                let mut g = grace_left(k, launcher.spec.grace_period);
                if let Some(period) = grace {
                    g.period = g.period.min(period);
                }
                end_on_agent(launcher, k, reason, &g)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(())
            }
            .await;
            if let Err(e) = r {
                tracing::info!(kernel_id = %k.id, error = %e, "cluster session: a kernel could not be ended now; the reconcile sweep ends it");
            }
        })
        .await;
    if let Some(main) = rows.iter().find(|k| k.is_main()) {
        if let Err(e) = remove_network(launcher, main).await {
            tracing::info!(session_id = %main.session_id, error = %e, "cluster session: its network is left for the reconcile sweep");
        }
    }
}

/// Removes the network named on one main row (`main`: every kernel of its generation ended on
/// its agents: a preempted session before its requeue, a generation a restart superseded, a
/// session whose kernels all ended), then forgets it on that row; nothing to do without one.
///
/// Errors: the store's, or the network's removal (`cluster-network-failed`: its agent does not
/// answer, a container still holds it).
pub(super) async fn remove_network_of(
    launcher: &Launcher,
    main: &KernelRow,
) -> Result<(), ManagerError> {
    let Some(name) = main.network.as_deref() else {
        return Ok(());
    };
    match main.cluster_mode {
        ClusterMode::SingleNode => {
            network::destroy_local(
                &launcher.pool,
                &launcher.metrics,
                &main.agent_id,
                name,
                launcher.spec.destroy_timeout,
            )
            .await?
        }
        ClusterMode::MultiNode => network::remove_overlay(&launcher.spec.overlay, name).await?,
    }
    // Cleared on that row by its id, not on the session's current main row: a restart may
    // have queued the next generation meanwhile, whose own network that would forget.
    launcher.store.clear_network(&main.id).await?;
    Ok(())
}

/// Removes a session's network once none of its kernels is live (the main row's `network`,
/// then cleared). Nothing to do without one.
///
/// Errors: the store's, or the network's removal (`cluster-network-failed`), when some kernel
/// is still live, or the removal failed.
async fn remove_network(launcher: &Launcher, main: &KernelRow) -> Result<(), ManagerError> {
    let store = &launcher.store;
    let rows = store.session_kernels(&main.session_id).await?;
    let Some(main) = rows.iter().find(|k| k.is_main()) else {
        return Ok(());
    };
    let Some(name) = main.network.as_deref() else {
        return Ok(());
    };
    if let Some(live) = rows.iter().find(|k| k.is_live()) {
        return Err(ManagerError::ClusterNetworkFailed(format!(
            "network `{name}`: kernel {} is still {}",
            live.cluster_hostname,
            live.status.as_str()
        )));
    }
    remove_network_of(launcher, main).await
}

/// The reconcile sweep's pass over cluster sessions (the leader's): in each session that has
/// a kernel ended while others live, the others are ended with that kernel's reason (a lost
/// agent, a failed or finished main process: the session ends whole, and a batch session's
/// exit code stays its main kernel's); a session whose kernels all ended loses its network.
/// Returns how many sessions it acted on.
///
/// Errors: the store could not be read.
pub(super) async fn settle(launcher: &Launcher, limit: u32) -> Result<usize, StoreError> {
    let sessions = launcher.store.unsettled_clusters(limit).await?;
    let n = sessions.len();
    for rows in sessions {
        let ended = rows.iter().filter(|k| !k.is_live()).min_by(|a, b| {
            a.terminated_at
                .unwrap_or(f64::MAX)
                .total_cmp(&b.terminated_at.unwrap_or(f64::MAX))
        });
        match ended {
            Some(first) if rows.iter().any(KernelRow::is_live) => {
                let reason = first
                    .status_reason
                    .clone()
                    .unwrap_or_else(|| "kernel-terminated".to_owned());
                tracing::info!(session_id = %first.session_id, kernel = %first.cluster_hostname, %reason, "cluster session: a kernel ended; ending the others");
                end_gang(launcher, &rows, &reason, None).await;
                // Every kernel ended now (else the next pass sees the rest end): its policy.
                let rows = launcher.store.session_kernels(&first.session_id).await?;
                restart::apply(launcher, &rows).await?;
            }
            _ => {
                if let Some(main) = rows.iter().find(|k| k.is_main()) {
                    if let Err(e) = remove_network(launcher, main).await {
                        tracing::info!(session_id = %main.session_id, error = %e, "cluster session: its network could not be removed yet");
                    }
                }
                restart::apply(launcher, &rows).await?;
            }
        }
    }
    // The networks of generations a restart superseded, once their agents answer again.
    for main in launcher.store.superseded_networks(limit).await? {
        match remove_network_of(launcher, &main).await {
            Ok(()) => {
                tracing::info!(session_id = %main.session_id, network = ?main.network, "cluster session: a restarted session's old network removed")
            }
            Err(e) => {
                tracing::debug!(session_id = %main.session_id, error = %e, "cluster session: an old generation's network is left for a later pass")
            }
        }
    }
    Ok(n)
}

//! A cluster session's network, made before its first kernel is created and removed after its
//! last kernel ends, as Backend.AI 26.x's manager does
//! (`manager/sokovan/scheduler/launcher/launcher.py::_setup_network_configuration`,
//! `hooks/status.py::_destroy_network`):
//! - `single-node` with more than one kernel: `create_local_network("bai-singlenode-<session
//!   id>")` on the agent that holds every kernel (a bridge; the agent labels it and refuses to remove
//!   one it did not make) → `network_config = {"mode": "bridge", "network_name"}`;
//! - `multi-node`: a Docker Swarm overlay `bai-multinode-<session id>` made by the manager on a
//!   Swarm manager's engine (`manager/network/overlay.py`): attachable, labelled
//!   `ai.backend.cluster-network=1`, the MTU when configured, an existing one reused →
//!   `network_config = {"mode": "overlay", "network_name", "network_id"}`.
//!
//! A session of one kernel has no network of its own.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bollard::network::CreateNetworkOptions;
use bollard::Docker;
use rmpv::Value;

use crate::manager::calls::call_method;
use crate::manager::error::ManagerError;
use crate::manager::metrics::ManagerMetrics;
use crate::manager::pool::AgentPool;
use crate::model::cluster::ClusterMode;
use crate::rpc::agent_api::network::{
    CreateLocalNetwork, DestroyLocalNetwork, NetworkArgs, CLUSTER_NETWORK_LABEL,
};

/// Where `multi-node` sessions' overlay networks are made (`[scheduler] swarm-docker-host`,
/// `overlay-mtu`).
#[derive(Clone, Debug, Default)]
pub struct OverlaySpec {
    /// The Swarm manager's engine; `None`: `DOCKER_HOST`, else the local socket.
    pub docker_host: Option<String>,
    /// `com.docker.network.driver.mtu`; `None`: Docker's.
    pub mtu: Option<u32>,
}

/// Seconds a call to the Swarm manager's engine may take.
const ENGINE_TIMEOUT_SECS: u64 = 30;

/// The network a session of `mode` gets: `bai-singlenode-<id>` / `bai-multinode-<id>` (the
/// names upstream's manager gives), with `-r<n>` after it for a generation a restart queued
/// (`generation`: its main row's `restart_count`, 0 for the first): the old generation's
/// network may outlive it on a lost agent's engine, or a Swarm with its containers still
/// attached, and a new kernel must not join its namesakes there.
pub fn network_name(mode: ClusterMode, session_id: &str, generation: i64) -> String {
    let base = match mode {
        ClusterMode::SingleNode => format!("bai-singlenode-{session_id}"),
        ClusterMode::MultiNode => format!("bai-multinode-{session_id}"),
    };
    match generation {
        0 => base,
        n => format!("{base}-r{n}"),
    }
}

/// A client of the Swarm manager's engine.
///
/// Errors: [`ManagerError::ClusterNetworkFailed`] for an address bollard does not take.
fn engine(spec: &OverlaySpec) -> Result<Docker, ManagerError> {
    let failed = |e: bollard::errors::Error| {
        ManagerError::ClusterNetworkFailed(format!(
            "[scheduler] swarm-docker-host {:?}: {e}",
            spec.docker_host.as_deref().unwrap_or("(local default)")
        ))
    };
    let v = bollard::API_DEFAULT_VERSION;
    match spec.docker_host.as_deref() {
        None => Docker::connect_with_local_defaults(),
        Some(h) if h.starts_with("unix://") || h.starts_with('/') => {
            Docker::connect_with_unix(h, ENGINE_TIMEOUT_SECS, v)
        }
        Some(h) => Docker::connect_with_http(h, ENGINE_TIMEOUT_SECS, v),
    }
    .map_err(failed)
}

/// Makes (or reuses) a `multi-node` session's overlay: its id.
///
/// Errors: [`ManagerError::ClusterNetworkFailed`] with the engine's message (`This node is
/// not a swarm manager…` when the engine is no Swarm manager).
pub async fn create_overlay(spec: &OverlaySpec, name: &str) -> Result<String, ManagerError> {
    let docker = engine(spec)?;
    let failed = |e: bollard::errors::Error| {
        ManagerError::ClusterNetworkFailed(format!("overlay network `{name}`: {e}"))
    };
    // Idempotent, as upstream's plugin: a network of that name already there is the one.
    if let Ok(n) = docker
        .inspect_network::<String>(name, None)
        .await
        .map(|n| n.id)
    {
        return Ok(n.unwrap_or_default());
    }
    let mut options: HashMap<String, String> = HashMap::new();
    if let Some(mtu) = spec.mtu {
        options.insert("com.docker.network.driver.mtu".into(), mtu.to_string());
    }
    let created = docker
        .create_network(CreateNetworkOptions {
            name: name.to_owned(),
            check_duplicate: true,
            driver: "overlay".to_owned(),
            attachable: true,
            options,
            labels: HashMap::from([(CLUSTER_NETWORK_LABEL.to_owned(), "1".to_owned())]),
            ..Default::default()
        })
        .await;
    match created {
        Ok(r) => Ok(r.id),
        // Made by another replica meanwhile (409): that one is the session's.
        Err(
            e @ bollard::errors::Error::DockerResponseServerError {
                status_code: 409, ..
            },
        ) => docker
            .inspect_network::<String>(name, None)
            .await
            .map(|n| n.id.unwrap_or_default())
            .map_err(|_| failed(e)),
        Err(e) => Err(failed(e)),
    }
}

/// Removes a `multi-node` session's overlay; one already gone is no error. Only a network
/// with the cluster label is removed.
///
/// Errors: [`ManagerError::ClusterNetworkFailed`] with the engine's message.
pub async fn remove_overlay(spec: &OverlaySpec, name: &str) -> Result<(), ManagerError> {
    let docker = engine(spec)?;
    let failed = |e: bollard::errors::Error| {
        ManagerError::ClusterNetworkFailed(format!("overlay network `{name}`: {e}"))
    };
    let labels = match docker.inspect_network::<String>(name, None).await {
        Ok(n) => n.labels.unwrap_or_default(),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => return Ok(()),
        Err(e) => return Err(failed(e)),
    };
    if labels.get(CLUSTER_NETWORK_LABEL).map(String::as_str) != Some("1") {
        return Err(ManagerError::ClusterNetworkFailed(format!(
            "network `{name}` is not a cluster network (no {CLUSTER_NETWORK_LABEL} label): left alone"
        )));
    }
    match docker.remove_network(name).await {
        Ok(()) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        Err(e) => Err(failed(e)),
    }
}

/// `create_local_network(name)` on `agent_id`.
///
/// Errors: [`ManagerError::ClusterNetworkFailed`] with the agent's answer.
pub async fn create_local(
    pool: &actix::Addr<AgentPool>,
    metrics: &ManagerMetrics,
    agent_id: &str,
    name: &str,
    timeout: Duration,
) -> Result<(), ManagerError> {
    let args = NetworkArgs {
        network_name: name.to_owned(),
    };
    call_method::<CreateLocalNetwork>(pool, metrics, agent_id, &args, timeout)
        .await
        .map_err(|e| {
            ManagerError::ClusterNetworkFailed(format!(
                "create_local_network `{name}` on agent `{agent_id}`: {e}"
            ))
        })
}

/// `destroy_local_network(name)` on `agent_id` (one already gone is no error there).
///
/// Errors: [`ManagerError::ClusterNetworkFailed`] with the agent's answer.
pub async fn destroy_local(
    pool: &actix::Addr<AgentPool>,
    metrics: &ManagerMetrics,
    agent_id: &str,
    name: &str,
    timeout: Duration,
) -> Result<(), ManagerError> {
    let args = NetworkArgs {
        network_name: name.to_owned(),
    };
    call_method::<DestroyLocalNetwork>(pool, metrics, agent_id, &args, timeout)
        .await
        .map_err(|e| {
            ManagerError::ClusterNetworkFailed(format!(
                "destroy_local_network `{name}` on agent `{agent_id}`: {e}"
            ))
        })
}

/// `ClusterInfo.network_config` for a session's network: `{"mode": "bridge",
/// "network_name"}` or `{"mode": "overlay", "network_name", "network_id"}`; empty without one.
pub fn network_config(mode: ClusterMode, network: Option<(&str, &str)>) -> BTreeMap<String, Value> {
    let Some((name, id)) = network else {
        return BTreeMap::new();
    };
    let mut c = BTreeMap::from([("network_name".to_owned(), Value::from(name))]);
    match mode {
        ClusterMode::SingleNode => {
            c.insert("mode".into(), "bridge".into());
        }
        ClusterMode::MultiNode => {
            c.insert("mode".into(), "overlay".into());
            c.insert("network_id".into(), id.into());
        }
    }
    c
}

//! The manager actor host. Now: the agent pool (seed 000); the store, event intake, agent
//! registry, scheduler and HTTP API arrive with the manager issue.

pub mod pool;

use std::time::Duration;

use actix::Actor;

use crate::config::ManagerConfig;
use crate::rpc::curve::{load_certificate, load_keypair};
use pool::{AgentCall, AgentEndpoint, AgentPool, ClosePool, RegisterAgent};

/// Runs the manager until SIGINT or SIGTERM: starts the agent pool, registers the agents of
/// `[[agents]]`, and asks each for `gather_hwinfo` once (the pool's health check then pings
/// them every `health-check-interval`).
pub async fn run(config: ManagerConfig) -> anyhow::Result<()> {
    let keypair = config.manager.rpc_keypair.as_deref().map(load_keypair).transpose()?;
    let pool = AgentPool::new(config.agent_pool.spec(), keypair).start();
    for agent in &config.agents {
        let public_key = agent.public_key.as_deref().map(load_certificate).transpose()?.map(|c| c.public);
        let endpoint = AgentEndpoint { addr: agent.addr.zmq_endpoint(), public_key };
        pool.send(RegisterAgent { agent_id: agent.id.clone(), endpoint }).await?;
        let call = AgentCall::new(&agent.id, "gather_hwinfo", vec![], Duration::from_secs(10));
        match pool.send(call).await? {
            Ok(info) => tracing::info!(agent_id = %agent.id, hwinfo = %info, "agent reachable"),
            Err(e) => tracing::warn!(agent_id = %agent.id, error = %e, "agent not reachable yet"),
        }
    }
    tracing::info!(agents = config.agents.len(), "manager started");
    crate::signals::wait_for_shutdown().await;
    tracing::info!("manager shutting down");
    let _ = pool.send(ClosePool).await;
    Ok(())
}

//! The agent daemon. Now: the RPC server with the foundation's methods; the kernel lifecycle,
//! heartbeats, events and stats arrive with their issues under the agent supervisor.

pub mod hwinfo;
pub mod methods;

use actix::Actor;

use crate::config::AgentConfig;
use crate::rpc::curve::{load_certificate, load_keypair};
use crate::rpc::{Dispatcher, RpcServer, ServerCurve};

/// Builds the agent's RPC server from its config (bound, not yet started).
///
/// Errors: unreadable key files, or the RPC address cannot be bound.
pub fn rpc_server(config: &AgentConfig) -> anyhow::Result<RpcServer> {
    let a = &config.agent;
    let curve = match (&a.rpc_auth_manager_public_key, &a.rpc_auth_agent_keypair) {
        (Some(manager_key), Some(keypair)) => Some(ServerCurve {
            keypair: load_keypair(keypair)?,
            allowed_clients: vec![(load_certificate(manager_key)?.public, "manager".to_owned())],
        }),
        _ => None,
    };
    let mut dispatcher = Dispatcher::new(Some(a.id.clone()));
    methods::register(&mut dispatcher, &a.id);
    Ok(RpcServer::bind(&a.rpc_listen_addr.zmq_endpoint(), curve, dispatcher)?)
}

/// Runs the agent until SIGINT or SIGTERM.
pub async fn run(config: AgentConfig) -> anyhow::Result<()> {
    let server = rpc_server(&config)?;
    tracing::info!(agent_id = %config.agent.id, endpoint = server.endpoint(), "agent started");
    let addr = server.start();
    crate::signals::wait_for_shutdown().await;
    tracing::info!(agent_id = %config.agent.id, "agent shutting down");
    let _ = addr.send(crate::rpc::server::Shutdown).await;
    Ok(())
}

//! The manager tree's `pool` child: one connection per agent (`[agent-pool]`, `[[agents]]`).

use actix::{Actor, Addr};
use actors::ChildSpec;
use anyhow::Context as _;

use crate::config::ManagerConfig;
use crate::manager::pool::{AgentEndpoint, AgentPool, ClosePool, PoolSpec, RegisterAgent};
use crate::rpc::curve::load_certificate;
use crate::rpc::KeyPair;

/// The started pool and the bound of the registry's heartbeat inbox.
pub(in crate::manager) struct Started {
    /// The pool, every `[[agents]]` entry registered.
    pub pool: Addr<AgentPool>,
    /// The configured fleet (`[agent-pool] max-agents`'s default or value), before the
    /// descriptor limit lowers it: agents sharing connections need fewer.
    pub inbox_capacity: usize,
}

/// Starts the pool from `[agent-pool]` with CURVE `keypair` and registers `[[agents]]`.
/// `[agent-pool] max-agents` set: the descriptor limit must serve it; unset: the limit is
/// raised, and the fleet lowered to what it serves (with a warning).
///
/// Errors: the descriptor limit is too low for `max-agents`; the pool cannot start; an agent's
/// public key file is unreadable.
pub(in crate::manager) async fn start(
    config: &ManagerConfig,
    keypair: Option<KeyPair>,
) -> anyhow::Result<Started> {
    let mut pool_spec = config.agent_pool.spec();
    let inbox_capacity = pool_spec.max_agents as usize;
    match config.agent_pool.max_agents {
        Some(n) => {
            crate::limits::ensure_open_files(PoolSpec::fds_needed(n), "[agent-pool] max-agents")?;
        }
        None => {
            let (soft, hard) = crate::limits::raise_open_files()?;
            let fits = PoolSpec::agents_for_fds(soft);
            if fits < pool_spec.max_agents {
                tracing::warn!(soft, hard, agents = fits, "RLIMIT_NOFILE serves only this many agents; raise it (LimitNOFILE) for a larger fleet, or set [agent-pool] max-agents to be refused at start instead");
                pool_spec.max_agents = fits;
            }
        }
    }
    let pool = AgentPool::new(pool_spec, keypair)
        .context("[agent-pool] max-agents / io-threads")?
        .start();
    for agent in &config.agents {
        let public_key = agent
            .public_key
            .as_deref()
            .map(load_certificate)
            .transpose()?
            .map(|c| c.public);
        pool.send(RegisterAgent {
            agent_id: agent.id.clone(),
            endpoint: AgentEndpoint {
                addr: agent.addr.zmq_endpoint(),
                public_key,
            },
        })
        .await?;
    }
    Ok(Started {
        pool,
        inbox_capacity,
    })
}

/// `pool`: the agent connections; stopped, they are closed ([`ClosePool`]).
pub(in crate::manager) fn child_spec(pool: Addr<AgentPool>) -> ChildSpec {
    super::holder("pool", pool, |pool| async move {
        let _ = pool.send(ClosePool).await;
    })
}

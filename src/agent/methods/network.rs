//! Network and host-port methods (the typed contract of [`crate::rpc::agent_api::network`]):
//! `create_local_network(network_name)`, `destroy_local_network(network_name)`,
//! `assign_port()`, `release_port(port_no)`.
//!
//! Local networks are bridge networks of the agent's engine labelled
//! `ai.backend.cluster-network=1` (upstream's label) and `ai.backend.agent-id=<agent>`; both
//! calls are idempotent. `destroy_local_network` removes only a network with this agent's label
//! (another is refused with `NetworkNotOwned`). Assigned ports come from the same pool as
//! kernels' service ports and are held until released (not across an agent restart, like
//! upstream's). FAILURE names: `NetworkNotOwned`, `ResourceExhausted`,
//! `ContainerEngineError`, `ContainerEngineUnavailable`.

use std::collections::HashMap;

use super::{Ctx, Table};
use crate::agent::backend::{labels, BackendError};
use crate::agent::context::AgentContext;
use crate::rpc::agent_api::network as api;
use crate::rpc::agent_api::node::NoArgs;
use crate::rpc::{Dispatcher, ErrorMeta, Failure};

fn engine_meta(ctx: &AgentContext, e: BackendError) -> ErrorMeta {
    if let BackendError::Unavailable(why) = &e {
        ctx.engine.mark_down(why);
    }
    let failure = if e.is_unavailable() {
        Failure::ContainerEngineUnavailable
    } else {
        Failure::ContainerEngineError
    };
    ErrorMeta::failure(failure, e.to_string())
}

/// The labels a local network of this agent carries.
pub fn network_labels(agent_id: &str) -> HashMap<String, String> {
    HashMap::from([
        (api::CLUSTER_NETWORK_LABEL.to_owned(), "1".to_owned()),
        (labels::AGENT_ID.to_owned(), agent_id.to_owned()),
    ])
}

async fn create(ctx: &AgentContext, name: &str) -> Result<(), ErrorMeta> {
    let created = ctx
        .backend
        .create_network(name, &network_labels(&ctx.agent_id))
        .await
        .map_err(|e| engine_meta(ctx, e))?;
    tracing::info!(agent_id = %ctx.agent_id, network = name, created, "create_local_network");
    Ok(())
}

async fn destroy(ctx: &AgentContext, name: &str) -> Result<(), ErrorMeta> {
    let Some(found) = ctx
        .backend
        .inspect_network(name)
        .await
        .map_err(|e| engine_meta(ctx, e))?
    else {
        return Ok(()); // Already gone.
    };
    let ours = found.get(api::CLUSTER_NETWORK_LABEL).map(String::as_str) == Some("1")
        && found.get(labels::AGENT_ID) == Some(&ctx.agent_id);
    if !ours {
        return Err(ErrorMeta::failure(
            Failure::NetworkNotOwned,
            format!(
                "network `{name}` was not made by agent `{}`'s create_local_network: left alone",
                ctx.agent_id
            ),
        ));
    }
    let removed = ctx
        .backend
        .remove_network(name)
        .await
        .map_err(|e| engine_meta(ctx, e))?;
    tracing::info!(agent_id = %ctx.agent_id, network = name, removed, "destroy_local_network");
    Ok(())
}

/// Registers the network and port methods on `dispatcher`.
pub(crate) fn register(dispatcher: &mut Dispatcher, cx: &Ctx) {
    Table::new(dispatcher, cx.clone())
        .method::<api::CreateLocalNetwork, _, _>(|cx, args| async move {
            cx.engine.check()?;
            create(&cx, &args.network_name).await
        })
        .method::<api::DestroyLocalNetwork, _, _>(|cx, args| async move {
            cx.engine.check()?;
            destroy(&cx, &args.network_name).await
        })
        .method::<api::AssignPort, _, _>(assign_port)
        .method::<api::ReleasePort, _, _>(release_port);
}

/// `assign_port()` → a host port of the pool, held until `release_port`. Errors:
/// `ResourceExhausted`.
async fn assign_port(cx: Ctx, _: NoArgs) -> Result<u16, ErrorMeta> {
    let port = cx
        .ports
        .lock()
        .expect("port pool lock")
        .allocate(1)
        .map(|p| p[0]);
    if let Ok(p) = port {
        cx.node.port_assigned(p);
    }
    port.map_err(|e| ErrorMeta::failure(Failure::ResourceExhausted, e.to_string()))
}

/// `release_port(port_no)`: only a port `assign_port` handed out goes back to the pool.
async fn release_port(cx: Ctx, args: api::ReleasePortArgs) -> Result<(), ErrorMeta> {
    let port = args.port_no;
    if cx.node.port_unassigned(port) {
        cx.ports.lock().expect("port pool lock").release(&[port]);
    } else {
        tracing::warn!(agent_id = %cx.agent_id, port, "release_port: not a port assign_port handed out; left alone");
    }
    Ok(())
}

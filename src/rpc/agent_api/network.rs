//! Network and host-port methods: `create_local_network`, `destroy_local_network`,
//! `assign_port`, `release_port` (`ai.backend.agent.server.AgentRPCServer`).

use serde::{Deserialize, Serialize};

use super::node::NoArgs;
use super::Method;

/// The label upstream puts on a local network (`ai.backend.cluster-network=1`); kernelvisor
/// adds `ai.backend.agent-id=<agent>` and removes only networks labelled so.
pub const CLUSTER_NETWORK_LABEL: &str = "ai.backend.cluster-network";

/// `create_local_network(network_name)` → nil: a Docker bridge network of that name for a
/// single-node multi-container session, unless one exists (idempotent).
pub struct CreateLocalNetwork;

/// Arguments of [`CreateLocalNetwork`] and [`DestroyLocalNetwork`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetworkArgs {
    /// The network's name (the manager's client calls it `network_ref_name` when destroying).
    #[serde(alias = "network_ref_name")]
    pub network_name: String,
}

impl Method for CreateLocalNetwork {
    const NAME: &'static str = "create_local_network";
    const PARAMS: &'static [&'static str] = &["network_name"];
    type Args = NetworkArgs;
    type Reply = ();
}

/// `destroy_local_network(network_name)` → nil: removes the network `create_local_network`
/// made; one already gone is not an error. A network of that name without the agent's labels
/// is refused (`NetworkNotOwned`).
pub struct DestroyLocalNetwork;

impl Method for DestroyLocalNetwork {
    const NAME: &'static str = "destroy_local_network";
    const PARAMS: &'static [&'static str] = &["network_name"];
    type Args = NetworkArgs;
    type Reply = ();
}

/// `assign_port()` → int: a host port of `[container] port-range`, held until `release_port`
/// (FAILURE `ResourceExhausted` when none is free).
pub struct AssignPort;

impl Method for AssignPort {
    const NAME: &'static str = "assign_port";
    const PARAMS: &'static [&'static str] = &[];
    type Args = NoArgs;
    type Reply = u16;
}

/// `release_port(port_no)` → nil: gives back a port `assign_port` handed out (after the pool's
/// reuse cooldown it is free again). Any other port is left alone (logged), as it may be a
/// kernel's.
pub struct ReleasePort;

/// Arguments of [`ReleasePort`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleasePortArgs {
    /// The port.
    pub port_no: u16,
}

impl Method for ReleasePort {
    const NAME: &'static str = "release_port";
    const PARAMS: &'static [&'static str] = &["port_no"];
    type Args = ReleasePortArgs;
    type Reply = ();
}

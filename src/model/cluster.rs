//! Cluster sessions: a session of N kernels (`main1`, `sub1` … `sub{N-1}`) placed as one gang,
//! on one agent (`single-node`) or spread over agents (`multi-node`), as Backend.AI 26.x's
//! manager makes them (`src/ai/backend/manager/sokovan/scheduler/launcher/launcher.py`,
//! `PlacementPlan.from_items`; `ai.backend.common.types.ClusterMode`, `ClusterInfo`).
//!
//! The agent wire and the API share [`ClusterMode`]; the API shows a session's kernels as
//! [`SessionKernel`]s.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The largest `cluster_size` a session may ask for.
pub const MAX_CLUSTER_SIZE: u32 = 64;

/// The main kernel's role (`cluster_role`); Backend.AI's `DEFAULT_ROLE`.
pub const MAIN_ROLE: &str = "main";

/// Every other kernel's role.
pub const SUB_ROLE: &str = "sub";

/// `ai.backend.common.types.ClusterMode`: where a cluster session's kernels go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterMode {
    /// Every kernel of the session on one agent, on a bridge network of their own
    /// (`single-node`).
    #[default]
    SingleNode,
    /// One placement per kernel, over any agents, on a Docker Swarm overlay network
    /// (`multi-node`).
    MultiNode,
}

impl ClusterMode {
    /// The wire's and the store's name: `single-node`, `multi-node`.
    pub fn as_str(self) -> &'static str {
        match self {
            ClusterMode::SingleNode => "single-node",
            ClusterMode::MultiNode => "multi-node",
        }
    }

    /// The mode of a name; `None` for a name that is neither.
    pub fn parse(name: &str) -> Option<ClusterMode> {
        [ClusterMode::SingleNode, ClusterMode::MultiNode]
            .into_iter()
            .find(|m| m.as_str() == name)
    }
}

/// `kernelvisor ctl session create --cluster-mode`.
impl clap::ValueEnum for ClusterMode {
    fn value_variants<'a>() -> &'a [Self] {
        &[ClusterMode::SingleNode, ClusterMode::MultiNode]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        let help = match self {
            ClusterMode::SingleNode => "Every kernel on one agent (its slots times the size)",
            ClusterMode::MultiNode => "A placement per kernel, over the fleet's agents",
        };
        Some(clap::builder::PossibleValue::new(self.as_str()).help(help))
    }
}

/// How a `multi-node` cluster session's kernels are spread over the agents (`[scheduler]
/// cluster-placement`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClusterPlacement {
    /// Each kernel on the least loaded agent after placing it (as a session of one kernel):
    /// a gang spreads over the fleet.
    #[default]
    Spread,
    /// Each kernel on the most loaded agent that fits it (Kubernetes' `MostAllocated`): a
    /// gang fills few agents, leaving whole agents free for the next large one.
    Pack,
}

/// One kernel's place in its cluster: role, index within the role and host name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterSlot {
    /// `main` or `sub`.
    pub role: &'static str,
    /// 1-based within the role.
    pub idx: u32,
    /// `<role><idx>`: `main1`, `sub1`, …; the kernel's host name and network alias.
    pub hostname: String,
    /// 0-based over the whole session (Backend.AI's `local_rank`): `main1` is 0.
    pub local_rank: u32,
}

impl ClusterSlot {
    /// `main1`: a session's main kernel (a session of one kernel has only it).
    pub fn main() -> ClusterSlot {
        ClusterSlot {
            role: MAIN_ROLE,
            idx: 1,
            hostname: "main1".to_owned(),
            local_rank: 0,
        }
    }
}

/// The kernels of a session of `size`: `main1`, then `sub1` … `sub{size-1}` (Backend.AI's
/// `KernelEnqueueingConfig` order; `sub` kernels count from 1).
pub fn cluster_slots(size: u32) -> Vec<ClusterSlot> {
    (0..size.max(1))
        .map(|rank| {
            let (role, idx) = match rank {
                0 => (MAIN_ROLE, 1),
                n => (SUB_ROLE, n),
            };
            ClusterSlot {
                role,
                idx,
                hostname: format!("{role}{idx}"),
                local_rank: rank,
            }
        })
        .collect()
}

/// `BACKENDAI_CLUSTER_REPLICAS`: `main:1` or `main:1,sub:3`.
pub fn replicas_env(size: u32) -> String {
    match size.max(1) {
        1 => "main:1".to_owned(),
        n => format!("main:1,sub:{}", n - 1),
    }
}

/// `BACKENDAI_CLUSTER_HOSTS`: `main1,sub1,sub2`.
pub fn hosts_env(size: u32) -> String {
    cluster_slots(size)
        .into_iter()
        .map(|s| s.hostname)
        .collect::<Vec<_>>()
        .join(",")
}

/// A session's kernel, as `GET /v1/sessions/{id}` lists it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct SessionKernel {
    /// Kernel UUID.
    #[schema(required = true)]
    pub kernel_id: String,
    /// `main` or `sub`.
    #[schema(required = true)]
    pub cluster_role: String,
    /// 1-based within its role.
    #[schema(required = true)]
    pub cluster_idx: i64,
    /// `main1`, `sub1`, …: its host name, and its alias on the session's network.
    #[schema(required = true)]
    pub cluster_hostname: String,
    /// The agent it is placed on (empty while the session waits in the queue).
    #[schema(required = true)]
    pub agent_id: String,
    /// Its own status (`KernelStatus`'s name).
    #[schema(required = true)]
    pub status: String,
    /// Why it ended, once it has.
    #[schema(required = true)]
    pub status_reason: Option<String>,
    /// Its exit code, when it ended by itself.
    #[schema(required = true)]
    pub exit_code: Option<i64>,
    /// Service names it publishes: the main kernel's are the session's; a sub kernel
    /// publishes none (Backend.AI's agent exposes service ports on the main kernel only).
    #[schema(required = true)]
    pub service_ports: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_environment_follow_backend_ai() {
        let s = cluster_slots(3);
        let names: Vec<&str> = s.iter().map(|s| s.hostname.as_str()).collect();
        assert_eq!(names, ["main1", "sub1", "sub2"]);
        assert_eq!((s[0].role, s[0].idx, s[0].local_rank), ("main", 1, 0));
        assert_eq!((s[2].role, s[2].idx, s[2].local_rank), ("sub", 2, 2));
        assert_eq!(cluster_slots(0).len(), 1);
        assert_eq!(replicas_env(1), "main:1");
        assert_eq!(replicas_env(4), "main:1,sub:3");
        assert_eq!(hosts_env(3), "main1,sub1,sub2");
        for m in [ClusterMode::SingleNode, ClusterMode::MultiNode] {
            assert_eq!(ClusterMode::parse(m.as_str()), Some(m));
            assert_eq!(
                serde_json::to_value(m).unwrap(),
                serde_json::Value::from(m.as_str())
            );
        }
        assert_eq!(ClusterMode::parse("multi"), None);
    }
}

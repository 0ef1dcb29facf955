//! Node methods: `ping`, `health` / `health_v2`, `gather_hwinfo` / `gather_hwinfo_v2`,
//! `get_local_config`, `shutdown_agent` (`ai.backend.agent.server.AgentRPCServer`, the v3
//! domains `ai.backend.agent.rpc.health` / `.hwinfo`, and the reply models of
//! `ai.backend.common.dto.internal.health` / `ai.backend.common.dto.agent.response`).
//!
//! The `*_v2` methods use upstream's v3 envelope: no positional arguments, the keyword `req`
//! (the request model as a map; both are empty models) and `agent_id`.

use std::collections::BTreeMap;

use rmpv::Value;
use serde::{Deserialize, Serialize};

use super::Method;

/// Arguments of a method that takes none (besides `agent_id`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoArgs {}

/// The v3 envelope's arguments: `req`, the request model (required, as upstream's
/// `_parse_request_body` requires it).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct V3Args<R> {
    /// The request model.
    pub req: R,
}

/// `ping(msg)` → `msg`.
pub struct Ping;

/// Arguments of [`Ping`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PingArgs {
    /// Echoed back.
    pub msg: Value,
}

impl Method for Ping {
    const NAME: &'static str = "ping";
    const PARAMS: &'static [&'static str] = &["msg"];
    type Args = PingArgs;
    type Reply = Value;
}

/// `HealthStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// Every connectivity check passed.
    Ok,
    /// Some check failed.
    Degraded,
    /// The component itself is failing.
    Error,
}

/// `ComponentConnectivityStatus`: one dependency's check.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ComponentConnectivityStatus {
    /// `container`, `etcd`, `redis`, `manager`, ….
    pub service_group: String,
    /// `docker`, `etcd`, `live`, ….
    pub component_id: String,
    /// Whether it answered.
    pub is_healthy: bool,
    /// RFC 3339 UTC time of the check (`2026-01-02T03:04:05.678901Z`).
    pub last_checked_at: String,
    /// Why it failed.
    #[serde(default)]
    pub error_message: Option<String>,
}

/// `ConnectivityCheckResponse`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConnectivityCheckResponse {
    /// Every check passed (true with no checks).
    pub overall_healthy: bool,
    /// One entry per component checked.
    pub connectivity_checks: Vec<ComponentConnectivityStatus>,
    /// RFC 3339 UTC time of this answer.
    pub timestamp: String,
}

/// `HealthResponse` (and `HealthResp`, the v3 reply, which has the same fields).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HealthResponse {
    /// `ok` when every check passed, else `degraded`.
    pub status: HealthStatus,
    /// The agent's version.
    pub version: String,
    /// Always `agent`.
    pub component: String,
    /// The checks.
    pub connectivity: ConnectivityCheckResponse,
}

/// `health()` → upstream's `HealthResponse` plus kernelvisor's own fields (read by its tests
/// and operators): `agent_id`, `uptime_seconds`, and the engine outage's `engine_error` and
/// `engine_down_seconds` (nil while the engine is up).
pub struct Health;

/// The reply of [`Health`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HealthReply {
    /// Upstream's fields.
    #[serde(flatten)]
    pub health: HealthResponse,
    /// `[agent] id`.
    pub agent_id: String,
    /// Seconds since the RPC methods were registered.
    pub uptime_seconds: f64,
    /// The engine's error while it is down.
    #[serde(default)]
    pub engine_error: Option<String>,
    /// How long it has been down.
    #[serde(default)]
    pub engine_down_seconds: Option<f64>,
}

impl Method for Health {
    const NAME: &'static str = "health";
    const PARAMS: &'static [&'static str] = &[];
    type Args = NoArgs;
    type Reply = HealthReply;
}

/// `health_v2(req=HealthReq)` → `HealthResp` (the manager's `AgentClient.health`).
pub struct HealthV2;

impl Method for HealthV2 {
    const NAME: &'static str = "health_v2";
    const PARAMS: &'static [&'static str] = &[];
    type Args = V3Args<NoArgs>;
    type Reply = HealthResponse;
}

/// `HardwareMetadata`: one device kind's facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HardwareMetadata {
    /// `healthy`, `degraded`, `offline` or `unavailable` (`DeviceHwStatus`).
    pub status: String,
    /// Why it is not healthy.
    #[serde(default)]
    pub status_info: Option<String>,
    /// Free-form facts, strings only.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// `gather_hwinfo()` → `{device_name: HardwareMetadata}`: `cpu`, `mem`, `os`, `cuda` (NVML)
/// and one entry per other accelerator plugin (`mock`), whose metadata also carries each of
/// its slots' unit as `slot.<slot>.unit` (`count`).
pub struct GatherHwinfo;

impl Method for GatherHwinfo {
    const NAME: &'static str = "gather_hwinfo";
    const PARAMS: &'static [&'static str] = &[];
    type Args = NoArgs;
    type Reply = BTreeMap<String, HardwareMetadata>;
}

/// `DeviceHardwareInfo`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceHardwareInfo {
    /// The device kind (`cuda`, `cpu`, …).
    pub device_name: String,
    /// As [`HardwareMetadata::status`].
    pub status: String,
    /// As [`HardwareMetadata::status_info`].
    #[serde(default)]
    pub status_info: Option<String>,
    /// As [`HardwareMetadata::metadata`].
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
}

/// `GatherHwinfoResp`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatherHwinfoResp {
    /// One entry per device kind of [`GatherHwinfo`]'s reply, by name.
    pub devices: Vec<DeviceHardwareInfo>,
}

impl GatherHwinfoResp {
    /// The v3 list of a v1 map (upstream's `HwinfoRPCHandler` adapter).
    pub fn from_map(map: BTreeMap<String, HardwareMetadata>) -> GatherHwinfoResp {
        GatherHwinfoResp {
            devices: map
                .into_iter()
                .map(|(device_name, m)| DeviceHardwareInfo {
                    device_name,
                    status: m.status,
                    status_info: m.status_info,
                    metadata: m.metadata,
                })
                .collect(),
        }
    }
}

/// `gather_hwinfo_v2(req=GatherHwinfoReq)` → `GatherHwinfoResp`.
pub struct GatherHwinfoV2;

impl Method for GatherHwinfoV2 {
    const NAME: &'static str = "gather_hwinfo_v2";
    const PARAMS: &'static [&'static str] = &[];
    type Args = V3Args<NoArgs>;
    type Reply = GatherHwinfoResp;
}

/// `get_local_config(agent_id=None)` → the agent's config as the manager may see it, no key
/// material: upstream's `{"agent": {"abuse-report-path": str}, "watcher": {}}` with
/// kernelvisor's equivalents added under `agent`, `container` and `resource` (see
/// [`LocalConfig`]). Upstream's manager passes the agent id positionally.
pub struct GetLocalConfig;

/// Arguments of [`GetLocalConfig`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetLocalConfigArgs {
    /// The agent addressed (nil: this one).
    #[serde(default)]
    pub agent_id: Option<String>,
}

/// The reply of [`GetLocalConfig`] (keys as in the config file, kebab-case).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LocalConfig {
    /// `[agent]`.
    pub agent: LocalAgentConfig,
    /// `[container]`.
    pub container: LocalContainerConfig,
    /// `[resource]` and the slots it yields.
    pub resource: LocalResourceConfig,
    /// Upstream's watcher config; kernelvisor runs no watcher: empty.
    pub watcher: BTreeMap<String, Value>,
}

/// `[agent]` of [`LocalConfig`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LocalAgentConfig {
    /// Upstream's; kernelvisor writes no abuse reports: `""`.
    pub abuse_report_path: String,
    /// `[agent] id`.
    pub id: String,
    /// `[agent] region`.
    pub region: String,
    /// Upstream's scaling group; kernelvisor has one: `default`.
    pub scaling_group: String,
    /// `docker` or `dummy`.
    pub backend: String,
    /// The agent's version.
    pub version: String,
    /// Where the RPC endpoint binds (`host:port`).
    pub rpc_listen_addr: String,
    /// The address heartbeats advertise (nil: the bound one).
    pub advertised_rpc_addr: Option<String>,
    /// Where `/metrics` is served.
    pub service_addr: String,
    /// `preserve` or `terminate`.
    pub on_shutdown: String,
    /// Kernels set up at once.
    pub kernel_creation_concurrency: u64,
    /// Whether RPC calls must come over CURVE.
    pub rpc_auth: bool,
    /// Whether events and heartbeats go to a manager.
    pub manager: bool,
}

/// `[container]` of [`LocalConfig`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LocalContainerConfig {
    /// Host ports for service ports, inclusive.
    pub port_range: [u16; 2],
    /// Host address service ports bind.
    pub bind_host: String,
    /// The host users reach service ports at.
    pub advertised_host: Option<String>,
    /// Kernels' scratch directories.
    pub scratch_root: String,
    /// vfolders' root.
    pub vfolder_root: Option<String>,
    /// The uid kernels run as.
    pub kernel_uid: u32,
    /// The gid kernels run as.
    pub kernel_gid: u32,
    /// Processes per kernel.
    pub pids_limit: i64,
}

/// `[resource]` of [`LocalConfig`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct LocalResourceConfig {
    /// Cores held back from kernels.
    pub reserved_cpu: f64,
    /// Bytes held back from kernels.
    pub reserved_mem: u64,
    /// The slot capacity kernels share (`{slot: decimal string}`).
    pub slots: BTreeMap<String, String>,
    /// Each slot's unit (`count`, `bytes`, `unique`).
    pub slot_key_and_units: BTreeMap<String, String>,
}

impl Method for GetLocalConfig {
    const NAME: &'static str = "get_local_config";
    const PARAMS: &'static [&'static str] = &["agent_id"];
    type Args = GetLocalConfigArgs;
    type Reply = LocalConfig;
}

/// `shutdown_agent(terminate_kernels)` → nil: the agent stops as on SIGTERM (after answering),
/// destroying every kernel first when `terminate_kernels`, keeping them (re-attached at the
/// next start) otherwise. Upstream's is a no-op.
pub struct ShutdownAgent;

/// Arguments of [`ShutdownAgent`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShutdownAgentArgs {
    /// Destroy the kernels.
    #[serde(default)]
    pub terminate_kernels: bool,
}

impl Method for ShutdownAgent {
    const NAME: &'static str = "shutdown_agent";
    const PARAMS: &'static [&'static str] = &["terminate_kernels"];
    type Args = ShutdownAgentArgs;
    type Reply = ();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::agent_api::{decode_args, decode_reply, to_value};
    use crate::rpc::Call;

    #[test]
    fn the_v3_envelope_needs_req() {
        let call = Call {
            kwargs: vec![
                ("req".into(), Value::Map(vec![])),
                ("agent_id".into(), "a".into()),
            ],
            ..Call::default()
        };
        assert!(decode_args::<HealthV2>(&call).is_ok());
        let e = decode_args::<HealthV2>(&Call::default()).unwrap_err();
        assert!(e.0.contains("req"), "{e}");
    }

    #[test]
    fn health_v1_is_upstream_s_shape_plus_ours() {
        let reply = HealthReply {
            health: HealthResponse {
                status: HealthStatus::Degraded,
                version: "0.1.0".into(),
                component: "agent".into(),
                connectivity: ConnectivityCheckResponse {
                    overall_healthy: false,
                    connectivity_checks: vec![ComponentConnectivityStatus {
                        service_group: "container".into(),
                        component_id: "docker".into(),
                        is_healthy: false,
                        last_checked_at: "2026-01-02T03:04:05Z".into(),
                        error_message: Some("refused".into()),
                    }],
                    timestamp: "2026-01-02T03:04:05Z".into(),
                },
            },
            agent_id: "a".into(),
            uptime_seconds: 1.5,
            engine_error: Some("refused".into()),
            engine_down_seconds: Some(2.0),
        };
        let v = to_value(&reply);
        let keys: Vec<&str> = v
            .as_map()
            .unwrap()
            .iter()
            .filter_map(|(k, _)| k.as_str())
            .collect();
        for k in ["status", "version", "component", "connectivity", "agent_id"] {
            assert!(keys.contains(&k), "{k} in {keys:?}");
        }
        assert_eq!(decode_reply::<Health>(v.clone()).unwrap(), reply);
        // Upstream's model reads the same value.
        let upstream: HealthResponse = crate::rpc::agent_api::from_value(v).unwrap();
        assert_eq!(upstream, reply.health);
    }
}

//! Node methods (the typed contract of [`crate::rpc::agent_api::node`]): `ping`, `health` /
//! `health_v2`, `gather_hwinfo` / `gather_hwinfo_v2`, `get_local_config`, `shutdown_agent`.
//!
//! Health reports one connectivity check, the container engine (`service_group`
//! `container`, `component_id` the backend's kind, `docker` or `dummy`), as the agent's
//! engine-health probe last saw it: it never touches the engine itself, so it answers at once
//! during an outage. The agent has no etcd or Redis to check (its manager link is its own
//! ZeroMQ channel, reported by the manager's registry instead).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rmpv::Value;

use super::table::Table;
use super::Ctx;
use crate::agent::context::AgentContext;
use crate::agent::engine::EngineHealth;
use crate::config::OnShutdown;
use crate::rpc::agent_api::node as api;
use crate::rpc::agent_api::{from_value, Method};
use crate::rpc::{Dispatcher, ErrorMeta, Failure};

/// Seconds between answering `shutdown_agent` and starting the shutdown (the answer leaves
/// first).
const SHUTDOWN_DELAY: Duration = Duration::from_millis(200);

/// `t` in RFC 3339, UTC, with microseconds (`2026-01-02T03:04:05.678901Z`), as pydantic reads
/// a `datetime`.
pub fn rfc3339(t: SystemTime) -> String {
    let since = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        since.subsec_micros()
    )
}

/// What `health` reports from.
#[derive(Clone)]
struct HealthSource {
    agent_id: String,
    started: Instant,
    /// The engine's health and the backend's kind; `None` for a node-only dispatcher.
    engine: Option<(Arc<EngineHealth>, &'static str)>,
}

impl HealthSource {
    fn reply(&self) -> api::HealthReply {
        let now = rfc3339(SystemTime::now());
        let down = self.engine.as_ref().and_then(|(e, _)| e.down());
        let checks: Vec<api::ComponentConnectivityStatus> = self
            .engine
            .iter()
            .map(|(_, kind)| api::ComponentConnectivityStatus {
                service_group: "container".into(),
                component_id: (*kind).into(),
                is_healthy: down.is_none(),
                last_checked_at: now.clone(),
                error_message: down.as_ref().map(|(e, _)| e.clone()),
            })
            .collect();
        let healthy = checks.iter().all(|c| c.is_healthy);
        api::HealthReply {
            health: api::HealthResponse {
                status: if healthy {
                    api::HealthStatus::Ok
                } else {
                    api::HealthStatus::Degraded
                },
                version: env!("CARGO_PKG_VERSION").into(),
                component: "agent".into(),
                connectivity: api::ConnectivityCheckResponse {
                    overall_healthy: healthy,
                    connectivity_checks: checks,
                    timestamp: now,
                },
            },
            agent_id: self.agent_id.clone(),
            uptime_seconds: self.started.elapsed().as_secs_f64(),
            engine_error: down.as_ref().map(|(e, _)| e.clone()),
            engine_down_seconds: down.as_ref().map(|(_, d)| d.as_secs_f64()),
        }
    }
}

fn register_health(dispatcher: &mut Dispatcher, source: HealthSource) {
    Table::new(dispatcher, source)
        .method::<api::Health, _, _>(|s, _| async move { Ok(s.reply()) })
        .method::<api::HealthV2, _, _>(|s, _| async move { Ok(s.reply().health) });
}

fn hwinfo_map(v: Value) -> Result<BTreeMap<String, api::HardwareMetadata>, ErrorMeta> {
    from_value(v).map_err(|e| ErrorMeta::failure(Failure::HardwareProbeFailed, e.0))
}

fn register_hwinfo<F>(dispatcher: &mut Dispatcher, gather: F)
where
    F: Fn() -> Value + Clone + Send + Sync + 'static,
{
    let run = move || {
        let gather = gather.clone();
        async move {
            let v = tokio::task::spawn_blocking(gather)
                .await
                .map_err(|e| ErrorMeta::failure(Failure::HardwareProbeFailed, e.to_string()))?;
            hwinfo_map(v)
        }
    };
    let r = run.clone();
    dispatcher.register_method::<api::GatherHwinfo, _, _>(move |_, _| r());
    dispatcher.register_method::<api::GatherHwinfoV2, _, _>(move |_, _| {
        let r = run();
        async move { Ok(api::GatherHwinfoResp::from_map(r.await?)) }
    });
}

/// Registers `ping`, `health`, `health_v2` (no engine: always `ok`, no checks),
/// `gather_hwinfo` and `gather_hwinfo_v2` (the host's facts, no accelerators).
pub fn register(dispatcher: &mut Dispatcher, agent_id: &str) {
    dispatcher.register_method::<api::Ping, _, _>(|args, _| async move { Ok(args.msg) });
    register_health(
        dispatcher,
        HealthSource {
            agent_id: agent_id.to_owned(),
            started: Instant::now(),
            engine: None,
        },
    );
    register_hwinfo(dispatcher, crate::agent::hwinfo::gather);
}

/// The agent's config as `get_local_config` answers it.
pub fn local_config(ctx: &AgentContext) -> api::LocalConfig {
    let (a, c, r) = (
        &ctx.config.agent,
        &ctx.config.container,
        &ctx.config.resource,
    );
    let (slots, units) = {
        let s = ctx.slots.lock().expect("slots lock");
        let slots = s
            .capacity()
            .iter()
            .map(|(k, v)| (k.to_owned(), v.to_string()))
            .collect();
        let units = s
            .slot_types()
            .iter()
            .map(|(k, t)| (k.clone(), t.as_str().to_owned()))
            .collect();
        (slots, units)
    };
    api::LocalConfig {
        agent: api::LocalAgentConfig {
            abuse_report_path: String::new(),
            id: a.id.clone(),
            region: a.region.clone(),
            scaling_group: "default".into(),
            backend: ctx.backend.kind().into(),
            version: env!("CARGO_PKG_VERSION").into(),
            rpc_listen_addr: a.rpc_listen_addr.to_string(),
            advertised_rpc_addr: a.advertised_rpc_addr.as_ref().map(ToString::to_string),
            service_addr: a.service_addr.to_string(),
            on_shutdown: match a.on_shutdown {
                OnShutdown::Preserve => "preserve",
                OnShutdown::Terminate => "terminate",
            }
            .into(),
            kernel_creation_concurrency: a.kernel_creation_concurrency as u64,
            rpc_auth: a.rpc_auth_manager_public_key.is_some() && a.rpc_auth_agent_keypair.is_some(),
            manager: ctx.config.manager.is_some(),
        },
        container: api::LocalContainerConfig {
            port_range: c.port_range,
            bind_host: c.bind_host.clone(),
            advertised_host: c.advertised_host.clone(),
            scratch_root: c.scratch_root.display().to_string(),
            vfolder_root: c.vfolder_root.as_ref().map(|p| p.display().to_string()),
            kernel_uid: c.kernel_uid,
            kernel_gid: c.kernel_gid,
            pids_limit: c.pids_limit,
        },
        resource: api::LocalResourceConfig {
            reserved_cpu: r.reserved_cpu,
            reserved_mem: r.reserved_mem.0,
            slots,
            slot_key_and_units: units,
        },
        watcher: BTreeMap::new(),
    }
}

/// Registers (or replaces) the node methods that need the agent's context: `health` /
/// `health_v2` with the engine's health, `gather_hwinfo` / `gather_hwinfo_v2` with the
/// accelerators, `get_local_config`, `shutdown_agent`.
pub(crate) fn register_with_context(dispatcher: &mut Dispatcher, cx: &Ctx) {
    register_health(
        dispatcher,
        HealthSource {
            agent_id: cx.agent_id.clone(),
            started: Instant::now(),
            engine: Some((cx.engine.clone(), cx.backend.kind())),
        },
    );
    let accelerators = cx.slots.lock().expect("slots lock").accelerators().clone();
    register_hwinfo(dispatcher, move || {
        crate::agent::hwinfo::gather_with(&accelerators)
    });
    Table::new(dispatcher, cx.clone())
        .method::<api::GetLocalConfig, _, _>(get_local_config)
        .method::<api::ShutdownAgent, _, _>(shutdown_agent);
}

/// `get_local_config(agent_id=None)` → [`local_config`]; FAILURE `AgentIdMismatch` when
/// `agent_id` names another agent.
async fn get_local_config(
    cx: Ctx,
    args: api::GetLocalConfigArgs,
) -> Result<api::LocalConfig, ErrorMeta> {
    if let Some(theirs) = args.agent_id.filter(|t| *t != cx.agent_id) {
        return Err(ErrorMeta::failure(
            Failure::AgentIdMismatch,
            format!(
                "{}() addressed to agent '{theirs}' reached agent '{}'",
                api::GetLocalConfig::NAME,
                cx.agent_id
            ),
        ));
    }
    Ok(local_config(&cx))
}

/// `shutdown_agent(terminate_kernels)`: answers, then stops the agent after
/// [`SHUTDOWN_DELAY`], its kernels terminated or preserved as asked.
async fn shutdown_agent(cx: Ctx, args: api::ShutdownAgentArgs) -> Result<(), ErrorMeta> {
    let mode = if args.terminate_kernels {
        OnShutdown::Terminate
    } else {
        OnShutdown::Preserve
    };
    tracing::info!(agent_id = %cx.agent_id, ?mode, "shutdown_agent: the agent stops");
    actix_rt::spawn(async move {
        tokio::time::sleep(SHUTDOWN_DELAY).await;
        cx.node.request_shutdown(mode);
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_utc() {
        let t = UNIX_EPOCH + Duration::new(1_709_210_096, 123_456_789);
        assert_eq!(rfc3339(t), "2024-02-29T12:34:56.123456Z");
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
    }
}

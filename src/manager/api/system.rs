//! Fleet routes: agents (admin), `/health` (public: liveness probes carry no token) and
//! `/metrics` (admin: the numbers describe every key's sessions).

use std::collections::HashMap;

use actix_web::{get, web, HttpResponse};

use super::auth::Caller;
use super::responses;
use super::{reply, slot_amounts, ApiState, Res};
use crate::manager::pool::GetPoolStats;
use crate::manager::registry::{AgentSnapshot, CountByStatus, GraceRemaining, ListAgents, ALIVE};
use crate::manager::store::Usage;
use crate::model::agent::{Agent, AgentList};
use crate::model::health::{Health, HealthMode, HealthStatus};

/// Every known agent: liveness, slots, kernels, scheduling (admin). `slots_total` is every slot
/// the agent has, `slots_used` the sum of the slots its live kernels hold over the same slots
/// (and any other a kernel holds), `slot_types` each slot's unit; amounts are decimal strings.
/// `schedulable`, `draining` and `drain_deadline` tell of a cordon or drain.
#[utoipa::path(
    operation_id = "list_agents",
    tag = "system",
    responses(
        (status = 200, description = "The agents", body = AgentList),
        responses::AdminOnly,
    ),
)]
#[get("/v1/agents")]
pub(super) async fn list_agents(s: web::Data<ApiState>, caller: Caller) -> Res {
    caller.require_admin()?;
    let agents = s.registry.send(ListAgents).await?;
    let usage = s.store.usage_by_agent().await?;
    let agents = agents.iter().map(|a| agent_view(a, &usage)).collect();
    reply(HttpResponse::Ok(), &AgentList { agents })
}

/// One agent as `GET /v1/agents` shows it: the registry's row and image count, with the slots
/// its live kernels hold from `usage` (the store's [`crate::manager::store::Store::usage_by_agent`]).
pub(super) fn agent_view(a: &AgentSnapshot, usage: &HashMap<String, Usage>) -> Agent {
    let r = &a.row;
    let u = usage.get(&r.id).cloned().unwrap_or_default();
    // Every slot of the total shows in `slots_used`, zero when nothing holds it.
    let zeros: crate::slots::ResourceSlots = r
        .slots_total
        .iter()
        .map(|(k, _)| (k.to_owned(), crate::slots::Amount::ZERO))
        .collect();
    let used = zeros.checked_add(&u.slots).unwrap_or(u.slots);
    Agent {
        agent_id: r.id.clone(),
        status: r.status.to_string(),
        addr: r.addr.clone(),
        region: r.region.clone(),
        version: r.version.clone(),
        slots_total: slot_amounts(&r.slots_total),
        slots_used: slot_amounts(&used),
        slot_types: r
            .slot_types
            .iter()
            .map(|(name, t)| (name.clone(), t.as_str().to_owned()))
            .collect(),
        kernels: Some(u.kernels),
        last_heartbeat: r.last_heartbeat,
        image_count: i64::try_from(a.image_count).unwrap_or(i64::MAX),
        schedulable: r.schedulable,
        draining: r.draining,
        drain_deadline: r.drain_deadline,
    }
}

/// Liveness (no token needed): whether the start-up grace is over, how many agents are alive.
#[utoipa::path(
    operation_id = "health",
    tag = "system",
    security(()),
    responses((status = 200, description = "The manager answers", body = Health)),
)]
#[get("/health")]
pub(super) async fn health(s: web::Data<ApiState>) -> Res {
    let grace = s.registry.send(GraceRemaining).await?;
    let alive = s
        .registry
        .send(CountByStatus)
        .await?
        .get(ALIVE)
        .copied()
        .unwrap_or(0);
    let health = Health {
        status: Some(HealthStatus::Ok),
        mode: Some(if grace.is_some() {
            HealthMode::Grace
        } else {
            HealthMode::Normal
        }),
        agents_alive: Some(alive as u64),
        leader: s.leader.is_leader(),
        replica: s.store.replica_id().to_owned(),
    };
    reply(HttpResponse::Ok(), &health)
}

/// The manager's Prometheus metrics (admin).
#[utoipa::path(
    operation_id = "metrics",
    tag = "system",
    responses(
        (status = 200, description = "Prometheus text format 0.0.4", body = String, content_type = "text/plain"),
        responses::AdminOnly,
    ),
)]
#[get("/metrics")]
pub(super) async fn metrics(s: web::Data<ApiState>, caller: Caller) -> Res {
    caller.require_admin()?;
    let m = &s.metrics;
    m.agents.reset();
    for status in [
        ALIVE,
        crate::manager::registry::LOST,
        crate::manager::registry::PENDING,
        crate::manager::registry::TERMINATED,
    ] {
        m.agents.with_label_values(&[status]).set(0);
    }
    for (status, n) in s.registry.send(CountByStatus).await? {
        m.agents.with_label_values(&[&status]).set(n as i64);
    }
    m.leader.set(i64::from(s.leader.is_leader()));
    let p = s.pool.send(GetPoolStats).await?;
    for (state, n) in [
        ("known", p.known),
        ("connecting", p.connecting),
        ("healthy", p.healthy),
        ("unhealthy", p.unhealthy),
    ] {
        m.pool_entries.with_label_values(&[state]).set(n as i64);
    }
    if let Some((took, n)) = p.last_sweep {
        m.pool_last_sweep.set(took.as_secs_f64());
        m.pool_last_sweep_entries.set(n as i64);
    }
    m.live_kernels.reset();
    for (status, n) in s.store.live_kernel_counts().await? {
        m.live_kernels.with_label_values(&[status.as_str()]).set(n);
    }
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(m.render()))
}

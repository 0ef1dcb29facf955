//! Cordon and drain routes (admin): `POST /v1/agents/{id}/cordon`, `…/uncordon` and `…/drain`.
//! A cordoned agent gets no new session (Backend.AI's `schedulable` flag; queued sessions wait
//! with pending reason `agents-cordoned` when only cordoned agents could take them); a drained
//! one is cordoned and its sessions end by themselves or, with a deadline, are terminated then
//! (`agent-drained`; Nomad's node drain). The store holds the flags
//! (`Store::set_agent_schedulable`, `Store::drain_agent`); this replica's registry takes them
//! at once, the others within a second; the leader enforces deadlines
//! (`crate::manager::scheduler` `drain.rs`).

use actix_web::{post, web, HttpResponse};

use super::auth::Caller;
use super::responses;
use super::system::agent_view;
use super::{reply, ApiState, Res};
use crate::manager::error::ManagerError;
use crate::manager::registry::{AgentSnapshot, FlushAgents, Scheduling, SetScheduling};
use crate::manager::scheduler::AdmitNow;
use crate::manager::store::{now, AgentRow, StoreError};
use crate::model::agent::{Agent, DrainRequest};
use crate::model::error::ErrorBody;
use crate::model::object::Object;

/// The longest drain deadline, seconds (a year): anything longer is a mistake, not a plan.
const MAX_DEADLINE: f64 = 365.0 * 24.0 * 3600.0;

/// Cordons an agent: nothing new is placed on it; its sessions keep running. Answers the agent
/// as `GET /v1/agents` shows it (`schedulable: false`). Cordoning a draining agent leaves the
/// drain as it is.
#[utoipa::path(
    operation_id = "cordon_agent",
    tag = "system",
    params(("id" = String, Path, description = "Agent id")),
    responses(
        (status = 200, description = "The agent, cordoned", body = Agent),
        (status = 404, description = "`agent-not-found`", body = ErrorBody),
        responses::AdminOnly,
    ),
)]
#[post("/v1/agents/{id}/cordon")]
pub(super) async fn cordon(s: web::Data<ApiState>, caller: Caller, id: web::Path<String>) -> Res {
    caller.require_admin()?;
    let row = on_stored_row(&s, || s.store.set_agent_schedulable(&id, false)).await?;
    let agent = answer(&s, &id, row).await?;
    tracing::info!(target: "audit", agent = %id, key = %caller.access_key, "agent cordoned");
    reply(HttpResponse::Ok(), &agent)
}

/// Uncordons an agent: sessions are placed on it again, and a drain in progress ends (its
/// deadline with it). Starts an admission round, so queued sessions that fit are placed now.
/// Answers the agent as `GET /v1/agents` shows it (`schedulable: true`, `draining: false`).
#[utoipa::path(
    operation_id = "uncordon_agent",
    tag = "system",
    params(("id" = String, Path, description = "Agent id")),
    responses(
        (status = 200, description = "The agent, schedulable again", body = Agent),
        (status = 404, description = "`agent-not-found`", body = ErrorBody),
        responses::AdminOnly,
    ),
)]
#[post("/v1/agents/{id}/uncordon")]
pub(super) async fn uncordon(s: web::Data<ApiState>, caller: Caller, id: web::Path<String>) -> Res {
    caller.require_admin()?;
    let row = on_stored_row(&s, || s.store.set_agent_schedulable(&id, true)).await?;
    let agent = answer(&s, &id, row).await?;
    // Only the leader admits; on a standby the leader's next round (at most
    // `admission-interval` later, after its registry re-read the row) places them.
    s.scheduler.do_send(AdmitNow);
    tracing::info!(target: "audit", agent = %id, key = %caller.access_key, "agent uncordoned");
    reply(HttpResponse::Ok(), &agent)
}

/// Drains an agent: cordoned, and `draining`. Its sessions end by themselves; with
/// `{"deadline": SECONDS}` the leader terminates those still there after that many seconds
/// (status reason `agent-drained`, within `[scheduler] sweep-interval` of the deadline). No
/// body (or `{}`) drains without a deadline; draining again replaces the deadline. The agent
/// stays cordoned after its last session ended, until uncordoned. Answers the agent as
/// `GET /v1/agents` shows it (`drain_deadline` in Unix seconds).
#[utoipa::path(
    operation_id = "drain_agent",
    tag = "system",
    params(("id" = String, Path, description = "Agent id")),
    request_body(content = Option<DrainRequest>, description = "Optional: the deadline"),
    responses(
        (status = 200, description = "The agent, draining", body = Agent),
        (status = 400, description = "`invalid-request`: a body that is not a JSON object of `deadline`, or a deadline that is not a number of seconds above 0 (at most a year)", body = ErrorBody),
        (status = 404, description = "`agent-not-found`", body = ErrorBody),
        responses::AdminOnly,
    ),
)]
#[post("/v1/agents/{id}/drain")]
pub(super) async fn drain(
    s: web::Data<ApiState>,
    caller: Caller,
    id: web::Path<String>,
    body: web::Bytes,
) -> Res {
    caller.require_admin()?;
    let deadline = deadline_of(&body)?;
    let at = deadline.map(|secs| now() + secs);
    let row = on_stored_row(&s, || s.store.drain_agent(&id, at)).await?;
    let agent = answer(&s, &id, row).await?;
    tracing::info!(target: "audit", agent = %id, key = %caller.access_key, deadline = ?deadline, "agent draining");
    reply(HttpResponse::Ok(), &agent)
}

/// The drain body's deadline in seconds from now: `None` for no body (or only whitespace),
/// `{}` or `{"deadline": null}`.
///
/// Errors: 400 `invalid-request` for a body that is not such a JSON object, or a deadline
/// that is not above 0 or longer than [`MAX_DEADLINE`].
fn deadline_of(body: &[u8]) -> Result<Option<f64>, ManagerError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let request = serde_json::from_slice::<Object<DrainRequest>>(body)
        .map_err(|e| ManagerError::InvalidRequest(format!("drain body: {e}")))?
        .into_inner();
    match request.deadline {
        None => Ok(None),
        Some(d) if d.is_finite() && d > 0.0 && d <= MAX_DEADLINE => Ok(Some(d)),
        Some(d) => Err(ManagerError::InvalidRequest(format!(
            "`deadline` must be a number of seconds above 0 and at most {MAX_DEADLINE} (a year), not {d}"
        ))),
    }
}

/// Runs `write`, one of the store's scheduling updates of an agent's row, and returns the row
/// it wrote (`None`: no such agent). An agent that registered less than a second ago is listed
/// by `GET /v1/agents` (the registry) before its row is in the store (written behind, once a
/// second): when `write` finds no row, this replica's registry writes its changed rows now and
/// `write` runs once more, rather than answer 404 for an agent the API lists.
///
/// Errors: the store's; the registry's mailbox.
async fn on_stored_row<F, Fut>(s: &ApiState, write: F) -> Result<Option<AgentRow>, ManagerError>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Option<AgentRow>, StoreError>>,
{
    if let Some(row) = write().await? {
        return Ok(Some(row));
    }
    s.registry.send(FlushAgents).await?;
    Ok(write().await?)
}

/// Tells this replica's registry the flags the store now holds (`row`; `None`: no such
/// agent) and answers the agent as `GET /v1/agents` shows it.
///
/// Errors: 404 `agent-not-found`.
async fn answer(s: &ApiState, id: &str, row: Option<AgentRow>) -> Result<Agent, ManagerError> {
    let row = row.ok_or_else(|| ManagerError::AgentNotFound(id.to_owned()))?;
    let snapshot = s
        .registry
        .send(SetScheduling {
            agent_id: id.to_owned(),
            flags: Scheduling::of(&row),
        })
        .await?
        // Stored by another replica and not re-read here yet: the stored row.
        .unwrap_or(AgentSnapshot {
            row,
            image_count: 0,
        });
    let usage = s.store.usage_by_agent().await?;
    Ok(agent_view(&snapshot, &usage))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_deadlines() {
        for empty in ["", "  \n", "{}", r#"{"deadline": null}"#] {
            assert_eq!(deadline_of(empty.as_bytes()).unwrap(), None, "{empty:?}");
        }
        assert_eq!(deadline_of(br#"{"deadline": 2}"#).unwrap(), Some(2.0));
        assert_eq!(deadline_of(br#"{"deadline": 0.5}"#).unwrap(), Some(0.5));
        for bad in [
            r#"{"deadline": 0}"#,
            r#"{"deadline": -3}"#,
            r#"{"deadline": 1e300}"#,
            r#"{"deadline": "60"}"#,
            r#"{"deadline": 60, "force": true}"#,
            r#"[60]"#,
            "60",
            "{",
        ] {
            let e = deadline_of(bad.as_bytes()).unwrap_err();
            assert_eq!(e.code(), "invalid-request", "{bad}: {e}");
        }
        let e = deadline_of(br#"{"deadline": -3}"#).unwrap_err();
        assert!(e.to_string().contains("above 0"), "{e}");
    }
}

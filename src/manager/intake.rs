//! `EventIntake`: the callosum server agents report to (`docs/events.md`), a ROUTER on
//! `[manager] event-listen-addr` (:6021). With CURVE it proves itself with the manager's key
//! pair and admits only the agents' public keys found in `agent-keys-dir`.
//!
//! - `agent_events(agent_id, events)` → `{"acked": [id, …]}`: each event applied in its own
//!   transaction by the registry, then acked; a duplicate id acked without being re-applied;
//!   an event that does not parse is not acked (logged, counted) and neither is any later one.
//! - `agent_heartbeat(agent_id, info)` → `{}`: left in the registry's [`HeartbeatInbox`] (latest
//!   wins per agent, applied in batches); FAILURE `ManagerOverloaded` when the inbox already
//!   holds `capacity` other agents' heartbeats.
//!
//! Identity: an agent's key file is `<agent-id>.key`, and ZAP admits the connection under that
//! file stem. A call whose `agent_id` is not the caller's own is refused with FAILURE
//! `AgentIdentityMismatch` before anything is applied (logged, counted in
//! `kernelvisor_manager_intake_identity_mismatches_total{method}`), so one node's key cannot
//! report for, or terminate the kernels of, another. An unauthenticated intake (no CURVE) has
//! no identity to bind to and accepts any `agent_id`, as before.

use std::path::Path;

use actix::Addr;
use rmpv::Value;

use super::events::AgentEvent;
use super::metrics::ManagerMetrics;
use super::registry::{AgentRegistry, ApplyEvents, Heartbeat, HeartbeatInbox, Put};
use crate::rpc::curve::{load_certificate, CurveKey, KeyError};
use crate::rpc::intake_api::{EventsReply, EVENTS_METHOD, HEARTBEAT_METHOD};
use crate::rpc::{Call, Dispatcher, ErrorMeta, Failure};

/// The agents' public keys: every `*.key` certificate in `dir`, named by file stem.
///
/// Errors: the directory cannot be read, or a `.key` file is not a certificate.
pub fn load_agent_keys(dir: &Path) -> Result<Vec<(CurveKey, String)>, KeyError> {
    let mut keys = Vec::new();
    let io = |source| KeyError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let entries = std::fs::read_dir(dir).map_err(io)?;
    for entry in entries {
        let path = entry.map_err(io)?.path();
        if path.extension().and_then(|e| e.to_str()) == Some("key") {
            let name = path
                .file_stem()
                .and_then(|s| s.to_str())
                .unwrap_or_default()
                .to_owned();
            keys.push((load_certificate(&path)?.public, name));
        }
    }
    keys.sort_by(|a, b| a.1.cmp(&b.1));
    Ok(keys)
}

/// The call's `agent_id`, which must be the caller's own when the connection is authenticated.
///
/// Errors: `TypeError` when missing; `AgentIdentityMismatch` when it differs from the ZAP user
/// id (counted and logged here, as the caller sees only the FAILURE).
fn agent_id(call: &Call, method: &str, metrics: &ManagerMetrics) -> Result<String, ErrorMeta> {
    let agent_id = call
        .arg(0, "agent_id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            ErrorMeta::failure(Failure::TypeError, "missing required argument: 'agent_id'")
        })?;
    match call.peer_user_id.as_deref() {
        Some(key_id) if key_id != agent_id => {
            tracing::warn!(method, claimed = %agent_id, key = %key_id, "intake call refused: agent_id is not the caller's key");
            metrics
                .intake_identity_mismatches
                .with_label_values(&[method])
                .inc();
            Err(ErrorMeta::failure(
                Failure::AgentIdentityMismatch,
                format!("agent '{key_id}' (by its CURVE key) cannot report as agent '{agent_id}'"),
            ))
        }
        _ => Ok(agent_id.to_owned()),
    }
}

/// The intake's dispatch table.
pub fn dispatcher(
    registry: Addr<AgentRegistry>,
    inbox: std::sync::Arc<HeartbeatInbox>,
    metrics: std::sync::Arc<ManagerMetrics>,
) -> Dispatcher {
    let mut d = Dispatcher::new(None);
    for method in [EVENTS_METHOD, HEARTBEAT_METHOD] {
        // Shown at 0 before the first refusal.
        metrics
            .intake_identity_mismatches
            .with_label_values(&[method]);
    }
    for reason in ["superseded", "stale", "inbox-full"] {
        metrics.heartbeats_dropped.with_label_values(&[reason]);
    }
    let (r, m) = (registry.clone(), metrics.clone());
    d.register(EVENTS_METHOD, move |call| {
        let (r, m) = (r.clone(), m.clone());
        async move {
            let agent_id = agent_id(&call, EVENTS_METHOD, &m)?;
            let raw = call.arg(1, "events").and_then(Value::as_array).ok_or_else(|| ErrorMeta::failure(Failure::TypeError, "'events' must be a list"))?;
            let mut events = Vec::with_capacity(raw.len());
            for v in raw {
                match AgentEvent::from_value(v) {
                    Ok(e) => events.push(e),
                    Err(e) => {
                        // Later events wait behind it: per-kernel order matters more than progress.
                        tracing::error!(%agent_id, error = %e, event = %v, "malformed agent event: not acked");
                        m.events_rejected.with_label_values(&["malformed"]).inc();
                        break;
                    }
                }
            }
            let acked = r.send(ApplyEvents { agent_id, events }).await.map_err(|e| ErrorMeta::failure(Failure::ManagerShuttingDown, e.to_string()))?;
            Ok(crate::rpc::agent_api::to_value(&EventsReply { acked }))
        }
    });
    d.register(HEARTBEAT_METHOD, move |call| {
        let (inbox, m) = (inbox.clone(), metrics.clone());
        async move {
            let agent_id = agent_id(&call, HEARTBEAT_METHOD, &m)?;
            let info = call.arg(1, "info").cloned().unwrap_or(Value::Nil);
            let hb = Heartbeat::from_value(&agent_id, &info)
                .map_err(|e| ErrorMeta::failure(Failure::InvalidHeartbeat, e))?;
            match inbox.put(hb) {
                Ok(put) => {
                    m.heartbeats.inc();
                    match put {
                        Put::New => {}
                        Put::Superseded => m
                            .heartbeats_dropped
                            .with_label_values(&["superseded"])
                            .inc(),
                        Put::Stale => m.heartbeats_dropped.with_label_values(&["stale"]).inc(),
                    }
                    Ok(Value::Map(vec![]))
                }
                Err(full) => {
                    m.heartbeats_dropped
                        .with_label_values(&["inbox-full"])
                        .inc();
                    tracing::warn!(%agent_id, error = %full, "heartbeat refused");
                    Err(ErrorMeta::failure(
                        Failure::ManagerOverloaded,
                        full.to_string(),
                    ))
                }
            }
        }
    });
    d
}

//! `GET /health`: liveness, public (probes carry no token).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `status` of `/health`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthStatus {
    /// The manager answers.
    Ok,
}

/// `mode` of `/health`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthMode {
    /// Serving.
    Normal,
    /// Start-up grace: kernel routes answer 503 `starting-up`.
    Grace,
}

/// `GET /health`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Health {
    /// Always `ok`.
    #[schema(value_type = HealthStatus, required = true)]
    pub status: Option<HealthStatus>,
    /// Start-up grace or not.
    #[schema(value_type = HealthMode, required = true)]
    pub mode: Option<HealthMode>,
    /// Agents `ALIVE` now.
    #[schema(value_type = u64, required = true)]
    pub agents_alive: Option<u64>,
    /// Whether this replica holds the single-leader duties (PostgreSQL advisory lock; always
    /// `true` on SQLite).
    #[schema(required = true)]
    pub leader: bool,
    /// This manager process's replica id (a UUID, fresh per start).
    #[schema(required = true)]
    pub replica: String,
}

//! Services on a session's service ports: `GET /v1/sessions/{id}/services`, `POST` and `DELETE
//! /v1/sessions/{id}/services/{name}`.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Whether a service's process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServiceStatus {
    /// It runs.
    Running,
    /// It does not.
    Stopped,
}

/// A service on a service port.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Service {
    /// Its name.
    #[schema(required = true)]
    pub name: String,
    /// `http`, `tcp` or `preopen`.
    #[schema(required = true)]
    pub protocol: String,
    /// Ports in the container.
    #[schema(required = true)]
    pub container_ports: Vec<u16>,
    /// Host ports they are published on.
    #[schema(required = true)]
    pub host_ports: Vec<u16>,
    /// Whether it runs.
    // The agent's word, passed on.
    #[schema(value_type = ServiceStatus, required = true)]
    pub status: String,
    /// `http://<host>:<first host port>` (`tcp://` for `tcp`); null without host ports.
    #[schema(required = true)]
    pub url: Option<String>,
}

/// `POST /v1/sessions/{id}/services/{name}`'s answer: the service, and whether this call
/// started it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ServiceStarted {
    /// Its name.
    #[schema(required = true)]
    pub name: String,
    /// `http`, `tcp` or `preopen`.
    #[schema(required = true)]
    pub protocol: String,
    /// Ports in the container.
    #[schema(required = true)]
    pub container_ports: Vec<u16>,
    /// Host ports they are published on.
    #[schema(required = true)]
    pub host_ports: Vec<u16>,
    /// `running`.
    #[schema(value_type = ServiceStatus, required = true)]
    pub status: String,
    /// `http://<host>:<first host port>` (`tcp://` for `tcp`); null without host ports.
    #[schema(required = true)]
    pub url: Option<String>,
    /// False when it was running already.
    #[schema(value_type = bool, required = true)]
    pub started: Option<bool>,
}

/// `GET /v1/sessions/{id}/services`'s answer.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct ServiceList {
    /// Every service port of the session.
    #[schema(required = true)]
    pub services: Vec<Service>,
}

//! The `POST /v1/sessions` body and its checks (`docs/manager-api.md`).

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::manager::error::ManagerError;
use crate::workload::RestartPolicy;

/// `POST /v1/sessions` body (`docs/manager-api.md`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// Image reference.
    #[schema(min_length = 1)]
    pub image: String,
    /// `{"cpu": cores, "mem": bytes or "256m", "cuda.device": n}`.
    #[schema(schema_with = crate::manager::api::openapi::resource_slots_schema)]
    pub resource_slots: BTreeMap<String, serde_json::Value>,
    /// Admin keys only: create the session on behalf of this access key. Without it the owner
    /// is the caller (`CreateSession::owner`).
    #[serde(default)]
    pub access_key: Option<String>,
    /// Extra environment.
    #[serde(default)]
    pub environ: BTreeMap<String, String>,
    /// The owner's vfolders: `{"name", "permission"}` (never a host path: the manager resolves
    /// names to `<owner>/<name>` under the agents' vfolder root).
    #[serde(default, deserialize_with = "crate::manager::api::body::objects")]
    pub mounts: Vec<MountSpec>,
    /// `interactive` (default) or `batch`.
    #[serde(default, rename = "type")]
    #[schema(value_type = Option<crate::manager::api::openapi::SessionType>)]
    pub session_type: Option<String>,
    /// Shell command for the main process: required for batch, optional for interactive.
    #[serde(default)]
    pub command: Option<String>,
    /// Seconds a batch session may run (batch only).
    #[serde(default)]
    #[schema(minimum = 0, exclusive_minimum = 0)]
    pub batch_timeout: Option<f64>,
    /// Service ports beyond those the image declares: `{"name", "protocol", "container_ports"}`
    /// (the agent checks them: names, protocols, ports).
    #[serde(default, deserialize_with = "crate::manager::api::body::objects")]
    pub service_ports: Vec<ServicePortSpec>,
    /// What the kernel's supervisor does when its container exits: `{"mode": "never" |
    /// "on-failure" | "always", "max_restarts", "window", "backoff"}` (default `never`).
    #[serde(default)]
    pub restart_policy: Option<RestartPolicy>,
}

/// A service port a session asks for (`POST /v1/sessions`).
#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ServicePortSpec {
    /// Service name (its def file is `/etc/backend.ai/service-defs/<name>.json` in the image).
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub name: String,
    /// `http`, `tcp` or `preopen` (default `tcp`).
    #[serde(default)]
    #[schema(value_type = Option<crate::manager::api::openapi::ServiceProtocol>)]
    pub protocol: Option<String>,
    /// Ports inside the container.
    #[schema(schema_with = crate::manager::api::openapi::container_ports_schema)]
    pub container_ports: Vec<u16>,
}

impl SessionRequest {
    /// The session type, checked: `interactive` or `batch`; `command` required for batch,
    /// non-blank when given; `batch_timeout` positive and batch only; `restart_policy` within
    /// its bounds.
    ///
    /// Errors: [`ManagerError::InvalidRequest`] naming the field.
    pub fn checked_type(&self) -> Result<&'static str, ManagerError> {
        let bad = |m: &str| Err(ManagerError::InvalidRequest(m.to_owned()));
        let t = match self.session_type.as_deref() {
            None | Some("interactive") => "interactive",
            Some("batch") => "batch",
            Some(_) => return bad("`type` must be `interactive` or `batch`"),
        };
        if self.command.as_deref().is_some_and(|c| c.trim().is_empty()) {
            return bad("`command` must not be empty");
        }
        if t == "batch" && self.command.is_none() {
            return bad("a batch session needs a `command`");
        }
        match self.batch_timeout {
            Some(x) if !(x.is_finite() && x > 0.0) => {
                bad("`batch_timeout` must be a positive number of seconds")
            }
            Some(_) if t != "batch" => bad("`batch_timeout` applies to batch sessions only"),
            _ => Ok(t),
        }?;
        if let Some(p) = &self.restart_policy {
            p.check().map_err(ManagerError::InvalidRequest)?;
        }
        Ok(t)
    }
}

/// A vfolder mount of a session request: one of the owner's vfolders (`POST /v1/vfolders`).
#[derive(Clone, Debug, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MountSpec {
    /// vfolder name; mounted at `/home/work/<name>`.
    #[schema(pattern = "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,63}$")]
    pub name: String,
    /// `rw` (default, Backend.AI's for an owned vfolder) or `ro`.
    #[serde(default)]
    #[schema(value_type = Option<crate::manager::api::openapi::MountPermission>)]
    pub permission: Option<String>,
}

impl MountSpec {
    /// `ro` or `rw`.
    ///
    /// Errors: [`ManagerError::InvalidRequest`] for another value.
    pub fn checked_permission(&self) -> Result<&'static str, ManagerError> {
        match self.permission.as_deref() {
            None | Some("rw") => Ok("rw"),
            Some("ro") => Ok("ro"),
            Some(p) => Err(ManagerError::InvalidRequest(format!(
                "mount `{}`: permission `{p}` must be `ro` or `rw`",
                self.name
            ))),
        }
    }
}

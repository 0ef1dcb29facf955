//! Service methods: `start_service`, `shutdown_service` (`ai.backend.agent.server`), and
//! kernelvisor's `list_services`.

use std::collections::BTreeMap;

use rmpv::Value;
use serde::{Deserialize, Serialize};

use super::kernel::KernelIdArgs;
use super::Method;

/// A service port of a kernel with whether its service runs (kernelvisor's answers).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceState {
    /// Service name.
    pub name: String,
    /// `http`, `tcp`, `preopen`, ….
    pub protocol: String,
    /// Ports in the container.
    pub container_ports: Vec<u16>,
    /// Host ports they are published on, index for index.
    pub host_ports: Vec<u16>,
    /// Backend.AI's `ServicePort` flag (always false here).
    #[serde(default)]
    pub is_inference: bool,
    /// `running` or `stopped`.
    pub status: String,
    /// The agent's `[container] advertised-host`, when it has one.
    #[serde(default)]
    pub advertised_host: Option<String>,
}

/// `{"services": [ServiceState]}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceList {
    /// Every service port of the kernel.
    pub services: Vec<ServiceState>,
}

/// kernelvisor's `shutdown_service` answer: `{"status": "stopped", "service"}`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceStopped {
    /// `stopped`.
    pub status: String,
    /// The service, stopped.
    pub service: ServiceState,
}

/// `start_service(kernel_id, service, opts)` → [`StartServiceReply`]: upstream's
/// `{"status": "started" | "running" | "failed", "error"}` (the kernel runner's answer; a
/// service the kernel does not have, or one that fails to start, is `failed` with its `error`,
/// not a FAILURE) plus kernelvisor's `host_ports` and `service`.
pub struct StartService;

/// Arguments of [`StartService`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StartServiceArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// Service name (a service port's `name`).
    pub service: String,
    /// `{"arguments", "envs"}` (upstream's; kernelvisor runs the image's declared command).
    #[serde(default)]
    pub opts: Option<BTreeMap<String, Value>>,
}

/// The reply of [`StartService`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StartServiceReply {
    /// `started` (this call started it), `running` (it already ran), `failed`.
    pub status: String,
    /// Why it failed (nil otherwise).
    #[serde(default)]
    pub error: Option<String>,
    /// kernelvisor: the FAILURE name the failure would have had (`ServiceNotFound`,
    /// `ServiceStartFailed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_name: Option<String>,
    /// kernelvisor: the last output of a service that failed to start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
    /// kernelvisor: the service port's host ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_ports: Option<Vec<u16>>,
    /// kernelvisor: the service (`{"name", "protocol", "container_ports", "host_ports",
    /// "status", "advertised_host"}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceState>,
}

impl Method for StartService {
    const NAME: &'static str = "start_service";
    const PARAMS: &'static [&'static str] = &["kernel_id", "service", "opts"];
    type Args = StartServiceArgs;
    type Reply = StartServiceReply;
}

/// `shutdown_service(kernel_id, service)` → upstream answers nil (its manager ignores the
/// value); kernelvisor answers `{"status": "stopped", "service": {…}}`.
pub struct ShutdownService;

/// Arguments of [`ShutdownService`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ShutdownServiceArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// Service name.
    pub service: String,
}

impl Method for ShutdownService {
    const NAME: &'static str = "shutdown_service";
    const PARAMS: &'static [&'static str] = &["kernel_id", "service"];
    type Args = ShutdownServiceArgs;
    type Reply = ServiceStopped;
}

/// `list_services(kernel_id)` → `{"services": [{…, "status": "running" | "stopped"}]}`
/// (kernelvisor's).
pub struct ListServices;

impl Method for ListServices {
    const NAME: &'static str = "list_services";
    const PARAMS: &'static [&'static str] = &["kernel_id"];
    type Args = KernelIdArgs;
    type Reply = ServiceList;
}

//! Kernel errors with the stable names that cross the wire as FAILURE (Backend.AI's exception
//! names where they exist).

use actors::SetupError;

use crate::agent::backend::BackendError;
use crate::agent::resources::{PortsExhausted, SlotError};
use crate::rpc::failure::Failure;
use crate::rpc::ErrorMeta;

/// Why a kernel operation failed. [`KernelError::name`] is the FAILURE name.
#[derive(Debug, Clone, thiserror::Error)]
pub enum KernelError {
    /// No kernel with this id on this agent (`KernelNotFound`).
    #[error("kernel not found: {0}")]
    NotFound(String),
    /// The spec is malformed or unsafe (`InvalidKernelConfig`): unknown slot, negative memory,
    /// traversal in a vfolder, duplicate kernel id, …
    #[error("invalid kernel config: {0}")]
    InvalidConfig(String),
    /// Not enough slots or host ports (`ResourceExhausted`).
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// The image is not local and cannot be pulled (`ImageNotFound`).
    #[error("image not found: {0}")]
    ImageNotFound(String),
    /// The image's registry cannot be reached (`RegistryUnreachable`).
    #[error("registry unreachable: {0}")]
    RegistryUnreachable(String),
    /// The registry refused the credentials, or wanted some (`RegistryAuthFailed`).
    #[error("registry authentication failed: {0}")]
    RegistryAuthFailed(String),
    /// The image pull took longer than `[container] image-pull-timeout` (`ImagePullTimeout`).
    #[error("image pull timed out: {0}")]
    PullTimeout(String),
    /// The kernel is not in a state that allows the operation (`KernelNotRunning`).
    #[error("kernel {0} is {1}")]
    NotRunning(String, &'static str),
    /// The container engine failed (`ContainerEngineError`).
    #[error("container engine: {0}")]
    Engine(String),
    /// The container engine cannot be reached: down or restarting (`ContainerEngineUnavailable`).
    /// Transient; nothing of the operation was left behind.
    #[error("container engine unavailable: {0}")]
    EngineUnavailable(String),
    /// The kernel's `bootstrap_script` failed or ran too long (`BootstrapScriptFailed`).
    #[error("{0}")]
    BootstrapFailed(String),
    /// The container cannot be made as its config asks: the cluster network it names does not
    /// exist on the engine (`ContainerCreationFailedError`, upstream's name for a create the
    /// engine refuses, `ai.backend.agent.errors.agent`).
    #[error("container creation failed: {0}")]
    ContainerCreationFailed(String),
    /// A stage failed during creation; `name` is the inner error's name, the message names the
    /// stage (`stage `ports`: resource exhausted: …`).
    #[error("stage `{stage}` failed: {source}")]
    Stage {
        /// The failing stage.
        stage: &'static str,
        /// What went wrong there.
        source: Box<KernelError>,
    },
}

impl KernelError {
    /// The stable FAILURE name; a stage failure carries its cause's name.
    pub fn name(&self) -> Failure {
        match self {
            KernelError::NotFound(_) => Failure::KernelNotFound,
            KernelError::InvalidConfig(_) => Failure::InvalidKernelConfig,
            KernelError::ResourceExhausted(_) => Failure::ResourceExhausted,
            KernelError::ImageNotFound(_) => Failure::ImageNotFound,
            KernelError::RegistryUnreachable(_) => Failure::RegistryUnreachable,
            KernelError::RegistryAuthFailed(_) => Failure::RegistryAuthFailed,
            KernelError::PullTimeout(_) => Failure::ImagePullTimeout,
            KernelError::NotRunning(..) => Failure::KernelNotRunning,
            KernelError::Engine(_) => Failure::ContainerEngineError,
            KernelError::EngineUnavailable(_) => Failure::ContainerEngineUnavailable,
            KernelError::BootstrapFailed(_) => Failure::BootstrapScriptFailed,
            KernelError::ContainerCreationFailed(_) => Failure::ContainerCreationFailedError,
            KernelError::Stage { source, .. } => source.name(),
        }
    }

    /// As a FAILURE for the wire.
    pub fn to_meta(&self) -> ErrorMeta {
        ErrorMeta::new(self.name(), self.to_string())
    }

    /// From a failed [`StageChain::setup`](actors::StageChain::setup): the stage and its
    /// cause, recovered from the provisioner's boxed error.
    pub fn from_setup(e: &SetupError) -> KernelError {
        let source = e
            .failed
            .source
            .downcast_ref::<KernelError>()
            .cloned()
            .unwrap_or_else(|| KernelError::Engine(e.failed.source.to_string()));
        KernelError::Stage {
            stage: e.failed.stage,
            source: Box::new(source),
        }
    }
}

impl From<BackendError> for KernelError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::ImageNotFound(i) => KernelError::ImageNotFound(i),
            BackendError::RegistryUnreachable(i) => KernelError::RegistryUnreachable(i),
            BackendError::RegistryAuthFailed(i) => KernelError::RegistryAuthFailed(i),
            BackendError::Unavailable(e) => KernelError::EngineUnavailable(e),
            other => KernelError::Engine(other.to_string()),
        }
    }
}

impl From<SlotError> for KernelError {
    fn from(e: SlotError) -> Self {
        match e {
            SlotError::Invalid(m) => KernelError::InvalidConfig(m),
            e @ SlotError::Unknown(_) => KernelError::InvalidConfig(e.to_string()),
            e @ SlotError::Exhausted { .. } => KernelError::ResourceExhausted(e.to_string()),
        }
    }
}

impl From<PortsExhausted> for KernelError {
    fn from(e: PortsExhausted) -> Self {
        KernelError::ResourceExhausted(e.to_string())
    }
}

//! Configuration files: `agent.toml` and `manager.toml` (samples in `configs/`).
//!
//! Keys follow Backend.AI's agent config where the concept is the same (`[agent] id`,
//! `rpc-listen-addr`, `rpc-auth-manager-public-key`, …). Every table denies unknown keys, so a
//! typo is an error at start that names the key and its line, never a silent default.

mod agent;
mod common;
mod manager;

pub use agent::{
    AcceleratorSection, AgentConfig, AgentManagerSection, AgentSection, BackendKind,
    ContainerSection, DummySection, KernelRunnerSection, MockAcceleratorSection, MockDeviceConfig,
    OnShutdown, RedisSection, ResourceSection, RunnerMode, StatsSection,
};
pub use common::{ByteSize, ConfigError, HostPort, LogFormat, LoggingConfig, Seconds};
pub use manager::{
    registry_url_host, ApiSection, ManagerConfig, ManagerSection, PoolSection, ReclaimSection,
    RegistrySection, SchedulerSection, StaticAgent, StoreSection,
};

use std::path::Path;

/// Reads and parses a TOML file into `T`, then runs `validate`.
///
/// Errors: the file cannot be read; TOML syntax, an unknown key or a bad value (the message
/// names the key and shows the line); a semantic check of `validate`.
pub fn load<T: serde::de::DeserializeOwned>(
    path: &Path,
    validate: impl FnOnce(&T) -> Result<(), ConfigError>,
) -> Result<T, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| ConfigError::Read(path.display().to_string(), e.to_string()))?;
    let config: T = toml::from_str(&text)
        .map_err(|e| ConfigError::Parse(path.display().to_string(), e.to_string()))?;
    validate(&config)?;
    Ok(config)
}

//! `agent.toml`.

use std::path::PathBuf;

use serde::Deserialize;

use super::common::{ConfigError, HostPort, LoggingConfig};

/// The whole agent config file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AgentConfig {
    /// `[agent]`.
    pub agent: AgentSection,
    /// `[logging]`.
    #[serde(default)]
    pub logging: LoggingConfig,
}

/// `[agent]`: identity, RPC endpoint and its keys.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct AgentSection {
    /// Agent id, unique in the cluster (Backend.AI: `[agent] id`).
    pub id: String,
    /// Where the RPC ROUTER binds (default `0.0.0.0:6011`).
    #[serde(default = "default_rpc_listen_addr")]
    pub rpc_listen_addr: HostPort,
    /// The manager's public certificate (`zmq.auth` format). With `rpc-auth-agent-keypair`, turns
    /// CURVE on and admits only this key.
    pub rpc_auth_manager_public_key: Option<PathBuf>,
    /// The agent's secret certificate (`.key_secret`).
    pub rpc_auth_agent_keypair: Option<PathBuf>,
    /// Directory for the agent's state (store, outbox); default `./var/agent`.
    #[serde(default = "default_var_base_path")]
    pub var_base_path: PathBuf,
}

fn default_rpc_listen_addr() -> HostPort {
    HostPort { host: "0.0.0.0".into(), port: 6011 }
}

fn default_var_base_path() -> PathBuf {
    PathBuf::from("var/agent")
}

impl AgentConfig {
    /// Loads and checks an agent config file.
    ///
    /// Errors: see [`super::load`]; an empty `id`; only one of the two key paths set.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        super::load(path, Self::validate)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let a = &self.agent;
        if a.id.trim().is_empty() {
            return Err(ConfigError::Invalid("agent.id", "must not be empty".into()));
        }
        match (&a.rpc_auth_manager_public_key, &a.rpc_auth_agent_keypair) {
            (Some(_), None) => Err(ConfigError::Invalid("agent.rpc-auth-agent-keypair", "required when rpc-auth-manager-public-key is set".into())),
            (None, Some(_)) => Err(ConfigError::Invalid("agent.rpc-auth-manager-public-key", "required when rpc-auth-agent-keypair is set".into())),
            _ => Ok(()),
        }
    }
}

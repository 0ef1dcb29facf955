//! `manager.toml`.

use std::path::PathBuf;

use serde::Deserialize;

use super::common::{ConfigError, HostPort, LoggingConfig, Seconds};
use crate::manager::pool::PoolSpec;
use crate::rpc::socket::Keepalive;

/// The whole manager config file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ManagerConfig {
    /// `[manager]`.
    #[serde(default)]
    pub manager: ManagerSection,
    /// `[agent-pool]`: seed 000's intervals.
    #[serde(default)]
    pub agent_pool: PoolSection,
    /// `[[agents]]`: agents known at start (the agent registry adds the rest at run time).
    #[serde(default)]
    pub agents: Vec<StaticAgent>,
    /// `[logging]`.
    #[serde(default)]
    pub logging: LoggingConfig,
}

/// `[manager]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ManagerSection {
    /// The manager's secret certificate (`.key_secret`), used as CURVE client key towards agents.
    pub rpc_keypair: Option<PathBuf>,
}

/// `[agent-pool]`; every duration in seconds. Defaults: seed 000.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct PoolSection {
    /// Health-check sweep period (30).
    pub health_check_interval: Seconds,
    /// Health-check ping timeout (5).
    pub ping_timeout: Seconds,
    /// Connection errors before an entry is unhealthy (3).
    pub failure_threshold: u32,
    /// Unhealthy time before eviction (60).
    pub recovery_timeout: Seconds,
    /// Wait for callosum's handshake PONG (5).
    pub handshake_timeout: Seconds,
    /// TCP keepalive idle time (60).
    pub tcp_keepalive_idle: u16,
    /// TCP keepalive probe interval (20).
    pub tcp_keepalive_intvl: u16,
    /// TCP keepalive probe count (3).
    pub tcp_keepalive_cnt: u16,
}

impl Default for PoolSection {
    fn default() -> Self {
        let d = PoolSpec::default();
        PoolSection {
            health_check_interval: Seconds(d.health_check_interval),
            ping_timeout: Seconds(d.ping_timeout),
            failure_threshold: d.failure_threshold,
            recovery_timeout: Seconds(d.recovery_timeout),
            handshake_timeout: Seconds(d.handshake_timeout),
            tcp_keepalive_idle: d.keepalive.idle_secs as u16,
            tcp_keepalive_intvl: d.keepalive.interval_secs as u16,
            tcp_keepalive_cnt: d.keepalive.count as u16,
        }
    }
}

impl PoolSection {
    /// The pool's runtime spec.
    pub fn spec(&self) -> PoolSpec {
        PoolSpec {
            health_check_interval: self.health_check_interval.0,
            ping_timeout: self.ping_timeout.0,
            failure_threshold: self.failure_threshold,
            recovery_timeout: self.recovery_timeout.0,
            handshake_timeout: self.handshake_timeout.0,
            keepalive: Keepalive {
                idle_secs: self.tcp_keepalive_idle.into(),
                interval_secs: self.tcp_keepalive_intvl.into(),
                count: self.tcp_keepalive_cnt.into(),
            },
        }
    }
}

/// `[[agents]]`: an agent the manager knows without waiting for its heartbeat.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct StaticAgent {
    /// Agent id.
    pub id: String,
    /// Its RPC address.
    pub addr: HostPort,
    /// Its public certificate; omit for an unauthenticated agent.
    pub public_key: Option<PathBuf>,
}

impl ManagerConfig {
    /// Loads and checks a manager config file.
    ///
    /// Errors: see [`super::load`]; `failure-threshold = 0`; a CURVE agent without `rpc-keypair`.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        super::load(path, Self::validate)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.agent_pool.failure_threshold == 0 {
            return Err(ConfigError::Invalid("agent-pool.failure-threshold", "must be at least 1".into()));
        }
        if self.manager.rpc_keypair.is_none() && self.agents.iter().any(|a| a.public_key.is_some()) {
            return Err(ConfigError::Invalid("manager.rpc-keypair", "required when an agent has a public-key".into()));
        }
        Ok(())
    }
}

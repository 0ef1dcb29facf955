//! `PoolSpec`: the agent pool's timing and failure policy (Backend.AI's `AgentPoolSpec`).

use std::time::Duration;

use crate::rpc::socket::Keepalive;

/// Descriptors per agent: its route of the pool's ROUTER, its intake connection.
const FDS_PER_AGENT: u64 = 2;
/// Descriptors for everything else (store, API clients, logs).
const FDS_HEADROOM: u64 = 4096;

/// Timing and failure policy of the [`super::AgentPool`]; defaults are Backend.AI's
/// `AgentPoolSpec` ones.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolSpec {
    /// Period of the health-check sweep that pings every entry (default 30 s).
    pub health_check_interval: Duration,
    /// How long a health-check ping may take (default 5 s).
    pub ping_timeout: Duration,
    /// Consecutive connection errors (timeouts, I/O) that make an entry unhealthy (default 3).
    /// Business errors (FAILURE replies) never count.
    pub failure_threshold: u32,
    /// How long an entry may stay unhealthy before the sweep evicts it (default 60 s).
    pub recovery_timeout: Duration,
    /// How long a new connection waits for callosum's PONG (default 5 s).
    pub handshake_timeout: Duration,
    /// TCP keepalive of every DEALER (default idle 60 s, interval 20 s, 3 probes).
    pub keepalive: Keepalive,
    /// Most agents in the fleet (default 20000): the open files the manager needs
    /// ([`PoolSpec::fds_needed`]).
    pub max_agents: u32,
    /// ZeroMQ I/O threads (default 1).
    pub io_threads: u16,
    /// Health-check pings in flight at once (default 256).
    pub health_check_concurrency: u32,
    /// Over how long a periodic sweep starts its pings, evenly (default: half the interval).
    pub health_check_spread: Option<Duration>,
}

impl PoolSpec {
    /// Open file descriptors a manager needs for `max_agents`: each agent's pool route and its
    /// intake connection are a TCP connection each; plus room for the rest of the process.
    pub fn fds_needed(max_agents: u32) -> u64 {
        FDS_PER_AGENT * u64::from(max_agents) + FDS_HEADROOM
    }

    /// The most agents `fds` open files serve (the inverse of [`PoolSpec::fds_needed`]).
    pub fn agents_for_fds(fds: u64) -> u32 {
        u32::try_from(fds.saturating_sub(FDS_HEADROOM) / FDS_PER_AGENT).unwrap_or(u32::MAX)
    }
}

impl Default for PoolSpec {
    fn default() -> Self {
        PoolSpec {
            health_check_interval: Duration::from_secs(30),
            ping_timeout: Duration::from_secs(5),
            failure_threshold: 3,
            recovery_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(5),
            keepalive: Keepalive::default(),
            max_agents: 20_000,
            io_threads: 1,
            health_check_concurrency: 256,
            health_check_spread: None,
        }
    }
}

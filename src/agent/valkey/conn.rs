//! The `valkey` child's connections: one per logical database, made when first needed, every
//! command and connection attempt bounded ([`TIMEOUT`]), a connection that failed dropped and
//! made again on the next write. Nothing here retries: each channel writes again on its own
//! next turn, so an unreachable or stalled Valkey costs one bounded attempt per turn and never
//! holds anything else up (as the bus sender's heartbeats, `bus/sender.rs`).

use std::collections::HashMap;
use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::FromRedisValue;

use crate::config::RedisSection;

/// Longest a connection attempt or a reply may take.
pub const TIMEOUT: Duration = Duration::from_secs(2);

/// Why a write failed: `connect` (no connection could be made), `io` (the connection broke or
/// a reply did not come in time), `rejected` (Valkey answered with an error).
pub type Failure = &'static str;

/// Connections to one Valkey, by logical database.
pub struct Conns {
    config: RedisSection,
    by_db: HashMap<i64, ConnectionManager>,
}

impl Conns {
    /// No connection yet to the server of `config`.
    pub fn new(config: RedisSection) -> Conns {
        Conns {
            config,
            by_db: HashMap::new(),
        }
    }

    async fn connection(&mut self, db: i64) -> Result<ConnectionManager, Failure> {
        if let Some(c) = self.by_db.get(&db) {
            return Ok(c.clone());
        }
        let client = self.config.client(db).map_err(|_| "connect")?;
        let cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(TIMEOUT)
            .set_response_timeout(TIMEOUT)
            .set_number_of_retries(0)
            .set_max_delay(1000);
        match tokio::time::timeout(TIMEOUT * 2, ConnectionManager::new_with_config(client, cfg))
            .await
        {
            Ok(Ok(c)) => {
                self.by_db.insert(db, c.clone());
                Ok(c)
            }
            Ok(Err(e)) if e.kind() == redis::ErrorKind::AuthenticationFailed => Err("rejected"),
            _ => Err("connect"),
        }
    }

    /// Runs `pipe` on database `db`. A broken or slow connection is dropped.
    pub async fn pipe<T: FromRedisValue>(
        &mut self,
        db: i64,
        pipe: &redis::Pipeline,
    ) -> Result<T, Failure> {
        let mut c = self.connection(db).await?;
        let r = tokio::time::timeout(TIMEOUT, pipe.query_async::<T>(&mut c)).await;
        self.settle(db, r)
    }

    /// Runs `cmd` on database `db`. A broken or slow connection is dropped.
    pub async fn cmd<T: FromRedisValue>(
        &mut self,
        db: i64,
        cmd: &redis::Cmd,
    ) -> Result<T, Failure> {
        let mut c = self.connection(db).await?;
        let r = tokio::time::timeout(TIMEOUT, cmd.query_async::<T>(&mut c)).await;
        self.settle(db, r)
    }

    fn settle<T>(
        &mut self,
        db: i64,
        r: Result<redis::RedisResult<T>, tokio::time::error::Elapsed>,
    ) -> Result<T, Failure> {
        match r {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) if !(e.is_io_error() || e.is_connection_dropped() || e.is_timeout()) => {
                Err("rejected")
            }
            _ => {
                self.by_db.remove(&db);
                Err("io")
            }
        }
    }

    /// The server's clock, Unix seconds (`TIME` on database `db`), as upstream stamps kernel
    /// presence (`ValkeyScheduleClient._get_redis_time`).
    pub async fn time(&mut self, db: i64) -> Result<u64, Failure> {
        let (secs, _micros): (u64, u64) = self.cmd(db, &redis::cmd("TIME")).await?;
        Ok(secs)
    }
}

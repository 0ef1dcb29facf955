//! The manager tree's `store` child: the store (SQLite file by default, PostgreSQL by URL),
//! migrated, with its admin key, and the event stream its status writes feed.

use std::sync::Arc;

use actors::ChildSpec;
use anyhow::Context as _;

use crate::config::ManagerConfig;
use crate::manager::bootstrap;
use crate::manager::event_hub::{EventHub, HubSpec};
use crate::manager::leader::SqliteLock;
use crate::manager::metrics::ManagerMetrics;
use crate::manager::store::Store;

/// What [`open`] opened.
pub(in crate::manager) struct Opened {
    /// The store, publishing to `events`.
    pub store: Store,
    /// On SQLite, the lock that keeps a second manager off the file.
    pub lock: Option<SqliteLock>,
    /// The event stream (`GET /v1/events`): fed by the store's status writes and the
    /// registry's liveness.
    pub events: EventHub,
}

/// Opens `[store] url` (migrating it) and makes sure it has an admin key
/// ([`bootstrap::ensure_admin_key`], `[api] admin-token-file`); on SQLite, first takes the
/// file's lock.
///
/// Errors: another manager holds the SQLite file; the store cannot be opened (the message
/// names the URL, its password redacted); the token file cannot be written.
pub(in crate::manager) async fn open(
    config: &ManagerConfig,
    metrics: &Arc<ManagerMetrics>,
) -> anyhow::Result<Opened> {
    // Before anything migrates: SQLite serves one manager.
    let lock = SqliteLock::acquire(&config.store.url)?;
    let events = EventHub::new(
        HubSpec {
            history: config.events.history,
            queue: config.events.queue,
        },
        Some(metrics.clone()),
    );
    let store = Store::connect(&config.store.url)
        .await
        .with_context(|| format!("store {}", redact(&config.store.url)))?
        .with_events(events.clone());
    bootstrap::ensure_admin_key(&store, &config.api.admin_token_file).await?;
    Ok(Opened {
        store,
        lock,
        events,
    })
}

/// `store`: the store (and, on SQLite, the file lock, released once the store is closed).
pub(in crate::manager) fn child_spec(store: Store, lock: Option<SqliteLock>) -> ChildSpec {
    super::holder("store", (store, lock), |(store, lock)| async move {
        store.close().await;
        drop(lock);
    })
}

/// `postgres://user:secret@host` → `postgres://user:***@host` for logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].find(':') {
            Some(c) => format!("{}:***{}", &url[..s + 3 + c], &url[at..]),
            None => url.to_owned(),
        },
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn redacts_passwords() {
        assert_eq!(
            super::redact("postgres://kv:secret@127.0.0.1/db"),
            "postgres://kv:***@127.0.0.1/db"
        );
        assert_eq!(super::redact("sqlite://var/m.db"), "sqlite://var/m.db");
    }
}

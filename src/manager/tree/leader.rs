//! The manager tree's `leader` child: which replica runs the single-leader duties.

use actors::ChildSpec;

use crate::config::ManagerConfig;
use crate::manager::leader::Leadership;
use crate::manager::store::Store;

/// This replica's [`Leadership`] on `store`, renewed every `[manager] leader-lease`.
pub(in crate::manager) fn start(config: &ManagerConfig, store: &Store) -> Leadership {
    Leadership::start(store, config.manager.leader_lease.0)
}

/// `leader`: this replica's [`Leadership`] (the advisory-lock loop runs until every clone is
/// dropped).
pub(in crate::manager) fn child_spec(leader: Leadership) -> ChildSpec {
    super::holder("leader", leader, |_| async {})
}

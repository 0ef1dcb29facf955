//! An image pull's progress in bytes: what the agent sums from the engine's per-layer lines and
//! the manager shows in a `PULLING` session (`pull_progress`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Progress of one image pull, summed over its layers.
///
/// `total_bytes` grows while the engine discovers layer sizes (a layer's size is known once its
/// download starts); at the end `current_bytes == total_bytes` and `layers_done ==
/// layers_total`. Layers the node already had count as done with no bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct PullProgress {
    /// Bytes downloaded so far (compressed layer bytes, as the registry serves them).
    pub current_bytes: u64,
    /// Bytes of every layer whose size is known so far.
    pub total_bytes: u64,
    /// Layers downloaded and extracted (or already present).
    pub layers_done: u32,
    /// Layers of the image seen so far.
    pub layers_total: u32,
}

//! Image methods: `check_pulling`, `check_and_pull`, `purge_images`, `commit`,
//! `get_commit_status`, `push_image` (`ai.backend.agent.server.AgentRPCServer`), and
//! kernelvisor's `image_pull_status` (where a pull stands, with its progress in bytes).
//!
//! Arguments of methods not implemented yet are loose (every field optional), so a call reaches
//! the `NotImplemented` answer rather than a `TypeError`.

use std::collections::BTreeMap;

use rmpv::Value;
use serde::{Deserialize, Serialize};

use super::Method;
use crate::model::pull::PullProgress;

/// The FAILURE name of a method the agent does not implement yet.
pub const NOT_IMPLEMENTED: &str = "NotImplemented";

/// `check_pulling(image_name)` → bool: a pull of that image is in flight on this agent (for a
/// kernel's image stage).
pub struct CheckPulling;

/// Arguments of [`CheckPulling`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckPullingArgs {
    /// The image's canonical name.
    pub image_name: String,
}

impl Method for CheckPulling {
    const NAME: &'static str = "check_pulling";
    const PARAMS: &'static [&'static str] = &["image_name"];
    type Args = CheckPullingArgs;
    type Reply = bool;
}

/// `check_and_pull(image_configs)` → `{image: bgtask id (32 hex digits)}`: starts, per image,
/// a check and (when needed) a pull in the background and answers at once; the outcome is
/// told by the events `image_pull_started` / `image_pull_finished` (`msg` `Image already
/// exists` when no pull was needed) / `image_pull_failed`, as Backend.AI 26.x's agent does
/// (`AbstractAgent.check_and_pull`), and by [`ImagePullStatus`].
pub struct CheckAndPull;

/// Arguments of [`CheckAndPull`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckAndPullArgs {
    /// `{canonical: ImageConfig}`.
    pub image_configs: BTreeMap<String, super::kernel::ImageConfig>,
}

impl Method for CheckAndPull {
    const NAME: &'static str = "check_and_pull";
    const PARAMS: &'static [&'static str] = &["image_configs"];
    type Args = CheckAndPullArgs;
    type Reply = BTreeMap<String, String>;
}

/// `image_pull_status(image_name)` → [`PullState`] or nil (kernelvisor's): the pull of that
/// image in flight on this agent, else the outcome of its last pull or check there (`done`
/// when it was already present); nil when the agent has not seen it lately.
pub struct ImagePullStatus;

impl Method for ImagePullStatus {
    const NAME: &'static str = "image_pull_status";
    const PARAMS: &'static [&'static str] = &["image_name"];
    type Args = CheckPullingArgs;
    type Reply = Option<PullState>;
}

/// Where one image pull stands.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "kebab-case")]
pub enum PullState {
    /// The engine is pulling it.
    Pulling {
        /// Bytes and layers so far.
        progress: PullProgress,
    },
    /// Pulled (or already present): the image is local.
    Done {
        /// The final progress (zero when no pull was needed).
        progress: PullProgress,
    },
    /// The pull failed.
    Failed {
        /// The FAILURE name: `ImageNotFound`, `RegistryUnreachable`, `RegistryAuthFailed`,
        /// `ImagePullTimeout`, `ContainerEngineUnavailable` or `ContainerEngineError`.
        error: String,
        /// What went wrong, in words.
        message: String,
    },
}

impl PullState {
    /// `true` once the pull ended either way.
    pub fn is_over(&self) -> bool {
        !matches!(self, PullState::Pulling { .. })
    }
}

/// `purge_images(image_canonicals, force, noprune)` → `{"responses": [{"image", "error"}]}`
/// (not implemented).
pub struct PurgeImages;

/// Arguments of [`PurgeImages`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeImagesArgs {
    /// Images to remove.
    #[serde(default)]
    pub image_canonicals: Option<Vec<String>>,
    /// Remove even when containers use them.
    #[serde(default)]
    pub force: Option<bool>,
    /// Keep untagged parents.
    #[serde(default)]
    pub noprune: Option<bool>,
}

impl Method for PurgeImages {
    const NAME: &'static str = "purge_images";
    const PARAMS: &'static [&'static str] = &["image_canonicals", "force", "noprune"];
    type Args = PurgeImagesArgs;
    type Reply = Value;
}

/// `commit(kernel_id, subdir, *, canonical=None, filename=None, extra_labels=None)` →
/// `{"bgtask_id", "kernel", "path"}` (not implemented).
pub struct Commit;

/// Arguments of [`Commit`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CommitArgs {
    /// Kernel id.
    #[serde(default)]
    pub kernel_id: Option<String>,
    /// Directory under the commit path.
    #[serde(default)]
    pub subdir: Option<String>,
    /// The image's new name.
    #[serde(default)]
    pub canonical: Option<String>,
    /// A file to export the image to.
    #[serde(default)]
    pub filename: Option<String>,
    /// Labels to add.
    #[serde(default)]
    pub extra_labels: Option<BTreeMap<String, String>>,
}

impl Method for Commit {
    const NAME: &'static str = "commit";
    const PARAMS: &'static [&'static str] = &["kernel_id", "subdir"];
    type Args = CommitArgs;
    type Reply = Value;
}

/// `get_commit_status(kernel_id, subdir)` → `{"kernel", "status": "ready" | "ongoing"}` (not
/// implemented).
pub struct GetCommitStatus;

/// Arguments of [`GetCommitStatus`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetCommitStatusArgs {
    /// Kernel id.
    #[serde(default)]
    pub kernel_id: Option<String>,
    /// Directory under the commit path.
    #[serde(default)]
    pub subdir: Option<String>,
}

impl Method for GetCommitStatus {
    const NAME: &'static str = "get_commit_status";
    const PARAMS: &'static [&'static str] = &["kernel_id", "subdir"];
    type Args = GetCommitStatusArgs;
    type Reply = Value;
}

/// `push_image(image_ref, registry_conf)` → `{"bgtask_id", "canonical"}` (not implemented).
pub struct PushImage;

/// Arguments of [`PushImage`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PushImageArgs {
    /// The image (`ImageRef`).
    #[serde(default)]
    pub image_ref: Option<Value>,
    /// The registry (`ImageRegistry`).
    #[serde(default)]
    pub registry_conf: Option<Value>,
}

impl Method for PushImage {
    const NAME: &'static str = "push_image";
    const PARAMS: &'static [&'static str] = &["image_ref", "registry_conf"];
    type Args = PushImageArgs;
    type Reply = Value;
}

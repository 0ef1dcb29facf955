//! Image methods: `check_pulling`, `check_and_pull`, `purge_images`, `commit`,
//! `get_commit_status`, `push_image` (`ai.backend.agent.server.AgentRPCServer`), and
//! kernelvisor's `image_pull_status` (where a pull stands, with its progress in bytes) and
//! `get_bgtask` (the state and progress of a `commit` or `push_image`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::Method;
use crate::model::pull::PullProgress;

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

/// `purge_images(image_canonicals, force, noprune)` → [`PurgeImagesReply`]
/// (`@rpc_function_v2`: upstream answers `PurgeImagesResp.as_dict()`). Each image is removed
/// as `docker rmi` removes it; one that cannot be is reported in its entry's `error`, never
/// as a FAILURE.
pub struct PurgeImages;

/// Arguments of [`PurgeImages`] (upstream's `PurgeImagesReq`: `images`, `force`, `noprune`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeImagesArgs {
    /// Images to remove: references (`repo:tag`, `host/repo:tag`) or ids (`sha256:…`).
    pub image_canonicals: Vec<String>,
    /// Remove even when stopped containers use them or they have other tags (upstream:
    /// "Remove the images even if it is being used by stopped containers or has other tags").
    #[serde(default)]
    pub force: bool,
    /// Keep their untagged parents ("Don't delete untagged parent images").
    #[serde(default)]
    pub noprune: bool,
}

/// One image's outcome in [`PurgeImagesReply`] (upstream's `PurgeImageResp`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeImageResult {
    /// The image as the call named it.
    pub image: String,
    /// `None` (nil) when it was removed; why not otherwise.
    #[serde(default)]
    pub error: Option<String>,
}

/// The reply of [`PurgeImages`] (upstream's `PurgeImagesResp`): one entry per image, in the
/// call's order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PurgeImagesReply {
    /// See [`PurgeImageResult`].
    pub responses: Vec<PurgeImageResult>,
}

impl Method for PurgeImages {
    const NAME: &'static str = "purge_images";
    const PARAMS: &'static [&'static str] = &["image_canonicals", "force", "noprune"];
    type Args = PurgeImagesArgs;
    type Reply = PurgeImagesReply;
}

/// `commit(kernel_id, subdir, *, canonical=None, filename=None, extra_labels=None)` →
/// [`CommitReply`] `{"bgtask_id", "kernel", "path"}`: starts saving the kernel's container as
/// the image `canonical` in the background (upstream's `BackgroundTaskManager`) and answers at
/// once. `subdir` names the commit (upstream's manager passes the owner's e-mail, `@` as `_`):
/// one commit per kernel and `subdir` runs at a time ([`GetCommitStatus`]).
pub struct Commit;

/// Arguments of [`Commit`]. `canonical`, `filename` and `extra_labels` are keyword-only
/// upstream, so [`Commit`]'s `PARAMS` lists only the first two and the manager sends the
/// others as keywords.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CommitArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// The commit's name space (see [`Commit`]).
    pub subdir: String,
    /// The new image's reference (`host[:port]/repo:tag`; `latest` when it has no tag).
    #[serde(default)]
    pub canonical: Option<String>,
    /// A file (under upstream's `image-commit-path/<subdir>`) to export the image to as a
    /// gzipped tar; not supported by this agent (FAILURE `NotImplemented`).
    #[serde(default)]
    pub filename: Option<String>,
    /// Labels to add to the image.
    #[serde(default)]
    pub extra_labels: Option<BTreeMap<String, String>>,
}

/// The reply of [`Commit`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitReply {
    /// The background task's id (a UUID as text): [`GetBgtask`] reports it.
    pub bgtask_id: String,
    /// The kernel id, as the call gave it.
    pub kernel: String,
    /// `<subdir>/<filename>` for a commit to a file; nil otherwise.
    #[serde(default)]
    pub path: Option<String>,
}

impl Method for Commit {
    const NAME: &'static str = "commit";
    const PARAMS: &'static [&'static str] = &["kernel_id", "subdir"];
    type Args = CommitArgs;
    type Reply = CommitReply;
}

/// `get_commit_status(kernel_id, subdir)` → [`CommitStatusReply`] `{"kernel", "status":
/// "ongoing" | "ready"}`: whether a commit of the kernel under `subdir` is running (upstream's
/// `CommitStatus`; `ready` also when none ever ran).
pub struct GetCommitStatus;

/// Arguments of [`GetCommitStatus`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetCommitStatusArgs {
    /// Kernel id.
    pub kernel_id: String,
    /// As given to [`Commit`].
    pub subdir: String,
}

/// `ongoing` while a commit runs, `ready` otherwise (upstream's `CommitStatus` values).
pub const COMMIT_ONGOING: &str = "ongoing";
/// See [`COMMIT_ONGOING`].
pub const COMMIT_READY: &str = "ready";

/// The reply of [`GetCommitStatus`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitStatusReply {
    /// The kernel id, as the call gave it.
    pub kernel: String,
    /// [`COMMIT_ONGOING`] or [`COMMIT_READY`].
    pub status: String,
}

impl Method for GetCommitStatus {
    const NAME: &'static str = "get_commit_status";
    const PARAMS: &'static [&'static str] = &["kernel_id", "subdir"];
    type Args = GetCommitStatusArgs;
    type Reply = CommitStatusReply;
}

/// `push_image(image_ref, registry_conf)` → [`PushImageReply`] `{"bgtask_id", "canonical"}`:
/// starts pushing the local image `image_ref.canonical` to its registry with
/// `registry_conf`'s credentials in the background and answers at once. A local image
/// (`is_local`) is not pushed (its task is done at once), as upstream.
pub struct PushImage;

/// Arguments of [`PushImage`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PushImageArgs {
    /// The image (`ImageRef`; its canonical name is `registry/project/name:tag`, empty parts
    /// left out).
    pub image_ref: super::kernel::ImageRef,
    /// The registry and its credentials (`ImageRegistry`); pushed anonymously without a user
    /// name and password.
    pub registry_conf: super::kernel::ImageRegistry,
}

/// The reply of [`PushImage`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushImageReply {
    /// The background task's id (a UUID as text).
    pub bgtask_id: String,
    /// The image's canonical name.
    pub canonical: String,
}

impl Method for PushImage {
    const NAME: &'static str = "push_image";
    const PARAMS: &'static [&'static str] = &["image_ref", "registry_conf"];
    type Args = PushImageArgs;
    type Reply = PushImageReply;
}

/// The canonical name of `image_ref` as upstream's `ImageRef.canonical` writes it:
/// `registry/project/name:tag` with empty parts left out.
pub fn canonical(image_ref: &super::kernel::ImageRef) -> String {
    let parts: Vec<&str> = [
        image_ref.registry.as_str(),
        image_ref.project.as_deref().unwrap_or(""),
        image_ref.name.as_str(),
    ]
    .into_iter()
    .filter(|p| !p.is_empty())
    .collect();
    format!("{}:{}", parts.join("/"), image_ref.tag)
}

/// kernelvisor's `get_bgtask(bgtask_id)` → [`BgtaskState`]: the state and progress of a
/// [`Commit`] or [`PushImage`] task (upstream reports them as `bgtask_*` events instead).
/// FAILURE `BgtaskNotFound` for an id the agent does not know (never started, forgotten an
/// hour after it ended, or started before the agent restarted).
pub struct GetBgtask;

/// Arguments of [`GetBgtask`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GetBgtaskArgs {
    /// As [`CommitReply::bgtask_id`] / [`PushImageReply::bgtask_id`].
    pub bgtask_id: String,
}

/// What a background task does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BgtaskKind {
    /// A [`Commit`].
    #[default]
    Commit,
    /// A [`PushImage`].
    Push,
    /// One image of a [`CheckAndPull`].
    Pull,
}

/// Where a background task is (upstream's `BgtaskStatus` names, lower case).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BgtaskStatus {
    /// Running.
    #[default]
    Ongoing,
    /// Ended well.
    Done,
    /// Ended with an error (`error_name`, `message`).
    Failed,
}

/// The reply of [`GetBgtask`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BgtaskState {
    /// The task's id.
    pub bgtask_id: String,
    /// What it does.
    pub kind: BgtaskKind,
    /// The image committed or pushed (its canonical name).
    pub image: String,
    /// The kernel committed (commits only).
    #[serde(default)]
    pub kernel: Option<String>,
    /// Where it is.
    pub status: BgtaskStatus,
    /// Bytes pushed so far, summed over the layers the engine reported (0 for a commit).
    #[serde(default)]
    pub current_bytes: u64,
    /// The bytes of those layers (0 until the engine reports one; layers the registry already
    /// has are not counted).
    #[serde(default)]
    pub total_bytes: u64,
    /// The committed image's id (`sha256:…`) once a commit is done.
    #[serde(default)]
    pub image_id: Option<String>,
    /// The error's FAILURE-style name when it failed (`RegistryAuthFailed`,
    /// `RegistryUnreachable`, `ImageNotFound`, `ContainerEngineUnavailable`,
    /// `ContainerEngineError`, `KernelNotFound`, `CommitInProgress`).
    #[serde(default)]
    pub error_name: Option<String>,
    /// Why it failed.
    #[serde(default)]
    pub message: Option<String>,
    /// When it started (Unix seconds).
    pub started_at: f64,
    /// When it ended (Unix seconds).
    #[serde(default)]
    pub finished_at: Option<f64>,
}

impl Method for GetBgtask {
    const NAME: &'static str = "get_bgtask";
    const PARAMS: &'static [&'static str] = &["bgtask_id"];
    type Args = GetBgtaskArgs;
    type Reply = BgtaskState;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::agent_api::kernel::ImageRef;

    #[test]
    fn canonical_names_join_the_non_empty_parts() {
        let r = |registry: &str, project: Option<&str>, name: &str| ImageRef {
            name: name.into(),
            project: project.map(Into::into),
            tag: "1".into(),
            registry: registry.into(),
            ..ImageRef::default()
        };
        assert_eq!(
            canonical(&r("127.0.0.1:5000", Some("team"), "img")),
            "127.0.0.1:5000/team/img:1"
        );
        assert_eq!(
            canonical(&r("127.0.0.1:5000", None, "team/img")),
            "127.0.0.1:5000/team/img:1"
        );
        assert_eq!(
            canonical(&r("cr.backend.ai", Some(""), "python")),
            "cr.backend.ai/python:1"
        );
    }
}

//! Installed images: the key `installed_image:<agent_id>` in the image database (3), a JSON
//! list of `{"canonical", "digest", "architecture"}` (`InstalledImageInfo`,
//! `ai/backend/common/data/image/types.py`), without a TTL —
//! `ValkeyImageClient.add_agent_installed_images`
//! (`ai/backend/common/clients/valkey_client/valkey_image/client.py`), which upstream's agent
//! calls on every heartbeat with what its last image scan found (`AbstractAgent.heartbeat`,
//! `DockerAgent.scan_images`). The manager's `AgentRepository.sync_installed_images` reads it.
//!
//! Which images: as `scan_images`, every tag (`repo:tag`, not `<none>`) of an image that has
//! labels and whose `ai.backend.kernelspec` (1 when absent) is within 1..=1; `digest` is the
//! image's id (`sha256:…`). `architecture` is this node's (`x86_64`, `aarch64`): the engine's
//! list does not say an image's own, and it runs only those of its node.

use serde::Serialize;

use super::conn::{Conns, Failure};
use crate::agent::backend::ImageSummary;

/// The image database (`ai.backend.common.defs.REDIS_IMAGE_DB`).
pub const DB: i64 = 3;

/// The label giving an image's kernel spec version (`LabelName.KERNEL_SPEC`).
const KERNEL_SPEC: &str = "ai.backend.kernelspec";

/// The key of agent `agent_id`'s list.
pub fn key(agent_id: &str) -> String {
    format!("installed_image:{agent_id}")
}

/// One entry of the list (`InstalledImageInfo`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct InstalledImage {
    /// The tag, `repo:tag` as the engine names it.
    pub canonical: String,
    /// The image's id, `sha256:…`.
    pub digest: String,
    /// `x86_64`, `aarch64`, … (upstream's alias of the engine's name).
    pub architecture: String,
}

/// This node's architecture as upstream names it (`DEFAULT_IMAGE_ARCH`,
/// `ai/backend/common/arch.py`).
pub fn architecture() -> &'static str {
    // Rust names them as upstream's aliases do (`x86_64`, `aarch64`, `x86`).
    std::env::consts::ARCH
}

/// The entries for `images`, ordered by tag.
pub fn installed(images: &[ImageSummary]) -> Vec<InstalledImage> {
    let mut out: Vec<InstalledImage> = images
        .iter()
        .filter(|i| {
            !i.labels.is_empty()
                && i.labels
                    .get(KERNEL_SPEC)
                    .map_or(Some(1), |v| v.trim().parse::<i64>().ok())
                    == Some(1)
        })
        .flat_map(|i| {
            i.tags
                .iter()
                .filter(|t| !t.ends_with("<none>"))
                .map(|t| InstalledImage {
                    canonical: t.clone(),
                    digest: i.id.clone(),
                    architecture: architecture().to_owned(),
                })
        })
        .collect();
    out.sort_by(|a, b| a.canonical.cmp(&b.canonical));
    out
}

/// Writes `images` as agent `agent_id`'s list; an empty list is not written (upstream's
/// `add_agent_installed_images` returns early too).
///
/// Errors: the [`Failure`] of the `SET`.
pub async fn write(
    conns: &mut Conns,
    agent_id: &str,
    images: &[InstalledImage],
) -> Result<(), Failure> {
    if images.is_empty() {
        return Ok(());
    }
    let json = serde_json::to_string(images).expect("strings always serialize");
    conns
        .cmd::<()>(DB, redis::cmd("SET").arg(key(agent_id)).arg(json))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn image(id: &str, tags: &[&str], labels: &[(&str, &str)]) -> ImageSummary {
        ImageSummary {
            id: id.into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
            size_bytes: 1,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
        }
    }

    #[test]
    fn labelled_images_of_kernel_spec_one_are_listed_per_tag() {
        let list = installed(&[
            image(
                "sha256:a",
                &["py:3", "cr.io/p/py:3"],
                &[("ai.backend.kernelspec", "1")],
            ),
            image("sha256:b", &["other:1"], &[("maintainer", "x")]),
            image("sha256:c", &["bare:1"], &[]),
            image("sha256:d", &["future:1"], &[("ai.backend.kernelspec", "2")]),
        ]);
        let tags: Vec<&str> = list.iter().map(|i| i.canonical.as_str()).collect();
        assert_eq!(tags, ["cr.io/p/py:3", "other:1", "py:3"]);
        assert_eq!(list[0].digest, "sha256:a");
        assert_eq!(
            serde_json::to_string(&list[1]).unwrap(),
            format!(
                r#"{{"canonical":"other:1","digest":"sha256:b","architecture":"{}"}}"#,
                architecture()
            )
        );
    }
}

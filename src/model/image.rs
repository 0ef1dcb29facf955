//! Images: removing them from an agent (`POST /v1/agents/{id}/images/purge`, admin) and saving
//! a session's container as one, pushed to a registry (`POST` and `GET
//! /v1/sessions/{id}/commit`).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `POST /v1/agents/{id}/images/purge` body.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PurgeImagesRequest {
    /// Images to remove from the agent: references (`repo:tag`, `host/repo:tag`) or ids
    /// (`sha256:…`); 1 to 100 of them.
    #[schema(min_items = 1, max_items = 100)]
    pub images: Vec<String>,
    /// Remove also images stopped containers use or that have other tags (`docker rmi
    /// --force`). An image a kernel of the agent runs is refused without it; with it only its
    /// tag goes while the kernel runs.
    #[serde(default)]
    pub force: bool,
    /// Keep the images' untagged parents (`docker rmi --no-prune`).
    #[serde(default)]
    pub noprune: bool,
}

/// One image's outcome in [`PurgedImages`].
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct PurgedImage {
    /// The image as the request named it.
    #[schema(required = true)]
    pub image: String,
    /// Whether it was removed.
    #[schema(required = true)]
    pub removed: bool,
    /// Why not: the agent's reason (an image a kernel uses names the kernels; a missing one
    /// says `no such local image`); null when removed.
    #[schema(value_type = Option<String>, required = true)]
    pub error: Option<String>,
}

/// `POST /v1/agents/{id}/images/purge`'s answer: one entry per image, in the request's order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct PurgedImages {
    /// The agent.
    #[schema(required = true)]
    pub agent_id: String,
    /// See [`PurgedImage`].
    #[schema(required = true)]
    pub images: Vec<PurgedImage>,
}

/// `POST /v1/sessions/{id}/commit` body.
#[derive(Clone, Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitRequest {
    /// The new image's reference, `[host[:port]/]repo[:tag]` (`latest` when no tag), e.g.
    /// `registry.example.com/team/trained:v2`. With `push`, `host` names the registry: a
    /// `[[registry]]` of the manager's config with that host gives the credentials.
    #[schema(max_length = 255)]
    pub image: String,
    /// Push the image to its registry once committed.
    #[serde(default)]
    pub push: bool,
}

/// Where a commit is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CommitStatus {
    /// The agent is saving the container as an image.
    #[default]
    Committing,
    /// The agent is pushing the image (`current_bytes` of `total_bytes`).
    Pushing,
    /// Committed (and pushed, when asked).
    Done,
    /// Ended with an error (`error_code`, `reason`).
    Failed,
}

impl CommitStatus {
    /// Whether it has ended (`done` or `failed`).
    pub fn ended(self) -> bool {
        matches!(self, CommitStatus::Done | CommitStatus::Failed)
    }
}

/// A session's commit (`POST` and `GET /v1/sessions/{id}/commit`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(default)]
pub struct Commit {
    /// The session.
    #[schema(required = true)]
    pub session_id: String,
    /// Its kernel, whose container is committed.
    #[schema(required = true)]
    pub kernel_id: String,
    /// The agent it runs on.
    #[schema(required = true)]
    pub agent_id: String,
    /// The new image's reference.
    #[schema(required = true)]
    pub image: String,
    /// Whether it is pushed.
    #[schema(required = true)]
    pub push: bool,
    /// Where it is.
    #[schema(required = true)]
    pub status: CommitStatus,
    /// The image's id (`sha256:…`) once committed.
    #[schema(value_type = Option<String>, required = true)]
    pub image_id: Option<String>,
    /// Bytes pushed so far (the layers the registry lacked).
    #[schema(required = true)]
    pub current_bytes: u64,
    /// The bytes of the layers being pushed (0 until the agent reports one).
    #[schema(required = true)]
    pub total_bytes: u64,
    /// When failed: the error code (`registry-auth-failed`, `registry-unreachable`,
    /// `image-not-found`, `agent-unavailable`, `agent-error`, `invalid-request`).
    #[schema(value_type = Option<String>, required = true)]
    pub error_code: Option<String>,
    /// When failed: why.
    #[schema(value_type = Option<String>, required = true)]
    pub reason: Option<String>,
    /// When it was asked for (Unix seconds).
    #[schema(required = true)]
    pub started_at: f64,
    /// When it ended (Unix seconds).
    #[schema(value_type = Option<f64>, required = true)]
    pub finished_at: Option<f64>,
}

/// Checks an image reference for a commit, Docker's grammar: `[host[:port]/]path[:tag]`, the
/// path's components lower-case `[a-z0-9]` separated by `.`, `_`, `__` or `-`, the tag
/// `[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}`; no digest; at most 255 characters.
///
/// Errors: what is wrong, naming the reference.
pub fn check_reference(reference: &str) -> Result<(), String> {
    let bad = |why: &str| Err(format!("image `{reference}`: {why}"));
    if reference.is_empty() || reference.len() > 255 {
        return bad("must be 1 to 255 characters");
    }
    if reference.contains('@') {
        return bad("a digest (`@sha256:…`) cannot name a new image");
    }
    let (name, tag) = match reference.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, Some(t)),
        _ => (reference, None),
    };
    if let Some(t) = tag {
        let ok = !t.is_empty()
            && t.len() <= 128
            && t.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
            && !t.starts_with(['.', '-']);
        if !ok {
            return bad("the tag must be 1-128 of A-Z a-z 0-9 _ . - not starting with . or -");
        }
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    let first = parts[0];
    if parts.len() > 1 && (first.contains('.') || first.contains(':') || first == "localhost") {
        let (host, port) = first.split_once(':').unwrap_or((first, ""));
        let host_ok = !host.is_empty()
            && host
                .split('.')
                .all(|l| !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        let port_ok =
            first.split_once(':').is_none() || (!port.is_empty() && port.parse::<u16>().is_ok());
        if !host_ok || !port_ok {
            return bad("the registry host must be `name[.name…][:port]`");
        }
        parts.remove(0);
    }
    let component_ok = |c: &str| {
        !c.is_empty()
            && c.starts_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
            && c.ends_with(|ch: char| ch.is_ascii_lowercase() || ch.is_ascii_digit())
            && c.chars().all(|ch| {
                ch.is_ascii_lowercase() || ch.is_ascii_digit() || matches!(ch, '.' | '_' | '-')
            })
            && !c.contains("..")
            && !c.contains("___")
    };
    if parts.is_empty() || !parts.iter().all(|c| component_ok(c)) {
        return bad(
            "the repository must be lower-case `a-z 0-9` parts separated by `/`, `.`, `_` or `-`",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_follow_dockers_grammar() {
        for ok in [
            "img",
            "img:v1",
            "team/img:1.0-rc_2",
            "127.0.0.1:5000/team/img:1",
            "registry.example.com/a/b/c",
            "localhost/img:latest",
            "my-reg.io/x__y.z",
        ] {
            assert_eq!(check_reference(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "Img:1",
            "img:",
            "img:-x",
            "/img",
            "team//img",
            "img@sha256:abcd",
            "127.0.0.1:x/img",
            "reg.io:5000/",
            "img:a/b",
            "-img",
        ] {
            assert!(check_reference(bad).is_err(), "{bad}");
        }
        assert!(check_reference(&"a".repeat(256)).is_err());
    }
}

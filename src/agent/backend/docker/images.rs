//! Image housekeeping on the Docker engine: the bodies of [`super::DockerBackend`]'s
//! `remove_image` (`DELETE /images/{name}`), `commit_container` (`POST /commit`) and
//! `push_image` (`POST /images/{name}/push`).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use bollard::auth::DockerCredentials;
use bollard::container::Config;
use bollard::errors::Error as DockerError;
use bollard::image::{CommitContainerOptions, PushImageOptions, RemoveImageOptions};
use bollard::Docker;
use futures::StreamExt;

use super::errors::{container_err, engine, optional, pull_err, status};
use crate::agent::backend::{labels, BackendError, ImageInfo, PullProgress, RegistryAuth};

/// How long a commit may take: the engine answers once the container's whole filesystem
/// diff is written as a layer (tens of GB for a trained model), far beyond the 120 s every
/// other request gets.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(3600);

/// The labels the agent puts on a kernel's container (see [`labels`]): the engine copies a
/// container's labels into an image committed from it, so the commit sets them back.
const KERNEL_LABELS: [&str; 9] = [
    labels::KERNEL_ID,
    labels::SESSION_ID,
    labels::AGENT_ID,
    labels::OWNER,
    labels::SERVICE_PORTS,
    labels::SESSION_TYPE,
    labels::RESTART_POLICY,
    labels::RESOURCE_SLOTS,
    labels::DEVICES,
];

/// `host:port/repo:tag` → (`host:port/repo`, `tag`); `latest` when the last path component
/// has no tag. A digest (`@sha256:…`) stays in the repository part (the engine refuses it).
pub(super) fn split_tag(reference: &str) -> (String, String) {
    let slash = reference.rfind('/').map_or(0, |i| i + 1);
    match reference[slash..].rfind(':') {
        Some(i) if !reference.contains('@') => (
            reference[..slash + i].to_owned(),
            reference[slash + i + 1..].to_owned(),
        ),
        _ => (reference.to_owned(), "latest".to_owned()),
    }
}

/// A Dockerfile word in double quotes (`LABEL "key"="value"`): `\` and `"` escaped.
fn quoted(word: &str) -> String {
    let mut out = String::with_capacity(word.len() + 2);
    out.push('"');
    for c in word.chars() {
        if matches!(c, '"' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

fn credentials(auth: Option<&RegistryAuth>) -> Option<DockerCredentials> {
    auth.map(|a| DockerCredentials {
        username: Some(a.username.clone()),
        password: Some(a.password.clone()),
        serveraddress: Some(a.server.clone()),
        ..DockerCredentials::default()
    })
}

/// See [`crate::agent::backend::ContainerBackend::remove_image`].
pub(super) async fn remove_image(
    docker: &Docker,
    reference: &str,
    force: bool,
    noprune: bool,
) -> Result<Vec<String>, BackendError> {
    let options = RemoveImageOptions { force, noprune };
    match docker.remove_image(reference, Some(options), None).await {
        Ok(items) => Ok(items
            .into_iter()
            .flat_map(|i| {
                [
                    i.untagged.map(|u| format!("Untagged: {u}")),
                    i.deleted.map(|d| format!("Deleted: {d}")),
                ]
            })
            .flatten()
            .collect()),
        Err(e) if status(&e) == Some(404) => Err(BackendError::ImageNotFound(format!(
            "{reference}: no such local image"
        ))),
        Err(DockerError::DockerResponseServerError {
            status_code: 409,
            message,
        }) => Err(BackendError::Engine(message)),
        Err(e) => Err(engine(e)),
    }
}

/// The `LABEL` changes of a commit: every kernel label the container carries set back to the
/// base image's value (empty when it had none), then `extra` (which wins).
fn label_changes(
    container: &HashMap<String, String>,
    base: &HashMap<String, String>,
    extra: &HashMap<String, String>,
) -> Option<String> {
    let mut set: BTreeMap<&str, &str> = BTreeMap::new();
    for key in KERNEL_LABELS.iter().filter(|k| container.contains_key(**k)) {
        set.insert(key, base.get(*key).map_or("", String::as_str));
    }
    for (k, v) in extra {
        set.insert(k, v);
    }
    let lines: Vec<String> = set
        .iter()
        .map(|(k, v)| format!("LABEL {}={}", quoted(k), quoted(v)))
        .collect();
    (!lines.is_empty()).then(|| lines.join("\n"))
}

/// See [`crate::agent::backend::ContainerBackend::commit_container`].
pub(super) async fn commit_container(
    docker: &Docker,
    id: &str,
    reference: &str,
    extra: &HashMap<String, String>,
) -> Result<ImageInfo, BackendError> {
    let c = docker
        .inspect_container(id, None)
        .await
        .map_err(container_err(id))?;
    let container_labels = c
        .config
        .as_ref()
        .and_then(|c| c.labels.clone())
        .unwrap_or_default();
    // The base image may be gone (purged with `force` while the kernel ran): its labels and
    // command are then unknown, and the container's stay.
    let base = match c.image.as_deref().filter(|i| !i.is_empty()) {
        Some(image) => optional(docker.inspect_image(image).await).map_err(engine)?,
        None => None,
    };
    let base_config = base.and_then(|i| i.config).unwrap_or_default();
    let base_labels = base_config.labels.unwrap_or_default();
    let (repo, tag) = split_tag(reference);
    let options = CommitContainerOptions {
        container: id.to_owned(),
        repo,
        tag,
        comment: String::new(),
        author: String::new(),
        pause: true,
        changes: label_changes(&container_labels, &base_labels, extra),
    };
    let config = Config::<String> {
        cmd: base_config.cmd,
        ..Default::default()
    };
    let committed = docker
        .clone()
        .with_timeout(COMMIT_TIMEOUT)
        .commit_container(options, config)
        .await
        .map_err(|e| match status(&e) {
            Some(404) => BackendError::ContainerNotFound(id.to_owned()),
            _ => engine(e),
        })?;
    let image = optional(docker.inspect_image(reference).await).map_err(engine)?;
    Ok(ImageInfo {
        id: image
            .as_ref()
            .and_then(|i| i.id.clone())
            .or(committed.id)
            .unwrap_or_default(),
        reference: reference.to_owned(),
        labels: image
            .and_then(|i| i.config)
            .and_then(|c| c.labels)
            .unwrap_or_default(),
    })
}

/// See [`crate::agent::backend::ContainerBackend::push_image`].
pub(super) async fn push_image(
    docker: &Docker,
    reference: &str,
    auth: Option<&RegistryAuth>,
    progress: &(dyn Fn(PullProgress) + Send + Sync),
) -> Result<(), BackendError> {
    let (repo, tag) = split_tag(reference);
    let options = PushImageOptions { tag: tag.as_str() };
    let mut push = docker.push_image(&repo, Some(options), credentials(auth));
    while let Some(item) = push.next().await {
        let info = match item {
            Ok(info) => info,
            Err(e) if status(&e) == Some(404) => {
                return Err(BackendError::ImageNotFound(format!(
                    "{reference}: no such local image"
                )))
            }
            Err(e) => return Err(pull_err(reference, e)),
        };
        if let Some(error) = info.error {
            return Err(pull_err(
                reference,
                DockerError::DockerStreamError { error },
            ));
        }
        progress(PullProgress {
            layer: None,
            status: info.status.unwrap_or_default(),
            current: info.progress_detail.as_ref().and_then(|d| d.current),
            total: info.progress_detail.and_then(|d| d.total),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_split_into_repository_and_tag() {
        let split = |r: &str| {
            let (a, b) = split_tag(r);
            (a, b)
        };
        assert_eq!(
            split("127.0.0.1:5000/team/img:1"),
            ("127.0.0.1:5000/team/img".into(), "1".into())
        );
        assert_eq!(
            split("127.0.0.1:5000/team/img"),
            ("127.0.0.1:5000/team/img".into(), "latest".into())
        );
        assert_eq!(split("img"), ("img".into(), "latest".into()));
        assert_eq!(split("img:v2"), ("img".into(), "v2".into()));
        assert_eq!(
            split("r/img@sha256:ab"),
            ("r/img@sha256:ab".into(), "latest".into())
        );
    }

    #[test]
    fn kernel_labels_are_set_back_and_extra_labels_added() {
        let container: HashMap<String, String> = [
            (labels::KERNEL_ID, "k1"),
            (labels::SERVICE_PORTS, "[]"),
            ("team", "a"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let base = HashMap::from([(labels::SERVICE_PORTS.to_owned(), "web:http:8080".to_owned())]);
        let extra = HashMap::from([("note".to_owned(), r#"say "hi" \o/"#.to_owned())]);
        let changes = label_changes(&container, &base, &extra).unwrap();
        assert_eq!(
            changes,
            [
                r#"LABEL "ai.backend.kernel-id"="""#,
                r#"LABEL "ai.backend.service-ports"="web:http:8080""#,
                r#"LABEL "note"="say \"hi\" \\o/""#,
            ]
            .join("\n")
        );
        assert_eq!(label_changes(&HashMap::new(), &base, &HashMap::new()), None);
    }
}

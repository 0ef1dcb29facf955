//! What the engine says, read into the backend's terms: image references, published ports,
//! exit codes in container listings.

use std::collections::HashSet;

use bollard::models::PortMap;

use crate::agent::backend::{ImageSummary, PortMapping};

/// `reference` with `:latest` when it names neither a tag nor a digest (the engine would
/// otherwise pull every tag).
pub(super) fn with_tag(reference: &str) -> String {
    let last = reference.rsplit('/').next().unwrap_or(reference);
    if reference.contains('@') || last.contains(':') {
        reference.to_owned()
    } else {
        format!("{reference}:latest")
    }
}

/// An entry of the engine's image list in the backend's terms: Docker's placeholder
/// `<none>:<none>` (an untagged image) dropped from the tags, a negative size read as 0.
pub(super) fn summary(image: bollard::models::ImageSummary) -> ImageSummary {
    ImageSummary {
        id: image.id,
        tags: image
            .repo_tags
            .into_iter()
            .filter(|t| t != "<none>:<none>")
            .collect(),
        size_bytes: u64::try_from(image.size).unwrap_or(0),
        labels: image.labels,
    }
}

/// Published TCP ports from the engine's port map, one per (container, host) port pair.
pub(super) fn port_mappings(ports: Option<PortMap>) -> Vec<PortMapping> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for (key, bindings) in ports.unwrap_or_default() {
        let Some(container_port) = key.strip_suffix("/tcp").and_then(|p| p.parse().ok()) else {
            continue;
        };
        for b in bindings.unwrap_or_default() {
            if let Some(host_port) = b.host_port.and_then(|p| p.parse().ok()) {
                if seen.insert((container_port, host_port)) {
                    out.push(PortMapping {
                        container_port,
                        host_port,
                    });
                }
            }
        }
    }
    out.sort_by_key(|p| (p.container_port, p.host_port));
    out
}

/// The exit code in a container list's status text (`Exited (137) 5 seconds ago`).
pub(super) fn listed_exit_code(status: &str) -> Option<i64> {
    status
        .strip_prefix("Exited (")?
        .split(')')
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use bollard::models::PortBinding;

    use super::*;

    #[test]
    fn tags_and_exit_codes() {
        assert_eq!(with_tag("busybox"), "busybox:latest");
        assert_eq!(with_tag("localhost:5000/a/b"), "localhost:5000/a/b:latest");
        assert_eq!(with_tag("a/b:1.0"), "a/b:1.0");
        assert_eq!(with_tag("a@sha256:00"), "a@sha256:00");
        assert_eq!(listed_exit_code("Exited (137) 5 seconds ago"), Some(137));
        assert_eq!(listed_exit_code("Up 3 minutes"), None);
    }

    #[test]
    fn untagged_images_have_no_tags() {
        let listed = |tags: &[&str], size| bollard::models::ImageSummary {
            id: "sha256:ab".into(),
            repo_tags: tags.iter().map(|t| t.to_string()).collect(),
            size,
            ..Default::default()
        };
        assert_eq!(
            summary(listed(&["python:3.12", "py:latest"], 1000)),
            ImageSummary {
                id: "sha256:ab".into(),
                tags: vec!["python:3.12".into(), "py:latest".into()],
                size_bytes: 1000,
                labels: Default::default(),
            }
        );
        let none = summary(listed(&["<none>:<none>"], -1));
        assert!(none.tags.is_empty() && none.size_bytes == 0, "{none:?}");
    }

    #[test]
    fn ports_are_parsed_and_deduplicated() {
        let binding = |port: &str| PortBinding {
            host_ip: Some("0.0.0.0".into()),
            host_port: Some(port.into()),
        };
        let map = PortMap::from([
            (
                "8080/tcp".into(),
                Some(vec![binding("30000"), binding("30000")]),
            ),
            ("53/udp".into(), Some(vec![binding("30001")])),
            ("22/tcp".into(), None),
        ]);
        assert_eq!(
            port_mappings(Some(map)),
            vec![PortMapping {
                container_port: 8080,
                host_port: 30000
            }]
        );
    }
}

//! Which kernels get the runner: Backend.AI's image labels, the image's libc, and
//! `[kernel-runner] mode` (`docs/kernel-runner.md`, 6.1 B.1).

use std::collections::HashMap;

use futures::StreamExt;

use crate::agent::backend::{ContainerBackend, ContainerSpec};
use crate::config::RunnerMode;

/// `ai.backend.kernelspec`: the image is a Backend.AI kernel image.
pub const KERNELSPEC: &str = "ai.backend.kernelspec";
/// `ai.backend.runtime-type`: the runner class (`python`, `app`, …).
pub const RUNTIME_TYPE: &str = "ai.backend.runtime-type";
/// `ai.backend.base-distro`: the image's distro (else upstream probes the libc).
pub const BASE_DISTRO: &str = "ai.backend.base-distro";
/// `ai.backend.envs.corecount`: variables set to the kernel's core count.
pub const CORECOUNT: &str = "ai.backend.envs.corecount";

/// The runtime types Backend.AI 26.9.6's runner has (`lang_map` in
/// `src/ai/backend/kernel/__init__.py`): any other makes it exit at start.
pub const RUNTIME_TYPES: &[&str] = &["python", "app", "vendor.aws_polly", "vendor.h2o"];

/// What a kernel gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gate {
    /// The runner, with the image's runtime type and path.
    Runner {
        /// `ai.backend.runtime-type` (`app` when absent, as upstream for unlabelled images).
        runtime_type: String,
        /// `ai.backend.runtime-path`, if any.
        runtime_path: Option<String>,
    },
    /// The agent's process path (`docker exec` per run).
    Process,
    /// `mode = require` and the image cannot run it: why.
    Refused(String),
}

/// Whether a labelled image is known not to be glibc by its labels alone (Alpine is musl).
fn musl_by_label(labels: &HashMap<String, String>) -> bool {
    labels
        .get(BASE_DISTRO)
        .is_some_and(|d| d.starts_with("alpine"))
}

/// The gate for an image with `labels`, under `mode`, with or without a located runner, and
/// what a libc probe said (`None`: not probed).
pub fn decide(
    image: &str,
    labels: &HashMap<String, String>,
    mode: RunnerMode,
    krunner: bool,
    glibc: Option<bool>,
) -> Gate {
    let labelled = labels.contains_key(KERNELSPEC) || labels.contains_key(RUNTIME_TYPE);
    let runtime_type = labels
        .get(RUNTIME_TYPE)
        .cloned()
        .unwrap_or_else(|| "app".into());
    let why_not = if !krunner {
        Some("no kernel runner is provisioned ([kernel-runner] dir; run `just krunner`)".to_owned())
    } else if musl_by_label(labels) || glibc == Some(false) {
        Some(format!(
            "image `{image}` has no glibc, which the static-gnu kernel runner needs"
        ))
    } else if !RUNTIME_TYPES.contains(&runtime_type.as_str()) {
        Some(format!(
            "image `{image}`'s runtime type `{runtime_type}` is not one the kernel runner has ({})",
            RUNTIME_TYPES.join(", ")
        ))
    } else {
        None
    };
    let runner = || Gate::Runner {
        runtime_type: runtime_type.clone(),
        runtime_path: labels
            .get(crate::agent::backend::labels::RUNTIME_PATH)
            .cloned(),
    };
    match (mode, why_not) {
        (RunnerMode::Off, _) => Gate::Process,
        (RunnerMode::Require, Some(why)) => {
            Gate::Refused(format!("[kernel-runner] mode = require, but {why}"))
        }
        (RunnerMode::Require, None) => runner(),
        (RunnerMode::Auto, None) if labelled => runner(),
        (RunnerMode::Auto, _) => Gate::Process,
    }
}

/// Whether the probe is worth a container: the image could get the runner.
pub fn worth_probing(labels: &HashMap<String, String>, mode: RunnerMode, krunner: bool) -> bool {
    let labelled = labels.contains_key(KERNELSPEC) || labels.contains_key(RUNTIME_TYPE);
    krunner
        && !musl_by_label(labels)
        && match mode {
            RunnerMode::Off => false,
            RunnerMode::Auto => labelled,
            RunnerMode::Require => true,
        }
}

/// glibc's dynamic loader and libc where glibc distros put them (upstream runs `ldd` in a
/// throwaway container, `resolve_image_distro` in `src/ai/backend/agent/docker/agent.py`;
/// looking for the files in a created, never started, container needs nothing of the image).
const GLIBC_FILES: &[&str] = &[
    "/lib64/ld-linux-x86-64.so.2",
    "/lib/ld-linux-aarch64.so.1",
    "/lib/x86_64-linux-gnu/libc.so.6",
    "/lib/aarch64-linux-gnu/libc.so.6",
    "/usr/lib/x86_64-linux-gnu/libc.so.6",
    "/usr/lib64/libc.so.6",
    "/lib64/libc.so.6",
];

/// Whether image `image_id` has glibc: a created (never started) container of it is asked for
/// glibc's files, then removed.
///
/// Errors: the engine's.
pub async fn probe_glibc(
    backend: &dyn ContainerBackend,
    image_id: &str,
) -> Result<bool, crate::agent::backend::BackendError> {
    let spec = ContainerSpec {
        name: format!("kv-libc-probe-{}", uuid::Uuid::new_v4().simple()),
        image: image_id.to_owned(),
        cmd: Some(vec!["/nonexistent".into()]),
        ..Default::default()
    };
    let id = backend.create_container(&spec).await?;
    let mut found = false;
    for path in GLIBC_FILES {
        let mut archive = backend.archive_get(&id, path);
        if let Some(Ok(_)) = archive.next().await {
            found = true;
            break;
        }
    }
    backend.remove_container(&id).await?;
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn labelled_glibc_images_get_the_runner_in_auto() {
        let l = labels(&[
            (KERNELSPEC, "1"),
            (RUNTIME_TYPE, "python"),
            ("ai.backend.runtime-path", "/usr/bin/python3"),
        ]);
        assert_eq!(
            decide("py", &l, RunnerMode::Auto, true, Some(true)),
            Gate::Runner {
                runtime_type: "python".into(),
                runtime_path: Some("/usr/bin/python3".into())
            }
        );
        // Without a runner, a libc, or labels: the process path.
        assert_eq!(
            decide("py", &l, RunnerMode::Auto, false, Some(true)),
            Gate::Process
        );
        assert_eq!(
            decide("py", &l, RunnerMode::Auto, true, Some(false)),
            Gate::Process
        );
        assert_eq!(
            decide("bb", &labels(&[]), RunnerMode::Auto, true, Some(false)),
            Gate::Process
        );
        assert_eq!(
            decide("py", &l, RunnerMode::Off, true, Some(true)),
            Gate::Process
        );
    }

    #[test]
    fn require_refuses_by_name() {
        let g = decide(
            "busybox",
            &labels(&[]),
            RunnerMode::Require,
            true,
            Some(false),
        );
        assert!(
            matches!(&g, Gate::Refused(w) if w.contains("busybox") && w.contains("glibc")),
            "{g:?}"
        );
        let g = decide(
            "x",
            &labels(&[(RUNTIME_TYPE, "julia")]),
            RunnerMode::Require,
            true,
            Some(true),
        );
        assert!(
            matches!(&g, Gate::Refused(w) if w.contains("julia")),
            "{g:?}"
        );
        let g = decide("x", &labels(&[]), RunnerMode::Require, false, None);
        assert!(
            matches!(&g, Gate::Refused(w) if w.contains("just krunner")),
            "{g:?}"
        );
        // An unlabelled glibc image runs the `app` runner, as upstream.
        assert_eq!(
            decide("x", &labels(&[]), RunnerMode::Require, true, Some(true)),
            Gate::Runner {
                runtime_type: "app".into(),
                runtime_path: None
            }
        );
    }
}

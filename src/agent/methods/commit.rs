//! Saving work (the typed contract of [`crate::rpc::agent_api::images`]): `commit`,
//! `get_commit_status`, `push_image` as upstream answers them (Backend.AI 26.x
//! `AgentRPCServer` and `DockerAgent`), and kernelvisor's `get_bgtask`.
//!
//! - `commit(kernel_id, subdir, canonical=…, extra_labels=…)` answers `{"bgtask_id", "kernel",
//!   "path": nil}` at once and saves the kernel's container as the local image `canonical` in
//!   the background ([`ContainerBackend::commit_container`]: bind mounts such as
//!   `/home/work` are not part of it). A second commit of the same kernel and `subdir` while
//!   one runs gets its own task, which fails at once with `CommitInProgress` (upstream's file
//!   lock does the same). `filename` (upstream's export to a `.tar.gz`) answers FAILURE
//!   `NotImplemented`; no `canonical` answers FAILURE `InvalidArgument` (upstream would make an
//!   unnamed image nobody can use).
//! - `get_commit_status(kernel_id, subdir)`: `{"kernel", "status": "ongoing" | "ready"}`.
//! - `push_image(image_ref, registry_conf)` answers `{"bgtask_id", "canonical"}` at once and
//!   pushes in the background with `registry_conf`'s user name and password (when it has
//!   both; anonymously otherwise; the password never logged); a local image (`is_local`) is
//!   not pushed, its task done at once, as upstream.
//! - `get_bgtask(bgtask_id)`: the task's [`BgtaskState`] (status, bytes pushed, error), or
//!   FAILURE `BgtaskNotFound`.
//!
//! FAILURE names of the calls themselves: `KernelNotFound`, `KernelNotRunning` (no
//! container), `ContainerEngineUnavailable`, `TypeError`. A task's own failure is in its
//! state: `error_name` `RegistryAuthFailed`, `RegistryUnreachable`, `ImageNotFound`,
//! `ContainerEngineError`, `ContainerEngineUnavailable`, `CommitInProgress`.

use std::collections::HashMap;
use std::sync::Arc;

use super::args::lookup;
use super::{Ctx, Table};
use crate::agent::backend::{ContainerBackend, PullProgress, RegistryAuth};
use crate::agent::bgtasks::Bgtasks;
use crate::agent::kernel::KernelError;
use crate::agent::pulls::registry_auth;
use crate::rpc::agent_api::images as api;
use crate::rpc::{Dispatcher, ErrorMeta, Failure};

/// The FAILURE of a second commit of one kernel and `subdir` while the first runs (in the
/// task's state).
pub const COMMIT_IN_PROGRESS: &str = "CommitInProgress";

fn fail(tasks: &Bgtasks, id: &str, e: KernelError) {
    tasks.failed(id, e.name(), e.to_string());
}

/// Runs a commit task to its end.
async fn run_commit(
    tasks: Bgtasks,
    backend: Arc<dyn ContainerBackend>,
    id: String,
    container_id: String,
    canonical: String,
    labels: HashMap<String, String>,
) {
    match backend
        .commit_container(&container_id, &canonical, &labels)
        .await
    {
        Ok(image) => {
            tracing::info!(bgtask = %id, image = %canonical, image_id = %image.id, "commit done");
            tasks.done(&id, Some(image.id));
        }
        Err(e) => {
            tracing::warn!(bgtask = %id, image = %canonical, error = %e, "commit failed");
            fail(&tasks, &id, e.into());
        }
    }
}

/// Runs a push task to its end.
async fn run_push(
    tasks: Bgtasks,
    backend: Arc<dyn ContainerBackend>,
    id: String,
    canonical: String,
    auth: Option<RegistryAuth>,
) {
    let t = tasks.clone();
    let task_id = id.clone();
    let progress = move |p: PullProgress| t.progress(&task_id, &p);
    match backend
        .push_image(&canonical, auth.as_ref(), &progress)
        .await
    {
        Ok(()) => {
            tracing::info!(bgtask = %id, image = %canonical, "push done");
            tasks.done(&id, None);
        }
        Err(e) => {
            tracing::warn!(bgtask = %id, image = %canonical, error = %e, "push failed");
            fail(&tasks, &id, e.into());
        }
    }
}

/// What the commit methods share: the agent's [`Ctx`] and one background-task table.
#[derive(Clone)]
struct Commits {
    cx: Ctx,
    tasks: Bgtasks,
}

/// Registers `commit`, `get_commit_status`, `push_image` and `get_bgtask` on `dispatcher`,
/// over the agent's task table (which `check_and_pull` and the `valkey` child share).
pub(crate) fn register(dispatcher: &mut Dispatcher, cx: &Ctx) {
    let state = Commits {
        cx: cx.clone(),
        tasks: cx.bgtasks.clone(),
    };
    Table::new(dispatcher, state)
        .method::<api::Commit, _, _>(commit)
        .method::<api::GetCommitStatus, _, _>(get_commit_status)
        .method::<api::PushImage, _, _>(push_image)
        .method::<api::GetBgtask, _, _>(get_bgtask);
}

/// `commit(kernel_id, subdir, canonical=…, extra_labels=…)`: see the module's doc.
async fn commit(s: Commits, args: api::CommitArgs) -> Result<api::CommitReply, ErrorMeta> {
    let (c, t) = (&s.cx, s.tasks.clone());
    if let Some(f) = &args.filename {
        return Err(ErrorMeta::failure(
            Failure::NotImplemented,
            format!("commit(filename={f:?}): exporting an image to a file is not implemented by this agent; commit with `canonical` (and push_image)"),
        ));
    }
    let Some(canonical) = args.canonical.clone().filter(|c| !c.trim().is_empty()) else {
        return Err(ErrorMeta::failure(
            Failure::InvalidArgument,
            "commit(): `canonical`, the new image's name (host/repo:tag), is required",
        ));
    };
    c.engine.check()?;
    let info = lookup(&c.registry, &args.kernel_id).await?;
    let Some(container_id) = info.container_id.clone() else {
        return Err(
            KernelError::NotRunning(args.kernel_id.clone(), info.status.as_str()).to_meta(),
        );
    };
    let id = match t.start_commit(
        &canonical,
        &args.kernel_id,
        &args.subdir,
        COMMIT_IN_PROGRESS,
    ) {
        Err(id) => id,
        Ok(id) => {
            tracing::info!(kernel = %args.kernel_id, image = %canonical, bgtask = %id, "committing the kernel's container");
            let labels = args.extra_labels.clone().unwrap_or_default();
            tokio::spawn(run_commit(
                t,
                c.backend.clone(),
                id.clone(),
                container_id,
                canonical,
                labels.into_iter().collect(),
            ));
            id
        }
    };
    Ok(api::CommitReply {
        bgtask_id: id,
        kernel: args.kernel_id,
        path: None,
    })
}

/// `get_commit_status(kernel_id, subdir)` → `{"kernel", "status": "ongoing" | "ready"}`.
async fn get_commit_status(
    s: Commits,
    args: api::GetCommitStatusArgs,
) -> Result<api::CommitStatusReply, ErrorMeta> {
    // Upstream looks the kernel up first (an unknown one is an error).
    lookup(&s.cx.registry, &args.kernel_id).await?;
    let status = if s.tasks.commit_ongoing(&args.kernel_id, &args.subdir) {
        api::COMMIT_ONGOING
    } else {
        api::COMMIT_READY
    };
    Ok(api::CommitStatusReply {
        kernel: args.kernel_id,
        status: status.to_owned(),
    })
}

/// `push_image(image_ref, registry_conf)` → `{"bgtask_id", "canonical"}`, pushing in the
/// background.
async fn push_image(
    s: Commits,
    args: api::PushImageArgs,
) -> Result<api::PushImageReply, ErrorMeta> {
    let (c, t) = (&s.cx, s.tasks.clone());
    let canonical = api::canonical(&args.image_ref);
    if !args.image_ref.is_local {
        c.engine.check()?;
    }
    let id = t.start_push(&canonical);
    if args.image_ref.is_local {
        t.done(&id, None);
    } else {
        let auth = registry_auth(&canonical, &args.registry_conf);
        tracing::info!(image = %canonical, registry = %args.registry_conf.name, authenticated = auth.is_some(), bgtask = %id, "pushing an image");
        tokio::spawn(run_push(
            t,
            c.backend.clone(),
            id.clone(),
            canonical.clone(),
            auth,
        ));
    }
    Ok(api::PushImageReply {
        bgtask_id: id,
        canonical,
    })
}

/// `get_bgtask(bgtask_id)` → the task's state, or FAILURE `BgtaskNotFound`.
async fn get_bgtask(s: Commits, args: api::GetBgtaskArgs) -> Result<api::BgtaskState, ErrorMeta> {
    s.tasks.get(&args.bgtask_id).ok_or_else(|| {
        ErrorMeta::failure(
            Failure::BgtaskNotFound,
            format!(
                "no background task {} on this agent (unknown, ended over an hour ago, or started before the agent restarted)",
                args.bgtask_id
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rpc::agent_api::kernel::ImageRegistry;

    #[test]
    fn credentials_need_a_user_and_a_password() {
        let reg = |u: Option<&str>, p: Option<&str>| ImageRegistry {
            name: "team".into(),
            url: "http://127.0.0.1:5000".into(),
            username: u.map(Into::into),
            password: p.map(Into::into),
        };
        let a = registry_auth("127.0.0.1:5000/team/img:1", &reg(Some("kv"), Some("pw"))).unwrap();
        assert_eq!(
            (a.username.as_str(), a.server.as_str()),
            ("kv", "127.0.0.1:5000")
        );
        assert!(registry_auth("r.io/x:1", &reg(Some("kv"), None)).is_none());
        assert!(registry_auth("r.io/x:1", &reg(Some(""), Some("pw"))).is_none());
        assert_eq!(
            crate::rpc::agent_api::kernel::registry_host("localhost/x"),
            "localhost"
        );
    }
}

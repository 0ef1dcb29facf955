//! Session commits (`POST` / `GET /v1/sessions/{id}/commit`): the session's container saved as
//! an image by its agent (`commit`), then, when asked, pushed to the image's registry
//! (`push_image`) with the credentials of the manager's `[[registry]]` for the image's host,
//! as Backend.AI's manager does it (`commit_session`: `commit`, wait for its background task,
//! `push_image`, wait again). The agent's tasks are followed with kernelvisor's `get_bgtask`
//! (upstream's manager waits for `bgtask_*` events instead), which also gives the pushed bytes.
//!
//! One commit per session at a time; the last one of each session is kept ([`Commits`]) in
//! this manager's memory: another replica, or this one after a restart, does not know it
//! (`commit-not-found`), and a commit whose manager stopped is not followed further (the agent
//! finishes what it was doing).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use actix::Addr;

use super::calls::{agent_error, call_method, call_method_kw};
use super::error::ManagerError;
use super::image_registries::{registry_host, ImageRegistries};
use super::metrics::ManagerMetrics;
use super::pool::{AgentCallError, AgentPool};
use crate::model::image::{Commit, CommitStatus};
use crate::rpc::agent_api::images::{
    BgtaskState, BgtaskStatus, CommitArgs, GetBgtask, GetBgtaskArgs, PushImage, PushImageArgs,
};
use crate::rpc::agent_api::kernel::ImageRef;
use crate::rpc::{CallError, ErrorMeta};

/// Label the committed image gets: the session it was saved from.
pub const LABEL_SESSION: &str = "ai.kernelvisor.committed-from.session";
/// Label the committed image gets: the image the session ran.
pub const LABEL_BASE_IMAGE: &str = "ai.kernelvisor.committed-from.image";

/// How long one call to the agent may take (each answers at once; the work is in the
/// background).
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// Between two `get_bgtask` polls.
const POLL_INTERVAL: Duration = Duration::from_millis(500);
/// The agent may not answer this long in a row before the commit is `failed`
/// (`agent-unavailable`).
const UNREACHABLE_LIMIT: Duration = Duration::from_secs(120);
/// The most one commit or push task may take.
const TASK_LIMIT: Duration = Duration::from_secs(6 * 3600);
/// Ended commits older than this are forgotten when another begins.
const RETENTION: Duration = Duration::from_secs(24 * 3600);

/// The current time in Unix seconds.
pub fn now_secs() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

/// The last commit of each session (see the module doc); cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct Commits {
    inner: Arc<Mutex<HashMap<String, Commit>>>,
}

impl Commits {
    fn table(&self) -> MutexGuard<'_, HashMap<String, Commit>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The session's last commit.
    pub fn get(&self, session_id: &str) -> Option<Commit> {
        self.table().get(session_id).cloned()
    }

    /// Records `commit` as its session's, replacing an ended one.
    ///
    /// Errors: 409 `commit-in-progress` while one of the session has not ended.
    pub fn begin(&self, commit: Commit) -> Result<(), ManagerError> {
        let mut table = self.table();
        let horizon = now_secs() - RETENTION.as_secs_f64();
        table.retain(|_, c| c.finished_at.is_none_or(|t| t >= horizon));
        if let Some(c) = table.get(&commit.session_id).filter(|c| !c.status.ended()) {
            return Err(ManagerError::CommitInProgress(format!(
                "session {} is already {} image {}",
                c.session_id,
                match c.status {
                    CommitStatus::Pushing => "pushing",
                    _ => "committing to",
                },
                c.image
            )));
        }
        table.insert(commit.session_id.clone(), commit);
        Ok(())
    }

    fn update(&self, session_id: &str, f: impl FnOnce(&mut Commit)) {
        if let Some(c) = self.table().get_mut(session_id) {
            f(c);
        }
    }

    /// Ends the session's commit as `failed` with `e`'s code and message.
    pub fn fail(&self, session_id: &str, e: &ManagerError) {
        tracing::warn!(session = %session_id, code = e.code(), error = %e, "commit failed");
        self.update(session_id, |c| {
            c.status = CommitStatus::Failed;
            c.error_code = Some(e.code().to_owned());
            c.reason = Some(e.to_string());
            c.finished_at = Some(now_secs());
        });
    }
}

/// What a commit needs from the manager.
#[derive(Clone)]
pub struct CommitContext {
    /// The agent connections.
    pub pool: Addr<AgentPool>,
    /// For the calls' metrics.
    pub metrics: Arc<ManagerMetrics>,
    /// The registries' credentials.
    pub registries: Arc<ImageRegistries>,
    /// Where the commits are kept.
    pub commits: Commits,
}

/// `agent_error` of a FAILURE `name` / `message` the agent reported for a task.
fn task_error(agent_id: &str, state: &BgtaskState) -> ManagerError {
    let e = AgentCallError::Call {
        agent_id: agent_id.to_owned(),
        source: CallError::Failure(ErrorMeta::new(
            state
                .error_name
                .clone()
                .unwrap_or_else(|| crate::rpc::Failure::BgtaskFailed.into()),
            state.message.clone().unwrap_or_default(),
        )),
    };
    agent_error(&e)
}

/// The `ImageRef` upstream's manager sends for `reference`: the registry its host, no project,
/// the rest of the path as the name (so its canonical name is `reference` with a tag).
pub fn image_ref(reference: &str) -> ImageRef {
    let host = registry_host(reference);
    let path = reference
        .strip_prefix(&format!("{host}/"))
        .unwrap_or(reference);
    let (name, tag) = match path.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, t),
        _ => (path, "latest"),
    };
    ImageRef {
        name: name.to_owned(),
        project: None,
        tag: tag.to_owned(),
        registry: host,
        architecture: std::env::consts::ARCH.to_owned(),
        is_local: false,
    }
}

/// Starts a commit of `kernel_id`'s container on `agent_id` as `commit.image` (`subdir`: the
/// owner's access key); returns the agent's task id.
///
/// Errors: the agent's refusal as the API's error (`agent-unavailable`, `agent-error`,
/// `session-not-running`…).
pub async fn start(
    ctx: &CommitContext,
    commit: &Commit,
    subdir: &str,
    base_image: &str,
) -> Result<String, ManagerError> {
    let args = CommitArgs {
        kernel_id: commit.kernel_id.clone(),
        subdir: subdir.to_owned(),
        canonical: Some(commit.image.clone()),
        filename: None,
        extra_labels: Some(BTreeMap::from([
            (LABEL_SESSION.to_owned(), commit.session_id.clone()),
            (LABEL_BASE_IMAGE.to_owned(), base_image.to_owned()),
        ])),
    };
    let reply = call_method_kw::<crate::rpc::agent_api::images::Commit>(
        &ctx.pool,
        &ctx.metrics,
        &commit.agent_id,
        &args,
        CALL_TIMEOUT,
    )
    .await
    .map_err(|e| agent_error(&e))?;
    Ok(reply.bgtask_id)
}

/// Follows the commit task `bgtask_id`, then pushes when asked; records every step in
/// `ctx.commits` until the commit ends.
pub async fn follow(ctx: CommitContext, commit: Commit, bgtask_id: String) {
    let session = commit.session_id.clone();
    let result = async {
        let done = wait(&ctx, &commit, &bgtask_id).await?;
        ctx.commits.update(&session, |c| c.image_id = done.image_id.clone());
        if commit.push {
            let registry = ctx.registries.for_image(&commit.image);
            tracing::info!(%session, image = %commit.image, registry = %registry.name, "pushing the committed image");
            ctx.commits
                .update(&session, |c| c.status = CommitStatus::Pushing);
            let args = PushImageArgs {
                image_ref: image_ref(&commit.image),
                registry_conf: registry,
            };
            let reply = call_method::<PushImage>(
                &ctx.pool,
                &ctx.metrics,
                &commit.agent_id,
                &args,
                CALL_TIMEOUT,
            )
            .await
            .map_err(|e| agent_error(&e))?;
            wait(&ctx, &commit, &reply.bgtask_id).await?;
        }
        Ok::<(), ManagerError>(())
    }
    .await;
    match result {
        Ok(()) => {
            tracing::info!(%session, image = %commit.image, pushed = commit.push, "commit done");
            ctx.commits.update(&session, |c| {
                c.status = CommitStatus::Done;
                c.finished_at = Some(now_secs());
            });
        }
        Err(e) => ctx.commits.fail(&session, &e),
    }
}

/// Polls the agent's task until it ends, copying its bytes into the commit; its last state
/// when done.
///
/// Errors: the task's failure as the API's error; `agent-unavailable` when the agent did not
/// answer for [`UNREACHABLE_LIMIT`]; `agent-error` when it lost the task (it restarted) or the
/// task outlasted [`TASK_LIMIT`].
async fn wait(
    ctx: &CommitContext,
    commit: &Commit,
    bgtask_id: &str,
) -> Result<BgtaskState, ManagerError> {
    let started = Instant::now();
    let mut last_answer = Instant::now();
    let args = GetBgtaskArgs {
        bgtask_id: bgtask_id.to_owned(),
    };
    loop {
        match call_method::<GetBgtask>(
            &ctx.pool,
            &ctx.metrics,
            &commit.agent_id,
            &args,
            CALL_TIMEOUT,
        )
        .await
        {
            Ok(state) => {
                last_answer = Instant::now();
                ctx.commits.update(&commit.session_id, |c| {
                    c.current_bytes = state.current_bytes;
                    c.total_bytes = state.total_bytes;
                });
                match state.status {
                    BgtaskStatus::Done => return Ok(state),
                    BgtaskStatus::Failed => return Err(task_error(&commit.agent_id, &state)),
                    BgtaskStatus::Ongoing => {}
                }
            }
            Err(e) if e.failure().is_some() => return Err(agent_error(&e)),
            Err(e) if last_answer.elapsed() >= UNREACHABLE_LIMIT => {
                return Err(ManagerError::AgentUnavailable(format!(
                    "agent {} did not answer for {} s while it worked on task {bgtask_id}: {e}",
                    commit.agent_id,
                    UNREACHABLE_LIMIT.as_secs()
                )))
            }
            Err(_) => {}
        }
        if started.elapsed() >= TASK_LIMIT {
            return Err(ManagerError::AgentError(format!(
                "task {bgtask_id} did not end within {} h",
                TASK_LIMIT.as_secs() / 3600
            )));
        }
        actix_rt::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(session: &str) -> Commit {
        Commit {
            session_id: session.into(),
            image: "r.io/a:1".into(),
            ..Commit::default()
        }
    }

    #[test]
    fn one_commit_per_session_at_a_time() {
        let commits = Commits::default();
        commits.begin(commit("s1")).unwrap();
        commits.begin(commit("s2")).unwrap();
        let e = commits.begin(commit("s1")).unwrap_err();
        assert_eq!(e.code(), "commit-in-progress");
        commits.fail("s1", &ManagerError::RegistryAuthFailed("no".into()));
        let c = commits.get("s1").unwrap();
        assert_eq!(c.status, CommitStatus::Failed);
        assert_eq!(c.error_code.as_deref(), Some("registry-auth-failed"));
        assert!(c.finished_at.is_some());
        commits.begin(commit("s1")).unwrap();
        assert_eq!(commits.get("s1").unwrap().status, CommitStatus::Committing);
    }

    #[test]
    fn image_refs_name_the_reference() {
        let r = image_ref("127.0.0.1:5000/team/img:1");
        assert_eq!(
            (
                r.registry.as_str(),
                r.project.clone(),
                r.name.as_str(),
                r.tag.as_str()
            ),
            ("127.0.0.1:5000", None, "team/img", "1")
        );
        assert_eq!(
            crate::rpc::agent_api::images::canonical(&r),
            "127.0.0.1:5000/team/img:1"
        );
        let r = image_ref("reg.io/img");
        assert_eq!(
            crate::rpc::agent_api::images::canonical(&r),
            "reg.io/img:latest"
        );
        let r = image_ref("team/img:2");
        assert_eq!(
            crate::rpc::agent_api::images::canonical(&r),
            "docker.io/team/img:2"
        );
    }
}

//! The HTTP API (actix-web, `[api] listen-addr`, :8081): sessions, vfolders, agents, access
//! keys, `/health`, `/metrics`, and its OpenAPI document (`/v1/openapi.json`, [`openapi`]).
//! Every route but `GET /health` and the web console's page and assets (`/`, `/ui/…`,
//! [`crate::manager::console`]) needs a bearer token ([`auth`]). Contract:
//! `docs/manager-api.md`.

pub mod auth;
mod cordon;
mod error;
mod events;
mod files;
mod images;
mod keys;
pub mod openapi;
mod pty;
mod responses;
mod services;
mod sessions;
#[cfg(test)]
mod surface_tests;
mod system;
mod vfolders;

use std::net::TcpListener;
use std::sync::Arc;

use actix::Addr;
use actix_web::http::StatusCode;
use actix_web::{web, App, HttpResponse, HttpResponseBuilder, HttpServer};
use serde::Serialize;

use super::error::ManagerError;
use super::metrics::ManagerMetrics;
use super::pool::AgentPool;
use super::registry::{AgentRegistry, GraceRemaining};
use super::scheduler::Scheduler;
use super::store::{KernelRow, Store};
use crate::model::cluster::SessionKernel;
use crate::model::session::{KernelStatus, Session};
use auth::Caller;

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    /// The store.
    pub store: Store,
    /// The registry (liveness, grace).
    pub registry: Addr<AgentRegistry>,
    /// The scheduler.
    pub scheduler: Addr<Scheduler>,
    /// The pool (metrics).
    pub pool: Addr<AgentPool>,
    /// Metrics.
    pub metrics: Arc<ManagerMetrics>,
    /// Whether this replica leads (`/health`).
    pub leader: crate::manager::leader::Leadership,
    /// `[api] max-upload-size`, bytes.
    pub max_upload_size: u64,
    /// `[[registry]]`: the credentials a commit pushes with.
    pub registries: Arc<crate::manager::image_registries::ImageRegistries>,
    /// The sessions' commits this manager follows.
    pub commits: crate::manager::commits::Commits,
    /// The event stream (`GET /v1/events`).
    pub events: crate::manager::event_hub::EventHub,
}

type Res = Result<HttpResponse, ManagerError>;

/// A session as the API shows it (`stages` absent: [`sessions::get`] adds them).
pub fn session(k: &KernelRow) -> Session {
    session_of(k, std::slice::from_ref(k))
}

/// A session from its main kernel's row `k` and every kernel's row (`kernels`, `main1` first;
/// `k` alone for a session of one kernel): the main kernel's fields, its `kernels` listed,
/// and its `status` theirs combined ([`combined_status`]).
pub fn session_of(k: &KernelRow, kernels: &[KernelRow]) -> Session {
    let (status, reason) = combined_status(k, kernels);
    // Idle reclaim: a cluster session's activity and readings are its kernels' combined.
    let facts = k.with_session_facts(kernels);
    Session {
        status: status.as_str().to_owned(),
        status_reason: reason,
        cluster_size: k.cluster_size,
        cluster_mode: Some(k.cluster_mode),
        kernels: kernels
            .iter()
            .map(|c| SessionKernel {
                kernel_id: c.id.clone(),
                cluster_role: c.cluster_role.clone(),
                cluster_idx: c.cluster_idx,
                cluster_hostname: c.cluster_hostname.clone(),
                agent_id: c.agent_id.clone(),
                status: c.status.as_str().to_owned(),
                status_reason: c.status_reason.clone(),
                exit_code: c.exit_code,
                service_ports: c.service_ports.clone(),
            })
            .collect(),
        ..kernel_session(&facts)
    }
}

/// The session a kernel's row `k` belongs to, as the API shows it: its main kernel's row and
/// the session with its kernels (a cluster session's read from the store).
///
/// Errors: the store's.
async fn session_view(s: &ApiState, k: &KernelRow) -> Result<(KernelRow, Session), ManagerError> {
    if k.cluster_size <= 1 {
        return Ok((k.clone(), session(k)));
    }
    let kernels = s.store.session_kernels(&k.session_id).await?;
    let main = kernels
        .iter()
        .find(|c| c.is_main())
        .cloned()
        .unwrap_or_else(|| k.clone());
    let view = session_of(&main, &kernels);
    Ok((main, view))
}

/// A cluster session's status from its kernels': the main kernel's once every kernel has
/// ended (or while it waits in the queue alone); `TERMINATING` while some kernel ended or is
/// ending and others live (the reconcile sweep ends them), with the first ended one's reason;
/// `RESTARTING` while one restarts; else the least advanced (`RUNNING` only when every kernel
/// is).
pub fn combined_status(main: &KernelRow, kernels: &[KernelRow]) -> (KernelStatus, Option<String>) {
    let own = (main.status, main.status_reason.clone());
    if kernels.len() <= 1 || !kernels.iter().any(KernelRow::is_live) {
        return own;
    }
    let ending = kernels
        .iter()
        .filter(|c| !c.is_live() || c.status == KernelStatus::Terminating)
        .min_by(|a, b| {
            a.terminated_at
                .unwrap_or(f64::MAX)
                .total_cmp(&b.terminated_at.unwrap_or(f64::MAX))
        });
    if let Some(c) = ending {
        return (KernelStatus::Terminating, c.status_reason.clone());
    }
    if kernels.iter().any(|c| c.status == KernelStatus::Restarting) {
        return (KernelStatus::Restarting, None);
    }
    let least = kernels
        .iter()
        .map(|c| c.status)
        .min_by_key(|s| s.rank())
        .unwrap_or(main.status);
    (least, None)
}

/// A session of one kernel, from its row.
fn kernel_session(k: &KernelRow) -> Session {
    Session {
        session_id: k.session_id.clone(),
        kernel_id: k.id.clone(),
        agent_id: k.agent_id.clone(),
        access_key: k.access_key.clone(),
        image: k.image.clone(),
        status: k.status.as_str().to_owned(),
        status_reason: k.status_reason.clone(),
        exit_code: k.exit_code,
        session_type: Some(k.session_type),
        command: k.command.clone(),
        batch_timeout: k.batch_timeout,
        result: Some(k.result),
        resource_slots: slot_amounts(&k.resource_slots),
        mounts: k.mounts.clone(),
        restart_policy: k.restart_policy,
        restart_count: k.restart_count,
        pull_progress: k.pull_progress,
        created_at: Some(k.created_at),
        terminated_at: k.terminated_at,
        priority: k.priority,
        pending_reason: k.pending_reason.clone().filter(|_| k.is_pending()),
        // Filled in by the handlers that answer a queued session (a store query).
        queue_position: None,
        queued_at: k.queued_at,
        admitted_at: k.admitted_at,
        stages: None,
        exec_path: None,
        cluster_size: k.cluster_size,
        cluster_mode: Some(k.cluster_mode),
        kernels: Vec::new(),
        stop_signal: k.stop_signal.clone(),
        grace_period: k.grace_period,
        terminate_deadline: k.terminate_deadline.filter(|_| {
            matches!(
                k.status,
                KernelStatus::Terminating | KernelStatus::Preempted
            )
        }),
        // Preemption (issue 41 item 2).
        preemptible: k.preemptible,
        ..reclaim_view(k)
    }
}

// Idle reclaim.
/// A session's reclaim fields (`docs/design.md`, "Idle reclaim"): its policy, last activity
/// and deadlines (none once it ended or while it is not `RUNNING` yet, except the lifetime's
/// once placed).
fn reclaim_view(k: &KernelRow) -> Session {
    let running = k.status == KernelStatus::Running;
    let d = crate::model::reclaim::Deadlines::of(&k.reclaim_state());
    Session {
        reclaim: k.reclaim.policy(),
        last_activity: k.reclaim.last_activity,
        idle_deadline: d.idle.filter(|_| running),
        lifetime_deadline: d.lifetime.filter(|_| running),
        utilization_deadline: d.utilization.filter(|_| running),
        ..Session::default()
    }
}

/// Slots as the API writes them: `{name: decimal string}`.
fn slot_amounts(slots: &crate::slots::ResourceSlots) -> crate::model::slots::SlotAmounts {
    slots
        .iter()
        .map(|(name, amount)| (name.to_owned(), amount.to_string()))
        .collect()
}

/// `body` as the JSON answer of `resp`. It goes through `serde_json::Value`, whose map is
/// sorted: every answer's keys are in alphabetical order at every level, as they were when the
/// handlers built `json!` values (clients must not care, but a byte-stable body is easier to
/// diff and cache).
fn reply<T: Serialize>(mut resp: HttpResponseBuilder, body: &T) -> Res {
    let value = serde_json::to_value(body)
        .map_err(|e| ManagerError::Internal(format!("answer does not serialize: {e}")))?;
    Ok(resp.json(value))
}

/// Kernel API calls are refused during the start-up grace period.
async fn not_in_grace(s: &ApiState) -> Result<(), ManagerError> {
    match s.registry.send(GraceRemaining).await? {
        Some(left) => Err(ManagerError::StartingUp(left)),
        None => Ok(()),
    }
}

/// Shortest session id prefix the API resolves (`docker` takes any; four hex digits keep a typo
/// from naming a session by chance).
const MIN_ID_PREFIX: usize = 4;

/// The session's kernel when `caller` may act on it: by session or kernel id, or by a unique
/// prefix (≥ [`MIN_ID_PREFIX`] characters) of the id of one of the caller's sessions (an admin:
/// anyone's), as `docker` and `git` take a short id.
///
/// Errors: 404 `session-not-found`, also for another key's session; 400 `invalid-request` when
/// the prefix names several sessions (some of them listed).
async fn owned_kernel(s: &ApiState, caller: &Caller, id: &str) -> Result<KernelRow, ManagerError> {
    let exact = s.store.kernel(id).await?;
    if exact.is_some() || id.len() < MIN_ID_PREFIX {
        return caller.owned(id, exact);
    }
    let owner = (!caller.admin).then_some(caller.access_key.as_str());
    let mut found = s.store.session_ids_with_prefix(id, owner, 4).await?;
    match found.len() {
        0 => Err(ManagerError::SessionNotFound(id.to_owned())),
        1 => {
            let session_id = found.remove(0);
            caller.owned(id, s.store.kernel(&session_id).await?)
        }
        n => Err(ManagerError::InvalidRequest(format!(
            "`{id}` is the start of {} sessions' ids ({}…): give more of the id",
            if n > 3 {
                "more than 3".to_owned()
            } else {
                n.to_string()
            },
            found[..n.min(3)].join(", ")
        ))),
    }
}

/// The id a scheduler message names for what the caller asked with `asked`: the kernel id when
/// `asked` is one, else the session id (`asked` was the session id or a prefix of it).
fn resolved_id(asked: &str, k: &KernelRow) -> String {
    if asked == k.id {
        k.id.clone()
    } else {
        k.session_id.clone()
    }
}

/// The OpenAPI description of the `kernel` query parameter.
pub(super) const KERNEL_PARAM: &str = "A cluster session's kernel to act in, by host name (`main1`, `sub1`, …) or kernel id (a session of one kernel takes `main1` or its kernel id); default: the kernel the path names, the main kernel for a session id";

/// `?kernel=` of the routes that act in one kernel of a session (logs, files, terminal,
/// interrupt, services): a cluster session's kernel by host name (`main1`, `sub1`, …) or
/// kernel id; absent: the kernel the path names ([`selected_kernel`]). Unknown parameters are
/// ignored, as they were before these routes read a query.
#[derive(Debug, Default, serde::Deserialize)]
pub(super) struct KernelQuery {
    /// The selector; see [`selected_kernel`].
    #[serde(default)]
    pub kernel: Option<String>,
}

/// The kernel of the caller's session `id` (as [`owned_kernel`] resolves it) that `selector`
/// names: a kernel of the session by its host name (`main1`, `sub1`, …; Backend.AI's
/// `cluster_hostname`) or its kernel id. Without a selector, the kernel the path names: the
/// main kernel for a session id (or a prefix of it), that kernel for a kernel id. A session of
/// one kernel takes `main1` and its kernel id only.
///
/// Errors: 404 `session-not-found`, also for a selector that names no kernel of the session
/// (the message names the selector and lists the session's kernels); the store's.
async fn selected_kernel(
    s: &ApiState,
    caller: &Caller,
    id: &str,
    selector: Option<&str>,
) -> Result<KernelRow, ManagerError> {
    let k = owned_kernel(s, caller, id).await?;
    select_in(&s.store, id, k, selector).await
}

/// [`selected_kernel`] once the path's kernel `k` is known: its session's kernels read only
/// for a selector on a cluster session.
async fn select_in(
    store: &Store,
    id: &str,
    k: KernelRow,
    selector: Option<&str>,
) -> Result<KernelRow, ManagerError> {
    let Some(selector) = selector else {
        return Ok(k);
    };
    if k.cluster_size <= 1 {
        return pick_kernel(id, selector, std::slice::from_ref(&k));
    }
    pick_kernel(id, selector, &store.session_kernels(&k.session_id).await?)
}

/// The kernel of `kernels` (one session's) whose host name or id is `selector`.
///
/// Errors: 404 `session-not-found` naming the selector and the session's kernels.
fn pick_kernel(id: &str, selector: &str, kernels: &[KernelRow]) -> Result<KernelRow, ManagerError> {
    if let Some(k) = kernels
        .iter()
        .find(|k| k.cluster_hostname == selector || k.id == selector)
    {
        return Ok(k.clone());
    }
    let hosts: Vec<&str> = kernels
        .iter()
        .map(|k| k.cluster_hostname.as_str())
        .collect();
    Err(ManagerError::KernelNotFound(format!(
        "session `{id}` has no kernel `{selector}` (its kernels: {}; `kernel` takes a host name \
         or a kernel id)",
        hosts.join(", ")
    )))
}

/// The caller's session's kernel that `selector` names ([`selected_kernel`]; without one, the
/// kernel the path names), which must be `RUNNING` (files and services live in its container).
/// Only the selected kernel's status counts, not the session's combined one.
///
/// Errors: 404 `session-not-found` (also another key's, or a selector naming no kernel of the
/// session), 409 `session-not-running`.
async fn running_kernel(
    s: &ApiState,
    caller: &Caller,
    id: &str,
    selector: Option<&str>,
) -> Result<KernelRow, ManagerError> {
    not_in_grace(s).await?;
    let k = selected_kernel(s, caller, id, selector).await?;
    must_run(&k, id, selector)?;
    Ok(k)
}

/// 409 `session-not-running` unless `k` is `RUNNING`, naming the session as the caller did and
/// the selected kernel when a selector chose it.
fn must_run(k: &KernelRow, id: &str, selector: Option<&str>) -> Result<(), ManagerError> {
    if k.status == KernelStatus::Running {
        return Ok(());
    }
    // The error writes "session `{name}` is …": with a selector it reads "session `S`'s kernel
    // `sub1` is CREATING, not RUNNING".
    let name = match selector {
        Some(sel) => format!("{id}`'s kernel `{sel}"),
        None => id.to_owned(),
    };
    Err(ManagerError::SessionNotRunning(
        name,
        k.status.as_str().to_owned(),
    ))
}

fn count_error<T>(s: &ApiState, r: Result<T, ManagerError>) -> Result<T, ManagerError> {
    if let Err(e) = &r {
        s.metrics
            .session_errors
            .with_label_values(&[e.code()])
            .inc();
    }
    r
}

fn invalid(e: impl std::fmt::Display) -> actix_web::Error {
    ManagerError::InvalidRequest(e.to_string()).into()
}

/// Every route of the API, each once: a handler's actix route macro (`#[get("/v1/…")]`) gives
/// its method and path, its `#[utoipa::path]` the rest of its operation, and
/// utoipa-actix-web registers it with actix and with the OpenAPI document
/// ([`openapi::document`]) at once. A new route is its handler plus one line here.
pub fn routes(cfg: &mut utoipa_actix_web::service_config::ServiceConfig) {
    cfg.service(sessions::create)
        .service(sessions::list)
        .service(sessions::get)
        .service(sessions::delete)
        .service(sessions::execute)
        .service(sessions::interrupt)
        .service(sessions::logs)
        .service(pty::open)
        .service(images::commit)
        .service(images::commit_state)
        .service(services::list)
        .service(services::start)
        .service(services::stop)
        .service(files::list)
        .service(files::upload)
        .service(files::download)
        .service(events::stream)
        .service(system::list_agents)
        .service(cordon::cordon)
        .service(cordon::uncordon)
        .service(cordon::drain)
        .service(images::purge)
        .service(keys::create)
        .service(keys::list)
        .service(keys::get)
        .service(keys::change)
        .service(keys::delete)
        .service(vfolders::create)
        .service(vfolders::list)
        .service(vfolders::delete)
        .service(openapi::serve)
        .service(system::health)
        .service(system::metrics);
}

/// The app's configuration, for the server and for tests: [`routes`], the extractors' error
/// answers (400 `invalid-request`) and [`unrouted`] for what no route takes.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.app_data(
        web::JsonConfig::default()
            .limit(1 << 20)
            .error_handler(|e, _| invalid(e)),
    )
    .app_data(web::QueryConfig::default().error_handler(|e, _| invalid(e)))
    .app_data(web::PathConfig::default().error_handler(|e, _| invalid(e)))
    .default_service(web::to(unrouted))
    // The web console (`/`, `/ui/…`): not API operations, so not in the OpenAPI document.
    .configure(crate::manager::console::configure);
    routes(&mut utoipa_actix_web::service_config::ServiceConfig::new(
        cfg,
    ));
}

/// The answer to a request no route took: 405 `method-not-allowed` when its path is a route's
/// (for another method: each handler is a resource of its own, guarded by its method), else
/// 404 `not-found`.
async fn unrouted(req: actix_web::HttpRequest) -> HttpResponse {
    // The path as the router matched it (requoted), not the raw URI.
    if req.resource_map().has_resource(req.match_info().as_str()) {
        error::plain(
            StatusCode::METHOD_NOT_ALLOWED,
            "method-not-allowed",
            "method not allowed on this route",
        )
    } else {
        error::plain(StatusCode::NOT_FOUND, "not-found", "no such route")
    }
}

/// Starts the API server on `listener` with `workers` threads; returns the server (a future
/// that runs it; stop it through `server.handle().stop(true)`). With `tls` every connection is
/// TLS (HTTPS only, built by [`crate::manager::tls::server_config`]); without it, plain HTTP.
///
/// Errors: the listener cannot be used.
pub fn serve(
    listener: TcpListener,
    workers: usize,
    state: ApiState,
    tls: Option<rustls::ServerConfig>,
) -> std::io::Result<actix_web::dev::Server> {
    let server = HttpServer::new(move || {
        App::new()
            .wrap(actix_web::middleware::from_fn(auth::authenticate))
            .app_data(web::Data::new(state.clone()))
            .configure(configure)
    })
    .workers(workers)
    .disable_signals()
    .shutdown_timeout(5);
    let server = match tls {
        Some(config) => server.listen_rustls_0_23(listener, config)?,
        None => server.listen(listener)?,
    };
    Ok(server.run())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::session::{SessionResult, SessionType};
    use crate::slots::Amount;

    fn row() -> KernelRow {
        KernelRow {
            id: "k1".into(),
            session_id: "s1".into(),
            agent_id: "a1".into(),
            access_key: "AK1".into(),
            image: "img".into(),
            status: KernelStatus::Running,
            status_reason: None,
            exit_code: None,
            resource_slots: [
                ("cpu".to_owned(), Amount::parse("1.5").unwrap()),
                ("mem".to_owned(), Amount::parse("268435456").unwrap()),
            ]
            .into_iter()
            .collect(),
            created_at: 1.5,
            terminated_at: None,
            session_type: SessionType::Batch,
            command: Some("true".into()),
            batch_timeout: Some(60.0),
            result: SessionResult::Undefined,
            mounts: serde_json::from_str(r#"[{"name":"data","permission":null}]"#).unwrap(),
            restart_policy: serde_json::from_str(
                r#"{"mode":"never","max_restarts":3,"window":60.0,"backoff":1.0}"#,
            )
            .unwrap(),
            restart_count: 0,
            pull_progress: None,
            priority: 10,
            queued_at: None,
            admitted_at: None,
            pending_reason: None,
            status_changed_at: 1.5,
            cluster_mode: crate::model::cluster::ClusterMode::SingleNode,
            cluster_size: 1,
            cluster_role: "main".into(),
            cluster_idx: 1,
            cluster_hostname: "main1".into(),
            network: None,
            service_ports: vec!["sshd".into()],
            stop_signal: None,
            grace_period: Some(10.0),
            terminate_deadline: None,
            reclaim: Default::default(),
            preemptible: false,
            superseded_by: None,
            preempted_at: None,
        }
    }

    /// A kernel of a cluster of 3 in `status`.
    fn member(host: &str, status: KernelStatus, ended_at: Option<f64>) -> KernelRow {
        let (role, idx) = host.split_at(host.len() - 1);
        KernelRow {
            id: format!("k-{host}"),
            status,
            terminated_at: ended_at,
            status_reason: ended_at.map(|_| format!("{host}-ended")),
            cluster_size: 3,
            cluster_role: role.into(),
            cluster_idx: idx.parse().unwrap(),
            cluster_hostname: host.into(),
            ..row()
        }
    }

    #[test]
    fn a_cluster_session_is_running_only_when_every_kernel_is_and_ends_whole() {
        use KernelStatus::*;
        let status = |ks: &[KernelRow]| combined_status(&ks[0], ks);
        let creating = [
            member("main1", Running, None),
            member("sub1", Creating, None),
            member("sub2", Running, None),
        ];
        assert_eq!(status(&creating), (Creating, None));
        let running = [
            member("main1", Running, None),
            member("sub1", Running, None),
            member("sub2", Running, None),
        ];
        assert_eq!(status(&running), (Running, None));
        // A sub kernel lost: the session is ending, with its reason, until the sweep ends
        // the others.
        let lost = [
            member("main1", Running, None),
            member("sub1", Terminated, Some(9.0)),
            member("sub2", Running, None),
        ];
        assert_eq!(status(&lost), (Terminating, Some("sub1-ended".into())));
        // Every kernel ended: the main kernel's status and reason.
        let ended = [
            member("main1", Terminated, Some(10.0)),
            member("sub1", Terminated, Some(9.0)),
            member("sub2", Terminated, Some(10.0)),
        ];
        assert_eq!(status(&ended), (Terminated, Some("main1-ended".into())));
        let view = session_of(&running[0], &running);
        assert_eq!(view.cluster_size, 3);
        let hosts: Vec<&str> = view
            .kernels
            .iter()
            .map(|k| k.cluster_hostname.as_str())
            .collect();
        assert_eq!(hosts, ["main1", "sub1", "sub2"]);
        assert_eq!(view.kernels[1].cluster_role, "sub");
        assert_eq!(view.kernels[2].cluster_idx, 2);
    }

    /// A cluster session `sess` of 3 (kernels `k-main1`, `k-sub1`, `k-sub2` on agent `a`) and
    /// a session `solo` of one kernel, in a fresh SQLite store; `main1`, `sub1` and `solo`
    /// `RUNNING`, `sub2` still `SCHEDULED`.
    async fn sessions_in_store() -> (tempfile::TempDir, Store) {
        use crate::manager::store::NewKernel;
        use crate::model::cluster::{cluster_slots, ClusterMode, ClusterSlot};
        use crate::slots::ResourceSlots;
        let (dir, store) = crate::manager::store::test_store_with_key().await;
        let new = |id: &str, session: &str, size: u32, slot: ClusterSlot| NewKernel {
            cluster_mode: ClusterMode::SingleNode,
            cluster_size: size,
            cluster: slot,
            id: id.into(),
            session_id: session.into(),
            agent_id: "a".into(),
            access_key: "AK".into(),
            image: "img".into(),
            resource_slots: ResourceSlots::default(),
            session_type: SessionType::Interactive,
            command: None,
            batch_timeout: None,
            mounts: Vec::new(),
            restart_policy: Default::default(),
            priority: 10,
            request: None,
            stop_signal: None,
            grace_period: None,
            preemptible: false,
        };
        let gang: Vec<NewKernel> = cluster_slots(3)
            .into_iter()
            .map(|slot| new(&format!("k-{}", slot.hostname), "sess", 3, slot))
            .collect();
        let roomy: ResourceSlots = [("cpu".to_owned(), Amount::from_units(100))]
            .into_iter()
            .collect();
        let totals = [("a".to_owned(), roomy.clone())].into_iter().collect();
        store
            .reserve_gang(&gang, &totals, false)
            .await
            .unwrap()
            .unwrap();
        store
            .reserve_kernel(&new("solo", "solo", 1, ClusterSlot::main()), &roomy)
            .await
            .unwrap();
        for id in ["k-main1", "k-sub1", "solo"] {
            assert!(store
                .advance_kernel(id, KernelStatus::Running)
                .await
                .unwrap());
        }
        (dir, store)
    }

    /// What the kernel routes act in: `?kernel=` / execute's `kernel` picks a cluster
    /// session's kernel by host name or id; without it the kernel the path names (the main
    /// one for a session id); a selector naming no kernel of the session is 404
    /// `session-not-found` naming it; the `RUNNING` check is the selected kernel's.
    #[actix_rt::test]
    async fn a_selector_picks_the_sessions_kernel_and_its_status_counts() {
        let (_dir, store) = sessions_in_store().await;
        let named = |id: &'static str| {
            let store = store.clone();
            async move { store.kernel(id).await.unwrap().unwrap() }
        };
        let pick = |id: &'static str, selector: Option<&'static str>| {
            let store = store.clone();
            async move {
                let k = store.kernel(id).await.unwrap().unwrap();
                select_in(&store, id, k, selector).await
            }
        };
        // The session id names the main kernel; a selector another kernel of the session.
        assert_eq!(pick("sess", None).await.unwrap().id, "k-main1");
        assert_eq!(pick("sess", Some("main1")).await.unwrap().id, "k-main1");
        let sub1 = pick("sess", Some("sub1")).await.unwrap();
        assert_eq!((sub1.id.as_str(), sub1.agent_id.as_str()), ("k-sub1", "a"));
        assert_eq!(
            pick("sess", Some("k-sub2")).await.unwrap().cluster_hostname,
            "sub2"
        );
        // Named by a kernel's id: that kernel, and a selector still searches the session.
        assert_eq!(pick("k-sub2", None).await.unwrap().id, "k-sub2");
        assert_eq!(pick("k-sub2", Some("sub1")).await.unwrap().id, "k-sub1");
        for unknown in ["sub3", "SUB1", "", "solo"] {
            let e = pick("sess", Some(unknown)).await.unwrap_err();
            assert_eq!(
                (e.status(), e.code()),
                (404, "session-not-found"),
                "{unknown:?}"
            );
            assert_eq!(
                e.to_string(),
                format!(
                    "session `sess` has no kernel `{unknown}` (its kernels: main1, sub1, sub2; \
                     `kernel` takes a host name or a kernel id)"
                )
            );
        }
        // A session of one kernel: `main1` or its kernel id only.
        assert_eq!(pick("solo", Some("main1")).await.unwrap().id, "solo");
        assert_eq!(pick("solo", Some("solo")).await.unwrap().id, "solo");
        let e = pick("solo", Some("sub1")).await.unwrap_err();
        assert_eq!(e.code(), "session-not-found");
        assert!(
            e.to_string()
                .contains("no kernel `sub1` (its kernels: main1;"),
            "{e}"
        );
        // RUNNING is the selected kernel's: sub2 is not, while the main kernel is.
        let sub2 = pick("sess", Some("sub2")).await.unwrap();
        let e = must_run(&sub2, "sess", Some("sub2")).unwrap_err();
        assert_eq!((e.status(), e.code()), (409, "session-not-running"));
        assert_eq!(
            e.to_string(),
            "session `sess`'s kernel `sub2` is SCHEDULED, not RUNNING"
        );
        must_run(&sub1, "sess", Some("sub1")).unwrap();
        must_run(&named("sess").await, "sess", None).unwrap();
        let e = must_run(&named("k-sub2").await, "k-sub2", None).unwrap_err();
        assert_eq!(e.to_string(), "session `k-sub2` is SCHEDULED, not RUNNING");
        // The session as listed: not RUNNING while sub2 is not; its kernels in order.
        let kernels = store.session_kernels("sess").await.unwrap();
        let view = session_of(&kernels[0], &kernels);
        assert_eq!(view.status, "SCHEDULED");
        let hosts: Vec<&str> = view
            .kernels
            .iter()
            .map(|k| k.cluster_hostname.as_str())
            .collect();
        assert_eq!(hosts, ["main1", "sub1", "sub2"]);
    }

    /// The query extractors take `kernel` beside their own parameters, and the routes that
    /// had no query before still take (and ignore) unknown parameters.
    #[test]
    fn kernel_queries_parse() {
        let q = web::Query::<KernelQuery>::from_query("kernel=sub1&x=1").unwrap();
        assert_eq!(q.kernel.as_deref(), Some("sub1"));
        assert_eq!(
            web::Query::<KernelQuery>::from_query("").unwrap().kernel,
            None
        );
        let pty =
            web::Query::<crate::model::terminal::PtyQuery>::from_query("rows=3&cols=4&kernel=sub2")
                .unwrap();
        assert_eq!(pty.kernel.as_deref(), Some("sub2"));
        let b: crate::model::exec::ExecuteBody =
            serde_json::from_str(r#"{"code": "hostname", "kernel": "sub1"}"#).unwrap();
        assert_eq!(b.kernel.as_deref(), Some("sub1"));
    }

    async fn body(r: Res) -> String {
        let resp = r.unwrap();
        String::from_utf8(
            actix_web::body::to_bytes(resp.into_body())
                .await
                .unwrap()
                .to_vec(),
        )
        .unwrap()
    }

    /// A session answers the keys (and nulls) the handlers wrote as `json!` before the model,
    /// in the same (alphabetical) order: `stages` only where `GET /v1/sessions/{id}` adds it.
    #[actix_web::test]
    async fn session_body_is_the_documented_shape() {
        let listed = body(reply(HttpResponse::Ok(), &session(&row()))).await;
        let before = serde_json::json!({
            "session_id": "s1", "kernel_id": "k1", "agent_id": "a1", "access_key": "AK1",
            "image": "img", "status": "RUNNING", "status_reason": null, "exit_code": null,
            "type": "batch", "command": "true", "batch_timeout": 60.0, "result": "UNDEFINED",
            "resource_slots": {"cpu": "1.5", "mem": "268435456"},
            "mounts": [{"name": "data", "permission": null}],
            "restart_policy": {"mode": "never", "max_restarts": 3, "window": 60.0, "backoff": 1.0},
            "restart_count": 0, "created_at": 1.5, "terminated_at": null,
            "pull_progress": null, "priority": 10, "pending_reason": null,
            "queue_position": null, "queued_at": null, "admitted_at": null,
            "cluster_size": 1, "cluster_mode": "single-node", "preemptible": false,
            "kernels": [{
                "kernel_id": "k1", "cluster_role": "main", "cluster_idx": 1,
                "cluster_hostname": "main1", "agent_id": "a1", "status": "RUNNING",
                "status_reason": null, "exit_code": null, "service_ports": ["sshd"],
            }],
            // Idle reclaim.
            "reclaim": {}, "last_activity": null, "idle_deadline": null,
            "lifetime_deadline": null, "utilization_deadline": null,
        });
        // Graceful termination's fields (issue 41): the row's, and no deadline unless ending.
        let mut before = before;
        before["stop_signal"] = serde_json::Value::Null;
        before["grace_period"] = serde_json::json!(10.0);
        before["terminate_deadline"] = serde_json::Value::Null;
        assert_eq!(listed, before.to_string());
        let got = Session {
            stages: Some(None),
            exec_path: Some(None),
            ..session(&row())
        };
        let mut with_stages = before.clone();
        with_stages["stages"] = serde_json::Value::Null;
        with_stages["exec_path"] = serde_json::Value::Null;
        assert_eq!(
            body(reply(HttpResponse::Ok(), &got)).await,
            with_stages.to_string()
        );
    }

    /// An error is `{"error": {"code", "message"}}`, `output` only for `service-failed`.
    #[actix_web::test]
    async fn error_body_keys() {
        use actix_web::ResponseError;
        let plain = ManagerError::SessionNotFound("x".into()).error_response();
        let text = body(Ok(plain)).await;
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], "session-not-found");
        assert!(v["error"].get("output").is_none(), "{text}");
        let failed = ManagerError::ServiceFailed {
            message: "m".into(),
            output: "tail".into(),
        }
        .error_response();
        let v: serde_json::Value = serde_json::from_str(&body(Ok(failed)).await).unwrap();
        assert_eq!(v["error"]["output"], "tail");
    }
}

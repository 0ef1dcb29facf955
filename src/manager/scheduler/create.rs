//! `CreateSession`: resolve the mounts, place and reserve (retrying lost races), then
//! `create_kernels` on the chosen agent; any failure undoes the reservation.

use std::time::{Duration, Instant};

use actix::prelude::*;
use rmpv::Value;

use super::cluster::{gang_kernels, GangKernel};
use super::launch::{kernel_config, new_kernel, resolve_mounts, ClusterPlace, Launcher, Placed};
use super::place::{
    fits_some_agent, gang_total, parse_request, parse_request_typed, place, place_by, place_gang,
    PlaceError,
};
use super::pull::{PullOutcome, PullPhase};
use super::Scheduler;
use crate::manager::calls::{agent_error, call_agent, call_method};
use crate::manager::error::ManagerError;
use crate::manager::registry::{AgentImages, PlacementCandidates};
use crate::manager::store::{Admitted, AgentRow, KernelRow, NewKernel, ReserveError, Store};
use crate::model::cluster::{cluster_slots, ClusterMode};
use crate::model::queue::{PendingCode, PendingReason};
use crate::model::session::{KernelStatus, SessionRequest};
use crate::rpc::agent_api::kernel::{
    ClusterInfo, CreateKernels, CreateKernelsArgs, DestroyKernel, DestroyKernelArgs,
    KernelCreationConfig,
};
use crate::rpc::agent_api::{decode_reply, encode_args, to_value};
use crate::slots::ResourceSlots;

/// Placements tried before a create gives up with `no-capacity` when every try lost a race for
/// the chosen agent's slots (other replicas placing at the same time).
const MAX_PLACEMENT_ATTEMPTS: u32 = 5;

/// Creates a session: its kernel row as stored after the agent answered, or `PENDING` when it
/// was queued.
#[derive(Message)]
#[rtype(result = "Result<KernelRow, ManagerError>")]
pub struct CreateSession {
    /// The access key that will own it (the caller, or the key an admin named).
    pub owner: String,
    /// What was asked for.
    pub request: SessionRequest,
}

/// Whether the caller waits for the creation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Waiter {
    /// `POST /v1/sessions` waits (a short pull answers `PULLING` and goes on): a failure
    /// discards the row and is the caller's error.
    Caller,
    /// An admission from the queue: nobody waits; a failure ends the session `TERMINATED`
    /// with the error's code as its reason.
    Nobody,
}

/// What a direct placement ended in when it did not place.
enum Unplaced {
    /// Nothing fits now: queue it with this reason (or refuse it with the error).
    Wait(PendingReason, ManagerError),
    /// A hard error (the request is wrong, the store failed).
    Error(ManagerError),
}

impl Handler<CreateSession> for Scheduler {
    type Result = ResponseFuture<Result<KernelRow, ManagerError>>;

    fn handle(&mut self, msg: CreateSession, ctx: &mut Context<Self>) -> Self::Result {
        let (owner, mut req) = (msg.owner, msg.request);
        let (store, registry, placing, launcher, slot_types) = (
            self.store.clone(),
            self.registry.clone(),
            self.placing.clone(),
            self.launcher(),
            self.slot_types.clone(),
        );
        let me = ctx.address();
        let placement = self.spec.cluster_placement;
        let preemption = self.spec.preemption.enabled;
        Box::pin(async move {
            if req.image.trim().is_empty() {
                return Err(ManagerError::InvalidRequest(
                    "`image` must not be empty".into(),
                ));
            }
            if owner.is_empty() {
                return Err(ManagerError::InvalidRequest(
                    "`access_key` must not be empty".into(),
                ));
            }
            req.checked_type()?;
            super::launch::RequestGrace::fill(&launcher.spec, &mut req)?;
            let (size, mode) = req.checked_cluster()?;
            let main = ClusterPlace {
                slot: cluster_slots(size).remove(0),
                mode,
                size,
            };
            let priority = req.checked_priority()?;
            // Idle reclaim: what it asks for, then its key's defaults, then `[reclaim]`'s.
            let reclaim =
                super::reclaim::policy_of(&store, &owner, &req, &launcher.spec.reclaim).await?;
            // Preemption: a session that does not say takes its key's default, fixed in its
            // request (and so kept when it is requeued). Read only when preemption is on.
            if preemption && req.preemptible.is_none() {
                let default = store
                    .access_key(&owner)
                    .await?
                    .is_some_and(|k| k.preemptible);
                req.preemptible = Some(default);
            }
            let enqueue = req.enqueue.unwrap_or(true);
            let mounts = resolve_mounts(&store, &owner, &req.mounts).await?;
            let kernel_id = uuid::Uuid::new_v4().to_string();
            let session_id = uuid::Uuid::new_v4().to_string();
            let ids = (kernel_id.as_str(), session_id.as_str());
            let placed = {
                let all = registry.send(PlacementCandidates).await?;
                let types = slot_types.of(&all);
                let slots = match parse_request_typed(&req.resource_slots, &types, all.is_empty()) {
                    // No agent at all: a request of the built-in slots can wait for one.
                    Err(ManagerError::NoAgents) if enqueue => {
                        parse_request(&req.resource_slots, &[fake_builtin_agent()])?
                    }
                    other => other?,
                };
                // One that no agent could ever hold is refused, queue or not (a single-node
                // cluster needs every kernel's slots on one agent).
                let on_one = match mode {
                    ClusterMode::SingleNode => gang_total(&slots, size)?,
                    ClusterMode::MultiNode => slots.clone(),
                };
                if let Err(e @ PlaceError::SlotsExceedCapacity(_)) = fits_some_agent(&all, &on_one)
                {
                    return Err(e.into());
                }
                let ahead = enqueue && store.queued_at_or_above(priority).await?;
                let outcome = if ahead {
                    // Sessions of its priority or higher wait: it queues behind them, so that
                    // the queue's order holds (its position says how many).
                    Err(Unplaced::Wait(
                        PendingReason::new(
                            PendingCode::Priority,
                            format!("sessions of priority {priority} or higher are ahead of it"),
                        ),
                        // Unused: `ahead` is counted only when it may queue.
                        ManagerError::NoCapacity(String::new()),
                    ))
                } else {
                    // One placement at a time per replica (an admission round holds the same
                    // lock); the store serializes reservations on an agent across replicas and
                    // re-checks its room, so a lost race places again. Queueing needs no lock.
                    let _guard = placing.lock().await;
                    match size {
                        1 => {
                            place_now(&store, &registry, &all, &owner, &req, ids, &slots, priority)
                                .await
                                .map(|a| gang_kernels(&kernel_id, &[a]))
                        }
                        _ => {
                            let gang = Gang {
                                owner: &owner,
                                req: &req,
                                ids,
                                slots: &slots,
                                priority,
                                main: &main,
                                placement,
                            };
                            place_gang_now(&store, &registry, &all, &gang).await
                        }
                    }
                };
                match outcome {
                    Ok(kernels) => Ok((kernels, slots)),
                    Err(Unplaced::Error(e)) => return Err(e),
                    Err(Unplaced::Wait(_, e)) if !enqueue => return Err(e),
                    Err(Unplaced::Wait(reason, _)) => Err((reason, slots, !ahead)),
                }
            };
            let (kernels, slots) = match placed {
                Ok(placed) => placed,
                Err((reason, slots, first_in_line)) => {
                    // A cluster session waits as its main kernel's row alone.
                    let new = new_kernel(&owner, &req, ids, "", &slots, priority, &main)?;
                    let mut row = match store.enqueue_kernel(&new, &reason).await {
                        Ok(row) => row,
                        Err(ReserveError::UnknownAccessKey(k)) => {
                            return Err(ManagerError::AccessKeyNotFound(k))
                        }
                        Err(e) => return Err(ManagerError::Internal(e.to_string())),
                    };
                    // Idle reclaim.
                    store.set_reclaim_policy(&session_id, &reclaim).await?;
                    row.reclaim = crate::manager::store::ReclaimColumns::of_policy(&reclaim);
                    tracing::info!(session_id = %session_id, priority, reason = %reason.code, "session queued");
                    me.do_send(super::Queued { first_in_line });
                    return Ok(row);
                }
            };
            // Idle reclaim: on its rows before it runs.
            store.set_reclaim_policy(&session_id, &reclaim).await?;
            let placed = Placed {
                owner,
                request: req,
                kernel_id: kernel_id.clone(),
                session_id,
                agent_id: kernels[0].agent_id.clone(),
                slots,
                mounts,
            };
            match size {
                1 => launcher.launch(placed, Waiter::Caller).await?,
                _ => {
                    let launched = launcher
                        .launch_gang(super::cluster::GangPlaced {
                            placed,
                            mode,
                            kernels,
                            generation: 0,
                        })
                        .await?;
                    // Its create failed and its restart policy queued it again: the caller
                    // gets the queued session, as for one queued at once.
                    if let super::cluster::GangLaunch::Requeued(row) = launched {
                        return Ok(*row);
                    }
                }
            }
            store
                .kernel(&kernel_id)
                .await?
                .ok_or_else(|| ManagerError::Internal("created kernel row vanished".into()))
        })
    }
}

/// An agent with only the built-in slots, to parse a request by when no agent is `ALIVE`.
fn fake_builtin_agent() -> AgentRow {
    AgentRow::alive("", ResourceSlots::new(), crate::slots::builtin_types())
}

/// Places and reserves a session now (retrying lost races): the agent it is reserved on.
#[allow(clippy::too_many_arguments)]
async fn place_now(
    store: &Store,
    registry: &Addr<crate::manager::registry::AgentRegistry>,
    all: &[AgentRow],
    owner: &str,
    req: &SessionRequest,
    ids: (&str, &str),
    slots: &ResourceSlots,
    priority: i64,
) -> Result<String, Unplaced> {
    let images = registry
        .send(AgentImages)
        .await
        .map_err(|e| Unplaced::Error(e.into()))?;
    // Agents the store turned out to hold LOST/PENDING (rare: copied only then).
    let mut fewer: Option<Vec<AgentRow>> = None;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let candidates: &[AgentRow] = fewer.as_deref().unwrap_or(all);
        let placed = store
            .with_usage(|usage| place(candidates, usage, slots, &req.image, &images))
            .await
            .map_err(|e| Unplaced::Error(e.into()))?;
        let agent_id = match placed {
            Ok(id) => id,
            Err(e @ PlaceError::SlotsExceedCapacity(_)) => return Err(Unplaced::Error(e.into())),
            Err(e) => return Err(Unplaced::Wait(e.pending_reason(), e.into())),
        };
        let total = candidates
            .iter()
            .find(|a| a.id == agent_id)
            .map(|a| a.slots_total.clone())
            .unwrap_or_default();
        let new = new_kernel(
            owner,
            req,
            ids,
            &agent_id,
            slots,
            priority,
            &ClusterPlace::single(),
        )
        .map_err(Unplaced::Error)?;
        match store.reserve_kernel(&new, &total).await {
            Ok(()) => return Ok(agent_id),
            Err(ReserveError::UnknownAccessKey(k)) => {
                return Err(Unplaced::Error(ManagerError::AccessKeyNotFound(k)))
            }
            Err(e @ ReserveError::ConcurrencyLimit(..)) => {
                return Err(Unplaced::Wait(
                    PendingReason::new(PendingCode::ConcurrencyLimit, e.to_string()),
                    ManagerError::ConcurrencyLimit(e.to_string()),
                ))
            }
            Err(ReserveError::Store(e)) => return Err(Unplaced::Error(e.into())),
            Err(e) if attempt >= MAX_PLACEMENT_ATTEMPTS => {
                tracing::warn!(error = %e, attempt, "placement kept losing races");
                return Err(Unplaced::Wait(
                    PendingReason::new(PendingCode::NoCapacity, e.to_string()),
                    ManagerError::NoCapacity(format!("{e}; retry after a session ends")),
                ));
            }
            Err(ReserveError::AgentNotAlive(id, status)) => {
                tracing::info!(agent_id = %id, %status, "placement: the store holds the agent not alive; placing elsewhere");
                let mut rest = candidates.to_vec();
                rest.retain(|a| a.id != id);
                fewer = Some(rest);
            }
            Err(ReserveError::NoRoom(id)) => {
                tracing::debug!(agent_id = %id, attempt, "placement: lost a race for the agent's slots; placing again");
                store.expire_usage();
            }
        }
    }
}

/// A cluster session to place: what its rows are made of.
struct Gang<'a> {
    owner: &'a str,
    req: &'a SessionRequest,
    /// Its main kernel's and the session's ids.
    ids: (&'a str, &'a str),
    /// Each kernel's slots.
    slots: &'a ResourceSlots,
    priority: i64,
    /// The main kernel's place (the cluster's mode and size).
    main: &'a ClusterPlace,
    /// `[scheduler] cluster-placement`.
    placement: crate::model::cluster::ClusterPlacement,
}

/// Places and reserves a cluster session now, whole (retrying lost races as [`place_now`]
/// does): each kernel's agent, `main1` first.
async fn place_gang_now(
    store: &Store,
    registry: &Addr<crate::manager::registry::AgentRegistry>,
    all: &[AgentRow],
    g: &Gang<'_>,
) -> Result<Vec<GangKernel>, Unplaced> {
    let images = registry
        .send(AgentImages)
        .await
        .map_err(|e| Unplaced::Error(e.into()))?;
    let (mode, size) = (g.main.mode, g.main.size);
    let mut fewer: Option<Vec<AgentRow>> = None;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let candidates: &[AgentRow] = fewer.as_deref().unwrap_or(all);
        let placed = store
            .with_usage(|usage| {
                let mut usage = usage.clone();
                place_gang(mode, size, g.slots, &mut usage, |req, usage| {
                    place_by(g.placement, candidates, usage, req, &g.req.image, &images)
                })
            })
            .await
            .map_err(|e| Unplaced::Error(e.into()))?;
        let agents = match placed {
            Ok(agents) => agents,
            Err(e @ PlaceError::SlotsExceedCapacity(_)) => return Err(Unplaced::Error(e.into())),
            Err(e) => return Err(Unplaced::Wait(e.pending_reason(), e.into())),
        };
        let kernels = gang_kernels(g.ids.0, &agents);
        let rows = gang_rows(g, &kernels).map_err(Unplaced::Error)?;
        let totals = candidates
            .iter()
            .filter(|a| agents.contains(&a.id))
            .map(|a| (a.id.clone(), a.slots_total.clone()))
            .collect();
        match store.reserve_gang(&rows, &totals, false).await {
            Ok(_) => return Ok(kernels),
            Err(ReserveError::UnknownAccessKey(k)) => {
                return Err(Unplaced::Error(ManagerError::AccessKeyNotFound(k)))
            }
            Err(e @ ReserveError::ConcurrencyLimit(..)) => {
                return Err(Unplaced::Wait(
                    PendingReason::new(PendingCode::ConcurrencyLimit, e.to_string()),
                    ManagerError::ConcurrencyLimit(e.to_string()),
                ))
            }
            Err(ReserveError::Store(e)) => return Err(Unplaced::Error(e.into())),
            Err(e) if attempt >= MAX_PLACEMENT_ATTEMPTS => {
                return Err(Unplaced::Wait(
                    PendingReason::new(PendingCode::NoCapacity, e.to_string()),
                    ManagerError::NoCapacity(format!("{e}; retry after a session ends")),
                ));
            }
            Err(ReserveError::AgentNotAlive(id, _)) => {
                let mut rest = candidates.to_vec();
                rest.retain(|a| a.id != id);
                fewer = Some(rest);
            }
            Err(ReserveError::NoRoom(_)) => store.expire_usage(),
        }
    }
}

/// The rows of a cluster session's `kernels`, `main1` first.
fn gang_rows(g: &Gang<'_>, kernels: &[GangKernel]) -> Result<Vec<NewKernel>, ManagerError> {
    kernels
        .iter()
        .map(|k| {
            let place = ClusterPlace {
                slot: k.slot.clone(),
                mode: g.main.mode,
                size: g.main.size,
            };
            new_kernel(
                g.owner,
                g.req,
                (&k.kernel_id, g.ids.1),
                &k.agent_id,
                g.slots,
                g.priority,
                &place,
            )
        })
        .collect()
}

impl Launcher {
    /// Creates a placed kernel: builds its `KernelCreationConfig`, pulls its image when its
    /// agent lacks it, and calls `create_kernels`. With [`Waiter::Caller`] a pull longer than
    /// 2 s goes on in the background (the row shows `PULLING`) and a failure discards the
    /// reservation; with [`Waiter::Nobody`] a failure ends the session `TERMINATED` with the
    /// error's code as its reason. Either way, no failure leaves a reservation behind.
    pub(super) async fn launch(&self, p: Placed, waiter: Waiter) -> Result<(), ManagerError> {
        let Launcher {
            store,
            pool,
            metrics,
            spec,
        } = self.clone();
        let config = kernel_config(&spec, &p, &ClusterPlace::single(), None)?;
        let on_refusal = match waiter {
            Waiter::Caller => OnRefusal::Discard,
            Waiter::Nobody => OnRefusal::Terminate,
        };
        let kernel_id = p.kernel_id.clone();
        // A failure before the agent was asked: undo the reservation the way the waiter needs.
        let undo = |e: ManagerError| {
            let (store, kernel_id) = (store.clone(), kernel_id.clone());
            async move {
                match on_refusal {
                    OnRefusal::Discard => store.discard_reservation(&kernel_id).await?,
                    OnRefusal::Terminate => {
                        store.terminate_kernel(&kernel_id, e.code(), None).await?
                    }
                };
                Err::<(), ManagerError>(e)
            }
        };
        let creation = Creation {
            pool: pool.clone(),
            metrics: metrics.clone(),
            store: store.clone(),
            agent_id: p.agent_id.clone(),
            kernel_id: p.kernel_id.clone(),
            session_id: p.session_id.clone(),
            config,
            create_timeout: spec.create_timeout,
            destroy_timeout: spec.destroy_timeout,
        };
        let pull = PullPhase {
            pool: pool.clone(),
            metrics: metrics.clone(),
            store: store.clone(),
            agent_id: p.agent_id.clone(),
            kernel_id: p.kernel_id.clone(),
            image: creation.config.image.clone(),
        };
        let follow = match pull.start().await {
            Ok(follow) => follow,
            Err(e) => return undo(e).await,
        };
        if follow {
            let now = Instant::now();
            let answer_by = match waiter {
                Waiter::Caller => now + PULL_ANSWER_WAIT,
                Waiter::Nobody => now,
            };
            match pull.follow(answer_by, now + spec.create_timeout).await {
                PullOutcome::Ready => {}
                PullOutcome::Failed(e) => return undo(e).await,
                PullOutcome::Pulling => {
                    // A long pull: answer `PULLING` now; the pull and the create go on.
                    actix::spawn(finish_in_background(
                        pull,
                        creation,
                        now + spec.image_pull_timeout,
                    ));
                    return Ok(());
                }
            }
        }
        creation.create(on_refusal).await
    }
}

impl Launcher {
    /// Creates a placed session from its stored row and request (an admitted queued session,
    /// or an orphaned pull the reconcile sweep took over), with nobody waiting; any failure
    /// ends it `TERMINATED` with the error's code as its reason (its reservation released).
    ///
    /// Errors: as [`Launcher::launch`]'s; `internal` when the stored request cannot be read.
    pub(super) async fn launch_stored(&self, stored: Admitted) -> Result<(), ManagerError> {
        let row = stored.row;
        let fail = |e: ManagerError| {
            let (store, id) = (self.store.clone(), row.id.clone());
            async move {
                store.terminate_kernel(&id, e.code(), None).await?;
                Err::<(), ManagerError>(e)
            }
        };
        let request: SessionRequest = match serde_json::from_str(&stored.request) {
            Ok(r) => r,
            Err(e) => {
                return fail(ManagerError::Internal(format!(
                    "the stored request cannot be read back: {e}"
                )))
                .await
            }
        };
        let mounts = match resolve_mounts(&self.store, &row.access_key, &request.mounts).await {
            Ok(m) => m,
            Err(e) => return fail(e).await,
        };
        let placed = Placed {
            owner: row.access_key.clone(),
            request,
            kernel_id: row.id.clone(),
            session_id: row.session_id.clone(),
            agent_id: row.agent_id.clone(),
            slots: row.resource_slots.clone(),
            mounts,
        };
        self.launch(placed, Waiter::Nobody).await
    }
}

/// How long `POST /v1/sessions` waits for a pull before it answers `PULLING` and lets the pull
/// go on (a present image, or a pull that fails at once, still answers in the call).
const PULL_ANSWER_WAIT: Duration = Duration::from_secs(2);

/// What a refused `create_kernels` does to the kernel's row.
#[derive(Clone, Copy, PartialEq, Eq)]
enum OnRefusal {
    /// Delete it (the caller gets the error; nothing was ever visible).
    Discard,
    /// Keep it `TERMINATED` with the error's code as its reason (a create the caller no longer
    /// waits for: the session shows why it ended).
    Terminate,
}

/// A placed and reserved kernel's `create_kernels` call.
struct Creation {
    pool: Addr<crate::manager::pool::AgentPool>,
    metrics: std::sync::Arc<crate::manager::metrics::ManagerMetrics>,
    store: Store,
    agent_id: String,
    kernel_id: String,
    session_id: String,
    config: KernelCreationConfig,
    create_timeout: Duration,
    destroy_timeout: Duration,
}

impl Creation {
    /// Calls `create_kernels` and records the answer; any failure undoes the reservation.
    ///
    /// Errors: the agent's refusal as the manager's error (the row deleted or terminated per
    /// `on_refusal`); `agent-unavailable` when the outcome is unknown (the row terminated
    /// `failed-to-create`, and the agent asked to destroy the kernel when it can be reached).
    async fn create(self, on_refusal: OnRefusal) -> Result<(), ManagerError> {
        let Creation {
            pool,
            metrics,
            store,
            agent_id,
            kernel_id,
            session_id,
            config,
            create_timeout,
            destroy_timeout,
        } = self;
        let call = encode_args::<CreateKernels>(&CreateKernelsArgs {
            session_id: session_id.clone(),
            kernel_ids: vec![kernel_id.clone()],
            configs: vec![to_value(&config)],
            cluster_info: Some(ClusterInfo::default()),
            kernel_image_refs: None,
        });
        let destroy = |reason: &str| {
            let (pool, metrics, agent, kid, sid, reason) = (
                pool.clone(),
                metrics.clone(),
                agent_id.clone(),
                kernel_id.clone(),
                session_id.clone(),
                reason.to_owned(),
            );
            actix::spawn(async move {
                let args = DestroyKernelArgs {
                    kernel_id: kid,
                    session_id: Some(sid),
                    reason: Some(reason),
                    suppress_events: None,
                    // The kernel's own grace (its request's, in its config).
                    grace_period: None,
                };
                let _ =
                    call_method::<DestroyKernel>(&pool, &metrics, &agent, &args, destroy_timeout)
                        .await;
            });
        };
        match call_agent(
            &pool,
            &metrics,
            &agent_id,
            "create_kernels",
            call.args,
            create_timeout,
        )
        .await
        {
            Ok(reply) => {
                // The status the agent reports (`RUNNING` when it reports none); a name that
                // is no status moves nothing.
                let results = decode_reply::<CreateKernels>(reply)
                    .map_err(|e| ManagerError::Internal(e.to_string()))?;
                if let Some(r) = results.first() {
                    let names: Vec<String> =
                        r.service_ports.iter().map(|p| p.name.clone()).collect();
                    store.set_service_ports(&kernel_id, &names).await?;
                }
                let status = results
                    .first()
                    .and_then(|r| r.info.get("status"))
                    .and_then(Value::as_str)
                    .map_or(Some(KernelStatus::Running), KernelStatus::parse);
                let moved = match status {
                    Some(status) => store.advance_kernel(&kernel_id, status).await?,
                    None => false,
                };
                // Moved forward: it was live and not `TERMINATING` (a later state), so only a
                // row that did not move is read back.
                let row = match moved {
                    true => None,
                    false => store.kernel(&kernel_id).await?,
                };
                let gone = |k: &KernelRow| k.status.is_ending();
                if let Some(k) = row.filter(gone) {
                    // Deleted while it was being created (a `PULLING` session deleted, a
                    // destroy the agent refused mid-create), or ended by the reconcile sweep
                    // past its state's deadline: what the row says stands, the kernel goes.
                    destroy(k.status_reason.as_deref().unwrap_or("user-requested"));
                    return Err(ManagerError::SessionNotFound(session_id));
                }
                metrics.sessions_created.inc();
                Ok(())
            }
            Err(e) if e.failure().is_some() => {
                // The agent refused it whole: nothing exists there.
                let error = agent_error(&e);
                match on_refusal {
                    OnRefusal::Discard => {
                        store.discard_reservation(&kernel_id).await?;
                    }
                    OnRefusal::Terminate => {
                        store
                            .terminate_kernel(&kernel_id, error.code(), None)
                            .await?;
                    }
                }
                Err(error)
            }
            Err(e) => {
                // Unknown outcome: the kernel may exist. Release it here, and ask the agent
                // to destroy it when it can be reached (its kernel_terminated is then a no-op).
                store
                    .terminate_kernel(&kernel_id, "failed-to-create", None)
                    .await?;
                destroy("failed-to-create");
                Err(ManagerError::AgentUnavailable(e.to_string()))
            }
        }
    }
}

/// How long one stretch of following a background pull lasts before the kernel's row is looked
/// at again (a session deleted, or its agent lost, meanwhile stops the follow).
const BACKGROUND_STRETCH: Duration = Duration::from_secs(10);

/// Follows a pull the create call no longer waits for until it ends or `deadline` (`[scheduler]
/// image-pull-timeout`) passes, then creates the kernel; a failure ends the session
/// `TERMINATED` with the error's code as its reason (`registry-auth-failed`, …).
async fn finish_in_background(pull: PullPhase, creation: Creation, deadline: Instant) {
    let (store, kernel_id) = (creation.store.clone(), creation.kernel_id.clone());
    let live = || async {
        store
            .kernel(&kernel_id)
            .await
            .ok()
            .flatten()
            .is_some_and(|k| k.is_live())
    };
    let failed = |e: ManagerError| {
        let (store, kernel_id) = (store.clone(), kernel_id.clone());
        async move {
            tracing::info!(kernel_id = %kernel_id, error = %e, "the session's image pull failed");
            if let Err(se) = store.terminate_kernel(&kernel_id, e.code(), None).await {
                tracing::warn!(kernel_id = %kernel_id, error = %se, "cannot end a session whose pull failed");
            }
        }
    };
    loop {
        let stretch = (Instant::now() + BACKGROUND_STRETCH).min(deadline);
        match pull.follow(stretch, deadline).await {
            PullOutcome::Ready => break,
            PullOutcome::Failed(e) => return failed(e).await,
            PullOutcome::Pulling if Instant::now() >= deadline => {
                return failed(ManagerError::ImagePullTimeout(format!(
                    "{}: still pulling at [scheduler] image-pull-timeout",
                    pull.image.canonical
                )))
                .await;
            }
            PullOutcome::Pulling => {
                if !live().await {
                    return;
                }
            }
        }
    }
    if !live().await {
        return;
    }
    let kernel_id = creation.kernel_id.clone();
    if let Err(e) = creation.create(OnRefusal::Terminate).await {
        tracing::info!(kernel_id = %kernel_id, error = %e, "create after a pull failed");
    }
}

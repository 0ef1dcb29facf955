//! OTP-grade supervision and resource stages on actix, domain-free.
//!
//! actix restarts a stopped `Supervised` actor and nothing more. This crate adds what
//! Erlang/OTP's `supervisor` gives (restart strategies and intensity, ordered start, reverse
//! shutdown with timeouts, panics contained to the child that panicked, dynamic children) and
//! the Provisioner/Stage chain of the agent-architecture design (seed 001).
//!
//! # Supervision
//!
//! A [`Supervisor`] is an actix actor that owns an ordered list of children, each described
//! by a [`ChildSpec`]: an id, how to start it (a future, an actix actor, or a nested
//! supervisor), a [`RestartType`] and a [`Shutdown`] policy.
//!
//! * Children start in list order; the supervisor stops them in reverse order, asking each
//!   to stop and forcing it when its graceful timeout runs out.
//! * Every child runs as its own task under `catch_unwind`: a panic is that child's abnormal
//!   exit ([`ExitReason::Panicked`]), never a dead arbiter or process.
//! * When a child must be restarted, the [`Strategy`] picks the group to restart with it;
//!   the group's running members stop in reverse order, then the group starts in order,
//!   after an optional [`Backoff`].
//! * More than [`Intensity::max_restarts`] restarts within [`Intensity::max_window`] and the
//!   supervisor stops all its children and exits with [`ExitReason::Failed`], so that its own
//!   supervisor deals with it (escalation); at the root, [`Root::join`] returns it.
//! * [`AddChild`], [`RemoveChild`] and [`WhichChildren`] manage children at run time, e.g.
//!   a registry with one supervisor per kernel.
//!
//! ```
//! use std::time::Duration;
//! use actors::{AddChild, ChildSpec, Intensity, RestartType, Shutdown, Strategy, Supervisor};
//!
//! # actix_rt::System::new().block_on(async {
//! // An agent-like tree: a worker that fails once, and a dynamic registry of kernels.
//! let attempts = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
//! let root = Supervisor::build("agent")
//!     .strategy(Strategy::RestForOne)
//!     .intensity(Intensity::new(3, 10)) // at most 3 restarts within 10 s
//!     .child(ChildSpec::task("store", move |stop| {
//!         let attempt = attempts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
//!         async move {
//!             if attempt == 0 {
//!                 return Err("disk not ready"); // restarted: it is permanent
//!             }
//!             stop.requested().await;
//!             Ok(())
//!         }
//!     }))
//!     .child(ChildSpec::supervisor("kernels", Supervisor::build("kernels")))
//!     .start();
//!
//! let kernel = ChildSpec::task("kernel-1", |stop| async move {
//!     stop.requested().await;
//!     Ok::<_, String>(())
//! })
//! .restart(RestartType::Temporary)
//! .shutdown(Shutdown::millis(500));
//! let registry = Supervisor::build("kernels").child(kernel);
//! root.addr().send(AddChild(ChildSpec::supervisor("more-kernels", registry))).await.unwrap().unwrap();
//!
//! tokio::time::sleep(Duration::from_millis(10)).await;
//! // Children stop in reverse order: more-kernels (kernel-1 inside it), kernels, store.
//! assert_eq!(root.shutdown().await, actors::ExitReason::Shutdown);
//! # });
//! ```
//!
//! # Stages
//!
//! A [`Provisioner`] sets one kind of resource up from a spec and tears it down. A [`Stage`]
//! owns at most one such resource. A [`StageChain`] sets stages up in order, building each
//! stage's spec from what the earlier stages produced ([`Resources`]); when stage *k* fails
//! it tears down stages *k−1 … 1* in reverse and reports a [`SetupError`] naming stage *k*.
//! Teardown runs in reverse and is idempotent. [`StageChain::detach`] lets go of the
//! resources without releasing them ([`Detached`]), and [`StageChainBuilder::rebuild`] owns
//! existing ones again (recovery). Each setup and teardown is reported to a [`StageHook`]
//! with its duration and error, for metrics. A [`Runner`] is the actix actor that owns a
//! chain, so it can be a supervised child.
//!
//! ```
//! use actors::{BoxError, Provisioner, StageChain};
//!
//! struct Ports;
//! impl Provisioner for Ports {
//!     type Spec = u16;
//!     type Resource = Vec<u16>;
//!     fn name(&self) -> &'static str { "ports" }
//!     async fn setup(&self, count: u16) -> Result<Vec<u16>, BoxError> {
//!         Ok((30000..30000 + count).collect())
//!     }
//!     async fn teardown(&self, _ports: Vec<u16>) -> Result<(), BoxError> { Ok(()) }
//! }
//!
//! struct Container;
//! impl Provisioner for Container {
//!     type Spec = Vec<u16>;
//!     type Resource = String;
//!     fn name(&self) -> &'static str { "container" }
//!     async fn setup(&self, ports: Vec<u16>) -> Result<String, BoxError> {
//!         Ok(format!("container publishing {ports:?}"))
//!     }
//!     async fn teardown(&self, _id: String) -> Result<(), BoxError> { Ok(()) }
//! }
//!
//! # futures::executor::block_on(async {
//! let mut chain = StageChain::builder()
//!     .stage(Ports, |_| Ok(2))
//!     // The container's spec comes from the ports stage's resource.
//!     .stage(Container, |earlier| Ok(earlier.get::<Vec<u16>>("ports")?.clone()))
//!     .build();
//! chain.setup().await.unwrap();
//! assert_eq!(chain.resources().get::<String>("container").unwrap(), "container publishing [30000, 30001]");
//! chain.teardown().await.unwrap(); // container, then ports
//! chain.teardown().await.unwrap(); // nothing left: a no-op
//! # });
//! ```
//!
//! # Stage trees
//!
//! A [`StageTree`] runs the same stages as supervised children instead: one task per stage
//! under a `rest_for_one` [`Supervisor`], each setting up once the stages before it hold
//! their resources, optionally watching its resource ([`StageTreeBuilder::watched_stage`]),
//! and releasing it when stopped. A watcher's `Err` restarts that stage and the ones after
//! it within the tree's [`Intensity`] (a kernel's restart policy); [`StageTree::stages`]
//! shows each stage's status, restarts and setup time.
//!
//! # A kernel registry
//!
//! The agent's `KernelRegistry` is a one_for_one [`Supervisor`] without initial children. A
//! kernel is added as
//! `AddChild(ChildSpec::actor(id, move |ctx, exit| Runner::new(chain(&cfg)).with_exit(exit)))`
//! with [`RestartType::Temporary`] and a [`Shutdown`] long enough for its teardown (the
//! factory publishes `ctx.address()` where the agent can find it); it is then set up with
//! [`SetupChain`] (image → slots → ports → scratch → mounts → container → service ports).
//! Destroying it is [`RemoveChild`]: its runner stops and tears the stages down in reverse.
//! On graceful agent shutdown each runner gets [`DetachChain`] and the [`Detached`] resources
//! are persisted; on restart [`StageChainBuilder::rebuild`] adopts them again.
//!
//! # OTP terms
//!
//! | OTP | here |
//! |---|---|
//! | `supervisor`, `init/1` flags | [`Supervisor`], [`Supervisor::build`] → [`SupervisorBuilder`] |
//! | `child_spec()`: `id`, `start` | [`ChildSpec`]: [`ChildSpec::task`], [`ChildSpec::actor`], [`ChildSpec::supervisor`] |
//! | `restart`: `permanent` / `transient` / `temporary` | [`RestartType`] |
//! | `shutdown`: ms / `brutal_kill` / `infinity` | [`Shutdown::Graceful`] / [`Shutdown::Immediate`] / [`Shutdown::Infinity`] |
//! | `strategy`: `one_for_one` / `one_for_all` / `rest_for_one` | [`Strategy`] |
//! | `intensity`, `period` | [`Intensity::max_restarts`], [`Intensity::max_window`] |
//! | exit reasons `normal`, `shutdown`, `killed`, `{error, _}` | [`ExitReason`] |
//! | `exit(Child, shutdown)` | [`StopSignal`] (tasks), `ctx.stop()` (actors) |
//! | `start_child`, `terminate_child` + `delete_child`, `which_children` | [`AddChild`], [`RemoveChild`], [`WhichChildren`] |
//! | links (a dead supervisor takes its children) | dropping a [`Root`] or killing a supervisor forces its children |
//!
//! Seed 001's names map one to one: `Provisioner` → [`Provisioner`], `Stage` → [`Stage`],
//! `SpecGenerator` → the spec closure of [`StageChainBuilder::stage`], `Runner` →
//! [`StageChain`] owned by the [`Runner`] actor, the metrics it mentions → [`StageHook`].

#![warn(missing_docs)]

mod child;
mod stage;
mod supervisor;

pub use child::{ExitHandle, ExitReason, StopSignal};
pub use stage::{
    BoxError, DetachChain, Detached, MissingResource, NoopHook, Observer, Phase, Provisioner,
    Resources, Runner, SetupChain, SetupError, Stage, StageChain, StageChainBuilder, StageError,
    StageHook, StageInfo, StageKey, StageStatus, StageTree, StageTreeBuilder, TeardownChain,
    TeardownError, WatchFn,
};
pub use supervisor::{
    AddChild, Backoff, ChildInfo, ChildSpec, Intensity, RemoveChild, RestartType, Root, Shutdown,
    Strategy, Supervisor, SupervisorBuilder, SupervisorError, WhichChildren,
};

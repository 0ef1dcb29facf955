//! The stage chain: stages set up in order, each fed by what the earlier ones produced, torn
//! down in reverse (seed 001's `Runner` over its resources).

use std::any::{type_name, Any};
use std::fmt;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use futures::future::LocalBoxFuture;
use futures::FutureExt;

use super::hook::{NoopHook, StageHook};
use super::owned::{Phase, Stage, StageError};
use super::provisioner::{BoxError, Provisioner};
use crate::child::panic_message;

/// Builds a stage's spec from the chain's earlier resources (seed 001's `SpecGenerator`).
type SpecFn<S> = Box<dyn Fn(&Resources<'_>) -> Result<S, BoxError>>;

/// A stage and its spec generator, with the provisioner's types erased so a chain can hold
/// stages of different kinds.
trait Link {
    fn name(&self) -> &'static str;
    fn resource(&self) -> Option<&dyn Any>;
    fn setup<'a>(
        &'a mut self,
        earlier: &Resources<'_>,
    ) -> LocalBoxFuture<'a, Result<(), StageError>>;
    fn teardown(&mut self) -> LocalBoxFuture<'_, Result<(), StageError>>;
    fn detach(&mut self) -> Option<Box<dyn Any + Send>>;
    fn adopt(&mut self, resource: Box<dyn Any + Send>) -> Result<(), StageError>;
    fn set_hook(&mut self, hook: Arc<dyn StageHook>);
}

struct Linked<P: Provisioner> {
    stage: Stage<P>,
    spec: SpecFn<P::Spec>,
}

impl<P: Provisioner> Link for Linked<P> {
    fn name(&self) -> &'static str {
        self.stage.name()
    }

    fn resource(&self) -> Option<&dyn Any> {
        self.stage.resource().map(|r| r as &dyn Any)
    }

    fn setup<'a>(
        &'a mut self,
        earlier: &Resources<'_>,
    ) -> LocalBoxFuture<'a, Result<(), StageError>> {
        let spec = panic::catch_unwind(AssertUnwindSafe(|| (self.spec)(earlier))).unwrap_or_else(
            |payload| Err(format!("spec panicked: {}", panic_message(&*payload)).into()),
        );
        async move {
            match spec {
                Ok(spec) => self.stage.setup(spec).await.map(drop),
                Err(cause) => Err(self.stage.spec_failed(cause)),
            }
        }
        .boxed_local()
    }

    fn teardown(&mut self) -> LocalBoxFuture<'_, Result<(), StageError>> {
        self.stage.teardown().boxed_local()
    }

    fn detach(&mut self) -> Option<Box<dyn Any + Send>> {
        self.stage
            .detach()
            .map(|r| Box::new(r) as Box<dyn Any + Send>)
    }

    fn adopt(&mut self, resource: Box<dyn Any + Send>) -> Result<(), StageError> {
        let stage = self.name();
        let error = |source: BoxError| StageError {
            stage,
            phase: Phase::Adopt,
            source,
        };
        let resource = resource.downcast::<P::Resource>().map_err(|_| {
            error(format!("resource is not a {}", type_name::<P::Resource>()).into())
        })?;
        self.stage
            .adopt(*resource)
            .map_err(|_| error("already holds a resource".into()))
    }

    fn set_hook(&mut self, hook: Arc<dyn StageHook>) {
        self.stage.set_hook(hook);
    }
}

/// Read access to the resources of the stages before the one being set up, by stage name.
///
/// Given to spec generators; also [`StageChain::resources`] for the chain's owner.
pub struct Resources<'a> {
    source: Source<'a>,
}

/// Where a [`Resources`] view reads: a chain's stages, or a stage tree's board.
enum Source<'a> {
    Links(&'a [Box<dyn Link>]),
    Board(&'a [(&'static str, Option<&'a (dyn Any + Send)>)]),
}

impl<'a> Resources<'a> {
    /// A view over a stage tree's published resources, `(stage, resource)` in order.
    pub(crate) fn board(entries: &'a [(&'static str, Option<&'a (dyn Any + Send)>)]) -> Self {
        Resources {
            source: Source::Board(entries),
        }
    }

    fn lookup(&self, stage: &str) -> Option<&'a dyn Any> {
        match self.source {
            Source::Links(links) => links
                .iter()
                .find(|l| l.name() == stage)
                .and_then(|l| l.resource()),
            Source::Board(entries) => entries
                .iter()
                .find(|(name, _)| *name == stage)
                .and_then(|(_, r)| r.map(|r| r as &dyn Any)),
        }
    }

    /// The resource of stage `stage`, as an `R`.
    ///
    /// # Errors
    /// [`MissingResource`] if no such stage is visible, it holds nothing, or its resource is
    /// not an `R`. It converts into [`BoxError`], so a spec generator can use `?`.
    pub fn get<R: 'static>(&self, stage: &str) -> Result<&'a R, MissingResource> {
        self.lookup(stage)
            .and_then(|r| r.downcast_ref::<R>())
            .ok_or_else(|| MissingResource {
                stage: stage.to_owned(),
                ty: type_name::<R>(),
            })
    }
}

/// [`Resources::get`] found no resource of that stage and type.
#[derive(Debug, thiserror::Error)]
#[error("no `{ty}` resource from stage `{stage}`")]
pub struct MissingResource {
    /// The stage asked for.
    pub stage: String,
    /// The type asked for.
    pub ty: &'static str,
}

/// Resources handed out by [`StageChain::detach`], or gathered for [`StageChain::adopt`]
/// when recovering: each keyed by the name of the stage that owns it, in chain order.
#[derive(Default)]
pub struct Detached {
    pub(crate) resources: Vec<(&'static str, Box<dyn Any + Send>)>,
}

impl Detached {
    /// An empty set, to be filled with [`with`](Detached::with) on recovery.
    pub fn new() -> Detached {
        Detached::default()
    }

    /// Adds `resource` as the resource of stage `stage`.
    pub fn with<R: Send + 'static>(mut self, stage: &'static str, resource: R) -> Detached {
        self.resources.push((stage, Box::new(resource)));
        self
    }

    /// The resource of stage `stage`, if present and an `R` (for persisting it).
    pub fn get<R: 'static>(&self, stage: &str) -> Option<&R> {
        self.resources
            .iter()
            .find(|(s, _)| *s == stage)
            .and_then(|(_, r)| r.downcast_ref())
    }

    /// The names of the stages present, in chain order.
    pub fn stages(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.resources.iter().map(|(s, _)| *s)
    }

    /// `true` if no stage held a resource.
    pub fn is_empty(&self) -> bool {
        self.resources.is_empty()
    }
}

impl fmt::Debug for Detached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.stages()).finish()
    }
}

/// [`StageChain::setup`] failed: the failing stage's error, and the errors (if any) of the
/// rollback that tore the earlier stages down.
#[derive(Debug, thiserror::Error)]
#[error("{failed}{}", if rollback.is_empty() { String::new() } else { format!(" (and {} rollback error(s))", rollback.len()) })]
pub struct SetupError {
    /// The stage that failed; its `stage` field names it.
    pub failed: StageError,
    /// Teardown errors of earlier stages during the rollback, in teardown order.
    pub rollback: Vec<StageError>,
}

/// [`StageChain::teardown`] finished, but some stages failed to tear down.
#[derive(Debug, thiserror::Error)]
#[error("{} stage(s) failed to tear down; first: {}", errors.len(), errors[0])]
pub struct TeardownError {
    /// The failures, in teardown (reverse) order; never empty.
    pub errors: Vec<StageError>,
}

/// An ordered chain of [`Stage`]s, each owning one resource: set up in order, torn down in
/// reverse (seed 001's `Runner` with `Stage`s and spec generators).
///
/// Lifecycle: [`setup`](StageChain::setup) once built (a failure at stage *k* tears down
/// *k−1 … 1* and reports stage *k*); [`teardown`](StageChain::teardown) when done, any number
/// of times; or [`detach`](StageChain::detach) to leave every resource in place, then later
/// [`StageChainBuilder::rebuild`] (or [`adopt`](StageChain::adopt)) to own them again.
/// Not `Send`: it lives in one actor ([`Runner`](crate::Runner) or your own).
pub struct StageChain {
    links: Vec<Box<dyn Link>>,
}

impl StageChain {
    /// Starts a chain description: add stages in setup order.
    pub fn builder() -> StageChainBuilder {
        StageChainBuilder {
            links: Vec::new(),
            hook: Arc::new(NoopHook),
        }
    }

    /// The stage names, in setup order.
    pub fn stages(&self) -> Vec<&'static str> {
        self.links.iter().map(|l| l.name()).collect()
    }

    /// The resources the stages hold now, by stage name.
    pub fn resources(&self) -> Resources<'_> {
        Resources {
            source: Source::Links(&self.links),
        }
    }

    /// `true` when every stage holds its resource.
    pub fn is_ready(&self) -> bool {
        self.links.iter().all(|l| l.resource().is_some())
    }

    /// Sets up, in order, every stage that does not hold a resource yet (stages adopted on
    /// rebuild are kept as they are), each with the spec its generator builds from the
    /// resources before it.
    ///
    /// # Errors
    /// On the first failing stage *k*, tears down stages *k−1 … 1* in reverse and returns
    /// [`SetupError`] naming stage *k*; the chain then holds nothing and may be set up again.
    pub async fn setup(&mut self) -> Result<(), SetupError> {
        for k in 0..self.links.len() {
            if self.links[k].resource().is_some() {
                continue;
            }
            let (earlier, rest) = self.links.split_at_mut(k);
            if let Err(failed) = rest[0]
                .setup(&Resources {
                    source: Source::Links(earlier),
                })
                .await
            {
                tracing::warn!(%failed, "stage setup failed; rolling back");
                let rollback = teardown_all(&mut self.links[..k]).await;
                return Err(SetupError { failed, rollback });
            }
        }
        Ok(())
    }

    /// Tears down, in reverse order, every stage that holds a resource. Idempotent: stages
    /// that never finished setup, were detached, or were already torn down are skipped, so
    /// each resource is released at most once.
    ///
    /// # Errors
    /// [`TeardownError`] with every stage that failed; the others were still torn down.
    pub async fn teardown(&mut self) -> Result<(), TeardownError> {
        let errors = teardown_all(&mut self.links).await;
        if errors.is_empty() {
            Ok(())
        } else {
            Err(TeardownError { errors })
        }
    }

    /// Stops owning the resources without tearing them down and hands them out, so the
    /// caller can persist them (the agent's graceful shutdown keeps containers running).
    /// A later teardown of this chain does nothing.
    pub fn detach(&mut self) -> Detached {
        let resources = self
            .links
            .iter_mut()
            .filter_map(|l| Some((l.name(), l.detach()?)))
            .collect();
        Detached { resources }
    }

    /// Takes ownership of resources that already exist (recovery), each by its stage name;
    /// stages absent from `existing` stay empty.
    ///
    /// # Errors
    /// [`Phase::Adopt`] if `existing` names a stage this chain lacks, gives a resource of the
    /// wrong type, or names a stage that already holds one. Stages adopted before the error
    /// keep their resource.
    pub fn adopt(&mut self, existing: Detached) -> Result<(), StageError> {
        for (stage, resource) in existing.resources {
            let link = self
                .links
                .iter_mut()
                .find(|l| l.name() == stage)
                .ok_or_else(|| StageError {
                    stage,
                    phase: Phase::Adopt,
                    source: "no such stage in this chain".into(),
                })?;
            link.adopt(resource)?;
        }
        Ok(())
    }
}

impl fmt::Debug for StageChain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(
                self.links
                    .iter()
                    .map(|l| (l.name(), l.resource().is_some())),
            )
            .finish()
    }
}

async fn teardown_all(links: &mut [Box<dyn Link>]) -> Vec<StageError> {
    let mut errors = Vec::new();
    for link in links.iter_mut().rev() {
        if let Err(e) = link.teardown().await {
            tracing::warn!(%e, "stage teardown failed");
            errors.push(e);
        }
    }
    errors
}

/// Describes a [`StageChain`]: its stages in setup order and its [`StageHook`].
pub struct StageChainBuilder {
    links: Vec<Box<dyn Link>>,
    hook: Arc<dyn StageHook>,
}

impl StageChainBuilder {
    /// Reports every stage's setup and teardown to `hook` (default [`NoopHook`]).
    pub fn hook(mut self, hook: Arc<dyn StageHook>) -> Self {
        self.hook = hook;
        self
    }

    /// Appends a stage run by `provisioner`, whose spec `spec(earlier)` builds from the
    /// resources of the stages added before it (seed 001's spec generator). A generator error
    /// or panic is that stage's setup failure. It is `Fn` so a torn-down chain can be set up
    /// again.
    ///
    /// # Panics
    /// If a stage with the same name was already added (a programming error).
    pub fn stage<P, F>(mut self, provisioner: P, spec: F) -> Self
    where
        P: Provisioner,
        F: Fn(&Resources<'_>) -> Result<P::Spec, BoxError> + 'static,
    {
        let name = provisioner.name();
        assert!(
            self.links.iter().all(|l| l.name() != name),
            "duplicate stage name `{name}`"
        );
        self.links.push(Box::new(Linked {
            stage: Stage::new(provisioner),
            spec: Box::new(spec),
        }));
        self
    }

    /// The chain, holding nothing yet.
    pub fn build(self) -> StageChain {
        let mut links = self.links;
        for link in &mut links {
            link.set_hook(self.hook.clone());
        }
        StageChain { links }
    }

    /// The chain, owning `existing` resources (recovery after a detach or a restart): see
    /// [`StageChain::adopt`].
    ///
    /// # Errors
    /// As [`StageChain::adopt`].
    pub fn rebuild(self, existing: Detached) -> Result<StageChain, StageError> {
        let mut chain = self.build();
        chain.adopt(existing)?;
        Ok(chain)
    }
}

//! The provisioner: how one kind of resource is set up and torn down (seed 001's
//! `Provisioner[TSpec, TResource]`).

/// The error type provisioners return; any error that can cross threads.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Sets up and tears down one kind of resource, holding no per-resource state (seed 001).
///
/// Everything a setup needs arrives as its `Spec`; what it produced comes back as the
/// `Resource`, which a [`Stage`](crate::Stage) then owns until it hands it back to
/// [`teardown`](Provisioner::teardown). Dependencies on earlier stages are injected through
/// the spec (see [`StageChainBuilder::stage`](crate::StageChainBuilder::stage)), not looked
/// up by the provisioner.
///
/// The futures need not be `Send`: stages run on the actix arbiter of the actor that owns
/// them.
#[allow(async_fn_in_trait)] // Deliberate: callers poll these on one thread, never need `Send`.
pub trait Provisioner: 'static {
    /// What [`setup`](Provisioner::setup) needs.
    type Spec: 'static;
    /// What [`setup`](Provisioner::setup) produced and [`teardown`](Provisioner::teardown)
    /// releases. `Send` so a detached resource can be handed to another actor to persist.
    type Resource: Send + 'static;

    /// The stage's name: unique within a chain, used in errors and as the metrics label.
    fn name(&self) -> &'static str;

    /// Creates the resource. On `Err` nothing must be left behind: the stage holds nothing
    /// to tear down.
    async fn setup(&self, spec: Self::Spec) -> Result<Self::Resource, BoxError>;

    /// Releases the resource. Called at most once per resource; on `Err` the resource is
    /// considered gone anyway (the error is reported, never retried).
    async fn teardown(&self, resource: Self::Resource) -> Result<(), BoxError>;
}

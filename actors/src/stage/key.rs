//! Typed stage keys: a stage's name together with the type of its resource, so that reading
//! another stage's resource ([`Resources::of`]) or handing one back on recovery
//! ([`Detached::with_key`]) cannot name a stage with a typo or ask for the wrong type.

use std::fmt;
use std::marker::PhantomData;

use super::chain::{Detached, MissingResource, Resources};
use super::provisioner::Provisioner;

/// The name of a stage whose resource is an `R`; declare one `const` per stage:
///
/// ```
/// # use actors::{BoxError, Provisioner, StageKey};
/// struct Ports;
/// impl Provisioner for Ports {
///     type Spec = u16;
///     type Resource = Vec<u16>;
///     fn name(&self) -> &'static str { PORTS.name() }
///     async fn setup(&self, n: u16) -> Result<Vec<u16>, BoxError> { Ok((1..=n).collect()) }
///     async fn teardown(&self, _: Vec<u16>) -> Result<(), BoxError> { Ok(()) }
/// }
/// // Does not compile unless `Vec<u16>` is `Ports`'s resource.
/// const PORTS: StageKey<Vec<u16>> = StageKey::of::<Ports>("ports");
/// ```
pub struct StageKey<R> {
    name: &'static str,
    resource: PhantomData<fn() -> R>,
}

impl<R> StageKey<R> {
    /// The key of the stage named `name` whose provisioner is a `P` (whose resource must be
    /// an `R`); `name` must be what `P`'s [`Provisioner::name`] returns.
    pub const fn of<P: Provisioner<Resource = R>>(name: &'static str) -> StageKey<R> {
        StageKey {
            name,
            resource: PhantomData,
        }
    }

    /// The stage's name.
    pub const fn name(self) -> &'static str {
        self.name
    }
}

impl<R> Clone for StageKey<R> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<R> Copy for StageKey<R> {}

impl<R> fmt::Debug for StageKey<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StageKey({})", self.name)
    }
}

impl<'a> Resources<'a> {
    /// The resource of the stage `key` names, as [`Resources::get`] with its name and type.
    ///
    /// Errors: [`MissingResource`] when that stage holds no resource (yet).
    pub fn of<R: 'static>(&self, key: StageKey<R>) -> Result<&'a R, MissingResource> {
        self.get(key.name)
    }
}

impl Detached {
    /// Adds `resource` as the resource of the stage `key` names.
    pub fn with_key<R: Send + 'static>(self, key: StageKey<R>, resource: R) -> Detached {
        self.with(key.name, resource)
    }
}

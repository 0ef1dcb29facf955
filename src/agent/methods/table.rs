//! How a method module lists its methods: a [`Table`] over one shared state, each method one
//! `async fn(state, args)` (see [`super::Ctx`]), so that the state is cloned once per call in
//! one place instead of once per closure by hand.

use std::future::Future;

use rmpv::Value;

use crate::rpc::agent_api::Method;
use crate::rpc::{Call, Dispatcher, ErrorMeta};

/// Registers handlers on a [`Dispatcher`], each called with a clone of `state`.
pub(crate) struct Table<'a, S> {
    dispatcher: &'a mut Dispatcher,
    state: S,
}

impl<'a, S: Clone + 'static> Table<'a, S> {
    /// A table registering on `dispatcher`, handing `state` to every handler.
    pub(crate) fn new(dispatcher: &'a mut Dispatcher, state: S) -> Self {
        Table { dispatcher, state }
    }

    /// Registers `handler` as the typed method `M` ([`Dispatcher::register_method`]: arguments
    /// decoded into `M::Args`, a bad one a FAILURE `TypeError`; the reply encoded with named
    /// fields), replacing any earlier handler of that name.
    pub(crate) fn method<M, F, Fut>(&mut self, handler: F) -> &mut Self
    where
        M: Method + 'static,
        S: Send + Sync,
        F: Fn(S, M::Args) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<M::Reply, ErrorMeta>> + 'static,
    {
        let state = self.state.clone();
        self.dispatcher
            .register_method::<M, _, _>(move |args, _| handler(state.clone(), args));
        self
    }

    /// Registers `handler` under `name` with the raw [`Call`], for a method whose arguments
    /// the typed contract does not decode alone (kernelvisor's own, or one with an optional
    /// shape).
    pub(crate) fn raw<F, Fut>(&mut self, name: &str, handler: F) -> &mut Self
    where
        S: Send + Sync,
        F: Fn(S, Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Value, ErrorMeta>> + 'static,
    {
        let state = self.state.clone();
        self.dispatcher
            .register(name, move |call| handler(state.clone(), call));
        self
    }

    /// Makes `alias` call the handler registered as `target` ([`Dispatcher::alias`]; panics
    /// when `target` is not registered yet).
    pub(crate) fn alias(&mut self, alias: &str, target: &str) -> &mut Self {
        self.dispatcher.alias(alias, target);
        self
    }
}

//! The agent's RPC dispatch table: method name → async handler.
//!
//! Later issues extend it with `register` (kernel lifecycle, execute, …). A handler gets the
//! decoded [`Call`] and returns a msgpack value or an [`ErrorMeta`] that crosses the wire as
//! FAILURE with a stable name (`KernelNotFound`, `ResourceExhausted`, …).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::LocalBoxFuture;
use futures::FutureExt;
use rmpv::Value;

use super::codec::{Call, ErrorMeta};
use super::failure::Failure;

/// What a handler returns: the RESULT value, or a FAILURE.
pub type HandlerResult = Result<Value, ErrorMeta>;

/// A registered handler. Handlers run on the RPC server's arbiter, each in its own task, so
/// they may hold `!Send` state across awaits; blocking work belongs in `spawn_blocking`.
pub type Handler = Arc<dyn Fn(Call) -> LocalBoxFuture<'static, HandlerResult> + Send + Sync>;

impl ErrorMeta {
    /// A user-level error with a stable `name` (the Python exception type upstream) and a
    /// description; no traceback.
    pub fn new(name: impl Into<String>, repr: impl Into<String>) -> Self {
        ErrorMeta {
            name: name.into(),
            repr: repr.into(),
            traceback: String::new(),
        }
    }
}

/// Told about every request a [`Dispatcher`] resolved or refused (metrics: Backend.AI's
/// `backendai_rpc_requests`, `…_failure_requests`, `…_request_duration_seconds`).
pub trait RequestObserver: Send + Sync + 'static {
    /// `method` finished after `duration`; `failure` is the FAILURE/ERROR name when it failed
    /// (`UnknownMethod`, a handler's error name, `HandlerPanicked`, `CancelledError`).
    fn observe(&self, method: &str, duration: Duration, failure: Option<&str>);

    /// A registered handler of `method` failed with `error` (a FAILURE it returned, or
    /// `HandlerPanicked`); not called for unknown methods nor refused `agent_id`s, which never
    /// reach a handler. Backend.AI's agent sends `agent_error` here (`collect_error`).
    fn failed(&self, method: &str, error: &ErrorMeta) {
        let _ = (method, error);
    }
}

/// Reports a request when dropped: after its handler's future finished, or when it was
/// dropped unfinished (cancelled, or unwinding from a panic).
struct Observed {
    observer: Arc<dyn RequestObserver>,
    method: Arc<str>,
    started: Instant,
    outcome: Option<Option<String>>,
}

impl Drop for Observed {
    fn drop(&mut self) {
        let failure = match &self.outcome {
            Some(f) => f.as_deref(),
            None if std::thread::panicking() => {
                let e = ErrorMeta::failure(
                    Failure::HandlerPanicked,
                    format!("the handler of {} panicked", self.method),
                );
                self.observer.failed(&self.method, &e);
                Some(Failure::HandlerPanicked.as_str())
            }
            None => Some("CancelledError"),
        };
        self.observer
            .observe(&self.method, self.started.elapsed(), failure);
    }
}

/// Method name → handler, plus the agent id that an `agent_id` kwarg must name.
#[derive(Clone, Default)]
pub struct Dispatcher {
    methods: HashMap<String, Handler>,
    agent_id: Option<String>,
    observer: Option<Arc<dyn RequestObserver>>,
}

impl Dispatcher {
    /// An empty table. With `agent_id`, calls whose `agent_id` kwarg names another agent fail
    /// with `AgentIdMismatch` (Backend.AI passes it to most methods; ours is accepted and dropped).
    pub fn new(agent_id: Option<String>) -> Self {
        Dispatcher {
            methods: HashMap::new(),
            agent_id,
            observer: None,
        }
    }

    /// Reports every request to `observer` from now on.
    pub fn observe(&mut self, observer: Arc<dyn RequestObserver>) -> &mut Self {
        self.observer = Some(observer);
        self
    }

    /// Registers `handler` under `method`, replacing any earlier one.
    pub fn register<F, Fut>(&mut self, method: &str, handler: F) -> &mut Self
    where
        F: Fn(Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = HandlerResult> + 'static,
    {
        self.methods.insert(
            method.to_owned(),
            Arc::new(move |call| handler(call).boxed_local()),
        );
        self
    }

    /// Registers a typed method of the agent contract ([`super::agent_api`]): the call's
    /// arguments are decoded into `M::Args` (a missing or mistyped one is a FAILURE `TypeError`
    /// naming it) and the handler's `M::Reply` is encoded with named fields. The handler also
    /// gets the raw [`Call`] (for what the arguments do not carry, e.g. the ZAP user id).
    pub fn register_method<M, F, Fut>(&mut self, handler: F) -> &mut Self
    where
        M: super::agent_api::Method + 'static,
        F: Fn(M::Args, Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<M::Reply, ErrorMeta>> + 'static,
    {
        let handler = Arc::new(handler);
        self.register(M::NAME, move |call| {
            let handler = handler.clone();
            async move {
                let args = super::agent_api::decode_args::<M>(&call).map_err(|e| {
                    ErrorMeta::failure(Failure::TypeError, format!("{}(): {e}", M::NAME))
                })?;
                let reply = handler(args, call).await?;
                Ok(super::agent_api::to_value(&reply))
            }
        })
    }

    /// Makes `alias` call the handler registered as `target` (e.g. `reset_instance` → `reset_agent`).
    ///
    /// Panics if `target` is not registered: a wiring mistake caught at start-up.
    pub fn alias(&mut self, alias: &str, target: &str) -> &mut Self {
        let h = self
            .methods
            .get(target)
            .unwrap_or_else(|| panic!("alias {alias} → unknown method {target}"))
            .clone();
        self.methods.insert(alias.to_owned(), h);
        self
    }

    /// The registered method names, sorted.
    pub fn methods(&self) -> Vec<&str> {
        let mut m: Vec<&str> = self.methods.keys().map(String::as_str).collect();
        m.sort_unstable();
        m
    }

    /// Looks `method` up and checks the `agent_id` kwarg, returning the handler and the call
    /// with that kwarg removed.
    ///
    /// Errors (sent as FAILURE): `UnknownMethod` naming the method; `AgentIdMismatch`.
    pub fn resolve(&self, method: &str, call: Call) -> Result<(Handler, Call), ErrorMeta> {
        let resolved = self.lookup(method, call);
        let Some(observer) = &self.observer else {
            return resolved;
        };
        match resolved {
            Ok((handler, call)) => {
                let (observer, method): (_, Arc<str>) = (observer.clone(), method.into());
                let observed: Handler = Arc::new(move |call| {
                    let mut guard = Observed {
                        observer: observer.clone(),
                        method: method.clone(),
                        started: Instant::now(),
                        outcome: None,
                    };
                    let work = handler(call);
                    async move {
                        let result = work.await;
                        if let Err(e) = &result {
                            guard.observer.failed(&guard.method, e);
                        }
                        guard.outcome = Some(result.as_ref().err().map(|e| e.name.clone()));
                        drop(guard);
                        result
                    }
                    .boxed_local()
                });
                Ok((observed, call))
            }
            Err(failure) => {
                // Unknown names are not used as labels: a caller could mint unbounded series.
                let label = if self.methods.contains_key(method) {
                    method
                } else {
                    "(unknown)"
                };
                observer.observe(label, Duration::ZERO, Some(&failure.name));
                Err(failure)
            }
        }
    }

    fn lookup(&self, method: &str, mut call: Call) -> Result<(Handler, Call), ErrorMeta> {
        let handler = self.methods.get(method).ok_or_else(|| {
            ErrorMeta::failure(
                Failure::UnknownMethod,
                format!("unknown RPC method '{method}'"),
            )
        })?;
        if let Some(v) = call.take_kwarg("agent_id") {
            if let (Some(ours), Some(theirs)) = (&self.agent_id, v.as_str()) {
                if ours != theirs {
                    return Err(ErrorMeta::failure(
                        Failure::AgentIdMismatch,
                        format!("call addressed to agent '{theirs}' reached agent '{ours}'"),
                    ));
                }
            }
        }
        Ok((handler.clone(), call))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_methods_aliases_and_agent_id() {
        let mut d = Dispatcher::new(Some("a1".into()));
        d.register("reset_agent", |_| async { Ok(Value::Nil) })
            .alias("reset_instance", "reset_agent");
        assert_eq!(d.methods(), vec!["reset_agent", "reset_instance"]);
        let err = d.resolve("nope", Call::default()).err().unwrap();
        assert_eq!(
            (err.name.as_str(), err.repr.as_str()),
            ("UnknownMethod", "unknown RPC method 'nope'")
        );
        let mine = Call {
            args: vec![],
            kwargs: vec![("agent_id".into(), Value::from("a1"))],
            peer_user_id: None,
        };
        let (_, call) = d.resolve("reset_instance", mine).unwrap();
        assert!(
            call.kwargs.is_empty(),
            "our agent_id kwarg is dropped before the handler"
        );
        let theirs = Call {
            args: vec![],
            kwargs: vec![("agent_id".into(), Value::from("a2"))],
            peer_user_id: None,
        };
        assert_eq!(
            d.resolve("reset_agent", theirs).err().unwrap().name,
            "AgentIdMismatch"
        );
    }
}

//! Image methods (the typed contract of [`crate::rpc::agent_api::images`]): `check_pulling`
//! answers from the pulls the kernels' image stages have in flight; `check_and_pull` is
//! registered so that it answers FAILURE `NotImplemented` (not `UnknownMethod`) until the
//! agent implements it. `purge_images` is in [`super::purge`]; `commit`,
//! `get_commit_status`, `push_image` in [`super::commit`].

use std::sync::Arc;

use crate::agent::context::AgentContext;
use crate::rpc::agent_api::images as api;
use crate::rpc::agent_api::Method;
use crate::rpc::{Dispatcher, ErrorMeta};

/// The FAILURE of a method the agent does not implement yet.
pub fn not_implemented(method: &str) -> ErrorMeta {
    ErrorMeta::new(
        api::NOT_IMPLEMENTED,
        format!(
            "{method}() is not implemented by this agent (kernelvisor {}) yet",
            env!("CARGO_PKG_VERSION")
        ),
    )
}

fn refuse<M: Method + 'static>(dispatcher: &mut Dispatcher) {
    dispatcher.register_method::<M, _, _>(|_, _| async { Err(not_implemented(M::NAME)) });
}

/// Registers the image methods on `dispatcher`.
pub fn register(dispatcher: &mut Dispatcher, ctx: Arc<AgentContext>) {
    dispatcher.register_method::<api::CheckPulling, _, _>(move |args, _| {
        let pulling = ctx.node.is_pulling(&args.image_name);
        async move { Ok(pulling) }
    });
    refuse::<api::CheckAndPull>(dispatcher);
}

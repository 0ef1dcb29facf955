//! Dangling kernels (`docs/design.md`), decided by the manager: `list_dangling_kernels`,
//! `adopt_kernel` and `destroy_dangling_kernel` (see `crate::agent::dangling`).
//!
//! FAILURE names: `KernelNotFound` (no dangling kernel with this id), `KernelNotAdoptable`
//! (the engine's description is not enough, or several containers claim the id),
//! `InvalidKernelConfig` (the id is live on this agent), `ContainerEngineError`.

use std::sync::Arc;

use actix::Addr;
use rmpv::Value;

use crate::agent::context::AgentContext;
use crate::agent::dangling;
use crate::agent::registry::KernelRegistry;
use crate::rpc::agent_api::kernel as api;
use crate::rpc::Dispatcher;

/// Registers the dangling-kernel methods on `dispatcher`.
pub fn register(
    dispatcher: &mut Dispatcher,
    ctx: Arc<AgentContext>,
    registry: Addr<KernelRegistry>,
) {
    // list_dangling_kernels() → [{"id", "session_id", "container_id", "running", "image",
    //   "host_ports", "resource_slots", "access_key", "adoptable", "reason"}]
    let c = ctx.clone();
    dispatcher.register("list_dangling_kernels", move |_| {
        let c = c.clone();
        async move {
            Ok(Value::Array(
                c.dangling.list().iter().map(|k| k.to_value()).collect(),
            ))
        }
    });

    // adopt_kernel(kernel_id) → kernel info (as create_kernels returns it)
    let (r, c) = (registry.clone(), ctx.clone());
    dispatcher.register_method::<api::AdoptKernel, _, _>(move |args, _| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            let info = dangling::adopt(&c, &r, &args.kernel_id)
                .await
                .map_err(|e| e.to_meta())?;
            crate::rpc::agent_api::from_value(info.to_value(&c.agent_id))
                .map_err(|e| crate::rpc::ErrorMeta::new("InvalidReply", e.to_string()))
        }
    });

    // destroy_dangling_kernel(kernel_id) → {"destroyed": n}
    let (r, c) = (registry, ctx);
    dispatcher.register_method::<api::DestroyDanglingKernel, _, _>(move |args, _| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            let n = dangling::destroy(&c, &r, &args.kernel_id)
                .await
                .map_err(|e| e.to_meta())?;
            Ok(api::Destroyed {
                destroyed: n as u64,
            })
        }
    });
}

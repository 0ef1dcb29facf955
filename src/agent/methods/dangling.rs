//! Dangling kernels (seed 001), decided by the manager: `list_dangling_kernels`,
//! `adopt_kernel` and `destroy_dangling_kernel` (see `crate::agent::dangling`).
//!
//! FAILURE names: `KernelNotFound` (no dangling kernel with this id), `KernelNotAdoptable`
//! (the engine's description is not enough, or several containers claim the id),
//! `InvalidKernelConfig` (the id is live on this agent), `ContainerEngineError`.

use std::sync::Arc;

use actix::Addr;
use rmpv::Value;

use super::args::str_arg;
use crate::agent::context::AgentContext;
use crate::agent::dangling;
use crate::agent::registry::KernelRegistry;
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
    dispatcher.register("adopt_kernel", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            let kernel_id = str_arg(&call, 0, "kernel_id")?;
            let info = dangling::adopt(&c, &r, &kernel_id)
                .await
                .map_err(|e| e.to_meta())?;
            Ok(info.to_value(&c.agent_id))
        }
    });

    // destroy_dangling_kernel(kernel_id) → {"destroyed": n}
    let (r, c) = (registry, ctx);
    dispatcher.register("destroy_dangling_kernel", move |call| {
        let (r, c) = (r.clone(), c.clone());
        async move {
            let kernel_id = str_arg(&call, 0, "kernel_id")?;
            let n = dangling::destroy(&c, &r, &kernel_id)
                .await
                .map_err(|e| e.to_meta())?;
            Ok(Value::Map(vec![("destroyed".into(), (n as u64).into())]))
        }
    });
}

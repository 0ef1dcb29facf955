//! Dangling kernels (`docs/design.md`), decided by the manager: `list_dangling_kernels`,
//! `adopt_kernel` and `destroy_dangling_kernel` (see `crate::agent::dangling`).
//!
//! FAILURE names: `KernelNotFound` (no dangling kernel with this id), `KernelNotAdoptable`
//! (the engine's description is not enough, or several containers claim the id),
//! `InvalidKernelConfig` (the id is live on this agent), `ContainerEngineError`.

use rmpv::Value;

use super::{Ctx, Table};
use crate::agent::dangling;
use crate::rpc::agent_api::kernel as api;
use crate::rpc::{Call, Dispatcher, ErrorMeta, Failure};

/// Registers the dangling-kernel methods on `dispatcher`.
pub(crate) fn register(dispatcher: &mut Dispatcher, cx: &Ctx) {
    Table::new(dispatcher, cx.clone())
        .raw("list_dangling_kernels", list_dangling_kernels)
        .method::<api::AdoptKernel, _, _>(adopt_kernel)
        .method::<api::DestroyDanglingKernel, _, _>(destroy_dangling_kernel);
}

/// `list_dangling_kernels()` → `[{"id", "session_id", "container_id", "running", "image",
/// "host_ports", "resource_slots", "access_key", "adoptable", "reason"}]`.
async fn list_dangling_kernels(cx: Ctx, _: Call) -> Result<Value, ErrorMeta> {
    Ok(Value::Array(
        cx.dangling.list().iter().map(|k| k.to_value()).collect(),
    ))
}

/// `adopt_kernel(kernel_id)` → the kernel's info (as `create_kernels` returns it).
async fn adopt_kernel(cx: Ctx, args: api::KernelIdArgs) -> Result<api::KernelInfoReply, ErrorMeta> {
    let info = dangling::adopt(&cx.agent, &cx.registry, &args.kernel_id)
        .await
        .map_err(|e| e.to_meta())?;
    crate::rpc::agent_api::from_value(info.to_value(&cx.agent_id))
        .map_err(|e| ErrorMeta::failure(Failure::InvalidReply, e.to_string()))
}

/// `destroy_dangling_kernel(kernel_id)` → `{"destroyed": n}`.
async fn destroy_dangling_kernel(
    cx: Ctx,
    args: api::KernelIdArgs,
) -> Result<api::Destroyed, ErrorMeta> {
    let n = dangling::destroy(&cx.agent, &cx.registry, &args.kernel_id)
        .await
        .map_err(|e| e.to_meta())?;
    Ok(api::Destroyed {
        destroyed: n as u64,
    })
}

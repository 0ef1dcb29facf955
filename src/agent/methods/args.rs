//! Argument and kernel lookups every agent method module shares.

use actix::Addr;
use rmpv::Value;

use crate::agent::kernel::{KernelError, KernelInfo, KernelStatus};
use crate::agent::registry::{GetKernel, KernelRegistry};
use crate::rpc::{Call, ErrorMeta};

pub(crate) fn type_error(msg: String) -> ErrorMeta {
    ErrorMeta::new("TypeError", msg)
}

/// Argument `i` named `name` (positional or keyword), required.
pub(crate) fn arg<'a>(call: &'a Call, i: usize, name: &str) -> Result<&'a Value, ErrorMeta> {
    call.arg(i, name)
        .filter(|v| !v.is_nil())
        .ok_or_else(|| type_error(format!("missing required argument: '{name}'")))
}

pub(crate) fn str_arg(call: &Call, i: usize, name: &str) -> Result<String, ErrorMeta> {
    arg(call, i, name)?
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| type_error(format!("argument '{name}' must be a string")))
}

pub(crate) fn mailbox(e: actix::MailboxError) -> ErrorMeta {
    ErrorMeta::new("AgentShuttingDown", e.to_string())
}

/// The kernel's facts, or FAILURE `KernelNotFound`.
pub(crate) async fn lookup(
    registry: &Addr<KernelRegistry>,
    kernel_id: &str,
) -> Result<KernelInfo, ErrorMeta> {
    registry
        .send(GetKernel(kernel_id.to_owned()))
        .await
        .map_err(mailbox)?
        .ok_or_else(|| KernelError::NotFound(kernel_id.to_owned()).to_meta())
}

/// The facts of a `RUNNING` kernel with a container, or FAILURE `KernelNotFound` /
/// `KernelNotRunning`.
pub(crate) async fn running(
    registry: &Addr<KernelRegistry>,
    kernel_id: &str,
) -> Result<KernelInfo, ErrorMeta> {
    let info = lookup(registry, kernel_id).await?;
    match (&info.container_id, info.status) {
        (Some(_), KernelStatus::Running) => Ok(info),
        _ => Err(KernelError::NotRunning(kernel_id.to_owned(), info.status.as_str()).to_meta()),
    }
}

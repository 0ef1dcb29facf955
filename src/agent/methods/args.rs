//! Kernel lookups and error conversions every agent method module shares (arguments are
//! decoded by the typed contract, `crate::rpc::agent_api`).

use actix::Addr;

use crate::agent::kernel::{KernelError, KernelInfo, KernelStatus};
use crate::agent::registry::{GetKernel, KernelRegistry};
use crate::rpc::{ErrorMeta, Failure};

pub(crate) fn type_error(msg: String) -> ErrorMeta {
    ErrorMeta::failure(Failure::TypeError, msg)
}

pub(crate) fn mailbox(e: actix::MailboxError) -> ErrorMeta {
    ErrorMeta::failure(Failure::AgentShuttingDown, e.to_string())
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

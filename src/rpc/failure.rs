//! The FAILURE names kernelvisor's agent and intake answer with (callosum's `ErrorMetadata.name`,
//! [`ErrorMeta::name`]), as one enum both ends use: the agent's errors name themselves through it
//! and the manager matches on it, so a renamed failure cannot leave the other end matching a
//! string nobody sends.
//!
//! On the wire a name stays a plain string (a Python client reads `exc.name`); a name this build
//! does not know (a newer agent's) is not a [`Failure`] ([`Failure::parse`] answers `None`) and the
//! manager shows it as `agent-error` with the name in the message.

use std::fmt;

use super::codec::ErrorMeta;

macro_rules! failures {
    ($($(#[$doc:meta])* $variant:ident,)*) => {
        /// A FAILURE name of kernelvisor's own, spelled on the wire as the variant's name.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Failure {
            $($(#[$doc])* $variant,)*
        }

        impl Failure {
            /// Every name, in declaration order.
            pub const ALL: &'static [Failure] = &[$(Failure::$variant,)*];

            /// The wire name (`"KernelNotFound"`).
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Failure::$variant => stringify!($variant),)*
                }
            }

            /// The failure of a wire name; `None` for a name this build does not know.
            pub fn parse(name: &str) -> Option<Failure> {
                match name {
                    $(stringify!($variant) => Some(Failure::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

failures! {
    // The kernel's life (`agent/kernel/error.rs`).
    /// No such kernel on the agent.
    KernelNotFound,
    /// A kernel config the agent refuses (bad image, slots, mounts, …).
    InvalidKernelConfig,
    /// Not enough slots, ports or devices left on the agent.
    ResourceExhausted,
    /// The image is not in its registry.
    ImageNotFound,
    /// The image's registry cannot be reached.
    RegistryUnreachable,
    /// The image's registry refused the credentials (or wanted some).
    RegistryAuthFailed,
    /// An image pull ran past `image-pull-timeout`.
    ImagePullTimeout,
    /// The kernel exists but its container does not run.
    KernelNotRunning,
    /// The container engine answered with an error.
    ContainerEngineError,
    /// The container engine cannot be reached (down, restarting): transient.
    ContainerEngineUnavailable,
    /// The kernel's `bootstrap_script` failed or ran too long.
    BootstrapScriptFailed,
    /// The kernel's container cannot be made as asked (a cluster network that does not exist);
    /// Backend.AI's agent's name for it.
    ContainerCreationFailedError,
    /// A dangling container the agent cannot rebuild as a kernel (`adopt_kernel`).
    KernelNotAdoptable,
    // Runs of `execute` (`agent/exec/`).
    /// No such run.
    RunNotFound,
    /// The run was started without stdin.
    RunHasNoStdin,
    /// A run of that id exists already.
    RunExists,
    /// The run's stdin is closed (it exited, or closed it).
    RunStdinClosed,
    /// A terminal request to a run without a terminal.
    RunHasNoTty,
    /// An `execute` mode the agent does not implement.
    UnsupportedExecutionMode,
    /// The kernel's runner (Backend.AI's kernel runner in its container) did not answer in
    /// time, or its connection is closed.
    KernelRunnerUnresponsive,
    /// The kernel's logs are gone.
    LogsNotFound,
    /// The kernel's logs cannot be read.
    LogsUnreadable,
    // Services (`agent/services/`).
    /// No such service in the kernel.
    ServiceNotFound,
    /// The service's process did not come up (its output in the traceback).
    ServiceStartFailed,
    // Files (`agent/files/`).
    /// A path outside the kernel's work directory, or not a path.
    InvalidPath,
    /// No such file.
    FileNotFound,
    /// A file over the transfer limit.
    FileTooLarge,
    /// An upload's bytes differ from its announced size.
    UploadSizeMismatch,
    /// No such chunked transfer.
    TransferNotFound,
    // Images, commits, networks, the node.
    /// What the agent does not implement (`commit` to a file, `rpc::agent_api::images`).
    NotImplemented,
    /// An argument the method refuses.
    InvalidArgument,
    /// No such background task.
    BgtaskNotFound,
    /// A background task failed without a name of its own.
    BgtaskFailed,
    /// A network the agent did not create.
    NetworkNotOwned,
    /// Probing the node's hardware failed.
    HardwareProbeFailed,
    // Calls in general (`rpc/dispatch.rs`, `rpc/server.rs`).
    /// Missing or ill-typed arguments (Python's name for it).
    TypeError,
    /// No method of that name.
    UnknownMethod,
    /// The handler panicked.
    HandlerPanicked,
    /// The call named another agent than the one serving it.
    AgentIdMismatch,
    /// The agent is stopping.
    AgentShuttingDown,
    /// A reply that does not decode into its method's type (the manager's own reading of it).
    InvalidReply,
    // The manager's event intake (`manager/intake.rs`).
    /// An intake call whose `agent_id` is not the caller's CURVE identity.
    AgentIdentityMismatch,
    /// A heartbeat refused because the inbox holds `max-agents` other agents.
    ManagerOverloaded,
    /// A heartbeat that does not parse.
    InvalidHeartbeat,
    /// The manager is stopping.
    ManagerShuttingDown,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<Failure> for String {
    fn from(f: Failure) -> String {
        f.as_str().to_owned()
    }
}

impl PartialEq<&str> for Failure {
    fn eq(&self, name: &&str) -> bool {
        self.as_str() == *name
    }
}

impl PartialEq<Failure> for str {
    fn eq(&self, f: &Failure) -> bool {
        self == f.as_str()
    }
}

impl PartialEq<Failure> for String {
    fn eq(&self, f: &Failure) -> bool {
        self.as_str() == f.as_str()
    }
}

impl ErrorMeta {
    /// A FAILURE of `failure`'s name with `repr` (kept beside [`Failure`] so that [`ErrorMeta`]
    /// stays the codec's plain record).
    pub fn failure(failure: Failure, repr: impl Into<String>) -> ErrorMeta {
        ErrorMeta::new(failure, repr)
    }

    /// Its name as a [`Failure`]; `None` for a name this build does not know.
    pub fn known(&self) -> Option<Failure> {
        Failure::parse(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for f in Failure::ALL {
            assert_eq!(Failure::parse(f.as_str()), Some(*f));
            assert_eq!(f.to_string(), f.as_str());
        }
        assert_eq!(Failure::KernelNotFound.as_str(), "KernelNotFound");
        assert_eq!(Failure::parse("SomethingNewer"), None);
        let meta = ErrorMeta::failure(Failure::ImageNotFound, "x");
        assert_eq!(meta.name, "ImageNotFound");
        assert_eq!(meta.known(), Some(Failure::ImageNotFound));
    }
}

//! Engine errors as [`BackendError`]s: an engine that cannot be reached
//! ([`BackendError::Unavailable`]) told from one that refused the request, and the 404s that
//! mean a missing container or path.

use bollard::errors::Error as DockerError;

use crate::agent::backend::BackendError;

/// A bollard error as a [`BackendError`]: [`BackendError::Unavailable`] when the engine could
/// not be reached (see [`unreachable`]), `Engine` otherwise; the message carries the error's
/// causes (`error trying to connect: Connection refused (os error 111)`).
pub(super) fn engine(e: DockerError) -> BackendError {
    let message = describe(&e);
    if unreachable(&e) {
        BackendError::Unavailable(message)
    } else {
        BackendError::Engine(message)
    }
}

/// `e` and its causes, `: `-separated, each once.
pub(super) fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cur = Some(e);
    while let Some(err) = cur {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = err.source();
    }
    parts.join(": ")
}

/// Whether `e` means the engine could not be reached at all, rather than refused the request:
/// no socket, connection refused or reset, the connection closed mid-request, a request
/// timeout. A response from the engine (any status) is never one.
fn unreachable(e: &DockerError) -> bool {
    match e {
        DockerError::DockerResponseServerError { .. } => false,
        DockerError::RequestTimeoutError | DockerError::SocketNotFoundError(_) => true,
        DockerError::HyperResponseError { err }
            if err.is_closed() || err.is_incomplete_message() || err.is_canceled() =>
        {
            true
        }
        DockerError::HyperLegacyError { err } if err.is_connect() => true,
        DockerError::IOError { err } => lost_connection(err) || io_unreachable(err),
        _ => io_unreachable(e),
    }
}

/// An I/O error of a missing socket, or a refused or lost connection.
fn lost_connection(io: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        io.kind(),
        ConnectionRefused
            | ConnectionReset
            | ConnectionAborted
            | NotConnected
            | BrokenPipe
            | UnexpectedEof
            | TimedOut
            | NotFound
    )
}

/// A [`lost_connection`] I/O error somewhere in `e`'s causes.
fn io_unreachable(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err
            .downcast_ref::<std::io::Error>()
            .is_some_and(lost_connection)
        {
            return true;
        }
        cur = err.source();
    }
    false
}

/// A failed pull of `reference`, told apart by what the engine says of the registry (Docker
/// passes the registry's failure on as text, in a 4xx/5xx answer or in the progress stream):
/// credentials refused or missing → [`BackendError::RegistryAuthFailed`]; the registry's name
/// does not resolve, it refuses connections, TLS fails, it does not answer →
/// [`BackendError::RegistryUnreachable`]; no such repository, tag or manifest →
/// [`BackendError::ImageNotFound`]. The engine itself unreachable stays `Unavailable`.
pub(super) fn pull_err(reference: &str, e: DockerError) -> BackendError {
    let message = match &e {
        DockerError::DockerResponseServerError { message, .. } => message.clone(),
        DockerError::DockerStreamError { error } => error.clone(),
        _ => return engine(e),
    };
    let text = format!("{reference}: {message}");
    match classify_pull_failure(&message) {
        PullFailure::Auth => BackendError::RegistryAuthFailed(text),
        PullFailure::Unreachable => BackendError::RegistryUnreachable(text),
        PullFailure::NotFound => BackendError::ImageNotFound(text),
        PullFailure::Other => BackendError::Engine(text),
    }
}

/// What a registry failure message means; see [`pull_err`].
#[derive(Debug, PartialEq, Eq)]
enum PullFailure {
    Auth,
    Unreachable,
    NotFound,
    Other,
}

fn classify_pull_failure(message: &str) -> PullFailure {
    let m = message.to_ascii_lowercase();
    let any = |needles: &[&str]| needles.iter().any(|n| m.contains(n));
    // Order matters. Docker Hub words a repository that does not exist as one it may not see
    // ("pull access denied for x, repository does not exist or may require 'docker login':
    // denied: requested access to the resource is denied"): a missing image, the likelier
    // reading (refused credentials are "incorrect username or password" there).
    if m.contains("repository does not exist") {
        PullFailure::NotFound
    } else if any(&[
        "no basic auth credentials",
        "unauthorized",
        "authentication required",
        "incorrect username or password",
        "401 unauthorized",
        "denied: requested access",
    ]) {
        PullFailure::Auth
    } else if any(&[
        "no such host",
        "connection refused",
        "i/o timeout",
        "server misbehaving",
        "network is unreachable",
        "no route to host",
        "tls handshake",
        "x509:",
        "http: server gave http response to https client",
        "context deadline exceeded",
        "connection reset by peer",
        "eof",
    ]) {
        PullFailure::Unreachable
    } else if any(&[
        "manifest unknown",
        "not found",
        "name unknown",
        "does not exist",
        "repository name must",
        "invalid reference format",
    ]) {
        PullFailure::NotFound
    } else {
        PullFailure::Other
    }
}

pub(super) fn status(e: &DockerError) -> Option<u16> {
    match e {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

/// Maps a 404 to [`BackendError::ContainerNotFound`], anything else to `Engine`.
pub(super) fn container_err(id: &str) -> impl Fn(DockerError) -> BackendError + '_ {
    move |e| match status(&e) {
        Some(404) => BackendError::ContainerNotFound(id.to_owned()),
        _ => engine(e),
    }
}

/// A failed container start: a missing container, or the OCI runtime's refusal said in words
/// first (what was wrong with the command), then the engine's own text, which alone is a wall of
/// runc internals (`failed to create shim task: OCI runtime create failed: …`).
pub(super) fn start_err(id: &str) -> impl Fn(DockerError) -> BackendError + '_ {
    move |e| match &e {
        DockerError::DockerResponseServerError { message, .. }
            if message.contains("OCI runtime") =>
        {
            BackendError::Engine(format!(
                "the container could not start: {} (engine: {message})",
                runtime_refusal(message)
            ))
        }
        // The engine checks a container's network when it starts it (`network x not found`,
        // a 404 like a missing container's).
        DockerError::DockerResponseServerError { message, .. } if message.contains("network") => {
            BackendError::Engine(format!("the container could not start: {message}"))
        }
        _ => container_err(id)(e),
    }
}

/// What runc's refusal to start a container's process means, in words.
fn runtime_refusal(message: &str) -> String {
    // runc: `exec: "/nothing": stat /nothing: no such file or directory`, or
    // `exec: "python": executable file not found in $PATH`.
    let command = message
        .split_once("exec: \"")
        .and_then(|(_, rest)| rest.split_once('"'))
        .map(|(cmd, _)| cmd);
    match command {
        Some(cmd) if message.contains("executable file not found") => {
            format!("its command `{cmd}` is not in any directory of the container's PATH")
        }
        Some(cmd) if message.contains("no such file or directory") => {
            format!("its command `{cmd}` does not exist in the image")
        }
        Some(cmd) if message.contains("permission denied") => {
            format!("its command `{cmd}` is not executable")
        }
        _ => "the OCI runtime refused to start its process".to_owned(),
    }
}

/// The archive API answers 404 both for a missing container and a missing path; the engine's
/// message tells them apart ("No such container" vs "Could not find the file").
pub(super) fn archive_err(id: &str, path: &str) -> impl Fn(DockerError) -> BackendError {
    let (id, path) = (id.to_owned(), path.to_owned());
    move |e| match &e {
        DockerError::DockerResponseServerError {
            status_code: 404,
            message,
        } if message.contains("No such container") => BackendError::ContainerNotFound(id.clone()),
        DockerError::DockerResponseServerError {
            status_code: 404, ..
        } => BackendError::PathNotFound(path.clone()),
        _ => engine(e),
    }
}

/// `Ok(None)` for a 404.
pub(super) fn optional<T>(r: Result<T, DockerError>) -> Result<Option<T>, DockerError> {
    match r {
        Err(e) if status(&e) == Some(404) => Ok(None),
        r => r.map(Some),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_refusals_in_words() {
        let missing = r#"failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: "/nothing": stat /nothing: no such file or directory: unknown"#;
        assert_eq!(
            runtime_refusal(missing),
            "its command `/nothing` does not exist in the image"
        );
        let path = r#"failed to create shim task: OCI runtime create failed: runc create failed: unable to start container process: exec: "sh": executable file not found in $PATH: unknown"#;
        assert_eq!(
            runtime_refusal(path),
            "its command `sh` is not in any directory of the container's PATH"
        );
        let denied = r#"OCI runtime create failed: runc create failed: unable to start container process: exec: "/etc/passwd": permission denied: unknown"#;
        assert_eq!(
            runtime_refusal(denied),
            "its command `/etc/passwd` is not executable"
        );
        assert_eq!(
            runtime_refusal("OCI runtime create failed: cgroup"),
            "the OCI runtime refused to start its process"
        );
    }

    /// Messages as Docker 28 words them (seen against Debian's docker-registry 2.8).
    #[test]
    fn registry_failures_are_told_apart() {
        use PullFailure::*;
        for (message, want) in [
            (r#"Head "http://127.0.0.1:5055/v2/team/busy/manifests/1": no basic auth credentials"#, Auth),
            (r#"Head "http://127.0.0.1:5055/v2/team/busy/manifests/1": unauthorized: authentication required"#, Auth),
            ("pull access denied for x, repository does not exist or may require 'docker login': denied: requested access to the resource is denied", NotFound),
            ("Head \"https://registry-1.docker.io/v2/team/x/manifests/1\": unauthorized: incorrect username or password", Auth),
            (r#"Get "http://127.0.0.1:5056/v2/": dial tcp 127.0.0.1:5056: connect: connection refused"#, Unreachable),
            (r#"Get "https://nosuchhost.invalid/v2/": dial tcp: lookup nosuchhost.invalid on 10.255.255.53:53: no such host"#, Unreachable),
            ("manifest for 127.0.0.1:5055/team/busy:nope not found: manifest unknown: manifest unknown", NotFound),
            ("received unexpected HTTP status: 500 Internal Server Error", Other),
        ] {
            assert_eq!(classify_pull_failure(message), want, "{message}");
        }
    }

    #[test]
    fn unreachable_engines_are_told_from_refusals() {
        let io = |kind| DockerError::IOError {
            err: std::io::Error::from(kind),
        };
        for e in [
            io(std::io::ErrorKind::ConnectionRefused),
            io(std::io::ErrorKind::ConnectionReset),
            io(std::io::ErrorKind::NotFound),
            DockerError::RequestTimeoutError,
            DockerError::SocketNotFoundError("/x.sock".into()),
        ] {
            assert!(engine(e).is_unavailable());
        }
        for e in [
            DockerError::DockerResponseServerError {
                status_code: 500,
                message: "connection refused by the registry".into(),
            },
            DockerError::DockerResponseServerError {
                status_code: 409,
                message: "conflict".into(),
            },
            io(std::io::ErrorKind::InvalidData),
        ] {
            assert!(!engine(e).is_unavailable());
        }
    }
}

//! The manager tree's `api` child: the HTTP API (`[api]`: listen address, workers, TLS, upload
//! bound).

use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};

use actors::{ChildSpec, Shutdown, StopSignal};
use anyhow::Context as _;

use crate::config::ManagerConfig;
use crate::manager::{api, tls};

/// The bound API, not serving until its child starts.
pub(in crate::manager) struct Bound {
    /// The server (spawned by [`child_spec`]).
    pub server: actix_web::dev::Server,
    /// Where it listens.
    pub addr: SocketAddr,
    /// `https` with `[api] tls-cert` and `tls-key`, else `http`.
    pub scheme: &'static str,
}

/// Reads the TLS files, binds `[api] listen-addr` and builds the server over `state`.
///
/// Errors: `tls-cert` or `tls-key` is unreadable or invalid (the message names the file); the
/// address cannot be bound.
pub(in crate::manager) fn bind(
    config: &ManagerConfig,
    state: api::ApiState,
) -> anyhow::Result<Bound> {
    // Read before anything listens, so a bad certificate or key stops the start naming the
    // file.
    let tls = match (&config.api.tls_cert, &config.api.tls_key) {
        (Some(cert), Some(key)) => Some(tls::server_config(cert, key)?),
        _ => {
            tracing::warn!("the HTTP API is plain HTTP (no TLS): set [api] tls-cert and tls-key to serve HTTPS");
            None
        }
    };
    let listener = TcpListener::bind((
        config.api.listen_addr.host.as_str(),
        config.api.listen_addr.port,
    ))
    .with_context(|| format!("api.listen-addr {}", config.api.listen_addr))?;
    let addr = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let server = api::serve(listener, config.api.workers, state, tls)?;
    Ok(Bound {
        server,
        addr,
        scheme,
    })
}

/// `api`: the HTTP API, serving from the tree's start; stopped, in-flight requests get the
/// server's graceful period (5 s) to finish.
pub(in crate::manager) fn child_spec(server: actix_web::dev::Server) -> ChildSpec {
    let handle = server.handle();
    let server = Arc::new(Mutex::new(Some(server)));
    let serving = ChildSpec::task("api", move |signal: StopSignal| {
        // Spawned here, in the tree's start, rather than when this child is first polled.
        let spawned = server
            .lock()
            .expect("api server lock")
            .take()
            .map(actix_rt::spawn);
        let handle = handle.clone();
        async move {
            spawned.ok_or("the manager's `api` cannot restart")?;
            signal.requested().await;
            handle.stop(true).await;
            Ok::<_, String>(())
        }
    });
    serving.shutdown(Shutdown::Infinity)
}

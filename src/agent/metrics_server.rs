//! The metrics endpoint: Prometheus text format on `[agent] service-addr` (default
//! `0.0.0.0:6003`, Backend.AI's agent service port), path `/metrics`.

use std::net::SocketAddr;
use std::sync::Arc;

use actix_web::{web, App, HttpResponse, HttpServer};
use actors::{ChildSpec, StopSignal};

use super::first_start::FirstStart;
use super::metrics::AgentMetrics;
use crate::config::HostPort;

async fn render(m: web::Data<Arc<AgentMetrics>>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(prometheus::TEXT_FORMAT)
        .body(m.render())
}

/// A bound metrics server; [`MetricsServer::run`] serves it.
pub struct MetricsServer {
    server: actix_web::dev::Server,
    addr: SocketAddr,
}

impl MetricsServer {
    /// Binds `addr` (port 0 picks a free one) with one worker thread.
    ///
    /// Errors: the address is in use or invalid.
    pub fn bind(addr: &HostPort, metrics: Arc<AgentMetrics>) -> std::io::Result<MetricsServer> {
        let data = web::Data::new(metrics);
        let http = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .route("/metrics", web::get().to(render))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .bind((addr.host.as_str(), addr.port))?;
        let bound = *http
            .addrs()
            .first()
            .ok_or_else(|| std::io::Error::other("bound no address"))?;
        tracing::info!(addr = %bound, "metrics endpoint bound (/metrics)");
        Ok(MetricsServer {
            server: http.run(),
            addr: bound,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `stop` resolves, then stops gracefully.
    pub async fn run(self, stop: impl std::future::Future<Output = ()>) -> std::io::Result<()> {
        let handle = self.server.handle();
        let mut server = std::pin::pin!(self.server);
        tokio::select! {
            r = &mut server => r,
            _ = stop => {
                // The stop command is sent at once; its completion needs the server future
                // polled, so wait on the server itself rather than on the returned future.
                drop(handle.stop(true));
                server.await
            }
        }
    }
}

/// The agent tree's `metrics` child: serves `first` (bound by `Agent::start`, so a port in use
/// stops the start) until stopped; a restart binds the address `first` got again (its port
/// may have been 0).
pub fn child_spec(first: MetricsServer, metrics: Arc<AgentMetrics>) -> ChildSpec {
    let addr = HostPort {
        host: first.addr.ip().to_string(),
        port: first.addr.port(),
    };
    let first = FirstStart::new(first);
    ChildSpec::task("metrics", move |stop: StopSignal| {
        let server = first
            .take()
            .map(Ok)
            .unwrap_or_else(|| MetricsServer::bind(&addr, metrics.clone()));
        async move { server?.run(stop.requested()).await }
    })
}

//! `session services`, `service-start` and `service-stop`: a session's services
//! (`/v1/sessions/{id}/services[/{name}]`).

use std::io::Write;

use clap::Args;

use crate::ctl::{render, show_to, Client, Failure, Output};

/// Arguments of `kernelvisor ctl session services`.
#[derive(Debug, Args)]
pub struct ServicesArgs {
    /// Session id (UUID).
    pub id: String,
}

/// Arguments of `kernelvisor ctl session service-start` and `service-stop`.
#[derive(Debug, Args)]
pub struct ServiceArgs {
    /// Session id (UUID).
    pub id: String,
    /// Service name, as `session services` lists it.
    pub name: String,
}

/// `session services`.
pub(super) fn services(
    client: &Client,
    id: &str,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    let reply = client.services(id)?;
    show_to(out, &reply, render::services, stdout)
}

/// `session service-start`: the service's URL, or (`-o json`) the manager's answer.
pub(super) fn service_start(
    client: &Client,
    id: &str,
    name: &str,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    let reply = client.start_service(id, name)?;
    show_to(out, &reply, |v| render::service_started(v, name), stdout)
}

/// `session service-stop`.
pub(super) fn service_stop(
    client: &Client,
    id: &str,
    name: &str,
    out: Output,
    stdout: &mut impl Write,
) -> Result<i32, Failure> {
    let reply = client.stop_service(id, name)?;
    show_to(out, &reply, |v| render::service_stopped(v, name), stdout)
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::ctl::test_util::text;
    use crate::ctl::testserver::{Answer, Server};
    use crate::ctl::{format, report};

    const SERVICES: &str = r#"{"services": [{"name": "web", "protocol": "http", "container_ports": [8080], "host_ports": [30001], "status": "running", "url": "http://10.0.0.5:30001"}, {"name": "jupyter", "protocol": "http", "container_ports": [8888], "host_ports": [], "status": "stopped", "url": null}]}"#;

    #[test]
    fn services_table_and_json() {
        let server = Server::start(vec![
            Answer::json(200, SERVICES),
            Answer::json(200, SERVICES),
        ]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        assert_eq!(
            services(&client, "S 1", Output::Table, &mut out).unwrap(),
            0
        );
        let table = text(out);
        let lines: Vec<&str> = table.lines().collect();
        assert!(
            lines[0].starts_with("NAME") && lines[0].ends_with("URL"),
            "{table}"
        );
        assert!(lines[1].starts_with("web ") && lines[1].ends_with("http://10.0.0.5:30001"));
        assert!(
            lines[2].contains("stopped") && lines[2].ends_with('-'),
            "{table}"
        );
        let mut out = Vec::new();
        services(&client, "S 1", Output::Json, &mut out).unwrap();
        assert_eq!(text(out), format::pretty_json(SERVICES) + "\n");
        let requests = server.requests();
        assert_eq!(requests[0].line, "GET /v1/sessions/S%201/services");
        assert_eq!(requests[1].line, "GET /v1/sessions/S%201/services");
    }

    #[test]
    fn service_start_started_or_already_running() {
        let service = |started: bool| {
            Answer::json(
                200,
                json!({"name": "web", "protocol": "http", "container_ports": [8080],
                       "host_ports": [30001], "status": "running",
                       "url": "http://10.0.0.5:30001", "started": started})
                .to_string(),
            )
        };
        let server = Server::start(vec![service(true), service(false), service(false)]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        service_start(&client, "S", "web", Output::Table, &mut out).unwrap();
        service_start(&client, "S", "web", Output::Table, &mut out).unwrap();
        assert_eq!(
            text(out),
            "web started: http://10.0.0.5:30001\nweb already running: http://10.0.0.5:30001\n"
        );
        let mut out = Vec::new();
        service_start(&client, "S", "web", Output::Json, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            (&v["started"], &v["status"]),
            (&json!(false), &json!("running"))
        );
        let requests = server.requests();
        for r in &requests {
            assert_eq!(r.line, "POST /v1/sessions/S/services/web");
            assert_eq!(r.header("content-length"), Some("0"));
            assert_eq!(r.body, "");
        }
    }

    #[test]
    fn service_start_failure_prints_the_output() {
        let body = json!({"error": {"code": "service-failed",
            "message": "service web exited with code 1 before listening",
            "output": "Traceback (most recent call last):\nOSError: port in use"}})
        .to_string();
        let server = Server::start(vec![
            Answer::json(409, body.clone()),
            Answer::json(409, body),
        ]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        let Err(Failure::Client(e)) = service_start(&client, "S", "web", Output::Table, &mut out)
        else {
            panic!("not an API error")
        };
        assert_eq!(e.exit_code(), 1);
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        report(&e, Output::Table, false, &mut stdout, &mut stderr);
        assert_eq!(text(stdout), "");
        assert_eq!(
            text(stderr),
            "error: service-failed: service web exited with code 1 before listening (HTTP 409)\n\
             Traceback (most recent call last):\nOSError: port in use\n"
        );
        assert!(out.is_empty());

        let Err(Failure::Client(e)) = service_start(&client, "S", "web", Output::Json, &mut out)
        else {
            panic!("not an API error")
        };
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        report(&e, Output::Json, false, &mut stdout, &mut stderr);
        let v: Value = serde_json::from_slice(&stdout).unwrap();
        assert_eq!(v["error"]["code"], "service-failed");
        assert!(text(stderr).ends_with("OSError: port in use\n"));
    }

    #[test]
    fn service_stop_prints_stopped() {
        let body = r#"{"name": "web", "protocol": "http", "container_ports": [8080], "host_ports": [30001], "status": "stopped", "url": "http://10.0.0.5:30001"}"#;
        let not_found = r#"{"error": {"code": "service-not-found", "message": "no service db"}}"#;
        let server = Server::start(vec![Answer::json(200, body), Answer::json(404, not_found)]);
        let client = Client::new(&server.url).unwrap();
        let mut out = Vec::new();
        assert_eq!(
            service_stop(&client, "S", "web", Output::Table, &mut out).unwrap(),
            0
        );
        assert_eq!(text(out), "web stopped\n");
        match service_stop(&client, "S", "d b", Output::Table, &mut Vec::new()) {
            Err(Failure::Client(e)) => {
                assert_eq!(e.exit_code(), 1);
                assert_eq!(
                    e.to_string(),
                    "error: service-not-found: no service db (HTTP 404)"
                );
            }
            other => panic!("{other:?}"),
        }
        let requests = server.requests();
        assert_eq!(requests[0].line, "DELETE /v1/sessions/S/services/web");
        assert_eq!(requests[1].line, "DELETE /v1/sessions/S/services/d%20b");
    }
}

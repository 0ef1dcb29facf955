//! `session services`, `service-start` and `service-stop`: a session's services
//! (`/v1/sessions/{id}/services[/{name}]`).

use std::io::Write;

use clap::Args;
use serde_json::Value;

use crate::ctl::render::{opt, table, text, with};
use crate::ctl::{show_to, Client, Failure, Output};
use crate::model::service::{Service, ServiceList, ServiceStarted};

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
    show_to(out, &reply, services_table, stdout)
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
    show_to(out, &reply, |v| started_line(v, name), stdout)
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
    show_to(out, &reply, |v| stopped_line(v, name), stdout)
}

/// A list of ports (`[8080, 8081]`) as `8080,8081`; empty as `-`.
fn ports(list: &[u16]) -> String {
    if list.is_empty() {
        "-".to_owned()
    } else {
        list.iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// `GET /v1/sessions/{id}/services` (`{"services": [...]}`) as a table: NAME, PROTOCOL, STATUS,
/// CONTAINER-PORTS, HOST-PORTS (comma-separated), URL; in the manager's order.
fn services_table(v: &Value) -> String {
    with(v, |list: ServiceList| {
        let rows = list
            .services
            .iter()
            .map(|s| {
                vec![
                    text(&s.name),
                    text(&s.protocol),
                    text(&s.status),
                    ports(&s.container_ports),
                    ports(&s.host_ports),
                    opt(s.url.as_ref()),
                ]
            })
            .collect();
        table(
            vec![
                "NAME",
                "PROTOCOL",
                "STATUS",
                "CONTAINER-PORTS",
                "HOST-PORTS",
                "URL",
            ],
            rows,
        )
    })
}

/// The answer of `POST /v1/sessions/{id}/services/{name}`: `web started: URL`, or
/// `web already running: URL` when `started` is false (without a URL: no `: URL`). `name` is
/// used when the answer has none.
fn started_line(v: &Value, name: &str) -> String {
    with(v, |s: ServiceStarted| {
        let name = if s.name.is_empty() { name } else { &s.name };
        let what = if s.started == Some(false) {
            "already running"
        } else {
            "started"
        };
        match s.url.as_deref().filter(|u| !u.is_empty()) {
            Some(url) => format!("{name} {what}: {url}\n"),
            None => format!("{name} {what}\n"),
        }
    })
}

/// The answer of `DELETE /v1/sessions/{id}/services/{name}`: `web stopped`.
fn stopped_line(v: &Value, name: &str) -> String {
    with(v, |s: Service| {
        let name = if s.name.is_empty() { name } else { &s.name };
        format!("{name} stopped\n")
    })
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;
    use crate::ctl::render::tests::cells;
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

    #[test]
    fn services_table_rows() {
        let v = json!({"services": [
            {"name": "web", "protocol": "http", "container_ports": [8080], "host_ports": [30001],
             "status": "running", "url": "http://10.0.0.5:30001"},
            {"name": "ssh", "protocol": "tcp", "container_ports": [22, 2222], "host_ports": [],
             "status": "stopped", "url": null}
        ]});
        let out = services_table(&v);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            cells(lines[0]),
            [
                "NAME",
                "PROTOCOL",
                "STATUS",
                "CONTAINER-PORTS",
                "HOST-PORTS",
                "URL"
            ]
        );
        assert_eq!(
            cells(lines[1]),
            [
                "web",
                "http",
                "running",
                "8080",
                "30001",
                "http://10.0.0.5:30001"
            ]
        );
        assert_eq!(
            cells(lines[2]),
            ["ssh", "tcp", "stopped", "22,2222", "-", "-"]
        );
        assert!(services_table(&json!({"services": []})).starts_with("NAME"));
    }

    #[test]
    fn service_lines() {
        let v = json!({"name": "web", "status": "running", "url": "http://h:1", "started": true});
        assert_eq!(started_line(&v, "x"), "web started: http://h:1\n");
        let v = json!({"name": "web", "url": "http://h:1", "started": false});
        assert_eq!(started_line(&v, "x"), "web already running: http://h:1\n");
        assert_eq!(started_line(&json!({}), "x"), "x started\n");
        assert_eq!(
            stopped_line(&json!({"name": "web", "status": "stopped"}), "x"),
            "web stopped\n"
        );
    }
}

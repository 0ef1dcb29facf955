//! Services and files end to end: a manager process and an agent process (CURVE on both
//! channels), the real Docker engine and the HTTP API, with the test image's services
//! (`kernelvisor-test:services`: busybox `httpd` as `web`, and `broken`, which exits at once).
//! - upload `index.html`, start `web`, GET its `url` from the host: the same bytes; started twice
//!   at once: one `started`, one `running`; stopped: the port no longer serves;
//! - `broken` → 409 `service-failed` with its output; an unknown service → 404;
//! - a 64 MiB random file up and down with the same SHA-256, the agent's and the manager's peak
//!   RSS (VmHWM) under 150 MB;
//! - traversal (`../etc/x`, `/etc/passwd`, a symlink to `/etc` made in the kernel) refused with
//!   `invalid-path` for upload, download and listing, nothing written outside `/home/work`;
//! - services and files on a kernel re-attached after an agent restart.
//!
//! Agent host ports: 32600–32699 (20 per agent).

use crate::common;

use std::io::{Read, Write};
use std::time::Duration;

use common::assert_bounded_memory;
use common::cluster::{wait_for, Cluster, Db};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const LONG: Duration = Duration::from_secs(60);
const IMAGE: &str = "kernelvisor-test:services";

fn cluster(name: &str, ports: u16) -> Cluster {
    let mut c = Cluster::new(Db::Sqlite);
    c.start_manager();
    let a = c.add_agent(name, ports, "");
    let id = c.agents[a].id().to_owned();
    c.wait_agent_status(&id, "ALIVE", LONG);
    wait_for(LONG, "normal mode", || {
        (c.get("/v1/sessions").ok()?.status == 200).then_some(())
    });
    c
}

fn create(c: &Cluster) -> String {
    let body = json!({"image": IMAGE, "resource_slots": {"cpu": 0.25, "mem": "64m"}, "access_key": c.access_key});
    let a = c.post("/v1/sessions", &body);
    assert_eq!(a.status, 201, "create: {a:?}");
    a.body["session_id"].as_str().unwrap().to_owned()
}

fn url(c: &Cluster, path: &str) -> String {
    format!("{}{path}", c.api)
}

/// PUT `data` as a file; (status, body).
fn put(c: &Cluster, sid: &str, path: &str, data: &[u8]) -> (u16, Value) {
    let r = ureq::put(&url(c, &format!("/v1/sessions/{sid}/files/{path}")))
        .set("Authorization", &c.auth())
        .timeout(LONG)
        .send_bytes(data);
    answer(r)
}

fn answer(r: Result<ureq::Response, ureq::Error>) -> (u16, Value) {
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    let status = resp.status();
    let text = resp.into_string().unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// GET a file: Ok(bytes) or Err((status, error body)).
fn get_file(c: &Cluster, sid: &str, path: &str) -> Result<Vec<u8>, (u16, Value)> {
    match ureq::get(&url(c, &format!("/v1/sessions/{sid}/files/{path}")))
        .set("Authorization", &c.auth())
        .timeout(LONG)
        .call()
    {
        Ok(r) => {
            assert_eq!(r.content_type(), "application/octet-stream");
            let mut v = Vec::new();
            r.into_reader().read_to_end(&mut v).unwrap();
            Ok(v)
        }
        Err(ureq::Error::Status(s, r)) => Err((s, r.into_json().unwrap_or(Value::Null))),
        Err(e) => panic!("{e}"),
    }
}

fn list_dir(c: &Cluster, sid: &str, dir: &str) -> (u16, Value) {
    answer(
        ureq::get(&url(c, &format!("/v1/sessions/{sid}/files")))
            .set("Authorization", &c.auth())
            .query("dir", dir)
            .timeout(LONG)
            .call(),
    )
}

/// Runs `code` with `sh` in the kernel; (stdout + stderr, exit code).
fn sh(c: &Cluster, sid: &str, code: &str) -> (String, i64) {
    let mut a = c.post(
        &format!("/v1/sessions/{sid}/execute"),
        &json!({"code": code, "flush_timeout": 5}),
    );
    let mut out = String::new();
    loop {
        assert_eq!(a.status, 200, "{a:?}");
        for item in a.body["console"].as_array().unwrap() {
            out.push_str(item[1].as_str().unwrap_or(""));
        }
        if a.body["status"] == "finished" {
            return (out, a.body["exitCode"].as_i64().unwrap());
        }
        let run_id = a.body["runId"].as_str().unwrap().to_owned();
        a = c.post(
            &format!("/v1/sessions/{sid}/execute"),
            &json!({"mode": "continue", "run_id": run_id, "flush_timeout": 5}),
        );
    }
}

/// One request written as is (an HTTP client would collapse `..` in the path): (status, JSON
/// body).
fn raw(c: &Cluster, method: &str, path: &str, body: &[u8]) -> (u16, Value) {
    let mut s = std::net::TcpStream::connect(c.api.trim_start_matches("http://")).unwrap();
    s.set_read_timeout(Some(LONG)).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: {}\r\nContent-Length: {}\r\n\r\n",
        c.auth(),
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let status = text[9..12].parse().unwrap();
    let json = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, serde_json::from_str(json).unwrap_or(Value::Null))
}

fn services(c: &Cluster, sid: &str) -> Vec<Value> {
    let a = c.get(&format!("/v1/sessions/{sid}/services")).unwrap();
    assert_eq!(a.status, 200, "{a:?}");
    a.body["services"].as_array().unwrap().clone()
}

fn service<'a>(list: &'a [Value], name: &str) -> &'a Value {
    list.iter().find(|s| s["name"] == name).unwrap()
}

/// GET a service URL from the host: the body, or the transport error.
fn fetch(u: &str) -> Result<String, String> {
    match ureq::get(u).timeout(Duration::from_secs(5)).call() {
        Ok(r) => Ok(r.into_string().unwrap()),
        Err(e) => Err(e.to_string()),
    }
}

#[test]
fn a_web_service_serves_an_uploaded_file_and_stops() {
    let c = cluster("web", 32600);
    let sid = create(&c);

    // Declared by the image's label, not started yet.
    let list = services(&c, &sid);
    let web = service(&list, "web");
    assert_eq!(web["protocol"], "http");
    assert_eq!(web["container_ports"], json!([8080]));
    assert_eq!(web["status"], "stopped");
    assert_eq!(service(&list, "broken")["status"], "stopped");
    let host_port = web["host_ports"][0].as_u64().unwrap();
    assert_eq!(
        web["url"].as_str().unwrap(),
        format!("http://localhost:{host_port}")
    );

    let page = b"<html><body>hello from kernelvisor</body></html>\n";
    let (status, body) = put(&c, &sid, "index.html", page);
    assert_eq!(
        (status, body["size"].as_u64()),
        (201, Some(page.len() as u64)),
        "{body}"
    );
    // Owned by the kernel's user.
    assert_eq!(
        sh(&c, &sid, "stat -c %u:%g index.html"),
        ("1000:1000\n".into(), 0)
    );

    // Two starts at once: one starts it, the other answers `running` once it is up.
    let path = format!("/v1/sessions/{sid}/services/web");
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| c.post(&path, &json!({})));
        let b = s.spawn(|| c.post(&path, &json!({})));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!((a.status, b.status), (200, 200), "{a:?} {b:?}");
    let mut started = [a.body["started"].as_bool(), b.body["started"].as_bool()];
    started.sort();
    assert_eq!(started, [Some(false), Some(true)], "{a:?} {b:?}");
    assert_eq!(a.body["status"], "running");
    let web_url = a.body["url"].as_str().unwrap().to_owned();
    assert_eq!(
        fetch(&format!("{web_url}/index.html")).unwrap().as_bytes(),
        page
    );
    assert_eq!(service(&services(&c, &sid), "web")["status"], "running");

    // Stopped: the port serves no more.
    let d = c.delete(&path);
    assert_eq!(
        (d.status, d.body["status"].as_str()),
        (200, Some("stopped")),
        "{d:?}"
    );
    assert!(fetch(&format!("{web_url}/index.html")).is_err());
    assert_eq!(service(&services(&c, &sid), "web")["status"], "stopped");
    // And it starts again.
    let again = c.post(&path, &json!({}));
    assert_eq!(
        (again.status, again.body["started"].as_bool()),
        (200, Some(true)),
        "{again:?}"
    );
    assert_eq!(
        fetch(&format!("{web_url}/index.html")).unwrap().as_bytes(),
        page
    );

    // A service whose process dies is seen stopped, and starts again.
    assert_eq!(sh(&c, &sid, "killall httpd").1, 0);
    wait_for(LONG, "web seen stopped", || {
        (service(&services(&c, &sid), "web")["status"] == "stopped").then_some(())
    });
    let revived = c.post(&path, &json!({}));
    assert_eq!(revived.body["started"].as_bool(), Some(true), "{revived:?}");
    assert_eq!(
        fetch(&format!("{web_url}/index.html")).unwrap().as_bytes(),
        page
    );

    // A service whose command exits at once: 409 with its output.
    let broken = c.post(&format!("/v1/sessions/{sid}/services/broken"), &json!({}));
    assert_eq!(
        (broken.status, broken.code()),
        (409, "service-failed"),
        "{broken:?}"
    );
    assert!(
        broken.body["error"]["output"]
            .as_str()
            .unwrap()
            .contains("broken service: missing config"),
        "{broken:?}"
    );
    let unknown = c.post(&format!("/v1/sessions/{sid}/services/jupyter"), &json!({}));
    assert_eq!(
        (unknown.status, unknown.code()),
        (404, "service-not-found"),
        "{unknown:?}"
    );

    // Listing and downloads.
    assert_eq!(put(&c, &sid, "sub/dir/note.txt", b"note").0, 201);
    let (status, l) = list_dir(&c, &sid, "");
    assert_eq!(status, 200, "{l}");
    let files = l["files"].as_array().unwrap();
    let index = files.iter().find(|f| f["name"] == "index.html").unwrap();
    assert_eq!(
        (index["type"].as_str(), index["size"].as_u64()),
        (Some("file"), Some(page.len() as u64))
    );
    assert_eq!(index["mode"], "0644");
    assert!(files
        .iter()
        .any(|f| f["name"] == "sub" && f["type"] == "dir"));
    let (_, sub) = list_dir(&c, &sid, "sub/dir");
    assert_eq!(sub["files"][0]["name"], "note.txt");
    assert_eq!(get_file(&c, &sid, "sub/dir/note.txt").unwrap(), b"note");
    let missing = get_file(&c, &sid, "nope.txt").unwrap_err();
    assert_eq!(
        (missing.0, missing.1["error"]["code"].as_str()),
        (404, Some("file-not-found"))
    );
    let (status, body) = list_dir(&c, &sid, "nope");
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (404, Some("file-not-found"))
    );
    // A directory is not a file.
    assert_eq!(
        get_file(&c, &sid, "sub").unwrap_err().1["error"]["code"],
        "invalid-path"
    );

    // Upload limits: no Content-Length → 411; more than max-upload-size → 413 before any body.
    let raw = |head: &str| {
        let mut s = std::net::TcpStream::connect(c.api.trim_start_matches("http://")).unwrap();
        s.set_read_timeout(Some(LONG)).unwrap();
        s.write_all(head.as_bytes()).unwrap();
        let mut buf = [0u8; 512];
        let n = s.read(&mut buf).unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let chunked = raw(&format!(
        "PUT /v1/sessions/{sid}/files/x.bin HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        c.auth()
    ));
    assert!(chunked.starts_with("HTTP/1.1 411"), "{chunked}");
    let huge = raw(&format!(
        "PUT /v1/sessions/{sid}/files/x.bin HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Length: {}\r\n\r\n",
        c.auth(),
        2u64 << 30
    ));
    assert!(
        huge.starts_with("HTTP/1.1 413") && huge.contains("upload-too-large"),
        "{huge}"
    );

    // The same through the CLI.
    let ctl = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
            .args(["ctl", "--api", &c.api])
            .env("KERNELVISOR_TOKEN", &c.token)
            .args(args)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let local = tempfile::tempdir().unwrap();
    let src = local.path().join("page.html");
    std::fs::write(&src, page).unwrap();
    let (code, out) = ctl(&[
        "session",
        "cp",
        src.to_str().unwrap(),
        &format!("{sid}:cli/"),
    ]);
    assert_eq!(code, Some(0), "{out}");
    let (code, out) = ctl(&["session", "ls", &sid, "cli"]);
    assert!(code == Some(0) && out.contains("page.html"), "{out}");
    let back = local.path().join("back.html");
    let (code, out) = ctl(&[
        "session",
        "cp",
        &format!("{sid}:cli/page.html"),
        back.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{out}");
    assert_eq!(std::fs::read(&back).unwrap(), page);
    let (code, out) = ctl(&["session", "services", &sid]);
    assert!(
        code == Some(0) && out.contains("web") && out.contains("broken"),
        "{out}"
    );
    let (code, out) = ctl(&["session", "service-start", &sid, "broken"]);
    assert!(
        code != Some(0) && out.contains("broken service: missing config"),
        "{out}"
    );
    c.check_invariants();
}

/// The services image re-labelled with `label` (one image per label value).
fn image_with_label(tag: &str, label: &str) -> String {
    let name = format!("kernelvisor-test:{tag}");
    let dockerfile = format!("FROM {IMAGE}\nLABEL ai.backend.service-ports=\"{label}\"\n");
    let mut build = std::process::Command::new("docker")
        .args(["build", "-q", "-t", &name, "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    build
        .stdin
        .take()
        .unwrap()
        .write_all(dockerfile.as_bytes())
        .unwrap();
    assert!(build.wait().unwrap().success(), "docker build");
    name
}

#[test]
fn traversal_is_refused_and_nothing_is_written_outside_home_work() {
    let c = cluster("traverse", 32620);

    // A label that does not parse: the session is refused, naming the label.
    let bad = image_with_label("badlabel", "web:gopher:80");
    let body = json!({"image": bad, "resource_slots": {"cpu": 0.25, "mem": "64m"}, "access_key": c.access_key});
    let a = c.post("/v1/sessions", &body);
    assert_eq!((a.status, a.code()), (400, "invalid-request"), "{a:?}");
    let msg = a.body["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("ai.backend.service-ports") && msg.contains("gopher"),
        "{msg}"
    );

    let sid = create(&c);
    assert_eq!(
        sh(
            &c,
            &sid,
            "ln -s /etc out && mkdir -p in a/b && ln -s ../../in a/b/up"
        )
        .1,
        0
    );

    let code = |r: (u16, Value)| (r.0, r.1["error"]["code"].as_str().unwrap_or("").to_owned());
    let refused = (400, "invalid-path".to_owned());
    // `..` written as is (a client would collapse it); `//etc` makes the path absolute.
    for path in ["../etc/x", "sub/../../etc/x"] {
        let p = format!("/v1/sessions/{sid}/files/{path}");
        assert_eq!(code(raw(&c, "PUT", &p, b"pwned")), refused, "upload {path}");
        assert_eq!(code(raw(&c, "GET", &p, b"")), refused, "download {path}");
    }
    for path in ["/etc/passwd", "/etc/x", "out/x", "out/passwd"] {
        assert_eq!(
            code(put(&c, &sid, path, b"pwned")),
            refused,
            "upload {path}"
        );
        assert_eq!(
            get_file(&c, &sid, path).map_err(code).unwrap_err(),
            refused,
            "download {path}"
        );
    }
    for dir in ["../etc", "/etc", "out", "out/"] {
        assert_eq!(code(list_dir(&c, &sid, dir)), refused, "list {dir}");
    }
    assert_eq!(
        sh(
            &c,
            &sid,
            "test ! -e /etc/x && test ! -e /x && grep -c pwned /etc/passwd"
        )
        .1,
        1
    );

    // A symlink that stays inside /home/work is followed.
    // (`a/b/up` -> `../../in`, relative to `a/b`.)
    assert_eq!(put(&c, &sid, "a/b/up/f.txt", b"inside").0, 201);
    assert_eq!(sh(&c, &sid, "cat in/f.txt"), ("inside".into(), 0));
    assert_eq!(get_file(&c, &sid, "a/b/up/f.txt").unwrap(), b"inside");
    assert_eq!(list_dir(&c, &sid, "a/b/up").1["files"][0]["name"], "f.txt");
    c.check_invariants();
}

/// A deterministic pseudo-random byte source (xorshift64*), `len` bytes long.
struct Noise {
    state: u64,
    left: u64,
}

impl Read for Noise {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (buf.len() as u64).min(self.left) as usize;
        for chunk in buf[..n].chunks_mut(8) {
            self.state ^= self.state >> 12;
            self.state ^= self.state << 25;
            self.state ^= self.state >> 27;
            let v = self.state.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        self.left -= n as u64;
        Ok(n)
    }
}

#[test]
fn sixty_four_mib_round_trip_in_bounded_memory() {
    const SIZE: u64 = 64 << 20;
    let c = cluster("bigfile", 32640);
    let sid = create(&c);
    let manager = c.manager.as_ref().unwrap().id();

    let mut expected = Sha256::new();
    std::io::copy(
        &mut Noise {
            state: 0x9E37_79B9_7F4A_7C15,
            left: SIZE,
        },
        &mut expected,
    )
    .unwrap();
    let expected = expected.finalize();

    let r = ureq::put(&url(&c, &format!("/v1/sessions/{sid}/files/data/big.bin")))
        .set("Authorization", &c.auth())
        .timeout(Duration::from_secs(300))
        .set("Content-Length", &SIZE.to_string())
        .send(Noise {
            state: 0x9E37_79B9_7F4A_7C15,
            left: SIZE,
        });
    let (status, body) = answer(r);
    assert_eq!((status, body["size"].as_u64()), (201, Some(SIZE)), "{body}");
    let (out, code) = sh(&c, &sid, "sha256sum data/big.bin | cut -d' ' -f1");
    assert_eq!(code, 0);
    assert_eq!(out.trim(), format!("{expected:x}"));

    let resp = ureq::get(&url(&c, &format!("/v1/sessions/{sid}/files/data/big.bin")))
        .set("Authorization", &c.auth())
        .timeout(Duration::from_secs(300))
        .call()
        .unwrap();
    assert_eq!(
        resp.header("Content-Length"),
        Some(SIZE.to_string().as_str())
    );
    let mut got = Sha256::new();
    let n = std::io::copy(&mut resp.into_reader(), &mut got).unwrap();
    assert_eq!(n, SIZE);
    assert_eq!(got.finalize(), expected);

    assert_bounded_memory(c.agents[0].pid(), manager, "64 MiB up and down");
    c.check_invariants();
}

#[test]
fn services_and_files_survive_an_agent_restart() {
    let mut c = cluster("restart", 32660);
    let agent_id = c.agents[0].id().to_owned();
    let sid = create(&c);
    assert_eq!(put(&c, &sid, "index.html", b"before restart").0, 201);
    let started = c.post(&format!("/v1/sessions/{sid}/services/web"), &json!({}));
    assert_eq!(started.status, 200, "{started:?}");
    let web_url = started.body["url"].as_str().unwrap().to_owned();

    c.stop_agent(0);
    c.start_agent(0);
    c.wait_agent_status(&agent_id, "ALIVE", LONG);
    wait_for(LONG, "the session through the restarted agent", || {
        (c.get(&format!("/v1/sessions/{sid}/services")).ok()?.status == 200).then_some(())
    });

    // The service started before the restart is still seen, served, and stoppable.
    assert_eq!(service(&services(&c, &sid), "web")["status"], "running");
    assert_eq!(
        fetch(&format!("{web_url}/index.html")).unwrap(),
        "before restart"
    );
    let again = c.post(&format!("/v1/sessions/{sid}/services/web"), &json!({}));
    assert_eq!(again.body["started"].as_bool(), Some(false), "{again:?}");
    assert_eq!(
        c.delete(&format!("/v1/sessions/{sid}/services/web")).status,
        200
    );
    assert!(fetch(&format!("{web_url}/index.html")).is_err());

    let (status, body) = put(&c, &sid, "index.html", b"after restart");
    assert_eq!(status, 201, "the first upload after the restart: {body}");
    assert_eq!(get_file(&c, &sid, "index.html").unwrap(), b"after restart");
    let started = c.post(&format!("/v1/sessions/{sid}/services/web"), &json!({}));
    assert_eq!(started.body["started"].as_bool(), Some(true), "{started:?}");
    assert_eq!(
        fetch(&format!("{web_url}/index.html")).unwrap(),
        "after restart"
    );
    c.check_invariants();
}

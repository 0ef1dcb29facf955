//! The manager's API over TLS (`[api] tls-cert` / `tls-key`) with the real binaries: a manager
//! process serving HTTPS with a self-signed certificate made here (rcgen, for `localhost` and
//! 127.0.0.1), and `kernelvisor ctl` talking to it with and without `--ca-cert`. No agent and no
//! Docker: nothing here needs a kernel.

use crate::common::agent::free_port;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kernelvisor::config::ManagerConfig;

use crate::common::pty;

/// A self-signed certificate for `localhost` and 127.0.0.1, written as `cert.pem` and
/// `key.pem` in `dir`.
fn self_signed(dir: &Path) -> (PathBuf, PathBuf) {
    let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
    let certified = rcgen::generate_simple_self_signed(names).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

/// A minimal manager config (SQLite in `dir`, no CURVE, short intervals, the admin token
/// written to `dir/admin-token`) with `api_extra` lines added to `[api]`; written to
/// `dir/name`.
fn manager_config(dir: &Path, name: &str, api_port: u16, api_extra: &str) -> PathBuf {
    let d = dir.display();
    let text = format!(
        "[manager]\nevent-listen-addr = {{ host = \"127.0.0.1\", port = {intake} }}\n\
         heartbeat-interval = 1\nheartbeat-timeout = 3\nstartup-grace = 2.5\n\n\
         [store]\nurl = \"sqlite://{d}/m.db\"\n\n\
         [api]\nlisten-addr = {{ host = \"127.0.0.1\", port = {api_port} }}\nworkers = 1\n\
         admin-token-file = {token}\n{api_extra}\n\
         [logging]\nlevel = \"info\"\n",
        intake = free_port(),
        token = quoted(&dir.join("admin-token")),
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// `toml`'s basic string of a path.
fn quoted(p: &Path) -> String {
    format!("{:?}", p.display().to_string())
}

/// A manager process, killed when dropped; its stdout and stderr go to `log`.
struct Manager {
    child: Child,
    log: PathBuf,
}

impl Manager {
    fn start(config: &Path, log: PathBuf) -> Manager {
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
            .args(["manager", "--config"])
            .arg(config)
            .env("NO_COLOR", "1")
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Manager { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits up to `limit` for the process to exit by itself; its exit status, if it did.
    fn exited_within(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Manager {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `kernelvisor ctl ARGS` with no `KERNELVISOR_*` variables from the environment.
fn ctl(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .arg("ctl")
        .args(args)
        .env_remove("KERNELVISOR_API")
        .env_remove("KERNELVISOR_TOKEN")
        .env_remove("KERNELVISOR_CA_CERT")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn tls_cert_and_key_go_together() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    for extra in ["tls-cert = \"/x/cert.pem\"", "tls-key = \"/x/key.pem\""] {
        let path = manager_config(dir.path(), "half.toml", port, extra);
        let err = ManagerConfig::load(&path).unwrap_err().to_string();
        assert!(err.contains("api.tls-key"), "{extra}: {err}");
    }
    let both = "tls-cert = \"/x/cert.pem\"\ntls-key = \"/x/key.pem\"";
    let config = ManagerConfig::load(&manager_config(dir.path(), "m.toml", port, both)).unwrap();
    assert_eq!(
        config.api.tls_cert.as_deref(),
        Some(Path::new("/x/cert.pem"))
    );
    assert_eq!(config.api.tls_key.as_deref(), Some(Path::new("/x/key.pem")));
}

#[test]
fn manager_refuses_to_start_on_a_bad_certificate_or_key() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let missing = dir.path().join("missing.pem");
    let junk = dir.path().join("junk.pem");
    std::fs::write(&junk, "-----BEGIN CERTIFICATE-----\nnot base64!\n").unwrap();
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let (_, other_key) = self_signed(&other);
    for (i, (c, k, named)) in [
        (&missing, &key, &missing),
        (&cert, &missing, &missing),
        (&junk, &key, &junk),
        (&cert, &cert, &cert),
        // A key that is not the certificate's: both files are named.
        (&cert, &other_key, &other_key),
    ]
    .into_iter()
    .enumerate()
    {
        let extra = format!("tls-cert = {}\ntls-key = {}", quoted(c), quoted(k));
        let config = manager_config(dir.path(), &format!("bad{i}.toml"), free_port(), &extra);
        let mut m = Manager::start(&config, dir.path().join(format!("bad{i}.log")));
        let status = m
            .exited_within(Duration::from_secs(30))
            .unwrap_or_else(|| panic!("case {i}: the manager started: {}", m.log()));
        assert!(!status.success(), "case {i}");
        let log = m.log();
        assert!(
            log.contains(&named.display().to_string()),
            "case {i}: the error names {}: {log}",
            named.display()
        );
        assert!(!log.contains("manager started"), "case {i}: {log}");
    }
}

#[test]
fn plain_http_is_warned_about_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let config = manager_config(dir.path(), "m.toml", port, "");
    let m = Manager::start(&config, dir.path().join("m.log"));
    let api = format!("http://127.0.0.1:{port}");
    wait_for_health(&["--api", &api], &m);
    let log = m.log();
    assert_eq!(log.matches("plain HTTP").count(), 1, "{log}");
    // An https:// URL of a plain HTTP API: no answer, and a hint at the scheme.
    let out = ctl(&["--api", &format!("https://127.0.0.1:{port}"), "health"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("use an http:// URL"), "{err}");
}

/// Polls `ctl ARGS health` until it exits 0 (up to 30 s); panics with the manager's log.
fn wait_for_health(args: &[&str], m: &Manager) -> Output {
    let start = Instant::now();
    loop {
        let out = ctl(&[args, &["health"][..]].concat());
        if out.status.success() {
            return out;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no health answer over {args:?}: {}\nmanager log:\n{}",
            text(&out.stderr),
            m.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn https_api_with_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = self_signed(dir.path());
    let token_file = dir.path().join("admin-token");
    let extra = format!("tls-cert = {}\ntls-key = {}", quoted(&cert), quoted(&key));
    let port = free_port();
    let config = manager_config(dir.path(), "m.toml", port, &extra);
    let m = Manager::start(&config, dir.path().join("m.log"));
    let api = format!("https://localhost:{port}");
    let ca = cert.to_str().unwrap();

    // The CLI trusts exactly --ca-cert: the health answer comes over TLS.
    let out = wait_for_health(&["--api", &api, "--ca-cert", ca], &m);
    assert!(
        text(&out.stdout).contains("Status:"),
        "{}",
        text(&out.stdout)
    );
    assert!(!m.log().contains("plain HTTP"), "TLS is on: {}", m.log());
    let out = ctl(&["--api", &api, "--ca-cert", ca, "-o", "json", "health"]);
    let health: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(health["status"], "ok");
    // The certificate names 127.0.0.1 too; the CA also comes from KERNELVISOR_CA_CERT.
    let out = Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .args(["ctl", "health"])
        .env("KERNELVISOR_API", format!("https://127.0.0.1:{port}/"))
        .env("KERNELVISOR_CA_CERT", ca)
        .env_remove("KERNELVISOR_TOKEN")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Without --ca-cert the self-signed certificate is not trusted (webpki roots): no answer,
    // exit 3, an error that says so and how to fix it.
    let out = ctl(&["--api", &api, "health"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(
        err.starts_with("error: ") && err.contains("certificate"),
        "{err}"
    );
    assert!(err.contains("--ca-cert"), "{err}");
    assert!(out.stdout.is_empty());
    // A CA file that is not the server's certificate is no better.
    let other = dir.path().join("other");
    std::fs::create_dir(&other).unwrap();
    let (other_cert, _) = self_signed(&other);
    let out = ctl(&[
        "--api",
        &api,
        "--ca-cert",
        other_cert.to_str().unwrap(),
        "health",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("certificate"),
        "{}",
        text(&out.stderr)
    );

    // The terminal's WebSocket (`session exec -t`) goes over the same TLS, trusting the same
    // --ca-cert: the API's answer to its upgrade (401, no token given) comes back through it;
    // without --ca-cert the certificate is refused as for every call.
    let mut terminal = pty::Pty::shell(dir.path(), 24, 80, &[]);
    let bin = env!("CARGO_BIN_EXE_kernelvisor");
    for (ca_arg, says, code) in [
        (format!("--ca-cert {ca}"), "unauthorized", 1),
        (String::new(), "certificate", 3),
    ] {
        let from = terminal.mark();
        terminal.send(&format!(
            "env -u KERNELVISOR_TOKEN -u KERNELVISOR_CA_CERT {bin} ctl --api {api} {ca_arg} \
             session exec -it some-session; echo EXIT=$((0+$?))\n"
        ));
        let end = terminal.expect_from(from, &format!("EXIT={code}"), Duration::from_secs(30));
        let shown = terminal.output();
        assert!(end.is_some(), "{ca_arg:?}: {shown}");
        assert!(shown[from..].contains(says), "{ca_arg:?}: {shown}");
    }

    // Plain HTTP to the TLS port gets no HTTP answer (a TLS alert), and a hint at the scheme.
    let out = ctl(&["--api", &format!("http://127.0.0.1:{port}"), "health"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("use an https:// URL"), "{err}");
    assert!(out.stdout.is_empty());

    // The admin token the manager wrote at start works through TLS; without it the answer is
    // a 401 with the hint.
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim();
    let out = ctl(&[
        "--api",
        &api,
        "--ca-cert",
        ca,
        "--token",
        token,
        "access-key",
        "list",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("ACCESS KEY"),
        "{}",
        text(&out.stdout)
    );
    let out = ctl(&["--api", &api, "--ca-cert", ca, "access-key", "list"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("(HTTP 401)") && err.contains("hint: ") && err.contains("KERNELVISOR_TOKEN"),
        "{err}"
    );
    // A user key made over TLS, its secret used as a token from KERNELVISOR_TOKEN.
    let out = ctl(&[
        "--api",
        &api,
        "--ca-cert",
        ca,
        "--token",
        token,
        "-o",
        "json",
        "access-key",
        "create",
        "--name",
        "tls-test",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let created: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&created["role"], &created["name"]),
        (&serde_json::json!("user"), &serde_json::json!("tls-test"))
    );
    let secret = created["secret_key"].as_str().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kernelvisor"))
        .args(["ctl", "--api", &api, "--ca-cert", ca, "vfolder", "list"])
        .env("KERNELVISOR_TOKEN", secret)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).starts_with("NAME"),
        "{}",
        text(&out.stdout)
    );
}

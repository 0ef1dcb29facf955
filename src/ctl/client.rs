//! A small blocking client for the manager's HTTP API (`docs/manager-api.md`), on `ureq`.
//!
//! `http://` or `https://` (rustls with the `ring` provider: the webpki roots, or exactly the
//! certificates of [`ClientOptions::ca_cert`]). With [`ClientOptions::token`] every request
//! carries `Authorization: Bearer <token>`. Every call answers the body both as the raw text
//! (so `--output json` can print it unchanged) and parsed, except the calls that hand back the
//! body as a reader for answers that stream (`/logs?follow=true`, events, a file's bytes); a
//! file upload is sent as it is read. The calls by method and path are private: ctl calls each
//! route through its typed method of `api`, where its path is written once.
//!
//! Several managers (`docs/design.md`, high availability): the base may be a comma-separated list of URLs. A request goes
//! to the one that answered last (the first at start); when it cannot be reached (connection
//! refused, DNS, connect timeout: nothing was sent) the next is tried, and an error names every
//! URL tried. A request that reached a manager is never sent again.

use std::fmt;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::model::error::ErrorBody;

mod api;
pub use api::{execute_path, file_path, lenient, logs_path, read, Answer, EVENTS_PATH};

/// How long to wait for the TCP connection to the manager.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Whole-request limit for calls that do not run user code or stream (everything but execute
/// and followed logs).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Bodies larger than this are refused (ureq's `into_string` limit is 10 MiB as well).
const MAX_BODY: u64 = 10 * 1024 * 1024;
/// File transfers (`session cp`) have no whole-request limit (a file may take long); they fail
/// when a single read or write of the connection waits longer than this.
pub const TRANSFER_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

/// An error answer of the API: a 4xx/5xx status with `{"error": {"code", "message"}}`.
///
/// Displayed as `error: <code>: <message> (HTTP <status>)`. When the body is not that envelope
/// (a proxy's HTML page, say), `code` is `unexpected-response` and `message` the start of the body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("error: {code}: {message} (HTTP {status})")]
pub struct ApiError {
    /// The HTTP status (400–599).
    pub status: u16,
    /// The stable error code (`session-not-found`, `no-capacity`, …); branch on this.
    pub code: String,
    /// Human text; never branch on it.
    pub message: String,
    /// The raw response body, for `--output json`.
    pub body: String,
    /// What to try, printed by ctl after the error as `hint: …` (a 401: how to give a token).
    /// Not part of the displayed error.
    pub hint: Option<String>,
}

impl ApiError {
    /// Builds the error from a non-2xx status and its body.
    pub fn from_body(status: u16, body: String) -> Self {
        // The API's envelope has a code; any other body (a proxy's HTML page) has none.
        let envelope = serde_json::from_str::<ErrorBody>(&body)
            .ok()
            .filter(|e| !e.error.code.is_empty())
            .map(|e| (e.error.code, e.error.message));
        let (code, message) = envelope.unwrap_or_else(|| {
            let text: String = body.trim().chars().take(200).collect();
            (
                "unexpected-response".to_owned(),
                if text.is_empty() {
                    "(empty body)".to_owned()
                } else {
                    text
                },
            )
        });
        ApiError {
            status,
            code,
            message,
            body,
            hint: None,
        }
    }

    /// Whether the body was the API's JSON error envelope (then it is worth printing as JSON).
    pub fn is_envelope(&self) -> bool {
        self.code != "unexpected-response"
    }

    /// The `output` string of the error (`service-failed`: the tail of the service's output),
    /// read from `error.output` or, failing that, a top-level `output` (a shape outside the
    /// model, read as it is).
    pub fn output(&self) -> Option<String> {
        if let Some(output) = serde_json::from_str::<ErrorBody>(&self.body)
            .ok()
            .and_then(|e| e.error.output)
        {
            return Some(output);
        }
        let v = serde_json::from_str::<Value>(&self.body).ok()?;
        v.get("output")?.as_str().map(str::to_owned)
    }
}

/// Exit status of `ctl` when the API could not be reached or the connection broke: 3, apart
/// from clap's 2 for a usage error, so a script can tell "retry later" from "fix the command".
pub const EXIT_UNREACHABLE: i32 = 3;

/// Why a call got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API answered with an error status (ctl exits 1).
    #[error(transparent)]
    Api(#[from] ApiError),
    /// No answer: bad URL, DNS, connection refused, TLS, I/O error or timeout (ctl exits
    /// [`EXIT_UNREACHABLE`]).
    #[error("error: {what} {url}: {detail}")]
    Transport {
        what: &'static str,
        url: String,
        detail: String,
    },
    /// A 2xx answer whose body is not JSON (ctl exits 1).
    #[error("error: invalid response from {url}: {detail}")]
    InvalidResponse { url: String, detail: String },
}

impl ClientError {
    /// The process exit status this error maps to: [`EXIT_UNREACHABLE`] when the API could not
    /// be reached or the connection broke, else 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            ClientError::Transport { .. } => EXIT_UNREACHABLE,
            ClientError::Api(_) | ClientError::InvalidResponse { .. } => 1,
        }
    }
}

/// A successful (2xx) answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The body exactly as received (empty for an answer without a body).
    pub text: String,
    /// The body parsed (`null` for an answer without a body).
    pub json: Value,
}

impl AsRef<Reply> for Reply {
    fn as_ref(&self) -> &Reply {
        self
    }
}

/// How a [`Client`] authenticates and whom it trusts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientOptions {
    /// Sent with every request as `Authorization: Bearer <token>`; `None` (or empty): no
    /// `Authorization` header.
    pub token: Option<String>,
    /// A PEM file of the certificates to trust for `https://` (the API's self-signed
    /// certificate, or the CA that issued it), instead of the webpki roots. Read when the
    /// client is made, also for an `http://` URL (where it goes unused).
    pub ca_cert: Option<PathBuf>,
}

/// What to try when the API refused a request for want of a token (HTTP 401, none given).
pub const NO_TOKEN_HINT: &str =
    "the API wants an access token: pass --token TOKEN or set KERNELVISOR_TOKEN";
/// What to try when the API refused the token given (HTTP 401).
pub const BAD_TOKEN_HINT: &str =
    "the token given (--token or KERNELVISOR_TOKEN) was refused: check it, and that its access \
     key exists and is enabled";

/// A client bound to one API base URL such as `http://127.0.0.1:8081`, or several. A clone
/// shares the connection pools and goes on on its own (for another thread).
#[derive(Clone)]
pub struct Client {
    /// Every base URL, in the order given.
    bases: Vec<String>,
    /// The one that answered last (tried first).
    current: std::cell::Cell<usize>,
    /// `url: why` of each base the last request could not reach, when it reached none.
    unreached: std::cell::RefCell<Vec<String>>,
    /// `Bearer <token>`, the value of the `Authorization` header.
    authorization: Option<String>,
    /// The `--ca-cert` file, if any: named in the hint of a certificate error.
    ca_cert: Option<PathBuf>,
    agent: ureq::Agent,
    /// For file transfers: every read and write bounded by [`TRANSFER_IDLE_TIMEOUT`].
    transfer: ureq::Agent,
}

// The request closures return ureq's own `Result`, whose error is large; it is handled at once.
#[allow(clippy::result_large_err)]
impl Client {
    /// A client for the API at `base` (a trailing `/` is ignored), without a token, trusting
    /// the webpki roots for `https://`.
    ///
    /// Errors as [`Client::with_options`].
    pub fn new(base: &str) -> Result<Self, ClientError> {
        Client::with_options(base, &ClientOptions::default())
    }

    /// A client for the API at `base` (a trailing `/` is ignored) with a token and trusted
    /// certificates.
    ///
    /// Errors ([`ClientError::Transport`], ctl exits 2): "invalid API URL" unless `base` is
    /// `http://…` or `https://…`; "cannot use CA certificate" when `ca_cert` cannot be read or
    /// holds no PEM certificate that rustls accepts.
    pub fn with_options(base: &str, options: &ClientOptions) -> Result<Self, ClientError> {
        let mut bases = Vec::new();
        for one in base.split(',').filter(|b| !b.trim().is_empty()) {
            let one = one.trim().trim_end_matches('/');
            let scheme_ok = ["http://", "https://"].iter().any(|scheme| {
                one.get(..scheme.len())
                    .is_some_and(|s| s.eq_ignore_ascii_case(scheme))
                    && one.len() > scheme.len()
            });
            if !scheme_ok {
                return Err(ClientError::Transport {
                    what: "invalid API URL",
                    url: one.to_owned(),
                    detail: "expected http://HOST:PORT or https://HOST:PORT".to_owned(),
                });
            }
            bases.push(one.to_owned());
        }
        if bases.is_empty() {
            return Err(ClientError::Transport {
                what: "invalid API URL",
                url: base.to_owned(),
                detail: "expected http://HOST:PORT or https://HOST:PORT".to_owned(),
            });
        }
        let mut agent = ureq::AgentBuilder::new().timeout_connect(CONNECT_TIMEOUT);
        let mut transfer = ureq::AgentBuilder::new()
            .timeout_connect(CONNECT_TIMEOUT)
            .timeout_read(TRANSFER_IDLE_TIMEOUT)
            .timeout_write(TRANSFER_IDLE_TIMEOUT);
        if let Some(path) = &options.ca_cert {
            let tls = Arc::new(tls_config(path)?);
            agent = agent.tls_config(tls.clone());
            transfer = transfer.tls_config(tls);
        }
        Ok(Client {
            bases,
            current: std::cell::Cell::new(0),
            unreached: std::cell::RefCell::new(Vec::new()),
            authorization: options
                .token
                .as_deref()
                .filter(|t| !t.is_empty())
                .map(|t| format!("Bearer {t}")),
            ca_cert: options.ca_cert.clone(),
            agent: agent.build(),
            transfer: transfer.build(),
        })
    }

    /// A request on `agent` with the `Authorization` header when there is a token.
    fn request(&self, agent: &ureq::Agent, method: &str, url: &str) -> ureq::Request {
        let req = agent.request(method, url);
        match &self.authorization {
            Some(value) => req.set("Authorization", value),
            None => req,
        }
    }

    /// The full URL of `path` (which starts with `/`) at the base in use.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.bases[self.current.get()])
    }

    /// Sends `path` with `send` (given the full URL) to the base in use, and on a connection
    /// failure (nothing sent) to the next ones in turn; the base that answered is used first
    /// from then on. Returns the URL of the last try and its outcome; when no base could be
    /// reached, the error's detail names every URL tried.
    fn send(
        &self,
        path: &str,
        mut send: impl FnMut(&str) -> Result<ureq::Response, ureq::Error>,
    ) -> (String, Result<ureq::Response, ureq::Error>) {
        let n = self.bases.len();
        let start = self.current.get();
        let mut tried = Vec::new();
        for k in 0..n {
            let i = (start + k) % n;
            let url = format!("{}{path}", self.bases[i]);
            let res = send(&url);
            match &res {
                Err(ureq::Error::Transport(t)) if unreachable(t) => {
                    tried.push(format!("{url}: {}", transport_detail(t)));
                    if k + 1 < n {
                        continue;
                    }
                    if n > 1 {
                        *self.unreached.borrow_mut() = tried;
                    }
                    return (url, res);
                }
                _ => {
                    self.current.set(i);
                    self.unreached.borrow_mut().clear();
                    return (url, res);
                }
            }
        }
        unreachable!("the loop returns on its last try")
    }

    /// The first base, from the one in use, that takes a TCP connection (for a request whose
    /// body cannot be sent twice); the one in use when none does.
    fn reachable_base(&self) -> usize {
        let n = self.bases.len();
        let start = self.current.get();
        if n == 1 {
            return start;
        }
        for k in 0..n {
            let i = (start + k) % n;
            let Some((host, port)) = host_port(&self.bases[i]) else {
                continue;
            };
            let addrs = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port));
            let up = addrs
                .into_iter()
                .flatten()
                .any(|a| std::net::TcpStream::connect_timeout(&a, CONNECT_TIMEOUT).is_ok());
            if up {
                self.current.set(i);
                return i;
            }
        }
        start
    }

    /// `GET path?query`.
    fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Reply, ClientError> {
        let (url, res) = self.send(path, |url| {
            let mut req = self
                .request(&self.agent, "GET", url)
                .timeout(REQUEST_TIMEOUT);
            for (k, v) in query {
                req = req.query(k, v);
            }
            req.call()
        });
        self.finish(&url, res)
    }

    /// `POST path` with a JSON body; `timeout` `None` waits as long as the manager takes.
    fn post(
        &self,
        path: &str,
        body: &Value,
        timeout: Option<Duration>,
    ) -> Result<Reply, ClientError> {
        let (url, res) = self.send(path, |url| {
            let mut req = self.request(&self.agent, "POST", url);
            if let Some(t) = timeout {
                req = req.timeout(t);
            }
            req.send_json(body)
        });
        self.finish(&url, res)
    }

    /// `PATCH path` with a JSON body.
    fn patch(&self, path: &str, body: &Value) -> Result<Reply, ClientError> {
        let (url, res) = self.send(path, |url| {
            self.request(&self.agent, "PATCH", url)
                .timeout(REQUEST_TIMEOUT)
                .send_json(body)
        });
        self.finish(&url, res)
    }

    /// `POST path` without a body (`Content-Length: 0`); `timeout` as for [`Client::post`].
    fn post_empty(&self, path: &str, timeout: Option<Duration>) -> Result<Reply, ClientError> {
        let (url, res) = self.send(path, |url| {
            let mut req = self.request(&self.agent, "POST", url);
            if let Some(t) = timeout {
                req = req.timeout(t);
            }
            req.send_bytes(&[])
        });
        self.finish(&url, res)
    }

    /// `DELETE path`.
    fn delete(&self, path: &str) -> Result<Reply, ClientError> {
        self.delete_query(path, &[])
    }

    /// `DELETE path?query`.
    fn delete_query(&self, path: &str, query: &[(&str, &str)]) -> Result<Reply, ClientError> {
        let (url, res) = self.send(path, |url| {
            let mut req = self
                .request(&self.agent, "DELETE", url)
                .timeout(REQUEST_TIMEOUT);
            for (k, v) in query {
                req = req.query(k, v);
            }
            req.call()
        });
        self.finish(&url, res)
    }

    /// `GET path?query` whose 2xx body is read as it arrives, any size (`/logs`): the body as a
    /// reader, unread. Error answers map as for the other calls. `timeout` bounds the whole call
    /// including reading the body; `None` waits forever (a followed log may stream for hours).
    /// Map read errors with [`read_error`].
    fn get_stream(
        &self,
        path: &str,
        query: &[(&str, &str)],
        timeout: Option<Duration>,
    ) -> Result<impl Read + Send, ClientError> {
        let (url, res) = self.send(path, |url| {
            let mut req = self.request(&self.agent, "GET", url);
            if let Some(t) = timeout {
                req = req.timeout(t);
            }
            for (k, v) in query {
                req = req.query(k, v);
            }
            req.call()
        });
        match res {
            Ok(resp) => Ok(resp.into_reader()),
            Err(e) => Err(self.failure(&url, e)),
        }
    }

    /// `PUT path` with `body` as the raw request body, sent as it is read (never held whole),
    /// with `Content-Length: length`; at most `length` bytes of `body` are sent. Each read and
    /// write of the connection may wait `TRANSFER_IDLE_TIMEOUT`; the whole call has no limit.
    ///
    /// An answer the manager gives before it read the whole body (an error, say) reaches ureq
    /// only as a broken connection once the body no longer fits the socket buffers: that is an
    /// "upload cut off" [`ClientError::Transport`] with a hint of the likely cause.
    fn put_file(&self, path: &str, body: impl Read, length: u64) -> Result<Reply, ClientError> {
        // The body is read as it is sent, so it cannot be sent twice: pick a reachable manager
        // first.
        let url = format!("{}{path}", self.bases[self.reachable_base()]);
        let req = self
            .request(&self.transfer, "PUT", &url)
            .set("Content-Type", "application/octet-stream")
            .set("Content-Length", &length.to_string());
        match req.send(body.take(length)) {
            Err(ureq::Error::Transport(t)) if cut_off(&t) => Err(ClientError::Transport {
                what: "upload cut off by",
                url: url.clone(),
                detail: format!(
                    "{} (the manager closed the connection before it read the whole file: it \
                     may have refused it; check the session id and path, or the manager's log)",
                    transport_detail(&t)
                ),
            }),
            res => self.finish(&url, res),
        }
    }

    /// `GET path` whose 2xx body is a file's bytes: the body as a reader, unread (chunked or
    /// with `Content-Length`; a body that ends before its `Content-Length` fails the read). Error
    /// answers map as for the other calls. Each read may wait `TRANSFER_IDLE_TIMEOUT`; the
    /// whole call has no limit. Map read errors with `read_error`.
    fn get_file(&self, path: &str) -> Result<impl Read + Send, ClientError> {
        let (url, res) = self.send(path, |url| self.request(&self.transfer, "GET", url).call());
        match res {
            Ok(resp) => Ok(resp.into_reader()),
            Err(e) => Err(self.failure(&url, e)),
        }
    }

    /// Reads the response (or error) of one call into a [`Reply`] or [`ClientError`]. A 2xx
    /// answer without a body (`204`) is a [`Reply`] of `""` / `null`.
    fn finish(
        &self,
        url: &str,
        res: Result<ureq::Response, ureq::Error>,
    ) -> Result<Reply, ClientError> {
        match res {
            Ok(resp) => {
                let text = read_body(url, resp)?;
                if text.trim().is_empty() {
                    return Ok(Reply {
                        text: String::new(),
                        json: Value::Null,
                    });
                }
                match serde_json::from_str(&text) {
                    Ok(json) => Ok(Reply { text, json }),
                    Err(e) => Err(ClientError::InvalidResponse {
                        url: url.to_owned(),
                        detail: format!("not JSON: {e}"),
                    }),
                }
            }
            Err(e) => Err(self.failure(url, e)),
        }
    }

    /// The full URL of `path` at the first base, from the one in use, that takes a TCP
    /// connection: for a connection of its own (the terminal's WebSocket).
    pub(crate) fn reachable_url(&self, path: &str) -> String {
        format!("{}{path}", self.bases[self.reachable_base()])
    }

    /// The `Authorization` header value (`Bearer <token>`), when there is a token.
    pub(crate) fn authorization(&self) -> Option<&str> {
        self.authorization.as_deref()
    }

    /// The TLS configuration for an `https://` connection made outside ureq (the terminal's
    /// WebSocket): exactly the `--ca-cert` certificates, else the webpki roots, on `ring`.
    ///
    /// Errors: as [`Client::with_options`] for a `--ca-cert` it cannot use.
    pub(crate) fn tls_config(&self) -> Result<rustls::ClientConfig, ClientError> {
        if let Some(path) = &self.ca_cert {
            return tls_config(path);
        }
        let roots: rustls::RootCertStore = webpki_roots::TLS_SERVER_ROOTS.iter().cloned().collect();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Ok(rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ClientError::Transport {
                what: "cannot set up TLS for",
                url: self.bases[self.current.get()].clone(),
                detail: e.to_string(),
            })?
            .with_root_certificates(roots)
            .with_no_client_auth())
    }

    /// An error answer (`status`, `body`) as every call reports it: a 401 with a hint about
    /// the token.
    pub(crate) fn api_error(&self, status: u16, body: String) -> ClientError {
        let mut api = ApiError::from_body(status, body);
        if status == 401 {
            let hint = match self.authorization {
                None => NO_TOKEN_HINT,
                Some(_) => BAD_TOKEN_HINT,
            };
            api.hint = Some(hint.to_owned());
        }
        api.into()
    }

    /// A call's error: the API's error answer (a 401 with a hint about the token), or why there
    /// was none (a certificate error with a hint about `--ca-cert`).
    fn failure(&self, url: &str, e: ureq::Error) -> ClientError {
        match e {
            ureq::Error::Status(status, resp) => {
                // A body we cannot read still leaves the status worth reporting.
                let body = read_body(url, resp).unwrap_or_default();
                self.api_error(status, body)
            }
            ureq::Error::Transport(t) => {
                let unreached = std::mem::take(&mut *self.unreached.borrow_mut());
                if !unreached.is_empty() {
                    return ClientError::Transport {
                        what: "could not reach",
                        url: self.bases.join(","),
                        detail: format!("no API URL answered: {}", unreached.join("; ")),
                    };
                }
                let mut err = transport(url, &t);
                if let (ClientError::Transport { detail, .. }, Some(hint)) =
                    (&mut err, self.transport_hint(url, &t))
                {
                    detail.push_str(&format!(" ({hint})"));
                }
                err
            }
        }
    }

    /// What to try after a transport error that TLS explains: the server's certificate is not
    /// trusted (`--ca-cert`), an `https://` URL of a plain HTTP API, or an `http://` URL of an
    /// HTTPS one (its answer is a TLS alert, not an HTTP status line).
    fn transport_hint(&self, url: &str, t: &ureq::Transport) -> Option<String> {
        let https = url
            .get(..8)
            .is_some_and(|s| s.eq_ignore_ascii_case("https://"));
        match tls_error(t) {
            Some(rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented) => {
                Some(match &self.ca_cert {
                    None => "the API's certificate is not trusted: pass --ca-cert PATH or set \
                             KERNELVISOR_CA_CERT, PATH being the certificate or the CA that \
                             issued it"
                        .to_owned(),
                    Some(p) => format!(
                        "the API's certificate is not trusted by --ca-cert {}, or does not name \
                         the host of the API URL",
                        p.display()
                    ),
                })
            }
            Some(rustls::Error::InvalidMessage(_)) if https => {
                Some("is the API plain HTTP? then use an http:// URL".to_owned())
            }
            None if !https && not_http(t) => Some(
                "the answer is not HTTP: is the API served over HTTPS? then use an https:// URL"
                    .to_owned(),
            ),
            _ => None,
        }
    }
}

/// The rustls client config that trusts exactly the certificates of the PEM file `path`, on the
/// `ring` provider.
///
/// Errors ([`ClientError::Transport`], "cannot use CA certificate"): the file cannot be read,
/// its PEM is malformed, it holds no certificate, or rustls rejects one as a trust anchor.
fn tls_config(path: &Path) -> Result<rustls::ClientConfig, ClientError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::CertificateDer;
    let fail = |detail: String| ClientError::Transport {
        what: "cannot use CA certificate",
        url: path.display().to_string(),
        detail,
    };
    let pem = std::fs::read(path).map_err(|e| fail(e.to_string()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| fail(format!("invalid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(fail(
            "no PEM certificate (BEGIN CERTIFICATE) in it".to_owned(),
        ));
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| fail(format!("not a usable certificate: {e}")))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| fail(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

/// Whether a transport error is an answer that is not HTTP: a bad status line or header
/// (ureq reports a status line without `\n`, as a TLS alert is, as an `InvalidInput` I/O error).
fn not_http(t: &ureq::Transport) -> bool {
    if matches!(
        t.kind(),
        ureq::ErrorKind::BadStatus | ureq::ErrorKind::BadHeader
    ) {
        return true;
    }
    std::error::Error::source(t)
        .and_then(|s| s.downcast_ref::<io::Error>())
        .is_some_and(|e| {
            matches!(
                e.kind(),
                io::ErrorKind::InvalidInput | io::ErrorKind::InvalidData
            )
        })
}

/// The rustls error under a transport error, if any (ureq wraps it in an `io::Error`).
fn tls_error(t: &ureq::Transport) -> Option<&rustls::Error> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(t);
    while let Some(e) = next {
        let tls = e.downcast_ref::<rustls::Error>().or_else(|| {
            e.downcast_ref::<io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if tls.is_some() {
            return tls;
        }
        next = e.source();
    }
    None
}

fn read_body(url: &str, resp: ureq::Response) -> Result<String, ClientError> {
    let mut text = String::new();
    resp.into_reader()
        .take(MAX_BODY)
        .read_to_string(&mut text)
        .map_err(|e| read_error(url, &e))?;
    Ok(text)
}

/// A failure reading the body of an answer from `url` (the connection broke, or the call's
/// timeout passed): a [`ClientError::Transport`] (ctl exits 2).
pub fn read_error(url: &str, e: &io::Error) -> ClientError {
    ClientError::Transport {
        what: "reading the response from",
        url: url.to_owned(),
        detail: e.to_string(),
    }
}

fn transport(url: &str, t: &ureq::Transport) -> ClientError {
    use ureq::ErrorKind as K;
    let what = match t.kind() {
        K::InvalidUrl | K::UnknownScheme => "invalid API URL",
        K::Dns | K::ConnectionFailed | K::ProxyConnect => "could not reach",
        _ => "no answer from",
    };
    ClientError::Transport {
        what,
        url: url.to_owned(),
        detail: transport_detail(t),
    }
}

/// `(host, port)` of a base URL (`http://h:p`, `https://h` → 443, `[::1]:p`).
fn host_port(base: &str) -> Option<(String, u16)> {
    let (scheme, rest) = base.split_once("://")?;
    let authority = rest.split('/').next()?;
    let default = if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        80
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h, p.parse().ok()?),
        _ => (authority, default),
    };
    Some((
        host.trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned(),
        port,
    ))
}

/// Whether a transport error happened before anything was sent (so another manager may take
/// the request): DNS, or no connection.
fn unreachable(t: &ureq::Transport) -> bool {
    matches!(
        t.kind(),
        ureq::ErrorKind::Dns | ureq::ErrorKind::ConnectionFailed
    )
}

/// The innermost cause of a transport error: the useful part ("Connection refused (os error
/// 111)").
fn transport_detail(t: &ureq::Transport) -> String {
    std::error::Error::source(t)
        .map(|s| s.to_string())
        .or_else(|| t.message().map(str::to_owned))
        .unwrap_or_else(|| t.kind().to_string())
}

/// Whether the connection broke under a request being sent (the peer closed it early).
fn cut_off(t: &ureq::Transport) -> bool {
    std::error::Error::source(t)
        .and_then(|s| s.downcast_ref::<io::Error>())
        .is_some_and(|e| {
            matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            )
        })
}

/// Percent-encodes one path segment (an id or key from the command line).
pub fn segment(s: &str) -> impl fmt::Display + '_ {
    struct Seg<'a>(&'a str);
    impl fmt::Display for Seg<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            for b in self.0.bytes() {
                if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                    write!(f, "{}", b as char)?;
                } else {
                    write!(f, "%{b:02X}")?;
                }
            }
            Ok(())
        }
    }
    Seg(s)
}

/// Percent-encodes each `/`-separated segment of a path, keeping the `/` between them
/// (`sub dir/a?.txt` → `sub%20dir/a%3F.txt`).
pub fn segments(path: &str) -> String {
    path.split('/')
        .map(|s| segment(s).to_string())
        .collect::<Vec<_>>()
        .join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_error_from_envelope() {
        let body = r#"{"error": {"code": "session-not-found", "message": "no session abc"}}"#;
        let e = ApiError::from_body(404, body.to_owned());
        assert_eq!(
            (e.status, e.code.as_str(), e.message.as_str()),
            (404, "session-not-found", "no session abc")
        );
        assert!(e.is_envelope());
        assert_eq!(
            e.to_string(),
            "error: session-not-found: no session abc (HTTP 404)"
        );
        assert_eq!(ClientError::from(e).exit_code(), 1);
    }

    #[test]
    fn api_error_from_other_body() {
        let e = ApiError::from_body(502, "<html>Bad Gateway</html>\n".to_owned());
        assert_eq!(
            e.to_string(),
            "error: unexpected-response: <html>Bad Gateway</html> (HTTP 502)"
        );
        assert!(!e.is_envelope());
        assert_eq!(
            ApiError::from_body(500, String::new()).message,
            "(empty body)"
        );
    }

    #[test]
    fn connection_refused_names_the_url_and_exits_2() {
        // Port 1 on loopback: nothing listens there in any sane environment.
        let client = Client::new("http://127.0.0.1:1/").unwrap();
        let err = client.get("/v1/agents", &[]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("error: could not reach http://127.0.0.1:1/v1/agents: "),
            "{text}"
        );
        assert_eq!(err.exit_code(), EXIT_UNREACHABLE);
    }

    #[test]
    fn several_urls_fail_over_on_connection_errors_only() {
        use crate::ctl::testserver::{Answer, Server};
        // A dead manager first: the request goes to the live one, which is used first from then
        // on (the second request reaches it directly).
        let dead = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let server = Server::start(vec![
            Answer::json(200, r#"{"agents": []}"#),
            Answer::json(
                404,
                r#"{"error": {"code": "session-not-found", "message": "no"}}"#,
            ),
        ]);
        let client = Client::new(&format!("{dead}, {}/", server.url)).unwrap();
        assert_eq!(
            client.get("/v1/agents", &[]).unwrap().json["agents"],
            serde_json::json!([])
        );
        assert!(client.url("/x").starts_with(&server.url));
        // An error answer is an answer: not retried elsewhere.
        let err = client.delete("/v1/sessions/s").unwrap_err();
        assert_eq!(err.exit_code(), 1, "{err}");
        let requests = server.requests();
        assert_eq!(requests.len(), 2);
        assert!(requests[0].line.starts_with("GET /v1/agents"));

        // None answers: every URL is named.
        let dead2 = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let client = Client::new(&format!("{dead},{dead2}")).unwrap();
        let err = client.get("/health", &[]).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains(&format!("{dead}/health")) && text.contains(&format!("{dead2}/health")),
            "{text}"
        );
        assert_eq!(err.exit_code(), EXIT_UNREACHABLE);
        assert_eq!(
            host_port("https://m.example/"),
            Some(("m.example".into(), 443))
        );
        assert_eq!(host_port("http://[::1]:81"), Some(("::1".into(), 81)));
    }

    #[test]
    fn http_and_https_urls_only() {
        let err = Client::new("ftp://127.0.0.1:1").err().unwrap();
        assert_eq!(
            err.to_string(),
            "error: invalid API URL ftp://127.0.0.1:1: expected http://HOST:PORT or https://HOST:PORT"
        );
        assert_eq!(err.exit_code(), EXIT_UNREACHABLE);
        assert!(Client::new("127.0.0.1:8081").is_err());
        assert!(Client::new("http://").is_err());
        assert!(Client::new("https://").is_err());
        assert_eq!(
            Client::new("HTTP://m:1/").unwrap().url("/health"),
            "HTTP://m:1/health"
        );
        assert_eq!(
            Client::new("HTTPS://m:1/").unwrap().url("/health"),
            "HTTPS://m:1/health"
        );
    }

    #[test]
    fn ca_cert_must_be_a_pem_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let with_ca = |path: &std::path::Path| {
            let options = ClientOptions {
                token: None,
                ca_cert: Some(path.to_owned()),
            };
            Client::with_options("https://localhost:1", &options)
        };
        let missing = dir.path().join("missing.pem");
        let err = with_ca(&missing).err().unwrap();
        assert!(
            err.to_string().starts_with(&format!(
                "error: cannot use CA certificate {}: ",
                missing.display()
            )),
            "{err}"
        );
        assert_eq!(err.exit_code(), EXIT_UNREACHABLE);
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, "hello\n").unwrap();
        let err = with_ca(&junk).err().unwrap();
        assert!(
            err.to_string()
                .ends_with("no PEM certificate (BEGIN CERTIFICATE) in it"),
            "{err}"
        );
    }

    #[test]
    fn bearer_token_on_every_call_and_only_with_a_token() {
        use crate::ctl::testserver::{Answer, Server};
        let ok = || Answer::json(200, "{}");
        let server = Server::start(vec![ok(), ok(), ok(), ok(), ok(), ok(), ok(), ok()]);
        let options = ClientOptions {
            token: Some("AKX:s3cret".to_owned()),
            ca_cert: None,
        };
        let client = Client::with_options(&server.url, &options).unwrap();
        client.get("/v1/agents", &[]).unwrap();
        client.post("/v1/sessions", &Value::Null, None).unwrap();
        client
            .post_empty("/v1/sessions/S/services/w", None)
            .unwrap();
        client.patch("/v1/access-keys/K", &Value::Null).unwrap();
        client.delete("/v1/vfolders/v").unwrap();
        let mut logs = String::new();
        client
            .get_stream("/v1/sessions/S/logs", &[], None)
            .unwrap()
            .read_to_string(&mut logs)
            .unwrap();
        client
            .put_file("/v1/sessions/S/files/a", &b"x"[..], 1)
            .unwrap();
        // An empty token is no token.
        let options = ClientOptions {
            token: Some(String::new()),
            ca_cert: None,
        };
        Client::with_options(&server.url, &options)
            .unwrap()
            .get("/health", &[])
            .unwrap();
        let requests = server.requests();
        for r in &requests[..7] {
            assert_eq!(
                r.header("authorization"),
                Some("Bearer AKX:s3cret"),
                "{}",
                r.line
            );
        }
        assert_eq!(requests[7].header("authorization"), None);
    }

    #[test]
    fn a_tls_answer_to_http_hints_at_https() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0; 1024];
            let _ = stream.read(&mut request);
            // What a TLS server answers to plain text: a fatal alert record (decode_error).
            stream.write_all(&[21, 3, 3, 0, 2, 2, 50]).unwrap();
        });
        let err = Client::new(&url).unwrap().get("/health", &[]).unwrap_err();
        server.join().unwrap();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("error: no answer from {url}/health: ")),
            "{text}"
        );
        assert!(
            text.ends_with(
                "(the answer is not HTTP: is the API served over HTTPS? then use an https:// URL)"
            ),
            "{text}"
        );
        assert_eq!(err.exit_code(), EXIT_UNREACHABLE);
    }

    #[test]
    fn unauthorized_hints_at_the_token() {
        use crate::ctl::testserver::{Answer, Server};
        let body = r#"{"error": {"code": "unauthorized", "message": "no valid token"}}"#;
        let server = Server::start(vec![Answer::json(401, body), Answer::json(401, body)]);
        let err = Client::new(&server.url)
            .unwrap()
            .get("/v1/agents", &[])
            .unwrap_err();
        let ClientError::Api(api) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(
            err.to_string(),
            "error: unauthorized: no valid token (HTTP 401)"
        );
        assert_eq!(api.hint.as_deref(), Some(NO_TOKEN_HINT));
        assert_eq!(err.exit_code(), 1);
        let options = ClientOptions {
            token: Some("wrong".to_owned()),
            ca_cert: None,
        };
        let err = Client::with_options(&server.url, &options)
            .unwrap()
            .get("/v1/agents", &[])
            .unwrap_err();
        let ClientError::Api(api) = err else {
            panic!("{err:?}")
        };
        assert_eq!(api.hint.as_deref(), Some(BAD_TOKEN_HINT));
        // Other refusals carry no hint.
        assert_eq!(ApiError::from_body(403, body.to_owned()).hint, None);
    }

    #[test]
    fn get_stream_reads_chunks_as_they_come() {
        use crate::ctl::testserver::{Answer, Server};
        let (gate, wait) = std::sync::mpsc::channel();
        let parts = vec![b"line 1\n".to_vec(), b"line 2\n".to_vec()];
        let server = Server::start(vec![Answer {
            status: 200,
            content_type: "text/plain",
            parts,
            gate: Some(wait),
            announced_length: None,
            skip_body: false,
        }]);
        let client = Client::new(&server.url).unwrap();
        let mut body = client
            .get_stream("/v1/sessions/S/logs", &[("follow", "true")], None)
            .unwrap();
        // The second chunk is only sent once the first was read here.
        let start = std::time::Instant::now();
        let mut buf = [0; 64];
        let n = body.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"line 1\n");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the first chunk came before the answer ended"
        );
        gate.send(()).unwrap();
        let mut rest = String::new();
        body.read_to_string(&mut rest).unwrap();
        assert_eq!(rest, "line 2\n");
        assert_eq!(
            server.requests()[0].line,
            "GET /v1/sessions/S/logs?follow=true"
        );
    }

    #[test]
    fn get_stream_errors_map_as_other_calls() {
        use crate::ctl::testserver::{Answer, Server};
        let body = r#"{"error": {"code": "logs-not-found", "message": "no logs for kernel k"}}"#;
        let server = Server::start(vec![Answer::json(404, body)]);
        let client = Client::new(&server.url).unwrap();
        let err = client
            .get_stream("/v1/sessions/S/logs", &[], Some(REQUEST_TIMEOUT))
            .err()
            .unwrap();
        assert_eq!(
            err.to_string(),
            "error: logs-not-found: no logs for kernel k (HTTP 404)"
        );
        assert_eq!(err.exit_code(), 1);
        let err = Client::new("http://127.0.0.1:1")
            .unwrap()
            .get_stream("/x", &[], None)
            .err()
            .unwrap();
        assert_eq!(err.exit_code(), EXIT_UNREACHABLE);
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(segment("3f2a-b_c.d~").to_string(), "3f2a-b_c.d~");
        assert_eq!(segment("a/b c?").to_string(), "a%2Fb%20c%3F");
        assert_eq!(segments("sub dir/a?.txt"), "sub%20dir/a%3F.txt");
        assert_eq!(segments("d/é%/"), "d/%C3%A9%25/");
        assert_eq!(segments(""), "");
    }

    #[test]
    fn api_error_output() {
        let body =
            r#"{"error": {"code": "service-failed", "message": "web exited", "output": "boom\n"}}"#;
        let e = ApiError::from_body(409, body.to_owned());
        assert_eq!(e.output().as_deref(), Some("boom\n"));
        let body = r#"{"error": {"code": "service-failed", "message": "m"}, "output": "tail"}"#;
        assert_eq!(
            ApiError::from_body(409, body.to_owned())
                .output()
                .as_deref(),
            Some("tail")
        );
        assert_eq!(ApiError::from_body(500, "x".to_owned()).output(), None);
    }
}

//! A small blocking client for the manager's HTTP API (`docs/manager-api.md`), on `ureq`.
//!
//! Plain `http://` only (no TLS is compiled in). Every call answers the body both as the raw text
//! (so `--output json` can print it unchanged) and parsed, except [`Client::get_stream`] and
//! [`Client::get_file`], which hand back the body as a reader for answers that stream
//! (`/logs?follow=true`, a file's bytes). [`Client::put_file`] sends a file as it reads it.

use std::fmt;
use std::io::{self, Read};
use std::time::Duration;

use serde_json::Value;

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
}

impl ApiError {
    /// Builds the error from a non-2xx status and its body.
    pub fn from_body(status: u16, body: String) -> Self {
        let envelope = serde_json::from_str::<Value>(&body).ok().and_then(|v| {
            let e = v.get("error")?;
            Some((
                e.get("code")?.as_str()?.to_owned(),
                e.get("message").and_then(Value::as_str)?.to_owned(),
            ))
        });
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
        }
    }

    /// Whether the body was the API's JSON error envelope (then it is worth printing as JSON).
    pub fn is_envelope(&self) -> bool {
        self.code != "unexpected-response"
    }

    /// The `output` string of the error (`service-failed`: the tail of the service's output),
    /// read from `error.output` or, failing that, a top-level `output`.
    pub fn output(&self) -> Option<String> {
        let v = serde_json::from_str::<Value>(&self.body).ok()?;
        let output = v
            .get("error")
            .and_then(|e| e.get("output"))
            .filter(|o| o.is_string())
            .or_else(|| v.get("output"))?;
        output.as_str().map(str::to_owned)
    }
}

/// Why a call got no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API answered with an error status (ctl exits 1).
    #[error(transparent)]
    Api(#[from] ApiError),
    /// No answer: bad URL, DNS, connection refused, I/O error or timeout (ctl exits 2).
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
    /// The process exit status this error maps to: 2 when the API could not be reached, else 1.
    pub fn exit_code(&self) -> i32 {
        match self {
            ClientError::Transport { .. } => 2,
            ClientError::Api(_) | ClientError::InvalidResponse { .. } => 1,
        }
    }
}

/// A successful (2xx) answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The body exactly as received.
    pub text: String,
    /// The body parsed.
    pub json: Value,
}

/// A client bound to one API base URL such as `http://127.0.0.1:8081`.
pub struct Client {
    base: String,
    agent: ureq::Agent,
    /// For file transfers: every read and write bounded by [`TRANSFER_IDLE_TIMEOUT`].
    transfer: ureq::Agent,
}

impl Client {
    /// A client for the API at `base` (a trailing `/` is ignored).
    ///
    /// Errors ([`ClientError::Transport`], "invalid API URL") unless `base` is `http://…`.
    pub fn new(base: &str) -> Result<Self, ClientError> {
        let base = base.trim().trim_end_matches('/');
        let scheme_ok = base
            .get(..7)
            .is_some_and(|s| s.eq_ignore_ascii_case("http://"))
            && base.len() > 7;
        if !scheme_ok {
            return Err(ClientError::Transport {
                what: "invalid API URL",
                url: base.to_owned(),
                detail: "expected http://HOST:PORT (only plain http:// is supported)".to_owned(),
            });
        }
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(CONNECT_TIMEOUT)
            .build();
        let transfer = ureq::AgentBuilder::new()
            .timeout_connect(CONNECT_TIMEOUT)
            .timeout_read(TRANSFER_IDLE_TIMEOUT)
            .timeout_write(TRANSFER_IDLE_TIMEOUT)
            .build();
        Ok(Client {
            base: base.to_owned(),
            agent,
            transfer,
        })
    }

    /// The full URL of `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `GET path?query`.
    pub fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Reply, ClientError> {
        let url = self.url(path);
        let mut req = self.agent.get(&url).timeout(REQUEST_TIMEOUT);
        for (k, v) in query {
            req = req.query(k, v);
        }
        finish(&url, req.call())
    }

    /// `POST path` with a JSON body; `timeout` `None` waits as long as the manager takes.
    pub fn post(
        &self,
        path: &str,
        body: &Value,
        timeout: Option<Duration>,
    ) -> Result<Reply, ClientError> {
        let url = self.url(path);
        let mut req = self.agent.post(&url);
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        finish(&url, req.send_json(body))
    }

    /// `POST path` without a body (`Content-Length: 0`); `timeout` as for [`Client::post`].
    pub fn post_empty(&self, path: &str, timeout: Option<Duration>) -> Result<Reply, ClientError> {
        let url = self.url(path);
        let mut req = self.agent.post(&url);
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        finish(&url, req.send_bytes(&[]))
    }

    /// `DELETE path`.
    pub fn delete(&self, path: &str) -> Result<Reply, ClientError> {
        let url = self.url(path);
        finish(
            &url,
            self.agent.delete(&url).timeout(REQUEST_TIMEOUT).call(),
        )
    }

    /// `GET path?query` whose 2xx body is read as it arrives, any size (`/logs`): the body as a
    /// reader, unread. Error answers map as for the other calls. `timeout` bounds the whole call
    /// including reading the body; `None` waits forever (a followed log may stream for hours).
    /// Map read errors with [`read_error`].
    pub fn get_stream(
        &self,
        path: &str,
        query: &[(&str, &str)],
        timeout: Option<Duration>,
    ) -> Result<impl Read + Send, ClientError> {
        let url = self.url(path);
        let mut req = self.agent.get(&url);
        if let Some(t) = timeout {
            req = req.timeout(t);
        }
        for (k, v) in query {
            req = req.query(k, v);
        }
        match req.call() {
            Ok(resp) => Ok(resp.into_reader()),
            Err(e) => Err(failure(&url, e)),
        }
    }

    /// `PUT path` with `body` as the raw request body, sent as it is read (never held whole),
    /// with `Content-Length: length`; at most `length` bytes of `body` are sent. Each read and
    /// write of the connection may wait `TRANSFER_IDLE_TIMEOUT`; the whole call has no limit.
    ///
    /// An answer the manager gives before it read the whole body (an error, say) reaches ureq
    /// only as a broken connection once the body no longer fits the socket buffers: that is an
    /// "upload cut off" [`ClientError::Transport`] with a hint of the likely cause.
    pub fn put_file(&self, path: &str, body: impl Read, length: u64) -> Result<Reply, ClientError> {
        let url = self.url(path);
        let req = self
            .transfer
            .put(&url)
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
            res => finish(&url, res),
        }
    }

    /// `GET path` whose 2xx body is a file's bytes: the body as a reader, unread (chunked or
    /// with `Content-Length`; a body that ends before its `Content-Length` fails the read). Error
    /// answers map as for the other calls. Each read may wait `TRANSFER_IDLE_TIMEOUT`; the
    /// whole call has no limit. Map read errors with `read_error`.
    pub fn get_file(&self, path: &str) -> Result<impl Read + Send, ClientError> {
        let url = self.url(path);
        match self.transfer.get(&url).call() {
            Ok(resp) => Ok(resp.into_reader()),
            Err(e) => Err(failure(&url, e)),
        }
    }
}

/// Reads the response (or error) of one call into a [`Reply`] or [`ClientError`].
fn finish(url: &str, res: Result<ureq::Response, ureq::Error>) -> Result<Reply, ClientError> {
    match res {
        Ok(resp) => {
            let text = read_body(url, resp)?;
            match serde_json::from_str(&text) {
                Ok(json) => Ok(Reply { text, json }),
                Err(e) => Err(ClientError::InvalidResponse {
                    url: url.to_owned(),
                    detail: format!("not JSON: {e}"),
                }),
            }
        }
        Err(e) => Err(failure(url, e)),
    }
}

/// A call's error: the API's error answer, or why there was none.
fn failure(url: &str, e: ureq::Error) -> ClientError {
    match e {
        ureq::Error::Status(status, resp) => {
            // A body we cannot read still leaves the status worth reporting.
            let body = read_body(url, resp).unwrap_or_default();
            ApiError::from_body(status, body).into()
        }
        ureq::Error::Transport(t) => transport(url, &t),
    }
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
        assert_eq!(err.exit_code(), 2);
    }

    #[test]
    fn only_http_urls() {
        let err = Client::new("https://127.0.0.1:1").err().unwrap();
        assert_eq!(
            err.to_string(),
            "error: invalid API URL https://127.0.0.1:1: expected http://HOST:PORT (only plain http:// is supported)"
        );
        assert_eq!(err.exit_code(), 2);
        assert!(Client::new("127.0.0.1:8081").is_err());
        assert!(Client::new("http://").is_err());
        assert_eq!(
            Client::new("HTTP://m:1/").unwrap().url("/health"),
            "HTTP://m:1/health"
        );
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
        assert_eq!(err.exit_code(), 2);
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

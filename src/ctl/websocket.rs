//! A blocking WebSocket to the API (`ctl session exec -t`: `GET /v1/sessions/{id}/pty`), on
//! tungstenite over a TCP stream of our own, TLS through the same rustls configuration as the
//! HTTP client ([`Client::tls_config`]: `--ca-cert`, else the webpki roots), with the same
//! bearer token and the same error reporting: a refused upgrade is the API's error answer.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use tungstenite::client::IntoClientRequest;
use tungstenite::handshake::HandshakeError;
use tungstenite::http::HeaderValue;

use super::{Client, ClientError};

/// How long to wait for the TCP connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the handshake (TLS, then the HTTP upgrade, which starts the terminal on the agent)
/// may take.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(60);

/// The connection under the WebSocket: plain TCP or TLS over it.
pub enum Stream {
    /// `http://`.
    Plain(TcpStream),
    /// `https://`.
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, TcpStream>>),
}

impl Stream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => &s.sock,
        }
    }

    /// The socket's file descriptor, to `poll` on.
    pub fn raw_fd(&self) -> RawFd {
        self.tcp().as_raw_fd()
    }

    /// Makes reads wait at most `limit` (`None`: forever); a read that waited that long fails
    /// with `WouldBlock`, and the WebSocket can be read again.
    pub fn set_read_timeout(&self, limit: Option<Duration>) -> io::Result<()> {
        self.tcp().set_read_timeout(limit)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(s) => s.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// An open WebSocket.
pub type Socket = tungstenite::WebSocket<Stream>;

/// Opens a WebSocket to `path` (with its query) at the API, with the client's token.
///
/// Errors: [`ClientError::Api`] when the API answers the upgrade with an error (404
/// `session-not-found`, 409 `session-not-running`, …, a 401 with its hint);
/// [`ClientError::Transport`] when it cannot be reached or TLS fails.
pub fn connect(client: &Client, path: &str) -> Result<Socket, ClientError> {
    let url = client.reachable_url(path);
    let transport = |what: &'static str, detail: String| ClientError::Transport {
        what,
        url: url.clone(),
        detail,
    };
    let (https, rest) = if let Some(rest) = strip_scheme(&url, "https://") {
        (true, rest)
    } else if let Some(rest) = strip_scheme(&url, "http://") {
        (false, rest)
    } else {
        return Err(transport(
            "invalid API URL",
            "expected http:// or https://".into(),
        ));
    };
    let authority = rest.split('/').next().unwrap_or_default();
    let (host, port) = split_authority(authority, if https { 443 } else { 80 })
        .ok_or_else(|| transport("invalid API URL", "no host:port in it".into()))?;
    let addrs = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| transport("could not reach", e.to_string()))?;
    let mut last = None;
    let mut tcp = None;
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => {
                tcp = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let tcp = tcp.ok_or_else(|| {
        let detail = last.map_or_else(|| "no address".to_owned(), |e| e.to_string());
        transport("could not reach", detail)
    })?;
    let _ = tcp.set_nodelay(true); // keystrokes are small writes that should go at once
    tcp.set_read_timeout(Some(HANDSHAKE_TIMEOUT))
        .and_then(|()| tcp.set_write_timeout(Some(HANDSHAKE_TIMEOUT)))
        .map_err(|e| transport("could not reach", e.to_string()))?;
    let stream = if https {
        let name = rustls::pki_types::ServerName::try_from(host.clone())
            .map_err(|e| transport("invalid API URL", e.to_string()))?;
        let conn = rustls::ClientConnection::new(Arc::new(client.tls_config()?), name)
            .map_err(|e| transport("cannot set up TLS for", e.to_string()))?;
        Stream::Tls(Box::new(rustls::StreamOwned::new(conn, tcp)))
    } else {
        Stream::Plain(tcp)
    };
    let ws_url = format!("{}{}", if https { "wss://" } else { "ws://" }, rest);
    let mut request = ws_url
        .as_str()
        .into_client_request()
        .map_err(|e| transport("invalid API URL", e.to_string()))?;
    if let Some(auth) = client.authorization() {
        let value = HeaderValue::from_str(auth)
            .map_err(|e| transport("invalid token for", e.to_string()))?;
        request.headers_mut().insert("Authorization", value);
    }
    match tungstenite::client(request, stream) {
        Ok((socket, _)) => {
            let tcp = socket.get_ref().tcp();
            tcp.set_write_timeout(None)
                .map_err(|e| transport("no answer from", e.to_string()))?;
            Ok(socket)
        }
        Err(HandshakeError::Failure(tungstenite::Error::Http(resp))) => {
            let status = resp.status().as_u16();
            let body = resp
                .into_body()
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default();
            Err(client.api_error(status, body))
        }
        Err(HandshakeError::Failure(e)) => Err(transport("no answer from", e.to_string())),
        Err(HandshakeError::Interrupted(_)) => Err(transport(
            "no answer from",
            format!(
                "the upgrade took longer than {} s",
                HANDSHAKE_TIMEOUT.as_secs()
            ),
        )),
    }
}

/// `url` without `scheme` (case-insensitive), when it starts with it.
fn strip_scheme<'a>(url: &'a str, scheme: &str) -> Option<&'a str> {
    url.get(..scheme.len())
        .filter(|s| s.eq_ignore_ascii_case(scheme))
        .map(|_| &url[scheme.len()..])
}

/// `(host, port)` of `host[:port]` or `[v6][:port]`.
fn split_authority(authority: &str, default_port: u16) -> Option<(String, u16)> {
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !p.contains(']') => (h, p.parse().ok()?),
        _ => (authority, default_port),
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    (!host.is_empty()).then(|| (host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities() {
        assert_eq!(
            split_authority("127.0.0.1:8081", 80),
            Some(("127.0.0.1".into(), 8081))
        );
        assert_eq!(split_authority("h", 443), Some(("h".into(), 443)));
        assert_eq!(split_authority("[::1]:9", 80), Some(("::1".into(), 9)));
        assert_eq!(split_authority("[::1]", 80), Some(("::1".into(), 80)));
        assert_eq!(split_authority("h:x", 80), None);
        assert_eq!(strip_scheme("HTTPS://h/p", "https://"), Some("h/p"));
        assert_eq!(strip_scheme("http://h", "https://"), None);
    }

    #[test]
    fn refused_upgrades_are_api_errors() {
        use crate::ctl::testserver::{Answer, Server};
        let body =
            r#"{"error": {"code": "session-not-found", "message": "session `S` not found"}}"#;
        let server = Server::start(vec![Answer::json(404, body), Answer::json(404, body)]);
        let client = Client::new(&server.url).unwrap();
        let size = crate::model::terminal::TerminalSize { rows: 24, cols: 80 };
        match connect(&client, "/v1/sessions/S/pty?rows=24&cols=80") {
            Err(ClientError::Api(e)) => {
                assert_eq!((e.status, e.code.as_str()), (404, "session-not-found"))
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("connected"),
        }
        // The client's typed route: the same upgrade, its command percent-encoded.
        match client.terminal("S", None, size, Some("top -b")) {
            Err(ClientError::Api(e)) => assert_eq!(e.status, 404),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("connected"),
        }
        let requests = server.requests();
        assert_eq!(requests[0].line, "GET /v1/sessions/S/pty?rows=24&cols=80");
        assert_eq!(
            requests[1].line,
            "GET /v1/sessions/S/pty?rows=24&cols=80&command=top%20-b"
        );
    }
}

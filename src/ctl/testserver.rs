//! A tiny HTTP/1.1 server for ctl's unit tests: it answers canned responses in order, one per
//! connection (`Connection: close`), and hands back the requests it got (request line, headers
//! and body).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::mpsc::Receiver;
use std::thread::JoinHandle;
use std::time::Duration;

/// One canned response.
pub struct Answer {
    pub status: u16,
    pub content_type: &'static str,
    /// With more than one part the body is sent chunked, one chunk per part; before each part
    /// after the first the server waits for a message on `gate` (when given, up to 10 s).
    pub parts: Vec<Vec<u8>>,
    pub gate: Option<Receiver<()>>,
    /// With one part: the `Content-Length` to announce instead of the part's length. A larger
    /// one makes an answer that ends early (the connection closes before the body is complete).
    pub announced_length: Option<usize>,
    /// Answer without reading the request's body (then close: a client still sending it sees
    /// the connection break).
    pub skip_body: bool,
}

impl Answer {
    /// A JSON answer with `status`.
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Answer::bytes(status, "application/json", body.into().into_bytes())
    }

    /// An answer of `body` as it is, with `Content-Length`.
    pub fn bytes(status: u16, content_type: &'static str, body: Vec<u8>) -> Self {
        Answer {
            status,
            content_type,
            parts: vec![body],
            gate: None,
            announced_length: None,
            skip_body: false,
        }
    }
}

/// A request as received.
#[derive(Debug)]
pub struct Request {
    /// `GET /v1/…?…`: the method and target of the request line.
    pub line: String,
    /// The headers in order, names as sent.
    pub headers: Vec<(String, String)>,
    /// The body (read as `Content-Length` says; empty without one).
    pub bytes: Vec<u8>,
    /// The body as text (invalid UTF-8 replaced).
    pub body: String,
}

impl Request {
    /// The value of the first header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A running server; [`Server::requests`] waits until every answer was given.
pub struct Server {
    pub url: String,
    handle: JoinHandle<Vec<Request>>,
}

impl Server {
    /// Serves `answers` in order on a fresh loopback port.
    pub fn start(answers: Vec<Answer>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let handle = std::thread::spawn(move || {
            answers
                .into_iter()
                .map(|a| serve_one(&listener, a))
                .collect()
        });
        Server { url, handle }
    }

    /// The requests, in order, once all answers were given.
    pub fn requests(self) -> Vec<Request> {
        self.handle.join().unwrap()
    }
}

fn serve_one(listener: &TcpListener, answer: Answer) -> Request {
    let (stream, _) = listener.accept().unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let mut headers = Vec::new();
    let mut length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        if header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            let (name, value) = (name.trim().to_owned(), value.trim().to_owned());
            if name.eq_ignore_ascii_case("content-length") {
                length = value.parse().unwrap();
            }
            headers.push((name, value));
        }
    }
    let mut bytes = vec![0; if answer.skip_body { 0 } else { length }];
    reader.read_exact(&mut bytes).unwrap();
    let line = line
        .trim_end()
        .trim_end_matches("HTTP/1.1")
        .trim_end()
        .to_owned();
    let request = Request {
        line,
        headers,
        body: String::from_utf8_lossy(&bytes).into_owned(),
        bytes,
    };

    let mut out = stream;
    let head = format!(
        "HTTP/1.1 {} X\r\nContent-Type: {}\r\nConnection: close\r\n",
        answer.status, answer.content_type
    );
    if let [part] = answer.parts.as_slice() {
        let length = answer.announced_length.unwrap_or(part.len());
        // Head and body in one write, as an HTTP server sends a small answer: a WebSocket
        // client reads a refused upgrade's body only from what came with the head.
        let mut whole = format!("{head}Content-Length: {length}\r\n\r\n").into_bytes();
        whole.extend_from_slice(part);
        // The client may give up on an answer that ends early: ignore a closed connection.
        let _ = out.write_all(&whole);
    } else {
        write!(out, "{head}Transfer-Encoding: chunked\r\n\r\n").unwrap();
        for (i, part) in answer.parts.iter().enumerate() {
            if i > 0 {
                if let Some(gate) = &answer.gate {
                    let _ = gate.recv_timeout(Duration::from_secs(10));
                }
            }
            write!(out, "{:x}\r\n", part.len()).unwrap();
            out.write_all(part).unwrap();
            out.write_all(b"\r\n").unwrap();
            out.flush().unwrap();
        }
        write!(out, "0\r\n\r\n").unwrap();
    }
    let _ = out.flush();
    request
}

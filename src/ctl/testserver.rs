//! A tiny HTTP/1.1 server for ctl's unit tests: it answers canned responses in order, one per
//! connection (`Connection: close`), and hands back the requests it got.

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
    pub parts: Vec<String>,
    pub gate: Option<Receiver<()>>,
}

impl Answer {
    /// A JSON answer with `status`.
    pub fn json(status: u16, body: impl Into<String>) -> Self {
        Answer {
            status,
            content_type: "application/json",
            parts: vec![body.into()],
            gate: None,
        }
    }
}

/// A request as received.
#[derive(Debug)]
pub struct Request {
    /// `GET /v1/…?…`: the method and target of the request line.
    pub line: String,
    pub body: String,
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
    let mut length = 0;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header).unwrap();
        if header.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).unwrap();
    let line = line
        .trim_end()
        .trim_end_matches("HTTP/1.1")
        .trim_end()
        .to_owned();
    let request = Request {
        line,
        body: String::from_utf8(body).unwrap(),
    };

    let mut out = stream;
    let head = format!(
        "HTTP/1.1 {} X\r\nContent-Type: {}\r\nConnection: close\r\n",
        answer.status, answer.content_type
    );
    if let [part] = answer.parts.as_slice() {
        write!(out, "{head}Content-Length: {}\r\n\r\n{part}", part.len()).unwrap();
    } else {
        write!(out, "{head}Transfer-Encoding: chunked\r\n\r\n").unwrap();
        for (i, part) in answer.parts.iter().enumerate() {
            if i > 0 {
                if let Some(gate) = &answer.gate {
                    let _ = gate.recv_timeout(Duration::from_secs(10));
                }
            }
            write!(out, "{:x}\r\n{part}\r\n", part.len()).unwrap();
            out.flush().unwrap();
        }
        write!(out, "0\r\n\r\n").unwrap();
    }
    out.flush().unwrap();
    request
}

//! Server-sent events read from a streamed body (`GET /v1/events`), frame by frame, in bounded
//! memory: one line of at most [`MAX_LINE`] bytes and one frame's data at a time, however long
//! the stream runs. Comments (`: keep-alive`) and fields other than `id`, `event` and `data`
//! are skipped, as the SSE specification says a reader does.

use std::io::{self, BufRead};

/// Longest line taken (an event's JSON is far smaller); a longer one is an error rather than
/// memory the server decides.
pub const MAX_LINE: usize = 1 << 20;

/// One frame: its `id:`, `event:` and `data:` (several data lines joined by `\n`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// The `id:` field, when it had one.
    pub id: Option<String>,
    /// The `event:` field (`message` when absent, as the specification says).
    pub event: String,
    /// The data.
    pub data: String,
}

/// Frames of a body, in order.
pub struct Frames<R> {
    body: R,
    line: Vec<u8>,
}

impl<R: BufRead> Frames<R> {
    /// Frames of `body`.
    pub fn new(body: R) -> Self {
        Frames {
            body,
            line: Vec::new(),
        }
    }

    /// The next frame; `None` when the body ended (a partial frame at the end is dropped, as an
    /// EventSource drops it).
    ///
    /// Errors: the read failed, or a line is longer than [`MAX_LINE`] (`InvalidData`).
    pub fn next_frame(&mut self) -> io::Result<Option<Frame>> {
        let mut frame = Frame::default();
        let mut has_data = false;
        loop {
            if !self.read_line()? {
                return Ok(None);
            }
            let line = String::from_utf8_lossy(&self.line);
            let line = line.trim_end_matches(['\n', '\r']);
            if line.is_empty() {
                if has_data {
                    if frame.event.is_empty() {
                        frame.event = "message".into();
                    }
                    return Ok(Some(frame));
                }
                frame = Frame::default();
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "id" => frame.id = Some(value.to_owned()),
                "event" => frame.event = value.to_owned(),
                "data" => {
                    if has_data {
                        frame.data.push('\n');
                    }
                    frame.data.push_str(value);
                    has_data = true;
                }
                _ => {}
            }
        }
    }

    /// Reads one line into `self.line` (with its end); `false` at the end of the body.
    fn read_line(&mut self) -> io::Result<bool> {
        self.line.clear();
        loop {
            let (done, used) = {
                let buf = match self.body.fill_buf() {
                    Ok(b) => b,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                };
                if buf.is_empty() {
                    return Ok(!self.line.is_empty());
                }
                match buf.iter().position(|&b| b == b'\n') {
                    Some(i) => {
                        self.line.extend_from_slice(&buf[..=i]);
                        (true, i + 1)
                    }
                    None => {
                        self.line.extend_from_slice(buf);
                        (false, buf.len())
                    }
                }
            };
            self.body.consume(used);
            if self.line.len() > MAX_LINE {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("an event stream line longer than {MAX_LINE} bytes"),
                ));
            }
            if done {
                return Ok(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(text: &str) -> Vec<Frame> {
        let mut f = Frames::new(io::BufReader::with_capacity(7, text.as_bytes()));
        let mut out = Vec::new();
        while let Some(frame) = f.next_frame().unwrap() {
            out.push(frame);
        }
        out
    }

    #[test]
    fn frames_comments_and_multiline_data() {
        let got = frames(
            ": kernelvisor events\n\nid: 5\nevent: session_status\ndata: {\"a\":1}\n\n\
             : keep-alive\n\ndata: one\r\ndata:two\nretry: 10\n\nid: 9\ndata: cut",
        );
        assert_eq!(
            got,
            [
                Frame {
                    id: Some("5".into()),
                    event: "session_status".into(),
                    data: "{\"a\":1}".into()
                },
                Frame {
                    id: None,
                    event: "message".into(),
                    data: "one\ntwo".into()
                },
            ]
        );
    }

    #[test]
    fn an_endless_line_is_refused_not_buffered() {
        let long = "data: ".to_owned() + &"x".repeat(MAX_LINE + 10);
        let mut f = Frames::new(io::BufReader::new(long.as_bytes()));
        let e = f.next_frame().unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}

//! ctl's stdin for `session exec` (without `-t`): read on a thread of its own in chunks of at
//! most [`CHUNK`] bytes, handed over through a channel that holds one chunk, so memory stays
//! the same whatever the size of the input, and a slow run slows the reading.
//!
//! The execute API's `input` takes text: a chunk never ends inside a UTF-8 character (its
//! incomplete tail waits for the next read), and bytes that are not UTF-8 become U+FFFD.

use std::io::Read;
use std::sync::mpsc::{sync_channel, Receiver, TryRecvError};

/// Largest chunk, in bytes (plus at most 3 of a character carried over).
pub const CHUNK: usize = 64 * 1024;

/// What the reader has.
#[derive(Debug, PartialEq, Eq)]
pub enum Input {
    /// The next piece of text (never empty).
    Text(String),
    /// The input ended (or could not be read further: the error's text).
    End(Option<String>),
    /// Nothing yet.
    Pending,
}

/// The reading thread's end of the input.
pub struct StdinChunks {
    rx: Receiver<Input>,
    ended: bool,
}

impl StdinChunks {
    /// Starts reading `input` on a thread.
    pub fn spawn(mut input: impl Read + Send + 'static) -> StdinChunks {
        // One chunk waits in the channel while the next is read: two in memory at most.
        let (tx, rx) = sync_channel(1);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; CHUNK];
            let mut carry: Vec<u8> = Vec::new();
            loop {
                let n = match input.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(e) => {
                        let _ = tx.send(Input::End(Some(e.to_string())));
                        return;
                    }
                };
                carry.extend_from_slice(&buf[..n]);
                let text = take_text(&mut carry);
                if !text.is_empty() && tx.send(Input::Text(text)).is_err() {
                    return; // the run ended: nobody wants more
                }
            }
            if !carry.is_empty() {
                let _ = tx.send(Input::Text(String::from_utf8_lossy(&carry).into_owned()));
            }
            let _ = tx.send(Input::End(None));
        });
        StdinChunks { rx, ended: false }
    }

    /// The next piece, without waiting ([`Input::Pending`] when none is ready; [`Input::End`]
    /// once, then `Pending` forever).
    pub fn next(&mut self) -> Input {
        if self.ended {
            return Input::Pending;
        }
        match self.rx.try_recv() {
            Ok(input) => {
                self.ended = matches!(input, Input::End(_));
                input
            }
            Err(TryRecvError::Empty) => Input::Pending,
            Err(TryRecvError::Disconnected) => {
                self.ended = true;
                Input::End(None)
            }
        }
    }

    /// Waits for the next piece (or the end).
    #[cfg(test)]
    pub fn wait(&mut self) -> Input {
        if self.ended {
            return Input::Pending;
        }
        let input = self.rx.recv().unwrap_or(Input::End(None));
        self.ended = matches!(input, Input::End(_));
        input
    }
}

/// The text of `buf` up to an incomplete character at its end (left in `buf`); invalid bytes
/// as U+FFFD.
fn take_text(buf: &mut Vec<u8>) -> String {
    let keep = match std::str::from_utf8(buf) {
        Ok(_) => 0,
        // `error_len() == None`: the bytes at the end may still become a character.
        Err(e) if e.error_len().is_none() => buf.len() - e.valid_up_to(),
        Err(_) => {
            // Invalid somewhere: keep only an incomplete tail, if the end is one.
            let tail_start = buf.len().saturating_sub(3);
            (tail_start..buf.len())
                .find(|&i| {
                    std::str::from_utf8(&buf[i..])
                        .err()
                        .is_some_and(|e| e.valid_up_to() == 0 && e.error_len().is_none())
                })
                .map_or(0, |i| buf.len() - i)
        }
    };
    let rest = buf.split_off(buf.len() - keep);
    let text = String::from_utf8_lossy(buf).into_owned();
    *buf = rest;
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn characters_are_never_split() {
        let text = "héllo ✓ 😀 end";
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            let mut buf = bytes[..cut].to_vec();
            let mut out = take_text(&mut buf);
            buf.extend_from_slice(&bytes[cut..]);
            out += &take_text(&mut buf);
            assert!(buf.is_empty(), "cut at {cut}");
            assert_eq!(out, text, "cut at {cut}");
        }
        let mut bad = vec![b'a', 0xFF, b'b', 0xE2, 0x9C];
        assert_eq!(take_text(&mut bad), "a\u{FFFD}b");
        assert_eq!(bad, vec![0xE2, 0x9C]);
    }

    #[test]
    fn chunks_are_bounded_and_complete() {
        let data: Vec<u8> = (0..CHUNK * 3 + 17).map(|i| b'a' + (i % 26) as u8).collect();
        let mut chunks = StdinChunks::spawn(std::io::Cursor::new(data.clone()));
        let mut got = String::new();
        loop {
            match chunks.wait() {
                Input::Text(t) => {
                    assert!(!t.is_empty() && t.len() <= CHUNK, "{}", t.len());
                    got.push_str(&t);
                }
                Input::End(e) => {
                    assert_eq!(e, None);
                    break;
                }
                Input::Pending => unreachable!("wait never answers Pending before the end"),
            }
        }
        assert_eq!(got.as_bytes(), &data[..]);
        assert_eq!(chunks.next(), Input::Pending, "the end is told once");
    }
}

//! A run's unread output: chunks in arrival order, merged per stream, taken in bounded answers;
//! and the UTF-8 decoding that never splits a character across two answers.

use std::collections::{HashMap, VecDeque};

use crate::agent::backend::OutputStream;

/// Unread output of one run, oldest first. Adjacent chunks of the same stream are merged, so an
/// answer has one console entry per stream switch, not per engine frame.
#[derive(Debug, Default)]
pub struct Console {
    chunks: VecDeque<(OutputStream, Vec<u8>)>,
    bytes: usize,
}

impl Console {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Nothing held.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Appends `data` of `stream`.
    pub fn push(&mut self, stream: OutputStream, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.bytes += data.len();
        match self.chunks.back_mut() {
            Some((last, buf)) if *last == stream => buf.extend_from_slice(data),
            _ => self.chunks.push_back((stream, data.to_vec())),
        }
    }

    /// Takes the oldest `max` bytes at most (a chunk larger than what is left is split), in order.
    pub fn take(&mut self, max: usize) -> Vec<(OutputStream, Vec<u8>)> {
        let mut out = Vec::new();
        let mut left = max;
        while left > 0 {
            let Some((stream, mut buf)) = self.chunks.pop_front() else {
                break;
            };
            if buf.len() > left {
                let rest = buf.split_off(left);
                self.chunks.push_front((stream, rest));
            }
            left -= buf.len();
            self.bytes -= buf.len();
            out.push((stream, buf));
        }
        out
    }
}

/// Length of an incomplete UTF-8 sequence at the end of `buf` (0 to 3 bytes), to be held back
/// until the bytes that complete it arrive.
fn incomplete_tail(buf: &[u8]) -> usize {
    for back in 1..=buf.len().min(4) {
        let b = buf[buf.len() - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: keep looking for the lead byte
        }
        let need = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if need > back { back } else { 0 };
    }
    0
}

/// Turns a run's bytes into console text per stream. A character split across two chunks is
/// held back and sent whole with the next answer; invalid bytes become U+FFFD (JSON and
/// msgpack strings must be text).
#[derive(Debug, Default)]
pub struct Utf8Carry {
    pending: HashMap<OutputStream, Vec<u8>>,
}

impl Utf8Carry {
    /// Text of `bytes` (after what was held back for `stream`), minus an incomplete tail.
    pub fn decode(&mut self, stream: OutputStream, bytes: Vec<u8>) -> String {
        let mut buf = match self.pending.remove(&stream) {
            Some(mut p) => {
                p.extend_from_slice(&bytes);
                p
            }
            None => bytes,
        };
        let keep = incomplete_tail(&buf);
        if keep > 0 {
            let tail = buf.split_off(buf.len() - keep);
            self.pending.insert(stream, tail);
        }
        match String::from_utf8(buf) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        }
    }

    /// What is still held back (the run ended mid-character), as replacement text.
    pub fn finish(&mut self) -> Vec<(OutputStream, String)> {
        let mut out: Vec<_> = self
            .pending
            .drain()
            .map(|(s, b)| (s, String::from_utf8_lossy(&b).into_owned()))
            .collect();
        out.sort_by_key(|(s, _)| *s == OutputStream::Stderr);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use OutputStream::{Stderr, Stdout};

    #[test]
    fn take_is_bounded_ordered_and_loses_nothing() {
        let mut c = Console::default();
        c.push(Stdout, b"abc");
        c.push(Stdout, b"def");
        c.push(Stderr, b"EE");
        c.push(Stdout, b"gh");
        assert_eq!(c.len(), 10);
        let first = c.take(4);
        assert_eq!(first, vec![(Stdout, b"abcd".to_vec())]);
        let second = c.take(4);
        assert_eq!(
            second,
            vec![(Stdout, b"ef".to_vec()), (Stderr, b"EE".to_vec())]
        );
        assert_eq!(c.take(100), vec![(Stdout, b"gh".to_vec())]);
        assert!(c.is_empty() && c.take(10).is_empty());
    }

    #[test]
    fn characters_are_never_split() {
        let text = "héllo wörld ✓ 😀";
        let bytes = text.as_bytes();
        for cut in 0..=bytes.len() {
            let mut carry = Utf8Carry::default();
            let mut out = carry.decode(Stdout, bytes[..cut].to_vec());
            out += &carry.decode(Stdout, bytes[cut..].to_vec());
            assert!(carry.finish().is_empty());
            assert_eq!(out, text, "cut at {cut}");
        }
    }

    #[test]
    fn invalid_and_truncated_bytes_become_replacements() {
        let mut carry = Utf8Carry::default();
        assert_eq!(carry.decode(Stdout, vec![b'a', 0xFF, b'b']), "a\u{FFFD}b");
        assert_eq!(carry.decode(Stderr, vec![b'x', 0xE2, 0x9C]), "x");
        assert_eq!(carry.finish(), vec![(Stderr, "\u{FFFD}".to_owned())]);
    }
}

//! The line and field layer of the event-stream format, shared by both event assemblers.
//!
//! [`Tokenizer`] takes the body chunk by chunk ([`Tokenizer::feed`]) and hands out its lines
//! ([`Tokenizer::next_line`]), whatever byte the chunks split at: lines end with `\n`, `\r\n` or
//! `\r` (a `\r` ending one chunk and a `\n` starting the next are one line end), and one UTF-8 BOM
//! at the very start is skipped, even split across chunks. [`field`] reads a line: blank, a
//! comment, or a `name: value` field (one optional space after the colon dropped).
//!
//! Memory is bounded by the caller: a line longer than the `limit` it passes is not buffered
//! but handed out in [`Line::Piece`]s as its bytes arrive, so the caller can fail on it or read
//! past it. Handing out a line costs no allocation and no copy beyond the one into the buffer.

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One line of the stream, without its line end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line<'a> {
    /// A whole line, at most the limit long.
    Whole(&'a [u8]),
    /// Part of a line over the limit: the bytes read so far, then the next ones as they come;
    /// `last` on the one the line's end closed (it may be empty).
    Piece { bytes: &'a [u8], last: bool },
}

/// What a whole line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field<'a> {
    /// An empty line: it dispatches the event.
    Blank,
    /// A line starting with `:` (its text after the colon), such as a keep-alive.
    Comment(&'a [u8]),
    /// `name: value`; a line without a colon is a name with an empty value.
    Value { name: &'a [u8], value: &'a [u8] },
}

/// Reads a whole line as a field.
pub fn field(line: &[u8]) -> Field<'_> {
    match line.first() {
        None => Field::Blank,
        Some(b':') => Field::Comment(&line[1..]),
        Some(_) => match memchr::memchr(b':', line) {
            Some(i) => {
                let value = &line[i + 1..];
                Field::Value {
                    name: &line[..i],
                    value: value.strip_prefix(b" ").unwrap_or(value),
                }
            }
            None => Field::Value {
                name: line,
                value: b"",
            },
        },
    }
}

/// Splits a chunked stream into lines. See the module documentation.
#[derive(Debug, Default)]
pub struct Tokenizer {
    buf: Vec<u8>,
    /// Start of the unconsumed bytes of `buf`.
    pos: usize,
    /// How many bytes from `pos` are known to hold no line end (so a long line is scanned once).
    scanned: usize,
    /// The last line ended with `\r`: a `\n` right after it belongs to that line end.
    skip_lf: bool,
    bom_checked: bool,
    /// The current line is being handed out in pieces.
    in_pieces: bool,
}

impl Tokenizer {
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends the next chunk of the stream. Take the lines out with [`Self::next_line`] before
    /// feeding more, or the buffer holds every chunk fed meanwhile.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next line, or `None` when the bytes fed so far hold no further one. A line longer
    /// than `limit` bytes comes in [`Line::Piece`]s, as do the rest of a line already in pieces.
    pub fn next_line(&mut self, limit: usize) -> Option<Line<'_>> {
        if !self.bom_checked {
            let rest = &self.buf[self.pos..];
            if rest.len() < BOM.len() && BOM.starts_with(rest) {
                return None; // maybe a BOM, split: wait for more bytes
            }
            if rest.starts_with(BOM) {
                self.pos += BOM.len();
            }
            self.bom_checked = true;
        }
        if self.skip_lf {
            match self.buf.get(self.pos) {
                None => {
                    self.compact();
                    return None;
                }
                Some(&b) => {
                    if b == b'\n' {
                        self.pos += 1;
                    }
                    self.skip_lf = false;
                }
            }
        }
        let start = self.pos;
        let from = start + self.scanned;
        match memchr::memchr2(b'\n', b'\r', &self.buf[from..]) {
            Some(i) => {
                let end = from + i;
                self.skip_lf = self.buf[end] == b'\r';
                self.pos = end + 1;
                self.scanned = 0;
                let bytes = &self.buf[start..end];
                if self.in_pieces || bytes.len() > limit {
                    self.in_pieces = false;
                    return Some(Line::Piece { bytes, last: true });
                }
                Some(Line::Whole(bytes))
            }
            None => {
                let len = self.buf.len() - start;
                if len > limit || (self.in_pieces && len > 0) {
                    self.in_pieces = true;
                    self.pos = self.buf.len();
                    self.scanned = 0;
                    return Some(Line::Piece {
                        bytes: &self.buf[start..],
                        last: false,
                    });
                }
                self.scanned = len;
                self.compact();
                None
            }
        }
    }

    /// Bytes held: the start of a line not yet ended.
    pub fn buffered(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn compact(&mut self) {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
    }
}

#[cfg(test)]
mod tests;

//! An incremental Server-Sent Events parser, shared by the streaming providers.
//!
//! Feed it the response body chunk by chunk as it arrives ([`SseParser::feed`]) and take the
//! complete events out ([`SseParser::next_event`]) until it returns `None`; at the end of the body
//! call [`SseParser::finish`] once. Chunks may split the stream at any byte (inside a line, between
//! `\r` and `\n`, inside a UTF-8 sequence): lines are decoded only once complete.
//!
//! It follows the WHATWG event-stream rules: lines end with `\n`, `\r\n` or `\r`; a blank line
//! dispatches the event; lines starting with `:` are comments; `data` lines are joined with `\n`;
//! `event` names the event; every other field (`id`, `retry`, unknown) is ignored; one optional
//! UTF-8 BOM at the start is skipped. One leniency: [`SseParser::finish`] dispatches a last event
//! whose terminating blank line never came (the spec drops it).
//!
//! Memory is bounded: a single line, or the data of a single event, longer than the limit
//! (default [`DEFAULT_MAX_EVENT_BYTES`]) is an [`SseError`]. Errors are terminal: drop the parser.

/// The default cap on one line and on one event's data: 8 MiB.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseEvent {
    /// The `event:` field when the event had one (OpenAI sends none; Anthropic names each event).
    pub event: Option<String>,
    /// The event's `data:` lines joined with `\n`.
    pub data: String,
}

/// The stream broke the parser's memory bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("server-sent event line longer than {limit} bytes")]
    LineTooLong { limit: usize },
    #[error("server-sent event data larger than {limit} bytes")]
    EventTooLarge { limit: usize },
}

/// The event being assembled from its lines.
#[derive(Debug, Default)]
struct Pending {
    data: String,
    event: Option<String>,
}

impl Pending {
    /// Applies one complete line (without its terminator); returns the event a blank line dispatches.
    fn line(&mut self, line: &[u8], max: usize) -> Result<Option<SseEvent>, SseError> {
        if line.is_empty() {
            if self.data.is_empty() {
                self.event = None;
                return Ok(None);
            }
            let mut data = std::mem::take(&mut self.data);
            data.pop(); // the '\n' every data line appends
            return Ok(Some(SseEvent {
                event: self.event.take(),
                data,
            }));
        }
        if line[0] == b':' {
            return Ok(None);
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(b" ").unwrap_or(v))
            }
            None => (line, &b""[..]),
        };
        match name {
            b"data" => {
                if self.data.len() + value.len() + 1 > max {
                    return Err(SseError::EventTooLarge { limit: max });
                }
                self.data.push_str(&text(value));
                self.data.push('\n');
            }
            b"event" => self.event = Some(text(value).into_owned()),
            _ => {}
        }
        Ok(None)
    }
}

/// A field's value as text, invalid UTF-8 replaced. Validated first with `from_utf8`, which
/// checks ASCII a word at a time (`from_utf8_lossy` goes byte by byte): every delta passes here.
fn text(value: &[u8]) -> std::borrow::Cow<'_, str> {
    match std::str::from_utf8(value) {
        Ok(s) => s.into(),
        Err(_) => String::from_utf8_lossy(value),
    }
}

/// An incremental event-stream parser. See the module documentation.
#[derive(Debug)]
pub struct SseParser {
    buf: Vec<u8>,
    /// Start of the unconsumed bytes of `buf`.
    pos: usize,
    /// How many bytes from `pos` are known to hold no line terminator (so a long line is scanned once).
    scanned: usize,
    /// The last line ended with `\r`: a `\n` right after it belongs to that terminator.
    skip_lf: bool,
    bom_checked: bool,
    pending: Pending,
    max: usize,
}

impl Default for SseParser {
    fn default() -> Self {
        Self::new()
    }
}

impl SseParser {
    /// A parser with the default limit ([`DEFAULT_MAX_EVENT_BYTES`]).
    pub fn new() -> Self {
        Self::with_limit(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A parser that rejects a line, or an event's data, longer than `max_bytes`.
    pub fn with_limit(max_bytes: usize) -> Self {
        SseParser {
            buf: Vec::new(),
            pos: 0,
            scanned: 0,
            skip_lf: false,
            bom_checked: false,
            pending: Pending::default(),
            max: max_bytes,
        }
    }

    /// Appends the next chunk of the stream. Take the events out with [`Self::next_event`] before
    /// feeding more, or the buffer holds every chunk fed meanwhile.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete event, or `None` when the bytes fed so far hold no further one.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, SseError> {
        loop {
            if !self.bom_checked {
                let rest = &self.buf[self.pos..];
                if rest.len() < BOM.len() && BOM.starts_with(rest) {
                    return Ok(None); // maybe a BOM, split: wait for more bytes
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
                        return Ok(None);
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
            match self.buf[from..]
                .iter()
                .position(|&b| b == b'\n' || b == b'\r')
            {
                Some(i) => {
                    let end = from + i;
                    if end - start > self.max {
                        return Err(SseError::LineTooLong { limit: self.max });
                    }
                    self.skip_lf = self.buf[end] == b'\r';
                    self.pos = end + 1;
                    self.scanned = 0;
                    if let Some(ev) = self.pending.line(&self.buf[start..end], self.max)? {
                        return Ok(Some(ev));
                    }
                }
                None => {
                    self.scanned = self.buf.len() - start;
                    if self.scanned > self.max {
                        return Err(SseError::LineTooLong { limit: self.max });
                    }
                    self.compact();
                    return Ok(None);
                }
            }
        }
    }

    /// Ends the stream: completes an unterminated last line and dispatches an event whose blank
    /// line never came. Call once, after [`Self::next_event`] returned `None`.
    pub fn finish(&mut self) -> Result<Option<SseEvent>, SseError> {
        self.feed(b"\n\n");
        self.next_event()
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

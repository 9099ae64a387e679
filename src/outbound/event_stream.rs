//! Incremental Server-Sent Events parsing: one tokenizer, two event assemblers.
//!
//! - `tokenizer.rs`: the line and field layer both share ([`Tokenizer`], [`field`]): chunks
//!   split anywhere, `\n` / `\r\n` / `\r` line ends, the leading BOM, `name: value` fields,
//!   comments, and the size bound (a line over it comes in pieces, never buffered).
//! - this file: [`SseParser`], the providers' assembler, on the latency path (every delta passes
//!   here). Lenient: data-only events, invalid UTF-8 replaced, and a last event whose blank line
//!   never came is dispatched by [`SseParser::finish`]; a line or an event over the limit is an
//!   [`SseError`].
//! - `strict.rs`: [`StrictParser`], the MCP client's assembler. Strict UTF-8, events with only an
//!   `id` or `retry` emitted, and an event over the limit read past (its ends kept) rather than
//!   failing the stream.
//!
//! Feed the body chunk by chunk as it arrives ([`SseParser::feed`]) and take the complete events
//! out ([`SseParser::next_event`]) until it returns `None`; at the end of the body call
//! [`SseParser::finish`] once. It follows the WHATWG event-stream rules: a blank line dispatches
//! the event; `data` lines are joined with `\n`; `event` names the event; every other field
//! (`id`, `retry`, unknown) is ignored. Memory is bounded: a single line, or the data of a single
//! event, longer than the limit (default [`DEFAULT_MAX_EVENT_BYTES`]) is an [`SseError`]. Errors
//! are terminal: drop the parser.

mod strict;
mod tokenizer;

pub use strict::{Oversize, StrictEvent, StrictItem, StrictParser};
pub use tokenizer::{field, Field, Line, Tokenizer};

/// The default cap on one line and on one event's data: 8 MiB.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

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
    /// Applies one whole line; returns the event a blank line dispatches.
    #[inline]
    fn line(&mut self, line: &[u8], max: usize) -> Result<Option<SseEvent>, SseError> {
        match field(line) {
            Field::Blank => {
                if self.data.is_empty() {
                    self.event = None;
                    return Ok(None);
                }
                let mut data = std::mem::take(&mut self.data);
                data.pop(); // the '\n' every data line appends
                Ok(Some(SseEvent {
                    event: self.event.take(),
                    data,
                }))
            }
            Field::Comment(_) => Ok(None),
            Field::Value {
                name: b"data",
                value,
            } => {
                if self.data.len() + value.len() + 1 > max {
                    return Err(SseError::EventTooLarge { limit: max });
                }
                self.data.push_str(&text(value));
                self.data.push('\n');
                Ok(None)
            }
            Field::Value {
                name: b"event",
                value,
            } => {
                self.event = Some(text(value).into_owned());
                Ok(None)
            }
            Field::Value { .. } => Ok(None),
        }
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

/// The providers' incremental event-stream parser. See the module documentation.
#[derive(Debug)]
pub struct SseParser {
    lines: Tokenizer,
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
            lines: Tokenizer::new(),
            pending: Pending::default(),
            max: max_bytes,
        }
    }

    /// Appends the next chunk of the stream. Take the events out with [`Self::next_event`] before
    /// feeding more, or the buffer holds every chunk fed meanwhile.
    pub fn feed(&mut self, chunk: &[u8]) {
        self.lines.feed(chunk);
    }

    /// The next complete event, or `None` when the bytes fed so far hold no further one.
    pub fn next_event(&mut self) -> Result<Option<SseEvent>, SseError> {
        while let Some(line) = self.lines.next_line(self.max) {
            let Line::Whole(line) = line else {
                return Err(SseError::LineTooLong { limit: self.max });
            };
            if let Some(ev) = self.pending.line(line, self.max)? {
                return Ok(Some(ev));
            }
        }
        Ok(None)
    }

    /// Ends the stream: completes an unterminated last line and dispatches an event whose blank
    /// line never came. Call once, after [`Self::next_event`] returned `None`.
    pub fn finish(&mut self) -> Result<Option<SseEvent>, SseError> {
        self.feed(b"\n\n");
        self.next_event()
    }
}

#[cfg(test)]
mod tests;

//! The MCP client's event assembler, on the shared [`Tokenizer`].
//!
//! Like `sse_stream` (which rmcp's clients use), an event is emitted when any field was set, so
//! `id`/`retry`-only events come out; field values must be UTF-8 (else [`Utf8Error`], terminal);
//! an event cut off by the end of the body is never emitted. Unlike it, unknown fields, lines
//! without a colon and repeated fields follow the spec (ignored / last wins) instead of failing.
//!
//! Each event is bounded: its raw bytes (its lines and their ends, comments excluded) may not go
//! over `max_event_size`. One that does is read past, not buffered, keeping only the first and
//! last `keep` bytes of its data and its `id`; it comes out as an [`Oversize`] in its place, so
//! the caller can answer it (the MCP client turns a response into its JSON-RPC error).

use std::str::Utf8Error;

use super::tokenizer::{field, Field, Line, Tokenizer};

/// One event with every field the spec defines.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StrictEvent {
    pub event: Option<String>,
    /// The `data` lines joined with `\n`; `None` when it had none.
    pub data: Option<String>,
    pub id: Option<String>,
    pub retry: Option<u64>,
}

/// An event over the limit, read past.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oversize {
    /// Its raw bytes, as far as read (a blank line ends it).
    pub size: u64,
    /// The first and last `keep` bytes of its data (lines joined by newlines).
    pub head: Vec<u8>,
    pub tail: Vec<u8>,
    /// Its `id`, when it had a short one.
    pub id: Option<String>,
}

/// What the parser gives out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StrictItem {
    Event(StrictEvent),
    Oversize(Oversize),
}

/// The strict incremental parser. See the module documentation.
#[derive(Debug)]
pub struct StrictParser {
    lines: Tokenizer,
    state: State,
}

#[derive(Debug)]
struct State {
    event: Option<StrictEvent>,
    /// Raw bytes of the current event's finished lines (comments excluded), line ends included.
    event_size: usize,
    max_event_size: usize,
    keep: usize,
    /// The current event is over `max_event_size`: read past, its ends kept.
    over: Option<Over>,
}

impl StrictParser {
    /// A parser of events of at most `max_event_size` raw bytes, keeping the first and last
    /// `keep` bytes of the data of those over it.
    pub fn new(max_event_size: usize, keep: usize) -> Self {
        StrictParser {
            lines: Tokenizer::new(),
            state: State {
                event: None,
                event_size: 0,
                max_event_size,
                keep,
                over: None,
            },
        }
    }

    /// Appends the next chunk of the stream; take the items out with [`Self::next_item`].
    pub fn feed(&mut self, chunk: &[u8]) {
        self.lines.feed(chunk);
    }

    /// The next event (or oversize event), or `None` when the bytes fed so far hold no further one.
    pub fn next_item(&mut self) -> Result<Option<StrictItem>, Utf8Error> {
        loop {
            let s = &mut self.state;
            if s.over.is_none() && s.event_size > s.max_event_size {
                s.start_over();
            }
            // Read past an event over the limit a piece at a time; else bound its next line.
            let limit = match s.over {
                Some(_) => 0,
                None => s.max_event_size - s.event_size,
            };
            let Some(line) = self.lines.next_line(limit) else {
                return Ok(None);
            };
            if let Some(item) = self.state.line(line)? {
                return Ok(Some(item));
            }
        }
    }
}

impl State {
    fn start_over(&mut self) {
        self.over = Some(Over::new(self.event.take(), self.event_size, self.keep));
    }

    fn line(&mut self, line: Line<'_>) -> Result<Option<StrictItem>, Utf8Error> {
        let (bytes, last) = match line {
            Line::Whole(bytes) if self.over.is_none() => {
                return self.whole(bytes).map(|e| e.map(StrictItem::Event));
            }
            Line::Whole(bytes) => (bytes, true),
            Line::Piece { bytes, last } => (bytes, last),
        };
        if self.over.is_none() {
            self.start_over();
        }
        let Some(over) = &mut self.over else {
            return Ok(None);
        };
        over.part(bytes);
        if !last || !over.line_end() {
            return Ok(None);
        }
        self.event_size = 0;
        Ok(self.over.take().map(|o| StrictItem::Oversize(o.finish())))
    }

    /// A whole line of an event within the limit; returns the event a blank line dispatches.
    fn whole(&mut self, line: &[u8]) -> Result<Option<StrictEvent>, Utf8Error> {
        let (name, value) = match field(line) {
            Field::Blank => {
                self.event_size = 0;
                return Ok(self.event.take());
            }
            Field::Comment(_) => return Ok(None), // a keep-alive
            Field::Value { name, value } => (name, value),
        };
        self.event_size += line.len() + 1;
        let text = || std::str::from_utf8(value);
        match name {
            b"data" => {
                let text = text()?;
                let event = self.event.get_or_insert_with(StrictEvent::default);
                match &mut event.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(text);
                    }
                    None => event.data = Some(text.to_owned()),
                }
            }
            b"event" => {
                self.event.get_or_insert_with(StrictEvent::default).event = Some(text()?.into())
            }
            b"id" if !value.contains(&0) => {
                self.event.get_or_insert_with(StrictEvent::default).id = Some(text()?.into());
            }
            b"retry" => {
                if let Ok(ms) = text()?.parse::<u64>() {
                    self.event.get_or_insert_with(StrictEvent::default).retry = Some(ms);
                }
            }
            _ => {}
        }
        Ok(None)
    }
}

/// What a line of an event over the limit is, as far as read.
#[derive(Debug)]
enum Part {
    /// Its name so far (no colon yet).
    Name(Vec<u8>),
    /// `data`: its value goes to the kept ends; `fresh` until the value's first byte.
    Data { fresh: bool },
    /// `id`: its value, kept (if short).
    Id(Vec<u8>),
    /// A comment, another field, or a name too long to be one we use.
    Other,
}

/// An event over the limit, being read past.
#[derive(Debug)]
struct Over {
    summary: Oversize,
    keep: usize,
    data_lines: usize,
    /// Bytes of the current line so far.
    line_len: usize,
    part: Part,
}

/// Longest field name looked at, and `id` value kept.
const FIELD_NAME: usize = 16;
const ID_VALUE: usize = 1024;

impl Over {
    /// Read past an event whose finished lines (`size` bytes) made `event`.
    fn new(event: Option<StrictEvent>, size: usize, keep: usize) -> Over {
        let mut over = Over {
            summary: Oversize {
                size: size as u64,
                head: Vec::with_capacity(keep),
                tail: Vec::new(),
                id: None,
            },
            keep,
            data_lines: 0,
            line_len: 0,
            part: Part::Name(Vec::new()),
        };
        if let Some(event) = event {
            over.summary.id = event.id;
            if let Some(data) = event.data {
                over.data_lines = 1;
                over.data(data.as_bytes());
            }
        }
        over
    }

    fn data(&mut self, v: &[u8]) {
        let (s, keep) = (&mut self.summary, self.keep);
        if s.head.len() < keep {
            let take = v.len().min(keep - s.head.len());
            s.head.extend_from_slice(&v[..take]);
        }
        s.tail.extend_from_slice(&v[v.len().saturating_sub(keep)..]);
        let extra = s.tail.len().saturating_sub(keep);
        s.tail.drain(..extra);
    }

    /// A data line begins: a newline joins it to the one before.
    fn data_line(&mut self) {
        if self.data_lines > 0 {
            self.data(b"\n");
        }
        self.data_lines += 1;
    }

    /// Part of the current line, without its end.
    fn part(&mut self, mut p: &[u8]) {
        self.summary.size += p.len() as u64;
        self.line_len += p.len();
        loop {
            match &mut self.part {
                Part::Name(name) => {
                    let colon = memchr::memchr(b':', p);
                    let upto = colon.unwrap_or(p.len());
                    if name.len() + upto > FIELD_NAME {
                        self.part = Part::Other;
                        return;
                    }
                    name.extend_from_slice(&p[..upto]);
                    let Some(colon) = colon else { return };
                    self.part = match name.as_slice() {
                        b"data" => {
                            self.data_line();
                            Part::Data { fresh: true }
                        }
                        b"id" => Part::Id(Vec::new()),
                        _ => Part::Other,
                    };
                    p = &p[colon + 1..];
                }
                Part::Data { fresh } => {
                    if *fresh && !p.is_empty() {
                        *fresh = false;
                        p = p.strip_prefix(b" ").unwrap_or(p);
                    }
                    self.data(p);
                    return;
                }
                Part::Id(value) => {
                    if value.len() + p.len() > ID_VALUE {
                        self.part = Part::Other;
                    } else {
                        value.extend_from_slice(p);
                    }
                    return;
                }
                Part::Other => return,
            }
        }
    }

    /// The current line ended; `true` when it was blank (the event's end).
    fn line_end(&mut self) -> bool {
        if self.line_len == 0 {
            return true;
        }
        self.summary.size += 1;
        match std::mem::replace(&mut self.part, Part::Name(Vec::new())) {
            // `data` without a colon: a data line with an empty value.
            Part::Name(name) if name == b"data" => self.data_line(),
            Part::Id(value) if !value.contains(&0) => {
                if let Ok(id) = String::from_utf8(value) {
                    self.summary.id = Some(id);
                }
            }
            _ => {}
        }
        self.line_len = 0;
        false
    }

    fn finish(self) -> Oversize {
        self.summary
    }
}

#[cfg(test)]
mod tests;

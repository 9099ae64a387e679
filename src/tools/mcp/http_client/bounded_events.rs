//! The server's SSE bodies, parsed into rmcp's events within a size bound per event.
//!
//! An event over the bound is read past, not buffered, keeping only the ends of its data: when
//! they show a response, an event carrying a JSON-RPC error for its id (with the reason) takes
//! its place, so its call ends at once; anything else is logged and dropped (its `id` still
//! passed on, so a resumed stream does not send it again). See [`super::super::too_large`].

use std::collections::VecDeque;
use std::sync::Arc;

use futures_util::StreamExt;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::SseError;
use serde_json::json;

use super::super::too_large::{self, GLIMPSE};
use super::wire::Sse;

/// The events of an SSE body, each at most `max_event_size` raw bytes (comments excluded).
pub(super) fn sse_events(
    body: Incoming,
    max_event_size: usize,
    server: Arc<str>,
) -> BoxedSseResponse {
    let parser = SseParser::new(max_event_size, server);
    futures_util::stream::unfold(Some((body, parser)), |state| async move {
        let (mut body, mut parser) = state?;
        loop {
            if let Some(event) = parser.ready.pop_front() {
                return Some((Ok(event), Some((body, parser))));
            }
            let data = match body.frame().await? {
                Ok(frame) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue, // trailers
                },
                Err(e) => return Some((Err(SseError::Body(Box::new(e))), None)),
            };
            if let Err(e) = parser.feed(&data) {
                return Some((Err(e), None));
            }
        }
    })
    .boxed()
}

/// The WHATWG event-stream format, fed chunk by chunk. Like `sse_stream` (which rmcp's clients
/// use), an event is emitted when any field was set, so rmcp sees `id`/`retry`-only events; an
/// event cut off by the end of the body is dropped. Unlike it, unknown fields, lines without a
/// colon and repeated fields follow the spec (ignored / last wins) instead of failing the stream.
pub(super) struct SseParser {
    pub(super) ready: VecDeque<Sse>,
    event: Option<Sse>,
    line: Vec<u8>,
    /// Raw bytes of the current event's finished lines (comments excluded), newlines included.
    event_size: usize,
    max_event_size: usize,
    after_cr: bool,
    at_start: bool,
    /// The current event is over `max_event_size`: read past, its ends kept.
    over: Option<Over>,
    /// The server, for the log and the error answer.
    server: Arc<str>,
}

impl SseParser {
    pub(super) fn new(max_event_size: usize, server: Arc<str>) -> SseParser {
        SseParser {
            ready: VecDeque::new(),
            event: None,
            line: Vec::new(),
            event_size: 0,
            max_event_size,
            after_cr: false,
            at_start: true,
            over: None,
            server,
        }
    }

    pub(super) fn feed(&mut self, mut chunk: &[u8]) -> Result<(), SseError> {
        if self.after_cr && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        self.after_cr = false;
        while !chunk.is_empty() {
            let end = memchr::memchr2(b'\r', b'\n', chunk);
            let part = &chunk[..end.unwrap_or(chunk.len())];
            match &mut self.over {
                Some(over) => over.part(part),
                None if self.event_size + self.line.len() + part.len() > self.max_event_size => {
                    let mut over = Over::new(self.event.take(), self.event_size);
                    over.part(&self.line);
                    over.part(part);
                    self.line.clear();
                    self.at_start = false;
                    self.over = Some(over);
                }
                None => self.line.extend_from_slice(part),
            }
            let Some(end) = end else { break };
            let cr = chunk[end] == b'\r';
            chunk = &chunk[end + 1..];
            if cr {
                match chunk.first() {
                    Some(b'\n') => chunk = &chunk[1..],
                    None => self.after_cr = true,
                    Some(_) => {}
                }
            }
            if let Some(over) = &mut self.over {
                if over.line_end() {
                    self.event_size = 0;
                    if let Some(over) = self.over.take() {
                        self.ready.extend(over.finish(&self.server));
                    }
                }
                continue;
            }
            let line = std::mem::take(&mut self.line);
            self.line_done(&line)?;
            self.line = line;
            self.line.clear();
        }
        Ok(())
    }

    fn line_done(&mut self, mut line: &[u8]) -> Result<(), SseError> {
        if std::mem::take(&mut self.at_start) {
            line = line.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(line);
        }
        if line.is_empty() {
            self.event_size = 0;
            self.ready.extend(self.event.take());
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(()); // a comment (keep-alive)
        }
        self.event_size += line.len() + 1;
        let (name, value) = match line.iter().position(|b| *b == b':') {
            Some(colon) => (&line[..colon], &line[colon + 1..]),
            None => (line, &[][..]),
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        let text = || std::str::from_utf8(value).map_err(SseError::Utf8Parse);
        match name {
            b"data" => {
                let text = text()?;
                let event = self.event.get_or_insert_with(Sse::default);
                match &mut event.data {
                    Some(data) => {
                        data.push('\n');
                        data.push_str(text);
                    }
                    None => event.data = Some(text.to_owned()),
                }
            }
            b"event" => self.event.get_or_insert_with(Sse::default).event = Some(text()?.into()),
            b"id" if !value.contains(&0) => {
                self.event.get_or_insert_with(Sse::default).id = Some(text()?.into());
            }
            b"retry" => {
                if let Ok(ms) = text()?.parse::<u64>() {
                    self.event.get_or_insert_with(Sse::default).retry = Some(ms);
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// What a line of an event over the limit is, as far as read.
enum Field {
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
struct Over {
    /// Its raw bytes so far.
    size: u64,
    /// The first and last [`GLIMPSE`] bytes of its data (lines joined by newlines).
    head: Vec<u8>,
    tail: Vec<u8>,
    data_lines: usize,
    id: Option<String>,
    /// Bytes of the current line so far.
    line_len: usize,
    field: Field,
}

/// Longest field name looked at, and `id` value kept.
const FIELD_NAME: usize = 16;
const ID_VALUE: usize = 1024;

impl Over {
    /// Read past an event whose finished lines (`size` bytes) made `event`.
    fn new(event: Option<Sse>, size: usize) -> Over {
        let mut over = Over {
            size: size as u64,
            head: Vec::with_capacity(GLIMPSE),
            tail: Vec::new(),
            data_lines: 0,
            id: None,
            line_len: 0,
            field: Field::Name(Vec::new()),
        };
        if let Some(event) = event {
            over.id = event.id;
            if let Some(data) = event.data {
                over.data_lines = 1;
                over.data(data.as_bytes());
            }
        }
        over
    }

    fn data(&mut self, v: &[u8]) {
        if self.head.len() < GLIMPSE {
            let take = v.len().min(GLIMPSE - self.head.len());
            self.head.extend_from_slice(&v[..take]);
        }
        self.tail
            .extend_from_slice(&v[v.len().saturating_sub(GLIMPSE)..]);
        let extra = self.tail.len().saturating_sub(GLIMPSE);
        self.tail.drain(..extra);
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
        self.size += p.len() as u64;
        self.line_len += p.len();
        loop {
            match &mut self.field {
                Field::Name(name) => {
                    let colon = memchr::memchr(b':', p);
                    let upto = colon.unwrap_or(p.len());
                    if name.len() + upto > FIELD_NAME {
                        self.field = Field::Other;
                        return;
                    }
                    name.extend_from_slice(&p[..upto]);
                    let Some(colon) = colon else { return };
                    self.field = match name.as_slice() {
                        b"data" => {
                            self.data_line();
                            Field::Data { fresh: true }
                        }
                        b"id" => Field::Id(Vec::new()),
                        _ => Field::Other,
                    };
                    p = &p[colon + 1..];
                }
                Field::Data { fresh } => {
                    if *fresh && !p.is_empty() {
                        *fresh = false;
                        p = p.strip_prefix(b" ").unwrap_or(p);
                    }
                    self.data(p);
                    return;
                }
                Field::Id(value) => {
                    if value.len() + p.len() > ID_VALUE {
                        self.field = Field::Other;
                    } else {
                        value.extend_from_slice(p);
                    }
                    return;
                }
                Field::Other => return,
            }
        }
    }

    /// The current line ended; `true` when it was blank (the event's end).
    fn line_end(&mut self) -> bool {
        if self.line_len == 0 {
            return true;
        }
        self.size += 1;
        match std::mem::replace(&mut self.field, Field::Name(Vec::new())) {
            // `data` without a colon: a data line with an empty value.
            Field::Name(name) if name == b"data" => self.data_line(),
            Field::Id(value) if !value.contains(&0) => {
                if let Ok(id) = String::from_utf8(value) {
                    self.id = Some(id);
                }
            }
            _ => {}
        }
        self.line_len = 0;
        false
    }

    /// What takes the event's place: the error answer to its call when it was a response,
    /// else its id alone (if it had one).
    fn finish(self, server: &str) -> Option<Sse> {
        let outline = too_large::outline(&self.head, &self.tail);
        let size = Some(self.size);
        let Some(call) = outline.answered() else {
            too_large::warn_unanswerable(server, size, &outline);
            return self.id.map(|id| Sse::default().id(id));
        };
        tracing::warn!(
            server,
            size_bytes = self.size,
            max_bytes = too_large::MAX_MESSAGE,
            id = %call,
            "an MCP server's answer was over the size an MCP message may have: dropped, its call ended with the reason"
        );
        let who = format!("MCP server {server}");
        let answer =
            json!({"jsonrpc": "2.0", "id": call, "error": too_large::error_data(&who, size)});
        Some(Sse {
            data: Some(answer.to_string()),
            id: self.id,
            ..Sse::default()
        })
    }
}

//! The server's SSE bodies, parsed into rmcp's events within a size bound per event.

use std::collections::VecDeque;

use futures_util::StreamExt;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::SseError;

use super::Sse;

/// An SSE event larger than the transport's limit: the stream stops with this error.
#[derive(Debug, thiserror::Error)]
#[error("SSE event exceeded the maximum size of {0} bytes")]
struct EventTooLarge(usize);

/// The events of an SSE body, each at most `max_event_size` raw bytes (comments excluded).
pub(super) fn sse_events(body: Incoming, max_event_size: usize) -> BoxedSseResponse {
    let parser = SseParser::new(max_event_size);
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
}

impl SseParser {
    pub(super) fn new(max_event_size: usize) -> SseParser {
        SseParser {
            ready: VecDeque::new(),
            event: None,
            line: Vec::new(),
            event_size: 0,
            max_event_size,
            after_cr: false,
            at_start: true,
        }
    }

    pub(super) fn feed(&mut self, mut chunk: &[u8]) -> Result<(), SseError> {
        if self.after_cr && chunk.first() == Some(&b'\n') {
            chunk = &chunk[1..];
        }
        self.after_cr = false;
        while !chunk.is_empty() {
            let end = chunk.iter().position(|b| matches!(b, b'\r' | b'\n'));
            let part = &chunk[..end.unwrap_or(chunk.len())];
            if self.event_size + self.line.len() + part.len() > self.max_event_size {
                let error = EventTooLarge(self.max_event_size);
                return Err(SseError::Body(Box::new(error)));
            }
            self.line.extend_from_slice(part);
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

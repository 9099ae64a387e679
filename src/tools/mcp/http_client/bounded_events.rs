//! The server's SSE bodies, parsed into rmcp's events within a size bound per event.
//!
//! An event over the bound is read past, not buffered, keeping only the ends of its data: when
//! they show a response, an event carrying a JSON-RPC error for its id (with the reason) takes
//! its place, so its call ends at once; anything else is logged and dropped (its `id` still
//! passed on, so a resumed stream does not send it again). See [`super::super::too_large`].
//! The parsing is [`StrictParser`]'s, on the tokenizer the providers' streams share.

use std::collections::VecDeque;
use std::sync::Arc;

use futures_util::StreamExt;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::SseError;
use serde_json::json;

use crate::outbound::event_stream::{Oversize, StrictEvent, StrictItem, StrictParser};

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

/// [`StrictParser`] giving rmcp's events: see the module documentation.
pub(super) struct SseParser {
    pub(super) ready: VecDeque<Sse>,
    parser: StrictParser,
    /// The server, for the log and the error answer.
    server: Arc<str>,
}

impl SseParser {
    pub(super) fn new(max_event_size: usize, server: Arc<str>) -> SseParser {
        SseParser {
            ready: VecDeque::new(),
            parser: StrictParser::new(max_event_size, GLIMPSE),
            server,
        }
    }

    pub(super) fn feed(&mut self, chunk: &[u8]) -> Result<(), SseError> {
        self.parser.feed(chunk);
        while let Some(item) = self.parser.next_item().map_err(SseError::Utf8Parse)? {
            match item {
                StrictItem::Event(StrictEvent {
                    event,
                    data,
                    id,
                    retry,
                }) => self.ready.push_back(Sse {
                    event,
                    data,
                    id,
                    retry,
                }),
                StrictItem::Oversize(over) => self.ready.extend(answer(over, &self.server)),
            }
        }
        Ok(())
    }
}

/// What takes an event over the limit's place: the error answer to its call when it was a
/// response, else its id alone (if it had one).
fn answer(over: Oversize, server: &str) -> Option<Sse> {
    let outline = too_large::outline(&over.head, &over.tail);
    let size = Some(over.size);
    let Some(call) = outline.answered() else {
        too_large::warn_unanswerable(server, size, &outline);
        return over.id.map(|id| Sse::default().id(id));
    };
    tracing::warn!(
        server,
        size_bytes = over.size,
        max_bytes = too_large::MAX_MESSAGE,
        id = %call,
        "an MCP server's answer was over the size an MCP message may have: dropped, its call ended with the reason"
    );
    let who = format!("MCP server {server}");
    let answer = json!({"jsonrpc": "2.0", "id": call, "error": too_large::error_data(&who, size)});
    Some(Sse {
        data: Some(answer.to_string()),
        id: over.id,
        ..Sse::default()
    })
}

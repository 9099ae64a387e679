//! A scripted fake Anthropic Messages upstream: a real hyper server on `127.0.0.1:0` that speaks
//! the Messages streaming wire format and records every request.
//!
//! ```no_run
//! # async fn demo() {
//! use turnstile::testkit::fake_anthropic::{FakeAnthropic, Reply};
//! let fake = FakeAnthropic::start().await;
//! fake.push(Reply::text("Hello there").usage(12, 3));
//! // ... point the Anthropic provider at fake.base_url() and run a turn ...
//! let reqs = fake.wait_requests(1).await;
//! assert_eq!(reqs[0]["model"], "some-model");
//! # }
//! ```
//!
//! Each `POST /v1/messages` takes the next queued [`Reply`] (FIFO); with none queued it answers
//! HTTP 500 `{"type":"error","error":{"type":"api_error","message":"fake upstream: no scripted
//! reply"}}` so a test fails loudly. A streamed reply is, in order, one SSE event each (with its
//! `event:` line, as the real API sends them):
//!
//! - `message_start` (usage `input_tokens`, `cache_creation_input_tokens`,
//!   `cache_read_input_tokens`, `output_tokens: 1`), then a `ping`;
//! - the reply's thinking blocks, in the order they were added: a `thinking` block is
//!   `content_block_start`, `thinking_delta`s, one `signature_delta`, `content_block_stop`; a
//!   `redacted_thinking` block comes whole in its `content_block_start` (its `data`), then
//!   `content_block_stop`;
//! - a `text` block when the reply has text: start, `text_delta`s, stop;
//! - one `tool_use` block per tool call, one after the other: start (with `id`, `name`, `input:
//!   {}`), an empty `input_json_delta`, the input JSON in `input_json_delta`s of `chunk_chars`
//!   characters, stop;
//! - `message_delta` (`stop_reason`, usage `output_tokens`) and `message_stop` (the ending part;
//!   [`Reply::error_event`] replaces it with an `error` event).
//!
//! Dropping the [`FakeAnthropic`] stops the server and every connection.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Value};

pub use super::fake_upstream::Gate;
use super::fake_upstream::{split_chars, Failure, Pace, Script, Server, Wire};

/// The signature [`Reply::thinking`] signs its block with.
pub const FAKE_SIGNATURE: &str = "RmFrZVNpZ25hdHVyZQ==";

/// One thinking block of a reply.
#[derive(Debug, Clone)]
enum Thinking {
    Signed { text: String, signature: String },
    Redacted { data: String },
}

/// One scripted answer to one Messages request. Build with [`Reply::text`],
/// [`Reply::tool_calls`], [`Reply::status`], [`Reply::api_error`] or [`Reply::raw`], then refine
/// with the builder methods.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Error reply, raw body, chunking, break / hold / pace, headers.
    script: Script,
    thinking: Vec<Thinking>,
    text: String,
    tool_calls: Vec<(String, String, Value)>,
    stop_reason: Option<String>,
    /// An `error` event `(type, message)` sent instead of `message_delta` + `message_stop`.
    error_event: Option<(String, String)>,
    usage: (u64, u64),
    /// `cache_read_input_tokens`, `cache_creation_input_tokens` of `message_start`.
    cache: (u64, u64),
}

impl Reply {
    fn empty() -> Reply {
        Reply {
            script: Script::default(),
            thinking: Vec::new(),
            text: String::new(),
            tool_calls: Vec::new(),
            stop_reason: None,
            error_event: None,
            usage: (10, 5),
            cache: (0, 0),
        }
    }

    /// A text answer, streamed as `text_delta`s of [`Reply::chunk_chars`] characters (default 4);
    /// stop reason `end_turn`.
    pub fn text(s: &str) -> Reply {
        Reply {
            text: s.to_string(),
            ..Reply::empty()
        }
    }

    /// Tool calls `(id, name, input)`, one `tool_use` block each; stop reason `tool_use`. Each
    /// input is sent as JSON text in `input_json_delta` fragments of `chunk_chars` characters.
    pub fn tool_calls(calls: &[(&str, &str, Value)]) -> Reply {
        Reply {
            tool_calls: calls
                .iter()
                .map(|(id, name, input)| (id.to_string(), name.to_string(), input.clone()))
                .collect(),
            ..Reply::empty()
        }
    }

    /// An HTTP error response with this status and JSON body (no stream).
    pub fn status(code: u16, body: Value) -> Reply {
        Reply {
            script: Script {
                error: Some((code, body)),
                ..Script::default()
            },
            ..Reply::empty()
        }
    }

    /// An HTTP error response in the Anthropic shape:
    /// `{"type":"error","error":{"type": error_type,"message": message}}`.
    pub fn api_error(code: u16, error_type: &str, message: &str) -> Reply {
        Reply::status(
            code,
            json!({"type": "error", "error": {"type": error_type, "message": message}}),
        )
    }

    /// A verbatim `text/event-stream` body, sent in writes of `chunk_chars` bytes (default 4;
    /// splits may fall inside UTF-8 sequences): for upstream quirks the builder cannot express.
    /// `hold_after`, `break_after` and `pace` count these writes.
    pub fn raw(body: &str) -> Reply {
        Reply {
            script: Script {
                raw: Some(body.to_string()),
                ..Script::default()
            },
            ..Reply::empty()
        }
    }

    /// Thinking (a `thinking` block of `thinking_delta`s signed [`FAKE_SIGNATURE`]), streamed
    /// before the text. Same as [`Reply::thinking_signed`] with that signature.
    pub fn thinking(self, s: &str) -> Reply {
        self.thinking_signed(s, FAKE_SIGNATURE)
    }

    /// Adds a `thinking` block with this text and signature (sent as one `signature_delta`).
    pub fn thinking_signed(mut self, s: &str, signature: &str) -> Reply {
        self.thinking.push(Thinking::Signed {
            text: s.to_string(),
            signature: signature.to_string(),
        });
        self
    }

    /// Adds a `redacted_thinking` block with this (opaque) `data`.
    pub fn redacted_thinking(mut self, data: &str) -> Reply {
        self.thinking.push(Thinking::Redacted {
            data: data.to_string(),
        });
        self
    }

    /// `cache_read_input_tokens` and `cache_creation_input_tokens` of `message_start` (default 0).
    pub fn cache_tokens(mut self, read: u64, creation: u64) -> Reply {
        self.cache = (read, creation);
        self
    }

    /// Text streamed before the tool calls (or replacing the text of [`Reply::text`]).
    pub fn with_text(mut self, s: &str) -> Reply {
        self.text = s.to_string();
        self
    }

    /// Overrides the stop reason (`max_tokens`, `refusal`, `stop_sequence`, `pause_turn`, ...).
    pub fn finish(mut self, stop_reason: &str) -> Reply {
        self.stop_reason = Some(stop_reason.to_string());
        self
    }

    /// Ends the stream with an `error` event (e.g. `overloaded_error`) instead of
    /// `message_delta` and `message_stop`, as the API does when it fails mid-answer.
    pub fn error_event(mut self, error_type: &str, message: &str) -> Reply {
        self.error_event = Some((error_type.to_string(), message.to_string()));
        self
    }

    /// `input_tokens` of `message_start` and `output_tokens` of `message_delta` (default 10 / 5).
    pub fn usage(mut self, input: u64, output: u64) -> Reply {
        self.usage = (input, output);
        self
    }

    /// Characters per delta for text, thinking and tool input JSON (0 counts as 1).
    pub fn chunk_chars(mut self, n: usize) -> Reply {
        self.script.chunk_chars = n.max(1);
        self
    }

    /// Sends only the first `n_events` SSE events (`message_start` and `ping` count; writes for
    /// [`Reply::raw`]), then breaks the connection: the chunked body is never terminated.
    pub fn break_after(mut self, n_events: usize) -> Reply {
        self.script.break_after = Some(n_events);
        self
    }

    /// Sends every content event, then waits for `gate` before `message_delta` and
    /// `message_stop`: keeps a turn running, with its output visible, until the test opens it.
    pub fn hold(self, gate: Gate) -> Reply {
        self.hold_after(usize::MAX, gate)
    }

    /// Sends the first `n_events` SSE events, then waits for `gate` before sending the rest.
    /// `usize::MAX` holds before the ending, like [`Reply::hold`].
    pub fn hold_after(mut self, n_events: usize, gate: Gate) -> Reply {
        self.script.hold = Some((n_events, gate));
        self
    }

    /// Waits `every` before each SSE event after the first (benchmarks).
    pub fn pace(mut self, every: Duration) -> Reply {
        self.script.pace = Some(Pace::Gap(every));
        self
    }

    /// Sets a response header (e.g. `retry-after` on a [`Reply::status`] reply; `content-type`
    /// replaces the default).
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.script
            .headers
            .push((name.to_string(), value.to_string()));
        self
    }

    /// The SSE events of a streamed reply, split into the content part and the ending part.
    fn events(&self, id: &str, model: &Value) -> (Vec<Bytes>, Vec<Bytes>) {
        let ev = |v: Value| -> Bytes {
            let name = v["type"].as_str().unwrap_or("message").to_string();
            Bytes::from(format!("event: {name}\ndata: {v}\n\n"))
        };
        let (input_tokens, output_tokens) = self.usage;
        let mut content = vec![
            ev(json!({"type": "message_start", "message": {
                "id": id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": {
                    "input_tokens": input_tokens,
                    "cache_creation_input_tokens": self.cache.1,
                    "cache_read_input_tokens": self.cache.0,
                    "output_tokens": 1,
                },
            }})),
            ev(json!({"type": "ping"})),
        ];
        let mut index = 0u64;
        let delta = |index: u64, d: Value| {
            ev(json!({"type": "content_block_delta", "index": index, "delta": d}))
        };
        let stop = |index: u64| ev(json!({"type": "content_block_stop", "index": index}));
        for block in &self.thinking {
            match block {
                Thinking::Signed { text, signature } => {
                    content.push(ev(json!({"type": "content_block_start", "index": index,
                        "content_block": {"type": "thinking", "thinking": "", "signature": ""}})));
                    for piece in split_chars(text, self.script.chunk_chars) {
                        content.push(delta(
                            index,
                            json!({"type": "thinking_delta", "thinking": piece}),
                        ));
                    }
                    content.push(delta(
                        index,
                        json!({"type": "signature_delta", "signature": signature}),
                    ));
                }
                Thinking::Redacted { data } => {
                    content.push(ev(json!({"type": "content_block_start", "index": index,
                        "content_block": {"type": "redacted_thinking", "data": data}})));
                }
            }
            content.push(stop(index));
            index += 1;
        }
        if !self.text.is_empty() {
            content.push(ev(json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "text", "text": ""}})));
            for piece in split_chars(&self.text, self.script.chunk_chars) {
                content.push(delta(index, json!({"type": "text_delta", "text": piece})));
            }
            content.push(stop(index));
            index += 1;
        }
        for (id, name, input) in &self.tool_calls {
            content.push(ev(json!({"type": "content_block_start", "index": index,
                "content_block": {"type": "tool_use", "id": id, "name": name, "input": {}}})));
            content.push(delta(
                index,
                json!({"type": "input_json_delta", "partial_json": ""}),
            ));
            for piece in split_chars(&input.to_string(), self.script.chunk_chars) {
                content.push(delta(
                    index,
                    json!({"type": "input_json_delta", "partial_json": piece}),
                ));
            }
            content.push(stop(index));
            index += 1;
        }

        let ending = match &self.error_event {
            Some((kind, message)) => vec![ev(json!({"type": "error",
                "error": {"type": kind, "message": message}}))],
            None => {
                let stop_reason = self.stop_reason.clone().unwrap_or_else(|| {
                    if self.tool_calls.is_empty() {
                        "end_turn".to_string()
                    } else {
                        "tool_use".to_string()
                    }
                });
                vec![
                    ev(json!({"type": "message_delta",
                        "delta": {"stop_reason": stop_reason, "stop_sequence": null},
                        "usage": {"output_tokens": output_tokens}})),
                    ev(json!({"type": "message_stop"})),
                ]
            }
        };
        (content, ending)
    }
}

/// The Messages wire format, for the shared [`Server`].
struct AnthropicWire;

impl Wire for AnthropicWire {
    type Reply = Reply;
    const ROUTE: &'static str = "/v1/messages";
    const CONTENT_TYPE: &'static str = "text/event-stream; charset=utf-8";

    fn failure_body(failure: Failure, message: &str) -> Value {
        let kind = match failure {
            Failure::NoRoute => "not_found_error",
            Failure::Unreadable | Failure::NotJson | Failure::Invalid => "invalid_request_error",
            Failure::NoReply => "api_error",
        };
        json!({"type": "error", "error": {"type": kind, "message": message}})
    }

    fn script(reply: &Reply) -> &Script {
        &reply.script
    }

    fn validate(request: &Value) -> Result<(), String> {
        check_request(request)
    }

    fn events(reply: &Reply, request: &Value, n: u64) -> (Vec<Bytes>, Vec<Bytes>) {
        let model = request.get("model").cloned().unwrap_or(Value::Null);
        reply.events(&format!("msg_fake{n:06}"), &model)
    }

    fn stream_headers(headers: &mut HeaderMap, n: u64) {
        headers.insert(
            HeaderName::from_static("request-id"),
            HeaderValue::from_str(&format!("req_fake{n:06}"))
                .unwrap_or_else(|_| HeaderValue::from_static("req_fake")),
        );
    }
}

/// What the Messages API refuses with a 400 (and the fake does too): an assistant message's
/// `tool_use` blocks not each answered by a `tool_result` block in the user message right after
/// it, or a `tool_result` that answers no `tool_use` of the message before. `Err` says what is
/// wrong.
pub fn check_request(req: &Value) -> Result<(), String> {
    let empty = Vec::new();
    let blocks = |m: &Value, kind: &str, key: &str| -> Vec<String> {
        m["content"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .filter(|b| b["type"] == kind)
            .map(|b| b[key].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let messages = req["messages"].as_array().unwrap_or(&empty);
    let mut open: Vec<String> = Vec::new();
    for (j, m) in messages.iter().enumerate() {
        let answers = blocks(m, "tool_result", "tool_use_id");
        if m["role"] == "user" {
            for id in &answers {
                match open.iter().position(|c| c == id) {
                    Some(pos) => {
                        open.remove(pos);
                    }
                    None => {
                        return Err(format!(
                            "messages.{j}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. \
                             Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                        ))
                    }
                }
            }
        }
        if !open.is_empty() {
            return Err(format!(
                "messages.{j}: `tool_use` ids were found without `tool_result` blocks immediately after: {open:?}"
            ));
        }
        if m["role"] == "assistant" {
            open = blocks(m, "tool_use", "id");
        }
    }
    if open.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "`tool_use` ids were found without `tool_result` blocks immediately after: {open:?}"
        ))
    }
}

/// The fake server. See the module documentation.
pub struct FakeAnthropic {
    server: Server<AnthropicWire>,
}

impl FakeAnthropic {
    /// Binds `127.0.0.1:0` and starts serving.
    pub async fn start() -> FakeAnthropic {
        FakeAnthropic {
            server: Server::start().await,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.server.addr()
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        self.server.base_url()
    }

    /// Queues a reply; replies are served FIFO, one per `POST /v1/messages`.
    pub fn push(&self, reply: Reply) {
        self.server.push(reply);
    }

    /// How many queued replies no request has taken yet.
    pub fn pending_replies(&self) -> usize {
        self.server.pending_replies()
    }

    /// How many TCP connections the server has accepted (to check connection reuse).
    pub fn connections(&self) -> u64 {
        self.server.connections()
    }

    /// Every request body received so far, in order (a body that is not JSON is kept as a string).
    pub fn requests(&self) -> Vec<Value> {
        self.server.requests()
    }

    /// The headers of every request received so far, in order.
    pub fn request_headers(&self) -> Vec<HeaderMap> {
        self.server.request_headers()
    }

    /// Waits until at least `n` requests have arrived, then returns them all.
    pub async fn wait_requests(&self, n: usize) -> Vec<Value> {
        self.server.wait_requests(n).await
    }
}

#[cfg(test)]
#[path = "fake_anthropic_tests.rs"]
mod tests;

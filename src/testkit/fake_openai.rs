//! A scripted fake OpenAI-compatible upstream: a real hyper server on `127.0.0.1:0` that speaks
//! the chat-completions streaming wire format and records every request.
//!
//! ```no_run
//! # async fn demo() {
//! use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};
//! let fake = FakeOpenAi::start().await;
//! fake.push(Reply::text("Hello there").usage(12, 3));
//! // ... point the OpenAI provider at fake.base_url() and run a turn ...
//! let reqs = fake.wait_requests(1).await;
//! assert_eq!(reqs[0]["model"], "some-model");
//! # }
//! ```
//!
//! Each `POST /v1/chat/completions` takes the next queued [`Reply`] (FIFO); with none queued it
//! answers with the fallback reply if one is set ([`FakeOpenAi::set_fallback`], for benchmarks
//! that send thousands of identical requests), else HTTP 500
//! `{"error":{"message":"fake upstream: no scripted reply"}}` so a test fails loudly. A streamed reply is, in order: a role chunk (`{"role":"assistant","content":""}`), the
//! thinking deltas (`reasoning_content`), the text deltas (`content`), the tool-call deltas, a
//! finish chunk, a usage chunk with `"choices":[]` when the request asked
//! `stream_options.include_usage`, and `data: [DONE]`. Dropping the [`FakeOpenAi`] stops the server
//! and every connection.
//!
//! Built to be cheap enough to sit under a benchmark: `TCP_NODELAY` and keep-alive on every
//! connection, no logging, a reply with no pacing, hold or break is written straight from its
//! prepared events (no task per request), and recording can be switched off
//! ([`FakeOpenAi::record_requests`]).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::HeaderMap;
use serde_json::{json, Value};

use super::fake_upstream::{split_chars, Failure, Pace, Script, Server, Wire};
pub use super::fake_upstream::{Gate, SendLog};

/// One scripted answer to one chat-completions request. Build with [`Reply::text`],
/// [`Reply::tool_calls`] or [`Reply::status`], then refine with the builder methods.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Error reply, raw body, chunking, break / hold / pace, send log, headers.
    script: Script,
    thinking: String,
    text: String,
    tool_calls: Vec<(String, String, Value)>,
    finish: Option<String>,
    usage: (u64, u64),
    /// Report as prompt tokens the request's `messages` and `tools` JSON bytes over 4.
    count_prompt: bool,
    /// Another answer, for requests whose first message contains this text.
    instead: Option<(String, Box<Reply>)>,
    /// The answer, made from each request ([`Reply::by_request`]).
    by_request: Option<ByRequest>,
}

/// A function making a reply of a request (see [`Reply::by_request`]).
#[derive(Clone)]
struct ByRequest(std::sync::Arc<dyn Fn(&Value) -> Reply + Send + Sync>);

impl std::fmt::Debug for ByRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ByRequest(..)")
    }
}

impl Reply {
    fn empty() -> Reply {
        Reply {
            script: Script::default(),
            thinking: String::new(),
            text: String::new(),
            tool_calls: Vec::new(),
            finish: None,
            usage: (10, 5),
            count_prompt: false,
            instead: None,
            by_request: None,
        }
    }

    /// A text answer, streamed as `content` deltas of [`Reply::chunk_chars`] characters
    /// (default 4); finish reason `stop`.
    pub fn text(s: &str) -> Reply {
        Reply {
            text: s.to_string(),
            ..Reply::empty()
        }
    }

    /// Tool calls `(id, name, input)`; finish reason `tool_calls`. Each call opens with a chunk
    /// carrying its `index`, `id`, `type` and `function.name` (arguments `""`), then the
    /// arguments JSON follows in fragments of `chunk_chars` characters, the calls' fragments
    /// interleaved round-robin by index.
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

    /// Reasoning (`reasoning_content` deltas), streamed before the text.
    pub fn thinking(mut self, s: &str) -> Reply {
        self.thinking = s.to_string();
        self
    }

    /// Text streamed before the tool calls (or replacing the text of [`Reply::text`]).
    pub fn with_text(mut self, s: &str) -> Reply {
        self.text = s.to_string();
        self
    }

    /// Overrides the finish reason (`length`, `content_filter`, ...).
    pub fn finish(mut self, reason: &str) -> Reply {
        self.finish = Some(reason.to_string());
        self
    }

    /// Report as `prompt_tokens` the size of the request: the JSON bytes of its `messages` and
    /// `tools`, over 4 (a stand-in for a tokenizer, for tests of context windows).
    pub fn count_prompt(mut self) -> Reply {
        self.count_prompt = true;
        self
    }

    /// Answer with `other` (its text, tool calls and usage) a request whose first message (the
    /// system prompt, usually) contains `needle`: one reply for two kinds of calls, e.g. a
    /// fallback that answers both a turn's calls and a compaction's summary call.
    pub fn instead_when(mut self, needle: &str, other: Reply) -> Reply {
        self.instead = Some((needle.to_string(), Box::new(other)));
        self
    }

    /// An answer made by `make` from each request's body (its text, tool calls and usage; this
    /// reply's hold, break, pace and headers still apply): as a fallback, one model for many
    /// concurrent sessions whose answers depend on what each was asked (a chaos test's calls
    /// with ids of their own).
    pub fn by_request(make: impl Fn(&Value) -> Reply + Send + Sync + 'static) -> Reply {
        Reply {
            by_request: Some(ByRequest(std::sync::Arc::new(make))),
            ..Reply::empty()
        }
    }

    /// The usage of the final chunk (default 10 prompt / 5 completion tokens).
    pub fn usage(mut self, input: u64, output: u64) -> Reply {
        self.usage = (input, output);
        self
    }

    /// Characters per delta for text, thinking and tool arguments (0 counts as 1).
    pub fn chunk_chars(mut self, n: usize) -> Reply {
        self.script.chunk_chars = n.max(1);
        self
    }

    /// Sends only the first `n_chunks` SSE events (the role chunk counts; writes for [`Reply::raw`]), then breaks the
    /// connection: the chunked body is never terminated, no finish chunk, no `[DONE]`.
    pub fn break_after(mut self, n_chunks: usize) -> Reply {
        self.script.break_after = Some(n_chunks);
        self
    }

    /// Sends every delta, then waits for `gate` before the finish chunk, usage and `[DONE]`:
    /// keeps a turn running, with its output visible, until the test opens the gate.
    pub fn hold(self, gate: Gate) -> Reply {
        self.hold_after(usize::MAX, gate)
    }

    /// Sends the first `n_chunks` SSE events (the role chunk counts), then waits for `gate`
    /// before sending the rest. `usize::MAX` holds before the finish chunk, like [`Reply::hold`].
    pub fn hold_after(mut self, n_chunks: usize, gate: Gate) -> Reply {
        self.script.hold = Some((n_chunks, gate));
        self
    }

    /// Sends the SSE events `every` apart (benchmarks): event `i` is due `i * every` after the
    /// first. The schedule is absolute, so timer granularity delays an event without pushing
    /// back the ones after it.
    pub fn pace(mut self, every: Duration) -> Reply {
        self.script.pace = Some(Pace::Schedule(every));
        self
    }

    /// Records in `log` the instant each SSE event is handed to the connection (after its
    /// pacing wait). A fallback reply shares one log across requests.
    pub fn log_sends(mut self, log: SendLog) -> Reply {
        self.script.send_log = Some(log);
        self
    }

    /// Sets a response header (e.g. `Retry-After` on a [`Reply::status`] reply; `Content-Type`
    /// replaces the default).
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.script
            .headers
            .push((name.to_string(), value.to_string()));
        self
    }

    /// The SSE events of a streamed reply, split into the deltas part and the ending part
    /// (finish chunk, usage chunk, `[DONE]`).
    ///
    /// The chunk envelope is written as text around each `choices` (the bytes are those of the
    /// equivalent `json!` object): building a JSON map per chunk cost more than the rest of a
    /// request, and benchmarks run this thousands of times.
    fn events(&self, id: &str, model: &Value, include_usage: bool) -> (Vec<Bytes>, Vec<Bytes>) {
        let created = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let envelope = format!(
            "data: {{\"id\":{},\"object\":\"chat.completion.chunk\",\"created\":{created},\"model\":{model},\"system_fingerprint\":\"fp_fake\",\"choices\":",
            Value::from(id)
        );
        let chunk = |choices: &str, usage: Option<Value>| -> Bytes {
            let mut out = String::with_capacity(envelope.len() + choices.len() + 64);
            out.push_str(&envelope);
            out.push_str(choices);
            if let Some(u) = usage {
                out.push_str(",\"usage\":");
                out.push_str(&u.to_string());
            }
            out.push_str("}\n\n");
            Bytes::from(out)
        };
        let delta = |d: &str| -> Bytes {
            chunk(
                &format!(
                    "[{{\"index\":0,\"delta\":{d},\"logprobs\":null,\"finish_reason\":null}}]"
                ),
                None,
            )
        };
        let piece = |key: &str, text: &str| format!("{{\"{key}\":{}}}", Value::from(text));

        let mut deltas = vec![delta(r#"{"role":"assistant","content":"","refusal":null}"#)];
        for p in split_chars(&self.thinking, self.script.chunk_chars) {
            deltas.push(delta(&piece("reasoning_content", &p)));
        }
        for p in split_chars(&self.text, self.script.chunk_chars) {
            deltas.push(delta(&piece("content", &p)));
        }
        let mut fragments: Vec<VecDeque<String>> = Vec::new();
        for (i, (id, name, _)) in self.tool_calls.iter().enumerate() {
            deltas.push(delta(
                &json!({"tool_calls": [{
                    "index": i,
                    "id": id,
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }]})
                .to_string(),
            ));
            let args = self.tool_calls[i].2.to_string();
            fragments.push(split_chars(&args, self.script.chunk_chars).into());
        }
        // Round-robin over the calls until every call's arguments are out.
        while fragments.iter().any(|f| !f.is_empty()) {
            for (i, f) in fragments.iter_mut().enumerate() {
                if let Some(piece) = f.pop_front() {
                    deltas.push(delta(
                        &json!({"tool_calls": [{
                            "index": i,
                            "function": {"arguments": piece},
                        }]})
                        .to_string(),
                    ));
                }
            }
        }

        let finish = self.finish.clone().unwrap_or_else(|| {
            if self.tool_calls.is_empty() {
                "stop".to_string()
            } else {
                "tool_calls".to_string()
            }
        });
        let mut ending = vec![chunk(
            &format!(
                "[{{\"index\":0,\"delta\":{{}},\"logprobs\":null,\"finish_reason\":{}}}]",
                Value::from(finish)
            ),
            None,
        )];
        if include_usage {
            let (input, output) = self.usage;
            ending.push(chunk(
                "[]",
                Some(json!({
                    "prompt_tokens": input,
                    "completion_tokens": output,
                    "total_tokens": input + output,
                })),
            ));
        }
        ending.push(Bytes::from_static(b"data: [DONE]\n\n"));
        (deltas, ending)
    }
}

/// The chat-completions wire format, for the shared [`Server`].
struct OpenAiWire;

impl Wire for OpenAiWire {
    type Reply = Reply;
    const ROUTE: &'static str = "/v1/chat/completions";
    const CONTENT_TYPE: &'static str = "text/event-stream";

    fn failure_body(failure: Failure, message: &str) -> Value {
        match failure {
            Failure::Unreadable => json!({"error": {"message": message}}),
            Failure::NoRoute | Failure::NotJson | Failure::Invalid => {
                json!({"error": {"message": message, "type": "invalid_request_error"}})
            }
            Failure::NoReply => json!({"error": {"message": message, "type": "server_error"}}),
        }
    }

    fn script(reply: &Reply) -> &Script {
        &reply.script
    }

    fn validate(request: &Value) -> Result<(), String> {
        check_request(request)
    }

    fn events(reply: &Reply, request: &Value, n: u64) -> (Vec<Bytes>, Vec<Bytes>) {
        let model = request.get("model").cloned().unwrap_or(Value::Null);
        let include_usage = request
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let id = format!("chatcmpl-fake{n:06}");
        if let Some(make) = &reply.by_request {
            return Self::events(&(make.0)(request), request, n);
        }
        if let Some((needle, other)) = &reply.instead {
            let first = request.pointer("/messages/0/content");
            if first.is_some_and(|c| c.to_string().contains(needle.as_str())) {
                return Self::events(other, request, n);
            }
        }
        if reply.count_prompt {
            let size = |k: &str| request.get(k).map_or(0, |v| v.to_string().len()) as u64;
            let mut counted = reply.clone();
            counted.usage.0 = (size("messages") + size("tools")) / 4;
            return counted.events(&id, &model, include_usage);
        }
        reply.events(&id, &model, include_usage)
    }
}

/// What an OpenAI-compatible upstream refuses with a 400 (and the fake does too): an assistant
/// message's `tool_calls` not each answered by a `tool` message right after it (before any
/// other message), or a `tool` message that answers no call. `Err` says what is wrong.
pub fn check_request(req: &Value) -> Result<(), String> {
    let empty = Vec::new();
    let messages = req["messages"].as_array().unwrap_or(&empty);
    // Calls of the last assistant message not answered yet.
    let mut open: Vec<String> = Vec::new();
    for (j, m) in messages.iter().enumerate() {
        match m["role"].as_str() {
            Some("tool") => {
                let id = m["tool_call_id"].as_str().unwrap_or_default();
                match open.iter().position(|c| c == id) {
                    Some(pos) => {
                        open.remove(pos);
                    }
                    None => {
                        return Err(format!(
                            "messages.[{j}]: a tool message for {id:?}, which answers no open call"
                        ))
                    }
                }
            }
            _ if !open.is_empty() => {
                return Err(format!(
                    "messages.[{j}] ({}) comes before the answers to calls {open:?}",
                    m["role"]
                ))
            }
            Some("assistant") => {
                for c in m["tool_calls"].as_array().unwrap_or(&empty) {
                    open.push(c["id"].as_str().unwrap_or_default().to_string());
                }
            }
            _ => {}
        }
    }
    if open.is_empty() {
        Ok(())
    } else {
        Err(format!("calls {open:?} are sent without their answers"))
    }
}

/// The fake server. See the module documentation.
pub struct FakeOpenAi {
    server: Server<OpenAiWire>,
}

impl FakeOpenAi {
    /// Binds `127.0.0.1:0` and starts serving.
    pub async fn start() -> FakeOpenAi {
        FakeOpenAi {
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

    /// Queues a reply; replies are served FIFO, one per `POST /v1/chat/completions`.
    pub fn push(&self, reply: Reply) {
        self.server.push(reply);
    }

    /// Serves `reply` to every request that finds the queue empty (queued replies still go
    /// first): thousands of identical requests need no pushing.
    pub fn set_fallback(&self, reply: Reply) {
        self.server.set_fallback(Some(reply));
    }

    /// Removes the fallback reply: an empty queue answers 500 again.
    pub fn clear_fallback(&self) {
        self.server.set_fallback(None);
    }

    /// Whether request bodies and headers are kept for [`FakeOpenAi::requests`] (default
    /// `true`). A benchmark switches it off so that memory does not grow with every request;
    /// [`FakeOpenAi::request_count`] still counts them.
    pub fn record_requests(&self, on: bool) {
        self.server.record_requests(on);
    }

    /// How many chat-completions requests have arrived, recorded or not.
    pub fn request_count(&self) -> u64 {
        self.server.request_count()
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
#[path = "fake_openai_tests.rs"]
mod tests;

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

use super::server::{split_chars, Failure, Pace, Script, Server, Wire};
pub use super::server::{Gate, SendLog};

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
mod tests {
    use super::*;
    use http::Request;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    use std::sync::Arc;

    type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

    fn client() -> TestClient {
        Client::builder(TokioExecutor::new()).build_http()
    }

    async fn post(fake: &FakeOpenAi, body: Value) -> (u16, HeaderMap, Result<String, String>) {
        let req = Request::post(format!("{}/chat/completions", fake.base_url()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let resp = client().request(req).await.unwrap();
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8(b.to_bytes().to_vec()).unwrap())
            .map_err(|e| e.to_string());
        (status, headers, body)
    }

    /// The JSON of every `data:` event but `[DONE]`, and whether `[DONE]` came last.
    fn chunks(body: &str) -> (Vec<Value>, bool) {
        let events: Vec<&str> = body
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").expect("data: line"))
            .collect();
        let done = events.last() == Some(&"[DONE]");
        let json = events
            .iter()
            .filter(|e| **e != "[DONE]")
            .map(|e| serde_json::from_str(e).unwrap())
            .collect();
        (json, done)
    }

    fn req(include_usage: bool) -> Value {
        json!({"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": true,
               "stream_options": {"include_usage": include_usage}})
    }

    #[tokio::test]
    async fn text_reply_has_the_openai_chunk_shape() {
        let fake = FakeOpenAi::start().await;
        fake.push(Reply::text("Hello, world").usage(7, 3));
        let (status, headers, body) = post(&fake, req(true)).await;
        assert_eq!(status, 200);
        assert_eq!(headers["content-type"], "text/event-stream");
        let (chunks, done) = chunks(&body.unwrap());
        assert!(done);
        for c in &chunks {
            assert_eq!(c["object"], "chat.completion.chunk");
            assert_eq!(c["model"], "m1");
            assert!(c["id"].as_str().unwrap().starts_with("chatcmpl-"));
            assert!(c["created"].is_u64());
        }
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect();
        assert_eq!(text, "Hello, world");
        // 12 chars in pieces of 4, after the role chunk.
        assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "Hell");
        let n = chunks.len();
        assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[n - 1]["choices"], json!([]));
        assert_eq!(chunks[n - 1]["usage"]["prompt_tokens"], 7);
        assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 3);
        assert_eq!(fake.requests(), vec![req(true)]);
    }

    #[tokio::test]
    async fn no_usage_chunk_unless_asked() {
        let fake = FakeOpenAi::start().await;
        fake.push(Reply::text("x"));
        let (_, _, body) = post(&fake, req(false)).await;
        let (chunks, done) = chunks(&body.unwrap());
        assert!(done);
        assert!(chunks.iter().all(|c| c.get("usage").is_none()));
        assert_eq!(
            chunks.last().unwrap()["choices"][0]["finish_reason"],
            "stop"
        );
    }

    #[tokio::test]
    async fn tool_calls_are_interleaved_by_index() {
        let fake = FakeOpenAi::start().await;
        fake.push(
            Reply::tool_calls(&[
                ("call_a", "get_weather", json!({"city": "Tokyo"})),
                ("call_b", "get_time", json!({"tz": "Asia/Tokyo"})),
            ])
            .with_text("Checking.")
            .thinking("hm"),
        );
        let (_, _, body) = post(&fake, req(true)).await;
        let (chunks, _) = chunks(&body.unwrap());
        let deltas: Vec<&Value> = chunks
            .iter()
            .filter_map(|c| c["choices"].get(0).map(|ch| &ch["delta"]))
            .collect();
        let indices: Vec<u64> = deltas
            .iter()
            .filter_map(|d| d["tool_calls"][0]["index"].as_u64())
            .collect();
        assert!(
            indices.windows(2).any(|w| w[0] > w[1]),
            "interleaved: {indices:?}"
        );
        let mut args = [String::new(), String::new()];
        for d in &deltas {
            if let Some(tc) = d["tool_calls"].get(0) {
                let i = tc["index"].as_u64().unwrap() as usize;
                args[i].push_str(tc["function"]["arguments"].as_str().unwrap());
            }
        }
        assert_eq!(
            serde_json::from_str::<Value>(&args[0]).unwrap(),
            json!({"city": "Tokyo"})
        );
        assert_eq!(
            serde_json::from_str::<Value>(&args[1]).unwrap(),
            json!({"tz": "Asia/Tokyo"})
        );
        // Thinking, then text, then tools; finish reason tool_calls.
        let first_text = deltas.iter().position(|d| d["content"] == "Chec").unwrap();
        let first_think = deltas
            .iter()
            .position(|d| d["reasoning_content"] == "hm")
            .unwrap();
        let first_tool = deltas
            .iter()
            .position(|d| d.get("tool_calls").is_some())
            .unwrap();
        assert!(first_think < first_text && first_text < first_tool);
        assert_eq!(deltas.last().unwrap(), &&json!({}));
        let finish = chunks
            .iter()
            .rev()
            .find_map(|c| c["choices"][0]["finish_reason"].as_str());
        assert_eq!(finish, Some("tool_calls"));
    }

    #[tokio::test]
    async fn status_reply_with_header_and_empty_queue() {
        let fake = FakeOpenAi::start().await;
        fake.push(
            Reply::status(429, json!({"error": {"message": "slow down"}}))
                .header("Retry-After", "3"),
        );
        let (status, headers, body) = post(&fake, req(true)).await;
        assert_eq!(status, 429);
        assert_eq!(headers["retry-after"], "3");
        assert_eq!(
            serde_json::from_str::<Value>(&body.unwrap()).unwrap()["error"]["message"],
            "slow down"
        );
        let (status, _, body) = post(&fake, req(true)).await;
        assert_eq!(status, 500);
        assert!(body.unwrap().contains("fake upstream: no scripted reply"));
        assert_eq!(fake.wait_requests(2).await.len(), 2);
    }

    #[tokio::test]
    async fn a_call_without_its_answer_is_refused_as_the_real_api_does() {
        let fake = FakeOpenAi::start().await;
        fake.push(Reply::text("kept for the next request"));
        let call = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        let user = json!({"role": "user", "content": "go on"});
        let answer = json!({"role": "tool", "tool_call_id": "call_1", "content": "ok"});
        for (messages, wrong) in [
            (
                json!([user, call, user]),
                "comes before the answers to calls [\"call_1\"]",
            ),
            (json!([user, call]), "sent without their answers"),
            (json!([user, answer]), "answers no open call"),
        ] {
            let (status, _, body) = post(&fake, json!({"model": "m", "messages": messages})).await;
            assert_eq!(status, 400, "{messages}");
            let body: Value = serde_json::from_str(&body.unwrap()).unwrap();
            assert_eq!(body["error"]["type"], "invalid_request_error");
            let message = body["error"]["message"].as_str().unwrap();
            assert!(message.contains(wrong), "{message}");
        }
        assert_eq!(
            fake.pending_replies(),
            1,
            "a refused request takes no reply"
        );
        let ok = json!({"model": "m", "stream": true, "messages": [user, call, answer, user]});
        assert_eq!(post(&fake, ok).await.0, 200);
    }

    #[tokio::test]
    async fn break_after_ends_the_body_with_an_error() {
        let fake = FakeOpenAi::start().await;
        fake.push(Reply::text("abcdefgh").break_after(2));
        let (status, _, body) = post(&fake, req(true)).await;
        assert_eq!(status, 200);
        assert!(body.is_err(), "the client must see a broken body");
    }

    #[tokio::test]
    async fn hold_waits_for_the_gate_and_wait_requests_is_notified() {
        let fake = Arc::new(FakeOpenAi::start().await);
        let gate = Gate::new();
        fake.push(Reply::text("held").hold(gate.clone()));
        let f = fake.clone();
        let waiter = tokio::spawn(async move { f.wait_requests(1).await });
        let f = fake.clone();
        let call = tokio::spawn(async move { post(&f, req(true)).await });
        let seen = waiter.await.unwrap();
        assert_eq!(seen[0]["model"], "m1");
        assert!(!call.is_finished());
        gate.open();
        let (_, _, body) = call.await.unwrap();
        assert!(chunks(&body.unwrap()).1);
    }

    #[tokio::test]
    async fn gate_opened_before_waiting_stays_open() {
        let gate = Gate::new();
        gate.open();
        gate.wait().await;
        gate.clone().wait().await;
        assert!(gate.is_open());
    }

    #[tokio::test]
    async fn fallback_serves_an_empty_queue_after_the_queued_replies() {
        let fake = FakeOpenAi::start().await;
        fake.set_fallback(Reply::text("again").chunk_chars(16));
        fake.push(Reply::text("first"));
        let text = |body: String| -> String {
            chunks(&body)
                .0
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                .collect()
        };
        let (status, _, body) = post(&fake, req(false)).await;
        assert_eq!(status, 200);
        assert_eq!(text(body.unwrap()), "first");
        for _ in 0..3 {
            let (status, _, body) = post(&fake, req(true)).await;
            assert_eq!(status, 200);
            let body = body.unwrap();
            assert!(chunks(&body).1, "ends with [DONE]");
            assert_eq!(text(body), "again");
        }
        assert_eq!(fake.pending_replies(), 0);
        fake.clear_fallback();
        let (status, _, _) = post(&fake, req(true)).await;
        assert_eq!(status, 500);
        assert_eq!(fake.request_count(), 5);
    }

    #[tokio::test]
    async fn recording_can_be_switched_off_and_connections_are_reused() {
        let fake = FakeOpenAi::start().await;
        fake.set_fallback(Reply::text("x"));
        fake.record_requests(false);
        let client = client();
        for _ in 0..5 {
            let req = Request::post(format!("{}/chat/completions", fake.base_url()))
                .body(Full::new(Bytes::from(req(true).to_string())))
                .unwrap();
            let resp = client.request(req).await.unwrap();
            assert_eq!(resp.status(), 200);
            resp.into_body().collect().await.unwrap();
        }
        assert_eq!(fake.request_count(), 5);
        assert!(fake.requests().is_empty(), "nothing recorded");
        assert_eq!(fake.connections(), 1, "keep-alive: one connection");
        fake.record_requests(true);
        post(&fake, req(true)).await.2.unwrap();
        assert_eq!(fake.requests(), vec![req(true)]);
    }

    #[tokio::test]
    async fn send_log_records_every_event_in_order() {
        let fake = FakeOpenAi::start().await;
        let log = SendLog::new();
        fake.set_fallback(
            Reply::text("abcdef")
                .chunk_chars(2)
                .pace(Duration::from_millis(2))
                .log_sends(log.clone()),
        );
        let before = std::time::Instant::now();
        let (_, _, body) = post(&fake, req(true)).await;
        let after = std::time::Instant::now();
        // role + 3 deltas + finish + usage + [DONE]
        assert_eq!(chunks(&body.unwrap()).0.len(), 6);
        let times = log.take();
        assert_eq!(times.len(), 7);
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        assert!(before <= times[0] && times[6] <= after);
        // Paced 2 ms apart from the first event.
        assert!(times[6] - times[0] >= Duration::from_millis(12));
        assert!(log.take().is_empty(), "take clears the log");
        // Unpaced replies are logged too.
        fake.set_fallback(Reply::text("xy").log_sends(log.clone()));
        post(&fake, req(false)).await.2.unwrap();
        assert_eq!(log.take().len(), 4);
    }

    #[tokio::test]
    async fn paced_events_keep_their_schedule() {
        let fake = FakeOpenAi::start().await;
        // 1 role chunk + 10 deltas + finish + [DONE] = 13 events, 12 gaps of 5 ms.
        fake.push(
            Reply::text("abcdefghij")
                .chunk_chars(1)
                .pace(Duration::from_millis(5)),
        );
        let started = std::time::Instant::now();
        let (_, _, body) = post(&fake, req(false)).await;
        let elapsed = started.elapsed();
        assert_eq!(chunks(&body.unwrap()).0.len(), 12);
        assert!(elapsed >= Duration::from_millis(60), "{elapsed:?}");
        // Loose: tests run in parallel on busy machines.
        assert!(elapsed < Duration::from_millis(60 + 150), "{elapsed:?}");
    }

    #[test]
    fn chunks_are_the_bytes_of_their_json_objects() {
        let reply = Reply::tool_calls(&[("call_1", "f", json!({"q": "é\"x"}))])
            .with_text("a\"b\\c\n")
            .thinking("hm")
            .chunk_chars(2);
        let (deltas, ending) = reply.events("chatcmpl-x1", &json!("m1"), true);
        let n = deltas.len() + ending.len();
        for (i, ev) in deltas.iter().chain(&ending).enumerate() {
            let text = std::str::from_utf8(ev).unwrap();
            let data = text
                .strip_prefix("data: ")
                .and_then(|t| t.strip_suffix("\n\n"))
                .expect("one data line");
            if i == n - 1 {
                assert_eq!(data, "[DONE]");
                continue;
            }
            // Re-serializing the parsed object (key order kept) gives the same bytes.
            let v: serde_json::Map<String, Value> = serde_json::from_str(data).unwrap();
            assert_eq!(Value::Object(v.clone()).to_string(), data);
            let keys: Vec<&str> = v.keys().map(String::as_str).collect();
            let mut want = vec![
                "id",
                "object",
                "created",
                "model",
                "system_fingerprint",
                "choices",
            ];
            if i == n - 2 {
                want.push("usage");
            }
            assert_eq!(keys, want, "{data}");
            assert_eq!(v["id"], "chatcmpl-x1");
            assert_eq!(v["model"], "m1");
        }
        let text: String = deltas
            .iter()
            .map(|b| std::str::from_utf8(b).unwrap())
            .filter_map(|t| {
                let v: Value = serde_json::from_str(t.strip_prefix("data: ")?.trim()).ok()?;
                v["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_string)
            })
            .collect();
        assert_eq!(text, "a\"b\\c\n");
    }

    #[test]
    fn split_chars_respects_utf8() {
        assert_eq!(split_chars("héllo世界", 3), vec!["hél", "lo世", "界"]);
        assert_eq!(split_chars("", 4), Vec::<String>::new());
    }
}

//! The OpenAI-compatible provider: `POST {base_url}/chat/completions` with `stream: true`.
//!
//! Works with OpenAI and the servers that copy its API (Ollama, vLLM, llama.cpp, LM Studio,
//! OpenRouter, ...). The response is read frame by frame through the shared
//! [`SseParser`](crate::outbound::event_stream::SseParser) (the HTTP side is in [`transport`](super::transport)); text and
//! reasoning fragments go to the [`DeltaSink`] as soon as their chunk is parsed.
//!
//! Mapping of the history ([`Message`]) to the wire:
//! - `req.system` first as a `system` message (a `System` message in the history is sent as is);
//! - user: a plain string, or (when the blocks hold an image) content parts `text` / `image_url`;
//!   text-only block lists are sent as their text joined with `\n` (every server takes strings);
//! - assistant: `content` = its text blocks joined with `\n` (`null` when empty and it has tool
//!   calls, `""` otherwise), `tool_calls` for its `tool_use` blocks (omitted when none); thinking
//!   and image blocks are not sent;
//! - tool: `{"role":"tool","tool_call_id","content": text}` (non-text blocks dropped).
//!
//! `ModelRequest::thinking` is not sent: chat completions has no portable switch for it; servers
//! that reason return `reasoning_content` (or `reasoning`), which is always read.
//!
//! Choices where upstreams differ or the wire is loose:
//! - `finish_reason` `stop` (or none, or unknown) with tool calls in the output is reported as
//!   [`ModelStop::ToolUse`] (some servers, older Ollama among them, say `stop` there);
//! - with `finish_reason: length`, a tool call whose arguments do not parse (cut by the limit) is
//!   dropped and the stop is [`ModelStop::MaxTokens`], not a protocol error;
//! - an `{"error": ...}` object inside the stream becomes `Status(code)` when the error carries a
//!   numeric `code`/`status` in 400..=599, else `Status(500)`: retryable as that status is;
//! - a stream that ends (cleanly) without `[DONE]` but after a `finish_reason` is accepted;
//! - a `2xx` answer with `Content-Type: application/json` (a server that ignored `stream`) is read
//!   as a whole completion;
//! - an invalid base URL or API key (not a valid header value) is a non-retryable `Connect` error.

use std::collections::BTreeMap;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http::header::AUTHORIZATION;
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{json, Map, Value};

#[cfg(test)]
use super::errors::parse_retry_after;
use super::transport::{
    body_message, call_id, error_text, parse_event, preview, protocol, tool_input, Accumulate,
    Collected, Endpoint,
};
use super::{
    DeltaSink, ModelOutput, ModelRequest, ModelStop, Provider, UpstreamError, UpstreamErrorKind,
};
use crate::message::{Block, Content, Message, ToolCall, Usage};

/// The most tool calls one answer may carry.
const MAX_TOOL_CALLS: usize = 1024;

/// An OpenAI-compatible chat-completions upstream.
pub struct OpenAi {
    /// `{base_url}/chat/completions`, with the key as `Authorization: Bearer <key>`.
    endpoint: Endpoint,
}

impl OpenAi {
    /// `base_url` without a trailing slash, e.g. `http://127.0.0.1:11434/v1`. An empty key is no
    /// key. `timeout` bounds each whole call, from connecting to the last byte.
    pub fn new(base_url: String, api_key: Option<String>, timeout: Duration) -> OpenAi {
        OpenAi {
            endpoint: Endpoint::new(
                base_url,
                "/chat/completions",
                AUTHORIZATION,
                "Bearer ",
                api_key,
                timeout,
            ),
        }
    }

    /// Sends these headers on every request too (`[upstream] headers`, expanded).
    pub fn with_headers(mut self, headers: Vec<(http::HeaderName, http::HeaderValue)>) -> Self {
        self.endpoint.set_headers(headers);
        self
    }

    /// The base URL this provider talks to.
    pub fn base_url(&self) -> &str {
        self.endpoint.base_url()
    }
}

impl Provider for OpenAi {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn complete<'a>(
        &'a self,
        req: &'a ModelRequest,
        sink: &'a mut dyn DeltaSink,
    ) -> BoxFuture<'a, Result<ModelOutput, UpstreamError>> {
        Box::pin(async move {
            let body = RequestBody::new(req);
            self.endpoint
                .call::<Acc>(&body, &[], error_message, sink)
                .await
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Request

/// The body of a chat-completions request, serialized straight from the request it borrows
/// (tool schemas are written out, never copied into a `Value` first: they are most of a body).
#[derive(serde::Serialize)]
pub(crate) struct RequestBody<'a> {
    model: &'a str,
    messages: WireMessages<'a>,
    stream: bool,
    stream_options: StreamOptions,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tools: Vec<WireTool<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    stop: &'a [String],
}

#[derive(serde::Serialize)]
struct StreamOptions {
    include_usage: bool,
}

#[derive(serde::Serialize)]
struct WireTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: ToolFunction<'a>,
}

#[derive(serde::Serialize)]
struct ToolFunction<'a> {
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
}

impl<'a> RequestBody<'a> {
    pub(crate) fn new(req: &'a ModelRequest) -> RequestBody<'a> {
        RequestBody {
            model: &req.model,
            messages: WireMessages {
                system: req.system.as_deref(),
                messages: &req.messages,
            },
            stream: true,
            stream_options: StreamOptions {
                include_usage: true,
            },
            tools: req
                .tools
                .iter()
                .map(|t| WireTool {
                    kind: "function",
                    function: ToolFunction {
                        name: &t.name,
                        description: &t.description,
                        parameters: &t.parameters,
                    },
                })
                .collect(),
            max_tokens: req.max_tokens,
            temperature: req.tuning.temperature,
            stop: &req.tuning.stop,
        }
    }
}

/// The conversation in the chat-completions shape (the system prompt first), written straight
/// from our messages: no JSON tree is built on the way.
struct WireMessages<'a> {
    system: Option<&'a str>,
    messages: &'a [Message],
}

impl Serialize for WireMessages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.messages.len() + 1))?;
        if let Some(system) = self.system {
            seq.serialize_element(&WireMessage::System(system))?;
        }
        for m in self.messages {
            seq.serialize_element(&WireMessage::Ours(m))?;
        }
        seq.end()
    }
}

enum WireMessage<'a> {
    System(&'a str),
    Ours(&'a Message),
}

impl Serialize for WireMessage<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(None)?;
        match self {
            WireMessage::System(content) => {
                map.serialize_entry("role", "system")?;
                map.serialize_entry("content", content)?;
            }
            WireMessage::Ours(Message::System { content }) => {
                map.serialize_entry("role", "system")?;
                map.serialize_entry("content", content)?;
            }
            WireMessage::Ours(Message::User { content }) => {
                map.serialize_entry("role", "user")?;
                map.serialize_entry("content", &UserContent(content))?;
            }
            WireMessage::Ours(Message::Assistant { content }) => {
                map.serialize_entry("role", "assistant")?;
                let text = content.text_ref();
                let calls = ToolCalls(content);
                if text.is_empty() && calls.any() {
                    map.serialize_entry("content", &())?;
                } else {
                    map.serialize_entry("content", &*text)?;
                }
                if calls.any() {
                    map.serialize_entry("tool_calls", &calls)?;
                }
            }
            WireMessage::Ours(Message::Tool {
                tool_call_id,
                content,
            }) => {
                map.serialize_entry("role", "tool")?;
                map.serialize_entry("tool_call_id", tool_call_id)?;
                map.serialize_entry("content", &*content.text_ref())?;
            }
        }
        map.end()
    }
}

/// A user message's content: a string, or parts when it carries an image.
struct UserContent<'a>(&'a Content);

impl Serialize for UserContent<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let blocks = match self.0 {
            Content::Blocks(blocks) if blocks.iter().any(|b| matches!(b, Block::Image { .. })) => {
                blocks
            }
            other => return s.serialize_str(&other.text_ref()),
        };
        let mut seq = s.serialize_seq(None)?;
        for b in blocks {
            match b {
                Block::Text { text } => {
                    seq.serialize_element(&json!({"type": "text", "text": text}))?
                }
                Block::Image { url } => {
                    seq.serialize_element(&json!({"type": "image_url", "image_url": {"url": url}}))?
                }
                _ => {}
            }
        }
        seq.end()
    }
}

/// An assistant message's tool uses, as `tool_calls`.
struct ToolCalls<'a>(&'a Content);

impl ToolCalls<'_> {
    fn uses(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        let blocks: &[Block] = match self.0 {
            Content::Blocks(blocks) => blocks,
            Content::Text(_) => &[],
        };
        blocks.iter().filter_map(|b| match b {
            Block::ToolUse {
                tool_call_id,
                name,
                input,
            } => Some((tool_call_id.as_str(), name.as_str(), input)),
            _ => None,
        })
    }

    fn any(&self) -> bool {
        self.uses().next().is_some()
    }
}

impl Serialize for ToolCalls<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Call<'a> {
            id: &'a str,
            #[serde(rename = "type")]
            kind: &'static str,
            function: Function<'a>,
        }
        #[derive(Serialize)]
        struct Function<'a> {
            name: &'a str,
            /// The input as JSON text, as the API wants it.
            arguments: String,
        }
        s.collect_seq(self.uses().map(|(id, name, input)| Call {
            id,
            kind: "function",
            function: Function {
                name,
                arguments: input.to_string(),
            },
        }))
    }
}

// ---------------------------------------------------------------------------------------------
// Response

#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    choices: Option<Vec<WireChoice>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct WireChoice {
    /// Streaming.
    #[serde(default)]
    delta: Option<WireDelta>,
    /// A whole (non-streamed) completion.
    #[serde(default)]
    message: Option<WireDelta>,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct WireDelta {
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_calls: Option<Vec<WireToolCall>>,
}

#[derive(Deserialize)]
struct WireToolCall {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    function: Option<WireFunction>,
}

#[derive(Deserialize)]
struct WireFunction {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
}

#[derive(Default)]
struct ToolAcc {
    id: String,
    name: String,
    arguments: String,
}

/// The output accumulated from the chunks seen so far.
#[derive(Default)]
struct Acc {
    /// Text, thinking, usage and the answer's size.
    out: Collected,
    tools: BTreeMap<u64, ToolAcc>,
    /// The index the last tool-call fragment went to (for servers that omit `index`).
    last_tool: Option<u64>,
    finish: Option<String>,
}

impl Acc {
    fn chunk(&mut self, chunk: WireChunk, sink: &mut dyn DeltaSink) -> Result<(), UpstreamError> {
        if let Some(err) = chunk.error {
            return Err(stream_error(&err));
        }
        if let Some(u) = chunk.usage {
            self.out.usage = Usage {
                input_tokens: u.prompt_tokens.unwrap_or(0),
                output_tokens: u.completion_tokens.unwrap_or(0),
            };
        }
        let Some(choice) = chunk.choices.and_then(|c| c.into_iter().next()) else {
            return Ok(());
        };
        if let Some(reason) = choice.finish_reason {
            self.finish = Some(reason);
        }
        let Some(delta) = choice.delta.or(choice.message) else {
            return Ok(());
        };
        let reasoning = match delta.reasoning_content {
            Some(r) if !r.is_empty() => Some(r),
            _ => delta.reasoning,
        };
        if let Some(r) = reasoning {
            self.out.thinking(&r, sink)?;
        }
        if let Some(t) = delta.content {
            self.out.text(&t, sink)?;
        }
        for call in delta.tool_calls.unwrap_or_default() {
            self.tool_fragment(call)?;
        }
        Ok(())
    }

    fn tool_fragment(&mut self, call: WireToolCall) -> Result<(), UpstreamError> {
        let id = call.id.filter(|s| !s.is_empty());
        let index = match call.index {
            Some(i) => i,
            // No index: a new id starts a new call, anything else continues the last one.
            None => match (&id, self.last_tool) {
                (Some(id), _) if !self.tools.values().any(|t| &t.id == id) => {
                    self.tools.keys().next_back().map_or(0, |k| k + 1)
                }
                (Some(id), _) => self
                    .tools
                    .iter()
                    .find(|(_, t)| &t.id == id)
                    .map_or(0, |(k, _)| *k),
                (None, Some(last)) => last,
                (None, None) => 0,
            },
        };
        if !self.tools.contains_key(&index) && self.tools.len() >= MAX_TOOL_CALLS {
            return Err(protocol(format!(
                "the upstream sent more than {MAX_TOOL_CALLS} tool calls"
            )));
        }
        self.last_tool = Some(index);
        let (name, arguments) = match call.function {
            Some(f) => (f.name.filter(|s| !s.is_empty()), f.arguments),
            None => (None, None),
        };
        let added = id.as_ref().map_or(0, String::len)
            + name.as_ref().map_or(0, String::len)
            + arguments.as_ref().map_or(0, String::len);
        self.out.grow(added)?;
        let acc = self.tools.entry(index).or_default();
        // `id` and `name` come once, in a call's first fragment; a server that repeats them in
        // later fragments must not have them doubled.
        if let Some(id) = id {
            if acc.id.is_empty() {
                acc.id = id;
            }
        }
        if let Some(name) = name {
            if acc.name.is_empty() {
                acc.name = name;
            }
        }
        if let Some(a) = arguments {
            acc.arguments.push_str(&a);
        }
        Ok(())
    }
}

impl Accumulate for Acc {
    type Whole = WireChunk;
    const UNFINISHED: &'static str =
        "the upstream stream ended before it finished (no finish_reason, no [DONE])";

    fn event(&mut self, data: &str, sink: &mut dyn DeltaSink) -> Result<bool, UpstreamError> {
        if data.trim() == "[DONE]" {
            return Ok(true);
        }
        if let Some(chunk) = parse_event(data, "chunk")? {
            self.chunk(chunk, sink)?;
        }
        Ok(false)
    }

    fn stopped(&self) -> bool {
        self.finish.is_some()
    }

    fn finish(self) -> Result<ModelOutput, UpstreamError> {
        let has_tools = !self.tools.is_empty();
        let stop = match self.finish.as_deref() {
            Some("length") => ModelStop::MaxTokens,
            Some("content_filter") => ModelStop::Refusal,
            Some("tool_calls") | Some("function_call") => ModelStop::ToolUse,
            _ if has_tools => ModelStop::ToolUse,
            _ => ModelStop::EndTurn,
        };
        let mut tool_calls = Vec::with_capacity(self.tools.len());
        for (index, t) in self.tools {
            let input = tool_input(&t.arguments, Value::Object(Map::new()), stop).map_err(|e| {
                protocol(format!(
                    "the upstream sent invalid JSON arguments for tool {:?} ({e})",
                    t.name
                ))
                .with_detail(preview(t.arguments.as_bytes()))
            })?;
            let Some(input) = input else {
                continue;
            };
            if t.name.is_empty() {
                if stop == ModelStop::MaxTokens {
                    continue;
                }
                return Err(protocol(format!(
                    "the upstream sent tool call #{index} without a name"
                )));
            }
            tool_calls.push(ToolCall {
                id: call_id(t.id, "call_"),
                name: t.name,
                input,
            });
        }
        Ok(self.out.output(tool_calls, stop))
    }

    /// A `2xx` `application/json` answer: a server that ignored `stream: true`.
    fn whole(
        chunk: WireChunk,
        bytes: &[u8],
        sink: &mut dyn DeltaSink,
    ) -> Result<ModelOutput, UpstreamError> {
        let mut acc = Acc::default();
        acc.chunk(chunk, sink)?;
        if acc.finish.is_none() && acc.out.text.is_empty() && acc.tools.is_empty() {
            return Err(
                protocol("the upstream's JSON answer has no choices").with_detail(preview(bytes))
            );
        }
        acc.finish()
    }
}

/// An `{"error": ...}` object met inside a 2xx stream.
fn stream_error(err: &Value) -> UpstreamError {
    let code = ["code", "status"]
        .iter()
        .filter_map(|k| err.get(k).and_then(Value::as_u64))
        .find(|c| (400..=599).contains(c))
        .unwrap_or(500) as u16;
    let message = match super::transport::error_type_of(err) {
        Some(kind) => format!("the upstream reported an error mid-stream, error type {kind}"),
        None => "the upstream reported an error mid-stream".to_string(),
    };
    UpstreamError::new(UpstreamErrorKind::Status(code), message).with_detail(error_text(err))
}

/// `{"error":{"message"}}` (or `{"error":"..."}`, or `{"message"}`), else the body's first 500 bytes.
fn error_message(body: &[u8]) -> String {
    body_message(body, |v| {
        let msg = match v.get("error") {
            Some(Value::String(s)) => Some(s.as_str()),
            Some(e) => e.get("message").and_then(Value::as_str),
            None => v.get("message").and_then(Value::as_str),
        };
        msg.map(str::to_string)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::fake_openai::{FakeOpenAi, Gate, Reply};
    use crate::upstream::ToolDef;
    use std::sync::Arc;
    use tokio::sync::mpsc;

    use crate::testkit::sinks::{Forward, Rec};

    fn provider(fake: &FakeOpenAi) -> OpenAi {
        OpenAi::new(fake.base_url(), None, Duration::from_secs(10))
    }

    fn ask(text: &str) -> ModelRequest {
        ModelRequest {
            model: "test-model".into(),
            system: None,
            messages: vec![Message::User {
                content: Content::Text(text.into()),
            }],
            tools: vec![],
            max_tokens: None,
            thinking: false,
            tuning: Default::default(),
        }
    }

    async fn run(fake: &FakeOpenAi, reply: Reply) -> (Result<ModelOutput, UpstreamError>, Rec) {
        fake.push(reply);
        let mut rec = Rec::default();
        let out = provider(fake).complete(&ask("hi"), &mut rec).await;
        (out, rec)
    }

    async fn run_raw(body: &str) -> Result<ModelOutput, UpstreamError> {
        let fake = FakeOpenAi::start().await;
        run(&fake, Reply::raw(body).chunk_chars(7)).await.0
    }

    fn sse(chunks: &[Value]) -> String {
        chunks.iter().map(|c| format!("data: {c}\n\n")).collect()
    }

    #[tokio::test]
    async fn text_streams_as_fragments() {
        let fake = FakeOpenAi::start().await;
        let text = "The quick brown fox jumps over the lazy dog, naïvely 🦊.";
        let (out, rec) = run(&fake, Reply::text(text)).await;
        let out = out.unwrap();
        assert_eq!(out.text, text);
        assert!(rec.text.len() > 5, "fragments: {:?}", rec.text);
        assert_eq!(rec.text.concat(), text);
        assert!(rec.text.iter().all(|f| !f.is_empty()));
        assert_eq!(out.stop, ModelStop::EndTurn);
        assert!(out.tool_calls.is_empty());
        assert_eq!(out.thinking, "");
        assert_eq!(
            out.usage,
            Usage {
                input_tokens: 10,
                output_tokens: 5
            }
        );
    }

    #[tokio::test]
    async fn fragments_reach_the_sink_before_the_stream_ends() {
        let fake = Arc::new(FakeOpenAi::start().await);
        let gate = Gate::new();
        fake.push(Reply::text("streaming works").hold(gate.clone()));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let f = fake.clone();
        let call = tokio::spawn(async move {
            let p = provider(&f);
            let mut sink = Forward(tx);
            p.complete(&ask("hi"), &mut sink).await
        });
        let mut seen = String::new();
        while seen != "streaming works" {
            seen.push_str(&rx.recv().await.expect("a fragment"));
        }
        assert!(!call.is_finished(), "the stream is held open by the gate");
        gate.open();
        let out = call.await.unwrap().unwrap();
        assert_eq!(out.text, "streaming works");
    }

    #[tokio::test]
    async fn thinking_streams_before_text() {
        let fake = FakeOpenAi::start().await;
        let (out, rec) = run(&fake, Reply::text("42").thinking("Let me think it over.")).await;
        let out = out.unwrap();
        assert_eq!(out.thinking, "Let me think it over.");
        assert!(rec.thinking.len() > 1);
        assert_eq!(rec.thinking.concat(), out.thinking);
        assert_eq!(out.text, "42");
    }

    #[tokio::test]
    async fn reasoning_field_is_accepted_too() {
        let body = sse(&[
            json!({"choices": [{"index": 0, "delta": {"reasoning": "hmm "}, "finish_reason": null}]}),
            json!({"choices": [{"index": 0, "delta": {"reasoning": "ok", "content": "yes"}, "finish_reason": null}]}),
            // Servers that send both carry the same text: taken once.
            json!({"choices": [{"index": 0, "delta": {"reasoning": "!", "reasoning_content": "!"}, "finish_reason": "stop"}]}),
        ]) + "data: [DONE]\n\n";
        let out = run_raw(&body).await.unwrap();
        assert_eq!(out.thinking, "hmm ok!");
        assert_eq!(out.text, "yes");
    }

    #[tokio::test]
    async fn parallel_tool_calls_are_assembled_by_index() {
        let fake = FakeOpenAi::start().await;
        let weather = json!({"city": "Tokyo", "units": {"temp": "C"}, "days": [1, 2, 3]});
        let time = json!({"tz": "Asia/Tokyo — 東京"});
        let (out, rec) = run(
            &fake,
            Reply::tool_calls(&[
                ("call_w", "get_weather", weather.clone()),
                ("call_t", "get_time", time.clone()),
            ])
            .with_text("Checking both.")
            .chunk_chars(3),
        )
        .await;
        let out = out.unwrap();
        assert_eq!(out.stop, ModelStop::ToolUse);
        assert_eq!(out.text, "Checking both.");
        assert_eq!(rec.text.concat(), "Checking both.");
        assert_eq!(
            out.tool_calls,
            vec![
                ToolCall {
                    id: "call_w".into(),
                    name: "get_weather".into(),
                    input: weather
                },
                ToolCall {
                    id: "call_t".into(),
                    name: "get_time".into(),
                    input: time
                },
            ]
        );
    }

    #[tokio::test]
    async fn tool_call_quirks_missing_id_empty_arguments_stop_reason() {
        let body = sse(&[
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 1, "function": {"name": "second", "arguments": ""}},
                {"index": 0, "id": "call_x", "function": {"name": "first", "arguments": "{\"a\""}}]}, "finish_reason": null}]}),
            // Repeated id/name in a later fragment must not be doubled.
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "call_x", "function": {"name": "first", "arguments": ":1}"}}]}, "finish_reason": null}]}),
            json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        ]) + "data: [DONE]\n\n";
        let out = run_raw(&body).await.unwrap();
        assert_eq!(out.stop, ModelStop::ToolUse, "stop with tool calls");
        assert_eq!(out.tool_calls.len(), 2);
        assert_eq!(out.tool_calls[0].id, "call_x");
        assert_eq!(out.tool_calls[0].name, "first");
        assert_eq!(out.tool_calls[0].input, json!({"a": 1}));
        assert_eq!(out.tool_calls[1].name, "second");
        assert_eq!(out.tool_calls[1].input, json!({}));
        let id = &out.tool_calls[1].id;
        assert!(id.starts_with("call_") && id.len() > 5, "{id}");
        assert!(id[5..].chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[tokio::test]
    async fn tool_calls_without_index_or_finish_reason() {
        let body = sse(&[
            json!({"choices": [{"delta": {"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"id": "b", "function": {"name": "g", "arguments": "{\"x\""}}]}}]}),
            json!({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": ":2}"}}]}}]}),
        ]) + "data: [DONE]\n\n";
        let out = run_raw(&body).await.unwrap();
        assert_eq!(out.stop, ModelStop::ToolUse);
        let got: Vec<(&str, &str, &Value)> = out
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), &c.input))
            .collect();
        assert_eq!(
            got,
            vec![("a", "f", &json!({})), ("b", "g", &json!({"x": 2}))]
        );
    }

    #[tokio::test]
    async fn invalid_tool_arguments_are_a_protocol_error_naming_the_tool() {
        let fake = FakeOpenAi::start().await;
        let body = sse(&[
            json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get_weather", "arguments": "{\"city\": Tok"}}]}, "finish_reason": "tool_calls"}]}),
        ]) + "data: [DONE]\n\n";
        let err = run(&fake, Reply::raw(&body)).await.0.unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Protocol);
        assert!(!err.retryable);
        assert!(err.message.contains("get_weather"), "{}", err.message);
        // Cut by max_tokens instead: the broken call is dropped, the stop says why.
        let cut = body.replace("\"tool_calls\"}]", "\"length\"}]");
        let out = run(&fake, Reply::raw(&cut)).await.0.unwrap();
        assert_eq!(out.stop, ModelStop::MaxTokens);
        assert!(out.tool_calls.is_empty());
    }

    #[tokio::test]
    async fn finish_reasons_length_and_content_filter() {
        let fake = FakeOpenAi::start().await;
        let (out, _) = run(&fake, Reply::text("trunc").finish("length")).await;
        assert_eq!(out.unwrap().stop, ModelStop::MaxTokens);
        let (out, _) = run(&fake, Reply::text("").finish("content_filter")).await;
        assert_eq!(out.unwrap().stop, ModelStop::Refusal);
        let (out, _) = run(&fake, Reply::text("odd").finish("something_new")).await;
        assert_eq!(out.unwrap().stop, ModelStop::EndTurn);
        let (out, _) = run(
            &fake,
            Reply::tool_calls(&[("c", "f", json!({}))]).finish("function_call"),
        )
        .await;
        assert_eq!(out.unwrap().stop, ModelStop::ToolUse);
    }

    #[tokio::test]
    async fn usage_comes_from_the_final_chunk() {
        let fake = FakeOpenAi::start().await;
        let (out, _) = run(&fake, Reply::text("counted").usage(123, 45)).await;
        assert_eq!(
            out.unwrap().usage,
            Usage {
                input_tokens: 123,
                output_tokens: 45
            }
        );
    }

    #[tokio::test]
    async fn http_500_is_a_retryable_status_error_with_the_upstream_message() {
        let fake = FakeOpenAi::start().await;
        let (out, _) = run(
            &fake,
            Reply::status(
                500,
                json!({"error": {"message": "the model crashed", "type": "server_error"}}),
            ),
        )
        .await;
        let err = out.unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Status(500));
        assert!(err.retryable);
        assert_eq!(
            err.message,
            "the upstream answered HTTP 500 (the upstream failed), error type server_error"
        );
        assert!(err.to_string().contains("the model crashed"), "{err}");
        assert_eq!(err.retry_after, None);
        // Nothing queued: the fake's own 500 message comes through.
        let err = provider(&fake)
            .complete(&ask("x"), &mut Rec::default())
            .await
            .unwrap_err();
        assert!(err.to_string().contains("fake upstream: no scripted reply"));
    }

    #[tokio::test]
    async fn secrets_an_error_body_echoes_are_redacted_from_what_is_logged() {
        let fake = FakeOpenAi::start().await;
        let key = "sk-this-key-must-not-be-logged";
        let org = "org-private-header-value";
        let provider = OpenAi::new(fake.base_url(), Some(key.into()), Duration::from_secs(10))
            .with_headers(vec![(
                http::HeaderName::from_static("openai-organization"),
                http::HeaderValue::from_static("org-private-header-value"),
            )]);
        let echo = format!("Incorrect API key provided: {key} (Bearer {key}) for {org}");
        fake.push(Reply::status(401, json!({"error": {"message": echo}})));
        let err = provider
            .complete(&ask("hi"), &mut Rec::default())
            .await
            .unwrap_err();
        // The log line is the error's message and detail.
        let logged = format!("{err} {}", err.detail.clone().unwrap_or_default());
        assert!(
            logged.contains("Incorrect API key provided: [redacted]"),
            "{logged}"
        );
        assert!(!logged.contains(key) && !logged.contains(org), "{logged}");
        // A broken stream's error event is redacted too.
        fake.push(Reply::raw(&format!(
            "data: {}\n\n",
            json!({"error": {"message": format!("bad key {key}")}})
        )));
        let err = provider
            .complete(&ask("hi"), &mut Rec::default())
            .await
            .unwrap_err();
        let logged = format!("{err} {:?}", err.detail);
        assert!(!logged.contains(key), "{logged}");
    }

    #[tokio::test]
    async fn http_429_carries_retry_after() {
        let fake = FakeOpenAi::start().await;
        let (out, _) = run(
            &fake,
            Reply::status(429, json!({"error": {"message": "rate limited"}}))
                .header("Retry-After", "7"),
        )
        .await;
        let err = out.unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Status(429));
        assert!(err.retryable);
        assert_eq!(err.retry_after, Some(Duration::from_secs(7)));
    }

    #[tokio::test]
    async fn http_400_is_not_retryable() {
        let fake = FakeOpenAi::start().await;
        let (out, _) = run(
            &fake,
            Reply::status(
                400,
                json!({"error": {"message": "max_tokens is too large", "param": "max_tokens"}}),
            ),
        )
        .await;
        let err = out.unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Status(400));
        assert!(!err.retryable);
        // No error type in the body: the status alone; the upstream's words go to the log.
        assert_eq!(
            err.message,
            "the upstream answered HTTP 400 (the upstream refused the request)"
        );
        assert!(err.to_string().contains("max_tokens is too large"), "{err}");
    }

    #[tokio::test]
    async fn a_non_json_error_body_is_quoted_cut_at_500_bytes() {
        let fake = FakeOpenAi::start().await;
        let page = format!("<html>{}</html>", "x".repeat(2000));
        let (out, _) = run(
            &fake,
            Reply::raw(&page)
                .chunk_chars(4096)
                .header("content-type", "text/html"),
        )
        .await;
        // A 200 with HTML is not a stream: no [DONE], no finish.
        assert_eq!(out.unwrap_err().kind, UpstreamErrorKind::Stream);
        assert_eq!(error_message(page.as_bytes()).len(), 500 + '…'.len_utf8());
        assert_eq!(error_message(b"{\"error\": \"plain\"}"), "plain");
        assert_eq!(error_message(b""), "(empty body)");
    }

    #[tokio::test]
    async fn a_broken_stream_is_a_stream_error() {
        let fake = FakeOpenAi::start().await;
        let (out, rec) = run(&fake, Reply::text("abcdefghijkl").break_after(2)).await;
        let err = out.unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Stream);
        assert!(err.retryable);
        assert_eq!(
            rec.text.concat(),
            "abcd",
            "what came before the break was streamed"
        );
    }

    #[tokio::test]
    async fn a_stream_ending_without_done_or_finish_is_a_stream_error() {
        let body = sse(&[
            json!({"choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": null}]}),
        ]);
        let err = run_raw(&body).await.unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Stream);
        // With a finish_reason but no [DONE] (and no final blank line): accepted.
        let body = sse(&[
            json!({"choices": [{"index": 0, "delta": {"content": "whole"}, "finish_reason": "stop"}]}),
        ]);
        let out = run_raw(body.trim_end()).await.unwrap();
        assert_eq!(out.text, "whole");
    }

    #[tokio::test]
    async fn errors_inside_the_stream() {
        let body = sse(&[
            json!({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": null}]}),
            json!({"error": {"message": "overloaded", "type": "server_error"}}),
        ]);
        let err = run_raw(&body).await.unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Status(500));
        assert!(err.retryable);
        assert!(err.message.contains("server_error"), "{}", err.message);
        assert!(err.to_string().contains("overloaded"), "{err}");
        let body = sse(&[json!({"error": {"message": "bad input", "code": 400}})]);
        let err = run_raw(&body).await.unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Status(400));
        assert!(!err.retryable);
        let err = run_raw("data: {\"choices\": [\n\n").await.unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Protocol);
        let err = run_raw("data: {\"choices\": [{\"delta\": {\"content\": 5}}]}\n\n")
            .await
            .unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Protocol);
    }

    #[tokio::test]
    async fn comments_and_other_fields_are_ignored() {
        let body = ": OPENROUTER PROCESSING\r\n\r\nevent: message\r\nid: 1\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}],\"usage\":null}\r\n\r\ndata: [DONE]\r\n\r\n";
        let out = run_raw(body).await.unwrap();
        assert_eq!(out.text, "ok");
        assert_eq!(out.stop, ModelStop::EndTurn);
    }

    #[tokio::test]
    async fn a_non_streamed_json_answer_is_read_whole() {
        let fake = FakeOpenAi::start().await;
        let answer = json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "whole answer", "reasoning_content": "r",
                        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
            "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3, "completion_tokens": 4}});
        let (out, rec) = run(
            &fake,
            Reply::raw(&answer.to_string()).header("content-type", "application/json"),
        )
        .await;
        let out = out.unwrap();
        assert_eq!(out.text, "whole answer");
        assert_eq!(rec.text.concat(), "whole answer");
        assert_eq!(out.thinking, "r");
        assert_eq!(out.stop, ModelStop::ToolUse);
        assert_eq!(out.tool_calls[0].input, json!({"a": 1}));
        assert_eq!(out.usage.output_tokens, 4);
    }

    #[tokio::test]
    async fn the_whole_call_is_bounded_by_the_timeout() {
        let fake = FakeOpenAi::start().await;
        let gate = Gate::new();
        fake.push(Reply::text("never finishes").hold(gate.clone()));
        let p = OpenAi::new(fake.base_url(), None, Duration::from_millis(300));
        let mut rec = Rec::default();
        let err = p.complete(&ask("hi"), &mut rec).await.unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Timeout);
        assert!(!err.retryable);
        assert_eq!(
            rec.text.concat(),
            "never finishes",
            "deltas streamed before the hold"
        );
        gate.open();
    }

    #[tokio::test]
    async fn connection_refused_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let p = OpenAi::new(format!("http://{addr}/v1"), None, Duration::from_secs(5));
        let err = p
            .complete(&ask("hi"), &mut Rec::default())
            .await
            .unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Connect);
        assert!(err.retryable);
        assert!(!err.message.contains(&addr.to_string()), "{}", err.message);
        assert!(err.to_string().contains(&addr.to_string()), "{err}");
    }

    #[tokio::test]
    async fn a_bad_base_url_is_a_non_retryable_error() {
        let p = OpenAi::new("not a url".into(), None, Duration::from_secs(5));
        let err = p
            .complete(&ask("hi"), &mut Rec::default())
            .await
            .unwrap_err();
        assert_eq!(err.kind, UpstreamErrorKind::Connect);
        assert!(!err.retryable);
    }

    #[tokio::test]
    async fn connections_are_reused() {
        let fake = FakeOpenAi::start().await;
        let p = provider(&fake);
        for i in 0..5 {
            fake.push(Reply::text(&format!("answer {i}")));
            let out = p.complete(&ask("hi"), &mut Rec::default()).await.unwrap();
            assert_eq!(out.text, format!("answer {i}"));
        }
        assert!(
            fake.connections() <= 2,
            "connections: {}",
            fake.connections()
        );
    }

    /// A raw HTTP/1 upstream that reads each request whole and answers it with the head and
    /// body `answer` makes of an event stream saying "ok", then drops the connection (closing
    /// it) or, with `keep_open`, holds it open and silent. Its address and count of connections.
    async fn raw_upstream(
        answer: fn(&str) -> String,
        keep_open: bool,
    ) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            let mut open = Vec::new();
            while let Ok((mut sock, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                // The head, then as many body bytes as Content-Length says.
                let (head_end, length) = loop {
                    let n = sock.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the client closed before sending a request");
                    req.extend_from_slice(&buf[..n]);
                    if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&req[..i]).to_lowercase();
                        let length: usize = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map(|v| v.trim().parse().unwrap())
                            .unwrap_or(0);
                        break (i + 4, length);
                    }
                };
                while req.len() < head_end + length {
                    let n = sock.read(&mut buf).await.unwrap();
                    req.extend_from_slice(&buf[..n]);
                }
                let body = sse(&[
                    json!({"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": null}]}),
                    json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
                ]) + "data: [DONE]\n\n";
                sock.write_all(answer(&body).as_bytes()).await.unwrap();
                if keep_open {
                    open.push(sock);
                }
            }
        });
        (addr, accepted)
    }

    #[tokio::test]
    async fn a_server_that_closes_each_connection_after_answering_costs_no_call() {
        // Answers one request per connection, then closes it without saying so (no
        // `Connection: close`): the pooled connection is dead when the next call comes.
        let (addr, accepted) = raw_upstream(
            |body| {
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
            },
            false,
        )
        .await;
        let p = OpenAi::new(format!("http://{addr}/v1"), None, Duration::from_secs(5));
        for _ in 0..5 {
            let out = p.complete(&ask("hi"), &mut Rec::default()).await.unwrap();
            assert_eq!(out.text, "ok");
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 5);
    }

    #[tokio::test]
    async fn an_answer_whose_body_never_ends_costs_its_connection_not_the_next_call() {
        // Sends the final event in a chunked body and never the body's end (the chunk of size
        // 0), keeping the connection open: the call ends at `[DONE]`, and the next one cannot
        // reuse the connection, whose last answer is still going on.
        let (addr, accepted) = raw_upstream(
            |body| {
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n",
                    body.len()
                )
            },
            true,
        )
        .await;
        let p = OpenAi::new(format!("http://{addr}/v1"), None, Duration::from_secs(5));
        for _ in 0..3 {
            let out = p.complete(&ask("hi"), &mut Rec::default()).await.unwrap();
            assert_eq!(out.text, "ok");
        }
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn the_request_names_its_host_and_path() {
        let fake = FakeOpenAi::start().await;
        fake.record_requests(true);
        fake.push(Reply::text("done"));
        provider(&fake)
            .complete(&ask("hi"), &mut Rec::default())
            .await
            .unwrap();
        let headers = fake.request_headers();
        assert_eq!(headers.len(), 1, "one request reached /chat/completions");
        assert_eq!(
            headers[0].get("host").and_then(|h| h.to_str().ok()),
            Some(fake.addr().to_string().as_str())
        );
    }

    #[tokio::test]
    async fn the_request_carries_the_history_tools_and_key() {
        let fake = FakeOpenAi::start().await;
        fake.push(Reply::text("done"));
        let p = OpenAi::new(
            fake.base_url(),
            Some("sk-test".into()),
            Duration::from_secs(10),
        );
        let req = ModelRequest {
            model: "gpt-test".into(),
            system: Some("Be brief.".into()),
            messages: vec![
                Message::User {
                    content: Content::Text("Weather and time in Tokyo?".into()),
                },
                Message::Assistant {
                    content: Content::Blocks(vec![
                        Block::thinking("two tools"),
                        Block::Text {
                            text: "Checking.".into(),
                        },
                        Block::ToolUse {
                            tool_call_id: "call_1".into(),
                            name: "get_weather".into(),
                            input: json!({"city": "Tokyo"}),
                        },
                        Block::ToolUse {
                            tool_call_id: "call_2".into(),
                            name: "get_time".into(),
                            input: json!({}),
                        },
                    ]),
                },
                Message::Tool {
                    tool_call_id: "call_1".into(),
                    content: Content::Text("18C".into()),
                },
                Message::Tool {
                    tool_call_id: "call_2".into(),
                    content: Content::Blocks(vec![Block::Text {
                        text: "09:00".into(),
                    }]),
                },
                Message::Assistant {
                    content: Content::Blocks(vec![Block::ToolUse {
                        tool_call_id: "call_3".into(),
                        name: "noop".into(),
                        input: json!({}),
                    }]),
                },
                Message::Tool {
                    tool_call_id: "call_3".into(),
                    content: Content::Text("".into()),
                },
                Message::Assistant {
                    content: Content::Text("It is 18C at 09:00.".into()),
                },
                Message::User {
                    content: Content::Blocks(vec![
                        Block::Text {
                            text: "And this?".into(),
                        },
                        Block::Image {
                            url: "data:image/png;base64,AAAA".into(),
                        },
                    ]),
                },
            ],
            tools: vec![ToolDef {
                name: "get_weather".into(),
                description: "Weather for a city".into(),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}).into(),
            }],
            max_tokens: Some(256),
            thinking: true,
            tuning: Default::default(),
        };
        let out = p.complete(&req, &mut Rec::default()).await.unwrap();
        assert_eq!(out.text, "done");
        let sent = fake.wait_requests(1).await.remove(0);
        assert_eq!(
            sent,
            json!({
                "model": "gpt-test",
                "messages": [
                    {"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Weather and time in Tokyo?"},
                    {"role": "assistant", "content": "Checking.", "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Tokyo\"}"}},
                        {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                    {"role": "tool", "tool_call_id": "call_2", "content": "09:00"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "call_3", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
                    ]},
                    {"role": "tool", "tool_call_id": "call_3", "content": ""},
                    {"role": "assistant", "content": "It is 18C at 09:00."},
                    {"role": "user", "content": [
                        {"type": "text", "text": "And this?"},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    ]},
                ],
                "stream": true,
                "stream_options": {"include_usage": true},
                "tools": [{"type": "function", "function": {
                    "name": "get_weather",
                    "description": "Weather for a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                }}],
                "max_tokens": 256,
            })
        );
        let headers = &fake.request_headers()[0];
        assert_eq!(headers["authorization"], "Bearer sk-test");
        assert_eq!(headers["content-type"], "application/json");
        // Without tools or max_tokens those keys are absent; without a key, no Authorization.
        fake.push(Reply::text("x"));
        provider(&fake)
            .complete(&ask("plain"), &mut Rec::default())
            .await
            .unwrap();
        let sent = fake.wait_requests(2).await.remove(1);
        assert!(sent.get("tools").is_none() && sent.get("max_tokens").is_none());
        assert!(fake.request_headers()[1].get("authorization").is_none());
    }

    #[test]
    fn retry_after_parsing() {
        assert_eq!(parse_retry_after(" 12 "), Some(Duration::from_secs(12)));
        assert_eq!(parse_retry_after("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("NaN"), None);
    }
}

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
    #[serde(default)]
    prompt_tokens_details: Option<WirePromptDetails>,
}

/// `usage.prompt_tokens_details`: of the prompt's tokens, `cached_tokens` the cache held.
#[derive(Deserialize)]
struct WirePromptDetails {
    cached_tokens: Option<u64>,
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
                cached_input_tokens: (u.prompt_tokens_details)
                    .map_or(0, |d| d.cached_tokens.unwrap_or(0)),
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
mod tests;

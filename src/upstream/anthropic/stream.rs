//! The Messages answer: the stream's events (or a whole JSON message) accumulated into a
//! [`ModelOutput`], and the API's errors as [`UpstreamError`]s.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::message::{SignedThinking, ToolCall};
use crate::upstream::transport::{
    body_message, call_id, error_text, parse_event, preview, protocol, tool_input, Accumulate,
    Collected,
};
use crate::upstream::{DeltaSink, ModelOutput, ModelStop, UpstreamError, UpstreamErrorKind};

/// The most tool calls one answer may carry.
const MAX_TOOL_CALLS: usize = 1024;
/// The most content blocks (of any type) one answer may carry.
const MAX_BLOCKS: usize = 4096;

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireEvent {
    MessageStart {
        message: WireMessage,
    },
    ContentBlockStart {
        index: u64,
        content_block: WireBlock,
    },
    ContentBlockDelta {
        index: u64,
        delta: WireDelta,
    },
    ContentBlockStop {},
    MessageDelta {
        #[serde(default)]
        delta: Option<WireMessageDelta>,
        #[serde(default)]
        usage: Option<WireUsage>,
    },
    MessageStop {},
    Ping {},
    Error {
        #[serde(default)]
        error: Option<Value>,
    },
    #[serde(other)]
    Other,
}

/// A message: `message_start`'s, or a whole (non-streamed) answer.
#[derive(Deserialize)]
struct WireMessage {
    #[serde(default)]
    content: Option<Vec<WireBlock>>,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<WireUsage>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireBlock {
    Text {
        #[serde(default)]
        text: String,
    },
    Thinking {
        #[serde(default)]
        thinking: String,
        #[serde(default)]
        signature: Option<String>,
    },
    RedactedThinking {
        #[serde(default)]
        data: String,
    },
    ToolUse {
        #[serde(default)]
        id: String,
        #[serde(default)]
        name: String,
        #[serde(default)]
        input: Option<Value>,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum WireDelta {
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        thinking: String,
    },
    SignatureDelta {
        signature: String,
    },
    InputJsonDelta {
        partial_json: String,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct WireMessageDelta {
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
}

impl WireUsage {
    /// All the prompt's tokens, when the usage carries any input count.
    fn input(&self) -> Option<u64> {
        let parts = [
            self.input_tokens,
            self.cache_creation_input_tokens,
            self.cache_read_input_tokens,
        ];
        parts.iter().any(Option::is_some).then(|| {
            parts
                .iter()
                .flatten()
                .fold(0u64, |a, b| a.saturating_add(*b))
        })
    }
}

/// A content block being accumulated.
enum BlockAcc {
    Tool {
        id: String,
        name: String,
        /// The `input` of `content_block_start` (`{}` when streaming; whole when not).
        initial: Option<Value>,
        json: String,
    },
    /// A `thinking` block: its text (also in the output's thinking) and its signature.
    Thinking { text: String, signature: String },
    /// A `redacted_thinking` block (whole in its `content_block_start`).
    Redacted { data: String },
    /// Text, or a block we do not use.
    Other,
}

/// The output accumulated from the events seen so far.
#[derive(Default)]
pub(super) struct Acc {
    /// Text, thinking, usage and the answer's size.
    out: Collected,
    blocks: BTreeMap<u64, BlockAcc>,
    tool_count: usize,
    stop: Option<String>,
}

impl Acc {
    fn usage(&mut self, u: &WireUsage) {
        if let Some(input) = u.input() {
            self.out.usage.input_tokens = input;
            self.out.usage.cached_input_tokens = u.cache_read_input_tokens.unwrap_or(0);
        }
        if let Some(output) = u.output_tokens {
            self.out.usage.output_tokens = output;
        }
    }

    fn block_start(
        &mut self,
        index: u64,
        block: WireBlock,
        sink: &mut dyn DeltaSink,
    ) -> Result<(), UpstreamError> {
        if !self.blocks.contains_key(&index) && self.blocks.len() >= MAX_BLOCKS {
            return Err(protocol(format!(
                "the upstream sent more than {MAX_BLOCKS} content blocks"
            )));
        }
        let acc = match block {
            WireBlock::Text { text } => {
                self.out.text(&text, sink)?;
                BlockAcc::Other
            }
            WireBlock::Thinking {
                thinking,
                signature,
            } => {
                self.out.thinking(&thinking, sink)?;
                let signature = signature.unwrap_or_default();
                self.out.grow(signature.len())?;
                BlockAcc::Thinking {
                    text: thinking,
                    signature,
                }
            }
            WireBlock::RedactedThinking { data } => {
                self.out.grow(data.len())?;
                BlockAcc::Redacted { data }
            }
            WireBlock::ToolUse { id, name, input } => {
                if self.tool_count >= MAX_TOOL_CALLS {
                    return Err(protocol(format!(
                        "the upstream sent more than {MAX_TOOL_CALLS} tool calls"
                    )));
                }
                self.tool_count += 1;
                let initial_len = input.as_ref().map_or(0, |v| v.to_string().len());
                self.out.grow(id.len() + name.len() + initial_len)?;
                BlockAcc::Tool {
                    id,
                    name,
                    initial: input,
                    json: String::new(),
                }
            }
            WireBlock::Other => BlockAcc::Other,
        };
        if let Some(BlockAcc::Tool { .. }) = self.blocks.insert(index, acc) {
            // A repeated index replaced a tool block: keep the count honest.
            self.tool_count -= 1;
        }
        Ok(())
    }
}

impl Accumulate for Acc {
    type Whole = Value;
    const UNFINISHED: &'static str =
        "the upstream stream ended before it finished (no stop_reason, no message_stop)";

    fn event(&mut self, data: &str, sink: &mut dyn DeltaSink) -> Result<bool, UpstreamError> {
        let Some(event) = parse_event::<WireEvent>(data, "event")? else {
            return Ok(false);
        };
        match event {
            WireEvent::MessageStart { message } => {
                if let Some(u) = &message.usage {
                    self.usage(u);
                }
            }
            WireEvent::ContentBlockStart {
                index,
                content_block,
            } => self.block_start(index, content_block, sink)?,
            WireEvent::ContentBlockDelta { index, delta } => match delta {
                WireDelta::TextDelta { text } => self.out.text(&text, sink)?,
                WireDelta::ThinkingDelta { thinking } => {
                    self.out.thinking(&thinking, sink)?;
                    if let Some(BlockAcc::Thinking { text, .. }) = self.blocks.get_mut(&index) {
                        text.push_str(&thinking);
                    }
                }
                WireDelta::SignatureDelta { signature } => {
                    self.out.grow(signature.len())?;
                    if let Some(BlockAcc::Thinking { signature: s, .. }) =
                        self.blocks.get_mut(&index)
                    {
                        s.push_str(&signature);
                    }
                }
                WireDelta::InputJsonDelta { partial_json } => {
                    self.out.grow(partial_json.len())?;
                    match self.blocks.get_mut(&index) {
                        Some(BlockAcc::Tool { json, .. }) => json.push_str(&partial_json),
                        _ => {
                            return Err(protocol(format!(
                                "the upstream sent tool input for content block {index}, which is not a tool_use block"
                            )))
                        }
                    }
                }
                WireDelta::Other => {}
            },
            WireEvent::MessageDelta { delta, usage } => {
                if let Some(reason) = delta.and_then(|d| d.stop_reason) {
                    self.stop = Some(reason);
                }
                if let Some(u) = &usage {
                    self.usage(u);
                }
            }
            WireEvent::MessageStop {} => return Ok(true),
            WireEvent::Error { error } => return Err(stream_error(error.as_ref())),
            WireEvent::ContentBlockStop {} | WireEvent::Ping {} | WireEvent::Other => {}
        }
        Ok(false)
    }

    fn stopped(&self) -> bool {
        self.stop.is_some()
    }

    fn finish(self) -> Result<ModelOutput, UpstreamError> {
        let has_tools = self.tool_count > 0;
        let stop = match self.stop.as_deref() {
            Some("max_tokens") | Some("model_context_window_exceeded") => ModelStop::MaxTokens,
            Some("refusal") => ModelStop::Refusal,
            Some("tool_use") => ModelStop::ToolUse,
            _ if has_tools => ModelStop::ToolUse,
            // end_turn, stop_sequence, pause_turn, none, unknown.
            _ => ModelStop::EndTurn,
        };
        let mut tool_calls = Vec::with_capacity(self.tool_count);
        let mut signed = Vec::new();
        for (index, block) in self.blocks {
            let (id, name, initial, json) = match block {
                BlockAcc::Tool {
                    id,
                    name,
                    initial,
                    json,
                } => (id, name, initial, json),
                // Unsigned thinking cannot be sent back: it is kept as text only.
                BlockAcc::Thinking { text, signature } if !signature.is_empty() => {
                    signed.push(SignedThinking::Thinking {
                        thinking: text,
                        signature,
                    });
                    continue;
                }
                BlockAcc::Redacted { data } => {
                    signed.push(SignedThinking::RedactedThinking { data });
                    continue;
                }
                BlockAcc::Thinking { .. } | BlockAcc::Other => continue,
            };
            let empty = initial
                .filter(Value::is_object)
                .unwrap_or_else(|| Value::Object(Map::new()));
            let input = tool_input(&json, empty, stop).map_err(|e| {
                protocol(format!(
                    "the upstream sent invalid JSON input for tool {name:?} ({e})"
                ))
                .with_detail(preview(json.as_bytes()))
            })?;
            let Some(input) = input else {
                continue;
            };
            if name.is_empty() {
                if stop == ModelStop::MaxTokens {
                    continue;
                }
                return Err(protocol(format!(
                    "the upstream sent tool_use block {index} without a name"
                )));
            }
            tool_calls.push(ToolCall {
                id: call_id(id, "toolu_"),
                name,
                input,
            });
        }
        let mut out = self.out.output(tool_calls, stop);
        out.signed_thinking = signed;
        Ok(out)
    }

    /// A `2xx` `application/json` answer: a gateway that ignored `stream: true`.
    fn whole(
        value: Value,
        bytes: &[u8],
        sink: &mut dyn DeltaSink,
    ) -> Result<ModelOutput, UpstreamError> {
        if value.get("type").and_then(Value::as_str) == Some("error") {
            return Err(stream_error(value.get("error")));
        }
        let message: WireMessage = serde_json::from_value(value).map_err(|e| {
            protocol(format!("the upstream's JSON answer is not a message ({e})"))
                .with_detail(preview(bytes))
        })?;
        let Some(content) = message.content else {
            return Err(
                protocol("the upstream's JSON answer has no content").with_detail(preview(bytes))
            );
        };
        let mut acc = Acc::default();
        for (i, block) in content.into_iter().enumerate() {
            acc.block_start(i as u64, block, sink)?;
        }
        acc.stop = message.stop_reason;
        if let Some(u) = &message.usage {
            acc.usage(u);
        }
        acc.finish()
    }
}

/// The status an Anthropic error type stands for, and whether retrying may help.
fn error_status(kind: &str) -> (u16, bool) {
    match kind {
        "overloaded_error" => (529, true),
        "api_error" => (500, true),
        "rate_limit_error" => (429, true),
        "timeout_error" => (504, true),
        "invalid_request_error" => (400, false),
        "authentication_error" => (401, false),
        "billing_error" => (402, false),
        "permission_error" => (403, false),
        "not_found_error" => (404, false),
        "request_too_large" => (413, false),
        _ => (500, false),
    }
}

/// An `error` event met inside a 2xx stream.
fn stream_error(err: Option<&Value>) -> UpstreamError {
    let kind = err
        .and_then(|e| e.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    let message = err.map_or_else(|| "(no details)".to_string(), error_text);
    let (code, retryable) = error_status(kind);
    let short = err.and_then(crate::upstream::transport::error_type_of);
    let mut e = UpstreamError::new(
        UpstreamErrorKind::Status(code),
        match short {
            Some(kind) => format!("the upstream reported an error mid-stream, error type {kind}"),
            None => "the upstream reported an error mid-stream".to_string(),
        },
    )
    .with_detail(message);
    e.retryable = retryable;
    e
}

/// `{"type":"error","error":{"type","message"}}` as `type: message` (or `{"error":"..."}`, or
/// `{"message"}`), else the body's first 500 bytes.
pub(super) fn error_message(body: &[u8]) -> String {
    body_message(body, |v| {
        let (kind, msg) = match v.get("error") {
            Some(Value::String(s)) => (None, Some(s.as_str())),
            Some(e) => (
                e.get("type").and_then(Value::as_str),
                e.get("message").and_then(Value::as_str),
            ),
            None => (None, v.get("message").and_then(Value::as_str)),
        };
        match (kind, msg) {
            (Some(k), Some(m)) if !k.is_empty() => Some(format!("{k}: {m}")),
            (_, Some(m)) => Some(m.to_string()),
            (Some(k), None) => Some(k.to_string()),
            (None, None) => None,
        }
    })
}

//! The Messages request: the history, the tools and the thinking settings as the API wants
//! them (see the mapping in [`super`]).

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use serde_json::{json, Map, Value};

use crate::message::{Block, Content, Message};
use crate::upstream::{ModelRequest, ToolDef};

/// Thinking budget bounds.
const MIN_THINKING_BUDGET: u32 = 1024;
const MAX_THINKING_BUDGET: u32 = 8192;

/// The thinking budget for a `max_tokens`, and the `max_tokens` to send with it.
pub(super) fn thinking_budget(max_tokens: u32) -> (u32, u32) {
    let budget = (max_tokens / 2).clamp(MIN_THINKING_BUDGET, MAX_THINKING_BUDGET);
    (budget, max_tokens.max(budget + MIN_THINKING_BUDGET))
}

/// The JSON body of a Messages request; `default_max_tokens` when the request sets none.
pub(crate) fn request_body(req: &ModelRequest, default_max_tokens: u32) -> Value {
    let with_thinking = req.thinking && thinking_allowed(&req.messages);
    let (system, messages) = messages(req, with_thinking);
    let mut max_tokens = req.max_tokens.unwrap_or(default_max_tokens).max(1);
    let mut thinking = None;
    if with_thinking {
        let (budget, max) = thinking_budget(max_tokens);
        max_tokens = max;
        thinking = Some(json!({"type": "enabled", "budget_tokens": budget}));
    }

    let mut body = Map::new();
    body.insert("model".into(), Value::String(req.model.clone()));
    body.insert("max_tokens".into(), Value::from(max_tokens));
    if !system.is_empty() {
        body.insert(
            "system".into(),
            json!([{"type": "text", "text": system, "cache_control": ephemeral()}]),
        );
    }
    body.insert("messages".into(), Value::Array(messages));
    if !req.tools.is_empty() {
        body.insert("tools".into(), tools(&req.tools));
    }
    body.insert("stream".into(), Value::Bool(true));
    if let Some(t) = thinking {
        body.insert("thinking".into(), t);
    } else if let Some(t) = req.tuning.temperature {
        // With thinking on, Anthropic allows only its default temperature.
        body.insert("temperature".into(), Value::from(t));
    }
    if !req.tuning.stop.is_empty() {
        body.insert("stop_sequences".into(), json!(req.tuning.stop));
    }
    Value::Object(body)
}

/// The system prompt (the request's, then the history's `System` messages) and the messages,
/// merged by role, with a cache breakpoint on the last stable one.
fn messages(req: &ModelRequest, with_thinking: bool) -> (String, Vec<Value>) {
    let mut system = req.system.clone().unwrap_or_default();
    let mut turns: Vec<MessageParam> = Vec::with_capacity(req.messages.len());
    for m in &req.messages {
        match m {
            Message::System { content } => {
                if !content.is_empty() {
                    if !system.is_empty() {
                        system.push_str("\n\n");
                    }
                    system.push_str(content);
                }
            }
            Message::User { content } => push_turn(&mut turns, "user", user_blocks(content)),
            Message::Assistant { content } => push_turn(
                &mut turns,
                "assistant",
                assistant_blocks(content, with_thinking),
            ),
            Message::Tool {
                tool_call_id,
                content,
            } => push_turn(
                &mut turns,
                "user",
                vec![json!({
                    "type": "tool_result",
                    "tool_use_id": tool_call_id,
                    "content": tool_result_content(content),
                })],
            ),
        }
    }
    // The last stable turn (the one before the newest): a cache breakpoint.
    if let Some(i) = turns.len().checked_sub(2) {
        turns[i].cache = true;
    }
    let messages = turns.into_iter().map(MessageParam::into_json).collect();
    (system, messages)
}

/// The `tools` parameter, the last one carrying a cache breakpoint.
fn tools(defs: &[ToolDef]) -> Value {
    let mut tools: Vec<Value> = defs
        .iter()
        .map(|t| {
            let mut tool = Map::new();
            tool.insert("name".into(), Value::String(t.name.clone()));
            if !t.description.is_empty() {
                tool.insert("description".into(), Value::String(t.description.clone()));
            }
            tool.insert("input_schema".into(), input_schema(&t.parameters));
            Value::Object(tool)
        })
        .collect();
    if let Some(Value::Object(last)) = tools.last_mut() {
        last.insert("cache_control".into(), ephemeral());
    }
    Value::Array(tools)
}

/// `{"type": "ephemeral"}`: a prompt-cache breakpoint (the default five-minute cache).
fn ephemeral() -> Value {
    json!({"type": "ephemeral"})
}

/// Whether thinking may be on for a request with this history. Mid tool loop (the newest user
/// turn holds tool results) the API requires the assistant turn that called the tools to start
/// with its signed thinking; when that turn has none (an answer given with thinking off, or
/// history from before signatures were kept) thinking is left off for the call, as the API
/// advises.
fn thinking_allowed(messages: &[Message]) -> bool {
    let mut rest = messages
        .iter()
        .rev()
        .filter(|m| !matches!(m, Message::System { .. }))
        .peekable();
    let mut tool_loop = false;
    while let Some(m) = rest.next_if(|m| matches!(m, Message::User { .. } | Message::Tool { .. })) {
        tool_loop |= matches!(m, Message::Tool { .. });
    }
    !tool_loop
        || rest
            .take_while(|m| matches!(m, Message::Assistant { .. }))
            .any(|m| match m {
                Message::Assistant {
                    content: Content::Blocks(blocks),
                } => blocks
                    .iter()
                    .any(|b| matches!(b, Block::Thinking { signed, .. } if !signed.is_empty())),
                _ => false,
            })
}

/// One message of the request being assembled (the API's `MessageParam`).
struct MessageParam {
    role: &'static str,
    blocks: Vec<Value>,
    /// Carries a cache breakpoint (on its last block that may have one).
    cache: bool,
}

impl MessageParam {
    fn into_json(mut self) -> Value {
        // Tool results first in a user turn, thinking first in an assistant turn (stable), as
        // the API requires.
        let first = if self.role == "user" {
            is_tool_result
        } else {
            is_thinking
        };
        let (mut front, rest): (Vec<Value>, Vec<Value>) = self.blocks.into_iter().partition(first);
        front.extend(rest);
        self.blocks = front;
        if self.cache {
            // Thinking blocks cannot carry `cache_control`.
            if let Some(Value::Object(b)) = self.blocks.iter_mut().rev().find(|b| !is_thinking(b)) {
                b.insert("cache_control".into(), ephemeral());
            }
        }
        let content = match self.blocks.as_slice() {
            [one] if one["type"] == "text" && one.get("cache_control").is_none() => {
                one["text"].clone()
            }
            _ => Value::Array(self.blocks),
        };
        json!({"role": self.role, "content": content})
    }
}

fn is_tool_result(b: &Value) -> bool {
    b["type"] == "tool_result"
}

fn is_thinking(b: &Value) -> bool {
    b["type"] == "thinking" || b["type"] == "redacted_thinking"
}

/// Appends blocks as a turn of `role`, merged into the last turn when it has the same role.
fn push_turn(turns: &mut Vec<MessageParam>, role: &'static str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    if let Some(last) = turns.last_mut() {
        if last.role == role {
            last.blocks.extend(blocks);
            return;
        }
    }
    turns.push(MessageParam {
        role,
        blocks,
        cache: false,
    });
}

fn text_block(text: &str) -> Option<Value> {
    (!text.is_empty()).then(|| json!({"type": "text", "text": text}))
}

fn user_blocks(content: &Content) -> Vec<Value> {
    match content {
        Content::Text(s) => text_block(s).into_iter().collect(),
        Content::Blocks(blocks) => blocks
            .iter()
            .filter_map(|b| match b {
                Block::Text { text } => text_block(text),
                Block::Image { url } => Some(image_block(url)),
                Block::Thinking { .. } | Block::ToolUse { .. } => None,
            })
            .collect(),
    }
}

/// An assistant message's blocks; signed thinking only `with_thinking` (unsigned thinking cannot
/// be sent back).
fn assistant_blocks(content: &Content, with_thinking: bool) -> Vec<Value> {
    match content {
        Content::Text(s) => text_block(s).into_iter().collect(),
        Content::Blocks(blocks) => blocks
            .iter()
            .flat_map(|b| -> Vec<Value> {
                match b {
                    Block::Thinking { signed, .. } if with_thinking => signed
                        .iter()
                        .filter_map(|t| serde_json::to_value(t).ok())
                        .collect(),
                    other => assistant_block(other).into_iter().collect(),
                }
            })
            .collect(),
    }
}

/// An assistant block other than signed thinking.
fn assistant_block(b: &Block) -> Option<Value> {
    match b {
        Block::Text { text } => text_block(text),
        Block::ToolUse {
            tool_call_id,
            name,
            input,
        } => {
            let input = if input.is_object() {
                input.clone()
            } else {
                Value::Object(Map::new())
            };
            Some(json!({"type": "tool_use", "id": tool_call_id, "name": name, "input": input}))
        }
        Block::Thinking { .. } | Block::Image { .. } => None,
    }
}

/// A tool result's `content`: its text, or a list of text and image blocks when it holds images.
fn tool_result_content(content: &Content) -> Value {
    match content {
        Content::Blocks(blocks) if blocks.iter().any(|b| matches!(b, Block::Image { .. })) => {
            Value::Array(user_blocks(content))
        }
        _ => Value::String(content.text()),
    }
}

/// An `image` block: a base64 source from a `data:` URI, else a URL source.
pub(super) fn image_block(url: &str) -> Value {
    let source = match url.strip_prefix("data:").and_then(|r| r.split_once(',')) {
        Some((meta, payload)) => {
            let mut params = meta.split(';');
            let media_type = params.next().unwrap_or("").trim().to_ascii_lowercase();
            let is_base64 = params.any(|p| p.trim().eq_ignore_ascii_case("base64"));
            let data = if is_base64 {
                payload
                    .chars()
                    .filter(|c| !c.is_ascii_whitespace())
                    .collect()
            } else {
                STANDARD.encode(crate::outbound::percent_decode(payload))
            };
            let media_type = if media_type.is_empty() {
                sniff_media_type(&data).to_string()
            } else {
                media_type
            };
            json!({"type": "base64", "media_type": media_type, "data": data})
        }
        None => json!({"type": "url", "url": url}),
    };
    json!({"type": "image", "source": source})
}

/// The image type from the first base64 characters (for a `data:` URI that names none).
fn sniff_media_type(b64: &str) -> &'static str {
    if b64.starts_with("/9j/") {
        "image/jpeg"
    } else if b64.starts_with("R0lGOD") {
        "image/gif"
    } else if b64.starts_with("UklGR") {
        "image/webp"
    } else {
        "image/png"
    }
}

/// A tool's `input_schema`: an object schema (`type: object` added when missing).
fn input_schema(parameters: &Value) -> Value {
    match parameters {
        Value::Object(m) => {
            let mut m = m.clone();
            m.entry("type")
                .or_insert_with(|| Value::String("object".into()));
            Value::Object(m)
        }
        _ => json!({"type": "object", "properties": {}}),
    }
}

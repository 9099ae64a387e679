//! The built-in `echo` provider: deterministic, no network, so that a fresh checkout runs with
//! zero setup and the whole turn machinery can be tried by hand.
//!
//! It answers the last message:
//! - a user message `/call NAME {json}` calls tool NAME (when it is offered) with that input;
//! - any other user message is echoed back: `Echo: <text>`, streamed word by word;
//! - after tool results it reports them: `Tool NAME returned: <content>`.
//!
//! With thinking on, it first "thinks" one line. Usage counts are characters / 4, rounded up.

use futures_util::future::BoxFuture;
use serde_json::Value;

use super::{DeltaSink, ModelOutput, ModelRequest, ModelStop, Provider, UpstreamError};
use crate::message::{Block, Content, Message, ToolCall, Usage};

pub struct Echo;

fn tokens(chars: usize) -> u64 {
    chars.div_ceil(4) as u64
}

impl Provider for Echo {
    fn name(&self) -> &'static str {
        "echo"
    }

    fn complete<'a>(
        &'a self,
        req: &'a ModelRequest,
        sink: &'a mut dyn DeltaSink,
    ) -> BoxFuture<'a, Result<ModelOutput, UpstreamError>> {
        Box::pin(async move { Ok(answer(req, sink)) })
    }
}

fn answer(req: &ModelRequest, sink: &mut dyn DeltaSink) -> ModelOutput {
    let input_chars: usize = req
        .messages
        .iter()
        .map(|m| serde_json::to_string(m).map(|s| s.len()).unwrap_or(0))
        .sum::<usize>()
        + req.system.as_ref().map_or(0, String::len);
    let mut out = ModelOutput {
        thinking: String::new(),
        signed_thinking: Vec::new(),
        text: String::new(),
        tool_calls: Vec::new(),
        usage: Usage::default(),
        stop: ModelStop::EndTurn,
    };
    let (text, call) = match req.messages.last() {
        Some(Message::User { content }) => {
            let said = content.text();
            match parse_call(&said, req) {
                Some(call) => (String::new(), Some(call)),
                None => (format!("Echo: {said}"), None),
            }
        }
        Some(Message::Tool { .. }) => (tool_report(&req.messages), None),
        _ => ("Echo: (nothing to echo)".to_string(), None),
    };
    if req.thinking {
        out.thinking = format!("The last message has {} characters.", text.chars().count());
        sink.thinking(&out.thinking);
    }
    for piece in text.split_inclusive(' ') {
        sink.text(piece);
    }
    out.text = text;
    if let Some(call) = call {
        out.tool_calls.push(call);
        out.stop = ModelStop::ToolUse;
    }
    let output_chars = out.text.len() + out.thinking.len() + out.tool_calls.len() * 32;
    out.usage = Usage {
        input_tokens: tokens(input_chars),
        output_tokens: tokens(output_chars),
        ..Default::default()
    };
    out
}

/// `/call NAME {json}` → a call of an offered tool.
fn parse_call(said: &str, req: &ModelRequest) -> Option<ToolCall> {
    let rest = said.trim().strip_prefix("/call ")?;
    let (name, args) = rest.trim().split_once(' ').unwrap_or((rest.trim(), "{}"));
    if !req.tools.iter().any(|t| t.name == name) {
        return None;
    }
    let input: Value = serde_json::from_str(args.trim())
        .ok()
        .filter(Value::is_object)?;
    let n = req.messages.len();
    Some(ToolCall {
        id: format!("call_echo_{n}"),
        name: name.to_string(),
        input,
    })
}

/// Report the results that follow the last assistant message.
fn tool_report(messages: &[Message]) -> String {
    let start = messages
        .iter()
        .rposition(|m| matches!(m, Message::Assistant { .. }))
        .map_or(0, |i| i + 1);
    let names = |id: &str| -> String {
        messages[..start]
            .iter()
            .rev()
            .find_map(|m| match m {
                Message::Assistant {
                    content: Content::Blocks(blocks),
                } => blocks.iter().find_map(|b| match b {
                    Block::ToolUse {
                        tool_call_id, name, ..
                    } if tool_call_id == id => Some(name.clone()),
                    _ => None,
                }),
                _ => None,
            })
            .unwrap_or_else(|| id.to_string())
    };
    messages[start..]
        .iter()
        .filter_map(|m| match m {
            Message::Tool {
                tool_call_id,
                content,
            } => Some(format!(
                "Tool {} returned: {}",
                names(tool_call_id),
                content.text()
            )),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests;

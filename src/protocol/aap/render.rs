//! Renders a turn's feed (stored events and deltas) as AAP: SSE events for `delta` and
//! `message` modes, one `AgentResponse` for `none`.
//!
//! What the client sent is not echoed back: the results of client tools (named in the turn's
//! `user.message`) appear neither as `tool_result` events nor in `messages`. Results of server
//! tools (run inline, granted, or denied) do, so the client's view matches the history.

use std::collections::HashSet;

use serde_json::{json, Value};

use super::request::StreamMode;
use crate::engine::history::Projector;
use crate::engine::{DeltaKind, Feed};
use crate::log::{Event, EventBody, StopReason};

/// The AAP `stopReason` of a terminal event, and an error object for failures.
pub(crate) fn stop_reason(body: &EventBody) -> (&'static str, Option<Value>) {
    match body {
        EventBody::TurnCompleted { stop_reason, .. } => (
            match stop_reason {
                StopReason::EndTurn => "end_turn",
                StopReason::ToolUse => "tool_use",
                // AAP's "a limit was reached; the client may continue".
                StopReason::MaxTokens | StopReason::MaxSteps => "max_tokens",
                StopReason::Refusal => "refusal",
            },
            None,
        ),
        EventBody::TurnFailed {
            reason, message, ..
        } => (
            "error",
            Some(json!({"reason": reason, "message": message.clone().unwrap_or_default()})),
        ),
        EventBody::TurnCancelled { .. } => (
            "error",
            Some(json!({"reason": "cancelled", "message": "the turn was cancelled"})),
        ),
        _ => ("error", None),
    }
}

/// Follows one turn's feed.
#[derive(Default)]
pub(crate) struct TurnRenderer {
    /// Calls whose results the client sent in this turn.
    client_results: HashSet<String>,
    /// This turn's events as history (`none` mode).
    projector: Projector,
    /// Bytes of text and of thinking sent as deltas since the last stored message (`delta`
    /// mode): when the turn dropped fragments its watcher was too slow for, the stored message
    /// sends the rest.
    sent_text: usize,
    sent_thinking: usize,
    /// The turn dropped fragments for this watcher (see `engine/delivery/channel.rs`).
    pub fragments_lost: bool,
}

/// The part of a stored message that deltas did not show, when fragments were dropped: what
/// comes after the `sent` bytes that were shown.
fn unsent(content: &str, sent: usize) -> Option<&str> {
    content.get(sent..).filter(|rest| !rest.is_empty())
}

impl TurnRenderer {
    fn note(&mut self, ev: &Event) {
        if let EventBody::UserMessage {
            content: Value::Array(blocks),
            ..
        } = &ev.body
        {
            for b in blocks {
                if b.get("type").and_then(Value::as_str) == Some("tool_result") {
                    if let Some(id) = b.get("tool_use_id").and_then(Value::as_str) {
                        self.client_results.insert(id.to_string());
                    }
                }
            }
        }
    }

    fn is_client_result(&self, body: &EventBody) -> bool {
        matches!(body, EventBody::ToolResult { tool_use_id, .. } if self.client_results.contains(tool_use_id))
    }

    /// The SSE events (name, data) for one feed item in `delta` or `message` mode.
    pub(crate) fn sse(&mut self, mode: StreamMode, item: &Feed) -> Option<(&'static str, String)> {
        let (name, data) = match item {
            Feed::Fragment { kind, text } if mode == StreamMode::Delta => match kind {
                DeltaKind::Message => {
                    self.sent_text += text.len();
                    ("text_delta", json!({ "delta": text }))
                }
                DeltaKind::Thinking => {
                    self.sent_thinking += text.len();
                    ("thinking_delta", json!({ "delta": text }))
                }
            },
            Feed::Fragment { .. } | Feed::Delta { .. } => return None,
            Feed::Event(ev) => {
                self.note(ev);
                match &ev.body {
                    EventBody::AgentThinking { content, .. } if mode == StreamMode::Delta => {
                        let sent = std::mem::take(&mut self.sent_thinking);
                        match unsent(content, sent).filter(|_| self.fragments_lost) {
                            Some(rest) => ("thinking_delta", json!({ "delta": rest })),
                            None => return None,
                        }
                    }
                    // A compaction's summary is not the agent's answer.
                    EventBody::AgentMessage {
                        compaction: true, ..
                    } => return None,
                    EventBody::AgentMessage { content, .. } if mode == StreamMode::Delta => {
                        let sent = std::mem::take(&mut self.sent_text);
                        match unsent(content, sent).filter(|_| self.fragments_lost) {
                            Some(rest) => ("text_delta", json!({ "delta": rest })),
                            None => return None,
                        }
                    }
                    EventBody::AgentThinking { content, .. } if mode == StreamMode::Message => {
                        ("thinking", json!({ "thinking": content }))
                    }
                    EventBody::AgentMessage { content, .. }
                        if mode == StreamMode::Message && !content.is_empty() =>
                    {
                        ("text", json!({ "text": content }))
                    }
                    EventBody::ToolUse {
                        tool_use_id,
                        name,
                        input,
                    } => (
                        "tool_call",
                        json!({"toolCallId": tool_use_id, "name": name, "input": input}),
                    ),
                    EventBody::ToolResult {
                        tool_use_id,
                        content,
                        ..
                    } if !self.is_client_result(&ev.body) => (
                        "tool_result",
                        json!({"toolCallId": tool_use_id, "content": content}),
                    ),
                    body if body.is_terminal() => {
                        let (reason, error) = stop_reason(body);
                        let mut data = json!({ "stopReason": reason });
                        if let Some(error) = error {
                            data["error"] = error;
                        }
                        ("turn_stop", data)
                    }
                    _ => return None,
                }
            }
        };
        Some((name, data.to_string()))
    }

    /// Fold one item for the JSON response; the `AgentResponse` once the turn has ended.
    pub(crate) fn collect(&mut self, item: &Feed) -> Option<Value> {
        let Feed::Event(ev) = item else { return None };
        self.note(ev);
        match &ev.body {
            EventBody::UserMessage { .. } => None,
            body if self.is_client_result(body) => None,
            body if body.is_terminal() => {
                let (reason, error) = stop_reason(body);
                let messages = std::mem::take(&mut self.projector).into_messages();
                let mut resp = json!({"stopReason": reason, "messages": messages});
                if let Some(error) = error {
                    resp["error"] = error;
                }
                Some(resp)
            }
            body => {
                self.projector.apply(body);
                None
            }
        }
    }
}

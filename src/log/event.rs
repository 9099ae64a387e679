//! The events of the session log (spec 003): their types, and their one serialization.
//!
//! An event is serialized exactly once, when it is appended; history reads and live streams
//! send those same bytes, so the same event is byte-identical everywhere.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::message::{SignedThinking, Usage};

/// The `content` of an `agent.thinking` whose thinking the provider sent only encrypted (spec 003
/// says a thinking's content is never empty).
pub const REDACTED_THINKING: &str = "[redacted thinking]";

/// A file attached to a message or delivered by a tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRef {
    pub id: String,
    pub filename: String,
    pub mime_type: String,
    pub size_bytes: u64,
}

/// Why a turn completed (`turn.completed.stop_reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    /// The turn waits for client tool results or permissions.
    ToolUse,
    MaxTokens,
    /// The turn made `max_steps` model calls and the model still wanted tools.
    MaxSteps,
    Refusal,
}

/// Why a turn failed (`turn.failed.reason`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailReason {
    ModelError,
    Timeout,
    EmptyOutput,
    InternalError,
    WorkerLost,
    WorkerShutdown,
}

/// The type-specific part of an event. `type` is the tag.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum EventBody {
    /// What the client sent: text or content blocks; a follow-up after a `tool_use` stop carries
    /// `tool_result` and `tool_permission` blocks.
    #[serde(rename = "user.message")]
    UserMessage {
        content: Value,
        files: Vec<FileRef>,
        skills: Vec<Value>,
    },
    /// `signature` and `blocks` are ours (spec 003 has `content` only; clients ignore them):
    /// what the provider needs back to continue after a tool call. See [`EventBody::thinking`].
    #[serde(rename = "agent.thinking")]
    AgentThinking {
        content: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        blocks: Vec<SignedThinking>,
    },
    /// An empty `content` retracts the text streamed since the previous stored event.
    #[serde(rename = "agent.message")]
    AgentMessage {
        content: String,
        /// Set on a plan proposed in the runs API's plan mode.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        plan: bool,
        /// Set on the summary that replaces the oldest turns in the model's context (see
        /// `engine/context.rs`): it is not the agent's answer, and history shows it only in
        /// `compacted`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        compaction: bool,
        /// With `compaction`: the first and last event ids of the stretch of the log it
        /// summarises (the last one ends the stretch; the turns after it stay as they are).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        replaces: Option<[String; 2]>,
    },
    #[serde(rename = "agent.tool_use")]
    ToolUse {
        tool_use_id: String,
        name: String,
        input: Value,
    },
    #[serde(rename = "agent.tool_result")]
    ToolResult {
        tool_use_id: String,
        content: Value,
        is_error: bool,
        files: Vec<FileRef>,
    },
    #[serde(rename = "turn.completed")]
    TurnCompleted {
        usage: Option<Usage>,
        stop_reason: StopReason,
    },
    #[serde(rename = "turn.failed")]
    TurnFailed {
        reason: FailReason,
        usage: Option<Usage>,
        /// What went wrong, for people reading the log.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    #[serde(rename = "turn.cancelled")]
    TurnCancelled { usage: Option<Usage> },
}

impl EventBody {
    /// The `agent.thinking` of one model step: its visible thinking `text`, and the provider's
    /// signed blocks kept the most compact way that loses nothing:
    /// - one signed block whose text is `text` (the usual case): its `signature` alone;
    /// - several blocks, or redacted ones: all of them in `blocks`, as issued (text included);
    ///
    /// and a step with no visible text but signed blocks gets [`REDACTED_THINKING`] as content.
    /// `None` when the step thought nothing.
    pub fn thinking(text: &str, signed: &[SignedThinking]) -> Option<EventBody> {
        let content = if text.is_empty() {
            if signed.is_empty() {
                return None;
            }
            REDACTED_THINKING.to_string()
        } else {
            text.to_string()
        };
        let (signature, blocks) = match signed {
            [] => (None, Vec::new()),
            [SignedThinking::Thinking {
                thinking,
                signature,
            }] if *thinking == content => (Some(signature.clone()), Vec::new()),
            _ => (None, signed.to_vec()),
        };
        Some(EventBody::AgentThinking {
            content,
            signature,
            blocks,
        })
    }

    /// The provider blocks an `agent.thinking` stands for (empty for unsigned thinking and for
    /// every other event).
    pub fn signed_thinking(&self) -> Vec<SignedThinking> {
        match self {
            EventBody::AgentThinking {
                content,
                signature,
                blocks,
            } => match signature {
                _ if !blocks.is_empty() => blocks.clone(),
                Some(signature) => vec![SignedThinking::Thinking {
                    thinking: content.clone(),
                    signature: signature.clone(),
                }],
                None => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// Whether this is one of the three terminal events.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self,
            EventBody::TurnCompleted { .. }
                | EventBody::TurnFailed { .. }
                | EventBody::TurnCancelled { .. }
        )
    }

    /// The `type` string.
    pub fn type_name(&self) -> &'static str {
        match self {
            EventBody::UserMessage { .. } => "user.message",
            EventBody::AgentThinking { .. } => "agent.thinking",
            EventBody::AgentMessage { .. } => "agent.message",
            EventBody::ToolUse { .. } => "agent.tool_use",
            EventBody::ToolResult { .. } => "agent.tool_result",
            EventBody::TurnCompleted { .. } => "turn.completed",
            EventBody::TurnFailed { .. } => "turn.failed",
            EventBody::TurnCancelled { .. } => "turn.cancelled",
        }
    }
}

/// A stored event: its place in the session's log, its parsed form and its one serialization.
#[derive(Debug, Clone)]
pub struct Event {
    /// Position in the session's log, from 1.
    pub seq: u64,
    pub id: String,
    pub turn_id: String,
    pub created_at: String,
    pub body: EventBody,
    /// The event's JSON: `id`, `type`, `turn_id`, `created_at`, then the body's fields.
    pub json: Arc<str>,
}

impl Event {
    /// Build an event and serialize it once.
    pub fn new(
        seq: u64,
        id: String,
        turn_id: String,
        created_at: String,
        body: EventBody,
    ) -> Event {
        let json = serialize(&id, &turn_id, &created_at, &body);
        Event {
            seq,
            id,
            turn_id,
            created_at,
            body,
            json: json.into(),
        }
    }

    /// Parse a stored serialization back (the bytes are kept as they are).
    pub fn parse(seq: u64, json: &str) -> Result<Event, serde_json::Error> {
        let mut v: Map<String, Value> = serde_json::from_str(json)?;
        let take = |v: &mut Map<String, Value>, k: &str| match v.remove(k) {
            Some(Value::String(s)) => Ok(s),
            _ => Err(serde::de::Error::custom(format!(
                "stored event without {k}"
            ))),
        };
        let id = take(&mut v, "id")?;
        let turn_id = take(&mut v, "turn_id")?;
        let created_at = take(&mut v, "created_at")?;
        let body: EventBody = serde_json::from_value(Value::Object(v))?;
        Ok(Event {
            seq,
            id,
            turn_id,
            created_at,
            body,
            json: json.into(),
        })
    }
}

/// `{"id", "type", "turn_id", "created_at", ...the body's fields}`, written straight out (no
/// `Value` in between): the body serializes as `{"type":"…",<fields>}` (an internally tagged
/// enum writes its tag first), and its fields are spliced in after the envelope.
fn serialize(id: &str, turn_id: &str, created_at: &str, body: &EventBody) -> String {
    let name = body.type_name();
    let mut out = Vec::with_capacity(160);
    out.extend_from_slice(b"{\"id\":");
    push_json_str(&mut out, id);
    out.extend_from_slice(b",\"type\":\"");
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(b"\",\"turn_id\":");
    push_json_str(&mut out, turn_id);
    out.extend_from_slice(b",\"created_at\":");
    push_json_str(&mut out, created_at);
    // The body serializes as `{"type":"<name>"` then `}` or `,<fields>}`: written in place, its
    // tag is then cut out, so that its fields follow the envelope's. (Serializing our own enum
    // cannot fail: every field is plain data.)
    let body_at = out.len();
    let written = serde_json::to_writer(&mut out, body).is_ok();
    let prefix = br#"{"type":""#;
    let tag_len = prefix.len() + name.len() + 1;
    let tagged = written
        && out.get(body_at..body_at + tag_len).is_some_and(|tag| {
            tag[..prefix.len()] == *prefix
                && tag[prefix.len()..tag_len - 1] == *name.as_bytes()
                && tag[tag_len - 1] == b'"'
        });
    if tagged {
        out.drain(body_at..body_at + tag_len);
    } else {
        out.truncate(body_at);
        out.push(b'}');
    }
    // Only JSON was written, and JSON is UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // A string always serializes.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests;

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
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn serialization_puts_common_fields_first_and_round_trips() {
        let ev = Event::new(
            3,
            "evt_1".into(),
            "turn_1".into(),
            "2026-01-01T00:00:00.000Z".into(),
            EventBody::ToolResult {
                tool_use_id: "call_1".into(),
                content: json!("18C"),
                is_error: false,
                files: vec![],
            },
        );
        assert_eq!(
            &*ev.json,
            r#"{"id":"evt_1","type":"agent.tool_result","turn_id":"turn_1","created_at":"2026-01-01T00:00:00.000Z","tool_use_id":"call_1","content":"18C","is_error":false,"files":[]}"#
        );
        let back = Event::parse(3, &ev.json).unwrap();
        assert_eq!(back.body, ev.body);
        assert_eq!(back.id, "evt_1");
        assert_eq!(&*back.json, &*ev.json);
    }

    /// The envelope as a `Value` map, the way events were first serialized: the direct writer
    /// must give exactly these bytes for every kind of event.
    fn via_value(id: &str, turn_id: &str, created_at: &str, body: &EventBody) -> String {
        let mut out = Map::new();
        out.insert("id".into(), Value::String(id.into()));
        out.insert("type".into(), Value::String(body.type_name().into()));
        out.insert("turn_id".into(), Value::String(turn_id.into()));
        out.insert("created_at".into(), Value::String(created_at.into()));
        if let Ok(Value::Object(fields)) = serde_json::to_value(body) {
            for (k, v) in fields {
                if k != "type" {
                    out.insert(k, v);
                }
            }
        }
        Value::Object(out).to_string()
    }

    #[test]
    fn every_kind_of_event_serializes_as_its_envelope_then_its_fields() {
        let file = FileRef {
            id: "file_1".into(),
            filename: "a \"q\".txt".into(),
            mime_type: "text/plain".into(),
            size_bytes: 3,
        };
        let usage = Some(Usage::default());
        let bodies = vec![
            EventBody::UserMessage {
                content: json!([{"type": "text", "text": "héllo\n\u{1F600} \"x\""}]),
                files: vec![file.clone()],
                skills: vec![json!({"name": "s"})],
            },
            EventBody::AgentThinking {
                content: "\t<b>&</b>".into(),
                signature: None,
                blocks: vec![],
            },
            EventBody::AgentThinking {
                content: "t".into(),
                signature: Some("U0lH".into()),
                blocks: vec![],
            },
            EventBody::AgentThinking {
                content: REDACTED_THINKING.into(),
                signature: None,
                blocks: vec![SignedThinking::RedactedThinking {
                    data: "RU5D".into(),
                }],
            },
            EventBody::AgentMessage {
                content: String::new(),
                plan: false,
                compaction: false,
                replaces: None,
            },
            EventBody::AgentMessage {
                content: "1. plan".into(),
                plan: true,
                compaction: false,
                replaces: None,
            },
            EventBody::AgentMessage {
                content: "Summary".into(),
                plan: false,
                compaction: true,
                replaces: Some(["evt_1".into(), "evt_9".into()]),
            },
            EventBody::ToolUse {
                tool_use_id: "call_1".into(),
                name: "mcp__t__x".into(),
                input: json!({"z": 1, "a": [null, 2.5, "\\"]}),
            },
            EventBody::ToolResult {
                tool_use_id: "call_1".into(),
                content: json!([{"type": "text", "text": "ok"}]),
                is_error: true,
                files: vec![file],
            },
            EventBody::TurnCompleted {
                usage,
                stop_reason: StopReason::MaxSteps,
            },
            EventBody::TurnFailed {
                reason: FailReason::WorkerLost,
                usage: None,
                message: Some("gone \u{7}".into()),
            },
            EventBody::TurnFailed {
                reason: FailReason::Timeout,
                usage,
                message: None,
            },
            EventBody::TurnCancelled { usage: None },
        ];
        for body in bodies {
            let ev = Event::new(
                1,
                "evt_\"1".into(),
                "turn_1".into(),
                "2026".into(),
                body.clone(),
            );
            assert_eq!(&*ev.json, via_value("evt_\"1", "turn_1", "2026", &body));
            assert_eq!(Event::parse(1, &ev.json).unwrap().body, body);
        }
    }

    #[test]
    fn thinking_keeps_signatures_compactly_and_is_never_empty() {
        let signed = |t: &str, s: &str| SignedThinking::Thinking {
            thinking: t.into(),
            signature: s.into(),
        };
        let redacted = SignedThinking::RedactedThinking { data: "ENC".into() };
        assert_eq!(EventBody::thinking("", &[]), None);
        let plain = EventBody::thinking("hmm", &[]).unwrap();
        assert_eq!(
            serde_json::to_value(&plain).unwrap(),
            json!({"type": "agent.thinking", "content": "hmm"})
        );
        assert!(plain.signed_thinking().is_empty());
        // One signed block: only its signature beside the content.
        let one = EventBody::thinking("hmm", &[signed("hmm", "SIG")]).unwrap();
        assert_eq!(
            serde_json::to_value(&one).unwrap(),
            json!({"type": "agent.thinking", "content": "hmm", "signature": "SIG"})
        );
        assert_eq!(one.signed_thinking(), vec![signed("hmm", "SIG")]);
        // Several, or redacted: every block as issued.
        let all = vec![redacted.clone(), signed("a", "S1"), signed("b", "S2")];
        let many = EventBody::thinking("ab", &all).unwrap();
        assert_eq!(many.signed_thinking(), all);
        let v = serde_json::to_value(&many).unwrap();
        assert_eq!(
            v["blocks"][0],
            json!({"type": "redacted_thinking", "data": "ENC"})
        );
        assert!(v.get("signature").is_none());
        // Only redacted thinking: a content that says so.
        let hidden = EventBody::thinking("", std::slice::from_ref(&redacted)).unwrap();
        assert_eq!(
            hidden,
            EventBody::AgentThinking {
                content: REDACTED_THINKING.into(),
                signature: None,
                blocks: vec![redacted],
            }
        );
        // Stored and read back.
        let ev = Event::new(1, "evt_1".into(), "turn_1".into(), "t".into(), many.clone());
        assert_eq!(Event::parse(1, &ev.json).unwrap().body, many);
    }

    #[test]
    fn terminal_events_carry_usage_or_null() {
        let ev = Event::new(
            1,
            "evt_2".into(),
            "turn_1".into(),
            "t".into(),
            EventBody::TurnCancelled { usage: None },
        );
        assert!(ev.json.ends_with(r#""usage":null}"#), "{}", ev.json);
        assert!(ev.body.is_terminal());
    }
}

//! AAP history as a projection of the event log.
//!
//! The same fold serves the model's context, `GET /sessions/{id}/history` and the messages of a
//! turn's JSON response. Rules: a `user.message` becomes a user message (its `tool_result` /
//! `tool_permission` blocks are not history: the `agent.tool_result` events that follow are);
//! thinking, text and tool uses of one model step form one assistant message; each
//! `agent.tool_result` is a tool message; an empty `agent.message` (a retraction) adds nothing.

use serde_json::Value;

use super::session::PlanDecision;
use crate::log::{EventBody, FileRef};
use crate::message::{Block, Content, Message};

/// Folds events into history messages.
#[derive(Debug, Clone, Default)]
pub struct Projector {
    messages: Vec<Message>,
    assistant: Vec<Block>,
    /// Files attached to user messages: (index in `messages`, the files).
    attachments: Vec<(usize, Vec<FileRef>)>,
    /// Where the current turn's messages start, and whether it has produced anything yet.
    turn_start: usize,
    turn_output: bool,
    /// The tool calls of the current turn: a result for any other call answers an earlier
    /// turn's, and goes before the current turn's user message.
    turn_calls: Vec<String>,
}

/// How an attached file appears in history: one line naming it and where it is.
pub fn attachment_line(f: &FileRef) -> String {
    format!(
        "[Attached file: {} ({}, {} bytes), in the workspace at /workspace/{}]",
        f.filename, f.mime_type, f.size_bytes, f.filename
    )
}

impl Projector {
    /// Start from seed messages (a session's `messages` at creation).
    pub fn with_seed(seed: &[Message]) -> Projector {
        Projector {
            messages: seed.to_vec(),
            assistant: Vec::new(),
            attachments: Vec::new(),
            turn_start: seed.len(),
            turn_output: false,
            turn_calls: Vec::new(),
        }
    }

    pub fn apply(&mut self, ev: &EventBody) {
        match ev {
            EventBody::UserMessage { content, files, .. } => {
                self.close_assistant();
                self.turn_start = self.messages.len();
                self.turn_output = false;
                self.turn_calls.clear();
                if let Some(decision) = PlanDecision::of_content(content) {
                    self.decide(&decision);
                    self.turn_output = true;
                    return;
                }
                let content = user_content(content);
                if files.is_empty() {
                    if let Some(content) = content {
                        self.messages.push(Message::User { content });
                    }
                } else {
                    let mut blocks = content.map(|c| c.blocks()).unwrap_or_default();
                    blocks.extend(files.iter().map(|f| Block::Text {
                        text: attachment_line(f),
                    }));
                    self.attachments.push((self.messages.len(), files.clone()));
                    self.messages.push(Message::User {
                        content: Content::Blocks(blocks),
                    });
                }
            }
            EventBody::AgentThinking { content, .. } => self.assistant.push(Block::Thinking {
                thinking: content.clone(),
                signed: ev.signed_thinking(),
            }),
            EventBody::AgentMessage { content, .. } => {
                if !content.is_empty() {
                    self.assistant.push(Block::Text {
                        text: content.clone(),
                    })
                }
            }
            EventBody::ToolUse {
                tool_use_id,
                name,
                input,
            } => {
                self.turn_calls.push(tool_use_id.clone());
                self.assistant.push(Block::ToolUse {
                    tool_call_id: tool_use_id.clone(),
                    name: name.clone(),
                    input: input.clone(),
                })
            }
            EventBody::ToolResult {
                tool_use_id,
                content,
                ..
            } => {
                self.close_assistant();
                let message = Message::Tool {
                    tool_call_id: tool_use_id.clone(),
                    content: to_content(content),
                };
                if self.turn_calls.contains(tool_use_id) {
                    self.messages.push(message);
                } else {
                    // An earlier turn's call, answered as this turn starts: its result goes
                    // right after the calls, before this turn's user message (a model API
                    // wants every call answered before anything else is said).
                    let at = self.turn_start.min(self.messages.len());
                    self.messages.insert(at, message);
                    self.turn_start = at + 1;
                    for (i, _) in self.attachments.iter_mut() {
                        if *i >= at {
                            *i += 1;
                        }
                    }
                }
            }
            // A turn cancelled before it ever ran (queued) was never part of the
            // conversation: its message leaves the history (the log keeps it).
            EventBody::TurnCancelled { usage: None } if !self.turn_output => {
                self.assistant.clear();
                self.messages.truncate(self.turn_start);
                let start = self.turn_start;
                self.attachments.retain(|(i, _)| *i < start);
            }
            EventBody::TurnCompleted { .. }
            | EventBody::TurnFailed { .. }
            | EventBody::TurnCancelled { .. } => self.close_assistant(),
        }
        if !matches!(ev, EventBody::UserMessage { .. }) && !ev.is_terminal() {
            self.turn_output = true;
        }
    }

    /// A plan decision as the model (and AAP history) sees it: a user message saying it; an
    /// edited plan replaces the proposed one (the last assistant message) in the history.
    fn decide(&mut self, decision: &PlanDecision) {
        let text = match decision {
            PlanDecision::Confirm { edits: Some(edits) } => {
                if let Some(Message::Assistant { content }) = self
                    .messages
                    .iter_mut()
                    .rev()
                    .find(|m| matches!(m, Message::Assistant { .. }))
                {
                    *content = Content::Text(edits.clone());
                }
                "The plan is approved, as edited by the user (the plan above is the edited one). Carry it out now, using tools as needed.".to_string()
            }
            PlanDecision::Confirm { edits: None } => {
                "The plan is approved. Carry it out now, using tools as needed.".to_string()
            }
            PlanDecision::Reject { reason } => {
                let why = match reason.as_deref().map(str::trim) {
                    Some(r) if !r.is_empty() => format!(": {r}"),
                    _ => String::new(),
                };
                format!("The plan was rejected{why}. Propose a new plan; do not call tools yet.")
            }
        };
        self.messages.push(Message::User {
            content: Content::Text(text),
        });
    }

    fn close_assistant(&mut self) {
        if !self.assistant.is_empty() {
            let blocks = std::mem::take(&mut self.assistant);
            self.messages.push(Message::Assistant {
                content: Content::from_blocks(blocks),
            });
        }
    }

    /// The history so far (an unfinished assistant message included).
    pub fn messages(&self) -> Vec<Message> {
        let mut out = self.messages.clone();
        if !self.assistant.is_empty() {
            out.push(Message::Assistant {
                content: Content::from_blocks(self.assistant.clone()),
            });
        }
        out
    }

    /// Every file attached so far.
    pub fn attached_files(&self) -> Vec<FileRef> {
        self.attachments
            .iter()
            .flat_map(|(_, f)| f.iter().cloned())
            .collect()
    }

    /// The history with each attachment line replaced by what `inline` gives for its file (the
    /// file's content, for the model).
    pub fn messages_inlined(
        &self,
        inline: &dyn Fn(&FileRef) -> Option<Vec<Block>>,
    ) -> Vec<Message> {
        let mut out = self.messages();
        for (idx, files) in &self.attachments {
            if let Some(Message::User {
                content: Content::Blocks(blocks),
            }) = out.get_mut(*idx)
            {
                for f in files {
                    let line = attachment_line(f);
                    if let Some(pos) = blocks
                        .iter()
                        .position(|b| matches!(b, Block::Text { text } if *text == line))
                    {
                        if let Some(replacement) = inline(f) {
                            blocks.splice(pos..=pos, replacement);
                        }
                    }
                }
            }
        }
        out
    }

    pub fn into_messages(mut self) -> Vec<Message> {
        self.close_assistant();
        self.messages
    }
}

/// The history content of a `user.message`, without its tool result and permission blocks.
fn user_content(content: &Value) -> Option<Content> {
    match content {
        Value::String(s) => Some(Content::Text(s.clone())),
        Value::Array(items) => {
            let blocks: Vec<Block> = items
                .iter()
                .filter(|b| {
                    !matches!(
                        b.get("type").and_then(Value::as_str),
                        Some("tool_result" | "tool_permission")
                    )
                })
                .filter_map(|b| serde_json::from_value(b.clone()).ok())
                .collect();
            (!blocks.is_empty()).then_some(Content::Blocks(blocks))
        }
        _ => None,
    }
}

/// A stored tool result (`"text"` or blocks) as message content.
pub fn to_content(v: &Value) -> Content {
    match v {
        Value::String(s) => Content::Text(s.clone()),
        other => serde_json::from_value(other.clone())
            .unwrap_or_else(|_| Content::Text(other.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::StopReason;
    use serde_json::json;

    fn tool_use(id: &str) -> EventBody {
        EventBody::ToolUse {
            tool_use_id: id.into(),
            name: "get_weather".into(),
            input: json!({"city": "Tokyo"}),
        }
    }

    #[test]
    fn a_tool_round_trip_projects_to_aap_history() {
        let mut p = Projector::with_seed(&[Message::System {
            content: "sys".into(),
        }]);
        let events = [
            EventBody::UserMessage {
                content: json!("weather?"),
                files: vec![],
                skills: vec![],
            },
            EventBody::AgentMessage {
                content: "Let me check.".into(),
                plan: false,
            },
            tool_use("call_1"),
            EventBody::TurnCompleted {
                usage: None,
                stop_reason: StopReason::ToolUse,
            },
            EventBody::UserMessage {
                content: json!([{"type": "tool_result", "tool_use_id": "call_1", "content": "18C"}]),
                files: vec![],
                skills: vec![],
            },
            EventBody::ToolResult {
                tool_use_id: "call_1".into(),
                content: json!("18C"),
                is_error: false,
                files: vec![],
            },
            EventBody::AgentMessage {
                content: "It is 18C.".into(),
                plan: false,
            },
            EventBody::TurnCompleted {
                usage: None,
                stop_reason: StopReason::EndTurn,
            },
        ];
        for e in &events {
            p.apply(e);
        }
        let v = serde_json::to_value(p.into_messages()).unwrap();
        assert_eq!(
            v,
            json!([
                {"role": "system", "content": "sys"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Let me check."},
                    {"type": "tool_use", "toolCallId": "call_1", "name": "get_weather", "input": {"city": "Tokyo"}}
                ]},
                {"role": "tool", "toolCallId": "call_1", "content": "18C"},
                {"role": "assistant", "content": "It is 18C."}
            ])
        );
    }

    #[test]
    fn a_turn_cancelled_while_queued_leaves_no_message() {
        let mut p = Projector::default();
        let user = |t: &str| EventBody::UserMessage {
            content: json!(t),
            files: vec![],
            skills: vec![],
        };
        p.apply(&user("one"));
        p.apply(&EventBody::AgentMessage {
            content: "answer".into(),
            plan: false,
        });
        p.apply(&EventBody::TurnCompleted {
            usage: None,
            stop_reason: StopReason::EndTurn,
        });
        p.apply(&user("two"));
        p.apply(&EventBody::TurnCancelled { usage: None });
        p.apply(&user("three"));
        p.apply(&EventBody::TurnCancelled {
            usage: Some(crate::message::Usage::default()),
        });
        let v = serde_json::to_value(p.into_messages()).unwrap();
        assert_eq!(
            v,
            json!([
                {"role": "user", "content": "one"},
                {"role": "assistant", "content": "answer"},
                {"role": "user", "content": "three"}
            ]),
            "a turn cancelled while it ran keeps its message"
        );
    }

    #[test]
    fn an_earlier_turns_call_answered_by_a_new_message_goes_before_it() {
        let mut p = Projector::default();
        let user = |t: &str| EventBody::UserMessage {
            content: json!(t),
            files: vec![],
            skills: vec![],
        };
        p.apply(&user("weather?"));
        p.apply(&tool_use("call_1"));
        p.apply(&EventBody::TurnCompleted {
            usage: None,
            stop_reason: StopReason::ToolUse,
        });
        p.apply(&user("never mind"));
        p.apply(&EventBody::ToolResult {
            tool_use_id: "call_1".into(),
            content: json!("Not answered"),
            is_error: true,
            files: vec![],
        });
        p.apply(&tool_use("call_2"));
        p.apply(&EventBody::ToolResult {
            tool_use_id: "call_2".into(),
            content: json!("ok"),
            is_error: false,
            files: vec![],
        });
        let roles: Vec<String> = serde_json::to_value(p.into_messages())
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(
            roles,
            ["user", "assistant", "tool", "user", "assistant", "tool"]
        );
    }

    #[test]
    fn plan_decisions_say_themselves_and_an_edit_replaces_the_plan() {
        let mut p = Projector::default();
        p.apply(&EventBody::UserMessage {
            content: json!("goal"),
            files: vec![],
            skills: vec![],
        });
        p.apply(&EventBody::AgentMessage {
            content: "1. a".into(),
            plan: true,
        });
        p.apply(&EventBody::TurnCompleted {
            usage: None,
            stop_reason: StopReason::EndTurn,
        });
        p.apply(&EventBody::UserMessage {
            content: json!([{"type": "plan_decision", "decision": "confirmed", "edits": "1. b"}]),
            files: vec![],
            skills: vec![],
        });
        let v = serde_json::to_value(p.into_messages()).unwrap();
        assert_eq!(v[1], json!({"role": "assistant", "content": "1. b"}));
        assert!(v[2]["content"].as_str().unwrap().contains("approved"));
    }

    #[test]
    fn a_retraction_adds_nothing_and_thinking_stays() {
        let mut p = Projector::default();
        p.apply(&EventBody::AgentThinking {
            content: "hmm".into(),
            signature: None,
            blocks: vec![],
        });
        p.apply(&EventBody::AgentMessage {
            content: String::new(),
            plan: false,
        });
        p.apply(&EventBody::AgentMessage {
            content: "answer".into(),
            plan: false,
        });
        let v = serde_json::to_value(p.into_messages()).unwrap();
        assert_eq!(
            v,
            json!([{"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hmm"}, {"type": "text", "text": "answer"}
            ]}])
        );
    }
}

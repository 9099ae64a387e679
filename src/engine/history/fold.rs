//! How each logged event changes the projection: the folding of the log into messages.

use serde_json::Value;

use super::{attachment_line, to_content, user_content, Cut, Projector};
use crate::engine::session_record::PlanDecision;
use crate::log::{Event, EventBody, FileRef};
use crate::message::{Block, Content, Message};

impl Projector {
    /// Fold an event with its id: what compactions need (they name the events they replace).
    /// The session's history is folded this way; a fold of one turn's events needs only
    /// [`Projector::apply`].
    pub fn apply_event(&mut self, ev: &Event) {
        if self.first_id.is_none() {
            self.first_id = Some(ev.id.clone());
        }
        if let EventBody::AgentMessage {
            content,
            compaction: true,
            replaces: Some([_, last]),
            ..
        } = &ev.body
        {
            self.fold_compaction(content, last);
        }
        self.apply_with(Some(&ev.id), &ev.body);
        self.last_id = Some(ev.id.clone());
    }

    /// A compaction replacing everything up to event `last`: the compacted history starts at
    /// the cut after it. (A compaction naming no known cut is left out: the context stays
    /// whole, which is safe.)
    fn fold_compaction(&mut self, summary: &str, last: &str) {
        let Some(pos) = self.cuts.iter().position(|c| c.before == last) else {
            tracing::warn!(last, "a compaction names no place in the history; ignored");
            return;
        };
        let cut = self.cuts[pos].clone();
        self.cuts.drain(..=pos);
        self.first_id = Some(cut.first);
        self.summary = Some((summary.to_string(), cut.at));
    }

    /// Note that message `at` begins with event `id`: a place where a compaction may end.
    fn cut_here(&mut self, id: Option<&str>, at: usize, user: bool) {
        if let (Some(id), Some(before)) = (id, &self.last_id) {
            self.cuts.push(Cut {
                at,
                user,
                before: before.clone(),
                first: id.to_string(),
            });
        }
    }

    /// Fold an event's body (compactions add nothing here).
    pub fn apply(&mut self, ev: &EventBody) {
        self.apply_with(None, ev)
    }

    fn apply_with(&mut self, id: Option<&str>, ev: &EventBody) {
        match ev {
            EventBody::UserMessage { content, files, .. } => self.user_message(id, content, files),
            EventBody::AgentThinking { content, .. } => {
                self.assistant_begins(id);
                self.assistant.push(Block::Thinking {
                    thinking: content.clone(),
                    signed: ev.signed_thinking(),
                })
            }
            EventBody::AgentMessage {
                compaction: true, ..
            } => {}
            EventBody::AgentMessage { content, .. } => {
                if !content.is_empty() {
                    self.assistant_begins(id);
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
                self.assistant_begins(id);
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
            } => self.tool_result(tool_use_id, content),
            // A turn cancelled before it ever ran (queued) was never part of the
            // conversation: its message leaves the history (the log keeps it).
            EventBody::TurnCancelled { usage: None } if !self.turn_output => {
                self.assistant.clear();
                self.messages.truncate(self.turn_start);
                let start = self.turn_start;
                self.attachments.retain(|(i, _)| *i < start);
                self.cuts.retain(|c| c.at < start);
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

    /// An assistant message begins with this event, unless one is open already.
    fn assistant_begins(&mut self, id: Option<&str>) {
        if self.assistant.is_empty() {
            self.cut_here(id, self.messages.len(), false);
        }
    }

    pub(super) fn close_assistant(&mut self) {
        if !self.assistant.is_empty() {
            let blocks = std::mem::take(&mut self.assistant);
            self.messages.push(Message::Assistant {
                content: Content::from_blocks(blocks),
            });
        }
    }

    /// A user message starts a turn: its content and attached files, or a plan decision.
    fn user_message(&mut self, id: Option<&str>, content: &Value, files: &[FileRef]) {
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
        if content.is_some() || !files.is_empty() {
            self.cut_here(id, self.messages.len(), true);
        }
        if files.is_empty() {
            if let Some(content) = content {
                self.messages.push(Message::User { content });
            }
        } else {
            let mut blocks = content.map(|c| c.blocks()).unwrap_or_default();
            blocks.extend(files.iter().map(|f| Block::Text {
                text: attachment_line(f),
            }));
            self.attachments.push((self.messages.len(), files.to_vec()));
            self.messages.push(Message::User {
                content: Content::Blocks(blocks),
            });
        }
    }

    /// A tool's result: after its call, or, for an earlier turn's call answered as this turn
    /// starts, before this turn's user message.
    fn tool_result(&mut self, tool_use_id: &str, content: &Value) {
        self.close_assistant();
        let message = Message::Tool {
            tool_call_id: tool_use_id.to_string(),
            content: to_content(content),
        };
        if self.turn_calls.iter().any(|c| c == tool_use_id) {
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
}

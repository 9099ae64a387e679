//! AAP history as a projection of the event log.
//!
//! The same fold serves the model's context, `GET /sessions/{id}/history` and the messages of a
//! turn's JSON response. Rules: a `user.message` becomes a user message (its `tool_result` /
//! `tool_permission` blocks are not history: the `agent.tool_result` events that follow are);
//! thinking, text and tool uses of one model step form one assistant message; each
//! `agent.tool_result` is a tool message; an empty `agent.message` (a retraction) adds nothing.
//!
//! A compaction (an `agent.message` with `compaction: true`, see `engine/context_window.rs`) adds
//! nothing to the full history; folded with its event ids ([`Projector::apply_event`]), it
//! starts the compacted history, which the model is sent: the seed's system message, the
//! summary as a user message, then the messages after the last event it replaces.

mod fold;

use serde_json::Value;

use crate::log::FileRef;
use crate::message::{Block, Content, Message};

/// Gives an attached file as the model sees it (its content), or `None` to keep its line.
pub type Inline<'a> = dyn Fn(&FileRef) -> Option<Vec<Block>> + 'a;

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
    /// Where the compacted history may start, after the last compaction: a message index
    /// before which nothing is a tool result's call (see [`Cut`]).
    cuts: Vec<Cut>,
    /// The id of the last event folded with its id.
    last_id: Option<String>,
    /// The id of the first event not yet compacted (`None`: no event yet).
    first_id: Option<String>,
    /// The last compaction: its summary and the index of the first message it keeps.
    summary: Option<(String, usize)>,
}

/// A place where the compacted history may start: message `at` begins (a user message, or an
/// assistant message, never a tool result), and `before` is the id of the event before it (the
/// last event a compaction cut here replaces); `first` is the id of the event that began it.
#[derive(Debug, Clone)]
struct Cut {
    at: usize,
    /// A user message starts here (else an assistant message).
    user: bool,
    before: String,
    first: String,
}

/// What may be compacted now: the messages after the last compaction, the places where a new
/// compaction may end, and the ids it would replace.
#[derive(Debug, Clone, Default)]
pub struct Compactable {
    /// The last summary, if any (what precedes `messages`).
    pub summary: Option<String>,
    /// The messages after the last compaction (an unfinished assistant message included).
    pub messages: Vec<Message>,
    /// Indices in `messages` where the kept part may start, ascending, each with whether a
    /// user message starts there and the id of the last event a compaction ending there
    /// replaces. Never past the current turn's start.
    pub cuts: Vec<(usize, bool, String)>,
    /// The id of the first event not yet compacted.
    pub first_id: Option<String>,
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
            ..Projector::default()
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

    /// The compacted history: what the model is sent next (the seed's system message, the
    /// last compaction's summary, the messages after it), with attachments given by `inline`
    /// when it is set. Without a compaction, the full history.
    pub fn compacted(&self, inline: Option<&Inline<'_>>) -> Vec<Message> {
        // Built once and moved, never cloned: this runs before every model call.
        let mut all = match inline {
            Some(inline) => self.messages_inlined(inline),
            None => self.messages(),
        };
        let Some((summary, from)) = &self.summary else {
            return all;
        };
        let rest = all.split_off((*from).min(all.len()));
        let mut out: Vec<Message> = all
            .into_iter()
            .filter(|m| matches!(m, Message::System { .. }))
            .collect();
        out.push(Message::User {
            content: Content::Text(format!("{}{summary}", super::context_window::SUMMARY_INTRO)),
        });
        out.extend(rest);
        out
    }

    /// What a compaction could replace now (see [`Compactable`]).
    pub fn compactable(&self) -> Compactable {
        let all = self.messages();
        let from = self
            .summary
            .as_ref()
            .map_or(0, |(_, at)| *at)
            .min(all.len());
        let cuts = self
            .cuts
            .iter()
            .filter(|c| c.at > from && c.at <= self.turn_start)
            .map(|c| (c.at - from, c.user, c.before.clone()))
            .collect();
        Compactable {
            summary: self.summary.as_ref().map(|(s, _)| s.clone()),
            messages: all[from..].to_vec(),
            cuts,
            first_id: self.first_id.clone(),
        }
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
mod tests;

//! A request waiting in the store's inbox, as its row holds it (JSON): relayed from another
//! instance, or the row of a turn queued here, which stands for it until it begins. Applied by
//! `relayed.rs`; written by the commands (`mod.rs`, `start.rs`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::engine::types::{ClientResult, Permission, SessionUpdate, TurnInput};
use crate::log::FileRef;

/// A request in the inbox.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(super) enum Relayed {
    /// A message's turn (also a queued turn's own row: see [`row_of`]).
    Message {
        content: Value,
        files: Vec<FileRef>,
        skills: Vec<Value>,
        /// Plan mode (a run with `plan`, a plan's rejection).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        plan: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_steps: Option<u32>,
    },
    Cancel {
        turn_id: Option<String>,
    },
    Interrupt,
    /// The decision's `plan_decision` block.
    Plan {
        decision: Value,
    },
    /// A client's answers to the calls a turn stopped on, sent where the session's MCP calls
    /// wait on them (see `answer_relay.rs`): a follow-up turn the client attends from the
    /// instance it reached.
    Resume {
        results: Vec<ClientResult>,
        permissions: Vec<Permission>,
        /// The session settings the follow-up changes (AAP sends its client tools again).
        #[serde(default)]
        update: SessionUpdate,
        /// The client shows streamed text as it comes (see
        /// [`ShownText`](crate::engine::types::ShownText)).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        irrevocable: bool,
    },
}

/// The row that stands for a queued turn in the store's inbox until it begins: the order as a
/// message (`None` for an order no row can hold: only a new message queues).
pub(super) fn row_of(input: &TurnInput, plan: bool, max_steps: Option<u32>) -> Option<String> {
    let TurnInput::User {
        content,
        files,
        skills,
    } = input
    else {
        return None;
    };
    let relayed = Relayed::Message {
        content: content.clone(),
        files: files.clone(),
        skills: skills.clone(),
        plan,
        max_steps,
    };
    serde_json::to_string(&relayed).ok()
}

impl Relayed {
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Relayed::Message { .. } => "message",
            Relayed::Cancel { .. } => "cancel",
            Relayed::Interrupt => "interrupt",
            Relayed::Plan { .. } => "plan",
            Relayed::Resume { .. } => "resume",
        }
    }
}

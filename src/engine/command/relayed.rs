//! Requests relayed from another instance through the store's inbox (see
//! `engine/scaleout/relay.rs`): what they are, and how the instance that runs the session
//! applies them, through the same calls a request made here takes once it holds the lease: a
//! queued message is queued (or run) under the turn id the receiving instance answered; a
//! cancel or an interrupt cancels; a plan decision decides.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::engine::engine_handle::Engine;
use crate::engine::session::Session;
use crate::engine::session_record::PlanDecision;
use crate::engine::types::{EngineError, TurnInput, TurnOrder};
use crate::log::{FileRef, InboxRow};

/// Where a client attends a turn, for the turns the holder starts from the inbox (the events
/// and runs APIs say the same).
const ATTEND_AT: &str = "POST /sessions/{id}/turns";

/// A request in the inbox.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(super) enum Relayed {
    Message {
        content: Value,
        files: Vec<FileRef>,
        skills: Vec<Value>,
    },
    Cancel {
        turn_id: Option<String>,
    },
    Interrupt,
    /// The decision's `plan_decision` block.
    Plan {
        decision: Value,
    },
}

impl Relayed {
    pub(super) fn kind(&self) -> &'static str {
        match self {
            Relayed::Message { .. } => "message",
            Relayed::Cancel { .. } => "cancel",
            Relayed::Interrupt => "interrupt",
            Relayed::Plan { .. } => "plan",
        }
    }
}

/// Apply the rows taken from the session's inbox in order, as the requests they were (the
/// engine's [`Inner::apply_relayed`](crate::engine::engine_handle::Inner)); the rows that must wait (from the first
/// that cannot be applied now on).
pub(crate) fn apply(engine: &Engine, session: &Arc<Session>, rows: Vec<InboxRow>) -> Vec<InboxRow> {
    let mut rows = rows.into_iter();
    while let Some(row) = rows.next() {
        let relayed: Relayed = match serde_json::from_str(&row.body) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "an inbox row does not parse; dropped");
                continue;
            }
        };
        let done = match relayed {
            Relayed::Message {
                content,
                files,
                skills,
            } => {
                let input = TurnInput::User {
                    content,
                    files,
                    skills,
                };
                let order = TurnOrder::unattended(input, ATTEND_AT);
                super::start::start_here(engine, session, order, row.turn_id.clone()).map(drop)
            }
            Relayed::Cancel { turn_id } => {
                super::cancel::cancel_here(engine, session, turn_id.as_deref());
                Ok(())
            }
            Relayed::Interrupt => {
                super::cancel::cancel_here(engine, session, None);
                Ok(())
            }
            Relayed::Plan { decision } => {
                match PlanDecision::of_content(&Value::Array(vec![decision])) {
                    Some(d) => {
                        super::plan::decide_here(engine, session, d, ATTEND_AT, row.turn_id.clone())
                            .map(drop)
                    }
                    None => Ok(()),
                }
            }
        };
        match done {
            Ok(()) => {}
            Err(EngineError::ShuttingDown)
            | Err(EngineError::OverLimit {
                server_wide: true, ..
            }) => return std::iter::once(row).chain(rows).collect(),
            Err(e) => {
                tracing::warn!(session = %session.id, turn = ?row.turn_id, error = %e, "a request from another instance could not be applied; dropped");
            }
        }
    }
    Vec::new()
}

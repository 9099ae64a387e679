//! Requests waiting in the store's inbox: relayed from another instance (see
//! `engine/scaleout/inbox_relay.rs`), or the rows of turns queued here that a crash left
//! unbegun. What they are, and how the instance that runs the session applies them, through
//! the same calls a request made here takes once it holds the lease: a queued message is
//! queued (or run) under the turn id it was answered with; a cancel or an interrupt cancels; a
//! plan decision decides. A turn's row stays until the turn begins (see `start.rs`).

use std::sync::Arc;

use serde_json::{json, Value};

use super::inbox_entry::Relayed;
use crate::engine::engine_handle::{Applied, Engine};
use crate::engine::session::Session;
use crate::engine::session_record::PlanDecision;
use crate::engine::types::{EngineError, ShownText, TurnInput, TurnOrder};
use crate::log::InboxRow;

/// Where a client attends a turn, for the turns the holder starts from the inbox (the events
/// and runs APIs say the same).
const ATTEND_AT: &str = "POST /sessions/{id}/turns";

/// Apply the rows taken from the session's inbox in order, as the requests they were (the
/// engine's [`Inner::apply_relayed`](crate::engine::engine_handle::Inner)): the rows that must
/// wait (from the first that cannot be applied now on), and the replies to their senders.
pub(crate) fn apply(engine: &Engine, session: &Arc<Session>, rows: Vec<InboxRow>) -> Applied {
    let mut applied = Applied::default();
    // Queued turns cancelled before a restart: their `cancel` rows (see `cancel.rs`).
    let cancelled: Vec<String> = rows
        .iter()
        .filter(|r| r.kind == super::cancel::CANCEL_ROW)
        .filter_map(|r| r.turn_id.clone())
        .collect();
    let mut rows = rows.into_iter();
    while let Some(row) = rows.next() {
        let relayed: Relayed = match serde_json::from_str(&row.body) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "an inbox row does not parse; dropped");
                continue;
            }
        };
        let own_cancel = row.kind == super::cancel::CANCEL_ROW && row.turn_id.is_some();
        let replies =
            !own_cancel && !matches!(relayed, Relayed::Message { .. } | Relayed::Resume { .. });
        let outcome = carry_out(engine, session, relayed, row.turn_id.clone(), &cancelled);
        let reply = match outcome {
            Ok(stopped) => json!({ "stopped": stopped }),
            Err(EngineError::ShuttingDown)
            | Err(EngineError::OverLimit {
                server_wide: true, ..
            }) => {
                applied.back = std::iter::once(row).chain(rows).collect();
                return applied;
            }
            Err(e) => {
                tracing::warn!(session = %session.id, turn = ?row.turn_id, error = %e, "a request waiting in the inbox could not be carried out; dropped");
                if let Some(turn_id) = &row.turn_id {
                    engine.inner.store.inbox_row_done(&session.id, turn_id);
                }
                json!({ "error": e.to_string() })
            }
        };
        if replies {
            applied.replies.push((row.seq, reply.to_string()));
        }
    }
    applied
}

/// Carry out one request of the inbox, under the turn id it was answered with (if any): the
/// turns a cancel or an interrupt stopped.
fn carry_out(
    engine: &Engine,
    session: &Arc<Session>,
    relayed: Relayed,
    turn_id: Option<String>,
    cancelled: &[String],
) -> Result<Vec<String>, EngineError> {
    match relayed {
        Relayed::Message {
            content,
            files,
            skills,
            plan,
            max_steps,
        } => {
            let input = TurnInput::User {
                content,
                files,
                skills,
            };
            let order = TurnOrder {
                plan,
                ..TurnOrder::unattended(input, ATTEND_AT)
            }
            .with_max_steps(max_steps);
            match turn_id {
                // Cancelled while it waited, before a restart: logged so, never run.
                Some(t) if cancelled.contains(&t) => {
                    super::cancel::log_cancelled(engine, session, order, t);
                    Ok(Vec::new())
                }
                turn_id => super::start::start_here(engine, session, order, turn_id, true)
                    .map(|_| Vec::new()),
            }
        }
        Relayed::Cancel { turn_id } => Ok(super::cancel::cancel_here(
            engine,
            session,
            turn_id.as_deref(),
        )),
        Relayed::Interrupt => Ok(super::cancel::cancel_here(engine, session, None)),
        Relayed::Resume {
            results,
            permissions,
            update,
            irrevocable,
        } => {
            let input = TurnInput::Resume {
                results,
                permissions,
            };
            let mut order = TurnOrder::attended(input, update);
            if irrevocable {
                order.delivery.text = ShownText::Irrevocable;
            }
            super::start::start_here(engine, session, order, turn_id, true).map(|_| Vec::new())
        }
        Relayed::Plan { decision } => {
            match PlanDecision::of_content(&Value::Array(vec![decision])) {
                Some(d) => super::plan::decide_here(engine, session, d, ATTEND_AT, turn_id, true)
                    .map(|_| Vec::new()),
                None => Ok(Vec::new()),
            }
        }
    }
}

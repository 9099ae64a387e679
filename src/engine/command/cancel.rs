//! Cancelling turns here: one turn (running or queued), or every turn and a plan's wait.

use std::sync::Arc;

use super::inbox_entry::Relayed;
use crate::engine::engine_handle::Engine;
use crate::engine::session::Session;
use crate::engine::session_record::PlanDecision;
use crate::engine::session_state::State;
use crate::engine::turn;
use crate::engine::turn_job::{Job, StopCause, TurnControl};
use crate::engine::types::{TurnInput, TurnOrder};
use crate::ids;

/// Cancel one turn (running or queued) or, with no id, the running turn and every queued
/// one. Idempotent: a turn that already ended is left alone. The ids it stopped.
pub(super) fn cancel_here(
    engine: &Engine,
    session: &Arc<Session>,
    turn_id: Option<&str>,
) -> Vec<String> {
    let (stopped, next) = {
        let mut st = session.lock();
        // A plan waits from before its turn's last write is durable: that turn, still
        // running, has ended but for it. The interrupt ends the wait, not the turn.
        let plan_waits = turn_id.is_none() && st.plan().is_some();
        let wanted = |id: &str| turn_id.is_none_or(|t| t == id);
        let mut stopped = st.turns().cancel(wanted, !plan_waits);
        note_cancelled_rows(engine, session, &st.turns().queued_with_rows(&stopped));
        if plan_waits && st.take_plan().is_some() {
            stopped.push(interrupt_plan(engine, session, &mut st));
        }
        // Nothing running: cancelled queued turns are logged right away.
        (
            stopped,
            turn::next_queued(session, &mut st, &engine.inner.store),
        )
    };
    if let Some(job) = next {
        turn::spawn(&engine.inner, session.clone(), job);
    }
    stopped
}

/// Queued turns cancelled while their rows in the inbox stand for them: each gets a `cancel`
/// row under its turn id, committed before the cancel is answered, so that a process that
/// stops before the turn is logged leaves it to be logged cancelled, never run (see
/// `relayed.rs`). The turn's [`WriteOp::InboxDone`](crate::log::WriteOp) removes both rows.
fn note_cancelled_rows(engine: &Engine, session: &Session, turn_ids: &[String]) {
    for turn_id in turn_ids {
        let body = Relayed::Cancel {
            turn_id: Some(turn_id.clone()),
        };
        let Ok(body) = serde_json::to_string(&body) else {
            continue;
        };
        engine
            .inner
            .store
            .put_inbox_row(&session.id, turn_id, CANCEL_ROW, body);
    }
}

/// The kind of a queued turn's `cancel` row (see [`note_cancelled_rows`]).
pub(super) const CANCEL_ROW: &str = "cancel";

/// A queued turn that was cancelled (its `cancel` row read back after a restart, see
/// `relayed.rs`): logged cancelled now when no turn runs, else queued stopped behind the
/// running one, to be logged as it ends. Never run.
pub(super) fn log_cancelled(
    engine: &Engine,
    session: &Arc<Session>,
    order: TurnOrder,
    turn_id: String,
) {
    let control = TurnControl::new(turn_id);
    let job = unattended_job(control, order, true);
    let mut st = session.lock();
    log_or_queue_stopped(engine, session, &mut st, job);
}

/// The job of an order no client attends.
fn unattended_job(control: Arc<TurnControl>, order: TurnOrder, row: bool) -> Job {
    Job {
        control,
        input: order.input,
        answering: Vec::new(),
        sink: None,
        client: order.delivery.client,
        plan: order.plan,
        max_steps: order.max_steps,
        text: order.delivery.text,
        slot: None,
        parent: tracing::Span::current(),
        row,
        confirm: false,
    }
}

/// A turn that never runs: logged cancelled now when none runs, else queued stopped (logged
/// as the running one ends).
fn log_or_queue_stopped(engine: &Engine, session: &Session, st: &mut State, job: Job) {
    if st.turns().running().is_none() {
        turn::log_unstarted(session, st, &engine.inner.store, &job);
        return;
    }
    job.control.stop(StopCause::Cancelled);
    st.queue_turn(job);
}

/// Ends the wait of a plan when everything is cancelled (the runs API's interrupt): the
/// run's last turn is a rejection of the plan, cancelled before it started, so the log, the
/// run stream (`done`) and a restart all show that the run ended there. Logged now, or,
/// while the plan's turn is still ending, queued cancelled behind it (logged as it ends).
/// Its turn id.
fn interrupt_plan(engine: &Engine, session: &Session, st: &mut State) -> String {
    let decision = PlanDecision::Reject {
        reason: Some("Interrupted: the run was stopped.".into()),
    };
    let input = TurnInput::User {
        content: serde_json::Value::Array(vec![decision.block()]),
        files: vec![],
        skills: vec![],
    };
    let control = TurnControl::new(ids::new("turn"));
    let turn_id = control.turn_id.clone();
    let job = unattended_job(control, TurnOrder::unattended(input, ""), false);
    log_or_queue_stopped(engine, session, st, job);
    turn_id
}

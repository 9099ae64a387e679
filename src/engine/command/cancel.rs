//! Cancelling turns here: one turn (running or queued), or every turn and a plan's wait.

use std::sync::Arc;

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
    let order = TurnOrder::unattended(input, "");
    let job = Job {
        control: control.clone(),
        input: order.input,
        answering: Vec::new(),
        sink: None,
        client: order.delivery.client,
        plan: false,
        max_steps: None,
        text: order.delivery.text,
        slot: None,
        parent: tracing::Span::current(),
        row: false,
        confirm: false,
    };
    if st.turns().running().is_none() {
        turn::log_unstarted(session, st, &engine.inner.store, &job);
        return turn_id;
    }
    control.stop(StopCause::Cancelled);
    st.queue_turn(job);
    turn_id
}

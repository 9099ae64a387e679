//! Starting a turn here: an order checked against the session's state and limits, then run at
//! once, or queued behind the running turn.

use std::sync::Arc;

use crate::engine::approvals;
use crate::engine::delivery::channel;
use crate::engine::engine_handle::Engine;
use crate::engine::session::Session;
use crate::engine::session_record::Pending;
use crate::engine::session_settings::is_empty_update;
use crate::engine::session_state::State;
use crate::engine::turn;
use crate::engine::turn_handle::{Accept, TurnHandle};
use crate::engine::turn_job::{Job, RunSlot, TurnControl};
use crate::engine::types::{Client, EngineError, Runner, TurnInput, TurnOrder, WhenBusy};
use crate::{clock, ids};

/// Start a turn here (this instance holds the session's lease, or there is none): validate
/// the order against the session's state, apply its overrides and run the turn (on its own
/// task, or its watcher's), or queue it behind the running one when the order says so.
/// Under a turn id minted already (by the instance that answered the request, see
/// `relayed.rs`), or a new one.
///
/// A turn that queues is accepted durably: a row in the store's inbox stands for it until it
/// begins (written here, in the commit the caller waits for with
/// [`TurnHandle::accepted`], unless the order came `from_inbox`, where its row is already).
pub(super) fn start_here(
    engine: &Engine,
    session: &Arc<Session>,
    req: TurnOrder,
    turn_id: Option<String>,
    from_inbox: bool,
) -> Result<TurnHandle, EngineError> {
    engine.check_open()?;
    let drive = req.delivery.runner == Runner::Watcher;
    let (tx, rx, overflow) = channel::channel();
    let mut st = session.lock();
    let after_seq = st.out().tail.last().map_or(0, |e| e.seq);
    // A principal whose `agents` no longer name the session's agent: no more turns there.
    let agent = engine.agent_of(session, &st.record().agent)?;
    let (answering, slot) = admit(engine, session, &mut st, &req, from_inbox)?;
    let changed = !is_empty_update(&req.update);
    let record = if changed {
        let mut record = st.record().as_ref().clone();
        engine.apply_update(&agent, &mut record, req.update)?;
        Some(record)
    } else {
        None
    };
    if let TurnInput::Resume { .. } = &req.input {
        st.clear_pending();
    }
    // The session goes on: a plan that waited for a decision no longer does (a decision
    // took it before starting its turn).
    st.drop_plan();
    if let Some(record) = record {
        st.set_record(record);
    }
    let control = TurnControl::new(turn_id.unwrap_or_else(|| ids::new("turn")));
    // `slot` is `None` for a turn that queues (see `TurnQueue::place`).
    let queued = slot.is_none();
    let order = (&req.input, req.plan, req.max_steps);
    let accept = accept(engine, session, order, &control.turn_id, queued, from_inbox);
    let job = Job {
        control: control.clone(),
        input: req.input,
        answering,
        sink: Some(tx),
        client: req.delivery.client,
        plan: req.plan,
        max_steps: req.max_steps,
        text: req.delivery.text,
        slot,
        parent: tracing::Span::current(),
        row: queued || from_inbox,
        confirm: req.delivery.confirm,
    };
    crate::telemetry::note_turn(&control.turn_id);
    let run_now = st.queue_turn(job);
    drop(st);
    if changed {
        store_settings(engine, session, run_now.is_none());
    }
    let running = (drive && run_now.is_some()).then(|| engine.inner.tracker.token());
    let driven = match run_now {
        Some(job) if drive => Some(turn::drive(&engine.inner, session.clone(), job)),
        Some(job) => {
            turn::spawn(&engine.inner, session.clone(), job);
            None
        }
        None => None,
    };
    let turn_id = control.turn_id.clone();
    let parts = (rx, overflow, driven, running);
    Ok(
        TurnHandle::new((turn_id, after_seq), engine.clone(), session.clone(), parts)
            .accepted_when(accept),
    )
}

/// When the turn is accepted durably (see [`TurnHandle::accepted`]): a turn that queues is
/// written as a row of the inbox here (with the session's lock held, so that rows are in the
/// order of the queue), unless it came from there.
fn accept(
    engine: &Engine,
    session: &Session,
    (input, plan, max_steps): (&TurnInput, bool, Option<u32>),
    turn_id: &str,
    queued: bool,
    from_inbox: bool,
) -> Accept {
    if !queued {
        return Accept::FirstEvent;
    }
    if from_inbox {
        return Accept::Ticket(0);
    }
    match super::inbox_entry::row_of(input, plan, max_steps) {
        Some(body) => {
            let store = &engine.inner.store;
            Accept::Ticket(store.put_inbox_row(&session.id, turn_id, "message", body))
        }
        None => Accept::Ticket(0),
    }
}

/// Write the session's new settings: committed now for a `queued` turn (one that runs now
/// commits them with its first events).
fn store_settings(engine: &Engine, session: &Session, queued: bool) {
    engine.persist(session);
    if queued {
        if let Err(e) = engine.inner.store.commit() {
            tracing::error!(session = %session.id, error = %e, "the session's new settings could not be stored");
        }
    }
}

/// Whether the session can take the order now (with its lock held): it exists, is not busy
/// unless the order queues, the order answers what the session waits on, and the limits
/// allow it. The calls it answers, and its place among the running turns (`None`: queued).
fn admit(
    engine: &Engine,
    session: &Arc<Session>,
    st: &mut State,
    req: &TurnOrder,
    from_inbox: bool,
) -> Result<(Vec<Pending>, Option<RunSlot>), EngineError> {
    if st.is_deleted() {
        return Err(EngineError::NotFound {
            what: "session",
            id: session.id.to_string(),
        });
    }
    if let Some(r) = st.turns().running() {
        if req.when_busy == WhenBusy::Refuse {
            return Err(EngineError::Busy {
                turn_id: r.turn_id.clone(),
            });
        }
    }
    approvals::settle_locked(&engine.inner, session, st, clock::now_ms());
    // A new message where no client can answer the open calls (a message of the events
    // API, a run) goes on: its turn answers them first (see `Turn::begin`). Where a client
    // attends, it is a conflict.
    let goes_on = matches!(req.delivery.client, Client::Absent { .. })
        && matches!(req.input, TurnInput::User { .. });
    let answering = if goes_on {
        Vec::new()
    } else {
        let history = st.history();
        crate::engine::answer_check::check_answers(st.pending(), &req.input, &|| {
            history.messages()
        })?
    };
    // An order from the inbox was admitted when it was sent: it queues past the limit.
    if from_inbox && st.turns().running().is_some() {
        return Ok((answering, None));
    }
    let place = st
        .turns()
        .place(&engine.inner.config().limits, &engine.inner.running_turns)?;
    Ok((answering, place))
}

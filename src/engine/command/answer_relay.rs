//! A client's answers to the calls a turn stopped on, reaching an instance other than the one
//! that holds the session (a shared store). A turn that stopped on questions of MCP servers
//! keeps those MCP calls open in the memory of the instance that ran it, which holds the
//! session's lease until they are answered: the answers go to it through the store's inbox
//! (`relayed.rs` starts the follow-up turn there, under the turn id minted here), and the
//! client that sent them attends that turn from here, its events followed in the log.
//!
//! A turn refused so is checked against the session as its log holds it, with the calls the
//! holder keeps open alive (see [`client_questions::still_asked`]): a malformed or stale answer
//! gets the error one instance gives, before anything is sent; a new message while no call
//! waits finds the lease being handed back (the holder releases it right after the turn's end
//! is published, which a client following the turn here may see first), and claims it again.
//! Should the holder still refuse the answers (another answer came first through another
//! instance, the calls expired meanwhile), nothing of the turn is logged: the client's stream
//! ends after [`taken_within`] without a terminal event.

use std::sync::Arc;
use std::time::Duration;

use super::inbox_entry::Relayed;
use crate::engine::answer_check::check_answers;
use crate::engine::client_questions;
use crate::engine::engine_handle::Engine;
use crate::engine::log_follower::Follow;
use crate::engine::scaleout;
use crate::engine::session::Session;
use crate::engine::session_state::State;
use crate::engine::turn_handle::TurnHandle;
use crate::engine::turn_queue::queue_full;
use crate::engine::types::{Client, EngineError, ShownText, TurnInput, TurnOrder};
use crate::log::Posted;

/// What a turn refused by the holder of the session's lease comes to.
pub(super) enum Sent {
    /// The holder has the answers: the follow-up turn, followed here.
    Turn(TurnHandle),
    /// The log shows nothing that holds the lease there (no turn open, no call waiting on a
    /// question): the holder is handing it back, or has. The caller claims it again.
    ClaimAgain,
}

/// A turn (`order`) for a session whose lease another instance holds, which refused this
/// one's claim (`busy`), checked against the session as its log holds it: `session_busy` naming the turn while a
/// turn is open there, the error one instance gives for answers that do not fit the calls it
/// waits on, a client's answers sent to the holder (see the module documentation), else
/// [`Sent::ClaimAgain`].
pub(super) async fn answer_elsewhere(
    engine: &Engine,
    session: &Arc<Session>,
    order: TurnOrder,
    busy: EngineError,
) -> Result<Sent, EngineError> {
    // A turn open there (the common case): refused on what this instance has not seen yet
    // of the log, before reading it whole.
    if let Some(turn_id) = engine.open_turn(session).await? {
        return Err(EngineError::Busy { turn_id });
    }
    let checked = scaleout::read_back(&engine.inner, session, |st| {
        check(engine, session, st, &order)
    })
    .await
    .ok()
    .flatten()
    .flatten();
    let Some(checked) = checked else {
        // The log read back shows a turn open (its first commit came meanwhile): name it.
        return Err(match engine.open_turn(session).await? {
            Some(turn_id) => EngineError::Busy { turn_id },
            None => busy,
        });
    };
    let after_seq = checked?;
    let TurnInput::Resume {
        results,
        permissions,
    } = &order.input
    else {
        return Ok(Sent::ClaimAgain);
    };
    // Subscribed before the answers go: the turn's first commit is heard.
    let follow = Follow::new(engine, session.clone(), after_seq).await?;
    let relayed = Relayed::Resume {
        results: results.clone(),
        permissions: permissions.clone(),
        update: order.update,
        irrevocable: order.delivery.text == ShownText::Irrevocable,
    };
    let turn_id = crate::ids::new("turn");
    match engine
        .post_relayed(session, &relayed, Some(turn_id.clone()))
        .await?
    {
        Posted::Queued(_) => {
            let wait = taken_within(engine);
            let handle = TurnHandle::followed((turn_id, after_seq), engine, session, follow);
            Ok(Sent::Turn(handle.first_event_within(wait)))
        }
        Posted::NotHeld => Ok(Sent::ClaimAgain),
        Posted::Full(n) => Err(queue_full(n)),
    }
}

/// The order checked against the session as its log holds it (`st`, just read back), as
/// `start.rs` checks it: the seq its turn's events follow, or the error one instance gives.
/// `None` while the log shows a turn open (it runs on the holder).
fn check(
    engine: &Engine,
    session: &Session,
    st: &State,
    order: &TurnOrder,
) -> Option<Result<u64, EngineError>> {
    let last = st.out().tail.last();
    if last.is_some_and(|e| !e.body.is_terminal()) {
        return None;
    }
    let after_seq = last.map_or(0, |e| e.seq);
    // (A new message no client attends goes on past the calls: see `start.rs`.)
    let goes_on = matches!(order.delivery.client, Client::Absent { .. })
        && matches!(order.input, TurnInput::User { .. });
    if goes_on {
        return Some(Ok(after_seq));
    }
    let mut pending = st.pending().to_vec();
    client_questions::still_asked(&mut pending);
    let history = st.history();
    let checked = check_answers(&pending, &order.input, &|| history.messages()).and_then(|_| {
        let record = st.record();
        let agent = engine.agent_of(session, &record.agent)?;
        engine.apply_update(&agent, &mut record.as_ref().clone(), order.update.clone())
    });
    Some(checked.map(|()| after_seq))
}

/// How long the client waits for the holder to start the turn: long enough for a holder that
/// died to lose its lease and another to take the answers over.
fn taken_within(engine: &Engine) -> Duration {
    (engine.inner.config().store.lease * 3).max(Duration::from_secs(5))
}

//! A session's one writer on a shared store (PostgreSQL): the instance that runs a session's
//! turns holds its lease (`Store::take_lease`).
//!
//! - [`claim`], before a turn starts: takes the lease, or answers `session_busy` when another
//!   live instance holds it. A lease newly taken means another instance may have written the
//!   session since this one last saw it: the session is read back from the log first, and a
//!   turn its last holder left open (it died) is closed `worker_lost`.
//! - [`release`], when a session's last turn ends: the lease goes back, so that any instance
//!   may run the next turn.
//!
//! On the embedded store (one process) there is no lease: `claim` returns at once.

use std::sync::Arc;

use crate::engine::engine_handle::Inner;
use crate::engine::replay::Logged;
use crate::engine::session::Session;
use crate::engine::session_state::State;
use crate::engine::types::EngineError;
use crate::log::{ClaimGuard, Event, FailReason, LeaseTaken, Released};

const WHY: &str = "the instance running this turn stopped before it ended";

/// Make this instance the session's one writer before a turn starts on it (see the module
/// documentation); `Busy` while another live instance holds it. Keep the claim until the
/// turn is started (or refused), then drop it: the lease is not handed back meanwhile.
pub(crate) async fn claim(
    inner: &Arc<Inner>,
    session: &Arc<Session>,
) -> Result<Option<ClaimGuard>, EngineError> {
    let store = &inner.store;
    let Some(guard) = store.claiming(&session.id) else {
        return Ok(None);
    };
    if session.lock().turns().running().is_some() {
        return Ok(Some(guard));
    }
    match store.take_lease(&session.id).await? {
        LeaseTaken::Held { fresh } if !fresh && !store.lease_unread(&session.id) => Ok(Some(guard)),
        LeaseTaken::Held { .. } => {
            // Not read back, no turn: a turn on what this instance last saw could write
            // seqs another instance has used. Until a claim has read it back (another claim
            // may be reading it now, or have failed to), every claim reads it.
            // A read that fails is the database gone (a restart, a network cut) but for a
            // corrupt row, which the log names: a 503 the client may try again after.
            refresh(inner, session).await.map_err(|()| {
                crate::log::StoreError::Unavailable(
                    "the session could not be read back after taking its lease".into(),
                )
            })?;
            if session.lock().is_deleted() {
                // Deleted by another instance: no turn, and the lease goes back.
                drop(guard);
                release(inner, session).await;
                return Err(EngineError::NotFound {
                    what: "session",
                    id: session.id.to_string(),
                });
            }
            store.lease_read_back(&session.id);
            Ok(Some(guard))
        }
        LeaseTaken::Busy => Err(EngineError::Busy {
            // The other instance's turn: its last event's unless that ended it (one row, not
            // the whole log). Empty while the turn's first events wait for their commit.
            turn_id: store.open_turn_id(&session.id).await?.unwrap_or_default(),
        }),
    }
}

/// The session as the log holds it now (another instance may have run turns on it), and a turn
/// the lease's last holder left open closed as `worker_lost`. `Err` if the log could not be
/// read (the session as it was: stale); `Ok` also when a turn of this instance runs on it
/// already (started by a claim that read it back).
async fn refresh(inner: &Arc<Inner>, session: &Arc<Session>) -> Result<(), ()> {
    let store = &inner.store;
    let closed = reread(inner, session, |st| {
        session.close_open_locked(st, store, FailReason::WorkerLost, WHY)
    })
    .await?
    .flatten();
    if let Some(turn_id) = closed {
        if let Err(e) = store.flush().await {
            tracing::error!(session = %session.id, error = %e, "could not close a turn left open by another instance");
        }
        session.publish_durable(store);
        tracing::warn!(session = %session.id, turn = %turn_id, "closed a turn left unfinished by another instance (worker_lost)");
    }
    Ok(())
}

/// Makes the session in memory what the log holds now, unless this instance is writing it (a
/// turn running, events not yet published): its state read again, and the events it had not
/// seen published to its live subscribers. Then `then`, under the same lock. `Err`: the log
/// could not be read (logged). A session the log no longer has (another instance deleted it)
/// is marked deleted and leaves memory (`Ok(None)`).
pub(crate) async fn reread<T>(
    inner: &Arc<Inner>,
    session: &Arc<Session>,
    then: impl FnOnce(&mut State) -> T,
) -> Result<Option<T>, ()> {
    reread_upto(inner, session, u64::MAX, then).await
}

/// [`reread`], taking the log only as far as `upto` (a seq a commit heard wrote up to): what
/// later commits wrote is read when they are heard, so that a delta heard between two commits
/// reaches subscribers between the events it came between.
pub(crate) async fn reread_upto<T>(
    inner: &Arc<Inner>,
    session: &Arc<Session>,
    upto: u64,
    then: impl FnOnce(&mut State) -> T,
) -> Result<Option<T>, ()> {
    let idle =
        |st: &State| st.turns().running().is_none() && st.out().held.is_empty() && !st.is_deleted();
    let (mut st, copy, seen) = loop {
        let seen = {
            let st = session.lock();
            // Busy, or as far as asked already (a later log was read meanwhile: never back).
            if !idle(&st) || st.next_seq() >= upto {
                return Ok(None);
            }
            st.next_seq()
        };
        let mut copy = session.read_back(&inner.store).await.ok_or(())?;
        copy.events.retain(|e| e.seq <= upto);
        let st = session.lock();
        // A turn of this instance started meanwhile: it has the session as it is.
        if !idle(&st) {
            return Ok(None);
        }
        // Another read was applied meanwhile, perhaps of a later log than ours: read again.
        if st.next_seq() == seen {
            break (st, copy, seen);
        }
    };
    if copy.row.is_none() {
        // Deleted by another instance: its feed closes (its streams end), it leaves memory.
        st.mark_deleted();
        drop(st);
        crate::sync::lock(&inner.sessions).remove(&*session.id);
        return Ok(None);
    }
    if let Some(record) = copy
        .row
        .as_ref()
        .and_then(|r| serde_json::from_str(&r.record).ok())
    {
        st.set_record(record);
    }
    let unseen: Vec<Arc<Event>> = copy
        .events
        .iter()
        .filter(|e| e.seq > seen)
        .map(|e| Arc::new(e.clone()))
        .collect();
    let logged = Logged::read(st.record(), copy.events);
    st.apply_logged(logged);
    if !unseen.is_empty() && st.out().watched() {
        st.publish_heard(unseen);
    }
    Ok(Some(then(&mut st)))
}

/// The session's lease handed back if it is idle here (see [`super::turn_ended`]), without
/// taking what waits in the inbox: what the release did (`None`:
/// not held, busy here, or the store failed).
pub(crate) async fn release(inner: &Arc<Inner>, session: &Arc<Session>) -> Option<Released> {
    let store = &inner.store;
    let mark = store.lease_mark(&session.id)?;
    if !idle_here(&session.lock()) {
        return None;
    }
    let s = session.clone();
    let idle = move || idle_here(&s.lock());
    match store.release_lease_if(&session.id, mark, idle).await {
        Ok(r) => Some(r),
        Err(e) => {
            tracing::warn!(session = %session.id, error = %e, "could not hand back a session's lease");
            None
        }
    }
}

/// Whether nothing of this instance writes the session now: no turn running or queued, and
/// every event appended published (so committed). MCP calls waiting on a question to the
/// client live only in this instance's memory: while some do, the lease stays here (another
/// instance reading the log back would end them as after a restart).
pub(super) fn idle_here(st: &State) -> bool {
    st.turns().is_idle() && st.out().held.is_empty() && st.waits().idle()
}

//! Requests for a session another instance runs (holds its lease) go to that one through the
//! store's inbox (`log/postgres/inbox.rs`), and are applied there as if they had come to it
//! (by the engine's commands: see `engine/command/relayed.rs`).
//!
//! - Sending ([`post`]): the commands write a request here when another instance holds the
//!   lease; the answer is the one a local request gets (a queued message: its turn id).
//! - Taking ([`drain`]): the holder hears of the rows (`LISTEN`), of rows its release of the
//!   lease found, or of rows left for lack of room in its queue once a queued turn starts; it
//!   takes them in order, at most as many messages as its queue has room for (`[limits]
//!   queued_turns`: rows that do not fit wait in the inbox, where the sender counts them).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::claim;
use crate::engine::engine_handle::{Engine, Inner};
use crate::engine::session::Session;
use crate::engine::types::EngineError;
use crate::log::{Posted, Released};

/// A session's inbox as this instance sees it: one taker at a time; whether rows were left
/// for lack of room.
#[derive(Default)]
struct InboxState {
    taking: tokio::sync::Mutex<()>,
    left: AtomicBool,
}

/// Send a request (`kind`, its JSON `body`) to the instance that holds the session's lease,
/// through the store's inbox; at most `[limits] queued_turns` messages wait there.
pub(crate) async fn post(
    inner: &Inner,
    session: &Session,
    kind: &'static str,
    body: String,
    turn_id: Option<String>,
) -> Result<Posted, EngineError> {
    let max = inner.config().limits.queued_turns;
    Ok(inner
        .store
        .post_inbox(&session.id, kind, body, turn_id, max)
        .await?)
}

/// The session's last turn has ended and none is queued: hand its lease back, unless a turn
/// is admitted meanwhile (it takes the lease again first, which the release then sees, or it
/// is claimed while the release waits its turn, or running when the release's turn comes). One
/// round trip; nothing on the embedded store.
///
/// Idleness is looked at again in line with the takes, right before the lease goes: seen only
/// before the release waited for its turn, it let a lease go under a running turn (a claim
/// that found the lease this instance's, took nothing new and started its turn meanwhile);
/// the other instance then took the lease, read a log without that turn's unflushed events and
/// wrote the same seqs (`events_pkey`), losing a turn.
pub(crate) async fn release_when_idle(inner: &Arc<Inner>, session: &Arc<Session>) {
    if claim::release(inner, session).await == Some(Released::InboxWaiting) {
        drain_soon(inner, session.id.to_string());
    }
}

/// Before a message queues (or runs) here: the requests other instances sent the session
/// first are taken now, so that they go ahead of it. A client that sent one message to
/// another instance, had its `202`, then sent the next one here sees them run in that order,
/// as on one instance (the notice of the first may not have reached this one yet). One take
/// of the inbox (a transaction) per message, on a shared store only.
pub(crate) async fn take_sent_before(inner: &Arc<Inner>, session: &Arc<Session>) {
    if inner.store.instance().is_some() {
        drain(inner, &session.id).await;
    }
}

/// [`drain`] on a task of its own.
pub(super) fn drain_soon(inner: &Arc<Inner>, session_id: String) {
    let inner = inner.clone();
    tokio::spawn(async move { drain(&inner, &session_id).await });
}

/// A queued turn of the session started (its queue has room again): rows left in the inbox
/// for lack of room are taken now.
pub(super) fn room_opened(inner: &Arc<Inner>, session: &Session) {
    if session
        .extension::<InboxState>()
        .left
        .load(Ordering::Acquire)
    {
        drain_soon(inner, session.id.to_string());
    }
}

/// Take the requests waiting in the session's inbox and apply them, while this instance
/// holds its lease (or takes it: none holds it); then, the session idle, hand the lease back
/// (or, more rows found by that release, take them too). Rows that cannot be applied now (the
/// server runs all the turns it may, or stops) go back, for the sweep of held leases.
async fn drain(inner: &Arc<Inner>, session_id: &str) {
    let engine = Engine {
        inner: inner.clone(),
    };
    if engine.check_open().is_err() {
        return;
    }
    let session = match engine.load(session_id).await {
        Ok(Some(s)) => s,
        Ok(None) => {
            // Deleted: what it was sent goes with it.
            let _ = inner.store.drop_inbox(session_id).await;
            return;
        }
        Err(_) => return,
    };
    let state = session.extension::<InboxState>();
    let _one = state.taking.lock().await;
    let store = &inner.store;
    loop {
        let Ok(claim) = claim::claim(inner, &session).await else {
            return; // another instance holds it: the rows are its
        };
        // Idle here, rows still marked as this process's are orphans (a turn whose start could
        // not be stored): taken again, but for those a turn admitted meanwhile holds.
        let own_too = session.lock().turns().is_idle();
        let room = room(inner, &session);
        let (rows, left) = match store.take_inbox(&session.id, room, own_too).await {
            Ok(taken) => taken,
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e, "could not read the session's inbox");
                return;
            }
        };
        state.left.store(left, Ordering::Release);
        let rows: Vec<_> = {
            let st = session.lock();
            let held = |r: &crate::log::InboxRow| {
                r.turn_id.as_deref().is_some_and(|t| st.turns().holds(t))
            };
            rows.into_iter().filter(|r| !held(r)).collect()
        };
        let took_none = rows.is_empty();
        let applied = (inner.apply_relayed)(&engine, &session, rows);
        drop(claim);
        // What the requests wrote (a cancelled queued turn's row) is durable before their
        // senders answer.
        if !applied.replies.is_empty() {
            if let Err(e) = store.flush().await {
                tracing::warn!(session = %session.id, error = %e, "what relayed requests wrote could not be committed");
            }
        }
        if let Err(e) = store.notify_applied(applied.replies).await {
            tracing::warn!(session = %session.id, error = %e, "could not reply to relayed requests");
        }
        let back = applied.back;
        if !back.is_empty() {
            state.left.store(true, Ordering::Release);
            if let Err(e) = store.put_back_inbox(&session.id, back).await {
                tracing::error!(session = %session.id, error = %e, "requests taken from the inbox could not be put back: they are lost");
            }
            return;
        }
        if session.lock().turns().running().is_some() {
            return; // the end of its turns hands the lease back, or takes what came meanwhile
        }
        if claim::release(inner, &session).await != Some(Released::InboxWaiting) {
            return;
        }
        if took_none {
            // Rows came after the take (their sender's notice drains again), or the store
            // failed the take: the sweep of held leases comes back.
            tracing::debug!(session = %session.id, "inbox rows wait that this take did not get");
            return;
        }
    }
}

/// How many messages the session's queue can take now (one more when no turn runs: it runs).
fn room(inner: &Inner, session: &Session) -> usize {
    let queued_turns = inner.config().limits.queued_turns;
    session.lock().turns().room(queued_turns)
}

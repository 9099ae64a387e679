//! Scale-out on a shared store (PostgreSQL): the instance that runs a session's turns holds
//! its lease (`Store::take_lease`), so a session has one writer at a time.
//!
//! - [`Engine::claim`], before a turn starts: takes the lease, or answers `session_busy` when
//!   another live instance holds it. A lease newly taken means another instance may have
//!   written the session since this one last saw it: the session is read back from the log
//!   first, and a turn its last holder left open (it died) is closed `worker_lost`.
//! - [`release_when_idle`], when a session's last turn ends: the lease goes back, so that any
//!   instance may run the next turn.
//! - [`watch_expired`]: every half `lease_s`, the sessions whose holder stopped renewing
//!   (killed) are taken over, their open turn closed `worker_lost`, and released.
//! - `Engine::shutdown` hands back every lease at once.
//! - A release finds requests waiting in the session's inbox (`inbox.rs`): the lease is kept
//!   and they are taken.
//!
//! On the embedded store (one process) there is no lease: `claim` returns at once.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::replay::Logged;
use super::session::Session;
use super::shared::{Engine, Inner};
use super::types::EngineError;
use crate::log::{ClaimGuard, Event, FailReason, Heard, LeaseTaken, Released};

const WHY: &str = "the instance running this turn stopped before it ended";

impl Engine {
    /// Make this instance the session's one writer before a turn starts on it (see the module
    /// documentation); `Busy` while another live instance holds it. Keep the claim until the
    /// turn is started (or refused), then drop it: the lease is not handed back meanwhile.
    pub async fn claim(&self, session: &Arc<Session>) -> Result<Option<ClaimGuard>, EngineError> {
        let store = &self.inner.store;
        let Some(guard) = store.claiming(&session.id) else {
            return Ok(None);
        };
        if session.lock().running.is_some() {
            return Ok(Some(guard));
        }
        match store.take_lease(&session.id).await? {
            LeaseTaken::Held { fresh } if !fresh && !store.lease_unread(&session.id) => {
                Ok(Some(guard))
            }
            LeaseTaken::Held { .. } => {
                // Not read back, no turn: a turn on what this instance last saw could write
                // seqs another instance has used. Until a claim has read it back (another claim
                // may be reading it now, or have failed to), every claim reads it.
                refresh(&self.inner, session).await.map_err(|()| {
                    crate::log::StoreError::Postgres(
                        "the session could not be read back after taking its lease".into(),
                    )
                })?;
                store.lease_read_back(&session.id);
                Ok(Some(guard))
            }
            LeaseTaken::Busy => Err(EngineError::Busy {
                // The other instance's turn: its last event's (one row, not the whole log).
                turn_id: store.last_turn_id(&session.id).await?.unwrap_or_default(),
            }),
        }
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
/// could not be read (logged).
async fn reread<T>(
    inner: &Arc<Inner>,
    session: &Arc<Session>,
    then: impl FnOnce(&mut super::session::State) -> T,
) -> Result<Option<T>, ()> {
    let idle =
        |st: &super::session::State| st.running.is_none() && st.out.held.is_empty() && !st.deleted;
    let (mut st, copy, seen) = loop {
        let seen = {
            let st = session.lock();
            if !idle(&st) {
                return Ok(None);
            }
            st.next_seq
        };
        let copy = session.read_back(&inner.store).await.ok_or(())?;
        let st = session.lock();
        // A turn of this instance started meanwhile: it has the session as it is.
        if !idle(&st) {
            return Ok(None);
        }
        // Another read was applied meanwhile, perhaps of a later log than ours: read again.
        if st.next_seq == seen {
            break (st, copy, seen);
        }
    };
    if let Some(record) = copy
        .row
        .as_ref()
        .and_then(|r| serde_json::from_str(&r.record).ok())
    {
        st.record = Arc::new(record);
    }
    let unseen: Vec<Arc<Event>> = copy
        .events
        .iter()
        .filter(|e| e.seq > seen)
        .map(|e| Arc::new(e.clone()))
        .collect();
    let logged = Logged::read(&st.record, copy.events);
    st.history = logged.history;
    st.next_seq = logged.next_seq;
    st.out.tail = logged.tail;
    st.pending = logged.pending;
    st.plan = logged.plan;
    st.run_start = logged.run_start;
    if !unseen.is_empty() && st.out.watched() {
        let tail = std::mem::take(&mut st.out.tail);
        for ev in unseen {
            st.out.publish_heard(ev);
        }
        st.out.tail = tail;
    }
    Ok(Some(then(&mut st)))
}

/// Follows the commits of the other instances sharing the store (`LISTEN`): a session in
/// memory that another instance wrote is read again, and its live subscribers get the new
/// events. After the listener reconnects (it may have missed some), every session is.
pub(crate) fn hear_others(inner: &Arc<Inner>) {
    let Some(mut heard) = inner.store.commits_heard() else {
        return;
    };
    let weak: Weak<Inner> = Arc::downgrade(inner);
    tokio::spawn(async move {
        loop {
            let heard = match heard.recv().await {
                Ok(h) => h,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Heard::Resync,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            let Some(inner) = weak.upgrade() else { return };
            if let Heard::Inbox {
                session_id, holder, ..
            } = &heard
            {
                if holder.is_empty() || inner.store.instance() == Some(holder.as_str()) {
                    super::inbox::drain_soon(&inner, session_id.clone());
                }
                continue;
            }
            if heard == Heard::Resync {
                // Requests left for this instance meanwhile.
                for id in inner.store.held_leases() {
                    super::inbox::drain_soon(&inner, id);
                }
            }
            if let Heard::Delta(d) = &heard {
                let s = crate::sync::lock(&inner.sessions)
                    .get(&d.session_id)
                    .cloned();
                if let Some(s) = s {
                    if s.lock().next_seq < d.after_seq {
                        let _ = reread(&inner, &s, |_| ()).await; // its commit was missed
                    }
                    super::delivery::publish_remote(&s, d);
                }
                continue;
            }
            let sessions: Vec<Arc<Session>> = {
                let map = crate::sync::lock(&inner.sessions);
                match &heard {
                    Heard::Commit { session_id, .. } => {
                        map.get(session_id).cloned().into_iter().collect()
                    }
                    Heard::Resync => map.values().cloned().collect(),
                    Heard::Inbox { .. } => Vec::new(),
                    Heard::Delta(_) => Vec::new(),
                }
            };
            for s in sessions {
                if let Heard::Commit { seq, .. } = heard {
                    if s.lock().next_seq >= seq {
                        continue; // this instance's own commit, or seen already
                    }
                }
                let _ = reread(&inner, &s, |_| ()).await;
            }
        }
    });
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
    if release(inner, session).await == Some(Released::InboxWaiting) {
        super::inbox::drain_soon(inner, session.id.to_string());
    }
}

/// [`release_when_idle`] without taking what waits in the inbox: what the release did (`None`:
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
fn idle_here(st: &super::session::State) -> bool {
    st.running.is_none() && st.queue.is_empty() && st.out.held.is_empty() && st.waits.idle()
}

/// Takes over, every half `lease_s`, the sessions whose lease expired (their instance died):
/// closes the turn it left open (`worker_lost`) and hands the lease back. Ends with the engine.
pub(crate) fn watch_expired(inner: &Arc<Inner>) {
    if inner.store.instance().is_none() {
        return;
    }
    let every = (inner.config.store.lease / 2).max(Duration::from_millis(200));
    let weak: Weak<Inner> = Arc::downgrade(inner);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(inner) = weak.upgrade() else { return };
            let engine = Engine { inner };
            let expired = match engine.inner.store.expired_leases().await {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the expired leases");
                    continue;
                }
            };
            for id in expired {
                let Ok(Some(session)) = engine.load(&id).await else {
                    continue;
                };
                if let Ok(claim) = engine.claim(&session).await {
                    drop(claim);
                    release_when_idle(&engine.inner, &session).await;
                }
            }
            // Leases taken for turns that were then refused (a bad request after the claim),
            // or left by a race: a session idle here is handed back.
            for id in engine.inner.store.held_leases() {
                let idle = crate::sync::lock(&engine.inner.sessions).get(&id).cloned();
                match idle {
                    Some(s) if idle_here(&s.lock()) => release_when_idle(&engine.inner, &s).await,
                    Some(_) => {}
                    None => {
                        if let Some(mark) = engine.inner.store.lease_mark(&id) {
                            let r = engine.inner.store.release_lease(&id, mark).await;
                            if matches!(r, Ok(Released::InboxWaiting)) {
                                super::inbox::drain_soon(&engine.inner, id);
                            }
                        }
                    }
                }
            }
        }
    });
}

//! A session: its persisted record, its in-memory state, and the one place events are appended.
//!
//! All state of a session sits behind one mutex that is never held across an await. Appending an
//! event assigns its sequence number and id, queues it for the store and folds it into the
//! history projection, under that lock, so the log and the projection see one order. An event
//! is published to live subscribers only once it is durable (`Session::publish_durable`, after
//! a [`Store::flush`]): nobody ever sees an event that a crash could take back.

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::broadcast;

use super::replay::{carried_calls, open_calls, unanswered_calls, LogCopy, Logged};
use super::session_record::{Pending, SessionRecord};
use super::session_state::State;
use super::types::{DeltaKind, Feed};
use crate::log::{Event, EventBody, FailReason, Store};
use crate::message::Message;
use crate::sync::lock;

/// A session in memory.
pub struct Session {
    pub id: Arc<str>,
    pub owner: Option<String>,
    pub created_at: String,
    /// When it was last taken from the engine's cache (the engine's tick), for dropping the
    /// least recently used first.
    pub(crate) used: std::sync::atomic::AtomicU64,
    /// Open event and run streams (`[limits] subscribers_per_session`).
    pub(crate) streams: std::sync::atomic::AtomicUsize,
    state: Mutex<State>,
    /// Told when a turn has ended here (its terminal event published, the next turn begun).
    turn_over: tokio::sync::Notify,
    /// What protocol adapters keep per session, one value per type (see [`Session::extension`]).
    extensions: Mutex<Vec<Arc<dyn std::any::Any + Send + Sync>>>,
}

impl Session {
    /// A session with this record and these stored events.
    pub(crate) fn restore(
        id: String,
        owner: Option<String>,
        created_at: String,
        record: SessionRecord,
        events: Vec<Event>,
    ) -> Session {
        let logged = Logged::read(&record, events);
        Session {
            id: id.into(),
            owner,
            created_at,
            used: Default::default(),
            extensions: Default::default(),
            streams: Default::default(),
            turn_over: Default::default(),
            state: Mutex::new(State::new(record, logged)),
        }
    }

    /// Wait (at most `within`) for the running turn to be over when its terminal event is
    /// written already. On a shared store the other instances see that event once it is
    /// committed, before this one has handed the session over: a client there that saw the
    /// turn end may send its next turn here in that gap, and must not be told `session_busy`.
    pub(crate) async fn until_ending_turn_over(&self, within: std::time::Duration) {
        let over = self.turn_over.notified();
        tokio::pin!(over);
        over.as_mut().enable();
        if self.lock().turn_ending() {
            let _ = tokio::time::timeout(within, over).await;
        }
    }

    /// The running turn is over (see [`Session::until_ending_turn_over`]).
    pub(crate) fn turn_over(&self) {
        self.turn_over.notify_waiters();
    }

    /// Whether a commit of the session's events failed ([`State::lost_writes`]): then
    /// [`Session::read_back`] is due. (A record write goes with the events of the turn that
    /// made it.)
    pub(crate) fn lost_writes(&self, store: &Store) -> bool {
        self.lock().lost_writes(store)
    }

    /// The session as the log holds it, for [`Session::rebuild_locked`]; `None` (logged) if it
    /// cannot be read.
    pub(crate) async fn read_back(&self, store: &Store) -> Option<LogCopy> {
        let read = async {
            let row = store.session(&self.id).await?;
            let events = store.events(&self.id, 0, usize::MAX >> 1).await?;
            Ok::<_, crate::log::StoreError>(LogCopy { row, events })
        };
        read.await
            .inspect_err(|e| tracing::error!(session = %self.id, error = %e, "could not read the session back after a failed commit"))
            .ok()
    }

    /// A session whose writes were lost while its log could not be read back either (the
    /// store unreachable), read back now and rebuilt: a turn the log has open is closed
    /// (`internal_error`, saying `why`) and the closing published. With `idle_only`, not while
    /// a turn runs on it (that turn's start does it). `Err` while the log cannot be read.
    pub(crate) async fn repair(&self, store: &Store, why: &str, idle_only: bool) -> Result<(), ()> {
        let copy = self.read_back(store).await.ok_or(())?;
        let mut st = self.lock();
        if !st.lost_writes(store) || (idle_only && st.turns().running().is_some()) {
            return Ok(());
        }
        let open = copy
            .events
            .last()
            .filter(|e| !e.body.is_terminal())
            .map(|e| e.turn_id.clone())
            .unwrap_or_default();
        self.rebuild_locked(&mut st, store, &copy, &open, why);
        Ok(())
    }

    /// After a failed commit: make what the session holds in memory what the log holds (the
    /// record, if its write failed; history, next seq, last turn, pending calls), so that the
    /// next turn neither shows the model what was never stored nor leaves a hole in the seqs.
    /// If the log has `turn_id` open, it is closed there ([`Session::close_open_locked`],
    /// `internal_error`, saying `why`) and the closing published, if its commit succeeds (else
    /// the log keeps the turn open: the session's next turn closes it first, or the next start
    /// as `worker_lost`). `copy` was read once every write so far had been through a commit.
    pub(crate) fn rebuild_locked(
        &self,
        st: &mut State,
        store: &Store,
        copy: &LogCopy,
        turn_id: &str,
        why: &str,
    ) -> Vec<Arc<Event>> {
        if st.is_deleted() {
            return Vec::new();
        }
        let reset = |st: &mut State| {
            let row = copy.row.as_ref().map(|r| r.record.as_str());
            st.reset_to(store, row, copy.events.clone());
        };
        reset(st);
        tracing::warn!(session = %self.id, seq = st.next_seq(), "the session was read back from the log after a failed commit");
        if st.out().tail.last().is_none_or(|e| e.turn_id != turn_id)
            || self
                .close_open_locked(st, store, FailReason::InternalError, why)
                .is_none()
        {
            return Vec::new();
        }
        // Rare: committed here, under the session's lock, so that nothing comes between.
        let committed = store.commit();
        let published = self.publish_durable_locked(st, store);
        if committed.is_err() {
            // The log keeps the turn open: the next turn closes it first (or the next start,
            // as `worker_lost`).
            reset(st);
        }
        published
    }

    /// If the session's last turn is open in the log (cut off by a crash, or its closing could
    /// not be written), append what closes it: its open calls, and the earlier turn's calls it
    /// was answering, cancelled, then `turn.failed` for this reason, saying `why`. The turn
    /// closed, if one was open.
    pub(crate) fn close_open_locked(
        &self,
        st: &mut State,
        store: &Store,
        reason: FailReason,
        why: &str,
    ) -> Option<String> {
        // What was appended, committed or not: a closing appended but not yet committed (by
        // a claim that read the session back while this one waited) closes it already.
        let appended: std::borrow::Cow<'_, [Arc<Event>]> = match st.out().held.as_slice() {
            [] => std::borrow::Cow::Borrowed(&st.out().tail),
            held => {
                let tail = st.out().tail.iter().cloned();
                let kept = held.iter().filter(|(t, _)| !store.failed(*t));
                std::borrow::Cow::Owned(tail.chain(kept.map(|(_, e)| e.clone())).collect())
            }
        };
        let last = appended.last().filter(|e| !e.body.is_terminal())?;
        let turn_id = last.turn_id.clone();
        let mut calls = carried_calls(&appended, &turn_id);
        calls.extend(open_calls(&appended, &turn_id));
        drop(appended);
        // A new message that went on past the calls the turn before stopped on answers them
        // first ("not answered"): cut off before it wrote that, they are still open.
        for call in unanswered_calls(&st.history().messages()) {
            if !calls.contains(&call) {
                calls.push(call);
            }
        }
        for call in calls {
            let result = EventBody::ToolResult {
                tool_use_id: call,
                content: "Cancelled.".into(),
                is_error: true,
                files: vec![],
            };
            self.append_locked(st, store, &turn_id, result);
        }
        let failed = EventBody::TurnFailed {
            reason,
            usage: None,
            message: Some(why.to_string()),
        };
        self.append_locked(st, store, &turn_id, failed);
        Some(turn_id)
    }

    /// [`State::at_rest`], without waiting: a session whose state is locked is in use.
    pub(crate) fn at_rest(&self, committed: u64) -> bool {
        self.state.try_lock().is_ok_and(|st| st.at_rest(committed))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Append an event to the log. It reaches live subscribers once it is durable: see
    /// [`Session::publish_durable`]. `None` when the session has been deleted.
    pub(crate) fn append(
        &self,
        store: &Store,
        turn_id: &str,
        body: EventBody,
    ) -> Option<Arc<Event>> {
        let mut st = self.lock();
        self.append_locked(&mut st, store, turn_id, body)
    }

    pub(crate) fn append_locked(
        &self,
        st: &mut State,
        store: &Store,
        turn_id: &str,
        body: EventBody,
    ) -> Option<Arc<Event>> {
        st.append(store, &self.id, turn_id, body)
    }

    /// Publish, in order, the held events the store has committed; returns them.
    pub(crate) fn publish_durable(&self, store: &Store) -> Vec<Arc<Event>> {
        let mut st = self.lock();
        self.publish_durable_locked(&mut st, store)
    }

    /// [`Session::publish_durable`] with the session's lock held.
    pub(crate) fn publish_durable_locked(&self, st: &mut State, store: &Store) -> Vec<Arc<Event>> {
        st.publish_durable(store)
    }

    /// A delta another instance streamed (a shared store): to this instance's live subscribers
    /// of the session, if they have seen exactly the events its writer's had.
    pub(crate) fn publish_remote(&self, d: &crate::log::RemoteDelta) {
        self.lock().publish_remote_delta(d);
    }

    /// Whether the session has live subscribers here or, on a shared store, on another
    /// instance: whoever is owed the deltas of a turn this instance runs.
    pub(crate) fn watched_anywhere(&self) -> bool {
        self.lock().out().watched_anywhere()
    }

    /// Add a streamed fragment to the turn's coalescer (see [`Outbox::push_fragment`]).
    pub(crate) fn push_fragment(
        &self,
        turn_id: &Arc<str>,
        kind: DeltaKind,
        fragment: &str,
    ) -> bool {
        self.lock().push_fragment(turn_id, kind, fragment)
    }

    /// Push the coalesced deltas if their 50 ms are up; when the next push is due otherwise.
    pub(crate) fn flush_due(&self) -> Option<tokio::time::Instant> {
        self.lock().flush_due()
    }

    /// The adapter's value of type `T` for this session, made on first use. Adapters keep
    /// here what belongs to their wire format (AAP: its `Idempotency-Key` records); it lives
    /// while the session is in memory.
    pub fn extension<T: std::any::Any + Send + Sync + Default>(&self) -> Arc<T> {
        let mut ext = lock(&self.extensions);
        if let Some(v) = ext.iter().find_map(|e| e.clone().downcast::<T>().ok()) {
            return v;
        }
        let v = Arc::new(T::default());
        ext.push(v.clone());
        v
    }

    /// The seq of the first event of the current (or last) run (0: none yet).
    pub fn run_start(&self) -> u64 {
        self.lock().run_start()
    }

    /// The plan waiting for approval, if any.
    pub fn pending_plan(&self) -> Option<String> {
        self.lock().plan().map(|p| p.plan.clone())
    }

    /// The turns waiting behind the running one.
    pub fn queued_turns(&self) -> Vec<String> {
        self.lock().turns().live()
    }

    /// Subscribe to live items, with the events of the current turn so far (taken atomically,
    /// so nothing falls between them).
    pub fn subscribe(&self) -> (Vec<Arc<Event>>, broadcast::Receiver<Feed>) {
        let mut st = self.lock();
        if st.is_deleted() {
            // A closed feed: the subscriber ends at once.
            return (st.out().tail.clone(), broadcast::channel(1).1);
        }
        let rx = st.subscribe();
        (st.out().tail.clone(), rx)
    }

    /// The events of the current (or last) turn.
    pub fn tail(&self) -> Vec<Arc<Event>> {
        self.lock().out().tail.clone()
    }

    pub fn record(&self) -> Arc<SessionRecord> {
        self.lock().record().clone()
    }

    pub fn history(&self) -> Vec<Message> {
        self.lock().history().messages()
    }

    /// Every file attached to the session's user messages.
    pub fn attached_files(&self) -> Vec<crate::log::FileRef> {
        self.lock().history().attached_files()
    }

    /// The compacted history (AAP `history?type=compacted`): what the model is sent next.
    pub fn compacted_history(&self) -> Vec<Message> {
        self.lock().history().compacted(None)
    }

    /// What a compaction could replace now.
    pub fn compactable(&self) -> super::history::Compactable {
        self.lock().history().compactable()
    }

    /// The history for the model (compacted): attached files inlined by `inline`.
    pub fn model_history(
        &self,
        inline: &dyn Fn(&crate::log::FileRef) -> Option<Vec<crate::message::Block>>,
    ) -> Vec<Message> {
        self.lock().history().compacted(Some(inline))
    }

    pub fn pending(&self) -> Vec<Pending> {
        self.lock().pending().to_vec()
    }

    pub fn running_turn(&self) -> Option<String> {
        self.lock().turns().running().map(|r| r.turn_id.clone())
    }
}

#[cfg(test)]
mod tests;

//! Following a session's log: replay from a cursor, then live, with no gap and no duplicate.
//!
//! Subscribing takes the live receiver and the log's end at that moment in one step. Stored
//! events up to that end are replayed from the log (the store, plus the current turn's events
//! the store does not hold yet); everything later comes from the receiver, in the order it was
//! published, so a delta is never sent after the stored event that completes it. Stored events
//! the receiver repeats are skipped. A subscriber that falls too far behind the live feed
//! subscribes again and is refilled from the log the same way, so it never silently misses an
//! event (only deltas, which are provisional, may be skipped).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::broadcast::Receiver;

use super::engine_handle::Engine;
use super::session::Session;
use super::types::{EngineError, Feed};
use crate::log::Event;

/// Replay page size when refilling from the store.
const PAGE: usize = 512;

/// A session's log from a cursor on.
pub struct Follow {
    engine: Engine,
    session: Arc<Session>,
    last_seq: u64,
    /// Stored events up to this seq are read from the log; later ones come from `rx`.
    replay_to: u64,
    /// Replayed events not sent yet: always the events right after `last_seq`, without a hole.
    backlog: VecDeque<Arc<Event>>,
    /// A live event that came after a hole: sent once the hole is filled from the log.
    held: Option<Arc<Event>>,
    rx: Receiver<Feed>,
    /// Its place among the session's open streams, when it is one.
    _slot: Option<StreamSlot>,
    /// A shared store: the deltas of the session's turns running on other instances come
    /// here while it is open.
    _deltas: Option<crate::log::DeltaWatch>,
}

/// An open stream of a session, counted against `[limits] subscribers_per_session` until it
/// is dropped (the client goes away, or the stream ends).
struct StreamSlot(Arc<Session>);

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.streams.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Follow {
    /// A client's stream of the session (events or run stream) from after `after_seq`: counted
    /// against `[limits] subscribers_per_session` while it is open (429 past it).
    pub async fn stream(
        engine: &Engine,
        session: Arc<Session>,
        after_seq: u64,
    ) -> Result<Follow, EngineError> {
        let limit = engine.config().limits.subscribers_per_session;
        let taken = session
            .streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            });
        if taken.is_err() {
            return Err(EngineError::OverLimit {
                kind: "too_many_subscribers",
                message: format!(
                    "session {} already has {limit} open event streams (limit: [limits] subscribers_per_session in tools.toml); close one first",
                    session.id
                ),
                server_wide: false,
                retry_after: SUBSCRIBERS_RETRY_AFTER,
            });
        }
        let slot = StreamSlot(session.clone());
        let mut follow = Follow::new(engine, session, after_seq).await?;
        follow._slot = Some(slot);
        Ok(follow)
    }

    /// Follow from after `after_seq` (0: from the beginning).
    pub async fn new(
        engine: &Engine,
        session: Arc<Session>,
        after_seq: u64,
    ) -> Result<Follow, EngineError> {
        let deltas = engine.store().watch_deltas(&session.id).await;
        let (tail, rx) = session.subscribe();
        let mut f = Follow {
            engine: engine.clone(),
            session,
            last_seq: after_seq,
            replay_to: tail.last().map_or(0, |e| e.seq),
            backlog: VecDeque::new(),
            held: None,
            rx,
            _slot: None,
            _deltas: deltas,
        };
        f.refill().await?;
        Ok(f)
    }

    /// Read the stored events after `last_seq` (at most up to `replay_to`) into the backlog,
    /// as far as they follow on without a hole. Events appended moments ago may not be readable
    /// yet (the current turn's are kept in memory, but not those of a turn that was cancelled
    /// in the queue): then the log is made durable and read again.
    async fn refill(&mut self) -> Result<(), EngineError> {
        if self.last_seq >= self.replay_to {
            return Ok(());
        }
        for attempt in 0..2 {
            let want = (self.replay_to - self.last_seq).min(PAGE as u64) as usize;
            let (events, _) = self
                .engine
                .events_after_seq(&self.session, self.last_seq, want)
                .await?;
            for (next, ev) in (self.last_seq + 1..).zip(events) {
                if ev.seq != next {
                    break;
                }
                self.backlog.push_back(ev);
            }
            if !self.backlog.is_empty() || attempt == 1 {
                break;
            }
            self.engine.store().flush().await?;
        }
        Ok(())
    }

    /// The next item: a stored event or a coalesced delta. `None` when the feed is closed.
    pub async fn next(&mut self) -> Option<Feed> {
        loop {
            if let Some(ev) = self.backlog.pop_front() {
                if ev.seq <= self.last_seq {
                    continue;
                }
                self.last_seq = ev.seq;
                return Some(Feed::Event(ev));
            }
            if self.last_seq < self.replay_to {
                if let Err(e) = self.refill().await {
                    tracing::warn!(session = %self.session.id, error = %e, "refilling a subscriber from the log failed");
                    return None;
                }
                if self.backlog.is_empty() {
                    // Ending the stream beats skipping events: the client resumes from its cursor.
                    tracing::warn!(session = %self.session.id, after = self.last_seq, to = self.replay_to, "events are missing from the log; ending the subscription");
                    return None;
                }
                continue;
            }
            if let Some(ev) = self.held.take() {
                if ev.seq > self.last_seq {
                    self.last_seq = ev.seq;
                    return Some(Feed::Event(ev));
                }
                continue;
            }
            match self.rx.recv().await {
                Ok(Feed::Event(ev)) if ev.seq > self.last_seq => {
                    if ev.seq > self.last_seq + 1 {
                        // Something fell between: read it from the log first.
                        self.replay_to = ev.seq - 1;
                        self.held = Some(ev);
                        continue;
                    }
                    self.last_seq = ev.seq;
                    return Some(Feed::Event(ev));
                }
                Ok(Feed::Event(_)) | Ok(Feed::Fragment { .. }) => continue,
                Ok(delta @ Feed::Delta { .. }) => return Some(delta),
                Err(RecvError::Lagged(n)) => {
                    tracing::debug!(session = %self.session.id, skipped = n, "slow subscriber refilled from the log");
                    let (tail, rx) = self.session.subscribe();
                    self.rx = rx;
                    self.replay_to = self.replay_to.max(tail.last().map_or(0, |e| e.seq));
                }
                Err(RecvError::Closed) => return None,
            }
        }
    }

    /// The last stored event sent.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }
}

/// `Retry-After` (seconds) of a session with all the streams it may have.
const SUBSCRIBERS_RETRY_AFTER: u64 = 5;

impl Engine {
    /// A session's events after `after` (an event id; `None` from the start), at most `limit`,
    /// and whether more follow.
    pub async fn events_after(
        &self,
        session: &Session,
        after: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<Arc<crate::log::Event>>, bool), EngineError> {
        let after_seq = match after {
            None => 0,
            Some(id) => self.seq_of(session, id).await?,
        };
        self.events_after_seq(session, after_seq, limit).await
    }

    /// A session's events with `seq > after_seq`: the store's, then the current turn's events
    /// the store does not hold yet.
    pub async fn events_after_seq(
        &self,
        session: &Session,
        after_seq: u64,
        limit: usize,
    ) -> Result<(Vec<Arc<crate::log::Event>>, bool), EngineError> {
        let tail = session.tail();
        let mut out: Vec<Arc<crate::log::Event>> = self
            .inner
            .store
            .events(&session.id, after_seq, limit + 1)
            .await?
            .into_iter()
            .map(Arc::new)
            .collect();
        let last = out.last().map_or(after_seq, |e| e.seq);
        if out.len() <= limit {
            out.extend(tail.into_iter().filter(|e| e.seq > last));
        }
        let more = out.len() > limit;
        out.truncate(limit);
        Ok((out, more))
    }

    /// The position of an event id in a session's log; an unknown id is an error, never a
    /// silent restart from the beginning.
    pub async fn seq_of(&self, session: &Session, event_id: &str) -> Result<u64, EngineError> {
        if let Some(ev) = session.tail().iter().find(|e| e.id == event_id) {
            return Ok(ev.seq);
        }
        match self.inner.store.seq_of(&session.id, event_id).await? {
            Some(seq) => Ok(seq),
            None => Err(EngineError::Invalid(format!(
                "event {event_id} is not in session {}'s log; pass the id of an event you received, or omit the cursor to start from the beginning",
                session.id
            ))),
        }
    }
}

//! Following a session's log: replay from a cursor, then live, with no gap and no duplicate.
//!
//! Subscribing takes the live receiver and the current turn's events in one step; the replay
//! reads the store after the cursor and adds the current turn's events the store does not have
//! yet; live items are then taken from the receiver, skipping stored events already sent. A
//! subscriber that falls too far behind the live feed is refilled from the log the same way, so
//! it never silently misses an event (only deltas, which are provisional, may be skipped).

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::broadcast::error::RecvError;
use tokio::sync::broadcast::Receiver;

use super::{Engine, EngineError, Feed, Session};
use crate::log::Event;

/// Replay page size when refilling from the store.
const PAGE: usize = 512;

/// A session's log from a cursor on.
pub struct Follow {
    engine: Engine,
    session: Arc<Session>,
    last_seq: u64,
    backlog: VecDeque<Arc<Event>>,
    /// More stored events may follow the backlog (it was read one page at a time).
    more: bool,
    rx: Receiver<Feed>,
}

impl Follow {
    /// Follow from after `after_seq` (0: from the beginning).
    pub async fn new(
        engine: &Engine,
        session: Arc<Session>,
        after_seq: u64,
    ) -> Result<Follow, EngineError> {
        let (_, rx) = session.subscribe();
        let mut f = Follow {
            engine: engine.clone(),
            session,
            last_seq: after_seq,
            backlog: VecDeque::new(),
            more: true,
            rx,
        };
        f.refill().await?;
        Ok(f)
    }

    async fn refill(&mut self) -> Result<(), EngineError> {
        let (events, more) = self
            .engine
            .events_after_seq(&self.session, self.last_seq, PAGE)
            .await?;
        self.backlog = events.into();
        self.more = more;
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
            if self.more {
                if let Err(e) = self.refill().await {
                    tracing::warn!(session = %self.session.id, error = %e, "refilling a subscriber from the log failed");
                    return None;
                }
                if !self.backlog.is_empty() {
                    continue;
                }
            }
            match self.rx.recv().await {
                Ok(Feed::Event(ev)) if ev.seq > self.last_seq => {
                    if ev.seq > self.last_seq + 1 {
                        // Something fell between: read it from the log first.
                        self.more = true;
                        self.backlog.push_back(ev);
                        if let Err(e) = self.refill().await {
                            tracing::warn!(error = %e, "refill failed");
                            return None;
                        }
                        continue;
                    }
                    self.last_seq = ev.seq;
                    return Some(Feed::Event(ev));
                }
                Ok(Feed::Event(_)) | Ok(Feed::Fragment { .. }) => continue,
                Ok(delta @ Feed::Delta { .. }) => return Some(delta),
                Err(RecvError::Lagged(n)) => {
                    tracing::debug!(session = %self.session.id, skipped = n, "slow subscriber refilled from the log");
                    self.rx = self.rx.resubscribe();
                    self.more = true;
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

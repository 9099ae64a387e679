//! What a session holds on its way to its live subscribers, under the session's lock: events
//! appended but not yet durable (published in order once committed, never before), the events
//! of its current turn published so far (for subscribers that join mid-turn), the coalescer that
//! gathers streamed fragments into deltas, and the live feed itself.

use std::sync::Arc;

use tokio::sync::broadcast;

use crate::engine::types::{DeltaKind, Feed};
use crate::log::{DeltaTap, Event, EventBody, RemoteDelta, Store};

/// Deltas are pushed when this many characters are buffered...
pub(crate) const DELTA_CHARS: usize = 200;
/// ...or this long after the first buffered fragment, whichever comes first.
pub(crate) const DELTA_WAIT: std::time::Duration = std::time::Duration::from_millis(50);

/// Gathers a turn's streamed fragments into deltas (spec 003).
#[derive(Debug)]
pub(crate) struct Coalescer {
    turn_id: Arc<str>,
    kind: DeltaKind,
    buf: String,
    chars: usize,
    /// When the buffer must be pushed (50 ms after its first fragment).
    pub deadline: Option<tokio::time::Instant>,
}

/// Live subscribers may lag this many items behind before they must refill from the log.
const FEED_CAPACITY: usize = 4096;

/// A session's events and deltas on their way to its live subscribers.
#[derive(Default)]
pub(crate) struct Outbox {
    /// The published events of the current (or last) turn, for subscribers that join mid-turn.
    pub tail: Vec<Arc<Event>>,
    /// Events appended but not yet published, with their store tickets, in order.
    pub held: Vec<(u64, Arc<Event>)>,
    pub coalescer: Option<Coalescer>,
    /// The live feed, made when the first subscriber comes and dropped when the last has gone
    /// (its buffer is sizeable, and most sessions never have a subscriber).
    feed: Option<broadcast::Sender<Feed>>,
    /// A shared store: the session's deltas also go to the other instances watching it.
    pub remote: Option<DeltaTap>,
}

impl Outbox {
    /// An outbox whose turn so far is `tail`.
    pub(crate) fn with_tail(tail: Vec<Arc<Event>>) -> Outbox {
        Outbox {
            tail,
            ..Default::default()
        }
    }

    /// Send an item to live subscribers, if there are any.
    fn send(&mut self, item: Feed) {
        if let Some(tx) = &self.feed {
            if tx.send(item).is_err() {
                self.feed = None;
            }
        }
    }

    /// End every live subscription (the session is gone).
    pub(crate) fn close_feed(&mut self) {
        self.feed = None;
    }

    /// Whether the session has live subscribers.
    pub(crate) fn watched(&self) -> bool {
        self.feed.as_ref().is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// Whether the session has live subscribers here, or another instance watches it.
    pub(crate) fn watched_anywhere(&self) -> bool {
        self.watched() || self.remote.as_ref().is_some_and(DeltaTap::watched)
    }

    /// A new subscription to the live feed (made now if there is none).
    pub(crate) fn subscribe(&mut self) -> broadcast::Receiver<Feed> {
        match &self.feed {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = broadcast::channel(FEED_CAPACITY);
                self.feed = Some(tx);
                rx
            }
        }
    }

    /// Publish, in order, the held events the store has committed; returns them. An event whose
    /// commit failed is not in the log: nobody sees it, and `diverged` is set.
    pub(crate) fn publish_durable(
        &mut self,
        store: &Store,
        diverged: &mut bool,
    ) -> Vec<Arc<Event>> {
        let committed = store.committed();
        let n = self
            .held
            .iter()
            .take_while(|(t, _)| *t <= committed)
            .count();
        let mut out = Vec::with_capacity(n);
        let held: Vec<_> = self.held.drain(..n).collect();
        for (ticket, ev) in held {
            if store.failed(ticket) {
                // Not in the log: nobody sees it.
                *diverged = true;
                continue;
            }
            if matches!(ev.body, EventBody::UserMessage { .. }) {
                self.tail.clear();
            }
            self.tail.push(ev.clone());
            self.send(Feed::Event(ev.clone()));
            out.push(ev);
        }
        out
    }

    /// Publish an event another instance committed (a shared store), as if this one had.
    pub(crate) fn publish_heard(&mut self, ev: Arc<Event>) {
        if matches!(ev.body, EventBody::UserMessage { .. }) {
            self.tail.clear();
        }
        self.tail.push(ev.clone());
        self.send(Feed::Event(ev));
    }

    /// Add a streamed fragment to the turn's coalescer, pushing a delta at every 200 characters.
    /// Returns whether the buffer now waits on its 50 ms deadline (someone must push it then:
    /// see [`Outbox::flush_due`]). Without live subscribers there is nobody to coalesce for.
    pub(crate) fn push_fragment(
        &mut self,
        turn_id: &Arc<str>,
        kind: DeltaKind,
        fragment: &str,
    ) -> bool {
        if !self.watched_anywhere() {
            self.coalescer = None;
            return false;
        }
        if self
            .coalescer
            .as_ref()
            .is_some_and(|c| c.kind != kind || c.turn_id != *turn_id)
        {
            self.flush_deltas();
        }
        let c = self.coalescer.get_or_insert_with(|| Coalescer {
            turn_id: turn_id.clone(),
            kind,
            buf: String::new(),
            chars: 0,
            deadline: None,
        });
        c.kind = kind;
        let mut full = Vec::new();
        for ch in fragment.chars() {
            c.buf.push(ch);
            c.chars += 1;
            if c.chars == DELTA_CHARS {
                full.push(std::mem::take(&mut c.buf));
                c.chars = 0;
                c.deadline = None;
            }
        }
        if !c.buf.is_empty() && c.deadline.is_none() {
            c.deadline = Some(tokio::time::Instant::now() + DELTA_WAIT);
        }
        let turn_id = c.turn_id.clone();
        let waits = c.deadline.is_some();
        for text in full {
            self.emit(turn_id.clone(), kind, text.into());
        }
        waits
    }

    /// A coalesced delta of this instance's turn: to live subscribers here, and to the other
    /// instances watching the session (before any later event, under the session's lock).
    fn emit(&mut self, turn_id: Arc<str>, kind: DeltaKind, text: Arc<str>) {
        if let Some(tap) = &self.remote {
            let after = self.tail.last().map_or(0, |e| e.seq);
            tap.send(after, &turn_id, kind == DeltaKind::Thinking, &text);
        }
        self.send(Feed::Delta {
            turn_id,
            kind,
            text,
        });
    }

    /// A delta another instance's turn streamed (a shared store): to live subscribers here
    /// only, if they have seen exactly the events that instance's had (`last_seq`, this
    /// instance's last known seq): never after the event it leads to.
    pub(crate) fn publish_remote_delta(&mut self, d: &RemoteDelta, last_seq: u64) -> bool {
        if d.after_seq != last_seq {
            return false;
        }
        let kind = if d.thinking {
            DeltaKind::Thinking
        } else {
            DeltaKind::Message
        };
        self.send(Feed::Delta {
            turn_id: d.turn_id.as_str().into(),
            kind,
            text: d.text.as_str().into(),
        });
        true
    }

    /// Push what the coalescer holds (called before every stored event, and by the timer).
    pub(crate) fn flush_deltas(&mut self) {
        if let Some(c) = self.coalescer.as_mut() {
            c.deadline = None;
            c.chars = 0;
            if !c.buf.is_empty() {
                let (turn_id, kind) = (c.turn_id.clone(), c.kind);
                let text = std::mem::take(&mut c.buf).into();
                self.emit(turn_id, kind, text);
            }
        }
    }

    /// Push the buffer if its 50 ms are up; when the next push is due otherwise.
    pub(crate) fn flush_due(&mut self) -> Option<tokio::time::Instant> {
        let deadline = self.coalescer.as_ref().and_then(|c| c.deadline)?;
        if deadline <= tokio::time::Instant::now() {
            self.flush_deltas();
            None
        } else {
            Some(deadline)
        }
    }
}

//! What a turn sends its watcher (the request that started it), bounded.
//!
//! A watcher that stops reading (an SSE client that no longer drains its socket) must not make
//! the server hold everything its turn says: the channel holds at most [`BOUND`] items, and the
//! turn never waits on it (a turn that waited would hold its session, its slot and its upstream
//! call hostage to one slow client). When it is full:
//! - a streamed fragment is dropped, and so is every later one of the turn: the watcher then
//!   gets the text with the stored `agent.message` (AAP `delta` mode sends what it missed as one
//!   delta: see `protocol/aap/render.rs`);
//! - a stored event is dropped, and so is every later item: the watcher, once it has read what
//!   the channel holds, reads the rest of its turn from the log (which has every event), from the
//!   first one it missed, and then follows it live like any subscriber.
//!
//! So a slow reader pauses only its own delivery, misses nothing, and costs the server at most
//! [`BOUND`] items, whatever its turn says.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use futures_util::task::AtomicWaker;
use tokio::sync::mpsc::{self, error::TrySendError};

use crate::engine::types::{DeltaKind, Feed};
use crate::log::Event;

/// Items a watcher may have unread before its turn stops sending to it.
pub(crate) const BOUND: usize = 1024;

/// What the turn and its watcher share besides the channel.
#[derive(Default)]
pub(crate) struct Overflow {
    /// The seq of the first event the channel could not take (0: none yet).
    dropped_from: AtomicU64,
    /// Fragments are no longer sent (one was dropped, or an event was).
    fragments_off: AtomicBool,
    /// The watcher, woken when an event is dropped (it may be waiting on an empty channel).
    waker: AtomicWaker,
}

impl Overflow {
    /// The seq of the first event the watcher missed, if any.
    pub(crate) fn dropped_from(&self) -> Option<u64> {
        match self.dropped_from.load(Ordering::Acquire) {
            0 => None,
            seq => Some(seq),
        }
    }

    /// Whether streamed fragments were dropped: the stored text then says what they missed.
    pub(crate) fn fragments_lost(&self) -> bool {
        self.fragments_off.load(Ordering::Acquire)
    }

    /// No fragment reaches the watcher (it reads the turn from the log): the stored text says
    /// all.
    pub(crate) fn lose_fragments(&self) {
        self.fragments_off.store(true, Ordering::Release);
    }

    pub(crate) fn register(&self, waker: &std::task::Waker) {
        self.waker.register(waker);
    }
}

/// The turn's end of its watcher's channel.
pub(crate) struct WatcherSink {
    tx: mpsc::Sender<Feed>,
    overflow: Arc<Overflow>,
}

/// A bounded channel for a turn's watcher: the turn's end, the watcher's, and what they share.
pub(crate) fn channel() -> (WatcherSink, mpsc::Receiver<Feed>, Arc<Overflow>) {
    let (tx, rx) = mpsc::channel(BOUND);
    let overflow = Arc::new(Overflow::default());
    let sink = WatcherSink {
        tx,
        overflow: overflow.clone(),
    };
    (sink, rx, overflow)
}

impl WatcherSink {
    /// A stored event, unless the watcher has missed one already (it reads them from the log).
    pub(crate) fn event(&self, ev: Arc<Event>) {
        if self.overflow.dropped_from().is_some() {
            return;
        }
        if let Err(TrySendError::Full(Feed::Event(ev))) = self.tx.try_send(Feed::Event(ev)) {
            self.overflow.fragments_off.store(true, Ordering::Release);
            self.overflow
                .dropped_from
                .store(ev.seq.max(1), Ordering::Release);
            self.overflow.waker.wake();
        }
    }

    /// A streamed fragment, unless fragments were dropped already.
    pub(crate) fn fragment(&self, kind: DeltaKind, text: &str) {
        if self.overflow.fragments_lost() {
            return;
        }
        let item = Feed::Fragment {
            kind,
            text: text.to_string(),
        };
        if let Err(TrySendError::Full(_)) = self.tx.try_send(item) {
            self.overflow.fragments_off.store(true, Ordering::Release);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::EventBody;

    fn event(seq: u64) -> Arc<Event> {
        Arc::new(Event::new(
            seq,
            format!("evt_{seq}"),
            "turn_1".into(),
            "2026-01-01T00:00:00.000Z".into(),
            EventBody::TurnCancelled { usage: None },
        ))
    }

    #[test]
    fn a_full_channel_drops_fragments_then_events_and_says_from_where() {
        let (sink, mut rx, overflow) = channel();
        for i in 0..BOUND {
            sink.fragment(DeltaKind::Message, &i.to_string());
        }
        assert!(!overflow.fragments_lost());
        sink.fragment(DeltaKind::Message, "one too many");
        assert!(overflow.fragments_lost());
        // Room again: fragments stay off, events go on.
        rx.try_recv().unwrap();
        sink.fragment(DeltaKind::Message, "dropped");
        sink.event(event(7));
        assert_eq!(overflow.dropped_from(), None);
        sink.event(event(8));
        assert_eq!(overflow.dropped_from(), Some(8));
        // Everything after the first missed event is left to the log.
        for _ in 0..BOUND {
            rx.try_recv().unwrap();
        }
        sink.event(event(9));
        assert!(
            rx.try_recv().is_err(),
            "nothing after the first missed event"
        );
        assert_eq!(overflow.dropped_from(), Some(8));
    }
}

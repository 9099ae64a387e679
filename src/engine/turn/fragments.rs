//! A model call's streamed fragments on their way to the turn's watcher and the session's live
//! subscribers, never before the events said before them (see `engine/delivery/`), and the
//! model call run beside the commit of those events.

use std::sync::Arc;
use std::time::Duration;

use crate::engine::delivery::channel::WatcherSink;
use crate::engine::delivery::outbox::DELTA_WAIT;
use crate::engine::session::Session;
use crate::engine::types::DeltaKind;
use crate::sync::lock;
use crate::upstream::DeltaSink;

/// Runs `call` (a model call) and `sync` (making the turn's events durable) side by side: if
/// `call` has not answered when a commit is `due` (its request went out in its first poll),
/// `sync` runs (committing on this thread) while the other side works, then `call` goes on.
/// `due`: `None` when everything is committed already. Returns whether everything said before
/// the call is now committed and published; if so, the fragments `feed` held back (they may not
/// pass the events before them) have gone to subscribers, and the next go at once.
pub(crate) async fn overlapped<T, E>(
    call: impl std::future::Future<Output = T>,
    sync: impl std::future::Future<Output = Result<(), E>>,
    due: Option<Duration>,
    feed: &FragmentFeed<'_>,
) -> Result<(T, bool), E> {
    let Some(due) = due else {
        feed.release();
        return Ok((call.await, true));
    };
    let mut call = std::pin::pin!(call);
    if let Ok(out) = tokio::time::timeout(due, call.as_mut()).await {
        return Ok((out, false));
    }
    sync.await?;
    feed.release();
    Ok((call.await, true))
}

/// Forwards a model call's streamed fragments to the turn's watcher and the session's live
/// subscribers.
pub(crate) struct Deltas<'a> {
    pub(crate) sink: Option<&'a WatcherSink>,
    /// Set when text is streamed (the turn's `streamed`).
    pub(crate) streamed: &'a std::sync::atomic::AtomicBool,
    pub(crate) feed: &'a FragmentFeed<'a>,
    pub(crate) thinking: bool,
    pub(crate) streamed_text: bool,
    /// The attempt's text, kept when the watcher cannot retract what it was sent.
    pub(crate) kept: Option<String>,
}

/// A model call's fragments on their way to the session's live subscribers, who may see them
/// only after the turn's earlier events: until those are published, fragments are held back, in
/// order.
pub(crate) struct FragmentFeed<'a> {
    session: &'a Arc<Session>,
    turn_id: &'a Arc<str>,
    flusher: &'a std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The fragments held back; `None` once released (or discarded).
    held: std::sync::Mutex<Option<Vec<(DeltaKind, String)>>>,
}

/// Pushes the session's coalesced deltas when their 50 ms are up, until aborted.
async fn flush_deltas_on_time(session: Arc<Session>) {
    let mut tick = tokio::time::interval(DELTA_WAIT / 5);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        match session.flush_due() {
            Some(deadline) => tokio::time::sleep_until(deadline).await,
            None => {
                tick.tick().await;
            }
        }
    }
}

impl<'a> FragmentFeed<'a> {
    /// A model call's feed: its fragments are held back until [`FragmentFeed::release`].
    pub(crate) fn new(
        session: &'a Arc<Session>,
        turn_id: &'a Arc<str>,
        flusher: &'a std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    ) -> FragmentFeed<'a> {
        FragmentFeed {
            session,
            turn_id,
            flusher,
            held: std::sync::Mutex::new(Some(Vec::new())),
        }
    }

    fn held(&self) -> std::sync::MutexGuard<'_, Option<Vec<(DeltaKind, String)>>> {
        lock(&self.held)
    }

    pub(crate) fn push(&self, kind: DeltaKind, fragment: &str) {
        if let Some(held) = self.held().as_mut() {
            held.push((kind, fragment.to_string()));
            return;
        }
        self.to_feed(kind, fragment);
    }

    /// The earlier events are out: send the fragments held back, and the next ones at once.
    pub(crate) fn release(&self) {
        for (kind, text) in self.held().take().unwrap_or_default() {
            self.to_feed(kind, &text);
        }
    }

    /// Whether fragments are held back.
    pub(crate) fn holds_any(&self) -> bool {
        self.held().as_ref().is_some_and(|h| !h.is_empty())
    }

    /// Drop the fragments held back: the call is over, and the message they make up follows.
    pub(crate) fn discard(&self) {
        self.held().take();
    }

    /// Into the session's coalescer, for its live subscribers.
    fn to_feed(&self, kind: DeltaKind, fragment: &str) {
        if self.session.push_fragment(self.turn_id, kind, fragment) {
            let mut flusher = lock(self.flusher);
            if flusher.is_none() {
                *flusher = Some(tokio::spawn(flush_deltas_on_time(self.session.clone())));
            }
        }
    }
}

impl Deltas<'_> {
    fn send(&mut self, kind: DeltaKind, fragment: &str) {
        // The watcher gets fragments at once: it renders them only in AAP `delta` mode, which
        // shows no event of the turn before its text (and never retracts, so no retry's
        // fragments can pass a retraction).
        if let Some(sink) = self.sink {
            sink.fragment(kind, fragment);
        }
        self.feed.push(kind, fragment);
    }
}

impl DeltaSink for Deltas<'_> {
    fn text(&mut self, fragment: &str) {
        if !fragment.is_empty() {
            self.streamed_text = true;
            self.streamed
                .store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(kept) = self.kept.as_mut() {
                kept.push_str(fragment);
            }
            self.send(DeltaKind::Message, fragment);
        }
    }

    fn thinking(&mut self, fragment: &str) {
        if self.thinking && !fragment.is_empty() {
            self.send(DeltaKind::Thinking, fragment);
        }
    }
}

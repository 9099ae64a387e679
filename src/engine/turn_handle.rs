//! A started turn as its watcher holds it: what the turn sends, read from its bounded channel,
//! then from the log if the watcher fell behind; and, for a turn its watcher runs, the turn
//! itself, polled as the watcher reads.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::delivery::channel::Overflow;
use super::engine_handle::Engine;
use super::log_follower::Follow;
use super::run_by_watcher::Driven;
use super::session::Session;
use super::types::{EngineError, Feed};

/// A started turn: its id and what it sends as it runs (stored events and deltas), read with
/// [`TurnHandle::recv`]. The turn goes on if this is dropped. What it sends waits here bounded
/// (see `delivery/channel.rs`): a reader that falls too far behind reads the rest of the turn from the log.
pub struct TurnHandle {
    pub turn_id: String,
    /// The seq of the session's last event when the turn was ordered: the turn's events come
    /// after it (AAP replays a keyed request's turn from there).
    pub after_seq: u64,
    feed: mpsc::Receiver<Feed>,
    overflow: Arc<Overflow>,
    /// Once the channel overflowed: the rest of the turn, from the log.
    follow: Option<Box<Follow>>,
    /// For reading from the log.
    engine: Engine,
    session: Arc<Session>,
    /// The turn's terminal event has been returned (read from the log).
    done: bool,
    /// The turn itself, when its watcher runs it (see [`Runner::Watcher`](super::types::Runner::Watcher)).
    driven: Option<Driven>,
    /// Counts a driven turn among the running ones until everything it sent is read, so that a
    /// shutdown waits for its watcher to have its terminal event.
    running: Option<tokio_util::task::task_tracker::TaskTrackerToken>,
    /// When the turn counts as accepted (see [`TurnHandle::accepted`]).
    accept: Accept,
    /// What [`TurnHandle::accepted`] read of the turn, for [`TurnHandle::recv`] to return first.
    peeked: Option<Feed>,
    /// A turn another instance starts (see [`TurnHandle::followed`]): by when its first event
    /// must be in the log, else the handle ends.
    first_by: Option<tokio::time::Instant>,
}

/// When a started turn is accepted durably.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Accept {
    /// It queued: once the commit that holds its row in the inbox is through (this ticket; 0:
    /// its row was in the store already).
    Ticket(u64),
    /// It runs now: once its first event is out, which nobody sees before it is durable.
    FirstEvent,
}

/// What the channel gave a [`TurnHandle`].
enum Step {
    Item(Feed),
    /// The turn has ended and everything it sent is read.
    End,
    /// The channel overflowed: the turn's events from after this seq are in the log only.
    Missed(u64),
}

/// What a [`TurnHandle`] reads: the turn's channel and its overflow, the turn itself when its
/// watcher runs it, and the token that counts it among the running turns meanwhile.
pub(crate) type HandleParts = (
    mpsc::Receiver<Feed>,
    Arc<Overflow>,
    Option<Driven>,
    Option<tokio_util::task::task_tracker::TaskTrackerToken>,
);

impl TurnHandle {
    pub(crate) fn new(
        (turn_id, after_seq): (String, u64),
        engine: Engine,
        session: Arc<Session>,
        (feed, overflow, driven, running): HandleParts,
    ) -> TurnHandle {
        TurnHandle {
            turn_id,
            after_seq,
            feed,
            overflow,
            follow: None,
            engine,
            session,
            done: false,
            driven,
            running,
            accept: Accept::FirstEvent,
            peeked: None,
            first_by: None,
        }
    }

    /// A turn another instance runs (it was sent the order through the store's inbox, see
    /// `command/answer_relay.rs`): its events read from the log, `follow`ed from before it.
    /// Accepted already (the inbox row is committed); its text comes whole with each stored
    /// message (no streamed fragments reach this instance).
    pub(crate) fn followed(
        (turn_id, after_seq): (String, u64),
        engine: &Engine,
        session: &Arc<Session>,
        follow: Follow,
    ) -> TurnHandle {
        let (sink, feed, overflow) = super::delivery::channel::channel();
        drop(sink);
        overflow.lose_fragments();
        let mut handle = TurnHandle::new(
            (turn_id, after_seq),
            engine.clone(),
            session.clone(),
            (feed, overflow, None, None),
        )
        .accepted_when(Accept::Ticket(0));
        handle.follow = Some(Box::new(follow));
        handle
    }

    /// End the handle (no terminal event) when the turn has not begun within `wait`: the
    /// instance it was sent to did not start it.
    pub(crate) fn first_event_within(mut self, wait: std::time::Duration) -> TurnHandle {
        self.first_by = Some(tokio::time::Instant::now() + wait);
        self
    }

    /// This turn is accepted as `accept` says.
    pub(crate) fn accepted_when(mut self, accept: Accept) -> TurnHandle {
        self.accept = accept;
        self
    }

    /// Returns once the turn is accepted durably: what the request that started it is answered
    /// with (its `202`, its stream's first byte) can never be lost to a crash from then on. A
    /// queued turn: its row in the store's inbox is committed (it is carried out after a crash).
    /// A turn that runs now: its `user.message` is committed (a crash closes it `worker_lost`);
    /// a turn the watcher runs runs meanwhile (the event is then the first [`TurnHandle::recv`]
    /// returns). An error when the store could not take it: nothing of the turn is stored.
    pub async fn accepted(&mut self) -> Result<(), EngineError> {
        let store = &self.engine.inner.store;
        match self.accept {
            Accept::Ticket(0) => Ok(()),
            Accept::Ticket(ticket) => {
                if store.committed() < ticket {
                    store.flush().await?;
                }
                if store.failed(ticket) {
                    return Err(EngineError::Store(crate::log::StoreError::WriteFailed(
                        "the queued turn could not be stored".into(),
                    )));
                }
                Ok(())
            }
            Accept::FirstEvent if self.peeked.is_some() => Ok(()),
            Accept::FirstEvent => match self.recv().await {
                Some(item) => {
                    self.peeked = Some(item);
                    Ok(())
                }
                None => Err(EngineError::Store(crate::log::StoreError::WriteFailed(
                    "the turn's start could not be stored".into(),
                ))),
            },
        }
    }

    /// The next thing the turn sends: `None` once it has ended and everything it sent is read.
    /// A driven turn runs while this is polled; if it is not polled for a second or two after
    /// the turn was woken, the turn goes on on a task of its own (see `run_by_watcher.rs`).
    pub async fn recv(&mut self) -> Option<Feed> {
        if let Some(item) = self.peeked.take() {
            return Some(item);
        }
        loop {
            if self.done {
                self.running = None;
                return None;
            }
            if let Some(follow) = self.follow.as_mut() {
                let next = match self.first_by {
                    None => follow.next().await,
                    Some(by) => tokio::time::timeout_at(by, follow.next())
                        .await
                        .unwrap_or_else(|_| {
                            tracing::warn!(turn = %self.turn_id, "the instance holding the session did not start the turn it was sent; its client's stream ends");
                            None
                        }),
                };
                match next {
                    Some(Feed::Event(ev)) if *ev.turn_id == *self.turn_id => {
                        self.first_by = None;
                        self.done = ev.body.is_terminal();
                        return Some(Feed::Event(ev));
                    }
                    Some(_) => continue,
                    None => {
                        self.done = true;
                        continue;
                    }
                }
            }
            match std::future::poll_fn(|cx| self.poll_step(cx)).await {
                Step::Item(item) => return Some(item),
                Step::End => return None,
                Step::Missed(after) => {
                    tracing::debug!(turn = %self.turn_id, "a turn's watcher fell behind: it reads the rest of the turn from the log");
                    if let Some(driven) = self.driven.take() {
                        driven.detach();
                    }
                    let session = self.session.clone();
                    match Follow::new(&self.engine, session, after).await {
                        Ok(f) => self.follow = Some(Box::new(f)),
                        Err(e) => {
                            tracing::warn!(turn = %self.turn_id, error = %e, "a turn's watcher could not read the rest of its turn from the log");
                            self.done = true;
                        }
                    }
                }
            }
        }
    }

    /// Whether streamed fragments were dropped (the watcher fell behind): the stored text then
    /// holds what they missed.
    pub fn fragments_lost(&self) -> bool {
        self.overflow.fragments_lost()
    }

    fn poll_step(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<Step> {
        use std::task::Poll;
        // The turn first: what it sends as it runs is then read in the same poll.
        if let Some(driven) = &self.driven {
            if driven.poll(cx).is_ready() {
                self.driven = None;
            }
        }
        match self.feed.poll_recv(cx) {
            Poll::Ready(Some(item)) => Poll::Ready(Step::Item(item)),
            Poll::Ready(None) => match self.overflow.dropped_from() {
                Some(seq) => Poll::Ready(Step::Missed(seq - 1)),
                None => {
                    self.running = None;
                    Poll::Ready(Step::End)
                }
            },
            Poll::Pending => {
                self.overflow.register(cx.waker());
                let Some(seq) = self.overflow.dropped_from() else {
                    return Poll::Pending;
                };
                // Nothing is sent after the first missed event: what the channel still holds
                // (sent since it was last seen empty) comes first.
                match self.feed.try_recv() {
                    Ok(item) => Poll::Ready(Step::Item(item)),
                    Err(_) => Poll::Ready(Step::Missed(seq - 1)),
                }
            }
        }
    }
}

impl Drop for TurnHandle {
    /// A watcher that goes away mid-turn (a client that disconnects) leaves its turn to a task
    /// of its own.
    fn drop(&mut self) {
        if let Some(driven) = self.driven.take() {
            driven.detach();
        }
    }
}

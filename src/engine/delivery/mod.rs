//! Delivery of a turn's events and fragments to its watcher and the session's live subscribers,
//! in the one order they may see them: stored events only once durable, and a model call's
//! fragments never before the events said before them (held back by the turn's
//! `engine/turn/fragments.rs`). The watcher's bounded channel is in
//! `channel.rs`; what a session holds on its way to subscribers (events not yet published, the
//! coalescer of deltas, the live feed) is in `outbox.rs`. On a shared store, the coalesced
//! deltas of a session another instance watches also go to it (`Outbox::remote`), and the
//! deltas another instance's turn streamed come in through `Session::publish_remote`.

pub(crate) mod channel;
pub(crate) mod outbox;

use std::sync::Arc;

use crate::log::Event;
use channel::WatcherSink;

/// Hand published events to the turn's watcher, if it has one.
pub(crate) fn to_watcher(sink: Option<&WatcherSink>, events: Vec<Arc<Event>>) {
    if let Some(sink) = sink {
        for ev in events {
            sink.event(ev);
        }
    }
}

//! One instance's side of streamed deltas: the sessions other instances watch (so a turn
//! sends only what someone watches), its own watches, and the deltas queued to send.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::sync::lock;

/// A delta another instance streamed, as the listener heard it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteDelta {
    pub session_id: String,
    /// The seq of the last stored event the writer's subscribers had been shown before it.
    pub after_seq: u64,
    pub turn_id: String,
    pub thinking: bool,
    pub text: String,
}

/// A delta on the wire: (session, after_seq, turn, thinking, text).
pub(super) type Wire = (String, u64, String, bool, String);

/// The deltas and watches of one store (one instance).
#[derive(Default)]
pub(crate) struct Deltas {
    /// Sessions other instances watch: by session, each watching instance and when its watch
    /// expires unless renewed.
    pub(super) watched: Mutex<HashMap<String, HashMap<String, Instant>>>,
    /// `watched.len()`: when 0 (nobody watches anything) no lock is taken.
    pub(super) n_watched: AtomicUsize,
    /// This instance's live subscribers, by session.
    pub(super) watching: Mutex<HashMap<String, usize>>,
    /// Held while this instance tells the database of a watch or its end, so that a session
    /// watched again as its last subscriber leaves ends watched.
    pub(super) watch_ops: tokio::sync::Mutex<()>,
    /// Deltas queued to send.
    pub(super) queue: Mutex<Vec<Wire>>,
    /// Held while a batch is sent (a commit waits for the one under way).
    pub(super) sending: tokio::sync::Mutex<()>,
    /// Woken when the queue gains its first delta.
    pub(super) wake: tokio::sync::Notify,
    /// Whether the listener has listened and read the watches under way once (an instance
    /// starts serving only then: see [`Deltas::until_listening`]).
    pub(super) listening: std::sync::atomic::AtomicBool,
    pub(super) listening_now: tokio::sync::Notify,
    /// Numbers this instance's notifications on the channel.
    pub(super) numbered: AtomicU64,
}

/// What the engine holds to send a session's deltas (`Store::delta_tap`).
#[derive(Clone)]
pub struct DeltaTap {
    pub(super) deltas: Arc<Deltas>,
    pub(super) session_id: Arc<str>,
}

impl DeltaTap {
    /// Whether another instance watches the session now. One atomic load when nobody watches
    /// anything.
    pub fn watched(&self) -> bool {
        self.deltas.is_watched(&self.session_id)
    }

    /// Queue a delta for the instances watching the session (call it under the session's
    /// lock, in the order its subscribers get them). Never blocks, never fails.
    pub fn send(&self, after_seq: u64, turn_id: &str, thinking: bool, text: &str) {
        let d = &self.deltas;
        if !d.is_watched(&self.session_id) {
            return;
        }
        let mut q = lock(&d.queue);
        q.push((
            self.session_id.to_string(),
            after_seq,
            turn_id.to_string(),
            thinking,
            text.to_string(),
        ));
        if q.len() == 1 {
            d.wake.notify_one();
        }
    }
}

impl Deltas {
    pub(super) fn is_watched(&self, session_id: &str) -> bool {
        if self.n_watched.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let now = Instant::now();
        let mut w = lock(&self.watched);
        let Some(by) = w.get_mut(session_id) else {
            return false;
        };
        by.retain(|_, until| *until > now);
        if by.is_empty() {
            w.remove(session_id);
            self.n_watched.store(w.len(), Ordering::Relaxed);
            return false;
        }
        true
    }

    pub(super) fn note_watch(&self, instance: &str, sessions: Vec<String>, until: Instant) {
        let mut w = lock(&self.watched);
        for sid in sessions {
            w.entry(sid)
                .or_default()
                .insert(instance.to_string(), until);
        }
        self.n_watched.store(w.len(), Ordering::Relaxed);
    }

    pub(super) fn note_unwatch(&self, instance: &str, sessions: Vec<String>) {
        let mut w = lock(&self.watched);
        for sid in sessions {
            if let Some(by) = w.get_mut(&sid) {
                by.remove(instance);
                if by.is_empty() {
                    w.remove(&sid);
                }
            }
        }
        self.n_watched.store(w.len(), Ordering::Relaxed);
    }
}

impl Deltas {
    /// Waits (at most `within`) until the listener listens and knows the watches under way,
    /// so that a turn started at once sends its first deltas to whoever watches already.
    pub(super) async fn until_listening(&self, within: Duration) {
        let _ = tokio::time::timeout(within, async {
            loop {
                let now = self.listening_now.notified();
                let mut now = std::pin::pin!(now);
                now.as_mut().enable();
                if self.listening.load(Ordering::Acquire) {
                    return;
                }
                now.await;
            }
        })
        .await;
    }
}

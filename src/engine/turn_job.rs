//! A turn as ordered, before and while it runs: its job (what it does and for whom), its control
//! (cancel, and why), and its place among the running turns (`[limits] running_turns`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

use super::delivery::channel::WatcherSink;
use super::session_record::Pending;
use super::types::{Client, ShownText, TurnInput};
use crate::sync::lock;

pub(crate) struct Job {
    pub control: Arc<TurnControl>,
    pub input: TurnInput,
    /// The calls being answered (for `Resume`), taken from the session when the turn started.
    pub answering: Vec<Pending>,
    pub sink: Option<WatcherSink>,
    pub client: Client,
    /// Plan mode (runs API): propose a plan without tools and wait for its approval first.
    pub plan: bool,
    pub max_steps: Option<u32>,
    pub text: ShownText,
    /// Its place among the running turns; `None` for a queued turn until it runs.
    pub slot: Option<RunSlot>,
    /// The span current when it was started (its request's): its own span's parent, wherever
    /// and whenever it runs.
    pub parent: tracing::Span,
    /// A row in the store's inbox stands for the turn until it begins (it was queued, or taken
    /// from the inbox): the commit of its `user.message` removes it, and is made before the turn
    /// calls the model, so that a turn carried out again after a crash has done nothing yet.
    pub row: bool,
    /// Its start is committed at once (see [`Delivery::confirm`](super::types::Delivery)).
    pub confirm: bool,
}

/// Why a running turn is being stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopCause {
    Cancelled,
    Shutdown,
}

/// The handle of a running turn.
#[derive(Debug)]
pub(crate) struct TurnControl {
    pub turn_id: String,
    pub token: CancellationToken,
    cause: Mutex<Option<StopCause>>,
}

impl TurnControl {
    pub(crate) fn new(turn_id: String) -> Arc<TurnControl> {
        Arc::new(TurnControl {
            turn_id,
            token: CancellationToken::new(),
            cause: Mutex::new(None),
        })
    }

    /// Ask the turn to stop; the first cause wins.
    pub(crate) fn stop(&self, cause: StopCause) {
        let mut c = lock(&self.cause);
        c.get_or_insert(cause);
        self.token.cancel();
    }

    pub(crate) fn cause(&self) -> Option<StopCause> {
        *lock(&self.cause)
    }
}

/// A turn counted among the running ones (`[limits] running_turns`) while it lives: taken when
/// a turn starts at once (refused past the limit) or when a queued one takes its session over
/// (never refused: it was accepted), given back when the turn's task ends.
pub(crate) struct RunSlot(Arc<AtomicUsize>);

impl RunSlot {
    /// A slot, if fewer than `limit` turns run.
    pub(crate) fn try_take(count: &Arc<AtomicUsize>, limit: usize) -> Option<RunSlot> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| RunSlot(count.clone()))
    }

    /// A slot whatever the count (a queued turn that was accepted).
    pub(crate) fn take(count: &Arc<AtomicUsize>) -> RunSlot {
        count.fetch_add(1, Ordering::AcqRel);
        RunSlot(count.clone())
    }
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

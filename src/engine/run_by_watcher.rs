//! Turns run by the task that watches them (see [`Runner::Watcher`](super::types::Runner::Watcher)), and the sweeper
//! that moves a stalled one to a task of its own.
//!
//! A watcher that runs its turn saves a hand-off between tasks at every step: what the
//! upstream sends is read, rendered and written out in one poll. But a watcher can stop
//! polling without going away: an SSE client that stops reading fills its socket, and its
//! connection stops asking the body for frames. Its turn must not stall with it: its time
//! limit, its commits, a cancel, a shutdown and the session's queue all wait on the turn
//! running. So the turn is polled with a waker of its own that notes each wake-up before
//! passing it on to the watcher, and a sweeper looks at the driven turns every [`TICK`]: one
//! woken and not polled since its last look goes to a task of its own, and its watcher reads
//! what it sends as from any turn on its own task.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use futures_util::task::AtomicWaker;
use tokio_util::task::TaskTracker;

use crate::sync::lock;

/// How often the sweeper looks: a turn whose watcher stopped polling it moves to a task of its
/// own one to two of these after it was woken.
pub(crate) const TICK: Duration = Duration::from_secs(1);

/// Looks with nothing to look at before the sweeper's task ends (a new driven turn starts it
/// again).
const IDLE_TICKS: u32 = 60;

type TurnFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A turn its watcher runs, until it ends, its watcher goes away ([`Driven::detach`]) or the
/// sweeper moves it.
pub(crate) struct Driven {
    slot: Arc<Slot>,
    /// Wakes through `slot` (kept here: a waker inside the slot would keep it alive forever).
    waker: Waker,
    tracker: TaskTracker,
}

struct Slot {
    /// The turn, while its watcher runs it.
    turn: Mutex<Option<TurnFuture>>,
    /// The watcher's waker, woken by the turn's.
    watcher: AtomicWaker,
    /// Woken since last polled.
    woken: AtomicBool,
    /// Seen woken and not polled at the sweeper's last look.
    suspect: AtomicBool,
}

impl Wake for Slot {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.watcher.wake();
    }
}

impl Slot {
    /// Woken and not polled for a whole look of the sweeper.
    fn stalled(&self) -> bool {
        self.woken.load(Ordering::Acquire) && self.suspect.swap(true, Ordering::AcqRel)
    }

    /// The turn to a task of its own, unless it has ended or moved already. `wait`: take it even
    /// if it is being polled at this moment (its watcher's own call); the sweeper leaves such a
    /// turn alone.
    fn detach(&self, tracker: &TaskTracker, wait: bool) {
        let mut turn = match self.turn.try_lock() {
            Ok(turn) => turn,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if wait => lock(&self.turn),
            Err(std::sync::TryLockError::WouldBlock) => return,
        };
        if let Some(turn) = turn.take() {
            // Outside a runtime (one shutting down), the turn is dropped as a task would be.
            if tokio::runtime::Handle::try_current().is_ok() {
                tracker.spawn(turn);
            }
        }
    }
}

impl Driven {
    pub(crate) fn new(sweeper: &Sweeper, tracker: &TaskTracker, turn: TurnFuture) -> Driven {
        let slot = Arc::new(Slot {
            turn: Mutex::new(Some(turn)),
            watcher: AtomicWaker::new(),
            woken: AtomicBool::new(false),
            suspect: AtomicBool::new(false),
        });
        sweeper.watch(&slot, tracker);
        Driven {
            waker: Waker::from(slot.clone()),
            slot,
            tracker: tracker.clone(),
        }
    }

    /// Runs the turn until it waits; ready once it has ended or moved to a task of its own.
    pub(crate) fn poll(&self, cx: &mut Context<'_>) -> Poll<()> {
        let mut turn = lock(&self.slot.turn);
        let Some(fut) = turn.as_mut() else {
            return Poll::Ready(());
        };
        self.slot.watcher.register(cx.waker());
        self.slot.woken.store(false, Ordering::Release);
        self.slot.suspect.store(false, Ordering::Release);
        match fut.as_mut().poll(&mut Context::from_waker(&self.waker)) {
            Poll::Ready(()) => {
                *turn = None;
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }

    /// Leaves the turn to a task of its own: its watcher goes away.
    pub(crate) fn detach(&self) {
        self.slot.detach(&self.tracker, true);
    }
}

/// The driven turns, looked at every [`TICK`] by a task that runs while there are any.
#[derive(Default)]
pub(crate) struct Sweeper {
    /// Shared with the sweeper's task, which holds it weakly: it ends with the engine.
    state: Arc<Mutex<SweepState>>,
}

#[derive(Default)]
struct SweepState {
    slots: Vec<Weak<Slot>>,
    running: bool,
}

impl Sweeper {
    fn watch(&self, slot: &Arc<Slot>, tracker: &TaskTracker) {
        let mut st = lock(&self.state);
        st.slots.push(Arc::downgrade(slot));
        if !st.running && tokio::runtime::Handle::try_current().is_ok() {
            st.running = true;
            tokio::spawn(sweep(Arc::downgrade(&self.state), tracker.clone()));
        }
    }
}

async fn sweep(state: Weak<Mutex<SweepState>>, tracker: TaskTracker) {
    let mut idle = 0;
    loop {
        tokio::time::sleep(TICK).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        let stalled: Vec<Arc<Slot>> = {
            let mut st = lock(&state);
            st.slots.retain(|s| s.strong_count() > 0);
            if st.slots.is_empty() {
                idle += 1;
                if idle >= IDLE_TICKS {
                    st.running = false;
                    return;
                }
                continue;
            }
            idle = 0;
            st.slots
                .iter()
                .filter_map(Weak::upgrade)
                .filter(|s| s.stalled())
                .collect()
        };
        for slot in stalled {
            tracing::debug!(
                "a driven turn's watcher stopped polling it: the turn goes on on a task of its own"
            );
            slot.detach(&tracker, false);
        }
    }
}

//! Giving freed memory back to the operating system.
//!
//! The allocator is the binary's choice (`src/main.rs` uses mimalloc, whose threads keep freed
//! pages for reuse until they allocate again or are asked to collect): the binary says how
//! with [`set_trim`], and has each runtime thread call [`on_idle`] when it goes idle. The
//! library calls [`trim`] after it let go of much memory at once (stopped `/mcp` sessions):
//! every runtime thread then collects the next time it is idle, so that an idle server's RSS
//! falls back. Without a trim set (tests, the system allocator) both do nothing.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static TRIM: OnceLock<fn()> = OnceLock::new();

/// Bumped by each [`trim`].
static WANTED: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The last [`WANTED`] this thread collected for.
    static DONE: Cell<u64> = const { Cell::new(0) };
}

/// How to give this thread's freed memory back (set once, by the binary).
pub fn set_trim(trim: fn()) {
    let _ = TRIM.set(trim);
}

/// Ask every runtime thread to give its freed memory back (this one at once).
pub fn trim() {
    if TRIM.get().is_none() {
        return;
    }
    WANTED.fetch_add(1, Ordering::Relaxed);
    on_idle();
    // A thread that is idle already would not hear of it until it has work: a task for each
    // wakes them, and they collect as they go idle again.
    if let Ok(rt) = tokio::runtime::Handle::try_current() {
        for _ in 0..rt.metrics().num_workers() {
            rt.spawn(async {});
        }
    }
}

/// A runtime thread is idle: collect if a [`trim`] came since it last did.
pub fn on_idle() {
    let Some(trim) = TRIM.get() else { return };
    let wanted = WANTED.load(Ordering::Relaxed);
    if DONE.with(|d| d.replace(wanted)) != wanted {
        trim();
    }
}

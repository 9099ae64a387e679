//! Scale-out on a shared store (PostgreSQL), behind one seam: the rest of the engine calls
//! only what this module names. A session has one writer at a time, the instance holding its
//! lease; requests for a session another instance runs go to it through the store's inbox.
//!
//! - `claim.rs`: taking a session's lease before a turn starts (reading the session back when
//!   another instance may have written it), handing it back when the session is idle here.
//! - `inbox_relay.rs`: the inbox, sending requests to the holder and taking the ones sent here.
//! - `listen.rs`: the other instances' commits, deltas and inbox rows, heard (`LISTEN`).
//! - `expiry.rs`: leases whose holder died, taken over and handed back.
//!
//! On the embedded store (one process) there is no lease and no other instance: a claim
//! returns at once, nothing is relayed, and the watchers do not start.

mod claim;
mod expiry;
mod inbox_relay;
mod listen;

use std::sync::Arc;

use super::engine_handle::Inner;
use super::session::Session;

// `read_back`: the session as the log holds it now (see `claim::reread`).
pub(crate) use claim::{claim, reread as read_back};
pub(crate) use inbox_relay::{post, release_when_idle, take_sent_before};

/// Start following the other instances (their commits, the inbox) and the expired leases.
pub(crate) fn start(inner: &Arc<Inner>) {
    expiry::watch_expired(inner);
    listen::hear_others(inner);
}

/// A turn of the session has ended (its end published). With another queued (`next`), the
/// queue has room again: rows the inbox kept for lack of it are taken. With none, the lease
/// goes back first (the client's next turn may go to any instance), unless requests wait in
/// the inbox, which are then taken here.
pub(crate) async fn turn_ended(inner: &Arc<Inner>, session: &Arc<Session>, next: bool) {
    if next {
        inbox_relay::room_opened(inner, session);
    } else {
        inbox_relay::release_when_idle(inner, session).await;
    }
}

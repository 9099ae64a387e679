//! What this instance's listener hears on the store's channels, in order.

use super::delta_state::RemoteDelta;

/// What the listener heard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// A commit (of any instance, this one included) wrote this session's events up to `seq`.
    Commit { session_id: String, seq: u64 },
    /// The listening connection was lost and is back: re-read what is followed.
    Resync,
    /// Requests for this session wait in the inbox (`inbox.rs`), for `holder` (empty: for
    /// whichever instance takes the lease).
    Inbox { session_id: String, holder: String },
    /// A delta another instance streamed (`deltas.rs`), heard in order with the commits.
    Delta(RemoteDelta),
}

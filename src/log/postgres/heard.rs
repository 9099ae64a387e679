//! What this instance's listener hears on the store's channels, in order.

use std::collections::BTreeMap;

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

/// Replies to relayed requests (`applied.rs`) kept, the newest (their seqs grow): far more
/// than can be waited on at once.
pub(super) const KEPT: usize = 4096;

/// The replies heard, by the seq of the inbox row they answer.
#[derive(Default)]
pub(crate) struct Replies {
    pub(super) heard: std::sync::Mutex<BTreeMap<i64, String>>,
    pub(super) came: tokio::sync::Notify,
}

impl Replies {
    /// A notification on `turnstile_applied` (`applied.rs`).
    pub(super) fn heard(&self, payload: &str) {
        let Some((seq, outcome)) = parse_reply(payload) else {
            return;
        };
        {
            let mut heard = crate::sync::lock(&self.heard);
            heard.insert(seq, outcome.to_string());
            while heard.len() > KEPT {
                heard.pop_first();
            }
        }
        self.came.notify_waiters();
    }
}

/// `<inbox seq> <outcome>`.
pub(super) fn parse_reply(payload: &str) -> Option<(i64, &str)> {
    let (seq, outcome) = payload.split_once(' ').unwrap_or((payload, ""));
    Some((seq.parse().ok()?, outcome))
}

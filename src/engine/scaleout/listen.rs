//! Hearing the other instances that share the store: their commits and streamed deltas reach
//! this instance's live subscribers, and requests sent to this instance's inbox are taken.

use std::sync::{Arc, Weak};

use super::{claim, inbox_relay};
use crate::engine::engine_handle::Inner;
use crate::engine::session::Session;
use crate::log::Heard;

/// Follows the commits of the other instances sharing the store (`LISTEN`): a session in
/// memory that another instance wrote is read again, and its live subscribers get the new
/// events. After the listener reconnects (it may have missed some), every session is.
pub(super) fn hear_others(inner: &Arc<Inner>) {
    let Some(mut heard) = inner.store.commits_heard() else {
        return;
    };
    let weak: Weak<Inner> = Arc::downgrade(inner);
    tokio::spawn(async move {
        loop {
            let heard = match heard.recv().await {
                Ok(h) => h,
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Heard::Resync,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
            let Some(inner) = weak.upgrade() else { return };
            if let Heard::Inbox {
                session_id, holder, ..
            } = &heard
            {
                if holder.is_empty() || inner.store.instance() == Some(holder.as_str()) {
                    inbox_relay::drain_soon(&inner, session_id.clone());
                }
                continue;
            }
            if heard == Heard::Resync {
                // Requests left for this instance meanwhile.
                for id in inner.store.held_leases() {
                    inbox_relay::drain_soon(&inner, id);
                }
            }
            if let Heard::Delta(d) = &heard {
                let s = crate::sync::lock(&inner.sessions)
                    .get(&d.session_id)
                    .cloned();
                if let Some(s) = s {
                    if s.lock().next_seq() < d.after_seq {
                        // Its commit was missed.
                        let _ = claim::reread_upto(&inner, &s, d.after_seq, |_| ()).await;
                    }
                    s.publish_remote(d);
                }
                continue;
            }
            let sessions: Vec<Arc<Session>> = {
                let map = crate::sync::lock(&inner.sessions);
                match &heard {
                    Heard::Commit { session_id, .. } => {
                        map.get(session_id).cloned().into_iter().collect()
                    }
                    Heard::Resync => map.values().cloned().collect(),
                    Heard::Inbox { .. } => Vec::new(),
                    Heard::Delta(_) => Vec::new(),
                }
            };
            let upto = match heard {
                Heard::Commit { seq, .. } => seq,
                _ => u64::MAX,
            };
            for s in sessions {
                if s.lock().next_seq() >= upto {
                    continue; // this instance's own commit, or seen already
                }
                let _ = claim::reread_upto(&inner, &s, upto, |_| ()).await;
            }
        }
    });
}

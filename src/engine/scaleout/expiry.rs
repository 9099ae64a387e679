//! Leases whose holder died: taken over, the turn it left open closed, handed back.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{claim, inbox_relay};
use crate::engine::engine_handle::{Engine, Inner};
use crate::log::Released;

/// Takes over, every half `lease_s`, the sessions whose lease expired (their instance died):
/// closes the turn it left open (`worker_lost`) and hands the lease back. Ends with the engine.
pub(super) fn watch_expired(inner: &Arc<Inner>) {
    if inner.store.instance().is_none() {
        return;
    }
    let every = (inner.config().store.lease / 2).max(Duration::from_millis(200));
    let weak: Weak<Inner> = Arc::downgrade(inner);
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(inner) = weak.upgrade() else { return };
            let engine = Engine { inner };
            let expired = match engine.inner.store.expired_leases().await {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::warn!(error = %e, "could not read the expired leases");
                    continue;
                }
            };
            for id in expired {
                let Ok(Some(session)) = engine.load(&id).await else {
                    continue;
                };
                if let Ok(held) = claim::claim(&engine.inner, &session).await {
                    drop(held);
                    inbox_relay::release_when_idle(&engine.inner, &session).await;
                }
            }
            // Leases taken for turns that were then refused (a bad request after the claim),
            // or left by a race: a session idle here is handed back.
            for id in engine.inner.store.held_leases() {
                let idle = crate::sync::lock(&engine.inner.sessions).get(&id).cloned();
                match idle {
                    Some(s) if claim::idle_here(&s.lock()) => {
                        inbox_relay::release_when_idle(&engine.inner, &s).await
                    }
                    Some(_) => {}
                    None => {
                        if let Some(mark) = engine.inner.store.lease_mark(&id) {
                            let r = engine.inner.store.release_lease(&id, mark).await;
                            if matches!(r, Ok(Released::InboxWaiting)) {
                                inbox_relay::drain_soon(&engine.inner, id);
                            }
                        }
                    }
                }
            }
        }
    });
}

//! The engine: sessions, their turns, and the turn loop. Knows nothing of HTTP or of any one
//! protocol's wire format: protocol adapters call it, renderers read what it logs.
//!
//! Seams for the next pieces:
//! - server tools plug in behind [`crate::tools::ToolHost`] (MCP federation, `deliver_file`);
//! - other APIs start turns with [`Engine::start_turn`] and a [`TurnOrder`] whose [`Delivery`]
//!   says what its watcher needs ([`Client::Absent`] where no client can run tools or answer
//!   permissions), and render the events a turn sends to its handle, or subscribe to a
//!   session's live feed with [`Session::subscribe`].
//!
//! Where things are (each file one idea; arrows run down this list, never up):
//! - `types.rs`, `record.rs`: the public types; what a session keeps besides its events.
//! - `context.rs`, `oversize.rs`, `catalog.rs`: pure parts (context window, oversized tool
//!   results, which tools a session has and where a call goes).
//! - `history/`: the log folded into the conversation the model and the APIs see.
//! - `delivery/`: events and fragments on their way to watchers and subscribers (`outbox.rs`:
//!   publish order and delta coalescing; `channel.rs`: a turn's bounded channel; `mod.rs`: a
//!   model call's fragments held behind the events before them).
//! - `job.rs`: a turn as ordered (its job, control, running slot). `replay.rs`: a session's
//!   state read from its log. `session.rs`: a session in memory and the one place events are
//!   appended.
//! - `shared.rs`: the engine handle and what sessions and turns share. `driven.rs`: turns their
//!   watcher runs. `approvals.rs`, `answers.rs`: permission expiry and binding; which answers a
//!   follow-up may give.
//! - `turn/`: the turn loop (`step.rs`), the model call (`model.rs`), compaction, server tool
//!   calls, attachments, and the end of a turn (`end.rs`).
//! - `registry.rs` (load, cache, count, list, delete sessions), `settings.rs` (create a
//!   session, validate its settings), `start.rs` (start, queue, cancel turns; plan decisions),
//!   `handle.rs` (a started turn as its watcher reads it), `follow.rs` (reading a session's log).
//! - `lease.rs`: scale-out on a shared store (one writer per session through its lease);
//!   `inbox.rs`: requests for a session another instance runs, sent to it and applied there.

mod answers;
pub mod approvals;
pub mod catalog;
pub mod context;
mod delivery;
mod driven;
mod elicit;
pub mod follow;
mod handle;
pub mod history;
mod inbox;
mod job;
mod lease;
pub mod oversize;
mod record;
mod registry;
mod replay;
pub mod session;
mod settings;
mod shared;
mod start;
mod turn;
mod types;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::clock;
use crate::config::Config;
use crate::log::{FailReason, Store};
use crate::sync::lock;
use crate::tools::ToolHost;
use crate::upstream::Provider;
use shared::Inner;

pub use handle::TurnHandle;
pub use job::StopCause;
pub use record::{Pending, PendingKind, PlanDecision, SessionRecord, ToolGrant};
pub use session::Session;
pub use shared::Engine;
pub use types::{
    AgentChoice, Client, ClientResult, Delivery, DeltaKind, EngineError, Feed, NewSession,
    Permission, Runner, SessionUpdate, SessionView, ShownText, Status, TurnInput, TurnOrder,
    WhenBusy,
};

impl Engine {
    /// Open the store and close every turn a previous process left unfinished (`worker_lost`).
    pub async fn open(
        config: Arc<Config>,
        store: Store,
        provider: Arc<dyn Provider>,
        tools: Arc<dyn ToolHost>,
        files: Option<crate::files::FileStore>,
    ) -> Result<Engine, EngineError> {
        let engine = Engine {
            inner: Arc::new(Inner {
                config,
                store,
                provider,
                tools,
                files,
                sessions: Mutex::new(HashMap::new()),
                tick: Default::default(),
                tracker: TaskTracker::new(),
                shutting_down: false.into(),
                sync_after_us: (turn::SYNC_AFTER.as_micros() as u64).into(),
                sweeper: Default::default(),
                running_turns: Default::default(),
                owned: Default::default(),
            }),
        };
        engine.recover().await?;
        // A shared store: what this instance held before a restart is closed; hand it back.
        engine.inner.store.release_all_leases().await?;
        lease::watch_expired(&engine.inner);
        lease::hear_others(&engine.inner);
        Ok(engine)
    }

    async fn recover(&self) -> Result<(), EngineError> {
        let store = &self.inner.store;
        for id in store.unfinished_sessions().await? {
            let Some(session) = self.load(&id).await? else {
                continue;
            };
            let why = "the process running this turn stopped before it ended";
            let closed =
                session.close_open_locked(&mut session.lock(), store, FailReason::WorkerLost, why);
            let Some(turn_id) = closed else { continue };
            store.flush().await?;
            session.publish_durable(store);
            tracing::warn!(session = %id, turn = %turn_id, "closed a turn left unfinished by a previous process (worker_lost)");
        }
        store.flush().await?;
        Ok(())
    }

    /// Testing: apply approval expiry to a session as if `ahead` had passed (see
    /// `engine/approvals.rs`), so tests need not wait out `approval_ttl_s`.
    #[doc(hidden)]
    pub fn expire_approvals_ahead(&self, session: &Arc<Session>, ahead: Duration) {
        let ahead = ahead.as_millis().min(i64::MAX as u128) as i64;
        approvals::settle_at(&self.inner, session, clock::now_ms().saturating_add(ahead));
    }

    /// Stop accepting turns, end running ones with `worker_shutdown`, wait for them (at most
    /// `grace`), and make everything durable.
    pub async fn shutdown(&self, grace: Duration) {
        self.inner
            .shutting_down
            .store(true, std::sync::atomic::Ordering::Release);
        let sessions: Vec<Arc<Session>> = lock(&self.inner.sessions).values().cloned().collect();
        for s in sessions {
            if let Some(control) = s.lock().running.clone() {
                control.stop(StopCause::Shutdown);
            }
        }
        self.inner.tracker.close();
        if tokio::time::timeout(grace, self.inner.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("some turns did not end within the shutdown grace period");
        }
        self.inner.tools.shutdown().await;
        if let Err(e) = self.inner.store.flush().await {
            tracing::error!(error = %e, "final flush of the store failed");
        }
        // A shared store: other instances may take this one's sessions at once.
        if let Err(e) = self.inner.store.release_all_leases().await {
            tracing::warn!(error = %e, "could not hand back this instance's leases");
        }
    }
}

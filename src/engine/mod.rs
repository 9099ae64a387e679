//! The engine: sessions, their turns, and the turn loop. Knows nothing of HTTP or of any one
//! protocol's wire format: protocol adapters call it, renderers read what it logs.
//!
//! Seams for the next pieces:
//! - server tools plug in behind [`crate::tools::ToolHost`] (MCP federation, `deliver_file`);
//! - other APIs change sessions through the commands of `command/` only ([`Engine::start_turn`]
//!   with a [`TurnOrder`] whose [`Delivery`] says what its watcher needs ([`Client::Absent`]
//!   where no client can run tools or answer permissions), [`Engine::queue_message`],
//!   [`Engine::cancel`], [`Engine::decide_plan`], ...), which take the session's lease and
//!   relay to the instance running it themselves; they render the events a turn sends to its
//!   handle, or subscribe to a session's live feed with [`Session::subscribe`].
//!
//! Where things are (each file one idea; arrows run down this list, never up):
//! - `command/`: the commands (create and delete a session, start a turn, queue a message,
//!   cancel, decide a plan), each the same wherever the session runs; `relayed.rs` applies the
//!   ones another instance sent.
//! - `turn/`: the turn loop (`step.rs`), the model call (`model.rs`) and its streamed fragments
//!   (`fragments.rs`), compaction, server tool calls (`server_calls.rs`), attachments, and the
//!   end of a turn (`end.rs`), which hands the session to its next queued turn.
//! - `scaleout/`: the one seam of scale-out on a shared store: a session's lease (`claim.rs`),
//!   requests sent through the store's inbox (`inbox_relay.rs`), the other instances heard
//!   (`listen.rs`), leases of dead instances taken over (`expiry.rs`).
//! - `registry.rs` (load, cache, count, list sessions), `session_settings.rs` (validate and
//!   store a session's settings), `turn_handle.rs` (a started turn as its watcher reads it),
//!   `log_follower.rs` (reading a session's log, then live), `approvals.rs` (permission expiry
//!   and binding).
//! - `engine_handle.rs`: the engine handle and what sessions and turns share.
//!   `run_by_watcher.rs`: turns their watcher runs, and the sweeper that moves a stalled one.
//! - `session.rs`: a session in memory and the one place events are appended;
//!   `session_state.rs`: what it holds behind its lock (fields private); `turn_queue.rs`: its
//!   running and queued turns (admit, push, next, cancel, what is live); `waits.rs`: what it
//!   waits on only in memory; `replay.rs`: its state read from its log.
//! - `delivery/`: events on their way to watchers and subscribers (`outbox.rs`: publish order
//!   and delta coalescing; `channel.rs`: a turn's bounded channel). `turn_job.rs`: a turn as
//!   ordered (its job, control, running slot).
//! - `history/`: the log folded into the conversation the model and the APIs see.
//! - pure parts: `context_window.rs` (the model's context window), `oversize.rs` (oversized
//!   tool results), `session_tools.rs` (which tools a session has and where a call goes),
//!   `answer_check.rs` (which answers a follow-up may give), `client_questions.rs` (MCP
//!   questions to the client).
//! - `types.rs`, `session_record.rs`: the public types; what a session keeps besides its
//!   events.

mod answer_check;
pub mod approvals;
mod client_questions;
mod command;
pub mod context_window;
mod delivery;
mod engine_handle;
pub mod history;
pub mod log_follower;
pub mod oversize;
mod registry;
mod reload_report;
mod replay;
mod run_by_watcher;
mod scaleout;
pub mod session;
mod session_record;
mod session_settings;
mod session_state;
pub mod session_tools;
mod turn;
mod turn_handle;
mod turn_job;
mod turn_queue;
mod types;
mod waits;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::clock;
use crate::config::Config;
use crate::log::{FailReason, Store};
use crate::sync::{lock, Swap};
use crate::tools::ToolHost;
use crate::upstream::router::Router;
use engine_handle::Inner;

pub use engine_handle::Engine;
pub use reload_report::ReloadReport;
pub use session::Session;
pub use session_record::{Pending, PendingKind, PlanDecision, SessionRecord, ToolGrant};
pub use turn_handle::TurnHandle;
pub use turn_job::StopCause;
pub use types::{
    AgentChoice, Client, ClientResult, Delivery, DeltaKind, EngineError, Feed, NewSession,
    Permission, Reach, Runner, SessionUpdate, SessionView, ShownText, Status, TurnInput, TurnOrder,
    WhenBusy,
};

impl Engine {
    /// Open the store and close every turn a previous process left unfinished (`worker_lost`).
    pub async fn open(
        config: Arc<Config>,
        store: Store,
        router: Arc<Router>,
        tools: Arc<dyn ToolHost>,
        files: Option<crate::files::FileStore>,
    ) -> Result<Engine, EngineError> {
        let engine = Engine {
            inner: Arc::new(Inner {
                config: Arc::new(Swap::new(config)),
                store: store.clone(),
                router: Swap::new(router),
                reloaded: Mutex::new(None),
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
                ledger: crate::usage::Ledger::new(store.clone()),
                apply_relayed: command::relayed::apply,
            }),
        };
        engine.recover().await?;
        // A shared store: what this instance held before a restart is closed; hand it back.
        engine.inner.store.release_all_leases().await?;
        scaleout::start(&engine.inner);
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
        self.carry_out_accepted().await
    }

    /// The embedded store: carry out the turns a previous process accepted and did not begin
    /// (their rows in the inbox), in the order they were accepted. Those that cannot start now
    /// (the server runs all the turns it may) stay for the next start.
    async fn carry_out_accepted(&self) -> Result<(), EngineError> {
        let store = &self.inner.store;
        for (id, rows) in store.inbox_at_start().await? {
            let n = rows.len();
            let Some(session) = self.load(&id).await? else {
                let id: Arc<str> = id.into();
                for turn_id in rows.iter().filter_map(|r| r.turn_id.as_deref()) {
                    store.inbox_row_done(&id, turn_id);
                }
                continue;
            };
            let applied = (self.inner.apply_relayed)(self, &session, rows);
            if let Err(e) = store.notify_applied(applied.replies).await {
                tracing::warn!(session = %id, error = %e, "could not reply to relayed requests");
            }
            let left = applied.back;
            tracing::info!(session = %id, turns = n - left.len(), "carrying out turns accepted before the restart");
            if !left.is_empty() {
                tracing::warn!(session = %id, turns = left.len(), "turns accepted before the restart wait for the next start: the server runs all the turns it may");
            }
        }
        store.flush().await?;
        Ok(())
    }

    /// Testing: apply approval expiry to a session as if `ahead` had passed (see
    /// `engine/approvals.rs`), so tests need not wait out `approval_ttl_s`.
    #[doc(hidden)]
    pub async fn expire_approvals_ahead(&self, session: &Arc<Session>, ahead: Duration) {
        let ahead = ahead.as_millis().min(i64::MAX as u128) as i64;
        let now = || clock::now_ms().saturating_add(ahead);
        approvals::settle_as_of(&self.inner, session, now).await;
    }

    /// Start no turn from now on (requests that would are answered `shutting_down`).
    pub fn stop_accepting(&self) {
        self.inner
            .shutting_down
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Stop accepting turns, let running ones go on to their end for up to `[server] drain_s`
    /// (queued ones do not start: their rows in the inbox stay), end those still running with
    /// `worker_shutdown`, wait for them (at most `grace`), and make everything durable.
    pub async fn shutdown(&self, grace: Duration) {
        self.stop_accepting();
        let drain = self.inner.config().server.drain;
        if !drain.is_zero() {
            self.inner.tracker.close();
            if tokio::time::timeout(drain, self.inner.tracker.wait())
                .await
                .is_ok()
            {
                tracing::info!("every running turn ended within drain_s");
            }
        }
        let sessions: Vec<Arc<Session>> = lock(&self.inner.sessions).values().cloned().collect();
        for s in sessions {
            if let Some(control) = s.lock().turns().running().cloned() {
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

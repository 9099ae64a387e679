//! The engine handle and what its sessions and turns share: the config, the store, the upstream
//! provider, the tool host and the counters of `[limits]`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio_util::task::TaskTracker;

use super::run_by_watcher::Sweeper;
use super::session::Session;
use super::session_tools;
use super::types::EngineError;
use crate::config::{AgentConfig, Config};
use crate::log::{InboxRow, Store};
use crate::sync::Swap;
use crate::tools::{ServerTool, ToolHost};
use crate::upstream::router::Router;

pub(crate) struct Inner {
    /// The configuration now; a reload replaces it whole (see [`Inner::config`]).
    pub(crate) config: Arc<Swap<Config>>,
    pub(crate) store: Store,
    /// The upstreams every model call goes through, rebuilt by a reload.
    pub(crate) router: Swap<Router>,
    /// What the last reload came to (`GET /status`).
    pub(crate) reloaded: Mutex<Option<crate::engine::ReloadReport>>,
    pub(crate) tools: Arc<dyn ToolHost>,
    pub(crate) files: Option<crate::files::FileStore>,
    pub(crate) sessions: Mutex<HashMap<String, Arc<Session>>>,
    /// Counts takings from `sessions`: a session's `used` is the tick of its last.
    pub(crate) tick: std::sync::atomic::AtomicU64,
    pub(crate) tracker: TaskTracker,
    pub(crate) shutting_down: std::sync::atomic::AtomicBool,
    /// [`turn::SYNC_AFTER`], in µs; tests may change it ([`Engine::set_sync_after`]).
    pub(crate) sync_after_us: std::sync::atomic::AtomicU64,
    /// The turns their watchers run, for a turn whose watcher stops polling to go on.
    pub(crate) sweeper: Sweeper,
    /// Turns running now, server-wide (`[limits] running_turns`).
    pub(crate) running_turns: Arc<AtomicUsize>,
    /// Sessions per owner (`[limits] sessions_per_key`): counted from the store on an owner's
    /// first create, then kept here as sessions are made and deleted.
    pub(crate) owned: Mutex<HashMap<Option<String>, usize>>,
    /// Each principal's spend against its budgets and rate limit (`crate::usage`).
    pub(crate) ledger: crate::usage::Ledger,
    /// Applies the requests another instance sent to this one (`engine/command/relayed.rs`),
    /// for the inbox's taker (`engine/scaleout/relay.rs`), which the commands sit above.
    pub(crate) apply_relayed: ApplyRelayed,
}

/// Applies rows taken from a session's inbox.
pub(crate) type ApplyRelayed = fn(&Engine, &Arc<Session>, Vec<InboxRow>) -> Applied;

/// What applying rows of the inbox came to.
#[derive(Debug, Default)]
pub(crate) struct Applied {
    /// The rows that must wait (put back).
    pub(crate) back: Vec<InboxRow>,
    /// Replies to the requests whose senders wait for them (a cancel, an interrupt, a plan
    /// decision), by row seq: JSON, `{"stopped": [turn ids]}` or `{"error": "…"}` or `{}`.
    pub(crate) replies: Vec<(i64, String)>,
}

impl Inner {
    /// The configuration now. A turn, a request or a task takes it once and keeps that
    /// snapshot to its end, so that a reload never changes the rules under it midway.
    pub(crate) fn config(&self) -> Arc<Config> {
        self.config.get()
    }

    /// The upstreams now (a snapshot, as [`Inner::config`]).
    pub(crate) fn router(&self) -> Arc<Router> {
        self.router.get()
    }

    /// How long an event may wait to be committed while its turn waits on a model or tool call
    /// (see [`turn::SYNC_AFTER`]).
    pub(crate) fn sync_after(&self) -> std::time::Duration {
        let us = self
            .sync_after_us
            .load(std::sync::atomic::Ordering::Relaxed);
        std::time::Duration::from_micros(us)
    }

    /// Whether the engine is stopping: no turn starts now.
    pub(crate) fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// The counter of running turns, for [`RunSlot`].
    pub(crate) fn running_turns(&self) -> &Arc<AtomicUsize> {
        &self.running_turns
    }
}

/// The engine; cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl Engine {
    /// The configuration now (a reload replaces it; a caller keeps the snapshot it took).
    pub fn config(&self) -> Arc<Config> {
        self.inner.config()
    }

    /// The cell that holds the configuration, for the parts outside the engine that read it
    /// per request (`/mcp`).
    pub(crate) fn config_cell(&self) -> Arc<Swap<Config>> {
        self.inner.config.clone()
    }

    /// Put a reloaded configuration and the router built from it in place: first the tool
    /// host's servers and policy (new servers are started, so that the new agents find their
    /// tools), then the config and the upstreams. From then on new turns and requests see them;
    /// running turns keep the snapshot they took.
    pub async fn reconfigure(&self, config: Arc<Config>, router: Arc<Router>) {
        self.inner.tools.reconfigure(config.clone()).await;
        self.inner.router.set(router);
        self.inner.config.set(config);
    }

    /// Record what a reload came to (shown by `GET /status`).
    pub fn set_reload_report(&self, report: crate::engine::ReloadReport) {
        *crate::sync::lock(&self.inner.reloaded) = Some(report);
    }

    /// What the last reload came to, if there was one.
    pub fn reload_report(&self) -> Option<crate::engine::ReloadReport> {
        crate::sync::lock(&self.inner.reloaded).clone()
    }

    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    /// Testing: how long an event may wait to be committed while its turn waits on a model or
    /// tool call (1 ms; see `SYNC_AFTER` in `engine/turn/mod.rs`).
    #[doc(hidden)]
    pub fn set_sync_after(&self, after: std::time::Duration) {
        let us = after.as_micros().min(u64::MAX as u128) as u64;
        self.inner
            .sync_after_us
            .store(us, std::sync::atomic::Ordering::Relaxed);
    }

    /// The tool host's current tools.
    pub fn host_tools(&self) -> Arc<Vec<ServerTool>> {
        self.inner.tools.tools()
    }

    /// Every MCP server's state (`GET /status`, `/readyz`).
    pub fn host_servers(&self) -> Vec<crate::tools::mcp::ServerReport> {
        self.inner.tools.servers()
    }

    /// Every upstream's state: breaker, calls in flight (`/status`).
    pub fn upstreams(&self) -> Vec<crate::upstream::router::UpstreamStatus> {
        self.inner.router().status()
    }

    /// A session's workspace folder: `sandboxes/<session id>/`.
    pub fn workspace(&self, session_id: &str) -> std::path::PathBuf {
        self.inner.config().server.sandboxes.join(session_id)
    }

    /// Moves whenever the tool host's tool set changes.
    pub fn tools_changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.tools.generation()
    }

    /// An agent's exposed server tools (`GET /meta`).
    pub fn exposed_tools(&self, agent: &AgentConfig) -> Vec<ServerTool> {
        let host = self.inner.tools.tools();
        session_tools::exposed(agent, &host)
            .into_iter()
            .cloned()
            .collect()
    }

    pub(crate) fn check_open(&self) -> Result<(), EngineError> {
        if self.inner.shutting_down.load(Ordering::Acquire) {
            return Err(EngineError::ShuttingDown);
        }
        Ok(())
    }
}

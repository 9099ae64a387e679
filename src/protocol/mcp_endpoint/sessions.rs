//! One agent's `/mcp` sessions: who owns each, whether it is in use, and when it ends.
//!
//! A session ends on `DELETE`, when its transport goes (the server stopping), or after
//! `[mcp_endpoint] session_idle_s` with no request, no open stream and no call running (rmcp's
//! own idle timer is off: it would end a session whose client only listens on its event
//! stream). Its session-scoped MCP servers are stopped and its workspace
//! (`sandboxes/mcp-<id>/`) removed at that moment.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker, SessionError,
};
use rmcp::transport::streamable_http_server::session::ServerSseMessage;
use rmcp::transport::streamable_http_server::{SessionId, SessionManager};
use rmcp::transport::WorkerTransport;
use tokio_util::sync::CancellationToken;

use crate::tools::ToolHost;

tokio::task_local! {
    /// The key opening a session (set by [`Sessions::opening`] around rmcp's handling of an
    /// `initialize`): the owner of the session rmcp creates for it.
    static OPENER: Option<String>;
}

/// What is kept of a session.
struct Record {
    owner: Option<String>,
    /// Requests under way, response streams open and handlers running.
    busy: u32,
    /// When `busy` last fell to 0 (or the session opened).
    since: Instant,
}

/// One agent's sessions: rmcp's session manager, with our records.
pub struct Sessions {
    live: LocalSessionManager,
    /// By session id.
    records: Mutex<HashMap<Box<str>, Record>>,
    host: Arc<dyn ToolHost>,
    sandboxes: PathBuf,
    idle_after: Duration,
}

impl Sessions {
    /// Sessions that end after `idle_after` unused; an ended one's servers are stopped on
    /// `host` and its workspace under `sandboxes` removed.
    pub fn new(host: Arc<dyn ToolHost>, sandboxes: PathBuf, idle_after: Duration) -> Sessions {
        let mut live = LocalSessionManager::default();
        // Idleness is ours to judge (an open event stream is not idle to us, while rmcp's
        // timer would end its session): see `reap`.
        live.session_config.keep_alive = None;
        Sessions {
            live,
            records: Mutex::new(HashMap::new()),
            host,
            sandboxes,
            idle_after,
        }
    }

    /// Run `handling` (rmcp serving a request that has no session id) with `owner` as the
    /// owner of the session it opens, if any.
    pub async fn opening<F: Future>(owner: Option<String>, handling: F) -> F::Output {
        OPENER.scope(owner, handling).await
    }

    /// How many sessions `owner` holds.
    pub fn held_by(&self, owner: &Option<String>) -> usize {
        crate::sync::lock(&self.records)
            .values()
            .filter(|r| r.owner == *owner)
            .count()
    }

    /// A request of `owner` to session `id`: the session stays in use while the returned
    /// guard lives (keep it with the response's body). `None`: no such session, or another
    /// key's.
    pub fn enter(self: &Arc<Self>, id: &str, owner: &Option<String>) -> Option<Busy> {
        let mut records = crate::sync::lock(&self.records);
        let r = records.get_mut(id).filter(|r| r.owner == *owner)?;
        r.busy += 1;
        Some(self.busy(id))
    }

    /// Session `id` in use (a handler of its `Gate` running, the response that opened it
    /// being sent) while the guard lives; `None` when it has ended.
    pub fn hold(self: &Arc<Self>, id: &str) -> Option<Busy> {
        let mut records = crate::sync::lock(&self.records);
        let r = records.get_mut(id)?;
        r.busy += 1;
        Some(self.busy(id))
    }

    fn busy(self: &Arc<Self>, id: &str) -> Busy {
        Busy {
            sessions: self.clone(),
            id: id.into(),
        }
    }

    /// End idle sessions, every tick, until `shutdown`.
    pub async fn reap(self: Arc<Self>, shutdown: CancellationToken) {
        let tick = (self.idle_after / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = shutdown.cancelled() => return,
            }
            self.sweep().await;
        }
    }

    /// One pass: sessions idle past `idle_after` end.
    async fn sweep(self: &Arc<Self>) {
        let now = Instant::now();
        let mut end = Vec::new();
        crate::sync::lock(&self.records).retain(|id, r| {
            let idle = r.busy == 0 && now.saturating_duration_since(r.since) >= self.idle_after;
            if idle {
                end.push(SessionId::from(&**id));
            }
            !idle
        });
        for id in &end {
            tracing::info!(session = %id, "MCP session ended: idle for {} s", self.idle_after.as_secs());
            // Its worker stops; rmcp then calls `close_session`, which finds no record.
            let _ = self.live.close_session(id).await;
            let (host, sandboxes, id) = (self.host.clone(), self.sandboxes.clone(), id.clone());
            tokio::spawn(async move { clean_up(&*host, &sandboxes, &id).await });
        }
    }

    /// rmcp has closed session `id` (`DELETE`, its worker stopped): it ends, its servers
    /// stopped and its workspace removed before this returns.
    async fn closed(&self, id: &SessionId) {
        let ended = crate::sync::lock(&self.records).remove(&**id).is_some();
        if ended {
            clean_up(&*self.host, &self.sandboxes, id).await;
        }
    }
}

/// What an ended session leaves: its session-scoped servers stop and its workspace goes, as an
/// AAP session's do when it is deleted.
async fn clean_up(host: &dyn ToolHost, sandboxes: &Path, id: &str) {
    let key = super::session_key(id);
    host.session_closed(&key).await;
    let _ = tokio::fs::remove_dir_all(sandboxes.join(&key)).await;
}

/// Remove the workspaces of MCP sessions (`mcp-*`) left in `sandboxes` by an earlier run: no
/// MCP session outlives its server process.
pub fn remove_stale_workspaces(sandboxes: &Path) {
    let Ok(entries) = std::fs::read_dir(sandboxes) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with("mcp-"))
            && entry.file_type().is_ok_and(|t| t.is_dir());
        if !stale {
            continue;
        }
        match std::fs::remove_dir_all(entry.path()) {
            Ok(()) => {
                tracing::info!(path = %entry.path().display(), "removed the workspace of an MCP session of an earlier run")
            }
            Err(e) => {
                tracing::warn!(path = %entry.path().display(), error = %e, "cannot remove the workspace of an MCP session of an earlier run")
            }
        }
    }
}

/// A session in use while this lives.
pub struct Busy {
    sessions: Arc<Sessions>,
    id: SessionId,
}

impl Drop for Busy {
    fn drop(&mut self) {
        if let Some(r) = crate::sync::lock(&self.sessions.records).get_mut(&*self.id) {
            r.busy = r.busy.saturating_sub(1);
            if r.busy == 0 {
                r.since = Instant::now();
            }
        }
    }
}

impl SessionManager for Sessions {
    type Error = LocalSessionManagerError;
    type Transport = WorkerTransport<LocalSessionWorker>;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let owner = OPENER.try_with(Clone::clone).map_err(|_| {
            SessionError::Io(std::io::Error::other(
                "an MCP session can only be opened through the endpoint",
            ))
        })?;
        let (id, transport) = self.live.create_session().await?;
        crate::sync::lock(&self.records).insert(
            Box::from(&*id),
            Record {
                owner,
                busy: 0,
                since: Instant::now(),
            },
        );
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<ServerJsonRpcMessage, Self::Error> {
        self.live.initialize_session(id, message).await
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        self.live.has_session(id).await
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let closed = self.live.close_session(id).await;
        self.closed(id).await;
        closed
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<
        impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        self.live.create_stream(id, message).await
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        self.live.accept_message(id, message).await
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<
        impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        self.live.create_standalone_stream(id).await
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<
        impl futures_util::Stream<Item = ServerSseMessage> + Send + Sync + 'static,
        Self::Error,
    > {
        self.live.resume(id, last_event_id).await
    }
}

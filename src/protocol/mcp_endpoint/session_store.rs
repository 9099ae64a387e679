//! One agent's `/mcp` sessions: who owns each, which are in memory, and when each ends.
//!
//! rmcp runs a session as two tasks (its worker and its service loop) over seven tokio
//! channels, each of which allocates a block of 32 slots when it is made, whatever its
//! capacity: ~90 KiB of heap per session before our [`Gate`](super::gate::Gate) adds its own.
//! A session nobody uses keeps none of it. After `[mcp_endpoint] session_park_s` with no
//! request, no open stream and no call running, a session is *parked*: its rmcp worker stops
//! and only its record stays (owner, the client's `initialize` parameters: well under 1 KiB).
//! Its next request restores it through rmcp's session store: the client's handshake is
//! replayed to a fresh `Gate`, and the request goes on as if nothing had happened. A session
//! whose client subscribed to a resource or set a log level holds state a restore would lose:
//! it is never parked (it still ends when idle).
//!
//! A session ends on `DELETE`, when its transport goes (the server stopping), or after
//! `session_idle_s` with no request, no open stream and no call running; its session-scoped
//! MCP servers are stopped and its workspace (`sandboxes/mcp-<id>/`) removed at that moment.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::{ClientJsonRpcMessage, ServerJsonRpcMessage};
use rmcp::transport::streamable_http_server::session::local::{
    LocalSessionManager, LocalSessionManagerError, LocalSessionWorker, SessionError,
};
use rmcp::transport::streamable_http_server::session::{
    ServerSseMessage, SessionState, SessionStore, SessionStoreError,
};
use rmcp::transport::streamable_http_server::{RestoreOutcome, SessionId, SessionManager};
use rmcp::transport::WorkerTransport;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::tools::ToolHost;

tokio::task_local! {
    /// The key opening a session (set by [`Sessions::opening`] around rmcp's handling of an
    /// `initialize`): the owner of the session rmcp creates for it.
    static OPENER: Option<String>;
}

/// How long a request waits for its session to finish parking before it gets a 503.
const PARKING_WAIT: Duration = Duration::from_secs(10);

/// Where a session's state is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// rmcp's worker runs it.
    Live,
    /// Its worker was told to stop; requests wait until it has.
    Parking,
    /// Only the record is left; its next request restores it.
    Parked,
}

impl State {
    /// Its `state` in `turnstile_mcp_endpoint_sessions`.
    fn label(self) -> &'static str {
        match self {
            State::Live | State::Parking => "live",
            State::Parked => "parked",
        }
    }
}

/// Count a session moving from `from` to `to` (`None`: opened, ended).
fn counted(from: Option<State>, to: Option<State>) {
    crate::metrics::mcp_endpoint_session(from.map(State::label), to.map(State::label));
}

/// What is kept of a session, parked or not.
struct Record {
    owner: Option<String>,
    state: State,
    /// Requests under way, response streams open and handlers running.
    busy: u32,
    /// When `busy` last fell to 0 (or the session opened).
    since: Instant,
    /// It holds state a restore would lose: never parked.
    pinned: bool,
    /// The client's `initialize` parameters (JSON), replayed to restore it.
    init: Option<Box<str>>,
    /// A digest of the tool list its client was last shown (see `Gate::on_initialized`).
    shown: Option<u64>,
}

/// Why a request cannot go to its session.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Refused {
    /// No such session, or another key's.
    Unknown,
    /// It is still parking after [`PARKING_WAIT`].
    Parking,
}

/// One agent's sessions: rmcp's session manager and session store, with our records.
pub(crate) struct Sessions {
    live: LocalSessionManager,
    /// By session id.
    records: Mutex<HashMap<Box<str>, Record>>,
    /// Told whenever a session finishes parking.
    parked: Notify,
    host: Arc<dyn ToolHost>,
    sandboxes: PathBuf,
    park_after: Duration,
    idle_after: Duration,
    /// When to give freed memory back to the OS (after sessions stopped).
    trim_at: Mutex<Option<Instant>>,
}

impl Sessions {
    /// Sessions that park after `park_after` and end after `idle_after` unused; an ended one's
    /// servers are stopped on `host` and its workspace under `sandboxes` removed.
    pub(crate) fn new(
        host: Arc<dyn ToolHost>,
        sandboxes: PathBuf,
        park_after: Duration,
        idle_after: Duration,
    ) -> Sessions {
        let mut live = LocalSessionManager::default();
        // Idleness is ours to judge (an open event stream is not idle to us, while rmcp's
        // timer would end its session): see `reap`.
        live.session_config.keep_alive = None;
        Sessions {
            live,
            records: Mutex::new(HashMap::new()),
            parked: Notify::new(),
            host,
            sandboxes,
            park_after,
            idle_after,
            trim_at: Mutex::new(None),
        }
    }

    /// Run `handling` (rmcp serving a request that has no session id) with `owner` as the
    /// owner of the session it opens, if any.
    pub(crate) async fn opening<F: Future>(owner: Option<String>, handling: F) -> F::Output {
        OPENER.scope(owner, handling).await
    }

    /// How many sessions `owner` holds, parked ones included.
    pub(crate) fn held_by(&self, owner: &Option<String>) -> usize {
        crate::sync::lock(&self.records)
            .values()
            .filter(|r| r.owner == *owner)
            .count()
    }

    /// A request of `owner` to session `id`: the session stays in use while the returned
    /// guard lives (keep it with the response's body). A session that is parking is waited
    /// for.
    pub(crate) async fn enter(
        self: &Arc<Self>,
        id: &str,
        owner: &Option<String>,
    ) -> Result<Busy, Refused> {
        let deadline = tokio::time::Instant::now() + PARKING_WAIT;
        loop {
            let parked = self.parked.notified();
            tokio::pin!(parked);
            parked.as_mut().enable();
            {
                let mut records = crate::sync::lock(&self.records);
                match records.get_mut(id) {
                    Some(r) if r.owner == *owner => {
                        if r.state != State::Parking {
                            r.busy += 1;
                            return Ok(self.busy(id));
                        }
                    }
                    _ => return Err(Refused::Unknown),
                }
            }
            if tokio::time::timeout_at(deadline, parked).await.is_err() {
                return Err(Refused::Parking);
            }
        }
    }

    /// Session `id` in use (a handler of its `Gate` running, the response that opened it
    /// being sent) while the guard lives; `None` when it has ended.
    pub(crate) fn hold(self: &Arc<Self>, id: &str) -> Option<Busy> {
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

    /// Session `id` holds state a restore would lose (a subscription, a log level): it is
    /// never parked.
    pub(crate) fn pin(&self, id: &str) {
        if let Some(r) = crate::sync::lock(&self.records).get_mut(id) {
            r.pinned = true;
        }
    }

    /// The digest of the tool list session `id`'s client was last shown, and a new one.
    pub(crate) fn shown(&self, id: &str, now: u64) -> Option<u64> {
        let mut records = crate::sync::lock(&self.records);
        let r = records.get_mut(id)?;
        r.shown.replace(now)
    }

    /// Park and end idle sessions, every tick, until `shutdown`.
    pub(crate) async fn reap(self: Arc<Self>, shutdown: CancellationToken) {
        let tick = (self.park_after.min(self.idle_after) / 4)
            .clamp(Duration::from_millis(50), Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = shutdown.cancelled() => return,
            }
            self.sweep().await;
        }
    }

    /// One pass: sessions idle past `idle_after` end, those idle past `park_after` park.
    async fn sweep(self: &Arc<Self>) {
        let now = Instant::now();
        let mut park = Vec::new();
        let mut end = Vec::new();
        {
            let mut records = crate::sync::lock(&self.records);
            records.retain(|id, r| {
                if r.busy > 0 || r.state == State::Parking {
                    return true;
                }
                let idle = now.saturating_duration_since(r.since);
                if idle >= self.idle_after {
                    end.push((SessionId::from(&**id), r.state == State::Live));
                    counted(Some(r.state), None);
                    return false;
                }
                if idle >= self.park_after
                    && r.state == State::Live
                    && !r.pinned
                    && r.init.is_some()
                {
                    r.state = State::Parking;
                    park.push(SessionId::from(&**id));
                }
                true
            });
            // What a parked session keeps is copied afresh, side by side: left where it was
            // made, among the data of the session's worker, its few bytes would keep every
            // page they share from going back to the OS once the worker has stopped.
            for id in &park {
                if let Some(mut r) = records.remove(&**id) {
                    r.owner = r.owner.as_deref().map(String::from);
                    r.init = r.init.as_deref().map(Box::from);
                    records.insert(Box::from(&**id), r);
                }
            }
            // A map keeps its capacity: give it back once most of it is empty.
            if records.capacity() > 64 && records.len() < records.capacity() / 4 {
                records.shrink_to_fit();
            }
        }
        for id in &park {
            // Its worker stops; rmcp then calls `close_session`, which sees it parking.
            let _ = self.live.close_session(id).await;
        }
        for (id, live) in &end {
            tracing::info!(session = %id, "MCP session ended: idle for {} s", self.idle_after.as_secs());
            if *live {
                let _ = self.live.close_session(id).await;
            }
            let (host, sandboxes, id) = (self.host.clone(), self.sandboxes.clone(), id.clone());
            tokio::spawn(async move { clean_up(&*host, &sandboxes, &id).await });
        }
        if !park.is_empty() || !end.is_empty() {
            self.trim_later();
        }
        let due = {
            let mut at = crate::sync::lock(&self.trim_at);
            match *at {
                Some(t) if t <= Instant::now() => at.take().is_some(),
                _ => false,
            }
        };
        if due {
            crate::memory::trim();
        }
    }

    /// Give freed memory back once the stopped sessions' tasks have let go of it.
    fn trim_later(&self) {
        *crate::sync::lock(&self.trim_at) = Some(Instant::now() + Duration::from_secs(2));
    }

    /// rmcp has closed session `id` (`DELETE`, its worker stopped): a parking session is now
    /// parked; any other ends, its servers stopped and its workspace removed before this
    /// returns.
    async fn closed(&self, id: &SessionId) {
        let ended = {
            let mut records = crate::sync::lock(&self.records);
            match records.get_mut(&**id) {
                Some(r) if r.state == State::Parking => {
                    r.state = State::Parked;
                    counted(Some(State::Parking), Some(State::Parked));
                    self.parked.notify_waiters();
                    false
                }
                Some(_) => match records.remove(&**id) {
                    Some(r) => {
                        counted(Some(r.state), None);
                        true
                    }
                    None => false,
                },
                None => false,
            }
        };
        if ended {
            clean_up(&*self.host, &self.sandboxes, id).await;
        }
        self.trim_later();
    }
}

/// What an ended session leaves: its session-scoped servers stop and its workspace goes, as an
/// AAP session's do when it is deleted.
async fn clean_up(host: &dyn ToolHost, sandboxes: &Path, id: &str) {
    let key = session_key(id);
    host.session_closed(&key).await;
    let workspace = sandboxes.join(&key);
    // Most sessions never had one: no thread of the blocking pool (which would keep the
    // memory it touched for a while) is woken for them.
    if std::fs::symlink_metadata(&workspace).is_ok() {
        let _ = tokio::fs::remove_dir_all(workspace).await;
    }
}

/// Remove the workspaces of MCP sessions (`mcp-*`) left in `sandboxes` by an earlier run: no
/// MCP session outlives its server process.
pub(super) fn remove_stale_workspaces(sandboxes: &Path) {
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
pub(crate) struct Busy {
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
        counted(None, Some(State::Live));
        crate::sync::lock(&self.records).insert(
            Box::from(&*id),
            Record {
                owner,
                state: State::Live,
                busy: 0,
                since: Instant::now(),
                pinned: false,
                init: None,
                shown: None,
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

    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        let parked = |records: &HashMap<Box<str>, Record>| {
            records.get(&*id).is_some_and(|r| r.state == State::Parked)
        };
        if !parked(&crate::sync::lock(&self.records)) {
            return Ok(RestoreOutcome::NotSupported);
        }
        let outcome = self.live.restore_session(id.clone()).await?;
        if let RestoreOutcome::Restored(_) = &outcome {
            let kept = match crate::sync::lock(&self.records).get_mut(&*id) {
                Some(r) => {
                    counted(Some(r.state), Some(State::Live));
                    r.state = State::Live;
                    true
                }
                None => false,
            };
            if !kept {
                // Ended meanwhile (a DELETE): no worker for it.
                let _ = self.live.close_session(&id).await;
                return Ok(RestoreOutcome::NotSupported);
            }
        }
        Ok(outcome)
    }
}

/// rmcp's session store: where a parked session's handshake is kept for its restore.
#[async_trait::async_trait]
impl SessionStore for Sessions {
    async fn load(&self, id: &str) -> Result<Option<SessionState>, SessionStoreError> {
        let init = crate::sync::lock(&self.records)
            .get(id)
            .and_then(|r| r.init.clone());
        match init {
            Some(json) => Ok(Some(SessionState::new(serde_json::from_str(&json)?))),
            None => Ok(None),
        }
    }

    async fn store(&self, id: &str, state: &SessionState) -> Result<(), SessionStoreError> {
        let json = serde_json::to_string(&state.initialize_params)?;
        if let Some(r) = crate::sync::lock(&self.records).get_mut(id) {
            r.init = Some(json.into_boxed_str());
        }
        Ok(())
    }

    async fn delete(&self, _id: &str) -> Result<(), SessionStoreError> {
        // The record went with the session (`close_session`, which rmcp calls first).
        Ok(())
    }
}

/// The AAP-side session id an MCP session stands for (its workspace folder, its session-scoped
/// MCP servers): `mcp-<Mcp-Session-Id>`.
pub(super) fn session_key(mcp_session_id: &str) -> String {
    let clean: String = mcp_session_id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(80)
        .collect();
    format!("mcp-{clean}")
}

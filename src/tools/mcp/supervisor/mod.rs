//! One task per MCP server instance owns its connection: spawn (or connect), handshake, list
//! tools, re-list on `notifications/tools/list_changed`, restart with backoff when it dies, and
//! shut down. Calls do not go through the task: they use the current peer directly, so they run
//! in parallel and a slow call never blocks another.
//!
//! Child hygiene: a cleared environment (`PATH`, `HOME`, `LANG`, `TMPDIR` and the server's `env`
//! table, never the upstream's or the API's keys), its own process group (killed whole on
//! shutdown and restart, so `npx`-style launchers leave no orphans), `kill_on_drop`, and stderr
//! drained until EOF and logged with bounds (see [`super::stderr`]).

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{Peer, RoleClient};
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::elicit::Asker;

mod catalog_events;
mod handler;
mod launch;
mod line_limit;
mod ordered;
mod stdio;
use crate::config::McpServerConfig;
use crate::tools::relay::Relays;
use crate::tools::ToolOutput;
pub use catalog_events::{CatalogEvent, SessionFeed};
use handler::{Calls, Handler, Registered};
use launch::kill_group;
pub use launch::Placement;

/// A tool as its server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    pub name: String,
    pub description: String,
    pub input_schema: std::sync::Arc<Value>,
    /// The whole definition, as listed.
    pub definition: std::sync::Arc<rmcp::model::Tool>,
}

/// Where the connection stands.
#[derive(Clone)]
pub enum Link {
    Starting,
    Ready(Peer<RoleClient>),
    /// Down, with why; a restart is scheduled.
    Down(String),
    Stopped,
}

/// Restart backoff: from this, doubling, capped; reset after sustained uptime.
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const SUSTAINED_UPTIME: Duration = Duration::from_secs(60);
/// How long a session-scoped instance waits, once its tools are listed, for the server to ask
/// for its roots before its first call goes out.
const ROOTS_GRACE: Duration = Duration::from_millis(200);
/// How long a stopped child's stderr is awaited to its end.
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(1);

/// Consecutive failed (re)starts of a server that was up before it counts as `failed` rather
/// than `restarting` (with the backoff, about 3 s of trying).
pub const RESTART_BUDGET: u32 = 5;

/// Where a server instance stands, as `GET /status`, `/readyz` and `check` report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerState {
    /// The first connection attempt is under way.
    Starting,
    Up,
    /// It was up, went down, and is being restarted within [`RESTART_BUDGET`].
    Restarting,
    /// It never came up, or failed [`RESTART_BUDGET`] restarts in a row (it keeps retrying
    /// with backoff; `last_error` says why).
    Failed,
    Stopped,
}

/// A snapshot of one server instance for operators.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerStatus {
    pub name: String,
    pub state: ServerState,
    /// The child's process id (stdio servers, while one runs).
    pub pid: Option<u32>,
    /// Tools it lists now.
    pub tools: usize,
    /// Connection attempts after the first.
    pub restarts: u64,
    pub last_error: Option<String>,
    /// When a tool was last called on it (RFC 3339, UTC).
    pub last_call: Option<String>,
}

/// What the supervising task and calls record about an instance; read by [`Supervisor::status`].
#[derive(Debug)]
struct Tracker {
    state: ServerState,
    restarts: u64,
    ever_up: bool,
    failures_since_up: u32,
    last_error: Option<String>,
    last_call: Option<std::time::SystemTime>,
}

impl Tracker {
    fn new() -> Tracker {
        Tracker {
            state: ServerState::Starting,
            restarts: 0,
            ever_up: false,
            failures_since_up: 0,
            last_error: None,
            last_call: None,
        }
    }

    fn up(&mut self) {
        self.state = ServerState::Up;
        self.ever_up = true;
        self.failures_since_up = 0;
    }

    /// The instance went down (an attempt failed, or the server exited after being up).
    fn down(&mut self, why: &str, attempt_failed: bool) {
        self.last_error = Some(why.to_string());
        if attempt_failed {
            self.failures_since_up = self.failures_since_up.saturating_add(1);
        }
        self.state = if !self.ever_up || self.failures_since_up >= RESTART_BUDGET {
            ServerState::Failed
        } else {
            ServerState::Restarting
        };
    }
}

/// RFC 3339 (UTC, seconds) of a moment.
fn rfc3339(t: std::time::SystemTime) -> Option<String> {
    let t = time::OffsetDateTime::from(t).replace_nanosecond(0).ok()?;
    t.format(&time::format_description::well_known::Rfc3339)
        .ok()
}

/// The handle of a running server instance.
pub struct Supervisor {
    pub name: String,
    link: watch::Receiver<Link>,
    tools: watch::Receiver<Arc<Vec<McpTool>>>,
    timeout: Duration,
    shutdown: CancellationToken,
    done: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The process group of the current child (stdio servers), for a last-resort kill.
    pgid: Arc<std::sync::atomic::AtomicI32>,
    tracker: Arc<std::sync::Mutex<Tracker>>,
    calls: Calls,
    next_call: std::sync::atomic::AtomicU64,
    oauth: Option<Arc<super::oauth::OAuth>>,
    /// Calls whose progress is relayed, by their progress token.
    relays: Relays,
    /// Its resource and prompt notifications (for `/mcp`).
    events: catalog_events::Events,
}

impl Supervisor {
    /// Start supervising a server instance. It connects in the background; see [`Self::ready`].
    pub fn start(cfg: McpServerConfig, placement: Placement) -> Arc<Supervisor> {
        let (link_tx, link) = watch::channel(Link::Starting);
        let (tools_tx, tools) = watch::channel(Arc::new(Vec::new()));
        let shutdown = CancellationToken::new();
        let pgid = Arc::new(std::sync::atomic::AtomicI32::new(0));
        let tracker = Arc::new(std::sync::Mutex::new(Tracker::new()));
        let calls: Calls = Arc::default();
        let relays = Relays::default();
        let events = catalog_events::events();
        let sup = Arc::new(Supervisor {
            name: cfg.name.clone(),
            link,
            tools,
            timeout: cfg.timeout,
            shutdown: shutdown.clone(),
            done: tokio::sync::Mutex::new(None),
            pgid: pgid.clone(),
            tracker: tracker.clone(),
            calls: calls.clone(),
            next_call: std::sync::atomic::AtomicU64::new(0),
            oauth: placement.oauth.clone(),
            relays: relays.clone(),
            events: events.clone(),
        });
        let run = Run {
            stderr_log: Arc::new(std::sync::Mutex::new(super::stderr::StderrLog::new(
                cfg.name.clone(),
            ))),
            metrics: crate::metrics::mcp(&cfg.name),
            cfg,
            placement,
            link: link_tx,
            tools: tools_tx,
            shutdown,
            pgid,
            tracker,
            calls,
            relays,
            events,
        };
        let task = tokio::spawn(run.run());
        if let Ok(mut done) = sup.done.try_lock() {
            *done = Some(task);
        }
        sup
    }

    /// Wait until the first connection attempt has ended: `Ok` when ready, else why not.
    pub async fn ready(&self, within: Duration) -> Result<(), String> {
        let mut link = self.link.clone();
        let wait = async {
            loop {
                match &*link.borrow_and_update() {
                    Link::Ready(_) => return Ok(()),
                    Link::Down(why) => return Err(why.clone()),
                    Link::Stopped => return Err("stopped".to_string()),
                    Link::Starting => {}
                }
                if link.changed().await.is_err() {
                    return Err("stopped".to_string());
                }
            }
        };
        tokio::time::timeout(within, wait)
            .await
            .unwrap_or_else(|_| Err(format!("not ready after {} s", within.as_secs())))
    }

    /// Where the instance stands now.
    pub fn status(&self) -> ServerStatus {
        let t = crate::sync::lock(&self.tracker);
        let pid = self.pgid.load(std::sync::atomic::Ordering::SeqCst);
        ServerStatus {
            name: self.name.clone(),
            state: t.state,
            pid: (pid > 0 && t.state != ServerState::Stopped).then_some(pid.unsigned_abs()),
            tools: self.tools.borrow().len(),
            restarts: t.restarts,
            last_error: t.last_error.clone(),
            last_call: t.last_call.and_then(rfc3339),
        }
    }

    /// The tools as the server lists them now.
    pub fn tools(&self) -> Arc<Vec<McpTool>> {
        self.tools.borrow().clone()
    }

    /// A receiver that wakes when the tool list changes.
    pub fn tools_changed(&self) -> watch::Receiver<Arc<Vec<McpTool>>> {
        self.tools.clone()
    }

    /// Call a tool: the server's result, or the error output a failure is (the server not up
    /// within the call's timeout, a transport error, the timeout itself). Waits for the server
    /// to be up (within the call's timeout) if it is restarting.
    pub async fn call(
        &self,
        tool: &str,
        input: Value,
        asker: Asker,
    ) -> Result<CallToolResult, ToolOutput> {
        crate::sync::lock(&self.tracker).last_call = Some(std::time::SystemTime::now());
        let id = self
            .next_call
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let paused = asker.paused.clone();
        crate::sync::lock(&self.calls).push((id, asker));
        let _registered = Registered {
            calls: self.calls.clone(),
            id,
        };
        let deadline = tokio::time::Instant::now() + self.timeout;
        let peer = self.up_by(deadline).await?;
        let args = match input {
            Value::Object(map) => Some(map),
            Value::Null => None,
            other => {
                return Err(ToolOutput::error(format!(
                    "tool input must be a JSON object, not {other}"
                )))
            }
        };
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = args;
        let call = crate::tools::relay::call_tool(&peer, params, &self.relays);
        // (Paused while the server's question waits on a person: see `elicit::within`.)
        match crate::tools::mcp::elicit::within(deadline, &paused, call)
            .await
            .ok_or(())
        {
            Ok(Ok(result)) => Ok(result),
            Ok(Err(e)) => {
                // The details (rmcp's words, Rust types and all) are for the log only.
                tracing::warn!(server = %self.name, tool, error = %e, "an MCP tool call failed");
                let login = match &self.oauth {
                    Some(o) => o.needs_login().await,
                    None => None,
                };
                Err(ToolOutput::error(match login {
                    Some(why) => format!("MCP server {} needs a login: {why}", self.name),
                    None => super::describe_error(&format!("MCP server {}", self.name), &e),
                }))
            }
            // Spec 003: a call cut short gets "Cancelled."; why goes to the log, not the model.
            Err(_) => {
                tracing::warn!(
                    server = %self.name,
                    tool,
                    timeout_s = self.timeout.as_secs(),
                    "an MCP tool call did not answer within its timeout_s: cancelled"
                );
                Err(ToolOutput::error("Cancelled."))
            }
        }
    }

    /// The connection, while the server is up.
    pub fn peer(&self) -> Option<Peer<RoleClient>> {
        match &*self.link.borrow() {
            Link::Ready(peer) => Some(peer.clone()),
            _ => None,
        }
    }

    /// The server's `timeout_s`, for requests made on [`Self::peer`].
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The server's resource and prompt notifications from now on.
    pub fn catalog_events(&self) -> tokio::sync::broadcast::Receiver<CatalogEvent> {
        self.events.subscribe()
    }

    /// The connection once the server is up, waiting for it (a restart) until `deadline`; else
    /// the error output the call gets.
    async fn up_by(&self, deadline: tokio::time::Instant) -> Result<Peer<RoleClient>, ToolOutput> {
        let mut link = self.link.clone();
        loop {
            let state = link.borrow_and_update().clone();
            match state {
                Link::Ready(peer) => return Ok(peer),
                Link::Stopped => {
                    return Err(ToolOutput::error(format!(
                        "MCP server {} is stopped",
                        self.name
                    )))
                }
                Link::Starting | Link::Down(_) => {
                    match tokio::time::timeout_at(deadline, link.changed()).await {
                        Ok(Ok(())) => continue,
                        _ => {
                            let why = match &*link.borrow() {
                                Link::Down(why) => why.clone(),
                                _ => "it is starting".to_string(),
                            };
                            return Err(ToolOutput::error(format!(
                                "MCP server {} is not available ({why}); the call timed out after {} s",
                                self.name,
                                self.timeout.as_secs()
                            )));
                        }
                    }
                }
            }
        }
    }

    /// [`Self::stop`] once its calls in flight have ended (within `timeout_s`): a reload.
    pub async fn stop_after_calls(&self) {
        let deadline = tokio::time::Instant::now() + self.timeout + Duration::from_secs(1);
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        while !crate::sync::lock(&self.calls).is_empty() && tokio::time::Instant::now() < deadline {
            tick.tick().await;
        }
        self.stop().await;
    }

    /// Stop the instance: close the connection and end the child's process group.
    pub async fn stop(&self) {
        self.shutdown.cancel();
        if let Some(task) = self.done.lock().await.take() {
            let _ = task.await;
        }
        kill_group(&self.pgid);
    }
}

/// What the task supervising one instance holds.
struct Run {
    cfg: McpServerConfig,
    placement: Placement,
    link: watch::Sender<Link>,
    tools: watch::Sender<Arc<Vec<McpTool>>>,
    shutdown: CancellationToken,
    pgid: Arc<std::sync::atomic::AtomicI32>,
    tracker: Arc<std::sync::Mutex<Tracker>>,
    relays: Relays,
    stderr_log: Arc<std::sync::Mutex<super::stderr::StderrLog>>,
    metrics: Arc<crate::metrics::McpMetrics>,
    calls: Calls,
    events: catalog_events::Events,
}

impl Run {
    fn track(&self, f: impl FnOnce(&mut Tracker)) {
        f(&mut crate::sync::lock(&self.tracker));
    }

    fn down(&self, why: String, attempt_failed: bool) {
        self.track(|t| t.down(&why, attempt_failed));
        self.link.send_replace(Link::Down(why));
    }

    /// Connect, serve, and restart with backoff until shut down.
    async fn run(self) {
        let mut backoff = BACKOFF_START;
        let mut attempts: u64 = 0;
        while !self.shutdown.is_cancelled() {
            if attempts > 0 {
                self.track(|t| t.restarts += 1);
            }
            attempts += 1;
            let started = Instant::now();
            let mut drain = None;
            if self.life(&mut drain).await.is_break() {
                break;
            }
            kill_group(&self.pgid);
            if let Some(drain) = drain {
                // The child's group is gone: its stderr ends, and what it wrote last is logged
                // and counted. A descendant that left the group may hold the pipe open; then
                // the reader goes on by itself.
                let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, drain).await;
            }
            if self.shutdown.is_cancelled() {
                break;
            }
            if !matches!(&*self.link.borrow(), Link::Down(_)) {
                self.track(|t| t.down("the server exited", false));
                self.link
                    .send_replace(Link::Down("the server exited; restarting".into()));
                tracing::warn!(server = %self.cfg.name, "MCP server exited; restarting");
            }
            if started.elapsed() >= SUSTAINED_UPTIME {
                backoff = BACKOFF_START;
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.shutdown.cancelled() => break,
            }
            backoff = (backoff * 2).min(BACKOFF_MAX);
            self.metrics.restarted();
        }
        self.track(|t| t.state = ServerState::Stopped);
        self.link.send_replace(Link::Stopped);
    }

    /// One life of the instance: connect (bounded by `startup_timeout_s`) and serve until the
    /// connection ends. `Break` when shut down while connecting.
    async fn life(&self, drain: &mut Option<tokio::task::JoinHandle<()>>) -> ControlFlow<()> {
        let cfg = &self.cfg;
        let (changed_tx, changed_rx) = mpsc::unbounded_channel();
        let (roots_asked, asked) = watch::channel(false);
        let handler = Handler {
            roots_asked,
            changed: changed_tx,
            server: cfg.name.clone(),
            elicitation: cfg.elicitation,
            sampling: cfg.sampling.then(|| super::sampling::Budget {
                server: cfg.name.clone(),
                max_tokens: cfg.sampling_max_tokens,
                calls_per_turn: cfg.sampling_calls_per_turn,
            }),
            calls: self.calls.clone(),
            relays: self.relays.clone(),
            events: self.events.clone(),
            root: self
                .placement
                .workspace
                .as_ref()
                .map(|w| std::fs::canonicalize(w).unwrap_or_else(|_| w.clone())),
        };
        let connecting = launch::connect(
            cfg,
            &self.placement,
            handler,
            &self.pgid,
            &self.stderr_log,
            drain,
        );
        let connected = tokio::select! {
            r = tokio::time::timeout(cfg.startup_timeout, connecting) => r.unwrap_or_else(|_| {
                Err(format!("no handshake within {} s (startup_timeout_s)", cfg.startup_timeout.as_secs()))
            }),
            _ = self.shutdown.cancelled() => return ControlFlow::Break(()),
        };
        match connected {
            Ok(service) => self.serve(service, changed_rx, asked).await,
            Err(e) => {
                tracing::warn!(server = %cfg.name, error = %e, "MCP server failed to start");
                self.down(e, true);
            }
        }
        ControlFlow::Continue(())
    }

    /// List the tools, then serve calls (they use the peer directly) and re-list on
    /// `list_changed` until the connection ends or the instance is shut down.
    async fn serve(
        &self,
        service: launch::Service,
        mut changed: mpsc::UnboundedReceiver<()>,
        mut roots_asked: watch::Receiver<bool>,
    ) {
        let peer = service.peer().clone();
        match tokio::time::timeout(self.cfg.startup_timeout, list(&self.cfg.name, &peer)).await {
            Ok(Ok(listed)) => {
                if self.placement.workspace.is_some() {
                    // A server that uses roots asks for them as soon as it is initialized:
                    // give it a moment, so that its first call already knows its root.
                    let asked = roots_asked.wait_for(|asked| *asked);
                    let _ = tokio::time::timeout(ROOTS_GRACE, asked).await;
                }
                self.tools.send_replace(Arc::new(listed));
                self.link.send_replace(Link::Ready(peer.clone()));
            }
            Ok(Err(e)) => {
                let why = match &self.placement.oauth {
                    Some(o) => o.needs_login().await.map(|w| format!("needs a login: {w}")),
                    None => None,
                };
                return self.down(why.unwrap_or(format!("listing tools failed: {e}")), true);
            }
            Err(_) => return self.down("listing tools timed out".into(), true),
        }
        let _up = self.metrics.up();
        self.track(|t| t.up());
        tracing::info!(server = %self.cfg.name, tools = self.tools.borrow().len(), "MCP server ready");
        let mut cancel = Some(service.cancellation_token());
        let waiting = service.waiting();
        tokio::pin!(waiting);
        loop {
            tokio::select! {
                _ = self.shutdown.cancelled() => {
                    if let Some(c) = cancel.take() { c.cancel(); }
                    let _ = waiting.as_mut().await;
                    break;
                }
                _ = waiting.as_mut() => break,
                Some(()) = changed.recv() => {
                    while changed.try_recv().is_ok() {}
                    self.relist(&peer).await;
                }
            }
        }
    }

    async fn relist(&self, peer: &Peer<RoleClient>) {
        match list(&self.cfg.name, peer).await {
            Ok(listed) => {
                tracing::info!(server = %self.cfg.name, tools = listed.len(), "MCP server changed its tools");
                self.tools.send_replace(Arc::new(listed));
            }
            Err(e) => {
                tracing::warn!(server = %self.cfg.name, error = %e, "re-listing tools failed")
            }
        }
    }
}

async fn list(server: &str, peer: &Peer<RoleClient>) -> Result<Vec<McpTool>, String> {
    let tools = peer.list_all_tools().await.map_err(|e| {
        tracing::debug!(server, error = %e, "tools/list failed");
        super::describe_error(&format!("MCP server {server}"), &e)
    })?;
    Ok(tools
        .into_iter()
        .map(|t| McpTool {
            name: t.name.to_string(),
            description: t.description.as_deref().unwrap_or_default().to_string(),
            input_schema: std::sync::Arc::new(Value::Object((*t.input_schema).clone())),
            definition: std::sync::Arc::new(t),
        })
        .collect())
}

//! One task per MCP server instance owns its connection: spawn (or connect), handshake, list
//! tools, re-list on `notifications/tools/list_changed`, restart with backoff when it dies, and
//! shut down. Calls do not go through the task: they use the current peer directly, so they run
//! in parallel and a slow call never blocks another.
//!
//! Child hygiene: a cleared environment (`PATH`, `HOME`, `LANG`, `TMPDIR` and the server's `env`
//! table, never the upstream's or the API's keys), its own process group (killed whole on
//! shutdown and restart, so `npx`-style launchers leave no orphans), `kill_on_drop`, and stderr
//! drained until EOF and logged with bounds (see [`super::stderr`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, Implementation, ProtocolVersion,
};
use rmcp::service::{MaybeSendFuture, NotificationContext, Peer, RoleClient, ServiceExt};
use rmcp::transport::TokioChildProcess;
use rmcp::ClientHandler;
use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::content::to_output;
use crate::config::{McpServerConfig, McpTransport};
use crate::tools::relay::Relays;
use crate::tools::ToolOutput;

/// A tool as its server lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    pub name: String,
    pub description: String,
    pub input_schema: std::sync::Arc<Value>,
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

/// Variables a child keeps from our environment; everything else is cleared.
const KEPT_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER", "SHELL",
];

/// Restart backoff: from this, doubling, capped; reset after sustained uptime.
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
const SUSTAINED_UPTIME: Duration = Duration::from_secs(60);
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

/// Where an instance runs: its working folder and the value of `{workspace}` in its args.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pub cwd: Option<PathBuf>,
    pub workspace: Option<PathBuf>,
    /// Folders a confined child must never reach (`data_dir`, `sandboxes`): see
    /// [`super::sandbox`].
    pub private: Vec<PathBuf>,
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
    /// Calls whose progress is relayed, by their progress token.
    relays: Relays,
}

/// Tells the supervisor a server changed its tool list; relays progress.
struct Handler {
    changed: mpsc::UnboundedSender<()>,
    relays: Relays,
}

impl ClientHandler for Handler {
    fn on_tool_list_changed(
        &self,
        _: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + MaybeSendFuture + '_ {
        let _ = self.changed.send(());
        std::future::ready(())
    }

    fn on_progress(
        &self,
        params: rmcp::model::ProgressNotificationParam,
        _: NotificationContext<RoleClient>,
    ) -> impl std::future::Future<Output = ()> + MaybeSendFuture + '_ {
        crate::tools::relay::deliver(&self.relays, params);
        std::future::ready(())
    }

    fn get_info(&self) -> ClientConfig {
        let mut info = ClientConfig::default();
        // The initialize-based protocol: list_changed arrives as a plain notification.
        info.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
        info.capabilities = ClientCapabilities::default();
        info.client_info = Implementation::new("turnstile", env!("CARGO_PKG_VERSION"));
        info
    }
}

impl Supervisor {
    /// Start supervising a server instance. It connects in the background; see [`Self::ready`].
    pub fn start(cfg: McpServerConfig, placement: Placement) -> Arc<Supervisor> {
        let (link_tx, link) = watch::channel(Link::Starting);
        let (tools_tx, tools) = watch::channel(Arc::new(Vec::new()));
        let shutdown = CancellationToken::new();
        let pgid = Arc::new(std::sync::atomic::AtomicI32::new(0));
        let tracker = Arc::new(std::sync::Mutex::new(Tracker::new()));
        let relays = Relays::default();
        let sup = Arc::new(Supervisor {
            name: cfg.name.clone(),
            link,
            tools,
            timeout: cfg.timeout,
            shutdown: shutdown.clone(),
            done: tokio::sync::Mutex::new(None),
            pgid: pgid.clone(),
            tracker: tracker.clone(),
            relays: relays.clone(),
        });
        let task = tokio::spawn(run(
            cfg, placement, link_tx, tools_tx, shutdown, pgid, tracker, relays,
        ));
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

    /// Call a tool; every failure is an error output. Waits for the server to be up (within the
    /// call's timeout) if it is restarting.
    pub async fn call(&self, tool: &str, input: Value) -> ToolOutput {
        crate::sync::lock(&self.tracker).last_call = Some(std::time::SystemTime::now());
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut link = self.link.clone();
        let peer = loop {
            let state = link.borrow_and_update().clone();
            match state {
                Link::Ready(peer) => break peer,
                Link::Stopped => {
                    return ToolOutput::error(format!("MCP server {} is stopped", self.name))
                }
                Link::Starting | Link::Down(_) => {
                    match tokio::time::timeout_at(deadline, link.changed()).await {
                        Ok(Ok(())) => continue,
                        _ => {
                            let why = match &*link.borrow() {
                                Link::Down(why) => why.clone(),
                                _ => "it is starting".to_string(),
                            };
                            return ToolOutput::error(format!(
                                "MCP server {} is not available ({why}); the call timed out after {} s",
                                self.name,
                                self.timeout.as_secs()
                            ));
                        }
                    }
                }
            }
        };
        let args = match input {
            Value::Object(map) => Some(map),
            Value::Null => None,
            other => {
                return ToolOutput::error(format!("tool input must be a JSON object, not {other}"))
            }
        };
        let mut params = CallToolRequestParams::new(tool.to_string());
        params.arguments = args;
        match tokio::time::timeout_at(
            deadline,
            crate::tools::relay::call_tool(&peer, params, &self.relays),
        )
        .await
        {
            Ok(Ok(result)) => to_output(result),
            Ok(Err(e)) => {
                ToolOutput::error(format!("MCP server {} failed the call: {e}", self.name))
            }
            // Spec 003: a call cut short gets "Cancelled."; why goes to the log, not the model.
            Err(_) => {
                tracing::warn!(
                    server = %self.name,
                    tool,
                    timeout_s = self.timeout.as_secs(),
                    "an MCP tool call did not answer within its timeout_s: cancelled"
                );
                ToolOutput::error("Cancelled.")
            }
        }
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

fn kill_group(pgid: &std::sync::atomic::AtomicI32) {
    let pg = pgid.swap(0, std::sync::atomic::Ordering::SeqCst);
    if pg > 0 {
        // SAFETY: killpg only sends a signal; a stale group id fails with ESRCH.
        unsafe {
            libc::killpg(pg, libc::SIGKILL);
        }
    }
}

#[allow(clippy::too_many_arguments)] // the relays join the handle's shared state
async fn run(
    cfg: McpServerConfig,
    placement: Placement,
    link: watch::Sender<Link>,
    tools: watch::Sender<Arc<Vec<McpTool>>>,
    shutdown: CancellationToken,
    pgid: Arc<std::sync::atomic::AtomicI32>,
    tracker: Arc<std::sync::Mutex<Tracker>>,
    relays: Relays,
) {
    let track = |f: &dyn Fn(&mut Tracker)| f(&mut crate::sync::lock(&tracker));
    let stderr_log = Arc::new(std::sync::Mutex::new(super::stderr::StderrLog::new(
        cfg.name.clone(),
    )));
    let mut backoff = BACKOFF_START;
    let metrics = crate::metrics::mcp(&cfg.name);
    let mut attempts: u64 = 0;
    while !shutdown.is_cancelled() {
        if attempts > 0 {
            track(&|t| t.restarts += 1);
        }
        attempts += 1;
        let started = Instant::now();
        let (changed_tx, mut changed_rx) = mpsc::unbounded_channel();
        let mut drain = None;
        let connected = tokio::select! {
            r = tokio::time::timeout(cfg.startup_timeout, connect(&cfg, &placement, Handler { changed: changed_tx, relays: relays.clone() }, &pgid, &stderr_log, &mut drain)) => match r {
                Ok(r) => r,
                Err(_) => Err(format!("no handshake within {} s (startup_timeout_s)", cfg.startup_timeout.as_secs())),
            },
            _ = shutdown.cancelled() => break,
        };
        match connected {
            Ok(service) => {
                let peer = service.peer().clone();
                match tokio::time::timeout(cfg.startup_timeout, list(&peer)).await {
                    Ok(Ok(listed)) => {
                        tools.send_replace(Arc::new(listed));
                        link.send_replace(Link::Ready(peer.clone()));
                        let _up = metrics.up();
                        track(&|t| t.up());
                        tracing::info!(server = %cfg.name, tools = tools.borrow().len(), "MCP server ready");
                        let mut cancel = Some(service.cancellation_token());
                        let waiting = service.waiting();
                        tokio::pin!(waiting);
                        loop {
                            tokio::select! {
                                _ = shutdown.cancelled() => {
                                    if let Some(c) = cancel.take() { c.cancel(); }
                                    let _ = waiting.as_mut().await;
                                    break;
                                }
                                _ = waiting.as_mut() => break,
                                Some(()) = changed_rx.recv() => {
                                    while changed_rx.try_recv().is_ok() {}
                                    match list(&peer).await {
                                        Ok(listed) => {
                                            tracing::info!(server = %cfg.name, tools = listed.len(), "MCP server changed its tools");
                                            tools.send_replace(Arc::new(listed));
                                        }
                                        Err(e) => tracing::warn!(server = %cfg.name, error = %e, "re-listing tools failed"),
                                    }
                                }
                            }
                        }
                    }
                    Ok(Err(e)) => {
                        let why = format!("listing tools failed: {e}");
                        track(&|t| t.down(&why, true));
                        link.send_replace(Link::Down(why));
                    }
                    Err(_) => {
                        track(&|t| t.down("listing tools timed out", true));
                        link.send_replace(Link::Down("listing tools timed out".into()));
                    }
                }
            }
            Err(e) => {
                tracing::warn!(server = %cfg.name, error = %e, "MCP server failed to start");
                track(&|t| t.down(&e, true));
                link.send_replace(Link::Down(e));
            }
        }
        kill_group(&pgid);
        if let Some(drain) = drain {
            // The child's group is gone: its stderr ends, and what it wrote last is logged and
            // counted. A descendant that left the group may hold the pipe open; then the
            // reader goes on by itself.
            let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, drain).await;
        }
        if shutdown.is_cancelled() {
            break;
        }
        if !matches!(&*link.borrow(), Link::Down(_)) {
            track(&|t| t.down("the server exited", false));
            link.send_replace(Link::Down("the server exited; restarting".into()));
            tracing::warn!(server = %cfg.name, "MCP server exited; restarting");
        }
        if started.elapsed() >= SUSTAINED_UPTIME {
            backoff = BACKOFF_START;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = shutdown.cancelled() => break,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
        metrics.restarted();
    }
    track(&|t| t.state = ServerState::Stopped);
    link.send_replace(Link::Stopped);
}

async fn list(peer: &Peer<RoleClient>) -> Result<Vec<McpTool>, String> {
    let tools = peer.list_all_tools().await.map_err(|e| e.to_string())?;
    Ok(tools
        .into_iter()
        .map(|t| McpTool {
            name: t.name.to_string(),
            description: t.description.map(|d| d.to_string()).unwrap_or_default(),
            input_schema: std::sync::Arc::new(Value::Object((*t.input_schema).clone())),
        })
        .collect())
}

type Service = rmcp::service::RunningService<RoleClient, Handler>;

async fn connect(
    cfg: &McpServerConfig,
    placement: &Placement,
    handler: Handler,
    pgid: &std::sync::atomic::AtomicI32,
    stderr_log: &Arc<std::sync::Mutex<super::stderr::StderrLog>>,
    drain: &mut Option<tokio::task::JoinHandle<()>>,
) -> Result<Service, String> {
    match &cfg.transport {
        McpTransport::Stdio {
            command,
            args,
            env,
            cwd,
        } => {
            let mut cmd = tokio::process::Command::new(command);
            let workspace = placement
                .workspace
                .as_ref()
                .map(|w| w.display().to_string());
            // `${VAR}` first (checked at load; a variable unset since is an error naming it),
            // then `{workspace}`.
            let unset = |what: &str, var: String| {
                format!("{what} uses ${{{var}}}, which is not set in turnstile's environment")
            };
            let mut child_args = Vec::with_capacity(args.len());
            for a in args {
                let a = expand(a).map_err(|var| unset("an argument", var))?;
                child_args.push(match &workspace {
                    Some(w) => a.replace("{workspace}", w),
                    None => a,
                });
            }
            let mut env_expanded = BTreeMap::new();
            for (k, v) in env {
                let v = expand(v).map_err(|var| unset(&format!("env {k}"), var))?;
                env_expanded.insert(k.clone(), v);
            }
            let env = &env_expanded;
            cmd.args(&child_args);
            cmd.env_clear();
            for k in KEPT_ENV {
                if let Ok(v) = std::env::var(k) {
                    cmd.env(k, v);
                }
            }
            cmd.envs(env);
            if let Some(dir) = placement.cwd.as_ref().or(cwd.as_ref()) {
                cmd.current_dir(dir);
            }
            cmd.kill_on_drop(true);
            #[cfg(unix)]
            cmd.process_group(0);
            if cfg.sandbox == crate::config::SandboxKind::Landlock {
                if !super::sandbox::available() {
                    return Err("sandbox = \"landlock\" but this kernel does not enforce Landlock; the server is not started unconfined".into());
                }
                let child_env = |k: &str| {
                    env.get(k)
                        .map(std::ffi::OsString::from)
                        .or_else(|| std::env::var_os(k))
                };
                let request = super::sandbox::Request {
                    command: command.clone(),
                    args: child_args.clone(),
                    path_var: child_env("PATH"),
                    home: child_env("HOME").map(PathBuf::from),
                    workspace: placement.workspace.clone(),
                    read_write: placement
                        .cwd
                        .as_ref()
                        .or(cwd.as_ref())
                        .cloned()
                        .into_iter()
                        .collect(),
                    private: placement.private.clone(),
                    network: cfg.network,
                };
                let plan = super::sandbox::plan(&request);
                tracing::debug!(server = %cfg.name, rules = ?plan.rules, network = cfg.network, "Landlock rules");
                super::sandbox::confine(&mut cmd, super::sandbox::ruleset(&plan)?);
            }
            let (proc, stderr) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start {command:?}: {e}"))?;
            if let Some(pid) = proc.id() {
                pgid.store(pid as i32, std::sync::atomic::Ordering::SeqCst);
            }
            if let Some(stderr) = stderr {
                *drain = Some(tokio::spawn(super::stderr::drain(
                    stderr,
                    stderr_log.clone(),
                )));
            }
            handler
                .serve(proc)
                .await
                .map_err(|e| format!("handshake failed: {e}"))
        }
        McpTransport::Http { url, headers } => {
            let headers = expand_headers(headers)?;
            handler
                .serve(super::http_client::transport(url, headers))
                .await
                .map_err(|e| format!("cannot connect to {url}: {e}"))
        }
    }
}

/// Header values with `${VAR}` replaced from the environment; a missing variable is an error.
fn expand_headers(
    headers: &BTreeMap<String, String>,
) -> Result<std::collections::HashMap<http::HeaderName, http::HeaderValue>, String> {
    let mut out = std::collections::HashMap::new();
    for (k, v) in headers {
        let value = expand(v).map_err(|var| {
            format!("header {k} uses ${{{var}}}, which is not set in turnstile's environment")
        })?;
        let name =
            http::HeaderName::try_from(k.as_str()).map_err(|e| format!("header {k}: {e}"))?;
        let value = http::HeaderValue::try_from(value).map_err(|e| format!("header {k}: {e}"))?;
        out.insert(name, value);
    }
    Ok(out)
}

/// `${VAR}` expansion from turnstile's environment; the name of the first missing variable on
/// failure (see [`crate::config::expand_vars`]).
pub fn expand(s: &str) -> Result<String, String> {
    crate::config::expand_env(s)
}

#[cfg(test)]
mod tests {
    #[test]
    fn env_expansion() {
        std::env::set_var("TURNSTILE_TEST_TOKEN", "s3cret");
        assert_eq!(
            super::expand("Bearer ${TURNSTILE_TEST_TOKEN}").unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(super::expand("plain").unwrap(), "plain");
        assert_eq!(
            super::expand("${TURNSTILE_NOPE_X}").unwrap_err(),
            "TURNSTILE_NOPE_X"
        );
    }
}

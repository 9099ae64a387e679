//! MCP federation: the servers of `[mcp_servers]` become tools named `mcp__<server>__<tool>`,
//! each with the policy's verdict and the rule that decided it.
//!
//! Shared servers (`scope = "shared"`) run once for the process. Session-scoped servers run one
//! instance per session, started at the session's first call with its workspace as cwd and
//! `{workspace}` in their args, stopped when the session is deleted or idle; their tool list is
//! taken at start-up from a probe instance in a scratch folder. At most `[limits]
//! session_servers` run at once server-wide, and at most `session_servers_per_key` for the
//! sessions of one API key (so one key cannot take every slot from the others): past either the
//! idlest (least recently called, no call in flight) of those counted is stopped to make room,
//! and when every one is in a call the new call gets an error result naming the limit.

pub mod content;
pub mod describe;
pub mod elicit;
pub mod http_client;
pub mod naming;
pub mod oauth;
pub mod policy;
pub mod resource_uri;
pub mod sampling;
pub mod sandbox;
pub mod stderr;
pub mod supervisor;
mod too_large;

pub use describe::describe_error;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::config::{Config, McpScope};
use crate::message::ToolSpec;
use crate::sync::lock;
use crate::tools::{CallContext, Reply, ServerTool, ToolHost, ToolOutput};
use supervisor::{McpTool, Placement, ServerStatus, Supervisor};

/// A session-scoped instance unused this long is stopped (it restarts at the next call).
const SESSION_IDLE: Duration = Duration::from_secs(600);

/// What federating the configured servers found at start-up.
#[derive(Debug, Clone, Default)]
pub struct StartReport {
    /// Servers that did not come up, with why (they keep retrying in the background).
    pub failed: Vec<(String, String)>,
}

/// One server's first start-up attempt has ended (for `check`'s progress lines).
#[derive(Debug, Clone)]
pub struct ServerProgress {
    pub server: String,
    /// The tools it listed, or why it did not come up.
    pub result: Result<usize, String>,
    pub elapsed: Duration,
}

/// One configured server as `GET /status` shows it: a shared server's instance, or a
/// session-scoped server's running instances.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerReport {
    pub name: String,
    /// `"shared"` or `"session"`.
    pub scope: &'static str,
    /// The shared instance (`None` for a session-scoped server).
    #[serde(flatten)]
    pub shared: Option<ServerStatus>,
    /// Running instances of a session-scoped server, by session id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<InstanceReport>>,
}

/// A running instance of a session-scoped server.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InstanceReport {
    pub session: String,
    #[serde(flatten)]
    pub status: ServerStatus,
}

/// The federated tool set at one moment.
#[derive(Default)]
struct Federation {
    tools: Arc<Vec<ServerTool>>,
    /// Federated name → (server index in the config, the tool's own name).
    routes: HashMap<String, (usize, String)>,
}

/// A session-scoped instance: its supervisor, when it was last called, its calls in flight,
/// and the API key owner of its session (whose share of `[limits] session_servers` it takes).
struct SessionInstance {
    sup: Arc<Supervisor>,
    used: Instant,
    in_flight: Arc<AtomicUsize>,
    owner: Option<String>,
}

impl SessionInstance {
    /// Mark a call as started (now, in flight until the guard drops).
    fn begin(&mut self) -> (Arc<Supervisor>, InFlight) {
        self.used = Instant::now();
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        (self.sup.clone(), InFlight(self.in_flight.clone()))
    }

    fn idle(&self) -> bool {
        self.in_flight.load(Ordering::SeqCst) == 0
    }
}

/// Which limit a new session-scoped instance found full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Full {
    /// `[limits] session_servers`: any idle instance may make room.
    Server,
    /// `[limits] session_servers_per_key`: only one of the same key's.
    Key,
}

impl Full {
    fn key(self) -> &'static str {
        match self {
            Full::Server => "[limits] session_servers",
            Full::Key => "[limits] session_servers_per_key",
        }
    }
}

/// A call in flight on a session-scoped instance (which is then never stopped to make room).
struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Session-scoped instances by (session id, server index).
type SessionInstances = HashMap<(String, usize), SessionInstance>;

/// The probe instances of session-scoped servers, by server index.
type Probes = Vec<(usize, Arc<Supervisor>)>;

/// The MCP side of the tool host (the [`Toolbox`](super::Toolbox) adds the built-in tools).
pub struct McpHost {
    config: Arc<Config>,
    /// Shared instances by server index.
    shared: HashMap<usize, Arc<Supervisor>>,
    /// Tool lists of session-scoped servers, from their probe.
    probed: HashMap<usize, Arc<Vec<McpTool>>>,
    /// What session-scoped servers declared (resources, prompts, logging) to their probe.
    probed_caps: HashMap<usize, rmcp::model::ServerCapabilities>,
    sessions: Mutex<SessionInstances>,
    /// The catalog events of each session's instances, by session id (see
    /// [`McpHost::session_catalog_events`]).
    session_feeds: Mutex<HashMap<String, supervisor::SessionFeed>>,
    /// Session-scoped instances stopped to make room under `[limits] session_servers`.
    evicted: AtomicU64,
    federation: RwLock<Federation>,
    generation: tokio::sync::watch::Sender<u64>,
    /// The OAuth of each HTTP server, by server index.
    oauth: HashMap<usize, Arc<oauth::OAuth>>,
}

/// Errors that stop federation outright (configuration errors).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct FederationError(pub String);

impl McpHost {
    /// Start every configured server and wait (bounded by each one's startup timeout) for the
    /// first attempt, so the first `/meta` already lists their tools.
    pub async fn start(
        config: Arc<Config>,
    ) -> Result<(Arc<McpHost>, StartReport), FederationError> {
        Self::start_reporting(config, &|_| {}).await
    }

    /// [`McpHost::start`], telling `progress` as each server's first attempt ends.
    pub async fn start_reporting(
        config: Arc<Config>,
        progress: &(dyn Fn(ServerProgress) + Sync),
    ) -> Result<(Arc<McpHost>, StartReport), FederationError> {
        warn_at_start(&config);
        let oauth: HashMap<usize, Arc<oauth::OAuth>> = config
            .mcp_servers
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i, oauth::OAuth::for_server(s, &config.server)?)))
            .collect();
        let (shared, probes) = spawn_servers(&config, &oauth);
        let report = first_attempts(&config, &shared, &probes, progress).await;
        let mut probed = HashMap::new();
        let mut probed_caps = HashMap::new();
        for (i, s) in probes {
            probed.insert(i, s.tools());
            if let Some(caps) = s
                .peer()
                .and_then(|p| p.peer_info().map(|i| i.capabilities.clone()))
            {
                probed_caps.insert(i, caps);
            }
            s.stop().await;
        }
        let host = Arc::new(McpHost {
            config,
            shared,
            probed,
            probed_caps,
            sessions: Mutex::new(HashMap::new()),
            session_feeds: Mutex::new(HashMap::new()),
            evicted: AtomicU64::new(0),
            federation: RwLock::new(Federation::default()),
            generation: tokio::sync::watch::channel(0).0,
            oauth,
        });
        host.refederate(true)?;
        host.follow_tool_lists();
        host.reap_periodically();
        Ok((host, report))
    }

    /// Refederate whenever a shared server's tool list changes (for as long as the host lives).
    fn follow_tool_lists(self: &Arc<Self>) {
        for s in self.shared.values() {
            let mut changed = s.tools_changed();
            let weak = Arc::downgrade(self);
            tokio::spawn(async move {
                while changed.changed().await.is_ok() {
                    let Some(host) = weak.upgrade() else { break };
                    if let Err(e) = host.refederate(false) {
                        tracing::error!(error = %e, "a changed tool list could not be federated");
                    }
                }
            });
        }
    }

    /// Stop idle session-scoped instances every 30 s (for as long as the host lives).
    fn reap_periodically(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            loop {
                tick.tick().await;
                let Some(host) = weak.upgrade() else { break };
                host.reap_idle().await;
            }
        });
    }

    /// Rebuild the federated list from every server's current tools. At start-up a name
    /// collision is an error; later (a server changed its list) the colliding tool is left out
    /// and logged.
    fn refederate(&self, strict: bool) -> Result<(), FederationError> {
        let mut tools = Vec::new();
        let mut routes: HashMap<String, (usize, String)> = HashMap::new();
        let mut owners: HashMap<String, (String, String)> = HashMap::new();
        for (i, cfg) in self.config.mcp_servers.iter().enumerate() {
            let listed = match cfg.scope {
                McpScope::Shared => self.shared.get(&i).map(|s| s.tools()),
                McpScope::Session => self.probed.get(&i).cloned(),
            }
            .unwrap_or_default();
            for t in listed.iter() {
                let name = naming::federated(&cfg.name, &t.name);
                if let Some(first) = owners.get(&name) {
                    let c = naming::Collision {
                        name: name.clone(),
                        first: first.clone(),
                        second: (cfg.name.clone(), t.name.clone()),
                    };
                    if strict {
                        return Err(FederationError(format!(
                            "{}: {c}",
                            self.config.path.display()
                        )));
                    }
                    tracing::error!("{c}; the second tool is left out");
                    continue;
                }
                owners.insert(name.clone(), (cfg.name.clone(), t.name.clone()));
                let decision = policy::decide(&self.config.policy, &name);
                routes.insert(name.clone(), (i, t.name.clone()));
                tools.push(ServerTool {
                    spec: ToolSpec {
                        name,
                        title: None,
                        description: t.description.clone(),
                        parameters: t.input_schema.clone(),
                    },
                    server: cfg.name.clone(),
                    tool: t.name.clone(),
                    verdict: decision.verdict,
                    rule: decision.rule,
                    definition: Some(t.definition.clone()),
                });
            }
        }
        *self.federation.write().unwrap_or_else(|p| p.into_inner()) = Federation {
            tools: Arc::new(tools),
            routes,
        };
        self.generation.send_modify(|g| *g += 1);
        Ok(())
    }

    /// Call the tool federated as `name` on its server (the session's instance for a
    /// session-scoped one): the server's result, or the error output a failure is.
    async fn call_server(
        &self,
        ctx: &CallContext,
        name: &str,
        input: Value,
    ) -> Result<rmcp::model::CallToolResult, ToolOutput> {
        let Some((idx, tool)) = self.route(name) else {
            return Err(ToolOutput::error(format!("Unknown tool {name}.")));
        };
        let asker = elicit::Asker {
            session_id: ctx.session_id.clone(),
            elicitor: ctx.elicitor.clone(),
            sampler: ctx.sampler.clone(),
            paused: Default::default(),
        };
        match self.shared.get(&idx) {
            Some(s) => s.call(&tool, input, asker).await,
            None => {
                let (s, _in_flight) = self.session_instance(idx, ctx).await?;
                s.call(&tool, input, asker).await
            }
        }
    }

    fn route(&self, name: &str) -> Option<(usize, String)> {
        self.federation
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .routes
            .get(name)
            .cloned()
    }

    /// The session's instance of server `idx`, started if needed, with the call marked in
    /// flight. Past `[limits] session_servers_per_key` for the session's key, that key's idlest
    /// instance (least recently called, no call in flight) is stopped first; past `[limits]
    /// session_servers`, the idlest of all. When every one counted is in a call, an error
    /// result naming the limit.
    async fn session_instance(
        &self,
        idx: usize,
        ctx: &CallContext,
    ) -> Result<(Arc<Supervisor>, InFlight), ToolOutput> {
        let key = (ctx.session_id.clone(), idx);
        let limits = &self.config.limits;
        // A keyless server's sessions are all one principal's: only the server-wide limit.
        let per_key = match ctx.owner {
            Some(_) => limits.session_servers_per_key,
            None => usize::MAX,
        };
        let mut full = Full::Server;
        // Each round stops one instance; others may take the room meanwhile, so a few rounds.
        for _ in 0..4 {
            let (victim_key, victim) = {
                let mut map = lock(&self.sessions);
                if let Some(inst) = map.get_mut(&key) {
                    return Ok(inst.begin());
                }
                let mine = map.values().filter(|i| i.owner == ctx.owner).count();
                full = if mine >= per_key {
                    Full::Key
                } else if map.len() >= limits.session_servers {
                    Full::Server
                } else {
                    return Ok(self.start_instance(&mut map, key, idx, ctx));
                };
                let idlest = map
                    .iter()
                    .filter(|(_, i)| i.idle() && (full == Full::Server || i.owner == ctx.owner))
                    .min_by_key(|(_, i)| i.used)
                    .map(|(k, _)| k.clone());
                match idlest.and_then(|k| map.remove(&k).map(|inst| (k, inst))) {
                    Some(found) => found,
                    None => break,
                }
            };
            tracing::info!(
                server = %self.config.mcp_servers[victim_key.1].name,
                session = %victim_key.0,
                limit = full.key(),
                "stopping the idlest session-scoped MCP server to make room; it restarts at its next call"
            );
            victim.sup.stop().await;
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        let file = self
            .config
            .path
            .file_name()
            .map(|f| f.to_string_lossy().into_owned())
            .unwrap_or_else(|| "the config file".into());
        Err(ToolOutput::error(match full {
            Full::Server => format!(
                "turnstile has {} session-scoped MCP servers running, each in a call (limit: [limits] session_servers in {file}); try again later",
                limits.session_servers
            ),
            Full::Key => format!(
                "this API key's sessions have {per_key} session-scoped MCP servers running, each in a call (limit: [limits] session_servers_per_key in {file}); try again when one ends"
            ),
        }))
    }

    /// Start the session's instance of server `idx` (there is room for it) with a call in flight.
    fn start_instance(
        &self,
        map: &mut SessionInstances,
        key: (String, usize),
        idx: usize,
        ctx: &CallContext,
    ) -> (Arc<Supervisor>, InFlight) {
        let workspace: PathBuf = ctx.workspace.clone();
        let _ = std::fs::create_dir_all(&workspace);
        let sup = Supervisor::start(
            self.config.mcp_servers[idx].clone(),
            Placement {
                cwd: Some(workspace.clone()),
                workspace: Some(workspace),
                private: sandbox::own_state(&self.config),
                oauth: self.oauth.get(&idx).cloned(),
            },
        );
        self.feed_session(&ctx.session_id, &sup);
        map.entry(key)
            .or_insert(SessionInstance {
                sup,
                used: Instant::now(),
                in_flight: Arc::new(AtomicUsize::new(0)),
                owner: ctx.owner.clone(),
            })
            .begin()
    }

    async fn reap_idle(&self) {
        let idle: Vec<Arc<Supervisor>> = {
            let mut map = lock(&self.sessions);
            let keys: Vec<_> = map
                .iter()
                .filter(|(_, inst)| inst.idle() && inst.used.elapsed() >= SESSION_IDLE)
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| map.remove(&k))
                .map(|inst| inst.sup)
                .collect()
        };
        for s in idle {
            s.stop().await;
        }
    }

    /// Every federated tool as `check` and `GET /tools` show it.
    pub fn listing(&self) -> Arc<Vec<ServerTool>> {
        self.federation
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .tools
            .clone()
    }

    /// Every configured server's state, in config order.
    pub fn status(&self) -> Vec<ServerReport> {
        let sessions = lock(&self.sessions);
        self.config
            .mcp_servers
            .iter()
            .enumerate()
            .map(|(i, cfg)| match cfg.scope {
                McpScope::Shared => ServerReport {
                    name: cfg.name.clone(),
                    scope: "shared",
                    shared: self.shared.get(&i).map(|s| s.status()),
                    instances: None,
                },
                McpScope::Session => ServerReport {
                    name: cfg.name.clone(),
                    scope: "session",
                    shared: None,
                    instances: Some(
                        sessions
                            .iter()
                            .filter(|((_, idx), _)| *idx == i)
                            .map(|((session, _), inst)| InstanceReport {
                                session: session.clone(),
                                status: inst.sup.status(),
                            })
                            .collect(),
                    ),
                },
            })
            .collect()
    }

    /// The session-scoped instances running now (for tests and metrics).
    pub fn session_instances(&self) -> usize {
        lock(&self.sessions).len()
    }

    /// Session-scoped instances stopped so far to make room under `[limits] session_servers`.
    pub fn session_instances_evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }
}

/// Said once at start-up: servers with `sandbox = "landlock"` on a kernel that cannot (fully)
/// confine them.
fn warn_at_start(config: &Config) {
    let confined: Vec<&str> = config
        .mcp_servers
        .iter()
        .filter(|s| s.sandbox == crate::config::SandboxKind::Landlock)
        .map(|s| s.name.as_str())
        .collect();
    if !confined.is_empty() && !sandbox::available() {
        tracing::error!(
            servers = %confined.join(", "),
            "this kernel does not enforce Landlock: servers with sandbox = \"landlock\" will not be started"
        );
    } else if !confined.is_empty() && !sandbox::restricts_tcp() {
        tracing::warn!(
            servers = %confined.join(", "),
            abi = sandbox::kernel_abi(),
            "this kernel's Landlock cannot restrict TCP (it needs ABI 4): servers with sandbox = \"landlock\" may open connections even with network = false"
        );
    }
}

/// Start every configured server: the shared instances, and a probe instance (in a scratch
/// folder) of each session-scoped server, for its tool list.
fn spawn_servers(
    config: &Config,
    oauth: &HashMap<usize, Arc<oauth::OAuth>>,
) -> (HashMap<usize, Arc<Supervisor>>, Probes) {
    let private = sandbox::own_state(config);
    let mut shared = HashMap::new();
    let mut probes = Vec::new();
    for (i, cfg) in config.mcp_servers.iter().enumerate() {
        match cfg.scope {
            McpScope::Shared => {
                let placement = Placement {
                    private: private.clone(),
                    oauth: oauth.get(&i).cloned(),
                    ..Placement::default()
                };
                shared.insert(i, Supervisor::start(cfg.clone(), placement));
            }
            McpScope::Session => {
                let scratch = config.server.data_dir.join("mcp-probe").join(&cfg.name);
                let _ = std::fs::create_dir_all(&scratch);
                let placement = Placement {
                    cwd: Some(scratch.clone()),
                    workspace: Some(scratch),
                    private: private.clone(),
                    oauth: oauth.get(&i).cloned(),
                };
                probes.push((i, Supervisor::start(cfg.clone(), placement)));
            }
        }
    }
    (shared, probes)
}

/// Wait for every server's first attempt (each bounded by its startup timeout), telling
/// `progress` as each ends; the servers that did not come up are reported.
async fn first_attempts(
    config: &Config,
    shared: &HashMap<usize, Arc<Supervisor>>,
    probes: &Probes,
    progress: &(dyn Fn(ServerProgress) + Sync),
) -> StartReport {
    let begun = Instant::now();
    let waits = shared
        .iter()
        .map(|(i, s)| (*i, s.clone()))
        .chain(probes.iter().map(|(i, s)| (*i, s.clone())))
        .map(|(i, s)| {
            let within = config.mcp_servers[i].startup_timeout + Duration::from_secs(1);
            async move {
                let r = s.ready(within).await;
                progress(ServerProgress {
                    server: config.mcp_servers[i].name.clone(),
                    result: r.clone().map(|()| s.tools().len()),
                    elapsed: begun.elapsed(),
                });
                (i, r)
            }
        });
    let mut report = StartReport::default();
    for (i, r) in futures_util::future::join_all(waits).await {
        if let Err(why) = r {
            report
                .failed
                .push((config.mcp_servers[i].name.clone(), why));
        }
    }
    report
}

impl ToolHost for McpHost {
    fn tools(&self) -> Arc<Vec<ServerTool>> {
        self.listing()
    }

    fn call<'a>(
        &'a self,
        ctx: &'a CallContext,
        name: &'a str,
        input: Value,
    ) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move {
            match self.call_server(ctx, name, input).await {
                Ok(result) => content::to_output(result),
                Err(failed) => failed,
            }
        })
    }

    fn call_verbatim<'a>(
        &'a self,
        ctx: &'a CallContext,
        name: &'a str,
        input: Value,
    ) -> BoxFuture<'a, Reply> {
        Box::pin(async move {
            match self.call_server(ctx, name, input).await {
                Ok(result) => Reply::Mcp(result),
                Err(failed) => Reply::Output(failed),
            }
        })
    }

    fn generation(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    fn servers(&self) -> Vec<ServerReport> {
        self.status()
    }

    fn session_closed<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, ()> {
        lock(&self.session_feeds).remove(session_id);
        Box::pin(async move {
            let gone: Vec<Arc<Supervisor>> = {
                let mut map = lock(&self.sessions);
                let keys: Vec<_> = map
                    .keys()
                    .filter(|(s, _)| s == session_id)
                    .cloned()
                    .collect();
                keys.into_iter()
                    .filter_map(|k| map.remove(&k))
                    .map(|inst| inst.sup)
                    .collect()
            };
            for s in gone {
                s.stop().await;
            }
        })
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let sessions: Vec<Arc<Supervisor>> = {
                let mut map = lock(&self.sessions);
                map.drain().map(|(_, inst)| inst.sup).collect()
            };
            let all = self.shared.values().cloned().chain(sessions);
            futures_util::future::join_all(all.map(|s| async move { s.stop().await })).await;
        })
    }
}

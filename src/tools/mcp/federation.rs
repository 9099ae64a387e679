//! The federation: every configured server's instances (shared, and per session for the
//! session-scoped ones), their tools merged under `mcp__<server>__<tool>` names with the
//! policy's verdicts, and calls routed to the instance that serves them.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use rmcp::model::ServerCapabilities;
use serde_json::Value;
use tokio::sync::broadcast;

use super::first_start::{first_attempts, spawn_servers, warn_at_start};
use super::reports::{InstanceReport, ServerProgress, ServerReport, StartReport};
use super::session_instance::{Full, InFlight, SessionInstance, SessionInstances, SESSION_IDLE};
use super::supervisor::{self, CatalogEvent, McpTool, Placement, Supervisor};
use super::{elicit, naming, oauth, policy, sandbox};
use crate::config::{Config, McpScope};
use crate::message::ToolSpec;
use crate::sync::{lock, Swap};
use crate::tools::{CallContext, ServerTool, ToolOutput};

/// The federated tool set at one moment.
#[derive(Default)]
struct Federation {
    tools: Arc<Vec<ServerTool>>,
    /// Federated name → (server index in `servers`' config, the tool's own name).
    routes: HashMap<String, (usize, String)>,
    /// The servers the routes' indices refer to.
    servers: Option<Arc<Servers>>,
}

/// The configured servers at one moment (a reload replaces them whole; see
/// `reconfigure.rs`), by their index in `config.mcp_servers`.
pub(super) struct Servers {
    pub(super) config: Arc<Config>,
    /// Shared instances by server index.
    pub(super) shared: HashMap<usize, Arc<Supervisor>>,
    /// Tool lists of session-scoped servers, from their probe.
    pub(super) probed: HashMap<usize, Arc<Vec<McpTool>>>,
    /// What session-scoped servers declared (resources, prompts, logging) to their probe.
    pub(super) probed_caps: HashMap<usize, rmcp::model::ServerCapabilities>,
    /// The OAuth of each HTTP server, by server index.
    pub(super) oauth: HashMap<usize, Arc<oauth::OAuth>>,
}

/// The MCP side of the tool host (the [`Toolbox`](super::Toolbox) adds the built-in tools).
pub struct McpHost {
    /// The servers now. Changed only with `sessions` locked (so that a session's instance is
    /// never started from a definition a reload has just replaced).
    pub(super) servers: Swap<Servers>,
    pub(super) sessions: Mutex<SessionInstances>,
    /// The catalog events of each session's instances, by session id (see
    /// [`McpHost::session_catalog_events`]).
    session_feeds: Mutex<HashMap<String, supervisor::SessionFeed>>,
    /// Session-scoped instances stopped to make room under `[limits] session_servers`.
    evicted: AtomicU64,
    federation: RwLock<Federation>,
    generation: tokio::sync::watch::Sender<u64>,
    /// One reload at a time.
    pub(super) reconfiguring: tokio::sync::Mutex<()>,
}

/// What the probes of session-scoped servers found (their tools and capabilities), the probes
/// stopped.
pub(super) async fn take_probes(
    probes: super::first_start::Probes,
) -> (
    HashMap<usize, Arc<Vec<McpTool>>>,
    HashMap<usize, ServerCapabilities>,
) {
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
    (probed, probed_caps)
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
        let (shared, probes) = spawn_servers(&config, &oauth, |_| true);
        let report = first_attempts(&config, &shared, &probes, progress).await;
        let (probed, probed_caps) = take_probes(probes).await;
        let host = Arc::new(McpHost {
            servers: Swap::new(Arc::new(Servers {
                config,
                shared,
                probed,
                probed_caps,
                oauth,
            })),
            sessions: Mutex::new(HashMap::new()),
            session_feeds: Mutex::new(HashMap::new()),
            evicted: AtomicU64::new(0),
            federation: RwLock::new(Federation::default()),
            generation: tokio::sync::watch::channel(0).0,
            reconfiguring: tokio::sync::Mutex::new(()),
        });
        host.refederate(true)?;
        let all: Vec<Arc<Supervisor>> = host.servers.get().shared.values().cloned().collect();
        host.follow_tool_lists(&all);
        host.reap_periodically();
        Ok((host, report))
    }

    /// Refederate whenever one of these shared servers' tool list changes (for as long as the
    /// host and the server live).
    pub(super) fn follow_tool_lists(self: &Arc<Self>, shared: &[Arc<Supervisor>]) {
        for s in shared {
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
    pub(super) fn refederate(&self, strict: bool) -> Result<(), FederationError> {
        let servers = self.servers.get();
        let config = &servers.config;
        let mut tools = Vec::new();
        let mut routes: HashMap<String, (usize, String)> = HashMap::new();
        let mut owners: HashMap<String, (String, String)> = HashMap::new();
        for (i, cfg) in config.mcp_servers.iter().enumerate() {
            let listed = match cfg.scope {
                McpScope::Shared => servers.shared.get(&i).map(|s| s.tools()),
                McpScope::Session => servers.probed.get(&i).cloned(),
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
                        return Err(FederationError(format!("{}: {c}", config.path.display())));
                    }
                    tracing::error!("{c}; the second tool is left out");
                    continue;
                }
                owners.insert(name.clone(), (cfg.name.clone(), t.name.clone()));
                let decision = policy::decide(&config.policy, &name);
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
            servers: Some(servers.clone()),
        };
        self.generation.send_modify(|g| *g += 1);
        Ok(())
    }

    /// Call the tool federated as `name` on its server (the session's instance for a
    /// session-scoped one): the server's result, or the error output a failure is.
    pub async fn call_server(
        &self,
        ctx: &CallContext,
        name: &str,
        input: Value,
    ) -> Result<rmcp::model::CallToolResult, ToolOutput> {
        let Some((servers, idx, tool)) = self.route(name) else {
            return Err(ToolOutput::error(format!("Unknown tool {name}.")));
        };
        let asker = elicit::Asker {
            session_id: ctx.session_id.clone(),
            elicitor: ctx.elicitor.clone(),
            sampler: ctx.sampler.clone(),
            paused: Default::default(),
        };
        match servers.shared.get(&idx) {
            Some(s) => s.call(&tool, input, asker).await,
            None => {
                let (s, _in_flight) = self.session_instance(&servers, idx, ctx).await?;
                s.call(&tool, input, asker).await
            }
        }
    }

    /// Where the tool federated as `name` is served: the servers, the index of its server
    /// among them, the tool's own name.
    fn route(&self, name: &str) -> Option<(Arc<Servers>, usize, String)> {
        let federation = self.federation.read().unwrap_or_else(|p| p.into_inner());
        let (idx, tool) = federation.routes.get(name)?.clone();
        Some((federation.servers.clone()?, idx, tool))
    }

    /// The session's instance of server `idx`, started if needed, with the call marked in
    /// flight. Past `[limits] session_servers_per_key` for the session's key, that key's idlest
    /// instance (least recently called, no call in flight) is stopped first; past `[limits]
    /// session_servers`, the idlest of all. When every one counted is in a call, an error
    /// result naming the limit.
    async fn session_instance(
        &self,
        servers: &Servers,
        idx: usize,
        ctx: &CallContext,
    ) -> Result<(Arc<Supervisor>, InFlight), ToolOutput> {
        let Some(cfg) = servers.config.mcp_servers.get(idx) else {
            return Err(ToolOutput::error("Unknown MCP server."));
        };
        let key = (ctx.session_id.clone(), cfg.name.clone());
        let limits = &servers.config.limits;
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
                    return self.start_instance(&mut map, key, ctx);
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
                server = %victim_key.1,
                session = %victim_key.0,
                limit = full.key(),
                "stopping the idlest session-scoped MCP server to make room; it restarts at its next call"
            );
            victim.sup.stop().await;
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        let file = servers
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

    /// Start the session's instance of server `key.1` (there is room for it) with a call in
    /// flight, from the server's definition now (`map` is locked: a reload waits for it).
    fn start_instance(
        &self,
        map: &mut SessionInstances,
        key: (String, String),
        ctx: &CallContext,
    ) -> Result<(Arc<Supervisor>, InFlight), ToolOutput> {
        let servers = self.servers.get();
        let config = &servers.config;
        let Some(idx) = config.mcp_servers.iter().position(|s| s.name == key.1) else {
            return Err(ToolOutput::error(format!(
                "MCP server {} was removed from the configuration",
                key.1
            )));
        };
        let workspace: PathBuf = ctx.workspace.clone();
        let _ = std::fs::create_dir_all(&workspace);
        let sup = Supervisor::start(
            config.mcp_servers[idx].clone(),
            Placement {
                cwd: Some(workspace.clone()),
                workspace: Some(workspace),
                private: sandbox::own_state(config),
                oauth: servers.oauth.get(&idx).cloned(),
            },
        );
        self.feed_session(&ctx.session_id, &sup);
        Ok(map
            .entry(key)
            .or_insert(SessionInstance {
                sup,
                used: Instant::now(),
                in_flight: Arc::new(AtomicUsize::new(0)),
                owner: ctx.owner.clone(),
            })
            .begin())
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
        let servers = self.servers.get();
        servers
            .config
            .mcp_servers
            .iter()
            .enumerate()
            .map(|(i, cfg)| match cfg.scope {
                McpScope::Shared => ServerReport {
                    name: cfg.name.clone(),
                    scope: "shared",
                    shared: servers.shared.get(&i).map(|s| s.status()),
                    instances: None,
                },
                McpScope::Session => ServerReport {
                    name: cfg.name.clone(),
                    scope: "session",
                    shared: None,
                    instances: Some(
                        sessions
                            .iter()
                            .filter(|((_, server), _)| *server == cfg.name)
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

    /// A counter that moves whenever the federated tool set changes.
    pub fn tool_generation(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// A session is gone: stop its instances of session-scoped servers.
    pub fn close_session<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, ()> {
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

    /// The process is stopping: stop every instance.
    pub fn stop_all(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let sessions: Vec<Arc<Supervisor>> = {
                let mut map = lock(&self.sessions);
                map.drain().map(|(_, inst)| inst.sup).collect()
            };
            let all = self
                .servers
                .get()
                .shared
                .values()
                .cloned()
                .collect::<Vec<_>>();
            let all = all.into_iter().chain(sessions);
            futures_util::future::join_all(all.map(|s| async move { s.stop().await })).await;
        })
    }
}

impl McpHost {
    /// The shared servers' instances, in config order.
    pub fn shared_servers(&self) -> Vec<Arc<Supervisor>> {
        let servers = self.servers.get();
        let mut all: Vec<(usize, Arc<Supervisor>)> = servers
            .shared
            .iter()
            .map(|(i, s)| (*i, s.clone()))
            .collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, s)| s).collect()
    }

    /// The catalog events of `session_id`'s own instances of session-scoped servers started
    /// from now on, each with its server's name, until the session closes. (Only a session
    /// someone listens to has a feed: an AAP session's instances feed none.)
    pub fn session_catalog_events(
        &self,
        session_id: &str,
    ) -> broadcast::Receiver<(String, CatalogEvent)> {
        crate::sync::lock(&self.session_feeds)
            .entry(session_id.to_string())
            .or_insert_with(|| broadcast::channel(64).0)
            .subscribe()
    }

    /// Forward the events of `sup`, an instance just started for `session_id`, to that
    /// session's feed if it has one (subscribed before the instance can have sent any), for
    /// as long as it lives.
    pub(super) fn feed_session(&self, session_id: &str, sup: &Supervisor) {
        let Some(feed) = crate::sync::lock(&self.session_feeds)
            .get(session_id)
            .cloned()
        else {
            return;
        };
        let mut events = sup.catalog_events();
        let server = sup.name.clone();
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(e) => {
                        let _ = feed.send((server.clone(), e));
                    }
                    // Tell the session's relay that something was missed.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = feed.send((server.clone(), CatalogEvent::Missed));
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        });
    }

    /// What the session-scoped servers declared to their probe at start, in config order
    /// (their instances start per session, after a client learns the capabilities).
    pub fn session_capabilities(&self) -> Vec<ServerCapabilities> {
        let servers = self.servers.get();
        let mut all: Vec<(&usize, &ServerCapabilities)> = servers.probed_caps.iter().collect();
        all.sort_by_key(|(i, _)| **i);
        all.into_iter().map(|(_, c)| c.clone()).collect()
    }

    /// The session's own instance of every session-scoped server whose probe's capabilities
    /// pass `wanted`, started if need be and up (each within its `startup_timeout_s`), in
    /// config order. One that cannot start (no room under `[limits] session_servers`) or does
    /// not come up is left out, logged.
    pub async fn session_servers(
        &self,
        ctx: &CallContext,
        wanted: impl Fn(&ServerCapabilities) -> bool,
    ) -> Vec<Arc<Supervisor>> {
        let mut out = Vec::new();
        let servers = self.servers.get();
        for (idx, cfg) in servers.config.mcp_servers.iter().enumerate() {
            if cfg.scope != McpScope::Session || !servers.probed_caps.get(&idx).is_some_and(&wanted)
            {
                continue;
            }
            let sup = match self.session_instance(&servers, idx, ctx).await {
                Ok((sup, _in_flight)) => sup,
                Err(refused) => {
                    tracing::warn!(server = %cfg.name, session = %ctx.session_id, reason = %refused.content, "a session-scoped MCP server was not started for /mcp");
                    continue;
                }
            };
            match sup.ready(cfg.startup_timeout).await {
                Ok(()) => out.push(sup),
                Err(why) => {
                    tracing::warn!(server = %cfg.name, session = %ctx.session_id, reason = %why, "a session-scoped MCP server is not up for /mcp")
                }
            }
        }
        out
    }
}

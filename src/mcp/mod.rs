//! MCP federation: the servers of `[mcp_servers]` become tools named `mcp__<server>__<tool>`,
//! each with the policy's verdict and the rule that decided it.
//!
//! Shared servers (`scope = "shared"`) run once for the process. Session-scoped servers run one
//! instance per session, started at the session's first call with its workspace as cwd and
//! `{workspace}` in their args, stopped when the session is deleted or idle; their tool list is
//! taken at start-up from a probe instance in a scratch folder.

pub mod content;
pub mod http_client;
pub mod naming;
pub mod policy;
pub mod sandbox;
pub mod supervisor;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::config::{Config, McpScope, McpServerConfig};
use crate::message::ToolSpec;
use crate::sync::lock;
use crate::tools::{CallContext, ServerTool, ToolHost, ToolOutput};
use supervisor::{McpTool, Placement, Supervisor};

/// A session-scoped instance unused this long is stopped (it restarts at the next call).
const SESSION_IDLE: Duration = Duration::from_secs(600);

/// What federating the configured servers found at start-up.
#[derive(Debug, Clone, Default)]
pub struct StartReport {
    /// Servers that did not come up, with why (they keep retrying in the background).
    pub failed: Vec<(String, String)>,
}

/// The federated tool set at one moment.
#[derive(Default)]
struct Federation {
    tools: Arc<Vec<ServerTool>>,
    /// Federated name → (server index in the config, the tool's own name).
    routes: HashMap<String, (usize, String)>,
}

/// Session-scoped instances by (session id, server index), with when each was last used.
type SessionInstances = HashMap<(String, usize), (Arc<Supervisor>, Instant)>;

/// The MCP side of the tool host.
pub struct McpHost {
    config: Arc<Config>,
    /// Shared instances by server index.
    shared: HashMap<usize, Arc<Supervisor>>,
    /// Tool lists of session-scoped servers, from their probe.
    probed: HashMap<usize, Arc<Vec<McpTool>>>,
    sessions: Mutex<SessionInstances>,
    federation: RwLock<Federation>,
    generation: tokio::sync::watch::Sender<u64>,
    /// Builtin tools (deliver_file) listed after the MCP ones.
    builtins: Vec<ServerTool>,
    /// The file store, for `deliver_file`.
    files: Option<crate::files::FileStore>,
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
        files: Option<crate::files::FileStore>,
    ) -> Result<(Arc<McpHost>, StartReport), FederationError> {
        let builtins = vec![ServerTool {
            spec: crate::files::deliver::spec(),
            server: "builtin".into(),
            tool: crate::files::deliver::NAME.into(),
            verdict: crate::config::Verdict::Ask,
            rule: "default".into(),
        }];
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
        }
        let mut shared = HashMap::new();
        let mut probes = Vec::new();
        for (i, cfg) in config.mcp_servers.iter().enumerate() {
            match cfg.scope {
                McpScope::Shared => {
                    shared.insert(i, Supervisor::start(cfg.clone(), Placement::default()));
                }
                McpScope::Session => {
                    let scratch = config.server.data_dir.join("mcp-probe").join(&cfg.name);
                    let _ = std::fs::create_dir_all(&scratch);
                    let placement = Placement {
                        cwd: Some(scratch.clone()),
                        workspace: Some(scratch),
                    };
                    probes.push((i, Supervisor::start(cfg.clone(), placement)));
                }
            }
        }
        let mut report = StartReport::default();
        let waits = shared
            .iter()
            .map(|(i, s)| (*i, s.clone()))
            .chain(probes.iter().map(|(i, s)| (*i, s.clone())))
            .map(|(i, s)| {
                let within = config.mcp_servers[i].startup_timeout + Duration::from_secs(1);
                async move { (i, s.ready(within).await) }
            });
        for (i, r) in futures_util::future::join_all(waits).await {
            if let Err(why) = r {
                report
                    .failed
                    .push((config.mcp_servers[i].name.clone(), why));
            }
        }
        let mut probed = HashMap::new();
        for (i, s) in probes {
            probed.insert(i, s.tools());
            s.stop().await;
        }
        let host = Arc::new(McpHost {
            config,
            shared,
            probed,
            sessions: Mutex::new(HashMap::new()),
            federation: RwLock::new(Federation::default()),
            generation: tokio::sync::watch::channel(0).0,
            builtins,
            files,
        });
        host.refederate(true)?;
        for s in host.shared.values() {
            let mut changed = s.tools_changed();
            let weak = Arc::downgrade(&host);
            tokio::spawn(async move {
                while changed.changed().await.is_ok() {
                    let Some(host) = weak.upgrade() else { break };
                    if let Err(e) = host.refederate(false) {
                        tracing::error!(error = %e, "a changed tool list could not be federated");
                    }
                }
            });
        }
        let weak = Arc::downgrade(&host);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(30));
            loop {
                tick.tick().await;
                let Some(host) = weak.upgrade() else { break };
                host.reap_idle().await;
            }
        });
        Ok((host, report))
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
                });
            }
        }
        for b in &self.builtins {
            if owners.contains_key(&b.spec.name) {
                return Err(FederationError(format!(
                    "the builtin tool {} collides with an MCP tool",
                    b.spec.name
                )));
            }
            let mut b = b.clone();
            let decision = policy::decide(&self.config.policy, &b.spec.name);
            b.verdict = decision.verdict;
            b.rule = decision.rule;
            tools.push(b);
        }
        *self.federation.write().unwrap_or_else(|p| p.into_inner()) = Federation {
            tools: Arc::new(tools),
            routes,
        };
        self.generation.send_modify(|g| *g += 1);
        Ok(())
    }

    fn route(&self, name: &str) -> Option<(usize, String)> {
        self.federation
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .routes
            .get(name)
            .cloned()
    }

    async fn session_instance(&self, idx: usize, ctx: &CallContext) -> Arc<Supervisor> {
        let key = (ctx.session_id.clone(), idx);
        let cfg: McpServerConfig = self.config.mcp_servers[idx].clone();
        let mut map = lock(&self.sessions);
        if let Some((s, used)) = map.get_mut(&key) {
            *used = Instant::now();
            return s.clone();
        }
        let workspace: PathBuf = ctx.workspace.clone();
        let _ = std::fs::create_dir_all(&workspace);
        let s = Supervisor::start(
            cfg,
            Placement {
                cwd: Some(workspace.clone()),
                workspace: Some(workspace),
            },
        );
        map.insert(key, (s.clone(), Instant::now()));
        s
    }

    async fn reap_idle(&self) {
        let idle: Vec<Arc<Supervisor>> = {
            let mut map = lock(&self.sessions);
            let keys: Vec<_> = map
                .iter()
                .filter(|(_, (_, used))| used.elapsed() >= SESSION_IDLE)
                .map(|(k, _)| k.clone())
                .collect();
            keys.into_iter()
                .filter_map(|k| map.remove(&k))
                .map(|(s, _)| s)
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

    /// The session-scoped instances running now (for tests and metrics).
    pub fn session_instances(&self) -> usize {
        lock(&self.sessions).len()
    }
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
            let Some((idx, tool)) = self.route(name) else {
                if name == crate::files::deliver::NAME {
                    return match &self.files {
                        Some(files) => crate::files::deliver::call(files, ctx, input).await,
                        None => ToolOutput::error("deliver_file: no file store is configured"),
                    };
                }
                return ToolOutput::error(format!("Unknown tool {name}."));
            };
            match self.shared.get(&idx) {
                Some(s) => s.call(&tool, input).await,
                None => {
                    self.session_instance(idx, ctx)
                        .await
                        .call(&tool, input)
                        .await
                }
            }
        })
    }

    fn generation(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    fn session_closed<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, ()> {
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
                    .map(|(s, _)| s)
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
                map.drain().map(|(_, (s, _))| s).collect()
            };
            let all = self.shared.values().cloned().chain(sessions);
            futures_util::future::join_all(all.map(|s| async move { s.stop().await })).await;
        })
    }
}

//! `/mcp`: turnstile as an MCP server (streamable HTTP), serving each configured agent's
//! federated tools under the operator's policy to any MCP client (`[mcp_endpoint]`).
//!
//! rmcp's server side does the protocol (JSON-RPC framing, SSE streams, `Mcp-Session-Id`
//! sessions, elicitation round trips, `notifications/cancelled`); this module puts it behind
//! our HTTP layer: the same API keys, a session visible only to the key that opened it (404 to
//! any other, as for AAP sessions), bodies bounded by `[server] max_body_bytes`. `/mcp` serves
//! the first agent of `[mcp_endpoint] agents`, `/mcp/<agent>` each listed one. See [`gate`] for
//! what a session offers, and [`catalog`] for the servers' resources and prompts.

mod ask;
pub mod catalog;
pub mod content;
pub mod gate;
mod to_client;
pub mod uri;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::config::Config;
use crate::http::{ApiError, Request, Response};
use crate::tools::ToolHost;
use gate::{Gate, McpCaller};

/// The AAP-side session id an MCP session stands for (its workspace folder, its session-scoped
/// MCP servers): `mcp-<Mcp-Session-Id>`.
pub fn session_key(mcp_session_id: &str) -> String {
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

type Service = StreamableHttpService<Gate, LocalSessionManager>;

/// One agent's endpoint.
struct AgentEndpoint {
    name: String,
    service: Service,
    sessions: Arc<LocalSessionManager>,
}

/// The `/mcp` endpoint: off (every path a 404) unless `[mcp_endpoint] enabled = true`.
pub struct Endpoint {
    agents: Vec<AgentEndpoint>,
    /// Who owns each open MCP session: (agent, session id) → the key's owner id.
    owners: Mutex<HashMap<(String, String), Option<String>>>,
    host: Arc<dyn ToolHost>,
    /// Open MCP sessions one key may hold (`[limits] sessions_per_key`, counted apart from its
    /// AAP sessions).
    per_key: usize,
    /// `[server] sandboxes`: a closed session's workspace is removed.
    sandboxes: std::path::PathBuf,
}

impl Endpoint {
    /// The endpoint of `config` over `host`, its sessions ended when `shutdown` is cancelled.
    /// rmcp's own `Host` check is off: the API's browser guard ([`crate::http::browser`]) has
    /// checked `Host`, `Origin` and the content type of every request before it comes here.
    pub fn new(
        config: &Arc<Config>,
        host: &Arc<dyn ToolHost>,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> Endpoint {
        let ep = &config.mcp_endpoint;
        let agents = if ep.enabled {
            ep.agents
                .iter()
                .filter_map(|name| config.agents.iter().find(|a| &a.name == name))
                .map(|agent| {
                    let sessions = Arc::new(LocalSessionManager::default());
                    let http = StreamableHttpServerConfig::default()
                        .with_max_request_body_bytes(
                            usize::try_from(config.server.max_body_bytes).unwrap_or(usize::MAX),
                        )
                        .with_cancellation_token(shutdown.child_token())
                        .disable_allowed_hosts();
                    let (config, agent_cfg, host) = (config.clone(), agent.clone(), host.clone());
                    let service = StreamableHttpService::new(
                        move || Ok(Gate::new(config.clone(), agent_cfg.clone(), host.clone())),
                        sessions.clone(),
                        http,
                    );
                    AgentEndpoint {
                        name: agent.name.clone(),
                        service,
                        sessions,
                    }
                })
                .collect()
        } else {
            Vec::new()
        };
        Endpoint {
            agents,
            owners: Mutex::new(HashMap::new()),
            host: host.clone(),
            per_key: config.limits.sessions_per_key,
            sandboxes: config.server.sandboxes.clone(),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.agents.is_empty()
    }

    /// Serve one request to `/mcp` (`agent: None`) or `/mcp/<agent>`.
    pub async fn handle(
        &self,
        agent: Option<&str>,
        owner: Option<String>,
        req: Request,
    ) -> Result<Response, ApiError> {
        // Boxed: rmcp's request future is large, and the API's future (every route's, AAP ones
        // too) would otherwise be as large and copied as such on every request.
        Box::pin(self.serve(agent, owner, req)).await
    }

    async fn serve(
        &self,
        agent: Option<&str>,
        owner: Option<String>,
        mut req: Request,
    ) -> Result<Response, ApiError> {
        let Some(ep) = (match agent {
            None => self.agents.first(),
            Some(name) => self.agents.iter().find(|a| a.name == name),
        }) else {
            return Err(ApiError::not_found(match agent {
                _ if !self.enabled() => "the MCP endpoint is off; turn it on with [mcp_endpoint] enabled = true in tools.toml".to_string(),
                Some(name) => format!("the MCP endpoint serves no agent {name:?}; list it in [mcp_endpoint] agents in tools.toml"),
                None => "no MCP endpoint".to_string(),
            }));
        };
        let sid = req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        if let Some(sid) = &sid {
            let known = crate::sync::lock(&self.owners)
                .get(&(ep.name.clone(), sid.clone()))
                .cloned();
            if known.as_ref() != Some(&owner) {
                return Err(ApiError::not_found(format!(
                    "no MCP session {sid}; start one with an initialize request (without Mcp-Session-Id)"
                )));
            }
        }
        if sid.is_none() && req.method() == http::Method::POST {
            self.forget_closed(ep).await;
            self.check_quota(&owner)?;
        }
        let deleting = req.method() == http::Method::DELETE;
        req.extensions_mut().insert(McpCaller {
            owner: owner.clone(),
        });
        let resp = ep.service.handle(req).await;
        let status = resp.status();
        match &sid {
            None => {
                let opened = resp
                    .headers()
                    .get("mcp-session-id")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                if let Some(opened) = opened {
                    crate::sync::lock(&self.owners).insert((ep.name.clone(), opened), owner);
                }
            }
            Some(sid) if deleting && status.is_success() => {
                crate::sync::lock(&self.owners).remove(&(ep.name.clone(), sid.clone()));
                self.closed(sid).await;
            }
            Some(_) => {}
        }
        let (parts, body) = resp.into_parts();
        Ok(http::Response::from_parts(parts, body.boxed_unsync()))
    }

    /// 429 when `owner` holds `[limits] sessions_per_key` open MCP sessions.
    fn check_quota(&self, owner: &Option<String>) -> Result<(), ApiError> {
        let n = crate::sync::lock(&self.owners)
            .values()
            .filter(|o| *o == owner)
            .count();
        if n < self.per_key {
            return Ok(());
        }
        Err(ApiError {
            retry_after: Some(60),
            ..ApiError::new(
                http::StatusCode::TOO_MANY_REQUESTS,
                "too_many_sessions",
                format!(
                    "this key already has {n} open MCP sessions (limit: [limits] sessions_per_key in tools.toml); end sessions it no longer needs (DELETE /mcp with their Mcp-Session-Id), idle ones close after 5 minutes"
                ),
            )
        })
    }

    /// Drop the owners of sessions rmcp has closed (expired, transport gone), releasing what
    /// the tool host kept for them.
    async fn forget_closed(&self, ep: &AgentEndpoint) {
        let live = ep.sessions.sessions.read().await;
        let gone: Vec<String> = {
            let mut owners = crate::sync::lock(&self.owners);
            let gone: Vec<String> = owners
                .keys()
                .filter(|(agent, sid)| *agent == ep.name && !live.contains_key(sid.as_str()))
                .map(|(_, sid)| sid.clone())
                .collect();
            for sid in &gone {
                owners.remove(&(ep.name.clone(), sid.clone()));
            }
            gone
        };
        drop(live);
        for sid in gone {
            self.closed(&sid).await;
        }
    }

    /// A session ended: its session-scoped servers stop and its workspace goes, as an AAP
    /// session's do when it is deleted.
    async fn closed(&self, sid: &str) {
        let key = session_key(sid);
        self.host.session_closed(&key).await;
        let _ = tokio::fs::remove_dir_all(self.sandboxes.join(&key)).await;
    }
}

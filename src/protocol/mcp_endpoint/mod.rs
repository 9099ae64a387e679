//! `/mcp`: turnstile as an MCP server (streamable HTTP), serving each configured agent's
//! federated tools under the operator's policy to any MCP client (`[mcp_endpoint]`).
//!
//! rmcp's server side does the protocol (JSON-RPC framing, SSE streams, `Mcp-Session-Id`
//! sessions, elicitation round trips, `notifications/cancelled`); this module puts it behind
//! our HTTP layer: the same API keys, a session visible only to the principal that opened it (404
//! to any other, as for AAP sessions, an admin's too), bodies bounded by `[server]
//! max_body_bytes`. `/mcp` serves the first agent of `[mcp_endpoint] agents` that the caller's
//! principal may use, `/mcp/<agent>` each listed one; a principal's `[keys.NAME] tools` narrow
//! what it is served. See [`gate`] for
//! what a session offers, [`passthrough`] for the servers' resources and prompts, and
//! [`session_store`] for what a session costs while idle and when it ends.

mod ask;
pub(crate) mod gate;
pub(crate) mod passthrough;
mod session_store;
mod to_client;
pub(crate) mod tool_result;
pub(crate) mod uri;

use std::sync::Arc;

use http_body_util::BodyExt;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::config::{Config, Scope};
use crate::http::{ApiError, Request, Response};
use crate::tools::ToolHost;
use gate::{Gate, McpCaller};
use session_store::{Busy, Refused, Sessions};

type Service = StreamableHttpService<Gate, Sessions>;

/// One agent's endpoint.
struct AgentEndpoint {
    name: String,
    service: Service,
    sessions: Arc<Sessions>,
}

/// The `/mcp` endpoint: off (every path a 404) unless `[mcp_endpoint] enabled = true`.
pub(crate) struct Endpoint {
    agents: Vec<AgentEndpoint>,
    /// Open MCP sessions one key may hold (`[limits] sessions_per_key`, counted apart from its
    /// AAP sessions).
    per_key: usize,
    /// `[mcp_endpoint] session_idle_s`, for the quota's message.
    idle_after: std::time::Duration,
}

impl Endpoint {
    /// The endpoint of `config` over `host`, its sessions ended when `shutdown` is cancelled.
    /// rmcp's own `Host` check is off: the API's browser guard ([`crate::http::browser`]) has
    /// checked `Host`, `Origin` and the content type of every request before it comes here.
    /// Workspaces of MCP sessions an earlier run left behind are removed.
    pub(crate) fn new(
        config: &Arc<Config>,
        live: &Arc<crate::sync::Swap<Config>>,
        host: &Arc<dyn ToolHost>,
        shutdown: &tokio_util::sync::CancellationToken,
    ) -> Endpoint {
        let ep = &config.mcp_endpoint;
        // With PostgreSQL, instances may share one `sandboxes` folder (see README "Several
        // instances"): another instance's sessions may be using what is there.
        if config.store.backend != crate::config::StoreBackendKind::Postgres {
            session_store::remove_stale_workspaces(&config.server.sandboxes);
        }
        let agents = if ep.enabled {
            ep.agents
                .iter()
                .filter_map(|name| config.agents.iter().find(|a| &a.name == name))
                .map(|agent| {
                    let sessions = Arc::new(Sessions::new(
                        host.clone(),
                        config.server.sandboxes.clone(),
                        ep.session_park,
                        ep.session_idle,
                    ));
                    tokio::spawn(sessions.clone().reap(shutdown.child_token()));
                    let mut http = StreamableHttpServerConfig::default()
                        .with_max_request_body_bytes(
                            usize::try_from(config.server.max_body_bytes).unwrap_or(usize::MAX),
                        )
                        .with_cancellation_token(shutdown.child_token())
                        .disable_allowed_hosts();
                    // A parked session is restored from its record (see `session_store`).
                    http.session_store = Some(sessions.clone());
                    let (live, agent_cfg, host) =
                        (live.clone(), Arc::new(agent.clone()), host.clone());
                    let gates = sessions.clone();
                    let service = StreamableHttpService::new(
                        move || {
                            // Each MCP session keeps the configuration of its start (a reload
                            // reaches the sessions that start after it), and its agent as
                            // that configuration defines it.
                            let config = live.get();
                            let agent = config
                                .agent(&agent_cfg.name)
                                .map_or_else(|| agent_cfg.clone(), |a| Arc::new(a.clone()));
                            Ok(Gate::new(config, agent, host.clone(), gates.clone()))
                        },
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
            per_key: config.limits.sessions_per_key,
            idle_after: ep.session_idle,
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        !self.agents.is_empty()
    }

    /// Serve one request to `/mcp` (`agent: None`) or `/mcp/<agent>` of `caller` (its owner id
    /// and what its principal may do).
    pub(crate) async fn handle(
        &self,
        agent: Option<&str>,
        caller: (Option<String>, Scope),
        req: Request,
    ) -> Result<Response, ApiError> {
        // Boxed: rmcp's request future is large, and the API's future (every route's, AAP ones
        // too) would otherwise be as large and copied as such on every request.
        Box::pin(self.serve(agent, caller, req)).await
    }

    async fn serve(
        &self,
        agent: Option<&str>,
        (owner, scope): (Option<String>, Scope),
        mut req: Request,
    ) -> Result<Response, ApiError> {
        let Some(ep) = (match agent {
            // The first agent the caller's principal may use (`[keys.NAME] agents`).
            None => self
                .agents
                .iter()
                .find(|a| scope.may_use(&a.name))
                .or(self.agents.first()),
            Some(name) => self.agents.iter().find(|a| a.name == name),
        }) else {
            return Err(ApiError::not_found(match agent {
                _ if !self.enabled() => "the MCP endpoint is off; turn it on with [mcp_endpoint] enabled = true in tools.toml".to_string(),
                Some(name) => format!("the MCP endpoint serves no agent {name:?}; list it in [mcp_endpoint] agents in tools.toml"),
                None => "no MCP endpoint".to_string(),
            }));
        };
        if !scope.may_use(&ep.name) {
            return Err(ApiError::forbidden(format!(
                "this key may not use agent {:?} ([keys] agents in tools.toml); GET /meta lists the agents it may use",
                ep.name
            )));
        }
        let sid = req
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        // The session is in use until the response's body has been sent (or dropped).
        let mut busy: Option<Busy> = None;
        if let Some(sid) = &sid {
            busy = Some(ep.sessions.enter(sid, &owner).await.map_err(|why| match why {
                Refused::Unknown => ApiError::not_found(format!(
                    "no MCP session {sid}; start one with an initialize request (without Mcp-Session-Id)"
                )),
                Refused::Parking => ApiError {
                    retry_after: Some(1),
                    ..ApiError::new(
                        http::StatusCode::SERVICE_UNAVAILABLE,
                        "session_busy",
                        format!("MCP session {sid} is being parked; try again"),
                    )
                },
            })?);
        } else if req.method() == http::Method::POST {
            self.check_quota(&owner)?;
        }
        req.extensions_mut().insert(McpCaller {
            owner: owner.clone(),
            scope,
        });
        let resp = match &sid {
            Some(_) => ep.service.handle(req).await,
            None => Sessions::opening(owner, ep.service.handle(req)).await,
        };
        if sid.is_none() {
            let opened = resp
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok());
            busy = opened.and_then(|id| ep.sessions.hold(id));
        }
        let (parts, body) = resp.into_parts();
        Ok(http::Response::from_parts(
            parts,
            Held { body, _busy: busy }.boxed_unsync(),
        ))
    }

    /// 429 when `owner` holds `[limits] sessions_per_key` MCP sessions.
    fn check_quota(&self, owner: &Option<String>) -> Result<(), ApiError> {
        let n: usize = self.agents.iter().map(|a| a.sessions.held_by(owner)).sum();
        if n < self.per_key {
            return Ok(());
        }
        Err(ApiError {
            retry_after: Some(60),
            ..ApiError::new(
                http::StatusCode::TOO_MANY_REQUESTS,
                "too_many_sessions",
                format!(
                    "this key already has {n} open MCP sessions (limit: [limits] sessions_per_key in tools.toml); end sessions it no longer needs (DELETE /mcp with their Mcp-Session-Id), idle ones end after {} s ([mcp_endpoint] session_idle_s)",
                    self.idle_after.as_secs()
                ),
            )
        })
    }
}

/// A response body that keeps its session in use until it is sent or dropped.
struct Held<B> {
    body: B,
    _busy: Option<Busy>,
}

impl<B: hyper::body::Body + Unpin> hyper::body::Body for Held<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

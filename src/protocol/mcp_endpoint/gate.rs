//! One MCP session's server: the agent's federated tools under the operator's policy.
//!
//! `tools/list` is the agent's exposed tools (its `tools` globs, minus `deny`). `tools/call`
//! refuses what is not listed (a denied tool: "denied by policy" with its rule), runs `trust`
//! tools, and turns `ask` into an elicitation to the calling client when it declared the
//! capability (accept runs the call; decline or cancel refuse it, with the client's reason when
//! it gave one); without the capability an `ask` tool is an error result naming the rule. Calls
//! go through the tool host (the same supervisors and timeouts as agent calls), but a server's
//! result is passed on as the server sent it (every kind of content, structured content,
//! `_meta`), and its tools are listed as it listed them, renamed: an MCP client reads MCP,
//! where a model gets the mapping agent calls get. A client's `notifications/cancelled` drops
//! the call, which cancels it on the child, and the child's progress for a call that asked for
//! it goes to the client.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[allow(deprecated)]
use rmcp::model::SetLevelRequestParams;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CompleteRequestParams, CompleteResult,
    GetPromptRequestParams, GetPromptResponse, Implementation, ListPromptsResult,
    ListResourceTemplatesResult, ListResourcesResult, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ReadResourceRequestParams, ReadResourceResponse, ServerConfig,
    SubscribeRequestParams, Tool, UnsubscribeRequestParams,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::transport::streamable_http_server::SessionRestoreMarker;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Value};

use super::ask::{self, Subject};
use super::session_store::{Busy, Sessions};
use super::tool_result::{refused, to_result};
use super::uri::{plain_name, shown};
use crate::config::{AgentConfig, Config, EndpointNames, Scope, Verdict};
use crate::tools::relay::{Progress, PROGRESS};
use crate::tools::{CallContext, Reply, ServerTool, ToolHost, ToolOutput};

/// The resources one session subscribed to: (server, the server's URI) → the URI as the client
/// gave it.
type Subscribed = Arc<std::sync::Mutex<std::collections::HashMap<(String, String), String>>>;

/// What one MCP session keeps of the servers' catalogs.
#[derive(Default)]
pub(crate) struct Kept {
    pub(super) subscribed: Subscribed,
    /// The level its client set (`logging/setLevel`): messages below it are not relayed.
    #[allow(deprecated)]
    pub(super) level: Arc<std::sync::Mutex<Option<rmcp::model::LoggingLevel>>>,
    /// Set once its own instances' notifications are relayed to its client.
    pub(super) relaying: std::sync::OnceLock<()>,
}

/// Who opened the session (put into each request's extensions by the endpoint): its owner id
/// and what its principal may do.
#[derive(Debug, Clone)]
pub(crate) struct McpCaller {
    pub owner: Option<String>,
    pub scope: Scope,
}

/// The server of one MCP session (while it is in memory: see [`Sessions`]).
pub(crate) struct Gate {
    pub config: Arc<Config>,
    pub agent: Arc<AgentConfig>,
    pub host: Arc<dyn ToolHost>,
    /// What it keeps of the servers' catalogs (subscriptions, its log level, relays).
    pub kept: Kept,
    /// Cancelled when the session's server is dropped (its relays end with it).
    pub ended: tokio_util::sync::CancellationToken,
    _ending: tokio_util::sync::DropGuard,
    /// Its agent's sessions: whether this one is in use, and what it holds.
    sessions: Arc<Sessions>,
}

impl Gate {
    pub(crate) fn new(
        config: Arc<Config>,
        agent: Arc<AgentConfig>,
        host: Arc<dyn ToolHost>,
        sessions: Arc<Sessions>,
    ) -> Gate {
        let ended = tokio_util::sync::CancellationToken::new();
        Gate {
            config,
            agent,
            host,
            kept: Default::default(),
            _ending: ended.clone().drop_guard(),
            ended,
            sessions,
        }
    }

    /// The agent as the caller's principal sees it: its tools narrowed by the principal's
    /// (`[keys.NAME] tools`). A request the endpoint did not mark sees no tool.
    pub(crate) fn agent_of(&self, extensions: &rmcp::model::Extensions) -> Cow<'_, AgentConfig> {
        let caller = extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<McpCaller>());
        match caller {
            Some(c) => self.agent.narrowed(&c.scope),
            None => self.agent.narrowed(&Scope {
                tools: Some(Arc::new(globset::GlobSet::empty())),
                ..Scope::default()
            }),
        }
    }

    /// Keeps the session in use while a handler runs (it is not parked under a call whose
    /// client went away). `None` for the `initialize` that opens it.
    fn in_use(&self, extensions: &rmcp::model::Extensions) -> Option<Busy> {
        self.sessions.hold(session_id(extensions)?)
    }
}

/// The `Mcp-Session-Id` a request or notification came with.
fn session_id(extensions: &rmcp::model::Extensions) -> Option<&str> {
    extensions
        .get::<http::request::Parts>()?
        .headers
        .get("mcp-session-id")?
        .to_str()
        .ok()
}

/// The name an MCP client sees each of `all` by (see [`shown`]), computed over every tool of
/// the host, denied and other agents' ones included: a name means the same tool whoever asks.
fn shown_names(all: &[ServerTool], names: EndpointNames) -> Vec<String> {
    let pairs: Vec<(&str, String)> = all
        .iter()
        .map(|t| (t.tool.as_str(), t.spec.name.clone()))
        .collect();
    shown(&pairs, names, plain_name)
}

/// The tools an MCP client of `agent` sees, by the names it sees them by: its exposed ones
/// (denied ones left out).
pub(crate) fn listed(
    agent: &AgentConfig,
    host: &dyn ToolHost,
    names: EndpointNames,
) -> Vec<(String, ServerTool)> {
    let all = host.tools();
    shown_names(&all, names)
        .into_iter()
        .zip(all.iter())
        .filter(|(_, t)| t.verdict != Verdict::Deny && agent.tool_globs.is_match(&t.spec.name))
        .map(|(name, t)| (name, t.clone()))
        .collect()
}

/// What a client's tool list depends on (each listed tool's name and definition), as a
/// digest: a session keeps 8 bytes of it, not a copy of every definition.
fn signature(agent: &AgentConfig, host: &dyn ToolHost, names: EndpointNames) -> u64 {
    use std::hash::{Hash, Hasher};
    let tools: Vec<Tool> = listed(agent, host, names)
        .iter()
        .map(|(name, t)| as_mcp(name, t))
        .collect();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    serde_json::to_vec(&tools).unwrap_or_default().hash(&mut h);
    h.finish()
}

/// A tool as an MCP client sees it, named `name`: an MCP server's definition as the server
/// listed it (title, annotations, output schema, icons, `_meta`); a built-in one from its spec.
fn as_mcp(name: &str, t: &ServerTool) -> Tool {
    if let Some(listed) = &t.definition {
        let mut tool = (**listed).clone();
        tool.name = name.to_string().into();
        return tool;
    }
    let schema = match &*t.spec.parameters {
        Value::Object(o) => o.clone(),
        _ => serde_json::Map::from_iter([("type".to_string(), json!("object"))]),
    };
    Tool::new(
        name.to_string(),
        t.spec.description.clone(),
        Arc::new(schema),
    )
}

/// Whether the calling client declared the sampling capability.
fn can_sample(ctx: &RequestContext<RoleServer>) -> bool {
    ctx.peer
        .peer_info()
        .is_some_and(|i| i.capabilities.sampling.is_some())
}

impl Gate {
    /// The call's context: the MCP session stands for the AAP session (its workspace,
    /// its session-scoped servers) and the key that opened it owns what it delivers.
    pub(super) fn call_context(&self, ctx: &RequestContext<RoleServer>) -> CallContext {
        let parts = ctx.extensions.get::<http::request::Parts>();
        let sid = parts
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none");
        let session_id = super::session_store::session_key(sid);
        CallContext {
            workspace: self.config.server.sandboxes.join(&session_id),
            session_id,
            owner: parts
                .and_then(|p| p.extensions.get::<McpCaller>())
                .and_then(|c| c.owner.clone()),
            // A federated server's question goes to this client, when it can answer.
            elicitor: ask::can_elicit(ctx).then(
                || -> Arc<dyn crate::tools::mcp::elicit::Elicitor> {
                    Arc::new(super::to_client::ClientElicitor {
                        peer: ctx.peer.clone(),
                        ttl: self.agent.approval_ttl,
                    })
                },
            ),
            // And its sampling requests (where the operator allows them) to this client's
            // model, when it can sample; else they are refused.
            sampler: can_sample(ctx).then(|| -> Arc<dyn crate::tools::mcp::sampling::Sampler> {
                Arc::new(super::to_client::ClientSampler {
                    peer: ctx.peer.clone(),
                    ttl: self.agent.approval_ttl,
                    made: Default::default(),
                })
            }),
        }
    }

    /// Where this server is reached, as the client addressed it (for download URLs).
    fn base_url(&self, ctx: &RequestContext<RoleServer>) -> String {
        let host = ctx
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.headers.get(http::header::HOST))
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .unwrap_or_else(|| self.config.server.listen.to_string());
        format!("http://{host}")
    }

    /// Ask the client (elicitation) whether `tool` may run: `None` when granted, else why not.
    async fn ask(
        &self,
        tool: &ServerTool,
        args: &Value,
        ctx: &RequestContext<RoleServer>,
    ) -> Option<String> {
        let subject = Subject {
            what: format!("Tool {}", tool.spec.name),
            question: format!(
                "Allow the tool {} ({}) to run with {}?",
                tool.spec.name, tool.server, args
            ),
            denied: "Tool call denied",
            rule: tool.rule.clone(),
        };
        ask::ask(&subject, self.agent.approval_ttl, ctx).await
    }
}

impl Gate {
    /// `tools/call`: the policy's verdict, then the call through the tool host.
    async fn run_call(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        // This session's own instances (one may start for this call) tell its client.
        self.relay_own(&context);
        let asked = request.name.to_string();
        // By its federated name, or (names = "own") the name it is shown by.
        let all = self.host.tools();
        let own = || {
            let names = shown_names(&all, self.config.mcp_endpoint.names);
            names.iter().position(|n| *n == asked).map(|i| &all[i])
        };
        let found = all.iter().find(|t| t.spec.name == asked);
        let found = match self.config.mcp_endpoint.names {
            EndpointNames::Federated => found,
            EndpointNames::Own => found.or_else(own),
        };
        let Some(tool) = found else {
            crate::metrics::tool(&*self.host, &asked).not_run(crate::metrics::NotRun::Refused);
            return Ok(refused(format!("Unknown tool {asked}.")).into());
        };
        let name = tool.spec.name.clone();
        let started = Instant::now();
        let metrics = crate::metrics::tool(&*self.host, &name);
        if tool.verdict == Verdict::Deny {
            metrics.not_run(crate::metrics::NotRun::Refused);
            log_call(tool, "refused", started.elapsed());
            return Ok(refused(format!(
                "Tool {name} is denied by policy (rule deny = {:?}).",
                tool.rule
            ))
            .into());
        }
        if !self
            .agent_of(&context.extensions)
            .tool_globs
            .is_match(&name)
        {
            metrics.not_run(crate::metrics::NotRun::Refused);
            log_call(tool, "refused", started.elapsed());
            return Ok(refused(format!(
                "Tool {name} is not among agent {}'s tools.",
                self.agent.name
            ))
            .into());
        }
        let args = request.arguments.map(Value::Object).unwrap_or(Value::Null);
        if tool.verdict == Verdict::Ask {
            if let Some(why) = self.ask(tool, &args, &context).await {
                metrics.not_run(crate::metrics::NotRun::Denied);
                log_call(tool, "denied", started.elapsed());
                return Ok(refused(why).into());
            }
        }
        let ctx = self.call_context(&context);
        let timer = metrics.start();
        let call = self.host.call_verbatim(&ctx, &name, args);
        let reply = tokio::select! {
            reply = relay_progress(&context, call) => reply,
            _ = context.ct.cancelled() => {
                drop(timer);
                log_call(tool, "cancelled", started.elapsed());
                return Ok(to_result(ToolOutput::error("Cancelled."), "").into());
            }
        };
        // An MCP server's result goes on as it came; a built-in tool's output is mapped.
        let result = match reply {
            Reply::Mcp(result) => result,
            Reply::Output(out) => to_result(out, &self.base_url(&context)),
        };
        let failed = result.is_error == Some(true);
        timer.done(failed);
        log_call(tool, if failed { "error" } else { "ok" }, started.elapsed());
        Ok(result.into())
    }
}

/// Run `call`, relaying its progress to the client when the request asked for progress.
async fn relay_progress<T>(
    context: &RequestContext<RoleServer>,
    call: impl std::future::Future<Output = T>,
) -> T {
    let Some(token) = context.meta.get_progress_token() else {
        return call.await;
    };
    let (to, mut from) = tokio::sync::mpsc::unbounded_channel::<Progress>();
    let peer = context.peer.clone();
    let forward = tokio::spawn(async move {
        while let Some(p) = from.recv().await {
            let mut param = ProgressNotificationParam::new(token.clone(), p.progress);
            param.total = p.total;
            param.message = p.message;
            if peer.notify_progress(param).await.is_err() {
                break;
            }
        }
    });
    let out = PROGRESS.scope(to, call).await;
    // The sender is gone with the scope: the forwarder sends what is left, then ends.
    let _ = forward.await;
    out
}

/// One line per call: server, tool, verdict, outcome, duration.
fn log_call(tool: &ServerTool, outcome: &str, took: Duration) {
    tracing::info!(
        server = %tool.server,
        tool = %tool.tool,
        verdict = %crate::telemetry::snake(&tool.verdict),
        outcome,
        duration_ms = took.as_millis() as u64,
        "mcp endpoint tool call"
    );
}

impl ServerHandler for Gate {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(self.capabilities())
            .with_server_info(Implementation::new("turnstile", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let _busy = self.in_use(&context.extensions);
        let agent = self.agent_of(&context.extensions);
        let tools = listed(&agent, &*self.host, self.config.mcp_endpoint.names);
        Ok(ListToolsResult::with_all_items(
            tools.iter().map(|(name, t)| as_mcp(name, t)).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let _busy = self.in_use(&context.extensions);
        // rmcp moves each request's handler future (the largest of these methods' futures)
        // into a spawned task: boxed, the call's state is not copied along every request.
        Box::pin(self.run_call(request, context)).await
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let _busy = self.in_use(&context.extensions);
        Ok(Box::pin(Gate::list_resources(self, &context)).await)
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let _busy = self.in_use(&context.extensions);
        Ok(Box::pin(Gate::list_resource_templates(self, &context)).await)
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let _busy = self.in_use(&context.extensions);
        Ok(Box::pin(Gate::read_resource(self, request.uri, &context))
            .await?
            .into())
    }

    async fn list_prompts(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListPromptsResult, ErrorData> {
        let _busy = self.in_use(&context.extensions);
        Ok(Box::pin(Gate::list_prompts(self, &context)).await)
    }

    async fn get_prompt(
        &self,
        request: GetPromptRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<GetPromptResponse, ErrorData> {
        let _busy = self.in_use(&context.extensions);
        Ok(Box::pin(Gate::get_prompt(self, request, &context))
            .await?
            .into())
    }

    async fn complete(
        &self,
        request: CompleteRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CompleteResult, ErrorData> {
        let _busy = self.in_use(&context.extensions);
        Box::pin(Gate::complete(self, request, &context)).await
    }

    async fn subscribe(
        &self,
        request: SubscribeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _busy = self.in_use(&context.extensions);
        Box::pin(Gate::subscribe(self, request.uri, &context)).await?;
        // Its subscriptions live in this server: the session must not be parked.
        if let Some(id) = session_id(&context.extensions) {
            self.sessions.pin(id);
        }
        Ok(())
    }

    #[allow(deprecated)]
    async fn set_level(
        &self,
        request: SetLevelRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        let _busy = self.in_use(&context.extensions);
        Box::pin(Gate::set_level(self, request, &context)).await?;
        // As is the level it set.
        if let Some(id) = session_id(&context.extensions) {
            self.sessions.pin(id);
        }
        Ok(())
    }

    async fn unsubscribe(
        &self,
        request: UnsubscribeRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Gate::unsubscribe(self, &request.uri);
        Ok(())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // Tell the client when its tool list changes (a child's list_changed, re-filtered).
        let peer = context.peer.clone();
        let agent = Arc::new(self.agent_of(&context.extensions).into_owned());
        let host = self.host.clone();
        let names = self.config.mcp_endpoint.names;
        let mut generation = host.generation();
        let mut last = signature(&agent, &*host, names);
        let ended = self.ended.clone();
        self.relay_catalog(peer.clone());
        if let Some(id) = session_id(&context.extensions) {
            // A parked session restored: what changed while no one relayed it is told now
            // (the tool list only if it did; the servers' resources and prompts may have).
            let before = self.sessions.shown(id, last);
            let restored = context.extensions.get::<SessionRestoreMarker>().is_some();
            if restored {
                if before.is_some_and(|b| b != last) {
                    let _ = peer.notify_tool_list_changed().await;
                }
                let caps = self.capabilities();
                if caps.resources.is_some() {
                    let _ = peer.notify_resource_list_changed().await;
                }
                if caps.prompts.is_some() {
                    let _ = peer.notify_prompt_list_changed().await;
                }
            }
        }
        let sessions = self.sessions.clone();
        let sid = session_id(&context.extensions).map(str::to_string);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = generation.changed() => if changed.is_err() { break },
                    _ = ended.cancelled() => break,
                }
                if peer.is_transport_closed() {
                    break;
                }
                let now = signature(&agent, &*host, names);
                if now == last {
                    continue;
                }
                last = now;
                if let Some(id) = &sid {
                    sessions.shown(id, now);
                }
                if peer.notify_tool_list_changed().await.is_err() {
                    break;
                }
            }
        });
    }
}

//! One MCP session's server: the agent's federated tools under the operator's policy.
//!
//! `tools/list` is the agent's exposed tools (its `tools` globs, minus `deny`). `tools/call`
//! refuses what is not listed (a denied tool: "denied by policy" with its rule), runs `trust`
//! tools, and turns `ask` into an elicitation to the calling client when it declared the
//! capability (accept runs the call; decline or cancel refuse it, with the client's reason when
//! it gave one); without the capability an `ask` tool is an error result naming the rule. Calls
//! go through the tool host (the same supervisors, timeouts and result mapping as agent calls);
//! a client's `notifications/cancelled` drops the call, which cancels it on the child, and the
//! child's progress for a call that asked for it goes to the client.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, ClientResult, ElicitRequest, ElicitRequestParams,
    ElicitationAction, Implementation, ListToolsResult, PaginatedRequestParams,
    ProgressNotificationParam, ServerCapabilities, ServerConfig, ServerRequest, Tool,
};
use rmcp::service::{NotificationContext, RequestContext};
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::{json, Value};

use super::content::{refused, to_result};
use crate::config::{AgentConfig, Config, Verdict};
use crate::tools::relay::{Progress, PROGRESS};
use crate::tools::{CallContext, ServerTool, ToolHost, ToolOutput};

/// Who opened the session (put into each request's extensions by the endpoint).
#[derive(Debug, Clone)]
pub struct McpCaller {
    pub owner: Option<String>,
}

/// The server of one MCP session.
pub struct Gate {
    pub config: Arc<Config>,
    pub agent: AgentConfig,
    pub host: Arc<dyn ToolHost>,
}

/// The tools an MCP client of `agent` sees: its exposed ones (denied ones left out).
pub fn listed(agent: &AgentConfig, host: &dyn ToolHost) -> Vec<ServerTool> {
    host.tools()
        .iter()
        .filter(|t| t.verdict != Verdict::Deny && agent.tool_globs.is_match(&t.spec.name))
        .cloned()
        .collect()
}

/// What a client's tool list depends on: each listed tool's name and schema.
fn signature(agent: &AgentConfig, host: &dyn ToolHost) -> Vec<(String, String)> {
    listed(agent, host)
        .iter()
        .map(|t| (t.spec.name.clone(), t.spec.parameters.to_string()))
        .collect()
}

fn as_mcp(t: &ServerTool) -> Tool {
    let schema = match &*t.spec.parameters {
        Value::Object(o) => o.clone(),
        _ => serde_json::Map::from_iter([("type".to_string(), json!("object"))]),
    };
    Tool::new(
        t.spec.name.clone(),
        t.spec.description.clone(),
        Arc::new(schema),
    )
}

impl Gate {
    /// The call's context: the MCP session stands for the AAP session (its workspace,
    /// its session-scoped servers) and the key that opened it owns what it delivers.
    fn call_context(&self, ctx: &RequestContext<RoleServer>) -> CallContext {
        let parts = ctx.extensions.get::<http::request::Parts>();
        let sid = parts
            .and_then(|p| p.headers.get("mcp-session-id"))
            .and_then(|v| v.to_str().ok())
            .unwrap_or("none");
        let session_id = super::session_key(sid);
        CallContext {
            workspace: self.config.server.sandboxes.join(&session_id),
            session_id,
            owner: parts
                .and_then(|p| p.extensions.get::<McpCaller>())
                .and_then(|c| c.owner.clone()),
            // A federated server's question goes to this client, when it can answer.
            elicitor: ctx
                .peer
                .peer_info()
                .is_some_and(|i| i.capabilities.elicitation.is_some())
                .then(|| -> Arc<dyn crate::tools::mcp::elicit::Elicitor> {
                    Arc::new(super::elicit_relay::ClientElicitor {
                        peer: ctx.peer.clone(),
                        ttl: self.agent.approval_ttl,
                    })
                }),
            // No turn to answer from or count in: a federated server's sampling is refused.
            sampler: None,
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
        let declared = ctx
            .peer
            .peer_info()
            .is_some_and(|i| i.capabilities.elicitation.is_some());
        if !declared {
            return Some(format!(
                "Tool {} needs permission (policy rule ask = {:?}) and this MCP client did not declare the elicitation capability, so none can be asked; use a client that supports elicitation, or have the operator trust the tool.",
                tool.spec.name, tool.rule
            ));
        }
        let schema = serde_json::from_value(json!({
            "type": "object",
            "properties": {"reason": {"type": "string", "description": "Why (optional)"}},
        }))
        .ok()?;
        let params = ElicitRequestParams::FormElicitationParams {
            meta: None,
            message: format!(
                "Allow the tool {} ({}) to run with {}? (policy rule ask = {:?})",
                tool.spec.name, tool.server, args, tool.rule
            ),
            requested_schema: schema,
        };
        let request = ServerRequest::ElicitRequest(ElicitRequest::new(params));
        let ttl = self.agent.approval_ttl;
        let answer = tokio::time::timeout(ttl, ctx.peer.send_request(request)).await;
        let result = match answer {
            Err(_) => return Some("Tool call denied: approval expired".into()),
            Ok(Err(e)) => return Some(format!("Tool call denied: the elicitation failed ({e})")),
            Ok(Ok(ClientResult::ElicitResult(r))) => r,
            Ok(Ok(_)) => {
                return Some(
                    "Tool call denied: the client's answer was not an elicitation result".into(),
                )
            }
        };
        let reason = result
            .content
            .as_ref()
            .and_then(|c| c.get("reason"))
            .and_then(Value::as_str)
            .filter(|r| !r.is_empty())
            .map(str::to_string);
        match result.action {
            ElicitationAction::Accept => None,
            _ => Some(match reason {
                Some(r) => format!("Tool call denied: {r}"),
                None => "Tool call denied".into(),
            }),
        }
    }
}

/// Run `call`, relaying its progress to the client when the request asked for progress.
async fn relay_progress(
    context: &RequestContext<RoleServer>,
    call: impl std::future::Future<Output = ToolOutput>,
) -> ToolOutput {
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
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new("turnstile", env!("CARGO_PKG_VERSION")))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = listed(&self.agent, &*self.host);
        Ok(ListToolsResult::with_all_items(
            tools.iter().map(as_mcp).collect(),
        ))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let name = request.name.to_string();
        let all = self.host.tools();
        let Some(tool) = all.iter().find(|t| t.spec.name == name) else {
            crate::metrics::tool(&*self.host, &name).not_run(crate::metrics::NotRun::Refused);
            return Ok(refused(format!("Unknown tool {name}.")).into());
        };
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
        if !self.agent.tool_globs.is_match(&name) {
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
        let call = self.host.call(&ctx, &name, args);
        let out = tokio::select! {
            out = relay_progress(&context, call) => out,
            _ = context.ct.cancelled() => {
                drop(timer);
                log_call(tool, "cancelled", started.elapsed());
                return Ok(to_result(ToolOutput::error("Cancelled."), "").into());
            }
        };
        timer.done(out.is_error);
        log_call(
            tool,
            if out.is_error { "error" } else { "ok" },
            started.elapsed(),
        );
        Ok(to_result(out, &self.base_url(&context)).into())
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        // Tell the client when its tool list changes (a child's list_changed, re-filtered).
        let peer = context.peer.clone();
        let agent = self.agent.clone();
        let host = self.host.clone();
        let mut generation = host.generation();
        let mut last = signature(&agent, &*host);
        tokio::spawn(async move {
            while generation.changed().await.is_ok() {
                if peer.is_transport_closed() {
                    break;
                }
                let now = signature(&agent, &*host);
                if now == last {
                    continue;
                }
                last = now;
                if peer.notify_tool_list_changed().await.is_err() {
                    break;
                }
            }
        });
    }
}

//! The tool host: the server-side tools the engine may offer and run.
//!
//! The engine sees server tools only through [`ToolHost`]: a snapshot of what exists (with the
//! operator's verdict for each) and a way to call one. The [`toolbox::Toolbox`] the server runs
//! puts MCP federation ([`mcp`]) and the built-in tools ([`deliver`]) behind it; client tools
//! never come here (the client runs them).

pub mod deliver;
pub mod mcp;
pub mod toolbox;

pub mod relay;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::config::Verdict;
use crate::log::FileRef;
use crate::message::ToolSpec;

/// A server-side tool as the host offers it.
#[derive(Debug, Clone)]
pub struct ServerTool {
    pub spec: ToolSpec,
    /// `builtin` for built-in tools, else the MCP server's name.
    pub server: String,
    /// The tool's own name on its server.
    pub tool: String,
    /// The operator's verdict, and the rule that decided it.
    pub verdict: Verdict,
    pub rule: String,
    /// The tool as its MCP server listed it (title, annotations, output schema, icons, `_meta`),
    /// for `/mcp` to pass on; `None` for a built-in tool.
    pub definition: Option<Arc<rmcp::model::Tool>>,
}

/// What a tool call gave back.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// A string or AAP content blocks.
    pub content: Value,
    pub is_error: bool,
    pub files: Vec<FileRef>,
}

impl ToolOutput {
    pub fn text(s: impl Into<String>) -> ToolOutput {
        ToolOutput {
            content: Value::String(s.into()),
            is_error: false,
            files: vec![],
        }
    }

    pub fn error(s: impl Into<String>) -> ToolOutput {
        ToolOutput {
            content: Value::String(s.into()),
            is_error: true,
            files: vec![],
        }
    }
}

/// What a call made for an MCP client gave back (see [`ToolHost::call_verbatim`]).
#[derive(Debug)]
pub enum Reply {
    /// An MCP server's own result, as it sent it: every kind of content block, structured
    /// content, `_meta`.
    Mcp(rmcp::model::CallToolResult),
    /// A built-in tool's output, or why the call did not reach a server.
    Output(ToolOutput),
}

/// Where a call runs.
#[derive(Clone)]
pub struct CallContext {
    pub session_id: String,
    /// The session's workspace folder (`sandboxes/<session id>/`).
    pub workspace: std::path::PathBuf,
    /// The API key owner of the session (files it delivers belong to it).
    pub owner: Option<String>,
    /// Who can answer an MCP server's elicitation during the call (`None`: no one; it is
    /// declined with a logged reason).
    pub elicitor: Option<Arc<dyn mcp::elicit::Elicitor>>,
    /// Who answers an MCP server's sampling requests during the call: the turn's upstream, or
    /// the `/mcp` client that made the call (`None`: refused, for a `/mcp` client that cannot
    /// sample).
    pub sampler: Option<Arc<dyn mcp::sampling::Sampler>>,
}

/// The server-side tools of this process.
pub trait ToolHost: Send + Sync + 'static {
    /// Every tool that exists now, denied ones included (callers filter by verdict).
    fn tools(&self) -> Arc<Vec<ServerTool>>;

    /// Run one call. Failures are error outputs, never panics; cancelling is dropping the future.
    fn call<'a>(
        &'a self,
        ctx: &'a CallContext,
        name: &'a str,
        input: Value,
    ) -> BoxFuture<'a, ToolOutput>;

    /// Run one call for a client that speaks MCP itself (`/mcp`): as [`ToolHost::call`], but an
    /// MCP server's result is given back as the server sent it rather than mapped for a model.
    fn call_verbatim<'a>(
        &'a self,
        ctx: &'a CallContext,
        name: &'a str,
        input: Value,
    ) -> BoxFuture<'a, Reply> {
        Box::pin(async move { Reply::Output(self.call(ctx, name, input).await) })
    }

    /// A session is gone: release what was kept for it (session-scoped servers).
    fn session_closed<'a>(&'a self, _session_id: &'a str) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// A counter that moves whenever the tool set changes (a server's list_changed).
    fn generation(&self) -> tokio::sync::watch::Receiver<u64> {
        tokio::sync::watch::channel(0).1
    }

    /// The MCP federation, whose servers' resources and prompts `/mcp` passes through (none
    /// by default).
    fn mcp_host(&self) -> Option<&mcp::McpHost> {
        None
    }

    /// Every MCP server's state, for `GET /status` and `/readyz` (none by default).
    fn servers(&self) -> Vec<mcp::ServerReport> {
        Vec::new()
    }

    /// The process is stopping: stop everything (no child may outlive it).
    fn shutdown(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// A host with no server tools.
pub struct NoTools;

impl ToolHost for NoTools {
    fn tools(&self) -> Arc<Vec<ServerTool>> {
        Arc::new(Vec::new())
    }

    fn call<'a>(
        &'a self,
        _: &'a CallContext,
        name: &'a str,
        _: Value,
    ) -> BoxFuture<'a, ToolOutput> {
        Box::pin(async move { ToolOutput::error(format!("unknown tool {name}")) })
    }
}

/// Tool metrics are labelled by the server and tool a federated name comes from.
impl crate::metrics::ToolDirectory for dyn ToolHost {
    fn labels_of(&self, name: &str) -> Option<crate::metrics::ToolLabels> {
        let listing = self.tools();
        let t = listing.iter().find(|t| t.spec.name == name)?;
        Some(crate::metrics::ToolLabels {
            server: t.server.clone(),
            tool: t.tool.clone(),
            verdict: match t.verdict {
                Verdict::Trust => "trust",
                Verdict::Ask => "ask",
                Verdict::Deny => "deny",
            },
        })
    }
}

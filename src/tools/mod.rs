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

mod call;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::config::Verdict;

pub use call::{CallContext, Reply, ServerTool, ToolOutput};

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

    /// A reload: the servers and the policy of `config` from now on (see
    /// `tools/mcp/reconfigure.rs`). Nothing to do by default.
    fn reconfigure(&self, _config: Arc<crate::config::Config>) -> BoxFuture<'_, ()> {
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

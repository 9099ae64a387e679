//! The tool host the server runs: the federated MCP tools, then the built-in tools
//! (`deliver_file`), each with the policy's verdict.
//!
//! MCP tools are all named `mcp__<server>__<tool>`, so a built-in name never collides with one.

use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use serde_json::Value;

use super::mcp::{FederationError, McpHost, ServerProgress, ServerReport, StartReport};
use super::{deliver, CallContext, Reply, ServerTool, ToolHost, ToolOutput};
use crate::config::Config;
use crate::files::FileStore;
use crate::sync::lock;

/// MCP federation plus the built-in tools.
pub struct Toolbox {
    mcp: Arc<McpHost>,
    /// The built-in tools, with their verdicts (listed after the MCP ones; a reload decides
    /// them again).
    builtins: Mutex<Vec<ServerTool>>,
    /// The file store `deliver_file` writes to (`None`: it answers with an error).
    files: Option<FileStore>,
    /// The last listing, and the MCP listing it was made from.
    listing: Mutex<Listing>,
}

/// A listing of every tool, made from one MCP listing.
struct Listing {
    mcp: Arc<Vec<ServerTool>>,
    all: Arc<Vec<ServerTool>>,
}

impl Toolbox {
    /// Start every MCP server of the config (see [`McpHost::start`]) and add the built-in tools.
    pub async fn start(
        config: Arc<Config>,
        files: Option<FileStore>,
    ) -> Result<(Arc<Toolbox>, StartReport), FederationError> {
        Self::start_reporting(config, files, &|_| {}).await
    }

    /// [`Toolbox::start`], telling `progress` as each MCP server's first attempt ends.
    pub async fn start_reporting(
        config: Arc<Config>,
        files: Option<FileStore>,
        progress: &(dyn Fn(ServerProgress) + Sync),
    ) -> Result<(Arc<Toolbox>, StartReport), FederationError> {
        let (mcp, report) = McpHost::start_reporting(config.clone(), progress).await?;
        Ok((Arc::new(Toolbox::new(&config, mcp, files)), report))
    }

    fn new(config: &Config, mcp: Arc<McpHost>, files: Option<FileStore>) -> Toolbox {
        let builtins = builtins(config);
        let listing = Mutex::new(Listing {
            mcp: Arc::new(Vec::new()),
            all: Arc::new(builtins.clone()),
        });
        let toolbox = Toolbox {
            mcp,
            builtins: Mutex::new(builtins),
            files,
            listing,
        };
        toolbox.listing();
        toolbox
    }

    /// Every tool as `check` and `GET /tools` show it: the MCP tools, then the built-in ones.
    pub fn listing(&self) -> Arc<Vec<ServerTool>> {
        let mcp = self.mcp.listing();
        let mut listing = lock(&self.listing);
        if !Arc::ptr_eq(&listing.mcp, &mcp) {
            let builtins = lock(&self.builtins);
            let mut all = Vec::with_capacity(mcp.len() + builtins.len());
            all.extend(mcp.iter().cloned());
            all.extend(builtins.iter().cloned());
            *listing = Listing {
                mcp,
                all: Arc::new(all),
            };
        }
        listing.all.clone()
    }
}

/// The built-in tools with the verdicts `config`'s policy gives them.
fn builtins(config: &Config) -> Vec<ServerTool> {
    let decision = super::mcp::policy::decide(&config.policy, deliver::NAME);
    vec![ServerTool {
        spec: deliver::spec(),
        server: "builtin".into(),
        tool: deliver::NAME.into(),
        verdict: decision.verdict,
        rule: decision.rule,
        definition: None,
    }]
}

impl ToolHost for Toolbox {
    fn tools(&self) -> Arc<Vec<ServerTool>> {
        self.listing()
    }

    fn call<'a>(
        &'a self,
        ctx: &'a CallContext,
        name: &'a str,
        input: Value,
    ) -> BoxFuture<'a, ToolOutput> {
        if name != deliver::NAME {
            return self.mcp.call(ctx, name, input);
        }
        match &self.files {
            Some(files) => deliver::call(files, ctx, input),
            None => {
                Box::pin(async { ToolOutput::error("deliver_file: no file store is configured") })
            }
        }
    }

    fn call_verbatim<'a>(
        &'a self,
        ctx: &'a CallContext,
        name: &'a str,
        input: Value,
    ) -> BoxFuture<'a, Reply> {
        if name != deliver::NAME {
            return self.mcp.call_verbatim(ctx, name, input);
        }
        let call = self.call(ctx, name, input);
        Box::pin(async move { Reply::Output(call.await) })
    }

    fn session_closed<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, ()> {
        self.mcp.session_closed(session_id)
    }

    fn generation(&self) -> tokio::sync::watch::Receiver<u64> {
        self.mcp.generation()
    }

    fn mcp_host(&self) -> Option<&McpHost> {
        Some(&self.mcp)
    }

    fn servers(&self) -> Vec<ServerReport> {
        self.mcp.status()
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        self.mcp.shutdown()
    }

    fn reconfigure(&self, config: Arc<Config>) -> BoxFuture<'_, ()> {
        // The built-ins first: the MCP side federates again at its end, which makes a new
        // MCP listing, so the next `listing()` is made with both.
        *lock(&self.builtins) = builtins(&config);
        Box::pin(async move { self.mcp.reconfigure(config).await })
    }
}

/// The federation alone as a tool host (the [`Toolbox`] adds the built-in tools to it).
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
                Ok(result) => super::mcp::content::to_output(result),
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
        self.tool_generation()
    }

    fn servers(&self) -> Vec<ServerReport> {
        self.status()
    }

    fn session_closed<'a>(&'a self, session_id: &'a str) -> BoxFuture<'a, ()> {
        self.close_session(session_id)
    }

    fn shutdown(&self) -> BoxFuture<'_, ()> {
        self.stop_all()
    }
}

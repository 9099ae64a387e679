//! One call of a server-side tool: where it runs ([`CallContext`]), who answers what its MCP
//! server asks during it (an [`Elicitor`], a [`Sampler`]), and what it gives back.

use std::sync::Arc;

use futures_util::future::BoxFuture;
#[allow(deprecated)]
use rmcp::model::{CreateMessageRequestParams, CreateMessageResult};
use serde_json::{Map, Value};

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
    pub elicitor: Option<Arc<dyn Elicitor>>,
    /// Who answers an MCP server's sampling requests during the call: the turn's upstream, or
    /// the `/mcp` client that made the call (`None`: refused, for a `/mcp` client that cannot
    /// sample).
    pub sampler: Option<Arc<dyn Sampler>>,
}

/// A server's question, as whoever answers it sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    /// The `[mcp_servers.X]` name.
    pub server: String,
    pub message: String,
    /// The requested schema: an object of primitive-typed properties.
    pub schema: Value,
}

/// An answer to a [`Question`].
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    Accept(Map<String, Value>),
    Decline,
    Cancel,
}

/// Someone who can answer a session's elicitations.
pub trait Elicitor: Send + Sync {
    /// Ask; `Err` says why no answer can come (then the question is declined).
    fn ask(&self, question: Question) -> BoxFuture<'static, Result<Answer, String>>;
}

/// What a server may ask for: its `[mcp_servers.X]` sampling keys.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub server: String,
    /// `sampling_max_tokens`: the cap on each request's `maxTokens`.
    pub max_tokens: u32,
    /// `sampling_calls_per_turn`.
    pub calls_per_turn: u32,
}

/// Someone who can answer a call's sampling requests.
#[allow(deprecated)]
pub trait Sampler: Send + Sync {
    /// Answer one request within `budget`; `Err` is the refusal or failure the server is told.
    fn sample<'a>(
        &'a self,
        budget: &'a Budget,
        request: CreateMessageRequestParams,
    ) -> BoxFuture<'a, Result<CreateMessageResult, String>>;
}

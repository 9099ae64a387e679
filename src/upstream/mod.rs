//! Upstream model providers: one trait, one implementation per wire format.
//!
//! The engine calls [`Provider::complete`] once per model step. Text and thinking fragments are
//! pushed into a [`DeltaSink`] as they arrive (so streaming adds no channel hop); the finished
//! step comes back as a [`ModelOutput`]. Cancelling a step is dropping its future.

pub mod anthropic;
pub mod attempt;
pub mod breaker;
pub mod echo;
mod errors;
pub mod openai;
pub mod router;
pub mod transport;

use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::message::{Message, SignedThinking, ToolCall, Usage};

/// A tool offered to the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDef {
    pub name: String,
    pub description: String,
    /// JSON Schema of the input object (the tool's own, shared).
    pub parameters: std::sync::Arc<Value>,
}

/// One model call.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    pub model: String,
    /// The system prompt, kept apart from `messages` (Anthropic wants it apart).
    pub system: Option<String>,
    /// The conversation, without system messages.
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDef>,
    pub max_tokens: Option<u32>,
    /// Ask the model for its reasoning where the provider can return it.
    pub thinking: bool,
    /// Generation parameters a caller set (an MCP server's sampling request); the provider's
    /// defaults where unset.
    pub tuning: Tuning,
}

/// Generation parameters beyond the model and its limit, each sent only when set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tuning {
    pub temperature: Option<f32>,
    /// Sequences that end the output (OpenAI `stop`, Anthropic `stop_sequences`).
    pub stop: Vec<String>,
}

/// Receives fragments of the model's output while it streams.
pub trait DeltaSink: Send {
    fn text(&mut self, fragment: &str);
    fn thinking(&mut self, fragment: &str);
}

/// A sink that drops everything: for callers that only want the finished output.
pub struct NoDeltas;

impl DeltaSink for NoDeltas {
    fn text(&mut self, _: &str) {}
    fn thinking(&mut self, _: &str) {}
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelStop {
    EndTurn,
    ToolUse,
    MaxTokens,
    Refusal,
}

/// The finished output of one model call.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelOutput {
    pub thinking: String,
    /// The provider's signed thinking blocks, in order, to be sent back to it (Anthropic; empty
    /// for the others).
    pub signed_thinking: Vec<SignedThinking>,
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    pub stop: ModelStop,
}

/// What went wrong talking to the upstream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpstreamErrorKind {
    /// Could not connect or send the request.
    Connect,
    /// The upstream answered with a non-success HTTP status.
    Status(u16),
    /// The response stream broke off before it finished.
    Stream,
    /// The upstream sent something that is not its protocol.
    Protocol,
    /// The whole call took longer than `timeout_s`.
    Timeout,
}

/// An upstream failure, with whether trying the same call again may help.
///
/// `message` is what a client may see (in `turn.failed`): what failed, the status and the
/// upstream's error type, never the upstream's address, headers or body. `detail` holds those,
/// for the server's log only (the `Display` form, which the engine logs with the turn id).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}{}", detail.as_ref().map(|d| format!(" [{d}]")).unwrap_or_default())]
pub struct UpstreamError {
    pub kind: UpstreamErrorKind,
    pub message: String,
    /// For the log: the address, the cause's chain, an excerpt of the body.
    pub detail: Option<String>,
    pub retryable: bool,
    /// The upstream's `Retry-After`, when it sent one.
    pub retry_after: Option<Duration>,
}

impl UpstreamError {
    pub fn new(kind: UpstreamErrorKind, message: impl Into<String>) -> Self {
        let retryable = match &kind {
            UpstreamErrorKind::Connect | UpstreamErrorKind::Stream => true,
            UpstreamErrorKind::Status(s) => *s == 429 || *s >= 500,
            UpstreamErrorKind::Protocol | UpstreamErrorKind::Timeout => false,
        };
        UpstreamError {
            kind,
            message: message.into(),
            detail: None,
            retryable,
            retry_after: None,
        }
    }

    /// With what only the server's log may show.
    pub fn with_detail(mut self, detail: impl Into<String>) -> Self {
        self.detail = Some(detail.into());
        self
    }
}

/// A model provider.
pub trait Provider: Send + Sync + 'static {
    /// A short name for logs (`openai`, `anthropic`, `echo`).
    fn name(&self) -> &'static str;

    /// Run one model call, pushing fragments into `sink` as they arrive.
    fn complete<'a>(
        &'a self,
        req: &'a ModelRequest,
        sink: &'a mut dyn DeltaSink,
    ) -> BoxFuture<'a, Result<ModelOutput, UpstreamError>>;
}

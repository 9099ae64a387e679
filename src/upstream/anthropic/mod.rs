//! The Anthropic Messages provider: `POST {base_url}/messages` with `stream: true`.
//!
//! The response is read frame by frame through the shared
//! [`SseParser`](crate::outbound::event_stream::SseParser) (the HTTP side is in [`transport`](super::transport)); text and
//! thinking fragments go to the [`DeltaSink`] as soon as their event is parsed. The request is
//! built in [`request`], the answer read in [`stream`]. Events are
//! dispatched on their data's `type` (the `event:` line repeats it); unknown event, block and
//! delta types are ignored, as the API's versioning policy asks.
//!
//! Mapping of the history ([`Message`]) to the wire:
//! - `req.system` goes to the top-level `system`, as one text block (omitted when `None` or
//!   empty); a `System` message found in the history is appended to it (after a blank line);
//! - user: text blocks → `text`, images → `image` with a `base64` source (from a `data:` URI; a
//!   non-base64 `data:` URI is percent-decoded and re-encoded) or a `url` source (other URLs);
//! - assistant: text → `text`, tool use → `tool_use` (`input` must be an object: anything else is
//!   sent as `{}`); thinking → the signed `thinking` / `redacted_thinking` blocks it came as
//!   (kept in the log with its `agent.thinking`), verbatim, only when thinking is on for the call
//!   (unsigned thinking, e.g. another provider's, and images are dropped); in each assistant turn
//!   the thinking blocks go first, as the API requires;
//! - tool: a `tool_result` block (`content` is the text; blocks with images are sent as a list of
//!   `text`/`image` blocks) in a USER turn;
//! - consecutive turns of the same role are merged into one (the API wants strictly alternating
//!   roles), and in a user turn the `tool_result` blocks are moved first (the API wants them
//!   before any text); empty text blocks are dropped (the API rejects them) and a turn left
//!   with no blocks is left out; a turn that is one text block is sent as a plain string;
//! - prompt caching: `cache_control: {type: ephemeral}` on the system block, on the last tool
//!   and on the last block (never a thinking block) of the turn before the newest one, the
//!   last stable turn: three breakpoints of the four the API allows. Each request reads the
//!   prefix the one before it wrote.
//!
//! Choices where the brief or the wire is loose:
//! - `max_tokens` is `req.max_tokens` when set, else the provider's default;
//! - with `req.thinking`, `thinking: {type: enabled, budget_tokens}` is sent, budget =
//!   `min(max_tokens / 2, 8192)` but at least 1024, and `max_tokens` is raised to at least
//!   budget + 1024. While a tool loop is running (the last user turn holds `tool_result`s) the
//!   API requires the last assistant turn to start with its signed thinking: thinking stays on
//!   when that turn has signed thinking, and is left off for the call when it has none (an
//!   answer given with thinking off, or logged before signatures were kept; the API's own
//!   advice: "To avoid this requirement, disable `thinking`");
//! - input usage is `input_tokens` + `cache_creation_input_tokens` + `cache_read_input_tokens`
//!   (all of the prompt); output usage is the last `output_tokens` seen (it is cumulative);
//! - reading: a `thinking` block's text is thinking (streamed to the sink), its
//!   `signature_delta`s make its signature; a `redacted_thinking` block comes whole; the
//!   output's `signed_thinking` lists both in the answer's order (a thinking block with no
//!   signature is kept as text only);
//! - a stop reason other than `max_tokens`/`refusal`/`model_context_window_exceeded` with
//!   tool calls in the output is reported as [`ModelStop::ToolUse`]; unknown ones as `EndTurn`;
//! - with `max_tokens`, a tool call whose input JSON does not parse (cut by the limit) is dropped,
//!   not a protocol error;
//! - `error` events: `overloaded_error` → `Status(529)`, `api_error` → `Status(500)`,
//!   `rate_limit_error` → `Status(429)`, `timeout_error` → `Status(504)` (all retryable); the
//!   request-side types map to their 4xx (not retryable); an unknown type is a non-retryable
//!   `Status(500)`;
//! - a stream that ends (cleanly) without `message_stop` but after a `message_delta` with a stop
//!   reason is accepted;
//! - a `2xx` `application/json` answer (a gateway that ignored `stream`) is read as a whole
//!   message;
//! - an invalid base URL or API key (not a valid header value) is a non-retryable `Connect` error.

use std::time::Duration;

use futures_util::future::BoxFuture;
use http::HeaderName;

use super::transport::Endpoint;
use super::{DeltaSink, ModelOutput, ModelRequest, Provider, UpstreamError};
use messages_request::request_body;
use stream::{error_message, Acc};

mod messages_request;
mod stream;

/// The API version this provider speaks.
pub const ANTHROPIC_VERSION: &str = "2023-06-01";
/// The default `max_tokens` when neither the request nor the config sets one.
pub const DEFAULT_MAX_TOKENS: u32 = 4096;

static ANTHROPIC_VERSION_HEADER: HeaderName = HeaderName::from_static("anthropic-version");

/// An Anthropic Messages upstream.
pub struct Anthropic {
    /// `{base_url}/messages`, with the key as `x-api-key`.
    endpoint: Endpoint,
    max_tokens: u32,
}

impl Anthropic {
    /// `base_url` without a trailing slash, e.g. `https://api.anthropic.com/v1`. An empty key is
    /// no key. `timeout` bounds each whole call, from connecting to the last byte. `max_tokens`
    /// is sent when the request sets none (the API requires it; 0 counts as 1).
    pub fn new(
        base_url: String,
        api_key: Option<String>,
        timeout: Duration,
        max_tokens: u32,
    ) -> Anthropic {
        Anthropic {
            endpoint: Endpoint::new(
                base_url,
                "/messages",
                HeaderName::from_static("x-api-key"),
                "",
                api_key,
                timeout,
            ),
            max_tokens: max_tokens.max(1),
        }
    }

    /// Sends these headers on every request too (`[upstream] headers`, expanded).
    pub fn with_headers(mut self, headers: Vec<(http::HeaderName, http::HeaderValue)>) -> Self {
        self.endpoint.set_headers(headers);
        self
    }

    /// The base URL this provider talks to.
    pub fn base_url(&self) -> &str {
        self.endpoint.base_url()
    }
}

impl Provider for Anthropic {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn complete<'a>(
        &'a self,
        req: &'a ModelRequest,
        sink: &'a mut dyn DeltaSink,
    ) -> BoxFuture<'a, Result<ModelOutput, UpstreamError>> {
        Box::pin(async move {
            let body = request_body(req, self.max_tokens);
            let headers = [(&ANTHROPIC_VERSION_HEADER, ANTHROPIC_VERSION)];
            self.endpoint
                .call::<Acc>(&body, &headers, error_message, sink)
                .await
        })
    }
}

#[cfg(test)]
mod tests;

//! The wire of the streamable-HTTP transport as this client speaks it: header names and media
//! types, the errors rmcp's transport sees, and the SSE event type it takes.

use std::time::Duration;

use futures_util::Stream;
use http::StatusCode;
use rmcp::transport::common::client_side_sse::BoxedSseResponse;
use rmcp::transport::streamable_http_client::StreamableHttpError;

pub(super) const JSON: &str = "application/json";
pub(super) const EVENT_STREAM: &str = "text/event-stream";
pub(super) const SESSION_ID: &str = "mcp-session-id";
pub(super) const LAST_EVENT_ID: &str = "last-event-id";
/// Headers the client sets itself; a custom header may not replace them (as in rmcp's clients).
pub(super) const RESERVED: [&str; 3] = ["accept", SESSION_ID, LAST_EVENT_ID];
/// How long a TCP connect may take before the request fails, rather than hang on a dead host.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// `sse_stream::Sse`, which rmcp does not re-export (and turnstile does not depend on):
/// named as the `Ok` item of rmcp's public SSE stream alias.
pub(super) type Sse = <<BoxedSseResponse as Stream>::Item as OkOf>::Ok;
pub(super) trait OkOf {
    type Ok;
}
impl<T, E> OkOf for Result<T, E> {
    type Ok = T;
}

pub(super) type Error = StreamableHttpError<HyperMcpError>;

/// Why a request to a remote MCP server failed below the protocol: rmcp's `Client` errors.
#[derive(Debug, thiserror::Error)]
pub enum HyperMcpError {
    /// The URL or a header does not make a valid request.
    #[error("invalid request: {0}")]
    Request(#[from] http::Error),
    /// Connecting or sending failed (DNS, TCP, TLS, connection closed).
    #[error("request failed: {0}")]
    Send(#[from] hyper_util::client::legacy::Error),
    /// Reading the response body failed.
    #[error("reading the response failed: {0}")]
    Body(#[from] hyper::Error),
    /// The message could not be encoded.
    #[error("encoding the message failed: {0}")]
    Encode(#[from] serde_json::Error),
    /// A status no other error stands for, with (for the log) the start of the body.
    #[error("HTTP {status}: {body}")]
    Status { status: StatusCode, body: String },
}

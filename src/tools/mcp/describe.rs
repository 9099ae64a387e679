//! What failed, in words: rmcp's errors as tool results and MCP errors give them.
//!
//! rmcp's own messages are for the log: a transport error names the transport's Rust type
//! (`Transport [turnstile::…::Ordered<rmcp::…>] error: HTTP 500`), a handshake error may
//! print a whole message with `{:?}`. What the model, an AAP client and a `/mcp` client see
//! says instead who failed and how ("MCP server shop answered HTTP 500"); the caller logs the
//! error itself beside it.

use std::error::Error as StdError;

use rmcp::service::ClientInitializeError;
use rmcp::transport::streamable_http_client::StreamableHttpError;
use rmcp::ServiceError;

use super::http_client::HyperMcpError;
use super::too_large;

/// What went wrong with a request to `who` ("MCP server shop", "the MCP client"), as one
/// sentence without Rust type names.
pub fn describe_error(who: &str, e: &ServiceError) -> String {
    match e {
        ServiceError::McpError(d) => {
            let ours = d
                .data
                .as_ref()
                .and_then(|d| d.get("reason"))
                .is_some_and(|r| r == too_large::REASON);
            if ours {
                d.message.to_string()
            } else if d.message.trim().is_empty() {
                format!("{who} answered with JSON-RPC error {}", d.code.0)
            } else {
                format!("{who} answered with an error: {}", d.message)
            }
        }
        ServiceError::TransportSend(t) => transport(who, t.error.as_ref()),
        ServiceError::TransportClosed => {
            format!("the connection to {who} closed before it answered")
        }
        ServiceError::UnexpectedResponse => {
            format!("{who} answered with a result of the wrong kind")
        }
        ServiceError::Cancelled { .. } => format!("the request to {who} was cancelled"),
        ServiceError::Timeout { timeout } => {
            format!("{who} did not answer within {} s", timeout.as_secs())
        }
        // Their own words name no type.
        e @ (ServiceError::SubscriptionLagged { .. }
        | ServiceError::InputRequiredRoundsExceeded { .. }) => format!("{who}: {e}"),
        _ => format!("the request to {who} failed"),
    }
}

/// Why the handshake with `who` failed, as one sentence without Rust type names.
pub fn describe_init_error(who: &str, e: &ClientInitializeError) -> String {
    match e {
        ClientInitializeError::TransportError { error, .. } => transport(who, error.error.as_ref()),
        ClientInitializeError::JsonRpcError(d) => {
            format!("{who} refused the handshake: {}", d.message)
        }
        ClientInitializeError::ConnectionClosed(_) => {
            format!("{who} closed the connection during the handshake")
        }
        ClientInitializeError::NoCompatibleProtocolVersion {
            server_supported, ..
        } => {
            let theirs: Vec<&str> = server_supported.iter().map(|v| v.as_str()).collect();
            format!(
                "{who} speaks no MCP protocol version turnstile knows (it offered {})",
                theirs.join(", ")
            )
        }
        ClientInitializeError::LegacyFallbackFailed { fallback, .. } => {
            describe_init_error(who, fallback)
        }
        ClientInitializeError::Cancelled => format!("the handshake with {who} was cancelled"),
        ClientInitializeError::ExpectedInitResponse(_)
        | ClientInitializeError::ExpectedInitResult(_)
        | ClientInitializeError::ConflictInitResponseId(..)
        | ClientInitializeError::UncorrelatedErrorResponse { .. } => {
            format!("{who} answered the handshake with something else than its result")
        }
        _ => format!("the handshake with {who} failed"),
    }
}

type HttpError = StreamableHttpError<HyperMcpError>;

/// A transport's error: the HTTP client's, or a stdio pipe's.
fn transport(who: &str, e: &(dyn StdError + 'static)) -> String {
    if let Some(e) = e.downcast_ref::<HttpError>() {
        return http(who, e);
    }
    if let Some(e) = e.downcast_ref::<std::io::Error>() {
        return match e.kind() {
            std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::NotConnected => {
                format!("the connection to {who} is closed (the server may have exited)")
            }
            _ => format!("talking to {who} failed: {}", io_words(e)),
        };
    }
    format!("the request to {who} failed")
}

fn http(who: &str, e: &HttpError) -> String {
    match e {
        StreamableHttpError::HttpStatus(s) => format!("{who} answered HTTP {}", s.status),
        StreamableHttpError::Client(HyperMcpError::Status { status, .. }) => {
            format!("{who} answered HTTP {}", status.as_u16())
        }
        StreamableHttpError::Client(HyperMcpError::Send(e)) => {
            match innermost_io(e) {
                Some(io) => format!("cannot reach {who}: {}", io_words(io)),
                None => format!("cannot reach {who}"),
            }
        }
        StreamableHttpError::Client(HyperMcpError::Body(_)) => {
            format!("reading the answer of {who} failed (the connection broke)")
        }
        StreamableHttpError::Client(HyperMcpError::Request(_)) => {
            format!("the request to {who} is not a valid HTTP request (check its url and headers)")
        }
        StreamableHttpError::Client(HyperMcpError::Encode(_)) => {
            format!("the request to {who} could not be encoded")
        }
        StreamableHttpError::ResponseBodyTooLarge { .. } => too_large::reason(who, None),
        StreamableHttpError::AuthRequired(_) => {
            format!("{who} refused the credentials (HTTP 401)")
        }
        StreamableHttpError::InsufficientScope(_) => {
            format!("{who} refused the request: the token's scope is not enough (HTTP 403)")
        }
        StreamableHttpError::SessionExpired => format!("{who} ended the session (HTTP 404)"),
        StreamableHttpError::UnexpectedContentType(ct) => format!(
            "{who} answered with content type {}, neither JSON nor an event stream",
            ct.as_deref().unwrap_or("(none)")
        ),
        StreamableHttpError::Sse(_) => format!("the event stream of {who} broke"),
        StreamableHttpError::UnexpectedEndOfStream
        | StreamableHttpError::TransportChannelClosed => {
            format!("the connection to {who} closed")
        }
        StreamableHttpError::UnexpectedServerResponse(_)
        | StreamableHttpError::Deserialize(_) => {
            format!("{who} answered with something that is not an MCP message")
        }
        StreamableHttpError::SessionRecoveryTimeout => format!(
            "the session with {who} expired and could not be renewed in time (the call may have run)"
        ),
        StreamableHttpError::ReinitializationFailed(d) => {
            format!("{who} refused a new session: {}", d.message)
        }
        StreamableHttpError::Io(e) => format!("talking to {who} failed: {}", io_words(e)),
        _ => format!("the request to {who} failed"),
    }
}

/// The deepest I/O error under `e` (the connect error under a client error).
fn innermost_io<'a>(e: &'a (dyn StdError + 'static)) -> Option<&'a std::io::Error> {
    let mut found = None;
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            found = Some(io);
        }
        next = e.source();
    }
    found
}

/// An I/O error in words, without its OS error number ("connection refused").
fn io_words(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = match text.find(" (os error") {
        Some(i) => &text[..i],
        None => &text,
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => "an I/O error".to_string(),
    }
}

#[cfg(test)]
mod tests;

use std::borrow::Cow;

use rmcp::model::{ErrorCode, ErrorData};
use rmcp::transport::streamable_http_client::HttpStatusError;
use rmcp::transport::DynamicTransportError;

use super::*;

fn send(e: impl StdError + Send + Sync + 'static) -> ServiceError {
    ServiceError::TransportSend(DynamicTransportError::from_parts(
            "turnstile::tools::mcp::supervisor::ordered::Ordered<rmcp::transport::worker::WorkerTransport<X>>",
            std::any::TypeId::of::<()>(),
            Box::new(e),
        ))
}

/// No Rust path or generic in what is described.
fn plain(s: &str) -> &str {
    assert!(!s.contains("::") && !s.contains('<'), "{s}");
    s
}

#[test]
fn transport_errors_in_words() {
    let who = "MCP server shop";
    let e = send(HttpError::HttpStatus(HttpStatusError::new(500, None)));
    assert!(
        e.to_string().contains("::"),
        "rmcp's own words name the type: {e}"
    );
    assert_eq!(
        plain(&describe_error(who, &e)),
        "MCP server shop answered HTTP 500"
    );
    let e = send(HttpError::Client(HyperMcpError::Status {
        status: http::StatusCode::BAD_GATEWAY,
        body: "<html>".into(),
    }));
    assert_eq!(
        plain(&describe_error(who, &e)),
        "MCP server shop answered HTTP 502"
    );
    let e = send(HttpError::UnexpectedServerResponse(Cow::Borrowed("x")));
    plain(&describe_error(who, &e));
    let e = send(std::io::Error::from(std::io::ErrorKind::BrokenPipe));
    assert_eq!(
        plain(&describe_error("MCP server time", &e)),
        "the connection to MCP server time is closed (the server may have exited)"
    );
    let e = send(std::io::Error::other("weird"));
    assert_eq!(
        plain(&describe_error("MCP server time", &e)),
        "talking to MCP server time failed: weird"
    );
}

#[test]
fn answers_and_ends_in_words() {
    let who = "MCP server shop";
    let e = ServiceError::McpError(ErrorData::new(
        ErrorCode::INVALID_PARAMS,
        "no such tool",
        None,
    ));
    assert_eq!(
        describe_error(who, &e),
        "MCP server shop answered with an error: no such tool"
    );
    let e = ServiceError::McpError(too_large::error_data(who, Some(20 << 20)));
    assert_eq!(
        describe_error(who, &e),
        "the answer of MCP server shop was 20 MiB, over the 16 MiB an MCP message may have"
    );
    assert_eq!(
        describe_error(who, &ServiceError::TransportClosed),
        "the connection to MCP server shop closed before it answered"
    );
    let e = ServiceError::Timeout {
        timeout: std::time::Duration::from_secs(3),
    };
    assert_eq!(
        describe_error(who, &e),
        "MCP server shop did not answer within 3 s"
    );
}

#[test]
fn io_errors_lose_their_number() {
    let e = std::io::Error::from_raw_os_error(libc::ECONNREFUSED);
    assert_eq!(io_words(&e), "connection refused");
}

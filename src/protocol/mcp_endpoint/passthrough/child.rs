//! A federated server as the pass-through sees it (up, with its timeout and capabilities), and
//! requests to it bounded by that timeout, with their outcome logged.

use std::future::Future;
use std::time::{Duration, Instant};

use rmcp::model::ServerCapabilities;
use rmcp::service::{Peer, RoleClient};
use rmcp::{ErrorData, ServiceError};

use crate::tools::mcp::policy::Decision;
use crate::tools::mcp::supervisor::Supervisor;

/// A server that is up, shared or this session's own instance: its connection, `timeout_s`
/// and declared capabilities.
#[derive(Clone)]
pub(super) struct Child {
    pub(super) server: String,
    pub(super) peer: Peer<RoleClient>,
    pub(super) timeout: Duration,
    pub(super) caps: ServerCapabilities,
    /// This session's own instance of a session-scoped server.
    pub(super) own: bool,
}

/// A request to a child, bounded by its `timeout_s`; the child's own JSON-RPC error passes
/// through.
pub(super) async fn within<T>(
    child: &Child,
    what: &str,
    request: impl Future<Output = Result<T, ServiceError>>,
) -> Result<T, ErrorData> {
    match tokio::time::timeout(child.timeout, request).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(ServiceError::McpError(e))) => Err(e),
        Ok(Err(e)) => {
            tracing::warn!(server = %child.server, error = %e, "{what} failed");
            let why =
                crate::tools::mcp::describe_error(&format!("MCP server {}", child.server), &e);
            Err(ErrorData::internal_error(
                format!("{what} failed: {why}"),
                None,
            ))
        }
        Err(_) => Err(ErrorData::internal_error(
            format!(
                "MCP server {} did not answer {what} within {} s (its timeout_s)",
                child.server,
                child.timeout.as_secs()
            ),
            None,
        )),
    }
}

pub(super) fn log(
    server: &str,
    what: &str,
    name: &str,
    d: &Decision,
    outcome: &str,
    started: Instant,
) {
    tracing::info!(
        server,
        name,
        verdict = %crate::telemetry::snake(&d.verdict),
        outcome,
        duration_ms = started.elapsed().as_millis() as u64,
        "mcp endpoint {what}"
    );
}

/// A child's list, or none when it failed (logged, unless the child does not serve the method).
pub(super) fn or_none<T>(child: &Child, what: &str, listed: Result<Vec<T>, ErrorData>) -> Vec<T> {
    listed.unwrap_or_else(|e| {
        if e.code != rmcp::model::ErrorCode::METHOD_NOT_FOUND {
            tracing::warn!(server = %child.server, error = %e.message, "{what} failed");
        }
        Vec::new()
    })
}

pub(super) fn outcome<T>(r: &Result<T, ErrorData>) -> &'static str {
    if r.is_ok() {
        "ok"
    } else {
        "error"
    }
}

/// `s` as a child, when it is up and passes `wanted`.
pub(super) fn child_of(
    s: &Supervisor,
    own: bool,
    wanted: &impl Fn(&ServerCapabilities) -> bool,
) -> Option<Child> {
    let peer = s.peer()?;
    let caps = peer.peer_info()?.capabilities.clone();
    wanted(&caps).then(|| Child {
        server: s.name.clone(),
        peer,
        timeout: s.timeout(),
        caps,
        own,
    })
}

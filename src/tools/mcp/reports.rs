//! What the federation tells about its servers: at start-up (each first attempt, the ones
//! that failed) and afterwards (`GET /status`, `/readyz`).

use std::time::Duration;

use super::supervisor::ServerStatus;

/// What federating the configured servers found at start-up.
#[derive(Debug, Clone, Default)]
pub struct StartReport {
    /// Servers that did not come up, with why (they keep retrying in the background).
    pub failed: Vec<(String, String)>,
}

/// One server's first start-up attempt has ended (for `check`'s progress lines).
#[derive(Debug, Clone)]
pub struct ServerProgress {
    pub server: String,
    /// The tools it listed, or why it did not come up.
    pub result: Result<usize, String>,
    pub elapsed: Duration,
}

/// One configured server as `GET /status` shows it: a shared server's instance, or a
/// session-scoped server's running instances.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ServerReport {
    pub name: String,
    /// `"shared"` or `"session"`.
    pub scope: &'static str,
    /// The shared instance (`None` for a session-scoped server).
    #[serde(flatten)]
    pub shared: Option<ServerStatus>,
    /// Running instances of a session-scoped server, by session id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instances: Option<Vec<InstanceReport>>,
}

/// A running instance of a session-scoped server.
#[derive(Debug, Clone, serde::Serialize)]
pub struct InstanceReport {
    pub session: String,
    #[serde(flatten)]
    pub status: ServerStatus,
}

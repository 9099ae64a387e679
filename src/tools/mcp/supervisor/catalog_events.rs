//! A server's notifications about what `/mcp` passes through besides its tools (resources,
//! prompts; a session-scoped instance's log messages), and where they go.

use tokio::sync::broadcast;

/// A server's notification about its resources or prompts.
#[derive(Debug, Clone, PartialEq)]
pub enum CatalogEvent {
    ResourcesChanged,
    PromptsChanged,
    /// `notifications/resources/updated` for this URI (as the server names it).
    ResourceUpdated(String),
    /// `notifications/message` of a session-scoped instance (all of whose messages are its
    /// session's; a shared server's belong to no one session and are not sent).
    #[allow(deprecated)]
    Logged(rmcp::model::LoggingMessageNotificationParam),
    /// Events were missed (a receiver fell behind): whatever changed, re-list.
    Missed,
}

/// Where an instance's catalog events go (receivers that fall behind see `Lagged`).
pub(super) type Events = broadcast::Sender<CatalogEvent>;

/// Where the catalog events of one session's instances go, each with its server's name.
pub type SessionFeed = broadcast::Sender<(String, CatalogEvent)>;

pub(super) fn events() -> Events {
    broadcast::channel(64).0
}

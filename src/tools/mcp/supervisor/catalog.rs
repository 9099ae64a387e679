//! What `/mcp` passes through of a server besides its tools (resources, prompts, completions,
//! read-only): the live connection to make those requests on, and the server's notifications
//! about them.

use std::sync::Arc;
use std::time::Duration;

use rmcp::service::{Peer, RoleClient};
use tokio::sync::broadcast;

use super::{Link, Supervisor};
use crate::tools::mcp::McpHost;

/// A server's notification about its resources or prompts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogEvent {
    ResourcesChanged,
    PromptsChanged,
    /// `notifications/resources/updated` for this URI (as the server names it).
    ResourceUpdated(String),
}

/// Where an instance's catalog events go (receivers that fall behind see `Lagged`).
pub(super) type Events = broadcast::Sender<CatalogEvent>;

pub(super) fn events() -> Events {
    broadcast::channel(64).0
}

impl Supervisor {
    /// The connection, while the server is up.
    pub fn peer(&self) -> Option<Peer<RoleClient>> {
        match &*self.link.borrow() {
            Link::Ready(peer) => Some(peer.clone()),
            _ => None,
        }
    }

    /// The server's `timeout_s`, for requests made on [`Self::peer`].
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The server's resource and prompt notifications from now on.
    pub fn catalog_events(&self) -> broadcast::Receiver<CatalogEvent> {
        self.events.subscribe()
    }
}

impl McpHost {
    /// The shared servers' instances, in config order (session-scoped servers have none to
    /// pass through: theirs start per session, for its tool calls).
    pub fn shared_servers(&self) -> Vec<Arc<Supervisor>> {
        let mut all: Vec<(usize, Arc<Supervisor>)> =
            self.shared.iter().map(|(i, s)| (*i, s.clone())).collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, s)| s).collect()
    }
}

//! What `/mcp` passes through of a server besides its tools (resources, prompts, completions,
//! read-only; a session-scoped instance's log messages): the live connection to make those
//! requests on, and the server's notifications about them.

use std::sync::Arc;
use std::time::Duration;

use rmcp::service::{Peer, RoleClient};
use tokio::sync::broadcast;

use rmcp::model::ServerCapabilities;

use super::{Link, Supervisor};
use crate::config::McpScope;
use crate::tools::mcp::McpHost;
use crate::tools::CallContext;

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
    /// The shared servers' instances, in config order.
    pub fn shared_servers(&self) -> Vec<Arc<Supervisor>> {
        let mut all: Vec<(usize, Arc<Supervisor>)> =
            self.shared.iter().map(|(i, s)| (*i, s.clone())).collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, s)| s).collect()
    }

    /// The catalog events of `session_id`'s own instances of session-scoped servers started
    /// from now on, each with its server's name, until the session closes. (Only a session
    /// someone listens to has a feed: an AAP session's instances feed none.)
    pub fn session_catalog_events(
        &self,
        session_id: &str,
    ) -> broadcast::Receiver<(String, CatalogEvent)> {
        crate::sync::lock(&self.session_feeds)
            .entry(session_id.to_string())
            .or_insert_with(|| broadcast::channel(64).0)
            .subscribe()
    }

    /// Forward the events of `sup`, an instance just started for `session_id`, to that
    /// session's feed if it has one (subscribed before the instance can have sent any), for
    /// as long as it lives.
    pub(in crate::tools::mcp) fn feed_session(&self, session_id: &str, sup: &Supervisor) {
        let Some(feed) = crate::sync::lock(&self.session_feeds)
            .get(session_id)
            .cloned()
        else {
            return;
        };
        let mut events = sup.catalog_events();
        let server = sup.name.clone();
        tokio::spawn(async move {
            loop {
                match events.recv().await {
                    Ok(e) => {
                        let _ = feed.send((server.clone(), e));
                    }
                    // Tell the session's relay that something was missed.
                    Err(broadcast::error::RecvError::Lagged(_)) => {
                        let _ = feed.send((server.clone(), CatalogEvent::Missed));
                    }
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        });
    }

    /// What the session-scoped servers declared to their probe at start, in config order
    /// (their instances start per session, after a client learns the capabilities).
    pub fn session_capabilities(&self) -> Vec<ServerCapabilities> {
        let mut all: Vec<(&usize, &ServerCapabilities)> = self.probed_caps.iter().collect();
        all.sort_by_key(|(i, _)| **i);
        all.into_iter().map(|(_, c)| c.clone()).collect()
    }

    /// The session's own instance of every session-scoped server whose probe's capabilities
    /// pass `wanted`, started if need be and up (each within its `startup_timeout_s`), in
    /// config order. One that cannot start (no room under `[limits] session_servers`) or does
    /// not come up is left out, logged.
    pub async fn session_servers(
        &self,
        ctx: &CallContext,
        wanted: impl Fn(&ServerCapabilities) -> bool,
    ) -> Vec<Arc<Supervisor>> {
        let mut out = Vec::new();
        for (idx, cfg) in self.config.mcp_servers.iter().enumerate() {
            if cfg.scope != McpScope::Session || !self.probed_caps.get(&idx).is_some_and(&wanted) {
                continue;
            }
            let sup = match self.session_instance(idx, ctx).await {
                Ok((sup, _in_flight)) => sup,
                Err(refused) => {
                    tracing::warn!(server = %cfg.name, session = %ctx.session_id, reason = %refused.content, "a session-scoped MCP server was not started for /mcp");
                    continue;
                }
            };
            match sup.ready(cfg.startup_timeout).await {
                Ok(()) => out.push(sup),
                Err(why) => {
                    tracing::warn!(server = %cfg.name, session = %ctx.session_id, reason = %why, "a session-scoped MCP server is not up for /mcp")
                }
            }
        }
        out
    }
}

//! What every handler gets: the server's shared state ([`App`]) and who is calling
//! ([`Caller`]). Apart from the route table (in the api module), so that protocols import it without
//! importing the routes that import them.

use std::sync::Arc;

use crate::config::{Principal, Scope};
use crate::engine::{Engine, Reach};
use crate::files::FileStore;
use crate::http::auth::Keys;

/// The server's shared state, one per server: the engine, the keys and the file store.
pub(crate) struct App {
    pub engine: Engine,
    /// The keys now (a reload replaces them).
    pub keys: Arc<crate::sync::Swap<Keys>>,
    /// Whether `GET /meta` is served without a key.
    pub public_meta: bool,
    /// Cancelled at shutdown, after running turns have ended: ends every open event stream.
    pub streams: tokio_util::sync::CancellationToken,
    pub files: FileStore,
    /// `/mcp` (`[mcp_endpoint]`).
    pub mcp: crate::protocol::mcp_endpoint::Endpoint,
    /// What a web page could make a browser send, refused (see [`crate::http::browser`]).
    pub browser: crate::http::browser::Guard,
}

impl App {
    /// The largest JSON request body (`[server] max_body_bytes`).
    pub(crate) fn max_body(&self) -> u64 {
        self.engine.config().server.max_body_bytes
    }
}

/// Who is calling: the principal of their key (`None` without keys, and on public routes).
#[derive(Debug, Clone, Default)]
pub(crate) struct Caller {
    pub principal: Option<Arc<Principal>>,
}

impl Caller {
    /// The owner id of what the caller makes (sessions, files, MCP sessions).
    pub(crate) fn owner(&self) -> Option<&str> {
        self.principal.as_deref().map(|p| p.owner.as_str())
    }

    pub(crate) fn owned(&self) -> Option<String> {
        self.owner().map(str::to_string)
    }

    /// The sessions it reaches: its own, or every one for an admin principal.
    pub(crate) fn reach(&self) -> Reach<'_> {
        match self.principal.as_deref() {
            Some(p) if p.scope.admin => Reach::Every,
            _ => Reach::Owner(self.owner()),
        }
    }

    /// What it may do (everything but admin without keys).
    pub(crate) fn scope(&self) -> Scope {
        self.principal
            .as_deref()
            .map(|p| p.scope.clone())
            .unwrap_or_default()
    }
}

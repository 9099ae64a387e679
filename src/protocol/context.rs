//! What every handler gets: the server's shared state ([`App`]) and who is calling
//! ([`Caller`]). Apart from the route table (in the api module), so that protocols import it without
//! importing the routes that import them.

use crate::engine::Engine;
use crate::files::FileStore;
use crate::http::auth::Keys;

/// The server's shared state, one per server: the engine, the keys and the file store.
pub(crate) struct App {
    pub engine: Engine,
    pub keys: Keys,
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

/// Who is calling: the owner id of their key (`None` without keys).
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    pub owner: Option<String>,
}

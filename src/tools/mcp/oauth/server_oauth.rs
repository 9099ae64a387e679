//! One server's OAuth: what it is configured with, where its tokens are kept, and where its
//! tokens stand; and the two choices every grant makes (scopes, token endpoint auth).

use super::store::{Saved, TokenStore};
use crate::config::{Env, OAuthConfig};

/// Step-ups (a new token for a challenged scope) in a row before giving up.
pub const STEP_UPS: u32 = 3;
/// A token this close to its expiry is refreshed first.
pub(super) const REFRESH_AHEAD_S: u64 = 60;

/// One server's OAuth state.
pub struct OAuth {
    pub server: String,
    pub(super) url: String,
    pub(super) cfg: OAuthConfig,
    pub(super) store: TokenStore,
    pub(super) state: tokio::sync::Mutex<State>,
    /// Where the secrets the config names are read.
    pub(super) env: Env,
}

impl std::fmt::Debug for OAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OAuth")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) saved: Option<Saved>,
    pub(super) stamp: Option<std::time::SystemTime>,
    pub(super) step_ups: u32,
    pub(super) refreshed_for_401: bool,
    /// Why a login is needed, when it is.
    pub(super) needs_login: Option<String>,
}

/// The space-separated union of two scope lists, in order.
pub fn union(a: Option<&str>, b: Option<&str>) -> Option<String> {
    let mut out: Vec<&str> = Vec::new();
    for s in a.into_iter().chain(b).flat_map(str::split_whitespace) {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    (!out.is_empty()).then(|| out.join(" "))
}

/// The token endpoint auth method to use among what the server supports (RFC 8414's default
/// when it says nothing: `client_secret_basic`).
pub fn pick_method(supported: Option<&Vec<String>>, has_secret: bool) -> String {
    let supports = |m: &str| supported.is_none_or(|s| s.iter().any(|x| x == m));
    if has_secret {
        for m in ["client_secret_basic", "client_secret_post"] {
            if supports(m) {
                return m.to_string();
            }
        }
    }
    if supported.is_some_and(|s| s.iter().any(|x| x == "none")) || !has_secret {
        return "none".to_string();
    }
    "client_secret_basic".to_string()
}

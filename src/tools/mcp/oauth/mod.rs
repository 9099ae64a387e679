//! OAuth 2.1 for streamable-HTTP MCP servers, per the MCP authorization spec.
//!
//! An [`OAuth`] per HTTP server gives the transport the bearer token of each request
//! ([`OAuth::bearer`]: stored, refreshed before expiry, or fetched by client credentials) and is
//! told of each 401/403 challenge ([`OAuth::challenged`]: refresh, a new client-credentials
//! token with the challenged scope (step-up, at most [`STEP_UPS`] times), or "needs a login").
//! The machine grants (client credentials, and the enterprise IdP's identity assertion of
//! [`identity`]) get their tokens without anyone, as they are needed.
//! An operator logs in once with `turnstile login SERVER` ([`OAuth::login`]): discovery,
//! registration (pre-registered id, client ID metadata document, or dynamic registration),
//! PKCE, `resource`, the redirect received on a loopback port. Tokens are stored encrypted
//! ([`store`]), never logged, and only ever sent to the server they were issued for.

pub mod discovery;
mod identity;
mod login;
mod server_oauth;
pub mod store;
mod tokens;
pub mod web;

use std::path::Path;
use std::sync::Arc;

use crate::config::{Env, McpServerConfig, McpTransport, OAuthConfig, OAuthGrant, ServerConfig};
use discovery::Challenge;
use server_oauth::{State, REFRESH_AHEAD_S};
use store::{ClientReg, Saved, TokenStore};

pub use server_oauth::{pick_method, union, OAuth, STEP_UPS};

impl OAuth {
    /// The OAuth handling of an HTTP server (`None` for stdio, or when the operator set an
    /// `Authorization` header of their own).
    pub fn for_server(cfg: &McpServerConfig, server: &ServerConfig) -> Option<Arc<OAuth>> {
        let McpTransport::Http { url, headers } = &cfg.transport else {
            return None;
        };
        if headers
            .keys()
            .any(|k| k.eq_ignore_ascii_case("authorization"))
        {
            return None;
        }
        Some(Arc::new(Self::new(
            &cfg.name,
            url,
            cfg.oauth.clone().unwrap_or_default(),
            &server.data_dir,
            server.secret_key_env.as_deref(),
            &cfg.env,
        )))
    }

    pub fn new(
        name: &str,
        url: &str,
        cfg: OAuthConfig,
        data_dir: &Path,
        secret_key_env: Option<&str>,
        env: &Env,
    ) -> OAuth {
        OAuth {
            server: name.to_string(),
            url: url.to_string(),
            cfg,
            store: TokenStore::new(data_dir, name, url, secret_key_env, env),
            state: tokio::sync::Mutex::new(State::default()),
            env: env.clone(),
        }
    }

    fn login_hint(&self) -> String {
        format!("run `turnstile login {}`", self.server)
    }

    /// Why this server needs an operator's login, if it does (for `check` and `/status`).
    pub async fn needs_login(&self) -> Option<String> {
        self.state.lock().await.needs_login.clone()
    }

    /// The stored state, re-read when another process (a login) changed the file.
    fn reload(&self, st: &mut State) {
        let stamp = self.store.stamp();
        if stamp != st.stamp || st.saved.is_none() {
            st.stamp = stamp;
            if let Some(s) = self.store.load() {
                st.saved = Some(s);
                st.needs_login = None;
                st.refreshed_for_401 = false;
            }
        }
    }

    /// The bearer token for the next request, if any: refreshed when it is about to expire;
    /// for client credentials, fetched when there is none.
    pub async fn bearer(&self) -> Option<String> {
        let mut st = self.state.lock().await;
        self.reload(&mut st);
        if st.saved.is_none() && self.machine() {
            // Refused: logged by `obtain`; the request goes without and its 401 tells.
            let _ = self.obtain(&mut st, None).await;
        }
        let expiring = st
            .saved
            .as_ref()
            .and_then(|s| s.expires_at)
            .is_some_and(|at| at <= tokens::now() + REFRESH_AHEAD_S);
        if expiring {
            self.renew(&mut st).await;
        }
        st.saved.as_ref().map(|s| s.access_token.clone())
    }

    /// A new token without the person: refresh, else client credentials.
    async fn renew(&self, st: &mut State) -> bool {
        let Some(s) = st.saved.clone() else {
            return false;
        };
        if s.refresh_token.is_some() {
            match tokens::refresh(&s).await {
                Ok(new) => {
                    self.keep(st, new);
                    tracing::info!(server = %self.server, "OAuth token refreshed");
                    return true;
                }
                Err(e) => tracing::warn!(server = %self.server, error = %e, "OAuth refresh failed"),
            }
        }
        if self.machine() {
            return self.obtain(st, s.scope.clone()).await.is_ok();
        }
        false
    }

    /// A grant that needs no person (client credentials, identity assertion).
    fn machine(&self) -> bool {
        self.cfg.grant != OAuthGrant::AuthorizationCode
    }

    /// A new token by the machine grant configured; when refused, logged and kept as why
    /// the server is not reachable.
    async fn obtain(&self, st: &mut State, scope: Option<String>) -> Result<(), String> {
        let r = match self.cfg.grant {
            OAuthGrant::IdentityAssertion => self.identity_assertion(st, scope).await,
            _ => self.client_credentials(st, scope).await,
        };
        if let Err(e) = &r {
            tracing::warn!(server = %self.server, grant = ?self.cfg.grant, error = %e, "OAuth token request failed");
            // What the calls and `turnstile check` say (the server's words, never a secret).
            st.needs_login = Some(format!("the token request failed: {e}"));
        }
        r
    }

    fn keep(&self, st: &mut State, saved: Saved) {
        if let Err(e) = self.store.save(&saved) {
            if self.store.has_key() {
                tracing::warn!(server = %self.server, error = %e, "OAuth tokens could not be stored");
            }
        }
        st.stamp = self.store.stamp();
        st.saved = Some(saved);
        st.needs_login = None;
    }

    /// A 401 or 403 came with `header`: whether a new token was obtained (retry the request).
    pub async fn challenged(&self, status: http::StatusCode, header: &str) -> bool {
        let challenge = discovery::parse_challenge(header);
        let mut st = self.state.lock().await;
        self.reload(&mut st);
        let insufficient = status == http::StatusCode::FORBIDDEN
            || challenge.error.as_deref() == Some("insufficient_scope");
        if insufficient {
            if st.step_ups >= STEP_UPS {
                st.needs_login = Some(format!(
                    "the server still refuses the scope {:?} after {STEP_UPS} step-ups",
                    challenge.scope.as_deref().unwrap_or("")
                ));
                return false;
            }
            st.step_ups += 1;
            let scope = union(
                st.saved.as_ref().and_then(|s| s.scope.as_deref()),
                challenge.scope.as_deref(),
            );
            if self.machine() {
                return self.obtain(&mut st, scope).await.is_ok();
            }
            login::remember_scope(&self.store_dir(), &self.server, scope.as_deref());
            st.needs_login = Some(format!(
                "the server asks for the scope {:?}: {}",
                scope.unwrap_or_default(),
                self.login_hint()
            ));
            return false;
        }
        // 401.
        if self.machine() {
            if st.step_ups >= STEP_UPS {
                return false;
            }
            st.step_ups += 1;
            return self.obtain(&mut st, challenge.scope.clone()).await.is_ok();
        }
        if st.saved.is_some() && !st.refreshed_for_401 {
            st.refreshed_for_401 = true;
            if self.renew(&mut st).await {
                return true;
            }
        }
        st.needs_login = Some(if self.store.has_key() {
            format!("the server needs an authorization: {}", self.login_hint())
        } else {
            "the server needs an OAuth login, and tokens can only be stored with [server] secret_key_env set".into()
        });
        false
    }

    /// A request went through: the step-up budget is whole again.
    pub async fn succeeded(&self) {
        if let Ok(mut st) = self.state.try_lock() {
            st.step_ups = 0;
            st.refreshed_for_401 = false;
        }
    }

    fn store_dir(&self) -> std::path::PathBuf {
        self.store.dir()
    }

    /// The MCP server's authorization server and resource: those of the stored token, else
    /// discovered.
    async fn found(&self, st: &State) -> Result<(discovery::AuthServer, String), String> {
        Ok(match &st.saved {
            Some(s) => (s.auth_server.clone(), s.resource.clone()),
            None => {
                let f = discovery::discover(&self.url, &Challenge::default())
                    .await
                    .map_err(|e| e.to_string())?;
                (f.auth_server, f.resource)
            }
        })
    }

    /// This client at the authorization server (configured id; secret or private-key JWT)
    /// and, for `private_key_jwt`, the signed client assertion.
    fn as_client(
        &self,
        found_as: &discovery::AuthServer,
    ) -> Result<(ClientReg, Option<String>), String> {
        let client_id = self
            .cfg
            .client_id
            .clone()
            .ok_or("no client_id configured")?;
        let secret = self.secret();
        let (method, assertion) = match &self.cfg.private_key_file {
            Some(path) => {
                let pem = std::fs::read_to_string(path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                let aud = if found_as.issuer.is_empty() {
                    found_as.token_endpoint.clone()
                } else {
                    found_as.issuer.clone()
                };
                (
                    "private_key_jwt".to_string(),
                    Some(tokens::client_assertion(&pem, &client_id, &aud)?),
                )
            }
            None => (
                pick_method(
                    found_as.token_endpoint_auth_methods_supported.as_ref(),
                    secret.is_some(),
                ),
                None,
            ),
        };
        let reg = ClientReg {
            client_id,
            client_secret: secret,
            auth_method: method,
            redirect_uri: None,
        };
        Ok((reg, assertion))
    }

    /// The scope asked for, else the configured one.
    fn scope_or_configured(&self, scope: Option<String>) -> Option<String> {
        scope.or_else(|| (!self.cfg.scopes.is_empty()).then(|| self.cfg.scopes.join(" ")))
    }

    /// Client credentials: discovery (once per token), then the grant.
    async fn client_credentials(
        &self,
        st: &mut State,
        scope: Option<String>,
    ) -> Result<(), String> {
        let (found_as, resource) = self.found(st).await?;
        let (reg, assertion) = self.as_client(&found_as)?;
        let scope = self.scope_or_configured(scope);
        let saved =
            tokens::client_credentials(&found_as, &reg, &resource, scope.as_deref(), assertion)
                .await?;
        self.keep(st, saved);
        Ok(())
    }

    fn secret(&self) -> Option<String> {
        self.cfg
            .client_secret_env
            .as_deref()
            .and_then(|v| self.env.var(v))
            .map(str::to_string)
            .filter(|s| !s.is_empty())
    }

    /// `turnstile login`: the whole authorization-code flow; `announce` gets the URL to open.
    /// For a machine grant, a token is fetched now (a check of the configuration).
    pub async fn login(&self, announce: &(dyn Fn(&str) + Sync)) -> Result<String, String> {
        if self.machine() {
            let mut st = self.state.lock().await;
            self.obtain(&mut st, None).await?;
            if let Some(saved) = &st.saved {
                self.store.save(saved)?;
            }
            return Ok(st
                .saved
                .as_ref()
                .and_then(|s| s.scope.clone())
                .unwrap_or_default());
        }
        let saved = login::run(self, announce).await?;
        let scope = saved.scope.clone();
        let mut st = self.state.lock().await;
        self.store.save(&saved)?;
        self.keep(&mut st, saved);
        login::remember_scope(&self.store_dir(), &self.server, None);
        Ok(scope.unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_union_and_methods() {
        assert_eq!(union(Some("a b"), Some("b c")).as_deref(), Some("a b c"));
        assert_eq!(union(None, None), None);
        let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(pick_method(None, true), "client_secret_basic");
        assert_eq!(
            pick_method(Some(&v(&["client_secret_post"])), true),
            "client_secret_post"
        );
        assert_eq!(pick_method(Some(&v(&["none"])), false), "none");
    }
}

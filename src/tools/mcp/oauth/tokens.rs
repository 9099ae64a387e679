//! Token requests through the `oauth2` crate (over [`super::web`]): the authorization code
//! with PKCE, refresh, client credentials (secret basic or post, or a private-key JWT).

use std::time::{SystemTime, UNIX_EPOCH};

use oauth2::basic::{BasicClient, BasicTokenResponse};
use oauth2::{
    AuthType, AuthUrl, AuthorizationCode, ClientId, ClientSecret, PkceCodeVerifier, RedirectUrl,
    RefreshToken, Scope, TokenResponse, TokenUrl,
};

use super::discovery::AuthServer;
use super::store::{ClientReg, Saved};
use super::web;

pub(super) fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn bad(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn auth_type(method: &str) -> AuthType {
    if method == "client_secret_basic" {
        AuthType::BasicAuth
    } else {
        AuthType::RequestBody
    }
}

macro_rules! client {
    ($as:expr, $reg:expr) => {{
        let mut c = BasicClient::new(ClientId::new($reg.client_id.clone()))
            .set_auth_uri(AuthUrl::new($as.authorization_endpoint.clone()).map_err(bad)?)
            .set_token_uri(TokenUrl::new($as.token_endpoint.clone()).map_err(bad)?)
            .set_auth_type(auth_type(&$reg.auth_method));
        if let Some(s) = &$reg.client_secret {
            if $reg.auth_method != "none" && $reg.auth_method != "private_key_jwt" {
                c = c.set_client_secret(ClientSecret::new(s.clone()));
            }
        }
        c
    }};
}

fn http(
    req: oauth2::HttpRequest,
) -> impl std::future::Future<Output = Result<oauth2::HttpResponse, web::WebError>> {
    web::send(req)
}

/// What a token response becomes.
pub(super) fn saved(
    t: &BasicTokenResponse,
    resource: &str,
    auth_server: &AuthServer,
    client: &ClientReg,
    asked_scope: Option<&str>,
    old_refresh: Option<&str>,
) -> Saved {
    Saved {
        resource: resource.to_string(),
        auth_server: auth_server.clone(),
        client: client.clone(),
        access_token: t.access_token().secret().clone(),
        refresh_token: t
            .refresh_token()
            .map(|r| r.secret().clone())
            .or_else(|| old_refresh.map(str::to_string)),
        expires_at: t.expires_in().map(|d| now() + d.as_secs()),
        scope: t
            .scopes()
            .map(|s| {
                s.iter()
                    .map(|s| s.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .or_else(|| asked_scope.map(str::to_string)),
    }
}

/// The authorization URL (PKCE S256, state, `resource`, scope) and the verifier to keep.
pub(super) fn authorization_url(
    auth_server: &AuthServer,
    client: &ClientReg,
    redirect_uri: &str,
    resource: &str,
    scope: Option<&str>,
) -> Result<(String, String, PkceCodeVerifier), String> {
    let c = client!(auth_server, client)
        .set_redirect_uri(RedirectUrl::new(redirect_uri.to_string()).map_err(bad)?);
    let (challenge, verifier) = oauth2::PkceCodeChallenge::new_random_sha256();
    let mut req = c
        .authorize_url(oauth2::CsrfToken::new_random)
        .set_pkce_challenge(challenge)
        .add_extra_param("resource", resource);
    if let Some(s) = scope {
        req = req.add_scopes(s.split_whitespace().map(|s| Scope::new(s.to_string())));
    }
    let (url, state) = req.url();
    Ok((url.to_string(), state.secret().clone(), verifier))
}

/// Exchange an authorization code.
pub(super) async fn exchange_code(
    auth_server: &AuthServer,
    client: &ClientReg,
    redirect_uri: &str,
    resource: &str,
    code: String,
    verifier: PkceCodeVerifier,
    scope: Option<&str>,
) -> Result<Saved, String> {
    let c = client!(auth_server, client)
        .set_redirect_uri(RedirectUrl::new(redirect_uri.to_string()).map_err(bad)?);
    let t = c
        .exchange_code(AuthorizationCode::new(code))
        .set_pkce_verifier(verifier)
        .add_extra_param("resource", resource)
        .request_async(&http)
        .await
        .map_err(describe)?;
    Ok(saved(&t, resource, auth_server, client, scope, None))
}

/// Refresh; the new state (the old refresh token kept when none comes back).
pub(super) async fn refresh(s: &Saved) -> Result<Saved, String> {
    let rt = s.refresh_token.clone().ok_or("no refresh token")?;
    let c = client!(s.auth_server, s.client);
    let t = c
        .exchange_refresh_token(&RefreshToken::new(rt.clone()))
        .add_extra_param("resource", s.resource.as_str())
        .request_async(&http)
        .await
        .map_err(describe)?;
    Ok(saved(
        &t,
        &s.resource,
        &s.auth_server,
        &s.client,
        s.scope.as_deref(),
        Some(&rt),
    ))
}

/// A client-credentials grant.
pub(super) async fn client_credentials(
    auth_server: &AuthServer,
    client: &ClientReg,
    resource: &str,
    scope: Option<&str>,
    assertion: Option<String>,
) -> Result<Saved, String> {
    let c = client!(auth_server, client);
    let mut req = c
        .exchange_client_credentials()
        .add_extra_param("resource", resource);
    if let Some(s) = scope {
        req = req.add_scopes(s.split_whitespace().map(|s| Scope::new(s.to_string())));
    }
    if let Some(jwt) = assertion {
        req = req
            .add_extra_param(
                "client_assertion_type",
                "urn:ietf:params:oauth:client-assertion-type:jwt-bearer",
            )
            .add_extra_param("client_assertion", jwt);
    }
    let t = req.request_async(&http).await.map_err(describe)?;
    Ok(saved(&t, resource, auth_server, client, scope, None))
}

fn describe(
    e: oauth2::RequestTokenError<web::WebError, oauth2::basic::BasicErrorResponse>,
) -> String {
    match e {
        oauth2::RequestTokenError::ServerResponse(r) => format!(
            "the authorization server refused: {}{}",
            r.error(),
            r.error_description()
                .map(|d| format!(" ({d})"))
                .unwrap_or_default()
        ),
        oauth2::RequestTokenError::Request(e) => format!("token request failed: {e}"),
        oauth2::RequestTokenError::Parse(e, _) => format!("unreadable token response: {e}"),
        oauth2::RequestTokenError::Other(e) => e,
    }
}

/// A private-key JWT client assertion (RFC 7523), ES256 over ring.
pub(super) fn client_assertion(
    pem: &str,
    client_id: &str,
    audience: &str,
) -> Result<String, String> {
    use base64::Engine;
    use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
    let b64 = base64::engine::general_purpose::STANDARD;
    let der: String = pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect::<Vec<_>>()
        .join("");
    let der = b64
        .decode(der.trim())
        .map_err(|e| format!("private key: {e}"))?;
    let rng = ring::rand::SystemRandom::new();
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &der, &rng)
        .map_err(|e| format!("private key (PKCS#8 P-256 expected): {e}"))?;
    let url = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut jti = [0u8; 16];
    ring::rand::SecureRandom::fill(&rng, &mut jti).map_err(|_| "no randomness")?;
    let now = now();
    let header = serde_json::json!({"alg": "ES256", "typ": "JWT"});
    let claims = serde_json::json!({
        "iss": client_id, "sub": client_id, "aud": audience,
        "iat": now, "exp": now + 300, "jti": url.encode(jti),
    });
    let signing_input = format!(
        "{}.{}",
        url.encode(header.to_string()),
        url.encode(claims.to_string())
    );
    let sig = key
        .sign(&rng, signing_input.as_bytes())
        .map_err(|_| "signing failed")?;
    Ok(format!("{signing_input}.{}", url.encode(sig.as_ref())))
}

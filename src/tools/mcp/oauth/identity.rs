//! Enterprise-managed authorization (the MCP extension
//! `io.modelcontextprotocol/enterprise-managed-authorization`, SEP-990; "cross-app access"):
//! the Identity Assertion JWT Authorization Grant (ID-JAG).
//!
//! The user's identity assertion from single sign-on (an OpenID Connect ID token, or a SAML 2
//! assertion), read from the configured variable or file each time one is needed, is
//! exchanged at the enterprise IdP's token endpoint (RFC 8693 token exchange) for an ID-JAG
//! whose audience is the MCP server's authorization server and whose resource is the MCP
//! server; the ID-JAG is then presented to that authorization server with the JWT-bearer grant
//! (RFC 7523) and this client's own authentication there. No person takes part: a token is
//! obtained as with client credentials (when there is none, on expiry after a refresh is
//! tried, on a 401 or a step-up), and stored like every other.
//!
//! The `oauth2` crate has neither grant, so both form requests are made here over
//! [`super::web`]; the answer of the second is read as the crate's token response.

use oauth2::url::form_urlencoded;

use super::discovery::{self, AuthServer};
use super::server_oauth::{OAuth, State};
use super::store::{ClientReg, Saved};
use super::{tokens, web};
use crate::config::{Env, IdpConfig};

pub(super) const TOKEN_EXCHANGE: &str = "urn:ietf:params:oauth:grant-type:token-exchange";
pub(super) const JWT_BEARER: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
pub(super) const ID_JAG: &str = "urn:ietf:params:oauth:token-type:id-jag";
/// Largest identity assertion read from a file.
const MAX_ASSERTION: u64 = 64 * 1024;

/// The RFC 8693 token type of the configured identity assertion.
fn subject_token_type(assertion_type: &str) -> &'static str {
    match assertion_type {
        "saml2" => "urn:ietf:params:oauth:token-type:saml2",
        _ => "urn:ietf:params:oauth:token-type:id_token",
    }
}

/// The token-exchange form sent to the IdP: the assertion as the subject token, an ID-JAG
/// asked for the authorization server (`audience`) and the MCP server (`resource`). The
/// client id goes in the form when the client has no secret (else in the Basic header).
pub(super) fn exchange_form(
    idp: &IdpConfig,
    assertion: &str,
    audience: &str,
    resource: &str,
    scope: Option<&str>,
    has_secret: bool,
) -> Vec<(&'static str, String)> {
    let mut f = vec![
        ("grant_type", TOKEN_EXCHANGE.to_string()),
        ("requested_token_type", ID_JAG.to_string()),
        ("audience", audience.to_string()),
        ("resource", resource.to_string()),
        ("subject_token", assertion.to_string()),
        (
            "subject_token_type",
            subject_token_type(&idp.assertion_type).to_string(),
        ),
    ];
    if let Some(s) = scope {
        f.push(("scope", s.to_string()));
    }
    if !has_secret {
        f.push(("client_id", idp.client_id.clone()));
    }
    f
}

/// The JWT-bearer form sent to the authorization server, with the client's authentication
/// per its method (`client_secret_basic` goes in the header, see [`basic`]).
pub(super) fn bearer_form(
    client: &ClientReg,
    jag: &str,
    resource: &str,
    scope: Option<&str>,
    client_assertion: Option<String>,
) -> Vec<(&'static str, String)> {
    let mut f = vec![
        ("grant_type", JWT_BEARER.to_string()),
        ("assertion", jag.to_string()),
        ("resource", resource.to_string()),
    ];
    if let Some(s) = scope {
        f.push(("scope", s.to_string()));
    }
    match client.auth_method.as_str() {
        "client_secret_basic" => {}
        "client_secret_post" => {
            f.push(("client_id", client.client_id.clone()));
            f.push((
                "client_secret",
                client.client_secret.clone().unwrap_or_default(),
            ));
        }
        _ => f.push(("client_id", client.client_id.clone())),
    }
    if let Some(jwt) = client_assertion {
        f.push((
            "client_assertion_type",
            "urn:ietf:params:oauth:client-assertion-type:jwt-bearer".into(),
        ));
        f.push(("client_assertion", jwt));
    }
    f
}

/// `Basic base64(urlencode(id):urlencode(secret))` (RFC 6749 §2.3.1).
pub(super) fn basic(id: &str, secret: &str) -> String {
    use base64::Engine;
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    let pair = format!("{}:{}", enc(id), enc(secret));
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(pair)
    )
}

/// POST a form; the status and the JSON answer (`Null` when it is not JSON).
async fn post_form(
    url: &str,
    form: &[(&'static str, String)],
    auth: Option<String>,
) -> Result<(http::StatusCode, serde_json::Value), String> {
    let body = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(form.iter().map(|(k, v)| (*k, v.as_str())))
        .finish();
    let mut req = http::Request::post(url)
        .header(
            http::header::CONTENT_TYPE,
            "application/x-www-form-urlencoded",
        )
        .header(http::header::ACCEPT, "application/json");
    if let Some(a) = auth {
        req = req.header(http::header::AUTHORIZATION, a);
    }
    let req = req
        .body(body.into_bytes())
        .map_err(|e| format!("{url}: {e}"))?;
    let resp = web::send(req).await.map_err(|e| e.to_string())?;
    let v = serde_json::from_slice(resp.body()).unwrap_or(serde_json::Value::Null);
    Ok((resp.status(), v))
}

/// An OAuth error answer, for messages (never the request, which holds secrets).
fn refused(who: &str, status: http::StatusCode, v: &serde_json::Value) -> String {
    let field = |k: &str| v.get(k).and_then(|e| e.as_str()).unwrap_or("");
    let desc = field("error_description");
    format!(
        "{who} refused ({status}): {}{}",
        if field("error").is_empty() {
            "no OAuth error given"
        } else {
            field("error")
        },
        if desc.is_empty() {
            String::new()
        } else {
            format!(" ({desc})")
        }
    )
}

/// The identity assertion, read now (a variable, or a file kept fresh by another process).
fn read_assertion(idp: &IdpConfig, env: &Env) -> Result<String, String> {
    let text = match (&idp.assertion_env, &idp.assertion_file) {
        (Some(var), _) => env
            .var(var)
            .map(str::to_string)
            .ok_or_else(|| format!("the identity assertion variable {var} is not set"))?,
        (None, Some(path)) => {
            use std::io::Read;
            let mut s = String::new();
            std::fs::File::open(path)
                .and_then(|f| f.take(MAX_ASSERTION).read_to_string(&mut s))
                .map_err(|e| format!("identity assertion file {}: {e}", path.display()))?;
            s
        }
        (None, None) => return Err("no identity assertion configured".into()),
    };
    let text = text.trim().to_string();
    if text.is_empty() {
        return Err("the identity assertion is empty".into());
    }
    Ok(text)
}

/// The IdP's token endpoint: configured, or named by its issuer's metadata.
async fn idp_token_endpoint(idp: &IdpConfig) -> Result<String, String> {
    if let Some(t) = &idp.token_endpoint {
        return Ok(t.clone());
    }
    let issuer = idp.issuer.as_deref().ok_or("no IdP configured")?;
    for url in discovery::as_candidates(issuer).map_err(|e| e.to_string())? {
        if let Some(doc) = web::get_json(&url).await.ok().flatten() {
            if let Some(t) = doc.get("token_endpoint").and_then(|t| t.as_str()) {
                return Ok(t.to_string());
            }
        }
    }
    Err(format!(
        "the IdP {issuer} publishes no metadata naming its token_endpoint (set idp_token_endpoint)"
    ))
}

/// RFC 8693 at the IdP: the ID-JAG.
async fn token_exchange(
    idp: &IdpConfig,
    env: &Env,
    assertion: &str,
    audience: &str,
    resource: &str,
    scope: Option<&str>,
) -> Result<String, String> {
    let endpoint = idp_token_endpoint(idp).await?;
    let secret = idp
        .client_secret_env
        .as_deref()
        .and_then(|v| env.var(v))
        .map(str::to_string)
        .filter(|s| !s.is_empty());
    let form = exchange_form(idp, assertion, audience, resource, scope, secret.is_some());
    let auth = secret.map(|s| basic(&idp.client_id, &s));
    let (status, v) = post_form(&endpoint, &form, auth).await?;
    if !status.is_success() {
        return Err(refused("the IdP's token exchange", status, &v));
    }
    if let Some(t) = v.get("issued_token_type").and_then(|t| t.as_str()) {
        if t != ID_JAG {
            return Err(format!("the IdP issued a {t}, not an ID-JAG"));
        }
    }
    v.get("access_token")
        .and_then(|t| t.as_str())
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or_else(|| "the IdP's token exchange answered no access_token".into())
}

/// RFC 7523 at the authorization server: the access token.
async fn jwt_bearer(
    auth_server: &AuthServer,
    client: &ClientReg,
    resource: &str,
    scope: Option<&str>,
    jag: &str,
    client_assertion: Option<String>,
) -> Result<Saved, String> {
    let form = bearer_form(client, jag, resource, scope, client_assertion);
    let auth = (client.auth_method == "client_secret_basic").then(|| {
        basic(
            &client.client_id,
            client.client_secret.as_deref().unwrap_or(""),
        )
    });
    let (status, v) = post_form(&auth_server.token_endpoint, &form, auth).await?;
    if !status.is_success() {
        return Err(refused("the authorization server", status, &v));
    }
    let t: oauth2::basic::BasicTokenResponse =
        serde_json::from_value(v).map_err(|e| format!("unreadable token response: {e}"))?;
    Ok(tokens::saved(
        &t,
        resource,
        auth_server,
        client,
        scope,
        None,
    ))
}

impl OAuth {
    /// The whole grant: discovery (once per token), the exchange at the IdP, the JWT-bearer
    /// grant at the authorization server.
    pub(super) async fn identity_assertion(
        &self,
        st: &mut State,
        scope: Option<String>,
    ) -> Result<(), String> {
        let idp = self
            .cfg
            .idp
            .as_ref()
            .ok_or("no IdP configured (idp_issuer or idp_token_endpoint)")?;
        let (found_as, resource) = self.found(st).await?;
        let (client, client_assertion) = self.as_client(&found_as)?;
        let scope = self.scope_or_configured(scope);
        let assertion = read_assertion(idp, &self.env)?;
        let audience = if found_as.issuer.is_empty() {
            found_as.token_endpoint.clone()
        } else {
            found_as.issuer.clone()
        };
        let jag = token_exchange(
            idp,
            &self.env,
            &assertion,
            &audience,
            &resource,
            scope.as_deref(),
        )
        .await?;
        let saved = jwt_bearer(
            &found_as,
            &client,
            &resource,
            scope.as_deref(),
            &jag,
            client_assertion,
        )
        .await?;
        self.keep(st, saved);
        Ok(())
    }
}

#[cfg(test)]
mod tests;

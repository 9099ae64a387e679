//! Finding a server's authorization server, per the MCP authorization spec: protected-resource
//! metadata (RFC 9728) from the `WWW-Authenticate` challenge, else path-based then at the root;
//! the authorization server's metadata (RFC 8414, then OpenID Connect discovery) at its
//! well-known places; the 2025-03-26 fallbacks (the MCP server's origin as the authorization
//! server, and its default endpoints) when neither is published.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::web::{get_json, WebError};

/// What a `WWW-Authenticate: Bearer ...` challenge says.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Challenge {
    pub resource_metadata: Option<String>,
    pub scope: Option<String>,
    pub error: Option<String>,
}

/// Parse the parameters of a Bearer challenge (quoted or bare values).
pub fn parse_challenge(header: &str) -> Challenge {
    let mut c = Challenge::default();
    let rest = header
        .trim()
        .strip_prefix("Bearer")
        .or_else(|| header.trim().strip_prefix("bearer"))
        .unwrap_or(header);
    let mut s = rest.trim_start();
    while !s.is_empty() {
        let Some(eq) = s.find('=') else { break };
        let key = s[..eq]
            .trim()
            .trim_start_matches(',')
            .trim()
            .to_ascii_lowercase();
        let after = s[eq + 1..].trim_start();
        let (value, next) = match after.strip_prefix('"') {
            Some(q) => match q.find('"') {
                Some(end) => (&q[..end], &q[end + 1..]),
                None => (q, ""),
            },
            None => match after.find(',') {
                Some(end) => (after[..end].trim(), &after[end..]),
                None => (after.trim(), ""),
            },
        };
        match key.as_str() {
            "resource_metadata" => c.resource_metadata = Some(value.to_string()),
            "scope" => c.scope = Some(value.to_string()),
            "error" => c.error = Some(value.to_string()),
            _ => {}
        }
        s = next.trim_start().trim_start_matches(',').trim_start();
    }
    c
}

/// An authorization server's endpoints and what it supports.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AuthServer {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    #[serde(default)]
    pub registration_endpoint: Option<String>,
    #[serde(default)]
    pub scopes_supported: Option<Vec<String>>,
    #[serde(default)]
    pub token_endpoint_auth_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub code_challenge_methods_supported: Option<Vec<String>>,
    #[serde(default)]
    pub client_id_metadata_document_supported: Option<bool>,
    /// No metadata was published: the 2025-03-26 default endpoints are used.
    #[serde(default)]
    pub fallback: bool,
}

/// What discovery found for one MCP server.
#[derive(Debug, Clone)]
pub struct Found {
    /// The resource to name in `resource=` (the PRM's `resource`, else the server's URL).
    pub resource: String,
    /// Scopes the protected resource says it supports.
    pub scopes_supported: Option<Vec<String>>,
    pub auth_server: AuthServer,
}

/// `scheme://host[:port]` of a URL, and its path without a trailing `/`.
pub fn split_url(url: &str) -> Result<(String, String), WebError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| WebError(format!("invalid URL {url}: {e}")))?;
    let (Some(scheme), Some(auth)) = (uri.scheme_str(), uri.authority()) else {
        return Err(WebError(format!("invalid URL {url}: not absolute")));
    };
    let path = uri.path().trim_end_matches('/').to_string();
    Ok((format!("{scheme}://{auth}"), path))
}

/// The places protected-resource metadata may be, in the spec's order.
pub fn prm_candidates(server_url: &str, challenge: &Challenge) -> Result<Vec<String>, WebError> {
    let mut out = Vec::new();
    if let Some(u) = &challenge.resource_metadata {
        out.push(u.clone());
    }
    let (origin, path) = split_url(server_url)?;
    if !path.is_empty() {
        out.push(format!(
            "{origin}/.well-known/oauth-protected-resource{path}"
        ));
    }
    out.push(format!("{origin}/.well-known/oauth-protected-resource"));
    Ok(out)
}

/// The places an authorization server's metadata may be, in the spec's order.
pub fn as_candidates(issuer: &str) -> Result<Vec<String>, WebError> {
    let (origin, path) = split_url(issuer)?;
    Ok(if path.is_empty() {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server"),
            format!("{origin}/.well-known/openid-configuration"),
        ]
    } else {
        vec![
            format!("{origin}/.well-known/oauth-authorization-server{path}"),
            format!("{origin}/.well-known/openid-configuration{path}"),
            format!("{origin}{path}/.well-known/openid-configuration"),
        ]
    })
}

/// Discover the authorization server of the MCP server at `server_url`.
pub async fn discover(server_url: &str, challenge: &Challenge) -> Result<Found, WebError> {
    let mut prm = None;
    for url in prm_candidates(server_url, challenge)? {
        if let Some(doc) = get_json(&url).await.ok().flatten() {
            prm = Some(doc);
            break;
        }
    }
    let (origin, _) = split_url(server_url)?;
    let (resource, scopes_supported, issuer) = match &prm {
        Some(doc) => {
            let issuer = doc
                .get("authorization_servers")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    WebError(
                        "the protected-resource metadata names no authorization_servers".into(),
                    )
                })?
                .to_string();
            let resource = doc
                .get("resource")
                .and_then(Value::as_str)
                .unwrap_or(server_url)
                .to_string();
            let scopes = doc.get("scopes_supported").and_then(strings);
            (resource, scopes, issuer)
        }
        // 2025-03-26: the MCP server's origin is the authorization server.
        None => (server_url.to_string(), None, origin.clone()),
    };
    let mut auth_server = None;
    for url in as_candidates(&issuer)? {
        if let Some(doc) = get_json(&url).await.ok().flatten() {
            if let Ok(meta) = serde_json::from_value::<AuthServer>(doc) {
                auth_server = Some(meta);
                break;
            }
        }
    }
    let auth_server = match auth_server {
        Some(a) => a,
        None if prm.is_none() => fallback(&origin),
        None => {
            return Err(WebError(format!(
                "authorization server {issuer} publishes no metadata (RFC 8414 or OpenID Connect discovery)"
            )))
        }
    };
    Ok(Found {
        resource,
        scopes_supported,
        auth_server,
    })
}

/// The 2025-03-26 default endpoints at the server's origin.
fn fallback(origin: &str) -> AuthServer {
    AuthServer {
        issuer: origin.to_string(),
        authorization_endpoint: format!("{origin}/authorize"),
        token_endpoint: format!("{origin}/token"),
        registration_endpoint: Some(format!("{origin}/register")),
        fallback: true,
        ..AuthServer::default()
    }
}

fn strings(v: &Value) -> Option<Vec<String>> {
    Some(
        v.as_array()?
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_string)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_parse() {
        let c = parse_challenge(
            "Bearer error=\"insufficient_scope\", scope=\"a b\", resource_metadata=\"https://x/.well-known/oauth-protected-resource/mcp\"",
        );
        assert_eq!(c.error.as_deref(), Some("insufficient_scope"));
        assert_eq!(c.scope.as_deref(), Some("a b"));
        assert_eq!(
            c.resource_metadata.as_deref(),
            Some("https://x/.well-known/oauth-protected-resource/mcp")
        );
        assert_eq!(parse_challenge("Bearer").scope, None);
        assert_eq!(
            parse_challenge("Bearer realm=mcp, scope=read")
                .scope
                .as_deref(),
            Some("read")
        );
    }

    #[test]
    fn well_known_places_in_order() {
        let c = Challenge::default();
        assert_eq!(
            prm_candidates("http://h:1/a/mcp", &c).unwrap(),
            vec![
                "http://h:1/.well-known/oauth-protected-resource/a/mcp",
                "http://h:1/.well-known/oauth-protected-resource"
            ]
        );
        assert_eq!(
            as_candidates("https://as/t1").unwrap(),
            vec![
                "https://as/.well-known/oauth-authorization-server/t1",
                "https://as/.well-known/openid-configuration/t1",
                "https://as/t1/.well-known/openid-configuration"
            ]
        );
        assert_eq!(as_candidates("https://as/").unwrap().len(), 2);
    }
}

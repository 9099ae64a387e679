//! The client-side features of `[mcp_servers.*]`: elicitation, sampling budgets and
//! `[mcp_servers.X.oauth]`.

use std::path::Path;

use toml::Spanned;

use super::error::{ConfigError, Cx};
use super::values::{key_path, mcp_server_key as key, resolve_path};
use crate::config::raw::RawMcpServer;
use crate::config::raw::RawOAuth;
use crate::config::{ElicitationMode, IdpConfig, OAuthConfig, OAuthGrant};

/// `elicitation`: `"ask"` (default) or `"decline"`.
///
/// `"ask"` by default: an elicitation is the server asking the person behind the session,
/// which is what the protocol means it for; where no one can be asked (runs, `POST /messages`)
/// it is declined anyway, with a logged reason, so the default never stalls a run.
pub(super) fn elicitation(
    cx: &Cx<'_>,
    name: &str,
    t: &RawMcpServer,
) -> Result<ElicitationMode, ConfigError> {
    let Some(v) = &t.elicitation else {
        return Ok(ElicitationMode::Ask);
    };
    Ok(
        match cx.choice(
            v,
            &key(name, "elicitation"),
            "elicitation",
            &["ask", "decline"],
        )? {
            "decline" => ElicitationMode::Decline,
            _ => ElicitationMode::Ask,
        },
    )
}

/// A count from 1 to `u32::MAX`, or `default`.
pub(super) fn count(
    cx: &Cx<'_>,
    v: Option<&Spanned<i64>>,
    key: &str,
    default: i64,
) -> Result<u32, ConfigError> {
    Ok(cx.int(v, key, default, 1, i64::from(u32::MAX))? as u32)
}

/// `[mcp_servers.X.oauth]`: only for an HTTP server.
pub(super) fn oauth(
    cx: &Cx<'_>,
    name: &str,
    t: &RawMcpServer,
    base_dir: &Path,
) -> Result<Option<OAuthConfig>, ConfigError> {
    let Some(table) = &t.oauth else {
        return Ok(None);
    };
    let k = |s: &str| key_path(&["mcp_servers", name, "oauth", s]);
    if t.url.is_none() {
        return Err(cx.err(
            table.span(),
            &key(name, "oauth"),
            "oauth only applies to an HTTP server (url); remove it for a stdio server (command)",
        ));
    }
    let o = table.get_ref();
    let grant = grant(cx, o.grant.as_ref(), &k("grant"))?;
    let client_id = match &o.client_id {
        None => None,
        Some(v) => Some(cx.non_empty(v, &k("client_id"), "the client id")?),
    };
    if grant != OAuthGrant::AuthorizationCode && client_id.is_none() {
        let g = o.grant.as_ref().map_or("", |g| g.get_ref().as_str());
        return Err(cx.err(
            table.span(),
            &k("client_id"),
            format!("grant = \"{g}\" needs the client_id the authorization server issued"),
        ));
    }
    let idp = (grant == OAuthGrant::IdentityAssertion)
        .then(|| idp(cx, o, base_dir, &k, table.span()))
        .transpose()?;
    let client_metadata_url = match &o.client_metadata_url {
        None => None,
        Some(v) => Some(cx.http_url(
            v,
            &k("client_metadata_url"),
            "https://example.com/turnstile-client.json",
        )?),
    };
    let mut scopes = Vec::new();
    for s in o.scopes.iter().flatten() {
        scopes.push(cx.non_empty(s, &k("scopes"), "a scope")?);
    }
    let private_key_file = match &o.private_key_file {
        None => None,
        Some(v) => Some(resolve_path(
            base_dir,
            Path::new(&cx.non_empty(v, &k("private_key_file"), "the path")?),
        )),
    };
    let signing_algorithm = match &o.signing_algorithm {
        None => "ES256".to_string(),
        Some(v) => cx
            .choice(
                v,
                &k("signing_algorithm"),
                "signing algorithm",
                &["ES256", "RS256"],
            )?
            .to_string(),
    };
    Ok(Some(OAuthConfig {
        grant,
        client_id,
        client_secret_env: cx
            .env_var_name(o.client_secret_env.as_ref(), &k("client_secret_env"))?,
        client_metadata_url,
        scopes,
        private_key_file,
        signing_algorithm,
        redirect_port: cx.int(o.redirect_port.as_ref(), &k("redirect_port"), 0, 0, 65535)? as u16,
        idp,
    }))
}

/// The IdP keys of `grant = "identity_assertion"`: where its token endpoint is (given, or
/// from its issuer's metadata), this client there, and where the identity assertion is read
/// (a variable or a file, never the config itself).
fn idp(
    cx: &Cx<'_>,
    o: &RawOAuth,
    base_dir: &Path,
    k: &dyn Fn(&str) -> String,
    span: std::ops::Range<usize>,
) -> Result<IdpConfig, ConfigError> {
    let need = |key: &str, what: &str| {
        cx.err(
            span.clone(),
            &k(key),
            format!("grant = \"identity_assertion\" needs {what}"),
        )
    };
    let url = |v: &Option<Spanned<String>>, key: &str| {
        v.as_ref()
            .map(|v| cx.http_url(v, &k(key), "https://idp.example.com"))
            .transpose()
    };
    let token_endpoint = url(&o.idp_token_endpoint, "idp_token_endpoint")?;
    let issuer = url(&o.idp_issuer, "idp_issuer")?;
    if token_endpoint.is_none() && issuer.is_none() {
        return Err(need(
            "idp_issuer",
            "the enterprise IdP: idp_issuer (its metadata names the token endpoint) or idp_token_endpoint",
        ));
    }
    let client_id = match &o.idp_client_id {
        Some(v) => cx.non_empty(v, &k("idp_client_id"), "the IdP client id")?,
        None => {
            return Err(need(
                "idp_client_id",
                "this client's id at the IdP (idp_client_id)",
            ))
        }
    };
    let assertion_env = cx.env_var_name(
        o.identity_assertion_env.as_ref(),
        &k("identity_assertion_env"),
    )?;
    let assertion_file = match &o.identity_assertion_file {
        None => None,
        Some(v) => Some(resolve_path(
            base_dir,
            Path::new(&cx.non_empty(v, &k("identity_assertion_file"), "the path")?),
        )),
    };
    if assertion_env.is_some() == assertion_file.is_some() {
        return Err(need(
            "identity_assertion_env",
            "one of identity_assertion_env (a variable) or identity_assertion_file (a file) holding the user's identity assertion",
        ));
    }
    let assertion_type = match &o.identity_assertion_type {
        None => "id_token".to_string(),
        Some(v) => cx
            .choice(
                v,
                &k("identity_assertion_type"),
                "identity assertion type",
                &["id_token", "saml2"],
            )?
            .to_string(),
    };
    Ok(IdpConfig {
        token_endpoint,
        issuer,
        client_id,
        client_secret_env: cx.env_var_name(
            o.idp_client_secret_env.as_ref(),
            &k("idp_client_secret_env"),
        )?,
        assertion_env,
        assertion_file,
        assertion_type,
    })
}

/// `grant`: `"authorization_code"` (default), `"client_credentials"` or `"identity_assertion"`.
fn grant(cx: &Cx<'_>, v: Option<&Spanned<String>>, key: &str) -> Result<OAuthGrant, ConfigError> {
    let Some(v) = v else {
        return Ok(OAuthGrant::AuthorizationCode);
    };
    Ok(
        match cx.choice(
            v,
            key,
            "grant",
            &[
                "authorization_code",
                "client_credentials",
                "identity_assertion",
            ],
        )? {
            "client_credentials" => OAuthGrant::ClientCredentials,
            "identity_assertion" => OAuthGrant::IdentityAssertion,
            _ => OAuthGrant::AuthorizationCode,
        },
    )
}

#[cfg(test)]
#[path = "mcp_client_tests.rs"]
mod tests;

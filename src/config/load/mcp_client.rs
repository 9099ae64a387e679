//! The client-side features of `[mcp_servers.*]`: elicitation, sampling budgets and
//! `[mcp_servers.X.oauth]`.

use std::path::Path;

use toml::Spanned;

use super::mcp_servers::key;
use super::values::key_path;
use super::{resolve_path, ConfigError, Cx};
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
mod tests {
    use super::super::test_support::*;
    use crate::config::{ElicitationMode, OAuthGrant};

    #[test]
    fn client_features_have_defaults_and_are_validated() {
        let c = ok("[mcp_servers.m]\nurl = \"http://127.0.0.1:1/mcp\"\n");
        let m = &c.mcp_servers[0];
        assert_eq!(m.elicitation, ElicitationMode::Ask);
        assert!(!m.sampling);
        assert_eq!(
            (m.sampling_max_tokens, m.sampling_calls_per_turn),
            (1024, 4)
        );
        assert!(m.oauth.is_none());
        assert_eq!(c.agents[0].elicitation_tool, "elicitation");
        let c = ok("[server]\nsecret_key_env = \"K\"\n[agents.a]\nelicitation_tool = \"ask_user\"\n[mcp_servers.m]\nurl = \"http://127.0.0.1:1/mcp\"\nelicitation = \"decline\"\nsampling = true\nsampling_max_tokens = 9\nsampling_calls_per_turn = 2\n[mcp_servers.m.oauth]\ngrant = \"client_credentials\"\nclient_id = \"c\"\nclient_secret_env = \"S\"\nscopes = [\"read\"]\n");
        let m = &c.mcp_servers[0];
        assert_eq!(m.elicitation, ElicitationMode::Decline);
        assert!(m.sampling);
        assert_eq!((m.sampling_max_tokens, m.sampling_calls_per_turn), (9, 2));
        let o = m.oauth.as_ref().unwrap();
        assert_eq!(o.grant, OAuthGrant::ClientCredentials);
        assert_eq!(o.client_id.as_deref(), Some("c"));
        assert_eq!(o.scopes, vec!["read".to_string()]);
        assert_eq!(c.server.secret_key_env.as_deref(), Some("K"));
        assert_eq!(c.agents[0].elicitation_tool, "ask_user");
        let e = bad("[mcp_servers.m]\nurl = \"http://127.0.0.1:1/mcp\"\nelicitation = \"maybe\"\n")
            .to_string();
        assert!(e.contains("mcp_servers.m.elicitation"), "{e}");
        let e = bad("[mcp_servers.m]\ncommand = \"x\"\n[mcp_servers.m.oauth]\n").to_string();
        assert!(e.contains("oauth only applies to an HTTP server"), "{e}");
        let e = bad("[mcp_servers.m]\nurl = \"http://127.0.0.1:1/mcp\"\n[mcp_servers.m.oauth]\ngrant = \"client_credentials\"\n").to_string();
        assert!(e.contains("client_id"), "{e}");
    }

    #[test]
    fn identity_assertion_grant_needs_its_idp_and_an_assertion() {
        let head = "[mcp_servers.m]\nurl = \"http://127.0.0.1:1/mcp\"\n[mcp_servers.m.oauth]\ngrant = \"identity_assertion\"\nclient_id = \"c\"\n";
        let c = ok(&format!("{head}idp_issuer = \"https://idp.example.com\"\nidp_client_id = \"i\"\nidp_client_secret_env = \"IDP_SECRET\"\nidentity_assertion_env = \"ID_TOKEN\"\n"));
        let o = c.mcp_servers[0].oauth.as_ref().unwrap();
        assert_eq!(o.grant, OAuthGrant::IdentityAssertion);
        let idp = o.idp.as_ref().unwrap();
        assert_eq!(idp.issuer.as_deref(), Some("https://idp.example.com"));
        assert_eq!(idp.client_id, "i");
        assert_eq!(idp.client_secret_env.as_deref(), Some("IDP_SECRET"));
        assert_eq!(idp.assertion_env.as_deref(), Some("ID_TOKEN"));
        assert_eq!(idp.assertion_type, "id_token");
        let e = bad(&format!(
            "{head}idp_client_id = \"i\"\nidentity_assertion_env = \"T\"\n"
        ))
        .to_string();
        assert!(
            e.contains("idp_issuer") && e.contains("idp_token_endpoint"),
            "{e}"
        );
        let e = bad(&format!(
            "{head}idp_token_endpoint = \"https://idp/token\"\nidp_client_id = \"i\"\n"
        ))
        .to_string();
        assert!(
            e.contains("identity_assertion_env") && e.contains("identity_assertion_file"),
            "{e}"
        );
        let e = bad(&format!("{head}idp_token_endpoint = \"https://idp/token\"\nidentity_assertion_file = \"t.jwt\"\n")).to_string();
        assert!(e.contains("idp_client_id"), "{e}");
    }
}

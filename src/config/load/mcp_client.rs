//! The client-side features of `[mcp_servers.*]`: elicitation, sampling budgets and
//! `[mcp_servers.X.oauth]`.

use std::path::Path;

use toml::Spanned;

use super::mcp_servers::key;
use super::values::key_path;
use super::{resolve_path, ConfigError, Cx};
use crate::config::raw::RawMcpServer;
use crate::config::{ElicitationMode, OAuthConfig, OAuthGrant};

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
    if grant == OAuthGrant::ClientCredentials && client_id.is_none() {
        return Err(cx.err(
            table.span(),
            &k("client_id"),
            "grant = \"client_credentials\" needs the client_id the authorization server issued",
        ));
    }
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
    }))
}

/// `grant`: `"authorization_code"` (default) or `"client_credentials"`.
fn grant(cx: &Cx<'_>, v: Option<&Spanned<String>>, key: &str) -> Result<OAuthGrant, ConfigError> {
    let Some(v) = v else {
        return Ok(OAuthGrant::AuthorizationCode);
    };
    Ok(
        match cx.choice(
            v,
            key,
            "grant",
            &["authorization_code", "client_credentials"],
        )? {
            "client_credentials" => OAuthGrant::ClientCredentials,
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
}

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
    let e = bad(&format!(
        "{head}idp_token_endpoint = \"https://idp/token\"\nidentity_assertion_file = \"t.jwt\"\n"
    ))
    .to_string();
    assert!(e.contains("idp_client_id"), "{e}");
}

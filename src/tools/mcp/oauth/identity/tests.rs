use super::*;

fn idp() -> IdpConfig {
    IdpConfig {
        token_endpoint: Some("https://idp.example.com/token".into()),
        client_id: "turnstile-at-idp".into(),
        assertion_env: Some("ID_TOKEN".into()),
        assertion_type: "id_token".into(),
        ..IdpConfig::default()
    }
}

fn get<'a>(f: &'a [(&'static str, String)], k: &str) -> Option<&'a str> {
    f.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str())
}

#[test]
fn token_exchange_asks_the_idp_for_an_id_jag_for_this_server() {
    let f = exchange_form(
        &idp(),
        "eyJ.id.token",
        "https://as.example.com",
        "https://mcp.example.com/mcp",
        Some("read write"),
        false,
    );
    assert_eq!(get(&f, "grant_type"), Some(TOKEN_EXCHANGE));
    assert_eq!(
        get(&f, "requested_token_type"),
        Some("urn:ietf:params:oauth:token-type:id-jag")
    );
    assert_eq!(get(&f, "subject_token"), Some("eyJ.id.token"));
    assert_eq!(
        get(&f, "subject_token_type"),
        Some("urn:ietf:params:oauth:token-type:id_token")
    );
    assert_eq!(get(&f, "audience"), Some("https://as.example.com"));
    assert_eq!(get(&f, "resource"), Some("https://mcp.example.com/mcp"));
    assert_eq!(get(&f, "scope"), Some("read write"));
    assert_eq!(get(&f, "client_id"), Some("turnstile-at-idp"));
    // With a secret, the client authenticates in the header and the form has no id.
    let mut saml = idp();
    saml.assertion_type = "saml2".into();
    let f = exchange_form(&saml, "PHNhbWw+", "a", "r", None, true);
    assert_eq!(get(&f, "client_id"), None);
    assert_eq!(get(&f, "scope"), None);
    assert_eq!(
        get(&f, "subject_token_type"),
        Some("urn:ietf:params:oauth:token-type:saml2")
    );
}

#[test]
fn jwt_bearer_presents_the_id_jag_with_the_client_authentication() {
    let reg = |m: &str| ClientReg {
        client_id: "c".into(),
        client_secret: Some("s".into()),
        auth_method: m.into(),
        redirect_uri: None,
    };
    let f = bearer_form(&reg("client_secret_basic"), "jag", "https://r", None, None);
    assert_eq!(get(&f, "grant_type"), Some(JWT_BEARER));
    assert_eq!(get(&f, "assertion"), Some("jag"));
    assert_eq!(get(&f, "resource"), Some("https://r"));
    assert_eq!(get(&f, "client_id"), None);
    assert_eq!(get(&f, "client_secret"), None);
    let f = bearer_form(&reg("client_secret_post"), "jag", "r", Some("x"), None);
    assert_eq!(get(&f, "client_secret"), Some("s"));
    assert_eq!(get(&f, "scope"), Some("x"));
    let f = bearer_form(
        &reg("private_key_jwt"),
        "jag",
        "r",
        None,
        Some("signed".into()),
    );
    assert_eq!(get(&f, "client_assertion"), Some("signed"));
    assert_eq!(get(&f, "client_secret"), None);
    // RFC 6749 §2.3.1: both halves form-encoded before base64.
    assert_eq!(basic("a:b", "c d"), "Basic YSUzQWI6Yytk");
}

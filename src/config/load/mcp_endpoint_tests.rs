use super::super::test_support::{bad, ok};

#[test]
fn off_by_default_and_the_default_agent() {
    let c = ok("[agents.a]\n[agents.b]\n");
    assert!(!c.mcp_endpoint.enabled);
    let c = ok("[agents.a]\n[agents.b]\n[mcp_endpoint]\nenabled = true\n");
    assert!(c.mcp_endpoint.enabled);
    assert_eq!(c.mcp_endpoint.agents, vec!["a".to_string()]);
    let c = ok("[agents.a]\n[agents.b]\n[mcp_endpoint]\nenabled = true\nagents = [\"b\", \"a\"]\n");
    assert_eq!(
        c.mcp_endpoint.agents,
        vec!["b".to_string(), "a".to_string()]
    );
}

#[test]
fn unknown_twice_empty_and_unknown_keys_are_errors() {
    let e = bad("[agents.a]\n[mcp_endpoint]\nenabled = true\nagents = [\"zed\"]\n");
    assert_eq!(
        (e.line, e.key.as_deref()),
        (Some(4), Some("mcp_endpoint.agents"))
    );
    assert!(e.message.contains("no agent named \"zed\"") && e.message.contains("a"));
    let e = bad("[agents.a]\n[mcp_endpoint]\nagents = [\"a\", \"a\"]\n");
    assert!(e.message.contains("listed twice"), "{}", e.message);
    let e = bad("[agents.a]\n[mcp_endpoint]\nagents = []\n");
    assert!(e.message.contains("names no agent"), "{}", e.message);
    let e = bad("[mcp_endpoint]\nenable = true\n");
    assert!(e.to_string().contains("enable"), "{e}");
}

#[test]
fn sessions_end_after_5_minutes_idle_and_park_after_30_s_by_default() {
    use std::time::Duration;
    let c = ok("[agents.a]\n");
    assert_eq!(c.mcp_endpoint.session_idle, Duration::from_secs(300));
    assert_eq!(c.mcp_endpoint.session_park, Duration::from_secs(30));
    let c = ok("[agents.a]\n[mcp_endpoint]\nsession_idle_s = 2\nsession_park_s = 1\n");
    assert_eq!(c.mcp_endpoint.session_idle, Duration::from_secs(2));
    assert_eq!(c.mcp_endpoint.session_park, Duration::from_secs(1));
    let e = bad("[agents.a]\n[mcp_endpoint]\nsession_idle_s = 0\n");
    assert_eq!(
        (e.line, e.key.as_deref()),
        (Some(3), Some("mcp_endpoint.session_idle_s"))
    );
}

#[test]
fn names_are_federated_by_default_or_the_servers_own() {
    use crate::config::EndpointNames;
    let c = ok("[agents.a]\n[mcp_endpoint]\n");
    assert_eq!(c.mcp_endpoint.names, EndpointNames::Federated);
    let c = ok("[agents.a]\n[mcp_endpoint]\nnames = \"own\"\n");
    assert_eq!(c.mcp_endpoint.names, EndpointNames::Own);
    let e = bad("[agents.a]\n[mcp_endpoint]\nnames = \"bare\"\n");
    assert_eq!(
        (e.line, e.key.as_deref()),
        (Some(3), Some("mcp_endpoint.names"))
    );
    assert!(
        e.to_string().contains(r#"expected "federated" or "own""#),
        "{e}"
    );
}

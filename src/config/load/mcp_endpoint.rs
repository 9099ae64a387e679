//! `[mcp_endpoint]`: `/mcp`, the agents' federated tools for MCP clients.

use toml::Spanned;

use super::{ConfigError, Cx};
use crate::config::raw::RawMcpEndpoint;
use crate::config::{AgentConfig, EndpointNames, McpEndpointConfig};

pub(super) fn mcp_endpoint(
    cx: &Cx<'_>,
    raw: Option<&Spanned<RawMcpEndpoint>>,
    agents: &[AgentConfig],
) -> Result<McpEndpointConfig, ConfigError> {
    let Some(raw) = raw else {
        return Ok(McpEndpointConfig::default());
    };
    let t = raw.get_ref();
    let known = || {
        agents
            .iter()
            .map(|a| a.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut names: Vec<String> = Vec::new();
    for v in t.agents.iter().flatten() {
        let name = v.get_ref();
        if !agents.iter().any(|a| &a.name == name) {
            return Err(cx.err(
                v.span(),
                "mcp_endpoint.agents",
                format!(
                    "no agent named {name:?}; the agents are: {} (each needs an [agents.NAME] table)",
                    known()
                ),
            ));
        }
        if names.contains(name) {
            return Err(cx.err(
                v.span(),
                "mcp_endpoint.agents",
                format!("{name:?} is listed twice; name each agent once"),
            ));
        }
        names.push(name.clone());
    }
    if t.agents.as_ref().is_some_and(Vec::is_empty) {
        return Err(cx.err(
            raw.span(),
            "mcp_endpoint.agents",
            format!(
                "names no agent; list whose tool sets /mcp serves (the agents are: {}), or leave the key out for the default agent",
                known()
            ),
        ));
    }
    if names.is_empty() {
        names.extend(agents.first().map(|a| a.name.clone()));
    }
    let naming = match &t.names {
        None => EndpointNames::Federated,
        Some(v) => match cx.choice(v, "mcp_endpoint.names", "naming", &["federated", "own"])? {
            "own" => EndpointNames::Own,
            _ => EndpointNames::Federated,
        },
    };
    let defaults = McpEndpointConfig::default();
    Ok(McpEndpointConfig {
        enabled: t.enabled.unwrap_or(false),
        agents: names,
        names: naming,
        session_idle: cx.secs(
            t.session_idle_s.as_ref(),
            "mcp_endpoint.session_idle_s",
            defaults.session_idle.as_secs() as i64,
        )?,
        session_park: cx.secs(
            t.session_park_s.as_ref(),
            "mcp_endpoint.session_park_s",
            defaults.session_park.as_secs() as i64,
        )?,
    })
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{bad, ok};

    #[test]
    fn off_by_default_and_the_default_agent() {
        let c = ok("[agents.a]\n[agents.b]\n");
        assert!(!c.mcp_endpoint.enabled);
        let c = ok("[agents.a]\n[agents.b]\n[mcp_endpoint]\nenabled = true\n");
        assert!(c.mcp_endpoint.enabled);
        assert_eq!(c.mcp_endpoint.agents, vec!["a".to_string()]);
        let c =
            ok("[agents.a]\n[agents.b]\n[mcp_endpoint]\nenabled = true\nagents = [\"b\", \"a\"]\n");
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
}

//! `[mcp_endpoint]`: `/mcp`, the agents' federated tools for MCP clients.

use toml::Spanned;

use super::error::{ConfigError, Cx};
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
#[path = "mcp_endpoint_tests.rs"]
mod tests;

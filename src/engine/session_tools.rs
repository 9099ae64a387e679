//! Which tools a session's agent has, which it offers the model, and where a call goes.
//!
//! Built per model step from the agent's config, the tool host's snapshot and the session's
//! record, so a changed tool list or a changed grant applies from the next step on.

use crate::config::{AgentConfig, Verdict};
use crate::engine::session_record::SessionRecord;
use crate::engine::types::Client;
use crate::message::ToolSpec;
use crate::tools::ServerTool;
use crate::upstream::ToolDef;

/// The server tools an agent exposes (`GET /meta`): those its `tools` globs match and policy
/// does not deny.
pub fn exposed<'a>(agent: &AgentConfig, host: &'a [ServerTool]) -> Vec<&'a ServerTool> {
    host.iter()
        .filter(|t| t.verdict != Verdict::Deny && agent.tool_globs.is_match(&t.spec.name))
        .collect()
}

/// Every tool name of an agent as `/meta` lists it, enabled or not: a client tool may not take
/// one. Policy-denied tools are not among them (they are not in `/meta` either).
pub fn agent_tool_names<'a>(
    agent: &'a AgentConfig,
    host: &'a [ServerTool],
) -> impl Iterator<Item = &'a str> + 'a {
    exposed(agent, host)
        .into_iter()
        .map(|t| t.spec.name.as_str())
}

/// Where one tool call goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// A client tool: the turn stops for its result.
    Client,
    /// A server tool both the operator and the session trust: run now.
    Inline,
    /// A server tool that needs the client's permission.
    Ask,
    /// Not to be run; the model gets this message as an error result.
    Refuse(String),
}

/// The tools of one session at one step.
pub struct Catalog<'a> {
    client: &'a [ToolSpec],
    /// Enabled server tools with the session's trust in each.
    server: Vec<(&'a ServerTool, bool)>,
    /// Every server tool the host has (to tell "denied" from "unknown").
    all: &'a [ServerTool],
    agent: &'a AgentConfig,
    /// Whether a client attends, to run client tools and answer permissions.
    attendance: Client,
}

impl<'a> Catalog<'a> {
    pub fn new(
        agent: &'a AgentConfig,
        host: &'a [ServerTool],
        record: &'a SessionRecord,
        attendance: Client,
    ) -> Catalog<'a> {
        let server = exposed(agent, host)
            .into_iter()
            .filter_map(|t| match &record.tools {
                None => Some((t, true)),
                Some(grants) => grants
                    .iter()
                    .find(|g| g.name == t.spec.name)
                    .map(|g| (t, g.trust)),
            })
            .collect();
        Catalog {
            client: &record.client_tools,
            server,
            all: host,
            agent,
            attendance,
        }
    }

    /// The tools offered to the model: client tools, then enabled server tools.
    pub fn offered(&self) -> Vec<ToolDef> {
        // The elicitation tool is the channel of MCP servers' questions to the person.
        let channel = &self.agent.elicitation_tool;
        let client = self
            .client
            .iter()
            .filter(|t| &t.name != channel)
            .map(|t| ToolDef {
                name: t.name.clone(),
                description: t.description.clone(),
                parameters: t.parameters.clone(),
            });
        let server = self.server.iter().map(|(t, _)| ToolDef {
            name: t.spec.name.clone(),
            description: t.spec.description.clone(),
            parameters: t.spec.parameters.clone(),
        });
        client.chain(server).collect()
    }

    pub fn route(&self, name: &str) -> Route {
        if name == self.agent.elicitation_tool {
            return Route::Refuse(format!(
                "Tool {name} is not a tool to call: it carries MCP servers' questions to the user."
            ));
        }
        if self.client.iter().any(|t| t.name == name) {
            return match self.attendance {
                Client::Attends => Route::Client,
                Client::Absent { attend_at } => Route::Refuse(format!(
                    "Tool {name} is a client tool and no client is attached to run it; \
                     client tools run only in turns made with {attend_at}."
                )),
            };
        }
        if let Some((tool, session_trust)) = self.server.iter().find(|(t, _)| t.spec.name == name) {
            return match tool.verdict {
                Verdict::Trust if *session_trust => Route::Inline,
                Verdict::Deny => Route::Refuse(format!("Tool {name} is denied by policy.")),
                _ => match self.attendance {
                    Client::Attends => Route::Ask,
                    Client::Absent { attend_at } => Route::Refuse(format!(
                        "Tool {name} needs a client's permission and none can be asked here; \
                         call it in a turn made with {attend_at}, where the client \
                         can grant it, or have the operator trust it."
                    )),
                },
            };
        }
        match self.all.iter().find(|t| t.spec.name == name) {
            Some(t) if t.verdict == Verdict::Deny => {
                Route::Refuse(format!("Tool {name} is denied by policy."))
            }
            Some(t) if self.agent.tool_globs.is_match(&t.spec.name) => {
                Route::Refuse(format!("Tool {name} is not enabled for this session."))
            }
            _ => Route::Refuse(format!("Unknown tool {name}.")),
        }
    }

    /// Re-check a call the client granted: policy may have changed since the turn stopped.
    pub fn route_granted(&self, name: &str) -> Route {
        match self.server.iter().find(|(t, _)| t.spec.name == name) {
            Some((t, _)) if t.verdict != Verdict::Deny => Route::Inline,
            _ => match self.route(name) {
                Route::Refuse(msg) => Route::Refuse(msg),
                _ => Route::Refuse(format!("Tool {name} is no longer available.")),
            },
        }
    }
}

//! A session's settings: made with the session, changed by a turn's update, and validated
//! against the agent either way; written to the sessions table.

use super::engine_handle::Engine;
use super::session::Session;
use super::session_record::SessionRecord;
use super::session_tools;
use super::types::{EngineError, SessionUpdate};
use std::borrow::Cow;
use std::sync::Arc;

use crate::config::{AgentConfig, Config};
use crate::log::SessionRow;

/// An agent as a principal sees it, in the configuration of the moment it was asked for (a
/// reload that replaces the configuration does not change it): no copy of the agent unless
/// the principal's `tools` narrow it.
pub(crate) enum AgentRef {
    Configured(Arc<Config>, usize),
    Narrowed(Box<AgentConfig>),
}

impl std::ops::Deref for AgentRef {
    type Target = AgentConfig;

    fn deref(&self) -> &AgentConfig {
        match self {
            AgentRef::Configured(config, at) => &config.agents[*at],
            AgentRef::Narrowed(agent) => agent,
        }
    }
}

impl Engine {
    pub(crate) fn persist(&self, session: &Session) {
        let record = session.record();
        let ticket = self.inner.store.put_session(SessionRow {
            id: session.id.to_string(),
            owner: session.owner.clone(),
            created_at: session.created_at.clone(),
            record: serde_json::to_string(&record).unwrap_or_default(),
        });
        let mut st = session.lock();
        st.record_stored(ticket);
    }

    /// Agent `name` of a session of `session`'s owner, as its principal sees it (its tools
    /// narrowed by `[keys.NAME] tools`): `forbidden` when the principal may not use it (its
    /// `agents` no longer name it), a conflict when it is no longer configured.
    pub(crate) fn agent_of(&self, session: &Session, name: &str) -> Result<AgentRef, EngineError> {
        self.agent_for(session.owner.as_deref(), name)
            .map_err(|e| match e {
                EngineError::Invalid(_) => EngineError::Conflict(format!(
                    "the session's agent {name:?} is no longer configured"
                )),
                e => e,
            })
    }

    /// Agent `name` for a principal of this owner id: `forbidden` when it may not use it, an
    /// invalid request when there is no such agent.
    pub(crate) fn agent_for(
        &self,
        owner: Option<&str>,
        name: &str,
    ) -> Result<AgentRef, EngineError> {
        let snapshot = self.inner.config();
        let config = &*snapshot;
        let Some(at) = config.agents.iter().position(|a| a.name == name) else {
            return Err(EngineError::Invalid(format!(
                "unknown agent {name:?}; GET /meta lists the agents: {}",
                agent_names(config, owner)
            )));
        };
        let agent = config.agent_as(owner, name).ok_or_else(|| {
            EngineError::Forbidden(format!(
                "this key may not use agent {name:?} ([keys] agents in tools.toml); GET /meta lists the agents it may use: {}",
                agent_names(config, owner)
            ))
        })?;
        Ok(match agent {
            Cow::Borrowed(_) => AgentRef::Configured(snapshot.clone(), at),
            Cow::Owned(narrowed) => AgentRef::Narrowed(Box::new(narrowed)),
        })
    }

    /// Validate overrides against the agent and apply them to a record.
    pub(crate) fn apply_update(
        &self,
        agent: &AgentConfig,
        record: &mut SessionRecord,
        update: SessionUpdate,
    ) -> Result<(), EngineError> {
        let host = self.inner.tools.tools();
        if let Some(tools) = &update.tools {
            let exposed = session_tools::exposed(agent, &host);
            let mut seen = std::collections::HashSet::new();
            for g in tools {
                if !exposed.iter().any(|t| t.spec.name == g.name) {
                    let names: Vec<&str> = exposed.iter().map(|t| t.spec.name.as_str()).collect();
                    return Err(EngineError::Invalid(format!(
                        "agent.tools names {:?}, which agent {:?} does not expose; GET /meta lists its tools: [{}]",
                        g.name, agent.name, names.join(", ")
                    )));
                }
                if !seen.insert(g.name.as_str()) {
                    return Err(EngineError::Invalid(format!(
                        "agent.tools names {:?} twice; name each tool once",
                        g.name
                    )));
                }
            }
        }
        if let Some(options) = &update.options {
            for (k, v) in options {
                validate_option(agent, k, v)?;
            }
        }
        if let Some(client_tools) = &update.client_tools {
            let mut seen = std::collections::HashSet::new();
            for t in client_tools {
                if t.name.is_empty() {
                    return Err(EngineError::Invalid(
                        "a client tool has an empty name".into(),
                    ));
                }
                if !seen.insert(t.name.as_str()) {
                    return Err(EngineError::Invalid(format!(
                        "client tool {:?} is declared twice; tool names must be unique",
                        t.name
                    )));
                }
                if session_tools::agent_tool_names(agent, &host).any(|n| n == t.name) {
                    return Err(EngineError::Invalid(format!(
                        "client tool {:?} has the name of one of agent {:?}'s tools; tool names must be unique across the client's and the agent's tools: rename the client tool",
                        t.name, agent.name
                    )));
                }
                if !t.parameters.is_object() {
                    return Err(EngineError::Invalid(format!(
                        "client tool {:?}: parameters must be a JSON Schema object",
                        t.name
                    )));
                }
            }
        }
        if let Some(tools) = update.tools {
            record.tools = Some(tools);
        }
        if let Some(options) = update.options {
            record.options.extend(options);
        }
        if let Some(client_tools) = update.client_tools {
            record.client_tools = client_tools;
        }
        Ok(())
    }
}

pub(crate) fn is_empty_update(u: &SessionUpdate) -> bool {
    u.tools.is_none() && u.options.is_none() && u.client_tools.is_none()
}

/// The agents a principal of this owner id may use, for messages.
pub(crate) fn agent_names(config: &Config, owner: Option<&str>) -> String {
    config
        .agents_of(owner)
        .iter()
        .map(|a| a.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The AAP options an agent offers: `thinking` always, `model` when `models` is set.
pub(super) fn validate_option(
    agent: &AgentConfig,
    key: &str,
    value: &str,
) -> Result<(), EngineError> {
    match key {
        "thinking" if value == "on" || value == "off" => Ok(()),
        "thinking" => Err(EngineError::Invalid(format!(
            "option thinking must be \"on\" or \"off\", not {value:?}"
        ))),
        "model" if !agent.models.is_empty() => {
            if agent.models.iter().any(|m| m == value) {
                Ok(())
            } else {
                Err(EngineError::Invalid(format!(
                    "option model must be one of [{}], not {value:?}",
                    agent.models.join(", ")
                )))
            }
        }
        _ => Err(EngineError::Invalid(format!(
            "agent {:?} has no option {key:?}; GET /meta lists its options",
            agent.name
        ))),
    }
}

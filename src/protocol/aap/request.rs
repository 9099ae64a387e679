//! AAP v3 request shapes (see the AAP schema page), parsed strictly so that a typo is a clear
//! 400 rather than a silently ignored field.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

use crate::engine::ToolGrant;
use crate::message::{Content, Message, ToolSpec};

/// The AAP protocol version served.
pub(crate) const VERSION: u32 = 3;

/// `stream`: how the turn's response is sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StreamMode {
    Delta,
    Message,
    #[default]
    None,
}

/// AAP `AgentConfig`: the agent a session picks (`name` required at creation, forbidden to change later).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentSelection {
    pub name: Option<String>,
    pub tools: Option<Vec<ToolGrant>>,
    pub options: Option<BTreeMap<String, String>>,
}

/// `POST /sessions`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateSession {
    pub agent: Option<AgentSelection>,
    #[serde(default)]
    pub messages: Vec<Message>,
    #[serde(default)]
    pub tools: Vec<ToolSpec>,
    /// Accepted for older clients; creating a session never runs the agent.
    #[serde(default)]
    #[allow(dead_code)]
    pub stream: Option<StreamMode>,
}

/// One message of a turn request.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum TurnMessage {
    User {
        content: Content,
    },
    Tool {
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        content: Content,
        /// Not in AAP; lets a client say its tool failed.
        #[serde(default, rename = "isError")]
        is_error: bool,
    },
    ToolPermission {
        #[serde(rename = "toolCallId")]
        tool_call_id: String,
        granted: bool,
        #[serde(default)]
        reason: Option<String>,
    },
    /// Accepted by the parser only to say clearly that it cannot be sent.
    System {
        #[allow(dead_code)]
        content: Value,
    },
    Assistant {
        #[allow(dead_code)]
        content: Value,
    },
}

/// `POST /sessions/{id}/turns`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StartTurn {
    pub agent: Option<AgentSelection>,
    #[serde(default)]
    pub stream: StreamMode,
    pub messages: Vec<TurnMessage>,
    pub tools: Option<Vec<ToolSpec>>,
}

//! What a session keeps besides its events: its record (agent, tool grants, options, client
//! tools, seed, the bindings of calls that asked for permission), the calls it waits on, and the
//! plan decisions its history carries.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::message::{Message, ToolCall, ToolSpec};

/// A server tool enabled for a session, and whether the session trusts it (AAP `ServerToolRef`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolGrant {
    pub name: String,
    #[serde(default)]
    pub trust: bool,
}

/// What is persisted about a session besides its events.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionRecord {
    pub agent: String,
    /// `None`: made without an `agent` object, so every permitted tool is enabled and trusted
    /// per policy. `Some(list)`: exactly these server tools are enabled.
    pub tools: Option<Vec<ToolGrant>>,
    pub options: BTreeMap<String, String>,
    pub client_tools: Vec<ToolSpec>,
    /// Seed history (`POST /sessions` `messages`).
    pub seed: Vec<Message>,
    /// What each server call the last turn paused on was bound to when it asked for
    /// permission (see `engine/approvals.rs`): a grant applies to exactly that call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub asked: Vec<AskedCall>,
}

/// A paused server call as it was when it asked for the client's permission. A grant binds to
/// it: the same server and tool, the same arguments (their digest, as logged), and the policy
/// verdict and rule that asked. When any of these differ at the grant, the call is re-decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AskedCall {
    pub call_id: String,
    /// The MCP server (`builtin` for built-in tools) and the tool's own name on it.
    pub server: String,
    pub tool: String,
    /// SHA-256 (hex) of the call's arguments as logged in its `agent.tool_use`.
    pub input_sha256: String,
    /// The operator's verdict then (`ask`, or `trust` when the session did not trust the
    /// tool), and the rule that decided it.
    pub verdict: String,
    pub rule: String,
}

/// The client's decision on a proposed plan. Logged as the content block that starts the
/// decision's turn (`{"type": "plan_decision", "decision": "confirmed", "edits"?}` or
/// `{"type": "plan_decision", "decision": "rejected", "reason"?}`).
#[derive(Debug, Clone, PartialEq)]
pub enum PlanDecision {
    /// Go on, with the plan replaced by `edits` when given.
    Confirm { edits: Option<String> },
    /// Propose another plan; the reason is given to the model.
    Reject { reason: Option<String> },
}

impl PlanDecision {
    /// The `user.message` content block the decision is logged as.
    pub fn block(&self) -> serde_json::Value {
        let mut b = serde_json::Map::new();
        b.insert("type".into(), "plan_decision".into());
        match self {
            PlanDecision::Confirm { edits } => {
                b.insert("decision".into(), "confirmed".into());
                if let Some(e) = edits {
                    b.insert("edits".into(), e.clone().into());
                }
            }
            PlanDecision::Reject { reason } => {
                b.insert("decision".into(), "rejected".into());
                if let Some(r) = reason {
                    b.insert("reason".into(), r.clone().into());
                }
            }
        }
        serde_json::Value::Object(b)
    }

    /// The decision a `user.message`'s content carries, if it is a plan decision.
    pub fn of_content(content: &serde_json::Value) -> Option<PlanDecision> {
        let b = content
            .as_array()?
            .iter()
            .find(|b| b.get("type").and_then(|t| t.as_str()) == Some("plan_decision"))?;
        let text = |k: &str| b.get(k).and_then(|v| v.as_str()).map(String::from);
        match b.get("decision").and_then(|d| d.as_str())? {
            "confirmed" => Some(PlanDecision::Confirm {
                edits: text("edits"),
            }),
            "rejected" => Some(PlanDecision::Reject {
                reason: text("reason"),
            }),
            _ => None,
        }
    }
}

/// Who must act on a pending tool call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PendingKind {
    /// A client tool: the client runs it and posts the result.
    Client,
    /// A server tool that needs the client's permission.
    Permission,
}

/// A tool call the last turn stopped on.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pending {
    #[serde(rename = "toolCallId")]
    pub call_id: String,
    pub name: String,
    pub input: serde_json::Value,
    pub kind: PendingKind,
    /// When the call was logged: its `agent.tool_use`'s `created_at` (so expiry survives a
    /// restart).
    #[serde(skip)]
    pub asked_at: String,
    /// A permission's deadline (`asked_at` plus the agent's `approval_ttl_s`): then the call
    /// is denied with reason "approval expired".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Past its deadline: denied ("approval expired") when the session goes on; a grant for it
    /// is refused, and the follow-up need not answer it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub expired: bool,
    /// The result it is settled with instead of being answered (a question of an MCP server
    /// asked before a restart, and its call: see `engine/client_questions.rs`); `expired` is set too.
    #[serde(skip)]
    pub ended: Option<String>,
}

impl Pending {
    pub fn call(&self) -> ToolCall {
        ToolCall {
            id: self.call_id.clone(),
            name: self.name.clone(),
            input: self.input.clone(),
        }
    }
}

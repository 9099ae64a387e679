//! Principals: who calls, as `[keys.NAME]` names them, and what each may do.
//!
//! A principal owns what its requests make (sessions, files, MCP sessions, approvals) under its
//! owner id, never under a raw key, so that its key can be rotated (`key_env_next`: two secrets
//! valid at once) without losing anything. The owner id of `[keys.NAME]` is `key:NAME`; a key
//! of `[server] api_keys_env` is a principal of its own whose owner id is the first 16 bytes of
//! its SHA-256 digest in hex (32 characters of `[0-9a-f]`, what stores written before
//! `[keys.*]` hold). The two forms never collide: a digest owner has no `:`.
//!
//! What a principal may do narrows what the server offers and never widens it: `agents` picks
//! the agents it may use, `tools` narrows each agent's tools (and so the policy: a tool outside
//! them is as if the agent did not have it), `admin` lets it see every session and approval.

use std::sync::Arc;

use globset::GlobSet;

/// The owner-id prefix of a `[keys.NAME]` principal.
pub const KEY_OWNER_PREFIX: &str = "key:";

/// Where one secret of a `[keys.NAME]` principal comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySecret {
    /// `key_env` / `key_env_next`: the environment variable holding the key (read at start-up;
    /// unset or empty stops the server).
    Env(String),
    /// `key_sha256` / `key_sha256_next`: the key's SHA-256 digest (the file holds no secret).
    Sha256([u8; 32]),
}

/// `[keys.NAME]`: one principal.
#[derive(Debug, Clone)]
pub struct KeyConfig {
    /// The table's key.
    pub name: String,
    /// Its secret (`key_env` or `key_sha256`), then the one of a rotation, if any
    /// (`key_env_next` or `key_sha256_next`), each with the config key that named it.
    pub secrets: Vec<(&'static str, KeySecret)>,
    pub scope: Scope,
    /// Its own budgets and rate limit (each unset one is `[limits]`'s: see
    /// [`crate::config::Config::budgets_of`]).
    pub budgets: crate::config::Budgets,
}

impl KeyConfig {
    /// Its owner id: `key:NAME`.
    pub fn owner_id(&self) -> String {
        format!("{KEY_OWNER_PREFIX}{}", self.name)
    }
}

/// What a principal may do. The default (a key of `api_keys_env`, or no keys at all) is
/// everything but `admin`.
#[derive(Debug, Clone, Default)]
pub struct Scope {
    /// `agents`: the agents it may use, in the file's order; `None`: every one.
    pub agents: Option<Vec<String>>,
    /// `tools`: globs that narrow every agent's tools; `None`: no narrowing.
    pub tools: Option<Arc<GlobSet>>,
    /// `admin`: sees every session and approval (default `false`).
    pub admin: bool,
}

impl Scope {
    /// No agent, no tool, no admin: a principal removed from the file.
    pub fn nothing() -> Scope {
        Scope {
            agents: Some(Vec::new()),
            tools: Some(Arc::new(GlobSet::empty())),
            admin: false,
        }
    }

    /// Whether it sees the whole server (`GET /status`: every MCP server and agent): an admin,
    /// or a principal that `agents` and `tools` do not narrow.
    pub fn sees_everything(&self) -> bool {
        self.admin || (self.agents.is_none() && self.tools.is_none())
    }

    /// Whether it may use agent `name`.
    pub fn may_use(&self, name: &str) -> bool {
        self.agents
            .as_ref()
            .is_none_or(|a| a.iter().any(|n| n == name))
    }
}

/// A caller that presented a valid key: its owner id and what it may do.
#[derive(Debug, Clone)]
pub struct Principal {
    /// `key:NAME`, or a digest of an `api_keys_env` key (see the module's doc).
    pub owner: String,
    pub scope: Scope,
}

/// An agent's `tools` globs, narrowed by a principal's (`[keys.NAME] tools`): a tool name
/// matches when it matches both.
#[derive(Debug, Clone)]
pub struct ToolGlobs {
    agent: Arc<GlobSet>,
    within: Option<Arc<GlobSet>>,
}

impl ToolGlobs {
    pub fn new(agent: GlobSet) -> ToolGlobs {
        ToolGlobs {
            agent: Arc::new(agent),
            within: None,
        }
    }

    pub fn is_match(&self, name: &str) -> bool {
        self.agent.is_match(name) && self.within.as_ref().is_none_or(|w| w.is_match(name))
    }

    /// These globs narrowed by `within` too (which replaces an earlier narrowing: a principal
    /// narrows an agent as configured, once).
    pub fn within(&self, within: Arc<GlobSet>) -> ToolGlobs {
        ToolGlobs {
            agent: self.agent.clone(),
            within: Some(within),
        }
    }
}

//! The validated `[upstreams.NAME]` tables (or the lone `[upstream]`): the model providers
//! turnstile calls, what each serves and how much of it may be used.

use std::collections::BTreeMap;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    OpenAi,
    Anthropic,
    Echo,
}

impl ProviderKind {
    /// The name written in the file (`provider = "openai"`).
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::OpenAi => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::Echo => "echo",
        }
    }
}

/// One upstream.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// The table's key (`[upstreams.NAME]`); `default` for a lone `[upstream]`.
    pub name: String,
    /// `Echo` when the file has no upstream table.
    pub provider: ProviderKind,
    /// Without a trailing slash. Defaults: openai `https://api.openai.com/v1`,
    /// anthropic `https://api.anthropic.com/v1`, echo empty.
    pub base_url: String,
    /// The environment variable holding the upstream's key (read at start-up, never logged).
    pub api_key_env: Option<String>,
    /// Its default model: `model`, else the first of `models`; required for openai and
    /// anthropic, `echo` for echo. What a call gets when it falls back to this upstream and
    /// the model asked for is not one it serves.
    pub model: String,
    /// The models it serves (routing of the AAP option `model`); empty: any model.
    pub models: Vec<String>,
    pub max_tokens: Option<u32>,
    /// The whole upstream call. Default 600 s.
    pub timeout: Duration,
    /// Retries on connect errors, 429 and 5xx, before falling back. Default 2.
    pub retries: u32,
    /// Extra headers on every upstream request, kept as written; `${VAR}` is expanded when
    /// the provider is built.
    pub headers: BTreeMap<String, String>,
    /// Calls to it at once at most; a call over it goes to the next upstream (as after a
    /// 429), else fails. Default: no limit.
    pub max_in_flight: Option<usize>,
    /// Consecutive failures (connect, timeout, 429, 5xx, broken stream) that open its circuit
    /// breaker. Default 5.
    pub breaker_failures: u32,
    /// How long an open breaker skips it before one probe call is let through. Default 30 s.
    pub breaker_open: Duration,
    /// `price`, USD per million tokens (for budgets).
    pub price: Option<Price>,
}

impl UpstreamConfig {
    /// Whether it serves `model` (an upstream with no `models` serves any).
    pub fn serves(&self, model: &str) -> bool {
        self.models.is_empty() || self.models.iter().any(|m| m == model)
    }
}

/// `[upstreams.X] price`: USD per million tokens, each at least 0.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    /// Input tokens read from the provider's prompt cache. Default: `input`.
    pub cached_input: f64,
}

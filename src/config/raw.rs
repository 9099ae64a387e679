//! `tools.toml` exactly as written: stage one of loading.
//!
//! Every table is `deny_unknown_fields`, every key optional (defaults are applied by
//! [`super::load`], never here). Values a later check may reject are kept as
//! [`toml::Spanned`] so that the error names their line. Integers are read as `i64` and
//! range-checked in `load`, so that `max_steps = -1` gets a message about `max_steps` rather than
//! a bare serde "expected u32". A `Spanned` table's span is its header (`[mcp_servers.fs]`), or
//! its key for a dotted or inline table: either way, the line to report for it.

use indexmap::IndexMap;
use serde::Deserialize;
use toml::Spanned;

/// The whole file.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub server: Option<Spanned<RawServer>>,
    #[serde(default)]
    pub upstream: Option<Spanned<RawUpstream>>,
    /// `[upstreams.NAME]`, in file order (the default order of every agent's upstreams).
    #[serde(default)]
    pub upstreams: Option<IndexMap<String, Spanned<RawUpstream>>>,
    /// `[agents.NAME]`, in file order (the first is the default agent).
    #[serde(default)]
    pub agents: Option<IndexMap<String, Spanned<RawAgent>>>,
    /// `[mcp_servers.NAME]`, in file order.
    #[serde(default)]
    pub mcp_servers: Option<IndexMap<String, Spanned<RawMcpServer>>>,
    #[serde(default)]
    pub policy: Option<Spanned<RawPolicy>>,
    #[serde(default)]
    pub files: Option<Spanned<RawFiles>>,
    #[serde(default)]
    pub limits: Option<Spanned<RawLimits>>,
    #[serde(default)]
    pub telemetry: Option<Spanned<RawTelemetry>>,
    #[serde(default)]
    pub mcp_endpoint: Option<Spanned<RawMcpEndpoint>>,
    pub store: Option<Spanned<RawStore>>,
    /// `[keys.NAME]`, in file order.
    #[serde(default)]
    pub keys: Option<IndexMap<String, Spanned<RawKey>>>,
}

/// `[server]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawServer {
    #[serde(default)]
    pub listen: Option<Spanned<String>>,
    #[serde(default)]
    pub data_dir: Option<Spanned<String>>,
    #[serde(default)]
    pub sandboxes: Option<Spanned<String>>,
    #[serde(default)]
    pub api_keys_env: Option<Spanned<String>>,
    #[serde(default)]
    pub public_meta: Option<bool>,
    #[serde(default)]
    pub max_body_bytes: Option<Spanned<i64>>,
    #[serde(default)]
    pub fsync: Option<bool>,
    #[serde(default)]
    pub session_cache: Option<Spanned<i64>>,
    #[serde(default)]
    pub drain_s: Option<Spanned<i64>>,
    #[serde(default)]
    pub header_timeout_s: Option<Spanned<i64>>,
    #[serde(default)]
    pub idle_timeout_s: Option<Spanned<i64>>,
    #[serde(default)]
    pub max_connections: Option<Spanned<i64>>,
    #[serde(default)]
    pub metrics_listen: Option<Spanned<String>>,
    /// Host names served besides loopback ones (see `http::browser`).
    #[serde(default)]
    pub allowed_hosts: Option<Vec<Spanned<String>>>,
    /// The variable holding the key that encrypts stored OAuth tokens.
    #[serde(default)]
    pub secret_key_env: Option<Spanned<String>>,
}

/// `[upstream]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    #[serde(default)]
    pub provider: Option<Spanned<String>>,
    #[serde(default)]
    pub base_url: Option<Spanned<String>>,
    #[serde(default)]
    pub api_key_env: Option<Spanned<String>>,
    #[serde(default)]
    pub model: Option<Spanned<String>>,
    #[serde(default)]
    pub max_tokens: Option<Spanned<i64>>,
    #[serde(default)]
    pub timeout_s: Option<Spanned<i64>>,
    #[serde(default)]
    pub retries: Option<Spanned<i64>>,
    #[serde(default)]
    pub headers: Option<Spanned<IndexMap<String, String>>>,
    #[serde(default)]
    pub models: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub max_in_flight: Option<Spanned<i64>>,
    #[serde(default)]
    pub breaker_failures: Option<Spanned<i64>>,
    #[serde(default)]
    pub breaker_open_s: Option<Spanned<i64>>,
    #[serde(default)]
    pub price: Option<Spanned<RawPrice>>,
}

/// `[upstreams.X] price = { input, output, cached_input }`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrice {
    #[serde(default)]
    pub input: Option<Spanned<f64>>,
    #[serde(default)]
    pub output: Option<Spanned<f64>>,
    #[serde(default)]
    pub cached_input: Option<Spanned<f64>>,
}

/// `[agents.NAME]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawAgent {
    #[serde(default)]
    pub title: Option<String>,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub version: Option<Spanned<String>>,
    #[serde(default)]
    pub system_prompt: Option<String>,
    #[serde(default)]
    pub tools: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub max_steps: Option<Spanned<i64>>,
    #[serde(default)]
    pub turn_timeout_s: Option<Spanned<i64>>,
    #[serde(default)]
    pub thinking: Option<bool>,
    #[serde(default)]
    pub models: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub upstreams: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub client_system_prompt: Option<bool>,
    #[serde(default)]
    pub approval_ttl_s: Option<Spanned<i64>>,
    #[serde(default)]
    pub wrap_up_s: Option<Spanned<i64>>,
    #[serde(default)]
    pub context_tokens: Option<Spanned<i64>>,
    #[serde(default)]
    pub compact_at: Option<Spanned<f64>>,
    #[serde(default)]
    pub elicitation_tool: Option<Spanned<String>>,
}

/// `[mcp_servers.NAME]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcpServer {
    /// stdio: the program to launch.
    #[serde(default)]
    pub command: Option<Spanned<String>>,
    #[serde(default)]
    pub args: Option<Spanned<Vec<String>>>,
    #[serde(default)]
    pub env: Option<Spanned<IndexMap<String, String>>>,
    #[serde(default)]
    pub cwd: Option<Spanned<String>>,
    /// streamable HTTP: the endpoint.
    #[serde(default)]
    pub url: Option<Spanned<String>>,
    #[serde(default)]
    pub headers: Option<Spanned<IndexMap<String, String>>>,
    /// `"shared"` or `"session"`.
    #[serde(default)]
    pub scope: Option<Spanned<String>>,
    #[serde(default)]
    pub timeout_s: Option<Spanned<i64>>,
    #[serde(default)]
    pub startup_timeout_s: Option<Spanned<i64>>,
    /// `"none"` or `"landlock"`.
    #[serde(default)]
    pub sandbox: Option<Spanned<String>>,
    /// With `sandbox = "landlock"`: whether the child may open TCP connections.
    #[serde(default)]
    pub network: Option<bool>,
    /// `"ask"` or `"decline"`.
    #[serde(default)]
    pub elicitation: Option<Spanned<String>>,
    #[serde(default)]
    pub sampling: Option<bool>,
    #[serde(default)]
    pub sampling_max_tokens: Option<Spanned<i64>>,
    #[serde(default)]
    pub sampling_calls_per_turn: Option<Spanned<i64>>,
    /// `[mcp_servers.X.oauth]`: an HTTP server behind OAuth 2.1.
    #[serde(default)]
    pub oauth: Option<Spanned<RawOAuth>>,
}

/// `[mcp_servers.X.oauth]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOAuth {
    /// `"authorization_code"` (default), `"client_credentials"` or `"identity_assertion"`.
    #[serde(default)]
    pub grant: Option<Spanned<String>>,
    /// A pre-registered client id (else a client ID metadata document, else dynamic registration).
    #[serde(default)]
    pub client_id: Option<Spanned<String>>,
    #[serde(default)]
    pub client_secret_env: Option<Spanned<String>>,
    /// The URL of this client's metadata document (used as its client id where the server
    /// supports client ID metadata documents).
    #[serde(default)]
    pub client_metadata_url: Option<Spanned<String>>,
    #[serde(default)]
    pub scopes: Option<Vec<Spanned<String>>>,
    /// A PEM private key for `private_key_jwt` client authentication.
    #[serde(default)]
    pub private_key_file: Option<Spanned<String>>,
    #[serde(default)]
    pub signing_algorithm: Option<Spanned<String>>,
    /// The loopback port `turnstile login` listens on for the redirect (0: any free port).
    #[serde(default)]
    pub redirect_port: Option<Spanned<i64>>,
    /// `grant = "identity_assertion"`: the enterprise IdP and the assertion it is given.
    #[serde(default)]
    pub idp_issuer: Option<Spanned<String>>,
    #[serde(default)]
    pub idp_token_endpoint: Option<Spanned<String>>,
    #[serde(default)]
    pub idp_client_id: Option<Spanned<String>>,
    #[serde(default)]
    pub idp_client_secret_env: Option<Spanned<String>>,
    #[serde(default)]
    pub identity_assertion_env: Option<Spanned<String>>,
    #[serde(default)]
    pub identity_assertion_file: Option<Spanned<String>>,
    #[serde(default)]
    pub identity_assertion_type: Option<Spanned<String>>,
}

/// `[policy]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    #[serde(default)]
    pub trust: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub ask: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub deny: Option<Vec<Spanned<String>>>,
    /// `"trust"`, `"ask"` or `"deny"`.
    #[serde(default)]
    pub default: Option<Spanned<String>>,
}

/// `[files]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFiles {
    #[serde(default)]
    pub max_bytes: Option<Spanned<i64>>,
}

/// `[limits]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    #[serde(default)]
    pub queued_turns: Option<Spanned<i64>>,
    #[serde(default)]
    pub running_turns: Option<Spanned<i64>>,
    #[serde(default)]
    pub sessions_per_key: Option<Spanned<i64>>,
    #[serde(default)]
    pub subscribers_per_session: Option<Spanned<i64>>,
    #[serde(default)]
    pub files_per_message: Option<Spanned<i64>>,
    #[serde(default)]
    pub session_servers: Option<Spanned<i64>>,
    #[serde(default)]
    pub session_servers_per_key: Option<Spanned<i64>>,
    #[serde(default)]
    pub disk_bytes_per_key: Option<Spanned<i64>>,
    #[serde(default)]
    pub files_per_key: Option<Spanned<i64>>,
    #[serde(default)]
    pub tool_result_bytes: Option<Spanned<i64>>,
    /// Budgets (`config/load/budgets.rs`); `rate_per_minute` is the contract's older name.
    #[serde(default, alias = "rate_per_minute")]
    pub requests_per_minute: Option<Spanned<i64>>,
    #[serde(default)]
    pub tokens_per_day: Option<Spanned<i64>>,
    #[serde(default)]
    pub tool_calls_per_day: Option<Spanned<i64>>,
    #[serde(default)]
    pub usd_per_month: Option<Spanned<f64>>,
}

/// `[telemetry]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTelemetry {
    #[serde(default)]
    pub otlp_endpoint: Option<Spanned<String>>,
}

/// `[mcp_endpoint]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcpEndpoint {
    #[serde(default)]
    pub enabled: Option<bool>,
    #[serde(default)]
    pub agents: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub names: Option<Spanned<String>>,
    #[serde(default)]
    pub session_idle_s: Option<Spanned<i64>>,
    #[serde(default)]
    pub session_park_s: Option<Spanned<i64>>,
}

/// `[store]`
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawStore {
    #[serde(default)]
    pub backend: Option<Spanned<String>>,
    #[serde(default)]
    pub url_env: Option<Spanned<String>>,
    #[serde(default)]
    pub lease_s: Option<Spanned<i64>>,
}

/// `[keys.NAME]`: a principal.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawKey {
    #[serde(default)]
    pub key_env: Option<Spanned<String>>,
    #[serde(default)]
    pub key_sha256: Option<Spanned<String>>,
    #[serde(default)]
    pub key_env_next: Option<Spanned<String>>,
    #[serde(default)]
    pub key_sha256_next: Option<Spanned<String>>,
    #[serde(default)]
    pub agents: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub tools: Option<Vec<Spanned<String>>>,
    #[serde(default)]
    pub admin: Option<bool>,
    /// Budgets (`config/load/budgets.rs`); `rate_per_minute` is the contract's older name.
    #[serde(default, alias = "rate_per_minute")]
    pub requests_per_minute: Option<Spanned<i64>>,
    #[serde(default)]
    pub tokens_per_day: Option<Spanned<i64>>,
    #[serde(default)]
    pub tool_calls_per_day: Option<Spanned<i64>>,
    #[serde(default)]
    pub usd_per_month: Option<Spanned<f64>>,
}

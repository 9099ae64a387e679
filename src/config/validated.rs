//! The validated configuration: what every part of turnstile reads, each default applied.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::principals::{KeyConfig, Scope, KEY_OWNER_PREFIX};
pub use super::upstreams::{Price, ProviderKind, UpstreamConfig};
use super::Env;

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it came from (for messages).
    pub path: PathBuf,
    pub server: ServerConfig,
    /// `[upstreams.NAME]` in file order, or the lone `[upstream]` as one entry named
    /// `default`; never empty (a file with neither gets the built-in echo provider).
    pub upstreams: Vec<UpstreamConfig>,
    /// In file order; never empty (a file with no `[agents.*]` gets one `assistant` agent).
    /// The first is the default agent.
    pub agents: Vec<AgentConfig>,
    /// In file order.
    pub mcp_servers: Vec<McpServerConfig>,
    pub policy: PolicyConfig,
    pub files: FilesConfig,
    /// `[limits]`: quotas on what a client or key can make turnstile hold.
    pub limits: LimitsConfig,
    /// `[telemetry]`.
    pub telemetry: TelemetryConfig,
    /// `[mcp_endpoint]`: `/mcp`, the federated tools for MCP clients.
    pub mcp_endpoint: McpEndpointConfig,
    /// `[store]`: where the event log lives.
    pub store: StoreConfig,
    /// `[keys.NAME]`: the principals, in file order (see [`super::principals`]).
    pub keys: Vec<KeyConfig>,
    /// The environment it was loaded with: the variables the file names (`api_keys_env`,
    /// `api_key_env`, `url_env`, `${VAR}` in headers) are read from it.
    pub env: Env,
}

/// `[store]`: the embedded SQLite store (default) or a shared PostgreSQL database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    pub backend: StoreBackendKind,
    /// `url_env`: the environment variable holding the PostgreSQL connection string (required
    /// with `backend = "postgres"`; the string itself is never in the file).
    pub url_env: Option<String>,
    /// `lease_s`: a dead instance's sessions are taken over after this. Default 10 s.
    pub lease: std::time::Duration,
}

impl Default for StoreConfig {
    fn default() -> StoreConfig {
        StoreConfig {
            backend: StoreBackendKind::Sqlite,
            url_env: None,
            lease: std::time::Duration::from_secs(10),
        }
    }
}

/// `[store] backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreBackendKind {
    /// `data_dir/turnstile.db` (embedded, the default).
    Sqlite,
    /// A PostgreSQL database shared by several instances.
    Postgres,
}

/// `[mcp_endpoint]`: whether `/mcp` serves the agents' federated tools over streamable HTTP.
#[derive(Debug, Clone)]
pub struct McpEndpointConfig {
    /// Default `false`: `/mcp` is then a 404.
    pub enabled: bool,
    /// Whose tool sets it serves, by agent name (each one of `agents`): `/mcp` serves the first,
    /// `/mcp/<agent>` each one. Default: the default agent.
    pub agents: Vec<String>,
    /// `names`: how MCP clients see the servers' tools, prompts and resources.
    pub names: EndpointNames,
    /// `session_idle_s` (300): a session with no request, no open stream and no running call
    /// for this long ends (its workspace and session-scoped servers go).
    pub session_idle: Duration,
    /// `session_park_s` (30): such a session is parked after this long (its in-memory state
    /// dropped, restored on its next request).
    pub session_park: Duration,
}

impl Default for McpEndpointConfig {
    fn default() -> Self {
        McpEndpointConfig {
            enabled: false,
            agents: Vec::new(),
            names: EndpointNames::default(),
            session_idle: Duration::from_secs(300),
            session_park: Duration::from_secs(30),
        }
    }
}

/// `[mcp_endpoint] names`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EndpointNames {
    /// `"federated"` (default): `mcp__<server>__<tool>`, `<server>/<prompt>`,
    /// `turnstile://<server>/<uri>`, the names agents and the policy use.
    #[default]
    Federated,
    /// `"own"`: each server's own tool and prompt names and resource URIs, where no other
    /// server has the same one (those keep the federated form). For a client that expects a
    /// server's names, as when turnstile fronts one server to gate it. The policy still
    /// judges the federated names.
    Own,
}

/// `[telemetry]`: where traces go, if anywhere.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// An OTLP/HTTP endpoint (e.g. `http://127.0.0.1:4318`); `None`: no export (unless
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` is set, which the telemetry module reads itself).
    pub otlp_endpoint: Option<String>,
}

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Default `127.0.0.1:8787`.
    pub listen: SocketAddr,
    /// Default `data`, relative paths resolved against the config file's folder.
    pub data_dir: PathBuf,
    /// Default `sandboxes`, relative paths resolved against the config file's folder.
    pub sandboxes: PathBuf,
    /// The environment variable holding comma-separated bearer keys, if auth is wanted.
    pub api_keys_env: Option<String>,
    /// Whether `GET /meta` is served without a key when keys are set. Default `true`.
    pub public_meta: bool,
    /// Largest JSON request body. Default 4 MiB.
    pub max_body_bytes: u64,
    /// Sync every group commit to disk (survives power loss; costs an fsync per commit).
    /// Default `false`: commits survive the process being killed, not the machine losing power.
    pub fsync: bool,
    /// Idle sessions kept in memory; past that, idle ones are dropped and read back from the log
    /// when next used. Default 1,000.
    pub session_cache: usize,
    /// On SIGTERM or SIGINT, how long running turns may go on to their end (no new turn
    /// starts meanwhile) before the rest are ended `worker_shutdown`. Default 0: at once.
    pub drain: Duration,
    /// A request head not complete by then closes the connection. Default 10 s.
    pub header_timeout: Duration,
    /// An idle keep-alive connection (no request under way) is closed after this. Default 60 s.
    pub idle_timeout: Duration,
    /// Open connections at most; over it a new connection is closed at once. Default 4096.
    pub max_connections: usize,
    /// Serve `/metrics` (no key needed) on this address too. Default none.
    pub metrics_listen: Option<SocketAddr>,
    /// Host names a request may name besides loopback ones (`*`: any); lower case, no port.
    /// `None`: loopback names only on a keyless loopback server, any elsewhere (see
    /// `http::browser`).
    pub allowed_hosts: Option<Vec<String>>,
    /// The variable holding the key that encrypts stored OAuth tokens (read when used).
    pub secret_key_env: Option<String>,
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The table's key: `[agents.NAME]`.
    pub name: String,
    /// Default: the name (`load` fills it in, so it is always `Some` after loading).
    pub title: Option<String>,
    pub description: Option<String>,
    /// Default `"0.1.0"`.
    pub version: String,
    /// Default empty (no system prompt).
    pub system_prompt: String,
    /// Globs over federated tool names this agent may use. Default `["*"]`.
    pub tools: Vec<String>,
    /// The compiled `tools` globs (narrowed by a principal's, see [`super::principals`]).
    pub tool_globs: super::principals::ToolGlobs,
    /// Model calls per turn. Default 32, at least 1.
    pub max_steps: u32,
    /// Default 3600 s.
    pub turn_timeout: Duration,
    /// Default of the AAP option `thinking`. Default `false`.
    pub thinking: bool,
    /// Offered to clients as the AAP select option `model`; empty means the option is not offered.
    pub models: Vec<String>,
    /// The upstreams its model calls may go to, by name, in order (routing and fallback).
    /// Default: every upstream, in file order.
    pub upstreams: Vec<String>,
    /// Whether a run's `system_prompt` may replace this agent's. Default `true` (spec 002 allows it).
    pub client_system_prompt: bool,
    /// A pending permission is denied with reason "approval expired" after this. Default 3600 s.
    pub approval_ttl: Duration,
    /// At `turn_timeout` the turn wraps up: one last model call without tools, bounded by this.
    /// Default 60 s.
    pub wrap_up: Duration,
    /// The upstream's context window in tokens, when the file sets it; `None`: the known
    /// model's own, else 128,000 (see the engine's context module).
    pub context_tokens: Option<u32>,
    /// Compact the oldest turns into a summary when the next request would pass this share of
    /// the window. Default 0.8, in (0, 1].
    pub compact_at: f64,
    /// A client tool of this name receives the MCP elicitations of the session's tool calls.
    /// Default `"elicitation"`.
    pub elicitation_tool: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum McpScope {
    /// One process for all sessions.
    Shared,
    /// One process per session, cwd its workspace.
    Session,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxKind {
    None,
    Landlock,
}

#[derive(Debug, Clone)]
pub enum McpTransport {
    /// `args` and `env` values are kept as written: `${VAR}` is expanded when the child is
    /// spawned (every variable was checked to be set when the file was loaded), so secrets are
    /// never held in (or logged from) the config.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// `headers` values are kept as written; `${VAR}` is expanded when connecting.
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

#[derive(Debug, Clone)]
pub struct McpServerConfig {
    /// The table's key: `[mcp_servers.NAME]`.
    pub name: String,
    pub transport: McpTransport,
    /// Default `Shared`.
    pub scope: McpScope,
    /// Per tool call. Default 60 s.
    pub timeout: Duration,
    /// Handshake and listing. Default 30 s.
    pub startup_timeout: Duration,
    /// Default `None`.
    pub sandbox: SandboxKind,
    /// With `sandbox = Landlock`: whether the child may open TCP connections. Default `false`.
    pub network: bool,
    /// What a server's `elicitation/create` gets. Default `Ask`.
    pub elicitation: ElicitationMode,
    /// Answer the server's `sampling/createMessage` from our upstream. Default `false`.
    pub sampling: bool,
    /// Per sampling request. Default 1024.
    pub sampling_max_tokens: u32,
    /// Sampling requests per turn. Default 4.
    pub sampling_calls_per_turn: u32,
    /// `[mcp_servers.X.oauth]` (HTTP servers only).
    pub oauth: Option<OAuthConfig>,
    /// The 1-based line of the table header, for messages about this server.
    pub line: usize,
    /// The environment the config was loaded with: `${VAR}` in `args`, `env` and `headers`,
    /// the variables a child keeps, and OAuth secrets are read from it.
    pub env: Env,
}

/// `[mcp_servers.X] elicitation`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ElicitationMode {
    /// Ask whoever can answer for the session; decline where no one can.
    #[default]
    Ask,
    /// Decline every elicitation.
    Decline,
}

/// `[mcp_servers.X.oauth] grant`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OAuthGrant {
    /// An operator logs in once (`turnstile login`); refresh tokens keep it going.
    #[default]
    AuthorizationCode,
    /// Machine to machine: the client's own credentials.
    ClientCredentials,
    /// Enterprise-managed authorization (MCP extension, SEP-990): an identity assertion from
    /// the enterprise IdP, exchanged there (RFC 8693) for an ID-JAG, presented to the server's
    /// authorization server as a JWT-bearer grant (RFC 7523).
    IdentityAssertion,
}

/// `[mcp_servers.X.oauth]`.
#[derive(Debug, Clone, Default)]
pub struct OAuthConfig {
    pub grant: OAuthGrant,
    pub client_id: Option<String>,
    /// The variable holding the client secret (read when used, never logged).
    pub client_secret_env: Option<String>,
    pub client_metadata_url: Option<String>,
    /// Asked for when neither the server's challenge nor its metadata says which.
    pub scopes: Vec<String>,
    pub private_key_file: Option<PathBuf>,
    /// For `private_key_jwt`: `"ES256"` (default) or `"RS256"`.
    pub signing_algorithm: String,
    /// The loopback port of `turnstile login`'s redirect listener; 0: any free port.
    pub redirect_port: u16,
    /// For `grant = "identity_assertion"`.
    pub idp: Option<IdpConfig>,
}

/// `[mcp_servers.X.oauth]` keys of `grant = "identity_assertion"`: the enterprise IdP.
#[derive(Debug, Clone, Default)]
pub struct IdpConfig {
    /// The IdP's token endpoint, given or found from `idp_issuer`'s metadata.
    pub token_endpoint: Option<String>,
    pub issuer: Option<String>,
    /// This client's id at the IdP.
    pub client_id: String,
    /// The variable holding its secret at the IdP, if it has one.
    pub client_secret_env: Option<String>,
    /// Where the identity assertion (the user's ID token from single sign-on) is read, each
    /// time one is needed: a variable, or a file another process keeps fresh.
    pub assertion_env: Option<String>,
    pub assertion_file: Option<PathBuf>,
    /// `"id_token"` (default) or `"saml2"`.
    pub assertion_type: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Trust,
    Ask,
    Deny,
}

/// One policy pattern with where it came from.
#[derive(Debug, Clone)]
pub struct PolicyRule {
    pub pattern: String,
    pub glob: globset::GlobMatcher,
    /// The 1-based line in the file.
    pub line: usize,
}

#[derive(Debug, Clone)]
pub struct PolicyConfig {
    pub trust: Vec<PolicyRule>,
    pub ask: Vec<PolicyRule>,
    pub deny: Vec<PolicyRule>,
    /// For a tool that no pattern names. Default `Ask`.
    pub default: Verdict,
}

#[derive(Debug, Clone)]
pub struct FilesConfig {
    /// Largest upload or delivered file. Default 100 MiB.
    pub max_bytes: u64,
}

/// `[limits]`: every quota's over-limit answer names its key here (`limits.<field>`).
#[derive(Debug, Clone)]
pub struct LimitsConfig {
    /// Turns queued per session behind the running one; over it `POST /messages` is 429. Default 32.
    pub queued_turns: usize,
    /// Turns running server-wide; over it a new turn is 503. Default 256.
    pub running_turns: usize,
    /// Sessions one API key may own; over it `POST /sessions` is 429. Default 10,000.
    pub sessions_per_key: usize,
    /// Open event and run streams per session; over it a new stream is 429. Default 64.
    pub subscribers_per_session: usize,
    /// Distinct file ids in one message; over it 400. Default 32.
    pub files_per_message: usize,
    /// Session-scoped MCP children server-wide; the idlest is stopped first, else 503. Default 128.
    pub session_servers: usize,
    /// Session-scoped MCP children one API key's sessions may run at once (a keyless server has
    /// one principal: only `session_servers` applies); past it that key's own idlest is stopped
    /// first. Default 32.
    pub session_servers_per_key: usize,
    /// Bytes of stored files one key may own; over it 413. Default 10 GiB. Each file counts
    /// at least [`crate::files::MIN_ACCOUNTED_BYTES`].
    pub disk_bytes_per_key: u64,
    /// Stored files one key may own; over it 413. Default 100,000.
    pub files_per_key: u64,
    /// A tool result larger than this reaches the model as its first part plus a note naming a
    /// workspace file holding the whole. Default 256 KiB.
    pub tool_result_bytes: usize,
    /// `requests_per_minute`, `tokens_per_day`, `tool_calls_per_day`, `usd_per_month`: each
    /// principal's, unless its `[keys.NAME]` table sets its own. Default: none.
    pub budgets: crate::config::Budgets,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            queued_turns: 32,
            running_turns: 256,
            sessions_per_key: 10_000,
            subscribers_per_session: 64,
            files_per_message: 32,
            session_servers: 128,
            session_servers_per_key: 32,
            disk_bytes_per_key: 10 * 1024 * 1024 * 1024,
            files_per_key: 100_000,
            tool_result_bytes: 256 * 1024,
            budgets: Default::default(),
        }
    }
}

impl Config {
    /// The agent with this name.
    pub fn agent(&self, name: &str) -> Option<&AgentConfig> {
        self.agents.iter().find(|a| a.name == name)
    }

    /// The default agent (the first in the file).
    pub fn default_agent(&self) -> &AgentConfig {
        &self.agents[0]
    }

    /// The upstream with this name.
    pub fn upstream(&self, name: &str) -> Option<&UpstreamConfig> {
        self.upstreams.iter().find(|u| u.name == name)
    }

    /// The model an agent's calls go to when the session picked none: its first upstream's.
    pub fn default_model(&self, agent: &AgentConfig) -> &str {
        agent
            .upstreams
            .first()
            .and_then(|name| self.upstream(name))
            .or(self.upstreams.first())
            .map_or("echo", |u| u.model.as_str())
    }

    /// The `[keys.NAME]` principal whose owner id this is (`None` for a key of `api_keys_env`,
    /// and without keys).
    pub fn key_of(&self, owner: Option<&str>) -> Option<&KeyConfig> {
        let name = owner?.strip_prefix(KEY_OWNER_PREFIX)?;
        self.keys.iter().find(|k| k.name == name)
    }

    /// What the owner of this id may do (everything but admin when not a `[keys.NAME]` one).
    /// A `key:NAME` owner whose table is gone from the file may do nothing: its sessions (an
    /// admin may still act in them, a queued turn may still run) get no agent and no tool,
    /// never the unnarrowed default.
    pub fn scope_of(&self, owner: Option<&str>) -> Cow<'_, Scope> {
        match self.key_of(owner) {
            Some(k) => Cow::Borrowed(&k.scope),
            None if owner.is_some_and(|o| o.starts_with(KEY_OWNER_PREFIX)) => {
                Cow::Owned(Scope::nothing())
            }
            None => Cow::Owned(Scope::default()),
        }
    }

    /// The budgets and rate limit of the owner of this id: its `[keys.NAME]` table's, each
    /// unset one `[limits]`'s (a key of `api_keys_env` and a keyless server have `[limits]`'s).
    pub fn budgets_of(&self, owner: Option<&str>) -> crate::config::Budgets {
        match self.key_of(owner) {
            Some(k) => k.budgets.or(self.limits.budgets),
            None => self.limits.budgets,
        }
    }

    /// Agent `name` as the owner of this id sees it (its tools narrowed); `None` when there is
    /// no such agent or it may not use it.
    pub fn agent_as(&self, owner: Option<&str>, name: &str) -> Option<Cow<'_, AgentConfig>> {
        let agent = self.agent(name)?;
        let scope = self.scope_of(owner);
        scope.may_use(name).then(|| agent.narrowed(&scope))
    }

    /// The agents the owner of this id may use, in file order; the first is its default.
    pub fn agents_of(&self, owner: Option<&str>) -> Vec<&AgentConfig> {
        let scope = self.scope_of(owner);
        self.agents
            .iter()
            .filter(|a| scope.may_use(&a.name))
            .collect()
    }
}

impl AgentConfig {
    /// This agent as a principal of `scope` sees it: its tools narrowed by the scope's `tools`.
    pub fn narrowed(&self, scope: &Scope) -> Cow<'_, AgentConfig> {
        match &scope.tools {
            None => Cow::Borrowed(self),
            Some(within) => {
                let mut narrowed = self.clone();
                narrowed.tool_globs = self.tool_globs.within(within.clone());
                Cow::Owned(narrowed)
            }
        }
    }
}

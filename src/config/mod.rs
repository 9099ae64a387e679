//! `tools.toml`: the operator's configuration.
//!
//! Two stages: [`raw`] deserializes the file as written (`deny_unknown_fields`, spans kept for
//! error messages), [`load`] validates it into the runtime types of [`validated`] with every
//! default applied. Nothing downstream ever sees a raw value or has to think about defaults.
//! [`env`] holds the variables turnstile reads ([`Env`]), handed to the loader and kept in the
//! [`Config`].

mod budgets;
mod env;
mod load;
mod principals;
mod raw;
mod upstreams;
mod validated;

pub use budgets::Budgets;
pub use env::{expand_vars, server_var, Env};
pub use load::{load, load_str, resolve_path, ConfigError};
pub use principals::{KeyConfig, KeySecret, Principal, Scope, ToolGlobs, KEY_OWNER_PREFIX};
pub use validated::{
    AgentConfig, Config, ElicitationMode, EndpointNames, FilesConfig, IdpConfig, LimitsConfig,
    McpEndpointConfig, McpScope, McpServerConfig, McpTransport, OAuthConfig, OAuthGrant,
    PolicyConfig, PolicyRule, Price, ProviderKind, SandboxKind, ServerConfig, StoreBackendKind,
    StoreConfig, TelemetryConfig, UpstreamConfig, Verdict,
};

//! Stage two of loading `tools.toml`: validate the [raw](super::raw) file into the runtime
//! [`Config`] with every default applied.
//!
//! Every problem becomes one [`ConfigError`] whose `Display` is a single line naming the file,
//! the 1-based line, the key and what to do, e.g.
//! `tools.toml:12: upstream.provider: unknown provider "gpt" (expected "openai", "anthropic" or "echo")`.
//! No input makes this module panic.
//!
//! One file per table of the file ([`server`], [`upstream`], [`agents`], [`mcp_servers`],
//! [`policy`], [`files`], [`limits`], [`telemetry`], [`store`], [`keys`]); [`parse`] turns TOML and serde errors into
//! [`ConfigError`]s and [`values`] holds the checks on single values that the tables share.

mod agents;
mod budget_keys;
mod error;
mod files;
mod keys;
mod limits;
mod mcp_client;
mod mcp_endpoint;
mod mcp_servers;
mod parse;
mod policy;
mod server;
mod store;
mod telemetry;
#[cfg(test)]
mod test_support;
mod upstream;
mod values;

use std::path::Path;

use super::{Config, Env};
pub use error::ConfigError;
use error::Cx;
pub use values::resolve_path;

/// Read and validate the config file at `path`, with the variables of `env` (`TURNSTILE_<KEY>`
/// overrides of `[server]`, `${VAR}` in stdio servers' `args` and `env`; kept in the [`Config`]
/// for the variables it names). A missing or unreadable file is an error naming it.
pub fn load(path: &Path, env: &Env) -> Result<Config, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        let message = match e.kind() {
            std::io::ErrorKind::NotFound => "config file not found: create it (the repository's \
                tools.toml is a working example), or pass --config FILE or set TURNSTILE_CONFIG"
                .to_string(),
            std::io::ErrorKind::InvalidData => {
                "cannot read the config file: it is not valid UTF-8; save it as UTF-8".to_string()
            }
            _ => format!("cannot read the config file: {e}"),
        };
        ConfigError {
            path: path.to_path_buf(),
            line: None,
            key: None,
            message,
        }
    })?;
    load_str(path, &text, env)
}

/// Validate `text` as the contents of the config file `path` (used in messages, and its folder
/// for resolving relative paths), with the variables of `env` (see [`load`]).
pub fn load_str(path: &Path, text: &str, env: &Env) -> Result<Config, ConfigError> {
    let mut cx = Cx {
        path,
        text,
        env,
        env_vars: Vec::new(),
    };
    let mut raw = cx.parse()?;
    cx.env_vars =
        super::env::apply_server_env(&mut raw, text.len(), env).map_err(|(var, message)| {
            ConfigError {
                path: path.to_path_buf(),
                line: None,
                key: Some(var),
                message,
            }
        })?;
    let cx = cx;
    let base_dir = path.parent().unwrap_or_else(|| Path::new(""));
    let upstreams = upstream::upstreams(&cx, raw.upstream.as_ref(), raw.upstreams.as_ref())?;
    let agents = agents::agents(&cx, raw.agents.as_ref(), &upstreams)?;
    let mcp_endpoint = mcp_endpoint::mcp_endpoint(&cx, raw.mcp_endpoint.as_ref(), &agents)?;
    let keys = keys::keys(&cx, raw.keys.as_ref(), &agents)?;
    Ok(Config {
        path: path.to_path_buf(),
        server: server::server(&cx, raw.server.as_ref(), base_dir)?,
        upstreams,
        agents,
        mcp_servers: mcp_servers::mcp_servers(&cx, raw.mcp_servers.as_ref(), base_dir)?,
        policy: policy::policy(&cx, raw.policy.as_ref())?,
        files: files::files(&cx, raw.files.as_ref())?,
        limits: limits::limits(&cx, raw.limits.as_ref())?,
        telemetry: telemetry::telemetry(&cx, raw.telemetry.as_ref())?,
        mcp_endpoint,
        store: store::store(&cx, raw.store.as_ref())?,
        keys,
        env: env.clone(),
    })
}

#[cfg(test)]
mod tests;

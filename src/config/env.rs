//! The environment's part in the configuration: the variables turnstile reads ([`Env`]),
//! `${VAR}` in values, and `TURNSTILE_<KEY>` variables standing in for `[server]` keys.
//!
//! Precedence: a command-line flag > a `TURNSTILE_<KEY>` variable > the file > the default. An
//! overriding value is checked exactly as the file's would be; its errors name the variable
//! (see [`ENV_SPAN_BASE`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use toml::Spanned;

use super::raw::{RawConfig, RawServer};

/// The environment variables turnstile reads: the process's (`Env::process()`, taken once in
/// `main`) or a given set (tests, which share one process and so never set its variables).
/// Loading reads `TURNSTILE_<KEY>` and `${VAR}` from it, and the [`Config`](super::Config)
/// keeps it for what is read later: API keys, the upstream's key, the store's URL, what MCP
/// children are given, OAuth secrets. Cheap to clone. Its `Debug` names no value.
#[derive(Clone, Default)]
pub struct Env(Arc<BTreeMap<String, String>>);

impl Env {
    /// The process's variables now (those that are not Unicode are left out, as
    /// `std::env::var` would not read them either).
    pub fn process() -> Env {
        Env::from_vars(
            std::env::vars_os()
                .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))),
        )
    }

    /// Exactly these variables.
    pub fn from_vars<K: Into<String>, V: Into<String>>(
        vars: impl IntoIterator<Item = (K, V)>,
    ) -> Env {
        Env(Arc::new(
            vars.into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        ))
    }

    /// These variables plus (or over) `more`.
    pub fn with<K: Into<String>, V: Into<String>>(
        &self,
        more: impl IntoIterator<Item = (K, V)>,
    ) -> Env {
        let mut vars = (*self.0).clone();
        vars.extend(more.into_iter().map(|(k, v)| (k.into(), v.into())));
        Env(Arc::new(vars))
    }

    /// The value of `name`, if set.
    pub fn var(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// `s` with every `${VAR}` replaced from these variables (see [`expand_vars`]).
    pub fn expand(&self, s: &str) -> Result<String, String> {
        expand_vars(s, &|k| self.var(k).map(str::to_string))
    }
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Env({} variables)", self.0.len())
    }
}

/// `s` with every `${VAR}` replaced by `lookup(VAR)`; `$${` writes a literal `${`. On failure,
/// the name of the first variable that is not set.
pub fn expand_vars(s: &str, lookup: &dyn Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        if rest[..start].ends_with('$') {
            // `$${`: a literal `${`.
            out.push_str(&rest[..start - 1]);
            out.push_str("${");
            rest = &rest[start + 2..];
            continue;
        }
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            out.push_str(&rest[start..]);
            return Ok(out);
        };
        let var = &after[..end];
        out.push_str(&lookup(var).ok_or_else(|| var.to_string())?);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Spans of values taken from the environment start past the file's end: the `i`-th variable
/// applied gets `text.len() + ENV_SPAN_BASE + i`, so that an error about it names the variable
/// rather than a line.
pub(super) const ENV_SPAN_BASE: usize = 1;

/// Every `[server]` key, each settable by `TURNSTILE_<KEY uppercased>`.
const SERVER_KEYS: &[&str] = &[
    "listen",
    "data_dir",
    "sandboxes",
    "api_keys_env",
    "public_meta",
    "max_body_bytes",
    "fsync",
    "session_cache",
    "drain_s",
    "header_timeout_s",
    "idle_timeout_s",
    "max_connections",
    "metrics_listen",
    "allowed_hosts",
];

/// The variable that sets `[server] key`.
pub fn server_var(key: &str) -> String {
    format!("TURNSTILE_{}", key.to_ascii_uppercase())
}

/// Puts the `TURNSTILE_<KEY>` variables that are set (and not empty) into `raw`'s `[server]`.
/// Returns the variables applied, in span order (see [`ENV_SPAN_BASE`]), or, for a value that
/// is not even of the key's type, `(variable, message)`.
pub(super) fn apply_server_env(
    raw: &mut RawConfig,
    text_len: usize,
    env: &Env,
) -> Result<Vec<String>, (String, String)> {
    let mut applied = Vec::new();
    for key in SERVER_KEYS {
        let var = server_var(key);
        let Some(value) = env.var(&var).filter(|v| !v.is_empty()).map(str::to_string) else {
            continue;
        };
        let at = text_len + ENV_SPAN_BASE + applied.len();
        let span = at..at + 1;
        let server = raw
            .server
            .get_or_insert_with(|| Spanned::new(0..0, RawServer::default()))
            .get_mut();
        let int = || {
            value.trim().parse::<i64>().map_err(|_| {
                (
                    var.clone(),
                    format!("{value:?} is not a whole number (it sets [server] {key})"),
                )
            })
        };
        let boolean = || match value.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err((
                var.clone(),
                format!("{value:?} is not true or false (it sets [server] {key})"),
            )),
        };
        let s = || Some(Spanned::new(span.clone(), value.clone()));
        let n = |v: i64| Some(Spanned::new(span.clone(), v));
        match *key {
            "listen" => server.listen = s(),
            "data_dir" => server.data_dir = s(),
            "sandboxes" => server.sandboxes = s(),
            "api_keys_env" => server.api_keys_env = s(),
            "metrics_listen" => server.metrics_listen = s(),
            // Comma-separated.
            "allowed_hosts" => {
                server.allowed_hosts = Some(
                    value
                        .split(',')
                        .map(str::trim)
                        .filter(|h| !h.is_empty())
                        .map(|h| Spanned::new(span.clone(), h.to_string()))
                        .collect(),
                )
            }
            "public_meta" => server.public_meta = Some(boolean()?),
            "fsync" => server.fsync = Some(boolean()?),
            "max_body_bytes" => server.max_body_bytes = n(int()?),
            "session_cache" => server.session_cache = n(int()?),
            "drain_s" => server.drain_s = n(int()?),
            "header_timeout_s" => server.header_timeout_s = n(int()?),
            "idle_timeout_s" => server.idle_timeout_s = n(int()?),
            "max_connections" => server.max_connections = n(int()?),
            _ => continue,
        }
        applied.push(var);
    }
    Ok(applied)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        match k {
            "TOKEN" => Some("s3cret".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn variables_are_expanded_and_a_missing_one_is_named() {
        assert_eq!(
            expand_vars("Bearer ${TOKEN}", &env).unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(expand_vars("${TOKEN}-${EMPTY}.", &env).unwrap(), "s3cret-.");
        assert_eq!(
            expand_vars("plain $HOME {x}", &env).unwrap(),
            "plain $HOME {x}"
        );
        assert_eq!(expand_vars("a $${TOKEN} b", &env).unwrap(), "a ${TOKEN} b");
        assert_eq!(expand_vars("open ${TOKEN", &env).unwrap(), "open ${TOKEN");
        assert_eq!(expand_vars("x ${NOPE} ${TOKEN}", &env).unwrap_err(), "NOPE");
    }

    #[test]
    fn every_server_key_has_its_variable() {
        assert_eq!(server_var("max_body_bytes"), "TURNSTILE_MAX_BODY_BYTES");
        assert_eq!(SERVER_KEYS.len(), 14);
    }
}

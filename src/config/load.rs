//! Stage two of loading `tools.toml`: validate the [raw](super::raw) file into the runtime
//! [`Config`] with every default applied.
//!
//! Every problem becomes one [`ConfigError`] whose `Display` is a single line naming the file,
//! the 1-based line, the key and what to do, e.g.
//! `tools.toml:12: upstream.provider: unknown provider "gpt" (expected "openai", "anthropic" or "echo")`.
//! No input makes this module panic.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use globset::{Glob, GlobBuilder, GlobMatcher, GlobSet, GlobSetBuilder};
use toml::de::{DeTable, DeValue};
use toml::Spanned;

use super::raw::{
    RawAgent, RawConfig, RawFiles, RawLimits, RawMcpServer, RawPolicy, RawServer, RawTelemetry,
    RawUpstream,
};
use super::{
    AgentConfig, Config, FilesConfig, LimitsConfig, McpScope, McpServerConfig, McpTransport,
    PolicyConfig, PolicyRule, ProviderKind, SandboxKind, ServerConfig, TelemetryConfig,
    UpstreamConfig, Verdict,
};

/// Default `[server] listen`.
const DEFAULT_LISTEN: &str = "127.0.0.1:8787";
/// Default `[server] max_body_bytes`: 4 MiB.
const DEFAULT_MAX_BODY_BYTES: u64 = 4 * 1024 * 1024;
/// Default `[files] max_bytes`: 100 MiB.
const DEFAULT_FILES_MAX_BYTES: u64 = 100 * 1024 * 1024;
/// Default `[upstream] timeout_s`.
const DEFAULT_UPSTREAM_TIMEOUT_S: i64 = 600;
/// Default `[upstream] retries`.
const DEFAULT_RETRIES: i64 = 2;
/// Default `[agents.X] max_steps`.
const DEFAULT_MAX_STEPS: i64 = 32;
/// Default `[agents.X] turn_timeout_s`.
const DEFAULT_TURN_TIMEOUT_S: i64 = 3600;
/// Default `[agents.X] version`.
const DEFAULT_AGENT_VERSION: &str = "0.1.0";
/// Default `[mcp_servers.X] timeout_s`.
const DEFAULT_MCP_TIMEOUT_S: i64 = 60;
/// Default `[mcp_servers.X] startup_timeout_s`.
const DEFAULT_MCP_STARTUP_TIMEOUT_S: i64 = 30;
/// Longest accepted `*_s` duration (one year), so that `Instant::now() + d` can never overflow.
const MAX_SECONDS: i64 = 365 * 24 * 3600;
/// Most accepted `[upstream] retries`.
const MAX_RETRIES: i64 = 100;

/// A config file that cannot be used: which file, where, which key, and what to do about it.
///
/// `Display` is one line: `FILE[:LINE]: [KEY: ]MESSAGE`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.one_line())]
pub struct ConfigError {
    /// The config file, as given.
    pub path: PathBuf,
    /// 1-based line in the file, when the problem has a place.
    pub line: Option<usize>,
    /// Dotted key path, e.g. `upstream.provider` or `mcp_servers.fs.command`.
    pub key: Option<String>,
    /// What is wrong and how to fix it (one line).
    pub message: String,
}

impl ConfigError {
    fn one_line(&self) -> String {
        let mut s = self.path.display().to_string();
        if let Some(line) = self.line {
            s.push(':');
            s.push_str(&line.to_string());
        }
        s.push_str(": ");
        if let Some(key) = &self.key {
            s.push_str(key);
            s.push_str(": ");
        }
        // Keep the promise of one line whatever a message embeds.
        s.push_str(&self.message.replace(['\r', '\n'], " "));
        s
    }
}

/// Read and validate the config file at `path`. A missing or unreadable file is an error naming it.
pub fn load(path: &Path) -> Result<Config, ConfigError> {
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
    load_str(path, &text)
}

/// Validate `text` as the contents of the config file `path` (used in messages, and its folder
/// for resolving relative paths).
pub fn load_str(path: &Path, text: &str) -> Result<Config, ConfigError> {
    load_str_with_env(path, text, &|k| std::env::var(k).ok())
}

/// [`load_str`] reading the environment (`TURNSTILE_<KEY>` overrides of `[server]`, `${VAR}`
/// in stdio servers' `args` and `env`) through `env`.
pub fn load_str_with_env(
    path: &Path,
    text: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
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
    Ok(Config {
        path: path.to_path_buf(),
        server: server(&cx, raw.server.as_ref(), base_dir)?,
        upstream: upstream(&cx, raw.upstream.as_ref())?,
        agents: agents(&cx, raw.agents.as_ref())?,
        mcp_servers: mcp_servers(&cx, raw.mcp_servers.as_ref(), base_dir)?,
        policy: policy(&cx, raw.policy.as_ref())?,
        files: files(&cx, raw.files.as_ref())?,
        limits: limits(&cx, raw.limits.as_ref())?,
        telemetry: telemetry(&cx, raw.telemetry.as_ref())?,
    })
}

/// `p` if absolute, else `p` under `base_dir` (the config file's folder); made absolute against
/// the current directory when that is relative too, so that a path handed to a child that runs
/// elsewhere (a session server's `{workspace}`, its cwd) still names the same place.
pub fn resolve_path(base_dir: &Path, p: &Path) -> PathBuf {
    let joined = if p.is_absolute() {
        p.to_path_buf()
    } else {
        base_dir.join(p)
    };
    std::path::absolute(&joined).unwrap_or(joined)
}

/// The file being checked, for building errors.
struct Cx<'a> {
    path: &'a Path,
    text: &'a str,
    /// The environment.
    env: super::env::Lookup<'a>,
    /// The `TURNSTILE_<KEY>` variables applied, by their spans (see `env::ENV_SPAN_BASE`).
    env_vars: Vec<String>,
}

impl Cx<'_> {
    /// The 1-based line holding byte `offset`.
    fn line_of(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|&&b| b == b'\n')
            .count()
            + 1
    }

    /// An error at `span`, about `key`.
    fn err(&self, span: Range<usize>, key: &str, message: impl Into<String>) -> ConfigError {
        if let Some(var) = span
            .start
            .checked_sub(self.text.len() + super::env::ENV_SPAN_BASE)
            .and_then(|i| self.env_vars.get(i))
        {
            return ConfigError {
                path: self.path.to_path_buf(),
                line: None,
                key: Some(key.to_string()),
                message: format!("{} (from the environment variable {var})", message.into()),
            };
        }
        ConfigError {
            path: self.path.to_path_buf(),
            line: Some(self.line_of(span.start)),
            key: Some(key.to_string()),
            message: message.into(),
        }
    }

    /// Deserialize the file into its raw form, turning TOML and serde errors into one-line errors.
    fn parse(&self) -> Result<RawConfig, ConfigError> {
        let (tree, syntax_errors) = DeTable::parse_recoverable(self.text);
        if let Some(e) = syntax_errors.first() {
            return Err(self.toml_error(e, tree.get_ref(), true));
        }
        toml::from_str::<RawConfig>(self.text)
            .map_err(|e| self.toml_error(&e, tree.get_ref(), false))
    }

    fn toml_error(&self, e: &toml::de::Error, tree: &DeTable<'_>, syntax: bool) -> ConfigError {
        let offset = e.span().map(|s| s.start);
        let key = offset.and_then(|o| key_path_at(tree, o));
        let mut message = tidy_serde_message(e.message());
        if syntax {
            if message == "duplicate key" {
                if let Some(name) = e.span().and_then(|s| self.text.get(s)) {
                    message = format!(
                        "duplicate key `{name}`: a key may appear only once per table; remove one"
                    );
                }
            }
            message = format!("invalid TOML: {message}");
        } else if message.starts_with("unknown field") {
            message.push_str(" (remove it or correct its spelling)");
        }
        ConfigError {
            path: self.path.to_path_buf(),
            line: offset.map(|o| self.line_of(o)),
            key,
            message,
        }
    }

    /// HTTP headers as written (values may hold `${VAR}`, expanded when connecting).
    fn headers(
        &self,
        h: Option<&Spanned<indexmap::IndexMap<String, String>>>,
        key: &str,
    ) -> Result<BTreeMap<String, String>, ConfigError> {
        let mut headers = BTreeMap::new();
        let Some(h) = h else { return Ok(headers) };
        for (name, value) in h.get_ref() {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(self.err(
                    h.span(),
                    key,
                    format!("invalid header name {name:?}: use letters, digits and '-', e.g. \"Authorization\""),
                ));
            }
            if http::HeaderValue::from_str(value).is_err() {
                return Err(self.err(
                    h.span(),
                    key,
                    format!(
                        "invalid value for header {name:?}: no line breaks or control characters"
                    ),
                ));
            }
            headers.insert(name.clone(), value.clone());
        }
        Ok(headers)
    }

    /// Every `${VAR}` in `value` names a variable that is set (the value is expanded later,
    /// where it is used).
    fn vars_set(&self, value: &str, span: Range<usize>, key: &str) -> Result<(), ConfigError> {
        super::env::expand_vars(value, self.env)
            .map(drop)
            .map_err(|var| {
                self.err(
                    span,
                    key,
                    format!(
                        "${{{var}}} is not set in turnstile's environment: set {var}, or write $${{ for a literal ${{"
                    ),
                )
            })
    }

    /// A non-negative integer in `min..=max`, or `default` when absent.
    fn int(
        &self,
        v: Option<&Spanned<i64>>,
        key: &str,
        default: i64,
        min: i64,
        max: i64,
    ) -> Result<i64, ConfigError> {
        let Some(v) = v else { return Ok(default) };
        let n = *v.get_ref();
        if n < min || n > max {
            let range = if max == i64::MAX {
                format!("of at least {min}")
            } else {
                format!("from {min} to {max}")
            };
            return Err(self.err(
                v.span(),
                key,
                format!("{n} is out of range: use a whole number {range}"),
            ));
        }
        Ok(n)
    }

    /// A duration from integer seconds (> 0), or `default_s` when absent.
    fn secs(
        &self,
        v: Option<&Spanned<i64>>,
        key: &str,
        default_s: i64,
    ) -> Result<Duration, ConfigError> {
        if let Some(v) = v {
            let n = *v.get_ref();
            if n <= 0 || n > MAX_SECONDS {
                return Err(self.err(
                    v.span(),
                    key,
                    format!(
                        "{n} is not a valid duration: give whole seconds from 1 to {MAX_SECONDS} (one year)"
                    ),
                ));
            }
        }
        let n = v.map_or(default_s, |v| *v.get_ref());
        Ok(Duration::from_secs(n.unsigned_abs()))
    }

    /// The name of an environment variable.
    fn env_var_name(
        &self,
        v: Option<&Spanned<String>>,
        key: &str,
    ) -> Result<Option<String>, ConfigError> {
        let Some(v) = v else { return Ok(None) };
        let s = v.get_ref();
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(self.err(
                v.span(),
                key,
                format!(
                    "{s:?} is not an environment variable name: use letters, digits and '_', e.g. \"OPENAI_API_KEY\""
                ),
            ));
        }
        Ok(Some(s.clone()))
    }

    /// A non-empty string.
    fn non_empty(&self, v: &Spanned<String>, key: &str, what: &str) -> Result<String, ConfigError> {
        if v.get_ref().trim().is_empty() {
            return Err(self.err(
                v.span(),
                key,
                format!("{what} is empty: give a value or remove the key"),
            ));
        }
        Ok(v.get_ref().clone())
    }

    /// An absolute `http://` or `https://` URL.
    fn http_url(
        &self,
        v: &Spanned<String>,
        key: &str,
        example: &str,
    ) -> Result<String, ConfigError> {
        let s = v.get_ref();
        let ok = s
            .parse::<http::Uri>()
            .ok()
            .filter(|u| matches!(u.scheme_str(), Some("http" | "https")) && u.authority().is_some())
            .is_some();
        if !ok {
            return Err(self.err(
                v.span(),
                key,
                format!(
                    "invalid URL {s:?}: it must start with http:// or https://, e.g. \"{example}\""
                ),
            ));
        }
        Ok(s.clone())
    }

    /// A globset glob over tool names (`*` also crosses `/`).
    fn glob(&self, v: &Spanned<String>, key: &str) -> Result<Glob, ConfigError> {
        let s = v.get_ref();
        if s.is_empty() {
            return Err(self.err(
                v.span(),
                key,
                "empty pattern: write a glob over tool names, e.g. \"mcp__fs__*\"",
            ));
        }
        GlobBuilder::new(s)
            .literal_separator(false)
            .build()
            .map_err(|e| {
                self.err(
                    v.span(),
                    key,
                    format!(
                        "invalid glob {s:?}: {} (globset syntax: * ? [abc] {{a,b}})",
                        e.kind()
                    ),
                )
            })
    }

    /// A string that must be one of `allowed`.
    fn choice<'v>(
        &self,
        v: &'v Spanned<String>,
        key: &str,
        what: &str,
        allowed: &[&str],
    ) -> Result<&'v str, ConfigError> {
        let s = v.get_ref().as_str();
        if allowed.contains(&s) {
            return Ok(s);
        }
        Err(self.err(
            v.span(),
            key,
            format!("unknown {what} {s:?} (expected {})", one_of(allowed)),
        ))
    }
}

/// `"a", "b" or "c"`.
fn one_of(allowed: &[&str]) -> String {
    let quoted: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
    match quoted.split_last() {
        None => String::new(),
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
    }
}

/// A dotted key path, quoting segments that are not bare TOML keys.
fn key_path(parts: &[&str]) -> String {
    parts
        .iter()
        .map(|p| {
            if is_name(p) {
                (*p).to_string()
            } else {
                format!("{p:?}")
            }
        })
        .collect::<Vec<_>>()
        .join(".")
}

/// `[A-Za-z0-9_-]+`
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Serde's wording, in the file's terms.
fn tidy_serde_message(msg: &str) -> String {
    let mut m = msg.replace(['\r', '\n'], " ");
    if let Some(i) = m.find(", expected struct ") {
        m.truncate(i);
        m.push_str(", expected a table");
    }
    for (from, to) in [
        ("expected i64", "expected an integer"),
        ("expected u64", "expected an integer"),
        ("expected a boolean", "expected true or false"),
        ("expected a sequence", "expected an array"),
        ("invalid type: sequence", "invalid type: array"),
        ("expected a map", "expected a table"),
        ("invalid type: map", "invalid type: table"),
    ] {
        m = m.replace(from, to);
    }
    m
}

/// The key path of the innermost key or value whose span holds `offset`.
fn key_path_at(tree: &DeTable<'_>, offset: usize) -> Option<String> {
    fn holds(span: &Range<usize>, offset: usize) -> bool {
        span.start <= offset && offset < span.end.max(span.start + 1)
    }
    fn walk_table(
        t: &DeTable<'_>,
        offset: usize,
        prefix: &mut Vec<String>,
        best: &mut Option<(usize, Vec<String>)>,
    ) {
        for (k, v) in t.iter() {
            prefix.push(k.get_ref().to_string());
            for span in [k.span(), v.span()] {
                if holds(&span, offset) {
                    let len = span.len();
                    if best.as_ref().is_none_or(|(l, _)| len <= *l) {
                        *best = Some((len, prefix.clone()));
                    }
                }
            }
            walk_value(v.get_ref(), offset, prefix, best);
            prefix.pop();
        }
    }
    fn walk_value(
        v: &DeValue<'_>,
        offset: usize,
        prefix: &mut Vec<String>,
        best: &mut Option<(usize, Vec<String>)>,
    ) {
        match v {
            DeValue::Table(t) => walk_table(t, offset, prefix, best),
            DeValue::Array(a) => {
                for item in a.iter() {
                    walk_value(item.get_ref(), offset, prefix, best);
                }
            }
            _ => {}
        }
    }
    let mut best = None;
    walk_table(tree, offset, &mut Vec::new(), &mut best);
    best.map(|(_, parts)| {
        let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
        key_path(&parts)
    })
}

/// `IP:PORT`, or `localhost:PORT` for 127.0.0.1.
fn parse_listen(s: &str) -> Option<SocketAddr> {
    if let Ok(addr) = s.parse() {
        return Some(addr);
    }
    let (host, port) = s.rsplit_once(':')?;
    if host.eq_ignore_ascii_case("localhost") {
        let port: u16 = port.parse().ok()?;
        return Some(SocketAddr::from((Ipv4Addr::LOCALHOST, port)));
    }
    None
}

fn server(
    cx: &Cx<'_>,
    raw: Option<&Spanned<RawServer>>,
    base_dir: &Path,
) -> Result<ServerConfig, ConfigError> {
    let default = RawServer::default();
    let t = raw.map(Spanned::get_ref).unwrap_or(&default);

    let listen = match &t.listen {
        None => parse_listen(DEFAULT_LISTEN).unwrap_or(SocketAddr::from((Ipv4Addr::LOCALHOST, 8787))),
        Some(v) => parse_listen(v.get_ref()).ok_or_else(|| {
            cx.err(
                v.span(),
                "server.listen",
                format!(
                    "{:?} is not a socket address: write IP:PORT, e.g. \"127.0.0.1:8787\" or \"0.0.0.0:8787\"",
                    v.get_ref()
                ),
            )
        })?,
    };
    let dir =
        |v: Option<&Spanned<String>>, key: &str, default: &str| -> Result<PathBuf, ConfigError> {
            let p = match v {
                None => default.to_string(),
                Some(v) => cx.non_empty(v, key, "the path")?,
            };
            Ok(resolve_path(base_dir, Path::new(&p)))
        };
    Ok(ServerConfig {
        listen,
        data_dir: dir(t.data_dir.as_ref(), "server.data_dir", "data")?,
        sandboxes: dir(t.sandboxes.as_ref(), "server.sandboxes", "sandboxes")?,
        api_keys_env: cx.env_var_name(t.api_keys_env.as_ref(), "server.api_keys_env")?,
        public_meta: t.public_meta.unwrap_or(true),
        fsync: t.fsync.unwrap_or(false),
        max_body_bytes: cx
            .int(
                t.max_body_bytes.as_ref(),
                "server.max_body_bytes",
                DEFAULT_MAX_BODY_BYTES as i64,
                1,
                i64::MAX,
            )?
            .unsigned_abs(),
        session_cache: cx
            .int(
                t.session_cache.as_ref(),
                "server.session_cache",
                DEFAULT_SESSION_CACHE,
                0,
                i64::MAX,
            )?
            .unsigned_abs() as usize,
        header_timeout: cx.secs(
            t.header_timeout_s.as_ref(),
            "server.header_timeout_s",
            DEFAULT_HEADER_TIMEOUT_S,
        )?,
        idle_timeout: cx.secs(
            t.idle_timeout_s.as_ref(),
            "server.idle_timeout_s",
            DEFAULT_IDLE_TIMEOUT_S,
        )?,
        max_connections: cx.int(
            t.max_connections.as_ref(),
            "server.max_connections",
            DEFAULT_MAX_CONNECTIONS,
            1,
            i64::from(u32::MAX),
        )? as usize,
        metrics_listen: match &t.metrics_listen {
            None => None,
            Some(v) => Some(parse_listen(v.get_ref()).ok_or_else(|| {
                cx.err(
                    v.span(),
                    "server.metrics_listen",
                    format!(
                        "{:?} is not a socket address: write IP:PORT, e.g. \"127.0.0.1:9464\"",
                        v.get_ref()
                    ),
                )
            })?),
        },
    })
}

/// Default `[server] header_timeout_s`.
const DEFAULT_HEADER_TIMEOUT_S: i64 = 10;
/// Default `[server] idle_timeout_s`.
const DEFAULT_IDLE_TIMEOUT_S: i64 = 60;
/// Default `[server] max_connections`.
const DEFAULT_MAX_CONNECTIONS: i64 = 4096;
/// Default `[agents.X] approval_ttl_s`.
const DEFAULT_APPROVAL_TTL_S: i64 = 3600;
/// Default `[agents.X] wrap_up_s`.
const DEFAULT_WRAP_UP_S: i64 = 60;
/// Default `[agents.X] compact_at`.
const DEFAULT_COMPACT_AT: f64 = 0.8;

/// Idle sessions kept in memory by default.
const DEFAULT_SESSION_CACHE: i64 = 1000;

fn upstream(
    cx: &Cx<'_>,
    raw: Option<&Spanned<RawUpstream>>,
) -> Result<UpstreamConfig, ConfigError> {
    let mut config = UpstreamConfig {
        provider: ProviderKind::Echo,
        base_url: String::new(),
        api_key_env: None,
        model: "echo".to_string(),
        max_tokens: None,
        timeout: Duration::from_secs(DEFAULT_UPSTREAM_TIMEOUT_S.unsigned_abs()),
        retries: DEFAULT_RETRIES as u32,
        headers: BTreeMap::new(),
    };
    let Some(table) = raw else { return Ok(config) };
    let t = table.get_ref();
    config.headers = cx.headers(t.headers.as_ref(), "upstream.headers")?;
    if let Some(h) = &t.headers {
        for (name, value) in &config.headers {
            cx.vars_set(value, h.span(), &key_path(&["upstream", "headers", name]))?;
        }
    }

    let Some(provider) = &t.provider else {
        return Err(cx.err(
            table.span(),
            "upstream.provider",
            "missing provider: add provider = \"openai\", \"anthropic\" or \"echo\" \
             (or remove the [upstream] table to use the built-in echo provider)",
        ));
    };
    let (kind, default_url, example_model) = match cx.choice(
        provider,
        "upstream.provider",
        "provider",
        &["openai", "anthropic", "echo"],
    )? {
        "openai" => (
            ProviderKind::OpenAi,
            "https://api.openai.com/v1",
            "gpt-4o-mini",
        ),
        "anthropic" => (
            ProviderKind::Anthropic,
            "https://api.anthropic.com/v1",
            "claude-sonnet-4-5",
        ),
        _ => (ProviderKind::Echo, "", "echo"),
    };
    config.provider = kind;

    config.base_url = match &t.base_url {
        None => default_url.to_string(),
        Some(v) => cx
            .http_url(v, "upstream.base_url", "http://127.0.0.1:11434/v1")?
            .trim_end_matches('/')
            .to_string(),
    };

    config.model = match &t.model {
        Some(v) => cx.non_empty(v, "upstream.model", "the model")?,
        None if kind == ProviderKind::Echo => "echo".to_string(),
        None => {
            return Err(cx.err(
                table.span(),
                "upstream.model",
                format!(
                    "missing model: the {} provider needs one; add model = \"{example_model}\" (or the model your server serves) under [upstream]",
                    provider.get_ref()
                ),
            ))
        }
    };

    config.api_key_env = cx.env_var_name(t.api_key_env.as_ref(), "upstream.api_key_env")?;
    config.max_tokens = match &t.max_tokens {
        None => None,
        Some(v) => Some(cx.int(Some(v), "upstream.max_tokens", 0, 1, u32::MAX as i64)? as u32),
    };
    config.timeout = cx.secs(
        t.timeout_s.as_ref(),
        "upstream.timeout_s",
        DEFAULT_UPSTREAM_TIMEOUT_S,
    )?;
    config.retries = cx.int(
        t.retries.as_ref(),
        "upstream.retries",
        DEFAULT_RETRIES,
        0,
        MAX_RETRIES,
    )? as u32;
    Ok(config)
}

/// The agent a file without `[agents.*]` gets.
fn default_agent() -> AgentConfig {
    let mut tools = GlobSetBuilder::new();
    if let Ok(g) = GlobBuilder::new("*").literal_separator(false).build() {
        tools.add(g);
    }
    AgentConfig {
        name: "assistant".to_string(),
        title: Some("Assistant".to_string()),
        description: None,
        version: DEFAULT_AGENT_VERSION.to_string(),
        system_prompt: "You are a helpful assistant.".to_string(),
        tools: vec!["*".to_string()],
        tool_globs: tools.build().unwrap_or_else(|_| GlobSet::empty()),
        max_steps: DEFAULT_MAX_STEPS as u32,
        turn_timeout: Duration::from_secs(DEFAULT_TURN_TIMEOUT_S.unsigned_abs()),
        thinking: false,
        models: Vec::new(),
        client_system_prompt: true,
        approval_ttl: Duration::from_secs(DEFAULT_APPROVAL_TTL_S.unsigned_abs()),
        wrap_up: Duration::from_secs(DEFAULT_WRAP_UP_S.unsigned_abs()),
        context_tokens: None,
        compact_at: DEFAULT_COMPACT_AT,
    }
}

fn agents(
    cx: &Cx<'_>,
    raw: Option<&indexmap::IndexMap<String, Spanned<RawAgent>>>,
) -> Result<Vec<AgentConfig>, ConfigError> {
    let Some(raw) = raw.filter(|m| !m.is_empty()) else {
        return Ok(vec![default_agent()]);
    };
    raw.iter().map(|(name, t)| agent(cx, name, t)).collect()
}

fn agent(cx: &Cx<'_>, name: &str, table: &Spanned<RawAgent>) -> Result<AgentConfig, ConfigError> {
    let key = |k: &str| key_path(&["agents", name, k]);
    if !is_name(name) {
        return Err(cx.err(
            table.span(),
            &key_path(&["agents", name]),
            format!("invalid agent name {name:?}: use only letters, digits, '_' and '-'"),
        ));
    }
    let t = table.get_ref();

    let (tools, tool_globs) = match &t.tools {
        None => (vec!["*".to_string()], default_agent().tool_globs),
        Some(patterns) => {
            let mut builder = GlobSetBuilder::new();
            for p in patterns {
                builder.add(cx.glob(p, &key("tools"))?);
            }
            let set = builder.build().map_err(|e| {
                cx.err(
                    table.span(),
                    &key("tools"),
                    format!("invalid tools globs: {}", e.kind()),
                )
            })?;
            (patterns.iter().map(|p| p.get_ref().clone()).collect(), set)
        }
    };

    let mut models = Vec::new();
    for m in t.models.iter().flatten() {
        models.push(cx.non_empty(m, &key("models"), "a model name")?);
    }

    let version = match &t.version {
        None => DEFAULT_AGENT_VERSION.to_string(),
        Some(v) => cx.non_empty(v, &key("version"), "the version")?,
    };

    Ok(AgentConfig {
        name: name.to_string(),
        title: Some(t.title.clone().unwrap_or_else(|| name.to_string())),
        description: t.description.clone(),
        version,
        system_prompt: t.system_prompt.clone().unwrap_or_default(),
        tools,
        tool_globs,
        max_steps: cx.int(
            t.max_steps.as_ref(),
            &key("max_steps"),
            DEFAULT_MAX_STEPS,
            1,
            u32::MAX as i64,
        )? as u32,
        turn_timeout: cx.secs(
            t.turn_timeout_s.as_ref(),
            &key("turn_timeout_s"),
            DEFAULT_TURN_TIMEOUT_S,
        )?,
        thinking: t.thinking.unwrap_or(false),
        models,
        client_system_prompt: t.client_system_prompt.unwrap_or(true),
        approval_ttl: cx.secs(
            t.approval_ttl_s.as_ref(),
            &key("approval_ttl_s"),
            DEFAULT_APPROVAL_TTL_S,
        )?,
        wrap_up: cx.secs(t.wrap_up_s.as_ref(), &key("wrap_up_s"), DEFAULT_WRAP_UP_S)?,
        context_tokens: match &t.context_tokens {
            None => None,
            v => Some(cx.int(
                v.as_ref(),
                &key("context_tokens"),
                0,
                1024,
                i64::from(u32::MAX),
            )? as u32),
        },
        compact_at: match &t.compact_at {
            None => DEFAULT_COMPACT_AT,
            Some(v) => {
                let x = *v.get_ref();
                if !(x > 0.0 && x <= 1.0) {
                    return Err(cx.err(
                        v.span(),
                        &key("compact_at"),
                        format!("{x} is out of range: give a share of the context window above 0 and at most 1, e.g. 0.8"),
                    ));
                }
                x
            }
        },
    })
}

fn mcp_servers(
    cx: &Cx<'_>,
    raw: Option<&indexmap::IndexMap<String, Spanned<RawMcpServer>>>,
    base_dir: &Path,
) -> Result<Vec<McpServerConfig>, ConfigError> {
    raw.into_iter()
        .flatten()
        .map(|(name, t)| mcp_server(cx, name, t, base_dir))
        .collect()
}

fn mcp_server(
    cx: &Cx<'_>,
    name: &str,
    table: &Spanned<RawMcpServer>,
    base_dir: &Path,
) -> Result<McpServerConfig, ConfigError> {
    let key = |k: &str| key_path(&["mcp_servers", name, k]);
    if !is_name(name) || name.contains("__") {
        return Err(cx.err(
            table.span(),
            &key_path(&["mcp_servers", name]),
            format!(
                "invalid server name {name:?}: use only letters, digits, '_' and '-', and no \"__\" \
                 (tools are named mcp__<server>__<tool>)"
            ),
        ));
    }
    let t = table.get_ref();

    let scope = match &t.scope {
        None => McpScope::Shared,
        Some(v) => match cx.choice(v, &key("scope"), "scope", &["shared", "session"])? {
            "session" => McpScope::Session,
            _ => McpScope::Shared,
        },
    };
    let sandbox = match &t.sandbox {
        None => SandboxKind::None,
        Some(v) => match cx.choice(v, &key("sandbox"), "sandbox", &["none", "landlock"])? {
            "landlock" => SandboxKind::Landlock,
            _ => SandboxKind::None,
        },
    };

    let transport = match (&t.command, &t.url) {
        (None, None) => {
            return Err(cx.err(
                table.span(),
                &key("command"),
                "missing command (or url): add command = \"...\" to launch a stdio server, \
                 or url = \"http://...\" for a streamable HTTP server",
            ))
        }
        (Some(_), Some(url)) => {
            return Err(cx.err(
                url.span(),
                &key("url"),
                "both command and url are set: keep command for a stdio server or url for an HTTP server, not both",
            ))
        }
        (Some(command), None) => {
            if let Some(h) = &t.headers {
                return Err(cx.err(
                    h.span(),
                    &key("headers"),
                    "headers only apply to an HTTP server (url); remove them for a stdio server (command)",
                ));
            }
            let command_s = cx.non_empty(command, &key("command"), "the command")?;
            if command_s.contains('\0') {
                return Err(cx.err(command.span(), &key("command"), "the command contains a NUL character"));
            }
            let mut args = Vec::new();
            if let Some(a) = &t.args {
                if a.get_ref().iter().any(|s| s.contains('\0')) {
                    return Err(cx.err(a.span(), &key("args"), "an argument contains a NUL character"));
                }
                args = a.get_ref().clone();
                for arg in &args {
                    cx.vars_set(arg, a.span(), &key("args"))?;
                }
            }
            let mut env = BTreeMap::new();
            if let Some(e) = &t.env {
                for (k, v) in e.get_ref() {
                    if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
                        return Err(cx.err(
                            e.span(),
                            &key("env"),
                            format!(
                                "invalid environment variable {k:?}: names must be non-empty without '=', and no NUL characters anywhere"
                            ),
                        ));
                    }
                    cx.vars_set(v, e.span(), &key_path(&["mcp_servers", name, "env", k]))?;
                    env.insert(k.clone(), v.clone());
                }
            }
            let cwd = match &t.cwd {
                None => None,
                Some(c) => {
                    if scope == McpScope::Session {
                        return Err(cx.err(
                            c.span(),
                            &key("cwd"),
                            "cwd cannot be set with scope = \"session\": a session-scoped server runs in the session's workspace; remove cwd",
                        ));
                    }
                    let c = cx.non_empty(c, &key("cwd"), "the path")?;
                    Some(resolve_path(base_dir, Path::new(&c)))
                }
            };
            McpTransport::Stdio {
                command: command_s,
                args,
                env,
                cwd,
            }
        }
        (None, Some(url)) => {
            for (present, k) in [
                (t.args.as_ref().map(Spanned::span), "args"),
                (t.env.as_ref().map(Spanned::span), "env"),
                (t.cwd.as_ref().map(Spanned::span), "cwd"),
            ] {
                if let Some(span) = present {
                    return Err(cx.err(
                        span,
                        &key(k),
                        format!(
                            "{k} only applies to a stdio server (command); remove it for an HTTP server (url)"
                        ),
                    ));
                }
            }
            if let Some(s) = &t.sandbox {
                if sandbox != SandboxKind::None {
                    return Err(cx.err(
                        s.span(),
                        &key("sandbox"),
                        "a sandbox only applies to a stdio server (command), which turnstile launches; remove it for an HTTP server (url)",
                    ));
                }
            }
            let url_s = cx.http_url(url, &key("url"), "http://127.0.0.1:9000/mcp")?;
            let headers = cx.headers(t.headers.as_ref(), &key("headers"))?;
            McpTransport::Http { url: url_s, headers }
        }
    };

    Ok(McpServerConfig {
        name: name.to_string(),
        transport,
        scope,
        timeout: cx.secs(
            t.timeout_s.as_ref(),
            &key("timeout_s"),
            DEFAULT_MCP_TIMEOUT_S,
        )?,
        startup_timeout: cx.secs(
            t.startup_timeout_s.as_ref(),
            &key("startup_timeout_s"),
            DEFAULT_MCP_STARTUP_TIMEOUT_S,
        )?,
        sandbox,
        network: t.network.unwrap_or(false),
        line: cx.line_of(table.span().start),
    })
}

fn policy(cx: &Cx<'_>, raw: Option<&Spanned<RawPolicy>>) -> Result<PolicyConfig, ConfigError> {
    let default = RawPolicy::default();
    let t = raw.map(Spanned::get_ref).unwrap_or(&default);
    let rules =
        |v: Option<&Vec<Spanned<String>>>, key: &str| -> Result<Vec<PolicyRule>, ConfigError> {
            v.into_iter()
                .flatten()
                .map(|p| {
                    let glob: GlobMatcher = cx.glob(p, key)?.compile_matcher();
                    Ok(PolicyRule {
                        pattern: p.get_ref().clone(),
                        glob,
                        line: cx.line_of(p.span().start),
                    })
                })
                .collect()
        };
    Ok(PolicyConfig {
        trust: rules(t.trust.as_ref(), "policy.trust")?,
        ask: rules(t.ask.as_ref(), "policy.ask")?,
        deny: rules(t.deny.as_ref(), "policy.deny")?,
        default: match &t.default {
            None => Verdict::Ask,
            Some(v) => {
                match cx.choice(v, "policy.default", "verdict", &["trust", "ask", "deny"])? {
                    "trust" => Verdict::Trust,
                    "deny" => Verdict::Deny,
                    _ => Verdict::Ask,
                }
            }
        },
    })
}

fn files(cx: &Cx<'_>, raw: Option<&Spanned<RawFiles>>) -> Result<FilesConfig, ConfigError> {
    let max = raw.and_then(|t| t.get_ref().max_bytes.as_ref());
    Ok(FilesConfig {
        max_bytes: cx
            .int(
                max,
                "files.max_bytes",
                DEFAULT_FILES_MAX_BYTES as i64,
                1,
                i64::MAX,
            )?
            .unsigned_abs(),
    })
}

fn telemetry(
    cx: &Cx<'_>,
    raw: Option<&Spanned<RawTelemetry>>,
) -> Result<TelemetryConfig, ConfigError> {
    let Some(v) = raw.and_then(|t| t.get_ref().otlp_endpoint.as_ref()) else {
        return Ok(TelemetryConfig::default());
    };
    Ok(TelemetryConfig {
        otlp_endpoint: Some(cx.http_url(v, "telemetry.otlp_endpoint", "http://127.0.0.1:4317")?),
    })
}

fn limits(cx: &Cx<'_>, raw: Option<&Spanned<RawLimits>>) -> Result<LimitsConfig, ConfigError> {
    let empty = RawLimits::default();
    let t = raw.map(Spanned::get_ref).unwrap_or(&empty);
    let d = LimitsConfig::default();
    let n = |v: Option<&Spanned<i64>>, key: &str, default: u64| -> Result<u64, ConfigError> {
        Ok(cx
            .int(v, key, default as i64, 1, i64::from(u32::MAX))?
            .unsigned_abs())
    };
    Ok(LimitsConfig {
        queued_turns: n(
            t.queued_turns.as_ref(),
            "limits.queued_turns",
            d.queued_turns as u64,
        )? as usize,
        running_turns: n(
            t.running_turns.as_ref(),
            "limits.running_turns",
            d.running_turns as u64,
        )? as usize,
        sessions_per_key: n(
            t.sessions_per_key.as_ref(),
            "limits.sessions_per_key",
            d.sessions_per_key as u64,
        )? as usize,
        subscribers_per_session: n(
            t.subscribers_per_session.as_ref(),
            "limits.subscribers_per_session",
            d.subscribers_per_session as u64,
        )? as usize,
        files_per_message: n(
            t.files_per_message.as_ref(),
            "limits.files_per_message",
            d.files_per_message as u64,
        )? as usize,
        session_servers: n(
            t.session_servers.as_ref(),
            "limits.session_servers",
            d.session_servers as u64,
        )? as usize,
        disk_bytes_per_key: cx
            .int(
                t.disk_bytes_per_key.as_ref(),
                "limits.disk_bytes_per_key",
                d.disk_bytes_per_key as i64,
                1,
                i64::MAX,
            )?
            .unsigned_abs(),
        tool_result_bytes: n(
            t.tool_result_bytes.as_ref(),
            "limits.tool_result_bytes",
            d.tool_result_bytes as u64,
        )? as usize,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> &'static Path {
        Path::new("/etc/turnstile/tools.toml")
    }

    /// The environment tests load with: `ORG`, `TOKEN` and what `extra` adds.
    fn test_env<'a>(extra: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            [("ORG", "acme"), ("TOKEN", "s3cret")]
                .iter()
                .chain(extra)
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    }

    fn ok_env(text: &str, extra: &[(&str, &str)]) -> Config {
        match load_str_with_env(path(), text, &test_env(extra)) {
            Ok(c) => c,
            Err(e) => panic!("expected a valid config, got: {e}"),
        }
    }

    fn bad_env(text: &str, extra: &[(&str, &str)]) -> ConfigError {
        let e = load_str_with_env(Path::new("tools.toml"), text, &test_env(extra))
            .expect_err("expected an error");
        let shown = e.to_string();
        assert!(!shown.contains('\n'), "not one line: {shown}");
        e
    }

    #[test]
    fn stdio_args_and_env_may_use_set_variables_and_an_unset_one_is_an_error_naming_it() {
        let c = ok_env(
            "[mcp_servers.gh]\ncommand = \"srv\"\nargs = [\"--token=${TOKEN}\", \"$${LITERAL}\"]\nenv = { ORG = \"${ORG}\" }\n",
            &[],
        );
        match &c.mcp_servers[0].transport {
            McpTransport::Stdio { args, env, .. } => {
                // Kept as written: expanded when the child is spawned.
                assert_eq!(args[0], "--token=${TOKEN}");
                assert_eq!(env["ORG"], "${ORG}");
            }
            McpTransport::Http { .. } => panic!("stdio expected"),
        }
        let e = bad_env(
            "[mcp_servers.gh]\ncommand = \"srv\"\nargs = [\"--token=${GH_TOKEN}\"]\n",
            &[],
        );
        assert_eq!(e.key.as_deref(), Some("mcp_servers.gh.args"));
        assert_eq!(e.line, Some(3));
        assert!(e.message.contains("${GH_TOKEN} is not set"), "{e}");
        let e = bad_env(
            "[mcp_servers.gh]\ncommand = \"srv\"\nenv = { KEY = \"${GH_KEY}\" }\n",
            &[],
        );
        assert_eq!(e.key.as_deref(), Some("mcp_servers.gh.env.KEY"));
        assert!(e.message.contains("GH_KEY"), "{e}");
        let e = bad_env(
            "[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nheaders = { X-Org = \"${NO_ORG}\" }\n",
            &[],
        );
        assert_eq!(e.key.as_deref(), Some("upstream.headers.X-Org"));
        assert!(e.message.contains("NO_ORG"), "{e}");
    }

    #[test]
    fn server_keys_come_from_turnstile_variables_over_the_file() {
        let file = "[server]\nlisten = \"127.0.0.1:1111\"\nmax_body_bytes = 10\n";
        let c = ok_env(
            file,
            &[
                ("TURNSTILE_LISTEN", "127.0.0.1:2222"),
                ("TURNSTILE_MAX_BODY_BYTES", "2048"),
                ("TURNSTILE_FSYNC", "true"),
                ("TURNSTILE_IDLE_TIMEOUT_S", "7"),
                ("TURNSTILE_DATA_DIR", "/var/lib/turnstile"),
                ("TURNSTILE_SESSION_CACHE", ""),
            ],
        );
        assert_eq!(c.server.listen.port(), 2222);
        assert_eq!(c.server.max_body_bytes, 2048);
        assert!(c.server.fsync);
        assert_eq!(c.server.idle_timeout, Duration::from_secs(7));
        assert_eq!(c.server.data_dir, Path::new("/var/lib/turnstile"));
        assert_eq!(c.server.session_cache, 1000, "an empty variable is unset");
        // With no [server] table at all.
        let c = ok_env("", &[("TURNSTILE_MAX_CONNECTIONS", "3")]);
        assert_eq!(c.server.max_connections, 3);

        let e = bad_env(file, &[("TURNSTILE_MAX_BODY_BYTES", "lots")]);
        assert_eq!(e.key.as_deref(), Some("TURNSTILE_MAX_BODY_BYTES"));
        assert!(e.message.contains("\"lots\" is not a whole number"), "{e}");
        let e = bad_env(file, &[("TURNSTILE_MAX_CONNECTIONS", "0")]);
        assert_eq!(e.line, None);
        assert_eq!(e.key.as_deref(), Some("server.max_connections"));
        assert!(
            e.message.contains("out of range") && e.message.contains("TURNSTILE_MAX_CONNECTIONS"),
            "{e}"
        );
        let e = bad_env(file, &[("TURNSTILE_LISTEN", "nowhere")]);
        assert!(e.to_string().contains("TURNSTILE_LISTEN"), "{e}");
        let e = bad_env(file, &[("TURNSTILE_PUBLIC_META", "maybe")]);
        assert!(e.to_string().contains("TURNSTILE_PUBLIC_META"), "{e}");
    }

    fn ok(text: &str) -> Config {
        match load_str_with_env(path(), text, &test_env(&[])) {
            Ok(c) => c,
            Err(e) => panic!("expected a valid config, got: {e}"),
        }
    }

    fn bad(text: &str) -> ConfigError {
        let e = load_str_with_env(Path::new("tools.toml"), text, &test_env(&[]))
            .expect_err("expected an error");
        let shown = e.to_string();
        assert!(!shown.contains('\n'), "not one line: {shown}");
        println!("{shown}");
        e
    }

    /// The example of CONTRACT.md, verbatim.
    const CONTRACT_EXAMPLE: &str = r#"[server]
listen    = "127.0.0.1:8787"
data_dir  = "data"        # the event log and delivered files (embedded store, created on demand)
sandboxes = "sandboxes"   # one workspace folder per session: sandboxes/<session id>/
# api_keys_env = "TURNSTILE_API_KEYS"   # comma-separated bearer keys; see Security

[upstream]
provider    = "openai"    # "openai" (chat completions), "anthropic" (messages), "echo" (built-in)
base_url    = "http://127.0.0.1:11434/v1"
api_key_env = "OPENAI_API_KEY"
model       = "qwen3:8b"
# max_tokens = 4096
# timeout_s  = 600        # whole upstream call
# retries    = 2          # on connect errors, 429 and 5xx (and a stream broken midway)

[agents.assistant]        # each table is one AAP agent in GET /meta; the first is the default
title          = "Assistant"
system_prompt  = "You are a helpful assistant."
tools          = ["*"]    # globs over federated names: which tools this agent may use
max_steps      = 32       # model calls per turn
turn_timeout_s = 3600     # then turn.failed reason "timeout"
thinking       = false    # default of the AAP option "thinking" ("on" / "off"): agent.thinking events only when on
# models = ["a", "b"]     # offered to clients as the AAP select option "model"

[mcp_servers.time]        # a stdio server, launched as a child process
command = "python3"
args    = ["-m", "mcp_server_time"]
env     = { TZ = "UTC" }  # children inherit no secrets: only a minimal environment plus this table
# scope   = "shared"      # "shared": one process for all sessions (default)
#                         # "session": one process per session, cwd = its workspace, "{workspace}" in args replaced
# timeout_s = 60          # per tool call

[mcp_servers.shop]        # a remote server over streamable HTTP
url = "http://127.0.0.1:9000/mcp"
# headers = { Authorization = "Bearer ${SHOP_TOKEN}" }

[policy]                  # globs over the federated tool names (globset syntax)
trust   = ["mcp__time__*", "deliver_file"]   # may run inline (trust: true)
ask     = ["mcp__fs__write_*"]               # every call pauses for the client's permission
deny    = ["mcp__fs__move_file"]             # never offered to the model, refused if called
default = "ask"                              # for a tool that no pattern names
"#;

    #[test]
    fn contract_example_loads_with_its_values() {
        let c = ok(CONTRACT_EXAMPLE);
        assert_eq!(c.path, path());
        assert_eq!(
            c.server.listen,
            "127.0.0.1:8787".parse::<SocketAddr>().unwrap()
        );
        assert_eq!(c.server.data_dir, Path::new("/etc/turnstile/data"));
        assert_eq!(c.server.sandboxes, Path::new("/etc/turnstile/sandboxes"));
        assert_eq!(c.server.api_keys_env, None);

        assert_eq!(c.upstream.provider, ProviderKind::OpenAi);
        assert_eq!(c.upstream.base_url, "http://127.0.0.1:11434/v1");
        assert_eq!(c.upstream.api_key_env.as_deref(), Some("OPENAI_API_KEY"));
        assert_eq!(c.upstream.model, "qwen3:8b");
        assert_eq!(c.upstream.max_tokens, None);
        assert_eq!(c.upstream.timeout, Duration::from_secs(600));
        assert_eq!(c.upstream.retries, 2);

        assert_eq!(c.agents.len(), 1);
        let a = c.default_agent();
        assert_eq!(a.name, "assistant");
        assert_eq!(a.title.as_deref(), Some("Assistant"));
        assert_eq!(a.system_prompt, "You are a helpful assistant.");
        assert_eq!(a.tools, vec!["*"]);
        assert!(a.tool_globs.is_match("mcp__time__get_current_time"));
        assert!(a.tool_globs.is_match("deliver_file"));
        assert_eq!(a.max_steps, 32);
        assert_eq!(a.turn_timeout, Duration::from_secs(3600));
        assert!(!a.thinking);
        assert!(a.models.is_empty());

        assert_eq!(c.mcp_servers.len(), 2);
        let time = &c.mcp_servers[0];
        assert_eq!(time.name, "time");
        assert_eq!(time.line, 25);
        assert_eq!(time.scope, McpScope::Shared);
        assert_eq!(time.sandbox, SandboxKind::None);
        assert_eq!(time.timeout, Duration::from_secs(60));
        assert_eq!(time.startup_timeout, Duration::from_secs(30));
        match &time.transport {
            McpTransport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                assert_eq!(command, "python3");
                assert_eq!(args, &vec!["-m".to_string(), "mcp_server_time".to_string()]);
                assert_eq!(env.get("TZ").map(String::as_str), Some("UTC"));
                assert_eq!(env.len(), 1);
                assert_eq!(cwd, &None);
            }
            other => panic!("expected stdio, got {other:?}"),
        }
        let shop = &c.mcp_servers[1];
        assert_eq!(shop.name, "shop");
        assert_eq!(shop.line, 33);
        match &shop.transport {
            McpTransport::Http { url, headers } => {
                assert_eq!(url, "http://127.0.0.1:9000/mcp");
                assert!(headers.is_empty());
            }
            other => panic!("expected http, got {other:?}"),
        }

        let p = &c.policy;
        let patterns =
            |rules: &[PolicyRule]| rules.iter().map(|r| r.pattern.clone()).collect::<Vec<_>>();
        assert_eq!(patterns(&p.trust), vec!["mcp__time__*", "deliver_file"]);
        assert_eq!(p.trust[0].line, 38);
        assert_eq!(p.trust[1].line, 38);
        assert!(p.trust[0].glob.is_match("mcp__time__get_current_time"));
        assert!(!p.trust[0].glob.is_match("mcp__shop__buy"));
        assert_eq!(patterns(&p.ask), vec!["mcp__fs__write_*"]);
        assert_eq!(p.ask[0].line, 39);
        assert_eq!(patterns(&p.deny), vec!["mcp__fs__move_file"]);
        assert_eq!(p.deny[0].line, 40);
        assert_eq!(p.default, Verdict::Ask);

        assert_eq!(c.files.max_bytes, 100 * 1024 * 1024);
        assert_eq!(c.server.max_body_bytes, 4 * 1024 * 1024);
        assert!(c.server.public_meta);
    }

    #[test]
    fn empty_file_gets_echo_default_agent_and_every_default() {
        let c = load_str(Path::new("tools.toml"), "").unwrap();
        assert_eq!(
            c.server.listen,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 8787))
        );
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(c.server.data_dir, cwd.join("data"));
        assert_eq!(c.server.sandboxes, cwd.join("sandboxes"));
        assert_eq!(c.server.api_keys_env, None);
        assert!(c.server.public_meta);
        assert_eq!(c.server.max_body_bytes, 4_194_304);

        assert_eq!(c.upstream.provider, ProviderKind::Echo);
        assert_eq!(c.upstream.model, "echo");
        assert_eq!(c.upstream.base_url, "");
        assert_eq!(c.upstream.api_key_env, None);
        assert_eq!(c.upstream.max_tokens, None);
        assert_eq!(c.upstream.timeout, Duration::from_secs(600));
        assert_eq!(c.upstream.retries, 2);

        assert_eq!(c.agents.len(), 1);
        let a = c.default_agent();
        assert_eq!(a.name, "assistant");
        assert_eq!(a.title.as_deref(), Some("Assistant"));
        assert_eq!(a.description, None);
        assert_eq!(a.version, "0.1.0");
        assert_eq!(a.system_prompt, "You are a helpful assistant.");
        assert_eq!(a.tools, vec!["*"]);
        assert!(a.tool_globs.is_match("mcp__fs__read_file"));
        assert_eq!(a.max_steps, 32);
        assert_eq!(a.turn_timeout, Duration::from_secs(3600));
        assert!(!a.thinking);
        assert!(a.models.is_empty());

        assert!(c.mcp_servers.is_empty());
        assert!(c.policy.trust.is_empty() && c.policy.ask.is_empty() && c.policy.deny.is_empty());
        assert_eq!(c.policy.default, Verdict::Ask);
        assert_eq!(c.files.max_bytes, 104_857_600);
    }

    #[test]
    fn unknown_key_names_line_and_key() {
        let e =
            bad("[server]\nlisten = \"127.0.0.1:1\"\n\n[agents.a]\ntitle = \"A\"\nmax_step = 3\n");
        assert_eq!(e.line, Some(6));
        assert_eq!(e.key.as_deref(), Some("agents.a.max_step"));
        assert!(
            e.message.contains("unknown field `max_step`"),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("`max_steps`"),
            "lists the expected keys: {}",
            e.message
        );
        assert!(e
            .to_string()
            .starts_with("tools.toml:6: agents.a.max_step: unknown field `max_step`"));

        let e = bad("# hi\nbogus = 1\n");
        assert_eq!(e.line, Some(2));
        assert_eq!(e.key.as_deref(), Some("bogus"));
        assert!(e.message.contains("`mcp_servers`"), "{}", e.message);
    }

    #[test]
    fn wrong_type_and_syntax_errors_are_one_line_with_a_line() {
        let e = bad("[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nretries = \"two\"\n");
        assert_eq!(e.line, Some(4));
        assert_eq!(e.key.as_deref(), Some("upstream.retries"));
        assert!(e.message.contains("expected an integer"), "{}", e.message);

        let e = bad("[server]\nlisten = \"127.0.0.1:1\"\n[agents\n");
        assert_eq!(e.line, Some(3));
        assert!(e.message.starts_with("invalid TOML:"), "{}", e.message);

        let e = bad("[server]\nlisten = \"a:1\"\nlisten = \"b:2\"\n");
        assert_eq!(e.line, Some(3));
    }

    #[test]
    fn bad_glob_in_policy_names_its_line() {
        let e = bad("[policy]\ntrust = [\"ok_*\"]\ndeny = [\n  \"fine\",\n  \"mcp__fs__[a\",\n]\n");
        assert_eq!(e.line, Some(5));
        assert_eq!(e.key.as_deref(), Some("policy.deny"));
        assert!(
            e.message.contains("invalid glob \"mcp__fs__[a\""),
            "{}",
            e.message
        );
        assert!(
            e.message.contains("unclosed character class"),
            "{}",
            e.message
        );
    }

    #[test]
    fn bad_glob_in_agent_tools_names_its_line() {
        let e = bad("[agents.a]\ntools = [\"{a,b\"]\n");
        assert_eq!(e.line, Some(2));
        assert_eq!(e.key.as_deref(), Some("agents.a.tools"));
    }

    #[test]
    fn unknown_provider_names_line_and_allowed_values() {
        let e = bad("[server]\nlisten = \"127.0.0.1:8787\"\n\n[upstream]\nprovider = \"gpt\"\nmodel = \"x\"\n");
        assert_eq!(e.line, Some(5));
        assert_eq!(e.key.as_deref(), Some("upstream.provider"));
        assert_eq!(
            e.to_string(),
            "tools.toml:5: upstream.provider: unknown provider \"gpt\" (expected \"openai\", \"anthropic\" or \"echo\")"
        );
    }

    #[test]
    fn openai_and_anthropic_need_a_model() {
        let e = bad("\n[upstream]\nprovider = \"openai\"\n");
        assert_eq!(e.line, Some(2));
        assert_eq!(e.key.as_deref(), Some("upstream.model"));
        assert!(e.message.starts_with("missing model"), "{}", e.message);

        let e = bad("[upstream]\nprovider = \"anthropic\"\n");
        assert_eq!(e.key.as_deref(), Some("upstream.model"));

        let c = ok("[upstream]\nprovider = \"anthropic\"\nmodel = \"claude\"\napi_key_env = \"ANTHROPIC_API_KEY\"\n");
        assert_eq!(c.upstream.provider, ProviderKind::Anthropic);
        assert_eq!(c.upstream.base_url, "https://api.anthropic.com/v1");
        let c = ok("[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"http://h:1/v1//\"\ntimeout_s = 5\nretries = 0\nmax_tokens = 100\n");
        assert_eq!(c.upstream.base_url, "http://h:1/v1");
        assert_eq!(c.upstream.timeout, Duration::from_secs(5));
        assert_eq!(c.upstream.retries, 0);
        assert_eq!(c.upstream.max_tokens, Some(100));
        let c = ok("[upstream]\nprovider = \"openai\"\nmodel = \"m\"\n");
        assert_eq!(c.upstream.base_url, "https://api.openai.com/v1");
        let c = ok("[upstream]\nprovider = \"echo\"\n");
        assert_eq!(c.upstream.provider, ProviderKind::Echo);
        assert_eq!(c.upstream.model, "echo");

        let e = bad(
            "[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"127.0.0.1:11434/v1\"\n",
        );
        assert_eq!(e.line, Some(4));
        assert_eq!(e.key.as_deref(), Some("upstream.base_url"));
        let e = bad("[upstream]\nmodel = \"m\"\n");
        assert_eq!(e.key.as_deref(), Some("upstream.provider"));
        assert_eq!(e.line, Some(1));
    }

    #[test]
    fn mcp_server_needs_exactly_one_of_command_and_url() {
        let e = bad("[server]\n\n[mcp_servers.fs]\nargs = [\"x\"]\n");
        assert_eq!(e.line, Some(3));
        assert_eq!(e.key.as_deref(), Some("mcp_servers.fs.command"));
        assert!(
            e.message.starts_with("missing command (or url)"),
            "{}",
            e.message
        );

        let e = bad("[mcp_servers.fs]\ncommand = \"x\"\nurl = \"http://h/mcp\"\n");
        assert_eq!(e.line, Some(3));
        assert_eq!(e.key.as_deref(), Some("mcp_servers.fs.url"));
        assert!(
            e.message.starts_with("both command and url"),
            "{}",
            e.message
        );

        let e = bad("[mcp_servers.web]\nurl = \"http://h/mcp\"\nargs = [\"x\"]\n");
        assert_eq!(e.key.as_deref(), Some("mcp_servers.web.args"));
        assert_eq!(e.line, Some(3));
        let e = bad("[mcp_servers.fs]\ncommand = \"x\"\nheaders = { A = \"b\" }\n");
        assert_eq!(e.key.as_deref(), Some("mcp_servers.fs.headers"));
        let e = bad("[mcp_servers.fs]\ncommand = \"x\"\nscope = \"global\"\n");
        assert_eq!(e.line, Some(3));
        assert!(
            e.message.contains("(expected \"shared\" or \"session\")"),
            "{}",
            e.message
        );
        let e = bad("[mcp_servers.a__b]\ncommand = \"x\"\n");
        assert_eq!(e.key.as_deref(), Some("mcp_servers.a__b"));
        let e = bad("[mcp_servers.\"a b\"]\ncommand = \"x\"\n");
        assert_eq!(e.key.as_deref(), Some("mcp_servers.\"a b\""));
        let e = bad("[mcp_servers.fs]\ncommand = \"x\"\ntimeout_s = 0\n");
        assert_eq!(e.key.as_deref(), Some("mcp_servers.fs.timeout_s"));
        assert_eq!(e.line, Some(3));
    }

    #[test]
    fn mcp_server_values_and_defaults() {
        let c = ok("[mcp_servers.fs]\ncommand = \"npx\"\nargs = [\"{workspace}\"]\nscope = \"session\"\nsandbox = \"landlock\"\ntimeout_s = 5\nstartup_timeout_s = 7\n\n[mcp_servers.rel]\ncommand = \"./srv\"\ncwd = \"tools\"\n\n[mcp_servers.web]\nurl = \"https://h.example/mcp\"\nheaders = { Authorization = \"Bearer ${T}\" }\n");
        let names: Vec<&str> = c.mcp_servers.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, vec!["fs", "rel", "web"]);
        let fs = &c.mcp_servers[0];
        assert_eq!(
            (fs.scope, fs.sandbox, fs.line),
            (McpScope::Session, SandboxKind::Landlock, 1)
        );
        assert_eq!(fs.timeout, Duration::from_secs(5));
        assert_eq!(fs.startup_timeout, Duration::from_secs(7));
        match &c.mcp_servers[1].transport {
            McpTransport::Stdio { cwd, .. } => {
                assert_eq!(cwd.as_deref(), Some(Path::new("/etc/turnstile/tools")))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.mcp_servers[1].line, 9);
        match &c.mcp_servers[2].transport {
            McpTransport::Http { url, headers } => {
                assert_eq!(url, "https://h.example/mcp");
                assert_eq!(
                    headers.get("Authorization").map(String::as_str),
                    Some("Bearer ${T}")
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(c.mcp_servers[2].line, 13);
    }

    #[test]
    fn agent_order_is_kept_and_the_first_is_default() {
        let c = ok("[agents.zeta]\nmax_steps = 4\nthinking = true\nmodels = [\"a\", \"b\"]\n\n[agents.alpha]\ntitle = \"Alpha\"\ntools = [\"mcp__fs__*\", \"deliver_file\"]\nturn_timeout_s = 10\nversion = \"2.0.0\"\ndescription = \"d\"\n\n[agents.mid]\n");
        let names: Vec<&str> = c.agents.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, vec!["zeta", "alpha", "mid"]);
        assert_eq!(c.default_agent().name, "zeta");
        let z = c.agent("zeta").unwrap();
        assert_eq!(z.title.as_deref(), Some("zeta"));
        assert_eq!(z.max_steps, 4);
        assert!(z.thinking);
        assert_eq!(z.models, vec!["a", "b"]);
        assert_eq!(z.system_prompt, "");
        let a = c.agent("alpha").unwrap();
        assert_eq!(a.title.as_deref(), Some("Alpha"));
        assert_eq!(a.description.as_deref(), Some("d"));
        assert_eq!(a.version, "2.0.0");
        assert_eq!(a.turn_timeout, Duration::from_secs(10));
        assert!(a.tool_globs.is_match("mcp__fs__read_file"));
        assert!(a.tool_globs.is_match("deliver_file"));
        assert!(!a.tool_globs.is_match("mcp__shop__buy"));
        let m = c.agent("mid").unwrap();
        assert_eq!(m.tools, vec!["*"]);
        assert!(m.tool_globs.is_match("anything"));
        assert_eq!(m.max_steps, 32);

        let e = bad("[agents.a]\n\n[agents.b]\nmax_steps = 0\n");
        assert_eq!(e.line, Some(4));
        assert_eq!(e.key.as_deref(), Some("agents.b.max_steps"));
        let e = bad("[agents.\"my agent\"]\n");
        assert_eq!(e.line, Some(1));
        assert!(e.message.starts_with("invalid agent name"), "{}", e.message);
    }

    #[test]
    fn relative_paths_resolve_against_the_file_folder() {
        let c = ok("[server]\ndata_dir = \"var/data\"\nsandboxes = \"/srv/sb\"\n");
        assert_eq!(c.server.data_dir, Path::new("/etc/turnstile/var/data"));
        assert_eq!(c.server.sandboxes, Path::new("/srv/sb"));
        assert_eq!(
            resolve_path(Path::new("/a/b"), Path::new("c")),
            Path::new("/a/b/c")
        );
        assert_eq!(
            resolve_path(Path::new("/a/b"), Path::new("/c")),
            Path::new("/c")
        );
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(resolve_path(Path::new(""), Path::new("c")), cwd.join("c"));
        assert_eq!(
            resolve_path(Path::new("conf"), Path::new("data")),
            cwd.join("conf/data")
        );
        let rel = load_str(Path::new("tools.toml"), "").unwrap();
        assert!(rel.server.data_dir.is_absolute() && rel.server.sandboxes.is_absolute());
    }

    #[test]
    fn listen_accepts_localhost_and_rejects_junk() {
        let c = ok("[server]\nlisten = \"localhost:9000\"\n");
        assert_eq!(
            c.server.listen,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 9000))
        );
        let c = ok("[server]\nlisten = \"[::1]:9000\"\n");
        assert_eq!(c.server.listen.port(), 9000);
        let e = bad("[server]\nlisten = \"localhost\"\n");
        assert_eq!(e.line, Some(2));
        assert_eq!(e.key.as_deref(), Some("server.listen"));
    }

    #[test]
    fn other_sections_and_policy_default() {
        let c = ok("[server]\npublic_meta = false\nmax_body_bytes = 1024\napi_keys_env = \"KEYS\"\nfsync = true\nsession_cache = 0\n[files]\nmax_bytes = 10\n[policy]\ndefault = \"deny\"\n");
        assert!(c.server.fsync);
        assert_eq!(c.server.session_cache, 0);
        assert_eq!(ok("").server.session_cache, 1000);
        assert!(!c.server.public_meta);
        assert_eq!(c.server.max_body_bytes, 1024);
        assert_eq!(c.server.api_keys_env.as_deref(), Some("KEYS"));
        assert_eq!(c.files.max_bytes, 10);
        assert_eq!(c.policy.default, Verdict::Deny);
        let e = bad("[policy]\ndefault = \"allow\"\n");
        assert_eq!(e.key.as_deref(), Some("policy.default"));
        assert!(e
            .message
            .contains("(expected \"trust\", \"ask\" or \"deny\")"));
        let e = bad("[server]\nsession_cache = -1\n");
        assert_eq!(e.key.as_deref(), Some("server.session_cache"));
        assert_eq!(c.limits.queued_turns, 32);
        let c = ok("[server]\nheader_timeout_s = 3\nidle_timeout_s = 5\nmax_connections = 7\n[limits]\nqueued_turns = 2\nrunning_turns = 3\nsessions_per_key = 4\nsubscribers_per_session = 5\nfiles_per_message = 6\nsession_servers = 7\ndisk_bytes_per_key = 8\ntool_result_bytes = 9\n[agents.a]\nclient_system_prompt = false\napproval_ttl_s = 11\n[mcp_servers.m]\ncommand = \"x\"\nsandbox = \"landlock\"\nnetwork = true\n");
        assert_eq!(c.server.header_timeout, Duration::from_secs(3));
        assert_eq!(c.server.idle_timeout, Duration::from_secs(5));
        assert_eq!(c.server.max_connections, 7);
        let l = &c.limits;
        assert_eq!(
            (
                l.queued_turns,
                l.running_turns,
                l.sessions_per_key,
                l.subscribers_per_session
            ),
            (2, 3, 4, 5)
        );
        assert_eq!(
            (
                l.files_per_message,
                l.session_servers,
                l.disk_bytes_per_key,
                l.tool_result_bytes
            ),
            (6, 7, 8, 9)
        );
        assert!(!c.agents[0].client_system_prompt);
        assert_eq!(c.agents[0].approval_ttl, Duration::from_secs(11));
        assert!(c.mcp_servers[0].network);
        let d = ok("");
        assert_eq!(d.server.header_timeout, Duration::from_secs(10));
        assert_eq!(d.server.idle_timeout, Duration::from_secs(60));
        assert_eq!(d.server.max_connections, 4096);
        assert!(d.agents[0].client_system_prompt);
        assert_eq!(d.agents[0].approval_ttl, Duration::from_secs(3600));
        assert_eq!(d.limits.disk_bytes_per_key, 10 << 30);
        assert_eq!(d.limits.tool_result_bytes, 262_144);
        let c = ok("[server]\nmetrics_listen = \"127.0.0.1:9464\"\n[telemetry]\notlp_endpoint = \"http://127.0.0.1:4317\"\n[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nheaders = { X-Org = \"${ORG}\" }\n[agents.a]\nwrap_up_s = 5\ncontext_tokens = 32000\ncompact_at = 0.5\n");
        assert_eq!(
            c.server.metrics_listen,
            Some(SocketAddr::from((Ipv4Addr::LOCALHOST, 9464)))
        );
        assert_eq!(
            c.telemetry.otlp_endpoint.as_deref(),
            Some("http://127.0.0.1:4317")
        );
        assert_eq!(c.upstream.headers["X-Org"], "${ORG}", "kept as written");
        assert_eq!(c.agents[0].wrap_up, Duration::from_secs(5));
        assert_eq!(c.agents[0].context_tokens, Some(32000));
        assert_eq!(c.agents[0].compact_at, 0.5);
        assert_eq!(d.agents[0].wrap_up, Duration::from_secs(60));
        assert_eq!(
            (d.agents[0].context_tokens, d.agents[0].compact_at),
            (None, 0.8)
        );
        assert_eq!(d.server.metrics_listen, None);
        let e = bad("[agents.a]\ncompact_at = 1.5\n");
        assert_eq!(e.key.as_deref(), Some("agents.a.compact_at"));
        let e = bad("[upstream]\nprovider = \"openai\"\nmodel = \"m\"\nheaders = { \"Bad Name\" = \"x\" }\n");
        assert_eq!(e.key.as_deref(), Some("upstream.headers"));
        let e = bad("[limits]\nqueued_turns = 0\n");
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(2), Some("limits.queued_turns"))
        );
        let e = bad("[limits]\nbogus = 1\n");
        assert!(e.to_string().contains("bogus"), "{e}");
        let e = bad("[files]\nmax_bytes = -5\n");
        assert_eq!(
            (e.line, e.key.as_deref()),
            (Some(2), Some("files.max_bytes"))
        );
    }

    #[test]
    fn missing_file_names_it() {
        let e = load(Path::new("/nonexistent/dir/tools.toml")).unwrap_err();
        assert_eq!(e.path, Path::new("/nonexistent/dir/tools.toml"));
        assert_eq!(e.line, None);
        assert!(e
            .to_string()
            .starts_with("/nonexistent/dir/tools.toml: config file not found"));
    }

    #[test]
    fn never_panics_on_odd_input() {
        for text in [
            "\u{feff}",
            "[server]\nlisten = \"",
            "agents = 5",
            "[agents]\nx = 1",
            "mcp_servers.fs.command = 3",
            "[[agents]]\n",
            "[policy]\ntrust = [1]",
            "[policy]\ntrust = \"x\"",
            "[upstream]\ntimeout_s = 99999999999999999",
            "\0\0\0",
            "[mcp_servers.x]\nurl = \"http://h\"\nheaders = { \"bad name\" = \"v\" }",
            "[mcp_servers.x]\ncommand = \"c\"\nenv = { \"A=B\" = \"v\" }",
        ] {
            let r = load_str(Path::new("t.toml"), text);
            if let Err(e) = r {
                let shown = e.to_string();
                assert!(!shown.contains('\n'), "{shown}");
                println!("{shown}");
            }
        }
    }

    #[test]
    fn repository_example_is_valid_and_uses_echo() {
        let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tools.toml"));
        let c = load(path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.upstream.provider, ProviderKind::Echo);
        assert_eq!(
            c.server.listen,
            SocketAddr::from((Ipv4Addr::LOCALHOST, 8787))
        );
        assert_eq!(
            c.server.data_dir,
            Path::new(env!("CARGO_MANIFEST_DIR")).join("data")
        );
        assert_eq!(c.default_agent().name, "assistant");
        assert!(c.mcp_servers.is_empty());
        assert_eq!(c.policy.trust.len(), 1);
        assert_eq!(c.policy.trust[0].pattern, "deliver_file");
        assert_eq!(c.policy.default, Verdict::Ask);
    }
}

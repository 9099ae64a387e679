//! `[mcp_servers.*]`: the MCP servers whose tools are federated, stdio or HTTP.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::Spanned;

use super::error::{ConfigError, Cx};
use super::values::{is_name, key_path, mcp_server_key as key, resolve_path};
use crate::config::raw::RawMcpServer;
use crate::config::{McpScope, McpServerConfig, McpTransport, SandboxKind};

/// Default `[mcp_servers.X] timeout_s`.
const DEFAULT_MCP_TIMEOUT_S: i64 = 60;
/// Default `[mcp_servers.X] startup_timeout_s`.
const DEFAULT_MCP_STARTUP_TIMEOUT_S: i64 = 30;

/// Default `[mcp_servers.X] sampling_max_tokens`.
const DEFAULT_SAMPLING_MAX_TOKENS: i64 = 1024;
/// Default `[mcp_servers.X] sampling_calls_per_turn`.
const DEFAULT_SAMPLING_CALLS_PER_TURN: i64 = 4;

pub(super) fn mcp_servers(
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
    check_name(cx, name, table)?;
    let t = table.get_ref();
    let scope = scope(cx, name, t)?;
    let sandbox = sandbox(cx, name, t)?;
    let transport = transport(cx, name, table, scope, sandbox, base_dir)?;
    Ok(McpServerConfig {
        name: name.to_string(),
        transport,
        scope,
        timeout: cx.secs(
            t.timeout_s.as_ref(),
            &key(name, "timeout_s"),
            DEFAULT_MCP_TIMEOUT_S,
        )?,
        startup_timeout: cx.secs(
            t.startup_timeout_s.as_ref(),
            &key(name, "startup_timeout_s"),
            DEFAULT_MCP_STARTUP_TIMEOUT_S,
        )?,
        sandbox,
        network: t.network.unwrap_or(false),
        elicitation: super::mcp_client::elicitation(cx, name, t)?,
        sampling: t.sampling.unwrap_or(false),
        sampling_max_tokens: super::mcp_client::count(
            cx,
            t.sampling_max_tokens.as_ref(),
            &key(name, "sampling_max_tokens"),
            DEFAULT_SAMPLING_MAX_TOKENS,
        )?,
        sampling_calls_per_turn: super::mcp_client::count(
            cx,
            t.sampling_calls_per_turn.as_ref(),
            &key(name, "sampling_calls_per_turn"),
            DEFAULT_SAMPLING_CALLS_PER_TURN,
        )?,
        oauth: super::mcp_client::oauth(cx, name, t, base_dir)?,
        line: cx.line_of(table.span().start),
        env: cx.env.clone(),
    })
}

/// A server name is a bare key without `__` (the separator in `mcp__<server>__<tool>`).
fn check_name(cx: &Cx<'_>, name: &str, table: &Spanned<RawMcpServer>) -> Result<(), ConfigError> {
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
    Ok(())
}

/// `scope`: `"shared"` (default) or `"session"`.
fn scope(cx: &Cx<'_>, name: &str, t: &RawMcpServer) -> Result<McpScope, ConfigError> {
    let Some(v) = &t.scope else {
        return Ok(McpScope::Shared);
    };
    Ok(
        match cx.choice(v, &key(name, "scope"), "scope", &["shared", "session"])? {
            "session" => McpScope::Session,
            _ => McpScope::Shared,
        },
    )
}

/// `sandbox`: `"none"` (default) or `"landlock"`.
fn sandbox(cx: &Cx<'_>, name: &str, t: &RawMcpServer) -> Result<SandboxKind, ConfigError> {
    let Some(v) = &t.sandbox else {
        return Ok(SandboxKind::None);
    };
    Ok(
        match cx.choice(v, &key(name, "sandbox"), "sandbox", &["none", "landlock"])? {
            "landlock" => SandboxKind::Landlock,
            _ => SandboxKind::None,
        },
    )
}

/// Exactly one of `command` (a stdio server) and `url` (a streamable HTTP server).
fn transport(
    cx: &Cx<'_>,
    name: &str,
    table: &Spanned<RawMcpServer>,
    scope: McpScope,
    sandbox: SandboxKind,
    base_dir: &Path,
) -> Result<McpTransport, ConfigError> {
    let t = table.get_ref();
    match (&t.command, &t.url) {
        (None, None) => Err(cx.err(
            table.span(),
            &key(name, "command"),
            "missing command (or url): add command = \"...\" to launch a stdio server, \
             or url = \"http://...\" for a streamable HTTP server",
        )),
        (Some(_), Some(url)) => Err(cx.err(
            url.span(),
            &key(name, "url"),
            "both command and url are set: keep command for a stdio server or url for an HTTP server, not both",
        )),
        (Some(command), None) => stdio(cx, name, t, command, scope, base_dir),
        (None, Some(url)) => http(cx, name, t, url, sandbox),
    }
}

/// A stdio server: `command`, `args`, `env`, `cwd`; no `headers`.
fn stdio(
    cx: &Cx<'_>,
    name: &str,
    t: &RawMcpServer,
    command: &Spanned<String>,
    scope: McpScope,
    base_dir: &Path,
) -> Result<McpTransport, ConfigError> {
    if let Some(h) = &t.headers {
        return Err(cx.err(
            h.span(),
            &key(name, "headers"),
            "headers only apply to an HTTP server (url); remove them for a stdio server (command)",
        ));
    }
    let command_s = cx.non_empty(command, &key(name, "command"), "the command")?;
    if command_s.contains('\0') {
        return Err(cx.err(
            command.span(),
            &key(name, "command"),
            "the command contains a NUL character",
        ));
    }
    Ok(McpTransport::Stdio {
        command: command_s,
        args: args(cx, name, t)?,
        env: env(cx, name, t)?,
        cwd: cwd(cx, name, t, scope, base_dir)?,
    })
}

/// `args`: no NUL, every `${VAR}` set (expanded when the child is spawned).
fn args(cx: &Cx<'_>, name: &str, t: &RawMcpServer) -> Result<Vec<String>, ConfigError> {
    let Some(a) = &t.args else {
        return Ok(Vec::new());
    };
    if a.get_ref().iter().any(|s| s.contains('\0')) {
        return Err(cx.err(
            a.span(),
            &key(name, "args"),
            "an argument contains a NUL character",
        ));
    }
    let args = a.get_ref().clone();
    for arg in &args {
        cx.vars_set(arg, a.span(), &key(name, "args"))?;
    }
    Ok(args)
}

/// `env`: the child's extra variables, every `${VAR}` in a value set.
fn env(cx: &Cx<'_>, name: &str, t: &RawMcpServer) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut env = BTreeMap::new();
    let Some(e) = &t.env else { return Ok(env) };
    for (k, v) in e.get_ref() {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(cx.err(
                e.span(),
                &key(name, "env"),
                format!(
                    "invalid environment variable {k:?}: names must be non-empty without '=', and no NUL characters anywhere"
                ),
            ));
        }
        cx.vars_set(v, e.span(), &key_path(&["mcp_servers", name, "env", k]))?;
        env.insert(k.clone(), v.clone());
    }
    Ok(env)
}

/// `cwd`, resolved against the config file's folder; not for a session-scoped server.
fn cwd(
    cx: &Cx<'_>,
    name: &str,
    t: &RawMcpServer,
    scope: McpScope,
    base_dir: &Path,
) -> Result<Option<PathBuf>, ConfigError> {
    let Some(c) = &t.cwd else { return Ok(None) };
    if scope == McpScope::Session {
        return Err(cx.err(
            c.span(),
            &key(name, "cwd"),
            "cwd cannot be set with scope = \"session\": a session-scoped server runs in the session's workspace; remove cwd",
        ));
    }
    let c = cx.non_empty(c, &key(name, "cwd"), "the path")?;
    Ok(Some(resolve_path(base_dir, Path::new(&c))))
}

/// An HTTP server: `url` and `headers`; none of the stdio keys, and no sandbox.
fn http(
    cx: &Cx<'_>,
    name: &str,
    t: &RawMcpServer,
    url: &Spanned<String>,
    sandbox: SandboxKind,
) -> Result<McpTransport, ConfigError> {
    for (present, k) in [
        (t.args.as_ref().map(Spanned::span), "args"),
        (t.env.as_ref().map(Spanned::span), "env"),
        (t.cwd.as_ref().map(Spanned::span), "cwd"),
    ] {
        if let Some(span) = present {
            return Err(cx.err(
                span,
                &key(name, k),
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
                &key(name, "sandbox"),
                "a sandbox only applies to a stdio server (command), which turnstile launches; remove it for an HTTP server (url)",
            ));
        }
    }
    let url_s = cx.http_url(url, &key(name, "url"), "http://127.0.0.1:9000/mcp")?;
    let headers = cx.headers(t.headers.as_ref(), &key(name, "headers"))?;
    Ok(McpTransport::Http {
        url: url_s,
        headers,
    })
}

#[cfg(test)]
#[path = "mcp_servers_tests.rs"]
mod tests;

//! `[mcp_servers.*]`: the MCP servers whose tools are federated, stdio or HTTP.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use toml::Spanned;

use super::values::{is_name, key_path};
use super::{resolve_path, ConfigError, Cx};
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

/// `mcp_servers.<name>.<k>`
pub(super) fn key(name: &str, k: &str) -> String {
    key_path(&["mcp_servers", name, k])
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
mod tests {
    use super::super::test_support::*;
    use crate::config::{McpScope, McpTransport, SandboxKind};
    use std::path::Path;
    use std::time::Duration;

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
}

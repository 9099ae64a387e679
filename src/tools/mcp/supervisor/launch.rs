//! Starting one connection to a server: a child process spoken to over stdio (its command,
//! arguments and environment expanded, its environment cleared, its own process group,
//! optionally confined by Landlock, its stderr drained) or a remote server over HTTP.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use rmcp::service::{RoleClient, ServiceExt};
use tokio::task::JoinHandle;

use super::handler::Handler;
use super::ordered::ordered;
use super::stdio;
use crate::config::{Env, McpServerConfig, McpTransport, SandboxKind};
use crate::tools::mcp::describe::describe_init_error;
use crate::tools::mcp::stderr::{self, StderrLog};
use crate::tools::mcp::{http_client, sandbox};

/// Variables a child keeps from our environment; everything else is cleared.
const KEPT_ENV: &[&str] = &[
    "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "TZ", "USER", "SHELL",
];

/// Where an instance runs: its working folder and the value of `{workspace}` in its args.
#[derive(Debug, Clone, Default)]
pub struct Placement {
    pub cwd: Option<PathBuf>,
    pub workspace: Option<PathBuf>,
    /// What a confined child must never reach, turnstile's own state
    /// ([`crate::tools::mcp::sandbox::own_state`]).
    pub private: Vec<PathBuf>,
    /// An HTTP server's OAuth (shared by its instances).
    pub oauth: Option<Arc<crate::tools::mcp::oauth::OAuth>>,
}

/// A connection that has done its handshake.
pub(super) type Service = rmcp::service::RunningService<RoleClient, Handler>;

/// Connect to the server of `cfg` and do the handshake. A stdio child's process group goes to
/// `pgid` and its stderr reader to `drain`.
pub(super) async fn connect(
    cfg: &McpServerConfig,
    placement: &Placement,
    handler: Handler,
    pgid: &AtomicI32,
    stderr_log: &Arc<Mutex<StderrLog>>,
    drain: &mut Option<JoinHandle<()>>,
) -> Result<Service, String> {
    // Progress and log messages are taken off the transport in the server's order.
    let relays = handler.relays.clone();
    let logs = handler.root.is_some().then(|| handler.events.clone());
    let who = format!("MCP server {}", cfg.name);
    match &cfg.transport {
        McpTransport::Stdio { command, .. } => {
            let cmd = child_command(cfg, placement)?;
            let (proc, stderr) = stdio::spawn(cmd, &cfg.name)
                .map_err(|e| format!("cannot start {command:?}: {e}"))?;
            if let Some(pid) = proc.id() {
                pgid.store(pid as i32, Ordering::SeqCst);
            }
            *drain = Some(tokio::spawn(stderr::drain(stderr, stderr_log.clone())));
            handler
                .serve(ordered(proc, relays, logs))
                .await
                .map_err(|e| {
                    tracing::debug!(server = %cfg.name, error = %e, "MCP handshake failed");
                    format!("handshake failed: {}", describe_init_error(&who, &e))
                })
        }
        McpTransport::Http { url, headers } => {
            let headers = expand_headers(&cfg.env, headers)?;
            let transport =
                http_client::server_transport(&cfg.name, url, headers, placement.oauth.clone());
            match handler.serve(ordered(transport, relays, logs)).await {
                Ok(service) => Ok(service),
                Err(e) => {
                    tracing::debug!(server = %cfg.name, error = %e, "MCP handshake failed");
                    let login = match &placement.oauth {
                        Some(o) => o.needs_login().await,
                        None => None,
                    };
                    Err(match login {
                        Some(why) => format!("needs a login: {why}"),
                        None => {
                            format!("cannot connect to {url}: {}", describe_init_error(&who, &e))
                        }
                    })
                }
            }
        }
    }
}

/// The child of a stdio server, ready to spawn: expanded arguments and environment (the rest
/// of ours cleared but [`KEPT_ENV`]), its folder, its own process group, confined when asked.
fn child_command(
    cfg: &McpServerConfig,
    placement: &Placement,
) -> Result<tokio::process::Command, String> {
    let McpTransport::Stdio {
        command,
        args,
        env,
        cwd,
    } = &cfg.transport
    else {
        return Err("not a stdio server".into());
    };
    let args = child_args(&cfg.env, args, placement)?;
    let env = child_env(&cfg.env, env)?;
    let mut cmd = tokio::process::Command::new(command);
    cmd.args(&args);
    cmd.env_clear();
    for k in KEPT_ENV {
        if let Some(v) = cfg.env.var(k) {
            cmd.env(k, v);
        }
    }
    cmd.envs(&env);
    let dir = placement.cwd.as_ref().or(cwd.as_ref());
    if let Some(dir) = dir {
        cmd.current_dir(dir);
    }
    cmd.kill_on_drop(true);
    #[cfg(unix)]
    cmd.process_group(0);
    if cfg.sandbox == SandboxKind::Landlock {
        confine(&mut cmd, cfg, placement, args, &env, dir)?;
    }
    Ok(cmd)
}

/// A variable used by `what` is not set.
fn unset(what: &str, var: String) -> String {
    format!("{what} uses ${{{var}}}, which is not set in turnstile's environment")
}

/// The arguments: `${VAR}` first (checked at load; a variable unset since is an error naming
/// it), then `{workspace}`.
fn child_args(vars: &Env, args: &[String], placement: &Placement) -> Result<Vec<String>, String> {
    let workspace = placement
        .workspace
        .as_ref()
        .map(|w| w.display().to_string());
    let mut out = Vec::with_capacity(args.len());
    for a in args {
        let a = vars.expand(a).map_err(|var| unset("an argument", var))?;
        out.push(match &workspace {
            Some(w) => a.replace("{workspace}", w),
            None => a,
        });
    }
    Ok(out)
}

/// The server's `env` table with `${VAR}` expanded.
fn child_env(
    vars: &Env,
    env: &BTreeMap<String, String>,
) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (k, v) in env {
        let v = vars
            .expand(v)
            .map_err(|var| unset(&format!("env {k}"), var))?;
        out.insert(k.clone(), v);
    }
    Ok(out)
}

/// Confine the child with Landlock (see [`sandbox`]); an error when this kernel cannot.
fn confine(
    cmd: &mut tokio::process::Command,
    cfg: &McpServerConfig,
    placement: &Placement,
    args: Vec<String>,
    env: &BTreeMap<String, String>,
    dir: Option<&PathBuf>,
) -> Result<(), String> {
    if !sandbox::available() {
        return Err("sandbox = \"landlock\" but this kernel does not enforce Landlock; the server is not started unconfined".into());
    }
    let McpTransport::Stdio { command, .. } = &cfg.transport else {
        return Err("not a stdio server".into());
    };
    let child_env = |k: &str| {
        env.get(k)
            .map(std::ffi::OsString::from)
            .or_else(|| cfg.env.var(k).map(std::ffi::OsString::from))
    };
    let request = sandbox::Request {
        command: command.clone(),
        args,
        path_var: child_env("PATH"),
        home: child_env("HOME").map(PathBuf::from),
        workspace: placement.workspace.clone(),
        read_write: dir.cloned().into_iter().collect(),
        private: placement.private.clone(),
        network: cfg.network,
    };
    let plan = sandbox::plan(&request);
    for (folder, why) in &plan.refused {
        tracing::warn!(server = %cfg.name, folder = %folder.display(), "Landlock: a folder named in the server's args or cwd is not allowed: {why}");
    }
    tracing::debug!(server = %cfg.name, rules = ?plan.rules, network = cfg.network, "Landlock rules");
    sandbox::confine(cmd, sandbox::ruleset(&plan)?);
    Ok(())
}

/// Header values with `${VAR}` replaced from the environment; a missing variable is an error.
fn expand_headers(
    vars: &Env,
    headers: &BTreeMap<String, String>,
) -> Result<HashMap<http::HeaderName, http::HeaderValue>, String> {
    let mut out = HashMap::new();
    for (k, v) in headers {
        let value = vars.expand(v).map_err(|var| {
            format!("header {k} uses ${{{var}}}, which is not set in turnstile's environment")
        })?;
        let name =
            http::HeaderName::try_from(k.as_str()).map_err(|e| format!("header {k}: {e}"))?;
        let value = http::HeaderValue::try_from(value).map_err(|e| format!("header {k}: {e}"))?;
        out.insert(name, value);
    }
    Ok(out)
}

/// Kill the process group `pgid` holds (the current child's), once.
pub(super) fn kill_group(pgid: &std::sync::atomic::AtomicI32) {
    let pg = pgid.swap(0, std::sync::atomic::Ordering::SeqCst);
    if pg > 0 {
        // SAFETY: killpg only sends a signal; a stale group id fails with ESRCH.
        unsafe {
            libc::killpg(pg, libc::SIGKILL);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn env_expansion() {
        let env = crate::config::Env::from_vars([("TURNSTILE_TEST_TOKEN", "s3cret")]);
        assert_eq!(
            env.expand("Bearer ${TURNSTILE_TEST_TOKEN}").unwrap(),
            "Bearer s3cret"
        );
        assert_eq!(env.expand("plain").unwrap(), "plain");
        assert_eq!(
            env.expand("${TURNSTILE_NOPE_X}").unwrap_err(),
            "TURNSTILE_NOPE_X"
        );
    }
}

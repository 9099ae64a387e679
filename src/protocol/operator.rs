//! Operator surfaces: `GET /tools`, the federated tools with their verdicts and deciding rules
//! (what `turnstile check` prints); `GET /readyz` for load balancers; `GET /status`, what runs
//! and how it stands.

use http::StatusCode;
use serde_json::json;

use crate::http::{json_response, ApiError, Response};
use crate::protocol::context::{App, Caller};
use crate::tools::mcp::supervisor::ServerState;
use crate::tools::ServerTool;

/// One tool as `GET /tools` and `check` show it.
pub(crate) fn tool_json(t: &ServerTool) -> serde_json::Value {
    json!({
        "name": t.spec.name,
        "server": t.server,
        "tool": t.tool,
        "verdict": t.verdict,
        "rule": t.rule,
        "description": t.spec.description,
    })
}

/// `GET /tools`.
/// A principal whose `[keys.NAME] tools` narrow its agents sees only the tools they match.
pub(crate) fn tools(app: &App, caller: &Caller) -> Response {
    let scope = caller.scope();
    let within = |name: &str| scope.tools.as_ref().is_none_or(|t| t.is_match(name));
    let tools: Vec<_> = app
        .engine
        .host_tools()
        .iter()
        .filter(|t| within(&t.spec.name))
        .map(tool_json)
        .collect();
    json_response(StatusCode::OK, &json!({ "tools": tools }))
}

/// Seconds a load balancer is asked to wait before asking `/readyz` again.
const READY_RETRY_AFTER: u16 = 5;

/// `GET /readyz`: 200 when the store is writable and every shared MCP server is up (or
/// restarting within its budget, see [`crate::tools::mcp::supervisor::RESTART_BUDGET`]); else 503
/// naming what is not ready. No key needed, like `/healthz`.
pub(crate) async fn readyz(app: &App) -> Result<Response, ApiError> {
    let store = app.engine.store().clone();
    let store_ok = tokio::task::spawn_blocking(move || store.probe_writable())
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
    let mut problems = Vec::new();
    if let Err(e) = &store_ok {
        problems.push(format!("the store is not writable ({e})"));
    }
    let mut servers = Vec::new();
    for s in app.engine.host_servers() {
        let Some(status) = &s.shared else { continue };
        let ready = matches!(status.state, ServerState::Up | ServerState::Restarting);
        if !ready {
            problems.push(format!(
                "MCP server {} is {}{}",
                s.name,
                state_name(status.state),
                status
                    .last_error
                    .as_ref()
                    .map(|e| format!(" ({e})"))
                    .unwrap_or_default()
            ));
        }
        servers.push(json!({
            "name": s.name,
            "state": status.state,
            "ready": ready,
            "last_error": status.last_error,
        }));
    }
    let store_json = match &store_ok {
        Ok(()) => json!({"writable": true}),
        Err(e) => json!({"writable": false, "error": e}),
    };
    if problems.is_empty() {
        return Ok(json_response(
            StatusCode::OK,
            &json!({"status": "ready", "store": store_json, "servers": servers}),
        ));
    }
    Err(ApiError {
        extra: Some(Box::new(json!({"store": store_json, "servers": servers}))),
        retry_after: Some(READY_RETRY_AFTER),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            format!("not ready: {}", problems.join("; ")),
        )
    })
}

fn state_name(s: ServerState) -> &'static str {
    match s {
        ServerState::Starting => "starting",
        ServerState::Up => "up",
        ServerState::Restarting => "restarting",
        ServerState::Failed => "failed",
        ServerState::Stopped => "stopped",
    }
}

/// `GET /status`: every MCP server's state, every upstream's (breaker, calls in flight),
/// active turns by agent, the store's size on disk
/// (the SQLite files under `data_dir`, or the PostgreSQL database's).
pub(crate) async fn status(app: &App, caller: &Caller) -> Result<Response, ApiError> {
    // It names every MCP server and agent: not for a key whose agents or tools are narrowed.
    if !caller.scope().sees_everything() {
        return Err(ApiError::forbidden(
            "GET /status shows every MCP server and agent: it needs a key that [keys] agents and tools do not narrow, or admin = true",
        ));
    }
    let data_dir = app.engine.config().server.data_dir.clone();
    let (db_bytes, files_bytes) = tokio::task::spawn_blocking(move || {
        let db: u64 = ["turnstile.db", "turnstile.db-wal", "turnstile.db-shm"]
            .iter()
            .filter_map(|f| std::fs::metadata(data_dir.join(f)).ok())
            .map(|m| m.len())
            .sum();
        (db, dir_bytes(&data_dir.join("files"), 2))
    })
    .await
    .unwrap_or((0, 0));
    // PostgreSQL: the size of turnstile's tables in the database (the files' bytes included).
    let db_bytes = match app.engine.store().db_bytes().await {
        Ok(Some(n)) => n,
        Ok(None) => db_bytes,
        Err(e) => {
            tracing::warn!(error = %e, "/status: cannot read the database's size");
            0
        }
    };
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "version": env!("CARGO_PKG_VERSION"),
            "mcp_servers": app.engine.host_servers(),
            "upstreams": app.engine.upstreams(),
            "agents": app.engine.active_turns().into_iter().map(|(name, n)| json!({
                "name": name,
                "active_turns": n,
            })).collect::<Vec<_>>(),
            "store": {
                "db_bytes": db_bytes,
                "files_bytes": files_bytes,
            },
            // What the last reload (SIGHUP, `turnstile reload`) came to; null before any.
            "reload": app.engine.reload_report(),
        }),
    ))
}

/// Bytes of the regular files under `dir`, `depth` folders deep at most (the file store is
/// flat, plus its `tmp/`).
fn dir_bytes(dir: &std::path::Path, depth: u32) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| Some((e.path(), e.metadata().ok()?)))
        .map(|(path, m)| {
            if m.is_file() {
                m.len()
            } else if m.is_dir() && depth > 1 {
                dir_bytes(&path, depth - 1)
            } else {
                0
            }
        })
        .sum()
}

//! `/mcp` sessions over time, on the real binary with a raw MCP client over HTTP: an idle
//! session ending on its own (its workspace and its session-scoped MCP server gone with no
//! other request arriving), and workspaces of an earlier run removed at start.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::mcp_http::McpHttp;
use serde_json::json;

/// `tools.toml` in `dir`: `/mcp` (with `endpoint`, more `[mcp_endpoint]` lines) over the
/// example server as `ex` (shared) and as `ws` (an instance per session).
fn config(dir: &Path, endpoint: &str) {
    let text = format!(
        "[server]\ndata_dir = {:?}\nsandboxes = {:?}\n\n[limits]\nsessions_per_key = 100\n\n[agents.assistant]\ntools = [\"*\"]\n\n{}\n{}\n[policy]\ntrust = [\"mcp__ex__*\", \"mcp__ws__*\"]\n\n[mcp_endpoint]\nenabled = true\n{endpoint}\n",
        dir.join("data").display().to_string(),
        dir.join("sandboxes").display().to_string(),
        common::mcp::example_server("ex", ""),
        common::mcp::example_server("ws", "scope = \"session\""),
    );
    std::fs::write(dir.join("tools.toml"), text).unwrap();
}

/// Whether process `pid` still runs (a zombie does not).
fn runs(pid: u64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(s.rsplit_once(')')?.1.trim_start().starts_with('Z')))
        .is_some_and(|zombie| !zombie)
}

#[tokio::test]
async fn an_idle_session_ends_on_its_own_with_its_workspace_and_its_server() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "session_idle_s = 2\n");
    let (child, http) = common::binary::serve_in(dir.path()).await;
    let mcp = McpHttp::new(http.base.trim_start_matches("http://").parse().unwrap());
    let id = mcp.open().await;
    // Its own instance of `ws` starts for the call, in its workspace.
    let a = mcp
        .call(
            &id,
            "tools/call",
            json!({"name": "mcp__ws__pid", "arguments": {}}),
        )
        .await;
    let m = a.message.expect("a response");
    let server: u64 = m["result"]["content"][0]["text"]
        .as_str()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or_else(|| panic!("a pid: {m}"));
    let workspace = dir.path().join("sandboxes").join(format!(
        "mcp-{}",
        id.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "_")
    ));
    assert!(workspace.is_dir(), "{} exists", workspace.display());
    assert!(runs(server), "the session's server runs");

    // No other request: 2 s idle, and both are gone.
    let deadline = Instant::now() + Duration::from_secs(20);
    while (workspace.exists() || runs(server)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !workspace.exists(),
        "the ended session's workspace is removed"
    );
    assert!(!runs(server), "the ended session's server is stopped");
    let a = mcp.call(&id, "tools/list", json!({})).await;
    assert_eq!(a.status, 404, "the session has ended: {a:?}");
    drop(child);
}

#[tokio::test]
async fn workspaces_of_mcp_sessions_of_an_earlier_run_are_removed_at_start() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), "");
    let sandboxes = dir.path().join("sandboxes");
    std::fs::create_dir_all(sandboxes.join("mcp-xyz/sub")).unwrap();
    std::fs::write(sandboxes.join("mcp-xyz/sub/notes.txt"), "left over").unwrap();
    // An AAP session's workspace outlives restarts, as its session does.
    std::fs::create_dir_all(sandboxes.join("sess_keep")).unwrap();
    let (child, _http) = common::binary::serve_in(dir.path()).await;
    assert!(!sandboxes.join("mcp-xyz").exists(), "mcp-xyz is removed");
    assert!(sandboxes.join("sess_keep").is_dir(), "sess_keep stays");
    drop(child);
}

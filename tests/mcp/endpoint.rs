//! `/mcp`: turnstile as an MCP server, driven by the official MCP Python SDK client
//! (`tests/mcp_endpoint/client.py`, PyPI `mcp`, pinned in the test venv) against the real binary
//! federating the example MCP server.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::AsyncBufReadExt;

/// A config serving `/mcp` (when `endpoint`) over the example server `ex`: `echo` and `add_tool`
/// trusted, `add` asked, `fail` denied.
fn config(dir: &Path, endpoint: &str, keys_env: Option<&str>) -> std::path::PathBuf {
    let keys = keys_env
        .map(|v| format!("api_keys_env = {v:?}\n"))
        .unwrap_or_default();
    let text = format!(
        "[server]\ndata_dir = {:?}\nsandboxes = {:?}\n{keys}\n[agents.assistant]\ntools = [\"*\"]\n\n{}\n[policy]\ntrust = [\"mcp__ex__echo\", \"mcp__ex__add_tool\", \"mcp__ex__slow\", \"mcp__ex__fresh\", \"mcp__ws__write_file\", \"deliver_file\"]\nask = [\"mcp__ex__add\"]\ndeny = [\"mcp__ex__fail\"]\ndefault = \"deny\"\n\n{endpoint}\n",
        dir.join("data").display().to_string(),
        dir.join("sandboxes").display().to_string(),
        crate::common::mcp::example_server("ex", ""),
    );
    let path = dir.join("tools.toml");
    std::fs::write(&path, text).unwrap();
    path
}

const ON: &str = "[mcp_endpoint]\nenabled = true\nagents = [\"assistant\"]\n";

/// Run the client script; every JSON line it printed, merged into one object.
async fn client(url: &str, key: &str, scenario: &str, arg: Option<&str>) -> Value {
    let python = crate::common::mcp_python_sdk::python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_endpoint/client.py");
    let mut cmd = tokio::process::Command::new(python);
    cmd.arg(script).args([url, key, scenario]);
    if let Some(a) = arg {
        cmd.arg(a);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.kill_on_drop(true).output())
        .await
        .expect("the client finished within 60 s")
        .expect("run the client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "client {scenario} failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut all = serde_json::Map::new();
    for line in stdout.lines().filter(|l| l.starts_with('{')) {
        let v: Value = serde_json::from_str(line).unwrap();
        all.extend(v.as_object().unwrap().clone());
    }
    Value::Object(all)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tools_are_listed_trusted_run_denied_refused_and_ask_needs_elicitation() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = crate::common::binary::serve(&config(dir.path(), ON, None)).await;
    let url = format!("http://{addr}/mcp");
    let v = client(&url, "-", "tools", None).await;
    let tools: Vec<&str> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(
        tools.contains(&"mcp__ex__echo") && tools.contains(&"mcp__ex__add"),
        "{tools:?}"
    );
    assert!(
        !tools.contains(&"mcp__ex__fail"),
        "a denied tool is hidden: {tools:?}"
    );
    assert!(
        !tools.contains(&"mcp__ex__pid"),
        "default deny hides the rest: {tools:?}"
    );
    assert_eq!(
        v["echo_schema"]["properties"]["text"]["type"], "string",
        "{v}"
    );
    assert_eq!(v["trusted"]["text"], "hi", "{v}");
    assert_eq!(v["trusted"]["is_error"], false);
    assert_eq!(v["denied"]["is_error"], true);
    let denied = v["denied"]["text"].as_str().unwrap();
    assert!(
        denied.contains("denied by policy") && denied.contains("mcp__ex__fail"),
        "{denied}"
    );
    assert_eq!(v["ask"]["is_error"], true, "no elicitation: refused {v}");
    let ask = v["ask"]["text"].as_str().unwrap();
    assert!(
        ask.contains("elicitation") && ask.contains("mcp__ex__add"),
        "names the rule: {ask}"
    );
    // Each call is counted as agent calls are: by server, tool, verdict and outcome.
    let (status, metrics) = metrics_text(addr).await;
    assert_eq!(status, 200);
    for series in [
        r#"server="ex",tool="echo",verdict="trust",outcome="ok""#,
        r#"server="ex",tool="fail",verdict="deny",outcome="refused""#,
        r#"server="ex",tool="add",verdict="ask",outcome="denied""#,
    ] {
        let line = metrics
            .lines()
            .find(|l| l.starts_with("turnstile_tool_calls_total{") && l.contains(series))
            .unwrap_or_else(|| panic!("no {series} in /metrics"));
        assert!(line.ends_with(" 1"), "{line}");
    }
}

async fn metrics_text(addr: std::net::SocketAddr) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut text = String::new();
    conn.read_to_string(&mut text).await.unwrap();
    let status = text[9..12].parse().unwrap();
    (status, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_tools_run_when_the_client_accepts_and_are_denied_with_its_reason() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = crate::common::binary::serve(&config(dir.path(), ON, None)).await;
    let url = format!("http://{addr}/mcp");
    let v = client(&url, "-", "accept", None).await;
    assert!(
        v["elicited"].as_str().unwrap().contains("mcp__ex__add"),
        "{v}"
    );
    assert_eq!(v["ask"]["is_error"], false, "{v}");
    // The same result mapping as agent calls: the text, then the structured content.
    assert!(v["ask"]["text"].as_str().unwrap().starts_with('3'), "{v}");
    let v = client(&url, "-", "decline", None).await;
    assert!(v["elicited"].is_string(), "{v}");
    assert_eq!(v["ask"]["is_error"], true, "{v}");
    assert_eq!(v["ask"]["text"], "Tool call denied: not today", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_reaches_the_client_when_a_child_changes_its_tools() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = crate::common::binary::serve(&config(dir.path(), ON, None)).await;
    let v = client(&format!("http://{addr}/mcp"), "-", "changed", None).await;
    assert_eq!(v["added"]["text"], "added fresh", "{v}");
    let tools: Vec<&str> = v["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert!(tools.contains(&"mcp__ex__fresh"), "{tools:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_is_cancelled_on_the_child() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = crate::common::binary::serve(&config(dir.path(), ON, None)).await;
    let watcher = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let notify = watcher.local_addr().unwrap().to_string();
    let lines = tokio::spawn(async move {
        let mut seen = Vec::new();
        while seen.len() < 2 {
            let (conn, _) = watcher.accept().await.unwrap();
            let mut line = String::new();
            tokio::io::BufReader::new(conn)
                .read_line(&mut line)
                .await
                .unwrap();
            seen.push(line.trim().to_string());
        }
        seen
    });
    let v = client(&format!("http://{addr}/mcp"), "-", "cancel", Some(&notify)).await;
    assert!(v["cancel"].is_object(), "{v}");
    let seen = tokio::time::timeout(Duration::from_secs(60), lines)
        .await
        .expect("the child saw the cancellation")
        .unwrap();
    // The child writes "cancelled" only when the cancellation reached it before its 30 s sleep
    // ended (a wall-clock bound would only measure how loaded the machine is).
    assert_eq!(seen[1], "cancelled", "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_childs_progress_reaches_the_caller() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = crate::common::binary::serve(&config(dir.path(), ON, None)).await;
    let v = client(&format!("http://{addr}/mcp"), "-", "progress", None).await;
    assert_eq!(v["slow"]["text"], "slept 300 ms", "{v}");
    assert_eq!(
        v["progress"],
        serde_json::json!([{"progress": 0.0, "total": 300.0, "message": "sleeping"}]),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliver_file_returns_a_link_to_the_file_from_the_sessions_workspace() {
    let dir = tempfile::tempdir().unwrap();
    // A session-scoped server runs in the MCP session's workspace and writes the file there.
    let endpoint = format!(
        "{ON}\n{}",
        crate::common::mcp::example_server("ws", "scope = \"session\"")
    );
    let (_child, addr) = crate::common::binary::serve(&config(dir.path(), &endpoint, None)).await;
    let v = client(&format!("http://{addr}/mcp"), "-", "deliver", None).await;
    assert_eq!(v["wrote"]["text"], "wrote 5 bytes", "{v}");
    assert_eq!(v["delivered"]["is_error"], false, "{v}");
    assert!(
        v["delivered"]["text"]
            .as_str()
            .unwrap()
            .starts_with("File delivered: out.txt"),
        "{v}"
    );
    assert_eq!(v["links"][0]["name"], "out.txt", "{v}");
    assert!(
        v["links"][0]["uri"]
            .as_str()
            .unwrap()
            .starts_with(&format!("http://{addr}/files/file_")),
        "{v}"
    );
    assert_eq!(v["download"], 200, "{v}");
    assert_eq!(v["body"], "hello", "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_sees_only_its_own_mcp_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("{ON}\n[limits]\nsessions_per_key = 1\n");
    let (_child, addr) = crate::common::binary::serve_with_env(
        &config(dir.path(), &endpoint, Some("MCPEP_TEST_KEYS")),
        &[("MCPEP_TEST_KEYS", "key-one,key-two")],
    )
    .await;
    let v = client(
        &format!("http://{addr}/mcp"),
        "key-one",
        "owners",
        Some("key-two"),
    )
    .await;
    assert_eq!(v["init"], 200, "{v}");
    assert_eq!(v["session"], true, "{v}");
    assert_eq!(v["other"], 404, "{v}");
    assert_eq!(v["mine"], 200, "{v}");
    // [limits] sessions_per_key counts each key's open MCP sessions.
    assert_eq!(v["second"], 429, "{v}");
    assert!(
        v["second_body"]
            .as_str()
            .unwrap()
            .contains("[limits] sessions_per_key"),
        "{v}"
    );
    assert!(v["retry_after"].is_string(), "{v}");
    assert_eq!(v["other_init"], 200, "{v}");
    let http = crate::common::Http::new(addr);
    let (status, _) = http.post("/mcp", &serde_json::json!({})).await;
    assert_eq!(status, 401, "no key, no endpoint");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_ends_open_mcp_sessions_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, addr) = crate::common::binary::serve(&config(dir.path(), ON, None)).await;
    let python = crate::common::mcp_python_sdk::python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_endpoint/client.py");
    let mut holder = tokio::process::Command::new(python)
        .arg(script)
        .args([&format!("http://{addr}/mcp"), "-", "hold"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(holder.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
        .await
        .expect("the client is ready within 30 s")
        .unwrap();
    assert_eq!(ready.as_deref(), Some(r#"{"ready": true}"#));
    let pid = child.id().unwrap() as i32;
    let asked = Instant::now();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("turnstile exited")
        .unwrap();
    assert!(status.success(), "{status}");
    // The open GET stream does not hold the process for the whole grace period (10 s).
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_is_off_by_default() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = crate::common::binary::serve(&config(dir.path(), "", None)).await;
    let http = crate::common::Http::new(addr);
    let (status, body) = http.post("/mcp", &serde_json::json!({})).await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("[mcp_endpoint] enabled"),
        "{body}"
    );
}

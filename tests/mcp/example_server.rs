//! Drives `examples/mcp_example.rs` with rmcp's own client (stdio) and with raw JSON-RPC over
//! HTTP (streamable HTTP).
//!
//! The example binary must be built: plain `cargo test` builds every example, but
//! `cargo test --test all -- mcp::example_server::` alone does not, so run
//! `cargo build --example mcp_example` first in that case.

use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use crate::common::mcp::example_server_path;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, JsonObject, PaginatedRequestParams, ProtocolVersion,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::transport::{ConfigureCommandExt, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceExt};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::Notify;

const TIMEOUT: Duration = Duration::from_secs(20);

/// A client that signals `list_changed` on every `notifications/tools/list_changed`.
#[derive(Clone, Default)]
struct TestClient {
    list_changed: Arc<Notify>,
}

impl ClientHandler for TestClient {
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        // notify_one keeps a permit when nobody waits yet, so no notification is lost.
        self.list_changed.notify_one();
    }
}

type Client = RunningService<RoleClient, TestClient>;

/// Spawns the example over stdio with `args`, in `cwd` if given; returns the connected client,
/// the child's pid and its piped stderr.
async fn connect(
    args: &[&str],
    cwd: Option<&std::path::Path>,
) -> (Client, u32, tokio::process::ChildStderr) {
    let command = tokio::process::Command::new(example_server_path()).configure(|command| {
        command.args(args);
        if let Some(cwd) = cwd {
            command.current_dir(cwd);
        }
        command.env_remove("MCP_EXAMPLE_SURELY_UNSET");
    });
    let (transport, stderr) = TokioChildProcess::builder(command)
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn mcp_example");
    let pid = transport.id().expect("child pid");
    let client = tokio::time::timeout(TIMEOUT, TestClient::default().serve(transport))
        .await
        .expect("initialize in time")
        .expect("initialize");
    (client, pid, stderr.expect("piped stderr"))
}

fn args(value: Value) -> JsonObject {
    match value {
        Value::Object(object) => object,
        other => panic!("arguments must be an object, got {other}"),
    }
}

async fn call(client: &Client, name: &str, arguments: Value) -> CallToolResult {
    let params = CallToolRequestParams::new(name.to_owned()).with_arguments(args(arguments));
    tokio::time::timeout(TIMEOUT, client.call_tool(params))
        .await
        .unwrap_or_else(|_| panic!("{name} answered in time"))
        .unwrap_or_else(|error| panic!("{name} failed: {error}"))
}

/// The single text content of `result`.
fn text(result: &CallToolResult) -> &str {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|content| content.as_text())
        .map(|text| text.text.as_str())
        .collect();
    assert_eq!(texts.len(), 1, "one text content in {result:?}");
    texts[0]
}

#[tokio::test]
async fn stdio_tools_are_listed_with_descriptions_and_schemas() {
    let (client, _pid, stderr) = connect(&[], None).await;
    let mut stderr = BufReader::new(stderr).lines();
    let first = tokio::time::timeout(TIMEOUT, stderr.next_line())
        .await
        .expect("stderr line in time")
        .expect("read stderr");
    assert_eq!(first.as_deref(), Some("mcp_example: started (stdio)"));

    let info = client.peer_info().expect("server info");
    assert_eq!(
        info.server_info.as_ref().map(|i| i.name.as_str()),
        Some("mcp_example")
    );
    // rmcp's client asks for 2026-07-28 (no initialize there); the server falls back to the
    // newest version that still has the handshake.
    assert_eq!(info.protocol_version, ProtocolVersion::V_2025_11_25);
    let tools_capability = info.capabilities.tools.as_ref().expect("tools capability");
    assert_eq!(tools_capability.list_changed, Some(true));

    let tools = client.list_all_tools().await.expect("tools/list");
    let mut names: Vec<&str> = tools.iter().map(|tool| tool.name.as_ref()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "add",
            "add_tool",
            "cwd",
            "echo",
            "env",
            "fail",
            "image",
            "pid",
            "slow",
            "write_file"
        ]
    );
    for tool in &tools {
        assert!(
            tool.description.as_deref().is_some_and(|d| !d.is_empty()),
            "{} has a description",
            tool.name
        );
        assert_eq!(
            tool.input_schema.get("type"),
            Some(&json!("object")),
            "{}",
            tool.name
        );
    }
    let schema = |name: &str| {
        let tool = tools.iter().find(|tool| tool.name == name).expect(name);
        Value::Object(tool.input_schema.as_ref().clone())
    };
    assert_eq!(
        schema("echo")["properties"]["text"]["type"],
        json!("string")
    );
    assert_eq!(schema("echo")["required"], json!(["text"]));
    assert_eq!(schema("add")["properties"]["a"]["type"], json!("number"));
    assert_eq!(schema("add")["properties"]["b"]["type"], json!("number"));
    assert_eq!(schema("slow")["properties"]["ms"]["type"], json!("integer"));
    assert_eq!(schema("write_file")["required"], json!(["path", "text"]));
    let add = tools.iter().find(|tool| tool.name == "add").unwrap();
    assert!(
        add.output_schema.is_some(),
        "add declares its output schema"
    );
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn stdio_tool_calls() {
    let (client, pid, _stderr) = connect(&[], None).await;

    let echo = call(&client, "echo", json!({"text": "héllo\nworld"})).await;
    assert_eq!(text(&echo), "héllo\nworld");
    assert_ne!(echo.is_error, Some(true));

    let add = call(&client, "add", json!({"a": 2, "b": 3})).await;
    assert_eq!(text(&add), "5");
    assert_eq!(add.structured_content, Some(json!({"sum": 5})));
    let add = call(&client, "add", json!({"a": 1.5, "b": 1})).await;
    assert_eq!(text(&add), "2.5");
    assert_eq!(add.structured_content, Some(json!({"sum": 2.5})));

    let fail = call(&client, "fail", json!({"message": "it broke"})).await;
    assert_eq!(fail.is_error, Some(true));
    assert_eq!(text(&fail), "it broke");

    let env = call(&client, "env", json!({"name": "MCP_EXAMPLE_SURELY_UNSET"})).await;
    assert_eq!(text(&env), "<unset>");
    let env = call(&client, "env", json!({"name": "PATH"})).await;
    assert_eq!(text(&env), std::env::var("PATH").unwrap());

    let got_pid = call(&client, "pid", json!({})).await;
    assert_eq!(text(&got_pid), pid.to_string());

    let image = call(&client, "image", json!({})).await;
    assert_eq!(image.content.len(), 2, "{image:?}");
    let png = image.content[0].as_image().expect("an image content first");
    assert_eq!(png.mime_type, "image/png");
    assert!(
        png.data.starts_with("iVBORw0KGgo"),
        "base64 of a PNG signature"
    );
    assert_eq!(text(&image), "a red pixel");

    let slow = call(&client, "slow", json!({"ms": 20})).await;
    assert_eq!(text(&slow), "slept 20 ms");

    // A bad argument is a tool error result, not a protocol error.
    let bad = call(&client, "echo", json!({"nope": 1})).await;
    assert_eq!(bad.is_error, Some(true));

    client.cancel().await.expect("close");
}

#[tokio::test]
async fn stdio_files_and_cwd() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (client, _pid, _stderr) = connect(&[], Some(dir.path())).await;

    let cwd = call(&client, "cwd", json!({})).await;
    assert_eq!(
        std::fs::canonicalize(text(&cwd)).unwrap(),
        std::fs::canonicalize(dir.path()).unwrap()
    );

    let wrote = call(
        &client,
        "write_file",
        json!({"path": "out.txt", "text": "hello"}),
    )
    .await;
    assert_eq!(text(&wrote), "wrote 5 bytes");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("out.txt")).unwrap(),
        "hello"
    );

    let missing = dir.path().join("no/such/dir/out.txt");
    let failed = call(
        &client,
        "write_file",
        json!({"path": missing.to_str().unwrap(), "text": "x"}),
    )
    .await;
    assert_eq!(failed.is_error, Some(true));
    assert!(
        text(&failed).contains("No such file or directory"),
        "{failed:?}"
    );

    // The server is still alive.
    let echo = call(&client, "echo", json!({"text": "still here"})).await;
    assert_eq!(text(&echo), "still here");
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn stdio_add_tool_notifies_and_the_tool_is_listed_and_callable() {
    let client_handler = TestClient::default();
    let list_changed = client_handler.list_changed.clone();
    let command = tokio::process::Command::new(example_server_path());
    let transport = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn")
        .0;
    let client = client_handler.serve(transport).await.expect("initialize");

    let before = client.list_all_tools().await.expect("tools/list");
    assert!(!before.iter().any(|tool| tool.name == "greet"));

    let added = call(&client, "add_tool", json!({"name": "greet"})).await;
    assert_eq!(text(&added), "added greet");
    tokio::time::timeout(TIMEOUT, list_changed.notified())
        .await
        .expect("notifications/tools/list_changed received");

    let after = client.list_all_tools().await.expect("tools/list");
    assert!(after.iter().any(|tool| tool.name == "greet"), "{after:?}");
    assert_eq!(after.len(), before.len() + 1);
    let greet = call(&client, "greet", json!({})).await;
    assert_eq!(text(&greet), "hello from greet");

    let again = call(&client, "add_tool", json!({"name": "greet"})).await;
    assert_eq!(again.is_error, Some(true));

    let unknown = client
        .call_tool(CallToolRequestParams::new("no_such_tool"))
        .await;
    assert!(unknown.is_err(), "an unknown tool is a protocol error");
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn stdio_tools_list_is_paginated_with_extra_tools() {
    let (client, _pid, _stderr) = connect(&["--tools", "12"], None).await;
    let first = client
        .list_tools(Some(PaginatedRequestParams::default()))
        .await
        .expect("first page");
    assert_eq!(first.tools.len(), 5);
    let cursor = first.next_cursor.clone().expect("a next cursor");
    let second = client
        .list_tools(Some(
            PaginatedRequestParams::default().with_cursor(Some(cursor)),
        ))
        .await
        .expect("second page");
    assert_eq!(second.tools.len(), 5);
    assert_ne!(first.tools[0].name, second.tools[0].name);

    let all = client.list_all_tools().await.expect("all pages");
    assert_eq!(all.len(), 10 + 12);
    for i in 0..12 {
        let name = format!("t{i}");
        assert!(all.iter().any(|tool| tool.name == name), "{name} listed");
    }
    let t11 = call(&client, "t11", json!({})).await;
    assert_eq!(text(&t11), "hello from t11");
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn stdio_server_exits_when_stdin_closes() {
    let mut child = tokio::process::Command::new(example_server_path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    drop(child.stdin.take());
    let status = tokio::time::timeout(TIMEOUT, child.wait())
        .await
        .expect("exits when stdin closes")
        .expect("wait");
    assert!(status.success(), "{status}");

    // Also after a session: close stdin once initialized.
    let command = tokio::process::Command::new(example_server_path());
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let client = TestClient::default().serve(transport).await.expect("init");
    assert_eq!(
        text(&call(&client, "echo", json!({"text": "x"})).await),
        "x"
    );
    // cancel() closes the transport: graceful_shutdown closes stdin and waits for the exit
    // (it would SIGTERM after 3 s); a clean exit is quick.
    let started = std::time::Instant::now();
    client.cancel().await.expect("close");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "exited on stdin close"
    );
}

/// A raw HTTP client for the streamable HTTP endpoint.
struct RawHttp {
    client: hyper_util::client::legacy::Client<
        hyper_util::client::legacy::connect::HttpConnector,
        Full<Bytes>,
    >,
    url: String,
    session: Option<String>,
}

impl RawHttp {
    /// POSTs one JSON-RPC message; returns the status and the JSON-RPC response with `id`, if
    /// any (read from a JSON body or from an SSE stream).
    async fn post(&mut self, message: Value) -> (http::StatusCode, Option<Value>) {
        let mut request = http::Request::post(&self.url)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        if let Some(session) = &self.session {
            request = request
                .header("mcp-session-id", session)
                .header("mcp-protocol-version", "2025-11-25");
        }
        let request = request
            .body(Full::new(Bytes::from(message.to_string())))
            .unwrap();
        let response = tokio::time::timeout(TIMEOUT, self.client.request(request))
            .await
            .expect("HTTP answer in time")
            .expect("HTTP request");
        let status = response.status();
        if let Some(session) = response.headers().get("mcp-session-id") {
            self.session = Some(session.to_str().unwrap().to_owned());
        }
        let is_sse = response
            .headers()
            .get("content-type")
            .and_then(|value| value.to_str().ok())
            .is_some_and(|value| value.starts_with("text/event-stream"));
        let Some(id) = message.get("id").cloned() else {
            return (status, None);
        };
        let mut body = response.into_body();
        let mut buffer = String::new();
        loop {
            let frame = tokio::time::timeout(TIMEOUT, body.frame())
                .await
                .expect("body frame in time");
            let Some(frame) = frame else { break };
            let frame = frame.expect("body frame");
            if let Some(data) = frame.data_ref() {
                buffer.push_str(std::str::from_utf8(data).unwrap());
            }
            if is_sse {
                for line in buffer.lines() {
                    let Some(data) = line.strip_prefix("data:") else {
                        continue;
                    };
                    if let Ok(value) = serde_json::from_str::<Value>(data.trim()) {
                        if value.get("id") == Some(&id) {
                            return (status, Some(value));
                        }
                    }
                }
            }
        }
        if is_sse {
            (status, None)
        } else {
            (status, serde_json::from_str(&buffer).ok())
        }
    }
}

#[tokio::test]
async fn http_mode_answers_initialize_and_tools_list() {
    let mut child = tokio::process::Command::new(example_server_path())
        .args(["--http", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn");
    let mut stdout = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(TIMEOUT, stdout.next_line())
        .await
        .expect("listening line in time")
        .expect("read stdout")
        .expect("a line");
    let url = line
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    assert!(
        url.starts_with("http://127.0.0.1:") && url.ends_with("/mcp"),
        "{url}"
    );
    let mut stderr = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = stderr.next_line().await.expect("read stderr");
    assert_eq!(first.as_deref(), Some("mcp_example: started (http)"));

    let mut http = RawHttp {
        client: hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http(),
        url,
        session: None,
    };
    let (status, initialized) = http
        .post(json!({
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-11-25",
                "capabilities": {},
                "clientInfo": {"name": "raw-test", "version": "0"}
            }
        }))
        .await;
    assert_eq!(status, http::StatusCode::OK);
    let initialized = initialized.expect("an initialize response");
    let result = &initialized["result"];
    assert_eq!(result["serverInfo"]["name"], json!("mcp_example"));
    assert_eq!(result["capabilities"]["tools"]["listChanged"], json!(true));
    assert_eq!(result["protocolVersion"], json!("2025-11-25"));
    assert!(http.session.is_some(), "a session id");

    let (status, _) = http
        .post(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        .await;
    assert_eq!(status, http::StatusCode::ACCEPTED);

    let (status, listed) = http
        .post(json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}))
        .await;
    assert_eq!(status, http::StatusCode::OK);
    let listed = listed.expect("a tools/list response");
    let names: Vec<&str> = listed["result"]["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|tool| tool["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"echo") && names.contains(&"add_tool"),
        "{names:?}"
    );

    let (status, echoed) = http
        .post(json!({
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {"name": "echo", "arguments": {"text": "over http"}}
        }))
        .await;
    assert_eq!(status, http::StatusCode::OK);
    let echoed = echoed.expect("a tools/call response");
    assert_eq!(echoed["result"]["content"][0]["text"], json!("over http"));

    child.kill().await.expect("kill");
}

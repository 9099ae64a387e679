//! Sandboxed workspaces and the built-in `deliver_file` tool, through real turns against the fake
//! upstream: a session's workspace lives and dies with it; a delivered file reaches the AAP stream,
//! the history, the event log and the file store byte for byte; every refusal (missing, a
//! directory, a FIFO, over `[files] max_bytes`, `..`, an absolute path) is an error result that
//! says what is wrong while the turn goes on. The last test federates the third-party
//! `@modelcontextprotocol/server-filesystem` (npm, provisioned into target/test-deps by
//! crate::common::provision) as a session-scoped server rooted at the workspace: the model writes a file
//! through it, then delivers it.

use std::collections::HashMap;
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::{config_text, logcheck::check_log, names, setup, Sse, TestServer};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// `[files] max_bytes` of these tests: report.csv (1,532 bytes) fits, big.bin (2,001) does not.
const MAX_BYTES: u64 = 2000;

fn extra(more: &str) -> String {
    format!(
        r#"
[files]
max_bytes = {MAX_BYTES}

[policy]
trust = ["deliver_file"]
default = "ask"

{more}
"#
    )
}

/// A server with [`extra`] and nothing more.
async fn start_default() -> (FakeOpenAi, TestServer) {
    setup(&extra("")).await
}

fn workspace(server: &TestServer, sid: &str) -> PathBuf {
    server.dir.path().join("sandboxes").join(sid)
}

/// A CSV of exactly `len` bytes, ending in a newline.
fn csv(len: usize) -> Vec<u8> {
    let mut out = b"date,item,amount\n".to_vec();
    let mut i = 0;
    while out.len() < len {
        out.extend_from_slice(
            format!(
                "2024-03-{:02},item-{i},{}.{:02}\n",
                i % 28 + 1,
                i * 7,
                i % 100
            )
            .as_bytes(),
        );
        i += 1;
    }
    out.truncate(len);
    out[len - 1] = b'\n';
    out
}

fn mkfifo(path: &Path) {
    let c = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid C string.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

/// Run an AAP turn with a message stream; fail (rather than hang) after 60 s.
async fn sse_turn(server: &TestServer, sid: &str, text: &str) -> Vec<Sse> {
    let body = json!({"stream": "message", "messages": [{"role": "user", "content": text}]});
    tokio::time::timeout(
        Duration::from_secs(60),
        server
            .http
            .post_sse(&format!("/sessions/{sid}/turns"), &body),
    )
    .await
    .expect("the turn did not finish within 60 s (a FIFO that blocks?)")
}

/// The session's whole event log, as `GET /sessions/{id}/events/history` returns it.
async fn log_events(server: &TestServer, sid: &str) -> Vec<Value> {
    let (status, v) = server
        .http
        .get(&format!("/sessions/{sid}/events/history?limit=1000"))
        .await;
    assert_eq!(status, 200, "{v}");
    v["events"].as_array().unwrap().clone()
}

/// The `agent.tool_result` events of a log, by tool call id.
fn results_by_call(events: &[Value]) -> HashMap<String, Value> {
    events
        .iter()
        .filter(|e| e["type"] == "agent.tool_result")
        .map(|e| (e["tool_use_id"].as_str().unwrap().to_string(), e.clone()))
        .collect()
}

/// The tool messages of an upstream request, by tool call id.
fn tool_messages(req: &Value) -> HashMap<String, String> {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// `GET path`: status, headers, body bytes.
async fn download(server: &TestServer, path: &str) -> (u16, http::HeaderMap, Vec<u8>) {
    let resp = server.http.request_raw("GET", path, None).await;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, headers, body)
}

/// Regular files under `data/files` (the blob store), temporary uploads excluded.
fn blob_count(server: &TestServer) -> usize {
    crate::common::stores::blob_count(&server.data_dir().with_file_name("tools.toml"))
}

#[tokio::test]
async fn a_session_owns_its_workspace_from_creation_to_deletion() {
    let (_fake, server) = start_default().await;
    let sid = server.session(json!({})).await;
    let ws = workspace(&server, &sid);
    assert!(
        ws.is_dir(),
        "the workspace exists as soon as the session does: {ws:?}"
    );
    let other = server.session(json!({})).await;
    assert!(workspace(&server, &other).is_dir());
    assert_ne!(ws, workspace(&server, &other), "one workspace per session");

    // Deleting the session removes its workspace, without following a symlink out of it.
    let outside = server.dir.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("keep.txt"), "keep me").unwrap();
    std::fs::create_dir_all(ws.join("out/nested")).unwrap();
    std::fs::write(ws.join("out/nested/f.txt"), "x").unwrap();
    std::os::unix::fs::symlink(&outside, ws.join("link_out")).unwrap();
    let (status, _) = server.http.delete(&format!("/sessions/{sid}")).await;
    assert_eq!(status, 204);
    assert!(!ws.exists(), "the workspace goes with the session");
    assert_eq!(
        std::fs::read_to_string(outside.join("keep.txt")).unwrap(),
        "keep me",
        "deleting a workspace never follows its symlinks"
    );
    assert!(
        workspace(&server, &other).is_dir(),
        "another session's workspace stays"
    );
}

#[tokio::test]
async fn a_delivered_file_reaches_the_stream_the_model_the_log_and_the_download() {
    let (fake, server) = start_default().await;
    let sid = server.session(json!({})).await;
    let report = csv(1532);
    assert_eq!(report.len(), 1532);
    std::fs::write(workspace(&server, &sid).join("report.csv"), &report).unwrap();

    fake.push(Reply::tool_calls(&[(
        "call_1",
        "deliver_file",
        json!({"path": "/workspace/report.csv"}),
    )]));
    fake.push(Reply::text("Your report is ready."));
    let events = sse_turn(&server, &sid, "Send me the report").await;
    assert_eq!(
        names(&events),
        vec![
            "turn_start",
            "tool_call",
            "tool_result",
            "text",
            "turn_stop"
        ],
        "{events:?}"
    );
    let delivered = "File delivered: report.csv (1,532 bytes)";
    assert_eq!(events[2].data["toolCallId"], "call_1");
    assert_eq!(events[2].data["content"], delivered);
    assert_eq!(events[4].data["stopReason"], "end_turn");

    // The model's next request saw the result.
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(tool_messages(&reqs[1])["call_1"], delivered);

    // AAP history holds it too.
    let (status, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(status, 200, "{hist}");
    let tool_msg = hist["history"]["full"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .unwrap_or_else(|| panic!("no tool message in history: {hist}"));
    assert_eq!(tool_msg["toolCallId"], "call_1");
    assert_eq!(tool_msg["content"], delivered);

    // The log's agent.tool_result carries the file object.
    let log = log_events(&server, &sid).await;
    let result = &results_by_call(&log)["call_1"];
    assert_eq!(result["is_error"], false);
    assert_eq!(result["content"], delivered);
    let files = result["files"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{result}");
    let id = files[0]["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("file_"), "{id}");
    assert_eq!(
        files[0],
        json!({"id": id, "filename": "report.csv", "mime_type": "text/csv", "size_bytes": 1532})
    );

    // Metadata and download: the same bytes, with the headers a browser needs.
    let (status, meta) = server.http.get(&format!("/files/{id}")).await;
    assert_eq!(status, 200, "{meta}");
    assert_eq!(meta["filename"], "report.csv");
    assert_eq!(meta["mime_type"], "text/csv");
    assert_eq!(meta["size_bytes"], 1532);
    let (status, headers, body) = download(&server, &format!("/files/{id}/content")).await;
    assert_eq!(status, 200);
    assert_eq!(body, report, "the download is byte-identical");
    assert_eq!(headers["content-type"], "text/csv");
    assert_eq!(headers["content-length"], "1532");
    assert_eq!(
        headers["content-disposition"],
        "attachment; filename=\"report.csv\""
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn each_refusal_is_an_error_result_naming_the_problem_and_the_turn_goes_on() {
    let (fake, server) = start_default().await;
    let sid = server.session(json!({})).await;
    let ws = workspace(&server, &sid);
    std::fs::create_dir_all(ws.join("folder")).unwrap();
    std::fs::write(ws.join("folder/inner.txt"), "inner").unwrap();
    mkfifo(&ws.join("pipe"));
    std::fs::write(ws.join("big.bin"), vec![7u8; MAX_BYTES as usize + 1]).unwrap();
    std::fs::write(ws.join("exact.txt"), vec![b'e'; MAX_BYTES as usize]).unwrap();
    // `../x` names a file that exists (beside the workspace): refused for leaving, not for missing.
    std::fs::write(
        server.dir.path().join("sandboxes/x"),
        "beside the workspace",
    )
    .unwrap();

    let calls: Vec<(&str, &str)> = vec![
        ("call_missing", "nope.csv"),
        ("call_dir", "folder"),
        ("call_fifo", "pipe"),
        ("call_big", "big.bin"),
        ("call_up", "../x"),
        ("call_abs", "/etc/passwd"),
        ("call_exact", "exact.txt"),
    ];
    let tool_calls: Vec<(&str, &str, Value)> = calls
        .iter()
        .map(|(id, path)| (*id, "deliver_file", json!({ "path": path })))
        .collect();
    fake.push(Reply::tool_calls(&tool_calls));
    fake.push(Reply::text("Some of those could not be delivered."));
    let events = sse_turn(&server, &sid, "deliver them all").await;
    assert_eq!(names(&events).first(), Some(&"turn_start"));
    assert_eq!(
        events.last().unwrap().data["stopReason"],
        "end_turn",
        "the turn goes on after the errors: {events:?}"
    );
    assert!(
        names(&events).contains(&"text"),
        "the model answered after the errors"
    );
    let streamed: HashMap<String, Value> = events
        .iter()
        .filter(|e| e.event == "tool_result")
        .map(|e| {
            (
                e.data["toolCallId"].as_str().unwrap().to_string(),
                e.data["content"].clone(),
            )
        })
        .collect();
    assert_eq!(streamed.len(), calls.len(), "{events:?}");

    let log = log_events(&server, &sid).await;
    let results = results_by_call(&log);
    let seen = tool_messages(&fake.requests()[1]);
    let expect: [(&str, &[&str]); 6] = [
        ("call_missing", &["no such file", "nope.csv"]),
        ("call_dir", &["folder", "is a directory"]),
        ("call_fifo", &["pipe", "is a FIFO"]),
        (
            "call_big",
            &[
                "big.bin",
                "2,001 bytes",
                "limit of 2,000 bytes",
                "max_bytes",
            ],
        ),
        ("call_up", &["../x", "outside the workspace"]),
        ("call_abs", &["/etc/passwd", "outside the workspace"]),
    ];
    for (id, words) in expect {
        let r = &results[id];
        assert_eq!(r["is_error"], true, "{id}: {r}");
        assert_eq!(r["files"], json!([]), "{id}: {r}");
        let text = r["content"].as_str().unwrap();
        for w in words {
            assert!(text.contains(w), "{id}: {text:?} should say {w:?}");
        }
        assert_eq!(
            streamed[id], r["content"],
            "{id}: the stream shows the same result"
        );
        assert_eq!(seen[id], text, "{id}: the model was told");
    }
    assert!(
        !results["call_abs"]["content"]
            .as_str()
            .unwrap()
            .contains("root:"),
        "nothing of /etc/passwd leaks"
    );
    // At exactly the limit the file is delivered: the limit is not off by one.
    let exact = &results["call_exact"];
    assert_eq!(exact["is_error"], false, "{exact}");
    assert_eq!(exact["content"], "File delivered: exact.txt (2,000 bytes)");
    assert_eq!(exact["files"][0]["size_bytes"], 2000);
    assert_eq!(blob_count(&server), 1, "only exact.txt was stored");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_file_written_through_server_filesystem_is_delivered_byte_identical() {
    let server_filesystem = crate::common::provision::server_filesystem();
    let fake = FakeOpenAi::start().await;
    let fs_server = format!(
        r#"
[mcp_servers.fs]
command = "node"
args = [{:?}, "{{workspace}}"]
scope = "session"
"#,
        server_filesystem.display().to_string()
    );
    let cfg = config_text(&fake, &extra(&fs_server)).replace(
        r#"trust = ["deliver_file"]"#,
        r#"trust = ["mcp__fs__*", "deliver_file"]"#,
    );
    let server = TestServer::start(&cfg).await;
    let (_, tools) = server.http.get("/tools").await;
    let write = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "mcp__fs__write_file")
        .cloned()
        .unwrap_or_else(|| panic!("server-filesystem's write_file is not federated: {tools}"));
    assert_eq!(write["verdict"], "trust", "{write}");

    let sid = server.session(json!({})).await;
    // The server checks paths against its allowed directory, resolved: give it the real path.
    let ws = std::fs::canonicalize(workspace(&server, &sid)).unwrap();
    let content = "# Notes\n\nWritten by the model through server-filesystem.\nÜnïcödé: 日本語, emoji 🚀\n\ttabs and trailing spaces   \n";
    fake.push(Reply::tool_calls(&[(
        "call_w",
        "mcp__fs__write_file",
        json!({"path": ws.join("notes.md").display().to_string(), "content": content}),
    )]));
    fake.push(Reply::tool_calls(&[(
        "call_d",
        "deliver_file",
        json!({"path": "notes.md"}),
    )]));
    fake.push(Reply::text("Here are your notes."));
    let events = sse_turn(&server, &sid, "write notes and send them").await;
    assert_eq!(
        names(&events),
        vec![
            "turn_start",
            "tool_call",
            "tool_result",
            "tool_call",
            "tool_result",
            "text",
            "turn_stop"
        ],
        "{events:?}"
    );
    let log = log_events(&server, &sid).await;
    let results = results_by_call(&log);
    assert_eq!(
        results["call_w"]["is_error"], false,
        "{}",
        results["call_w"]
    );
    let delivered = &results["call_d"];
    assert_eq!(delivered["is_error"], false, "{delivered}");
    assert_eq!(
        delivered["content"],
        format!("File delivered: notes.md ({} bytes)", content.len())
    );
    assert_eq!(events[4].data["content"], delivered["content"]);
    let id = delivered["files"][0]["id"].as_str().unwrap();
    assert_eq!(delivered["files"][0]["filename"], "notes.md");
    assert_eq!(delivered["files"][0]["size_bytes"], content.len());
    let (status, headers, body) = download(&server, &format!("/files/{id}/content")).await;
    assert_eq!(status, 200);
    assert_eq!(
        body,
        content.as_bytes(),
        "the download is byte-identical to what the model wrote"
    );
    assert_eq!(headers["content-length"], content.len().to_string());
    assert_eq!(
        std::fs::read(ws.join("notes.md")).unwrap(),
        content.as_bytes(),
        "the server wrote into the session's workspace"
    );
    check_log(server.engine().store(), &sid).await;
}

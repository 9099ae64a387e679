//! turnstile as an MCP client beyond tools: roots (a session-scoped server is confined to its
//! session's workspace by roots alone) and elicitation where no one can be asked (declined,
//! with the capability declared). OAuth is exercised by tests/mcp_conformance.rs.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use common::{config_text, TestServer};
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

async fn turn(server: &TestServer, sid: &str, text: &str) -> (u16, Value) {
    let body = json!({"messages": [{"role": "user", "content": text}]});
    tokio::time::timeout(
        Duration::from_secs(60),
        server.http.post(&format!("/sessions/{sid}/turns"), &body),
    )
    .await
    .expect("the turn did not finish within 60 s")
}

/// The text of each `agent.tool_result` of the session's log, by call id, with its error flag.
async fn results(server: &TestServer, sid: &str) -> HashMap<String, (String, bool)> {
    let (status, v) = server
        .http
        .get(&format!("/sessions/{sid}/events/history?limit=1000"))
        .await;
    assert_eq!(status, 200, "{v}");
    v["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "agent.tool_result")
        .map(|e| {
            let text = match &e["content"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (
                e["tool_use_id"].as_str().unwrap().to_string(),
                (text, e["is_error"].as_bool().unwrap_or(false)),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_scoped_filesystem_server_is_confined_to_the_workspace_by_roots_alone() {
    let server_filesystem = common::provision::server_filesystem();
    let fake = FakeOpenAi::start().await;
    // No directory in args: the server takes its allowed directories from our roots.
    let extra = format!(
        "[mcp_servers.fs]\ncommand = \"node\"\nargs = [{:?}]\nscope = \"session\"\n\n[policy]\ntrust = [\"mcp__fs__*\"]\n",
        server_filesystem.display().to_string()
    );
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let sid = server.session(json!({})).await;
    let ws_dir: PathBuf = server.dir.path().join("sandboxes").join(&sid);
    std::fs::create_dir_all(&ws_dir).unwrap();
    let ws = std::fs::canonicalize(&ws_dir).unwrap();
    let outside = std::fs::canonicalize(server.dir.path())
        .unwrap()
        .join("outside.txt");
    // The server applies the roots it asked for asynchronously: wait until it lists the
    // workspace as its allowed directory (each try a turn calling list_allowed_directories).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    for i in 0.. {
        let id = format!("call_list{i}");
        fake.push(Reply::tool_calls(&[(
            id.as_str(),
            "mcp__fs__list_allowed_directories",
            json!({}),
        )]));
        fake.push(Reply::text("listed"));
        let (status, v) = turn(&server, &sid, "list").await;
        assert_eq!(status, 200, "{v}");
        let r = results(&server, &sid).await;
        if r[&id].0.contains(&ws.display().to_string()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the server never took the workspace as its root: {:?}",
            r[&id]
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    fake.push(Reply::tool_calls(&[
        (
            "call_in",
            "mcp__fs__write_file",
            json!({"path": ws.join("in.txt").display().to_string(), "content": "inside"}),
        ),
        (
            "call_out",
            "mcp__fs__write_file",
            json!({"path": outside.display().to_string(), "content": "outside"}),
        ),
        ("call_dirs", "mcp__fs__list_allowed_directories", json!({})),
    ]));
    fake.push(Reply::text("done"));
    let (status, v) = turn(&server, &sid, "write both").await;
    assert_eq!(status, 200, "{v}");
    let r = results(&server, &sid).await;
    assert!(
        !r["call_in"].1,
        "writing inside the workspace failed: {:?}",
        r["call_in"]
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("in.txt")).unwrap(),
        "inside"
    );
    assert!(
        r["call_out"].1,
        "writing outside the workspace was not refused: {:?}",
        r["call_out"]
    );
    assert!(
        !outside.exists(),
        "a file was written outside the workspace"
    );
    assert!(
        r["call_dirs"].0.contains(&ws.display().to_string()),
        "the allowed directory is not the workspace: {:?}",
        r["call_dirs"]
    );
}

fn elicit_server(extra: &str) -> String {
    let script =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client/elicit_server.py");
    format!(
        "[mcp_servers.el]\ncommand = \"python3\"\nargs = [{:?}]\n{extra}\n\n[policy]\ntrust = [\"mcp__el__*\"]\n",
        script.display().to_string()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elicitation_no_one_can_answer_is_declined_and_the_capability_is_declared() {
    for extra in ["", "elicitation = \"decline\""] {
        let fake = FakeOpenAi::start().await;
        let server = TestServer::start(&config_text(&fake, &elicit_server(extra))).await;
        let sid = server.session(json!({})).await;
        fake.push(Reply::tool_calls(&[(
            "call_ask",
            "mcp__el__ask",
            json!({}),
        )]));
        fake.push(Reply::text("ok"));
        let (status, v) = turn(&server, &sid, "ask me").await;
        assert_eq!(status, 200, "{v}");
        let r = results(&server, &sid).await;
        let (text, is_error) = &r["call_ask"];
        assert!(!is_error, "{text}");
        assert!(
            text.starts_with("action=decline content=null"),
            "{extra}: {text}"
        );
        assert!(
            text.contains("\"elicitation\": {\"form\""),
            "{extra}: {text}"
        );
    }
}

//! turnstile as an MCP client beyond tools: roots (a session-scoped server is confined to its
//! session's workspace by roots alone) and elicitation where no one can be asked (declined,
//! with the capability declared). OAuth is exercised by tests/mcp/conformance.rs.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::common::{config_text, TestServer};
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
    let server_filesystem = crate::common::provision::server_filesystem();
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

/// An MCP client of `/mcp` that answers every elicitation with `content`.
struct Answering {
    content: Value,
    asked: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl rmcp::ClientHandler for Answering {
    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _: rmcp::service::RequestContext<rmcp::RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, rmcp::ErrorData> {
        if let rmcp::model::ElicitRequestParams::FormElicitationParams { message, .. } = request {
            self.asked.lock().unwrap().push(message);
        }
        Ok(
            rmcp::model::ElicitResult::new(rmcp::model::ElicitationAction::Accept)
                .with_content(self.content.clone()),
        )
    }

    fn get_info(&self) -> rmcp::model::ClientConfig {
        let mut info = rmcp::model::ClientConfig::default();
        let mut caps = rmcp::model::ClientCapabilities::default();
        caps.elicitation = Some(
            rmcp::model::ElicitationCapability::new()
                .with_form(rmcp::model::FormElicitationCapability::new()),
        );
        info.capabilities = caps;
        info
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elicitation_during_a_call_through_mcp_reaches_that_client_with_defaults_and_validation()
{
    use rmcp::ServiceExt;
    let fake = FakeOpenAi::start().await;
    let extra = format!(
        "{}\n[mcp_endpoint]\nenabled = true\nagents = [\"assistant\"]\n",
        elicit_server("")
    );
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let url = format!("http://{}/mcp", server.addr);
    // A valid answer: the defaults fill what it left out (SEP-1034).
    // An invalid one (count below its minimum): declined, never passed on.
    for (content, want) in [
        (
            json!({"name": "Grace"}),
            "action=accept content={\"count\": 2, \"name\": \"Grace\"}",
        ),
        (json!({"count": 0}), "action=decline content=null"),
    ] {
        let asked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let handler = Answering {
            content,
            asked: asked.clone(),
        };
        let client = handler
            .serve(turnstile::tools::mcp::http_client::transport(
                &url,
                HashMap::new(),
                None,
            ))
            .await
            .expect("connect to /mcp");
        let result = tokio::time::timeout(
            Duration::from_secs(30),
            client
                .peer()
                .call_tool(rmcp::model::CallToolRequestParams::new("mcp__el__ask")),
        )
        .await
        .expect("the call answered within 30 s")
        .expect("the call succeeded");
        let text = serde_json::to_value(&result.content).unwrap().to_string();
        assert!(
            text.contains(&want.replace('"', "\\\"")),
            "{want} not in {text}"
        );
        assert_eq!(*asked.lock().unwrap(), vec!["Who are you?".to_string()]);
        let _ = client.cancel().await;
    }
}

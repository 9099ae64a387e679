//! `/mcp` passes the federated servers' resources and prompts through (read-only, under
//! `turnstile://<server>/` and `<server>/`), driven by the official MCP Python SDK client
//! (`tests/mcp_endpoint_resources/client.py`) against the real binary federating the fixture
//! server (`tests/mcp_endpoint_resources/child.py`).

use std::path::Path;
use std::time::Duration;

use serde_json::{json, Value};

const P: &str = "turnstile://fx/";

/// `/mcp` over the fixture server `fx`: all of it trusted, but test://secret denied and
/// test://watched-resource and the prompt test_simple_prompt asked.
fn config(dir: &Path) -> std::path::PathBuf {
    config_with(dir, "", "")
}

/// [`config`] with `servers` federated beside `fx` (their tools trusted too) and `endpoint`
/// lines in `[mcp_endpoint]`.
fn config_with(dir: &Path, servers: &str, endpoint: &str) -> std::path::PathBuf {
    let text = format!(
        "[server]\ndata_dir = {:?}\nsandboxes = {:?}\n\n[agents.assistant]\ntools = [\"*\"]\n\n{}\n{servers}\n[policy]\ntrust = [\"mcp__fx__*\", \"mcp__fy__*\", \"mcp__ex__echo\"]\nask = [\"mcp__fx__test://watched-resource\", \"mcp__fx__test_simple_prompt\"]\ndeny = [\"mcp__fx__test://secret\"]\ndefault = \"deny\"\n\n[mcp_endpoint]\nenabled = true\n{endpoint}",
        dir.join("data").display().to_string(),
        dir.join("sandboxes").display().to_string(),
        crate::common::fixture_server::fixture_server("fx"),
    );
    let path = dir.join("tools.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Run the client script; every JSON line it printed, merged into one object.
async fn client(url: &str, scenario: &str) -> Value {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_endpoint_resources/client.py");
    let mut cmd = tokio::process::Command::new(crate::common::fixture_server::python());
    cmd.arg(script).args([url, scenario]);
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

async fn serve(dir: &Path) -> (tokio::process::Child, String) {
    let (child, addr) = crate::common::binary::serve(&config(dir)).await;
    (child, format!("http://{addr}/mcp"))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resources_are_listed_under_the_server_prefix_read_and_a_denied_one_hidden_and_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, url) = serve(dir.path()).await;
    let v = client(&url, "read").await;
    let caps = &v["capabilities"];
    assert_eq!(
        caps["resources"],
        json!({"subscribe": true, "listChanged": true}),
        "{v}"
    );
    assert_eq!(caps["prompts"], json!({"listChanged": true}), "{v}");
    assert!(caps["completions"].is_object(), "{v}");
    assert!(caps.get("logging").is_none(), "not served: {v}");
    assert_eq!(
        strings(&v["resources"]),
        vec![
            "turnstile://fx/test://static-binary",
            "turnstile://fx/test://static-text",
            "turnstile://fx/test://watched-resource",
        ],
        "the denied test://secret is hidden: {v}"
    );
    assert!(strings(&v["names"]).contains(&"fx/static-text"), "{v}");
    assert_eq!(
        strings(&v["templates"]),
        vec!["turnstile://fx/test://template/{id}/data"]
    );
    assert_eq!(
        v["text"],
        json!([{"uri": format!("{P}test://static-text"), "mime": "text/plain",
                "text": "This is the content of the static text resource.", "blob": null}])
    );
    assert_eq!(v["binary"][0]["mime"], "image/png", "{v}");
    assert!(v["binary"][0]["blob"]
        .as_str()
        .unwrap()
        .starts_with("iVBOR"));
    assert_eq!(
        v["template"][0]["uri"],
        format!("{P}test://template/42/data")
    );
    assert!(v["template"][0]["text"].as_str().unwrap().contains("42"));
    // The server's own URI (as a tool result's link carries it) reaches it too, and comes back
    // as it was sent.
    assert_eq!(v["own"][0]["uri"], "test://static-text", "{v}");
    assert_eq!(
        v["own"][0]["text"],
        "This is the content of the static text resource."
    );
    for denied in ["denied", "denied_own"] {
        let message = v[denied]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("denied by policy")
                && message.contains("rule deny = \"mcp__fx__test://secret\""),
            "{denied}: {v}"
        );
    }
    let asked = v["asked"]["message"].as_str().unwrap_or_default();
    assert!(
        asked.contains("elicitation") && asked.contains("mcp__fx__test://watched-resource"),
        "ask without elicitation is refused naming the rule: {v}"
    );
    assert_eq!(v["unknown"]["code"], -32002, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompts_are_listed_under_the_server_prefix_and_got_with_arguments() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, url) = serve(dir.path()).await;
    let v = client(&url, "prompts").await;
    assert_eq!(
        strings(&v["prompts"]),
        vec![
            "fx/test_prompt_with_arguments",
            "fx/test_prompt_with_embedded_resource",
            "fx/test_prompt_with_image",
            "fx/test_simple_prompt",
        ],
        "{v}"
    );
    assert_eq!(strings(&v["args"]), vec!["arg1", "arg2"]);
    assert_eq!(
        strings(&v["with_args"]),
        vec!["Prompt with arguments: arg1='red', arg2='blue'"]
    );
    let asked = v["asked"]["message"].as_str().unwrap_or_default();
    assert!(
        asked.contains("elicitation") && asked.contains("mcp__fx__test_simple_prompt"),
        "{v}"
    );
    let bare = v["bare"]["message"].as_str().unwrap_or_default();
    assert!(bare.contains("<server>/<prompt>"), "{v}");
    assert_eq!(strings(&v["completed"]), vec!["paris", "park", "party"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_asked_resource_and_prompt_are_served_when_the_client_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, url) = serve(dir.path()).await;
    let v = client(&url, "accept").await;
    assert!(
        v["elicited"]
            .as_str()
            .unwrap()
            .contains("mcp__fx__test_simple_prompt"),
        "the second question is the prompt's: {v}"
    );
    assert_eq!(v["read"][0]["text"], "Watched resource content.", "{v}");
    assert_eq!(
        strings(&v["prompt"]),
        vec!["This is a simple prompt for testing."]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_changed_and_subscribed_updates_are_relayed() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, url) = serve(dir.path()).await;
    let v = client(&url, "changed").await;
    assert!(
        !strings(&v["before"]).contains(&"turnstile://fx/test://added/fresh"),
        "{v}"
    );
    assert_eq!(v["added"], "added fresh", "{v}");
    assert!(
        strings(&v["resources"]).contains(&"turnstile://fx/test://added/fresh"),
        "{v}"
    );
    assert!(strings(&v["prompts"]).contains(&"fx/added_fresh"), "{v}");
    assert_eq!(
        strings(&v["updated"]),
        vec!["turnstile://fx/test://static-text"],
        "only the subscribed resource, as the client named it: {v}"
    );
    let denied = v["denied_subscribe"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(denied.contains("denied by policy"), "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_tool_definitions_and_results_pass_through_as_it_sent_them() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, url) = serve(dir.path()).await;
    let v = client(&url, "verbatim").await;
    // Listed as the server listed it, renamed: title, output schema and annotations kept.
    let tool = &v["structured_tool"];
    assert_eq!(tool["name"], "mcp__fx__structured", "{v}");
    assert_eq!(tool["title"], "Structured weather", "{v}");
    assert_eq!(
        tool["outputSchema"],
        json!({"type": "object", "properties": {"temperature": {"type": "number"}}, "required": ["temperature"]}),
        "{v}"
    );
    assert_eq!(
        tool["annotations"],
        json!({"readOnlyHint": true, "idempotentHint": true}),
        "{v}"
    );
    // The result as the server sent it: structured content and _meta (not a text rendering).
    let r = &v["structured"];
    assert_eq!(r["structuredContent"], json!({"temperature": 21.5}), "{v}");
    assert_eq!(r["_meta"], json!({"fixture/source": "child.py"}), "{v}");
    assert_eq!(
        r["content"],
        json!([{"type": "text", "text": "{\"temperature\": 21.5}"}])
    );
    // Every kind of content block, unchanged.
    assert_eq!(
        v["test_audio_content"],
        json!([{"type": "audio", "mimeType": "audio/wav", "data": "UklGRiYAAABXQVZFZm10IBAAAAABAAEAQB8AAAB9AAACABAAZGF0YQIAAAA="}]),
        "{v}"
    );
    assert_eq!(
        v["test_embedded_resource"],
        json!([{"type": "resource", "resource": {"uri": "test://embedded-resource", "mimeType": "text/plain", "text": "This is an embedded resource content."}}]),
        "{v}"
    );
    let mixed: Vec<&str> = v["test_multiple_content_types"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(mixed, ["text", "image", "resource"], "{v}");
    assert_eq!(
        v["error"],
        json!({"is_error": true, "content": [{"type": "text", "text": "This tool intentionally returns an error for testing"}]}),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_own_names_a_servers_names_are_served_where_unique_and_federated_ones_still_work() {
    let dir = tempfile::tempdir().unwrap();
    let ex = crate::common::mcp::example_server("ex", "");
    let path = config_with(dir.path(), &ex, "names = \"own\"\n");
    let (_child, addr) = crate::common::binary::serve(&path).await;
    let v = client(&format!("http://{addr}/mcp"), "names").await;
    let tools = strings(&v["tools"]);
    for own in ["structured", "test_simple_text", "add_resource", "echo"] {
        assert!(tools.contains(&own), "{own} by its own name: {tools:?}");
    }
    assert!(
        !tools.iter().any(|t| t.starts_with("mcp__")),
        "no tool keeps a federated name when its own is unique: {tools:?}"
    );
    assert!(!tools.contains(&"fail"), "policy still hides: {tools:?}");
    assert!(
        strings(&v["prompts"]).contains(&"test_prompt_with_arguments"),
        "{v}"
    );
    let resources = strings(&v["resources"]);
    assert!(resources.contains(&"test://static-text"), "{resources:?}");
    assert!(
        !resources.contains(&"test://secret"),
        "policy (on the federated name) still denies: {resources:?}"
    );
    assert_eq!(strings(&v["templates"]), ["test://template/{id}/data"]);
    let answer = json!({"is_error": false, "content": [{"type": "text", "text": "{\"temperature\": 21.5}"}]});
    assert_eq!(v["call_structured"], answer, "{v}");
    assert_eq!(v["call_mcp__fx__structured"], answer, "{v}");
    assert_eq!(
        v["prompt_own"],
        json!(["Prompt with arguments: arg1='a', arg2='b'"]),
        "{v}"
    );
    assert_eq!(
        v["prompt_federated"],
        json!(["Prompt with arguments: arg1='c', arg2='d'"]),
        "{v}"
    );
    assert_eq!(v["read_own"][0]["uri"], "test://static-text", "{v}");
    assert_eq!(
        v["read_federated"][0]["uri"],
        format!("{P}test://static-text"),
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_own_names_what_two_servers_share_keeps_its_federated_name() {
    let dir = tempfile::tempdir().unwrap();
    let fy = crate::common::fixture_server::fixture_server("fy");
    let path = config_with(dir.path(), &fy, "names = \"own\"\n");
    let (_child, addr) = crate::common::binary::serve(&path).await;
    let v = client(&format!("http://{addr}/mcp"), "names").await;
    let tools = strings(&v["tools"]);
    assert!(
        tools.contains(&"mcp__fx__structured") && tools.contains(&"mcp__fy__structured"),
        "{tools:?}"
    );
    assert!(
        !tools.contains(&"structured"),
        "a name two servers have names neither: {tools:?}"
    );
    let prompts = strings(&v["prompts"]);
    assert!(
        prompts.contains(&"fx/test_simple_prompt") || prompts.contains(&"fy/test_simple_prompt"),
        "{prompts:?}"
    );
    assert!(
        !prompts.contains(&"test_prompt_with_arguments"),
        "{prompts:?}"
    );
    let resources = strings(&v["resources"]);
    assert!(
        resources.contains(&"turnstile://fy/test://static-text"),
        "{resources:?}"
    );
    assert!(!resources.contains(&"test://static-text"), "{resources:?}");
    assert_eq!(
        v["call_structured"]["content"][0]["text"], "Unknown tool structured.",
        "{v}"
    );
    assert_eq!(v["call_mcp__fx__structured"]["is_error"], false, "{v}");
    assert!(
        v["prompt_own"]["message"]
            .as_str()
            .unwrap()
            .contains("Prompt test_prompt_with_arguments"),
        "{v}"
    );
    assert!(
        v["read_own"]["message"]
            .as_str()
            .unwrap()
            .contains("several MCP servers serve it"),
        "{v}"
    );
}

/// `fx` as a session-scoped server: an instance per MCP session.
const SESSION_SCOPED: &str = "scope = \"session\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_scoped_servers_catalog_is_its_sessions_own() {
    let dir = tempfile::tempdir().unwrap();
    let path = config_with(dir.path(), SESSION_SCOPED, "");
    let (_child, addr) = crate::common::binary::serve(&path).await;
    let url = format!("http://{addr}/mcp");
    let v = client(&url, "read").await;
    assert_eq!(
        v["capabilities"]["resources"],
        json!({"subscribe": true, "listChanged": true}),
        "declared from the server's probe: {v}"
    );
    assert!(
        strings(&v["resources"]).contains(&"turnstile://fx/test://static-text"),
        "{v}"
    );
    assert_eq!(
        v["text"][0]["text"],
        "This is the content of the static text resource."
    );
    assert!(
        v["denied"]["message"]
            .as_str()
            .unwrap()
            .contains("denied by policy"),
        "{v}"
    );
    // One session adds a resource to its instance (and hears of it); another session's
    // instance is another process, which never had it.
    let changed = client(&url, "changed").await;
    assert!(
        strings(&changed["resources"]).contains(&"turnstile://fx/test://added/fresh"),
        "{changed}"
    );
    assert_eq!(
        strings(&changed["updated"]),
        [format!("{P}test://static-text").as_str()]
    );
    let other = client(&url, "read").await;
    assert!(
        !strings(&other["resources"]).contains(&"turnstile://fx/test://added/fresh"),
        "another session's instance: {other}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_scoped_servers_log_messages_reach_its_session_at_the_level_it_set() {
    let dir = tempfile::tempdir().unwrap();
    let path = config_with(dir.path(), SESSION_SCOPED, "");
    let (_child, addr) = crate::common::binary::serve(&path).await;
    let v = client(&format!("http://{addr}/mcp"), "logs").await;
    assert_eq!(v["logging"], true, "{v}");
    assert_eq!(v["set_info"], "ok", "{v}");
    assert_eq!(v["called"], "Tool with logging executed successfully");
    let data = |key: &str| -> Vec<String> {
        v[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key}: {v}"))
            .iter()
            .map(|m| {
                format!(
                    "{} {}",
                    m["level"].as_str().unwrap(),
                    m["data"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert_eq!(
        data("at_info"),
        [
            "info Tool execution started",
            "info Tool processing data",
            "info Tool execution completed"
        ]
    );
    assert_eq!(v["set_error"], "ok", "{v}");
    assert_eq!(
        data("at_error"),
        ["error sentinel"],
        "info messages are not relayed below the level the client set"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_servers_log_messages_reach_no_session() {
    let dir = tempfile::tempdir().unwrap();
    let (_child, url) = serve(dir.path()).await;
    let v = client(&url, "logs").await;
    assert_eq!(
        v["logging"], false,
        "a shared server's logs are no one session's: {v}"
    );
    assert_eq!(v["set_info"]["code"], -32601, "{v}");
    assert_eq!(v["called"], "Tool with logging executed successfully");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calls_progress_and_log_messages_arrive_all_in_the_servers_order_before_its_result() {
    let dir = tempfile::tempdir().unwrap();
    let path = config_with(dir.path(), SESSION_SCOPED, "");
    let (_child, addr) = crate::common::binary::serve(&path).await;
    let v = client(&format!("http://{addr}/mcp"), "burst").await;
    assert_eq!(v["result"], "burst done");
    let progress: Vec<f64> = (0..50).map(f64::from).collect();
    assert_eq!(
        v["progress"],
        json!(progress),
        "every report, in order, before the result"
    );
    let logs: Vec<String> = (0..50).map(|i| format!("burst {i}")).collect();
    assert_eq!(v["logs"], json!(logs), "every message, in order");
}

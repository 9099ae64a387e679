//! Reloading `tools.toml` in the real binary (`turnstile reload`, SIGHUP) while a streamed turn
//! runs and an event stream and an `/mcp` session are open: the new policy decides the next
//! call, an added MCP server's tools appear and a removed one's go (with `list_changed` to the
//! `/mcp` client), nothing open is cut, and an invalid file changes nothing and says why.

use std::path::Path;
use std::time::Duration;

use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

use crate::common::mcp::example_server;
use crate::common::{config_text, Http};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

/// `ex` and `old`, everything of theirs trusted; `/mcp` on.
fn before(fake: &FakeOpenAi) -> String {
    config_text(
        fake,
        &format!(
            "{}{}\n[policy]\ntrust = [\"mcp__*\"]\ndefault = \"ask\"\n\n[mcp_endpoint]\nenabled = true\n",
            example_server("ex", ""),
            example_server("old", "")
        ),
    )
}

/// `old` removed, `new` added, `mcp__ex__add` now denied.
fn after(fake: &FakeOpenAi) -> String {
    config_text(
        fake,
        &format!(
            "{}{}\n[policy]\ntrust = [\"mcp__*\"]\ndeny = [\"mcp__ex__add\"]\ndefault = \"ask\"\n\n[mcp_endpoint]\nenabled = true\n",
            example_server("ex", ""),
            example_server("new", "")
        ),
    )
}

/// `GET /status` once its `reload` satisfies `done` (polled; the server's own answer is the
/// synchronisation, within 60 s).
async fn status_when(http: &Http, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (code, status) = http.get("/status").await;
        assert_eq!(code, 200, "{status}");
        if done(&status["reload"]) {
            return status;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no such reload within 60 s: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The federated tools `GET /tools` lists, each with its verdict.
async fn verdicts(http: &Http) -> Vec<(String, String)> {
    let (_, tools) = http.get("/tools").await;
    tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn verdict<'a>(tools: &'a [(String, String)], name: &str) -> Option<&'a str> {
    tools
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The `/mcp` client's `reload` scenario: started, and its tools before the reload.
async fn mcp_client(
    url: &str,
) -> (
    tokio::process::Child,
    tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    Value,
) {
    let python = crate::common::mcp_python_sdk::python();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_endpoint/client.py");
    let mut child = tokio::process::Command::new(python)
        .arg(script)
        .args([url, "-", "reload"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run the client");
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let before = next_json(&mut lines).await;
    (child, lines, before)
}

async fn next_json(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
) -> Value {
    loop {
        let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .expect("the /mcp client answered within 60 s")
            .unwrap()
            .expect("the /mcp client printed a line");
        if line.starts_with('{') {
            return serde_json::from_str(&line).unwrap();
        }
    }
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_policy_and_servers_without_cutting_what_runs() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, before(&fake)).unwrap();
    let (child, addr) = crate::common::binary::serve(&path).await;
    let http = Http::new(addr);
    let tools = verdicts(&http).await;
    assert_eq!(verdict(&tools, "mcp__ex__add"), Some("trust"), "{tools:?}");
    assert!(verdict(&tools, "mcp__old__add").is_some(), "{tools:?}");
    let (_, status) = http.get("/status").await;
    assert_eq!(status["reload"], Value::Null, "{status}");

    // Open: an event stream, an /mcp session, and a streamed turn held at the upstream.
    let (_, created) = http.post("/sessions", &json!({})).await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    let mut events =
        crate::common::sse_stream::get(&http.base, &format!("/sessions/{sid}/events/stream"), &[])
            .await
            .ok();
    let (mut mcp, mut mcp_lines, mcp_before) = mcp_client(&format!("http://{addr}/mcp")).await;
    assert!(
        names(&mcp_before["before"]).contains(&"mcp__old__add"),
        "{mcp_before}"
    );
    let gate = Gate::new();
    fake.push(Reply::text("answered while the file changed").hold(gate.clone()));
    let turn_http = http.clone();
    let turn_path = format!("/sessions/{sid}/turns");
    let running = tokio::spawn(async move {
        let resp = turn_http
            .request_raw(
                "POST",
                &turn_path,
                Some(
                    br#"{"stream":"delta","messages":[{"role":"user","content":"one"}]}"#.to_vec(),
                ),
            )
            .await;
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.map(|b| b.to_bytes());
        (
            status,
            body.map(|b| String::from_utf8_lossy(&b).into_owned()),
        )
    });
    fake.wait_requests(1).await;

    // `turnstile reload` with the new file.
    std::fs::write(&path, after(&fake)).unwrap();
    let out = crate::common::binary::blocking_command()
        .args(["reload", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "turnstile reload: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = status_when(&http, |r| r["generation"] == 1).await;
    assert_eq!(status["reload"]["ok"], true, "{status}");
    let servers: Vec<&str> = status["mcp_servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(servers, ["ex", "new"], "{status}");
    let tools = verdicts(&http).await;
    assert_eq!(verdict(&tools, "mcp__ex__add"), Some("deny"), "{tools:?}");
    assert_eq!(verdict(&tools, "mcp__new__add"), Some("trust"), "{tools:?}");
    assert_eq!(verdict(&tools, "mcp__old__add"), None, "{tools:?}");

    // The /mcp client heard list_changed and lists the new tool set.
    let mcp_after = next_json(&mut mcp_lines).await;
    let listed = names(&mcp_after["after"]);
    assert!(listed.contains(&"mcp__new__add"), "{mcp_after}");
    assert!(!listed.contains(&"mcp__old__add"), "{mcp_after}");
    assert!(!listed.contains(&"mcp__ex__add"), "{mcp_after}");
    assert!(mcp.wait().await.unwrap().success());

    // The running turn goes on to its end, on its stream; the event stream is still open.
    gate.open();
    let (code, body) = running.await.unwrap();
    assert_eq!(code, 200);
    let body = body.expect("the turn's stream was not cut");
    let sse = crate::common::parse_sse(&body);
    let said: String = sse
        .iter()
        .filter(|e| e.event == "text_delta")
        .filter_map(|e| e.data["delta"].as_str())
        .collect();
    assert_eq!(said, "answered while the file changed", "{body}");
    let last = sse.last().expect("events");
    assert_eq!(last.event, "turn_stop", "{body}");
    assert_eq!(last.data["stopReason"], "end_turn", "{body}");
    events.until(|f| f.event == "turn.completed").await;

    // The next call is decided by the new policy: denied, and the new server's tool offered.
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "mcp__ex__add",
        json!({"a": 1, "b": 2}),
    )]));
    fake.push(Reply::text("two done"));
    let (code, resp) = http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "two"}]}),
        )
        .await;
    assert_eq!(code, 200, "{resp}");
    let requests = fake.wait_requests(3).await;
    let offered: Vec<&str> = requests[1]["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .filter_map(|t| t["function"]["name"].as_str())
                .collect()
        })
        .unwrap_or_default();
    assert!(offered.contains(&"mcp__new__add"), "{offered:?}");
    assert!(!offered.contains(&"mcp__ex__add"), "{offered:?}");
    assert!(
        !offered.iter().any(|t| t.starts_with("mcp__old__")),
        "{offered:?}"
    );
    let answered = requests[2]["messages"].to_string();
    assert!(
        answered.contains("Tool mcp__ex__add is denied by policy."),
        "{answered}"
    );
    let frames = events.until(|f| f.event == "turn.completed").await;
    assert!(
        frames.iter().any(|f| f.event == "agent.tool_result"),
        "the event stream saw the second turn"
    );

    // An invalid file (SIGHUP this time): refused, everything stays, /status says why.
    std::fs::write(
        &path,
        format!("{}\n[policy.extra]\nnot_a_key = 1\n", after(&fake)),
    )
    .unwrap();
    let pid = child.id().expect("pid").to_string();
    assert!(std::process::Command::new("kill")
        .args(["-HUP", &pid])
        .status()
        .unwrap()
        .success());
    let status = status_when(&http, |r| r["ok"] == false).await;
    assert_eq!(status["reload"]["generation"], 1, "{status}");
    let error = status["reload"]["error"].as_str().unwrap();
    assert!(error.contains("tools.toml"), "{error}");
    let tools = verdicts(&http).await;
    assert_eq!(verdict(&tools, "mcp__ex__add"), Some("deny"), "{tools:?}");
    assert_eq!(verdict(&tools, "mcp__new__add"), Some("trust"), "{tools:?}");
    fake.push(Reply::text("three done"));
    let (code, resp) = http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "three"}]}),
        )
        .await;
    assert_eq!(code, 200, "{resp}");
    assert_eq!(resp["messages"][0]["content"], "three done", "{resp}");
    drop(child);
}

/// SHA-256 of `key`, in hex.
fn sha256(key: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, key.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn a_reload_changes_keys_and_agents_and_names_what_needs_a_restart() {
    let fake = FakeOpenAi::start().await;
    let keyed = |keys: &str, agents: &str, listen: &str| {
        config_text(&fake, &format!("{agents}\n{keys}"))
            .replace("[server]\n", &format!("[server]\nlisten = \"{listen}\"\n"))
    };
    let alice = format!("[keys.alice]\nkey_sha256 = \"{}\"\n", sha256("alice-key"));
    let bob = format!("[keys.bob]\nkey_sha256 = \"{}\"\n", sha256("bob-key"));
    let server =
        crate::common::TestServer::start(&keyed(&alice, "[agents.one]\n", "127.0.0.1:1")).await;
    let (alice_http, bob_http) = (
        server.http.with_key("alice-key"),
        server.http.with_key("bob-key"),
    );
    assert_eq!(alice_http.get("/sessions").await.0, 200);
    assert_eq!(bob_http.get("/sessions").await.0, 401);

    // bob replaces alice, agent two joins, and the listen address changes (a restart's job).
    std::fs::write(
        server.dir.path().join("tools.toml"),
        keyed(&bob, "[agents.one]\n[agents.two]\n", "127.0.0.1:2"),
    )
    .unwrap();
    let report = server.running.as_ref().unwrap().reload().await;
    assert!(report.ok, "{report:?}");
    assert_eq!(report.needs_restart, ["server.listen"], "{report:?}");
    assert_eq!(alice_http.get("/sessions").await.0, 401);
    let (code, meta) = bob_http.get("/meta").await;
    assert_eq!(code, 200, "{meta}");
    let agents: Vec<&str> = meta["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert_eq!(agents, ["one", "two"], "{meta}");
    // The running config keeps the address it started with.
    assert_eq!(server.engine().config().server.listen.port(), 1);

    // Removing the last key is refused: keyless serving is decided at start-up.
    std::fs::write(
        server.dir.path().join("tools.toml"),
        keyed("", "[agents.one]\n", "127.0.0.1:1"),
    )
    .unwrap();
    let report = server.running.as_ref().unwrap().reload().await;
    assert!(!report.ok, "{report:?}");
    assert_eq!(report.generation, 1, "{report:?}");
    assert!(
        report.error.as_deref().unwrap_or("").contains("restart"),
        "{report:?}"
    );
    assert_eq!(bob_http.get("/sessions").await.0, 200);
}

//! A reload's part in federation: unchanged servers keep their processes (a session's own one
//! too), changed ones restart, removed ones finish their calls in flight before they stop, and
//! a pending permission is re-decided under the reloaded policy when it is granted.

use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

use crate::common::mcp::example_server;
use crate::common::{config_text, TestServer};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

async fn turn(server: &TestServer, sid: &str, body: Value) -> Value {
    let (status, resp) = server
        .http
        .post(&format!("/sessions/{sid}/turns"), &body)
        .await;
    assert_eq!(status, 200, "{resp}");
    resp
}

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

/// Rewrite the server's `tools.toml` and reload it; the reload must be applied.
async fn reload(server: &TestServer, text: &str) {
    std::fs::write(server.dir.path().join("tools.toml"), text).unwrap();
    let report = server.running.as_ref().unwrap().reload().await;
    assert!(report.ok, "{report:?}");
}

/// The process ids the `pid` tool of each of `servers` gives, in one turn of `sid`.
async fn pids(fake: &FakeOpenAi, server: &TestServer, sid: &str, servers: &[&str]) -> Vec<i64> {
    let calls: Vec<(String, String)> = servers
        .iter()
        .map(|s| (format!("call_{s}"), format!("mcp__{s}__pid")))
        .collect();
    let calls: Vec<(&str, &str, Value)> = calls
        .iter()
        .map(|(id, name)| (id.as_str(), name.as_str(), json!({})))
        .collect();
    let before = fake.requests().len();
    fake.push(Reply::tool_calls(&calls));
    fake.push(Reply::text("ok"));
    turn(server, sid, user("pids")).await;
    let requests = fake.wait_requests(before + 2).await;
    let messages = requests[before + 1]["messages"].as_array().unwrap().clone();
    servers
        .iter()
        .map(|s| {
            // The last: the history holds the earlier turns' results under the same ids.
            let m = messages
                .iter()
                .rev()
                .find(|m| m["tool_call_id"] == format!("call_{s}"))
                .unwrap_or_else(|| panic!("no result of {s}: {messages:?}"));
            let text = m["content"].as_str().unwrap();
            text.parse()
                .unwrap_or_else(|_| panic!("{s} answered {text:?}"))
        })
        .collect()
}

/// Whether a process exists and is not a zombie.
fn alive(pid: i64) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z'),
        Err(_) => false,
    }
}

/// Until process `pid` is gone (within 30 s).
async fn gone(pid: i64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while alive(pid) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "process {pid} still runs"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const TRUST_ALL: &str = "[policy]\ntrust = [\"mcp__*\"]\n";

#[tokio::test]
async fn unchanged_servers_keep_their_processes_and_changed_ones_restart() {
    let fake = FakeOpenAi::start().await;
    let servers = |chg: &str, tail: &str| {
        format!(
            "{}{}{}{tail}\n{TRUST_ALL}",
            example_server("ex", ""),
            example_server("ws", "scope = \"session\""),
            example_server("chg", chg),
        )
    };
    let server = TestServer::start(&config_text(&fake, &servers("", ""))).await;
    let sid = server.session(json!({})).await;
    let before = pids(&fake, &server, &sid, &["ex", "ws", "chg"]).await;

    // chg changes and a server is added; ex and ws move down the file, unchanged.
    let added = example_server("added", "");
    reload(
        &server,
        &config_text(
            &fake,
            &format!("\n\n{}", servers("env = { X = \"1\" }", &added)),
        ),
    )
    .await;
    let after = pids(&fake, &server, &sid, &["ex", "ws", "chg", "added"]).await;
    assert_eq!(after[0], before[0], "the shared server ex was not touched");
    assert_eq!(after[1], before[1], "the session kept its own ws process");
    assert_ne!(after[2], before[2], "chg restarted");
    gone(before[2]).await;
    assert!(alive(after[0]) && alive(after[1]));
}

#[tokio::test]
async fn a_removed_server_finishes_its_call_in_flight_then_stops() {
    let fake = FakeOpenAi::start().await;
    let both = format!(
        "{}{}{TRUST_ALL}",
        example_server("ex", ""),
        example_server("old", "")
    );
    let server = TestServer::start(&config_text(&fake, &both)).await;
    let sid = server.session(json!({})).await;
    let watcher = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let notify = watcher.local_addr().unwrap().to_string();
    fake.push(Reply::tool_calls(&[(
        "call_s",
        "mcp__old__slow",
        json!({"ms": 1500, "notify": notify}),
    )]));
    fake.push(Reply::text("done"));
    let http = server.http.clone();
    let path = format!("/sessions/{sid}/turns");
    let running = tokio::spawn(async move { http.post(&path, &user("slow")).await });
    // The call has reached the server (it sends its pid first).
    let (conn, _) = watcher.accept().await.unwrap();
    let mut line = String::new();
    tokio::io::BufReader::new(conn)
        .read_line(&mut line)
        .await
        .unwrap();
    let pid: i64 = line.trim().parse().unwrap();

    let only_ex = format!("{}{TRUST_ALL}", example_server("ex", ""));
    reload(&server, &config_text(&fake, &only_ex)).await;
    let (_, tools) = server.http.get("/tools").await;
    assert!(!tools.to_string().contains("mcp__old__"), "{tools}");
    let (status, resp) = running.await.unwrap();
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        resp["messages"][1]["content"], "slept 1500 ms",
        "the call in flight finished: {resp}"
    );
    gone(pid).await;
}

#[tokio::test]
async fn a_pending_permission_is_re_decided_under_the_reloaded_policy() {
    let fake = FakeOpenAi::start().await;
    let ask = format!(
        "{}[policy]\nask = [\"mcp__ex__echo\"]\n",
        example_server("ex", "")
    );
    let server = TestServer::start(&config_text(&fake, &ask)).await;
    let sid = server
        .session(json!({"agent": {"name": "assistant", "tools": [{"name": "mcp__ex__echo", "trust": true}]}}))
        .await;
    fake.push(Reply::tool_calls(&[(
        "call_e",
        "mcp__ex__echo",
        json!({"text": "hi"}),
    )]));
    let resp = turn(&server, &sid, user("echo it")).await;
    assert_eq!(resp["stopReason"], "tool_use", "{resp}");

    let deny = format!(
        "{}[policy]\ndeny = [\"mcp__ex__echo\"]\n",
        example_server("ex", "")
    );
    reload(&server, &config_text(&fake, &deny)).await;
    fake.push(Reply::text("it was denied"));
    let resp = turn(
        &server,
        &sid,
        json!({"messages": [{"role": "tool_permission", "toolCallId": "call_e", "granted": true}]}),
    )
    .await;
    assert_eq!(
        resp["messages"][0]["content"],
        "Tool call denied: the policy now denies mcp__ex__echo (rule mcp__ex__echo)",
        "{resp}"
    );
}

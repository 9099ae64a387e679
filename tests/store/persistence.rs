//! The log survives restarts: a graceful one, `kill -9` of the real binary, and a turn cut off
//! mid-way (closed as `worker_lost` on the next start). SIGTERM ends running turns with
//! `worker_shutdown`, which their clients see. An `Idempotency-Key` survives `kill -9`: its
//! repeat gets the first response.

use crate::common::{config_text, logcheck::check_log, Http, TestServer};
use serde_json::json;
use tokio::process::Child;
use turnstile::log::{EventBody, FailReason};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

#[tokio::test]
async fn sessions_history_and_pending_calls_survive_a_restart() {
    let fake = FakeOpenAi::start().await;
    let cfg = config_text(&fake, "");
    let server = TestServer::start(&cfg).await;
    let tool = json!({"name": "get_weather", "description": "", "parameters": {"type": "object"}});
    let sid = server.session(json!({"tools": [tool]})).await;
    fake.push(Reply::text("first answer"));
    server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "one"}]}),
        )
        .await;
    fake.push(Reply::tool_calls(&[(
        "call_7",
        "get_weather",
        json!({"city": "Rome"}),
    )]));
    let (_, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "two"}]}),
        )
        .await;
    assert_eq!(resp["stopReason"], "tool_use");
    let (_, before) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    let dir = server.stop().await;

    let server = TestServer::start_in(dir, &cfg).await;
    let (_, after) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(after, before);
    resumes_the_pending_call(&server, &fake, &sid).await;
    let (_, list) = server.http.get("/sessions").await;
    assert_eq!(list["sessions"][0]["sessionId"], sid.as_str());
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn idle_sessions_leave_memory_past_session_cache_and_come_back_whole() {
    let fake = FakeOpenAi::start().await;
    let cfg = config_text(&fake, "").replace("[server]\n", "[server]\nsession_cache = 1\n");
    let server = TestServer::start(&cfg).await;
    let turn = |sid: &str, text: &str| {
        let (path, body) = (
            format!("/sessions/{sid}/turns"),
            json!({"messages": [{"role": "user", "content": text}]}),
        );
        let http = &server.http;
        async move { http.post(&path, &body).await }
    };
    // A session whose last turn stopped on a client tool: its pending call is derived state.
    let tool = json!({"name": "get_weather", "description": "", "parameters": {"type": "object"}});
    let sid = server.session(json!({"tools": [tool]})).await;
    fake.push(Reply::text("first answer"));
    turn(&sid, "one").await;
    fake.push(Reply::tool_calls(&[(
        "call_7",
        "get_weather",
        json!({"city": "Rome"}),
    )]));
    let (_, resp) = turn(&sid, "two").await;
    assert_eq!(resp["stopReason"], "tool_use");
    server.wait_idle(&sid).await;
    let history = format!("/sessions/{sid}/history?type=full");
    let (_, before) = server.http.get(&history).await;

    // Other sessions come and go: past the cache's one idle session, the first leaves memory.
    for i in 0..4 {
        let other = server.session(json!({})).await;
        fake.push(Reply::text(&format!("answer {i}")));
        let (status, _) = turn(&other, "hello").await;
        assert_eq!(status, 200);
        server.wait_idle(&other).await;
    }
    let (cached, first_cached) = server.engine().in_memory(&sid);
    assert!(
        !first_cached && cached <= 2,
        "{cached} sessions in memory, the first among them: {first_cached}"
    );

    // Read back from the log as it was: history, pending call, tools; and it goes on from there.
    let (_, after) = server.http.get(&history).await;
    assert_eq!(after, before);
    resumes_the_pending_call(&server, &fake, &sid).await;
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn the_least_recently_used_idle_sessions_leave_memory_first() {
    let fake = FakeOpenAi::start().await;
    let cfg = config_text(&fake, "").replace("[server]\n", "[server]\nsession_cache = 10\n");
    let server = TestServer::start(&cfg).await;
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.push(server.session(json!({})).await);
    }
    // The oldest is used again; then one more session is one too many: the cache drops the
    // least recently used idle ones, down to nine.
    let (status, _) = server.http.get(&format!("/sessions/{}", ids[0])).await;
    assert_eq!(status, 200);
    ids.push(server.session(json!({})).await);
    let cached: Vec<bool> = ids
        .iter()
        .map(|id| server.engine().in_memory(id).1)
        .collect();
    let mut expected = vec![true; 11];
    expected[1] = false;
    expected[2] = false;
    assert_eq!(cached, expected);
    // A dropped one is still there, read back from the log.
    let (status, info) = server.http.get(&format!("/sessions/{}", ids[1])).await;
    assert_eq!(
        (status, info["sessionId"].as_str()),
        (200, Some(ids[1].as_str()))
    );
}

/// A session of the tests above read back from the log: still awaiting the client's answer to
/// `call_7` (get_weather) with its tools, and answering it goes on from there.
async fn resumes_the_pending_call(server: &TestServer, fake: &FakeOpenAi, sid: &str) {
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "awaiting_client", "{info}");
    assert_eq!(info["pending"][0]["toolCallId"], "call_7");
    assert_eq!(info["tools"][0]["name"], "get_weather");
    fake.push(Reply::text("Rome is 25C"));
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "tool", "toolCallId": "call_7", "content": "25C"}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["messages"][0]["content"], "Rome is 25C");
}

/// The real binary, started on a free port.
struct Proc {
    child: Child,
    http: Http,
}

async fn spawn(dir: &std::path::Path) -> Proc {
    let (child, addr) = crate::common::binary::serve(&dir.join("tools.toml")).await;
    Proc {
        child,
        http: Http::new(addr),
    }
}

fn kill9(p: &Proc) {
    let pid = p.child.id().expect("pid");
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// The session's stored events, from the store of the config in `dir` (SQLite or PostgreSQL).
async fn stored(dir: &std::path::Path, sid: &str) -> Vec<turnstile::log::Event> {
    crate::common::stores::events(&dir.join("tools.toml"), sid).await
}

#[tokio::test]
async fn a_completed_turn_survives_kill_9_and_an_unfinished_one_is_closed_as_worker_lost() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, "")).unwrap();

    let mut p = spawn(dir.path()).await;
    let (status, created) = p.http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201);
    let sid = created["sessionId"].as_str().unwrap().to_string();
    fake.push(Reply::text("durable answer"));
    let (_, resp) = p
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "keep this"}]}),
        )
        .await;
    assert_eq!(resp["stopReason"], "end_turn");
    // A second turn is mid-flight (its upstream reply held) when the process is killed, after
    // a subscriber has seen its user message (published only once durable).
    let mut events_stream = crate::common::sse_stream::get(
        &p.http.base,
        &format!("/sessions/{sid}/events/stream"),
        &[],
    )
    .await
    .ok();
    let gate = Gate::new();
    fake.push(Reply::text("never finished").hold(gate.clone()));
    let http = p.http.clone();
    let path = format!("/sessions/{sid}/turns");
    let cut = tokio::spawn(async move {
        http.request_raw(
            "POST",
            &path,
            Some(
                br#"{"stream":"delta","messages":[{"role":"user","content":"cut off"}]}"#.to_vec(),
            ),
        )
        .await
    });
    fake.wait_requests(2).await;
    events_stream
        .until(|f| f.event == "user.message" && f.json()["content"] == "cut off")
        .await;
    kill9(&p);
    let _ = p.child.wait().await;
    let _ = cut.await;

    let p = spawn(dir.path()).await;
    let (_, hist) = p
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    let full = hist["history"]["full"].as_array().unwrap();
    assert_eq!(full[0], json!({"role": "user", "content": "keep this"}));
    assert_eq!(
        full[1],
        json!({"role": "assistant", "content": "durable answer"})
    );
    // The cut-off turn began (its user message, seen by a subscriber, was durable), so the
    // restart closed it as worker_lost.
    let events = stored(dir.path(), &sid).await;
    crate::common::logcheck::check_events(&events);
    let types: Vec<&str> = events.iter().map(|e| e.body.type_name()).collect();
    assert_eq!(
        types,
        [
            "user.message",
            "agent.message",
            "turn.completed",
            "user.message",
            "turn.failed"
        ]
    );
    assert!(
        matches!(
            events[4].body,
            EventBody::TurnFailed {
                reason: FailReason::WorkerLost,
                usage: None,
                ..
            }
        ),
        "{:?}",
        events[4].body
    );
    assert_eq!(
        full.len(),
        3,
        "the cut-off user message is history; nothing else of its turn"
    );
    // The session takes new turns.
    fake.push(Reply::text("back again"));
    let (status, resp) = p
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "again"}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["messages"][0]["content"], "back again");
    gate.open();
}

/// POST a turn with an `Idempotency-Key`: the status and the body's text.
async fn post_keyed(http: &Http, sid: &str, key: &str, body: &serde_json::Value) -> (u16, String) {
    let resp = crate::common::sse_stream::open(
        &http.base,
        "POST",
        &format!("/sessions/{sid}/turns"),
        &[("idempotency-key", key)],
        Some(body),
    )
    .await;
    let status = resp.status;
    (status, resp.text().await)
}

#[tokio::test]
async fn an_idempotency_key_survives_kill_9_and_its_repeat_gets_the_first_response() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, "")).unwrap();

    let p = spawn(dir.path()).await;
    let (_, created) = p.http.post("/sessions", &json!({})).await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    fake.push(Reply::text("the first outcome"));
    let body = json!({"messages": [{"role": "user", "content": "once only"}]});
    let first = post_keyed(&p.http, &sid, "key-durable", &body).await;
    assert_eq!(first.0, 200, "{}", first.1);
    let first_json: serde_json::Value = serde_json::from_str(&first.1).unwrap();
    assert_eq!(first_json["messages"][0]["content"], "the first outcome");
    // A streamed keyed turn too: its repeat after the kill gets the same events.
    fake.push(Reply::text("the streamed outcome"));
    let streamed = json!({"stream": "message", "messages": body["messages"].clone()});
    let (_, sse_before) = post_keyed(&p.http, &sid, "key-sse", &streamed).await;
    let mut p = p;
    kill9(&p);
    let _ = p.child.wait().await;

    let p = spawn(dir.path()).await;
    let again = post_keyed(&p.http, &sid, "key-durable", &body).await;
    assert_eq!(again, first, "the same status and body after kill -9");
    let (status, sse_after) = post_keyed(&p.http, &sid, "key-sse", &streamed).await;
    assert_eq!(status, 200, "{sse_after}");
    assert_eq!(
        crate::common::parse_sse(&sse_after),
        crate::common::parse_sse(&sse_before)
    );
    assert_eq!(fake.requests().len(), 2, "no model call for the repeats");
    let events = stored(dir.path(), &sid).await;
    crate::common::logcheck::check_events(&events);
    let turns: Vec<&str> = events
        .iter()
        .filter(|e| e.body.type_name() == "user.message")
        .map(|e| e.turn_id.as_str())
        .collect();
    assert_eq!(
        turns.len(),
        2,
        "two keys, two turns, none for the repeats: {turns:?}"
    );
    assert_ne!(turns[0], turns[1]);
    // The key with another body: 422, after the restart too.
    let other = json!({"messages": [{"role": "user", "content": "something else"}]});
    let (status, text) = post_keyed(&p.http, &sid, "key-durable", &other).await;
    assert_eq!(status, 422, "{text}");
    assert_eq!(stored(dir.path(), &sid).await.len(), events.len());
}

#[tokio::test]
async fn sigterm_ends_a_running_turn_with_worker_shutdown_and_exits_0() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, "")).unwrap();
    let mut p = spawn(dir.path()).await;
    let (_, created) = p.http.post("/sessions", &json!({})).await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    let gate = Gate::new();
    fake.push(
        Reply::text("streaming when the server stops")
            .chunk_chars(4)
            .hold(gate.clone()),
    );
    let http = p.http.clone();
    let path = format!("/sessions/{sid}/turns");
    let stream = tokio::spawn(async move {
        http.post_sse(
            &path,
            &json!({"stream": "delta", "messages": [{"role": "user", "content": "go"}]}),
        )
        .await
    });
    fake.wait_requests(1).await;
    let pid = p.child.id().unwrap();
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let events = stream.await.unwrap();
    let last = events.last().unwrap();
    assert_eq!(last.event, "turn_stop");
    assert_eq!(last.data["stopReason"], "error");
    assert_eq!(last.data["error"]["reason"], "worker_shutdown");
    let status = p.child.wait().await.unwrap();
    assert!(status.success(), "exit status {status:?}");
    let events = stored(dir.path(), &sid).await;
    crate::common::logcheck::check_events(&events);
    assert!(matches!(
        events.last().unwrap().body,
        EventBody::TurnFailed {
            reason: FailReason::WorkerShutdown,
            ..
        }
    ));
    gate.open();
}

//! Accepted means durable (issue 30): a request answered `2xx` — a message queued behind a
//! running turn, a message whose turn runs at once, a streamed turn's first byte, a permission
//! answer, an upload — is in the store before the answer. The real binary is killed with
//! `kill -9` right after each answer, and what it accepted is found after the restart: carried
//! out, or ended with a terminal event that says why (`worker_lost`).

use http_body_util::BodyExt;
use serde_json::json;
use turnstile::log::{EventBody, FailReason};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

use crate::common::{config_text, Http};

/// The real binary serving `dir/tools.toml`.
struct Proc {
    child: tokio::process::Child,
    http: Http,
}

async fn spawn(dir: &std::path::Path) -> Proc {
    let (child, addr) = crate::common::binary::serve(&dir.join("tools.toml")).await;
    Proc {
        child,
        http: Http::new(addr),
    }
}

/// `kill -9` the process and wait for it to be gone.
async fn kill9(p: &mut Proc) {
    let pid = p.child.id().expect("pid");
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let _ = p.child.wait().await;
}

async fn new_session(http: &Http) -> String {
    let (status, created) = http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    created["sessionId"].as_str().expect("id").to_string()
}

/// The session's stored events, checked by the log checker.
async fn stored(dir: &std::path::Path, sid: &str) -> Vec<turnstile::log::Event> {
    let events = crate::common::stores::events(&dir.join("tools.toml"), sid).await;
    crate::common::logcheck::check_events(&events);
    events
}

/// Polls the log (through the API) until `turn_id` has ended; its terminal event's JSON.
async fn until_ended(http: &Http, sid: &str, turn_id: &str) -> serde_json::Value {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (status, v) = http
            .get(&format!("/sessions/{sid}/events/history?limit=1000"))
            .await;
        assert_eq!(status, 200, "{v}");
        let events = v["events"].as_array().expect("events").clone();
        if let Some(end) = events.iter().find(|e| {
            e["turn_id"] == turn_id
                && matches!(
                    e["type"].as_str(),
                    Some("turn.completed" | "turn.failed" | "turn.cancelled")
                )
        }) {
            return end.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "turn {turn_id} did not end: {events:#?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The `user.message` contents of the turns in the log, in order, with each turn's end.
fn turns(events: &[turnstile::log::Event]) -> Vec<(String, String, &'static str)> {
    let mut out = Vec::new();
    for e in events {
        if let EventBody::UserMessage { content, .. } = &e.body {
            let text = content
                .as_str()
                .map_or_else(|| content.to_string(), str::to_string);
            out.push((e.turn_id.to_string(), text, ""));
        }
        if e.body.is_terminal() {
            if let Some(t) = out.iter_mut().rev().find(|t| *t.0 == *e.turn_id) {
                t.2 = e.body.type_name();
            }
        }
    }
    out
}

/// A server on a fresh folder, a session whose first message's turn is held at the model, and
/// a second message queued behind it (`202`): its turn id.
async fn queued_behind_a_held_turn() -> (FakeOpenAi, tempfile::TempDir, Proc, String, Gate, String)
{
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, "")).unwrap();
    let p = spawn(dir.path()).await;
    let sid = new_session(&p.http).await;
    // The first turn is held at the model; the second message queues behind it.
    let gate = Gate::new();
    fake.push(Reply::text("never finished").hold(gate.clone()));
    let (status, first) = p
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "first"}),
        )
        .await;
    assert_eq!(status, 202, "{first}");
    fake.wait_requests(1).await;
    let (status, queued) = p
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "queued"}),
        )
        .await;
    assert_eq!(status, 202, "{queued}");
    let queued_id = queued["turn_id"].as_str().unwrap().to_string();
    (fake, dir, p, sid, gate, queued_id)
}

#[tokio::test]
async fn a_queued_message_answered_202_is_carried_out_after_kill_9() {
    let (fake, dir, mut p, sid, gate, queued_id) = queued_behind_a_held_turn().await;
    kill9(&mut p).await;

    // After the restart the queued turn runs: it was accepted, so it is carried out.
    fake.push(Reply::text("done after restart"));
    let p = spawn(dir.path()).await;
    let end = until_ended(&p.http, &sid, &queued_id).await;
    assert_eq!(end["type"], "turn.completed", "{end}");
    let events = stored(dir.path(), &sid).await;
    let t = turns(&events);
    assert_eq!(t.len(), 2, "{t:?}");
    assert_eq!(t[0].1, "first");
    assert_eq!(
        t[0].2, "turn.failed",
        "the cut-off turn is closed worker_lost"
    );
    assert_eq!(
        (t[1].0.as_str(), t[1].1.as_str(), t[1].2),
        (queued_id.as_str(), "queued", "turn.completed")
    );
    let lost = events
        .iter()
        .find(|e| matches!(e.body, EventBody::TurnFailed { .. }))
        .unwrap();
    assert!(matches!(
        lost.body,
        EventBody::TurnFailed {
            reason: FailReason::WorkerLost,
            ..
        }
    ));
    let replies: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.body {
            EventBody::AgentMessage { content, .. } => Some(content.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(replies, ["done after restart"], "the queued turn ran once");
    gate.open();
}

#[tokio::test]
async fn a_queued_turn_cancelled_before_kill_9_is_logged_cancelled_and_never_run() {
    let (fake, dir, mut p, sid, gate, queued_id) = queued_behind_a_held_turn().await;
    let (status, v) = p
        .http
        .post(
            &format!("/sessions/{sid}/cancel"),
            &json!({"turn_id": queued_id}),
        )
        .await;
    assert_eq!((status, &v["cancelled"]), (200, &json!([queued_id])), "{v}");
    // Killed right after the cancel's answer, the running turn still held at the model.
    kill9(&mut p).await;

    // After the restart the cancelled turn is logged cancelled; it never reaches the model.
    fake.push(Reply::text("must not run"));
    let p = spawn(dir.path()).await;
    let end = until_ended(&p.http, &sid, &queued_id).await;
    assert_eq!(end["type"], "turn.cancelled", "{end}");
    let events = stored(dir.path(), &sid).await;
    let t = turns(&events);
    assert_eq!(t.len(), 2, "{t:?}");
    assert_eq!((t[0].1.as_str(), t[0].2), ("first", "turn.failed"));
    assert_eq!(
        (t[1].0.as_str(), t[1].1.as_str(), t[1].2),
        (queued_id.as_str(), "queued", "turn.cancelled")
    );
    assert_eq!(
        fake.request_count(),
        1,
        "only the first turn reached the model"
    );
    assert_eq!(
        fake.pending_replies(),
        1,
        "the reply for a second call is unused"
    );
    let (_, s) = p.http.get(&format!("/sessions/{sid}")).await;
    assert!(s.get("queued").is_none(), "nothing queued: {s}");
    gate.open();
}

#[tokio::test]
async fn a_message_whose_turn_runs_at_once_is_in_the_log_when_answered_202() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, "")).unwrap();
    let mut p = spawn(dir.path()).await;
    let sid = new_session(&p.http).await;
    let gate = Gate::new();
    fake.push(Reply::text("never finished").hold(gate.clone()));
    let (status, v) = p
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "at once"}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    let turn_id = v["turn_id"].as_str().unwrap().to_string();
    // Killed right after the answer: not a millisecond for a timer to commit it.
    kill9(&mut p).await;

    let p = spawn(dir.path()).await;
    let end = until_ended(&p.http, &sid, &turn_id).await;
    assert_eq!(end["type"], "turn.failed", "{end}");
    assert_eq!(end["reason"], "worker_lost", "{end}");
    let t = turns(&stored(dir.path(), &sid).await);
    assert_eq!(t, [(turn_id, "at once".to_string(), "turn.failed")]);
    gate.open();
}

#[tokio::test]
async fn a_streamed_turn_is_in_the_log_before_its_first_byte() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, "")).unwrap();
    let mut p = spawn(dir.path()).await;
    let sid = new_session(&p.http).await;
    let gate = Gate::new();
    fake.push(Reply::text("never finished").hold(gate.clone()));
    // Killed as soon as the response's head has arrived: its first byte.
    let stream = crate::common::sse_stream::open(
        &p.http.base,
        "POST",
        &format!("/sessions/{sid}/turns"),
        &[],
        Some(&json!({"stream": "delta", "messages": [{"role": "user", "content": "streamed"}]})),
    )
    .await
    .ok();
    kill9(&mut p).await;
    drop(stream);

    let p = spawn(dir.path()).await;
    let events = stored(dir.path(), &sid).await;
    let t = turns(&events);
    assert_eq!(t.len(), 1, "{t:?}");
    assert_eq!(t[0].1, "streamed");
    let end = until_ended(&p.http, &sid, &t[0].0).await;
    assert_eq!(end["reason"], "worker_lost", "{end}");
    gate.open();
}

/// `kill -9` as soon as the response head of a streamed permission answer has arrived: the
/// answer (its `user.message` with the `tool_permission` block) is in the log after the restart,
/// its turn ended with a reason, and the granted call ran at most once.
#[tokio::test]
async fn a_permission_answer_is_in_the_log_before_its_first_byte() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls.txt");
    let server = crate::common::mcp::example_server(
        "ex",
        &format!(
            "args = [\"--log-calls\", {:?}]",
            calls.display().to_string()
        ),
    );
    let extra = format!("{server}\n[policy]\nask = [\"mcp__ex__echo\"]\ndefault = \"ask\"\n");
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, &extra)).unwrap();
    let mut p = spawn(dir.path()).await;
    let sid = new_session(&p.http).await;
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "mcp__ex__echo",
        json!({"text": "hi"}),
    )]));
    let (status, paused) = p
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "echo hi"}]}),
        )
        .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["stopReason"], "tool_use", "{paused}");
    // The grant's turn runs the call, then waits on the model: held.
    let gate = Gate::new();
    fake.push(Reply::text("never finished").hold(gate.clone()));
    let answer = json!({"stream": "delta", "messages": [
        {"role": "tool_permission", "toolCallId": "call_1", "granted": true}
    ]});
    let stream = crate::common::sse_stream::open(
        &p.http.base,
        "POST",
        &format!("/sessions/{sid}/turns"),
        &[],
        Some(&answer),
    )
    .await
    .ok();
    kill9(&mut p).await;
    drop(stream);

    let p = spawn(dir.path()).await;
    let events = stored(dir.path(), &sid).await;
    let answered = events
        .iter()
        .find(|e| {
            matches!(&e.body, EventBody::UserMessage { content, .. }
            if content[0]["type"] == "tool_permission" && content[0]["granted"] == true)
        })
        .unwrap_or_else(|| panic!("the permission answer is in the log: {events:#?}"));
    let end = until_ended(&p.http, &sid, &answered.turn_id).await;
    assert!(
        end["type"] == "turn.completed" || end["reason"] == "worker_lost",
        "{end}"
    );
    let ran = std::fs::read_to_string(&calls).unwrap_or_default();
    assert!(
        ran.lines().count() <= 1,
        "the granted call ran at most once: {ran}"
    );
    gate.open();
}

/// An upload answered `201` is downloadable after `kill -9`; one cut off mid-body left no
/// record and the server takes uploads again.
#[tokio::test]
async fn an_upload_answered_201_survives_kill_9_and_one_cut_off_leaves_nothing() {
    use tokio::io::AsyncWriteExt;
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, "")).unwrap();
    let mut p = spawn(dir.path()).await;
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let resp = p
        .http
        .request_raw("POST", "/files?filename=kept.bin", Some(body.clone()))
        .await;
    assert_eq!(resp.status(), 201);
    let v = body_json(resp).await;
    let kept = v["id"].as_str().expect("a file id").to_string();
    // A second upload sends half its body, then the process is killed.
    let addr = p.http.base.trim_start_matches("http://").to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let head = format!(
        "POST /files?filename=cut.bin HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    conn.write_all(&body[..body.len() / 2]).await.unwrap();
    conn.flush().await.unwrap();
    kill9(&mut p).await;
    drop(conn);

    let p = spawn(dir.path()).await;
    let resp = p
        .http
        .request_raw("GET", &format!("/files/{kept}/content"), None)
        .await;
    assert_eq!(resp.status(), 200);
    let got = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(got.as_ref(), &body[..], "the accepted upload is whole");
    let store = crate::common::stores::open(&dir.path().join("tools.toml"));
    let usage = store.file_usage_of(None, 0).await.unwrap();
    assert_eq!(usage.files, 1, "the cut-off upload left no record");
    let resp = p
        .http
        .request_raw("POST", "/files?filename=again.bin", Some(body))
        .await;
    assert_eq!(resp.status(), 201);
}

async fn body_json(resp: hyper::Response<hyper::body::Incoming>) -> serde_json::Value {
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

/// `[server] drain_s`: on SIGTERM a running turn goes on to its end (its stream gets
/// `turn.completed`, not `worker_shutdown`), a message queued behind it does not start (its row
/// stays) and runs after the restart, and the process exits 0.
#[tokio::test]
async fn sigterm_with_drain_s_lets_the_running_turn_finish_and_keeps_the_queued_one() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = config_text(&fake, "").replace("[server]\n", "[server]\ndrain_s = 30\n");
    std::fs::write(dir.path().join("tools.toml"), config).unwrap();
    let mut p = spawn(dir.path()).await;
    let sid = new_session(&p.http).await;
    let gate = Gate::new();
    fake.push(Reply::text("finished while draining").hold(gate.clone()));
    let http = p.http.clone();
    let path = format!("/sessions/{sid}/turns");
    let stream = tokio::spawn(async move {
        http.post_sse(
            &path,
            &json!({"stream": "message", "messages": [{"role": "user", "content": "go"}]}),
        )
        .await
    });
    fake.wait_requests(1).await;
    let (status, queued) = p
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "later"}),
        )
        .await;
    assert_eq!(status, 202, "{queued}");
    let queued_id = queued["turn_id"].as_str().unwrap().to_string();
    let pid = p.child.id().expect("pid");
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    // Once the listener is closed no turn starts any more: the held one is let go then.
    let addr = p.http.base.trim_start_matches("http://").to_string();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tokio::net::TcpStream::connect(&addr).await.is_ok() {
        assert!(
            std::time::Instant::now() < deadline,
            "the listener stayed open"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    gate.open();
    let frames = stream.await.unwrap();
    let last = frames.last().expect("frames");
    assert_eq!(last.event, "turn_stop", "{frames:?}");
    assert_eq!(last.data["stopReason"], "end_turn", "{:?}", last.data);
    let status = p.child.wait().await.unwrap();
    assert!(status.success(), "exit status {status:?}");
    let t = turns(&stored(dir.path(), &sid).await);
    assert_eq!(
        t.len(),
        1,
        "the queued turn did not start during the drain: {t:?}"
    );
    assert_eq!(t[0].2, "turn.completed");

    fake.push(Reply::text("after the restart"));
    let p = spawn(dir.path()).await;
    let end = until_ended(&p.http, &sid, &queued_id).await;
    assert_eq!(end["type"], "turn.completed", "{end}");
}

/// `kill -9` while a granted call runs: after the restart the answering turn is closed
/// `worker_lost` with the call it was answering cancelled (`Cancelled.`), so that the history
/// never holds a call without its answer, and the session's next turn runs (found by the chaos
/// test: the model was sent the call unanswered, and refused every later turn with a 400).
#[tokio::test]
async fn a_granted_call_cut_by_kill_9_is_answered_cancelled_and_the_session_goes_on() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let calls = dir.path().join("calls.txt");
    let server = crate::common::mcp::example_server(
        "ex",
        &format!(
            "args = [\"--log-calls\", {:?}]",
            calls.display().to_string()
        ),
    );
    let extra = format!("{server}\n[policy]\nask = [\"mcp__ex__slow\"]\ndefault = \"ask\"\n");
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, &extra)).unwrap();
    let mut p = spawn(dir.path()).await;
    let sid = new_session(&p.http).await;
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "mcp__ex__slow",
        json!({"ms": 30000}),
    )]));
    let (status, paused) = p
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "go slowly"}]}),
        )
        .await;
    assert_eq!(status, 200, "{paused}");
    assert_eq!(paused["stopReason"], "tool_use", "{paused}");
    let answer = json!({"stream": "delta", "messages": [
        {"role": "tool_permission", "toolCallId": "call_1", "granted": true}
    ]});
    let stream = crate::common::sse_stream::open(
        &p.http.base,
        "POST",
        &format!("/sessions/{sid}/turns"),
        &[],
        Some(&answer),
    )
    .await
    .ok();
    // Killed once the call has reached the server (it runs for 30 s).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(&calls)
        .unwrap_or_default()
        .is_empty()
    {
        assert!(std::time::Instant::now() < deadline, "the call never ran");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    kill9(&mut p).await;
    drop(stream);

    let p = spawn(dir.path()).await;
    fake.push(Reply::text("going on"));
    let (status, next) = p
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "next"}]}),
        )
        .await;
    assert_eq!(status, 200, "{next}");
    assert_eq!(next["stopReason"], "end_turn", "{next}");
    let events = stored(dir.path(), &sid).await;
    let cancelled = events.iter().any(|e| {
        matches!(&e.body, EventBody::ToolResult { tool_use_id, content, .. }
            if tool_use_id == "call_1" && content == "Cancelled.")
    });
    assert!(cancelled, "the cut call is answered: {events:#?}");
    let t = turns(&events);
    assert_eq!(t.len(), 3, "{t:?}");
    assert_eq!(t[1].2, "turn.failed", "{t:?}");
    assert_eq!(t[2].2, "turn.completed", "{t:?}");
}

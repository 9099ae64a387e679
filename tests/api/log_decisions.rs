//! Every decision in the log, and the spec's exact rules (issue 17): plan decisions are turns of
//! their own, a message sent while calls are open answers them first, a tool past its timeout is
//! `Cancelled.`, `usage` is null until a model call answers, `turn_timeout_s` wraps up, unknown
//! history types are 404, denied tools do not block client tool names. Every test runs the log
//! checker and the request checker (no model request carries a call without its answer).

use std::time::{Duration, Instant};

use crate::common::mcp::example_server;
use crate::common::requestcheck::check_requests;
use crate::common::sse_stream::{Frame, SseStream};
use crate::common::{config_text, logcheck::check_log, setup, TestServer};
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

const POLICY: &str = r#"
[policy]
trust = ["mcp__ex__add", "mcp__ex__slow"]
deny = ["mcp__ex__write_file"]
default = "ask"
"#;

/// The example server `ex` (with `server_extra` in its table) under [`POLICY`], then `extra`.
async fn with_example_server(server_extra: &str, extra: &str) -> (FakeOpenAi, TestServer) {
    setup(&format!(
        "{}\n{POLICY}\n{extra}",
        example_server("ex", server_extra)
    ))
    .await
}

/// Both checkers: the session's log, and every request the fake upstream received.
async fn check_all(fake: &FakeOpenAi, server: &TestServer, sid: &str) -> Vec<Value> {
    check_requests(&fake.requests());
    check_log(server.engine().store(), sid)
        .await
        .iter()
        .map(|e| serde_json::from_str(&e.json).unwrap())
        .collect()
}

async fn send(server: &TestServer, sid: &str, text: &str) -> String {
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({ "content": text }),
        )
        .await;
    assert_eq!(status, 202, "POST messages: {v}");
    v["turn_id"].as_str().expect("turn_id").to_string()
}

async fn events(server: &TestServer, sid: &str) -> Vec<Value> {
    let (status, v) = server
        .http
        .get(&format!("/sessions/{sid}/events/history?limit=1000"))
        .await;
    assert_eq!(status, 200, "{v}");
    v["events"].as_array().unwrap().clone()
}

/// Poll the event history until `turn_id` has its terminal event; that event.
async fn terminal(server: &TestServer, sid: &str, turn_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let found = events(server, sid).await.into_iter().find(|e| {
            e["turn_id"] == turn_id
                && matches!(
                    e["type"].as_str(),
                    Some("turn.completed" | "turn.failed" | "turn.cancelled")
                )
        });
        if let Some(e) = found {
            return e;
        }
        assert!(Instant::now() < deadline, "turn {turn_id} never ended");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Poll the session until `f` holds of it.
async fn session_until(server: &TestServer, sid: &str, f: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
        if f(&info) {
            return info;
        }
        assert!(Instant::now() < deadline, "session never got there: {info}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn run_events(server: &TestServer, sid: &str) -> SseStream {
    crate::common::sse_stream::get(&server.http.base, &format!("/sessions/{sid}/events"), &[])
        .await
        .ok()
}

fn whole(frames: &[Frame]) -> Vec<(String, Value)> {
    frames
        .iter()
        .filter(|f| f.event != "partial_message")
        .map(|f| (f.event.clone(), f.json()))
        .collect()
}

fn texts(req: &Value) -> String {
    req["messages"].to_string()
}

#[tokio::test]
async fn plan_decisions_are_turns_that_history_streams_and_a_restart_show() {
    let fake = FakeOpenAi::start().await;
    let config = config_text(&fake, "");
    let server = TestServer::start(&config).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::text("1. Guess.\n2. Say it."));
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/run"),
            &json!({"goal": "add 2 and 3", "plan": true}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    let plan_turn = v["turn_id"].as_str().unwrap().to_string();
    // The plan's turn ends with its plan: turn.completed, end_turn; the plan waits.
    let end = terminal(&server, &sid, &plan_turn).await;
    assert_eq!(end["type"], "turn.completed", "{end}");
    assert_eq!(end["stop_reason"], "end_turn", "{end}");
    let info = session_until(&server, &sid, |i| i["status"] == "plan_pending_approval").await;
    assert_eq!(info["pending_plan"], "1. Guess.\n2. Say it.");

    // A restart while the plan waits: it still waits, rebuilt from the log.
    let dir = server.stop().await;
    let server = TestServer::start_in(dir, &config).await;
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "plan_pending_approval", "{info}");
    assert_eq!(info["pending_plan"], "1. Guess.\n2. Say it.");

    // Rejected: a new turn carries the decision; the reason is in the next plan call.
    fake.push(Reply::text("1. Call add.\n2. Report."));
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/plan/reject"),
            &json!({"reason": "no guessing"}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let reject_turn = v["turn_id"].as_str().unwrap().to_string();
    assert_ne!(reject_turn, plan_turn);
    terminal(&server, &sid, &reject_turn).await;
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    assert!(reqs[1]["tools"].as_array().is_none_or(|t| t.is_empty()));
    assert!(texts(&reqs[1]).contains("no guessing"), "{}", reqs[1]);
    session_until(&server, &sid, |i| {
        i["pending_plan"] == "1. Call add.\n2. Report."
    })
    .await;

    // Confirmed with edits: the edit replaces the proposed plan in the model's context.
    fake.push(Reply::text("Done: 5."));
    let edited = "1. Add 2 and 3 in your head.\n2. Answer in one line.";
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/plan/confirm"),
            &json!({ "edits": edited }),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let confirm_turn = v["turn_id"].as_str().unwrap().to_string();
    let end = terminal(&server, &sid, &confirm_turn).await;
    assert_eq!(end["stop_reason"], "end_turn", "{end}");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 3);
    let sent = texts(&reqs[2]);
    assert!(sent.contains("Answer in one line."), "{sent}");
    assert!(
        !sent.contains("1. Call add.\\n2. Report."),
        "the proposed plan is replaced by the edit: {sent}"
    );
    // Nothing waits any more.
    let (status, _) = server
        .http
        .post(&format!("/sessions/{sid}/plan/confirm"), &json!({}))
        .await;
    assert_eq!(status, 409);

    // The event log: the decisions are the user messages of their turns.
    let evs = events(&server, &sid).await;
    let users: Vec<&Value> = evs.iter().filter(|e| e["type"] == "user.message").collect();
    assert_eq!(users.len(), 3, "{evs:?}");
    assert_eq!(
        users[1]["content"],
        json!([{"type": "plan_decision", "decision": "rejected", "reason": "no guessing"}])
    );
    assert_eq!(
        users[2]["content"],
        json!([{"type": "plan_decision", "decision": "confirmed", "edits": edited}])
    );
    assert_eq!(users[2]["turn_id"], confirm_turn);
    // AAP history shows them too.
    let (_, h) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    let h = h["history"]["full"].to_string();
    assert!(h.contains("The plan was rejected: no guessing"), "{h}");
    assert!(h.contains("The plan is approved"), "{h}");
    // The run stream's replay: one run over three turns, `done` once, at its end.
    let mut s = run_events(&server, &sid).await;
    let frames = whole(&s.until(|f| f.event == "done").await);
    let names: Vec<&str> = frames.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "plan_proposed",
            "message",
            "plan_proposed",
            "message",
            "message",
            "done"
        ]
    );
    assert_eq!(frames[1].1["role"], "user");
    assert_eq!(frames[1].1["content"][0]["decision"], "rejected");
    assert_eq!(frames[3].1["content"][0]["edits"], edited);
    assert_eq!(
        frames[5].1,
        json!({"finish_reason": "NoMoreToolCalls", "total_steps": 3})
    );
    check_all(&fake, &server, &sid).await;
}

#[tokio::test]
async fn an_interrupt_while_a_plan_waits_ends_the_run_in_the_log() {
    let fake = FakeOpenAi::start().await;
    let config = config_text(&fake, "");
    let server = TestServer::start(&config).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::text("1. Guess.\n2. Say it."));
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/run"),
            &json!({"goal": "add 2 and 3", "plan": true}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    session_until(&server, &sid, |i| i["status"] == "plan_pending_approval").await;
    let mut stream = run_events(&server, &sid).await;

    let (status, v) = server
        .http
        .post(&format!("/sessions/{sid}/interrupt"), &json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    let stopped = v["cancelled"][0]
        .as_str()
        .expect("the run's last turn")
        .to_string();
    // The run stream ends: the plan, then done (cancelled).
    let frames = whole(&stream.until(|f| f.event == "done").await);
    let (last, done) = frames.last().unwrap();
    assert_eq!(last, "done");
    assert_eq!(done["finish_reason"], "Cancelled", "{done}");
    // The log: a rejection of the plan that never ran, cancelled with no usage.
    let evs = check_all(&fake, &server, &sid).await;
    let turn: Vec<&Value> = evs.iter().filter(|e| e["turn_id"] == stopped).collect();
    assert_eq!(turn.len(), 2, "{turn:?}");
    assert_eq!(turn[0]["type"], "user.message");
    assert_eq!(turn[0]["content"][0]["type"], "plan_decision");
    assert_eq!(turn[0]["content"][0]["decision"], "rejected");
    assert_eq!(turn[1]["type"], "turn.cancelled");
    assert_eq!(turn[1]["usage"], Value::Null);
    assert_eq!(fake.requests().len(), 1, "the interrupt calls no model");
    // Nothing waits any more, before and after a restart; a late confirmation is refused.
    async fn nothing_waits(server: &TestServer, sid: &str) {
        let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
        assert_eq!(info["status"], "idle", "{info}");
        assert!(info.get("pending_plan").is_none(), "{info}");
        let (status, _) = server
            .http
            .post(&format!("/sessions/{sid}/plan/confirm"), &json!({}))
            .await;
        assert_eq!(status, 409);
    }
    nothing_waits(&server, &sid).await;
    let server = TestServer::start_in(server.stop().await, &config).await;
    nothing_waits(&server, &sid).await;
}

#[tokio::test]
async fn a_message_queued_behind_a_tool_use_stop_answers_the_open_calls_first() {
    let (fake, server) = setup("").await;
    let sid = server
        .session(
            json!({"tools": [{"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}),
        )
        .await;
    // An AAP turn whose model call waits; a message is queued behind it.
    let gate = Gate::new();
    fake.push(
        Reply::tool_calls(&[("call_w", "get_weather", json!({"city": "Oslo"}))]).hold(gate.clone()),
    );
    fake.push(Reply::text("Let us talk about something else."));
    let http = server.http.clone();
    let path = format!("/sessions/{sid}/turns");
    let aap = tokio::spawn(async move {
        http.post(
            &path,
            &json!({"messages": [{"role": "user", "content": "weather?"}]}),
        )
        .await
    });
    fake.wait_requests(1).await;
    let queued = send(&server, &sid, "never mind").await;
    gate.open();
    let (status, resp) = aap.await.unwrap();
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["stopReason"], "tool_use", "{resp}");
    let end = terminal(&server, &sid, &queued).await;
    assert_eq!(end["stop_reason"], "end_turn", "{end}");
    let evs = events(&server, &sid).await;
    let turn: Vec<&Value> = evs.iter().filter(|e| e["turn_id"] == queued).collect();
    assert_eq!(turn[0]["type"], "user.message");
    assert_eq!(turn[1]["type"], "agent.tool_result");
    assert_eq!(turn[1]["tool_use_id"], "call_w");
    assert_eq!(
        turn[1]["content"],
        "Not answered: the session went on with a new message."
    );
    assert_eq!(turn[1]["is_error"], true);
    // The model saw the call answered before the new message.
    let reqs = fake.requests();
    let msgs = reqs[1]["messages"].as_array().unwrap();
    let roles: Vec<&str> = msgs.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(
        roles[roles.len() - 3..],
        ["assistant", "tool", "user"],
        "{roles:?}"
    );

    // Sent after the stop: the same. And an AAP user message while calls are open stays 409.
    fake.push(Reply::tool_calls(&[(
        "call_x",
        "get_weather",
        json!({"city": "Rome"}),
    )]));
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "and Rome?"}]}),
        )
        .await;
    assert_eq!(
        (status, resp["stopReason"].as_str()),
        (200, Some("tool_use"))
    );
    let (status, _) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "hello?"}]}),
        )
        .await;
    assert_eq!(status, 409);
    fake.push(Reply::text("Fine."));
    let after = send(&server, &sid, "forget it").await;
    terminal(&server, &sid, &after).await;
    let evs = events(&server, &sid).await;
    let results: Vec<&Value> = evs
        .iter()
        .filter(|e| e["turn_id"] == after && e["type"] == "agent.tool_result")
        .collect();
    assert_eq!(results.len(), 1);
    assert_eq!(results[0]["tool_use_id"], "call_x");
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "idle", "{info}");
    check_all(&fake, &server, &sid).await;
}

#[tokio::test]
async fn a_queued_message_cancelled_before_it_ran_leaves_the_open_calls_open_across_a_restart() {
    let fake = FakeOpenAi::start().await;
    let config = config_text(&fake, "");
    let server = TestServer::start(&config).await;
    let sid = server
        .session(
            json!({"tools": [{"name": "get_weather", "description": "Weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]}),
        )
        .await;
    let gate = Gate::new();
    fake.push(
        Reply::tool_calls(&[("call_w", "get_weather", json!({"city": "Oslo"}))]).hold(gate.clone()),
    );
    let http = server.http.clone();
    let path = format!("/sessions/{sid}/turns");
    let aap = tokio::spawn(async move {
        http.post(
            &path,
            &json!({"messages": [{"role": "user", "content": "weather?"}]}),
        )
        .await
    });
    fake.wait_requests(1).await;
    // A message queued behind the turn, cancelled before it starts.
    let queued = send(&server, &sid, "never mind").await;
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/cancel"),
            &json!({ "turn_id": queued }),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    gate.open();
    let (status, resp) = aap.await.unwrap();
    assert_eq!(
        (status, resp["stopReason"].as_str()),
        (200, Some("tool_use")),
        "{resp}"
    );
    let end = terminal(&server, &sid, &queued).await;
    assert_eq!(end["type"], "turn.cancelled", "{end}");
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["pending"][0]["toolCallId"], "call_w", "{info}");

    // Rebuilt from the log, the call is still open, and the client can still answer it.
    let dir = server.stop().await;
    let server = TestServer::start_in(dir, &config).await;
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["pending"][0]["toolCallId"], "call_w", "{info}");
    fake.push(Reply::text("Oslo: 4C."));
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "tool", "toolCallId": "call_w", "content": "4C"}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["stopReason"], "end_turn", "{resp}");
    let evs = check_all(&fake, &server, &sid).await;
    let results: Vec<&Value> = evs
        .iter()
        .filter(|e| e["type"] == "agent.tool_result" && e["tool_use_id"] == "call_w")
        .collect();
    assert_eq!(results.len(), 1, "{evs:?}");
    assert_eq!(results[0]["content"], "4C");
}

#[tokio::test]
async fn a_tool_past_its_timeout_is_cancelled_and_the_reason_stays_out_of_the_content() {
    let (fake, server) = with_example_server("timeout_s = 1", "").await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::tool_calls(&[(
        "call_s",
        "mcp__ex__slow",
        json!({"ms": 3000}),
    )]));
    fake.push(Reply::text("It was too slow."));
    let t = send(&server, &sid, "wait").await;
    terminal(&server, &sid, &t).await;
    let evs = check_all(&fake, &server, &sid).await;
    let result = evs
        .iter()
        .find(|e| e["type"] == "agent.tool_result")
        .unwrap();
    assert_eq!(result["content"], "Cancelled.", "{result}");
    assert_eq!(result["is_error"], true);
}

#[tokio::test]
async fn usage_is_null_when_no_model_call_answered() {
    let (fake, server) = setup("").await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::status(
        400,
        json!({"error": {"message": "bad request"}}),
    ));
    let t = send(&server, &sid, "hi").await;
    let end = terminal(&server, &sid, &t).await;
    assert_eq!(end["type"], "turn.failed");
    assert_eq!(end["usage"], Value::Null, "{end}");
    // Cancelled while its first call runs.
    let gate = Gate::new();
    fake.push(Reply::text("late").hold(gate.clone()));
    let t = send(&server, &sid, "slow").await;
    fake.wait_requests(2).await;
    let (status, _) = server
        .http
        .post(&format!("/sessions/{sid}/cancel"), &json!({}))
        .await;
    assert_eq!(status, 200);
    let end = terminal(&server, &sid, &t).await;
    assert_eq!(end["type"], "turn.cancelled");
    assert_eq!(end["usage"], Value::Null, "{end}");
    // Once a call answered, its usage is reported.
    fake.push(Reply::text("").usage(7, 0));
    let t = send(&server, &sid, "say nothing").await;
    let end = terminal(&server, &sid, &t).await;
    assert_eq!(end["reason"], "empty_output");
    assert_eq!(end["usage"], json!({"input_tokens": 7, "output_tokens": 0}));
    gate.open();
    check_all(&fake, &server, &sid).await;
}

#[tokio::test]
async fn turn_timeout_wraps_up_with_one_last_call_without_tools() {
    let (fake, server) = with_example_server(
        "",
        "[agents.assistant]\nturn_timeout_s = 1\nwrap_up_s = 5\n",
    )
    .await;
    let sid = server.session(json!({})).await;
    // The model calls a tool that outlives the turn.
    fake.push(Reply::tool_calls(&[(
        "call_s",
        "mcp__ex__slow",
        json!({"ms": 10000}),
    )]));
    fake.push(Reply::text("Time is up: the slow step did not finish."));
    let t = send(&server, &sid, "do the slow thing").await;
    let end = terminal(&server, &sid, &t).await;
    assert_eq!(end["type"], "turn.completed", "{end}");
    assert_eq!(end["stop_reason"], "end_turn");
    let evs = events(&server, &sid).await;
    let result = evs
        .iter()
        .find(|e| e["type"] == "agent.tool_result")
        .unwrap();
    assert_eq!(result["content"], "Cancelled.");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    assert!(
        reqs[1]["tools"].as_array().is_none_or(|t| t.is_empty()),
        "the wrap-up call offers no tools: {}",
        reqs[1]
    );
    assert!(texts(&reqs[1]).contains("Do not call tools"), "{}", reqs[1]);

    // A wrap-up call that fails: then the turn fails `timeout`.
    let gate = Gate::new();
    fake.push(Reply::text("never").hold(gate.clone()));
    fake.push(Reply::status(400, json!({"error": {"message": "no"}})));
    let t = send(&server, &sid, "again").await;
    let end = terminal(&server, &sid, &t).await;
    assert_eq!(end["type"], "turn.failed", "{end}");
    assert_eq!(end["reason"], "timeout", "{end}");
    gate.open();
    check_all(&fake, &server, &sid).await;
}

#[tokio::test]
async fn history_of_an_undeclared_type_is_404() {
    let (_fake, server) = setup("").await;
    let sid = server.session(json!({})).await;
    let (status, v) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=everything"))
        .await;
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error"]["type"], "not_found");
    let (status, _) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn a_client_tool_may_take_the_name_of_a_denied_tool_but_not_of_an_exposed_one() {
    let (_fake, server) = with_example_server("", "").await;
    let tool = |name: &str| json!({"tools": [{"name": name, "description": "d", "parameters": {"type": "object"}}]});
    let (status, v) = server
        .http
        .post("/sessions", &tool("mcp__ex__write_file"))
        .await;
    assert_eq!(status, 201, "a denied tool is not in /meta: {v}");
    let (status, v) = server.http.post("/sessions", &tool("mcp__ex__add")).await;
    assert_eq!(status, 400, "{v}");
}

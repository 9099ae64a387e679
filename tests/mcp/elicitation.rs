//! MCP elicitation through an AAP client: a real child MCP server (the official Python SDK,
//! tests/mcp_elicitation/server.py) whose tool asks its client a question mid-call and returns
//! what it got. The question reaches an AAP client that declared the agent's `elicitation_tool`
//! as a call of that tool; its tool result is the answer, validated against the requested schema;
//! where no one can be asked (a run, `POST /messages`) it is declined with a logged reason; a
//! question that waits across a restart is ended with its reason, and the log stays well formed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::common::logcheck::check_log;
use crate::common::tracing_capture::log_lines;
use crate::common::{config_text, TestServer};
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// The logged lines that mention `needle`.
fn logged(needle: &str) -> Vec<String> {
    let buf = log_lines();
    let text = String::from_utf8_lossy(&buf.lock().unwrap()).to_string();
    text.lines()
        .filter(|l| l.contains(needle))
        .map(String::from)
        .collect()
}

/// The server `asker` (the SDK's server script, on the test venv's Python) trusted, with
/// `extra` config after it.
fn config(fake: &FakeOpenAi, extra: &str) -> String {
    let python = crate::common::provision::python();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_elicitation/server.py");
    let _ = log_lines();
    config_text(
        fake,
        &format!(
            "{extra}\n[mcp_servers.asker]\ncommand = {:?}\nargs = [{:?}]\ntimeout_s = 2\n\n[policy]\ntrust = [\"mcp__asker__*\"]\n",
            python.display().to_string(),
            script.display().to_string()
        ),
    )
}

/// The client tool that carries MCP servers' questions (the agent's default name).
fn elicitation_tool() -> Value {
    json!({"name": "elicitation", "description": "asks the user an MCP server's question",
           "parameters": {"type": "object"}})
}

async fn post(server: &TestServer, sid: &str, body: Value) -> (u16, Value) {
    tokio::time::timeout(
        Duration::from_secs(60),
        server.http.post(&format!("/sessions/{sid}/turns"), &body),
    )
    .await
    .expect("the turn did not answer within 60 s")
}

/// Start a session whose model calls `mcp__asker__ask`; the turn stops on the question. The
/// session and the elicitation call (`tool_use` block).
async fn asked(fake: &FakeOpenAi, server: &TestServer) -> (String, Value) {
    let sid = server.session(json!({"tools": [elicitation_tool()]})).await;
    fake.push(Reply::tool_calls(&[(
        "call_ask",
        "mcp__asker__ask",
        json!({}),
    )]));
    let (status, r) = post(
        server,
        &sid,
        json!({"messages": [{"role": "user", "content": "who am I?"}]}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stopReason"], "tool_use", "{r}");
    (sid, question_in(&r))
}

/// The elicitation call (`tool_use` block) a turn's response stopped on.
fn question_in(r: &Value) -> Value {
    r["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .find(|b| b["type"] == "tool_use" && b["name"] == "elicitation")
        .unwrap_or_else(|| panic!("no elicitation call: {r}"))
}

/// Answer the question `q` with `answer` (sent as the tool result's text).
async fn answer(server: &TestServer, sid: &str, q: &Value, answer: Value) -> (u16, Value) {
    let msg = json!({"role": "tool", "toolCallId": q["toolCallId"], "content": answer.to_string()});
    post(server, sid, json!({"messages": [msg]})).await
}

/// Every event of the session's log.
async fn events(server: &TestServer, sid: &str) -> Vec<Value> {
    let (status, v) = server
        .http
        .get(&format!("/sessions/{sid}/events/history?limit=1000"))
        .await;
    assert_eq!(status, 200, "{v}");
    v["events"].as_array().unwrap().clone()
}

/// The result of each call (its text, and whether it is an error), by call id.
async fn results(server: &TestServer, sid: &str) -> HashMap<String, (String, bool)> {
    events(server, sid)
        .await
        .into_iter()
        .filter(|e| e["type"] == "agent.tool_result")
        .map(|e| {
            let text = match &e["content"] {
                Value::String(s) => s.clone(),
                other => other
                    .as_array()
                    .and_then(|b| b.first())
                    .and_then(|b| b["text"].as_str())
                    .map_or_else(|| other.to_string(), String::from),
            };
            let id = e["tool_use_id"].as_str().unwrap().to_string();
            (id, (text, e["is_error"].as_bool().unwrap_or(false)))
        })
        .collect()
}

/// What the child's tool returned: `{"action", "content"}`.
async fn child_got(server: &TestServer, sid: &str) -> Value {
    let r = results(server, sid).await;
    let (text, is_error) = &r["call_ask"];
    assert!(!is_error, "{text}");
    serde_json::from_str(text).unwrap_or_else(|_| panic!("not the child's JSON: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aap_client_answers_a_servers_question_validated_against_its_schema() {
    let fake = FakeOpenAi::start().await;
    fake.record_requests(true);
    let server = TestServer::start(&config(&fake, "")).await;
    let (sid, q) = asked(&fake, &server).await;
    let input = &q["input"];
    assert_eq!(input["server"], "asker", "{q}");
    assert_eq!(input["toolCallId"], "call_ask", "{q}");
    assert_eq!(input["message"], "Who are you?", "{q}");
    let schema = &input["requestedSchema"];
    assert_eq!(schema["properties"]["email"]["type"], "string", "{q}");
    assert_eq!(schema["properties"]["age"]["default"], 30, "{q}");
    assert!(schema["required"].to_string().contains("email"), "{schema}");
    // The elicitation tool is a channel, not a tool of the model.
    let offered = fake.requests()[0]["tools"].to_string();
    assert!(offered.contains("mcp__asker__ask"), "{offered}");
    assert!(!offered.contains("\"elicitation\""), "{offered}");
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "awaiting_client", "{info}");
    assert_eq!(info["pending"][0]["toolCallId"], q["toolCallId"], "{info}");

    // Answers that do not fit the schema: 400 naming the field; the question still waits.
    let bad = json!({"action": "accept", "content": {"email": "ada@example.com", "age": "old"}});
    let (status, err) = answer(&server, &sid, &q, bad).await;
    assert_eq!(status, 400, "{err}");
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(msg.contains("age: expected a integer"), "{msg}");
    let (status, err) = answer(
        &server,
        &sid,
        &q,
        json!({"action": "accept", "content": {}}),
    )
    .await;
    assert_eq!(status, 400, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("email: required"),
        "{err}"
    );
    let (status, err) = answer(&server, &sid, &q, json!({"action": "maybe"})).await;
    assert_eq!(status, 400, "{err}");
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["pending"][0]["toolCallId"], q["toolCallId"], "{info}");

    // A person takes longer than the call's timeout_s (2 s) to answer: the timeout is paused
    // while the question waits. (A deliberate delay past the timeout, not a synchronisation.)
    tokio::time::sleep(Duration::from_millis(2500)).await;
    fake.push(Reply::text("You are Ada."));
    let good =
        json!({"action": "accept", "content": {"email": "ada@example.com", "color": "blue"}});
    let (status, r) = answer(&server, &sid, &q, good.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stopReason"], "end_turn", "{r}");
    // The server got the answer with the schema's defaults for what it left out.
    assert_eq!(
        child_got(&server, &sid).await,
        json!({"action": "accept", "content": {"email": "ada@example.com", "age": 30, "color": "blue", "subscribe": true}})
    );
    // The question and the answer are in the log.
    let evs = events(&server, &sid).await;
    let qid = q["toolCallId"].as_str().unwrap();
    assert!(
        evs.iter().any(|e| e["type"] == "agent.tool_use"
            && e["tool_use_id"] == qid
            && e["name"] == "elicitation"
            && e["input"]["message"] == "Who are you?"),
        "no question in the log"
    );
    let answered = evs
        .iter()
        .find(|e| e["type"] == "user.message" && e["content"][0]["tool_use_id"] == qid)
        .expect("the answer's user.message");
    assert_eq!(answered["content"][0]["content"], good.to_string());
    assert_eq!(results(&server, &sid).await[qid].0, good.to_string());
    // The model never sees the channel: its next request has the call's result only.
    let second = fake.requests()[1].to_string();
    assert!(second.contains("ada@example.com"), "{second}");
    assert!(!second.contains(qid), "{second}");
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "idle", "{info}");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_declined_or_cancelled_by_the_client_reaches_the_server_so() {
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&config(&fake, "")).await;
    for action in ["decline", "cancel"] {
        let (sid, q) = asked(&fake, &server).await;
        fake.push(Reply::text("ok"));
        let (status, r) = answer(&server, &sid, &q, json!({"action": action})).await;
        assert_eq!(status, 200, "{r}");
        assert_eq!(
            child_got(&server, &sid).await,
            json!({"action": action, "content": null})
        );
        check_log(server.engine().store(), &sid).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn where_no_one_can_be_asked_the_question_is_declined_with_a_logged_reason() {
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&config(&fake, "")).await;
    // A run: no client attends.
    fake.push(Reply::tool_calls(&[(
        "call_ask",
        "mcp__asker__ask",
        json!({}),
    )]));
    fake.push(Reply::text("declined"));
    let (status, r) = server
        .http
        .post("/run", &json!({"goal": "who am I?"}))
        .await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["status"], "finished", "{r}");
    let sid = r["session_id"]
        .as_str()
        .or(r["id"].as_str())
        .map(String::from);
    assert!(
        r.to_string().contains("\\\"action\\\": \\\"decline\\\""),
        "the call's result: {r}"
    );
    let why = logged("MCP elicitation declined");
    assert!(
        why.iter()
            .any(|l| l.contains("no AAP client with the agent's elicitation_tool")),
        "{why:?}"
    );
    if let Some(sid) = sid {
        check_log(server.engine().store(), &sid).await;
    }
    // `POST /messages` of a session whose client declared the tool: no client attends either.
    let sid = server.session(json!({"tools": [elicitation_tool()]})).await;
    fake.push(Reply::tool_calls(&[(
        "call_ask",
        "mcp__asker__ask",
        json!({}),
    )]));
    fake.push(Reply::text("declined"));
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "who am I?"}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    server.wait_idle(&sid).await;
    assert_eq!(
        child_got(&server, &sid).await,
        json!({"action": "decline", "content": null})
    );
    assert!(
        logged("MCP elicitation declined")
            .iter()
            .any(|l| l.contains(&sid)),
        "the reason names the session"
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_waiting_across_a_restart_is_ended_with_its_reason_logged() {
    let fake = FakeOpenAi::start().await;
    fake.record_requests(true);
    let cfg = config(&fake, "");
    let server = TestServer::start(&cfg).await;
    let (sid, q) = asked(&fake, &server).await;
    let qid = q["toolCallId"].as_str().unwrap().to_string();
    let dir = server.stop().await;
    let server = TestServer::start_in(dir, &cfg).await;
    // The first request that takes the session settles the calls.
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "idle", "{info}");
    assert_eq!(info["pending"], json!([]), "{info}");
    let r = results(&server, &sid).await;
    assert_eq!(r["call_ask"], ("Cancelled.".to_string(), true));
    assert!(
        r[&qid].0.contains("restarted") && r[&qid].1,
        "{:?}",
        r[&qid]
    );
    assert!(
        logged("pending calls settled")
            .iter()
            .any(|l| l.contains(&sid) && l.contains("restart")),
        "the settling is logged"
    );
    // An answer to it now is refused, naming why.
    let (status, err) = answer(&server, &sid, &q, json!({"action": "decline"})).await;
    assert_eq!(status, 409, "{err}");
    assert!(err.to_string().contains("restarted"), "{err}");
    // The session goes on.
    fake.push(Reply::text("again?"));
    let (status, r) = post(
        &server,
        &sid,
        json!({"messages": [{"role": "user", "content": "hello"}]}),
    )
    .await;
    assert_eq!(status, 200, "{r}");
    let last = fake.requests().last().unwrap().to_string();
    assert!(last.contains("Cancelled."), "{last}");
    assert!(!last.contains(&qid), "{last}");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_not_answered_within_approval_ttl_is_declined_and_its_call_ended() {
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&config(&fake, "[agents.a]\napproval_ttl_s = 1\n")).await;
    let (sid, q) = asked(&fake, &server).await;
    let qid = q["toolCallId"].as_str().unwrap().to_string();
    // Settled by the session's timer, with no request: poll for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let r = loop {
        let r = results(&server, &sid).await;
        if r.contains_key(&qid) {
            break r;
        }
        assert!(std::time::Instant::now() < deadline, "not settled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(r[&qid].0.contains("approval_ttl_s") && r[&qid].1, "{r:?}");
    assert_eq!(r["call_ask"], ("Cancelled.".to_string(), true));
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "idle", "{info}");
    check_log(server.engine().store(), &sid).await;
}

/// The config of two instances on one PostgreSQL database (the shared cluster's; with
/// `TURNSTILE_TEST_STORE=postgres`, `config` names one already): the same text for both.
fn shared_database_config(fake: &FakeOpenAi) -> String {
    let text = config(fake, "");
    if crate::common::postgres::selected() {
        return text;
    }
    text + &crate::common::postgres::shared().store_table("lease_s = 2")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_a_question_asked_on_one_instance_is_answered_through_another() {
    let fake = FakeOpenAi::start().await;
    let text = shared_database_config(&fake);
    let a = TestServer::start(&text).await;
    let b = TestServer::start(&text).await;
    // A runs the turn; its MCP call waits there on the question (A keeps the session's lease).
    let (sid, q) = asked(&fake, &a).await;
    let qid = q["toolCallId"].as_str().unwrap().to_string();

    // Through B, a bad answer gets one instance's 400 naming the field, and nothing is sent.
    let bad = json!({"action": "accept", "content": {"email": "ada@example.com", "age": "old"}});
    let (status, err) = answer(&b, &sid, &q, bad).await;
    assert_eq!(status, 400, "{err}");
    assert!(err.to_string().contains("age: expected a integer"), "{err}");
    let (status, err) = post(
        &b,
        &sid,
        json!({"messages": [{"role": "tool", "toolCallId": "call_nope", "content": "{}"}]}),
    )
    .await;
    assert!(status == 400 || status == 409, "{status} {err}");
    let (_, info) = a.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "awaiting_client", "{info}");

    // A good answer through B: the call on A gets it, and B's client attends the turn to its end.
    fake.push(Reply::text("You are Ada."));
    let good = json!({"action": "accept", "content": {"email": "ada@example.com"}});
    let (status, r) = answer(&b, &sid, &q, good.clone()).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["stopReason"], "end_turn", "{r}");
    assert!(r.to_string().contains("You are Ada."), "{r}");
    assert_eq!(
        child_got(&b, &sid).await["content"]["email"],
        "ada@example.com"
    );
    assert_eq!(results(&a, &sid).await[&qid].0, good.to_string());

    // The other way round, streamed: asked on whichever instance runs the next turn (the
    // lease went back), answered through the other one in delta mode.
    let (runner, other) = (&b, &a);
    fake.push(Reply::tool_calls(&[(
        "call_ask2",
        "mcp__asker__ask",
        json!({}),
    )]));
    let (status, r) = post(
        runner,
        &sid,
        json!({"messages": [{"role": "user", "content": "and now?"}]}),
    )
    .await;
    assert_eq!(r["stopReason"], "tool_use", "{status} {r}");
    let q2 = question_in(&r);
    fake.push(Reply::text("Still Ada."));
    let msg = json!({"role": "tool", "toolCallId": q2["toolCallId"], "content": json!({"action": "decline"}).to_string()});
    let events = other
        .http
        .post_sse(
            &format!("/sessions/{sid}/turns"),
            &json!({"stream": "delta", "messages": [msg]}),
        )
        .await;
    let n = crate::common::names(&events);
    assert_eq!(n.first(), Some(&"turn_start"), "{n:?}");
    assert_eq!(n.last(), Some(&"turn_stop"), "{n:?}");
    let text: String = events
        .iter()
        .filter(|e| e.event == "text_delta")
        .map(|e| e.data["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Still Ada.", "{events:?}");
    assert_eq!(events.last().unwrap().data["stopReason"], "end_turn");
    let got: Value = serde_json::from_str(&results(other, &sid).await["call_ask2"].0).unwrap();
    assert_eq!(got, json!({"action": "decline", "content": null}));
    check_log(a.engine().store(), &sid).await;
}

//! Anthropic thinking that survives tool loops, and prompt caching: against the fake Messages API
//! (the real streaming format, signed and redacted thinking blocks included).
//!
//! What a client sees, by choice: the events API (the log, byte for byte) shows an
//! `agent.thinking`'s `signature` (one signed block) or `blocks` (several, or redacted ones) as
//! extra fields; AAP history, AAP turn responses and streams show thinking as
//! `{"type": "thinking", "thinking"}` only, as before.

use crate::common::{logcheck::check_log, TestServer};
use serde_json::{json, Value};
use turnstile::testkit::fake_anthropic::{FakeAnthropic, Reply};

fn config(fake: &FakeAnthropic) -> String {
    format!(
        "[server]\ndata_dir = \"data\"\nsandboxes = \"sandboxes\"\n\n\
         [upstream]\nprovider = \"anthropic\"\nbase_url = \"{}\"\nmodel = \"claude-test\"\nretries = 0\n\n\
         [agents.assistant]\nsystem_prompt = \"Be brief.\"\nthinking = true\n",
        fake.base_url()
    )
}

fn weather_tool() -> Value {
    json!({"name": "get_weather", "description": "weather",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}})
}

/// Posts a turn (non-streamed) and returns its JSON answer, checking the status.
async fn turn(server: &TestServer, sid: &str, messages: Value) -> Value {
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({ "messages": messages }),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    resp
}

fn tool_result(id: &str, content: &str) -> Value {
    json!([{"role": "tool", "toolCallId": id, "content": content}])
}

/// The stored `agent.thinking` events, as the events API returns them.
async fn thinking_events(server: &TestServer, sid: &str) -> Vec<Value> {
    let (status, v) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    assert_eq!(status, 200, "{v}");
    v["events"]
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["type"] == "agent.thinking")
        .cloned()
        .collect()
}

/// Every `cache_control` of a request body, wherever it is.
fn cache_controls(v: &Value) -> usize {
    match v {
        Value::Object(m) => {
            usize::from(m.contains_key("cache_control"))
                + m.values().map(cache_controls).sum::<usize>()
        }
        Value::Array(a) => a.iter().map(cache_controls).sum(),
        _ => 0,
    }
}

#[tokio::test]
async fn signed_thinking_is_sent_back_through_the_tool_loop_and_after_a_restart() {
    let fake = FakeAnthropic::start().await;
    let cfg = config(&fake);
    let server = TestServer::start(&cfg).await;
    let sid = server.session(json!({"tools": [weather_tool()]})).await;

    // Step 1: redacted and signed thinking, text, a client tool call.
    fake.push(
        Reply::tool_calls(&[("toolu_01", "get_weather", json!({"city": "Paris"}))])
            .redacted_thinking("RU5DUllQVEVELTE=")
            .thinking_signed("Paris: ask the tool.", "U0lHLTE=")
            .with_text("Checking.")
            .chunk_chars(5),
    );
    let resp = turn(
        &server,
        &sid,
        json!([{"role": "user", "content": "Paris?"}]),
    )
    .await;
    assert_eq!(resp["stopReason"], "tool_use", "{resp}");

    // The log keeps every block as issued; AAP shows the thinking text alone.
    let thinking = thinking_events(&server, &sid).await;
    assert_eq!(thinking.len(), 1);
    assert_eq!(thinking[0]["content"], "Paris: ask the tool.");
    assert_eq!(
        thinking[0]["blocks"],
        json!([
            {"type": "redacted_thinking", "data": "RU5DUllQVEVELTE="},
            {"type": "thinking", "thinking": "Paris: ask the tool.", "signature": "U0lHLTE="},
        ])
    );
    let aap_thinking = json!({"type": "thinking", "thinking": "Paris: ask the tool."});
    assert_eq!(resp["messages"][0]["content"][0], aap_thinking, "{resp}");
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    let full = hist["history"]["full"].clone();
    assert_eq!(full[1]["content"][0], aap_thinking, "{hist}");
    assert!(!full.to_string().contains("U0lH") && !full.to_string().contains("RU5D"));

    // A restart on the same data: the signatures come back from the log.
    let dir = server.stop().await;
    let server = TestServer::start_in(dir, &cfg).await;
    let (_, after) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(after["history"]["full"], full);

    // Step 2, after the tool result: one signed block and another call.
    fake.push(
        Reply::tool_calls(&[("toolu_02", "get_weather", json!({"city": "Rome"}))])
            .thinking_signed("Now Rome.", "U0lHLTI="),
    );
    let resp = turn(&server, &sid, tool_result("toolu_01", "21C")).await;
    assert_eq!(resp["stopReason"], "tool_use", "{resp}");
    let reqs = fake.wait_requests(2).await;
    let second = &reqs[1];
    assert_eq!(second["thinking"]["type"], "enabled", "thinking stays on");
    assert_eq!(
        second["messages"],
        json!([
            {"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": [
                {"type": "redacted_thinking", "data": "RU5DUllQVEVELTE="},
                {"type": "thinking", "thinking": "Paris: ask the tool.", "signature": "U0lHLTE="},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_01", "name": "get_weather",
                 "input": {"city": "Paris"}, "cache_control": {"type": "ephemeral"}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": "21C"},
            ]},
        ])
    );
    // Breakpoints: the system prompt, the last tool, the last stable turn.
    assert_eq!(
        second["system"],
        json!([{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}])
    );
    let tools = second["tools"].as_array().unwrap();
    assert_eq!(
        tools.last().unwrap()["cache_control"],
        json!({"type": "ephemeral"})
    );
    assert_eq!(cache_controls(second), 3);

    // One signed block: the event keeps its signature alone.
    let thinking = thinking_events(&server, &sid).await;
    assert_eq!(thinking.len(), 2);
    assert_eq!(
        thinking[1],
        json!({
            "id": thinking[1]["id"], "type": "agent.thinking", "turn_id": thinking[1]["turn_id"],
            "created_at": thinking[1]["created_at"],
            "content": "Now Rome.", "signature": "U0lHLTI=",
        })
    );

    // Step 3: the answer; its request carries both steps' thinking, each first in its turn.
    fake.push(
        Reply::text("Paris 21C, Rome 18C.")
            .thinking_signed("Both known.", "U0lHLTM=")
            .cache_tokens(900, 40)
            .usage(12, 7),
    );
    let resp = turn(&server, &sid, tool_result("toolu_02", "18C")).await;
    assert_eq!(resp["stopReason"], "end_turn", "{resp}");
    let third = &fake.wait_requests(3).await[2];
    assert_eq!(third["thinking"]["type"], "enabled");
    let messages = third["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 5);
    assert_eq!(
        messages[1],
        second["messages"][1]
            .as_object()
            .map(|m| {
                // The same turn, now without the breakpoint (it moved on).
                let mut m = m.clone();
                m["content"][3]
                    .as_object_mut()
                    .unwrap()
                    .remove("cache_control");
                Value::Object(m)
            })
            .unwrap()
    );
    assert_eq!(
        messages[3]["content"],
        json!([
            {"type": "thinking", "thinking": "Now Rome.", "signature": "U0lHLTI="},
            {"type": "tool_use", "id": "toolu_02", "name": "get_weather",
             "input": {"city": "Rome"}, "cache_control": {"type": "ephemeral"}},
        ])
    );
    assert!(cache_controls(third) <= 4);
    // Cached input tokens count as input, as before.
    let (_, events) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    let last = events["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["type"], "turn.completed");
    assert_eq!(
        last["usage"],
        json!({"input_tokens": 952, "output_tokens": 7})
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn only_redacted_thinking_is_logged_with_a_placeholder_and_sent_back_whole() {
    let fake = FakeAnthropic::start().await;
    let server = TestServer::start(&config(&fake)).await;
    let sid = server.session(json!({"tools": [weather_tool()]})).await;
    fake.push(
        Reply::tool_calls(&[("toolu_01", "get_weather", json!({"city": "Oslo"}))])
            .redacted_thinking("T05MWS1FTkM="),
    );
    turn(&server, &sid, json!([{"role": "user", "content": "Oslo?"}])).await;
    let thinking = thinking_events(&server, &sid).await;
    assert_eq!(thinking.len(), 1);
    assert_eq!(thinking[0]["content"], "[redacted thinking]");
    fake.push(Reply::text("Cold."));
    turn(&server, &sid, tool_result("toolu_01", "-3C")).await;
    let second = &fake.wait_requests(2).await[1];
    assert_eq!(second["thinking"]["type"], "enabled");
    assert_eq!(
        second["messages"][1]["content"][0],
        json!({"type": "redacted_thinking", "data": "T05MWS1FTkM="})
    );
    assert_eq!(second["messages"][1]["content"][1]["type"], "tool_use");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn with_thinking_off_no_thinking_is_asked_or_sent_back() {
    let fake = FakeAnthropic::start().await;
    let server = TestServer::start(&config(&fake)).await;
    let sid = server
        .session(json!({"tools": [weather_tool()],
                        "agent": {"name": "assistant", "options": {"thinking": "off"}}}))
        .await;
    fake.push(Reply::tool_calls(&[(
        "toolu_01",
        "get_weather",
        json!({"city": "Oslo"}),
    )]));
    turn(&server, &sid, json!([{"role": "user", "content": "Oslo?"}])).await;
    fake.push(Reply::text("Cold."));
    turn(&server, &sid, tool_result("toolu_01", "-3C")).await;
    let reqs = fake.wait_requests(2).await;
    for r in &reqs {
        assert!(r.get("thinking").is_none(), "{r}");
        assert!(!r.to_string().contains("\"thinking\""), "{r}");
    }
    assert!(thinking_events(&server, &sid).await.is_empty());
    check_log(server.engine().store(), &sid).await;
}

/// The official `anthropic` Python SDK reads the fake's stream (signed and redacted thinking,
/// cache token counts) and, sending its own follow-up the SDK way (the answer's content blocks
/// as the assistant turn), puts back the same thinking blocks turnstile puts back.
#[tokio::test]
async fn the_official_sdk_reads_the_fake_and_sends_back_the_thinking_turnstile_sends() {
    let fake = FakeAnthropic::start().await;
    let first = || {
        Reply::tool_calls(&[("toolu_01", "get_weather", json!({"city": "Paris"}))])
            .redacted_thinking("RU5DUllQVEVELTE=")
            .thinking_signed("Paris: ask the tool.", "U0lHLTE=")
            .with_text("Checking.")
            .cache_tokens(5, 3)
            .usage(12, 9)
    };
    fake.push(first());
    fake.push(Reply::text("Paris is 21C."));
    let python = tokio::task::spawn_blocking(crate::common::provision::python)
        .await
        .expect("provision");
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/anthropic_roundtrip.py");
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        tokio::process::Command::new(python)
            .arg(script)
            .arg(format!("http://{}", fake.addr()))
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the SDK script finishes")
    .expect("run python");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the SDK script failed: {stderr}");
    let parsed: Value = serde_json::from_slice(&out.stdout).expect("one JSON line");
    assert_eq!(
        parsed["content"],
        json!([
            {"type": "redacted_thinking", "data": "RU5DUllQVEVELTE="},
            {"type": "thinking", "thinking": "Paris: ask the tool.", "signature": "U0lHLTE="},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Paris"}},
        ]),
        "{parsed}"
    );
    assert_eq!(
        parsed["usage"],
        json!({"input_tokens": 12, "output_tokens": 9,
               "cache_read_input_tokens": 5, "cache_creation_input_tokens": 3})
    );
    assert_eq!(parsed["stop_reason"], "tool_use");
    assert_eq!(parsed["second"], "Paris is 21C.");

    // The same answer through turnstile.
    let server = TestServer::start(&config(&fake)).await;
    let sid = server.session(json!({"tools": [weather_tool()]})).await;
    fake.push(first());
    turn(
        &server,
        &sid,
        json!([{"role": "user", "content": "Paris?"}]),
    )
    .await;
    fake.push(Reply::text("Paris is 21C."));
    turn(&server, &sid, tool_result("toolu_01", "21C")).await;
    let reqs = fake.wait_requests(4).await;
    let thinking_sent = |req: &Value| -> Vec<Value> {
        assert_eq!(req["thinking"]["type"], "enabled", "{req}");
        req["messages"][1]["content"]
            .as_array()
            .expect("assistant blocks")
            .iter()
            .take_while(|b| b["type"] == "thinking" || b["type"] == "redacted_thinking")
            .cloned()
            .collect()
    };
    let sdk = thinking_sent(&reqs[1]);
    assert_eq!(sdk.len(), 2, "{}", reqs[1]);
    assert_eq!(thinking_sent(&reqs[3]), sdk);
    check_log(server.engine().store(), &sid).await;
}

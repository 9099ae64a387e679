//! AAP v3 turns against the fake upstream: the three response modes, client tools, validation,
//! busy sessions, and what the model was sent.

use crate::common::{config_text, logcheck::check_log, names, setup, TestServer};
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

const AGENT: &str = r#"
[agents.assistant]
system_prompt = "You are terse."
"#;

fn weather_tool() -> Value {
    json!({"name": "get_weather", "description": "Weather for a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})
}

#[tokio::test]
async fn meta_declares_version_3_agents_options_and_capabilities() {
    let (_fake, server) = setup("[agents.assistant]\n[agents.coder]\nthinking = true\nmodels = [\"fake-model\", \"other\"]\n").await;
    let (status, meta) = server.http.get("/meta").await;
    assert_eq!(status, 200);
    assert_eq!(meta["version"], 3);
    let agents = meta["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 2);
    assert_eq!(agents[0]["name"], "assistant");
    assert_eq!(agents[1]["name"], "coder");
    let caps = &agents[0]["capabilities"];
    for k in ["delta", "message", "none"] {
        assert!(caps["stream"][k].is_object(), "stream.{k}");
    }
    assert!(caps["history"]["full"].is_object() && caps["history"]["compacted"].is_object());
    assert!(caps["application"]["tools"].is_object());
    let thinking = &agents[1]["options"][0];
    assert_eq!(thinking["name"], "thinking");
    assert_eq!(thinking["type"], "select");
    assert_eq!(thinking["default"], "on");
    let model = &agents[1]["options"][1];
    assert_eq!(model["name"], "model");
    assert_eq!(model["options"], json!(["fake-model", "other"]));
    assert!(agents[0]["version"].is_string());
}

#[tokio::test]
async fn none_mode_returns_an_agent_response_and_the_model_saw_the_conversation() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::text("Tokyo is 18C and cloudy.").usage(30, 7));
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "Weather in Tokyo?"}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        resp,
        json!({"stopReason": "end_turn", "messages": [{"role": "assistant", "content": "Tokyo is 18C and cloudy."}]})
    );
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0]["model"], "fake-model");
    assert_eq!(reqs[0]["stream"], true);
    assert_eq!(reqs[0]["stream_options"]["include_usage"], true);
    assert_eq!(
        reqs[0]["messages"],
        json!([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Tokyo?"}])
    );
    let offered: Vec<&str> = reqs[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        offered,
        ["deliver_file"],
        "only the builtin tool is offered"
    );

    // A second turn carries the first one as history.
    fake.push(Reply::text("Osaka is 20C."));
    let (_, resp2) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "And Osaka?"}]}),
        )
        .await;
    assert_eq!(resp2["messages"][0]["content"], "Osaka is 20C.");
    let reqs = fake.requests();
    assert_eq!(
        reqs[1]["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Tokyo?"},
            {"role": "assistant", "content": "Tokyo is 18C and cloudy."},
            {"role": "user", "content": "And Osaka?"}
        ])
    );
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(hist["history"]["full"].as_array().unwrap().len(), 4);
    let events = check_log(server.engine().store(), &sid).await;
    let usage = events.iter().find_map(|e| match &e.body {
        turnstile::log::EventBody::TurnCompleted { usage, .. } => *usage,
        _ => None,
    });
    assert_eq!(
        usage.map(|u| (u.input_tokens, u.output_tokens)),
        Some((30, 7))
    );
}

#[tokio::test]
async fn delta_mode_streams_text_and_thinking_deltas_between_turn_start_and_turn_stop() {
    let (fake, server) = setup(AGENT).await;
    let sid = server
        .session(json!({"agent": {"name": "assistant", "options": {"thinking": "on"}}}))
        .await;
    fake.push(
        Reply::text("The weather in Tokyo is 18C.")
            .thinking("User asks weather.")
            .chunk_chars(5),
    );
    let events = server
        .http
        .post_sse(
            &format!("/sessions/{sid}/turns"),
            &json!({"stream": "delta", "messages": [{"role": "user", "content": "Tokyo?"}]}),
        )
        .await;
    let n = names(&events);
    assert_eq!(n.first(), Some(&"turn_start"));
    assert_eq!(n.last(), Some(&"turn_stop"));
    assert_eq!(events[0].data, json!({}));
    assert_eq!(
        events.last().unwrap().data,
        json!({"stopReason": "end_turn"})
    );
    let text: String = events
        .iter()
        .filter(|e| e.event == "text_delta")
        .map(|e| e.data["delta"].as_str().unwrap())
        .collect();
    let thinking: String = events
        .iter()
        .filter(|e| e.event == "thinking_delta")
        .map(|e| e.data["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "The weather in Tokyo is 18C.");
    assert_eq!(thinking, "User asks weather.");
    assert!(
        events.iter().filter(|e| e.event == "text_delta").count() > 1,
        "text arrives in several deltas"
    );
    assert!(
        !n.contains(&"text") && !n.contains(&"thinking"),
        "no whole messages in delta mode: {n:?}"
    );
    // History holds the whole message, thinking included.
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(
        hist["history"]["full"][1],
        json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "User asks weather."},
            {"type": "text", "text": "The weather in Tokyo is 18C."}
        ]})
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn message_mode_sends_whole_messages_and_no_thinking_when_it_is_off() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::text("Tokyo: 18C.").thinking("hidden reasoning"));
    let events = server
        .http
        .post_sse(
            &format!("/sessions/{sid}/turns"),
            &json!({"stream": "message", "messages": [{"role": "user", "content": "Tokyo?"}]}),
        )
        .await;
    assert_eq!(names(&events), vec!["turn_start", "text", "turn_stop"]);
    assert_eq!(events[1].data, json!({"text": "Tokyo: 18C."}));
    // Thinking is on for this turn only when asked for: now turn it on.
    fake.push(Reply::text("Osaka: 20C.").thinking("reasoning"));
    let events = server
        .http
        .post_sse(
            &format!("/sessions/{sid}/turns"),
            &json!({"stream": "message", "agent": {"options": {"thinking": "on"}}, "messages": [{"role": "user", "content": "Osaka?"}]}),
        )
        .await;
    assert_eq!(
        names(&events),
        vec!["turn_start", "thinking", "text", "turn_stop"]
    );
    assert_eq!(events[1].data, json!({"thinking": "reasoning"}));
    // The option persists for the session.
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["agent"]["options"]["thinking"], "on");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_client_tool_round_trip_stops_with_tool_use_and_resumes_with_the_result() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({"tools": [weather_tool()]})).await;
    fake.push(
        Reply::tool_calls(&[("call_001", "get_weather", json!({"city": "Tokyo"}))])
            .with_text("Let me check."),
    );
    let events = server
        .http
        .post_sse(
            &format!("/sessions/{sid}/turns"),
            &json!({"stream": "message", "messages": [{"role": "user", "content": "Tokyo?"}]}),
        )
        .await;
    assert_eq!(
        names(&events),
        vec!["turn_start", "text", "tool_call", "turn_stop"]
    );
    assert_eq!(
        events[2].data,
        json!({"toolCallId": "call_001", "name": "get_weather", "input": {"city": "Tokyo"}})
    );
    assert_eq!(events[3].data, json!({"stopReason": "tool_use"}));
    // The model was offered the client tool with its schema.
    let req = &fake.requests()[0];
    assert_eq!(req["tools"][0]["type"], "function");
    assert_eq!(req["tools"][0]["function"]["name"], "get_weather");
    assert_eq!(
        req["tools"][0]["function"]["parameters"],
        weather_tool()["parameters"]
    );

    // The session waits for the client.
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "awaiting_client");
    assert_eq!(info["pending"][0]["toolCallId"], "call_001");
    assert_eq!(info["pending"][0]["kind"], "client");

    // A plain user message now conflicts; a wrong id is named.
    let turns = format!("/sessions/{sid}/turns");
    let (status, err) = server
        .http
        .post(
            &turns,
            &json!({"messages": [{"role": "user", "content": "hello?"}]}),
        )
        .await;
    assert_eq!(status, 409, "{err}");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("call_001"));
    let (status, err) = server
        .http
        .post(
            &turns,
            &json!({"messages": [{"role": "tool", "toolCallId": "call_999", "content": "x"}]}),
        )
        .await;
    assert_eq!(status, 400);
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("call_999") && msg.contains("call_001"),
        "{msg}"
    );
    assert_eq!(
        fake.requests().len(),
        1,
        "rejected follow-ups never reach the model"
    );

    fake.push(Reply::text("Tokyo is 18C."));
    let (status, resp) = server
        .http
        .post(&turns, &json!({"messages": [{"role": "tool", "toolCallId": "call_001", "content": "18C, cloudy"}]}))
        .await;
    assert_eq!(status, 200, "{resp}");
    // The client's own result is not echoed back.
    assert_eq!(
        resp,
        json!({"stopReason": "end_turn", "messages": [{"role": "assistant", "content": "Tokyo is 18C."}]})
    );
    let req = &fake.requests()[1];
    let msgs = req["messages"].as_array().unwrap();
    assert_eq!(msgs[2]["role"], "assistant");
    assert_eq!(msgs[2]["tool_calls"][0]["id"], "call_001");
    assert_eq!(
        msgs[3],
        json!({"role": "tool", "tool_call_id": "call_001", "content": "18C, cloudy"})
    );

    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(
        hist["history"]["full"],
        json!([
            {"role": "user", "content": "Tokyo?"},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "toolCallId": "call_001", "name": "get_weather", "input": {"city": "Tokyo"}}
            ]},
            {"role": "tool", "toolCallId": "call_001", "content": "18C, cloudy"},
            {"role": "assistant", "content": "Tokyo is 18C."}
        ])
    );
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "idle");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn parallel_client_calls_need_every_result_in_one_request() {
    let (fake, server) = setup(AGENT).await;
    let sid = server
        .session(json!({"tools": [weather_tool(), {"name": "get_time", "description": "time", "parameters": {"type": "object"}}]}))
        .await;
    fake.push(Reply::tool_calls(&[
        ("call_a", "get_weather", json!({"city": "Tokyo"})),
        ("call_b", "get_time", json!({})),
    ]));
    let turns = format!("/sessions/{sid}/turns");
    let (_, resp) = server
        .http
        .post(
            &turns,
            &json!({"messages": [{"role": "user", "content": "both"}]}),
        )
        .await;
    assert_eq!(resp["stopReason"], "tool_use");
    let uses = resp["messages"][0]["content"].as_array().unwrap();
    assert_eq!(uses.len(), 2);
    let (status, err) = server
        .http
        .post(
            &turns,
            &json!({"messages": [{"role": "tool", "toolCallId": "call_a", "content": "18C"}]}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing answers for toolCallId call_b"),
        "{err}"
    );
    fake.push(Reply::text("done"));
    let (status, _) = server
        .http
        .post(
            &turns,
            &json!({"messages": [
                {"role": "tool", "toolCallId": "call_b", "content": "12:00"},
                {"role": "tool", "toolCallId": "call_a", "content": "18C"}
            ]}),
        )
        .await;
    assert_eq!(status, 200);
    let msgs = fake.requests()[1]["messages"].as_array().unwrap().clone();
    let tool_ids: Vec<&str> = msgs
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(tool_ids, vec!["call_a", "call_b"], "results in call order");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn the_step_budget_stops_with_max_tokens_and_answers_every_call() {
    let (fake, server) = setup("[agents.assistant]\nmax_steps = 1\n").await;
    let sid = server.session(json!({"tools": [weather_tool()]})).await;
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "get_weather",
        json!({"city": "Oslo"}),
    )]));
    let (_, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "Oslo?"}]}),
        )
        .await;
    assert_eq!(resp["stopReason"], "max_tokens");
    assert_eq!(resp["messages"][1]["role"], "tool");
    assert!(resp["messages"][1]["content"]
        .as_str()
        .unwrap()
        .contains("step budget"));
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(
        info["status"], "idle",
        "a spent budget leaves nothing pending"
    );
    let events = check_log(server.engine().store(), &sid).await;
    assert!(events
        .last()
        .unwrap()
        .json
        .contains("\"stop_reason\":\"max_steps\""));
}

#[tokio::test]
async fn finish_reasons_map_to_aap_stop_reasons() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let turns = format!("/sessions/{sid}/turns");
    for (finish, stop) in [
        ("length", "max_tokens"),
        ("content_filter", "refusal"),
        ("stop", "end_turn"),
    ] {
        fake.push(Reply::text("partial").finish(finish));
        let (_, resp) = server
            .http
            .post(
                &turns,
                &json!({"messages": [{"role": "user", "content": "x"}]}),
            )
            .await;
        assert_eq!(resp["stopReason"], stop, "finish_reason {finish}");
    }
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn upstream_failures_end_the_turn_with_error_and_model_error() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let turns = format!("/sessions/{sid}/turns");
    fake.push(Reply::status(
        500,
        json!({"error": {"message": "upstream exploded"}}),
    ));
    let (status, resp) = server
        .http
        .post(
            &turns,
            &json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(resp["stopReason"], "error");
    assert_eq!(resp["error"]["reason"], "model_error");
    // The status, not the upstream's own words (those go to the server's log).
    let message = resp["error"]["message"].as_str().unwrap();
    assert!(message.contains("HTTP 500"), "{message}");
    assert!(!message.contains("upstream exploded"), "{message}");

    // A stream that breaks midway, in message mode: the client was shown nothing yet, so the
    // streamed text is retracted in the log (an empty agent.message) and the turn fails.
    fake.push(
        Reply::text("this will break off somewhere")
            .chunk_chars(3)
            .break_after(4),
    );
    let events = server
        .http
        .post_sse(
            &turns,
            &json!({"stream": "message", "messages": [{"role": "user", "content": "y"}]}),
        )
        .await;
    assert_eq!(names(&events), vec!["turn_start", "turn_stop"]);
    assert_eq!(events.last().unwrap().data["stopReason"], "error");
    let log = check_log(server.engine().store(), &sid).await;
    let types: Vec<&str> = log.iter().map(|e| e.body.type_name()).collect();
    assert_eq!(
        types,
        vec![
            "user.message",
            "turn.failed",
            "user.message",
            "agent.message",
            "turn.failed"
        ],
        "the second failure retracts its streamed text with an empty agent.message"
    );
    assert!(log[3].json.contains("\"content\":\"\""));
    // Nothing of the failed turns is in history but the user messages.
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(hist["history"]["full"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn in_delta_mode_text_already_streamed_is_kept_and_never_retried_away() {
    let fake = FakeOpenAi::start().await;
    let cfg = config_text(&fake, AGENT).replace("retries = 0", "retries = 2");
    let server = TestServer::start(&cfg).await;
    let sid = server.session(json!({})).await;
    fake.push(
        Reply::text("this will break off somewhere")
            .chunk_chars(3)
            .break_after(4),
    );
    fake.push(Reply::text("a different second answer"));
    let events = server
        .http
        .post_sse(
            &format!("/sessions/{sid}/turns"),
            &json!({"stream": "delta", "messages": [{"role": "user", "content": "y"}]}),
        )
        .await;
    let shown: String = events
        .iter()
        .filter(|e| e.event == "text_delta")
        .map(|e| e.data["delta"].as_str().unwrap())
        .collect();
    assert!(!shown.is_empty(), "the client was shown part of the answer");
    assert_eq!(events.last().unwrap().data["stopReason"], "error");
    assert_eq!(
        fake.requests().len(),
        1,
        "no retry once the client holds streamed text"
    );
    // The history holds exactly what the client was shown.
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(
        hist["history"]["full"][1],
        json!({"role": "assistant", "content": shown})
    );
    let log = check_log(server.engine().store(), &sid).await;
    let types: Vec<&str> = log.iter().map(|e| e.body.type_name()).collect();
    assert_eq!(types, vec!["user.message", "agent.message", "turn.failed"]);
}

#[tokio::test]
async fn a_retryable_failure_is_retried_and_the_turn_succeeds() {
    let fake = FakeOpenAi::start().await;
    let cfg = config_text(&fake, AGENT).replace("retries = 0", "retries = 2");
    let server = TestServer::start(&cfg).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::status(503, json!({"error": {"message": "busy"}})).header("retry-after", "0"));
    fake.push(Reply::text("fine now"));
    let (_, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(resp["stopReason"], "end_turn");
    assert_eq!(resp["messages"][0]["content"], "fine now");
    assert_eq!(fake.requests().len(), 2);
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_second_turn_while_one_runs_is_409_with_the_running_turn_id() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let gate = Gate::new();
    fake.push(Reply::text("slow answer").hold(gate.clone()));
    let turns = format!("/sessions/{sid}/turns");
    let http = server.http.clone();
    let t = turns.clone();
    let first = tokio::spawn(async move {
        http.post(
            &t,
            &json!({"messages": [{"role": "user", "content": "first"}]}),
        )
        .await
    });
    fake.wait_requests(1).await;
    let (status, err) = server
        .http
        .post(
            &turns,
            &json!({"messages": [{"role": "user", "content": "second"}]}),
        )
        .await;
    assert_eq!(status, 409);
    assert_eq!(err["error"]["type"], "session_busy");
    let turn_id = err["error"]["turn_id"].as_str().unwrap().to_string();
    assert!(turn_id.starts_with("turn_"));
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "running");
    assert_eq!(info["turn_id"], turn_id.as_str());
    gate.open();
    let (status, resp) = first.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(resp["messages"][0]["content"], "slow answer");
    let log = check_log(server.engine().store(), &sid).await;
    assert_eq!(log[0].turn_id, turn_id);
}

#[tokio::test]
async fn a_client_that_disconnects_does_not_cancel_the_turn() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let gate = Gate::new();
    fake.push(Reply::text("finished anyway").hold(gate.clone()));
    let resp = server
        .http
        .request_raw(
            "POST",
            &format!("/sessions/{sid}/turns"),
            Some(
                serde_json::to_vec(
                    &json!({"stream": "delta", "messages": [{"role": "user", "content": "go"}]}),
                )
                .unwrap(),
            ),
        )
        .await;
    assert_eq!(resp.status(), 200);
    fake.wait_requests(1).await;
    drop(resp); // the client goes away mid-turn
    gate.open();
    assert_finished_anyway(&server, &sid).await;
}

/// The turn ended and was logged as completed with the held reply's text.
async fn assert_finished_anyway(server: &TestServer, sid: &str) {
    tokio::time::timeout(std::time::Duration::from_secs(10), server.wait_idle(sid))
        .await
        .expect("the turn never ended: it was dropped with its watcher");
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(
        hist["history"]["full"][1],
        json!({"role": "assistant", "content": "finished anyway"})
    );
    let log = check_log(server.engine().store(), sid).await;
    assert_eq!(log.last().unwrap().body.type_name(), "turn.completed");
}

/// A streamed turn is run by its response as the connection asks for frames. A client that
/// stays connected but stops reading fills its socket, and the connection stops asking: the
/// turn must go on without it (its time limit, commits, cancels and the session's queue depend
/// on it), and the client still gets every frame if it reads again.
#[tokio::test]
async fn a_client_that_stops_reading_its_stream_does_not_stall_the_turn() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    // More stream than the kernel holds for a loopback connection (at most 4 MiB sent, Linux's
    // default tcp_wmem, and a receive buffer of a few KiB asked for below), paced so that the
    // turn still has most of it to read when the socket is full.
    let text = "0123456789".repeat(600_000);
    let pace = std::time::Duration::from_millis(5);
    fake.push(Reply::text(&text).chunk_chars(20_000).pace(pace));
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(server.addr).await.unwrap();
    let body =
        json!({"stream": "delta", "messages": [{"role": "user", "content": "go"}]}).to_string();
    let head = format!(
        "POST /sessions/{sid}/turns HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(format!("{head}{body}").as_bytes())
        .await
        .unwrap();
    let mut first = [0u8; 12];
    conn.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    // The client reads no more until the turn has ended.
    tokio::time::timeout(std::time::Duration::from_secs(30), server.wait_idle(&sid))
        .await
        .expect("the turn stalled with the client that stopped reading");
    let log = check_log(server.engine().store(), &sid).await;
    assert_eq!(log.last().unwrap().body.type_name(), "turn.completed");
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(
        hist["history"]["full"][1]["content"].as_str().map(str::len),
        Some(text.len())
    );
    // Reading again, the client gets the whole stream, through to its end (the last chunk).
    let mut rest = Vec::new();
    while !rest.ends_with(b"\r\n0\r\n\r\n") {
        let mut buf = [0u8; 65536];
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "the connection closed before the stream's end");
        rest.extend_from_slice(&buf[..n]);
    }
    let rest = String::from_utf8(rest).unwrap();
    let streamed: usize = rest
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["delta"].as_str().map(str::len))
        .sum();
    assert_eq!(streamed, text.len());
    assert!(
        rest.contains("event: turn_stop"),
        "the stream ends with turn_stop"
    );
}

#[tokio::test]
async fn a_client_that_disconnects_before_a_stream_none_answer_does_not_cancel_the_turn() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let gate = Gate::new();
    fake.push(Reply::text("finished anyway").hold(gate.clone()));
    let conn = server
        .post_and_hold(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "go"}]}),
        )
        .await;
    fake.wait_requests(1).await;
    drop(conn); // the client goes away while it waits for the whole answer
    gate.open();
    assert_finished_anyway(&server, &sid).await;
}

#[tokio::test]
async fn a_driven_turn_whose_handle_is_dropped_runs_on_by_itself() {
    use turnstile::engine::{Runner, SessionUpdate, TurnInput, TurnOrder};
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let gate = Gate::new();
    fake.push(Reply::text("finished anyway").hold(gate.clone()));
    let engine = server.engine();
    let session = engine
        .session(turnstile::engine::Reach::Owner(None), &sid)
        .await
        .unwrap();
    let input = TurnInput::User {
        content: json!("go"),
        files: vec![],
        skills: vec![],
    };
    let mut req = TurnOrder::attended(input, SessionUpdate::default());
    req.delivery.runner = Runner::Watcher;
    let mut handle = engine.start_turn(&session, req).await.unwrap();
    // The turn runs only while its handle is read: read it until the model has the request.
    let asked = fake.wait_requests(1);
    tokio::pin!(asked);
    loop {
        tokio::select! {
            _ = &mut asked => break,
            item = handle.recv() => assert!(item.is_some(), "the turn ended before the model answered"),
        }
    }
    drop(handle);
    gate.open();
    assert_finished_anyway(&server, &sid).await;
}

#[tokio::test]
async fn seed_messages_and_a_seed_system_prompt_reach_the_model() {
    let (fake, server) = setup(AGENT).await;
    let sid = server
        .session(json!({"agent": {"name": "assistant"}, "messages": [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."}
        ]}))
        .await;
    fake.push(Reply::text("Berlin."));
    server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "And Germany?"}]}),
        )
        .await;
    assert_eq!(
        fake.requests()[0]["messages"],
        json!([
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And Germany?"}
        ])
    );
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=compacted"))
        .await;
    assert_eq!(hist["history"]["compacted"].as_array().unwrap().len(), 5);
    let events = check_log(server.engine().store(), &sid).await;
    assert_eq!(events.len(), 3, "seeds write no events");
}

#[tokio::test]
async fn images_in_user_content_are_passed_to_the_model() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::text("A cat."));
    let (status, _) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image", "url": "data:image/png;base64,iVBORw0KGgo="}
            ]}]}),
        )
        .await;
    assert_eq!(status, 200);
    let content = &fake.requests()[0]["messages"][1]["content"];
    assert_eq!(content[1]["type"], "image_url");
    assert_eq!(
        content[1]["image_url"]["url"],
        "data:image/png;base64,iVBORw0KGgo="
    );
    check_log(server.engine().store(), &sid).await;
}

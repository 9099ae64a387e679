use std::time::Duration;

use serde_json::{json, Value};

use super::messages_request::{image_block, request_body, thinking_budget};
use super::stream::error_message;
use super::*;
use crate::message::{Block, Content, Message, SignedThinking, ToolCall, Usage};
use crate::testkit::fake_anthropic::{FakeAnthropic, Gate, Reply};
use crate::upstream::errors::parse_retry_after;
use crate::upstream::ToolDef;
use crate::upstream::{ModelStop, UpstreamErrorKind};
use std::sync::Arc;
use tokio::sync::mpsc;

use crate::testkit::sinks::{Forward, Rec};

fn provider(fake: &FakeAnthropic) -> Anthropic {
    Anthropic::new(fake.base_url(), None, Duration::from_secs(10), 4096)
}

fn ask(text: &str) -> ModelRequest {
    ModelRequest {
        model: "claude-test".into(),
        system: None,
        messages: vec![Message::User {
            content: Content::Text(text.into()),
        }],
        tools: vec![],
        max_tokens: None,
        thinking: false,
        tuning: Default::default(),
    }
}

async fn run_req(
    fake: &FakeAnthropic,
    reply: Reply,
    req: &ModelRequest,
) -> (Result<ModelOutput, UpstreamError>, Rec) {
    fake.push(reply);
    let mut rec = Rec::default();
    let out = provider(fake).complete(req, &mut rec).await;
    (out, rec)
}

async fn run(fake: &FakeAnthropic, reply: Reply) -> (Result<ModelOutput, UpstreamError>, Rec) {
    run_req(fake, reply, &ask("hi")).await
}

async fn run_raw(body: &str) -> Result<ModelOutput, UpstreamError> {
    let fake = FakeAnthropic::start().await;
    run(&fake, Reply::raw(body).chunk_chars(7)).await.0
}

/// Anthropic-style SSE: each event named after its data's `type`.
fn sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
        .collect()
}

fn start(input_tokens: u64) -> Value {
    json!({"type": "message_start", "message": {"id": "msg_1", "type": "message",
            "role": "assistant", "content": [], "model": "m", "stop_reason": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1}}})
}

fn block_start(index: u64, block: Value) -> Value {
    json!({"type": "content_block_start", "index": index, "content_block": block})
}

fn delta(index: u64, d: Value) -> Value {
    json!({"type": "content_block_delta", "index": index, "delta": d})
}

fn stop(reason: &str, output_tokens: u64) -> [Value; 2] {
    [
        json!({"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": null},
                   "usage": {"output_tokens": output_tokens}}),
        json!({"type": "message_stop"}),
    ]
}

#[tokio::test]
async fn text_streams_as_fragments() {
    let fake = FakeAnthropic::start().await;
    let text = "The quick brown fox jumps over the lazy dog, naïvely 🦊.";
    let (out, rec) = run(&fake, Reply::text(text)).await;
    let out = out.unwrap();
    assert_eq!(out.text, text);
    assert!(rec.text.len() > 5, "fragments: {:?}", rec.text);
    assert_eq!(rec.text.concat(), text);
    assert!(rec.text.iter().all(|f| !f.is_empty()));
    assert!(rec.thinking.is_empty());
    assert_eq!(out.stop, ModelStop::EndTurn);
    assert!(out.tool_calls.is_empty());
    assert_eq!(out.thinking, "");
    assert_eq!(
        out.usage,
        Usage {
            input_tokens: 10,
            output_tokens: 5,
            ..Default::default()
        }
    );
}

#[tokio::test]
async fn fragments_reach_the_sink_before_the_stream_ends() {
    let fake = Arc::new(FakeAnthropic::start().await);
    let gate = Gate::new();
    fake.push(Reply::text("streaming works").hold(gate.clone()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    let f = fake.clone();
    let call = tokio::spawn(async move {
        let p = provider(&f);
        let mut sink = Forward(tx);
        p.complete(&ask("hi"), &mut sink).await
    });
    let mut seen = String::new();
    while seen != "streaming works" {
        seen.push_str(&rx.recv().await.expect("a fragment"));
    }
    assert!(!call.is_finished(), "the stream is held open by the gate");
    gate.open();
    let out = call.await.unwrap().unwrap();
    assert_eq!(out.text, "streaming works");
}

#[tokio::test]
async fn thinking_streams_and_is_requested() {
    let fake = FakeAnthropic::start().await;
    let mut req = ask("6 x 7?");
    req.thinking = true;
    let (out, rec) = run_req(
        &fake,
        Reply::text("42").thinking("Let me think it over."),
        &req,
    )
    .await;
    let out = out.unwrap();
    assert_eq!(out.thinking, "Let me think it over.");
    assert!(rec.thinking.len() > 1);
    assert_eq!(rec.thinking.concat(), out.thinking);
    assert_eq!(out.text, "42");
    assert_eq!(rec.text.concat(), "42");
    let sent = &fake.wait_requests(1).await[0];
    assert_eq!(
        sent["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    assert_eq!(sent["max_tokens"], 4096);
}

#[test]
fn thinking_budget_bounds() {
    // min(max/2, 8192), at least 1024; max_tokens then exceeds the budget by 1024 or more.
    assert_eq!(thinking_budget(4096), (2048, 4096));
    assert_eq!(thinking_budget(64000), (8192, 64000));
    assert_eq!(thinking_budget(1000), (1024, 2048));
    assert_eq!(thinking_budget(2500), (1250, 2500));
    assert_eq!(thinking_budget(1), (1024, 2048));
    let mut req = ask("x");
    req.thinking = true;
    req.max_tokens = Some(500);
    let body = request_body(&req, 4096);
    assert_eq!(body["max_tokens"], 2048);
    assert_eq!(body["thinking"]["budget_tokens"], 1024);
    // Without thinking: no thinking key, max_tokens as asked.
    req.thinking = false;
    let body = request_body(&req, 4096);
    assert_eq!(body["max_tokens"], 500);
    assert!(body.get("thinking").is_none());
    req.max_tokens = None;
    assert_eq!(request_body(&req, 777)["max_tokens"], 777);
}

#[test]
fn thinking_is_left_off_mid_tool_loop_without_a_signature() {
    let mut req = ask("weather?");
    req.thinking = true;
    req.messages.push(Message::Assistant {
        content: Content::Blocks(vec![
            Block::thinking("call it"),
            Block::ToolUse {
                tool_call_id: "toolu_1".into(),
                name: "get_weather".into(),
                input: json!({}),
            },
        ]),
    });
    req.messages.push(Message::Tool {
        tool_call_id: "toolu_1".into(),
        content: Content::Text("18C".into()),
    });
    let body = request_body(&req, 4096);
    assert!(body.get("thinking").is_none(), "{body}");
    // A new user message after the loop: thinking again.
    req.messages.push(Message::Assistant {
        content: Content::Text("18C.".into()),
    });
    req.messages.push(Message::User {
        content: Content::Text("thanks".into()),
    });
    let body = request_body(&req, 4096);
    assert_eq!(body["thinking"]["type"], "enabled");
}

fn signed(text: &str, signature: &str) -> SignedThinking {
    SignedThinking::Thinking {
        thinking: text.into(),
        signature: signature.into(),
    }
}

#[test]
fn signed_thinking_goes_back_first_and_keeps_thinking_on_through_the_loop() {
    let redacted = SignedThinking::RedactedThinking {
        data: "RU5D".into(),
    };
    let mut req = ask("weather?");
    req.thinking = true;
    req.messages.push(Message::Assistant {
        content: Content::Blocks(vec![
            Block::Text {
                text: "Checking.".into(),
            },
            Block::ToolUse {
                tool_call_id: "toolu_1".into(),
                name: "get_weather".into(),
                input: json!({}),
            },
        ]),
    });
    // A second assistant message merged into the same turn: its thinking still goes first.
    req.messages.push(Message::Assistant {
        content: Content::Blocks(vec![Block::Thinking {
            thinking: "call it".into(),
            signed: vec![redacted.clone(), signed("call it", "SIG")],
        }]),
    });
    req.messages.push(Message::Tool {
        tool_call_id: "toolu_1".into(),
        content: Content::Text("18C".into()),
    });
    let body = request_body(&req, 4096);
    assert_eq!(body["thinking"]["type"], "enabled", "{body}");
    assert_eq!(
        body["messages"][1]["content"],
        json!([
            {"type": "redacted_thinking", "data": "RU5D"},
            {"type": "thinking", "thinking": "call it", "signature": "SIG"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {},
             "cache_control": {"type": "ephemeral"}},
        ])
    );
    // With thinking off, no thinking block is sent (signed or not).
    req.thinking = false;
    let body = request_body(&req, 4096);
    assert!(body.get("thinking").is_none());
    let types: Vec<&str> = body["messages"][1]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["type"].as_str().unwrap())
        .collect();
    assert_eq!(types, ["text", "tool_use"]);
}

#[test]
fn cache_breakpoints_on_system_tools_and_the_last_stable_turn() {
    let mut req = ask("one");
    req.system = Some("Be brief.".into());
    req.tools = vec![
        ToolDef {
            name: "a".into(),
            description: String::new(),
            parameters: Value::Null.into(),
        },
        ToolDef {
            name: "b".into(),
            description: String::new(),
            parameters: Value::Null.into(),
        },
    ];
    let body = request_body(&req, 10);
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}])
    );
    assert!(body["tools"][0].get("cache_control").is_none());
    assert_eq!(
        body["tools"][1]["cache_control"],
        json!({"type": "ephemeral"})
    );
    // One message: nothing stable yet.
    assert_eq!(
        body["messages"],
        json!([{"role": "user", "content": "one"}])
    );
    req.messages.push(Message::Assistant {
        content: Content::Blocks(vec![Block::Thinking {
            thinking: "t".into(),
            signed: vec![signed("t", "S")],
        }]),
    });
    req.messages.push(Message::Assistant {
        content: Content::Text("answer".into()),
    });
    req.messages.push(Message::User {
        content: Content::Text("two".into()),
    });
    req.thinking = true;
    let body = request_body(&req, 10);
    // The turn before the newest: its last block (never a thinking block); the newest is
    // left as it was.
    assert_eq!(
        body["messages"][1]["content"],
        json!([
            {"type": "thinking", "thinking": "t", "signature": "S"},
            {"type": "text", "text": "answer", "cache_control": {"type": "ephemeral"}},
        ])
    );
    assert_eq!(body["messages"][2]["content"], "two");
    assert_eq!(body.to_string().matches("cache_control").count(), 3);
    // A stable turn of thinking alone gets no breakpoint.
    req.messages.remove(2);
    let body = request_body(&req, 10);
    assert_eq!(body.to_string().matches("cache_control").count(), 2);
}

#[tokio::test]
async fn signatures_and_redacted_thinking_are_kept() {
    let fake = FakeAnthropic::start().await;
    let mut req = ask("?");
    req.thinking = true;
    let reply = Reply::tool_calls(&[("toolu_1", "f", json!({}))])
        .redacted_thinking("RU5DUllQVEVE")
        .thinking_signed("first, ", "U0lHMQ==")
        .thinking_signed("second", "U0lHMg==")
        .chunk_chars(3);
    let (out, rec) = run_req(&fake, reply, &req).await;
    let out = out.unwrap();
    assert_eq!(out.thinking, "first, second");
    assert_eq!(rec.thinking.concat(), "first, second");
    assert_eq!(
        out.signed_thinking,
        vec![
            SignedThinking::RedactedThinking {
                data: "RU5DUllQVEVE".into()
            },
            signed("first, ", "U0lHMQ=="),
            signed("second", "U0lHMg=="),
        ]
    );
    // Unsigned thinking (no signature_delta) is text only.
    let raw = sse(&[
        start(1),
        block_start(0, json!({"type": "thinking", "thinking": ""})),
        delta(0, json!({"type": "thinking_delta", "thinking": "hm"})),
        json!({"type": "content_block_stop", "index": 0}),
        block_start(1, json!({"type": "text", "text": "ok"})),
        stop("end_turn", 2)[0].clone(),
        stop("end_turn", 2)[1].clone(),
    ]);
    let out = run_raw(&raw).await.unwrap();
    assert_eq!(out.thinking, "hm");
    assert!(out.signed_thinking.is_empty());
}

#[tokio::test]
async fn cached_input_tokens_count_as_input() {
    let fake = FakeAnthropic::start().await;
    let (out, _) = run(&fake, Reply::text("x").usage(7, 2).cache_tokens(100, 30)).await;
    assert_eq!(
        out.unwrap().usage,
        Usage {
            input_tokens: 137,
            output_tokens: 2,
            cached_input_tokens: 100,
        }
    );
}

#[tokio::test]
async fn two_tool_calls_with_split_input_json() {
    let fake = FakeAnthropic::start().await;
    let weather = json!({"city": "Tokyo", "units": {"temp": "C"}, "days": [1, 2, 3]});
    let time = json!({"tz": "Asia/Tokyo — 東京"});
    let (out, rec) = run(
        &fake,
        Reply::tool_calls(&[
            ("toolu_w", "get_weather", weather.clone()),
            ("toolu_t", "get_time", time.clone()),
        ])
        .with_text("Checking both.")
        .chunk_chars(3),
    )
    .await;
    let out = out.unwrap();
    assert_eq!(out.stop, ModelStop::ToolUse);
    assert_eq!(out.text, "Checking both.");
    assert_eq!(rec.text.concat(), "Checking both.");
    assert_eq!(
        out.tool_calls,
        vec![
            ToolCall {
                id: "toolu_w".into(),
                name: "get_weather".into(),
                input: weather
            },
            ToolCall {
                id: "toolu_t".into(),
                name: "get_time".into(),
                input: time
            },
        ]
    );
}

#[tokio::test]
async fn tool_input_quirks_empty_missing_id_and_bad_deltas() {
    // No input deltas at all → {}; no id → a generated one; signature/citation deltas ignored.
    let mut events = vec![
        start(3),
        block_start(
            0,
            json!({"type": "tool_use", "id": "", "name": "noop", "input": {}}),
        ),
        delta(0, json!({"type": "input_json_delta", "partial_json": ""})),
        json!({"type": "content_block_stop", "index": 0}),
        block_start(1, json!({"type": "redacted_thinking", "data": "xyz"})),
        delta(1, json!({"type": "signature_delta", "signature": "abc"})),
        delta(1, json!({"type": "citations_delta", "citation": {}})),
        json!({"type": "some_future_event", "x": 1}),
    ];
    events.extend(stop("tool_use", 9));
    let out = run_raw(&sse(&events)).await.unwrap();
    assert_eq!(out.tool_calls.len(), 1);
    assert_eq!(out.tool_calls[0].input, json!({}));
    assert!(out.tool_calls[0].id.starts_with("toolu_"));
    assert!(out.tool_calls[0].id.len() > 6);
    // Input JSON for a block that is not a tool_use block: a protocol error.
    let events = [
        start(3),
        block_start(0, json!({"type": "text", "text": ""})),
        delta(0, json!({"type": "input_json_delta", "partial_json": "{}"})),
    ];
    let err = run_raw(&sse(&events)).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Protocol);
}

#[tokio::test]
async fn invalid_tool_input_is_a_protocol_error_naming_the_tool() {
    let mut events = vec![
        start(3),
        block_start(
            0,
            json!({"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}),
        ),
        delta(
            0,
            json!({"type": "input_json_delta", "partial_json": "{\"city\": Tok"}),
        ),
        json!({"type": "content_block_stop", "index": 0}),
    ];
    events.extend(stop("tool_use", 9));
    let err = run_raw(&sse(&events)).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Protocol);
    assert!(!err.retryable);
    assert!(err.message.contains("get_weather"), "{}", err.message);
    // Cut by max_tokens instead: the broken call is dropped, the stop says why.
    let n = events.len();
    events[n - 2]["delta"]["stop_reason"] = json!("max_tokens");
    let out = run_raw(&sse(&events)).await.unwrap();
    assert_eq!(out.stop, ModelStop::MaxTokens);
    assert!(out.tool_calls.is_empty());
}

#[tokio::test]
async fn stop_reasons() {
    let fake = FakeAnthropic::start().await;
    for (reason, want) in [
        ("end_turn", ModelStop::EndTurn),
        ("stop_sequence", ModelStop::EndTurn),
        ("pause_turn", ModelStop::EndTurn),
        ("max_tokens", ModelStop::MaxTokens),
        ("model_context_window_exceeded", ModelStop::MaxTokens),
        ("refusal", ModelStop::Refusal),
        ("something_new", ModelStop::EndTurn),
    ] {
        let (out, _) = run(&fake, Reply::text("t").finish(reason)).await;
        assert_eq!(out.unwrap().stop, want, "{reason}");
    }
    let (out, _) = run(&fake, Reply::tool_calls(&[("toolu_1", "f", json!({}))])).await;
    assert_eq!(out.unwrap().stop, ModelStop::ToolUse);
    // Tool calls with an odd stop reason still ask for the tools.
    let (out, _) = run(
        &fake,
        Reply::tool_calls(&[("toolu_1", "f", json!({}))]).finish("end_turn"),
    )
    .await;
    assert_eq!(out.unwrap().stop, ModelStop::ToolUse);
}

#[tokio::test]
async fn usage_is_input_from_message_start_and_output_from_message_delta() {
    let fake = FakeAnthropic::start().await;
    let (out, _) = run(&fake, Reply::text("counted").usage(123, 45)).await;
    assert_eq!(
        out.unwrap().usage,
        Usage {
            input_tokens: 123,
            output_tokens: 45,
            ..Default::default()
        }
    );
    // Cached prompt tokens count as input; output_tokens is cumulative (the last one wins).
    let events = [
        json!({"type": "message_start", "message": {"usage": {"input_tokens": 5,
                "cache_creation_input_tokens": 100, "cache_read_input_tokens": 1000, "output_tokens": 1}}}),
        block_start(0, json!({"type": "text", "text": ""})),
        delta(0, json!({"type": "text_delta", "text": "x"})),
        json!({"type": "message_delta", "delta": {}, "usage": {"output_tokens": 3}}),
        json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 7}}),
        json!({"type": "message_stop"}),
    ];
    let out = run_raw(&sse(&events)).await.unwrap();
    assert_eq!(
        out.usage,
        Usage {
            input_tokens: 1105,
            output_tokens: 7,
            cached_input_tokens: 1000,
        }
    );
}

#[tokio::test]
async fn http_529_and_500_are_retryable_with_the_message() {
    let fake = FakeAnthropic::start().await;
    let (out, _) = run(
        &fake,
        Reply::api_error(529, "overloaded_error", "Overloaded").header("retry-after", "7"),
    )
    .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(529));
    assert!(err.retryable);
    // The client's message: the status and the error type; the upstream's words: the log's.
    assert_eq!(
        err.message,
        "the upstream answered HTTP 529 (the upstream failed), error type overloaded_error"
    );
    assert_eq!(err.detail.as_deref(), Some("overloaded_error: Overloaded"));
    assert_eq!(err.retry_after, Some(Duration::from_secs(7)));
    let (out, _) = run(
        &fake,
        Reply::api_error(500, "api_error", "Internal server error"),
    )
    .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(500));
    assert!(err.retryable);
    assert!(err.message.contains("api_error"), "{}", err.message);
    assert!(err.to_string().contains("Internal server error"), "{err}");
    assert_eq!(err.retry_after, None);
    let (out, _) = run(
        &fake,
        Reply::api_error(429, "rate_limit_error", "slow down"),
    )
    .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(429));
    assert!(err.retryable);
}

#[tokio::test]
async fn http_400_is_not_retryable() {
    let fake = FakeAnthropic::start().await;
    let (out, _) = run(
        &fake,
        Reply::api_error(400, "invalid_request_error", "max_tokens: must be positive"),
    )
    .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(400));
    assert!(!err.retryable);
    assert!(
        err.message.contains("HTTP 400") && err.message.contains("invalid_request_error"),
        "{}",
        err.message
    );
    assert!(!err.message.contains("max_tokens"), "{}", err.message);
    assert!(
        err.to_string()
            .contains("invalid_request_error: max_tokens: must be positive"),
        "the log line has the upstream's message: {err}"
    );
    assert_eq!(error_message(b""), "(empty body)");
    assert_eq!(error_message(b"{\"error\": \"plain\"}"), "plain");
    let page = format!("<html>{}</html>", "x".repeat(2000));
    assert_eq!(error_message(page.as_bytes()).len(), 500 + '…'.len_utf8());
}

#[tokio::test]
async fn error_events_inside_the_stream() {
    let fake = FakeAnthropic::start().await;
    let (out, rec) = run(
        &fake,
        Reply::text("partial").error_event("overloaded_error", "Overloaded"),
    )
    .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(529));
    assert!(err.retryable);
    assert!(err.message.contains("overloaded_error"), "{}", err.message);
    assert!(!err.message.contains("Overloaded"), "{}", err.message);
    assert!(err.to_string().contains("Overloaded"), "{err}");
    assert_eq!(rec.text.concat(), "partial");
    let (out, _) = run(&fake, Reply::text("p").error_event("api_error", "boom")).await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(500));
    assert!(err.retryable);
    let (out, _) = run(
        &fake,
        Reply::text("p").error_event("invalid_request_error", "bad"),
    )
    .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(400));
    assert!(!err.retryable);
    let (out, _) = run(&fake, Reply::text("p").error_event("mystery_error", "?")).await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(500));
    assert!(!err.retryable);
}

#[tokio::test]
async fn a_broken_stream_is_a_stream_error() {
    let fake = FakeAnthropic::start().await;
    // message_start, ping, block start, 2 deltas: then the break.
    let (out, rec) = run(&fake, Reply::text("abcdefghijkl").break_after(5)).await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Stream);
    assert!(err.retryable);
    assert_eq!(
        rec.text.concat(),
        "abcdefgh",
        "what came before the break was streamed"
    );
}

#[tokio::test]
async fn a_stream_ending_early_is_a_stream_error() {
    let events = [
        start(1),
        block_start(0, json!({"type": "text", "text": ""})),
        delta(0, json!({"type": "text_delta", "text": "par"})),
    ];
    let err = run_raw(&sse(&events)).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Stream);
    // With a stop reason but no message_stop (and no final blank line): accepted.
    let mut events = events.to_vec();
    events.push(stop("end_turn", 2)[0].clone());
    let out = run_raw(sse(&events).trim_end()).await.unwrap();
    assert_eq!(out.text, "par");
}

#[tokio::test]
async fn garbage_is_a_protocol_error_never_a_panic() {
    for body in [
            "event: message_start\ndata: {\"type\": \"message_start\"\n\n",
            "data: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": 5}}\n\n",
            "data: {\"type\": \"content_block_start\", \"index\": -1, \"content_block\": {\"type\": \"text\"}}\n\n",
            "data: [1, 2]\n\n",
            "data: {\"no_type\": true}\n\n",
        ] {
            let err = run_raw(body).await.unwrap_err();
            assert_eq!(err.kind, UpstreamErrorKind::Protocol, "{body}");
        }
    // A stream of nothing but comments and pings is not an answer.
    let err = run_raw(": hi\n\nevent: ping\ndata: {\"type\": \"ping\"}\n\n")
        .await
        .unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Stream);
}

#[tokio::test]
async fn a_non_streamed_json_answer_is_read_whole() {
    let fake = FakeAnthropic::start().await;
    let answer = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
            "content": [
                {"type": "thinking", "thinking": "r", "signature": "s"},
                {"type": "text", "text": "whole answer"},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}}],
            "stop_reason": "tool_use", "usage": {"input_tokens": 3, "output_tokens": 4}});
    let (out, rec) = run(
        &fake,
        Reply::raw(&answer.to_string()).header("content-type", "application/json"),
    )
    .await;
    let out = out.unwrap();
    assert_eq!(out.text, "whole answer");
    assert_eq!(rec.text.concat(), "whole answer");
    assert_eq!(out.thinking, "r");
    assert_eq!(out.signed_thinking, vec![signed("r", "s")]);
    assert_eq!(out.stop, ModelStop::ToolUse);
    assert_eq!(out.tool_calls[0].input, json!({"a": 1}));
    assert_eq!(
        out.usage,
        Usage {
            input_tokens: 3,
            output_tokens: 4,
            ..Default::default()
        }
    );
}

#[tokio::test]
async fn the_whole_call_is_bounded_by_the_timeout() {
    let fake = FakeAnthropic::start().await;
    let gate = Gate::new();
    fake.push(Reply::text("never finishes").hold(gate.clone()));
    let p = Anthropic::new(fake.base_url(), None, Duration::from_millis(300), 100);
    let mut rec = Rec::default();
    let err = p.complete(&ask("hi"), &mut rec).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Timeout);
    assert!(!err.retryable);
    assert_eq!(
        rec.text.concat(),
        "never finishes",
        "deltas streamed before the hold"
    );
    gate.open();
}

#[tokio::test]
async fn connection_refused_and_bad_config() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let p = Anthropic::new(
        format!("http://{addr}/v1"),
        None,
        Duration::from_secs(5),
        100,
    );
    let err = p
        .complete(&ask("hi"), &mut Rec::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Connect);
    assert!(err.retryable);
    assert!(!err.message.contains(&addr.to_string()), "{}", err.message);
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
    let p = Anthropic::new("not a url".into(), None, Duration::from_secs(5), 100);
    let err = p
        .complete(&ask("hi"), &mut Rec::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Connect);
    assert!(!err.retryable);
    let p = Anthropic::new(
        format!("http://{addr}/v1"),
        Some("bad\nkey".into()),
        Duration::from_secs(5),
        100,
    );
    let err = p
        .complete(&ask("hi"), &mut Rec::default())
        .await
        .unwrap_err();
    assert!(!err.retryable);
    assert!(!err.message.contains("bad\nkey"));
}

#[tokio::test]
async fn connections_are_reused() {
    let fake = FakeAnthropic::start().await;
    let p = provider(&fake);
    assert_eq!(p.name(), "anthropic");
    for i in 0..5 {
        fake.push(Reply::text(&format!("answer {i}")));
        let out = p.complete(&ask("hi"), &mut Rec::default()).await.unwrap();
        assert_eq!(out.text, format!("answer {i}"));
    }
    assert!(
        fake.connections() <= 2,
        "connections: {}",
        fake.connections()
    );
}

#[tokio::test]
async fn the_request_maps_the_history_tools_headers_and_images() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::text("done"));
    let p = Anthropic::new(
        fake.base_url(),
        Some("sk-ant-test".into()),
        Duration::from_secs(10),
        1000,
    );
    let req = ModelRequest {
            model: "claude-test".into(),
            system: Some("Be brief.".into()),
            messages: vec![
                Message::User {
                    content: Content::Text("Weather and time in Tokyo?".into()),
                },
                Message::Assistant {
                    content: Content::Blocks(vec![
                        Block::thinking("two tools"),
                        Block::Text {
                            text: "Checking.".into(),
                        },
                        Block::ToolUse {
                            tool_call_id: "toolu_1".into(),
                            name: "get_weather".into(),
                            input: json!({"city": "Tokyo"}),
                        },
                        Block::ToolUse {
                            tool_call_id: "toolu_2".into(),
                            name: "get_time".into(),
                            input: json!({}),
                        },
                    ]),
                },
                Message::Tool {
                    tool_call_id: "toolu_1".into(),
                    content: Content::Text("18C".into()),
                },
                Message::Tool {
                    tool_call_id: "toolu_2".into(),
                    content: Content::Blocks(vec![Block::Text {
                        text: "09:00".into(),
                    }]),
                },
                // A user message right after tool results: the same user turn.
                Message::User {
                    content: Content::Text("Also, be quick.".into()),
                },
                Message::Assistant {
                    content: Content::Blocks(vec![Block::ToolUse {
                        tool_call_id: "toolu_3".into(),
                        name: "noop".into(),
                        input: Value::Null,
                    }]),
                },
                Message::Tool {
                    tool_call_id: "toolu_3".into(),
                    content: Content::Text("".into()),
                },
                Message::Assistant {
                    content: Content::Text("It is 18C at 09:00.".into()),
                },
                // Two assistant messages in a row: merged.
                Message::Assistant {
                    content: Content::Blocks(vec![Block::thinking("only thinking: dropped")]),
                },
                Message::Assistant {
                    content: Content::Text("Anything else?".into()),
                },
                Message::User {
                    content: Content::Blocks(vec![
                        Block::Text {
                            text: "And this?".into(),
                        },
                        Block::Image {
                            url: "data:image/png;base64,iVBORw0KGgo=".into(),
                        },
                        Block::Image {
                            url: "https://example.com/cat.jpg".into(),
                        },
                        Block::Text { text: "".into() },
                    ]),
                },
            ],
            tools: vec![
                ToolDef {
                    name: "get_weather".into(),
                    description: "Weather for a city".into(),
                    parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}).into(),
                },
                ToolDef {
                    name: "noop".into(),
                    description: "".into(),
                    parameters: Value::Null.into(),
                },
            ],
            max_tokens: None,
            thinking: false,
            tuning: Default::default(),
        };
    let out = p.complete(&req, &mut Rec::default()).await.unwrap();
    assert_eq!(out.text, "done");
    let sent = fake.wait_requests(1).await.remove(0);
    assert_eq!(
        sent,
        json!({
            "model": "claude-test",
            "max_tokens": 1000,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "Weather and time in Tokyo?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Tokyo"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "get_time", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "09:00"},
                    {"type": "text", "text": "Also, be quick."},
                ]},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "toolu_3", "name": "noop", "input": {}},
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_3", "content": ""},
                ]},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "It is 18C at 09:00."},
                    {"type": "text", "text": "Anything else?", "cache_control": {"type": "ephemeral"}},
                ]},
                {"role": "user", "content": [
                    {"type": "text", "text": "And this?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
                ]},
            ],
            "tools": [
                {"name": "get_weather", "description": "Weather for a city",
                 "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
                {"name": "noop", "input_schema": {"type": "object", "properties": {}},
                 "cache_control": {"type": "ephemeral"}},
            ],
            "stream": true,
        })
    );
    // Roles strictly alternate.
    let roles: Vec<&str> = sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert!(roles.windows(2).all(|w| w[0] != w[1]), "{roles:?}");
    let headers = &fake.request_headers()[0];
    assert_eq!(headers["x-api-key"], "sk-ant-test");
    assert_eq!(headers["anthropic-version"], "2023-06-01");
    assert_eq!(headers["content-type"], "application/json");
    assert!(headers.get("authorization").is_none());
    // Without a system prompt, tools or key: those keys and the header are absent.
    fake.push(Reply::text("x"));
    provider(&fake)
        .complete(&ask("plain"), &mut Rec::default())
        .await
        .unwrap();
    let sent = fake.wait_requests(2).await.remove(1);
    assert!(sent.get("system").is_none() && sent.get("tools").is_none());
    assert_eq!(
        sent["messages"],
        json!([{"role": "user", "content": "plain"}])
    );
    assert!(fake.request_headers()[1].get("x-api-key").is_none());
    assert_eq!(fake.request_headers()[1]["anthropic-version"], "2023-06-01");
}

#[test]
fn temperature_and_stop_sequences_are_sent_when_set() {
    let mut req = ask("hi");
    let body = request_body(&req, 10);
    assert!(body.get("temperature").is_none() && body.get("stop_sequences").is_none());
    req.tuning.temperature = Some(0.5);
    req.tuning.stop = vec!["END".into()];
    let body = request_body(&req, 10);
    assert_eq!(body["temperature"], 0.5);
    assert_eq!(body["stop_sequences"], json!(["END"]));
}

#[test]
fn system_messages_in_the_history_join_the_system_prompt() {
    let mut req = ask("hi");
    req.system = Some("A.".into());
    req.messages.insert(
        0,
        Message::System {
            content: "B.".into(),
        },
    );
    let body = request_body(&req, 10);
    assert_eq!(body["system"][0]["text"], "A.\n\nB.");
    assert_eq!(body["messages"].as_array().unwrap().len(), 1);
}

#[test]
fn tool_results_come_first_and_keep_images() {
    let req = ModelRequest {
        messages: vec![
            Message::Assistant {
                content: Content::Blocks(vec![Block::ToolUse {
                    tool_call_id: "t1".into(),
                    name: "shot".into(),
                    input: json!({}),
                }]),
            },
            Message::User {
                content: Content::Text("meanwhile".into()),
            },
            Message::Tool {
                tool_call_id: "t1".into(),
                content: Content::Blocks(vec![
                    Block::Text {
                        text: "a screenshot".into(),
                    },
                    Block::Image {
                        url: "data:image/jpeg;base64,/9j/AA==".into(),
                    },
                ]),
            },
        ],
        ..ask("")
    };
    let body = request_body(&req, 10);
    assert_eq!(
        body["messages"][1],
        json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "a screenshot"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": "/9j/AA=="}},
            ]},
            {"type": "text", "text": "meanwhile"},
        ]})
    );
}

#[test]
fn data_uris() {
    let img = |url: &str| image_block(url)["source"].clone();
    assert_eq!(
        img("data:image/webp;base64, UklG\nRg== "),
        json!({"type": "base64", "media_type": "image/webp", "data": "UklGRg=="})
    );
    // No media type: sniffed from the data.
    assert_eq!(img("data:;base64,R0lGODlh")["media_type"], "image/gif");
    assert_eq!(img("data:;base64,/9j/4AAQ")["media_type"], "image/jpeg");
    // Not base64: percent-decoded, then encoded.
    assert_eq!(
        img("data:image/svg+xml,%3Csvg%2F%3E"),
        json!({"type": "base64", "media_type": "image/svg+xml", "data": "PHN2Zy8+"})
    );
    assert_eq!(
        img("data:image/png,f%6F%6")["data"],
        "Zm8lNg==",
        "a cut escape is kept as it is"
    );
    assert_eq!(img("http://example.com/x.png")["type"], "url");
}

#[test]
fn retry_after_parsing() {
    assert_eq!(parse_retry_after(" 12 "), Some(Duration::from_secs(12)));
    assert_eq!(parse_retry_after("1.5"), Some(Duration::from_millis(1500)));
    assert_eq!(parse_retry_after("-1"), None);
    assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
}

use super::*;
use crate::testkit::fake_openai::{FakeOpenAi, Gate, Reply};
use crate::upstream::ToolDef;
use std::sync::Arc;
use tokio::sync::mpsc;

use crate::testkit::sinks::{Forward, Rec};

fn provider(fake: &FakeOpenAi) -> OpenAi {
    OpenAi::new(fake.base_url(), None, Duration::from_secs(10))
}

fn ask(text: &str) -> ModelRequest {
    ModelRequest {
        model: "test-model".into(),
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

async fn run(fake: &FakeOpenAi, reply: Reply) -> (Result<ModelOutput, UpstreamError>, Rec) {
    fake.push(reply);
    let mut rec = Rec::default();
    let out = provider(fake).complete(&ask("hi"), &mut rec).await;
    (out, rec)
}

async fn run_raw(body: &str) -> Result<ModelOutput, UpstreamError> {
    let fake = FakeOpenAi::start().await;
    run(&fake, Reply::raw(body).chunk_chars(7)).await.0
}

fn sse(chunks: &[Value]) -> String {
    chunks.iter().map(|c| format!("data: {c}\n\n")).collect()
}

#[tokio::test]
async fn text_streams_as_fragments() {
    let fake = FakeOpenAi::start().await;
    let text = "The quick brown fox jumps over the lazy dog, naïvely 🦊.";
    let (out, rec) = run(&fake, Reply::text(text)).await;
    let out = out.unwrap();
    assert_eq!(out.text, text);
    assert!(rec.text.len() > 5, "fragments: {:?}", rec.text);
    assert_eq!(rec.text.concat(), text);
    assert!(rec.text.iter().all(|f| !f.is_empty()));
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
    let fake = Arc::new(FakeOpenAi::start().await);
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
async fn thinking_streams_before_text() {
    let fake = FakeOpenAi::start().await;
    let (out, rec) = run(&fake, Reply::text("42").thinking("Let me think it over.")).await;
    let out = out.unwrap();
    assert_eq!(out.thinking, "Let me think it over.");
    assert!(rec.thinking.len() > 1);
    assert_eq!(rec.thinking.concat(), out.thinking);
    assert_eq!(out.text, "42");
}

#[tokio::test]
async fn reasoning_field_is_accepted_too() {
    let body = sse(&[
        json!({"choices": [{"index": 0, "delta": {"reasoning": "hmm "}, "finish_reason": null}]}),
        json!({"choices": [{"index": 0, "delta": {"reasoning": "ok", "content": "yes"}, "finish_reason": null}]}),
        // Servers that send both carry the same text: taken once.
        json!({"choices": [{"index": 0, "delta": {"reasoning": "!", "reasoning_content": "!"}, "finish_reason": "stop"}]}),
    ]) + "data: [DONE]\n\n";
    let out = run_raw(&body).await.unwrap();
    assert_eq!(out.thinking, "hmm ok!");
    assert_eq!(out.text, "yes");
}

#[tokio::test]
async fn parallel_tool_calls_are_assembled_by_index() {
    let fake = FakeOpenAi::start().await;
    let weather = json!({"city": "Tokyo", "units": {"temp": "C"}, "days": [1, 2, 3]});
    let time = json!({"tz": "Asia/Tokyo — 東京"});
    let (out, rec) = run(
        &fake,
        Reply::tool_calls(&[
            ("call_w", "get_weather", weather.clone()),
            ("call_t", "get_time", time.clone()),
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
                id: "call_w".into(),
                name: "get_weather".into(),
                input: weather
            },
            ToolCall {
                id: "call_t".into(),
                name: "get_time".into(),
                input: time
            },
        ]
    );
}

#[tokio::test]
async fn tool_call_quirks_missing_id_empty_arguments_stop_reason() {
    let body = sse(&[
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 1, "function": {"name": "second", "arguments": ""}},
                {"index": 0, "id": "call_x", "function": {"name": "first", "arguments": "{\"a\""}}]}, "finish_reason": null}]}),
        // Repeated id/name in a later fragment must not be doubled.
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "id": "call_x", "function": {"name": "first", "arguments": ":1}"}}]}, "finish_reason": null}]}),
        json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    ]) + "data: [DONE]\n\n";
    let out = run_raw(&body).await.unwrap();
    assert_eq!(out.stop, ModelStop::ToolUse, "stop with tool calls");
    assert_eq!(out.tool_calls.len(), 2);
    assert_eq!(out.tool_calls[0].id, "call_x");
    assert_eq!(out.tool_calls[0].name, "first");
    assert_eq!(out.tool_calls[0].input, json!({"a": 1}));
    assert_eq!(out.tool_calls[1].name, "second");
    assert_eq!(out.tool_calls[1].input, json!({}));
    let id = &out.tool_calls[1].id;
    assert!(id.starts_with("call_") && id.len() > 5, "{id}");
    assert!(id[5..].chars().all(|c| c.is_ascii_hexdigit()));
}

#[tokio::test]
async fn tool_calls_without_index_or_finish_reason() {
    let body = sse(&[
        json!({"choices": [{"delta": {"tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "{}"}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"id": "b", "function": {"name": "g", "arguments": "{\"x\""}}]}}]}),
        json!({"choices": [{"delta": {"tool_calls": [{"function": {"arguments": ":2}"}}]}}]}),
    ]) + "data: [DONE]\n\n";
    let out = run_raw(&body).await.unwrap();
    assert_eq!(out.stop, ModelStop::ToolUse);
    let got: Vec<(&str, &str, &Value)> = out
        .tool_calls
        .iter()
        .map(|c| (c.id.as_str(), c.name.as_str(), &c.input))
        .collect();
    assert_eq!(
        got,
        vec![("a", "f", &json!({})), ("b", "g", &json!({"x": 2}))]
    );
}

#[tokio::test]
async fn invalid_tool_arguments_are_a_protocol_error_naming_the_tool() {
    let fake = FakeOpenAi::start().await;
    let body = sse(&[
        json!({"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "function": {"name": "get_weather", "arguments": "{\"city\": Tok"}}]}, "finish_reason": "tool_calls"}]}),
    ]) + "data: [DONE]\n\n";
    let err = run(&fake, Reply::raw(&body)).await.0.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Protocol);
    assert!(!err.retryable);
    assert!(err.message.contains("get_weather"), "{}", err.message);
    // Cut by max_tokens instead: the broken call is dropped, the stop says why.
    let cut = body.replace("\"tool_calls\"}]", "\"length\"}]");
    let out = run(&fake, Reply::raw(&cut)).await.0.unwrap();
    assert_eq!(out.stop, ModelStop::MaxTokens);
    assert!(out.tool_calls.is_empty());
}

#[tokio::test]
async fn finish_reasons_length_and_content_filter() {
    let fake = FakeOpenAi::start().await;
    let (out, _) = run(&fake, Reply::text("trunc").finish("length")).await;
    assert_eq!(out.unwrap().stop, ModelStop::MaxTokens);
    let (out, _) = run(&fake, Reply::text("").finish("content_filter")).await;
    assert_eq!(out.unwrap().stop, ModelStop::Refusal);
    let (out, _) = run(&fake, Reply::text("odd").finish("something_new")).await;
    assert_eq!(out.unwrap().stop, ModelStop::EndTurn);
    let (out, _) = run(
        &fake,
        Reply::tool_calls(&[("c", "f", json!({}))]).finish("function_call"),
    )
    .await;
    assert_eq!(out.unwrap().stop, ModelStop::ToolUse);
}

#[tokio::test]
async fn usage_comes_from_the_final_chunk() {
    let fake = FakeOpenAi::start().await;
    let (out, _) = run(&fake, Reply::text("counted").usage(123, 45)).await;
    assert_eq!(
        out.unwrap().usage,
        Usage {
            input_tokens: 123,
            output_tokens: 45,
            ..Default::default()
        }
    );
}

#[tokio::test]
async fn cached_prompt_tokens_come_from_the_usage_details() {
    let fake = FakeOpenAi::start().await;
    let body = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":100,\"completion_tokens\":2,",
        "\"prompt_tokens_details\":{\"cached_tokens\":80}}}\n\n",
        "data: [DONE]\n\n"
    );
    let (out, _) = run(&fake, Reply::raw(body)).await;
    assert_eq!(
        out.unwrap().usage,
        Usage {
            input_tokens: 100,
            output_tokens: 2,
            cached_input_tokens: 80,
        }
    );
}

#[tokio::test]
async fn http_500_is_a_retryable_status_error_with_the_upstream_message() {
    let fake = FakeOpenAi::start().await;
    let (out, _) = run(
        &fake,
        Reply::status(
            500,
            json!({"error": {"message": "the model crashed", "type": "server_error"}}),
        ),
    )
    .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(500));
    assert!(err.retryable);
    assert_eq!(
        err.message,
        "the upstream answered HTTP 500 (the upstream failed), error type server_error"
    );
    assert!(err.to_string().contains("the model crashed"), "{err}");
    assert_eq!(err.retry_after, None);
    // Nothing queued: the fake's own 500 message comes through.
    let err = provider(&fake)
        .complete(&ask("x"), &mut Rec::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("fake upstream: no scripted reply"));
}

#[tokio::test]
async fn secrets_an_error_body_echoes_are_redacted_from_what_is_logged() {
    let fake = FakeOpenAi::start().await;
    let key = "sk-this-key-must-not-be-logged";
    let org = "org-private-header-value";
    let provider = OpenAi::new(fake.base_url(), Some(key.into()), Duration::from_secs(10))
        .with_headers(vec![(
            http::HeaderName::from_static("openai-organization"),
            http::HeaderValue::from_static("org-private-header-value"),
        )]);
    let echo = format!("Incorrect API key provided: {key} (Bearer {key}) for {org}");
    fake.push(Reply::status(401, json!({"error": {"message": echo}})));
    let err = provider
        .complete(&ask("hi"), &mut Rec::default())
        .await
        .unwrap_err();
    // The log line is the error's message and detail.
    let logged = format!("{err} {}", err.detail.clone().unwrap_or_default());
    assert!(
        logged.contains("Incorrect API key provided: [redacted]"),
        "{logged}"
    );
    assert!(!logged.contains(key) && !logged.contains(org), "{logged}");
    // A broken stream's error event is redacted too.
    fake.push(Reply::raw(&format!(
        "data: {}\n\n",
        json!({"error": {"message": format!("bad key {key}")}})
    )));
    let err = provider
        .complete(&ask("hi"), &mut Rec::default())
        .await
        .unwrap_err();
    let logged = format!("{err} {:?}", err.detail);
    assert!(!logged.contains(key), "{logged}");
}

#[tokio::test]
async fn http_429_carries_retry_after() {
    let fake = FakeOpenAi::start().await;
    let (out, _) = run(
        &fake,
        Reply::status(429, json!({"error": {"message": "rate limited"}}))
            .header("Retry-After", "7"),
    )
    .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(429));
    assert!(err.retryable);
    assert_eq!(err.retry_after, Some(Duration::from_secs(7)));
}

#[tokio::test]
async fn http_400_is_not_retryable() {
    let fake = FakeOpenAi::start().await;
    let (out, _) = run(
        &fake,
        Reply::status(
            400,
            json!({"error": {"message": "max_tokens is too large", "param": "max_tokens"}}),
        ),
    )
    .await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(400));
    assert!(!err.retryable);
    // No error type in the body: the status alone; the upstream's words go to the log.
    assert_eq!(
        err.message,
        "the upstream answered HTTP 400 (the upstream refused the request)"
    );
    assert!(err.to_string().contains("max_tokens is too large"), "{err}");
}

#[tokio::test]
async fn a_non_json_error_body_is_quoted_cut_at_500_bytes() {
    let fake = FakeOpenAi::start().await;
    let page = format!("<html>{}</html>", "x".repeat(2000));
    let (out, _) = run(
        &fake,
        Reply::raw(&page)
            .chunk_chars(4096)
            .header("content-type", "text/html"),
    )
    .await;
    // A 200 with HTML is not a stream: no [DONE], no finish.
    assert_eq!(out.unwrap_err().kind, UpstreamErrorKind::Stream);
    assert_eq!(error_message(page.as_bytes()).len(), 500 + '…'.len_utf8());
    assert_eq!(error_message(b"{\"error\": \"plain\"}"), "plain");
    assert_eq!(error_message(b""), "(empty body)");
}

#[tokio::test]
async fn a_broken_stream_is_a_stream_error() {
    let fake = FakeOpenAi::start().await;
    let (out, rec) = run(&fake, Reply::text("abcdefghijkl").break_after(2)).await;
    let err = out.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Stream);
    assert!(err.retryable);
    assert_eq!(
        rec.text.concat(),
        "abcd",
        "what came before the break was streamed"
    );
}

#[tokio::test]
async fn a_stream_ending_without_done_or_finish_is_a_stream_error() {
    let body = sse(&[
        json!({"choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": null}]}),
    ]);
    let err = run_raw(&body).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Stream);
    // With a finish_reason but no [DONE] (and no final blank line): accepted.
    let body = sse(&[
        json!({"choices": [{"index": 0, "delta": {"content": "whole"}, "finish_reason": "stop"}]}),
    ]);
    let out = run_raw(body.trim_end()).await.unwrap();
    assert_eq!(out.text, "whole");
}

#[tokio::test]
async fn errors_inside_the_stream() {
    let body = sse(&[
        json!({"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": null}]}),
        json!({"error": {"message": "overloaded", "type": "server_error"}}),
    ]);
    let err = run_raw(&body).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(500));
    assert!(err.retryable);
    assert!(err.message.contains("server_error"), "{}", err.message);
    assert!(err.to_string().contains("overloaded"), "{err}");
    let body = sse(&[json!({"error": {"message": "bad input", "code": 400}})]);
    let err = run_raw(&body).await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Status(400));
    assert!(!err.retryable);
    let err = run_raw("data: {\"choices\": [\n\n").await.unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Protocol);
    let err = run_raw("data: {\"choices\": [{\"delta\": {\"content\": 5}}]}\n\n")
        .await
        .unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Protocol);
}

#[tokio::test]
async fn comments_and_other_fields_are_ignored() {
    let body = ": OPENROUTER PROCESSING\r\n\r\nevent: message\r\nid: 1\r\ndata: {\"choices\":[{\"delta\":{\"content\":\"ok\"},\"finish_reason\":\"stop\"}],\"usage\":null}\r\n\r\ndata: [DONE]\r\n\r\n";
    let out = run_raw(body).await.unwrap();
    assert_eq!(out.text, "ok");
    assert_eq!(out.stop, ModelStop::EndTurn);
}

#[tokio::test]
async fn a_non_streamed_json_answer_is_read_whole() {
    let fake = FakeOpenAi::start().await;
    let answer = json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0,
            "message": {"role": "assistant", "content": "whole answer", "reasoning_content": "r",
                        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
            "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 3, "completion_tokens": 4}});
    let (out, rec) = run(
        &fake,
        Reply::raw(&answer.to_string()).header("content-type", "application/json"),
    )
    .await;
    let out = out.unwrap();
    assert_eq!(out.text, "whole answer");
    assert_eq!(rec.text.concat(), "whole answer");
    assert_eq!(out.thinking, "r");
    assert_eq!(out.stop, ModelStop::ToolUse);
    assert_eq!(out.tool_calls[0].input, json!({"a": 1}));
    assert_eq!(out.usage.output_tokens, 4);
}

#[tokio::test]
async fn the_whole_call_is_bounded_by_the_timeout() {
    let fake = FakeOpenAi::start().await;
    let gate = Gate::new();
    fake.push(Reply::text("never finishes").hold(gate.clone()));
    let p = OpenAi::new(fake.base_url(), None, Duration::from_millis(300));
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
async fn connection_refused_is_a_connect_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let p = OpenAi::new(format!("http://{addr}/v1"), None, Duration::from_secs(5));
    let err = p
        .complete(&ask("hi"), &mut Rec::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Connect);
    assert!(err.retryable);
    assert!(!err.message.contains(&addr.to_string()), "{}", err.message);
    assert!(err.to_string().contains(&addr.to_string()), "{err}");
}

#[tokio::test]
async fn a_bad_base_url_is_a_non_retryable_error() {
    let p = OpenAi::new("not a url".into(), None, Duration::from_secs(5));
    let err = p
        .complete(&ask("hi"), &mut Rec::default())
        .await
        .unwrap_err();
    assert_eq!(err.kind, UpstreamErrorKind::Connect);
    assert!(!err.retryable);
}

#[tokio::test]
async fn connections_are_reused() {
    let fake = FakeOpenAi::start().await;
    let p = provider(&fake);
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

/// A raw HTTP/1 upstream that reads each request whole and answers it with the head and
/// body `answer` makes of an event stream saying "ok", then drops the connection (closing
/// it) or, with `keep_open`, holds it open and silent. Its address and count of connections.
async fn raw_upstream(
    answer: fn(&str) -> String,
    keep_open: bool,
) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((mut sock, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let mut req = Vec::new();
            let mut buf = [0u8; 4096];
            // The head, then as many body bytes as Content-Length says.
            let (head_end, length) = loop {
                let n = sock.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before sending a request");
                req.extend_from_slice(&buf[..n]);
                if let Some(i) = req.windows(4).position(|w| w == b"\r\n\r\n") {
                    let head = String::from_utf8_lossy(&req[..i]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map(|v| v.trim().parse().unwrap())
                        .unwrap_or(0);
                    break (i + 4, length);
                }
            };
            while req.len() < head_end + length {
                let n = sock.read(&mut buf).await.unwrap();
                req.extend_from_slice(&buf[..n]);
            }
            let body = sse(&[
                json!({"choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": null}]}),
                json!({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
            ]) + "data: [DONE]\n\n";
            sock.write_all(answer(&body).as_bytes()).await.unwrap();
            if keep_open {
                open.push(sock);
            }
        }
    });
    (addr, accepted)
}

#[tokio::test]
async fn a_server_that_closes_each_connection_after_answering_costs_no_call() {
    // Answers one request per connection, then closes it without saying so (no
    // `Connection: close`): the pooled connection is dead when the next call comes.
    let (addr, accepted) = raw_upstream(
            |body| {
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
            },
            false,
        )
        .await;
    let p = OpenAi::new(format!("http://{addr}/v1"), None, Duration::from_secs(5));
    for _ in 0..5 {
        let out = p.complete(&ask("hi"), &mut Rec::default()).await.unwrap();
        assert_eq!(out.text, "ok");
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 5);
}

#[tokio::test]
async fn an_answer_whose_body_never_ends_costs_its_connection_not_the_next_call() {
    // Sends the final event in a chunked body and never the body's end (the chunk of size
    // 0), keeping the connection open: the call ends at `[DONE]`, and the next one cannot
    // reuse the connection, whose last answer is still going on.
    let (addr, accepted) = raw_upstream(
            |body| {
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n",
                    body.len()
                )
            },
            true,
        )
        .await;
    let p = OpenAi::new(format!("http://{addr}/v1"), None, Duration::from_secs(5));
    for _ in 0..3 {
        let out = p.complete(&ask("hi"), &mut Rec::default()).await.unwrap();
        assert_eq!(out.text, "ok");
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn the_request_names_its_host_and_path() {
    let fake = FakeOpenAi::start().await;
    fake.record_requests(true);
    fake.push(Reply::text("done"));
    provider(&fake)
        .complete(&ask("hi"), &mut Rec::default())
        .await
        .unwrap();
    let headers = fake.request_headers();
    assert_eq!(headers.len(), 1, "one request reached /chat/completions");
    assert_eq!(
        headers[0].get("host").and_then(|h| h.to_str().ok()),
        Some(fake.addr().to_string().as_str())
    );
}

#[tokio::test]
async fn the_request_carries_the_history_tools_and_key() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("done"));
    let p = OpenAi::new(
        fake.base_url(),
        Some("sk-test".into()),
        Duration::from_secs(10),
    );
    let req = ModelRequest {
            model: "gpt-test".into(),
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
                            tool_call_id: "call_1".into(),
                            name: "get_weather".into(),
                            input: json!({"city": "Tokyo"}),
                        },
                        Block::ToolUse {
                            tool_call_id: "call_2".into(),
                            name: "get_time".into(),
                            input: json!({}),
                        },
                    ]),
                },
                Message::Tool {
                    tool_call_id: "call_1".into(),
                    content: Content::Text("18C".into()),
                },
                Message::Tool {
                    tool_call_id: "call_2".into(),
                    content: Content::Blocks(vec![Block::Text {
                        text: "09:00".into(),
                    }]),
                },
                Message::Assistant {
                    content: Content::Blocks(vec![Block::ToolUse {
                        tool_call_id: "call_3".into(),
                        name: "noop".into(),
                        input: json!({}),
                    }]),
                },
                Message::Tool {
                    tool_call_id: "call_3".into(),
                    content: Content::Text("".into()),
                },
                Message::Assistant {
                    content: Content::Text("It is 18C at 09:00.".into()),
                },
                Message::User {
                    content: Content::Blocks(vec![
                        Block::Text {
                            text: "And this?".into(),
                        },
                        Block::Image {
                            url: "data:image/png;base64,AAAA".into(),
                        },
                    ]),
                },
            ],
            tools: vec![ToolDef {
                name: "get_weather".into(),
                description: "Weather for a city".into(),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}).into(),
            }],
            max_tokens: Some(256),
            thinking: true,
            tuning: Default::default(),
        };
    let out = p.complete(&req, &mut Rec::default()).await.unwrap();
    assert_eq!(out.text, "done");
    let sent = fake.wait_requests(1).await.remove(0);
    assert_eq!(
        sent,
        json!({
            "model": "gpt-test",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather and time in Tokyo?"},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Tokyo\"}"}},
                    {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
                {"role": "tool", "tool_call_id": "call_2", "content": "09:00"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_3", "type": "function", "function": {"name": "noop", "arguments": "{}"}},
                ]},
                {"role": "tool", "tool_call_id": "call_3", "content": ""},
                {"role": "assistant", "content": "It is 18C at 09:00."},
                {"role": "user", "content": [
                    {"type": "text", "text": "And this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ]},
            ],
            "stream": true,
            "stream_options": {"include_usage": true},
            "tools": [{"type": "function", "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            }}],
            "max_tokens": 256,
        })
    );
    let headers = &fake.request_headers()[0];
    assert_eq!(headers["authorization"], "Bearer sk-test");
    assert_eq!(headers["content-type"], "application/json");
    // Without tools or max_tokens those keys are absent; without a key, no Authorization.
    fake.push(Reply::text("x"));
    provider(&fake)
        .complete(&ask("plain"), &mut Rec::default())
        .await
        .unwrap();
    let sent = fake.wait_requests(2).await.remove(1);
    assert!(sent.get("tools").is_none() && sent.get("max_tokens").is_none());
    assert!(fake.request_headers()[1].get("authorization").is_none());
}

#[test]
fn retry_after_parsing() {
    assert_eq!(parse_retry_after(" 12 "), Some(Duration::from_secs(12)));
    assert_eq!(parse_retry_after("1.5"), Some(Duration::from_millis(1500)));
    assert_eq!(parse_retry_after("-1"), None);
    assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    assert_eq!(parse_retry_after("NaN"), None);
}

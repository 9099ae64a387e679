use super::*;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::sync::Arc;

type TestClient = Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

fn client() -> TestClient {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn post(fake: &FakeOpenAi, body: Value) -> (u16, HeaderMap, Result<String, String>) {
    let req = Request::post(format!("{}/chat/completions", fake.base_url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| String::from_utf8(b.to_bytes().to_vec()).unwrap())
        .map_err(|e| e.to_string());
    (status, headers, body)
}

/// The JSON of every `data:` event but `[DONE]`, and whether `[DONE]` came last.
fn chunks(body: &str) -> (Vec<Value>, bool) {
    let events: Vec<&str> = body
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| e.strip_prefix("data: ").expect("data: line"))
        .collect();
    let done = events.last() == Some(&"[DONE]");
    let json = events
        .iter()
        .filter(|e| **e != "[DONE]")
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    (json, done)
}

fn req(include_usage: bool) -> Value {
    json!({"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": true,
               "stream_options": {"include_usage": include_usage}})
}

#[tokio::test]
async fn text_reply_has_the_openai_chunk_shape() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("Hello, world").usage(7, 3));
    let (status, headers, body) = post(&fake, req(true)).await;
    assert_eq!(status, 200);
    assert_eq!(headers["content-type"], "text/event-stream");
    let (chunks, done) = chunks(&body.unwrap());
    assert!(done);
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        assert_eq!(c["model"], "m1");
        assert!(c["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert!(c["created"].is_u64());
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello, world");
    // 12 chars in pieces of 4, after the role chunk.
    assert_eq!(chunks[1]["choices"][0]["delta"]["content"], "Hell");
    let n = chunks.len();
    assert_eq!(chunks[n - 2]["choices"][0]["finish_reason"], "stop");
    assert_eq!(chunks[n - 1]["choices"], json!([]));
    assert_eq!(chunks[n - 1]["usage"]["prompt_tokens"], 7);
    assert_eq!(chunks[n - 1]["usage"]["completion_tokens"], 3);
    assert_eq!(fake.requests(), vec![req(true)]);
}

#[tokio::test]
async fn no_usage_chunk_unless_asked() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("x"));
    let (_, _, body) = post(&fake, req(false)).await;
    let (chunks, done) = chunks(&body.unwrap());
    assert!(done);
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
}

#[tokio::test]
async fn tool_calls_are_interleaved_by_index() {
    let fake = FakeOpenAi::start().await;
    fake.push(
        Reply::tool_calls(&[
            ("call_a", "get_weather", json!({"city": "Tokyo"})),
            ("call_b", "get_time", json!({"tz": "Asia/Tokyo"})),
        ])
        .with_text("Checking.")
        .thinking("hm"),
    );
    let (_, _, body) = post(&fake, req(true)).await;
    let (chunks, _) = chunks(&body.unwrap());
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c["choices"].get(0).map(|ch| &ch["delta"]))
        .collect();
    let indices: Vec<u64> = deltas
        .iter()
        .filter_map(|d| d["tool_calls"][0]["index"].as_u64())
        .collect();
    assert!(
        indices.windows(2).any(|w| w[0] > w[1]),
        "interleaved: {indices:?}"
    );
    let mut args = [String::new(), String::new()];
    for d in &deltas {
        if let Some(tc) = d["tool_calls"].get(0) {
            let i = tc["index"].as_u64().unwrap() as usize;
            args[i].push_str(tc["function"]["arguments"].as_str().unwrap());
        }
    }
    assert_eq!(
        serde_json::from_str::<Value>(&args[0]).unwrap(),
        json!({"city": "Tokyo"})
    );
    assert_eq!(
        serde_json::from_str::<Value>(&args[1]).unwrap(),
        json!({"tz": "Asia/Tokyo"})
    );
    // Thinking, then text, then tools; finish reason tool_calls.
    let first_text = deltas.iter().position(|d| d["content"] == "Chec").unwrap();
    let first_think = deltas
        .iter()
        .position(|d| d["reasoning_content"] == "hm")
        .unwrap();
    let first_tool = deltas
        .iter()
        .position(|d| d.get("tool_calls").is_some())
        .unwrap();
    assert!(first_think < first_text && first_text < first_tool);
    assert_eq!(deltas.last().unwrap(), &&json!({}));
    let finish = chunks
        .iter()
        .rev()
        .find_map(|c| c["choices"][0]["finish_reason"].as_str());
    assert_eq!(finish, Some("tool_calls"));
}

#[tokio::test]
async fn status_reply_with_header_and_empty_queue() {
    let fake = FakeOpenAi::start().await;
    fake.push(
        Reply::status(429, json!({"error": {"message": "slow down"}})).header("Retry-After", "3"),
    );
    let (status, headers, body) = post(&fake, req(true)).await;
    assert_eq!(status, 429);
    assert_eq!(headers["retry-after"], "3");
    assert_eq!(
        serde_json::from_str::<Value>(&body.unwrap()).unwrap()["error"]["message"],
        "slow down"
    );
    let (status, _, body) = post(&fake, req(true)).await;
    assert_eq!(status, 500);
    assert!(body.unwrap().contains("fake upstream: no scripted reply"));
    assert_eq!(fake.wait_requests(2).await.len(), 2);
}

#[tokio::test]
async fn a_call_without_its_answer_is_refused_as_the_real_api_does() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("kept for the next request"));
    let call = json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
    let user = json!({"role": "user", "content": "go on"});
    let answer = json!({"role": "tool", "tool_call_id": "call_1", "content": "ok"});
    for (messages, wrong) in [
        (
            json!([user, call, user]),
            "comes before the answers to calls [\"call_1\"]",
        ),
        (json!([user, call]), "sent without their answers"),
        (json!([user, answer]), "answers no open call"),
    ] {
        let (status, _, body) = post(&fake, json!({"model": "m", "messages": messages})).await;
        assert_eq!(status, 400, "{messages}");
        let body: Value = serde_json::from_str(&body.unwrap()).unwrap();
        assert_eq!(body["error"]["type"], "invalid_request_error");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains(wrong), "{message}");
    }
    assert_eq!(
        fake.pending_replies(),
        1,
        "a refused request takes no reply"
    );
    let ok = json!({"model": "m", "stream": true, "messages": [user, call, answer, user]});
    assert_eq!(post(&fake, ok).await.0, 200);
}

#[tokio::test]
async fn break_after_ends_the_body_with_an_error() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("abcdefgh").break_after(2));
    let (status, _, body) = post(&fake, req(true)).await;
    assert_eq!(status, 200);
    assert!(body.is_err(), "the client must see a broken body");
}

#[tokio::test]
async fn hold_waits_for_the_gate_and_wait_requests_is_notified() {
    let fake = Arc::new(FakeOpenAi::start().await);
    let gate = Gate::new();
    fake.push(Reply::text("held").hold(gate.clone()));
    let f = fake.clone();
    let waiter = tokio::spawn(async move { f.wait_requests(1).await });
    let f = fake.clone();
    let call = tokio::spawn(async move { post(&f, req(true)).await });
    let seen = waiter.await.unwrap();
    assert_eq!(seen[0]["model"], "m1");
    assert!(!call.is_finished());
    gate.open();
    let (_, _, body) = call.await.unwrap();
    assert!(chunks(&body.unwrap()).1);
}

#[tokio::test]
async fn gate_opened_before_waiting_stays_open() {
    let gate = Gate::new();
    gate.open();
    gate.wait().await;
    gate.clone().wait().await;
    assert!(gate.is_open());
}

#[tokio::test]
async fn fallback_serves_an_empty_queue_after_the_queued_replies() {
    let fake = FakeOpenAi::start().await;
    fake.set_fallback(Reply::text("again").chunk_chars(16));
    fake.push(Reply::text("first"));
    let text = |body: String| -> String {
        chunks(&body)
            .0
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
            .collect()
    };
    let (status, _, body) = post(&fake, req(false)).await;
    assert_eq!(status, 200);
    assert_eq!(text(body.unwrap()), "first");
    for _ in 0..3 {
        let (status, _, body) = post(&fake, req(true)).await;
        assert_eq!(status, 200);
        let body = body.unwrap();
        assert!(chunks(&body).1, "ends with [DONE]");
        assert_eq!(text(body), "again");
    }
    assert_eq!(fake.pending_replies(), 0);
    fake.clear_fallback();
    let (status, _, _) = post(&fake, req(true)).await;
    assert_eq!(status, 500);
    assert_eq!(fake.request_count(), 5);
}

#[tokio::test]
async fn recording_can_be_switched_off_and_connections_are_reused() {
    let fake = FakeOpenAi::start().await;
    fake.set_fallback(Reply::text("x"));
    fake.record_requests(false);
    let client = client();
    for _ in 0..5 {
        let req = Request::post(format!("{}/chat/completions", fake.base_url()))
            .body(Full::new(Bytes::from(req(true).to_string())))
            .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        resp.into_body().collect().await.unwrap();
    }
    assert_eq!(fake.request_count(), 5);
    assert!(fake.requests().is_empty(), "nothing recorded");
    assert_eq!(fake.connections(), 1, "keep-alive: one connection");
    fake.record_requests(true);
    post(&fake, req(true)).await.2.unwrap();
    assert_eq!(fake.requests(), vec![req(true)]);
}

#[tokio::test]
async fn send_log_records_every_event_in_order() {
    let fake = FakeOpenAi::start().await;
    let log = SendLog::new();
    fake.set_fallback(
        Reply::text("abcdef")
            .chunk_chars(2)
            .pace(Duration::from_millis(2))
            .log_sends(log.clone()),
    );
    let before = std::time::Instant::now();
    let (_, _, body) = post(&fake, req(true)).await;
    let after = std::time::Instant::now();
    // role + 3 deltas + finish + usage + [DONE]
    assert_eq!(chunks(&body.unwrap()).0.len(), 6);
    let times = log.take();
    assert_eq!(times.len(), 7);
    assert!(times.windows(2).all(|w| w[0] <= w[1]));
    assert!(before <= times[0] && times[6] <= after);
    // Paced 2 ms apart from the first event.
    assert!(times[6] - times[0] >= Duration::from_millis(12));
    assert!(log.take().is_empty(), "take clears the log");
    // Unpaced replies are logged too.
    fake.set_fallback(Reply::text("xy").log_sends(log.clone()));
    post(&fake, req(false)).await.2.unwrap();
    assert_eq!(log.take().len(), 4);
}

#[tokio::test]
async fn paced_events_keep_their_schedule() {
    let fake = FakeOpenAi::start().await;
    // 1 role chunk + 10 deltas + finish + [DONE] = 13 events, 12 gaps of 5 ms.
    fake.push(
        Reply::text("abcdefghij")
            .chunk_chars(1)
            .pace(Duration::from_millis(5)),
    );
    let started = std::time::Instant::now();
    let (_, _, body) = post(&fake, req(false)).await;
    let elapsed = started.elapsed();
    assert_eq!(chunks(&body.unwrap()).0.len(), 12);
    assert!(elapsed >= Duration::from_millis(60), "{elapsed:?}");
    // Loose: tests run in parallel on busy machines.
    assert!(elapsed < Duration::from_millis(60 + 150), "{elapsed:?}");
}

#[test]
fn chunks_are_the_bytes_of_their_json_objects() {
    let reply = Reply::tool_calls(&[("call_1", "f", json!({"q": "é\"x"}))])
        .with_text("a\"b\\c\n")
        .thinking("hm")
        .chunk_chars(2);
    let (deltas, ending) = reply.events("chatcmpl-x1", &json!("m1"), true);
    let n = deltas.len() + ending.len();
    for (i, ev) in deltas.iter().chain(&ending).enumerate() {
        let text = std::str::from_utf8(ev).unwrap();
        let data = text
            .strip_prefix("data: ")
            .and_then(|t| t.strip_suffix("\n\n"))
            .expect("one data line");
        if i == n - 1 {
            assert_eq!(data, "[DONE]");
            continue;
        }
        // Re-serializing the parsed object (key order kept) gives the same bytes.
        let v: serde_json::Map<String, Value> = serde_json::from_str(data).unwrap();
        assert_eq!(Value::Object(v.clone()).to_string(), data);
        let keys: Vec<&str> = v.keys().map(String::as_str).collect();
        let mut want = vec![
            "id",
            "object",
            "created",
            "model",
            "system_fingerprint",
            "choices",
        ];
        if i == n - 2 {
            want.push("usage");
        }
        assert_eq!(keys, want, "{data}");
        assert_eq!(v["id"], "chatcmpl-x1");
        assert_eq!(v["model"], "m1");
    }
    let text: String = deltas
        .iter()
        .map(|b| std::str::from_utf8(b).unwrap())
        .filter_map(|t| {
            let v: Value = serde_json::from_str(t.strip_prefix("data: ")?.trim()).ok()?;
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "a\"b\\c\n");
}

#[test]
fn split_chars_respects_utf8() {
    assert_eq!(split_chars("héllo世界", 3), vec!["hél", "lo世", "界"]);
    assert_eq!(split_chars("", 4), Vec::<String>::new());
}

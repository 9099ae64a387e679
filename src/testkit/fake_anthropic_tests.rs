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

async fn post(fake: &FakeAnthropic, body: Value) -> (u16, HeaderMap, Result<String, String>) {
    let req = Request::post(format!("{}/messages", fake.base_url()))
        .header("content-type", "application/json")
        .header("x-api-key", "k")
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

/// `(event name, data JSON)` of every event; checks the name matches the data's `type`.
fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, data) = e.split_once('\n').expect("two lines");
            let name = name.strip_prefix("event: ").expect("event: line");
            let data: Value =
                serde_json::from_str(data.strip_prefix("data: ").expect("data: line")).unwrap();
            assert_eq!(data["type"], name);
            data
        })
        .collect()
}

fn req() -> Value {
    json!({"model": "claude-test", "max_tokens": 100, "stream": true,
               "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn a_tool_use_without_its_result_is_refused_as_the_real_api_does() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::text("kept for the next request"));
    let user = json!({"role": "user", "content": "go on"});
    let call = json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]});
    let answer = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}]});
    for (messages, wrong) in [
        (
            json!([user, call, user]),
            "without `tool_result` blocks immediately after",
        ),
        (
            json!([user, call]),
            "without `tool_result` blocks immediately after",
        ),
        (json!([answer]), "unexpected `tool_use_id`"),
    ] {
        let body = json!({"model": "m", "max_tokens": 10, "messages": messages});
        let (status, _, body) = post(&fake, body).await;
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
    let ok = json!({"model": "m", "max_tokens": 10, "stream": true,
            "messages": [user, call, answer]});
    assert_eq!(post(&fake, ok).await.0, 200);
}

#[tokio::test]
async fn text_reply_has_the_anthropic_event_shape() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::text("Hello, world").usage(7, 3));
    let (status, headers, body) = post(&fake, req()).await;
    assert_eq!(status, 200);
    assert!(headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    let evs = events(&body.unwrap());
    let types: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "message_start",
            "ping",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    assert_eq!(evs[0]["message"]["model"], "claude-test");
    assert_eq!(evs[0]["message"]["usage"]["input_tokens"], 7);
    assert!(evs[0]["message"]["id"]
        .as_str()
        .unwrap()
        .starts_with("msg_"));
    let text: String = evs
        .iter()
        .filter_map(|e| e["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, "Hello, world");
    assert_eq!(evs[3]["delta"]["text"], "Hell");
    assert_eq!(evs[7]["delta"]["stop_reason"], "end_turn");
    assert_eq!(evs[7]["usage"]["output_tokens"], 3);
    assert_eq!(fake.requests(), vec![req()]);
    assert_eq!(fake.request_headers()[0]["x-api-key"], "k");
}

#[tokio::test]
async fn thinking_text_and_tools_come_as_indexed_blocks() {
    let fake = FakeAnthropic::start().await;
    fake.push(
        Reply::tool_calls(&[
            ("toolu_a", "get_weather", json!({"city": "Tokyo"})),
            ("toolu_b", "get_time", json!({"tz": "Asia/Tokyo"})),
        ])
        .with_text("Checking.")
        .thinking("hm"),
    );
    let (_, _, body) = post(&fake, req()).await;
    let evs = events(&body.unwrap());
    let starts: Vec<(u64, &str)> = evs
        .iter()
        .filter(|e| e["type"] == "content_block_start")
        .map(|e| {
            (
                e["index"].as_u64().unwrap(),
                e["content_block"]["type"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        starts,
        [
            (0, "thinking"),
            (1, "text"),
            (2, "tool_use"),
            (3, "tool_use")
        ]
    );
    let mut args = [String::new(), String::new()];
    for e in &evs {
        if e["delta"]["type"] == "input_json_delta" {
            let i = e["index"].as_u64().unwrap() as usize - 2;
            args[i].push_str(e["delta"]["partial_json"].as_str().unwrap());
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
    assert!(evs
        .iter()
        .any(|e| e["delta"] == json!({"type": "signature_delta", "signature": FAKE_SIGNATURE})));
    let md = evs.iter().find(|e| e["type"] == "message_delta").unwrap();
    assert_eq!(md["delta"]["stop_reason"], "tool_use");
}

#[tokio::test]
async fn redacted_and_signed_thinking_blocks_in_order() {
    let fake = FakeAnthropic::start().await;
    fake.push(
        Reply::text("ok")
            .redacted_thinking("RU5D")
            .thinking_signed("ab", "U0lH")
            .cache_tokens(40, 2),
    );
    let (_, _, body) = post(&fake, req()).await;
    let evs = events(&body.unwrap());
    let usage = &evs[0]["message"]["usage"];
    assert_eq!(usage["cache_read_input_tokens"], 40);
    assert_eq!(usage["cache_creation_input_tokens"], 2);
    let content: Vec<Value> = evs[2..]
        .iter()
        .take_while(|e| e["type"] != "message_delta")
        .cloned()
        .collect();
    assert_eq!(
        content[..5],
        [
            json!({"type": "content_block_start", "index": 0,
                       "content_block": {"type": "redacted_thinking", "data": "RU5D"}}),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1,
                       "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
            json!({"type": "content_block_delta", "index": 1,
                       "delta": {"type": "thinking_delta", "thinking": "ab"}}),
            json!({"type": "content_block_delta", "index": 1,
                       "delta": {"type": "signature_delta", "signature": "U0lH"}}),
        ]
    );
    assert_eq!(content[6]["content_block"]["type"], "text");
}

#[tokio::test]
async fn error_event_replaces_the_ending() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::text("ab").error_event("overloaded_error", "Overloaded"));
    let (_, _, body) = post(&fake, req()).await;
    let evs = events(&body.unwrap());
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "error");
    assert_eq!(last["error"]["type"], "overloaded_error");
    assert!(evs.iter().all(|e| e["type"] != "message_stop"));
}

#[tokio::test]
async fn status_reply_with_header_and_empty_queue() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::api_error(529, "overloaded_error", "Overloaded").header("retry-after", "3"));
    let (status, headers, body) = post(&fake, req()).await;
    assert_eq!(status, 529);
    assert_eq!(headers["retry-after"], "3");
    let v: Value = serde_json::from_str(&body.unwrap()).unwrap();
    assert_eq!(v["error"]["type"], "overloaded_error");
    let (status, _, body) = post(&fake, req()).await;
    assert_eq!(status, 500);
    assert!(body.unwrap().contains("fake upstream: no scripted reply"));
    assert_eq!(fake.wait_requests(2).await.len(), 2);
    assert_eq!(fake.pending_replies(), 0);
}

#[tokio::test]
async fn break_after_ends_the_body_with_an_error() {
    let fake = FakeAnthropic::start().await;
    fake.push(Reply::text("abcdefgh").break_after(3));
    let (status, _, body) = post(&fake, req()).await;
    assert_eq!(status, 200);
    assert!(body.is_err(), "the client must see a broken body");
}

#[tokio::test]
async fn hold_waits_for_the_gate() {
    let fake = Arc::new(FakeAnthropic::start().await);
    let gate = Gate::new();
    fake.push(Reply::text("held").hold(gate.clone()));
    let f = fake.clone();
    let call = tokio::spawn(async move { post(&f, req()).await });
    let seen = fake.wait_requests(1).await;
    assert_eq!(seen[0]["model"], "claude-test");
    assert!(!call.is_finished());
    gate.open();
    let (_, _, body) = call.await.unwrap();
    assert_eq!(
        events(&body.unwrap()).last().unwrap()["type"],
        "message_stop"
    );
}

#[tokio::test]
async fn unknown_routes_are_404() {
    let fake = FakeAnthropic::start().await;
    let req = Request::get(format!("{}/models", fake.base_url()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 404);
}

//! Quotas a hostile client meets (issue 16): queued turns per session, running turns server-wide,
//! sessions per key, streams per session; the operator's limits over a run's; what an upstream
//! failure shows a client; `GET /sessions` without reading the sessions' logs; oversized tool
//! results. Each over-limit answer is checked as a client sees it: the status, the error type,
//! a message naming the config key, and `Retry-After`.

use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

use crate::common::{config_text, setup, Http, TestServer};

/// A request's status, `Retry-After` and JSON body.
async fn call(http: &Http, method: &str, path: &str, body: &Value) -> (u16, Option<String>, Value) {
    let resp = http
        .request_raw(method, path, Some(serde_json::to_vec(body).unwrap()))
        .await;
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, retry, v)
}

/// An over-limit answer: its status, its type, a message naming `key`, a whole-seconds
/// `Retry-After`.
fn assert_over_limit(got: &(u16, Option<String>, Value), status: u16, kind: &str, key: &str) {
    let (s, retry, v) = got;
    assert_eq!(*s, status, "{v}");
    assert_eq!(v["error"]["type"], kind, "{v}");
    let message = v["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains(key), "the message names {key}: {message}");
    let retry = retry.as_deref().expect("Retry-After");
    assert!(
        retry.parse::<u64>().is_ok_and(|s| s >= 1),
        "Retry-After: {retry}"
    );
}

/// Poll `cond` until it holds, for at most 10 s.
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn message(text: &str) -> Value {
    json!({ "content": text })
}

#[tokio::test]
async fn a_session_queues_at_most_queued_turns_behind_the_running_one() {
    let (fake, server) = setup("[limits]\nqueued_turns = 2\n").await;
    let sid = server.session(json!({})).await;
    let gate = Gate::new();
    fake.push(Reply::text("first").hold(gate.clone()));
    fake.set_fallback(Reply::text("later"));
    let path = format!("/sessions/{sid}/messages");
    for text in ["runs", "queued 1", "queued 2"] {
        let (status, _, v) = call(&server.http, "POST", &path, &message(text)).await;
        assert_eq!(status, 202, "{v}");
    }
    fake.wait_requests(1).await;
    let over = call(&server.http, "POST", &path, &message("one too many")).await;
    assert_over_limit(&over, 429, "too_many_queued_turns", "[limits] queued_turns");
    // A session run queues the same way.
    let run = call(
        &server.http,
        "POST",
        &format!("/sessions/{sid}/run"),
        &json!({"goal": "more"}),
    )
    .await;
    assert_over_limit(&run, 429, "too_many_queued_turns", "[limits] queued_turns");
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["queued"].as_array().unwrap().len(), 2, "{info}");

    // A cancelled queued turn frees its place.
    let queued = info["queued"][0].as_str().unwrap().to_string();
    let (status, _) = server
        .http
        .post(
            &format!("/sessions/{sid}/cancel"),
            &json!({ "turn_id": queued }),
        )
        .await;
    assert_eq!(status, 200);
    let (status, _, v) = call(&server.http, "POST", &path, &message("fits again")).await;
    assert_eq!(status, 202, "{v}");

    gate.open();
    server.wait_idle(&sid).await;
    eventually("every accepted turn ran", || async {
        server
            .engine()
            .session(turnstile::engine::Reach::Owner(None), &sid)
            .await
            .unwrap()
            .queued_turns()
            .is_empty()
            && server
                .engine()
                .session(turnstile::engine::Reach::Owner(None), &sid)
                .await
                .unwrap()
                .running_turn()
                .is_none()
    })
    .await;
    assert_eq!(fake.request_count(), 3, "the refused turns never ran");
}

#[tokio::test]
async fn the_server_runs_at_most_running_turns_and_refuses_new_ones_with_503() {
    let (fake, server) = setup("[limits]\nrunning_turns = 1\n").await;
    let busy = server.session(json!({})).await;
    let idle = server.session(json!({})).await;
    let gate = Gate::new();
    fake.push(Reply::text("held").hold(gate.clone()));
    fake.set_fallback(Reply::text("ok"));
    let (status, _, _) = call(
        &server.http,
        "POST",
        &format!("/sessions/{busy}/messages"),
        &message("hold the only slot"),
    )
    .await;
    assert_eq!(status, 202);
    fake.wait_requests(1).await;

    // A message to an idle session would start a turn now: 503.
    let msg = call(
        &server.http,
        "POST",
        &format!("/sessions/{idle}/messages"),
        &message("x"),
    )
    .await;
    assert_over_limit(
        &msg,
        503,
        "too_many_running_turns",
        "[limits] running_turns",
    );
    let aap = call(
        &server.http,
        "POST",
        &format!("/sessions/{idle}/turns"),
        &json!({"messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert_over_limit(
        &aap,
        503,
        "too_many_running_turns",
        "[limits] running_turns",
    );
    let run = call(&server.http, "POST", "/run", &json!({"goal": "x"})).await;
    assert_over_limit(
        &run,
        503,
        "too_many_running_turns",
        "[limits] running_turns",
    );
    let srun = call(
        &server.http,
        "POST",
        &format!("/sessions/{idle}/run"),
        &json!({"goal": "x"}),
    )
    .await;
    assert_over_limit(
        &srun,
        503,
        "too_many_running_turns",
        "[limits] running_turns",
    );
    // Queuing behind the running turn takes no new slot.
    let (status, _, _) = call(
        &server.http,
        "POST",
        &format!("/sessions/{busy}/messages"),
        &message("queued"),
    )
    .await;
    assert_eq!(status, 202);
    // The refused /run left no session behind.
    let (_, list) = server.http.get("/sessions").await;
    assert_eq!(list["sessions"].as_array().unwrap().len(), 2, "{list}");

    gate.open();
    eventually("the busy session is done", || async {
        let (_, info) = server.http.get(&format!("/sessions/{busy}")).await;
        info["status"] == "idle" && info.get("queued").is_none()
    })
    .await;
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{idle}/turns"),
            &json!({"messages": [{"role": "user", "content": "now"}]}),
        )
        .await;
    assert_eq!(status, 200, "a slot is free again: {resp}");
    assert_eq!(resp["stopReason"], "end_turn");
}

#[tokio::test]
async fn a_server_without_keys_holds_at_most_sessions_per_key_sessions() {
    let (fake, server) = setup("[limits]\nsessions_per_key = 2\n").await;
    let first = server.session(json!({})).await;
    server.session(json!({})).await;
    let over = call(&server.http, "POST", "/sessions", &json!({})).await;
    assert_over_limit(&over, 429, "too_many_sessions", "[limits] sessions_per_key");
    // /run makes a session too.
    let run = call(&server.http, "POST", "/run", &json!({"goal": "x"})).await;
    assert_over_limit(&run, 429, "too_many_sessions", "[limits] sessions_per_key");
    assert_eq!(fake.request_count(), 0);
    // Deleting one makes room.
    assert_eq!(
        server.http.delete(&format!("/sessions/{first}")).await.0,
        204
    );
    server.session(json!({})).await;
    let over = call(&server.http, "POST", "/sessions", &json!({})).await;
    assert_eq!(over.0, 429);
}

#[tokio::test]
async fn sessions_per_key_counts_each_key_and_what_the_store_held_before_a_restart() {
    let fake = FakeOpenAi::start().await;
    let var = "TURNSTILE_TEST_KEYS_QUOTAS";
    let cfg = config_text(&fake, "[limits]\nsessions_per_key = 2\n")
        .replace("[server]", &format!("[server]\napi_keys_env = \"{var}\""));
    let keys = [(var, "key-a,key-b")];
    let server = TestServer::start_with_env(&cfg, &keys).await;
    let a = server.http.with_key("key-a");
    let b = server.http.with_key("key-b");
    for _ in 0..2 {
        assert_eq!(a.post("/sessions", &json!({})).await.0, 201);
    }
    assert_over_limit(
        &call(&a, "POST", "/sessions", &json!({})).await,
        429,
        "too_many_sessions",
        "[limits] sessions_per_key",
    );
    assert_eq!(
        b.post("/sessions", &json!({})).await.0,
        201,
        "key-b has its own quota"
    );
    // The count is read back from the store after a restart.
    let dir = server.stop().await;
    let server = TestServer::start_in_with_env(dir, &cfg, &keys).await;
    let a = server.http.with_key("key-a");
    let b = server.http.with_key("key-b");
    assert_eq!(call(&a, "POST", "/sessions", &json!({})).await.0, 429);
    assert_eq!(b.post("/sessions", &json!({})).await.0, 201);
    assert_eq!(call(&b, "POST", "/sessions", &json!({})).await.0, 429);
}

#[tokio::test]
async fn a_session_has_at_most_subscribers_per_session_open_streams() {
    let (_fake, server) = setup("[limits]\nsubscribers_per_session = 2\n").await;
    let sid = server.session(json!({})).await;
    let other = server.session(json!({})).await;
    let base = &server.http.base;
    let events = format!("/sessions/{sid}/events/stream");
    let runs = format!("/sessions/{sid}/events");
    let one = crate::common::sse_stream::get(base, &events, &[]).await;
    assert_eq!(one.status, 200);
    let two = crate::common::sse_stream::get(base, &runs, &[]).await;
    assert_eq!(two.status, 200);
    for path in [&events, &runs] {
        let over = call(&server.http, "GET", path, &json!(null)).await;
        assert_over_limit(
            &over,
            429,
            "too_many_subscribers",
            "[limits] subscribers_per_session",
        );
    }
    // Another session has its own count.
    let s = crate::common::sse_stream::get(base, &format!("/sessions/{other}/events/stream"), &[])
        .await;
    assert_eq!(s.status, 200);
    // A stream that ends gives its place back.
    drop(one);
    eventually("the closed stream's place is free", || async {
        let s = crate::common::sse_stream::get(base, &events, &[]).await;
        s.status == 200
    })
    .await;
}

#[tokio::test]
async fn a_run_never_takes_more_steps_than_its_agent_allows() {
    let (fake, server) = setup("[agents.assistant]\nmax_steps = 2\n").await;
    for i in 0..5 {
        fake.push(Reply::tool_calls(&[(
            &format!("call_{i}"),
            "nope",
            json!({}),
        )]));
    }
    let (status, out) = server
        .http
        .post("/run", &json!({"goal": "loop", "max_steps": 40}))
        .await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["finish_reason"], "MaxStepsReached", "{out}");
    assert_eq!(
        fake.request_count(),
        2,
        "the agent's max_steps = 2 wins over 40"
    );
    // Fewer than the agent's is the run's to choose.
    fake.push(Reply::tool_calls(&[("call_x", "nope", json!({}))]));
    let (_, out) = server
        .http
        .post("/run", &json!({"goal": "once", "max_steps": 1}))
        .await;
    assert_eq!(out["finish_reason"], "MaxStepsReached", "{out}");
    assert_eq!(fake.request_count(), 3);
}

#[tokio::test]
async fn a_client_system_prompt_replaces_the_agents_only_where_the_operator_allows_it() {
    let (fake, server) = setup(
        "[agents.open]\nsystem_prompt = \"operator prompt\"\n\n[agents.closed]\nsystem_prompt = \"operator prompt\"\nclient_system_prompt = false\n",
    )
    .await;
    fake.record_requests(true);
    // The default agent (the first) allows it: the run's prompt is the model's.
    fake.push(Reply::text("done"));
    let (status, out) = server
        .http
        .post(
            "/run",
            &json!({"goal": "g", "system_prompt": "client prompt"}),
        )
        .await;
    assert_eq!(status, 200, "{out}");
    let sent = fake.requests().pop().unwrap();
    assert_eq!(sent["messages"][0]["role"], "system");
    assert_eq!(sent["messages"][0]["content"], "client prompt");

    // An agent that keeps its prompt: a seed system message is refused, naming the key.
    let (status, err) = server
        .http
        .post(
            "/sessions",
            &json!({"agent": {"name": "closed"}, "messages": [{"role": "system", "content": "obey me"}]}),
        )
        .await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(err["error"]["type"], "invalid_request");
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("[agents.closed] client_system_prompt"),
        "{msg}"
    );
    assert_eq!(fake.request_count(), 1);
}

#[tokio::test]
async fn a_run_system_prompt_is_refused_when_the_default_agent_keeps_its_own() {
    let (fake, server) = setup(
        "[agents.assistant]\nsystem_prompt = \"operator prompt\"\nclient_system_prompt = false\n",
    )
    .await;
    let (status, err) = server
        .http
        .post(
            "/run",
            &json!({"goal": "g", "system_prompt": "client prompt"}),
        )
        .await;
    assert_eq!(status, 400, "{err}");
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("[agents.assistant] client_system_prompt"),
        "{msg}"
    );
    assert_eq!(fake.request_count(), 0);
    let (_, list) = server.http.get("/sessions").await;
    assert!(list["sessions"].as_array().unwrap().is_empty(), "{list}");
    // Without one, the operator's prompt is used.
    fake.record_requests(true);
    fake.push(Reply::text("done"));
    let (status, _) = server.http.post("/run", &json!({"goal": "g"})).await;
    assert_eq!(status, 200);
    let sent = fake.requests().pop().unwrap();
    assert_eq!(sent["messages"][0]["content"], "operator prompt");
}

#[tokio::test]
async fn an_upstream_error_shows_clients_its_status_and_type_but_not_its_body_or_address() {
    let (fake, server) = setup("").await;
    let secret = "sk-live-QUOTAS-SECRET-123";
    let base_url = fake.base_url();
    let body = json!({"error": {
        "type": "invalid_request_error",
        "message": format!("Incorrect API key provided: {secret}; endpoint {base_url}/chat/completions"),
    }});
    let sid = server.session(json!({})).await;
    fake.push(Reply::status(400, body.clone()));
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(resp["stopReason"], "error");
    let shown = resp["error"].to_string();
    assert!(shown.contains("400"), "{shown}");
    assert!(shown.contains("invalid_request_error"), "{shown}");
    assert!(
        !shown.contains(secret),
        "the body's secret reached the client: {shown}"
    );
    assert!(
        !shown.contains(&base_url),
        "the base_url reached the client: {shown}"
    );

    // The log's turn.failed, as the event APIs show it.
    let (_, history) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    let failed = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "turn.failed")
        .expect("turn.failed")
        .clone();
    let text = failed.to_string();
    assert_eq!(failed["reason"], "model_error");
    assert!(text.contains("invalid_request_error"), "{text}");
    assert!(!text.contains(secret), "{text}");
    assert!(!text.contains(&base_url), "{text}");

    // The same through a message turn and a connection that cannot be made.
    fake.push(Reply::status(400, body));
    let (status, _) = server
        .http
        .post(&format!("/sessions/{sid}/messages"), &message("again"))
        .await;
    assert_eq!(status, 202);
    server.wait_idle(&sid).await;
    let (_, history) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    let text = history.to_string();
    assert!(!text.contains(secret), "{text}");
    assert!(!text.contains(&base_url), "{text}");
}

#[tokio::test]
async fn an_unreachable_upstream_is_named_without_its_address() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let fake = FakeOpenAi::start().await;
    let cfg = config_text(&fake, "").replace(&fake.base_url(), &format!("http://{addr}/v1"));
    let server = TestServer::start(&cfg).await;
    let sid = server.session(json!({})).await;
    let (_, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    let shown = resp["error"].to_string();
    assert!(
        shown.contains("could not connect to the upstream"),
        "{shown}"
    );
    assert!(!shown.contains(&addr.to_string()), "{shown}");
}

#[tokio::test]
async fn listing_sessions_reads_no_log_and_loads_no_session() {
    let fake = FakeOpenAi::start().await;
    let cfg = config_text(&fake, "").replace("[server]\n", "[server]\nsession_cache = 2\n");
    let server = TestServer::start(&cfg).await;
    let tool = json!({"name": "get_weather", "description": "", "parameters": {"type": "object"}});
    let mut ids = Vec::new();
    for i in 0..6 {
        let sid = server.session(json!({"tools": [tool.clone()]})).await;
        fake.push(Reply::text(&"long answer ".repeat(2000)));
        let (status, _) = server
            .http
            .post(
                &format!("/sessions/{sid}/turns"),
                &json!({"messages": [{"role": "user", "content": format!("turn {i}")}]}),
            )
            .await;
        assert_eq!(status, 200);
        ids.push(sid);
    }
    // The last one stops for its client tool.
    fake.push(Reply::tool_calls(&[("call_w", "get_weather", json!({}))]));
    let (_, resp) = server
        .http
        .post(
            &format!("/sessions/{}/turns", ids[5]),
            &json!({"messages": [{"role": "user", "content": "weather?"}]}),
        )
        .await;
    assert_eq!(resp["stopReason"], "tool_use");
    let dir = server.stop().await;

    let server = TestServer::start_in(dir, &cfg).await;
    assert_eq!(server.engine().in_memory("").0, 0);
    let (status, list) = server.http.get("/sessions").await;
    assert_eq!(status, 200);
    let listed = list["sessions"].as_array().unwrap();
    assert_eq!(listed.len(), 6);
    assert_eq!(
        server.engine().in_memory("").0,
        0,
        "listing loaded sessions into memory"
    );
    for (info, id) in listed.iter().zip(&ids) {
        assert_eq!(info["sessionId"], id.as_str());
        assert_eq!(info["agent"]["name"], "assistant");
        assert_eq!(info["tools"][0]["name"], "get_weather");
    }
    let statuses: Vec<&str> = listed
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        statuses,
        ["idle", "idle", "idle", "idle", "idle", "awaiting_client"]
    );
    // Reading each one loads it; past session_cache, the idle ones leave memory again.
    for id in &ids {
        let (status, info) = server.http.get(&format!("/sessions/{id}")).await;
        assert_eq!(status, 200);
        assert!(info["pending"].is_array());
        let (n, _) = server.engine().in_memory(id);
        assert!(n <= 2, "{n} sessions in memory with session_cache = 2");
    }
    let (_, info) = server.http.get(&format!("/sessions/{}", ids[5])).await;
    assert_eq!(info["status"], "awaiting_client");
    assert_eq!(info["pending"][0]["toolCallId"], "call_w");
}

#[tokio::test]
async fn a_tool_result_over_tool_result_bytes_reaches_the_model_cut_with_a_note_naming_its_file() {
    let extra = format!(
        "{}\n[policy]\ntrust = [\"mcp__ex__echo\"]\ndefault = \"ask\"\n\n[limits]\ntool_result_bytes = 1000\n",
        crate::common::mcp::example_server("ex", "")
    );
    let (fake, server) = setup(&extra).await;
    fake.record_requests(true);
    let sid = server.session(json!({})).await;
    // 3,001 bytes; the 1,000th byte falls inside a two-byte "é".
    let big = format!("a{}", "é".repeat(1500));
    fake.push(Reply::tool_calls(&[(
        "call_big",
        "mcp__ex__echo",
        json!({ "text": big }),
    )]));
    fake.push(Reply::text("read it"));
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "echo it"}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["stopReason"], "end_turn", "{resp}");

    let first_part = format!("a{}", "é".repeat(499));
    let file = "tool_results/call_big.txt";
    // What the model was sent on the next call.
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    let tool_msg = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the tool result in the next request")
        .clone();
    let given = tool_msg["content"]
        .as_str()
        .expect("text content")
        .to_string();
    assert!(given.starts_with(&format!("{first_part}\n\n[")), "{given}");
    assert!(!given.contains(&big), "the whole result reached the model");
    assert!(given.contains(file), "{given}");
    assert!(given.contains("3,001 bytes"), "{given}");
    assert!(given.contains("[limits] tool_result_bytes"), "{given}");
    assert!(given.contains("deliver_file"), "{given}");

    // The log keeps what the model was given.
    let (_, history) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    let logged = history["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "agent.tool_result")
        .expect("agent.tool_result")
        .clone();
    assert_eq!(logged["content"], given.as_str());
    assert_eq!(logged["is_error"], false);

    // The workspace holds the whole result.
    let path = server.dir.path().join("sandboxes").join(&sid).join(file);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), big);

    // A result under the limit is given whole.
    fake.push(Reply::tool_calls(&[(
        "call_small",
        "mcp__ex__echo",
        json!({ "text": "small" }),
    )]));
    fake.push(Reply::text("ok"));
    let (_, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "again"}]}),
        )
        .await;
    assert_eq!(resp["stopReason"], "end_turn", "{resp}");
    let last = fake.requests().pop().unwrap();
    let small = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap()
        .clone();
    assert_eq!(small["content"], "small");
    assert!(!server
        .dir
        .path()
        .join("sandboxes")
        .join(&sid)
        .join("tool_results/call_small.txt")
        .exists());
}

/// `POST path` with a JSON body on a connection whose socket receive buffer is 4 KiB: a client
/// that does not read makes the server's writes back up soon. The response, its body unread.
async fn post_small_buffer(
    base: &str,
    path: &str,
    body: &Value,
) -> hyper::Response<hyper::body::Incoming> {
    use hyper_util::client::legacy::{connect::HttpConnector, Client};
    let mut connector = HttpConnector::new();
    connector.set_recv_buffer_size(Some(4096));
    let client = Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, http_body_util::Full<bytes::Bytes>>(connector);
    let req = hyper::Request::post(format!("{base}{path}"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_string(),
        )))
        .unwrap();
    client.request(req).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turn_whose_client_stops_reading_finishes_and_the_client_misses_nothing() {
    let (fake, server) = setup("").await;
    let sid = server.session(json!({})).await;
    // 1,000,000 characters in 100,000 fragments: ~5 MB of text_delta events.
    let text: String = (0..1_000_000u32)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    fake.push(Reply::text(&text).chunk_chars(10));
    let resp = post_small_buffer(
        &server.http.base,
        &format!("/sessions/{sid}/turns"),
        &json!({"stream": "delta", "messages": [{"role": "user", "content": "talk"}]}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    // The client reads nothing: the turn still ends, and logs everything.
    server.wait_idle(&sid).await;
    let (_, history) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    let events = history["events"].as_array().unwrap();
    assert_eq!(events.last().unwrap()["type"], "turn.completed");
    let logged = events
        .iter()
        .find(|e| e["type"] == "agent.message")
        .unwrap();
    assert_eq!(logged["content"].as_str().unwrap().len(), text.len());

    // Now it reads: every character, in order, then the end.
    let body = tokio::time::timeout(Duration::from_secs(60), resp.into_body().collect())
        .await
        .expect("the rest of the stream within 60 s")
        .unwrap()
        .to_bytes();
    let body = String::from_utf8(body.to_vec()).unwrap();
    let mut got = String::new();
    let mut deltas = 0;
    let mut last = None;
    for frame in body.split("\n\n").filter(|f| !f.trim().is_empty()) {
        let mut event = "";
        let mut data = "";
        for line in frame.lines() {
            if let Some(v) = line.strip_prefix("event: ") {
                event = v;
            } else if let Some(v) = line.strip_prefix("data: ") {
                data = v;
            }
        }
        if event == "text_delta" {
            let v: Value = serde_json::from_str(data).unwrap();
            got.push_str(v["delta"].as_str().unwrap());
            deltas += 1;
        }
        if !event.is_empty() {
            last = Some((event.to_string(), data.to_string()));
        }
    }
    assert_eq!(got.len(), text.len(), "every character reached the client");
    assert!(got == text, "in order");
    let (event, data) = last.unwrap();
    assert_eq!(event, "turn_stop");
    assert!(data.contains("end_turn"), "{data}");
    // The turn did not queue 100,000 fragments for a client that was not reading: it stopped
    // at the bound, and the client got the rest with the stored message.
    assert!(
        deltas < 100_000,
        "{deltas} text_delta events: every fragment was held for the stalled client"
    );
}

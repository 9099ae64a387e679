//! Several upstreams: a call that fails before its first token falls back to the next upstream,
//! one that fails after it does not; a circuit breaker skips a failing upstream, then probes it;
//! the AAP option `model` picks the upstream that serves it. Real fakes, real wire formats.

use std::time::{Duration, Instant};

use crate::common::tracing_capture::recorder;
use crate::common::TestServer;
use serde_json::{json, Value};
use turnstile::testkit::fake_anthropic::{self, FakeAnthropic};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

/// Two upstreams, `primary` (serving `model-a`, with `primary_keys` added) then `secondary`
/// (serving `model-b`), both without retries; one agent offering both models.
fn config(primary: &str, primary_keys: &str, secondary: &str, secondary_provider: &str) -> String {
    format!(
        r#"
[server]
data_dir = "data"
sandboxes = "sandboxes"

[upstreams.primary]
provider = "openai"
base_url = "{primary}"
models = ["model-a"]
retries = 0
{primary_keys}

[upstreams.secondary]
provider = "{secondary_provider}"
base_url = "{secondary}"
models = ["model-b"]
retries = 0

[agents.assistant]
upstreams = ["primary", "secondary"]
models = ["model-a", "model-b"]
"#
    )
}

/// A base URL nothing listens on: a port taken from a listener that is then dropped.
fn closed_port_url() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    format!("http://127.0.0.1:{port}/v1")
}

/// Runs one turn saying `text`; the response.
async fn turn(server: &TestServer, sid: &str, text: &str) -> Value {
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": text}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    resp
}

/// The answer's text.
fn answer(resp: &Value) -> &str {
    resp["messages"][0]["content"].as_str().unwrap_or("")
}

/// `/status`'s entry for the upstream `name`.
async fn upstream_status(server: &TestServer, name: &str) -> Value {
    let (status, body) = server.http.get("/status").await;
    assert_eq!(status, 200, "{body}");
    body["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no upstream {name} in /status: {body}"))
}

/// Polls `/status` until the upstream's breaker is in `state`; fails after `within`.
async fn wait_breaker(server: &TestServer, name: &str, state: &str, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let status = upstream_status(server, name).await;
        if status["breaker"] == state {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "breaker of {name} not {state} within {within:?}: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A primary that fails as `primary` scripts it (or cannot be reached): the same turn is
/// answered once by the secondary, with its own model.
async fn falls_back(primary: Option<Reply>, primary_keys: &str) {
    let secondary = FakeOpenAi::start().await;
    let fake_primary = FakeOpenAi::start().await;
    let primary_url = match &primary {
        Some(reply) => {
            fake_primary.push(reply.clone());
            fake_primary.base_url()
        }
        None => closed_port_url(),
    };
    secondary.push(Reply::text("answered by the secondary"));
    let server = TestServer::start(&config(
        &primary_url,
        primary_keys,
        &secondary.base_url(),
        "openai",
    ))
    .await;
    let sid = server.session(json!({})).await;
    let resp = turn(&server, &sid, "hello").await;
    assert_eq!(answer(&resp), "answered by the secondary", "{resp}");
    assert_eq!(resp["stopReason"], "end_turn", "{resp}");
    let reqs = secondary.requests();
    assert_eq!(reqs.len(), 1, "the secondary is asked once");
    assert_eq!(
        reqs[0]["model"], "model-b",
        "its own model: it does not serve model-a"
    );
    let asked_primary = fake_primary.requests();
    assert_eq!(asked_primary.len(), usize::from(primary.is_some()));
    if let Some(first) = asked_primary.first() {
        assert_eq!(first["model"], "model-a");
    }
}

#[tokio::test]
async fn a_primary_refusing_connections_falls_back_to_the_secondary() {
    falls_back(None, "").await;
}

#[tokio::test]
async fn a_primary_answering_429_falls_back_to_the_secondary() {
    let busy = Reply::status(429, json!({"error": {"message": "slow down"}}));
    falls_back(Some(busy), "").await;
}

#[tokio::test]
async fn a_primary_answering_503_falls_back_to_the_secondary() {
    let down = Reply::status(503, json!({"error": {"message": "overloaded"}}));
    falls_back(Some(down), "").await;
}

#[tokio::test]
async fn a_primary_stalling_past_its_timeout_before_the_first_token_falls_back() {
    // The role chunk is sent, no text: the call times out with nothing streamed.
    let gate = Gate::new();
    let stall = Reply::text("too late").hold_after(1, gate.clone());
    falls_back(Some(stall), "timeout_s = 1").await;
    drop(gate);
}

#[tokio::test]
async fn a_fallback_may_cross_providers() {
    let _ = recorder();
    let primary = FakeOpenAi::start().await;
    primary.push(Reply::status(500, json!({"error": {"message": "boom"}})));
    let secondary = FakeAnthropic::start().await;
    secondary.push(fake_anthropic::Reply::text("answered by anthropic"));
    let server = TestServer::start(&config(
        &primary.base_url(),
        "",
        &secondary.base_url(),
        "anthropic",
    ))
    .await;
    let sid = server.session(json!({})).await;
    let resp = turn(&server, &sid, "hello").await;
    assert_eq!(answer(&resp), "answered by anthropic", "{resp}");
    let reqs = secondary.requests();
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0]["model"], "model-b");
    let said = reqs[0]["messages"][0]["content"].to_string();
    assert!(said.contains("hello"), "the same turn's message: {said}");

    // The log says which upstream and model each attempt went to, and which answered.
    let rec = recorder();
    let request = rec.request("/sessions/{id}/turns", &sid).await;
    let turns = rec.children(request.seq, "turn");
    assert_eq!(turns.len(), 1, "{turns:?}");
    let calls = rec.children(turns[0].seq, "model_call");
    let seen: Vec<[&str; 4]> = calls
        .iter()
        .map(|c| ["upstream", "provider", "model", "outcome"].map(|k| c.fields[k].as_str()))
        .collect();
    assert_eq!(seen.len(), 2, "{calls:?}");
    assert_eq!(seen[0][..3], ["primary", "openai", "model-a"]);
    assert!(seen[0][3].contains("HTTP 500"), "{:?}", seen[0]);
    assert_eq!(seen[1], ["secondary", "anthropic", "model-b", "ok"]);
}

#[tokio::test]
async fn a_primary_failing_after_the_first_token_fails_the_turn_without_fallback() {
    let primary = FakeOpenAi::start().await;
    let secondary = FakeOpenAi::start().await;
    // The role chunk and three text fragments, then the connection breaks.
    primary.push(
        Reply::text("this answer breaks off midway")
            .chunk_chars(3)
            .break_after(4),
    );
    secondary.push(Reply::text("must not be asked"));
    let server = TestServer::start(&config(
        &primary.base_url(),
        "",
        &secondary.base_url(),
        "openai",
    ))
    .await;
    let sid = server.session(json!({})).await;
    let resp = turn(&server, &sid, "hello").await;
    assert_eq!(resp["stopReason"], "error", "{resp}");
    assert_eq!(resp["error"]["reason"], "model_error", "{resp}");
    let message = resp["error"]["message"].as_str().unwrap();
    assert_eq!(message, "the upstream stream broke off");
    assert_eq!(primary.requests().len(), 1);
    assert!(
        secondary.requests().is_empty(),
        "no fallback once a token reached the client"
    );
}

#[tokio::test]
async fn the_breaker_skips_a_failing_primary_then_probes_it_and_closes() {
    let primary = FakeOpenAi::start().await;
    let secondary = FakeOpenAi::start().await;
    for _ in 0..2 {
        primary.push(Reply::status(503, json!({"error": {"message": "down"}})));
    }
    secondary.set_fallback(Reply::text("from the secondary"));
    // Open for 3 s: long enough that the third turn surely runs inside it.
    let keys = "breaker_failures = 2\nbreaker_open_s = 3";
    let server = TestServer::start(&config(
        &primary.base_url(),
        keys,
        &secondary.base_url(),
        "openai",
    ))
    .await;
    let sid = server.session(json!({})).await;
    assert_eq!(
        upstream_status(&server, "primary").await["breaker"],
        "closed"
    );

    for n in 1..=2 {
        let resp = turn(&server, &sid, &format!("turn {n}")).await;
        assert_eq!(answer(&resp), "from the secondary");
    }
    let status = upstream_status(&server, "primary").await;
    assert_eq!(status["breaker"], "open", "{status}");
    assert_eq!(status["consecutive_failures"], 2, "{status}");
    assert_eq!(status["provider"], "openai");
    assert_eq!(status["models"], json!(["model-a"]));
    assert_eq!(status["in_flight"], 0);

    // Open: the primary is not asked at all.
    let resp = turn(&server, &sid, "turn 3").await;
    assert_eq!(answer(&resp), "from the secondary");
    assert_eq!(
        upstream_status(&server, "primary").await["breaker"],
        "open",
        "the third turn ran inside the open period"
    );
    assert_eq!(primary.requests().len(), 2, "skipped while open");
    assert_eq!(secondary.requests().len(), 3);

    // Half-open after breaker_open_s: one probe goes to the primary; its success closes it.
    wait_breaker(&server, "primary", "half_open", Duration::from_secs(10)).await;
    primary.push(Reply::text("the primary is back"));
    let resp = turn(&server, &sid, "turn 4").await;
    assert_eq!(answer(&resp), "the primary is back");
    assert_eq!(primary.requests().len(), 3);
    assert_eq!(secondary.requests().len(), 3);
    let status = upstream_status(&server, "primary").await;
    assert_eq!(status["breaker"], "closed", "{status}");
    assert_eq!(status["consecutive_failures"], 0, "{status}");
}

#[tokio::test]
async fn the_model_option_routes_to_the_upstream_that_serves_it() {
    let primary = FakeOpenAi::start().await;
    let secondary = FakeOpenAi::start().await;
    primary.push(Reply::text("from the primary"));
    secondary.push(Reply::text("from the secondary"));
    let server = TestServer::start(&config(
        &primary.base_url(),
        "",
        &secondary.base_url(),
        "openai",
    ))
    .await;
    let picked = server
        .session(json!({"agent": {"name": "assistant", "options": {"model": "model-b"}}}))
        .await;
    let resp = turn(&server, &picked, "hi").await;
    assert_eq!(answer(&resp), "from the secondary");
    assert_eq!(secondary.requests()[0]["model"], "model-b");
    assert!(primary.requests().is_empty());

    // With no option, the agent's first upstream and its model.
    let default = server.session(json!({})).await;
    let resp = turn(&server, &default, "hi").await;
    assert_eq!(answer(&resp), "from the primary");
    assert_eq!(primary.requests()[0]["model"], "model-a");
    assert_eq!(secondary.requests().len(), 1);
}

#[tokio::test]
async fn a_full_primary_is_passed_over_like_a_429() {
    let primary = FakeOpenAi::start().await;
    let secondary = FakeOpenAi::start().await;
    let gate = Gate::new();
    primary.push(Reply::text("held").hold(gate.clone()));
    secondary.push(Reply::text("from the secondary"));
    let server = TestServer::start(&config(
        &primary.base_url(),
        "max_in_flight = 1",
        &secondary.base_url(),
        "openai",
    ))
    .await;
    // One call holds the primary's only slot...
    let first = server.session(json!({})).await;
    let http = server.http.clone();
    let held = tokio::spawn(async move {
        http.post(
            &format!("/sessions/{first}/turns"),
            &json!({"messages": [{"role": "user", "content": "one"}]}),
        )
        .await
    });
    primary.wait_requests(1).await;
    assert_eq!(upstream_status(&server, "primary").await["in_flight"], 1);
    // ...so the next goes to the secondary.
    let second = server.session(json!({})).await;
    let resp = turn(&server, &second, "two").await;
    assert_eq!(answer(&resp), "from the secondary");
    assert_eq!(primary.requests().len(), 1);
    gate.open();
    let (status, resp) = held.await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(answer(&resp), "held");
}

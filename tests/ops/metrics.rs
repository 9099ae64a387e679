//! `GET /metrics` after real turns, scraped from the real binary (so every count is this test's
//! own): turns, upstream calls and tokens, tool calls against the example MCP server, a pending
//! approval, sessions, streams, connections, MCP servers and store commits; and
//! `[server] metrics_listen`, which serves the same text without a key.

use std::net::SocketAddr;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common::Http;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::process::Child;
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

const KEY: &str = "metrics-test-key";

struct Proc {
    _child: Child,
    api: SocketAddr,
    metrics: SocketAddr,
}

/// The real binary with API keys, `metrics_listen` on a free port, the example MCP server as
/// `ex` (echo and fail trusted, add asked for).
async fn spawn(dir: &std::path::Path, fake: &FakeOpenAi) -> Proc {
    let config = format!(
        r#"
[server]
data_dir = "data"
sandboxes = "sandboxes"
api_keys_env = "TURNSTILE_METRICS_TEST_KEYS"
metrics_listen = "127.0.0.1:0"

[upstream]
provider = "openai"
base_url = "{}"
model = "fake-model"
retries = 0

{}
[policy]
trust = ["mcp__ex__echo", "mcp__ex__fail"]
ask = ["mcp__ex__add"]
default = "deny"
"#,
        fake.base_url(),
        crate::common::mcp::example_server("ex", "")
    );
    std::fs::write(dir.join("tools.toml"), config).unwrap();
    let mut child = crate::common::binary::command()
        .args(["serve", "--config"])
        .arg(dir.join("tools.toml"))
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .env("TURNSTILE_METRICS_TEST_KEYS", KEY)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn turnstile");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr_after = |line: &str, marker: &str| -> Option<SocketAddr> {
        let rest = line.split(marker).nth(1)?;
        rest.split(|c: char| c.is_whitespace() || c == '/')
            .next()?
            .parse()
            .ok()
    };
    let (mut api, mut metrics) = (None, None);
    while api.is_none() || metrics.is_none() {
        let line = lines
            .next_line()
            .await
            .expect("stderr")
            .expect("turnstile exited before listening");
        metrics = metrics.or(addr_after(&line, "metrics on http://"));
        api = api.or(addr_after(&line, "listening on http://"));
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Proc {
        _child: child,
        api: api.unwrap(),
        metrics: metrics.unwrap(),
    }
}

async fn get_text(http: &Http, path: &str) -> (u16, String) {
    let resp = http.request_raw("GET", path, None).await;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// The value of the sample `series` (name and labels exactly as rendered).
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no sample {series} in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn every_metric_counts_what_the_turns_did() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proc = spawn(dir.path(), &fake).await;
    let api = Http::new(proc.api).with_key(KEY);
    let scrape = Http::new(proc.metrics);

    let (status, created) = api.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["sessionId"].as_str().unwrap().to_string();
    let turn = |text: &str| json!({"messages": [{"role": "user", "content": text}]});
    let turns_path = format!("/sessions/{id}/turns");

    // Turn 1: two trusted tool calls (one succeeds, one fails), then an answer.
    fake.push(
        Reply::tool_calls(&[
            ("c1", "mcp__ex__echo", json!({"text": "hi"})),
            ("c2", "mcp__ex__fail", json!({"message": "boom"})),
        ])
        .usage(11, 3),
    );
    fake.push(Reply::text("done").usage(13, 4));
    let (status, body) = api.post(&turns_path, &turn("one")).await;
    assert_eq!(status, 200, "{body}");
    // Turn 2: the upstream fails.
    fake.push(Reply::status(500, json!({"error": {"message": "down"}})));
    let (status, body) = api.post(&turns_path, &turn("two")).await;
    assert_eq!(status, 200, "{body}");
    // Turn 3: a tool that asks for permission; left pending.
    fake.push(Reply::tool_calls(&[("c3", "mcp__ex__add", json!({"a": 1, "b": 2}))]).usage(5, 1));
    let (status, body) = api.post(&turns_path, &turn("three")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(fake.request_count(), 4);

    // An open event stream, held while scraping.
    let mut stream = tokio::net::TcpStream::connect(proc.api).await.unwrap();
    stream
        .write_all(
            format!(
                "GET /sessions/{id}/events/stream HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");

    // The stream is counted once its response is under way: poll for it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let (status, text) = get_text(&scrape, "/metrics").await;
        assert_eq!(status, 200, "{text}");
        if sample(&text, "turnstile_streams_open") >= 1.0 || Instant::now() > deadline {
            break text;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    // Turns, by agent and outcome; their durations.
    let a = r#"agent="assistant""#;
    assert_eq!(sample(&text, "turnstile_turns_started_total"), 3.0);
    assert_eq!(
        sample(
            &text,
            &format!("turnstile_turns_total{{{a},outcome=\"completed\"}}")
        ),
        2.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("turnstile_turns_total{{{a},outcome=\"failed\"}}")
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("turnstile_turns_total{{{a},outcome=\"cancelled\"}}")
        ),
        0.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("turnstile_turn_duration_seconds_count{{{a}}}")
        ),
        3.0
    );
    assert!(
        sample(
            &text,
            &format!("turnstile_turn_duration_seconds_sum{{{a}}}")
        ) > 0.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("turnstile_turn_duration_seconds_bucket{{{a},le=\"+Inf\"}}")
        ),
        3.0
    );

    // Upstream calls, time to first token and call duration, tokens: by provider and model.
    let m = r#"provider="openai",model="fake-model""#;
    assert_eq!(
        sample(
            &text,
            &format!("turnstile_upstream_calls_total{{{m},outcome=\"ok\"}}")
        ),
        3.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("turnstile_upstream_calls_total{{{m},outcome=\"error\"}}")
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("turnstile_upstream_first_token_seconds_count{{{m}}}")
        ),
        4.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("turnstile_upstream_call_duration_seconds_count{{{m}}}")
        ),
        4.0
    );
    let first = sample(
        &text,
        &format!("turnstile_upstream_first_token_seconds_sum{{{m}}}"),
    );
    let whole = sample(
        &text,
        &format!("turnstile_upstream_call_duration_seconds_sum{{{m}}}"),
    );
    assert!(
        first > 0.0 && first <= whole,
        "first token {first} s, calls {whole} s"
    );
    assert_eq!(
        sample(
            &text,
            &format!("turnstile_upstream_input_tokens_total{{{m}}}")
        ),
        29.0
    );
    assert_eq!(
        sample(
            &text,
            &format!("turnstile_upstream_output_tokens_total{{{m}}}")
        ),
        8.0
    );

    // Tool calls by server, tool, verdict and outcome; durations of those that ran.
    let call = |tool: &str, verdict: &str, outcome: &str| {
        sample(
            &text,
            &format!("turnstile_tool_calls_total{{server=\"ex\",tool=\"{tool}\",verdict=\"{verdict}\",outcome=\"{outcome}\"}}"),
        )
    };
    assert_eq!(call("echo", "trust", "ok"), 1.0);
    assert_eq!(call("echo", "trust", "error"), 0.0);
    assert_eq!(call("fail", "trust", "error"), 1.0);
    assert_eq!(call("fail", "trust", "ok"), 0.0);
    assert_eq!(
        sample(
            &text,
            r#"turnstile_tool_call_duration_seconds_count{server="ex",tool="echo"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(
            &text,
            r#"turnstile_tool_call_duration_seconds_count{server="ex",tool="fail"}"#
        ),
        1.0
    );
    assert!(
        !text.contains(r#"tool="add",verdict="ask",outcome="ok""#),
        "add never ran"
    );

    // Gauges: the pending approval, the session, the stream, the connection it is on.
    assert_eq!(sample(&text, "turnstile_pending_approvals"), 1.0);
    assert_eq!(sample(&text, "turnstile_sessions_active"), 1.0);
    assert_eq!(sample(&text, "turnstile_streams_open"), 1.0);
    assert!(sample(&text, "turnstile_connections_open") >= 1.0);
    assert_eq!(sample(&text, "turnstile_connections_refused_total"), 0.0);

    // MCP servers and the store.
    assert_eq!(
        sample(&text, r#"turnstile_mcp_servers_up{server="ex"}"#),
        1.0
    );
    assert_eq!(
        sample(&text, r#"turnstile_mcp_restarts_total{server="ex"}"#),
        0.0
    );
    assert!(sample(&text, "turnstile_store_commit_duration_seconds_count") >= 3.0);
    assert!(text.contains("# TYPE turnstile_store_commit_duration_seconds histogram"));
    assert!(text.contains("# TYPE turnstile_turns_total counter"));
    assert!(text.contains("# TYPE turnstile_pending_approvals gauge"));
    // No series names a session.
    assert!(!text.contains(&id), "a session id in the metrics");

    // Granting the permission runs the call: pending goes to 0, the call is counted.
    fake.push(Reply::text("three").usage(1, 1));
    let (status, body) = api
        .post(
            &turns_path,
            &json!({"messages": [{"role": "tool_permission", "toolCallId": "c3", "granted": true}]}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    drop(stream);
    let (_, text) = get_text(&scrape, "/metrics").await;
    assert_eq!(sample(&text, "turnstile_pending_approvals"), 0.0);
    assert_eq!(
        sample(
            &text,
            r#"turnstile_tool_calls_total{server="ex",tool="add",verdict="ask",outcome="ok"}"#
        ),
        1.0
    );
}

#[tokio::test]
async fn metrics_listen_serves_without_a_key_and_the_api_does_not() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let proc = spawn(dir.path(), &fake).await;

    let api = Http::new(proc.api);
    let (status, body) = get_text(&api, "/metrics").await;
    assert_eq!(status, 401, "{body}");
    let (status, body) = get_text(&api.with_key(KEY), "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        body.contains("# TYPE turnstile_mcp_servers_up gauge")
            && body.contains("turnstile_turns_started_total 0"),
        "{body}"
    );

    let scrape = Http::new(proc.metrics);
    let resp = scrape.request_raw("GET", "/metrics", None).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8"
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("turnstile_sessions_active 0"));
    // Nothing else is served there, with or without a key.
    let (status, body) = scrape.get("/sessions").await;
    assert_eq!(status, 404, "{body}");
    let (status, _) = scrape.with_key(KEY).get("/meta").await;
    assert_eq!(status, 404);
    let (status, _) = scrape.post("/metrics", &json!({})).await;
    assert_eq!(status, 405);
}

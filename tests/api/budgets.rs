//! Budgets, rate limits and spend per principal, against the real binary: a spent budget
//! refuses the turn before any upstream request, with a body naming the budget and when it
//! resets; a rate limit answers 429 with `Retry-After`; usage survives `kill -9` and matches
//! what the fake upstream reported; `GET /usage` shows a principal its own rows and an admin
//! every one; instances on one PostgreSQL share usage.

use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::process::Child;
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

use crate::common::postgres::PgCluster;
use crate::common::{config_text, Http};

const ALICE: &str = "alice-budget-secret";
const BOB: &str = "bob-budget-secret";
const CAROL: &str = "carol-budget-secret";
const ROOT: &str = "root-budget-secret";
const DAVE: &str = "dave-budget-secret";

const VARS: &[(&str, &str)] = &[
    ("TEST_BUDGET_ALICE", ALICE),
    ("TEST_BUDGET_BOB", BOB),
    ("TEST_BUDGET_CAROL", CAROL),
    ("TEST_BUDGET_ROOT", ROOT),
    ("TEST_BUDGET_DAVE", DAVE),
];

/// USD per million tokens of the fake upstream.
const PRICE_IN: f64 = 2.0;
const PRICE_OUT: f64 = 4.0;

/// alice may spend 15 tokens a day (one answer of the fake's default 10 + 5), bob makes 2
/// turn requests a minute, carol has no limit, root is an admin, dave runs one tool a day.
const KEYS: &str = r#"
[keys.alice]
key_env = "TEST_BUDGET_ALICE"
tokens_per_day = 15

[keys.bob]
key_env = "TEST_BUDGET_BOB"
requests_per_minute = 2

[keys.carol]
key_env = "TEST_BUDGET_CAROL"

[keys.root]
key_env = "TEST_BUDGET_ROOT"
admin = true

[keys.dave]
key_env = "TEST_BUDGET_DAVE"
tool_calls_per_day = 1
"#;

/// The fake upstream, priced, with [`KEYS`].
fn config(fake: &FakeOpenAi) -> String {
    config_text(fake, KEYS).replacen(
        "retries = 0",
        &format!("retries = 0\nprice = {{ input = {PRICE_IN}, output = {PRICE_OUT} }}"),
        1,
    )
}

/// The real binary serving `dir/tools.toml`.
struct Proc {
    child: Child,
    http: Http,
}

async fn spawn(dir: &std::path::Path) -> Proc {
    let (child, addr) = crate::common::binary::serve_with_env(&dir.join("tools.toml"), VARS).await;
    Proc {
        child,
        http: Http::new(addr),
    }
}

/// A POST's status, `Retry-After` and JSON body.
async fn post(http: &Http, path: &str, body: &Value) -> (u16, Option<u64>, Value) {
    let resp = http
        .request_raw("POST", path, Some(serde_json::to_vec(body).unwrap()))
        .await;
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        retry,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn session(http: &Http) -> String {
    let (status, created) = http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    created["sessionId"].as_str().unwrap().to_string()
}

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

/// Midnight UTC starting tomorrow, as the refusal writes it.
fn tomorrow() -> String {
    let d = time::OffsetDateTime::now_utc().date().next_day().unwrap();
    format!(
        "{:04}-{:02}-{:02}T00:00:00Z",
        d.year(),
        u8::from(d.month()),
        d.day()
    )
}

#[tokio::test]
async fn an_over_budget_principal_is_refused_before_any_upstream_request() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config(&fake)).unwrap();
    let p = spawn(dir.path()).await;
    let alice = p.http.with_key(ALICE);
    let sid = session(&alice).await;

    fake.push(Reply::text("within budget"));
    let (status, _, resp) = post(&alice, &format!("/sessions/{sid}/turns"), &user("one")).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(fake.request_count(), 1);

    // 15 of 15 tokens used: every surface that starts a turn refuses, before the model.
    fake.set_fallback(Reply::text("must not be asked"));
    let today_before = tomorrow();
    for (path, body) in [
        (format!("/sessions/{sid}/turns"), user("two")),
        (
            format!("/sessions/{sid}/messages"),
            json!({"content": "three"}),
        ),
        (format!("/sessions/{sid}/run"), json!({"goal": "four"})),
    ] {
        let (status, retry, err) = post(&alice, &path, &body).await;
        assert_eq!(status, 429, "{path}: {err}");
        let e = &err["error"];
        assert_eq!(e["type"], "budget_exceeded", "{err}");
        assert_eq!(e["budget"], "tokens_per_day", "{err}");
        assert_eq!(e["key"], "keys.alice.tokens_per_day", "{err}");
        assert_eq!(e["limit"], 15, "{err}");
        assert_eq!(e["used"], 15, "{err}");
        let resets = e["resets_at"].as_str().unwrap();
        assert!(resets == today_before || resets == tomorrow(), "{err}");
        assert!(e["message"].as_str().unwrap().contains("tokens_per_day"));
        let retry = retry.expect("Retry-After");
        assert!((1..=86_400).contains(&retry), "{retry}");
    }
    assert_eq!(
        fake.request_count(),
        1,
        "no upstream request for a refused turn"
    );

    // Another principal's budget is its own.
    let carol = p.http.with_key(CAROL);
    let other = session(&carol).await;
    let (status, _, resp) = post(&carol, &format!("/sessions/{other}/turns"), &user("hi")).await;
    assert_eq!(status, 200, "{resp}");

    // The metrics count the spend and the refusals by principal name.
    let resp = p
        .http
        .with_key(ROOT)
        .request_raw("GET", "/metrics", None)
        .await;
    let text = resp.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8_lossy(&text);
    for line in [
        "turnstile_principal_input_tokens_total{principal=\"alice\"} 10",
        "turnstile_principal_output_tokens_total{principal=\"alice\"} 5",
        "turnstile_principal_refusals_total{principal=\"alice\",budget=\"tokens_per_day\"} 3",
    ] {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
    assert!(!text.contains(ALICE), "a key in the metrics");
    drop(p.child);
}

#[tokio::test]
async fn over_requests_per_minute_a_turn_is_429_with_retry_after() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config(&fake)).unwrap();
    let p = spawn(dir.path()).await;
    let bob = p.http.with_key(BOB);
    let sid = session(&bob).await;
    fake.set_fallback(Reply::text("ok"));
    for text in ["one", "two"] {
        let (status, _, resp) = post(&bob, &format!("/sessions/{sid}/turns"), &user(text)).await;
        assert_eq!(status, 200, "{resp}");
    }
    let (status, retry, err) = post(&bob, &format!("/sessions/{sid}/turns"), &user("three")).await;
    assert_eq!(status, 429, "{err}");
    assert_eq!(err["error"]["type"], "rate_limited", "{err}");
    assert_eq!(err["error"]["budget"], "requests_per_minute", "{err}");
    assert_eq!(err["error"]["key"], "keys.bob.requests_per_minute", "{err}");
    assert_eq!(err["error"]["limit"], 2, "{err}");
    let retry = retry.expect("Retry-After");
    assert!(
        (1..=30).contains(&retry),
        "one request comes back every 30 s: {retry}"
    );
    assert_eq!(fake.request_count(), 2);
    // Reading is not a turn: not limited.
    for _ in 0..3 {
        assert_eq!(bob.get(&format!("/sessions/{sid}")).await.0, 200);
    }
    drop(p.child);
}

/// `GET /usage` with `query`, as `http`'s principal: its rows.
async fn usage(http: &Http, query: &str) -> (u16, Value) {
    http.get(&format!("/usage{query}")).await
}

fn kill9(child: &Child) {
    let pid = child.id().expect("pid");
    let status = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn usage_survives_kill_9_and_matches_the_tokens_the_fake_reported() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config(&fake)).unwrap();
    let mut p = spawn(dir.path()).await;
    let carol = p.http.with_key(CAROL);
    let sid = session(&carol).await;
    fake.push(Reply::text("first").usage(123, 45));
    fake.push(Reply::text("second").usage(7, 8));
    for text in ["one", "two"] {
        let (status, _, resp) = post(&carol, &format!("/sessions/{sid}/turns"), &user(text)).await;
        assert_eq!(status, 200, "{resp}");
    }
    let (status, before) = usage(&carol, "?group_by=principal,agent,upstream,model").await;
    assert_eq!(status, 200, "{before}");
    kill9(&p.child);
    let _ = p.child.wait().await;

    let p = spawn(dir.path()).await;
    let carol = p.http.with_key(CAROL);
    let (status, after) = usage(&carol, "?group_by=principal,agent,upstream,model").await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(after, before, "the same usage after kill -9");
    let rows = after["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{after}");
    let row = &rows[0];
    assert_eq!(row["principal"], "carol");
    assert_eq!(row["agent"], "assistant");
    assert_eq!(row["upstream"], "default");
    assert_eq!(row["model"], "fake-model");
    assert_eq!(row["input_tokens"], 130);
    assert_eq!(row["output_tokens"], 53);
    assert_eq!(row["tokens"], 183);
    assert_eq!(row["calls"], 2);
    let usd = (130.0 * PRICE_IN + 53.0 * PRICE_OUT) / 1e6;
    assert!((row["usd"].as_f64().unwrap() - usd).abs() < 1e-9, "{row}");
    assert_eq!(after["totals"]["tokens"], 183);
    // By day (the default): one row, today.
    let (_, by_day) = usage(&carol, "").await;
    let today = time::OffsetDateTime::now_utc().date();
    let today = format!(
        "{:04}-{:02}-{:02}",
        today.year(),
        u8::from(today.month()),
        today.day()
    );
    assert_eq!(by_day["rows"][0]["day"], today.as_str(), "{by_day}");
    assert_eq!(by_day["rows"][0]["tokens"], 183, "{by_day}");
    drop(p.child);
}

#[tokio::test]
async fn usage_shows_a_principal_its_own_rows_and_an_admin_every_one() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config(&fake)).unwrap();
    let p = spawn(dir.path()).await;
    let (alice, carol, root) = (
        p.http.with_key(ALICE),
        p.http.with_key(CAROL),
        p.http.with_key(ROOT),
    );
    for (http, tokens) in [(&alice, (4, 1)), (&carol, (20, 2))] {
        let sid = session(http).await;
        fake.push(Reply::text("hi").usage(tokens.0, tokens.1));
        let (status, _, resp) = post(http, &format!("/sessions/{sid}/turns"), &user("hi")).await;
        assert_eq!(status, 200, "{resp}");
    }
    let principals = |v: &Value| -> Vec<String> {
        v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["principal"].as_str().unwrap().to_string())
            .collect()
    };
    let (status, own) = usage(&alice, "?group_by=principal").await;
    assert_eq!(status, 200, "{own}");
    assert_eq!(principals(&own), ["alice"]);
    assert_eq!(own["totals"]["input_tokens"], 4);
    let (status, err) = usage(&alice, "?principal=carol").await;
    assert_eq!(status, 403, "{err}");
    assert_eq!(usage(&alice, "?principal=alice").await.0, 200);

    let (status, all) = usage(&root, "?group_by=principal").await;
    assert_eq!(status, 200, "{all}");
    assert_eq!(principals(&all), ["alice", "carol"]);
    assert_eq!(all["totals"]["input_tokens"], 24);
    let (_, one) = usage(&root, "?group_by=principal&principal=carol").await;
    assert_eq!(principals(&one), ["carol"]);
    let (_, none) = usage(&root, "?from=2000-01-01&to=2000-01-31").await;
    assert_eq!(none["rows"], json!([]), "{none}");
    assert_eq!(none["totals"]["tokens"], 0);

    for (query, says) in [
        ("?from=2026-13-01", "from"),
        ("?to=yesterday", "to"),
        ("?from=2026-12-02&to=2026-12-01", "after"),
        ("?group_by=day,color", "color"),
        ("?principal=a%20b", "principal"),
    ] {
        let (status, err) = usage(&root, query).await;
        assert_eq!(status, 400, "{query}: {err}");
        assert_eq!(err["error"]["type"], "invalid_request");
        assert!(
            err["error"]["message"].as_str().unwrap().contains(says),
            "{query}: {err}"
        );
    }
    drop(p.child);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_on_one_postgres_share_usage_and_budgets() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    // (With TURNSTILE_TEST_STORE=postgres the config has a store of its own: the pair's instead.)
    let text = config(&fake);
    let pair = pg.pair(text.split("\n[store]\n").next().unwrap(), 10);
    let a = spawn(pair.dirs[0].path()).await;
    let b = spawn(pair.dirs[1].path()).await;

    // alice spends her day's 15 tokens on A.
    let on_a = a.http.with_key(ALICE);
    let sid = session(&on_a).await;
    fake.push(Reply::text("spent on a"));
    let (status, _, resp) = post(&on_a, &format!("/sessions/{sid}/turns"), &user("a")).await;
    assert_eq!(status, 200, "{resp}");

    // B has heard of none of it but reads it from the store: refused before the model.
    let on_b = b.http.with_key(ALICE);
    let other = session(&on_b).await;
    let (status, _, err) = post(&on_b, &format!("/sessions/{other}/turns"), &user("b")).await;
    assert_eq!(status, 429, "{err}");
    assert_eq!(err["error"]["budget"], "tokens_per_day", "{err}");
    assert_eq!(err["error"]["used"], 15, "{err}");
    assert_eq!(fake.request_count(), 1);

    // Usage written on either instance is read on the other, and adds up.
    let carol_a = a.http.with_key(CAROL);
    let carol_b = b.http.with_key(CAROL);
    for (http, text) in [(&carol_a, "x"), (&carol_b, "y")] {
        let sid = session(http).await;
        fake.push(Reply::text(text).usage(100, 1));
        let (status, _, resp) = post(http, &format!("/sessions/{sid}/turns"), &user(text)).await;
        assert_eq!(status, 200, "{resp}");
    }
    for http in [&carol_a, &carol_b] {
        let (_, u) = usage(http, "?group_by=principal").await;
        assert_eq!(u["rows"][0]["input_tokens"], 200, "{u}");
        assert_eq!(u["rows"][0]["calls"], 2, "{u}");
    }
    let (_, all) = usage(&b.http.with_key(ROOT), "?group_by=principal").await;
    assert_eq!(all["totals"]["input_tokens"], 210, "{all}");
    drop((a.child, b.child));
}

#[tokio::test]
async fn past_tool_calls_per_day_a_call_gets_an_error_result_and_the_next_turn_is_refused() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let tools = format!(
        "{}\n[policy]\ntrust = [\"mcp__ex__add\"]\n",
        crate::common::mcp::example_server("ex", "")
    );
    let text = config(&fake).replacen(KEYS, &format!("{KEYS}\n{tools}"), 1);
    std::fs::write(dir.path().join("tools.toml"), text).unwrap();
    let p = spawn(dir.path()).await;
    let dave = p.http.with_key(DAVE);
    let sid = session(&dave).await;
    fake.push(Reply::tool_calls(&[
        ("call_1", "mcp__ex__add", json!({"a": 1, "b": 2})),
        ("call_2", "mcp__ex__add", json!({"a": 3, "b": 4})),
    ]));
    fake.push(Reply::text("one ran, one was refused"));
    let (status, _, resp) = post(&dave, &format!("/sessions/{sid}/turns"), &user("add")).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        resp["stopReason"], "end_turn",
        "the turn is not failed: {resp}"
    );
    // The model's second request: one result, one refusal that names the budget.
    let requests = fake.requests();
    let results: Vec<&Value> = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(results.len(), 2, "{:?}", requests[1]);
    let texts: Vec<String> = results.iter().map(|m| m["content"].to_string()).collect();
    assert_eq!(
        texts
            .iter()
            .filter(|t| t.contains("tool_calls_per_day"))
            .count(),
        1,
        "{texts:?}"
    );
    assert!(texts.iter().any(|t| t.contains('3')), "{texts:?}");

    let (status, _, err) = post(&dave, &format!("/sessions/{sid}/turns"), &user("more")).await;
    assert_eq!(status, 429, "{err}");
    assert_eq!(err["error"]["budget"], "tool_calls_per_day", "{err}");
    assert_eq!(err["error"]["used"], 1, "{err}");
    assert_eq!(fake.request_count(), 2);
    let (_, u) = usage(&dave, "?group_by=principal").await;
    assert_eq!(u["totals"]["tool_calls"], 1, "{u}");
    assert_eq!(u["totals"]["calls"], 2, "{u}");
    drop(p.child);
}

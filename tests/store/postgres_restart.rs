//! PostgreSQL restarted under two real instances (`pg_ctl stop -m fast`, then started again on
//! the same port and data). While it is down, requests that need the store fail within seconds,
//! 503 `store_unavailable` with `Retry-After`, and `/readyz` is 503; once it is back, both
//! instances reconnect by themselves (ready, new turns complete), a turn that was running when
//! the database went away is closed in the log by itself, and every turn answered 2xx is in
//! the log (the log checker passes).

use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::logcheck::check_log;
use crate::common::postgres::PgCluster;
use crate::common::{config_text, Http};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

/// Status, `Retry-After` and JSON body of a request, and how long it took.
async fn call(
    http: &Http,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, Option<String>, Value, Duration) {
    let started = Instant::now();
    let resp = http
        .request_raw(method, path, body.map(|b| serde_json::to_vec(b).unwrap()))
        .await;
    let status = resp.status().as_u16();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {bytes:?}"));
    (status, retry, v, started.elapsed())
}

async fn turn(http: &Http, sid: &str, text: &str) -> (u16, Option<String>, Value, Duration) {
    let body = json!({"messages": [{"role": "user", "content": text}]});
    call(http, "POST", &format!("/sessions/{sid}/turns"), Some(&body)).await
}

/// Asserts a request was refused as the store being unavailable, fast.
fn assert_refused(what: &str, (status, retry, v, took): &(u16, Option<String>, Value, Duration)) {
    assert_eq!(*status, 503, "{what}: {v}");
    assert!(retry.is_some(), "{what}: a 503 carries Retry-After");
    assert_eq!(v["error"]["type"], "store_unavailable", "{what}: {v}");
    assert!(
        *took < Duration::from_secs(5),
        "{what}: refused after {took:?}, not at once"
    );
}

/// Polls `/readyz` until its status is `want`, for at most 30 s.
async fn readyz_becomes(http: &Http, want: u16, dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _, v, _) = call(http, "GET", "/readyz", None).await;
        if status == want {
            if want != 200 {
                assert_eq!(v["error"]["store"]["writable"], false, "{v}");
            }
            return;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz still {status}, not {want}: {v}\nlog:\n{}",
            std::fs::read_to_string(dir.join("log.txt")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn events(http: &Http, sid: &str) -> Vec<Value> {
    let (status, v) = http
        .get(&format!("/sessions/{sid}/events/history?limit=1000"))
        .await;
    assert_eq!(status, 200, "{v}");
    v["events"].as_array().unwrap().clone()
}

fn is_terminal(ev: &Value) -> bool {
    matches!(
        ev["type"].as_str(),
        Some("turn.completed" | "turn.failed" | "turn.cancelled")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restarted_mid_load_fails_fast_503_then_both_instances_recover() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    fake.set_fallback(Reply::text("fine"));
    let p = pg.pair(&config_text(&fake, ""), 10);
    let (mut a, a_http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (mut b, b_http) = crate::common::binary::serve_in(p.dirs[1].path()).await;
    let (_, created) = a_http.post("/sessions", &json!({})).await;
    let sa = created["sessionId"].as_str().unwrap().to_string();
    let (_, created) = b_http.post("/sessions", &json!({})).await;
    let sb = created["sessionId"].as_str().unwrap().to_string();
    let mut answered: Vec<(String, String)> = Vec::new();
    for i in 0..3 {
        for (http, sid) in [(&a_http, &sa), (&b_http, &sb)] {
            let text = format!("before the restart #{i}");
            let (status, _, v, _) = turn(http, sid, &text).await;
            assert_eq!(status, 200, "{v}");
            answered.push((sid.clone(), text));
        }
    }

    // A turn runs on A (its model call held) when the database goes away; its start is
    // durable (committed 1 ms into the call).
    let gate = Gate::new();
    fake.push(Reply::text("answered while the database was down").hold(gate.clone()));
    let held = {
        let (http, sid) = (a_http.clone(), sa.clone());
        tokio::spawn(async move { turn(&http, &sid, "running at the restart").await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let held_turn = loop {
        let evs = events(&a_http, &sa).await;
        let last = evs.last().unwrap();
        if last["type"] == "user.message" && last["content"] == "running at the restart" {
            break last["turn_id"].as_str().unwrap().to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the held turn's start was never stored"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };

    pg.stop_fast();
    // While it is down: the store's refusal, at once, on either instance; both unready.
    let down = turn(&b_http, &sb, "while down").await;
    eprintln!(
        "a turn while the database is down: {} in {:?}: {}",
        down.0, down.3, down.2
    );
    assert_refused("a turn on B", &down);
    assert_refused(
        "a new session on A",
        &call(&a_http, "POST", "/sessions", Some(&json!({}))).await,
    );
    readyz_becomes(&a_http, 503, p.dirs[0].path()).await;
    readyz_becomes(&b_http, 503, p.dirs[1].path()).await;
    // The held turn's answer comes while the database is down: its end cannot be stored.
    gate.open();
    let held_answer = held.await.unwrap();
    eprintln!(
        "the turn cut by the restart: {} {}",
        held_answer.0, held_answer.2
    );
    if held_answer.0 == 200 {
        answered.push((sa.clone(), "running at the restart".into()));
    } else {
        // It began (its start is stored): not a 503 inviting a retry, but a 500 that says so.
        let (status, retry, v, _) = &held_answer;
        assert_eq!(*status, 500, "the turn cut by the restart: {v}");
        assert!(retry.is_none(), "no Retry-After for a turn that began: {v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains("began"),
            "{v}"
        );
    }

    pg.start_again();
    // Back: both instances reconnect by themselves.
    readyz_becomes(&a_http, 200, p.dirs[0].path()).await;
    readyz_becomes(&b_http, 200, p.dirs[1].path()).await;
    // The turn that was running is closed in the log by itself, with a reason.
    let deadline = Instant::now() + Duration::from_secs(30);
    let end = loop {
        let evs = events(&a_http, &sa).await;
        if let Some(end) = evs
            .iter()
            .find(|e| e["turn_id"] == held_turn.as_str() && is_terminal(e))
        {
            break end.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the turn running at the restart was never closed: {:?}",
            evs.last()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!("its end in the log: {end}");
    if end["type"] == "turn.failed" {
        assert!(
            end["message"].as_str().is_some_and(|m| !m.is_empty()),
            "{end}"
        );
    }
    // New turns complete, on each instance and across them.
    for (http, sid, text) in [
        (&a_http, &sa, "after the restart on A"),
        (&b_http, &sb, "after the restart on B"),
        (&b_http, &sa, "A's session on B"),
    ] {
        let (status, _, v, _) = turn(http, sid, text).await;
        assert_eq!(status, 200, "{text}: {v}");
        assert_eq!(v["stopReason"], "end_turn", "{text}: {v}");
        answered.push((sid.clone(), text.into()));
    }

    // Every answered turn is in the log, and the log holds the guarantees.
    let store = crate::common::stores::open(&p.dirs[0].path().join("tools.toml"));
    for sid in [&sa, &sb] {
        let log = check_log(&store, sid).await;
        for (s, text) in answered.iter().filter(|(s, _)| s == sid) {
            assert!(
                log.iter().any(|e| matches!(&e.body,
                    turnstile::log::EventBody::UserMessage { content, .. } if content == text.as_str())),
                "{s}: the answered turn {text:?} is missing from the log"
            );
        }
    }
    a.kill().await.unwrap();
    b.kill().await.unwrap();
}

/// Polls the session's history on `http` until `turn_id` has ended, for at most `within`;
/// whether it did, and the events' types and turn ids.
async fn ended_within(
    http: &Http,
    sid: &str,
    turn_id: &str,
    within: Duration,
) -> (bool, Vec<String>) {
    let started = Instant::now();
    loop {
        let (status, v) = http
            .get(&format!("/sessions/{sid}/events/history?limit=1000"))
            .await;
        let seen: Vec<String> = v["events"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| format!("{} {}", e["type"], e["turn_id"]))
            .collect();
        let ended = seen
            .iter()
            .any(|t| t.contains(turn_id) && t.contains("\"turn."));
        if (status == 200 && ended) || started.elapsed() > within {
            return (ended, seen);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Found by the chaos test (`store::chaos`): a message queued behind a running turn (`202`, its
/// inbox row committed) whose turn starts while PostgreSQL is down cannot commit its start. Its
/// row stayed marked as this process's, which never took it again while it lived, and kept the
/// session's lease: the accepted turn was neither run nor closed. Now an instance with no turn
/// of the session queued or running takes its own marked rows again: the turn runs once
/// PostgreSQL is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_turn_whose_start_could_not_be_stored_runs_once_postgres_is_back() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let p = pg.pair(&config_text(&fake, ""), 2);
    let (mut a, http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (_, created) = http.post("/sessions", &json!({})).await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    let gate = Gate::new();
    fake.push(Reply::text("first").hold(gate.clone()));
    let messages = format!("/sessions/{sid}/messages");
    let (status, _) = http.post(&messages, &json!({"content": "first"})).await;
    assert_eq!(status, 202);
    fake.wait_requests(1).await;
    let (status, queued) = http.post(&messages, &json!({"content": "queued"})).await;
    assert_eq!(status, 202, "{queued}");
    let queued_id = queued["turn_id"].as_str().unwrap().to_string();
    // The running turn ends while the database is down: the queued one starts then, and its
    // start cannot be committed.
    pg.stop_fast();
    fake.set_fallback(Reply::text("fine"));
    gate.open();
    tokio::time::sleep(Duration::from_millis(500)).await;
    pg.start_again();
    let (ended, seen) = ended_within(&http, &sid, &queued_id, Duration::from_secs(20)).await;
    let db = p.url.rsplit('/').next().unwrap();
    assert!(
        ended,
        "the queued turn {queued_id} never ran: {seen:#?}\ninbox: {}\nleases: {}",
        pg.psql(db, "SELECT seq, kind, turn_id, taken FROM inbox"),
        pg.psql(db, "SELECT * FROM leases"),
    );
    a.kill().await.unwrap();
}

/// Found by the chaos test (`store::chaos`): an AAP `none` turn whose start and tool call were
/// stored (the tool ran) but whose end cannot be committed (PostgreSQL went away) was answered
/// 503 `store_unavailable` with `Retry-After`, which says nothing was done; a client that
/// retried it (on another instance) ran the tool again. Now it is a 500 without `Retry-After`
/// that says the turn began; 503 stays for a turn none of whose events could be stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_whose_tool_ran_is_not_answered_503_when_its_end_cannot_be_stored() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let work = tempfile::tempdir().unwrap();
    let calls = work.path().join("calls.txt");
    let server = crate::common::mcp::example_server(
        "ex",
        &format!(
            "args = [\"--log-calls\", {:?}]",
            calls.display().to_string()
        ),
    );
    let extra = format!("{server}\n[policy]\ntrust = [\"mcp__ex__echo\"]\n");
    let p = pg.pair(&config_text(&fake, &extra), 2);
    let (mut a, http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (_, created) = http.post("/sessions", &json!({})).await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "mcp__ex__echo",
        json!({"text": "once"}),
    )]));
    let gate = Gate::new();
    fake.push(Reply::text("after the tool").hold(gate.clone()));
    let turn = {
        let (http, sid) = (http.clone(), sid.clone());
        tokio::spawn(async move { turn(&http, &sid, "echo once").await })
    };
    // The tool has run and its result is stored when the model is called again.
    fake.wait_requests(2).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    pg.stop_fast();
    gate.open();
    let (status, _, v, _) = turn.await.unwrap();
    pg.start_again();
    let ran = std::fs::read_to_string(&calls).unwrap_or_default();
    assert_eq!(ran.lines().count(), 1, "{ran}");
    assert_ne!(
        status, 503,
        "a turn whose tool ran must not invite a retry: {v}"
    );
    a.kill().await.unwrap();
}

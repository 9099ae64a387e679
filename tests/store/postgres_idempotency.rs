//! `Idempotency-Key`s shared by two real instances on one PostgreSQL database: a keyed turn on
//! A, repeated on B, gets A's response (another body: 422); the same key sent to A and B at once
//! starts exactly one turn and both get its response. The cost of the reservation, one
//! `INSERT ... ON CONFLICT` in one round trip, is printed beside a point read's.

use std::time::{Duration, Instant};

use crate::common::{config_text, logcheck::check_log, Http};
use serde_json::{json, Value};
use turnstile::log::{KeyReserved, KeyRow, Store};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// POST a turn with an `Idempotency-Key`: the status and the body's text.
async fn post_keyed(http: &Http, sid: &str, key: &str, body: &Value) -> (u16, String) {
    let resp = crate::common::sse_stream::open(
        &http.base,
        "POST",
        &format!("/sessions/{sid}/turns"),
        &[("idempotency-key", key)],
        Some(body),
    )
    .await;
    let status = resp.status;
    (status, resp.text().await)
}

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

/// The turns of the session's stored log that began with a user message.
async fn user_turns(url_config: &std::path::Path, sid: &str) -> Vec<String> {
    crate::common::stores::events(url_config, sid)
        .await
        .iter()
        .filter(|e| e.body.type_name() == "user.message")
        .map(|e| e.turn_id.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_used_on_a_is_answered_on_b_and_a_race_on_both_starts_one_turn() {
    let fake = FakeOpenAi::start().await;
    let p = crate::common::postgres::shared().pair(&config_text(&fake, ""), 10);
    let (_a, a) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (_b, b) = crate::common::binary::serve_in(p.dirs[1].path()).await;
    let config = p.dirs[0].path().join("tools.toml");
    let (status, created) = a.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["sessionId"].as_str().unwrap().to_string();

    // A keyed turn on A; its repeat on B answers A's outcome, with no turn of its own.
    fake.push(Reply::text("answered on A"));
    let first = post_keyed(&a, &sid, "key-a", &user("one")).await;
    assert_eq!(first.0, 200, "{}", first.1);
    let on_b = post_keyed(&b, &sid, "key-a", &user("one")).await;
    assert_eq!(on_b, first);
    assert_eq!(fake.requests().len(), 1);
    let (status, text) = post_keyed(&b, &sid, "key-a", &user("another body")).await;
    assert_eq!(status, 422, "{text}");
    assert_eq!(user_turns(&config, &sid).await.len(), 1);

    // The same key on A and B at once: one turn, and both get its response.
    fake.push(Reply::text("raced"));
    let two = user("two");
    let (x, y) = tokio::join!(
        post_keyed(&a, &sid, "key-race", &two),
        post_keyed(&b, &sid, "key-race", &two)
    );
    assert_eq!(x.0, 200, "{}", x.1);
    assert_eq!(x, y);
    let answer: Value = serde_json::from_str(&x.1).unwrap();
    assert_eq!(answer["messages"][0]["content"], "raced", "{answer}");
    assert_eq!(fake.requests().len(), 2, "one model call for the race");
    let turns = user_turns(&config, &sid).await;
    assert_eq!(turns.len(), 2, "one turn per key: {turns:?}");
    // And again in the streamed mode, many times in a row.
    for i in 0..5 {
        fake.push(Reply::text(&format!("streamed {i}")));
        let body = json!({"stream": "message", "messages": user(&format!("s{i}"))["messages"]});
        let key = format!("key-stream-{i}");
        let (x, y) = tokio::join!(
            post_keyed(&a, &sid, &key, &body),
            post_keyed(&b, &sid, &key, &body)
        );
        // The one that did not start the turn waits for it to be stored, then replays it, or
        // (streamed, the turn still running) is a 409 naming it.
        let ok = [&x, &y].iter().filter(|r| r.0 == 200).count();
        assert!(ok >= 1, "{x:?} {y:?}");
        for r in [&x, &y] {
            assert!(
                r.0 == 200 || (r.0 == 409 && r.1.contains("idempotent_request_in_progress")),
                "{r:?}"
            );
        }
    }
    assert_eq!(fake.requests().len(), 7, "one model call per key");
    assert_eq!(user_turns(&config, &sid).await.len(), 7);
    let store = crate::common::stores::open(&config);
    check_log(&store, &sid).await;

    // Deleting the session deletes its keys.
    let (status, _) = b.delete(&format!("/sessions/{sid}")).await;
    assert_eq!(status, 204);
    let left = store
        .reserve_idempotency_key(row(&sid, "key-a", now_ms()), 0)
        .await
        .unwrap();
    assert_eq!(left, KeyReserved::New { in_store: true });
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

fn row(sid: &str, key: &str, at: i64) -> KeyRow {
    KeyRow {
        session_id: sid.into(),
        key: key.into(),
        fingerprint: "fp".into(),
        started: None,
        created_at_ms: at,
    }
}

fn p50(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserved_idempotency_key_is_refused_to_a_second_store_and_costs_a_round_trip() {
    let (_, url) = crate::common::postgres::shared().store_table_and_url("");
    let open = |url: String| {
        tokio::task::spawn_blocking(move || {
            Store::open_postgres(&url, false, Duration::from_secs(10), None).unwrap()
        })
    };
    let (one, two) = (open(url.clone()).await.unwrap(), open(url).await.unwrap());
    let now = now_ms();
    let day = 24 * 3600 * 1000;
    assert_eq!(
        one.reserve_idempotency_key(row("s", "k", now), now - day)
            .await
            .unwrap(),
        KeyReserved::New { in_store: true }
    );
    // The other instance finds it reserved, its turn not started.
    let KeyReserved::Taken(found) = two
        .reserve_idempotency_key(row("s", "k", now + 1), now - day)
        .await
        .unwrap()
    else {
        panic!("taken")
    };
    assert_eq!(found.started, None);
    assert_eq!(found.created_at_ms, now);
    // Its turn started: the row, written in a commit, says which.
    let mut started = row("s", "k", now);
    started.started = Some(("turn_1".into(), 7));
    one.put_idempotency_key(started.clone(), now - day);
    one.flush().await.unwrap();
    assert_eq!(
        two.reserve_idempotency_key(row("s", "k", now + 2), now - day)
            .await
            .unwrap(),
        KeyReserved::Taken(started)
    );
    // Released, a reservation is free again; past 24 h a row is taken over.
    two.reserve_idempotency_key(row("s", "r", now), now - day)
        .await
        .unwrap();
    two.release_idempotency_key(row("s", "r", now))
        .await
        .unwrap();
    assert_eq!(
        one.reserve_idempotency_key(row("s", "r", now), now - day)
            .await
            .unwrap(),
        KeyReserved::New { in_store: true }
    );
    assert_eq!(
        two.reserve_idempotency_key(row("s", "k", now + day + 1), now + 1)
            .await
            .unwrap(),
        KeyReserved::New { in_store: true }
    );

    // The cost: a reservation against a point read, each one round trip.
    let (mut reserves, mut reads) = (Vec::new(), Vec::new());
    for i in 0..200 {
        let t = Instant::now();
        one.reserve_idempotency_key(row("s", &format!("m{i}"), now), now - day)
            .await
            .unwrap();
        reserves.push(t.elapsed());
        let t = Instant::now();
        one.session("s").await.unwrap();
        reads.push(t.elapsed());
    }
    eprintln!(
        "idempotency key reservation p50 {:?}, a point read p50 {:?}",
        p50(reserves),
        p50(reads)
    );
}

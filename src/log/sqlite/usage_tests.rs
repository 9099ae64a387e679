//! Usage riding on events (see `usage_rows.rs`): read whole before it is folded, after a
//! process stopped without folding, and after the session it rode on is deleted.

use std::sync::Arc;

use rusqlite::Connection;

use crate::log::{Event, EventBody, Store, UsageFilter, UsageRow};

fn message(seq: u64) -> Event {
    let body = EventBody::AgentMessage {
        content: format!("message {seq}"),
        plan: false,
        compaction: false,
        replaces: None,
    };
    let (id, created) = (crate::ids::new("evt"), "2026-01-01T00:00:00.000Z".into());
    Event::new(seq, id, "turn_1".into(), created, body)
}

fn call(input: u64) -> UsageRow {
    UsageRow {
        owner: "key:alice".into(),
        day: "2026-12-01".into(),
        agent: "a".into(),
        upstream: "up".into(),
        model: "m".into(),
        input_tokens: input,
        output_tokens: 1,
        calls: 1,
        ..UsageRow::default()
    }
}

/// (rows in `usage`, events carrying usage), read from the file.
fn where_usage_is(dir: &std::path::Path) -> (i64, i64) {
    let c = Connection::open(dir.join("turnstile.db")).unwrap();
    let count = |sql: &str| c.query_row(sql, [], |r| r.get(0)).unwrap();
    (
        count("SELECT count(*) FROM usage"),
        count("SELECT count(*) FROM events WHERE usage IS NOT NULL"),
    )
}

#[tokio::test]
async fn usage_riding_on_events_is_read_whole_after_a_stop_and_a_deleted_session() {
    let dir = tempfile::tempdir().unwrap();
    let (one, two): (Arc<str>, Arc<str>) = ("sess_1".into(), "sess_2".into());
    let store = Store::open(dir.path(), false).unwrap();
    // The first commit folds (nothing yet); the next ones carry their usage on their last event.
    store.append(&one, &message(1));
    store.flush().await.unwrap();
    store.append(&one, &message(2));
    store.add_usage(call(10));
    store.add_usage(call(5));
    store.flush().await.unwrap();
    assert_eq!(
        where_usage_is(dir.path()),
        (0, 1),
        "one event carries both calls"
    );
    // A commit with usage and no event adds it at once.
    store.add_usage(call(1));
    store.flush().await.unwrap();
    assert_eq!(where_usage_is(dir.path()), (1, 1));
    // Stopped without a fold (as by kill -9), then opened again: opening writes nothing;
    // the first commit folds what rode before the stop (the 20 of its own rides).
    drop(store);
    let store = Store::open(dir.path(), false).unwrap();
    store.append(&one, &message(3));
    store.add_usage(call(20));
    store.flush().await.unwrap();
    let c = Connection::open(dir.path().join("turnstile.db")).unwrap();
    let folded: i64 = c
        .query_row("SELECT input_tokens FROM usage", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        folded, 16,
        "what rode before the stop, with the call added at once"
    );
    // The session whose event carries usage is deleted: the usage stays its principal's.
    store.delete_session(&one);
    store.flush().await.unwrap();
    // The next event takes the deleted one's place (n): its usage counts all the same.
    store.append(&two, &message(1));
    store.add_usage(call(100));
    store.flush().await.unwrap();
    let alice = UsageFilter {
        owner: Some("key:alice".into()),
        ..UsageFilter::default()
    };
    let rows = store.usage(alice.clone()).await.unwrap();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!((rows[0].input_tokens, rows[0].calls), (136, 5));
    assert_eq!(where_usage_is(dir.path()).0, 1, "folded into its row");
    // Read again: nothing is folded twice.
    let again = store.usage(alice).await.unwrap();
    assert_eq!((again[0].input_tokens, again[0].calls), (136, 5));
}

#[test]
fn riding_usage_is_the_json_serde_makes() {
    let row = |owner: &str, usd: f64| UsageRow {
        owner: owner.into(),
        day: "2026-12-03".into(),
        agent: "a\"gent".into(),
        upstream: "up\\".into(),
        model: "m\u{1}é".into(),
        input_tokens: 10,
        output_tokens: u64::MAX,
        cached_tokens: 0,
        usd,
        calls: 1,
        tool_calls: 2,
    };
    for rows in [
        vec![],
        vec![row("", 0.0)],
        vec![row("k", 1.5e-7), row("q", 12.25)],
    ] {
        let ours = super::usage_rows::riding(&rows);
        assert_eq!(ours, serde_json::to_string(&rows).unwrap());
        assert_eq!(serde_json::from_str::<Vec<UsageRow>>(&ours).unwrap(), rows);
    }
}

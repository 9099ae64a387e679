use std::sync::Arc;

use crate::log::{Event, EventBody, Store};

fn message(seq: u64) -> Event {
    Event::new(
        seq,
        crate::ids::new("evt"),
        "turn_1".into(),
        "2026-01-01T00:00:00.000Z".into(),
        EventBody::AgentMessage {
            content: format!("message {seq}"),
            plan: false,
            compaction: false,
            replaces: None,
        },
    )
}

async fn seqs(store: &Store, session: &str) -> Vec<u64> {
    let events = store.events(session, 0, 100).await.unwrap();
    events.iter().map(|e| e.seq).collect()
}

#[tokio::test]
async fn after_a_failed_commit_no_event_goes_in_after_the_hole() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let (a, b): (Arc<str>, Arc<str>) = ("sess_a".into(), "sess_b".into());
    store.append(&a, &message(1));
    store.flush().await.unwrap();

    store.fail_commits(1);
    store.append(&a, &message(2));
    assert!(store.flush().await.is_err());

    // Written before its writer knew: it would follow the lost event 2. Another session's
    // writes in the same commit go in.
    let late = store.append(&a, &message(3));
    let other = store.append(&b, &message(1));
    let _ = store.flush().await;
    assert!(store.failed(late), "event 3 after the hole is refused");
    assert!(!store.failed(other));
    assert_eq!(seqs(&store, "sess_a").await, [1]);
    assert_eq!(seqs(&store, "sess_b").await, [1]);

    // Read back, the session writes on from what is stored.
    let again = store.append(&a, &message(2));
    let next = store.append(&a, &message(3));
    store.flush().await.unwrap();
    assert!(!store.failed(again) && !store.failed(next));
    assert_eq!(seqs(&store, "sess_a").await, [1, 2, 3]);
}

#[tokio::test]
async fn a_session_lost_from_its_first_event_starts_again_at_event_1() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let a: Arc<str> = "sess_a".into();
    store.append(&a, &message(1));
    store.fail_commits(1);
    assert!(store.flush().await.is_err());
    // What the log has decides, not what the failure said: event 1 follows nothing.
    store.append(&a, &message(1));
    store.append(&a, &message(2));
    store.flush().await.unwrap();
    assert_eq!(seqs(&store, "sess_a").await, [1, 2]);
}

use super::*;

fn record() -> SessionRecord {
    SessionRecord {
        agent: "a".into(),
        tools: None,
        options: Default::default(),
        client_tools: Vec::new(),
        seed: Vec::new(),
        asked: Vec::new(),
    }
}

fn user(text: &str) -> EventBody {
    EventBody::UserMessage {
        content: serde_json::Value::String(text.into()),
        files: vec![],
        skills: vec![],
    }
}

/// A session whose last turn is open: its `user.message` committed and published.
async fn open_turn(store: &Store) -> Session {
    let s = Session::restore("sess_t".into(), None, String::new(), record(), Vec::new());
    s.append(store, "turn_a", user("hi")).unwrap();
    store.flush().await.unwrap();
    assert_eq!(s.publish_durable(store).len(), 1);
    s
}

#[tokio::test]
async fn an_open_turn_is_closed_once_even_before_its_closing_is_committed() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let s = open_turn(&store).await;
    // A claim closes it; its commit is not yet published when the next turn's start looks.
    {
        let mut st = s.lock();
        assert_eq!(
            s.close_open_locked(&mut st, &store, FailReason::WorkerLost, "gone"),
            Some("turn_a".to_string())
        );
        assert_eq!(
            s.close_open_locked(&mut st, &store, FailReason::InternalError, "again"),
            None,
            "a closing appended and not yet committed already closes the turn"
        );
    }
    store.flush().await.unwrap();
    let published = s.publish_durable(&store);
    assert_eq!(published.len(), 1);
    assert!(published[0].body.is_terminal());
    assert_eq!(store.events("sess_t", 0, 100).await.unwrap().len(), 2);
}

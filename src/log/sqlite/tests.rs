//! The SQLite backend's tests, through the `Store` the crate holds.

use std::sync::Arc;

use rusqlite::{params, Connection};

use super::SqliteStore;
use crate::log::{Event, EventBody, StopReason};
use crate::log::{SessionRow, Store};

const CREATED: &str = "2026-01-01T00:00:00.000Z";

fn event(seq: u64, body: EventBody) -> Event {
    Event::new(
        seq,
        crate::ids::new("evt"),
        "turn_1".into(),
        CREATED.into(),
        body,
    )
}

fn message(seq: u64) -> Event {
    event(
        seq,
        EventBody::AgentMessage {
            content: format!("message {seq}"),
            plan: false,
            compaction: false,
            replaces: None,
        },
    )
}

fn session_row(id: &str) -> SessionRow {
    SessionRow {
        id: id.into(),
        owner: None,
        created_at: CREATED.into(),
        record: "{}".into(),
    }
}

/// What identifies a stored event: its seq, id and exact bytes.
fn keys(events: &[Event]) -> Vec<(u64, String, String)> {
    events
        .iter()
        .map(|e| (e.seq, e.id.clone(), e.json.to_string()))
        .collect()
}

async fn all_events(store: &Store, session: &str) -> Vec<Event> {
    store.events(session, 0, 100_000).await.unwrap()
}

/// The schema of version 1: events in a `WITHOUT ROWID` table, with an index on their ids.
const V1_SCHEMA: &str = "
    CREATE TABLE sessions (id TEXT PRIMARY KEY, owner TEXT, created_at TEXT NOT NULL,
        record TEXT NOT NULL);
    CREATE TABLE events (session_id TEXT NOT NULL, seq INTEGER NOT NULL, id TEXT NOT NULL,
        turn_id TEXT NOT NULL, type TEXT NOT NULL, json TEXT NOT NULL,
        PRIMARY KEY (session_id, seq)) WITHOUT ROWID;
    CREATE UNIQUE INDEX events_by_id ON events (session_id, id);
    CREATE TABLE files (id TEXT PRIMARY KEY, owner TEXT, filename TEXT NOT NULL,
        mime_type TEXT NOT NULL, size_bytes INTEGER NOT NULL, sha256 TEXT NOT NULL,
        created_at TEXT NOT NULL);
";

#[tokio::test]
async fn a_version_1_store_is_migrated_without_losing_events() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("turnstile.db");
    let sessions = ["sess_a", "sess_b"];
    let mut written: [Vec<Event>; 2] = Default::default();
    {
        let conn = Connection::open(&path).unwrap();
        conn.execute_batch(V1_SCHEMA).unwrap();
        conn.execute(
            "INSERT INTO sessions (id, owner, created_at, record) VALUES (?1, NULL, ?2, ?3)",
            params![sessions[0], CREATED, r#"{"v":1}"#],
        )
        .unwrap();
        for i in 0..50 {
            let (s, evs) = (i % 2, &mut written[i % 2]);
            let ev = message(evs.len() as u64 + 1);
            conn.execute(
                "INSERT INTO events (session_id, seq, id, turn_id, type, json)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![
                    sessions[s],
                    ev.seq as i64,
                    ev.id,
                    ev.turn_id,
                    ev.body.type_name(),
                    &*ev.json
                ],
            )
            .unwrap();
            evs.push(ev);
        }
    }

    let store = Store::open(dir.path(), false).unwrap();
    for (s, evs) in sessions.iter().zip(&written) {
        assert_eq!(keys(&all_events(&store, s).await), keys(evs));
        for ev in evs {
            assert_eq!(store.seq_of(s, &ev.id).await.unwrap(), Some(ev.seq));
        }
    }
    let row = store.session(sessions[0]).await.unwrap().unwrap();
    assert_eq!(row.record, r#"{"v":1}"#);
    {
        let conn = Connection::open(&path).unwrap();
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .unwrap();
        assert_eq!(version, 6);
        let leftovers: i64 = conn
            .query_row(
                "SELECT COUNT(*) FROM sqlite_master WHERE name IN ('events_by_id', 'events_v1')",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(leftovers, 0);
    }

    // Writes work on the migrated schema.
    let sid: Arc<str> = sessions[0].into();
    let new = message(written[0].len() as u64 + 1);
    let ticket = store.append(&sid, &new);
    store.commit().unwrap();
    assert_eq!(store.committed(), ticket);
    written[0].push(new.clone());
    assert_eq!(keys(&all_events(&store, &sid).await), keys(&written[0]));
    assert_eq!(store.seq_of(&sid, &new.id).await.unwrap(), Some(new.seq));
    drop(store);

    // A second open finds version 3 and leaves the store as it is.
    let store = Store::open(dir.path(), false).unwrap();
    for (s, evs) in sessions.iter().zip(&written) {
        assert_eq!(keys(&all_events(&store, s).await), keys(evs));
    }
}

#[tokio::test]
async fn open_turn_id_is_the_turn_of_the_last_event_of_that_session_unless_it_ended() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let (a, b): (Arc<str>, Arc<str>) = ("sess_a".into(), "sess_b".into());
    assert_eq!(store.open_turn_id(&a).await.unwrap(), None);
    let in_turn = |seq: u64, turn: &str| {
        let body = message(seq).body;
        Event::new(
            seq,
            crate::ids::new("evt"),
            turn.into(),
            CREATED.into(),
            body,
        )
    };
    for (seq, turn) in [(1, "turn_1"), (2, "turn_1"), (3, "turn_2")] {
        store.append(&a, &in_turn(seq, turn));
    }
    store.append(&b, &in_turn(1, "turn_9"));
    store.commit().unwrap();
    assert_eq!(
        store.open_turn_id(&a).await.unwrap().as_deref(),
        Some("turn_2")
    );
    assert_eq!(
        store.open_turn_id(&b).await.unwrap().as_deref(),
        Some("turn_9")
    );
    assert_eq!(store.open_turn_id("sess_none").await.unwrap(), None);
    // Its turn ended: no turn is open.
    let ended = Event::new(
        2,
        crate::ids::new("evt"),
        "turn_9".into(),
        CREATED.into(),
        crate::log::EventBody::TurnCancelled { usage: None },
    );
    store.append(&b, &ended);
    store.commit().unwrap();
    assert_eq!(store.open_turn_id(&b).await.unwrap(), None);
}

#[tokio::test]
async fn seq_of_finds_every_id_by_bisection_and_none_for_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let sessions: Vec<Arc<str>> = ["sess_a", "sess_b", "sess_c"]
        .into_iter()
        .map(Into::into)
        .collect();
    let mut written: Vec<Vec<Event>> = vec![Vec::new(); sessions.len()];
    for i in 0..600 {
        let s = i % sessions.len();
        let ev = message(written[s].len() as u64 + 1);
        store.append(&sessions[s], &ev);
        written[s].push(ev);
        if i % 4 == 3 {
            store.commit().unwrap();
        }
    }
    store.commit().unwrap();

    for (s, evs) in sessions.iter().zip(&written) {
        assert_eq!(evs.len(), 200);
        for ev in evs {
            assert_eq!(store.seq_of(s, &ev.id).await.unwrap(), Some(ev.seq));
        }
    }
    let (a, b) = (&sessions[0], &sessions[1]);
    // Well-formed ids that were never written: after every event, before every event, and
    // between two events of the session (same time part as an event, smaller random part).
    let later = crate::ids::new("evt");
    let earliest = format!("evt_{}", "0".repeat(24));
    let stored = &written[0][100].id;
    let between = format!("{}00000000", &stored[..stored.len() - 8]);
    assert_ne!(
        &between, stored,
        "pick an event whose random part is not zero"
    );
    for unknown in [&later, &earliest, &between] {
        assert_eq!(store.seq_of(a, unknown).await.unwrap(), None, "{unknown}");
    }
    // An id of session A is not found in session B, though it sorts among B's ids.
    for ev in &written[0] {
        assert_eq!(store.seq_of(b, &ev.id).await.unwrap(), None);
    }
    assert_eq!(
        store.seq_of("sess_empty", &written[0][0].id).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn seq_of_still_finds_ids_across_a_hole() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    // The hole at every place in 1..=20. The first probe of a bisection over 1..=20 is
    // seq 10, so a hole there sends every lookup down the fallback scan; a hole elsewhere
    // is met only by the lookups whose probes land on it.
    for hole in 1..=20u64 {
        let sid: Arc<str> = format!("sess_hole_{hole}").into();
        let mut kept = Vec::new();
        let mut lost = None;
        for seq in 1..=20 {
            let ev = message(seq);
            if seq == hole {
                lost = Some(ev); // Its commit failed: never stored.
            } else {
                store.append(&sid, &ev);
                kept.push(ev);
            }
        }
        store.commit().unwrap();
        assert_eq!(keys(&all_events(&store, &sid).await), keys(&kept));
        for ev in &kept {
            assert_eq!(
                store.seq_of(&sid, &ev.id).await.unwrap(),
                Some(ev.seq),
                "hole at {hole}"
            );
        }
        let lost = lost.unwrap();
        assert_eq!(store.seq_of(&sid, &lost.id).await.unwrap(), None);
    }
}

#[tokio::test]
async fn concurrent_commits_from_many_threads_make_every_write_durable() {
    const THREADS: usize = 8;
    const EVENTS: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                let sid: Arc<str> = format!("sess_{t}").into();
                let mut written = Vec::new();
                let mut last_ticket = 0;
                for seq in 1..=EVENTS {
                    let ev = message(seq);
                    last_ticket = store.append(&sid, &ev);
                    store.commit().unwrap();
                    // Our own write is through a commit once commit() returns.
                    assert!(store.committed() >= last_ticket);
                    written.push(ev);
                }
                (sid, written, last_ticket)
            })
        })
        .collect();
    let results: Vec<_> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let last_ticket = results.iter().map(|r| r.2).max().unwrap();
    assert_eq!(last_ticket, THREADS as u64 * EVENTS);
    assert_eq!(store.committed(), last_ticket);
    drop(store);

    let store = Store::open(dir.path(), false).unwrap();
    let mut total = 0;
    for (sid, written, _) in &results {
        let read = all_events(&store, sid).await;
        assert_eq!(keys(&read), keys(written), "{sid}");
        total += read.len();
    }
    assert_eq!(total, THREADS * EVENTS as usize);
}

/// Flushes that find another commit under way wait for it without blocking their thread;
/// each returns once its own writes are committed, whoever committed them. With and
/// without fsync (where one flush at a time commits on a blocking thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_flushes_from_many_tasks_make_every_write_durable() {
    concurrent_flushes(false).await;
    concurrent_flushes(true).await;
}

async fn concurrent_flushes(fsync: bool) {
    const TASKS: usize = 32;
    const EVENTS: u64 = 100;
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), fsync).unwrap();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let store = store.clone();
            tokio::spawn(async move {
                let sid: Arc<str> = format!("sess_{t}").into();
                let mut written = Vec::new();
                for seq in 1..=EVENTS {
                    let ev = message(seq);
                    let ticket = store.append(&sid, &ev);
                    store.flush().await.unwrap();
                    assert!(store.committed() >= ticket);
                    written.push(ev);
                }
                (sid, written)
            })
        })
        .collect();
    let all = futures_util::future::join_all(tasks);
    let results = tokio::time::timeout(std::time::Duration::from_secs(60), all)
        .await
        .expect("every flush returned");
    drop(store);

    let store = Store::open(dir.path(), false).unwrap();
    for r in results {
        let (sid, written) = r.unwrap();
        assert_eq!(
            keys(&all_events(&store, &sid).await),
            keys(&written),
            "{sid}"
        );
    }
}

/// Flushes beside threads that commit on their own all return: a flush that finds the
/// writer's lock taken waits to hear it is free, also from a commit that had nothing to
/// write (its writes went with another's). (That case once lost its wake-up and left a turn
/// waiting for good, once in ten bench runs; its window is too narrow to hit at will here,
/// so this is a stress test of the mixed path, not a reproduction.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_beside_commits_on_other_threads_all_return() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // Threads that keep taking the lock: mostly for commits that find nothing to write.
    let idle: Vec<_> = (0..3)
        .map(|_| {
            let (store, stop) = (store.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    store.commit().unwrap();
                }
            })
        })
        .collect();
    // One flusher: no other flush's commit comes to wake it.
    let flusher = tokio::spawn({
        let store = store.clone();
        async move {
            let sid: Arc<str> = "sess_1".into();
            for seq in 1..=2000 {
                store.append(&sid, &message(seq));
                store.flush().await.unwrap();
            }
        }
    });
    let done = tokio::time::timeout(std::time::Duration::from_secs(60), flusher).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in idle {
        t.join().unwrap();
    }
    assert!(done.is_ok(), "a flush waited for good");
}

#[tokio::test]
async fn unfinished_sessions_lists_sessions_whose_last_event_is_not_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let (done, running): (Arc<str>, Arc<str>) = ("sess_done".into(), "sess_running".into());
    store.put_session(session_row(&done));
    store.put_session(session_row(&running));
    store.append(&done, &message(1));
    store.append(&running, &message(1));
    store.append(
        &done,
        &event(
            2,
            EventBody::TurnCompleted {
                usage: None,
                stop_reason: StopReason::EndTurn,
            },
        ),
    );
    store.append(&running, &message(2));
    store.commit().unwrap();
    assert_eq!(
        store.unfinished_sessions().await.unwrap(),
        vec![running.to_string()]
    );
}

#[test]
fn the_wal_stops_growing_under_steady_commits() {
    // A small restart threshold, so that a few thousand commits cross it many times.
    let dir = tempfile::tempdir().unwrap();
    let store = Store::from(SqliteStore::open_tuned(dir.path(), false, 256).unwrap());
    let session: Arc<str> = "sess_wal".into();
    let wal = dir.path().join("turnstile.db-wal");
    let mut largest = 0;
    // Commits back to back, as under load: the checkpointer never sees a quiet WAL.
    for seq in 1..=12_000 {
        store.append(&session, &message(seq));
        store.commit().unwrap();
        largest = largest.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
    }
    // Every commit writes two or three frames: 12,000 commits would leave a WAL of 24,000+
    // frames (96 MiB+) if it never restarted. With restarts it stays near the threshold,
    // past it only while the thread's own checkpoint holds the checkpoint lock (the writer's
    // waits for the next commit then): a few hundred frames here, more on a busy machine.
    let frame = 4096 + 24;
    assert!(
        largest < 4096 * frame,
        "the WAL grew to {largest} bytes ({} frames)",
        largest / frame
    );
    drop(store);
    let store = Store::open(dir.path(), false).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let events = rt.block_on(store.events("sess_wal", 0, 20_000)).unwrap();
    assert_eq!(events.len(), 12_000);
}

#[tokio::test]
async fn idempotency_keys_are_stored_with_their_turn_and_expire_purge_and_go_with_the_session() {
    use crate::log::{KeyReserved, KeyRow};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let sid: Arc<str> = "sess_k".into();
    let key = |k: &str, at: i64, turn: Option<(&str, u64)>| KeyRow {
        session_id: sid.to_string(),
        key: k.into(),
        fingerprint: format!("fp-{k}"),
        started: turn.map(|(t, a)| (t.to_string(), a)),
        created_at_ms: at,
    };
    const DAY: i64 = 24 * 3600 * 1000;
    let now = 10 * DAY;
    store.put_session(session_row(&sid));
    // The first key queued brings a purge with it; an old row is there to be purged.
    let old = key("old", now - 2 * DAY, Some(("turn_0", 0)));
    store.put_idempotency_key(old.clone(), 0);
    store.commit().unwrap();
    let fresh = key("k1", now, Some(("turn_1", 3)));
    store.put_idempotency_key(fresh.clone(), now - DAY);
    store.append(&sid, &message(4));
    store.commit().unwrap();

    let found = store
        .reserve_idempotency_key(key("k1", now + 5, None), now - DAY)
        .await
        .unwrap();
    assert_eq!(found, KeyReserved::Taken(fresh.clone()));
    // Past its 24 h a key is ignored: free again.
    let expired = store
        .reserve_idempotency_key(key("old", now, None), now - DAY)
        .await
        .unwrap();
    assert_eq!(expired, KeyReserved::New { in_store: false });
    let count = |dir: &std::path::Path| -> i64 {
        let conn = Connection::open(dir.join("turnstile.db")).unwrap();
        conn.query_row("SELECT COUNT(*) FROM idempotency_keys", [], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(count(dir.path()), 2, "the old row waits for a purge");
    // A purge (queued with every 1000th key) deletes the old row only.
    for i in 0..999 {
        store.put_idempotency_key(key(&format!("n{i}"), now, Some(("t", 1))), now - DAY);
    }
    store.put_idempotency_key(key("last", now, Some(("t", 1))), now - DAY);
    store.commit().unwrap();
    assert_eq!(count(dir.path()), 1001);
    assert_eq!(
        store
            .reserve_idempotency_key(key("k1", now, None), 0)
            .await
            .unwrap(),
        KeyReserved::Taken(fresh)
    );
    // Deleting the session deletes its keys.
    store.delete_session(&sid);
    store.commit().unwrap();
    assert_eq!(count(dir.path()), 0);
    drop(store);
    // Reopened: the schema is there, the keys are not.
    let store = Store::open(dir.path(), false).unwrap();
    let again = store
        .reserve_idempotency_key(key("k1", now, None), 0)
        .await
        .unwrap();
    assert_eq!(again, KeyReserved::New { in_store: false });
}

#[tokio::test]
async fn usage_rows_add_up_by_key_and_are_read_by_owner_and_days() {
    use crate::log::{UsageFilter, UsageRow};
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), false).unwrap();
    let row = |owner: &str, day: &str, input: u64, tools: u64| UsageRow {
        owner: owner.into(),
        day: day.into(),
        agent: "a".into(),
        upstream: "up".into(),
        model: "m".into(),
        input_tokens: input,
        output_tokens: 1,
        cached_tokens: 2,
        usd: 0.25,
        calls: 1,
        tool_calls: tools,
    };
    store.add_usage(row("key:alice", "2026-12-01", 10, 0));
    store.add_usage(row("key:alice", "2026-12-01", 5, 1));
    store.add_usage(row("key:alice", "2026-12-02", 7, 0));
    store.add_usage(row("", "2026-12-01", 1, 0));
    store.flush().await.unwrap();
    let alice = |from: Option<&str>, to: Option<&str>| UsageFilter {
        owner: Some("key:alice".into()),
        from: from.map(String::from),
        to: to.map(String::from),
    };
    let rows = store.usage(alice(None, None)).await.unwrap();
    assert_eq!(rows.len(), 2, "one row per day: {rows:?}");
    assert_eq!(
        (
            rows[0].input_tokens,
            rows[0].output_tokens,
            rows[0].cached_tokens
        ),
        (15, 2, 4)
    );
    assert_eq!((rows[0].calls, rows[0].tool_calls), (2, 1));
    assert!((rows[0].usd - 0.5).abs() < 1e-12);
    let rows = store
        .usage(alice(Some("2026-12-02"), Some("2026-12-31")))
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].input_tokens, 7);
    let every = store.usage(UsageFilter::default()).await.unwrap();
    assert_eq!(every.len(), 3);
    assert_eq!(every[0].owner, "", "keyless first on its day");
}

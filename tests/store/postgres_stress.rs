//! Two real instances sharing one PostgreSQL under load: 200 turns spread over both, with
//! random `POST /messages` on either instance, cancels, and subscribers that switch instance
//! with `Last-Event-ID` every few frames. The log checker must find every invariant held,
//! every accepted turn must run exactly once (in the log once, ended), and what each
//! switching subscriber saw must be the log, nothing lost or repeated.
//!
//! A `409 session_busy` (the session's lease is held by the other instance, running a turn)
//! is an allowed answer for now: the driver tries again, and the test counts them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::postgres::{Pair, PgCluster};
use crate::common::{config_text, Http};
use serde_json::json;
use turnstile::log::{Event, Store};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// `[store] lease_s` of the store the test opens itself.
const LEASE: Duration = Duration::from_secs(10);
const SESSIONS: usize = 4;
const TURNS_PER_SESSION: usize = 50;

/// Follows a session's event stream, switching instance (with `Last-Event-ID`) every few
/// frames, until it has `target` stored events (`target` 0: not known yet); their ids.
async fn follow_switching(
    bases: [String; 2],
    sid: String,
    target: Arc<AtomicUsize>,
) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    let mut on = fastrand::usize(..2);
    loop {
        let last = ids.last().cloned();
        let headers: Vec<(&str, &str)> = last
            .iter()
            .map(|id| ("last-event-id", id.as_str()))
            .collect();
        let mut s = crate::common::sse_stream::get(
            &bases[on],
            &format!("/sessions/{sid}/events/stream"),
            &headers,
        )
        .await
        .ok();
        for _ in 0..fastrand::usize(3..15) {
            let t = target.load(SeqCst);
            if t > 0 && ids.len() >= t {
                return ids;
            }
            match tokio::time::timeout(Duration::from_millis(300), s.next()).await {
                Ok(Some(f)) => {
                    if let Some(id) = f.id {
                        ids.push(id);
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        on = 1 - on;
    }
}

/// What one session's driver did: the turn ids accepted (202), those it cancelled, and how
/// many `409 session_busy` it was answered on the way.
#[derive(Default)]
struct Driven {
    accepted: Vec<String>,
    cancelled: usize,
    busy: usize,
}

/// Sends the session's turns, each on a random instance, cancelling every ninth.
async fn drive(https: [Http; 2], sid: String) -> Driven {
    let mut d = Driven::default();
    for i in 0..TURNS_PER_SESSION {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let on = fastrand::usize(..2);
            let (status, v) = https[on]
                .post(
                    &format!("/sessions/{sid}/messages"),
                    &json!({"content": format!("m{i}")}),
                )
                .await;
            if status == 202 {
                let turn_id = v["turn_id"].as_str().expect("a turn id").to_string();
                if i % 9 == 4 {
                    let (status, c) = https[on]
                        .post(
                            &format!("/sessions/{sid}/cancel"),
                            &json!({"turn_id": turn_id}),
                        )
                        .await;
                    assert!(status < 300, "cancel: {status} {c}");
                    d.cancelled += 1;
                }
                d.accepted.push(turn_id);
                break;
            }
            assert_eq!(status, 409, "{v}");
            assert_eq!(v["error"]["type"], "session_busy", "{v}");
            d.busy += 1;
            assert!(Instant::now() < deadline, "the session stayed busy");
            // Retry pacing (not a synchronisation): the other instance's turn is running.
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    d
}

/// Polls the log until every accepted turn has ended (at most 30 s); the events.
async fn until_all_ended(
    store: &Store,
    p: &Pair,
    pg: &PgCluster,
    sid: &str,
    n: usize,
) -> Vec<Event> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let evs = store.events(sid, 0, 100_000).await.unwrap();
        let ended = evs.iter().filter(|e| e.body.is_terminal()).count();
        if ended >= n {
            return evs;
        }
        if Instant::now() > deadline {
            panic!("{sid}: {ended} of {n} turns ended\n{}", dump(p, pg, &evs));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The log, the database's errors and both instances' warnings, for a failure's message.
fn dump(p: &Pair, pg: &PgCluster, events: &[Event]) -> String {
    let kinds: Vec<String> = events
        .iter()
        .map(|e| format!("{} {} {} {}", e.seq, e.body.type_name(), e.turn_id, e.id))
        .collect();
    let logs: Vec<String> = p
        .dirs
        .iter()
        .map(|d| std::fs::read_to_string(d.path().join("log.txt")).unwrap_or_default())
        .collect();
    format!(
        "{}\n{}\nA:\n{}\nB:\n{}",
        kinds.join("\n"),
        pg.errors(),
        logs[0],
        logs[1]
    )
}

/// Every accepted turn is in the log exactly once, started and ended, and no other turn is.
fn each_accepted_turn_ran_once(sid: &str, accepted: &[String], events: &[Event]) {
    let mut started: HashMap<&str, usize> = HashMap::new();
    let mut ended: HashMap<&str, usize> = HashMap::new();
    for e in events {
        if matches!(e.body, turnstile::log::EventBody::UserMessage { .. }) {
            *started.entry(&e.turn_id).or_default() += 1;
        }
        if e.body.is_terminal() {
            *ended.entry(&e.turn_id).or_default() += 1;
        }
    }
    for t in accepted {
        assert_eq!(
            started.get(t.as_str()),
            Some(&1),
            "{sid}: turn {t} started once"
        );
        assert_eq!(
            ended.get(t.as_str()),
            Some(&1),
            "{sid}: turn {t} ended once"
        );
    }
    assert_eq!(
        started.len(),
        accepted.len(),
        "{sid}: the log holds exactly the accepted turns"
    );
}

fn pair(pg: &PgCluster, fake: &FakeOpenAi, lease_s: u64) -> Pair {
    pg.pair(&config_text(fake, ""), lease_s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_turns_over_two_instances_with_cancels_and_reconnects_lose_and_repeat_nothing()
{
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    for i in 0..(SESSIONS * TURNS_PER_SESSION * 2) {
        fake.push(Reply::text(&format!("answer {i}")));
    }
    let p = pair(&pg, &fake, 10);
    let (mut a, a_http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (mut b, b_http) = crate::common::binary::serve_in(p.dirs[1].path()).await;
    let https = [a_http.clone(), b_http.clone()];
    let mut sids = Vec::new();
    for i in 0..SESSIONS {
        let (status, created) = https[i % 2].post("/sessions", &json!({})).await;
        assert!(status < 300, "{status} {created}");
        sids.push(created["sessionId"].as_str().unwrap().to_string());
    }
    let targets: Vec<Arc<AtomicUsize>> = sids.iter().map(|_| Arc::default()).collect();
    let followers: Vec<_> = sids
        .iter()
        .zip(&targets)
        .map(|(sid, t)| {
            let bases = [a_http.base.clone(), b_http.base.clone()];
            tokio::spawn(follow_switching(bases, sid.clone(), t.clone()))
        })
        .collect();
    let drivers: Vec<_> = sids
        .iter()
        .map(|sid| tokio::spawn(drive(https.clone(), sid.clone())))
        .collect();
    let store = Store::open_postgres(&p.url, false, LEASE, None).unwrap();
    let (mut busy, mut cancels, mut turns) = (0, 0, 0);
    for ((sid, driver), target) in sids.iter().zip(drivers).zip(&targets) {
        let d = driver.await.unwrap();
        busy += d.busy;
        cancels += d.cancelled;
        turns += d.accepted.len();
        let events = until_all_ended(&store, &p, &pg, sid, d.accepted.len()).await;
        let checked = std::panic::catch_unwind(|| {
            crate::common::logcheck::check_events(&events);
            each_accepted_turn_ran_once(sid, &d.accepted, &events);
        });
        if checked.is_err() {
            panic!("{sid}: the log:\n{}", dump(&p, &pg, &events));
        }
        target.store(events.len(), SeqCst);
    }
    for (sid, follower) in sids.iter().zip(followers) {
        let seen = follower.await.unwrap();
        let logged: Vec<String> = store
            .events(sid, 0, 100_000)
            .await
            .unwrap()
            .iter()
            .map(|e| e.id.clone())
            .collect();
        assert_eq!(
            seen, logged,
            "{sid}: what a switching subscriber saw is the log"
        );
    }
    let logs: Vec<String> = p
        .dirs
        .iter()
        .map(|d| std::fs::read_to_string(d.path().join("log.txt")).unwrap_or_default())
        .collect();
    for (name, log) in ["A", "B"].iter().zip(&logs) {
        assert!(
            !log.contains("group commit failed"),
            "instance {name} had a failed commit:\n{log}"
        );
    }
    assert_eq!(turns, SESSIONS * TURNS_PER_SESSION);
    println!(
        "{turns} turns over 2 instances ({cancels} cancelled): {busy} answers 409 session_busy on the way"
    );
    let _ = a.kill().await;
    let _ = b.kill().await;
}

/// The lease goes back only if the session is still idle when the release's turn comes: a
/// release decided while idle, whose check fails by then (a turn started here meanwhile),
/// keeps the lease, so the other instance stays out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_whose_session_is_busy_by_its_turn_keeps_the_lease() {
    use turnstile::log::LeaseTaken;
    let pg = PgCluster::start();
    let url = pg.database("release");
    let a = Store::open_postgres(&url, false, LEASE, None).unwrap();
    let b = Store::open_postgres(&url, false, LEASE, None).unwrap();
    assert_eq!(
        a.take_lease("sess_x").await.unwrap(),
        LeaseTaken::Held { fresh: true }
    );
    // Newly taken: unread until the engine says it read the session back.
    assert!(a.lease_unread("sess_x"));
    assert_eq!(
        a.take_lease("sess_x").await.unwrap(),
        LeaseTaken::Held { fresh: false }
    );
    assert!(
        a.lease_unread("sess_x"),
        "a second take does not read it back"
    );
    a.lease_read_back("sess_x");
    assert!(!a.lease_unread("sess_x"));
    let mark = a.lease_mark("sess_x").unwrap();
    a.release_lease_if("sess_x", mark, || false).await.unwrap();
    assert_eq!(a.lease_mark("sess_x"), Some(mark), "still held by A");
    assert_eq!(b.take_lease("sess_x").await.unwrap(), LeaseTaken::Busy);
    a.release_lease_if("sess_x", mark, || true).await.unwrap();
    assert_eq!(a.lease_mark("sess_x"), None);
    assert_eq!(
        b.take_lease("sess_x").await.unwrap(),
        LeaseTaken::Held { fresh: true }
    );
    assert!(b.lease_unread("sess_x"));
}

/// `session_busy` names the other instance's turn from one row, the session's last, unless
/// that ended its turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_turn_id_reads_the_last_event_of_that_session_only() {
    let pg = PgCluster::start();
    let url = pg.database("last");
    let store = Store::open_postgres(&url, false, LEASE, None).unwrap();
    assert_eq!(store.open_turn_id("sess_a").await.unwrap(), None);
    let in_turn = |seq: u64, turn: &str| agent_message(seq, turn, &format!("m{seq}"));
    let (a, b): (Arc<str>, Arc<str>) = ("sess_a".into(), "sess_b".into());
    for sid in [&a, &b] {
        store.take_lease(sid).await.unwrap();
    }
    for (seq, turn) in [(1, "turn_1"), (2, "turn_1"), (3, "turn_2")] {
        store.append(&a, &in_turn(seq, turn));
    }
    store.append(&b, &in_turn(1, "turn_9"));
    store.flush().await.unwrap();
    assert_eq!(
        store.open_turn_id("sess_a").await.unwrap().as_deref(),
        Some("turn_2")
    );
    assert_eq!(
        store.open_turn_id("sess_b").await.unwrap().as_deref(),
        Some("turn_9")
    );
    let ended = Event::new(
        2,
        "evt_ended".into(),
        "turn_9".into(),
        "2026-01-01T00:00:00.000Z".into(),
        turnstile::log::EventBody::TurnCancelled { usage: None },
    );
    store.append(&b, &ended);
    store.flush().await.unwrap();
    assert_eq!(
        store.open_turn_id("sess_b").await.unwrap(),
        None,
        "its turn ended"
    );
}

/// One session's clash (a stale writer's duplicate seq) fails that session's writes only: the
/// other sessions' events in the same group commit go in, and are notified; the clashing
/// session's log is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clash_of_one_session_fails_its_writes_only_and_the_rest_of_the_batch_commits() {
    use turnstile::log::Heard;
    let pg = PgCluster::start();
    let url = pg.database("clash");
    let store = Store::open_postgres(&url, false, LEASE, None).unwrap();
    let mut heard = store.commits_heard().expect("postgres listens");
    let ev = |seq: u64| agent_message(seq, "turn_1", &format!("m{seq}"));
    let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) =
        ("sess_a".into(), "sess_b".into(), "sess_c".into());
    for sid in [&a, &b, &c] {
        store.take_lease(sid).await.unwrap();
    }
    let first_a = ev(1);
    store.append(&a, &first_a);
    store.flush().await.unwrap();
    // The listener is up once it hears a commit (it connects on its own after the open).
    let probe: Arc<str> = "sess_probe".into();
    store.take_lease(&probe).await.unwrap();
    let mut seq = 0;
    'listening: loop {
        seq += 1;
        store.append(&probe, &ev(seq));
        store.flush().await.unwrap();
        let until = Instant::now() + Duration::from_millis(200);
        while let Ok(Ok(h)) = tokio::time::timeout_at(until.into(), heard.recv()).await {
            if matches!(h, Heard::Commit { ref session_id, .. } if session_id == "sess_probe") {
                break 'listening;
            }
        }
        assert!(seq < 50, "the listener never heard a commit");
    }
    // One batch: B's, then a stale writer of A (seq 1 again, and 2), then C's.
    let tb = store.append(&b, &ev(1));
    let ta = [store.append(&a, &ev(1)), store.append(&a, &ev(2))];
    let tc = [store.append(&c, &ev(1)), store.append(&c, &ev(2))];
    let commits = store.commits();
    // The flush's own ticket (C's) went in.
    store.flush().await.unwrap();
    assert_eq!(store.commits(), commits + 1, "one commit for the batch");
    assert!(ta.iter().all(|t| store.failed(*t)), "A's writes failed");
    assert!(!store.failed(tb) && tc.iter().all(|t| !store.failed(*t)));
    let ids = |evs: Vec<Event>| evs.into_iter().map(|e| (e.seq, e.id)).collect::<Vec<_>>();
    assert_eq!(
        ids(store.events("sess_a", 0, 10).await.unwrap()),
        [(1, first_a.id.clone())],
        "A's log is as it was"
    );
    assert_eq!(store.events("sess_b", 0, 10).await.unwrap().len(), 1);
    assert_eq!(store.events("sess_c", 0, 10).await.unwrap().len(), 2);
    // Notified: B and C for the batch, not A.
    let mut notified = Vec::new();
    while !(notified.contains(&("sess_b".to_string(), 1))
        && notified.contains(&("sess_c".to_string(), 2)))
    {
        match tokio::time::timeout(Duration::from_secs(5), heard.recv()).await {
            Ok(Ok(Heard::Commit { session_id, seq })) => notified.push((session_id, seq)),
            other => panic!("no notification of B and C: {other:?} after {notified:?}"),
        }
    }
    assert!(
        !notified.iter().any(|(s, seq)| s == "sess_a" && *seq > 1),
        "{notified:?}"
    );
    // The next batch goes in as usual.
    store.append(&a, &ev(2));
    store.flush().await.unwrap();
    assert_eq!(store.events("sess_a", 0, 10).await.unwrap().len(), 2);
    // The clashing session last in its batch: the flush (its ticket) says so, B's goes in.
    let tb = store.append(&b, &ev(2));
    let ta = store.append(&a, &ev(2));
    assert!(store.flush().await.is_err());
    assert!(store.failed(ta) && !store.failed(tb));
    assert_eq!(store.events("sess_b", 0, 10).await.unwrap().len(), 2);
    assert_eq!(store.events("sess_a", 0, 10).await.unwrap().len(), 2);
}

/// A writer whose lease was taken over while it stalled (a database restart that outlasted
/// `lease_s`, a process paused that long) writes nothing more of that session: its batch is
/// refused for that session only, saying why, and the taker's writes are the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_whose_lease_was_taken_over_writes_nothing_more_of_that_session() {
    use turnstile::log::LeaseTaken;
    let pg = PgCluster::start();
    let url = pg.database("fence");
    let a = Store::open_postgres(&url, false, LEASE, None).unwrap();
    let b = Store::open_postgres(&url, false, LEASE, None).unwrap();
    let ev = |seq: u64, text: &str| agent_message(seq, "turn_1", text);
    let (x, y): (Arc<str>, Arc<str>) = ("sess_x".into(), "sess_y".into());
    for sid in [&x, &y] {
        a.take_lease(sid).await.unwrap();
    }
    a.append(&x, &ev(1, "a, holding"));
    a.flush().await.unwrap();
    // A stalls past its lease (its expiry as after lease_s with no renewal; the holder's name
    // another's, so that A's own renewal cannot bring it back), and B takes the session over.
    pg.psql(
        "fence",
        "UPDATE leases SET holder = 'inst_stalled', expires_at = now() - interval '1 second'
          WHERE session_id = 'sess_x'",
    );
    assert_eq!(
        b.take_lease("sess_x").await.unwrap(),
        LeaseTaken::Held { fresh: true }
    );
    let by_b = ev(2, "b, the taker");
    b.append(&x, &by_b);
    b.flush().await.unwrap();
    // A goes on as if it still held x (seq 3: no clash of seqs to catch it), and writes y too.
    let ta = a.append(&x, &ev(3, "a, stale"));
    let ty = a.append(&y, &ev(1, "a, still holding y"));
    let err = a.flush().await.err();
    assert!(a.failed(ta), "A's write of x went in: {err:?}");
    assert!(!a.failed(ty), "A's write of y was refused with x's");
    let ids = |evs: Vec<Event>| evs.into_iter().map(|e| (e.seq, e.id)).collect::<Vec<_>>();
    assert_eq!(
        ids(b.events("sess_x", 0, 10).await.unwrap()).last(),
        Some(&(2, by_b.id.clone())),
        "the taker's write is the session's last"
    );
    assert_eq!(b.events("sess_x", 0, 10).await.unwrap().len(), 2);
    assert_eq!(b.events("sess_y", 0, 10).await.unwrap().len(), 1);
    // Alone in its batch, the refusal says why.
    a.append(&x, &ev(3, "a, stale again"));
    let err = a
        .flush()
        .await
        .expect_err("a stale writer's batch is refused");
    assert!(
        err.to_string()
            .contains("no longer holds the lease of session sess_x"),
        "{err}"
    );
    // B hands x back; A, which never saw its lease go, takes it again as new: what it holds of
    // x in memory is stale, and it must read x back before it writes.
    b.release_lease("sess_x", b.lease_mark("sess_x").unwrap())
        .await
        .unwrap();
    assert_eq!(
        a.take_lease("sess_x").await.unwrap(),
        LeaseTaken::Held { fresh: true }
    );
    assert_eq!(
        a.take_lease("sess_y").await.unwrap(),
        LeaseTaken::Held { fresh: false }
    );
}

/// An `agent.message` event of `turn` at `seq`.
fn agent_message(seq: u64, turn: &str, text: &str) -> Event {
    Event::new(
        seq,
        turnstile::ids::new("evt"),
        turn.into(),
        "2026-01-01T00:00:00.000Z".into(),
        turnstile::log::EventBody::AgentMessage {
            content: text.into(),
            plan: false,
            compaction: false,
            replaces: None,
        },
    )
}

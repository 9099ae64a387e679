//! The PostgreSQL store backend against a real PostgreSQL started by the test
//! (`common/postgres.rs`: initdb + pg_ctl into a temporary folder): migrations and a newer
//! schema, persistence across a restart and a `kill -9`, the event history and stream with
//! `Last-Event-ID`, the log checker over many turns, group commit (one transaction per batch,
//! a failed batch leaves nothing and the next goes in), `pg_notify` at commit, and files with
//! their quota counted from the store. (`TURNSTILE_TEST_STORE=postgres` runs the other API test
//! files against PostgreSQL too.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::postgres::{Pair, PgCluster};
use crate::common::{config_text, logcheck::check_log, Http, TestServer};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use turnstile::log::{Event, EventBody, Store};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

/// `[store] lease_s` of the stores the tests open themselves.
const LEASE: Duration = Duration::from_secs(10);

/// The config of a test server on a fresh database of `pg`.
fn pg_config(pg: &PgCluster, fake: &FakeOpenAi, extra: &str) -> String {
    format!("{}{}", config_text(fake, extra), pg.store_table(""))
}

/// A store on a fresh database of `pg`.
fn pg_store(pg: &PgCluster, db: &str) -> (Store, String) {
    let url = pg.database(db);
    (
        Store::open_postgres(&url, false, LEASE, None).expect("open"),
        url,
    )
}

fn message(seq: u64, text: &str) -> Event {
    Event::new(
        seq,
        turnstile::ids::new("evt"),
        "turn_1".into(),
        "2026-01-01T00:00:00.000Z".into(),
        EventBody::AgentMessage {
            content: text.into(),
            plan: false,
            compaction: false,
            replaces: None,
        },
    )
}

async fn send_turn(http: &Http, sid: &str, text: &str) -> Value {
    let (status, v) = http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": text}]}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    v
}

fn pair(pg: &PgCluster, fake: &FakeOpenAi, lease_s: u64) -> Pair {
    pg.pair(&config_text(fake, ""), lease_s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_database_is_migrated_and_a_newer_schema_refuses_to_start() {
    let pg = PgCluster::start();
    let (store, url) = pg_store(&pg, "migrate");
    drop(store);
    assert_eq!(
        pg.psql("migrate", "SELECT version FROM turnstile_schema"),
        "7"
    );
    // Opening again (a restart, or a second instance) migrates nothing and keeps the rows.
    let again = Store::open_postgres(&url, false, LEASE, None).expect("reopen");
    drop(again);
    assert_eq!(
        pg.psql("migrate", "SELECT count(*) FROM turnstile_schema"),
        "1"
    );
    pg.psql("migrate", "UPDATE turnstile_schema SET version = 99");
    let err = Store::open_postgres(&url, false, LEASE, None)
        .err()
        .expect("a newer schema refuses to start")
        .to_string();
    assert!(
        err.contains("version 99, newer than this turnstile knows"),
        "{err}"
    );
    // A wrong address fails at start with a line, not a hang.
    let err = Store::open_postgres("postgres://postgres@127.0.0.1:1/none", false, LEASE, None)
        .err()
        .expect("no server there")
        .to_string();
    assert!(err.starts_with("cannot open the postgres store"), "{err}");
}

#[tokio::test]
async fn url_env_naming_an_unset_variable_stops_start_with_one_line() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    let text = format!(
        "{}\n[store]\nbackend = \"postgres\"\nurl_env = \"TURNSTILE_TEST_PG_NEVER_SET\"\n",
        config_text(&fake, "")
    );
    std::fs::write(&path, text).unwrap();
    let cfg = turnstile::config::load(&path, &crate::common::env(&[])).expect("valid file");
    let err = turnstile::startup::start(cfg, "127.0.0.1:0".parse().unwrap(), Default::default())
        .await
        .err()
        .expect("refused")
        .to_string();
    assert!(!err.contains('\n'), "{err}");
    assert!(
        err.contains("url_env names TURNSTILE_TEST_PG_NEVER_SET, which is unset or empty"),
        "{err}"
    );
}

#[tokio::test]
async fn sessions_history_and_the_log_survive_a_restart() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let cfg = pg_config(&pg, &fake, "");
    let server = TestServer::start(&cfg).await;
    let tool = json!({"name": "get_weather", "description": "", "parameters": {"type": "object"}});
    let sid = server.session(json!({"tools": [tool]})).await;
    fake.push(Reply::text("first answer"));
    send_turn(&server.http, &sid, "one").await;
    fake.push(Reply::tool_calls(&[(
        "call_7",
        "get_weather",
        json!({"city": "Rome"}),
    )]));
    let resp = send_turn(&server.http, &sid, "two").await;
    assert_eq!(resp["stopReason"], "tool_use");
    let (_, before) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    let (_, events_before) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    let dir = server.stop().await;
    // The SQLite file is not where the log went.
    assert!(!dir.path().join("data/turnstile.db").exists());

    let server = TestServer::start_in(dir, &cfg).await;
    let (_, after) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(after, before);
    let (_, events_after) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    assert_eq!(events_after, events_before);
    let (_, one) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(one["status"], "awaiting_client", "{one}");
    // The pending call is answered after the restart and the turn goes on.
    fake.push(Reply::text("sunny"));
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "tool", "toolCallId": "call_7", "content": "18C"}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    let (_, list) = server.http.get("/sessions").await;
    assert_eq!(list["sessions"][0]["sessionId"], sid.as_str());
    let events = check_log(server.engine().store(), &sid).await;
    assert_eq!(events.last().unwrap().body.type_name(), "turn.completed");
}

#[tokio::test]
async fn the_stream_replays_after_last_event_id_then_follows_live() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&pg_config(&pg, &fake, "")).await;
    let sid = server.session(json!({})).await;
    for i in 0..3 {
        fake.push(Reply::text(&format!("answer {i}")));
        send_turn(&server.http, &sid, &format!("q{i}")).await;
    }
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/events/history"))
        .await;
    let all: Vec<Value> = hist["events"].as_array().unwrap().clone();
    assert_eq!(all.len(), 9);
    let cursor = all[4]["id"].as_str().unwrap().to_string();
    let mut s = crate::common::sse_stream::get(
        &server.http.base,
        &format!("/sessions/{sid}/events/stream"),
        &[("last-event-id", &cursor)],
    )
    .await
    .ok();
    let replay = s.take(4).await;
    let ids: Vec<String> = replay.iter().map(|f| f.id.clone().unwrap()).collect();
    let want: Vec<String> = all[5..]
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, want);
    // Then live: a new turn's events, each once, after the replay.
    fake.push(Reply::text("live"));
    send_turn(&server.http, &sid, "q3").await;
    let live = s.until(|f| f.is_terminal()).await;
    let stored: Vec<&crate::common::sse_stream::Frame> =
        live.iter().filter(|f| f.id.is_some()).collect();
    assert_eq!(stored.first().unwrap().event, "user.message");
    assert_eq!(stored.len(), 3, "{stored:?}");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_turns_over_several_sessions_keep_every_log_invariant_in_few_commits() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&pg_config(&pg, &fake, "")).await;
    let sessions: Vec<String> =
        futures_util::future::join_all((0..4).map(|_| server.session(json!({})))).await;
    let turns = 60;
    for _ in 0..turns {
        fake.push(Reply::text("ok"));
    }
    let before = server.engine().store().commits();
    let mut posts = Vec::new();
    for i in 0..turns {
        let sid = sessions[i % sessions.len()].clone();
        let http = server.http.clone();
        posts.push(tokio::spawn(async move {
            let (status, v) = http
                .post(
                    &format!("/sessions/{sid}/messages"),
                    &json!({"content": format!("m{i}")}),
                )
                .await;
            assert_eq!(status, 202, "{v}");
        }));
    }
    for p in posts {
        p.await.unwrap();
    }
    let mut events = 0;
    for sid in &sessions {
        server.wait_idle(sid).await;
        // Queued turns: wait until every one has ended.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let evs = server
                .engine()
                .store()
                .events(sid, 0, 100_000)
                .await
                .unwrap();
            let ended = evs.iter().filter(|e| e.body.is_terminal()).count();
            if ended == turns / sessions.len() {
                break;
            }
            assert!(Instant::now() < deadline, "{sid}: {ended} turns ended");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        events += check_log(server.engine().store(), sid).await.len();
    }
    let commits = server.engine().store().commits() - before;
    println!("{turns} turns, {events} events, {commits} postgres commits");
    assert_eq!(events, turns * 3);
    assert!(
        commits < events as u64,
        "{commits} commits for {events} events"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_writes_nothing_and_the_next_one_goes_in() {
    let pg = PgCluster::start();
    let (store, _) = pg_store(&pg, "batches");
    let sid: Arc<str> = Arc::from("sess_a");
    store.take_lease(&sid).await.unwrap();
    store.append(&sid, &message(1, "one"));
    store.flush().await.unwrap();
    // A batch holding a duplicate seq fails whole: the good event beside it is not written.
    let t2 = store.append(&sid, &message(2, "two"));
    let dup = store.append(&sid, &message(1, "dup"));
    assert!(store.flush().await.is_err());
    assert!(store.failed(t2) && store.failed(dup));
    let seqs = |evs: Vec<Event>| evs.iter().map(|e| e.seq).collect::<Vec<_>>();
    assert_eq!(seqs(store.events("sess_a", 0, 100).await.unwrap()), [1]);
    // The connection is usable again: the next batch commits.
    let t3 = store.append(&sid, &message(2, "two again"));
    store.flush().await.unwrap();
    assert!(!store.failed(t3));
    assert_eq!(seqs(store.events("sess_a", 0, 100).await.unwrap()), [1, 2]);
    // An injected failure too, and the blocking commit.
    store.fail_commits(1);
    store.append(&sid, &message(3, "three"));
    assert!(store.commit().is_err());
    store.append(&sid, &message(3, "three again"));
    tokio::task::spawn_blocking({
        let store = store.clone();
        move || store.commit()
    })
    .await
    .unwrap()
    .unwrap();
    let evs = store.events("sess_a", 0, 100).await.unwrap();
    assert_eq!(seqs(evs.clone()), [1, 2, 3]);
    assert!(
        matches!(&evs[2].body, EventBody::AgentMessage { content, .. } if content == "three again")
    );
    assert_eq!(store.seq_of("sess_a", &evs[1].id).await.unwrap(), Some(2));
    // A writer that goes on past a failed commit (its seq 4 lost, now 5) leaves no hole.
    store.fail_commits(1);
    store.append(&sid, &message(4, "four, lost"));
    assert!(store.flush().await.is_err());
    store.append(&sid, &message(5, "five"));
    let err = store.flush().await.expect_err("an event after a hole");
    assert!(
        err.to_string()
            .contains("session sess_a has no event 4: its event 5 would leave a hole"),
        "{err}"
    );
    assert_eq!(
        seqs(store.events("sess_a", 0, 100).await.unwrap()),
        [1, 2, 3]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_notifies_each_session_with_its_last_seq_only_once_committed() {
    let pg = PgCluster::start();
    let (store, url) = pg_store(&pg, "notify");
    let (client, mut conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        use futures_util::StreamExt;
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send((n.channel().to_string(), n.payload().to_string()));
            }
        }
    });
    client
        .batch_execute("LISTEN turnstile_events")
        .await
        .unwrap();
    let (a, b): (Arc<str>, Arc<str>) = (Arc::from("sess_a"), Arc::from("sess_b"));
    store.take_lease(&a).await.unwrap();
    store.take_lease(&b).await.unwrap();
    for seq in 1..=3 {
        store.append(&a, &message(seq, "a"));
    }
    store.append(&b, &message(1, "b"));
    // Nothing is heard before the commit.
    assert!(tokio::time::timeout(Duration::from_millis(200), rx.recv())
        .await
        .is_err());
    store.flush().await.unwrap();
    let mut heard = Vec::new();
    for _ in 0..2 {
        let n = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n.0, "turnstile_events");
        heard.push(n.1);
    }
    heard.sort();
    assert_eq!(heard, ["sess_a 3", "sess_b 1"]);
    // A failed batch notifies nothing.
    store.fail_commits(1);
    store.append(&a, &message(4, "a"));
    assert!(store.flush().await.is_err());
    assert!(tokio::time::timeout(Duration::from_millis(200), rx.recv())
        .await
        .is_err());
}

#[tokio::test]
async fn files_upload_and_download_and_the_quota_counts_from_the_store_across_a_restart() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    // Each file counts as at least 4,096 bytes: room for one file of 8 bytes, not two.
    let cfg = pg_config(&pg, &fake, "[limits]\ndisk_bytes_per_key = 8000\n");
    let server = TestServer::start(&cfg).await;
    let upload = |server: &TestServer, body: &'static [u8]| {
        let http = server.http.clone();
        async move {
            let resp = http
                .request_raw("POST", "/files?filename=a.txt", Some(body.to_vec()))
                .await;
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await.unwrap().to_bytes();
            (status, serde_json::from_slice::<Value>(&bytes).unwrap())
        }
    };
    let (status, file) = upload(&server, b"12345678").await;
    assert_eq!(status, 201, "{file}");
    let id = file["id"].as_str().unwrap().to_string();
    let (status, err) = upload(&server, b"abcdefgh").await;
    assert_eq!(status, 413, "{err}");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("disk_bytes_per_key"));
    let dir = server.stop().await;

    // After a restart the quota is read back from the store's records.
    let server = TestServer::start_in(dir, &cfg).await;
    let (status, meta) = server.http.get(&format!("/files/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(meta["size_bytes"], 8);
    let resp = server
        .http
        .request_raw("GET", &format!("/files/{id}/content"), None)
        .await;
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&body[..], b"12345678");
    let (status, _) = upload(&server, b"abcdefgh").await;
    assert_eq!(status, 413);
    let (status, _) = server.http.delete(&format!("/files/{id}")).await;
    assert_eq!(status, 204);
    let (status, _) = upload(&server, b"abcdefgh").await;
    assert_eq!(status, 201);
}

#[tokio::test]
async fn kill_9_mid_turn_then_a_restart_closes_the_turn_worker_lost() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let url_table = pg.store_table("");
    std::fs::write(
        dir.path().join("tools.toml"),
        format!("{}{url_table}", config_text(&fake, "")),
    )
    .unwrap();
    let (mut child, http) = crate::common::binary::serve_in(dir.path()).await;
    let (_, created) = http.post("/sessions", &json!({})).await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    fake.push(Reply::text("durable answer"));
    send_turn(&http, &sid, "keep this").await;
    let mut events =
        crate::common::sse_stream::get(&http.base, &format!("/sessions/{sid}/events/stream"), &[])
            .await
            .ok();
    let gate = Gate::new();
    fake.push(Reply::text("never finished").hold(gate.clone()));
    let (status, _) = http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "cut off"}),
        )
        .await;
    assert_eq!(status, 202);
    fake.wait_requests(2).await;
    events
        .until(|f| f.event == "user.message" && f.json()["content"] == "cut off")
        .await;
    let pid = child.id().expect("pid");
    assert!(std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let _ = child.wait().await;

    let (mut child, http) = crate::common::binary::serve_in(dir.path()).await;
    let (_, hist) = http.get(&format!("/sessions/{sid}/events/history")).await;
    let evs = hist["events"].as_array().unwrap();
    let types: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "user.message",
            "agent.message",
            "turn.completed",
            "user.message",
            "turn.failed"
        ]
    );
    assert_eq!(evs[4]["reason"], "worker_lost", "{}", evs[4]);
    fake.push(Reply::text("back again"));
    let resp = send_turn(&http, &sid, "again").await;
    assert_eq!(resp["messages"][0]["content"], "back again");
    gate.open();
    let _ = child.kill().await;
}

/// One flush per event, one at a time, then 32 writers at once; the median flush and the
/// commits the writers took (printed for the record; asserted only that concurrent flushes
/// share commits). On a cluster with `fsync = on`, first with the default
/// `synchronous_commit = on`, then with it `off` for the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_cost_with_synchronous_commit_on_and_off() {
    let pg = PgCluster::start_with(&[]);
    for (db, sync) in [("sync_on", "on"), ("sync_off", "off")] {
        let url = pg.database(db);
        pg.psql(
            db,
            &format!("ALTER DATABASE {db} SET synchronous_commit = {sync}"),
        );
        let store = Store::open_postgres(&url, false, LEASE, None).expect("open");
        let sid: Arc<str> = Arc::from("sess_one");
        store.take_lease(&sid).await.unwrap();
        let mut times = Vec::new();
        for seq in 1..=200 {
            store.append(&sid, &message(seq, "x"));
            let t = Instant::now();
            store.flush().await.unwrap();
            times.push(t.elapsed());
        }
        times.sort();
        let before = store.commits();
        let started = Instant::now();
        let writers: Vec<_> = (0..32)
            .map(|w| {
                let store = store.clone();
                tokio::spawn(async move {
                    let sid: Arc<str> = Arc::from(format!("sess_w{w}"));
                    store.take_lease(&sid).await.unwrap();
                    for seq in 1..=50 {
                        store.append(&sid, &message(seq, "y"));
                        store.flush().await.unwrap();
                    }
                })
            })
            .collect();
        for w in writers {
            w.await.unwrap();
        }
        let elapsed = started.elapsed();
        let commits = store.commits() - before;
        println!(
            "synchronous_commit={sync}: one writer: flush p50 {:?} p99 {:?}; 32 writers: 1600 flushes in {commits} commits, {:.0} flushes/s",
            times[100],
            times[198],
            1600.0 / elapsed.as_secs_f64()
        );
        assert!(
            commits < 1600,
            "{commits} commits for 1600 concurrent flushes"
        );
        for w in 0..32 {
            assert_eq!(
                store
                    .events(&format!("sess_w{w}"), 0, 100)
                    .await
                    .unwrap()
                    .len(),
                50
            );
        }
    }
}

/// Two instances on one database: one writer per session through its lease, renewal while
/// alive, expiry when the holder dies, release at once, and each hearing the other's commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_sessions_through_leases_and_hear_each_others_commits() {
    use turnstile::log::{Heard, LeaseTaken};
    let pg = PgCluster::start();
    let url = pg.database("two");
    let short = Duration::from_secs(1);
    let a = Store::open_postgres(&url, false, short, None).unwrap();
    let b = Store::open_postgres(&url, false, short, None).unwrap();
    assert_ne!(a.instance(), b.instance());
    let mut b_hears = b.commits_heard().expect("postgres listens");

    assert_eq!(
        a.take_lease("sess_x").await.unwrap(),
        LeaseTaken::Held { fresh: true }
    );
    assert_eq!(
        a.take_lease("sess_x").await.unwrap(),
        LeaseTaken::Held { fresh: false }
    );
    assert_eq!(b.take_lease("sess_x").await.unwrap(), LeaseTaken::Busy);
    // A's lease outlives lease_s while A is alive (renewed every third of it).
    tokio::time::sleep(short * 2).await;
    assert_eq!(b.take_lease("sess_x").await.unwrap(), LeaseTaken::Busy);
    assert!(b.expired_leases().await.unwrap().is_empty());

    // A runs a turn: its session is unfinished, but not for B to close while A holds it.
    let sid: Arc<str> = Arc::from("sess_x");
    a.put_session(turnstile::log::SessionRow {
        id: "sess_x".into(),
        owner: None,
        created_at: "2026-01-01T00:00:00.000Z".into(),
        record: "{}".into(),
    });
    a.append(&sid, &message(1, "a writes"));
    a.flush().await.unwrap();
    assert!(b.unfinished_sessions().await.unwrap().is_empty());
    let heard = tokio::time::timeout(Duration::from_secs(5), b_hears.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        heard,
        Heard::Commit {
            session_id: "sess_x".into(),
            seq: 1
        }
    );
    assert_eq!(b.events("sess_x", 0, 10).await.unwrap().len(), 1);

    // Released: B takes it at once, fresh (A wrote meanwhile).
    a.release_lease("sess_x", a.lease_mark("sess_x").unwrap())
        .await
        .unwrap();
    assert_eq!(
        b.take_lease("sess_x").await.unwrap(),
        LeaseTaken::Held { fresh: true }
    );
    b.release_all_leases().await.unwrap();
    assert_eq!(
        a.take_lease("sess_x").await.unwrap(),
        LeaseTaken::Held { fresh: true }
    );

    // A dies (renews nothing): within lease_s its lease expires, and B takes it and finds the
    // turn A left unfinished.
    let died = Instant::now();
    drop(a);
    let deadline = Instant::now() + short * 5;
    while b.expired_leases().await.unwrap().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the dead instance's lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        b.take_lease("sess_x").await.unwrap(),
        LeaseTaken::Held { fresh: true }
    );
    println!(
        "lease taken over {:?} after its holder died (lease_s = 1)",
        died.elapsed()
    );
    assert_eq!(b.unfinished_sessions().await.unwrap(), ["sess_x"]);
}

async fn event_types(http: &Http, sid: &str) -> Vec<Value> {
    let (status, v) = http
        .get(&format!("/sessions/{sid}/events/history?limit=1000"))
        .await;
    assert_eq!(status, 200, "{v}");
    v["events"].as_array().unwrap().clone()
}

/// Polls `check` on the events B reads until it holds or `within` passes; how long it took.
async fn until_events(
    http: &Http,
    sid: &str,
    within: Duration,
    check: impl Fn(&[Value]) -> bool,
) -> Duration {
    let started = Instant::now();
    loop {
        let evs = event_types(http, sid).await;
        if check(&evs) {
            return started.elapsed();
        }
        assert!(started.elapsed() < within, "not within {within:?}: {evs:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_on_b_while_a_runs_is_busy_and_b_takes_over_within_lease_s_after_kill_9() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let lease_s = 2;
    let p = pair(&pg, &fake, lease_s);
    let (mut a, a_http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (mut b, b_http) = crate::common::binary::serve_in(p.dirs[1].path()).await;
    let (_, created) = a_http.post("/sessions", &json!({})).await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    // A runs a turn, held at the model.
    let gate = Gate::new();
    fake.push(Reply::text("never finished").hold(gate.clone()));
    let (status, _) = a_http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "on A"}),
        )
        .await;
    assert_eq!(status, 202);
    fake.wait_requests(1).await;
    // B sees the session and A's stored events, but cannot start a turn on it.
    until_events(&b_http, &sid, Duration::from_secs(5), |e| {
        e.iter().any(|e| e["type"] == "user.message")
    })
    .await;
    let (status, err) = b_http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "on B"}]}),
        )
        .await;
    assert_eq!(status, 409, "{err}");
    assert_eq!(err["error"]["type"], "session_busy");
    // (A `/messages` on B is queued for A: tests/store/postgres_inbox.rs.)

    // A dies mid-turn: B closes the turn worker_lost within lease_s + 5 s, on its own.
    let pid = a.id().expect("pid");
    assert!(std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let _ = a.wait().await;
    let took = until_events(&b_http, &sid, Duration::from_secs(lease_s + 5), |e| {
        e.last()
            .is_some_and(|l| l["type"] == "turn.failed" && l["reason"] == "worker_lost")
    })
    .await;
    println!("worker_lost via B {took:?} after kill -9 of A (lease_s = {lease_s})");
    // B takes the next turn.
    fake.push(Reply::text("B answers"));
    let resp = send_turn(&b_http, &sid, "on B again").await;
    assert_eq!(resp["messages"][0]["content"], "B answers");
    let store = Store::open_postgres(&p.url, false, LEASE, None).unwrap();
    let events = check_log(&store, &sid).await;
    let types: Vec<&str> = events.iter().map(|e| e.body.type_name()).collect();
    assert_eq!(
        types,
        [
            "user.message",
            "turn.failed",
            "user.message",
            "agent.message",
            "turn.completed"
        ]
    );
    gate.open();
    let _ = b.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_hands_the_leases_back_at_once_and_turns_alternate_between_instances() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    // A long lease: B could not take A's sessions by expiry within this test.
    let p = pair(&pg, &fake, 60);
    let (mut a, a_http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (mut b, b_http) = crate::common::binary::serve_in(p.dirs[1].path()).await;
    let (_, created) = a_http.post("/sessions", &json!({})).await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    // Idle sessions have no writer: turns go to either instance, each seeing the other's.
    for (i, http) in [&a_http, &b_http, &a_http, &b_http].into_iter().enumerate() {
        fake.push(Reply::text(&format!("answer {i}")));
        let resp = send_turn(http, &sid, &format!("q{i}")).await;
        assert_eq!(resp["messages"][0]["content"], format!("answer {i}"));
    }
    let (_, hist) = b_http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(
        hist["history"]["full"].as_array().unwrap().len(),
        8,
        "{hist}"
    );
    // A runs a turn and is stopped with SIGTERM: the turn ends worker_shutdown and B takes
    // the session at once, not after lease_s.
    let gate = Gate::new();
    fake.push(Reply::text("cut").hold(gate.clone()));
    let (status, _) = a_http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "on A"}),
        )
        .await;
    assert_eq!(status, 202);
    fake.wait_requests(5).await;
    let pid = a.id().expect("pid");
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap()
        .success());
    let status = a.wait().await.unwrap();
    assert!(status.success(), "{status}");
    let last = event_types(&b_http, &sid).await;
    assert_eq!(last.last().unwrap()["reason"], "worker_shutdown");
    fake.push(Reply::text("B at once"));
    let started = Instant::now();
    let resp = send_turn(&b_http, &sid, "after A stopped").await;
    assert_eq!(resp["messages"][0]["content"], "B at once");
    assert!(started.elapsed() < Duration::from_secs(30));
    let store = Store::open_postgres(&p.url, false, LEASE, None).unwrap();
    check_log(&store, &sid).await;
    gate.open();
    let _ = b.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_on_a_reaches_a_stream_on_b_once_each_and_history_is_identical_on_both() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let p = pair(&pg, &fake, 10);
    let (mut a, a_http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (mut b, b_http) = crate::common::binary::serve_in(p.dirs[1].path()).await;
    let (_, created) = a_http.post("/sessions", &json!({})).await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    fake.push(Reply::text("before"));
    send_turn(&a_http, &sid, "q0").await;
    let mut on_b = crate::common::sse_stream::get(
        &b_http.base,
        &format!("/sessions/{sid}/events/stream"),
        &[],
    )
    .await
    .ok();
    let replayed = on_b.take(3).await;
    assert_eq!(replayed.last().unwrap().event, "turn.completed");
    // Two turns on A, one by the events API and one by AAP: B's subscriber gets them live.
    for (i, text) in ["q1", "q2"].iter().enumerate() {
        fake.push(Reply::text(&format!("answer {i}")));
        if i == 0 {
            let (status, _) = a_http
                .post(
                    &format!("/sessions/{sid}/messages"),
                    &json!({"content": text}),
                )
                .await;
            assert_eq!(status, 202);
        } else {
            send_turn(&a_http, &sid, text).await;
        }
        let frames = on_b.until(|f| f.is_terminal()).await;
        let stored: Vec<&str> = frames
            .iter()
            .filter(|f| f.id.is_some())
            .map(|f| f.event.as_str())
            .collect();
        assert_eq!(stored, ["user.message", "agent.message", "turn.completed"]);
    }
    // Each event once, in order, with A's ids; B's history and AAP history equal A's.
    let a_events = event_types(&a_http, &sid).await;
    let b_events = event_types(&b_http, &sid).await;
    assert_eq!(a_events, b_events);
    assert_eq!(a_events.len(), 9);
    let (_, a_hist) = a_http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    let (_, b_hist) = b_http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(a_hist, b_hist);
    // A subscriber on B resuming from any of them gets the rest.
    let cursor = a_events[2]["id"].as_str().unwrap();
    let mut resumed = crate::common::sse_stream::get(
        &b_http.base,
        &format!("/sessions/{sid}/events/stream"),
        &[("last-event-id", cursor)],
    )
    .await
    .ok();
    let rest: Vec<String> = resumed
        .take(6)
        .await
        .iter()
        .map(|f| f.id.clone().unwrap())
        .collect();
    let want: Vec<String> = a_events[3..]
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(rest, want);
    let store = Store::open_postgres(&p.url, false, LEASE, None).unwrap();
    check_log(&store, &sid).await;
    let _ = a.kill().await;
    let _ = b.kill().await;
}

//! Several instances on one PostgreSQL: requests that reach an instance while another runs the
//! session go to that one through the inbox (`src/log/postgres/inbox.rs`,
//! `src/engine/inbox.rs`): a queued message, a cancel, an interrupt, a plan decision. Two real
//! binaries on a database of a real cluster (`common/postgres.rs`).

use std::time::{Duration, Instant};

use crate::common::postgres::Pair;
use crate::common::{config_text, logcheck::check_log, Http};
use serde_json::{json, Value};
use turnstile::log::{Posted, Released, Store};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

/// `[store] lease_s` of the stores the tests open themselves.
const LEASE: Duration = Duration::from_secs(10);

/// How long a test waits for what it expects.
const WITHIN: Duration = Duration::from_secs(20);

/// Both instances of a pair, running; a session created on the first.
fn pair(fake: &FakeOpenAi, lease_s: u64) -> Pair {
    pair_with(fake, lease_s, "")
}

/// [`pair`] with `extra` TOML in the config.
fn pair_with(fake: &FakeOpenAi, lease_s: u64, extra: &str) -> Pair {
    crate::common::postgres::shared().pair(&config_text(fake, extra), lease_s)
}

async fn start_both(p: &Pair) -> (Vec<tokio::process::Child>, Http, Http, String) {
    let (a, a_http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (b, b_http) = crate::common::binary::serve_in(p.dirs[1].path()).await;
    let (status, created) = a_http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["sessionId"].as_str().unwrap().to_string();
    (vec![a, b], a_http, b_http, sid)
}

async fn events(http: &Http, sid: &str) -> Vec<Value> {
    let (status, v) = http
        .get(&format!("/sessions/{sid}/events/history?limit=1000"))
        .await;
    assert_eq!(status, 200, "{v}");
    v["events"].as_array().unwrap().clone()
}

/// Polls the session's events on `http` until `check` holds (failing after [`WITHIN`]).
async fn until_events(http: &Http, sid: &str, check: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let started = Instant::now();
    loop {
        let evs = events(http, sid).await;
        if check(&evs) {
            return evs;
        }
        assert!(started.elapsed() < WITHIN, "not within {WITHIN:?}: {evs:?}");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

fn terminals(evs: &[Value]) -> usize {
    evs.iter()
        .filter(|e| {
            matches!(
                e["type"].as_str(),
                Some("turn.completed" | "turn.failed" | "turn.cancelled")
            )
        })
        .count()
}

async fn message(http: &Http, sid: &str, text: &str) -> (u16, Value) {
    http.post(
        &format!("/sessions/{sid}/messages"),
        &json!({ "content": text }),
    )
    .await
}

/// The warnings and errors an instance logged.
fn warnings(p: &Pair, i: usize) -> String {
    std::fs::read_to_string(p.dirs[i].path().join("log.txt")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_on_b_while_a_runs_is_queued_on_a_and_runs_after_its_turn() {
    let fake = FakeOpenAi::start().await;
    let p = pair(&fake, 10);
    let (children, a_http, b_http, sid) = start_both(&p).await;
    let gate = Gate::new();
    fake.push(Reply::text("first answer").hold(gate.clone()));
    fake.push(Reply::text("second answer"));
    let (status, first) = message(&a_http, &sid, "first").await;
    assert_eq!(status, 202, "{first}");
    fake.wait_requests(1).await;
    until_events(&b_http, &sid, |e| {
        e.iter().any(|e| e["type"] == "user.message")
    })
    .await;
    let mut on_b = crate::common::sse_stream::get(
        &b_http.base,
        &format!("/sessions/{sid}/events/stream"),
        &[],
    )
    .await
    .ok();
    // B answers what a local queued message gets: 202 and its turn id.
    let (status, second) = message(&b_http, &sid, "second").await;
    assert_eq!(status, 202, "{second}");
    let second_id = second["turn_id"].as_str().expect("turn_id").to_string();
    assert!(second_id.starts_with("turn_"), "{second}");
    assert_eq!(second.as_object().unwrap().len(), 1, "{second}");
    // Queued behind A's turn: nothing of it runs while A's turn does.
    assert_eq!(fake.request_count(), 1);
    gate.open();
    let frames = on_b.until(|f| f.event == "turn.completed" && f.data.contains(&second_id));
    let frames = frames.await;
    let second_user = frames
        .iter()
        .find(|f| f.event == "user.message" && f.data.contains(&second_id))
        .expect("B's stream shows the relayed turn");
    assert!(second_user.data.contains("second"), "{}", second_user.data);

    let store = Store::open_postgres(&p.url, false, LEASE, None).unwrap();
    let log = check_log(&store, &sid).await;
    let turns: Vec<(&str, &str)> = log
        .iter()
        .map(|e| (e.turn_id.as_str(), e.body.type_name()))
        .collect();
    let first_id = first["turn_id"].as_str().unwrap();
    assert_eq!(
        turns,
        [
            (first_id, "user.message"),
            (first_id, "agent.message"),
            (first_id, "turn.completed"),
            (second_id.as_str(), "user.message"),
            (second_id.as_str(), "agent.message"),
            (second_id.as_str(), "turn.completed"),
        ]
    );
    let on_a = events(&a_http, &sid).await;
    assert_eq!(on_a[4]["content"], "second answer");
    assert_eq!(on_a, events(&b_http, &sid).await);
    for i in [0, 1] {
        let w = warnings(&p, i);
        assert!(!w.contains("dropped") && !w.contains("lost"), "{w}");
    }
    drop(children);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_on_b_when_the_session_is_idle_runs() {
    let fake = FakeOpenAi::start().await;
    let p = pair(&fake, 10);
    let (children, a_http, b_http, sid) = start_both(&p).await;
    // A ran the last turn (and handed the lease back when it ended).
    fake.push(Reply::text("from A"));
    assert_eq!(message(&a_http, &sid, "on A").await.0, 202);
    until_events(&a_http, &sid, |e| terminals(e) == 1).await;
    fake.push(Reply::text("from B"));
    let (status, v) = message(&b_http, &sid, "on B").await;
    assert_eq!(status, 202, "{v}");
    let turn_id = v["turn_id"].as_str().unwrap();
    let evs = until_events(&a_http, &sid, |e| terminals(e) == 2).await;
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "turn.completed", "{last}");
    assert_eq!(last["turn_id"], turn_id);
    assert_eq!(evs[4]["content"], "from B");
    let store = Store::open_postgres(&p.url, false, LEASE, None).unwrap();
    check_log(&store, &sid).await;
    drop(children);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_and_an_interrupt_on_b_stop_the_turn_running_on_a() {
    let fake = FakeOpenAi::start().await;
    let p = pair(&fake, 10);
    let (children, a_http, b_http, sid) = start_both(&p).await;
    let gate = Gate::new();
    for (i, path) in ["cancel", "interrupt"].iter().enumerate() {
        fake.push(Reply::text("never").hold(gate.clone()));
        let (status, v) = message(&a_http, &sid, "long").await;
        assert_eq!(status, 202, "{v}");
        let turn_id = v["turn_id"].as_str().unwrap().to_string();
        fake.wait_requests(i + 1).await;
        until_events(&b_http, &sid, |e| {
            e.last().is_some_and(|l| l["turn_id"] == turn_id.as_str())
        })
        .await;
        let body = if i == 0 {
            json!({ "turn_id": turn_id })
        } else {
            json!({})
        };
        let sent = Instant::now();
        let (status, v) = b_http.post(&format!("/sessions/{sid}/{path}"), &body).await;
        assert_eq!(status, 200, "{path}: {v}");
        assert_eq!(v["cancelled"], json!([turn_id]), "{path}");
        let evs = until_events(&a_http, &sid, |e| terminals(e) == i + 1).await;
        let last = evs.last().unwrap();
        assert_eq!(last["type"], "turn.cancelled", "{path}: {last}");
        println!(
            "{path} on B: the turn on A ended within {:?}",
            sent.elapsed()
        );
        assert_eq!(last["turn_id"], turn_id.as_str());
    }
    gate.open();
    let store = Store::open_postgres(&p.url, false, LEASE, None).unwrap();
    check_log(&store, &sid).await;
    drop(children);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_confirmed_on_b_runs_when_a_holds_nothing() {
    let fake = FakeOpenAi::start().await;
    let p = pair(&fake, 10);
    let (children, a_http, b_http, sid) = start_both(&p).await;
    fake.push(Reply::text("1. Say done."));
    let (status, v) = a_http
        .post(
            &format!("/sessions/{sid}/run"),
            &json!({"goal": "finish", "plan": true}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    // B sees the plan waiting (A's turn ended: it holds nothing).
    let started = Instant::now();
    loop {
        let (_, info) = b_http.get(&format!("/sessions/{sid}")).await;
        if info["status"] == "plan_pending_approval" {
            break;
        }
        assert!(started.elapsed() < WITHIN, "{info}");
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    fake.push(Reply::text("done"));
    let (status, v) = b_http
        .post(&format!("/sessions/{sid}/plan/confirm"), &json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["status"], "confirmed");
    let turn_id = v["turn_id"].as_str().unwrap();
    let evs = until_events(&a_http, &sid, |e| terminals(e) == 2).await;
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "turn.completed", "{last}");
    assert_eq!(last["turn_id"], turn_id);
    // Decided: a second decision is refused on either instance.
    for http in [&a_http, &b_http] {
        let (status, v) = http
            .post(&format!("/sessions/{sid}/plan/confirm"), &json!({}))
            .await;
        assert_eq!(status, 409, "{v}");
    }
    let store = Store::open_postgres(&p.url, false, LEASE, None).unwrap();
    check_log(&store, &sid).await;
    drop(children);
}

/// The ids of the turns whose `user.message` says `text`s, in log order.
fn turns_of(log: &[turnstile::log::Event]) -> Vec<(String, String)> {
    log.iter()
        .filter_map(|e| match &e.body {
            turnstile::log::EventBody::UserMessage { content, .. } => Some((
                e.turn_id.clone(),
                content.as_str().unwrap_or_default().to_string(),
            )),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_messages_alternating_between_instances_each_make_exactly_one_turn() {
    let fake = FakeOpenAi::start().await;
    let p = pair(&fake, 10);
    let (children, a_http, b_http, sid) = start_both(&p).await;
    let gate = Gate::new();
    fake.push(Reply::text("held").hold(gate.clone()));
    fake.set_fallback(Reply::text("ok").chunk_chars(1));
    let mut accepted: Vec<(String, String)> = Vec::new();
    let (status, v) = message(&a_http, &sid, "m0").await;
    assert_eq!(status, 202, "{v}");
    accepted.push((v["turn_id"].as_str().unwrap().into(), "m0".into()));
    fake.wait_requests(1).await;
    // While A's turn is held: half queue on A, half go to it from B. Then back to back with
    // the turns running.
    for round in 0..2 {
        for i in 1..=20 {
            let text = format!("m{}", round * 100 + i);
            let http = if i % 2 == 0 { &a_http } else { &b_http };
            let (status, v) = message(http, &sid, &text).await;
            // Back to back, the queue may be full ([limits] queued_turns = 32): refused, not
            // accepted.
            if round == 1 && status == 429 {
                assert_eq!(v["error"]["type"], "too_many_queued_turns", "{v}");
                continue;
            }
            assert_eq!(status, 202, "{text}: {v}");
            accepted.push((v["turn_id"].as_str().unwrap().into(), text));
        }
        gate.open();
    }
    let evs = until_events(&a_http, &sid, |e| terminals(e) == accepted.len()).await;
    assert!(evs.iter().all(|e| e["type"] != "turn.cancelled"));
    let store = Store::open_postgres(&p.url, false, LEASE, None).unwrap();
    let log = check_log(&store, &sid).await;
    let ran = turns_of(&log);
    let mut got = ran.clone();
    let mut want = accepted.clone();
    got.sort();
    want.sort();
    assert_eq!(got, want, "each accepted message made exactly one turn");
    // Each instance's messages ran in the order it accepted them.
    for parity in [0, 1] {
        let of = |v: &[(String, String)]| -> Vec<String> {
            v.iter()
                .filter(|(_, t)| {
                    let n: usize = t[1..].parse().unwrap();
                    n > 0 && n % 2 == parity
                })
                .map(|(id, _)| id.clone())
                .collect()
        };
        assert_eq!(of(&ran), of(&accepted));
    }
    // Nothing left behind in the inbox.
    assert_eq!(inbox_rows(&p), 0);
    drop(children);
}

/// The release race at the store: a post of B either finds A's lease (and A's release then
/// finds the row and keeps the lease) or finds none (and B does the request itself); never a
/// row without a holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_racing_the_holders_release_is_never_stranded() {
    let pg = crate::common::postgres::shared();
    let (_, url) = pg.store_table_and_url("");
    let a = Store::open_postgres(&url, false, LEASE, None).unwrap();
    let b = Store::open_postgres(&url, false, LEASE, None).unwrap();
    // No holder: B does it itself.
    assert_eq!(
        b.post_inbox("sess_r", "message", "{}".into(), None, 32)
            .await
            .unwrap(),
        Posted::NotHeld
    );
    let (mut queued, mut not_held) = (0, 0);
    for round in 0..60 {
        a.take_lease("sess_r").await.unwrap();
        let mark = a.lease_mark("sess_r").unwrap();
        let body = format!("{{\"round\":{round}}}");
        // The release starts after 0 to 7 round trips of A's, so that it meets the post at
        // each of its statements.
        let release = async {
            for _ in 0..round % 8 {
                a.expired_leases().await.unwrap();
            }
            a.release_lease("sess_r", mark).await
        };
        let (posted, released) =
            tokio::join!(b.post_inbox("sess_r", "message", body, None, 32), release);
        match (posted.unwrap(), released.unwrap()) {
            (Posted::Queued(_), Released::InboxWaiting) => {
                queued += 1;
                let (rows, left) = a.take_inbox("sess_r", 32, false).await.unwrap();
                assert_eq!(rows.len(), 1);
                assert!(!left);
                let mark = a.lease_mark("sess_r").unwrap();
                assert_eq!(
                    a.release_lease("sess_r", mark).await.unwrap(),
                    Released::Yes
                );
            }
            (Posted::NotHeld, Released::Yes) => not_held += 1,
            other => panic!("round {round}: {other:?} strands a row or a lease"),
        }
        assert_eq!(b.take_inbox("sess_r", 32, false).await.unwrap().0, []);
    }
    println!("of 60 races: {queued} posted before the release, {not_held} after it");
    // The quota: messages waiting are counted.
    a.take_lease("sess_q").await.unwrap();
    for _ in 0..2 {
        let posted = b.post_inbox("sess_q", "message", "{}".into(), None, 2);
        assert!(matches!(posted.await.unwrap(), Posted::Queued(_)));
    }
    let posted = b.post_inbox("sess_q", "message", "{}".into(), None, 2);
    assert_eq!(posted.await.unwrap(), Posted::Full(2));
    let posted = b.post_inbox("sess_q", "cancel", "{}".into(), None, 2);
    assert!(matches!(posted.await.unwrap(), Posted::Queued(_)));
    // Room for one message: the cancel behind the second waits with it, in order.
    let (rows, left) = a.take_inbox("sess_q", 1, false).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert!(left);
    let (rows, left) = a.take_inbox("sess_q", 5, false).await.unwrap();
    let kinds: Vec<&str> = rows.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["message", "cancel"]);
    assert!(!left);
}

fn signal(child: &tokio::process::Child, sig: &str) {
    let pid = child.id().expect("pid").to_string();
    let ok = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

/// A stalls (SIGSTOP) mid-turn with a message for it in the inbox: once its lease expires, B
/// takes the session over, ends A's turn `worker_lost` and runs the message, under the turn
/// id B answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_over_after_it_expired_runs_what_waits_in_the_inbox() {
    let fake = FakeOpenAi::start().await;
    let lease_s = 2;
    let p = pair(&fake, lease_s);
    let (mut children, a_http, b_http, sid) = start_both(&p).await;
    let gate = Gate::new();
    fake.push(Reply::text("never").hold(gate.clone()));
    assert_eq!(message(&a_http, &sid, "on A").await.0, 202);
    fake.wait_requests(1).await;
    until_events(&b_http, &sid, |e| {
        e.iter().any(|e| e["type"] == "user.message")
    })
    .await;
    signal(&children[0], "-STOP");
    let stopped = Instant::now();
    fake.push(Reply::text("B's message answered"));
    let (status, v) = message(&b_http, &sid, "left for A").await;
    assert_eq!(status, 202, "{v}");
    let turn_id = v["turn_id"].as_str().unwrap();
    let evs = until_events(&b_http, &sid, |e| terminals(e) == 2).await;
    println!(
        "the inbox ran on B {:?} after A stalled (lease_s = {lease_s})",
        stopped.elapsed()
    );
    let types: Vec<(&str, &str)> = evs
        .iter()
        .map(|e| (e["type"].as_str().unwrap(), e["turn_id"].as_str().unwrap()))
        .collect();
    assert_eq!(types[1].0, "turn.failed", "{evs:?}");
    assert_eq!(evs[1]["reason"], "worker_lost");
    assert_eq!(
        types[2..],
        [
            ("user.message", turn_id),
            ("agent.message", turn_id),
            ("turn.completed", turn_id)
        ]
    );
    signal(&children[0], "-KILL");
    let _ = children[0].wait().await;
    gate.open();
    let store = Store::open_postgres(&p.url, false, LEASE, None).unwrap();
    check_log(&store, &sid).await;
    drop(children);
}

/// Rows waiting in the inbox of the pair's database.
fn inbox_rows(p: &Pair) -> usize {
    let db = p.url.rsplit('/').next().unwrap();
    let n = crate::common::postgres::shared().psql(db, "SELECT count(*) FROM inbox");
    n.parse().unwrap()
}

async fn until_inbox(p: &Pair, n: usize) {
    let started = Instant::now();
    while inbox_rows(p) != n {
        assert!(started.elapsed() < WITHIN, "the inbox never held {n} rows");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `[limits] queued_turns = 2` holds for the session, wherever a message is sent: every turn
/// waiting is a row in the inbox until it begins (the holder's own and those it took), so the
/// sender counts them all and refuses past the limit with 429, as the holder does; the turns
/// accepted run each once, in order, and leave no row behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_turns_holds_on_the_holder_and_in_the_inbox_and_nothing_accepted_is_lost() {
    let fake = FakeOpenAi::start().await;
    let p = pair_with(&fake, 10, "[limits]\nqueued_turns = 2\n");
    let (children, a_http, b_http, sid) = start_both(&p).await;
    let gate = Gate::new();
    fake.push(Reply::text("held").hold(gate.clone()));
    fake.set_fallback(Reply::text("ok"));
    let mut accepted = Vec::new();
    let (status, v) = message(&a_http, &sid, "m0").await;
    assert_eq!(status, 202, "{v}");
    accepted.push(v["turn_id"].as_str().unwrap().to_string());
    fake.wait_requests(1).await;
    // One sent to A, one to B: both wait behind A's running turn, each a row of the inbox.
    for (i, http) in [(1, &a_http), (2, &b_http)] {
        let (status, v) = message(http, &sid, &format!("m{i}")).await;
        assert_eq!(status, 202, "m{i}: {v}");
        accepted.push(v["turn_id"].as_str().unwrap().to_string());
        until_inbox(&p, i).await;
    }
    for http in [&b_http, &a_http] {
        let (status, err) = message(http, &sid, "one too many").await;
        assert_eq!(status, 429, "{err}");
        assert_eq!(err["error"]["type"], "too_many_queued_turns");
        let text = err["error"]["message"].as_str().unwrap();
        assert!(text.contains("[limits] queued_turns"), "{text}");
    }
    gate.open();
    until_events(&a_http, &sid, |e| terminals(e) == accepted.len()).await;
    until_inbox(&p, 0).await;
    let store = Store::open_postgres(&p.url, false, LEASE, None).unwrap();
    let log = check_log(&store, &sid).await;
    let ran: Vec<String> = turns_of(&log).into_iter().map(|(id, _)| id).collect();
    assert_eq!(ran, accepted);
    drop(children);
}

//! Scale-out on PostgreSQL with two real instances (A and B, two `turnstile serve` processes on
//! one database): a turn streamed on A shows its deltas live on B's event stream, in order,
//! before the stored message and never after it (also across a `Last-Event-ID` reconnect);
//! nothing is sent for deltas while no other instance watches; a file uploaded on A downloads
//! on B, whole and by range, and a delete on B is one on A; `/status` reports the database's
//! size. Latency from A's stream to B's is printed, not asserted.

use std::time::{Duration, Instant};

use crate::common::postgres::{Pair, PgCluster};
use crate::common::{config_text, logcheck::check_log, Http};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use turnstile::log::Store;
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

/// The database's name in its connection string.
fn db_name(url: &str) -> &str {
    url.rsplit('/').next().unwrap()
}

async fn event_list(http: &Http, sid: &str) -> Vec<Value> {
    let (status, v) = http
        .get(&format!("/sessions/{sid}/events/history?limit=1000"))
        .await;
    assert_eq!(status, 200, "{v}");
    v["events"].as_array().unwrap().clone()
}

/// Reads a stream until its turn ends, each frame with when it came.
async fn frames_until_terminal(
    s: &mut crate::common::sse_stream::SseStream,
) -> Vec<(Instant, crate::common::sse_stream::Frame)> {
    let mut out = Vec::new();
    loop {
        let f = s.frame().await;
        let done = f.is_terminal();
        out.push((Instant::now(), f));
        if done {
            return out;
        }
    }
}

/// A listener of the deltas channel, counting what each kind of message carries.
async fn listen_deltas(url: &str) -> tokio::sync::mpsc::UnboundedReceiver<Value> {
    use futures_util::StreamExt;
    let (client, mut conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
    {
        let listen = client.batch_execute("LISTEN turnstile_deltas");
        let mut listen = std::pin::pin!(listen);
        loop {
            tokio::select! {
                r = &mut listen => { r.unwrap(); break }
                m = messages.next() => assert!(m.is_some()),
            }
        }
    }
    tokio::spawn(async move {
        let _client = client;
        while let Some(Ok(m)) = messages.next().await {
            if let tokio_postgres::AsyncMessage::Notification(n) = m {
                let _ = tx.send(serde_json::from_str(n.payload()).unwrap());
            }
        }
    });
    rx
}

/// What came on the channel so far.
fn drain(rx: &mut tokio::sync::mpsc::UnboundedReceiver<Value>) -> Vec<Value> {
    let mut out = Vec::new();
    while let Ok(v) = rx.try_recv() {
        out.push(v);
    }
    out
}

fn delta_payloads(msgs: &[Value]) -> usize {
    msgs.iter().filter(|m| m.get("d").is_some()).count()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn pair(pg: &PgCluster, fake: &FakeOpenAi, lease_s: u64) -> Pair {
    pg.pair(&config_text(fake, ""), lease_s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turn_on_a_shows_its_deltas_live_on_b_in_order_before_the_message() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let p = pair(&pg, &fake, 10);
    let (mut a, a_http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (mut b, b_http) = crate::common::binary::serve_in(p.dirs[1].path()).await;
    let mut channel = listen_deltas(&p.url).await;
    let (_, created) = a_http.post("/sessions", &json!({})).await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    let stream_path = format!("/sessions/{sid}/events/stream");

    // Nobody on another instance watches: A's streamed turn sends nothing for deltas, even
    // with a subscriber of its own.
    let mut on_a = crate::common::sse_stream::get(&a_http.base, &stream_path, &[])
        .await
        .ok();
    fake.push(Reply::text(&"quiet ".repeat(100)).chunk_chars(5));
    let (status, _) = a_http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "q0"}),
        )
        .await;
    assert_eq!(status, 202);
    let local = frames_until_terminal(&mut on_a).await;
    assert!(
        local.iter().any(|(_, f)| f.is_delta()),
        "A's own stream has deltas"
    );
    // One round trip on the channel (a watch noted by the listener) bounds what was sent.
    let (_, _) = a_http.get("/status").await;
    assert_eq!(
        delta_payloads(&drain(&mut channel)),
        0,
        "no delta sent unwatched"
    );

    // B follows the session; A streams a long answer in many chunks.
    let mut on_b = crate::common::sse_stream::get(&b_http.base, &stream_path, &[])
        .await
        .ok();
    let replayed = on_b.take(3).await;
    assert_eq!(replayed.last().unwrap().event, "turn.completed");
    // And B follows it as a run too (the runs API): the last run replayed, then live.
    let mut run_on_b =
        crate::common::sse_stream::get(&b_http.base, &format!("/sessions/{sid}/events"), &[])
            .await
            .ok();
    let last_run = run_on_b.until(|f| f.event == "done").await;
    assert_eq!(last_run.len(), 2, "the last run: its message, then done");
    let text: String = (0..10_000).map(|i| format!("w{i} ")).collect();
    fake.push(
        Reply::text(&text)
            .chunk_chars(40)
            .pace(Duration::from_millis(1)),
    );
    // An AAP turn in `delta` mode: its own response streams the text too.
    let mut turn = crate::common::sse_stream::open(
        &a_http.base,
        "POST",
        &format!("/sessions/{sid}/turns"),
        &[],
        Some(&json!({"messages": [{"role": "user", "content": "q1"}], "stream": "delta"})),
    )
    .await
    .ok();
    let (a_frames, b_frames, aap, run) = tokio::join!(
        frames_until_terminal(&mut on_a),
        frames_until_terminal(&mut on_b),
        turn.until(|f| f.event == "turn_stop"),
        run_on_b.until(|f| f.event == "done")
    );
    // The run stream on B: the partial messages make the text, then the message, then done.
    let names: Vec<&str> = run.iter().map(|f| f.event.as_str()).collect();
    let n = names.len();
    assert!(n > 3, "{names:?}");
    assert!(
        names[..n - 2].iter().all(|e| *e == "partial_message"),
        "{names:?}"
    );
    assert_eq!(names[n - 2..], ["message", "done"]);
    let partial: String = run[..n - 2]
        .iter()
        .map(|f| f.json()["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(partial, text);
    let aap_text: String = aap
        .iter()
        .filter(|f| f.event == "text_delta")
        .map(|f| f.json()["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(aap_text, text);
    // B: the user message, every delta in order, then the message, then the end; each stored
    // event once, none after the message.
    let kinds: Vec<&str> = b_frames.iter().map(|(_, f)| f.event.as_str()).collect();
    let first_delta = kinds.iter().position(|k| k.ends_with(".delta")).unwrap();
    let message = kinds.iter().position(|k| *k == "agent.message").unwrap();
    assert_eq!(kinds[..first_delta], ["user.message"]);
    assert!(kinds[first_delta..message]
        .iter()
        .all(|k| *k == "agent.message.delta"));
    assert_eq!(kinds[message..], ["agent.message", "turn.completed"]);
    let b_deltas: Vec<String> = b_frames
        .iter()
        .filter(|(_, f)| f.is_delta())
        .map(|(_, f)| f.json()["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(b_deltas.concat(), text, "every delta, in order");
    assert_eq!(b_frames[message].1.json()["content"], text.as_str());
    // The same deltas as A's own subscriber got.
    let a_deltas: Vec<(Instant, String)> = a_frames
        .iter()
        .filter(|(_, f)| f.is_delta())
        .map(|(t, f)| (*t, f.json()["content"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        a_deltas.iter().map(|(_, d)| d.clone()).collect::<Vec<_>>(),
        b_deltas
    );
    assert!(delta_payloads(&drain(&mut channel)) > 0);
    // Added latency A → B per delta (reported, not asserted).
    let b_times: Vec<Instant> = b_frames
        .iter()
        .filter(|(_, f)| f.is_delta())
        .map(|(t, _)| *t)
        .collect();
    let mut lat: Vec<Duration> = a_deltas
        .iter()
        .zip(&b_times)
        .map(|((ta, _), tb)| tb.saturating_duration_since(*ta))
        .collect();
    lat.sort();
    println!(
        "delta latency A->B over {} deltas: p50 {:?}, p99 {:?}, max {:?}",
        lat.len(),
        percentile(&lat, 0.5),
        percentile(&lat, 0.99),
        lat.last().unwrap()
    );
    // History identical on both, and the log holds every invariant.
    assert_eq!(
        event_list(&a_http, &sid).await,
        event_list(&b_http, &sid).await
    );
    let (_, a_hist) = a_http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    let (_, b_hist) = b_http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(a_hist, b_hist);
    let store = Store::open_postgres(&p.url, false, Duration::from_secs(10), None).unwrap();
    check_log(&store, &sid).await;
    let _ = a.kill().await;
    let _ = b.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_on_b_reconnecting_mid_turn_gets_each_stored_event_once_and_deltas_in_place() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let p = pair(&pg, &fake, 10);
    let (mut b, b_http) = crate::common::binary::serve_in(p.dirs[1].path()).await;
    let (_, created) = b_http.post("/sessions", &json!({})).await;
    let sid = created["sessionId"].as_str().unwrap().to_string();
    let stream_path = format!("/sessions/{sid}/events/stream");
    let mut first = crate::common::sse_stream::get(&b_http.base, &stream_path, &[])
        .await
        .ok();
    // A starts after B began watching: it learns of the watch from the database.
    let (mut a, a_http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    // The answer streams half, waits for the gate, then streams the rest.
    let gate = Gate::new();
    let text: String = (0..400).map(|i| format!("t{i} ")).collect();
    fake.push(
        Reply::text(&text)
            .chunk_chars(10)
            .pace(Duration::from_millis(1))
            .hold_after(100, gate.clone()),
    );
    let (status, _) = a_http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "go"}),
        )
        .await;
    assert_eq!(status, 202);
    let user = first.frame().await;
    assert_eq!(user.event, "user.message");
    let mut before = String::new();
    while before.len() < 500 {
        let f = first.frame().await;
        assert_eq!(f.event, "agent.message.delta", "deltas only while held");
        before.push_str(f.json()["content"].as_str().unwrap());
    }
    assert!(text.starts_with(&before));
    // The subscriber goes and comes back with the last stored event it had.
    drop(first);
    let cursor = user.id.clone().unwrap();
    let mut again =
        crate::common::sse_stream::get(&b_http.base, &stream_path, &[("last-event-id", &cursor)])
            .await
            .ok();
    gate.open();
    let rest = frames_until_terminal(&mut again).await;
    let kinds: Vec<&str> = rest.iter().map(|(_, f)| f.event.as_str()).collect();
    let message = kinds.iter().position(|k| *k == "agent.message").unwrap();
    assert_eq!(
        kinds[message..],
        ["agent.message", "turn.completed"],
        "{kinds:?}"
    );
    assert!(
        kinds[..message].iter().all(|k| *k == "agent.message.delta"),
        "{kinds:?}"
    );
    assert!(
        message > 0,
        "deltas of the second half reach the new subscriber"
    );
    let after: String = rest[..message]
        .iter()
        .map(|(_, f)| f.json()["content"].as_str().unwrap().to_string())
        .collect();
    assert!(
        text.ends_with(&after),
        "in order, up to the end of the text"
    );
    assert_eq!(rest[message].1.json()["content"], text.as_str());
    // Each stored event once across both connections: exactly the log.
    let mut ids = vec![cursor];
    ids.extend(rest.iter().filter_map(|(_, f)| f.id.clone()));
    let log: Vec<String> = event_list(&a_http, &sid)
        .await
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(ids, log);
    assert_eq!(
        event_list(&a_http, &sid).await,
        event_list(&b_http, &sid).await
    );
    let _ = a.kill().await;
    let _ = b.kill().await;
}

async fn upload(http: &Http, name: &str, body: Vec<u8>) -> Value {
    let resp = http
        .request_raw("POST", &format!("/files?filename={name}"), Some(body))
        .await;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(status, 201, "{v}");
    v
}

/// `GET /files/{id}/content` with an optional `Range`: status, `Content-Range`, body.
async fn download(http: &Http, id: &str, range: Option<&str>) -> (u16, Option<String>, Vec<u8>) {
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut req = hyper::Request::builder().uri(format!("{}/files/{id}/content", http.base));
    if let Some(r) = range {
        req = req.header("range", r);
    }
    let req = req
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let resp = client.request(req).await.expect("request");
    let status = resp.status().as_u16();
    let content_range = resp
        .headers()
        .get("content-range")
        .map(|v| v.to_str().unwrap().to_string());
    let body = resp
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (status, content_range, body)
}

fn sha256_hex(b: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, b)
        .as_ref()
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

async fn db_bytes(http: &Http) -> u64 {
    let (status, v) = http.get("/status").await;
    assert_eq!(status, 200, "{v}");
    v["store"]["db_bytes"].as_u64().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_uploaded_on_a_downloads_on_b_whole_and_by_range_and_a_delete_on_b_is_one_on_a() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let p = pair(&pg, &fake, 10);
    let (mut a, a_http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (mut b, b_http) = crate::common::binary::serve_in(p.dirs[1].path()).await;
    let db = db_name(&p.url);
    let empty = db_bytes(&a_http).await;
    assert!(empty > 0, "the tables take room");

    // 2.5 MiB: three chunks of the store; bytes that do not compress.
    let mut body = Vec::with_capacity(5 << 19);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    while body.len() < 5 << 19 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        body.extend_from_slice(&x.to_le_bytes());
    }
    let file = upload(&a_http, "data.bin", body.clone()).await;
    let id = file["id"].as_str().unwrap();
    assert_eq!(file["size_bytes"], body.len());
    assert_eq!(pg.psql(db, "SELECT count(*) FROM file_chunks"), "3");
    let grown = db_bytes(&b_http).await;
    assert!(grown >= empty + body.len() as u64, "{empty} -> {grown}");
    // The same bytes again (on B) are one blob.
    let twin = upload(&b_http, "twin.bin", body.clone()).await;
    assert_eq!(
        pg.psql(db, "SELECT count(DISTINCT sha256) FROM file_chunks"),
        "1"
    );
    // Nothing of it on either instance's disk.
    for d in &p.dirs {
        let files = d.path().join("data/files");
        let on_disk = std::fs::read_dir(&files)
            .map(|r| {
                r.filter_map(|e| e.ok())
                    .filter(|e| e.path().is_file())
                    .count()
            })
            .unwrap_or(0);
        assert_eq!(on_disk, 0, "{}", files.display());
    }

    let (status, _, whole) = download(&b_http, id, None).await;
    assert_eq!(status, 200);
    assert_eq!(whole.len(), body.len());
    assert_eq!(sha256_hex(&whole), sha256_hex(&body));
    // Ranges across a chunk's end, inside one, and a suffix.
    let mib = 1usize << 20;
    for (range, lo, hi) in [
        (format!("bytes={}-{}", mib - 10, mib + 9), mib - 10, mib + 9),
        ("bytes=5-9".to_string(), 5, 9),
        ("bytes=-100".to_string(), body.len() - 100, body.len() - 1),
        (
            format!("bytes={}-", 2 * mib + 1),
            2 * mib + 1,
            body.len() - 1,
        ),
    ] {
        let (status, content_range, part) = download(&b_http, id, Some(&range)).await;
        assert_eq!(status, 206, "{range}");
        assert_eq!(
            content_range.as_deref(),
            Some(format!("bytes {lo}-{hi}/{}", body.len()).as_str())
        );
        assert_eq!(part, body[lo..=hi], "{range}");
    }

    // Deleted on B: gone on A; the bytes stay while the twin names them, then go.
    let (status, _) = b_http.delete(&format!("/files/{id}")).await;
    assert_eq!(status, 204);
    let (status, _, _) = download(&a_http, id, None).await;
    assert_eq!(status, 404);
    let (status, _) = a_http.get(&format!("/files/{id}")).await;
    assert_eq!(status, 404);
    let twin_id = twin["id"].as_str().unwrap();
    let (_, _, again) = download(&a_http, twin_id, None).await;
    assert_eq!(sha256_hex(&again), sha256_hex(&body));
    let (status, _) = a_http.delete(&format!("/files/{twin_id}")).await;
    assert_eq!(status, 204);
    assert_eq!(pg.psql(db, "SELECT count(*) FROM file_chunks"), "0");
    let _ = a.kill().await;
    let _ = b.kill().await;
}

/// A process's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    kb * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_file_goes_into_the_database_and_out_on_the_other_instance_in_bounded_memory() {
    let pg = PgCluster::start();
    let fake = FakeOpenAi::start().await;
    let p = pair(&pg, &fake, 10);
    let (mut a, a_http) = crate::common::binary::serve_in(p.dirs[0].path()).await;
    let (mut b, b_http) = crate::common::binary::serve_in(p.dirs[1].path()).await;
    let (a_pid, b_pid) = (a.id().unwrap(), b.id().unwrap());
    // Warm both up (a download of a small file) so that the peaks compare like with like.
    let small = upload(&a_http, "small.bin", vec![7u8; 1000]).await;
    let (status, _, _) = download(&b_http, small["id"].as_str().unwrap(), None).await;
    assert_eq!(status, 200);
    let (a_before, b_before) = (peak_rss(a_pid), peak_rss(b_pid));

    let size = 64usize << 20;
    let body: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
    let file = upload(&a_http, "big.bin", body.clone()).await;
    let id = file["id"].as_str().unwrap();
    // Downloaded on B as it streams (hashed on the way, not kept).
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;
    let client = Client::builder(TokioExecutor::new()).build_http();
    let req = hyper::Request::builder()
        .uri(format!("{}/files/{id}/content", b_http.base))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let mut resp = client.request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut hash = ring::digest::Context::new(&ring::digest::SHA256);
    let mut got = 0usize;
    while let Some(frame) = resp.body_mut().frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            got += data.len();
            hash.update(&data);
        }
    }
    assert_eq!(got, size);
    let want = ring::digest::digest(&ring::digest::SHA256, &body);
    assert_eq!(hash.finish().as_ref(), want.as_ref());
    let (a_grew, b_grew) = (
        peak_rss(a_pid).saturating_sub(a_before),
        peak_rss(b_pid).saturating_sub(b_before),
    );
    println!(
        "64 MiB through the database: peak RSS grew {} MiB on A (upload), {} MiB on B (download)",
        a_grew >> 20,
        b_grew >> 20
    );
    assert!(a_grew < (size as u64) / 2, "A's peak grew {a_grew} bytes");
    assert!(b_grew < (size as u64) / 2, "B's peak grew {b_grew} bytes");
    let _ = a.kill().await;
    let _ = b.kill().await;
}

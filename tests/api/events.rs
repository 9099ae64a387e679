//! The event log API (spec 003) against the fake upstream: queued messages, history paging,
//! byte-identical history and stream, resuming from every cursor, live follow while events are
//! written, delta coalescing (200 characters / 50 ms), retraction, cancel, timeout, failure
//! reasons and the SSE headers. Streams are read frame by frame as they arrive; nothing waits
//! on a timer to synchronise.

use std::collections::HashSet;
use std::time::Duration;

use crate::common::mcp::example_server;
use crate::common::sse_stream::{raw_array_elements, Frame, SseStream};
use crate::common::{config_text, logcheck::check_log, setup, TestServer};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

const AGENT: &str = r#"
[agents.assistant]
system_prompt = "You are terse."
"#;

const POLICY: &str = r#"
[policy]
trust = ["mcp__ex__add", "mcp__ex__slow"]
default = "ask"
"#;

/// With the example MCP server as `ex` (`add` and `slow` trusted).
async fn with_example_server() -> (FakeOpenAi, TestServer) {
    let extra = format!("{AGENT}\n{}\n{POLICY}", example_server("ex", ""));
    setup(&extra).await
}

/// `POST /sessions/{id}/messages` with this text: the new turn's id.
async fn send(server: &TestServer, sid: &str, text: &str) -> String {
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({ "content": text }),
        )
        .await;
    assert_eq!(status, 202, "POST messages: {v}");
    let turn_id = v["turn_id"].as_str().expect("turn_id").to_string();
    assert!(turn_id.starts_with("turn_"), "{turn_id}");
    turn_id
}

/// The AAP turn request that sends `text`, not streamed: its response.
async fn aap_turn(server: &TestServer, sid: &str, text: &str) -> Value {
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": text}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    resp
}

/// `GET /sessions/{id}/events/history{query}`: the status, the body as text, and parsed.
async fn history_raw(server: &TestServer, sid: &str, query: &str) -> (u16, String, Value) {
    let resp = server
        .http
        .request_raw(
            "GET",
            &format!("/sessions/{sid}/events/history{query}"),
            None,
        )
        .await;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let text = String::from_utf8(bytes.to_vec()).expect("utf-8");
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
    (status, text, v)
}

/// The whole event history (one page of up to 1000).
async fn history(server: &TestServer, sid: &str) -> Vec<Value> {
    let (status, _, v) = history_raw(server, sid, "?limit=1000").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["has_more"], false);
    v["events"].as_array().unwrap().clone()
}

/// The whole event history, page by page.
async fn history_all(server: &TestServer, sid: &str) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    loop {
        let q = match out.last() {
            Some(e) => format!("?limit=1000&after={}", e["id"].as_str().unwrap()),
            None => "?limit=1000".to_string(),
        };
        let (status, _, page) = history_raw(server, sid, &q).await;
        assert_eq!(status, 200, "{page}");
        out.extend(page["events"].as_array().unwrap().iter().cloned());
        if page["has_more"] == false {
            return out;
        }
    }
}

fn ids(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["id"].as_str().unwrap().to_string())
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// `GET /sessions/{id}/events/stream{query}` with these headers, asserted 200 SSE.
async fn stream(
    server: &TestServer,
    sid: &str,
    query: &str,
    headers: &[(&str, &str)],
) -> SseStream {
    crate::common::sse_stream::get(
        &server.http.base,
        &format!("/sessions/{sid}/events/stream{query}"),
        headers,
    )
    .await
    .ok()
}

/// The content of the last user message the model was sent.
fn last_user(req: &Value) -> String {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .unwrap_or_default()
}

/// Frames up to and including the terminal event of `turn_id`.
async fn until_terminal(s: &mut SseStream, turn_id: &str) -> Vec<Frame> {
    s.until(|f| f.is_terminal() && f.json()["turn_id"] == turn_id)
        .await
}

/// The stored events among frames (they have an id), checked against their `data`.
fn stored(frames: &[Frame]) -> Vec<Value> {
    frames
        .iter()
        .filter(|f| !f.is_delta())
        .map(|f| {
            let v = f.json();
            assert_eq!(
                f.id.as_deref(),
                v["id"].as_str(),
                "id: line = the event's id"
            );
            assert_eq!(f.event, v["type"], "event: line = the event's type");
            v
        })
        .collect()
}

/// Check a delta frame's shape; its text.
fn delta_text(f: &Frame, turn_id: &str, kind: &str) -> String {
    assert_eq!(f.event, kind);
    assert_eq!(f.id, None, "a delta has no id: line: {f:?}");
    let v = f.json();
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(
        sorted,
        vec!["content", "turn_id", "type"],
        "delta fields: {v}"
    );
    assert_eq!(v["type"], kind);
    assert_eq!(v["turn_id"], turn_id);
    v["content"].as_str().unwrap().to_string()
}

/// Deltas are provisional text of the segment the next `agent.message` completes: the deltas
/// since the previous stored event are (the end of) the next stored event's content, so it
/// must be an `agent.message` that ends with them. A subscriber that joins mid-segment sees only
/// its end; a delta of a segment whose `agent.message` was already sent is stale.
fn check_delta_order(frames: &[Frame], what: &str) {
    let mut pending = String::new();
    for (i, f) in frames.iter().enumerate() {
        if f.event == "agent.message.delta" {
            pending.push_str(f.json()["content"].as_str().unwrap());
            continue;
        }
        if f.is_delta() {
            continue;
        }
        if !pending.is_empty() {
            let v = f.json();
            assert!(
                f.event == "agent.message" && v["content"].as_str().unwrap().ends_with(&pending),
                "{what}: frame {i}: deltas {pending:?} are not the end of the next stored event {}",
                f.data
            );
        }
        pending.clear();
    }
}

/// The message deltas of one turn, each as its text.
fn message_deltas(frames: &[Frame], turn_id: &str) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f.event == "agent.message.delta" && f.json()["turn_id"] == turn_id)
        .map(|f| delta_text(f, turn_id, "agent.message.delta"))
        .collect()
}

/// Held by the tests that are heavy or sensitive to the 50 ms delta timer, so that they do not
/// run at the same time as each other.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A streamed reply of `text` in one-character `content` deltas, all sent in one write: the
/// server reads them in one go, so the 50 ms timer cannot cut them however slow the machine.
fn one_char_chunks_in_one_write(text: &str) -> Reply {
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "fake-model",
                   "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let mut body = chunk(json!({"role": "assistant", "content": ""}), Value::Null);
    for ch in text.chars() {
        body.push_str(&chunk(json!({ "content": ch.to_string() }), Value::Null));
    }
    body.push_str(&chunk(json!({}), json!("stop")));
    body.push_str("data: {\"id\":\"chatcmpl-1\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5,\"total_tokens\":15}}\n\n");
    body.push_str("data: [DONE]\n\n");
    Reply::raw(&body).chunk_chars(body.len())
}

#[tokio::test]
async fn messages_queue_fifo_and_run_one_at_a_time() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let gate = Gate::new();
    fake.push(Reply::text("first answer").hold(gate.clone()));
    fake.push(Reply::text("second answer"));
    fake.push(Reply::text("third answer"));
    let t1 = send(&server, &sid, "one").await;
    let t2 = send(&server, &sid, "two").await;
    let t3 = send(&server, &sid, "three").await;
    assert_eq!(
        [&t1, &t2, &t3].iter().collect::<HashSet<_>>().len(),
        3,
        "distinct turn ids"
    );

    let reqs = fake.wait_requests(1).await;
    assert_eq!(last_user(&reqs[0]), "one");
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "running", "{info}");
    assert_eq!(info["turn_id"], t1.as_str());
    assert_eq!(info["queued"], json!([t2, t3]), "{info}");
    // A queued turn is not in the log until it starts: only the running turn's events so far.
    // (What a turn said is durable within 1 ms of being said; a subscriber sees it once it is.)
    stream(&server, &sid, "", &[])
        .await
        .until(|f| f.event == "user.message")
        .await;
    let log = history(&server, &sid).await;
    assert_eq!(types(&log), vec!["user.message"]);
    assert_eq!(log[0]["turn_id"], t1.as_str());
    assert_eq!(log[0]["content"], "one");
    assert_eq!(fake.requests().len(), 1, "one turn at a time");

    gate.open();
    server.wait_idle(&sid).await;
    let reqs = fake.requests();
    let users: Vec<String> = reqs.iter().map(last_user).collect();
    assert_eq!(users, vec!["one", "two", "three"], "FIFO");
    // The second turn was sent to the model after the first had completed.
    assert_eq!(
        reqs[1]["messages"],
        json!([
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "two"}
        ])
    );
    let log = history(&server, &sid).await;
    let turn_of: Vec<&str> = log.iter().map(|e| e["turn_id"].as_str().unwrap()).collect();
    let mut expected = Vec::new();
    for t in [&t1, &t2, &t3] {
        expected.extend([t.as_str(); 3]);
    }
    assert_eq!(turn_of, expected, "turns never interleave");
    assert_eq!(
        types(&log),
        [["user.message", "agent.message", "turn.completed"]; 3].concat()
    );
    assert_eq!(log[4]["content"], "second answer");
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "idle");
    assert!(info.get("queued").is_none(), "{info}");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn history_pages_and_each_event_is_byte_identical_in_the_stream() {
    let (fake, server) = setup(AGENT).await;
    let sid = server
        .session(json!({"agent": {"name": "assistant", "options": {"thinking": "on"}}}))
        .await;
    // Text that JSON must escape, and non-ASCII.
    let tricky = "quote \" backslash \\ newline \n tab \t é 世界 😀 </script> \u{1}";
    fake.push(Reply::text(tricky).thinking("think one"));
    fake.push(Reply::text("second").thinking("think two"));
    fake.push(Reply::text("third").thinking("think three"));
    send(&server, &sid, tricky).await;
    send(&server, &sid, "again").await;
    let last = send(&server, &sid, "once more").await;
    server.wait_idle(&sid).await;

    let (status, raw, all) = history_raw(&server, &sid, "").await;
    assert_eq!(status, 200);
    assert_eq!(all["has_more"], false);
    let events = all["events"].as_array().unwrap().clone();
    assert_eq!(
        types(&events),
        [[
            "user.message",
            "agent.thinking",
            "agent.message",
            "turn.completed"
        ]; 3]
            .concat()
    );
    assert_eq!(events[2]["content"], tricky);
    assert_eq!(events[11]["turn_id"], last.as_str());
    let all_ids = ids(&events);
    let n = events.len();

    // Paging with every page size: the pages concatenate to the whole log, `has_more` is true
    // on every page but the last, and there is no empty trailing page.
    for limit in 1..=n + 1 {
        let mut got = Vec::new();
        let mut after = String::new();
        let mut pages = 0;
        loop {
            let q = if after.is_empty() {
                format!("?limit={limit}")
            } else {
                format!("?after={after}&limit={limit}")
            };
            let (status, _, page) = history_raw(&server, &sid, &q).await;
            assert_eq!(status, 200, "{q}: {page}");
            pages += 1;
            let evs = page["events"].as_array().unwrap();
            assert!(evs.len() <= limit, "{q}: {} events", evs.len());
            got.extend(ids(evs));
            if page["has_more"] == false {
                break;
            }
            assert_eq!(evs.len(), limit, "{q}: a page with more after it is full");
            after = got.last().unwrap().clone();
        }
        assert_eq!(got, all_ids, "limit {limit}");
        assert_eq!(pages, n.div_ceil(limit).max(1), "limit {limit}: pages");
    }
    // After the last event: nothing, and nothing more.
    let (_, _, tail) = history_raw(&server, &sid, &format!("?after={}", all_ids[n - 1])).await;
    assert_eq!(tail, json!({"events": [], "has_more": false}));
    let (_, _, mid) = history_raw(&server, &sid, &format!("?after={}&limit=2", all_ids[3])).await;
    assert_eq!(ids(mid["events"].as_array().unwrap()), all_ids[4..6]);
    assert_eq!(mid["has_more"], true);
    // Bad parameters are clear 400s.
    for q in [
        "?limit=0",
        "?limit=1001",
        "?limit=ten",
        "?after=evt_not_in_this_log",
    ] {
        let (status, _, err) = history_raw(&server, &sid, q).await;
        assert_eq!(status, 400, "{q}: {err}");
        assert_eq!(err["error"]["type"], "invalid_request", "{q}: {err}");
    }

    // The stream replays the same events with the same bytes.
    let raws = raw_array_elements(&raw, "events");
    assert_eq!(raws.len(), n);
    for (r, e) in raws.iter().zip(&events) {
        assert_eq!(&serde_json::from_str::<Value>(r).unwrap(), e);
    }
    let mut s = stream(&server, &sid, "", &[]).await;
    let frames = s.take(n).await;
    for (i, f) in frames.iter().enumerate() {
        assert_eq!(f.id.as_deref(), Some(all_ids[i].as_str()), "frame {i}");
        assert_eq!(f.event, events[i]["type"], "frame {i}");
        assert_eq!(
            f.data, raws[i],
            "frame {i}: the same bytes as in the history"
        );
        assert!(raw.contains(&f.data));
    }
    assert!(
        !types(&events).iter().any(|t| t.ends_with(".delta")),
        "deltas are never stored"
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn the_stream_resumes_after_every_cursor_and_rejects_unknown_cursors() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    fake.push(Reply::text("a"));
    fake.push(Reply::text("b"));
    fake.push(Reply::text("c"));
    for m in ["one", "two", "three"] {
        send(&server, &sid, m).await;
    }
    server.wait_idle(&sid).await;
    let events = history(&server, &sid).await;
    let all = ids(&events);
    let n = all.len();
    assert_eq!(n, 9);

    // Every cursor, as Last-Event-ID and as ?after=: exactly the events after it, in order.
    let mut open = Vec::new();
    for (i, cursor) in all.iter().enumerate() {
        for by_header in [true, false] {
            let mut s = if by_header {
                stream(&server, &sid, "", &[("last-event-id", cursor)]).await
            } else {
                stream(&server, &sid, &format!("?after={cursor}"), &[]).await
            };
            let frames = s.take(n - 1 - i).await;
            let got: Vec<String> = stored(&frames)
                .iter()
                .map(|e| e["id"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(got, all[i + 1..], "after {cursor} (header: {by_header})");
            open.push((format!("after {cursor} (header: {by_header})"), s));
        }
    }
    let mut s = stream(&server, &sid, "", &[]).await;
    assert_eq!(
        stored(&s.take(n).await)
            .iter()
            .map(|e| e["id"].as_str().unwrap().to_string())
            .collect::<Vec<_>>(),
        all
    );
    open.push(("no cursor".into(), s));

    // Nothing more was replayed: the next frame of every stream is the next turn's first event.
    fake.push(Reply::text("d"));
    let t4 = send(&server, &sid, "four").await;
    for (what, s) in &mut open {
        let f = s.frame().await;
        let v = f.json();
        assert_eq!(
            (f.event.as_str(), v["turn_id"].as_str()),
            ("user.message", Some(t4.as_str())),
            "{what}: a duplicate or extra event: {f:?}"
        );
        assert!(!all.contains(&v["id"].as_str().unwrap().to_string()));
    }
    server.wait_idle(&sid).await;

    // A cursor that is not in this session's log is a clear 400, never a restart.
    let other = server.session(json!({})).await;
    fake.push(Reply::text("x"));
    send(&server, &other, "elsewhere").await;
    server.wait_idle(&other).await;
    let foreign = ids(&history(&server, &other).await)[0].clone();
    for (query, header) in [
        (String::new(), Some("evt_00000000000000000000000000")),
        ("?after=evt_nope".to_string(), None),
        (String::new(), Some(foreign.as_str())),
        (format!("?after={foreign}"), None),
    ] {
        let headers: Vec<(&str, &str)> = header.map(|h| ("last-event-id", h)).into_iter().collect();
        let s = crate::common::sse_stream::get(
            &server.http.base,
            &format!("/sessions/{sid}/events/stream{query}"),
            &headers,
        )
        .await;
        assert_eq!(s.status, 400, "cursor {query} {header:?}");
        let body: Value = serde_json::from_str(&s.text().await).unwrap();
        assert_eq!(body["error"]["type"], "invalid_request", "{body}");
        let msg = body["error"]["message"].as_str().unwrap();
        let cursor = header
            .map(String::from)
            .unwrap_or_else(|| query["?after=".len()..].to_string());
        assert!(msg.contains(&cursor), "the message names the cursor: {msg}");
    }
    check_log(server.engine().store(), &sid).await;
    check_log(server.engine().store(), &other).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn subscribers_joining_while_events_are_written_miss_nothing_and_repeat_nothing() {
    let _serial = SERIAL.lock().await;
    let (fake, server) = setup(&format!(
        "{AGENT}\n[limits]\nsubscribers_per_session = 1000\n"
    ))
    .await; // up to 240 streams of one session at once
    let sid = server.session(json!({})).await;
    // Turns that write stored events in bursts: each step calls eight tools that do not exist,
    // so eight agent.tool_use and eight agent.tool_result events are logged at once; text
    // streams (paced) in between.
    const TURNS: usize = 4;
    const STEPS: usize = 3;
    for i in 0..TURNS {
        for step in 0..STEPS {
            let calls: Vec<(String, &str, Value)> = (0..8)
                .map(|j| {
                    (
                        format!("call_{i}_{step}_{j}"),
                        "no_such_tool",
                        json!({"j": j}),
                    )
                })
                .collect();
            let calls: Vec<(&str, &str, Value)> = calls
                .iter()
                .map(|(id, name, input)| (id.as_str(), *name, input.clone()))
                .collect();
            fake.push(
                Reply::tool_calls(&calls)
                    .with_text(&format!("Turn {i}, step {step}: trying tools. "))
                    .chunk_chars(3)
                    .pace(Duration::from_millis(1)),
            );
        }
        fake.push(
            Reply::text(&format!(
                "Answer {i}: {}",
                "lorem ipsum dolor sit amet ".repeat(4)
            ))
            .chunk_chars(3)
            .pace(Duration::from_millis(1)),
        );
    }
    // One subscriber from before the first event, for the deltas.
    let mut first = stream(&server, &sid, "", &[]).await;
    let mut turn_ids = Vec::new();
    for i in 0..TURNS {
        turn_ids.push(send(&server, &sid, &format!("message {i}")).await);
    }
    // While the turns run, keep subscribing, from four tasks at once: after the latest event
    // the history shows (which moves on while the subscription is made), and from the start.
    let mut loops = Vec::new();
    for task in 0..4 {
        let base = server.http.base.clone();
        let http = server.http.clone();
        let sid = sid.clone();
        loops.push(tokio::spawn(async move {
            let mut subs: Vec<(Option<String>, SseStream)> = Vec::new();
            let path = format!("/sessions/{sid}/events/stream");
            for k in task.. {
                if subs.len() >= 60 {
                    break;
                }
                let (_, info) = http.get(&format!("/sessions/{sid}")).await;
                if info["status"] == "idle" {
                    break;
                }
                let (_, page) = http
                    .get(&format!("/sessions/{sid}/events/history?limit=1000"))
                    .await;
                let cursor = page["events"]
                    .as_array()
                    .unwrap()
                    .last()
                    .map(|e| e["id"].as_str().unwrap().to_string());
                let s = match (&cursor, k % 3) {
                    (Some(c), 0) => {
                        crate::common::sse_stream::get(&base, &path, &[("last-event-id", c)]).await
                    }
                    (Some(c), 1) => {
                        crate::common::sse_stream::get(&base, &format!("{path}?after={c}"), &[])
                            .await
                    }
                    _ => crate::common::sse_stream::get(&base, &path, &[]).await,
                };
                subs.push((if k % 3 == 2 { None } else { cursor }, s.ok()));
            }
            subs
        }));
    }
    let mut subs = Vec::new();
    for l in loops {
        subs.extend(l.await.unwrap());
    }
    assert!(
        subs.len() > 4,
        "subscribed while the turns ran ({} times)",
        subs.len()
    );
    server.wait_idle(&sid).await;
    let log = history(&server, &sid).await;
    assert_eq!(log.len(), TURNS * (1 + STEPS * (1 + 16) + 2));
    let all = ids(&log);
    let last_turn = turn_ids.last().unwrap().clone();

    for (cursor, s) in &mut subs {
        let from = match cursor {
            Some(c) => all.iter().position(|i| i == c).unwrap() + 1,
            None => 0,
        };
        if from == all.len() {
            continue; // subscribed after the very end: nothing to replay or follow
        }
        let frames = until_terminal(s, &last_turn).await;
        let got: Vec<String> = ids(&stored(&frames));
        assert_eq!(
            got,
            all[from..],
            "subscribed after {cursor:?}: replay + live = history"
        );
        check_delta_order(&frames, &format!("subscribed after {cursor:?}"));
    }
    // The first subscriber saw every turn whole: its deltas concatenate to the turn's messages.
    let frames = until_terminal(&mut first, &last_turn).await;
    assert_eq!(ids(&stored(&frames)), all);
    check_delta_order(&frames, "subscribed before the first turn");
    for t in &turn_ids {
        let said: String = log
            .iter()
            .filter(|e| e["turn_id"] == t.as_str() && e["type"] == "agent.message")
            .map(|e| e["content"].as_str().unwrap())
            .collect();
        assert_eq!(message_deltas(&frames, t).concat(), said);
    }
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_falls_far_behind_still_gets_every_event() {
    let _serial = SERIAL.lock().await;
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    // A subscriber that reads nothing while the turn logs more events (5,400, about 8 MB) than
    // the live feed (4,096 items) and the connection's buffers hold.
    let mut slow = crate::common::sse_stream::get_small_buffer(
        &server.http.base,
        &format!("/sessions/{sid}/events/stream"),
        4096,
    )
    .await
    .ok();
    let pad = "x".repeat(3000);
    for step in 0..3 {
        let calls: Vec<(String, Value)> = (0..900)
            .map(|i| (format!("call_{step}_{i:03}"), json!({"i": i, "pad": pad})))
            .collect();
        let calls: Vec<(&str, &str, Value)> = calls
            .iter()
            .map(|(id, input)| (id.as_str(), "no_such_tool", input.clone()))
            .collect();
        fake.push(Reply::tool_calls(&calls).chunk_chars(4096));
    }
    fake.push(Reply::text("Those tools do not exist."));
    let t = send(&server, &sid, "call them all").await;
    server.wait_idle(&sid).await;
    let log = history_all(&server, &sid).await;
    assert_eq!(log.len(), 2 + 3 * 2 * 900 + 1, "{:?}", log.last());
    let frames = until_terminal(&mut slow, &t).await;
    assert_eq!(
        ids(&stored(&frames)),
        ids(&log),
        "every event, once, in order"
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn deltas_are_cut_at_200_unicode_characters_and_never_stored() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let mut s = stream(&server, &sid, "", &[]).await;
    let mixed: String = "é世😀a".chars().cycle().take(201).collect();
    let cases: Vec<(String, Vec<usize>)> = vec![
        ("a".repeat(199), vec![199]),
        ("b".repeat(200), vec![200]),
        ("c".repeat(201), vec![200, 1]),
        (mixed, vec![200, 1]),
        ("世".repeat(400), vec![200, 200]),
    ];
    let _serial = SERIAL.lock().await;
    for (text, expected) in &cases {
        fake.push(one_char_chunks_in_one_write(text));
        let t = send(&server, &sid, "go").await;
        let frames = until_terminal(&mut s, &t).await;
        let deltas = message_deltas(&frames, &t);
        let lens: Vec<usize> = deltas.iter().map(|d| d.chars().count()).collect();
        assert_eq!(&lens, expected, "{} characters", text.chars().count());
        assert_eq!(&deltas.concat(), text);
        // The deltas come after user.message and before the agent.message that completes them.
        let names: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
        let msg = names.iter().position(|n| *n == "agent.message").unwrap();
        assert_eq!(names[0], "user.message");
        assert!(
            names[1..msg].iter().all(|n| *n == "agent.message.delta"),
            "{names:?}"
        );
        assert_eq!(&names[msg..], ["agent.message", "turn.completed"]);
        assert_eq!(frames[msg].json()["content"], text.as_str());
    }
    let log = history(&server, &sid).await;
    assert_eq!(log.len(), 3 * cases.len());
    assert!(types(&log).iter().all(|t| !t.ends_with(".delta")));
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_delta_is_pushed_50ms_after_its_first_fragment_without_waiting_for_more() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let mut s = stream(&server, &sid, "", &[]).await;
    let gate = Gate::new();
    // The role chunk and five one-character chunks, then the upstream waits for the gate.
    fake.push(
        Reply::text("abcdefghij")
            .chunk_chars(1)
            .hold_after(6, gate.clone()),
    );
    let t = send(&server, &sid, "go").await;
    assert_eq!(s.frame().await.event, "user.message");
    // Only the timer can push these: no event follows and 200 characters never gather.
    let mut early = String::new();
    while early.len() < 5 {
        let f = s.frame().await;
        early.push_str(&delta_text(&f, &t, "agent.message.delta"));
    }
    assert_eq!(early, "abcde");
    assert!(!gate.is_open());
    gate.open();
    let frames = until_terminal(&mut s, &t).await;
    let names: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    let msg = names.iter().position(|n| *n == "agent.message").unwrap();
    assert!(
        names[..msg].iter().all(|n| *n == "agent.message.delta"),
        "{names:?}"
    );
    assert_eq!(message_deltas(&frames, &t).concat(), "fghij");
    assert_eq!(frames[msg].json()["content"], "abcdefghij");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn thinking_deltas_complete_into_the_thinking_event() {
    let (fake, server) = setup(AGENT).await;
    let sid = server
        .session(json!({"agent": {"name": "assistant", "options": {"thinking": "on"}}}))
        .await;
    let mut s = stream(&server, &sid, "", &[]).await;
    fake.push(
        Reply::text("The answer is 42.")
            .thinking("Let me reason about it.")
            .chunk_chars(2),
    );
    let t = send(&server, &sid, "why?").await;
    let frames = until_terminal(&mut s, &t).await;
    let thinking: String = frames
        .iter()
        .filter(|f| f.event == "agent.thinking.delta")
        .map(|f| delta_text(f, &t, "agent.thinking.delta"))
        .collect();
    assert_eq!(thinking, "Let me reason about it.");
    assert_eq!(message_deltas(&frames, &t).concat(), "The answer is 42.");
    let names: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    let th = names.iter().position(|n| *n == "agent.thinking").unwrap();
    let msg = names.iter().position(|n| *n == "agent.message").unwrap();
    let last_delta = names.iter().rposition(|n| n.ends_with(".delta")).unwrap();
    assert!(last_delta < th && last_delta < msg, "{names:?}");
    assert_eq!(frames[th].json()["content"], "Let me reason about it.");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_broken_attempt_is_retracted_with_an_empty_message_before_the_retry() {
    let fake = FakeOpenAi::start().await;
    let config = config_text(&fake, AGENT).replace("retries = 0", "retries = 1");
    assert!(config.contains("retries = 1"));
    let server = TestServer::start(&config).await;
    let sid = server.session(json!({})).await;
    let mut s = stream(&server, &sid, "", &[]).await;
    // The role chunk and "Pa", "rt", "ia"; then the connection breaks.
    fake.push(Reply::text("Partial answer").chunk_chars(2).break_after(4));
    fake.push(Reply::text("Good answer").chunk_chars(2));
    let t = send(&server, &sid, "hello").await;
    let frames = until_terminal(&mut s, &t).await;

    let mut segments: Vec<String> = vec![String::new()];
    let mut stored_msgs = Vec::new();
    for f in &frames {
        match f.event.as_str() {
            "agent.message.delta" => {
                segments
                    .last_mut()
                    .unwrap()
                    .push_str(&delta_text(f, &t, "agent.message.delta"))
            }
            "agent.message" => {
                stored_msgs.push(f.json()["content"].as_str().unwrap().to_string());
                segments.push(String::new());
            }
            _ => {}
        }
    }
    assert_eq!(
        stored_msgs,
        vec!["", "Good answer"],
        "retraction, then the message"
    );
    assert_eq!(
        segments[..2],
        ["Partia".to_string(), "Good answer".to_string()]
    );
    let log = history(&server, &sid).await;
    assert_eq!(
        types(&log),
        vec![
            "user.message",
            "agent.message",
            "agent.message",
            "turn.completed"
        ]
    );
    assert_eq!(log[1]["content"], "");
    assert_eq!(log[2]["content"], "Good answer");
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "one retry");
    assert_eq!(
        reqs[0]["messages"], reqs[1]["messages"],
        "the same request retried"
    );
    // The retracted text is not part of the conversation.
    let (_, hist) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(
        hist["history"]["full"],
        json!([{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Good answer"}])
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn cancelling_a_queued_turn_logs_it_cancelled_without_calling_the_model() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let gate = Gate::new();
    fake.push(Reply::text("first answer").hold(gate.clone()));
    fake.push(Reply::text("third answer"));
    let t1 = send(&server, &sid, "one").await;
    let t2 = send(&server, &sid, "two").await;
    let t3 = send(&server, &sid, "three").await;
    fake.wait_requests(1).await;
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/cancel"),
            &json!({ "turn_id": t2 }),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp, json!({"cancelled": [t2]}));
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "running");
    assert_eq!(info["turn_id"], t1.as_str(), "the running turn goes on");

    gate.open();
    server.wait_idle(&sid).await;
    let reqs = fake.requests();
    assert_eq!(
        reqs.iter().map(last_user).collect::<Vec<_>>(),
        vec!["one", "three"],
        "the cancelled turn never reached the model"
    );
    let log = history(&server, &sid).await;
    let two: Vec<&Value> = log.iter().filter(|e| e["turn_id"] == t2.as_str()).collect();
    assert_eq!(two.len(), 2, "{two:?}");
    assert_eq!(two[0]["type"], "user.message");
    assert_eq!(two[0]["content"], "two");
    assert_eq!(two[1]["type"], "turn.cancelled");
    assert!(
        two[1]["usage"].is_null() && two[1].get("usage").is_some(),
        "usage: null"
    );
    assert_eq!(log.last().unwrap()["type"], "turn.completed");
    assert_eq!(log.last().unwrap()["turn_id"], t3.as_str());
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_cancelled_queued_turn_is_no_longer_listed_as_queued() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let gate = Gate::new();
    fake.push(Reply::text("first answer").hold(gate.clone()));
    fake.push(Reply::text("third answer"));
    let t1 = send(&server, &sid, "one").await;
    let t2 = send(&server, &sid, "two").await;
    let t3 = send(&server, &sid, "three").await;
    fake.wait_requests(1).await;
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["queued"], json!([t2, t3]));
    let (_, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/cancel"),
            &json!({ "turn_id": t2 }),
        )
        .await;
    assert_eq!(resp, json!({"cancelled": [t2]}));
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["turn_id"], t1.as_str());
    assert_eq!(
        info["queued"],
        json!([t3]),
        "GET /sessions shows a cancelled turn as still queued: {info}"
    );
    gate.open();
    server.wait_idle(&sid).await;
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn cancelling_a_streaming_turn_reports_usage_so_far_and_ends_the_aap_stream_with_error() {
    let (fake, server) = with_example_server().await;
    let sid = server.session(json!({})).await;
    let gate = Gate::new();
    fake.push(
        Reply::tool_calls(&[("call_1", "mcp__ex__add", json!({"a": 2, "b": 3}))]).usage(30, 7),
    );
    fake.push(
        Reply::text("The sum is")
            .chunk_chars(2)
            .usage(500, 500)
            .hold(gate.clone()),
    );
    let mut aap = crate::common::sse_stream::open(
        &server.http.base,
        "POST",
        &format!("/sessions/{sid}/turns"),
        &[],
        Some(&json!({"stream": "delta", "messages": [{"role": "user", "content": "2+3?"}]})),
    )
    .await
    .ok();
    assert_eq!(aap.frame().await.event, "turn_start");
    // Read until the held call's text has streamed: the turn is mid-call.
    let mut text = String::new();
    while text != "The sum is" {
        let f = aap.frame().await;
        if f.event == "text_delta" {
            text.push_str(f.json()["delta"].as_str().unwrap());
        }
    }
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    let t = info["turn_id"]
        .as_str()
        .expect("a running turn")
        .to_string();
    let (status, resp) = server
        .http
        .post(&format!("/sessions/{sid}/cancel"), &json!({ "turn_id": t }))
        .await;
    assert_eq!(status, 200);
    assert_eq!(resp, json!({"cancelled": [t]}));
    let rest = aap.until(|f| f.event == "turn_stop").await;
    assert_eq!(
        rest.last().unwrap().json()["stopReason"],
        "error",
        "{rest:?}"
    );
    assert!(
        aap.next().await.is_none(),
        "the AAP stream ends after turn_stop"
    );

    server.wait_idle(&sid).await;
    let log = history(&server, &sid).await;
    assert_eq!(
        types(&log),
        vec![
            "user.message",
            "agent.tool_use",
            "agent.tool_result",
            "turn.cancelled"
        ]
    );
    assert_eq!(log[2]["is_error"], false);
    assert_eq!(
        log[3]["usage"],
        json!({"input_tokens": 30, "output_tokens": 7}),
        "the usage of the calls that completed"
    );
    assert!(!gate.is_open());
    check_log(server.engine().store(), &sid).await;
}

/// Starts a turn whose model calls `mcp__ex__slow` (`call_slow`) for a minute; returns once the
/// tool's sleep has started, with the turn's id and the tool's notify connection (keep it).
async fn turn_in_a_slow_tool(
    fake: &FakeOpenAi,
    server: &TestServer,
    sid: &str,
) -> (String, tokio::net::TcpStream) {
    let notify = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = notify.local_addr().unwrap().to_string();
    fake.push(Reply::tool_calls(&[(
        "call_slow",
        "mcp__ex__slow",
        json!({"ms": 60000, "notify": addr}),
    )]));
    let t = send(server, sid, "take your time").await;
    // The tool connects here once its sleep has started.
    let (conn, _) = tokio::time::timeout(Duration::from_secs(30), notify.accept())
        .await
        .expect("the slow tool started")
        .unwrap();
    (t, conn)
}

#[tokio::test]
async fn cancelling_during_a_slow_tool_gives_it_a_cancelled_result() {
    let (fake, server) = with_example_server().await;
    let sid = server.session(json!({})).await;
    let (t, _conn) = turn_in_a_slow_tool(&fake, &server, &sid).await;
    let (status, resp) = server
        .http
        .post(&format!("/sessions/{sid}/cancel"), &json!({ "turn_id": t }))
        .await;
    assert_eq!(status, 200);
    assert_eq!(resp, json!({"cancelled": [t]}));
    // The turn ends now, not when the 60 s sleep would.
    tokio::time::timeout(Duration::from_secs(20), server.wait_idle(&sid))
        .await
        .expect("the cancel ended the turn while the tool ran");
    let log = history(&server, &sid).await;
    assert_eq!(
        types(&log),
        vec![
            "user.message",
            "agent.tool_use",
            "agent.tool_result",
            "turn.cancelled"
        ]
    );
    assert_eq!(log[2]["tool_use_id"], "call_slow");
    assert_eq!(log[2]["is_error"], true);
    assert_eq!(log[2]["content"], "Cancelled.");
    assert_eq!(log[2]["files"], json!([]));
    assert_eq!(
        log[3]["usage"],
        json!({"input_tokens": 10, "output_tokens": 5})
    );
    assert_eq!(fake.requests().len(), 1, "no model call after the cancel");
    check_log(server.engine().store(), &sid).await;
}

/// A full disk: what a turn could not write is shown to nobody, the turn fails, and the session
/// goes on from what the log holds (no hole in the seqs, nothing unlogged in the model's context).
#[tokio::test]
async fn a_turn_whose_events_cannot_be_written_shows_nothing_unlogged_and_the_session_goes_on() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let mut s = stream(&server, &sid, "", &[]).await;
    fake.push(Reply::text("first answer"));
    let t1 = send(&server, &sid, "one").await;
    until_terminal(&mut s, &t1).await;
    let store = server.engine().store();

    // Nothing more fits: the turn's first commit fails.
    store.cap_size(Some(0)).unwrap();
    fake.push(Reply::text("never stored"));
    let big = "x".repeat(256 * 1024);
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": big}]}),
        )
        .await;
    assert_eq!(status, 503, "{resp}");
    assert_eq!(resp["error"]["type"], "store_unavailable", "{resp}");
    assert!(
        resp["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("could not be written")),
        "{resp}"
    );
    let logged = ["user.message", "agent.message", "turn.completed"];
    assert_eq!(types(&history(&server, &sid).await), logged);

    // Room again: the next turn goes on from the log.
    store.cap_size(None).unwrap();
    fake.push(Reply::text("second answer"));
    let t3 = send(&server, &sid, "two").await;
    let frames = until_terminal(&mut s, &t3).await;
    let seen: Vec<&str> = frames
        .iter()
        .filter(|f| !f.is_delta())
        .map(|f| f.event.as_str())
        .collect();
    assert_eq!(seen, logged, "the subscriber saw only what is logged");
    assert!(frames.iter().all(|f| f.json()["turn_id"] == t3.as_str()));
    let sent = fake.requests();
    let context = sent.last().unwrap()["messages"].to_string();
    assert!(
        !context.contains("xxxx"),
        "the model was sent the unlogged message"
    );
    assert_eq!(last_user(sent.last().unwrap()), "two");
    let log = check_log(store, &sid).await;
    assert_eq!(log.len(), 6);
}

/// A write failure mid-turn: the turn's start is in the log, its end cannot be written. The turn
/// is closed in the log (`turn.failed`) by the first commit that goes through: at once, or with
/// the next turn's start; nothing unlogged is shown or sent on.
#[tokio::test]
async fn a_turn_whose_end_cannot_be_written_is_closed_in_the_log_and_the_session_goes_on() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let mut s = stream(&server, &sid, "", &[]).await;
    let store = server.engine().store();
    // A turn whose commits after its first (beside the model call) fail, `n` of them.
    async fn turn_failing(
        fake: &FakeOpenAi,
        server: &TestServer,
        sid: &str,
        n: u32,
        text: &str,
    ) -> (u16, Value) {
        let store = server.engine().store();
        let gate = Gate::new();
        fake.push(Reply::text("never stored").hold(gate.clone()));
        let (path, body) = (
            format!("/sessions/{sid}/turns"),
            json!({"messages": [{"role": "user", "content": text}]}),
        );
        let asked = fake.requests().len() + 1;
        let http = server.http.clone();
        let answer = tokio::spawn(async move { http.post(&path, &body).await });
        fake.wait_requests(asked).await;
        store.flush().await.unwrap();
        store.fail_commits(n);
        gate.open();
        answer.await.unwrap()
    }

    // The turn's end fails, its closing goes through: the client is told why.
    let (status, resp) = turn_failing(&fake, &server, &sid, 1, "one").await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["stopReason"], "error", "{resp}");
    assert_eq!(resp["error"]["reason"], "internal_error", "{resp}");
    assert!(resp.to_string().contains("could not be written"), "{resp}");
    assert_eq!(
        types(&history(&server, &sid).await),
        ["user.message", "turn.failed"]
    );

    // Its closing fails too: the log keeps it open until the next turn closes it. It began
    // (its start is stored): a 500 that says so, not a 503 inviting the same turn again.
    let (status, resp) = turn_failing(&fake, &server, &sid, 2, "two").await;
    assert_eq!(status, 500, "{resp}");
    assert_eq!(resp["error"]["type"], "internal_error", "{resp}");
    assert!(resp.to_string().contains("began"), "{resp}");
    let two = ["user.message", "turn.failed", "user.message"];
    assert_eq!(types(&history(&server, &sid).await), two);

    fake.push(Reply::text("third answer"));
    let t3 = send(&server, &sid, "three").await;
    let frames = until_terminal(&mut s, &t3).await;
    let log = history(&server, &sid).await;
    assert_eq!(
        types(&log),
        [
            "user.message",
            "turn.failed",
            "user.message",
            "turn.failed",
            "user.message",
            "agent.message",
            "turn.completed"
        ]
    );
    assert_eq!(
        stored(&frames),
        log,
        "the subscriber saw the log, and only the log"
    );
    let sent = fake.requests();
    assert!(!sent.last().unwrap()["messages"]
        .to_string()
        .contains("never stored"));
    check_log(store, &sid).await;
}

/// A tool use is held back only as long as a fast call takes (to be committed with its result):
/// a call that runs on has its use logged and shown while it runs.
#[tokio::test]
async fn a_long_tool_call_is_logged_and_shown_while_it_runs() {
    let (fake, server) = with_example_server().await;
    let sid = server.session(json!({})).await;
    let mut s = stream(&server, &sid, "", &[]).await;
    let (t, _conn) = turn_in_a_slow_tool(&fake, &server, &sid).await;
    // The tool sleeps for a minute: what is shown now is shown while it runs.
    let mut seen = Vec::new();
    while seen.last().map(String::as_str) != Some("agent.tool_use") {
        let f = tokio::time::timeout(Duration::from_secs(30), s.frame())
            .await
            .expect("the tool use was shown while the tool ran");
        if !f.is_delta() {
            seen.push(f.event.clone());
        }
    }
    assert_eq!(seen, ["user.message", "agent.tool_use"]);
    let log = history(&server, &sid).await;
    assert_eq!(types(&log), ["user.message", "agent.tool_use"]);
    assert_eq!(log[1]["tool_use_id"], "call_slow");

    let (status, _) = server
        .http
        .post(&format!("/sessions/{sid}/cancel"), &json!({ "turn_id": t }))
        .await;
    assert_eq!(status, 200);
    tokio::time::timeout(Duration::from_secs(20), server.wait_idle(&sid))
        .await
        .expect("the cancel ended the turn");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_turn_whose_calls_answer_before_a_commit_is_due_is_committed_once_before_its_tools() {
    let (fake, server) = with_example_server().await;
    // No commit falls due during a call, however long it runs.
    server.engine().set_sync_after(Duration::from_secs(3600));
    let store = server.engine().store();
    let sid = server.session(json!({})).await;

    let before = store.commits();
    fake.push(Reply::text("hi"));
    let resp = aap_turn(&server, &sid, "hello").await;
    assert_eq!(resp["stopReason"], "end_turn");
    assert_eq!(store.commits() - before, 1, "one commit for the whole turn");

    // A trusted MCP tool between two model calls: the turn's start is committed before the
    // tool runs (a turn cut off after it ran is found begun, never carried out again), then
    // one commit for the rest.
    let before = store.commits();
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "mcp__ex__add",
        json!({"a": 2, "b": 3}),
    )]));
    fake.push(Reply::text("5"));
    let resp = aap_turn(&server, &sid, "add").await;
    assert_eq!(resp["stopReason"], "end_turn", "{resp}");
    assert_eq!(store.commits() - before, 2, "the start, then the rest");
    let log = history(&server, &sid).await;
    assert_eq!(
        types(&log),
        [
            "user.message",
            "agent.message",
            "turn.completed",
            "user.message",
            "agent.tool_use",
            "agent.tool_result",
            "agent.message",
            "turn.completed"
        ]
    );
    assert!(log[5]["content"].to_string().contains('5'), "{}", log[5]);

    // A live subscriber is shown streamed text only after the events before it: the turn's
    // start is committed and shown when the call ends, then the text, then the rest.
    let mut s = stream(&server, &sid, "", &[]).await;
    let before = store.commits();
    fake.push(Reply::text("abcdef").chunk_chars(2));
    let t = send(&server, &sid, "stream it").await;
    let frames: Vec<Frame> = until_terminal(&mut s, &t)
        .await
        .into_iter()
        .filter(|f| f.json()["turn_id"] == t)
        .collect();
    let names: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    let msg = names.iter().position(|n| *n == "agent.message").unwrap();
    assert_eq!(names[0], "user.message", "{names:?}");
    assert!(msg > 1, "{names:?}");
    assert!(
        names[1..msg].iter().all(|n| *n == "agent.message.delta"),
        "{names:?}"
    );
    assert_eq!(names[msg + 1..], ["turn.completed"]);
    assert_eq!(message_deltas(&frames, &t).concat(), "abcdef");
    assert_eq!(
        store.commits() - before,
        2,
        "the turn's start, then its end"
    );
    check_log(store, &sid).await;
}

#[tokio::test]
async fn what_a_turn_said_is_committed_once_due_even_when_no_single_call_runs_that_long() {
    let (fake, server) = with_example_server().await;
    // A commit may wait 300 ms. Each model call below sends its events (role, call or text,
    // finish, usage, [DONE]) 50 ms apart: 150–250 ms a call, ≥ 350 ms for the two.
    server.engine().set_sync_after(Duration::from_millis(300));
    let store = server.engine().store();
    let sid = server.session(json!({})).await;
    let pace = Duration::from_millis(50);
    fake.push(
        Reply::tool_calls(&[("call_1", "mcp__ex__add", json!({"a": 2, "b": 3}))])
            .chunk_chars(1000)
            .pace(pace),
    );
    fake.push(Reply::text("5").chunk_chars(1000).pace(pace));
    let before = store.commits();
    let resp = aap_turn(&server, &sid, "add").await;
    assert_eq!(resp["stopReason"], "end_turn", "{resp}");
    // The user message was due 300 ms after it was said: committed while the second call ran,
    // not held to the turn's end because each call alone was short.
    assert!(
        store.commits() - before >= 2,
        "one commit for a turn longer than the wait allowed"
    );
    check_log(store, &sid).await;
}

#[tokio::test]
async fn a_turn_waiting_to_retry_its_model_call_has_committed_and_shown_what_it_said() {
    let fake = FakeOpenAi::start().await;
    let config = config_text(&fake, AGENT).replace("retries = 0", "retries = 1");
    assert!(config.contains("retries = 1"));
    let server = TestServer::start(&config).await;
    // No commit falls due during a call: only the wait for the retry can make one.
    server.engine().set_sync_after(Duration::from_secs(3600));
    let sid = server.session(json!({})).await;
    let mut s = stream(&server, &sid, "", &[]).await;
    fake.push(Reply::status(503, json!({"error": {"message": "busy"}})));
    let gate = Gate::new();
    fake.push(Reply::text("at last").hold(gate.clone()));
    let t = send(&server, &sid, "hello").await;
    let first = s.frame().await;
    assert_eq!(first.event, "user.message");
    assert!(!gate.is_open(), "shown while the retry waits on the model");
    let log = history(&server, &sid).await;
    assert_eq!(types(&log), ["user.message"]);
    gate.open();
    let frames = until_terminal(&mut s, &t).await;
    assert_eq!(frames.last().unwrap().event, "turn.completed");
    assert_eq!(fake.request_count(), 2, "one retry");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_stale_cancel_spares_the_newer_turn_and_cancelling_twice_is_fine() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let cancel = format!("/sessions/{sid}/cancel");
    // Nothing to cancel yet.
    let (status, resp) = server.http.post(&cancel, &json!({})).await;
    assert_eq!((status, resp), (200, json!({"cancelled": []})));

    fake.push(Reply::text("done one"));
    let t1 = send(&server, &sid, "one").await;
    server.wait_idle(&sid).await;
    let gate = Gate::new();
    fake.push(Reply::text("done two").hold(gate.clone()));
    let t2 = send(&server, &sid, "two").await;
    fake.wait_requests(2).await;
    let (status, resp) = server.http.post(&cancel, &json!({ "turn_id": t1 })).await;
    assert_eq!(
        (status, resp),
        (200, json!({"cancelled": []})),
        "t1 had ended"
    );
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["turn_id"], t2.as_str());
    gate.open();
    server.wait_idle(&sid).await;
    let log = history(&server, &sid).await;
    let last = log.last().unwrap();
    assert_eq!(
        (last["type"].as_str(), last["turn_id"].as_str()),
        (Some("turn.completed"), Some(t2.as_str()))
    );

    let gate = Gate::new();
    fake.push(Reply::text("never").hold(gate.clone()));
    let t3 = send(&server, &sid, "three").await;
    fake.wait_requests(3).await;
    let (status, resp) = server.http.post(&cancel, &json!({ "turn_id": t3 })).await;
    assert_eq!((status, resp), (200, json!({"cancelled": [t3]})));
    let (status, resp) = server.http.post(&cancel, &json!({ "turn_id": t3 })).await;
    assert_eq!(
        (status, resp),
        (200, json!({"cancelled": []})),
        "again: nothing new"
    );
    let (status, resp) = server.http.post(&cancel, &json!({})).await;
    assert_eq!(
        (status, resp),
        (200, json!({"cancelled": []})),
        "no body: nothing new"
    );
    server.wait_idle(&sid).await;
    let (status, resp) = server.http.post(&cancel, &json!({ "turn_id": t3 })).await;
    assert_eq!(
        (status, resp),
        (200, json!({"cancelled": []})),
        "after it ended"
    );
    let log = history(&server, &sid).await;
    let cancelled: Vec<&Value> = log
        .iter()
        .filter(|e| e["type"] == "turn.cancelled")
        .collect();
    assert_eq!(cancelled.len(), 1, "one terminal event: {log:?}");
    assert_eq!(cancelled[0]["turn_id"], t3.as_str());
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn cancel_without_a_body_stops_the_running_turn_and_every_queued_one() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let gate = Gate::new();
    fake.push(Reply::text("held").hold(gate.clone()));
    let t1 = send(&server, &sid, "one").await;
    let t2 = send(&server, &sid, "two").await;
    let t3 = send(&server, &sid, "three").await;
    fake.wait_requests(1).await;
    let resp = server
        .http
        .request_raw("POST", &format!("/sessions/{sid}/cancel"), None)
        .await;
    assert_eq!(resp.status(), 200);
    let body: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let mut got: Vec<String> = serde_json::from_value(body["cancelled"].clone()).unwrap();
    got.sort();
    let mut want = vec![t1.clone(), t2.clone(), t3.clone()];
    want.sort();
    assert_eq!(got, want);
    server.wait_idle(&sid).await;
    let log = history(&server, &sid).await;
    let terminals: Vec<(&str, &str)> = log
        .iter()
        .filter(|e| e["type"].as_str().unwrap().starts_with("turn."))
        .map(|e| (e["turn_id"].as_str().unwrap(), e["type"].as_str().unwrap()))
        .collect();
    assert_eq!(
        terminals,
        vec![
            (t1.as_str(), "turn.cancelled"),
            (t2.as_str(), "turn.cancelled"),
            (t3.as_str(), "turn.cancelled")
        ]
    );
    assert_eq!(fake.requests().len(), 1);
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_turn_over_its_time_limit_fails_with_timeout() {
    let (fake, server) = setup("[agents.assistant]\nturn_timeout_s = 1\n").await;
    let sid = server.session(json!({})).await;
    let mut s = stream(&server, &sid, "", &[]).await;
    let gate = Gate::new();
    fake.push(Reply::text("never finished").hold(gate.clone()));
    let t = send(&server, &sid, "slow").await;
    let frames = until_terminal(&mut s, &t).await;
    let end = frames.last().unwrap().json();
    assert_eq!(end["type"], "turn.failed");
    assert_eq!(end["reason"], "timeout", "{end}");
    assert!(!gate.is_open());
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn failure_reasons_empty_output_and_model_error() {
    let (fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let mut s = stream(&server, &sid, "", &[]).await;
    fake.push(Reply::text("").usage(12, 0));
    let t = send(&server, &sid, "say nothing").await;
    let end = until_terminal(&mut s, &t).await.pop().unwrap().json();
    assert_eq!(
        (end["type"].as_str(), end["reason"].as_str()),
        (Some("turn.failed"), Some("empty_output")),
        "{end}"
    );
    assert_eq!(
        end["usage"],
        json!({"input_tokens": 12, "output_tokens": 0})
    );

    fake.push(Reply::status(
        503,
        json!({"error": {"message": "upstream unavailable"}}),
    ));
    let t = send(&server, &sid, "again").await;
    let end = until_terminal(&mut s, &t).await.pop().unwrap().json();
    assert_eq!(
        (end["type"].as_str(), end["reason"].as_str()),
        (Some("turn.failed"), Some("model_error")),
        "{end}"
    );

    fake.push(Reply::status(
        400,
        json!({"error": {"message": "content blocked"}}),
    ));
    let t = send(&server, &sid, "blocked").await;
    let end = until_terminal(&mut s, &t).await.pop().unwrap().json();
    assert_eq!(end["reason"], "model_error", "{end}");
    assert_eq!(fake.requests().len(), 3, "retries = 0: no retry");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn the_event_stream_has_sse_headers_and_unknown_sessions_are_404() {
    let (_fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let s = crate::common::sse_stream::get(
        &server.http.base,
        &format!("/sessions/{sid}/events/stream"),
        &[],
    )
    .await;
    assert_eq!(s.status, 200);
    let h = |k: &str| s.headers.get(k).map(|v| v.to_str().unwrap().to_string());
    assert_eq!(h("content-type").as_deref(), Some("text/event-stream"));
    assert_eq!(h("cache-control").as_deref(), Some("no-cache"));
    assert_eq!(h("x-accel-buffering").as_deref(), Some("no"));

    let missing = "sess_00000000000000000000000000";
    for (method, path) in [
        ("GET", format!("/sessions/{missing}/events/stream")),
        ("GET", format!("/sessions/{missing}/events/history")),
        ("POST", format!("/sessions/{missing}/messages")),
        ("POST", format!("/sessions/{missing}/cancel")),
    ] {
        let (status, v) = server
            .http
            .call(method, &path, Some(&json!({"content": "hi"})))
            .await;
        assert_eq!(status, 404, "{method} {path}: {v}");
        assert!(v["error"]["message"].is_string(), "{v}");
    }
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": ""}),
        )
        .await;
    assert_eq!(status, 400, "{v}");
}

#[tokio::test]
async fn every_event_a_subscriber_sees_is_already_in_the_log() {
    let (fake, server) = with_example_server().await;
    let sid = server.session(json!({})).await;
    let mut s = stream(&server, &sid, "", &[]).await;
    // The tool runs for a while: its tool use is seen, and checked, while it runs.
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "mcp__ex__slow",
        json!({"ms": 300}),
    )]));
    fake.push(Reply::text("done"));
    let turn_id = send(&server, &sid, "go").await;
    let mut seen = Vec::new();
    loop {
        let f = s.frame().await;
        if f.is_delta() {
            continue;
        }
        // The moment an event is seen, the log holds it, byte for byte: nothing a subscriber
        // is shown can be lost to a crash.
        let (status, text, _) = history_raw(&server, &sid, "?limit=1000").await;
        assert_eq!(status, 200, "{text}");
        assert!(
            raw_array_elements(&text, "events").contains(&f.data),
            "{} was on the stream before it was in the log: {text}",
            f.event
        );
        seen.push(f.event.clone());
        if f.is_terminal() && f.json()["turn_id"] == turn_id {
            break;
        }
    }
    assert_eq!(
        seen,
        [
            "user.message",
            "agent.tool_use",
            "agent.tool_result",
            "agent.message",
            "turn.completed"
        ]
    );
}

#[tokio::test]
async fn deleting_a_session_ends_its_event_streams() {
    let (_fake, server) = setup(AGENT).await;
    let sid = server.session(json!({})).await;
    let mut s = stream(&server, &sid, "", &[]).await;
    let (status, _) = server.http.delete(&format!("/sessions/{sid}")).await;
    assert_eq!(status, 204);
    assert!(
        s.next().await.is_none(),
        "the stream of a deleted session ends"
    );
}

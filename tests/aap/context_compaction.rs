//! Context that never overflows: a session driven past its model's context window compacts its
//! oldest turns into a summary (logged, shown in `history?type=compacted`, kept across a
//! restart), and a single message bigger than the window fails clearly.

use crate::common::{config_text, logcheck::check_log, names, TestServer};
use serde_json::{json, Value};
use turnstile::log::EventBody;
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// A 2,000-token window: compaction past 1,600 (the default `compact_at`, 0.8).
const AGENT: &str = r#"
[agents.assistant]
system_prompt = "You are terse."
context_tokens = 2000
"#;
const THRESHOLD: u64 = 1600;
const SUMMARY: &str = "SUMMARY: the user sent numbered notes about lighthouses; nothing is open.";

/// A message of about 1,200 bytes (300 tokens) that names its number.
fn note(k: usize) -> String {
    let mut s = format!("Note {k}: ");
    while s.len() < 1200 {
        s.push_str(&format!("lighthouse{k} keeper logbook entry; "));
    }
    s
}

/// Every call of turn `k` answers `reply k`, a summary call the summary; usage as the request's
/// size (messages and tools JSON over 4).
fn replies(fake: &FakeOpenAi, k: usize) {
    let summary = Reply::text(SUMMARY).count_prompt();
    fake.set_fallback(
        Reply::text(&format!("reply {k}"))
            .count_prompt()
            .instead_when("You summarise", summary),
    );
}

fn is_summary_call(req: &Value) -> bool {
    req.pointer("/messages/0/content")
        .and_then(Value::as_str)
        .is_some_and(|s| s.starts_with("You summarise"))
}

/// The size of a request as the fake counts it.
fn tokens(req: &Value) -> u64 {
    let size = |k: &str| req.get(k).map_or(0, |v| v.to_string().len()) as u64;
    (size("messages") + size("tools")) / 4
}

async fn history(server: &TestServer, sid: &str, kind: &str) -> Vec<Value> {
    let (status, v) = server
        .http
        .get(&format!("/sessions/{sid}/history?type={kind}"))
        .await;
    assert_eq!(status, 200, "{v}");
    v["history"][kind].as_array().expect("history").clone()
}

/// One turn in `message` stream mode; its SSE events.
async fn turn(server: &TestServer, sid: &str, text: &str) -> Vec<crate::common::Sse> {
    server
        .http
        .post_sse(
            &format!("/sessions/{sid}/turns"),
            &json!({"stream": "message", "messages": [{"role": "user", "content": text}]}),
        )
        .await
}

fn compactions(events: &[turnstile::log::Event]) -> Vec<&turnstile::log::Event> {
    events
        .iter()
        .filter(|e| {
            matches!(
                e.body,
                EventBody::AgentMessage {
                    compaction: true,
                    ..
                }
            )
        })
        .collect()
}

/// Drive a session until its first compaction, then one turn more. Returns the number of
/// turns made.
async fn drive_past_the_window(fake: &FakeOpenAi, server: &TestServer, sid: &str) -> usize {
    for k in 1..=10 {
        replies(fake, k);
        let sse = turn(server, sid, &note(k)).await;
        assert_eq!(
            names(&sse),
            ["turn_start", "text", "turn_stop"],
            "turn {k}: {sse:?}"
        );
        assert_eq!(
            sse[1].data["text"],
            format!("reply {k}"),
            "the summary is not streamed as the agent's answer"
        );
        assert_eq!(sse[2].data["stopReason"], "end_turn");
        let summarised = fake.requests().iter().any(is_summary_call);
        if summarised {
            replies(fake, k + 1);
            let sse = turn(server, sid, &note(k + 1)).await;
            assert_eq!(sse[2].data["stopReason"], "end_turn", "{sse:?}");
            return k + 1;
        }
    }
    panic!("ten notes of 300 tokens never compacted a 2,000-token window");
}

#[tokio::test]
async fn a_session_past_its_window_compacts_once_and_the_next_request_fits() {
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&config_text(&fake, AGENT)).await;
    let sid = server.session(json!({})).await;
    let turns = drive_past_the_window(&fake, &server, &sid).await;

    let reqs = fake.requests();
    let at: Vec<usize> = (0..reqs.len())
        .filter(|&i| is_summary_call(&reqs[i]))
        .collect();
    assert_eq!(at.len(), 1, "one compaction");
    let summary_call = &reqs[at[0]];
    assert!(
        summary_call.get("tools").is_none(),
        "the summary call offers no tools: {summary_call}"
    );
    let asked = summary_call["messages"][1]["content"].as_str().unwrap();
    assert!(asked.contains("Note 1: "), "the oldest note is summarised");
    // Every request before the summary call that went over the threshold... there is none:
    // the one that would have is the one that compacted first.
    for r in &reqs[..at[0]] {
        assert!(tokens(r) <= THRESHOLD, "{} tokens", tokens(r));
    }
    // The request right after the summary (same turn) and every later one fit, and begin with
    // the summary instead of the old notes.
    for r in &reqs[at[0] + 1..] {
        assert!(
            tokens(r) < THRESHOLD,
            "{} tokens after compaction",
            tokens(r)
        );
        let msgs = r["messages"].as_array().unwrap();
        assert_eq!(
            msgs[0],
            json!({"role": "system", "content": "You are terse."})
        );
        let first = msgs[1]["content"].as_str().unwrap();
        assert!(
            first.starts_with("Summary of the earlier conversation") && first.ends_with(SUMMARY),
            "{first}"
        );
        assert!(
            !r.to_string().contains("Note 1: "),
            "old notes are not re-sent"
        );
    }

    // The log keeps every event, the summary among them, marked.
    let events = check_log(server.engine().store(), &sid).await;
    let marked = compactions(&events);
    assert_eq!(marked.len(), 1);
    let EventBody::AgentMessage {
        content, replaces, ..
    } = &marked[0].body
    else {
        unreachable!()
    };
    assert_eq!(content, SUMMARY);
    let [first, last] = replaces.clone().expect("replaces");
    assert_eq!(first, events[0].id, "from the session's first event");
    let last_at = events.iter().position(|e| e.id == last).expect("last id");
    assert!(
        events[last_at].body.is_terminal(),
        "whole turns were replaced"
    );
    assert!(last < marked[0].id);
    assert!(marked[0].json.contains(r#""compaction":true"#));
    assert!(marked[0]
        .json
        .contains(&format!(r#""replaces":["{first}","{last}"]"#)));

    // `full` is everything, the summary not in it; `compacted` is what the model is sent next.
    let full = history(&server, &sid, "full").await;
    assert_eq!(full.len(), 2 * turns);
    for (k, pair) in full.chunks(2).enumerate() {
        assert_eq!(pair[0], json!({"role": "user", "content": note(k + 1)}));
        assert_eq!(
            pair[1],
            json!({"role": "assistant", "content": format!("reply {}", k + 1)})
        );
    }
    let compacted = history(&server, &sid, "compacted").await;
    assert!(compacted.len() < full.len());
    replies(&fake, 99);
    let sse = turn(&server, &sid, "And now?").await;
    assert_eq!(sse[1].data["text"], "reply 99");
    let next = fake.requests().pop().unwrap();
    let sent = next["messages"].as_array().unwrap();
    assert_eq!(
        sent[1..sent.len() - 1],
        compacted[..],
        "compacted history is exactly what the model was sent next"
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_restart_keeps_the_compacted_context() {
    let fake = FakeOpenAi::start().await;
    let config = config_text(&fake, AGENT);
    let server = TestServer::start(&config).await;
    let sid = server.session(json!({})).await;
    let turns = drive_past_the_window(&fake, &server, &sid).await;
    let compacted = history(&server, &sid, "compacted").await;
    let full = history(&server, &sid, "full").await;
    let dir = server.stop().await;

    let server = TestServer::start_in(dir, &config).await;
    assert_eq!(history(&server, &sid, "compacted").await, compacted);
    assert_eq!(history(&server, &sid, "full").await, full);
    let before = fake.requests().len();
    replies(&fake, turns + 1);
    let sse = turn(&server, &sid, "Still there?").await;
    assert_eq!(sse[2].data["stopReason"], "end_turn", "{sse:?}");
    let reqs = fake.requests();
    let first_after = &reqs[before];
    assert!(!is_summary_call(first_after), "no second compaction");
    let first = first_after["messages"][1]["content"].as_str().unwrap();
    assert!(
        first.starts_with("Summary of the earlier conversation") && first.ends_with(SUMMARY),
        "the first request after the restart starts with the summary: {first}"
    );
    assert!(!first_after.to_string().contains("Note 1: "));
    let events = check_log(server.engine().store(), &sid).await;
    assert_eq!(compactions(&events).len(), 1);
}

#[tokio::test]
async fn a_message_bigger_than_the_window_fails_clearly_without_an_upstream_call() {
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&config_text(&fake, AGENT)).await;
    let sid = server.session(json!({})).await;
    replies(&fake, 1);
    let sse = turn(&server, &sid, "Hello.").await;
    assert_eq!(sse[2].data["stopReason"], "end_turn");
    let huge = "x".repeat(12_000); // about 3,000 tokens in a 2,000-token window
    let sse = turn(&server, &sid, &huge).await;
    let stop = sse.last().unwrap();
    assert_eq!(stop.event, "turn_stop");
    assert_eq!(stop.data["stopReason"], "error", "{stop:?}");
    assert_eq!(stop.data["error"]["reason"], "model_error");
    let message = stop.data["error"]["message"].as_str().unwrap();
    for part in ["context window of 2000 tokens", "context_tokens", "shorter"] {
        assert!(message.contains(part), "{part:?} in {message}");
    }
    assert_eq!(
        fake.requests().len(),
        1,
        "neither the message nor a summary call went upstream"
    );
    let events = check_log(server.engine().store(), &sid).await;
    assert!(compactions(&events).is_empty());
    match &events.last().unwrap().body {
        EventBody::TurnFailed { usage, .. } => assert_eq!(*usage, None, "no model call answered"),
        other => panic!("{other:?}"),
    }
    // The session goes on with messages that fit.
    replies(&fake, 3);
    let sse = turn(&server, &sid, "Sorry, shorter.").await;
    assert_eq!(sse[1].data["text"], "reply 3");
}

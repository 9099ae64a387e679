//! Approvals that cannot hang or be forged (issue 16): a pending permission expires after
//! `[agents.X] approval_ttl_s` (also across a restart); a grant is re-decided under a policy
//! changed by a restart; a follow-up sent twice with one `Idempotency-Key` acts once and answers
//! the same; answers for unknown, settled or expired calls are 409s naming what is outstanding;
//! and a property test over random interleavings: an `ask` tool runs only after its own grant,
//! and at most once (exactly once unless a cancel cut its turn short).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::mcp::example_server;
use crate::common::{config_text, logcheck::check_log, TestServer};
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// The example server logging every call to `calls`; `echo` asks, `add` is trusted.
fn config(fake: &FakeOpenAi, calls: &Path, ttl_s: u64, policy: &str) -> String {
    let server = example_server(
        "ex",
        &format!(
            "args = [\"--log-calls\", {:?}]",
            calls.display().to_string()
        ),
    );
    let extra = format!(
        "[agents.assistant]\napproval_ttl_s = {ttl_s}\n\n{server}\n[policy]\n{policy}\ndefault = \"ask\"\n"
    );
    config_text(fake, &extra)
}

const ASK_ECHO: &str = "ask = [\"mcp__ex__echo\"]\ntrust = [\"mcp__ex__add\"]";

/// The calls the example server received: (tool, the `text` argument).
fn calls(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .map(|l| {
            let (tool, args) = l.split_once(' ').expect("a call line");
            let args: Value = serde_json::from_str(args).expect("call args");
            (
                tool.to_string(),
                args["text"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn echo_call(id: &str) -> (String, &'static str, Value) {
    (id.to_string(), "mcp__ex__echo", json!({ "text": id }))
}

fn push_calls(fake: &FakeOpenAi, calls: &[(String, &'static str, Value)]) {
    let calls: Vec<(&str, &str, Value)> = calls
        .iter()
        .map(|(id, name, input)| (id.as_str(), *name, input.clone()))
        .collect();
    fake.push(Reply::tool_calls(&calls));
}

fn user(text: &str) -> Value {
    json!({"messages": [{"role": "user", "content": text}]})
}

fn grant(id: &str, granted: bool) -> Value {
    json!({"role": "tool_permission", "toolCallId": id, "granted": granted})
}

async fn post_turn(server: &TestServer, sid: &str, body: &Value) -> (u16, Value) {
    server
        .http
        .post(&format!("/sessions/{sid}/turns"), body)
        .await
}

/// POST a turn with an `Idempotency-Key`: the status and the body's text.
async fn post_keyed(server: &TestServer, sid: &str, key: &str, body: &Value) -> (u16, String) {
    let resp = crate::common::sse_stream::open(
        &server.http.base,
        "POST",
        &format!("/sessions/{sid}/turns"),
        &[("idempotency-key", key)],
        Some(body),
    )
    .await;
    let status = resp.status;
    (status, resp.text().await)
}

/// A temp file path for the example server's call log, in the server's folder.
fn calls_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("calls.log")
}

async fn start(fake: &FakeOpenAi, ttl_s: u64, policy: &str) -> (TestServer, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = calls_path(&dir);
    let server = TestServer::start_in(dir, &config(fake, &path, ttl_s, policy)).await;
    (server, path)
}

async fn restart(server: TestServer, fake: &FakeOpenAi, ttl_s: u64, policy: &str) -> TestServer {
    let dir = server.stop().await;
    let path = calls_path(&dir);
    let config = crate::common::stores::keep_store(dir.path(), &config(fake, &path, ttl_s, policy));
    TestServer::start_in(dir, &config).await
}

/// Read the session's event stream (after `after`, an event id) until an event satisfies `stop`.
async fn stream_until(
    server: &TestServer,
    sid: &str,
    after: &str,
    stop: impl FnMut(&crate::common::sse_stream::Frame) -> bool,
) -> Vec<crate::common::sse_stream::Frame> {
    let path = format!("/sessions/{sid}/events/stream?after={after}");
    let mut stream = crate::common::sse_stream::get(&server.http.base, &path, &[])
        .await
        .ok();
    stream.until(stop).await
}

async fn last_event_id(server: &TestServer, sid: &str) -> String {
    let store = server.engine().store();
    store.flush().await.unwrap();
    let events = store.events(sid, 0, 1 << 20).await.unwrap();
    events.last().expect("an event").id.clone()
}

#[tokio::test]
async fn an_unanswered_permission_expires_on_time_is_denied_in_the_log_and_the_model_is_told() {
    let fake = FakeOpenAi::start().await;
    let (server, log) = start(&fake, 1, ASK_ECHO).await;
    let sid = server.session(json!({})).await;
    push_calls(&fake, &[echo_call("call_x")]);
    let (status, resp) = post_turn(&server, &sid, &user("echo")).await;
    assert_eq!(
        (status, resp["stopReason"].as_str()),
        (200, Some("tool_use")),
        "{resp}"
    );

    // The pending call shows its deadline: the tool_use's created_at plus approval_ttl_s.
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "awaiting_client", "{info}");
    let store = server.engine().store();
    store.flush().await.unwrap();
    let events = store.events(&sid, 0, 100).await.unwrap();
    let asked = events
        .iter()
        .find(|e| e.body.type_name() == "agent.tool_use")
        .unwrap();
    let ms = |s: &str| turnstile::clock::parse_ms(s).expect("a timestamp");
    let expires_at = info["pending"][0]["expires_at"]
        .as_str()
        .expect("expires_at");
    assert_eq!(ms(expires_at) - ms(&asked.created_at), 1000, "{info}");

    // The event stream shows the denial on time, with no request in between.
    let after = events.last().unwrap().id.clone();
    let frames = stream_until(&server, &sid, &after, |f| f.is_terminal()).await;
    let kinds: Vec<&str> = frames.iter().map(|f| f.event.as_str()).collect();
    assert_eq!(
        kinds,
        ["user.message", "agent.tool_result", "turn.completed"],
        "{frames:?}"
    );
    let result = frames[1].json();
    assert_eq!(result["tool_use_id"], "call_x");
    assert_eq!(result["content"], "Tool call denied: approval expired");
    assert_eq!(result["is_error"], true);
    let block = &frames[0].json()["content"][0];
    assert_eq!(
        (&block["reason"], &block["expired"], &block["granted"]),
        (&json!("approval expired"), &json!(true), &json!(false)),
        "{block}"
    );
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "idle", "{info}");
    assert_eq!(info["pending"], json!([]));

    // A late grant is refused, naming the call as expired; nothing ran.
    let (status, err) =
        post_turn(&server, &sid, &json!({"messages": [grant("call_x", true)]})).await;
    assert_eq!(status, 409, "{err}");
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(msg.contains("call_x") && msg.contains("expired"), "{msg}");
    assert!(msg.contains("no tool calls are pending"), "{msg}");

    // The model is told on the next turn: the denial is in its history like any other.
    fake.push(Reply::text("I could not echo it."));
    let (status, _) = post_turn(&server, &sid, &user("well?")).await;
    assert_eq!(status, 200);
    let reqs = fake.requests();
    let told: Vec<&Value> = reqs[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(told.len(), 1, "{reqs:?}");
    assert_eq!(told[0]["tool_call_id"], "call_x");
    assert_eq!(told[0]["content"], "Tool call denied: approval expired");
    assert_eq!(calls(&log), vec![], "an expired call never runs");
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn expiry_is_computed_from_the_log_after_a_restart() {
    let fake = FakeOpenAi::start().await;
    let (server, log) = start(&fake, 3, ASK_ECHO).await;
    let sid = server.session(json!({})).await;
    push_calls(&fake, &[echo_call("call_r")]);
    post_turn(&server, &sid, &user("echo")).await;
    let (_, before) = server.http.get(&format!("/sessions/{sid}")).await;
    let expires_at = before["pending"][0]["expires_at"].clone();
    assert!(expires_at.is_string(), "{before}");
    let after = last_event_id(&server, &sid).await;

    let server = restart(server, &fake, 3, ASK_ECHO).await;
    // Read back from the log: the same deadline (or, on a slow machine, already expired).
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    if info["status"] == "awaiting_client" {
        assert_eq!(info["pending"][0]["expires_at"], expires_at, "{info}");
    }
    let frames = stream_until(&server, &sid, &after, |f| f.is_terminal()).await;
    let result = frames
        .iter()
        .find(|f| f.event == "agent.tool_result")
        .expect("the expiry's result")
        .json();
    assert_eq!(result["content"], "Tool call denied: approval expired");
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "idle", "{info}");
    assert_eq!(calls(&log), vec![]);
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn an_expired_permission_beside_a_client_call_is_denied_in_the_follow_up_that_need_not_answer_it(
) {
    let fake = FakeOpenAi::start().await;
    // A real 1 s TTL, not the engine's clock hook: the expiry must hold on a store whose next
    // turn reads the session back from the log (PostgreSQL takes the session's lease anew).
    let (server, log) = start(&fake, 1, ASK_ECHO).await;
    let tool = json!({"name": "get_location", "description": "", "parameters": {"type": "object"}});
    let sid = server.session(json!({"tools": [tool]})).await;
    push_calls(
        &fake,
        &[
            ("call_c".to_string(), "get_location", json!({})),
            echo_call("call_p"),
        ],
    );
    post_turn(&server, &sid, &user("go")).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let info = loop {
        let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
        if info["pending"][1]["expired"] == true {
            break info;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "call_p not expired 10 s after its 1 s TTL: {info}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        info["status"], "awaiting_client",
        "the client call still waits: {info}"
    );
    assert_eq!(info["pending"][1]["toolCallId"], "call_p");
    assert_eq!(info["pending"][1]["expired"], true, "{info}");

    // Granting it is refused, naming it expired and what is still outstanding.
    let both = json!({"messages": [
        {"role": "tool", "toolCallId": "call_c", "content": "Paris"},
        grant("call_p", true)
    ]});
    let (status, err) = post_turn(&server, &sid, &both).await;
    assert_eq!(status, 409, "{err}");
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(msg.contains("call_p (mcp__ex__echo) has expired"), "{msg}");
    assert!(
        msg.contains("still outstanding: call_c (get_location"),
        "{msg}"
    );

    // The client's result alone is enough; the expired call is denied in the follow-up.
    fake.push(Reply::text("ok"));
    let only_client =
        json!({"messages": [{"role": "tool", "toolCallId": "call_c", "content": "Paris"}]});
    let (status, resp) = post_turn(&server, &sid, &only_client).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        resp["messages"][0],
        json!({"role": "tool", "toolCallId": "call_p", "content": "Tool call denied: approval expired"})
    );
    assert_eq!(calls(&log), vec![]);
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn a_grant_is_re_decided_under_a_policy_changed_by_a_restart() {
    let fake = FakeOpenAi::start().await;
    let (server, log) = start(&fake, 3600, ASK_ECHO).await;
    let denied = server.session(json!({})).await;
    let trusted = server.session(json!({})).await;
    push_calls(&fake, &[echo_call("call_d")]);
    post_turn(&server, &denied, &user("one")).await;
    push_calls(&fake, &[echo_call("call_t")]);
    post_turn(&server, &trusted, &user("two")).await;

    // The new tools.toml denies echo: the grant becomes a denial that names the rule.
    let deny = "deny = [\"mcp__ex__e*\"]\ntrust = [\"mcp__ex__add\"]";
    let server = restart(server, &fake, 3600, deny).await;
    fake.push(Reply::text("denied, then"));
    let (status, resp) = post_turn(
        &server,
        &denied,
        &json!({"messages": [grant("call_d", true)]}),
    )
    .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        resp["messages"][0],
        json!({"role": "tool", "toolCallId": "call_d",
               "content": "Tool call denied: the policy now denies mcp__ex__echo (rule mcp__ex__e*)"})
    );
    assert_eq!(
        calls(&log),
        vec![],
        "a call the policy now denies never runs"
    );
    check_log(server.engine().store(), &denied).await;

    // The next one trusts it (no ask): the client's grant applies, and it runs once.
    let trust = "trust = [\"mcp__ex__echo\", \"mcp__ex__add\"]";
    let server = restart(server, &fake, 3600, trust).await;
    fake.push(Reply::text("ran"));
    let (status, resp) = post_turn(
        &server,
        &trusted,
        &json!({"messages": [grant("call_t", true)]}),
    )
    .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(
        resp["messages"][0],
        json!({"role": "tool", "toolCallId": "call_t", "content": "call_t"})
    );
    assert_eq!(
        calls(&log),
        vec![("echo".to_string(), "call_t".to_string())]
    );
    check_log(server.engine().store(), &trusted).await;
}

#[tokio::test]
async fn a_follow_up_sent_twice_with_one_idempotency_key_answers_the_same_and_acts_once() {
    let fake = FakeOpenAi::start().await;
    let (server, log) = start(&fake, 3600, ASK_ECHO).await;
    let sid = server.session(json!({})).await;
    push_calls(&fake, &[echo_call("call_1")]);
    post_turn(&server, &sid, &user("one")).await;

    // stream "none": the same status and bytes, twice at once and once after.
    fake.push(Reply::text("echoed"));
    let body = json!({"messages": [grant("call_1", true)]});
    let (a, b) = tokio::join!(
        post_keyed(&server, &sid, "key-1", &body),
        post_keyed(&server, &sid, "key-1", &body)
    );
    assert_eq!(a.0, 200, "{}", a.1);
    assert_eq!(a, b);
    let again = post_keyed(&server, &sid, "key-1", &body).await;
    assert_eq!(again, a);
    let first: Value = serde_json::from_str(&a.1).unwrap();
    assert_eq!(first["messages"][0]["content"], "call_1", "{first}");
    assert_eq!(calls(&log).len(), 1, "the granted call ran once");
    assert_eq!(fake.requests().len(), 2, "one model call for the follow-up");
    // Without the key, the same follow-up is a conflict: the call is settled.
    let (status, err) = post_turn(&server, &sid, &body).await;
    assert_eq!(status, 409, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("call_1 is already settled"),
        "{err}"
    );
    // The key with another body: 422.
    let other = json!({"messages": [grant("call_1", false)]});
    let (status, text) = post_keyed(&server, &sid, "key-1", &other).await;
    assert_eq!(status, 422, "{text}");

    // SSE ("message" mode): the repeat gets the same events.
    push_calls(&fake, &[echo_call("call_2")]);
    post_turn(&server, &sid, &user("two")).await;
    fake.push(Reply::text("echoed again"));
    let body = json!({"stream": "message", "messages": [grant("call_2", true)]});
    let first = post_keyed(&server, &sid, "key-2", &body).await;
    let second = post_keyed(&server, &sid, "key-2", &body).await;
    assert_eq!(first.0, 200);
    let events = |t: &str| -> Vec<crate::common::Sse> { crate::common::parse_sse(t) };
    assert_eq!(events(&first.1), events(&second.1));
    assert_eq!(
        crate::common::names(&events(&first.1)),
        ["turn_start", "tool_result", "text", "turn_stop"]
    );
    assert_eq!(calls(&log).len(), 2, "each granted call ran once");
    assert_eq!(fake.requests().len(), 4);
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn answers_for_unknown_or_settled_calls_are_409_naming_what_is_outstanding() {
    let fake = FakeOpenAi::start().await;
    let (server, log) = start(&fake, 3600, ASK_ECHO).await;
    let sid = server.session(json!({})).await;
    push_calls(&fake, &[echo_call("call_a"), echo_call("call_b")]);
    post_turn(&server, &sid, &user("two calls")).await;

    let forged = json!({"messages": [grant("call_a", true), grant("call_b", false), grant("call_forged", true)]});
    let (status, err) = post_turn(&server, &sid, &forged).await;
    assert_eq!(status, 409, "{err}");
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("call_forged is not a call of this session"),
        "{msg}"
    );
    assert!(
        msg.contains("still outstanding: call_a (mcp__ex__echo")
            && msg.contains("call_b (mcp__ex__echo"),
        "{msg}"
    );
    assert_eq!(calls(&log), vec![], "a refused follow-up runs nothing");

    fake.push(Reply::text("one ran"));
    let ok = json!({"messages": [grant("call_a", true), grant("call_b", false)]});
    let (status, _) = post_turn(&server, &sid, &ok).await;
    assert_eq!(status, 200);
    let (status, err) =
        post_turn(&server, &sid, &json!({"messages": [grant("call_b", true)]})).await;
    assert_eq!(status, 409, "{err}");
    let msg = err["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("call_b is already settled") && msg.contains("no tool calls are pending"),
        "{msg}"
    );
    assert_eq!(
        calls(&log),
        vec![("echo".to_string(), "call_a".to_string())]
    );
    check_log(server.engine().store(), &sid).await;
}

mod interleavings {
    //! A property over random interleavings of calls, grants, denials, cancels, expiries,
    //! repeats and restarts of one session.

    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BTreeSet};

    #[derive(Debug, Clone)]
    enum Op {
        /// A user message; the model asks for this many `ask` calls.
        Call(usize),
        /// Answer every pending call: grant where the mask's bit is set, else deny.
        Answer(u8),
        /// Grant every pending call while a cancel races the follow-up.
        GrantAndCancel,
        /// A cancel with nothing running.
        Cancel,
        /// Past approval_ttl_s.
        Expire,
        /// Send the last keyed follow-up again.
        Repeat,
        Restart,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (1usize..=3).prop_map(Op::Call),
            3 => any::<u8>().prop_map(Op::Answer),
            1 => Just(Op::GrantAndCancel),
            1 => Just(Op::Cancel),
            2 => Just(Op::Expire),
            2 => Just(Op::Repeat),
            1 => Just(Op::Restart),
        ]
    }

    /// What the test knows: calls pending, granted ones, and ones whose turn a cancel raced.
    #[derive(Default)]
    struct Model {
        pending: Vec<String>,
        granted: BTreeSet<String>,
        raced: BTreeSet<String>,
        last_keyed: Option<(String, Value)>,
        next: usize,
    }

    async fn run(ops: Vec<Op>) {
        let fake = FakeOpenAi::start().await;
        let (mut server, log) = start(&fake, 3600, ASK_ECHO).await;
        let sid = server.session(json!({})).await;
        let mut m = Model::default();
        for (i, op) in ops.iter().enumerate() {
            match op {
                Op::Call(n) if m.pending.is_empty() => {
                    let ids: Vec<String> =
                        (0..*n).map(|j| format!("call_{}_{j}", m.next)).collect();
                    m.next += 1;
                    let uses: Vec<_> = ids.iter().map(|id| echo_call(id)).collect();
                    push_calls(&fake, &uses);
                    let (status, resp) = post_turn(&server, &sid, &user("go")).await;
                    assert_eq!(status, 200, "{op:?}: {resp}");
                    assert_eq!(resp["stopReason"], "tool_use");
                    m.pending = ids;
                }
                Op::Call(_) => {
                    // Calls are open: a user message is a conflict and changes nothing.
                    let (status, _) = post_turn(&server, &sid, &user("go")).await;
                    assert_eq!(status, 409, "{op:?}");
                }
                Op::Answer(mask) if !m.pending.is_empty() => {
                    let answers: Vec<Value> = m
                        .pending
                        .iter()
                        .enumerate()
                        .map(|(j, id)| grant(id, mask & (1 << j) != 0))
                        .collect();
                    fake.push(Reply::text("done"));
                    let body = json!({ "messages": answers });
                    let key = format!("k{i}");
                    let (status, text) = post_keyed(&server, &sid, &key, &body).await;
                    assert_eq!(status, 200, "{op:?}: {text}");
                    for (j, id) in m.pending.iter().enumerate() {
                        if mask & (1 << j) != 0 {
                            m.granted.insert(id.clone());
                        }
                    }
                    m.pending.clear();
                    m.last_keyed = Some((key, body));
                }
                Op::GrantAndCancel if !m.pending.is_empty() => {
                    let answers: Vec<Value> = m.pending.iter().map(|id| grant(id, true)).collect();
                    // The model may or may not be asked (the cancel may come first).
                    fake.set_fallback(Reply::text("done"));
                    let body = json!({ "messages": answers });
                    let cancel_path = format!("/sessions/{sid}/cancel");
                    let cancel = server.http.call("POST", &cancel_path, None);
                    let ((status, resp), _) = tokio::join!(post_turn(&server, &sid, &body), cancel);
                    assert_eq!(status, 200, "{op:?}: {resp}");
                    server.wait_idle(&sid).await;
                    for id in m.pending.drain(..) {
                        m.granted.insert(id.clone());
                        m.raced.insert(id);
                    }
                    fake.clear_fallback();
                }
                Op::Cancel | Op::Answer(_) | Op::GrantAndCancel => {
                    let (status, _) = server
                        .http
                        .call("POST", &format!("/sessions/{sid}/cancel"), None)
                        .await;
                    assert!(status < 300, "cancel: {status}");
                }
                Op::Expire => {
                    let session = server
                        .engine()
                        .session(turnstile::engine::Reach::Owner(None), &sid)
                        .await
                        .unwrap();
                    server
                        .engine()
                        .expire_approvals_ahead(&session, Duration::from_secs(3601))
                        .await;
                    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
                    assert_eq!(info["pending"], json!([]), "{info}");
                    m.pending.clear();
                }
                Op::Repeat => {
                    if let Some((key, body)) = &m.last_keyed {
                        let (status, text) = post_keyed(&server, &sid, key, body).await;
                        // The same answer while the key is remembered; after a restart it is
                        // judged afresh: its calls are settled (or others are pending).
                        assert!(
                            status == 200 || status == 409 || status == 400,
                            "{status}: {text}"
                        );
                    }
                }
                Op::Restart => {
                    server = restart(server, &fake, 3600, ASK_ECHO).await;
                }
            }
            // Only granted calls ever ran, each at most once.
            let mut ran: BTreeMap<String, usize> = BTreeMap::new();
            for (_, text) in calls(&log) {
                *ran.entry(text).or_default() += 1;
            }
            for (id, n) in &ran {
                assert!(
                    m.granted.contains(id),
                    "after {op:?}: {id} ran without a grant"
                );
                assert_eq!(*n, 1, "after {op:?}: {id} ran {n} times");
            }
        }
        // Every grant no cancel raced ran exactly once.
        let ran: BTreeSet<String> = calls(&log).into_iter().map(|(_, t)| t).collect();
        for id in m.granted.difference(&m.raced) {
            assert!(ran.contains(id), "{id} was granted but never ran");
        }
        server.wait_idle(&sid).await;
        check_log(server.engine().store(), &sid).await;
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 12, failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn an_ask_tool_runs_only_after_its_own_grant_and_at_most_once(ops in proptest::collection::vec(op(), 1..9)) {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(run(ops));
        }
    }
}

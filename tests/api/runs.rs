//! The runs API (spec 002) against the fake upstream and the example MCP server: the stateless
//! `POST /run`, session runs and their SSE stream (live and replayed), tools that need a
//! permission no one can give, plan mode, interrupt, and the spec's own JavaScript and Python
//! client examples run as written.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::mcp::example_server;
use crate::common::sse_stream::{Frame, SseStream};
use crate::common::{logcheck::check_log, setup, TestServer};
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Gate, Reply};

const AGENT: &str = r#"
[agents.assistant]
system_prompt = "You are terse."
"#;

const POLICY: &str = r#"
[policy]
trust = ["mcp__ex__add"]
ask = ["mcp__ex__echo"]
default = "ask"
"#;

/// The example server `ex` under [`AGENT`] and [`POLICY`].
async fn with_example_server() -> (FakeOpenAi, TestServer) {
    setup(&format!("{AGENT}\n{}\n{POLICY}", example_server("ex", ""))).await
}

fn add_call(id: &str, a: i64, b: i64) -> Reply {
    Reply::tool_calls(&[(id, "mcp__ex__add", json!({"a": a, "b": b}))])
}

/// A session made the runs API's way; its id.
async fn session(server: &TestServer) -> String {
    let (status, v) = server.http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{v}");
    let id = v["sessionId"].as_str().unwrap().to_string();
    assert_eq!(v["id"], id.as_str(), "`id` for runs clients: {v}");
    assert!(v["created_at"].is_string(), "{v}");
    id
}

/// `POST /sessions/{id}/run`: the turn id.
async fn start_run(server: &TestServer, sid: &str, body: Value) -> String {
    let (status, v) = server
        .http
        .post(&format!("/sessions/{sid}/run"), &body)
        .await;
    assert_eq!(status, 202, "{v}");
    v["turn_id"].as_str().expect("turn_id").to_string()
}

/// `GET /sessions/{id}/events`, asserted 200 SSE.
async fn run_events(server: &TestServer, sid: &str) -> SseStream {
    crate::common::sse_stream::get(&server.http.base, &format!("/sessions/{sid}/events"), &[])
        .await
        .ok()
}

async fn until_done(s: &mut SseStream) -> Vec<Frame> {
    s.until(|f| f.event == "done").await
}

/// (event, data) of the frames that are not `partial_message`.
fn whole(frames: &[Frame]) -> Vec<(String, Value)> {
    frames
        .iter()
        .filter(|f| f.event != "partial_message")
        .map(|f| (f.event.clone(), f.json()))
        .collect()
}

fn message(text: &str) -> (String, Value) {
    (
        "message".into(),
        json!({"role": "assistant", "content": [{"type": "text", "text": text}]}),
    )
}

fn ev(name: &str, data: Value) -> (String, Value) {
    (name.into(), data)
}

fn offered(req: &Value) -> Vec<String> {
    req["tools"]
        .as_array()
        .map(|t| {
            t.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// Every text the model was sent, as one string (to look for instructions in it).
fn sent_text(req: &Value) -> String {
    req["messages"].to_string()
}

/// Whether one of the messages the model was sent contains `text` (in a string content or in
/// a text part).
fn says(req: &Value, text: &str) -> bool {
    req["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| match &m["content"] {
            Value::String(s) => s.contains(text),
            Value::Array(parts) => parts
                .iter()
                .any(|p| p["text"].as_str().is_some_and(|t| t.contains(text))),
            _ => false,
        })
}

#[tokio::test]
async fn a_stateless_run_answers_finished_with_messages_and_usage() {
    let (fake, server) = with_example_server().await;
    fake.push(add_call("call_1", 2, 3).usage(100, 20));
    fake.push(Reply::text("The sum is 5.").usage(130, 10));
    let (status, resp) = server
        .http
        .post(
            "/run",
            &json!({"goal": "当前目录有哪些文件？", "system_prompt": "你是一个有用的助手。", "max_steps": 10}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["status"], "finished", "{resp}");
    assert_eq!(resp["finish_reason"], "NoMoreToolCalls");
    assert_eq!(
        resp["usage"],
        json!({"total_steps": 2, "total_tokens": 100 + 20 + 130 + 10})
    );
    let messages = resp["messages"].as_array().expect("messages");
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "assistant", "{resp}");
    assert!(last.to_string().contains("The sum is 5."), "{resp}");
    assert!(
        messages
            .iter()
            .any(|m| m.to_string().contains("mcp__ex__add")),
        "the tool call is among the messages: {resp}"
    );
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        reqs[0]["messages"][0],
        json!({"role": "system", "content": "你是一个有用的助手。"}),
        "system_prompt reaches the model"
    );
    assert_eq!(
        reqs[0]["messages"][1],
        json!({"role": "user", "content": "当前目录有哪些文件？"})
    );
    assert!(offered(&reqs[0]).contains(&"mcp__ex__add".to_string()));
    // The tool ran and the model saw its result.
    assert!(sent_text(&reqs[1]).contains("call_1"));
    // The run left no session behind.
    let (_, list) = server.http.get("/sessions").await;
    assert_eq!(list["sessions"], json!([]), "{list}");
}

#[tokio::test]
async fn a_stateless_run_whose_client_goes_away_still_ends_and_leaves_no_session() {
    let (fake, server) = with_example_server().await;
    let gate = Gate::new();
    fake.push(Reply::text("done anyway").hold(gate.clone()));
    let conn = server.post_and_hold("/run", &json!({"goal": "go"})).await;
    fake.wait_requests(1).await;
    let (_, list) = server.http.get("/sessions").await;
    let sid = list["sessions"][0]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("the run's session: {list}"))
        .to_string();
    let session = server
        .engine()
        .session(turnstile::engine::Reach::Owner(None), &sid)
        .await
        .unwrap();
    let (_, mut live) = session.subscribe();
    drop(conn); // the client goes away mid-run
    gate.open();
    // The run ends as it would have with its client there...
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match live.recv().await {
                Ok(turnstile::engine::Feed::Event(ev)) if ev.body.is_terminal() => return ev,
                Ok(_) => continue,
                Err(e) => panic!("the session's feed closed before the run ended: {e}"),
            }
        }
    })
    .await
    .expect("the run never ended");
    assert_eq!(end.body.type_name(), "turn.completed");
    // ...and its session is deleted after it, as ever.
    tokio::time::timeout(Duration::from_secs(10), async {
        while server.http.get(&format!("/sessions/{sid}")).await.0 != 404 {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the run's session was left behind");
}

#[tokio::test]
async fn a_stateless_run_stops_at_max_steps_while_the_model_keeps_calling_tools() {
    let (fake, server) = with_example_server().await;
    fake.push(add_call("call_1", 1, 1));
    fake.push(add_call("call_2", 2, 2));
    fake.push(Reply::text("never reached"));
    let (status, resp) = server
        .http
        .post("/run", &json!({"goal": "keep adding", "max_steps": 2}))
        .await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["status"], "finished");
    assert_eq!(resp["finish_reason"], "MaxStepsReached", "{resp}");
    assert_eq!(resp["usage"]["total_steps"], 2);
    assert_eq!(resp["usage"]["total_tokens"], 30);
    assert_eq!(fake.requests().len(), 2, "max_steps model calls");
    assert_eq!(fake.pending_replies(), 1);
    assert!(
        resp["messages"]
            .to_string()
            .contains("the turn's step budget is spent"),
        "the last call was not run: {resp}"
    );

    for bad in [
        json!({"goal": ""}),
        json!({"goal": "x", "max_steps": 0}),
        json!({"goal": "x", "unknown": 1}),
        json!({}),
    ] {
        let (status, err) = server.http.post("/run", &bad).await;
        assert_eq!(status, 400, "{bad}: {err}");
        assert_eq!(err["error"]["type"], "invalid_request", "{err}");
    }
    assert_eq!(fake.requests().len(), 2, "bad runs never reach the model");
}

#[tokio::test]
async fn a_session_run_streams_its_events_live_and_replays_them_to_late_subscribers() {
    let (fake, server) = with_example_server().await;
    let sid = session(&server).await;
    let mut live = run_events(&server, &sid).await;
    assert_eq!(live.headers["cache-control"], "no-cache");
    assert_eq!(live.headers["x-accel-buffering"], "no");
    fake.push(
        add_call("call_1", 2, 3)
            .with_text("Let me add.")
            .chunk_chars(3),
    );
    fake.push(Reply::text("The sum is 5.").chunk_chars(3));
    let t = start_run(&server, &sid, json!({"goal": "列出 src/ 的文件"})).await;
    assert!(t.starts_with("turn_"));
    let frames = until_done(&mut live).await;
    let expected = vec![
        message("Let me add."),
        ev("tool_call", json!({"name": "mcp__ex__add", "step": 1})),
        ev(
            "tool_result",
            json!({"name": "mcp__ex__add", "success": true}),
        ),
        message("The sum is 5."),
        ev(
            "done",
            json!({"finish_reason": "NoMoreToolCalls", "total_steps": 2}),
        ),
    ];
    assert_eq!(whole(&frames), expected);
    // partial_message {text, step} comes live, before the message it builds.
    for (step, text) in [(1, "Let me add."), (2, "The sum is 5.")] {
        let partial: String = frames
            .iter()
            .filter(|f| f.event == "partial_message" && f.json()["step"] == step)
            .map(|f| f.json()["text"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(partial, text, "step {step}");
    }
    let first_message = frames.iter().position(|f| f.event == "message").unwrap();
    assert_eq!(frames[0].event, "partial_message");
    assert!(frames[..first_message]
        .iter()
        .all(|f| f.event == "partial_message"));

    // A subscriber that comes after the run finished gets the whole run, without partials.
    let mut late = run_events(&server, &sid).await;
    let replay = until_done(&mut late).await;
    assert_eq!(whole(&replay), expected);
    assert_eq!(
        replay.len(),
        expected.len(),
        "no partial_message in a replay"
    );

    // Both follow live: the next run comes to each; a newer subscriber replays only it.
    fake.push(Reply::text("Again."));
    start_run(&server, &sid, json!({"goal": "again"})).await;
    let next = vec![
        message("Again."),
        ev(
            "done",
            json!({"finish_reason": "NoMoreToolCalls", "total_steps": 1}),
        ),
    ];
    assert_eq!(whole(&until_done(&mut late).await), next);
    assert_eq!(whole(&until_done(&mut live).await), next);
    server.wait_idle(&sid).await;
    let mut newest = run_events(&server, &sid).await;
    assert_eq!(whole(&until_done(&mut newest).await), next);
    // The log of the runs is the event log.
    let events = check_log(server.engine().store(), &sid).await;
    assert_eq!(events.len(), 6 + 3);
}

#[tokio::test]
async fn an_ask_tool_in_a_run_gets_an_error_result_saying_it_needs_permission() {
    let (fake, server) = with_example_server().await;
    let sid = session(&server).await;
    fake.push(Reply::tool_calls(&[(
        "call_e",
        "mcp__ex__echo",
        json!({"text": "hi"}),
    )]));
    fake.push(Reply::text("I could not echo it."));
    start_run(&server, &sid, json!({"goal": "echo hi"})).await;
    let mut s = run_events(&server, &sid).await;
    let frames = until_done(&mut s).await;
    assert_eq!(
        whole(&frames),
        vec![
            ev("tool_call", json!({"name": "mcp__ex__echo", "step": 1})),
            ev(
                "tool_result",
                json!({"name": "mcp__ex__echo", "success": false})
            ),
            message("I could not echo it."),
            ev(
                "done",
                json!({"finish_reason": "NoMoreToolCalls", "total_steps": 2})
            ),
        ]
    );
    let reqs = fake.requests();
    let result = reqs[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the model is given the tool's result")
        .clone();
    assert_eq!(result["tool_call_id"], "call_e");
    let text = result["content"].as_str().unwrap();
    assert!(
        text.contains("permission") && text.contains("POST /sessions/{id}/turns"),
        "says it needs a client's permission and which API can give it: {text}"
    );
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(
        info["status"], "idle",
        "a run never waits for a client: {info}"
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn plan_mode_proposes_without_tools_takes_rejections_and_runs_the_confirmed_edit() {
    let (fake, server) = with_example_server().await;
    let sid = session(&server).await;
    let confirm = format!("/sessions/{sid}/plan/confirm");
    let reject = format!("/sessions/{sid}/plan/reject");
    // Nothing to decide yet.
    for path in [&confirm, &reject] {
        let (status, err) = server.http.post(path, &json!({})).await;
        assert_eq!(status, 409, "{path}: {err}");
    }
    let mut s = run_events(&server, &sid).await;
    fake.push(Reply::text("1. Guess the sum.\n2. Say it."));
    start_run(&server, &sid, json!({"goal": "add 2 and 3", "plan": true})).await;
    let proposed = s.until(|f| f.event == "plan_proposed").await;
    assert_eq!(
        whole(&proposed),
        vec![ev(
            "plan_proposed",
            json!({"plan": "1. Guess the sum.\n2. Say it."})
        )]
    );
    let reqs = fake.requests();
    assert!(
        offered(&reqs[0]).is_empty(),
        "no tools while planning: {}",
        reqs[0]
    );
    assert!(sent_text(&reqs[0]).contains("add 2 and 3"));
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "plan_pending_approval", "{info}");
    assert_eq!(info["pending_plan"], "1. Guess the sum.\n2. Say it.");

    // Rejected: the model hears why and proposes again.
    fake.push(Reply::text("1. Call add with 2 and 3.\n2. Report the sum."));
    let (status, v) = server
        .http
        .post(
            &reject,
            &json!({"reason": "Do not guess: use the add tool."}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    let proposed = s.until(|f| f.event == "plan_proposed").await;
    assert_eq!(
        whole(&proposed),
        vec![
            // The decision is an event of the run (the user message of its next turn).
            ev(
                "message",
                json!({"role": "user", "content": [{"type": "plan_decision", "decision": "rejected", "reason": "Do not guess: use the add tool."}]})
            ),
            ev(
                "plan_proposed",
                json!({"plan": "1. Call add with 2 and 3.\n2. Report the sum."})
            )
        ]
    );
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2);
    assert!(offered(&reqs[1]).is_empty(), "still no tools: {}", reqs[1]);
    assert!(
        says(&reqs[1], "Do not guess: use the add tool."),
        "the reason reaches the model: {}",
        reqs[1]
    );
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "plan_pending_approval");
    assert_eq!(
        info["pending_plan"],
        "1. Call add with 2 and 3.\n2. Report the sum."
    );

    // Confirmed with edits: the edited plan is in the model's context and tools are offered.
    fake.push(add_call("call_1", 2, 3));
    fake.push(Reply::text("2 + 3 = 5."));
    let edited = "1. Call add with a=2, b=3.\n2. Answer in one line.";
    let (status, v) = server
        .http
        .post(&confirm, &json!({ "edits": edited }))
        .await;
    assert_eq!(status, 200, "{v}");
    let frames = until_done(&mut s).await;
    assert_eq!(
        whole(&frames),
        vec![
            ev(
                "message",
                json!({"role": "user", "content": [{"type": "plan_decision", "decision": "confirmed", "edits": edited}]})
            ),
            ev("tool_call", json!({"name": "mcp__ex__add", "step": 3})),
            ev(
                "tool_result",
                json!({"name": "mcp__ex__add", "success": true})
            ),
            message("2 + 3 = 5."),
            ev(
                "done",
                json!({"finish_reason": "NoMoreToolCalls", "total_steps": 4})
            ),
        ]
    );
    let reqs = fake.requests();
    assert!(
        says(&reqs[2], edited),
        "the edited plan is in context: {}",
        reqs[2]
    );
    assert!(offered(&reqs[2]).contains(&"mcp__ex__add".to_string()));
    // Decided: nothing pending any more.
    for path in [&confirm, &reject] {
        let (status, _) = server.http.post(path, &json!({})).await;
        assert_eq!(status, 409, "{path}");
    }
    server.wait_idle(&sid).await;
    let (_, info) = server.http.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["status"], "idle");
    assert!(info.get("pending_plan").is_none(), "{info}");
    // A late subscriber's replay shows the plans too.
    let mut late = run_events(&server, &sid).await;
    let replay = whole(&until_done(&mut late).await);
    let names: Vec<&str> = replay.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "plan_proposed",
            "message",
            "plan_proposed",
            "message",
            "tool_call",
            "tool_result",
            "message",
            "done"
        ]
    );
    check_log(server.engine().store(), &sid).await;
}

#[tokio::test]
async fn interrupt_cancels_a_running_run_and_a_failed_run_streams_error_then_done() {
    let (fake, server) = with_example_server().await;
    let sid = session(&server).await;
    let mut s = run_events(&server, &sid).await;
    let gate = Gate::new();
    fake.push(Reply::text("thinking out loud").hold(gate.clone()));
    let t = start_run(&server, &sid, json!({"goal": "wait"})).await;
    // Interrupted while its text streams (the upstream holds the rest).
    s.until(|f| f.event == "partial_message").await;
    let (status, v) = server
        .http
        .post(&format!("/sessions/{sid}/interrupt"), &json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["cancelled"], json!([t]));
    let frames = until_done(&mut s).await;
    assert_eq!(
        whole(&frames).last().unwrap(),
        &ev(
            "done",
            json!({"finish_reason": "Cancelled", "total_steps": 1})
        )
    );
    server.wait_idle(&sid).await;

    fake.push(Reply::status(
        500,
        json!({"error": {"message": "upstream exploded"}}),
    ));
    start_run(&server, &sid, json!({"goal": "fail"})).await;
    let frames = whole(&until_done(&mut s).await);
    assert_eq!(frames.len(), 2, "{frames:?}");
    assert_eq!(frames[0].0, "error");
    let msg = frames[0].1["message"].as_str().unwrap();
    assert!(msg.contains("model_error"), "{msg}");
    assert_eq!(frames[1].0, "done");
    assert_eq!(frames[1].1["finish_reason"], "Error", "{frames:?}");
    assert!(frames[1].1["total_steps"].is_u64(), "{frames:?}");
    assert!(!gate.is_open());
    check_log(server.engine().store(), &sid).await;
}

/// Run a spec client example script against the server, with a session ready for its run:
/// what it printed. `program` and `script` come from `crate::common::provision` (the test venv's
/// Python; Node with the script copied beside the provisioned node_modules).
async fn run_spec_client(program: PathBuf, script: PathBuf) -> String {
    let (fake, server) = with_example_server().await;
    let sid = session(&server).await;
    fake.push(add_call("call_ls", 1, 2).chunk_chars(2));
    fake.push(Reply::text("src/ 目录包含 main.rs 和 lib.rs").chunk_chars(2));
    let (program, script) = (program.display().to_string(), script.display().to_string());
    let mut cmd = tokio::process::Command::new(&program);
    cmd.arg(&script)
        .arg(&server.http.base)
        .arg(&sid)
        .env("PYTHONIOENCODING", "utf-8")
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{program} {script} did not finish within 60 s"))
        .unwrap_or_else(|e| panic!("{program} could not start ({e})"));
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "{program} {script} failed ({}); stdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let reqs = fake.requests();
    assert_eq!(reqs.len(), 2, "the script's run reached the model");
    assert!(sent_text(&reqs[0]).contains("列出文件"));
    server.wait_idle(&sid).await;
    check_log(server.engine().store(), &sid).await;
    stdout
}

#[tokio::test]
async fn the_specs_javascript_example_works_as_written() {
    let script = crate::common::provision::node_script("run_example.mjs");
    let out = run_spec_client("node".into(), script).await;
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        vec![
            "[工具] mcp__ex__add",
            "src/ 目录包含 main.rs 和 lib.rs",
            "完成: NoMoreToolCalls"
        ],
        "{out}"
    );
}

#[tokio::test]
async fn the_specs_python_example_works_as_written() {
    let python = crate::common::provision::python();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/spec_clients/run_example.py");
    let out = run_spec_client(python, script).await;
    // The Python example prints only the messages and the end.
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        vec!["src/ 目录包含 main.rs 和 lib.rs", "完成: NoMoreToolCalls"],
        "{out}"
    );
}
